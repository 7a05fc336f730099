// `spyglass report RUN -o report.html`: one self-contained HTML page of a
// run (src/report/report.h): the events through spyglass/profile_reader.h,
// the tables from src/analysis/.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "commands.h"
#include "export/output_file.h"
#include "memory/pprof.h"
#include "memory/timeline.h"
#include "analysis/summary.h"
#include "report/report.h"
#include "spyglass/profile_reader.h"

namespace spyglass::cli {
namespace {

report::FlameOptions flame_options;

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

// memory.*<suffix> (.prof, .timeline.tsv) in the run folder, in the log dir above it, and in RUN.
std::vector<std::string> NearbyMemoryProfiles(const std::string& run, const std::string& first_file,
                                              const std::string& suffix = ".prof",
                                              const std::string& prefix = "memory.") {
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
      if (name.starts_with(prefix) && name.ends_with(suffix) && e.is_regular_file(ec))
        found.insert(e.path().string());
    }
  }
  return {found.begin(), found.end()};
}

constexpr size_t kMaxNearbyProfiles = 16;

}  // namespace

// What the report page shows besides the timeline, read beside the run.
bool AddRunPanels(const std::string& command, const std::string& run, const std::string& first_file,
                  const std::vector<std::string>& memory_files, const report::FlameOptions& options,
                  report::ReportInput* in, const std::function<void(const std::string&)>& progress) {
  if (in->summary_json.empty()) {  // (spyglass view may have it from its cache)
    progress("summarizing " + run);
    analysis::SummaryOptions summary_options;
    summary_options.top = 20;
    analysis::Summary summary;
    if (Status s = analysis::Summarize(run, summary_options, &summary); !s.ok()) {
      std::cerr << command << ": " << s.message() << "\n";
      return false;
    }
    in->summary_json = analysis::SummaryToJson(summary);
  }

  // Memory profiles: those named must read; those found nearby are shown if they do.
  std::vector<std::pair<std::string, bool>> profiles;
  for (const std::string& m : memory_files) profiles.emplace_back(m, true);
  if (memory_files.empty()) {
    std::vector<std::string> nearby = NearbyMemoryProfiles(run, first_file);
    if (nearby.size() > kMaxNearbyProfiles) {
      in->notes.push_back(std::to_string(nearby.size()) + " memory profiles found; the last " +
                         std::to_string(kMaxNearbyProfiles) + " are shown (choose with --memory)");
      nearby.erase(nearby.begin(), nearby.end() - kMaxNearbyProfiles);
    }
    for (const std::string& m : nearby) profiles.emplace_back(m, false);
  }
  for (const auto& [path, required] : profiles) {
    progress("reading " + path);
    memory::PprofProfile p;
    if (Status s = memory::ReadPprofFile(path, &p); !s.ok()) {
      if (required) {
        std::cerr << command << ": " << s.message() << "\n";
        return false;
      }
      in->notes.push_back("memory profile left out: " + s.message());
      continue;
    }
    in->flames.push_back(report::BuildFlameGraph(p, fs::path(path).filename().string(), options));
  }

  // The CPU sampler's profiles beside the run (spyglass run --sample).
  {
    std::vector<std::string> cpu = NearbyMemoryProfiles(run, first_file, ".prof", "cpu.");
    if (cpu.size() > kMaxNearbyProfiles) cpu.erase(cpu.begin(), cpu.end() - kMaxNearbyProfiles);
    for (const std::string& path : cpu) {
      progress("reading " + path);
      memory::PprofProfile p;
      if (Status s = memory::ReadPprofFile(path, &p); !s.ok()) {
        in->notes.push_back("CPU profile left out: " + s.message());
        continue;
      }
      in->cpu_flames.push_back(report::BuildCpuFlameGraph(p, fs::path(path).filename().string(), options));
    }
  }

  // Memory over time beside the profiles (what a range of it held).
  if (memory_files.empty()) {
    std::vector<std::string> series = NearbyMemoryProfiles(run, first_file, ".timeline.tsv");
    if (series.size() > kMaxNearbyProfiles) series.erase(series.begin(), series.end() - kMaxNearbyProfiles);
    for (const std::string& path : series) {
      memory::Timeline m;
      if (Status s = memory::ReadTimelineFile(path, &m); !s.ok()) {
        in->notes.push_back("memory timeline left out: " + s.message());
        continue;
      }
      in->memory_timelines.emplace_back(fs::path(path).filename().string(), std::move(m));
    }
  }

  return true;
}

