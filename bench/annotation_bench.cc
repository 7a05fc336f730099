// Cost of one annotation (begin + end) on the hot path, next to its floor
// (two timestamp reads) and a naive baseline (mutex + std::vector of
// {std::string, start, end} with std::chrono::steady_clock).
//
//   build/bench/annotation_bench
//
// Sessions are run with the internal recorder (not start_trace/stop_trace,
// which export files): every kRestartEvery iterations per thread, the timer is
// paused, thread 0 stops, collects (counting bytes, events and drops) and
// restarts the session, and the timer resumes. So the buffers never fill and
// chunks come from the recorder's pool (the steady state of a session).
//
// Per-event cost is the CPU time per iteration (with ->Threads(2), the sum of
// both threads' CPU time divided by the events of both). At the end a summary
// prints the ratios the goals are stated in.
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "spyglass/annotation.h"
#include "trace/recorder.h"

namespace prof = spyglass::profiler;
namespace si = spyglass::internal;

namespace {

constexpr int64_t kRestartEvery = 1 << 20;  // iterations per thread between restarts
constexpr uint64_t kMiB = 1ull << 20;
const si::RecorderLimits kLimits{512 * kMiB, 1024 * kMiB};

// ---- what a session recorded -------------------------------------------------

struct Tally {
  uint64_t words = 0;
  uint64_t begins = 0;
  uint64_t ends = 0;
  uint64_t args = 0;
  uint64_t dropped = 0;
  uint64_t threads = 0;
};

// Walks the records (encoding in include/spyglass/internal/recorder.h).
void count_records(const uint64_t* p, const uint64_t* end, Tally& t) {
  while (p < end) {
    uint64_t w = *p;
    if (w & si::kEndBit) {
      ++t.ends;
      p += 1;
      continue;
    }
    uint64_t tag = w >> 56;
    if (tag == si::kTagStatic) {
      ++t.begins;
      p += 2;
    } else if (tag == si::kTagCopied) {
      ++t.begins;
      p += 2 + si::words_for(w & si::kPayloadMask);
    } else if (tag == si::kTagArg) {
      ++t.args;
      auto type = static_cast<si::ArgType>((w >> 48) & 0xff);
      uint64_t klen = (w >> 32) & 0xffff;
      uint64_t vlen = w & 0xffffffff;
      p += 1 + si::words_for(klen) + (type == si::ArgType::kString ? si::words_for(vlen) : 1);
    } else {
      std::fprintf(stderr, "annotation_bench: unknown record word %016llx\n", static_cast<unsigned long long>(w));
      std::abort();
    }
  }
}

void collect_into(uint64_t word, Tally& t) {
  si::recorder_stop();
  std::vector<si::RawThread> threads = si::recorder_collect(word);
  for (const si::RawThread& th : threads) {
    t.dropped += th.dropped;
    for (size_t i = 0; i < th.spans.size(); ++i) {
      auto [b, e] = th.spans[i];
      t.words += static_cast<uint64_t>(e - b);
      count_records(b, e, t);
      if (i < th.owned_spans) si::recorder_free_chunk(b);
    }
  }
  t.threads = std::max<uint64_t>(t.threads, threads.size());
  si::recorder_release(word);
}

// One session for the run of a benchmark, shared by its threads. Thread 0
// creates it before the timed loop (the threads start the loop together, after
// that), and reports after it (they also end it together).
struct SessionRun {
  uint64_t word = 0;
  Tally tally;
  std::unique_ptr<std::barrier<>> barrier;
};
SessionRun* g_run = nullptr;

void session_setup(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  g_run = new SessionRun;
  g_run->barrier = std::make_unique<std::barrier<>>(state.threads());
  g_run->word = si::recorder_start(prof::kLevelCritical, kLimits);
}

// Every kRestartEvery iterations: all threads pause, thread 0 collects and
// restarts, all resume.
inline void maybe_restart(benchmark::State& state, int64_t& n) {
  if (SPYGLASS_LIKELY(++n < kRestartEvery)) return;
  n = 0;
  state.PauseTiming();
  g_run->barrier->arrive_and_wait();
  if (state.thread_index() == 0) {
    collect_into(g_run->word, g_run->tally);
    g_run->word = si::recorder_start(prof::kLevelCritical, kLimits);
  }
  g_run->barrier->arrive_and_wait();
  state.ResumeTiming();
}

void session_teardown(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  collect_into(g_run->word, g_run->tally);
  const Tally& t = g_run->tally;
  uint64_t iterations = static_cast<uint64_t>(state.iterations()) * static_cast<uint64_t>(state.threads());
  // Events in the whole run (all threads); the counters are not averaged.
  state.counters["events"] = benchmark::Counter(static_cast<double>(t.ends), benchmark::Counter::kDefaults);
  state.counters["dropped"] = static_cast<double>(t.dropped);
  state.counters["bytes_per_event"] = t.ends ? 8.0 * static_cast<double>(t.words) / static_cast<double>(t.ends) : 0;
  if (t.begins != iterations || t.ends != iterations || t.dropped != 0) {
    state.SkipWithError(("recorded " + std::to_string(t.begins) + " begins / " + std::to_string(t.ends) +
                         " ends for " + std::to_string(iterations) + " iterations, dropped " +
                         std::to_string(t.dropped))
                            .c_str());
  }
  delete g_run;
  g_run = nullptr;
}

// ---- floor ---------------------------------------------------------------------

void BM_Floor_NowTicksX2(benchmark::State& state) {
  for (auto _ : state) {
    uint64_t a = si::now_ticks();
    benchmark::DoNotOptimize(a);
    uint64_t b = si::now_ticks();
    benchmark::DoNotOptimize(b);
  }
  state.SetLabel(si::g_state.use_tsc ? "rdtsc" : "clock_gettime");
}
BENCHMARK(BM_Floor_NowTicksX2);

void BM_Floor_ClockGettimeMonotonicX2(benchmark::State& state) {
  for (auto _ : state) {
    timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    benchmark::DoNotOptimize(a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_Floor_ClockGettimeMonotonicX2);

// ---- no session ------------------------------------------------------------------

void BM_NoSession_Static(benchmark::State& state) {
  for (auto _ : state) {
    // No DoNotOptimize(a): it would store the object; the relaxed load of the
    // session word is not elided by the compiler, so the loop is the real path.
    prof::TraceAnnotation a("name");
  }
}
BENCHMARK(BM_NoSession_Static);

void BM_NoSession_Dynamic(benchmark::State& state) {
  std::string name = "dynamic_name_42";
  benchmark::DoNotOptimize(name);
  for (auto _ : state) {
    prof::TraceAnnotation a(name);
  }
}
BENCHMARK(BM_NoSession_Dynamic);

// ---- session running ---------------------------------------------------------------

void BM_Session_Static(benchmark::State& state) {
  session_setup(state);
  int64_t n = 0;
  for (auto _ : state) {
    { prof::TraceAnnotation a("name"); }
    maybe_restart(state, n);
  }
  session_teardown(state);
}
BENCHMARK(BM_Session_Static)->Threads(1)->Threads(2);

// A name of typical length (longer than std::string's 15-byte inline buffer):
// free for us (a pointer), a heap allocation for the naive baseline.
constexpr char kLongName[] = "train_step/forward/matmul";

void BM_Session_StaticLongName(benchmark::State& state) {
  session_setup(state);
  int64_t n = 0;
  for (auto _ : state) {
    { prof::TraceAnnotation a(kLongName); }
    maybe_restart(state, n);
  }
  session_teardown(state);
}
BENCHMARK(BM_Session_StaticLongName)->Threads(1)->Threads(2);

void BM_Session_Dynamic(benchmark::State& state) {
  session_setup(state);
  std::string name = "dynamic_name_42";
  benchmark::DoNotOptimize(name);
  int64_t n = 0;
  for (auto _ : state) {
    { prof::TraceAnnotation a(name); }
    maybe_restart(state, n);
  }
  session_teardown(state);
}
BENCHMARK(BM_Session_Dynamic);

void BM_Session_Static3Args(benchmark::State& state) {
  session_setup(state);
  int64_t n = 0;
  int64_t size = 64;
  for (auto _ : state) {
    { prof::TraceAnnotation a("batch", {{"size", size}, {"lr", 0.1}, {"kind", "eval"}}); }
    maybe_restart(state, n);
  }
  session_teardown(state);
}
BENCHMARK(BM_Session_Static3Args);

void BM_Session_StepTraceAnnotation(benchmark::State& state) {
  session_setup(state);
  int64_t n = 0;
  int64_t step = 0;
  for (auto _ : state) {
    { prof::StepTraceAnnotation a("train", step++); }
    maybe_restart(state, n);
  }
  session_teardown(state);
}
BENCHMARK(BM_Session_StepTraceAnnotation);

// ---- flight recorder: the ring overwriting its oldest events ----------------------------
//
// A 4 MiB ring (kRingLimits) fills within the first ~170k events and then
// overwrites all the run long (the steady state of a flight recorder), with
// no pauses. At the end, held + overwritten events must be every iteration.

const si::RecorderLimits kRingLimits{4 * kMiB, 4 * kMiB, true};

struct RingRun {
  uint64_t word = 0;
};
RingRun* g_ring = nullptr;

void ring_setup(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  g_ring = new RingRun;
  g_ring->word = si::recorder_start(prof::kLevelCritical, kRingLimits);
}

void ring_teardown(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  si::recorder_stop();
  Tally t;
  uint64_t overwritten = 0;
  std::vector<si::RawThread> threads = si::recorder_collect(g_ring->word);
  for (const si::RawThread& th : threads) {
    t.dropped += th.dropped;
    overwritten += th.overwritten;
    for (size_t i = 0; i < th.spans.size(); ++i) {
      count_records(th.spans[i].first, th.spans[i].second, t);
      if (i < th.owned_spans) si::recorder_free_chunk(th.spans[i].first);
    }
  }
  si::recorder_release(g_ring->word);
  uint64_t iterations = static_cast<uint64_t>(state.iterations()) * static_cast<uint64_t>(state.threads());
  state.counters["overwritten"] = static_cast<double>(overwritten);
  if (t.begins + overwritten != iterations || t.dropped != 0)
    state.SkipWithError(("ring held " + std::to_string(t.begins) + " + overwrote " + std::to_string(overwritten) +
                         " events for " + std::to_string(iterations) + " iterations, dropped " +
                         std::to_string(t.dropped))
                            .c_str());
  delete g_ring;
  g_ring = nullptr;
}

void BM_Ring_Static(benchmark::State& state) {
  ring_setup(state);  // the threads start the loop together, after it
  for (auto _ : state) {
    prof::TraceAnnotation a("name");
  }
  ring_teardown(state);
}
BENCHMARK(BM_Ring_Static)->Threads(1)->Threads(2);

void BM_Ring_StepTraceAnnotation(benchmark::State& state) {
  ring_setup(state);
  int64_t step = 0;
  for (auto _ : state) {
    prof::StepTraceAnnotation a("train", step++);
  }
  ring_teardown(state);
}
BENCHMARK(BM_Ring_StepTraceAnnotation);

// ---- naive baseline ------------------------------------------------------------------

struct NaiveEvent {
  std::string name;
  int64_t start;
  int64_t end;
};
struct NaiveRecorder {
  std::mutex mu;
  std::vector<NaiveEvent> events;
};
NaiveRecorder* g_naive = nullptr;
std::unique_ptr<std::barrier<>> g_naive_barrier;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class NaiveAnnotation {
 public:
  explicit NaiveAnnotation(const char* name) {
    int64_t t = steady_ns();
    std::lock_guard<std::mutex> lock(g_naive->mu);
    index_ = g_naive->events.size();
    g_naive->events.push_back({name, t, 0});
  }
  ~NaiveAnnotation() {
    int64_t t = steady_ns();
    std::lock_guard<std::mutex> lock(g_naive->mu);
    g_naive->events[index_].end = t;
  }

 private:
  size_t index_;
};

template <const char* kName>
void BM_Naive_MutexVector(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_naive = new NaiveRecorder;
    g_naive->events.reserve(kRestartEvery * state.threads());
    g_naive_barrier = std::make_unique<std::barrier<>>(state.threads());
  }
  int64_t n = 0;
  for (auto _ : state) {
    { NaiveAnnotation a(kName); }
    if (++n == kRestartEvery) {  // same pause-and-drain as the sessions
      n = 0;
      state.PauseTiming();
      g_naive_barrier->arrive_and_wait();
      if (state.thread_index() == 0) g_naive->events.clear();
      g_naive_barrier->arrive_and_wait();
      state.ResumeTiming();
    }
  }
  if (state.thread_index() == 0) {
    delete g_naive;
    g_naive = nullptr;
    g_naive_barrier.reset();
  }
}
constexpr char kShortName[] = "name";
BENCHMARK_TEMPLATE(BM_Naive_MutexVector, kShortName)->Name("BM_Naive_MutexVector")->Threads(1)->Threads(2);
BENCHMARK_TEMPLATE(BM_Naive_MutexVector, kLongName)->Name("BM_Naive_MutexVector_LongName")->Threads(1)->Threads(2);

// ---- summary: the ratios of the goals ------------------------------------------------

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(OutputOptions opts) : ConsoleReporter(opts) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred || r.iterations == 0) continue;
      ns_[r.benchmark_name()] = r.GetAdjustedCPUTime();  // time unit is ns (the default)
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    auto get = [&](const char* name) { auto it = ns_.find(name); return it == ns_.end() ? -1.0 : it->second; };
    double floor = get("BM_Floor_NowTicksX2");
    double st1 = get("BM_Session_Static/threads:1");
    double st2 = get("BM_Session_Static/threads:2");
    double nv1 = get("BM_Naive_MutexVector/threads:1");
    double nv2 = get("BM_Naive_MutexVector/threads:2");
    double sl1 = get("BM_Session_StaticLongName/threads:1");
    double sl2 = get("BM_Session_StaticLongName/threads:2");
    double nl1 = get("BM_Naive_MutexVector_LongName/threads:1");
    double nl2 = get("BM_Naive_MutexVector_LongName/threads:2");
    double ns_static = get("BM_NoSession_Static");
    double ring1 = get("BM_Ring_Static/threads:1");
    double ring2 = get("BM_Ring_Static/threads:2");
    double step = get("BM_Session_StepTraceAnnotation");
    double ring_step = get("BM_Ring_StepTraceAnnotation");
    double ns_dyn = get("BM_NoSession_Dynamic");
    std::printf("\nSummary (CPU ns per event):\n");
    std::printf("  floor (now_ticks x2)                 %7.2f\n", floor);
    std::printf("  no session, static / dynamic         %7.2f / %.2f   (goal <= 2 ns)\n", ns_static, ns_dyn);
    std::printf("  session static, 1 / 2 threads        %7.2f / %.2f\n", st1, st2);
    std::printf("  naive, 1 / 2 threads                 %7.2f / %.2f\n", nv1, nv2);
    std::printf("  ratio session static / floor         %7.2f   (goal <= 1.5)\n", st1 / floor);
    std::printf("  ratio naive / session static         %7.2f   (goal >= 5), with 2 threads %.2f\n", nv1 / st1,
                nv2 / st2);
    std::printf("  long name (25 chars): session %.2f / %.2f, naive %.2f / %.2f (1 / 2 threads)\n", sl1, sl2, nl1, nl2);
    std::printf("  ratio naive / session, long name     %7.2f   (goal >= 5), with 2 threads %.2f\n", nl1 / sl1,
                nl2 / sl2);
    std::printf("  ratio session static 2 thr / 1 thr   %7.2f   (goal <= 1: per-event cost not worse)\n", st2 / st1);
    std::printf("  flight recorder ring, 1 / 2 threads  %7.2f / %.2f   (overwriting a 4 MiB ring)\n", ring1, ring2);
    std::printf("  ratio ring / session static          %7.2f   (goal ~1), with 2 threads %.2f\n", ring1 / st1,
                ring2 / st2);
    std::printf("  step: session %.2f, ring %.2f   ratio %.2f\n", step, ring_step, ring_step / step);
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Color only on a terminal (a custom reporter does not get --benchmark_color).
  SummaryReporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_Defaults
                                                 : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
