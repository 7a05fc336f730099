// Reading a big .xplane.pb three ways, for summary_bench.py's baselines:
//   scan      ProfileReader::Scan with a visitor that counts events (the
//             floor of what `spyglass summary` does)
//   model     ProfileReader::Read: the whole model (the chunked importer)
//   protobuf  the generated XSpace parsed whole (the naive way, as XProf reads)
// Prints "<mode> <events> <seconds> <peak bytes>" (VmHWM of this process).
//
//   build/bench/read_bench scan|model|protobuf FILE
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "process_memory.h"
#include "spyglass/profile_reader.h"
#include "xplane.pb.h"

namespace {

struct Count : spyglass::profile::ProfileVisitor {
  uint64_t events = 0;
  int64_t last = 0;
  void OnEvent(const spyglass::profile::EventRecord& e) override {
    ++events;
    last += e.duration_ps;  // read the fields, as a summary does
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s scan|model|protobuf FILE\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1], path = argv[2];
  auto t0 = std::chrono::steady_clock::now();
  uint64_t events = 0;
  if (mode == "protobuf") {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    tensorflow::profiler::XSpace space;
    if (!space.ParseFromString(ss.str())) return 1;
    for (const auto& p : space.planes())
      for (const auto& l : p.lines()) events += static_cast<uint64_t>(l.events_size());
  } else {
    spyglass::profile::ProfileReader r;
    if (auto s = r.Open(path); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    if (mode == "scan") {
      Count c;
      if (!r.Scan(c).ok()) return 1;
      events = c.events;
    } else if (mode == "model") {
      spyglass::profile::ProfileData d;
      if (!r.Read(&d).ok()) return 1;
      events = d.event_count();
    } else {
      return 2;
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %" PRIu64 " %.3f %" PRId64 "\n", mode.c_str(), events, s, spyglass::testing::PeakBytes());
  return 0;
}