namespace {

uint64_t max_page_bytes = report::kMaxPageBytes;

int RunReport(const std::string& run, const std::string& output, const std::vector<std::string>& memory_files) {
  Progress progress;
  std::vector<std::string> files;
  if (Status s = profile::FindProfileFiles(run, &files); !s.ok()) {
    std::cerr << "spyglass report: " << s.message() << "\n";
    return 1;
  }
  report::ReportInput in;
  in.title = run;
  report::TimelineBuilder timeline;
  for (const std::string& f : files) {
    progress.Set("reading the events of " + f);
    // Several files (hosts) of one run: their planes named after the file.
    std::string host;
    if (files.size() > 1) {
      host = fs::path(f).filename().string();
      host = host.substr(0, host.rfind(".xplane.pb"));
    }
    uint64_t sample_lines = 0;
    if (Status s = report::AddProfileFile(f, host, &timeline, &sample_lines); !s.ok()) {
      std::cerr << "spyglass report: " << s.message() << "\n";
      return 1;
    }
    // The CPU sampler's lines, from the whole model of a file that has
    // them: on the timeline named after their functions, and with their
    // stacks for the flame graph of a selected range.
    if (sample_lines > 0) {
      progress.Set("reading the CPU samples of " + f);
      if (Status s = report::AddCpuSamples(f, host, &timeline, &in.cpu_samples); !s.ok()) {
        std::cerr << "spyglass report: " << s.message() << "\n";
        return 1;
      }
    }
  }
  in.timeline = timeline.Finish();
  if (!AddRunPanels("spyglass report", run, files.front(), memory_files, flame_options, &in,
                    [&progress](const std::string& what) { progress.Set(what); }))
    return 1;

  progress.Set("writing " + output);
  in.max_page_bytes = max_page_bytes;
  std::string html = report::RenderReport(in);
  if (Status s = exporter::WriteOutputBytes(output, html); !s.ok()) {
    std::cerr << "spyglass report: " << s.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << output << " (" << memory::HumanBytes(static_cast<int64_t>(html.size())) << "): "
            << in.timeline.events << " events on " << in.timeline.tracks.size() << " threads, "
            << in.timeline.counters.size() << " counter" << (in.timeline.counters.size() == 1 ? "" : "s") << ", "
            << in.flames.size() << " memory profile" << (in.flames.size() == 1 ? "" : "s") << ", " << in.cpu_flames.size()
            << " CPU profile" << (in.cpu_flames.size() == 1 ? "" : "s") << "\n";
  if (in.timeline.coarsened_lanes || in.timeline.coarsened_counters)
    std::cout << "  coarsened to fit " << memory::HumanBytes(static_cast<int64_t>(max_page_bytes)) << ": "
              << in.timeline.coarsened_events << " events of " << in.timeline.coarsened_lanes
              << " lanes shown merged (the page says so; spyglass summary has them all)\n";
  return 0;
}

}  // namespace

void AddReportCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "One self-contained HTML page of a run: step times, summary, a zoomable timeline, CPU and memory flame graphs");
  static std::string run, output;
  static std::vector<std::string> memory_files;
  cmd->add_option("run", run, "a run folder, a log dir (its newest run) or one .xplane.pb (Spyglass's or JAX's)")
      ->required();
  cmd->add_option("-o,--output", output, "the HTML file to write")->required();
  cmd->add_option("--memory", memory_files,
                  "memory profile(s) (.prof, pprof) to show as flame graphs; default: memory.*.prof in the run "
                  "folder and its log dir");
  cmd->add_option("--max-bytes", max_page_bytes,
                  "the page's budget: past it, the timeline's finest detail is merged where it takes the most bytes "
                  "(the page says what)")
      ->default_val(report::kMaxPageBytes)
      ->check(CLI::Range(uint64_t{10000}, uint64_t{1} << 40));
  static bool all_frames = false;
  cmd->add_flag("--all-frames", all_frames,
                "keep the interpreter's and the import system's frames in a Python program's flame graphs "
                "(folded away by default)");
  cmd->callback([] {
    flame_options.fold_interpreter = !all_frames;
    std::exit(RunReport(run, output, memory_files));
  });
}

}  // namespace spyglass::cli
