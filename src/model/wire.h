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

// Reads the field at *pos: its number, wire type and its payload (the bytes
// of a length-delimited field; a varint's value in *varint). Groups (unknown
// fields only, in xplane.proto) are skipped whole; an end-group tag is a field
// only inside one (depth > 0).
Next NextField(std::string_view msg, size_t* pos, uint32_t* number, uint32_t* type, std::string_view* payload,
               uint64_t* varint = nullptr, int depth = 0);

// Splits a message into the payloads of field `split` (if `parts`) and the
// other fields, kept raw and in order in `rest`.
bool Split(std::string_view msg, uint32_t split, std::string* rest, std::vector<std::string_view>* parts);

void PutVarint(uint64_t v, std::string* out);
void PutLengthDelimited(uint32_t field, std::string_view value, std::string* out);

}  // namespace spyglass::model::wire
