// The pprof writer and reader (src/memory/pprof*.cc, protobuf wire format by
// hand) next to pprof's generated profile.proto code, on one large memory
// profile and on a hostile one.
//
//   build/bench/pprof_bench [--samples N] [--functions F] [--rounds R]
//
// Profile: N samples (default 200,000) with 16- to 64-frame stacks over F
// functions and locations (default 20,000; one line each, every 8th location
// with a second, inlined line), labels kind and device.
//   write    ours: EncodePprofGz; generated: build perftools::profiles::Profile
//            from the same data, SerializeToString, the same gzip (level 6).
//   floors   gzip alone and gunzip alone of the same serialized bytes.
//   read     ours: ParsePprof, then every sample's stack resolved to names (as
//            memtop does); generated: the same gunzip, ParseFromString, id
//            maps, the same resolution.
//   hostile  one 1 MiB name referenced by 20,000 functions, locations and
//            labels (profile_reader_hostile_test's file), both readers.
//   bomb     --empty-mib M (default 32) of empty samples (2 bytes each on the
//            wire, ~0.1% of that gzipped): what parsing them builds, with our
//            reader's default budget (1 GiB) and without one.
// Each step runs R times (default 5): best and median seconds. Memory: VmHWM
// after the step minus VmRSS before it, the high-water mark being reset by
// writing "5" to /proc/self/clear_refs (median over rounds). Equivalence is
// checked: the generated parser reads our output with the same samples and
// values, and our reader reads the generated writer's output with the same
// stacks of names.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "process_memory.h"
#include "common/gzip.h"
#include "memory/pprof.h"
#include "profile.pb.h"

namespace mem = spyglass::memory;
namespace pb = perftools::profiles;

