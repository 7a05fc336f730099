// The summary's work grows with the file, not with a name's length times its
// events: device ops, counters and steps whose metadata name is 1 MiB, each on
// many events. The bytes allocated while summarizing are counted (operator
// new, below) instead of timed: the name was copied into a map key once per
// event (a 1.3 MB file of 20k events took 57 s).
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include <gtest/gtest.h>

#include "analysis/summary.h"
#include "test_util.h"
#include "xplane.pb.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocated{0};
}  // namespace

void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocated.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace spyglass {
namespace {

namespace tp = tensorflow::profiler;
constexpr int64_t kMs = 1'000'000'000;
constexpr int kEvents = 500;

// A name as the summary keeps it: its first 1024 bytes and how many more.
std::string Capped(const std::string& name) {
  return name.substr(0, 1024) + "...(+" + std::to_string(name.size() - 1024) + " bytes)";
}

// What a file can make the summary hold and print is bounded by the file: one
// 1 MiB plane name over many threads (each thread, and each of its rows,
// carried it: gigabytes of JSON and memory), one 1 MiB event name on every
// thread.
TEST(Summary, LongNamesDoNotMultiplyOverThreads) {
  const std::string big(1 << 20, 'p');
  tp::XSpace space;
  tp::XPlane* plane = space.add_planes();
  plane->set_name("/host:process " + big);  // not the host plane: its threads carry its name
  (*plane->mutable_event_metadata())[1].set_id(1);
  (*plane->mutable_event_metadata())[1].set_name("op " + big);
  for (int t = 0; t < 100; ++t) {
    tp::XLine* line = plane->add_lines();
    line->set_id(t);
    line->set_name("thread " + std::to_string(t));
    tp::XEvent* e = line->add_events();
    e->set_metadata_id(1);
    e->set_offset_ps(t * kMs);
    e->set_duration_ps(kMs);
  }
  const std::string bytes = space.SerializeAsString();
  std::string path = testing::MakeTempDir() + "/long_plane.xplane.pb";
  std::ofstream(path, std::ios::binary) << bytes;
  analysis::Summary s;
  g_allocated = 0;
  g_counting = true;
  Status st = analysis::Summarize(path, {}, &s);
  const std::string json = analysis::SummaryToJson(s), text = analysis::SummaryToText(s);
  g_counting = false;
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_LT(json.size(), bytes.size()) << "the JSON (419 MB before) is bounded by the input";
  EXPECT_LT(text.size(), bytes.size());
  EXPECT_LT(g_allocated.load(), 16 * bytes.size()) << "bytes allocated";
  EXPECT_NE(json.find("...(+"), std::string::npos);
}

TEST(Summary, LongNamesAreCopiedOncePerMetadataNotPerEvent) {
  const std::string big(1 << 20, 'k');
  tp::XSpace space;
  auto md = [](tp::XPlane* p, int64_t id, const std::string& name) {
    auto& m = (*p->mutable_event_metadata())[id];
    m.set_id(id);
    m.set_name(name);
  };
  auto smd = [](tp::XPlane* p, int64_t id, const std::string& name) {
    auto& m = (*p->mutable_stat_metadata())[id];
    m.set_id(id);
    m.set_name(name);
  };
  tp::XPlane* host = space.add_planes();
  host->set_name("/host:CPU");
  md(host, 1, "step" + big), md(host, 2, "counter" + big);
  smd(host, 1, "step_num"), smd(host, 2, "live_bytes");
  tp::XLine* main = host->add_lines();
  main->set_id(1);
  main->set_name("main");
  tp::XLine* counters = host->add_lines();
  counters->set_id(2);
  counters->set_name("_counters_");
  tp::XPlane* gpu = space.add_planes();
  gpu->set_name("/device:GPU:0");
  md(gpu, 1, "kernel" + big);
  tp::XLine* stream = gpu->add_lines();
  stream->set_id(7);
  stream->set_name("Stream #7(Compute)");
  for (int i = 0; i < kEvents; ++i) {
    tp::XEvent* s = main->add_events();
    s->set_metadata_id(1);
    s->set_offset_ps(i * kMs);
    s->set_duration_ps(kMs);
    tp::XStat* n = s->add_stats();
    n->set_metadata_id(1);
    n->set_int64_value(i);
    tp::XEvent* c = counters->add_events();
    c->set_metadata_id(2);
    c->set_offset_ps(i * kMs);
    tp::XStat* v = c->add_stats();
    v->set_metadata_id(2);
    v->set_int64_value(i);
    tp::XEvent* k = stream->add_events();
    k->set_metadata_id(1);
    k->set_offset_ps(i * kMs);
    k->set_duration_ps(kMs / 2);
  }
  std::string path = testing::MakeTempDir() + "/long_names.xplane.pb";
  std::ofstream(path, std::ios::binary) << space.SerializeAsString();

  for (bool steps_window : {false, true}) {
    analysis::SummaryOptions o;
    if (steps_window) o.step_first = 10;  // a pass for the steps first
    analysis::Summary s;
    g_allocated = 0;
    g_counting = true;
    Status st = analysis::Summarize(path, o, &s);
    g_counting = false;
    ASSERT_TRUE(st.ok()) << st.message();
    // A few copies of each name (keys, rows), not one per event: kEvents
    // copies would be 500 MiB for each kind.
    EXPECT_LT(g_allocated.load(), uint64_t{64} << 20) << "bytes allocated, steps window " << steps_window;
    EXPECT_EQ(s.steps.duration.count, steps_window ? uint64_t{kEvents - 10} : uint64_t{kEvents});
    EXPECT_EQ(s.steps.name, Capped("step" + big));
    ASSERT_EQ(s.counters.size(), 1u);
    EXPECT_EQ(s.counters[0].samples, uint64_t{kEvents});
    EXPECT_EQ(s.counters[0].peak, kEvents - 1);
    EXPECT_EQ(s.counters[0].name, Capped("counter" + big));
    ASSERT_EQ(s.kernels.size(), 1u);
    EXPECT_EQ(s.kernels[0].count, steps_window ? uint64_t{kEvents - 10} : uint64_t{kEvents});
    EXPECT_EQ(s.kernels[0].name, Capped("kernel" + big));
  }
}

}  // namespace
}  // namespace spyglass
