// Helpers shared by the tests: temp dirs, reading our files back with the
// generated protobuf classes and zlib.
#pragma once

#include <zlib.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "xplane.pb.h"

namespace spyglass::testing {

namespace fs = std::filesystem;

// Temporary directories of this test process, removed when it exits.
inline std::vector<std::string>& TempDirs() {
  static auto* dirs = new std::vector<std::string>;
  return *dirs;
}

inline std::string MakeTempDir(const std::string& prefix = "spyglass-test") {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) return {};
  static const pid_t owner = getpid();
  if (TempDirs().empty())
    atexit([] {
      if (getpid() != owner) return;  // a forked child must not remove the parent's dirs
      std::error_code ec;
      for (const auto& d : TempDirs()) {
        fs::permissions(d, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(d, ec);
      }
    });
  TempDirs().push_back(p);
  return p;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline std::string ReadGzip(const std::string& path) {
  std::string out;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

inline tensorflow::profiler::XSpace ReadXSpace(const std::string& path) {
  tensorflow::profiler::XSpace space;
  std::string bytes = ReadFile(path);
  if (!space.ParseFromString(bytes)) space.add_errors("test: parse failed");
  return space;
}

inline const tensorflow::profiler::XPlane* FindPlane(const tensorflow::profiler::XSpace& s, const std::string& name) {
  for (const auto& p : s.planes())
    if (p.name() == name) return &p;
  return nullptr;
}

// An event of a plane, flattened for assertions.
struct FlatEvent {
  std::string name;
  int64_t line_id;
  std::string line_name;
  int64_t start_ps;
  int64_t duration_ps;
  std::map<std::string, std::string> stats;  // value as text
  std::map<std::string, int> stat_case;      // XStat::value_case
};

inline std::string StatText(const tensorflow::profiler::XPlane& p, const tensorflow::profiler::XStat& s) {
  switch (s.value_case()) {
    case tensorflow::profiler::XStat::kInt64Value: return std::to_string(s.int64_value());
    case tensorflow::profiler::XStat::kUint64Value: return std::to_string(s.uint64_value());
    case tensorflow::profiler::XStat::kDoubleValue: return std::to_string(s.double_value());
    case tensorflow::profiler::XStat::kStrValue: return s.str_value();
    case tensorflow::profiler::XStat::kBytesValue: return s.bytes_value();
    case tensorflow::profiler::XStat::kRefValue: return p.stat_metadata().at(s.ref_value()).name();
    default: return "";
  }
}

inline std::vector<FlatEvent> Events(const tensorflow::profiler::XPlane& p) {
  std::vector<FlatEvent> out;
  for (const auto& l : p.lines())
    for (const auto& e : l.events()) {
      FlatEvent f{p.event_metadata().at(e.metadata_id()).name(), l.id(), l.name(),
                  l.timestamp_ns() * 1000 + e.offset_ps(), e.duration_ps(), {}, {}};
      for (const auto& s : e.stats()) {
        const std::string& key = p.stat_metadata().at(s.metadata_id()).name();
        f.stats[key] = StatText(p, s);
        f.stat_case[key] = s.value_case();
      }
      out.push_back(f);
    }
  return out;
}

inline std::map<std::string, std::string> PlaneStats(const tensorflow::profiler::XPlane& p) {
  std::map<std::string, std::string> out;
  for (const auto& s : p.stats()) out[p.stat_metadata().at(s.metadata_id()).name()] = StatText(p, s);
  return out;
}

}  // namespace spyglass::testing
