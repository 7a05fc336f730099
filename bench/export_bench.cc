// Export of a large profile: model::Space -> .xplane.pb and .trace.json.gz,
// next to the naive path (build the generated protobuf XSpace, then
// SerializeToOstream). Reports seconds, events/s, output size and peak memory
// during each step, and checks that our .xplane.pb parses back with the
// generated protobuf with every event.
//
//   build/bench/export_bench [--events N] [--dir DIR] [--skip-naive]
//
// Memory: VmRSS before a step and VmHWM after it, the high-water mark being
// reset before each step by writing "5" to /proc/self/clear_refs. "model" is
// the RSS the model added when it was built.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <zlib.h>

#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "xplane.pb.h"

namespace fs = std::filesystem;
namespace model = spyglass::model;
namespace exporter = spyglass::exporter;
namespace pb = tensorflow::profiler;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// CPU time of the process (the exports are single-threaded): less sensitive
// than wall time to other load on a shared machine.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// kB fields of /proc/self/status.
int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line[n] == ':') return std::strtoll(line.c_str() + n + 1, nullptr, 10);
  return -1;
}
int64_t rss_bytes() { return status_kb("VmRSS") * 1024; }
int64_t hwm_bytes() { return status_kb("VmHWM") * 1024; }
bool reset_hwm() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0) return false;
  bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// ---- the profile -----------------------------------------------------------------

const char* const kNames[] = {
    "train_step",      "forward",          "backward",       "optimizer_update", "dataloader::next",
    "conv2d",          "matmul",           "relu",           "softmax",          "layer_norm",
    "attention",       "all_reduce",       "memcpy_h2d",     "memcpy_d2h",       "allocate",
    "free",            "tokenize",         "checkpoint::save", "eval_step",      "logging"};
constexpr int kNumNames = sizeof(kNames) / sizeof(kNames[0]);
constexpr int kLines = 4;

// Events per line in preorder: a step (depth 0) holding ops (depth 1), some
// of which hold kernels (depth 2); start ascending, parents before children,
// as Line::sort_events leaves them. ~10% of events carry 1 or 2 stats.
void fill_line(model::Plane& plane, model::Line& line, uint64_t count, uint32_t seed, const uint32_t ids[]) {
  std::mt19937 rng(seed);
  line.events.reserve(count);
  const uint32_t key_bytes = plane.intern_stat("bytes_accessed");
  const uint32_t key_shape = plane.intern_stat("shape");
  const uint32_t key_flops = plane.intern_stat("flops");
  int64_t t = 0;  // ps from line start
  uint64_t made = 0;
  auto add = [&](int64_t start, int64_t dur, uint32_t name) {
    model::Event e;
    e.offset_ps = start;
    e.duration_ps = dur;
    e.metadata_id = name;
    if (rng() % 10 == 0) {
      std::vector<model::Stat> stats;
      model::Stat s;
      s.metadata_id = key_bytes;
      s.kind = model::StatKind::kUint64;
      s.u64 = rng() % (1u << 24);
      stats.push_back(s);
      if (rng() % 2 == 0) {
        model::Stat s2;
        if (rng() % 2 == 0) {
          s2.metadata_id = key_flops;
          s2.kind = model::StatKind::kDouble;
          s2.f64 = static_cast<double>(rng()) * 1.5;
        } else {
          s2.metadata_id = key_shape;
          s2.kind = model::StatKind::kString;
          s2.str = "f32[" + std::to_string(rng() % 512) + ",128]";
        }
        stats.push_back(std::move(s2));
      }
      e.stats = static_cast<uint32_t>(line.stat_lists.size());
      line.stat_lists.push_back(std::move(stats));
    }
    line.events.push_back(e);
    ++made;
  };
  while (made < count) {
    // One step of 1 + ops (+ kernels) events.
    int64_t step_start = t;
    size_t step_index = line.events.size();
    add(step_start, 0, ids[0]);
    int64_t c = step_start + 1000;
    int ops = 3 + rng() % 6;
    for (int o = 0; o < ops && made < count; ++o) {
      int64_t op_start = c;
      size_t op_index = line.events.size();
      add(op_start, 0, ids[1 + rng() % (kNumNames - 1)]);
      int64_t k = op_start + 500;
      int kernels = rng() % 4;
      for (int j = 0; j < kernels && made < count; ++j) {
        int64_t d = 2000 + rng() % 200000;  // 2 ns .. 200 ns
        add(k, d, ids[1 + rng() % (kNumNames - 1)]);
        k += d + 300;
      }
      int64_t op_end = k + 700 + rng() % 50000;
      line.events[op_index].duration_ps = op_end - op_start;
      c = op_end + 1000;
    }
    int64_t step_end = c + 5000;
    line.events[step_index].duration_ps = step_end - step_start;
    t = step_end + 20000;
  }
  line.duration_ps = t;
}

