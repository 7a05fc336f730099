// Writes a run whose numbers are known, for the report's tests:
//   make_known_run LOG_DIR [--busy N] [--counters N]
// -> LOG_DIR/plugins/profile/run1/known.xplane.pb with, on /host:CPU,
//   thread "main": 5 steps "train" (step_num 1..5) of 10, 20, 30, 40, 50 ms,
//     1 ms apart, each holding "forward" (the first 40 %; batch=64, phase=warmup
//     in steps 1-2, else train) and "backward"
//     (the next 40 %) and, inside forward, "matmul" (half of forward);
//   thread "loader": "load_batch" of 2 ms at the start of each step, holding
//     "cudaLaunchKernel" of 50 us at 0.9 ms (correlation_id 100 + step: the
//     launch of the step's kernel);
// and on /device:GPU:0, line "Stream #7": a kernel "gemm_kernel" of 3 ms in each step
//   (correlation_id 100 + step, tf_op=train).
// Counters ("_counters_" lines): on /host:CPU "memory cpu" (live_bytes) of
//   i MiB at step i's start and i MiB + 512 KiB at its middle, 1 MiB at the
//   end (highest: 5.5 MiB); on /device:GPU:0 "sm__cycles_active.avg" of
//   10.5 * i during step i's kernel, 0 after it.
// --busy N adds thread "busy" with N more events (about), back to back from
// 0: "outer" of 4 us holding "inner" of 2 us holding "leaf" of 1 us, 0.5 us apart.
// --python 1 writes beside the run (LOG_DIR) memory.4242.known.exit.prof, a
// Python program's heap profile (json.tool's stacks, leaf first):
//   malloc <- PyUnicode_New <- raw_decode (json/decoder.py:353) <- EVAL <- main (json/tool.py:67) <- START: 4096 B
//   malloc <- PyList_Append <- load_rows (app.py:12) <- EVAL <- main (json/tool.py:67) <- START: 8192 B
//   with EVAL = _PyEval_EvalFrameDefault and START = _run_code (<frozen runpy>:88) <-
//   _run_module_as_main (<frozen runpy>:198) <- Py_RunMain <- main <- __libc_start_main <- _start
//   (7 interpreter frames a stack); and memory.4242.known.timeline.tsv, cpu:0
//   live bytes at 0, 10, 20, 30 ms: 0, 1 MiB, 3 MiB, 2 MiB; site "load <- main"
//   1 MiB at 10 and 20 ms (not in the top at 30 ms), "parse <- main" 2 MiB at 20 and 30 ms.
// --random N adds thread "random" with N events of irregular gaps and
// durations (0.1-50 us, xorshift) under 1000 names: data that compresses
// little (bench/report_bench.sh, the page's size bound).
// --counters N adds N samples of "sm__throughput.avg.pct" on /device:GPU:0,
// one a microsecond from 0 (a sawtooth; for bench/report_bench.sh).
// --async N adds N async producer/consumer pairs (XProf's "_p"/"_pt" and
// "_c"/"_ct" stats): pair k (from 0) is "prefetch" of 1 ms on thread
// "producer" at 2 + 10k ms (_p = 500 + k, _pt = 3), consumed by "consume" of
// 2 ms on thread "consumer" at 6 + 10k ms (_c = 500 + k, _ct = 3); and one
// "consume" of 0.5 ms at 9 + 10k ms of another type (_ct = 4), which pairs
// with none.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "export/log_dir.h"
#include "memory/pprof.h"
#include "memory/timeline.h"
#include "export/xplane/xplane_writer.h"
#include "model/schema.h"
#include "model/xspace.h"

namespace model = spyglass::model;

