// A big session end to end: records N events (default 100M) on a few
// threads, stops (recorder -> model), exports .xplane.pb and trace.json.gz,
// and reports for each step its wall time and its memory peak.
//
//   build/bench/big_session_bench [--events N] [--threads T] [--dir D] [--args | --steps] [--verify]
//
// Memory: VmHWM after each step, the high-water mark being reset before it
// by writing "5" to /proc/self/clear_refs. "recorded" is what the recorder's
// chunks added to VmRSS (the chunks are faulted in as they are taken).
// The goal: every peak below 1.2x the recorded bytes (above the baseline RSS).
//
// --verify reads the files back afterwards, once the model is freed: the
// generated protobuf parses the .xplane.pb (whole, as XProf does, below
// 1.5 GiB; near 2 GB line by line, the whole taking ~12 GB), and Python
// streams trace.json.gz through gzip, parses the head and every event object
// as JSON, and counts them (json.load of 100M events would need tens of GB).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/wire_format_lite.h>

#include "process_memory.h"
#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "session/session.h"
#include "spyglass/annotation.h"
#include "xplane.pb.h"

namespace fs = std::filesystem;
namespace model = spyglass::model;
namespace exporter = spyglass::exporter;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using spyglass::testing::Mib;
using spyglass::testing::PeakBytes;
using spyglass::testing::ResetPeak;
using spyglass::testing::RssBytes;

struct Step {
  const char* name;
  double seconds;
  int64_t peak;  // VmHWM during the step
};

// Flat events with a few static names, as a training loop's annotations;
// with `args`, each carries one integer argument (then 48 B recorded).
void Record(uint64_t n, bool args) {
  if (args) {
    for (uint64_t i = 0; i < n; ++i) spyglass::profiler::TraceAnnotation a("step", {{"i", static_cast<int64_t>(i)}});
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    switch (i & 3) {
      case 0: { spyglass::profiler::TraceAnnotation a("step"); break; }
      case 1: { spyglass::profiler::TraceAnnotation a("forward"); break; }
      case 2: { spyglass::profiler::TraceAnnotation a("backward"); break; }
      default: { spyglass::profiler::TraceAnnotation a("optimizer"); break; }
    }
  }
}