uint64_t model_bytes_estimate(const model::Space& space) {
  uint64_t b = 0;
  for (const model::Plane& p : space.planes)
    for (const model::Line& l : p.lines) {
      b += l.events.capacity() * sizeof(model::Event) + l.stat_lists.capacity() * sizeof(std::vector<model::Stat>);
      for (const auto& sl : l.stat_lists) {
        b += sl.capacity() * sizeof(model::Stat);
        for (const auto& s : sl) b += s.str.capacity() > 15 ? s.str.capacity() + 1 : 0;
      }
    }
  return b;
}

model::Space build_space(uint64_t n) {
  model::Space space;
  space.hostnames.push_back("benchhost");
  model::Plane& plane = space.plane(model::kHostPlaneName);
  plane.id = 0;
  uint32_t ids[kNumNames];
  for (int i = 0; i < kNumNames; ++i) ids[i] = plane.intern_event(kNames[i]);
  for (int i = 0; i < kLines; ++i) {
    model::Line& line = plane.line_with_id(1000 + i);
    line.display_id = 1000 + i;
    line.name = "worker-" + std::to_string(i);
    line.timestamp_ns = 1700000000000000000ll + i * 1000;
  }
  for (int i = 0; i < kLines; ++i) {
    uint64_t count = n / kLines + (static_cast<uint64_t>(i) < n % kLines ? 1 : 0);
    fill_line(plane, plane.lines[i], count, 1234 + i, ids);
    plane.lines[i].sort_events();  // already in order; keeps the model as collectors leave it
  }
  return space;
}

// ---- the naive path: the generated protobuf ----------------------------------------

void fill_stat(const model::Stat& s, pb::XStat* out) {
  out->set_metadata_id(s.metadata_id);
  switch (s.kind) {
    case model::StatKind::kInt64: out->set_int64_value(s.i64); break;
    case model::StatKind::kUint64: out->set_uint64_value(s.u64); break;
    case model::StatKind::kDouble: out->set_double_value(s.f64); break;
    case model::StatKind::kString: out->set_str_value(s.str); break;
    case model::StatKind::kBytes: out->set_bytes_value(s.str); break;
    case model::StatKind::kRef: out->set_ref_value(s.ref); break;
  }
}

