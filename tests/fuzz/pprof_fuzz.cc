// Fuzz target: bytes through the pprof reader, as they are and gzipped, then
// through the memtop and memdiff reports.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "memory/pprof.h"

namespace {

namespace mem = spyglass::memory;

std::string Gzip(std::string_view in) {
  uLong bound = compressBound(static_cast<uLong>(in.size())) + 64;
  std::string out(bound, '\0');
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void ReadAndReport(std::string_view bytes) {
  mem::PprofReadOptions opts;
  opts.max_bytes = 64 << 20;  // the limit is what is under test, not 1 GiB of frames per input
  mem::PprofProfile p;
  if (!mem::ParsePprof(bytes, &p, opts).ok()) return;
  for (const mem::PprofSample& s : p.samples) (void)mem::CallSite(s);
  (void)mem::MemTopReport(p, "fuzz.prof", 20);
  mem::PprofProfile empty;
  (void)mem::MemDiffReport(empty, p, "empty.prof", "fuzz.prof", 20);
  (void)mem::MemDiffReport(p, p, "fuzz.prof", "fuzz.prof", 20);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ReadAndReport(bytes);
  ReadAndReport(Gzip(bytes));
  return 0;
}