namespace {

using spyglass::testing::Mib;
using spyglass::testing::PeakBytes;
using spyglass::testing::ResetPeak;
using spyglass::testing::RssBytes;

struct Figures {
  std::vector<double> secs;
  std::vector<int64_t> peaks;
};
// Runs `step` `rounds` times; the step returns a checksum that is printed so
// that nothing is optimized away.
Figures Measure(int rounds, const std::function<uint64_t()>& step, uint64_t* check) {
  Figures f;
  for (int r = 0; r < rounds; ++r) {
    malloc_trim(0);  // what earlier rounds freed leaves the RSS, so that the peak is this round's
    ResetPeak();
    int64_t before = RssBytes();
    auto t0 = std::chrono::steady_clock::now();
    *check = step();
    f.secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    f.peaks.push_back(PeakBytes() - before);
  }
  return f;
}
template <class T>
T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
void Row(const char* name, const Figures& f, size_t bytes, uint64_t check) {
  std::printf("  %-44s %8.3f %8.3f %10.1f %10.1f   %016llx\n", name, *std::min_element(f.secs.begin(), f.secs.end()),
              Median(f.secs), Mib(Median(f.peaks)), Mib(static_cast<int64_t>(bytes)),
              static_cast<unsigned long long>(check));
}

mem::ProfileData MakeProfile(size_t samples, size_t functions) {
  std::mt19937_64 rng(42);
  mem::ProfileData d;
  const char* modules[] = {"jax::interpreters", "xla::cpu::runtime", "tensorflow::core", "absl::container",
                           "std::vector", "spyglass::model", "torch::autograd", "numpy::core"};
  for (size_t i = 0; i < functions; ++i) {
    mem::ProfileFunction f;
    f.name = std::string(modules[i % 8]) + "::Function" + std::to_string(i) + "(int, const Buffer&)";
    f.system_name = f.name;
    f.filename = "/src/" + std::string(modules[(i / 8) % 8]) + "/file_" + std::to_string(i % 500) + ".cc";
    f.start_line = static_cast<int64_t>(i % 3000);
    d.functions.push_back(std::move(f));
  }
  for (size_t i = 0; i < functions; ++i) {
    mem::ProfileLocation l;
    l.address = 0x400000 + i * 64;
    l.lines.push_back({i + 1, static_cast<int64_t>(10 + i % 900)});
    if (i % 8 == 0) l.lines.push_back({(i * 7) % functions + 1, static_cast<int64_t>(20 + i % 700)});
    d.locations.push_back(std::move(l));
  }
  const char* kinds[] = {"buffer", "executable", "host", "unknown"};
  const char* devices[] = {"TFRT_CPU_0", "cuda:0", "cuda:1", "tpu:0"};
  for (size_t i = 0; i < samples; ++i) {
    mem::ProfileSample s;
    size_t depth = 16 + rng() % 49;
    for (size_t k = 0; k < depth; ++k) s.location_ids.push_back(rng() % functions + 1);
    s.count = static_cast<int64_t>(1 + rng() % 100);
    s.bytes = static_cast<int64_t>(rng() % (1 << 24));
    s.kind = kinds[rng() % 4];
    s.device = devices[rng() % 4];
    d.samples.push_back(std::move(s));
  }
  return d;
}

// The generated writer: the same Profile our writer encodes.
std::string GeneratedPprofGz(const mem::ProfileData& d) {
  pb::Profile p;
  std::unordered_map<std::string, int64_t> ids;
  auto index = [&](const std::string& s) {
    auto [it, inserted] = ids.emplace(s, p.string_table_size());
    if (inserted) p.add_string_table(s);
    return it->second;
  };
  index("");
  for (auto [type, unit] : {std::pair<std::string, std::string>{"allocations", "count"}, {"space", "bytes"}}) {
    pb::ValueType* vt = p.add_sample_type();
    vt->set_type(index(type));
    vt->set_unit(index(unit));
  }
  const int64_t kind_key = index("kind"), device_key = index("device");
  for (const mem::ProfileSample& s : d.samples) {
    pb::Sample* m = p.add_sample();
    m->mutable_location_id()->Add(s.location_ids.begin(), s.location_ids.end());
    m->add_value(s.count);
    m->add_value(s.bytes);
    for (auto [key, value] : {std::pair{kind_key, &s.kind}, std::pair{device_key, &s.device}}) {
      if (value->empty()) continue;
      pb::Label* l = m->add_label();
      l->set_key(key);
      l->set_str(index(*value));
    }
  }
  for (size_t i = 0; i < d.locations.size(); ++i) {
    pb::Location* l = p.add_location();
    l->set_id(i + 1);
    l->set_address(d.locations[i].address);
    for (const mem::ProfileLine& line : d.locations[i].lines) {
      pb::Line* m = l->add_line();
      m->set_function_id(line.function_id);
      m->set_line(line.line);
    }
  }
  for (size_t i = 0; i < d.functions.size(); ++i) {
    const mem::ProfileFunction& f = d.functions[i];
    pb::Function* m = p.add_function();
    m->set_id(i + 1);
    m->set_name(index(f.name));
    m->set_system_name(index(f.system_name));
    m->set_filename(index(f.filename));
    m->set_start_line(f.start_line);
  }
  p.set_time_nanos(d.time_nanos);
  std::string out;
  p.SerializeToString(&out);
  return spyglass::GzipCompress(out, 6);
}

// Touches a resolved name (its size and ends: hashing 1 MiB names 40,000
// times would measure the hash).
uint64_t Mix(uint64_t h, std::string_view s) {
  uint64_t v = s.size();
  if (!s.empty()) v = v * 131 + static_cast<unsigned char>(s.front()) * 31 + static_cast<unsigned char>(s.back());
  return (h ^ v) * 0x100000001b3ull;
}

// Our reader, then every stack resolved to names.
uint64_t ReadOurs(const std::string& gz, mem::PprofProfile* keep = nullptr) {
  mem::PprofProfile p;
  spyglass::Status s = mem::ParsePprof(gz, &p);
  if (!s.ok()) {
    std::printf("our reader failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  uint64_t h = p.samples.size();
  for (const mem::PprofSample& sm : p.samples) {
    for (const mem::PprofFrame& f : sm.frames) h = Mix(Mix(h, f.function), f.file) + static_cast<uint64_t>(f.line);
    for (int64_t v : sm.values) h += static_cast<uint64_t>(v);
  }
  if (keep) *keep = std::move(p);
  return h;
}

// The generated reader with the same resolution (names as views into the
// parsed string table, inlined lines expanded innermost first).
uint64_t ReadGenerated(const std::string& gz, pb::Profile* keep = nullptr) {
  std::string raw;
  if (spyglass::GzipDecompress(gz, size_t{4} << 30, &raw) != spyglass::GunzipResult::kOk) std::exit(1);
  pb::Profile p;
  if (!p.ParseFromString(raw)) {
    std::printf("generated parser failed\n");
    std::exit(1);
  }
  raw = std::string();
  const auto& st = p.string_table();
  auto str = [&](int64_t i) -> std::string_view {
    return i >= 0 && i < st.size() ? std::string_view(st.Get(static_cast<int>(i))) : std::string_view();
  };
  std::unordered_map<uint64_t, const pb::Function*> functions;
  std::unordered_map<uint64_t, const pb::Location*> locations;
  for (const pb::Function& f : p.function()) functions[f.id()] = &f;
  for (const pb::Location& l : p.location()) locations[l.id()] = &l;
  uint64_t h = static_cast<uint64_t>(p.sample_size());
  for (const pb::Sample& sm : p.sample()) {
    for (uint64_t id : sm.location_id()) {
      auto l = locations.find(id);
      if (l == locations.end()) std::exit(1);
      for (const pb::Line& line : l->second->line()) {
        auto f = functions.find(line.function_id());
        if (f == functions.end()) std::exit(1);
        h = Mix(Mix(h, str(f->second->name())), str(f->second->filename())) + static_cast<uint64_t>(line.line());
      }
    }
    for (int64_t v : sm.value()) h += static_cast<uint64_t>(v);
  }
  if (keep) *keep = std::move(p);
  return h;
}

// profile_reader_hostile_test's file: one 1 MiB name (index 5) as the name
// and file of `refs` functions, one location and sample each, and as a label value.
std::string HugeNameProfile(int refs) {
  pb::Profile p;
  for (const char* s : {"", "allocations", "count", "space", "bytes"}) p.add_string_table(s);
  p.add_string_table(std::string(1 << 20, 'A'));
  p.add_string_table("kind");
  for (int t : {1, 3}) {
    pb::ValueType* vt = p.add_sample_type();
    vt->set_type(t);
    vt->set_unit(t + 1);
  }
  for (int i = 1; i <= refs; ++i) {
    pb::Function* f = p.add_function();
    f->set_id(i);
    f->set_name(5);
    f->set_filename(5);
    pb::Location* l = p.add_location();
    l->set_id(i);
    pb::Line* line = l->add_line();
    line->set_function_id(i);
    line->set_line(7);
    pb::Sample* s = p.add_sample();
    s->add_location_id(i);
    s->add_value(1);
    s->add_value(1000);
    pb::Label* lb = s->add_label();
    lb->set_key(6);
    lb->set_str(5);
  }
  std::string out;
  p.SerializeToString(&out);
  return spyglass::GzipCompress(out, 9);
}

// `mib` MiB of empty samples after an empty string table entry.
std::string EmptySamples(size_t mib) {
  std::string raw("\x32\x00", 2);
  raw.reserve(mib << 20);
  while (raw.size() < (mib << 20)) raw.append("\x12\x00", 2);
  return spyglass::GzipCompress(raw, 9);
}

// The generated parser alone (no resolution: the samples are empty).
uint64_t ParseGenerated(const std::string& gz) {
  std::string raw;
  if (spyglass::GzipDecompress(gz, size_t{4} << 30, &raw) != spyglass::GunzipResult::kOk) std::exit(1);
  pb::Profile p;
  if (!p.ParseFromString(raw)) return 0;
  return static_cast<uint64_t>(p.sample_size());
}

}  // namespace

int main(int argc, char** argv) {
  size_t samples = 200000, functions = 20000;
  int rounds = 5;
  size_t empty_mib = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--samples") samples = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--functions") functions = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--empty-mib") empty_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  if (!ResetPeak()) std::printf("warning: cannot write /proc/self/clear_refs; peaks are process-lifetime peaks\n");
  const mem::ProfileData data = MakeProfile(samples, functions);
  size_t frames = 0;
  for (const mem::ProfileSample& s : data.samples) frames += s.location_ids.size();
  std::printf("pprof: %zu samples, %zu functions/locations, %zu stack entries; %d rounds\n", samples, functions, frames,
              rounds);
  std::printf("  %-44s %8s %8s %10s %10s   %s\n", "step", "best s", "median s", "peak MiB", "out MiB", "check");

  std::string ours_gz, gen_gz;
  uint64_t c;
  Figures f = Measure(rounds, [&] { ours_gz = mem::EncodePprofGz(data, 6); return ours_gz.size(); }, &c);
  Row("write ours (EncodePprofGz, gzip 6)", f, ours_gz.size(), c);
  f = Measure(rounds, [&] { gen_gz = GeneratedPprofGz(data); return gen_gz.size(); }, &c);
  Row("write generated (build+Serialize+gzip 6)", f, gen_gz.size(), c);
  size_t raw_size = 0;
  f = Measure(rounds, [&] {
    std::string raw;
    spyglass::GzipDecompress(ours_gz, size_t{4} << 30, &raw);
    return raw_size = raw.size();
  }, &c);
  Row("floor: gunzip alone", f, raw_size, c);
  {
    std::string raw;
    spyglass::GzipDecompress(ours_gz, size_t{4} << 30, &raw);
    f = Measure(rounds, [&] { return spyglass::GzipCompress(raw, 6).size(); }, &c);
  }
  Row("floor: gzip 6 alone (of the same bytes)", f, c, c);
  uint64_t ours_check = 0, gen_check = 0;
  f = Measure(rounds, [&] { return ReadOurs(ours_gz); }, &ours_check);
  Row("read ours (ParsePprof + names)", f, 0, ours_check);
  f = Measure(rounds, [&] { return ReadGenerated(ours_gz); }, &gen_check);
  Row("read generated (gunzip+Parse+maps+names)", f, 0, gen_check);

  // Equivalence both ways.
  bool same = ours_check == gen_check;
  pb::Profile g;
  ReadGenerated(ours_gz, &g);
  same = same && static_cast<size_t>(g.sample_size()) == data.samples.size();
  for (size_t i = 0; same && i < data.samples.size(); ++i) {
    const pb::Sample& s = g.sample(static_cast<int>(i));
    same = s.value_size() == 2 && s.value(0) == data.samples[i].count && s.value(1) == data.samples[i].bytes &&
           std::equal(s.location_id().begin(), s.location_id().end(), data.samples[i].location_ids.begin(),
                      data.samples[i].location_ids.end());
  }
  mem::PprofProfile a, b;
  ReadOurs(ours_gz, &a);
  ReadOurs(gen_gz, &b);
  same = same && a.samples.size() == b.samples.size();
  for (size_t i = 0; same && i < a.samples.size(); ++i) {
    const mem::PprofSample &x = a.samples[i], &y = b.samples[i];
    same = x.values == y.values && x.labels == y.labels && x.frames.size() == y.frames.size();
    for (size_t k = 0; same && k < x.frames.size(); ++k)
      same = x.frames[k].function == y.frames[k].function && x.frames[k].file == y.frames[k].file &&
             x.frames[k].line == y.frames[k].line;
  }
  std::printf("  equivalence (generated reads ours; ours reads generated's): %s\n", same ? "same" : "DIFFERENT");
  g.Clear();
  a = {};
  b = {};

  const std::string huge = HugeNameProfile(20000);
  std::printf("hostile: 1 MiB name x 20,000 references (%.2f MiB gzipped)\n", Mib(static_cast<int64_t>(huge.size())));
  f = Measure(rounds, [&] { return ReadOurs(huge); }, &c);
  Row("read ours (ParsePprof + names)", f, 0, c);
  f = Measure(rounds, [&] { return ReadGenerated(huge); }, &c);
  Row("read generated (gunzip+Parse+maps+names)", f, 0, c);

  const std::string empty = EmptySamples(empty_mib);
  std::printf("bomb: %zu MiB of empty samples (%zu M samples, %.2f MiB gzipped)\n", empty_mib, (empty_mib << 20) / 2 >> 20,
              Mib(static_cast<int64_t>(empty.size())));
  std::string error;
  f = Measure(rounds, [&] {
    mem::PprofProfile p;
    spyglass::Status s = mem::ParsePprof(empty, &p);
    error = s.ok() ? "accepted" : s.message().substr(0, 90);
    return p.samples.size();
  }, &c);
  Row("read ours (default budget)", f, 0, c);
  std::printf("    -> %s\n", error.c_str());
  f = Measure(rounds, [&] { return ParseGenerated(empty); }, &c);
  Row("read generated (gunzip+ParseFromString)", f, 0, c);
  return same ? 0 : 1;
}
