// gzip (RFC 1952) of one buffer, the project's one way: a one-shot compress
// (pprof snapshots) and a bounded decompress (the pprof reader), plus the
// header and trailer bytes for writers that deflate a member themselves (the
// trace JSON writer's parallel slices). zlib; built into libspyglass_memory,
// which the heap hook loads, so no other dependency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spyglass {

// A gzip member's header: deflate, no flags, no mtime, OS unix.
inline constexpr uint8_t kGzipHeader[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};

// Whether `bytes` starts with the gzip magic.
inline bool IsGzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f && static_cast<uint8_t>(bytes[1]) == 0x8b;
}

// The 8-byte trailer: CRC-32 and length mod 2^32 of the uncompressed data, little-endian.
inline void GzipTrailer(uint32_t crc, uint64_t size, uint8_t out[8]) {
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<uint8_t>(crc >> (8 * i));
    out[4 + i] = static_cast<uint8_t>(size >> (8 * i));
  }
}

// `in` as one gzip member at zlib `level` (1-9; clamped). Throws
// std::bad_alloc when out of memory, like any std::string.
std::string GzipCompress(std::string_view in, int level = 6);

enum class GunzipResult {
  kOk,
  kTooLarge,   // more than max_out bytes would come out
  kTruncated,  // the data ends before the member does
  kCorrupt,    // not gzip, or a bad block or checksum
};
// Inflates the gzip member `in` into *out, never holding more than `max_out`
// bytes (a gzip bomb stops there). On kCorrupt, *detail (if given) gets
// zlib's message. *out is only valid on kOk.
GunzipResult GzipDecompress(std::string_view in, size_t max_out, std::string* out, std::string* detail = nullptr);

}  // namespace spyglass
