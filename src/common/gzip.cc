#include "common/gzip.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace spyglass {

std::string GzipCompress(std::string_view in, int level) {
  z_stream z{};
  // 15 + 16: a gzip header and trailer around the deflate stream.
  if (deflateInit2(&z, std::clamp(level, 1, 9), Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::bad_alloc();  // zlib fails to init only for memory (the arguments are valid)
  std::string out(deflateBound(&z, in.size()), '\0');
  size_t used = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {  // one pass, but for inputs past uInt's range
    if (z.avail_in == 0) {
      size_t n = std::min<size_t>(in.size(), 1u << 30);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z.avail_in = static_cast<uInt>(n);
      in.remove_prefix(n);
    }
    if (used == out.size()) out.resize(out.size() + out.size() / 2 + (64 << 10));
    size_t room = std::min<size_t>(out.size() - used, 1u << 30);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + used);
    z.avail_out = static_cast<uInt>(room);
    rc = deflate(&z, in.empty() ? Z_FINISH : Z_NO_FLUSH);
    used += room - z.avail_out;
    if (rc == Z_STREAM_ERROR) break;  // cannot happen with a valid stream; never loop on it
  }
  deflateEnd(&z);
  out.resize(used);
  return out;
}

GunzipResult GzipDecompress(std::string_view in, size_t max_out, std::string* out, std::string* detail) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) throw std::bad_alloc();
  // The trailer's size (mod 2^32) as a first guess; deflate expands at most
  // ~1032x, so a lying trailer cannot make a small input reserve much.
  size_t cap = 1 << 16;
  if (in.size() >= 4) {
    uint32_t isize;
    std::memcpy(&isize, in.data() + in.size() - 4, 4);
    cap = std::max(cap, std::min(static_cast<size_t>(isize) + 1, in.size() * 1032));
  }
  out->resize(std::min(cap, max_out));
  size_t used = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (z.avail_in == 0 && !in.empty()) {
      size_t n = std::min<size_t>(in.size(), 1u << 30);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z.avail_in = static_cast<uInt>(n);
      in.remove_prefix(n);
    }
    if (used == out->size()) {
      // Full: grow up to max_out, or check with one spare byte whether more follows.
      size_t grow = std::min(out->size(), max_out - out->size());
      if (grow == 0) {
        char spare;
        z.next_out = reinterpret_cast<Bytef*>(&spare);
        z.avail_out = 1;
        rc = inflate(&z, Z_NO_FLUSH);
        if (rc == Z_STREAM_END && z.avail_out == 1) break;
        inflateEnd(&z);
        if (z.avail_out == 0) return GunzipResult::kTooLarge;
        if (rc == Z_BUF_ERROR) return GunzipResult::kTruncated;
        if (detail) *detail = z.msg ? z.msg : "inflate error";
        return GunzipResult::kCorrupt;
      }
      out->resize(out->size() + grow);
    }
    size_t room = std::min<size_t>(out->size() - used, 1u << 30);
    z.next_out = reinterpret_cast<Bytef*>(out->data() + used);
    z.avail_out = static_cast<uInt>(room);
    rc = inflate(&z, Z_NO_FLUSH);
    used += room - z.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END) {
      if (detail) *detail = z.msg ? z.msg : "inflate error";
      inflateEnd(&z);
      if (rc == Z_BUF_ERROR) return GunzipResult::kTruncated;
      if (rc == Z_MEM_ERROR) throw std::bad_alloc();
      return GunzipResult::kCorrupt;
    }
  }
  inflateEnd(&z);
  out->resize(used);
  if (out->capacity() - used > used / 4) out->shrink_to_fit();  // a copy: only when much is unused
  return GunzipResult::kOk;
}

}  // namespace spyglass