// A training loop's shape (--steps): steps "train" (StepTraceAnnotation,
// step_num) of 8 nested events each: forward {matmul, relu, loss},
// backward {matmul}, optimizer. What `spyglass summary` is measured on.
void RecordSteps(uint64_t n, uint64_t first_step) {
  namespace p = spyglass::profiler;
  for (uint64_t i = 0; i < n / 8; ++i) {
    p::StepTraceAnnotation step("train", static_cast<int64_t>(first_step + i));
    {
      p::TraceAnnotation f("forward");
      { p::TraceAnnotation a("matmul"); }
      { p::TraceAnnotation a("relu"); }
      { p::TraceAnnotation a("loss"); }
    }
    {
      p::TraceAnnotation b("backward");
      { p::TraceAnnotation a("matmul"); }
    }
    { p::TraceAnnotation o("optimizer"); }
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t events = 100'000'000;
  int threads = 4;
  std::string dir = "/tmp/big_session_bench";
  bool verify = false, args = false, loop = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--events" && i + 1 < argc) events = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--verify") verify = true;
    else if (a == "--args") args = true;
    else if (a == "--steps") loop = true;
    else {
      std::fprintf(stderr, "usage: %s [--events N] [--threads T] [--dir D] [--args | --steps] [--verify]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  fs::create_directories(dir);
  if (!ResetPeak()) std::printf("warning: cannot write /proc/self/clear_refs; peaks are process-lifetime peaks\n");

  spyglass::profiler::ProfileOptions options;
  // 24 bytes per event plus the last, partly used chunk of each thread.
  uint64_t per_thread = (events / threads + 1) * (args ? 48 : loop ? 32 : 24) + (64ull << 20);
  options.buffer_bytes_per_thread = per_thread;
  options.buffer_bytes_total = per_thread * threads;
  std::vector<Step> steps;

  int64_t base = RssBytes();
  ResetPeak();
  auto t0 = Clock::now();
  std::unique_ptr<spyglass::session::Session> session;
  if (auto s = spyglass::session::Session::Create(options, "busy", &session); !s.ok()) {
    std::fprintf(stderr, "session: %s\n", s.message().c_str());
    return 1;
  }
  // The workers stay alive until the session is collected, as in a program
  // whose threads outlive the capture.
  std::mutex mu;
  std::condition_variable cv;
  bool collected = false;
  std::atomic<int> done{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      uint64_t n = events / threads + (static_cast<uint64_t>(t) < events % threads ? 1 : 0);
      if (loop) RecordSteps(n, static_cast<uint64_t>(t) * (n / 8));
      else Record(n, args);
      done.fetch_add(1);
      cv.notify_all();
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return collected; });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done.load() == threads; });
  }
  steps.push_back({"record", seconds_since(t0), PeakBytes()});
  int64_t recorded = RssBytes() - base;

  ResetPeak();
  t0 = Clock::now();
  auto space = std::make_unique<model::Space>();
  spyglass::session::SessionSummary summary;
  if (auto s = session->Stop(space.get(), &summary); !s.ok()) std::fprintf(stderr, "stop: %s\n", s.message().c_str());
  session.reset();
  steps.push_back({"stop (recorder -> model)", seconds_since(t0), PeakBytes()});
  int64_t model_rss = RssBytes() - base;
  {
    std::lock_guard<std::mutex> lock(mu);
    collected = true;
  }
  cv.notify_all();
  for (auto& w : workers) w.join();

  std::string xplane = dir + "/big.xplane.pb", json = dir + "/big.trace.json.gz";
  ResetPeak();
  t0 = Clock::now();
  if (auto s = exporter::WriteXSpaceFile(*space, xplane); !s.ok()) std::fprintf(stderr, "xplane: %s\n", s.message().c_str());
  steps.push_back({"export .xplane.pb", seconds_since(t0), PeakBytes()});
  ResetPeak();
  t0 = Clock::now();
  if (auto s = exporter::WriteTraceJsonGz(*space, json); !s.ok()) std::fprintf(stderr, "json: %s\n", s.message().c_str());
  steps.push_back({"export .trace.json.gz", seconds_since(t0), PeakBytes()});
  std::vector<std::string> warnings = space->warnings;
  space.reset();

  std::printf("big_session_bench: %" PRIu64 " events%s on %d threads; recorded %" PRIu64 " events, dropped %" PRIu64
              "\n", events, args ? " with an argument each" : "", threads, summary.events, summary.dropped_events);
  for (const auto& w : warnings) std::printf("warning in the XSpace: %s\n", w.c_str());
  std::printf("baseline RSS %.0f MiB; recorded bytes (RSS of the chunks) %.0f MiB = %.1f B/event; model %.0f MiB\n",
              Mib(base), Mib(recorded), static_cast<double>(recorded) / static_cast<double>(events), Mib(model_rss));
  std::printf("%-26s %9s %12s %16s\n", "step", "wall s", "peak MiB", "peak/recorded");
  for (const Step& s : steps)
    std::printf("%-26s %9.2f %12.0f %15.2fx\n", s.name, s.seconds, Mib(s.peak),
                static_cast<double>(s.peak - base) / static_cast<double>(recorded));
  std::printf("files: %s %.0f MiB, %s %.0f MiB\n", xplane.c_str(), Mib(static_cast<int64_t>(fs::file_size(xplane))),
              json.c_str(), Mib(static_cast<int64_t>(fs::file_size(json))));
  std::fflush(stdout);
  if (!verify) return 0;

  int rc = 0;
  {
    ResetPeak();
    t0 = Clock::now();
    uint64_t size = fs::file_size(xplane), n = 0;
    bool ok = size <= static_cast<uint64_t>(INT_MAX);
    int fd = ::open(xplane.c_str(), O_RDONLY);
    google::protobuf::io::FileInputStream in(fd);
    google::protobuf::io::CodedInputStream coded(&in);
    std::string how;
    if (size < (3ull << 29)) {
      // The whole message at once, as XProf reads it.
      how = "the whole XSpace";
      google::protobuf::Arena arena;
      auto* x = google::protobuf::Arena::Create<tensorflow::profiler::XSpace>(&arena);
      ok = ok && x->ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
      for (const auto& p : x->planes())
        if (p.name() == model::kHostPlaneName)
          for (const auto& l : p.lines()) n += static_cast<uint64_t>(l.events_size());
      for (const auto& w : x->warnings()) std::printf("verify: warning in the file: %s\n", w.c_str());
    } else {
      // Near 2 GB the generated classes take ~12 GB for the whole message:
      // each line is parsed on its own (the XSpace and XPlane framing read
      // here), and the file is under protobuf's limit (checked above).
      how = "each line";
      auto read_len = [&](uint32_t* len) { return coded.ReadVarint32(len); };
      while (ok) {
        uint32_t tag = coded.ReadTag();
        if (tag == 0) break;
        uint32_t len = 0;
        if ((tag & 7) != 2 || !read_len(&len)) { ok = false; break; }
        auto limit = coded.PushLimit(static_cast<int>(len));
        if (tag >> 3 == 1) {  // XSpace.planes
          while (ok) {
            uint32_t ptag = coded.ReadTag();
            if (ptag == 0) break;
            if (ptag >> 3 == 3 && (ptag & 7) == 2) {  // XPlane.lines
              uint32_t llen = 0;
              ok = read_len(&llen);
              auto llimit = coded.PushLimit(static_cast<int>(llen));
              tensorflow::profiler::XLine line;
              ok = ok && line.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
              coded.PopLimit(llimit);
              n += static_cast<uint64_t>(line.events_size());
            } else {
              ok = google::protobuf::internal::WireFormatLite::SkipField(&coded, ptag);
            }
          }
        } else if (tag >> 3 == 3) {  // XSpace.warnings
          std::string w;
          ok = coded.ReadString(&w, static_cast<int>(len));
          std::printf("verify: warning in the file: %s\n", w.c_str());
        } else {
          ok = coded.Skip(static_cast<int>(len));
        }
        coded.PopLimit(limit);
      }
    }
    ::close(fd);
    std::printf("verify: generated protobuf parses %s of the .xplane.pb (%" PRIu64 " bytes, limit %d): %s, %" PRIu64
                " of %" PRIu64 " events, %.1f s, peak %.0f MiB\n",
                how.c_str(), size, INT_MAX, ok ? "ok" : "FAILED", n, summary.events, seconds_since(t0),
                Mib(PeakBytes()));
    if (!ok) rc = 1;
  }
  {
    // Streams: a whole json.load of 100M events would need tens of GB.
    std::string py = dir + "/verify_json.py";
    std::ofstream(py) << R"(import gzip, json, sys
dec = json.JSONDecoder()
n = 0
buf = ''
head = None
with gzip.open(sys.argv[1], 'rt', encoding='utf-8') as f:
    while True:
        block = f.read(1 << 22)
        if head is None:
            buf += block
            i = buf.find('"traceEvents":[')
            if i < 0 and block:
                continue
            head = buf[:i]
            buf = buf[i + len('"traceEvents":['):]
        else:
            buf += block
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in ', \n':
                pos += 1
            if pos >= len(buf) or buf[pos] != '{':
                break
            try:
                ev, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                break  # the object continues in the next block
            if ev.get('ph') == 'X':
                n += 1
            pos = end
        buf = buf[pos:]
        if not block:
            break
tail = buf.strip()
json.loads('{' + head.strip().lstrip('{') + '"traceEvents":[]' + tail.lstrip(']'))
print(n)
)";
    t0 = Clock::now();
    std::string cmd = "python3 " + py + " " + json;
    FILE* p = ::popen(cmd.c_str(), "r");
    char out[64] = {0};
    size_t got = p ? std::fread(out, 1, sizeof out - 1, p) : 0;
    int status = p ? ::pclose(p) : -1;
    uint64_t n = got ? std::strtoull(out, nullptr, 10) : 0;
    std::printf("verify: Python gzip+json %s trace.json.gz: %" PRIu64 " complete events (%s), %.1f s\n",
                status == 0 ? "reads" : "FAILS to read", n, n == summary.events ? "all" : "MISMATCH",
                seconds_since(t0));
    if (status != 0 || n != summary.events) rc = 1;
  }
  return rc;
}
