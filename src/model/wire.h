// Protobuf wire format, read by hand where generated classes would build the
// whole message tree: the chunked XSpace import and the streaming profile
// reader walk an .xplane.pb field by field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spyglass::model::wire {

inline constexpr uint32_t kVarint = 0;
inline constexpr uint32_t kFixed64 = 1;
inline constexpr uint32_t kLengthDelimited = 2;
inline constexpr uint32_t kFixed32 = 5;

inline bool ReadVarint(std::string_view msg, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < msg.size(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(msg[(*pos)++]);
    *v |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// kTruncated: the message ends inside a field (a cut file); kBad: the bytes
// are not protobuf.
enum class Next { kField, kEnd, kBad, kTruncated };

// NextField for every case (groups, fixed sizes, errors).
Next NextFieldSlow(std::string_view msg, size_t* pos, uint32_t* number, uint32_t* type, std::string_view* payload,
                   uint64_t* varint, int depth);

// Reads the field at *pos: its number, wire type and its payload (the bytes
// of a length-delimited field; a varint's value in *varint). Groups (unknown
// fields only, in xplane.proto) are skipped whole; an end-group tag is a field
// only inside one (depth > 0). Inline for the common case (a one-byte tag of
// a varint or length-delimited field): a profile has tens of millions.
inline Next NextField(std::string_view msg, size_t* pos, uint32_t* number, uint32_t* type, std::string_view* payload,
                      uint64_t* varint = nullptr, int depth = 0) {
  size_t p = *pos;
  if (p == msg.size()) return Next::kEnd;
  uint8_t tag = static_cast<uint8_t>(msg[p]);
  if (tag < 0x80 && tag >= 8 && ((tag & 7) == kVarint || (tag & 7) == kLengthDelimited)) {
    size_t q = p + 1;
    uint64_t v;
    if (ReadVarint(msg, &q, &v)) {
      *number = tag >> 3;
      *type = tag & 7;
      if (*type == kVarint) {
        if (varint) *varint = v;
        *pos = q;
        return Next::kField;
      }
      if (v <= msg.size() - q) {
        *payload = msg.substr(q, v);
        if (varint) *varint = 0;
        *pos = q + v;
        return Next::kField;
      }
    }
  }
  return NextFieldSlow(msg, pos, number, type, payload, varint, depth);
}

// Splits a message into the payloads of field `split` (if `parts`) and the
// other fields, kept raw and in order in `rest`.
bool Split(std::string_view msg, uint32_t split, std::string* rest, std::vector<std::string_view>* parts);

void PutVarint(uint64_t v, std::string* out);
void PutLengthDelimited(uint32_t field, std::string_view value, std::string* out);

}  // namespace spyglass::model::wire
