#include "model/wire.h"

namespace spyglass::model::wire {

// Groups nest at most this deep (protobuf's own recursion limit).
constexpr int kMaxDepth = 100;

Next NextFieldSlow(std::string_view msg, size_t* pos, uint32_t* number, uint32_t* type, std::string_view* payload,
                   uint64_t* varint, int depth) {
  if (*pos == msg.size()) return Next::kEnd;
  uint64_t tag, v;
  if (!ReadVarint(msg, pos, &tag)) return *pos == msg.size() ? Next::kTruncated : Next::kBad;
  if (tag >> 3 == 0 || tag >> 3 > UINT32_MAX) return Next::kBad;
  *number = static_cast<uint32_t>(tag >> 3);
  *type = static_cast<uint32_t>(tag & 7);
  switch (*type) {
    case kVarint:
      if (!ReadVarint(msg, pos, &v)) return *pos == msg.size() ? Next::kTruncated : Next::kBad;
      if (varint) *varint = v;
      return Next::kField;
    case kFixed64: v = 8; break;
    case kFixed32: v = 4; break;
    case kLengthDelimited:
      if (!ReadVarint(msg, pos, &v)) return *pos == msg.size() ? Next::kTruncated : Next::kBad;
      break;
    case 3:  // start group: up to its end-group tag of the same number
      if (depth >= kMaxDepth) return Next::kBad;
      while (true) {
        uint32_t n, t;
        std::string_view p;
        Next r = NextField(msg, pos, &n, &t, &p, nullptr, depth + 1);
        if (r == Next::kEnd) return Next::kTruncated;
        if (r != Next::kField) return r;
        if (t == 4) return n == *number ? Next::kField : Next::kBad;
      }
    case 4: return depth > 0 ? Next::kField : Next::kBad;
    default: return Next::kBad;
  }
  if (v > msg.size() - *pos) return Next::kTruncated;
  *payload = msg.substr(*pos, v);
  if (varint) *varint = 0;
  *pos += v;
  return Next::kField;
}

bool Split(std::string_view msg, uint32_t split, std::string* rest, std::vector<std::string_view>* parts) {
  size_t pos = 0;
  while (true) {
    size_t start = pos;
    uint32_t number, type;
    std::string_view payload;
    Next n = NextField(msg, &pos, &number, &type, &payload);
    if (n != Next::kField) return n == Next::kEnd;
    if (number == split && type == kLengthDelimited) {
      if (parts) parts->push_back(payload);
    } else {
      rest->append(msg.substr(start, pos - start));
    }
  }
}

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLengthDelimited(uint32_t field, std::string_view value, std::string* out) {
  PutVarint(uint64_t{field} << 3 | kLengthDelimited, out);
  PutVarint(value.size(), out);
  out->append(value);
}

}  // namespace spyglass::model::wire