int main(int argc, char** argv) {
  long busy = 0, counters = 0, python = 0, random = 0, async_pairs = 0;
  bool ok = argc % 2 == 0;
  for (int i = 2; ok && i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    long n = std::atol(argv[i + 1]);
    if (flag == "--busy") busy = n;
    else if (flag == "--counters") counters = n;
    else if (flag == "--python") python = n;
    else if (flag == "--random") random = n;
    else if (flag == "--async") async_pairs = n;
    else ok = false;
    ok = ok && n >= 0;
  }
  if (!ok) {
    std::fprintf(stderr, "usage: make_known_run LOG_DIR [--busy N] [--counters N] [--python 1] [--random N] [--async N]\n");
    return 2;
  }
  constexpr int64_t kMs = 1'000'000'000;  // ps
  model::Space space;
  // Made first, referenced after: adding planes or lines moves them.
  space.plane(model::kHostPlaneName);
  space.plane(std::string(model::kGpuPlanePrefix) + "0");
  model::Plane& host = space.planes[0];
  model::Plane& gpu = space.planes[1];
  host.stats.push_back(host.int_stat(model::kProcessIdStat, 4242));
  host.line_with_id(1).name = "main";
  host.line_with_id(2).name = "loader";
  if (busy) host.line_with_id(3).name = "busy";
  if (random) host.line_with_id(4).name = "random";
  if (async_pairs) host.line_with_id(5).name = "producer", host.line_with_id(6).name = "consumer";
  gpu.line_with_id(7).name = "Stream #7";
  host.line_with_id(INT64_MAX).name = std::string(model::kCounterLineName);
  gpu.line_with_id(INT64_MAX).name = std::string(model::kCounterLineName);
  model::Line& main = host.lines[0];
  model::Line& loader = host.lines[1];
  model::Line& stream = gpu.lines[0];
  model::Line& memory = host.lines.back();
  model::Line& pm = gpu.lines.back();
  auto sample = [](model::Line& line, model::Plane& plane, const char* name, int64_t at, model::Stat value) {
    model::Event& e = line.events.emplace_back(model::Event{at, 0, plane.intern_event(name)});
    line.add_stats(e, std::vector<model::Stat>{value});
  };
  auto add = [](model::Line& line, model::Plane& plane, const char* name, int64_t at, int64_t dur) -> model::Event& {
    line.events.push_back({at, dur, plane.intern_event(name)});
    return line.events.back();
  };
  int64_t t = 0;
  for (int step = 1; step <= 5; ++step) {
    int64_t d = step * 10 * kMs;
    model::Event& e = add(main, host, "train", t, d);
    main.add_stats(e, std::vector<model::Stat>{host.int_stat("_r", 1), host.int_stat("step_num", step)});
    model::Event& fwd = add(main, host, "forward", t, d * 4 / 10);
    main.add_stats(fwd, std::vector<model::Stat>{host.int_stat("batch", 64), host.str_stat("phase", step < 3 ? "warmup" : "train")});
    add(main, host, "matmul", t, d * 2 / 10);
    add(main, host, "backward", t + d * 4 / 10, d * 4 / 10);
    add(loader, host, "load_batch", t, 2 * kMs);
    model::Event& launch = add(loader, host, "cudaLaunchKernel", t + 9 * kMs / 10, kMs / 20);
    loader.add_stats(launch, std::vector<model::Stat>{host.uint_stat(model::kCorrelationIdStat, 100 + step)});
    model::Event& kernel = add(stream, gpu, "gemm_kernel", t + kMs, 3 * kMs);
    stream.add_stats(kernel, std::vector<model::Stat>{gpu.uint_stat(model::kCorrelationIdStat, 100 + step),
                                                      gpu.ref_stat(model::kTfOpStat, "train")});
    constexpr int64_t kMiB = 1 << 20;
    sample(memory, host, "memory cpu", t, host.int_stat(model::kLiveBytesStat, step * kMiB));
    sample(memory, host, "memory cpu", t + d / 2, host.int_stat(model::kLiveBytesStat, step * kMiB + kMiB / 2));
    sample(pm, gpu, "sm__cycles_active.avg", t + kMs, gpu.double_stat("value", 10.5 * step));
    sample(pm, gpu, "sm__cycles_active.avg", t + 4 * kMs, gpu.double_stat("value", 0));
    t += d + kMs;
  }
  sample(memory, host, "memory cpu", t, host.int_stat(model::kLiveBytesStat, 1 << 20));
  if (busy) {
    constexpr int64_t kUs = 1'000'000;
    model::Line& line = host.lines[2];
    for (long i = 0; i < busy / 3; ++i) {
      int64_t at = i * 4500 * kUs / 1000;
      add(line, host, "outer", at, 4 * kUs);
      add(line, host, "inner", at + kUs, 2 * kUs);
      add(line, host, "leaf", at + kUs, kUs);
    }
  }
  if (random) {
    model::Line* line = nullptr;
    for (model::Line& l : host.lines)
      if (l.name == "random") line = &l;
    std::vector<uint32_t> names;
    for (int k = 0; k < 1000; ++k) names.push_back(host.intern_event("op_" + std::to_string(k * 7919 % 1000)));
    uint64_t x = 88172645463325252ull;
    int64_t at = 0;
    for (long i = 0; i < random; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      int64_t d = 100'000 + static_cast<int64_t>(x % 50'000) * 1000;  // ps
      line->events.push_back({at, d, names[(x >> 24) % names.size()]});
      at += d + static_cast<int64_t>((x >> 40) % 20'000) * 1000;
    }
  }
  if (async_pairs) {
    model::Line *producer = nullptr, *consumer = nullptr;
    for (model::Line& l : host.lines) {
      if (l.name == "producer") producer = &l;
      if (l.name == "consumer") consumer = &l;
    }
    for (long k = 0; k < async_pairs; ++k) {
      model::Event& p = add(*producer, host, "prefetch", (2 + 10 * k) * kMs, kMs);
      producer->add_stats(p, std::vector<model::Stat>{host.uint_stat("_p", 500 + k), host.int_stat("_pt", 3)});
      model::Event& c = add(*consumer, host, "consume", (6 + 10 * k) * kMs, 2 * kMs);
      consumer->add_stats(c, std::vector<model::Stat>{host.uint_stat("_c", 500 + k), host.int_stat("_ct", 3)});
      // A second consumer of another type: no producer of that type, no arrow.
      model::Event& o = add(*consumer, host, "consume", (9 + 10 * k) * kMs, kMs / 2);
      consumer->add_stats(o, std::vector<model::Stat>{host.uint_stat("_c", 500 + k), host.int_stat("_ct", 4)});
    }
  }
  for (long i = 0; i < counters; ++i)
    sample(pm, gpu, "sm__throughput.avg.pct", i * 1'000'000, gpu.double_stat("value", static_cast<double>(i % 1000) / 10));
  pm.sort_events();
  std::string run_dir;
  if (auto s = spyglass::exporter::MakeRunDir(argv[1], "run1", &run_dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  if (auto s = spyglass::exporter::WriteXSpaceFile(space, run_dir + "/known.xplane.pb"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  if (python) {
    namespace memory = spyglass::memory;
    memory::ProfileData d;
    d.functions = {{"_start", "", "", 0},          {"__libc_start_main", "", "", 0},
                   {"main", "", "", 0},            {"Py_RunMain", "", "", 0},
                   {"_run_module_as_main", "", "<frozen runpy>", 198}, {"_run_code", "", "<frozen runpy>", 88},
                   {"main", "", "/usr/lib/python3.11/json/tool.py", 60}, {"_PyEval_EvalFrameDefault", "", "", 0},
                   {"raw_decode", "", "/usr/lib/python3.11/json/decoder.py", 340}, {"PyUnicode_New", "", "", 0},
                   {"malloc", "", "", 0},          {"load_rows", "", "/srv/app.py", 10},
                   {"PyList_Append", "", "", 0}};
    const int64_t lines[] = {0, 0, 0, 0, 198, 88, 67, 0, 353, 0, 0, 12, 0};
    for (uint64_t i = 1; i <= d.functions.size(); ++i) d.locations.push_back({0x10 * i, {{i, lines[i - 1]}}});
    d.samples = {{{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 1, 4096, "heap", "cpu:0"},
                 {{11, 13, 12, 8, 7, 6, 5, 4, 3, 2, 1}, 2, 8192, "heap", "cpu:0"}};
    std::string log_dir = argv[1];
    std::FILE* f = std::fopen((log_dir + "/memory.4242.known.exit.prof").c_str(), "wb");
    std::string bytes = memory::EncodePprofGz(d);
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) return 1;
    memory::Timeline t;
    t.interval_ns = 10'000'000;
    t.devices = {"cpu:0"};
    t.peak_bytes = {3 << 20};
    t.sites = {{1, "cpu:0", "load <- main"}, {2, "cpu:0", "parse <- main"}};
    constexpr int64_t kMiB = 1 << 20;
    t.points = {{0, {0}, {0}, {}},
                {10'000'000, {kMiB}, {kMiB}, {{1, kMiB}}},
                {20'000'000, {3 * kMiB}, {3 * kMiB}, {{2, 2 * kMiB}, {1, kMiB}}},
                {30'000'000, {2 * kMiB}, {3 * kMiB}, {{2, 2 * kMiB}}}};
    f = std::fopen((log_dir + "/memory.4242.known.timeline.tsv").c_str(), "wb");
    std::string text = memory::FormatTimeline(t);
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) return 1;
  }
  std::printf("%s/known.xplane.pb\n", run_dir.c_str());
  return 0;
}
