// `spyglass report RUN -o report.html`: one self-contained HTML page of a
// run (src/report/report.h), its summary from src/analysis/.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "commands.h"
#include "common/quote.h"
#include "export/output_file.h"
#include "memory/pprof.h"
#include "model/schema.h"
#include "model/xspace_import_chunked.h"
#include "report/report.h"

namespace spyglass::cli {
namespace {

namespace fs = std::filesystem;

// What is being done, on stderr once the command has taken more than a
// second, then every few seconds while it lasts.
class Progress {
 public:
  Progress() : thread_([this] { Loop(); }) {}
  ~Progress() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Set(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = std::move(what);
    changed_ = true;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    std::chrono::milliseconds wait(1000);
    while (!cv_.wait_for(lock, wait, [this] { return done_; })) {
      if (changed_) std::cerr << "spyglass report: " << what_ << "\n";
      changed_ = false;
      wait = std::chrono::milliseconds(500);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::string what_ = "starting";
  bool changed_ = true, done_ = false;
  std::thread thread_;
};

// The .xplane.pb files RUN names: the file, a run folder's files, or the
// newest run of a log dir.
Status FindRunFiles(const std::string& run, std::vector<std::string>* files) {
  std::error_code ec;
  fs::path p(run);
  if (!fs::exists(p, ec)) return NotFoundError("no such file or directory: " + QuoteInput(run));
  if (!fs::is_directory(p, ec)) {
    files->push_back(run);
    return Status::Ok();
  }
  auto pbs_in = [&](const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().string().ends_with(".xplane.pb")) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  *files = pbs_in(p);
  if (!files->empty()) return Status::Ok();
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(p / "plugins" / "profile", ec))
    if (e.is_directory(ec)) runs.push_back(e.path());
  std::sort(runs.begin(), runs.end());
  for (auto it = runs.rbegin(); it != runs.rend() && files->empty(); ++it) *files = pbs_in(*it);
  if (files->empty()) return NotFoundError("no .xplane.pb in " + QuoteInput(run) + " nor in a run under it");
  return Status::Ok();
}

// memory.*.prof in the run folder, in the log dir above it, and in RUN.
std::vector<std::string> NearbyMemoryProfiles(const std::string& run, const std::string& first_file) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  fs::path run_dir = fs::path(first_file).parent_path();
  dirs.push_back(run_dir);
  fs::path abs = fs::absolute(run_dir, ec);
  if (abs.parent_path().filename() == "profile" && abs.parent_path().parent_path().filename() == "plugins")
    dirs.push_back(abs.parent_path().parent_path().parent_path());
  if (fs::is_directory(run, ec)) dirs.push_back(run);
  std::set<std::string> seen, found;
  for (const fs::path& d : dirs) {
    if (!seen.insert(fs::weakly_canonical(d, ec).string()).second) continue;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      std::string name = e.path().filename().string();
      if (name.starts_with("memory.") && name.ends_with(".prof") && e.is_regular_file(ec))
        found.insert(e.path().string());
    }
  }
  return {found.begin(), found.end()};
}

constexpr size_t kMaxNearbyProfiles = 16;

int RunReport(const std::string& run, const std::string& output, const std::vector<std::string>& memory_files) {
  Progress progress;
  std::vector<std::string> files;
  if (Status s = FindRunFiles(run, &files); !s.ok()) {
    std::cerr << "spyglass report: " << s.message() << "\n";
    return 1;
  }
  report::ReportInput in;
  in.title = run;
  report::TimelineBuilder timeline;
  for (const std::string& f : files) {
    progress.Set("reading " + f);
    std::ifstream is(f, std::ios::binary);
    std::stringstream buf;
    buf << is.rdbuf();
    model::Space space;
    if (Status s = model::ImportXSpaceBytesChunked(buf.str(), &space); !s.ok()) {
      std::cerr << "spyglass report: " << f << ": " << s.message() << "\n";
      return 1;
    }
    progress.Set("laying out the timeline of " + f);
    for (const model::Plane& p : space.planes)
      for (const model::Line& l : p.lines) {
        if (l.name == model::kCounterLineName) continue;
        timeline.BeginLine(p.name, l.display_name.empty() ? l.name : l.display_name);
        for (const model::Event& e : l.events) {
          const auto& m = p.event_metadata()[e.metadata_id < p.event_metadata().size() ? e.metadata_id : 0];
          timeline.AddEvent(m.display_name.empty() ? m.name : m.display_name, l.timestamp_ns * 1000 + e.offset_ps,
                            e.duration_ps);
        }
        timeline.EndLine();
      }
  }
  in.timeline = timeline.Finish();

  // Memory profiles: those named must read; those found nearby are shown if they do.
  std::vector<std::pair<std::string, bool>> profiles;
  for (const std::string& m : memory_files) profiles.emplace_back(m, true);
  if (memory_files.empty()) {
    std::vector<std::string> nearby = NearbyMemoryProfiles(run, files.front());
    if (nearby.size() > kMaxNearbyProfiles) {
      in.notes.push_back(std::to_string(nearby.size()) + " memory profiles found; the last " +
                         std::to_string(kMaxNearbyProfiles) + " are shown (choose with --memory)");
      nearby.erase(nearby.begin(), nearby.end() - kMaxNearbyProfiles);
    }
    for (const std::string& m : nearby) profiles.emplace_back(m, false);
  }
  for (const auto& [path, required] : profiles) {
    progress.Set("reading " + path);
    memory::PprofProfile p;
    if (Status s = memory::ReadPprofFile(path, &p); !s.ok()) {
      if (required) {
        std::cerr << "spyglass report: " << s.message() << "\n";
        return 1;
      }
      in.notes.push_back("memory profile left out: " + s.message());
      continue;
    }
    in.flames.push_back(report::BuildFlameGraph(p, fs::path(path).filename().string()));
  }

  progress.Set("writing " + output);
  std::string html = report::RenderReport(in);
  if (Status s = exporter::WriteOutputBytes(output, html); !s.ok()) {
    std::cerr << "spyglass report: " << s.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << output << " (" << memory::HumanBytes(static_cast<int64_t>(html.size())) << "): "
            << in.timeline.events << " events on " << in.timeline.tracks.size() << " threads, "
            << in.flames.size() << " memory profile" << (in.flames.size() == 1 ? "" : "s") << "\n";
  return 0;
}

}  // namespace

void AddReportCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "One self-contained HTML page of a run: step times, summary, a zoomable timeline and memory flame graphs");
  static std::string run, output;
  static std::vector<std::string> memory_files;
  cmd->add_option("run", run, "a run folder, a log dir (its newest run) or one .xplane.pb (Spyglass's or JAX's)")
      ->required();
  cmd->add_option("-o,--output", output, "the HTML file to write")->required();
  cmd->add_option("--memory", memory_files,
                  "memory profile(s) (.prof, pprof) to show as flame graphs; default: memory.*.prof in the run "
                  "folder and its log dir");
  cmd->callback([] { std::exit(RunReport(run, output, memory_files)); });
}

}  // namespace spyglass::cli