void build_proto(const model::Space& space, pb::XSpace* out) {
  for (const model::Plane& p : space.planes) {
    pb::XPlane* xp = out->add_planes();
    xp->set_id(p.id);
    xp->set_name(p.name);
    for (const model::Line& l : p.lines) {
      pb::XLine* xl = xp->add_lines();
      xl->set_id(l.id);
      xl->set_display_id(l.display_id);
      xl->set_name(l.name);
      xl->set_display_name(l.display_name);
      xl->set_timestamp_ns(l.timestamp_ns);
      xl->set_duration_ps(l.duration_ps);
      xl->mutable_events()->Reserve(static_cast<int>(l.events.size()));
      for (const model::Event& e : l.events) {
        pb::XEvent* xe = xl->add_events();
        xe->set_metadata_id(e.metadata_id);
        xe->set_offset_ps(e.offset_ps);
        xe->set_duration_ps(e.duration_ps);
        if (const auto* stats = l.stats_of(e))
          for (const model::Stat& s : *stats) fill_stat(s, xe->add_stats());
      }
    }
    for (size_t i = 1; i < p.event_metadata().size(); ++i) {
      const auto& m = p.event_metadata()[i];
      pb::XEventMetadata& xm = (*xp->mutable_event_metadata())[m.id];
      xm.set_id(m.id);
      xm.set_name(m.name);
      xm.set_display_name(m.display_name);
    }
    for (size_t i = 1; i < p.stat_metadata().size(); ++i) {
      const auto& m = p.stat_metadata()[i];
      pb::XStatMetadata& xm = (*xp->mutable_stat_metadata())[m.id];
      xm.set_id(m.id);
      xm.set_name(m.name);
      xm.set_description(m.description);
    }
    for (const model::Stat& s : p.stats) fill_stat(s, xp->add_stats());
  }
  for (const auto& s : space.hostnames) out->add_hostnames(s);
}

// ---- reporting -----------------------------------------------------------------------

struct Row {
  std::string what;
  uint64_t events;
  double seconds;
  double cpu;
  int64_t out_bytes;
  int64_t rss_before;
  int64_t hwm;
};
std::vector<Row> g_rows;

template <class F>
Row measure(const std::string& what, uint64_t events, const std::string& path, F&& f) {
  reset_hwm();
  int64_t before = rss_bytes();
  double c0 = cpu_seconds();
  auto t0 = Clock::now();
  f();
  double s = seconds_since(t0);
  double cpu = cpu_seconds() - c0;
  int64_t hwm = hwm_bytes();
  std::error_code ec;
  int64_t size = path.empty() ? -1 : static_cast<int64_t>(fs::file_size(path, ec));
  Row r{what, events, s, cpu, size, before, hwm};
  g_rows.push_back(r);
  std::printf("  %-36s %7.3f s (cpu %7.3f s)  %6.2f M events/s  out %7.1f MiB  RSS before %7.1f MiB  peak %7.1f MiB "
              "(+%.1f)\n",
              what.c_str(), s, cpu, static_cast<double>(events) / s / 1e6, size < 0 ? 0.0 : mib(size), mib(before),
              mib(hwm), mib(hwm - before));
  std::fflush(stdout);
  return r;
}

