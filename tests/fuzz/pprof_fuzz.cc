// Fuzz target: bytes through the pprof reader, as they are and gzipped, then
// through the memtop and memdiff reports.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/gzip.h"
#include "memory/pprof.h"

namespace {

namespace mem = spyglass::memory;

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
  ReadAndReport(spyglass::GzipCompress(bytes, 1));
  return 0;
}
