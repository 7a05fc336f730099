// Fuzz target: bytes as an .xplane.pb through the streaming read API, the
// summary (text and JSON), the diff of the file with itself, and the whole
// model read: errors are fine, crashes and hangs are not.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "analysis/diff.h"
#include "analysis/summary.h"
#include "spyglass/profile_reader.h"

#include <google/protobuf/stubs/logging.h>

namespace {

const bool kQuiet = [] {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}();

// The reader takes paths: one file per process, rewritten for each input.
const std::string& InputPath() {
  static const std::string path = "summary_fuzz." + std::to_string(getpid()) + ".xplane.pb";
  return path;
}

// What the text must never hold, whatever the names: bytes a terminal obeys
// (C0 but the newline, DEL, C1 as UTF-8).
bool HasControlBytes(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xa0) return true;
  }
  return false;
}

// Values no run has: negative step times, non-finite counter peaks.
bool HasNonsense(const spyglass::analysis::Summary& s) {
  if (s.steps.duration.count && s.steps.duration.min_ns < 0) return true;
  for (const auto& c : s.counters)
    if (!std::isfinite(c.peak) || !std::isfinite(c.last)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  {
    std::ofstream f(InputPath(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  spyglass::analysis::Summary s;
  spyglass::analysis::SummaryOptions o;
  o.top = 0;
  if (spyglass::analysis::Summarize(InputPath(), o, &s).ok()) {
    (void)spyglass::analysis::SummaryToJson(s);
    if (HasControlBytes(spyglass::analysis::SummaryToText(s))) std::abort();
    if (HasNonsense(s)) std::abort();
    spyglass::analysis::Summary two;
    spyglass::analysis::SummaryOptions top2;
    top2.top = 2;
    if (!spyglass::analysis::Summarize(InputPath(), top2, &two).ok() || two.threads.size() > 2 ||
        two.threads.size() + two.threads_left_out != s.threads.size())
      std::abort();  // --top bounds the threads, and counts the rest
    spyglass::analysis::Diff d;
    spyglass::analysis::DiffOptions dopt;
    dopt.fail_above_pct = 0;
    if (!spyglass::analysis::DiffRuns(InputPath(), InputPath(), dopt, &d).ok()) std::abort();  // read once, reads twice
    for (const auto& r : d.annotations)
      if (r.delta_ns != 0) std::abort();  // a file compared with itself
    if (HasControlBytes(spyglass::analysis::DiffToText(d))) std::abort();
  }
  spyglass::profile::ProfileReader r;
  if (r.Open(InputPath()).ok()) {
    spyglass::profile::ProfileData p;
    (void)r.Read(&p);
  }
  std::remove(InputPath().c_str());
  return 0;
}