uint64_t count_json_events(const std::string& path, uint64_t* json_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return 0;
  gzbuffer(f, 1 << 20);
  std::vector<char> buf(1 << 22);
  const std::string needle = "{\"ph\":\"X\"";
  std::string carry;
  uint64_t n = 0, total = 0;
  int got;
  while ((got = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
    total += static_cast<uint64_t>(got);
    std::string chunk = carry + std::string(buf.data(), static_cast<size_t>(got));
    size_t pos = 0;
    while ((pos = chunk.find(needle, pos)) != std::string::npos) {
      ++n;
      pos += needle.size();
    }
    carry = chunk.size() >= needle.size() ? chunk.substr(chunk.size() - (needle.size() - 1)) : chunk;
  }
  gzclose(f);
  *json_bytes = total;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 10'000'000;
  std::string dir;
  bool naive = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--events" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--skip-naive") naive = false;
    else {
      std::fprintf(stderr, "usage: %s [--events N] [--dir DIR] [--skip-naive]\n", argv[0]);
      return 2;
    }
  }
  bool own_dir = dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/spyglass_export_bench.XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  if (!reset_hwm()) std::printf("warning: cannot write /proc/self/clear_refs; peaks are process-lifetime peaks\n");

  std::printf("export_bench: %" PRIu64 " events, %d lines on %s, %d names, output in %s\n", n, kLines,
              std::string(model::kHostPlaneName).c_str(), kNumNames, dir.c_str());
  int64_t rss0 = rss_bytes();
  auto t0 = Clock::now();
  model::Space space = build_space(n);
  double build_s = seconds_since(t0);
  int64_t model_rss = rss_bytes() - rss0;
  uint64_t with_stats = 0;
  for (const auto& l : space.planes[0].lines) with_stats += l.stat_lists.size();
  std::printf("model: %" PRIu64 " events (%.1f%% with stats), built in %.2f s; RSS +%.1f MiB, estimate %.1f MiB "
              "(%.1f bytes/event)\n\n",
              space.event_count(), 100.0 * static_cast<double>(with_stats) / static_cast<double>(n), build_s,
              mib(model_rss), mib(static_cast<int64_t>(model_bytes_estimate(space))),
              static_cast<double>(model_rss) / static_cast<double>(n));

  const std::string xplane_path = dir + "/bench.xplane.pb";
  const std::string json_path = dir + "/bench.trace.json.gz";
  const std::string naive_path = dir + "/naive.xplane.pb";

  bool ok = true;
  Row xr = measure("WriteXSpaceFile (.xplane.pb)", n, xplane_path, [&] {
    auto st = exporter::WriteXSpaceFile(space, xplane_path);
    if (!st.ok()) {
      std::printf("WriteXSpaceFile failed\n");
      ok = false;
    }
  });
  Row jr = measure("WriteTraceJsonGz (.trace.json.gz)", n, json_path, [&] {
    auto st = exporter::WriteTraceJsonGz(space, json_path);
    if (!st.ok()) {
      std::printf("WriteTraceJsonGz failed\n");
      ok = false;
    }
  });

  Row nb{}, ns{};
  if (naive) {
    pb::XSpace* proto = new pb::XSpace;
    // Peak of the naive path: the larger of the two steps' peaks.
    int64_t naive_before = rss_bytes();
    nb = measure("naive: build generated XSpace", n, "", [&] { build_proto(space, proto); });
    ns = measure("naive: SerializeToOstream", n, naive_path, [&] {
      std::ofstream out(naive_path, std::ios::binary);
      if (!proto->SerializeToOstream(&out)) {
        std::printf("SerializeToOstream failed\n");
        ok = false;
      }
    });
    // Not timed: the same message serialized deterministically (map entries
    // in key order), to compare byte for byte with ours.
    std::string det;
    {
      google::protobuf::io::StringOutputStream so(&det);
      google::protobuf::io::CodedOutputStream co(&so);
      co.SetSerializationDeterministic(true);
      proto->SerializeToCodedStream(&co);
    }
    int64_t naive_peak = std::max(nb.hwm, ns.hwm);
    std::printf("  %-36s %7.3f s  %6.2f M events/s  peak +%.1f MiB over the model\n", "naive: build + serialize",
                nb.seconds + ns.seconds, static_cast<double>(n) / (nb.seconds + ns.seconds) / 1e6,
                mib(naive_peak - naive_before));
    delete proto;
    std::error_code ec;
    int64_t ours = static_cast<int64_t>(fs::file_size(xplane_path, ec));
    int64_t theirs = static_cast<int64_t>(fs::file_size(naive_path, ec));
    bool same = false;
    {
      std::ifstream a(xplane_path, std::ios::binary);
      std::string ours_bytes((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
      same = ours_bytes == det;
    }
    std::string().swap(det);
    std::printf("  output: ours %" PRId64 " bytes, generated protobuf %" PRId64 " bytes (%s)\n", ours, theirs,
                same ? "ours byte-identical to its deterministic serialization"
                     : ours == theirs ? "same size, bytes differ from its deterministic serialization"
                                      : "DIFFERENT size");
  }

  // Round trip: parse our .xplane.pb with the generated protobuf.
  {
    auto t1 = Clock::now();
    google::protobuf::Arena arena;
    auto* back = google::protobuf::Arena::CreateMessage<pb::XSpace>(&arena);
    int fd = ::open(xplane_path.c_str(), O_RDONLY);
    bool parsed = false;
    {
      google::protobuf::io::FileInputStream in(fd, 1 << 20);
      google::protobuf::io::CodedInputStream cin(&in);
      cin.SetTotalBytesLimit(INT32_MAX);
      parsed = back->ParseFromCodedStream(&cin) && cin.ConsumedEntireMessage();
    }
    ::close(fd);
    uint64_t events = 0, stats = 0;
    bool host = false;
    for (const auto& p : back->planes()) {
      if (p.name() == model::kHostPlaneName) host = true;
      for (const auto& l : p.lines()) {
        events += static_cast<uint64_t>(l.events_size());
        for (const auto& e : l.events()) stats += static_cast<uint64_t>(e.stats_size());
      }
    }
    uint64_t want_stats = 0;
    for (const auto& l : space.planes[0].lines)
      for (const auto& sl : l.stat_lists) want_stats += sl.size();
    bool rt = parsed && host && events == n && stats == want_stats;
    ok = ok && rt;
    std::printf("\nround trip (.xplane.pb parsed by generated protobuf, %.1f s): parsed=%s, %" PRIu64
                " events (want %" PRIu64 "), %" PRIu64 " stats (want %" PRIu64 ") -> %s\n",
                seconds_since(t1), parsed ? "yes" : "no", events, n, stats, want_stats, rt ? "OK" : "FAIL");
  }
  {
    uint64_t json_bytes = 0;
    uint64_t x = count_json_events(json_path, &json_bytes);
    bool jok = x == n;
    ok = ok && jok;
    std::printf("trace.json.gz check: %" PRIu64 " \"ph\":\"X\" events (want %" PRIu64 "), %.1f MiB uncompressed -> %s\n",
                x, n, mib(static_cast<int64_t>(json_bytes)), jok ? "OK" : "FAIL");
  }

  // Goals.
  auto peak_ratio = [&](const Row& r) { return static_cast<double>(r.hwm - rss0) / static_cast<double>(model_rss); };
  double x_rate = static_cast<double>(n) / xr.seconds, j_rate = static_cast<double>(n) / jr.seconds;
  double x_for_10m = xr.seconds * 1e7 / static_cast<double>(n);
  std::printf("\nGoals (model = %.1f MiB, peak ratio = (peak RSS - RSS before the model) / model):\n", mib(model_rss));
  std::printf("  .xplane.pb: %.3f s for %" PRIu64 " events (%.2f s per 10M), goal < 3 s per 10M: %s\n", xr.seconds, n,
              x_for_10m, x_for_10m < 3 ? "MET" : "NOT MET");
  std::printf("  .trace.json.gz: %.2f M events/s (%.2f M per CPU second), goal >= 1.5 M/s: %s\n", j_rate / 1e6,
              static_cast<double>(n) / jr.cpu / 1e6, j_rate >= 1.5e6 ? "MET" : "NOT MET");
  std::printf("  peak during .xplane.pb export: %.2fx the model (+%.1f MiB over RSS before), goal <= 2x: %s\n",
              peak_ratio(xr), mib(xr.hwm - xr.rss_before), peak_ratio(xr) <= 2 ? "MET" : "NOT MET");
  std::printf("  peak during .trace.json.gz export: %.2fx the model (+%.1f MiB over RSS before), goal <= 2x: %s\n",
              peak_ratio(jr), mib(jr.hwm - jr.rss_before), peak_ratio(jr) <= 2 ? "MET" : "NOT MET");
  if (naive) {
    std::printf("  naive generated protobuf: build+serialize %.3f s (%.1fx ours), peak %.2fx the model\n",
                nb.seconds + ns.seconds, (nb.seconds + ns.seconds) / xr.seconds,
                static_cast<double>(std::max(nb.hwm, ns.hwm) - rss0) / static_cast<double>(model_rss));
  }
  (void)x_rate;

  if (own_dir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return ok ? 0 : 1;
}
