// Downstream smoke test of an installed spyglass: records a short trace,
// checks that the .xplane.pb was written, and reads it back through the
// public read API (spyglass/profile_reader.h). Exits non-zero on any failure.
//
//   app <log_dir>
#include <spyglass/profile_reader.h>
#include <spyglass/profiler.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

namespace prof = spyglass::profiler;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <log_dir>\n", argv[0]);
    return 2;
  }
  const std::string log_dir = argv[1];
  std::printf("spyglass %s\n", spyglass::version());

  if (auto s = prof::start_trace(log_dir); !s.ok()) {
    std::fprintf(stderr, "start_trace failed: %s\n", s.message().c_str());
    return 1;
  }
  for (int64_t i = 0; i < 3; ++i) {
    prof::StepTraceAnnotation step("train", i);
    prof::TraceAnnotation a("batch", {{"size", 64}, {"lr", 0.1}, {"kind", "eval"}});
    prof::TraceAnnotation b(std::string("layer ") + std::to_string(i));
  }
  if (auto s = prof::stop_trace(); !s.ok()) {
    std::fprintf(stderr, "stop_trace failed: %s\n", s.message().c_str());
    return 1;
  }

  const prof::TraceFiles files = prof::last_trace_files();
  if (files.xplane_path.empty()) {
    std::fprintf(stderr, "last_trace_files().xplane_path is empty\n");
    return 1;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(files.xplane_path, ec) ||
      std::filesystem::file_size(files.xplane_path, ec) == 0) {
    std::fprintf(stderr, "missing or empty %s\n", files.xplane_path.c_str());
    return 1;
  }
  const std::string suffix = ".xplane.pb";
  if (files.xplane_path.size() < suffix.size() ||
      files.xplane_path.compare(files.xplane_path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    std::fprintf(stderr, "unexpected xplane path %s\n", files.xplane_path.c_str());
    return 1;
  }
  const prof::TraceStats stats = prof::last_trace_stats();
  if (stats.events < 9) {
    std::fprintf(stderr, "expected >= 9 events, got %llu\n", static_cast<unsigned long long>(stats.events));
    return 1;
  }
  // Read back: the steps in one streaming pass, the host plane in the whole model.
  namespace pr = spyglass::profile;
  pr::ProfileReader reader;
  if (auto s = reader.Open(files.xplane_path); !s.ok()) {
    std::fprintf(stderr, "ProfileReader::Open failed: %s\n", s.message().c_str());
    return 1;
  }
  struct Steps : pr::ProfileVisitor {
    int steps = 0;
    void OnEvent(const pr::EventRecord& e) override {
      for (const pr::ProfileStat& st : e.stats) steps += e.name == "train" && st.name == "step_num";
    }
  } visitor;
  pr::ProfileData data;
  if (!reader.Scan(visitor).ok() || !reader.Read(&data).ok() || !data.find_plane("/host:CPU")) {
    std::fprintf(stderr, "reading %s back failed\n", files.xplane_path.c_str());
    return 1;
  }
  if (visitor.steps != 3) {
    std::fprintf(stderr, "expected 3 steps read back, got %d\n", visitor.steps);
    return 1;
  }
  std::printf("ok: %s (%llu events)\n", files.xplane_path.c_str(), static_cast<unsigned long long>(stats.events));
  return 0;
}
