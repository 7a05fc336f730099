// Fuzz target: bytes as an .xplane.pb through the report's timeline (spans,
// levels of detail, counters, details) and the page it renders: errors are
// fine, crashes and hangs are not; what is built must decode as the page
// decodes it (every level's bytes inside the blob).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "report/report.h"
#include "report/timeline.h"

#include <google/protobuf/stubs/logging.h>

namespace {

const bool kQuiet = [] {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}();

const std::string& InputPath() {
  static const std::string path = "report_fuzz." + std::to_string(getpid()) + ".xplane.pb";
  return path;
}

void CheckLevel(const spyglass::report::Timeline& tl, const spyglass::report::TimelineLevel& l) {
  if (l.offset > tl.blob.size() || l.bytes > tl.blob.size() - l.offset) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  {
    std::ofstream f(InputPath(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  spyglass::report::TimelineBuilder b;
  if (spyglass::report::AddProfileFile(InputPath(), "", &b).ok()) {
    spyglass::report::ReportInput in;
    in.timeline = b.Finish();
    const auto& tl = in.timeline;
    if (tl.duration_ns < 0 || tl.tracks.size() > spyglass::report::kMaxTracks ||
        tl.counters.size() > spyglass::report::kMaxCounters || tl.details.size() > spyglass::report::kMaxDetails)
      std::abort();
    for (const auto& t : tl.tracks)
      for (const auto& lane : t.lanes)
        for (const auto& l : lane) CheckLevel(tl, l);
    for (const auto& c : tl.counters) {
      if (!(c.min <= c.max)) std::abort();
      for (const auto& l : c.levels) CheckLevel(tl, l);
    }
    (void)spyglass::report::RenderReport(in);
  }
  std::remove(InputPath().c_str());
  return 0;
}
