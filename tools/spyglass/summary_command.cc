// `spyglass summary` and `spyglass diff`: thin clients of src/analysis/,
// which reads profiles through spyglass/profile_reader.h.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/cpu_summary.h"
#include "analysis/diff.h"
#include "analysis/summary.h"
#include "commands.h"
#include "common/quote.h"

namespace spyglass::cli {
namespace {

// A progress line on stderr once reading has taken a second: redrawn in
// place on a terminal, else one line per tenth.
class Progress {
 public:
  explicit Progress(std::string cmd) : cmd_(std::move(cmd)), start_(std::chrono::steady_clock::now()) {}
  ~Progress() {
    if (shown_ && tty_) std::fprintf(stderr, "\r%*s\r", 72, "");
  }
  void operator()(uint64_t done, uint64_t all) {
    if (all == 0 || std::chrono::steady_clock::now() - start_ < std::chrono::seconds(1)) return;
    int pct = static_cast<int>(done * 100 / all);
    if (!tty_ && shown_ && pct / 10 == last_ / 10) return;
    if (tty_ && pct == last_) return;
    last_ = pct;
    shown_ = true;
    std::fprintf(stderr, "%sspyglass %s: reading %d%% (%llu of %llu MiB)%s", tty_ ? "\r" : "", cmd_.c_str(), pct,
                 static_cast<unsigned long long>(done >> 20), static_cast<unsigned long long>(all >> 20),
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string cmd_;
  std::chrono::steady_clock::time_point start_;
  bool tty_ = isatty(2) != 0;
  bool shown_ = false;
  int last_ = -1;
};

// "--step 5" or "--step 3:8" (first and last step numbers, inclusive).
bool ParseSteps(const std::string& s, analysis::SummaryOptions* o) {
  if (s.empty()) return true;
  auto num = [](std::string_view v, int64_t* out) {
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
    return !v.empty() && ec == std::errc() && end == v.data() + v.size();
  };
  size_t colon = s.find(':');
  int64_t a = 0, b = 0;
  if (colon == std::string::npos) {
    if (!num(s, &a)) return false;
    o->step_first = o->step_last = a;
    return true;
  }
  std::string_view sv(s);
  if (colon > 0) {
    if (!num(sv.substr(0, colon), &a)) return false;
    o->step_first = a;
  }
  if (colon + 1 < s.size()) {
    if (!num(sv.substr(colon + 1), &b)) return false;
    o->step_last = b;
  }
  return !(o->step_first && o->step_last && *o->step_first > *o->step_last);
}

struct Filters {
  size_t top = 10;
  std::string thread, steps;
  bool json = false;
};

void AddFilters(CLI::App* cmd, Filters* f) {
  cmd->add_option("-n,--top", f->top, "rows per table (0: all)")->default_val(f->top);
  cmd->add_option("--thread", f->thread, "only threads whose name contains this, or whose id is it");
  cmd->add_option("--step", f->steps, "only step N, or steps A:B (inclusive; A: or :B open), and events inside them");
  cmd->add_flag("--json", f->json, "print JSON instead of tables");
}

bool ToOptions(const char* cmd, const Filters& f, analysis::SummaryOptions* o) {
  o->top = f.top;
  o->thread = f.thread;
  if (!ParseSteps(f.steps, o)) {
    std::cerr << "spyglass " << cmd << ": --step takes N or A:B (step numbers), not '" << f.steps.substr(0, 40)
              << "'\n";
    return false;
  }
  return true;
}

// Why --step or --thread left nothing of `run` (summarized with `o` into
// `s`), naming what there is; "" when they kept something. Read again
// without the filter, on this error path only.
std::string NothingSelected(const std::string& run, const analysis::SummaryOptions& o, const analysis::Summary& s) {
  bool no_step = (o.step_first || o.step_last) && s.steps.duration.count == 0;
  bool no_thread = !o.thread.empty() && s.threads.empty();
  if (!no_step && !no_thread) return "";
  analysis::SummaryOptions all;
  all.top = 0;
  if (!no_thread) all.thread = o.thread;
  analysis::Summary w;
  bool known = analysis::Summarize(run, all, &w).ok();
  std::string why;
  if (no_thread) {
    why = "no thread matches --thread " + QuoteInput(o.thread) + " (a part of its name, or its id)";
    if (known && !w.threads.empty()) {
      why += "; the threads:";
      size_t shown = std::min<size_t>(w.threads.size(), 12);
      for (size_t i = 0; i < shown; ++i)
        why += std::string(i ? "," : "") + " " + QuoteInput(w.threads[i].name) + " (" +
               std::to_string(w.threads[i].id) + ")";
      if (shown < w.threads.size()) why += ", and " + std::to_string(w.threads.size() - shown) + " more";
    }
    return why;
  }
  auto bound = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string(); };
  why = "no step in --step " + (o.step_first == o.step_last ? bound(o.step_first)
                                                              : bound(o.step_first) + ":" + bound(o.step_last));
  if (!known) return why;
  if (w.steps.all.empty()) return why + "; the run has no steps (no event with a step_num)";
  auto [lo, hi] = std::minmax_element(w.steps.all.begin(), w.steps.all.end(),
                                      [](const analysis::Step& a, const analysis::Step& b) { return a.number < b.number; });
  return why + "; the run has " + std::to_string(w.steps.duration.count) + " steps, numbered " +
         std::to_string(lo->number) + " to " + std::to_string(hi->number);
}

}  // namespace

void AddSummaryCommands(CLI::App& app) {
  auto* summary = app.add_subcommand(
      "summary", "Where the time went in a profile: steps, top annotations (total and self time), threads, GPU "
                 "kernels and copies, memory peaks, drops");
  static std::string run;
  static Filters sf;
  summary->add_option("run", run, "a .xplane.pb (ours or JAX's), a run folder, or a log dir (its newest run)")
      ->required();
  AddFilters(summary, &sf);
  summary->callback([] {
    analysis::SummaryOptions o;
    if (!ToOptions("summary", sf, &o)) std::exit(2);
    analysis::Summary s;
    Status st;
    {
      Progress progress("summary");
      o.progress = [&](uint64_t d, uint64_t a) { progress(d, a); };
      st = analysis::Summarize(run, o, &s);
    }
    if (!st.ok()) {
      std::string other = OtherCommandFor(run, true);
      std::cerr << "spyglass summary: " << (other.empty() ? st.message() : other) << "\n";
      std::exit(1);
    }
    if (std::string why = NothingSelected(run, o, s); !why.empty()) {
      std::cerr << "spyglass summary: " << why << "\n";
      std::exit(1);
    }
    // The CPU sampler's tables, when the run has samples: after the text
    // tables, or the JSON's "cpu".
    analysis::CpuSummary cpu;
    const bool has_cpu = analysis::SummarizeCpu(run, o.top, &cpu).ok();
    if (sf.json) std::cout << analysis::SummaryToJson(s, has_cpu ? &cpu : nullptr);
    else std::cout << analysis::SummaryToText(s) << (has_cpu ? analysis::CpuSummaryToText(cpu) : "");
  });

  auto* diff = app.add_subcommand(
      "diff", "Compare two runs: steps and annotations side by side, biggest change first, with a noise estimate; "
              "--fail-above gates CI (exit 1 on a regression, 2 on an error)");
  static std::string base, next;
  static Filters df{20};
  static double fail_above = -1;
  static std::vector<std::string> gate_annotations;
  diff->add_option("base", base, "the baseline run (file, run folder or log dir)")->required();
  diff->add_option("new", next, "the run to compare with it")->required();
  AddFilters(diff, &df);
  diff->add_option("--fail-above", fail_above,
                   "exit 1 when the mean step time, or an --annotation's time per step, grew more than PCT percent")
      ->check(CLI::Range(0.0, 1e9));
  diff->add_option("--annotation", gate_annotations, "an annotation (by name) that --fail-above also gates on")
      ->allow_extra_args(false);
  diff->callback([] {
    analysis::DiffOptions o;
    if (!ToOptions("diff", df, &o.summary)) std::exit(2);
    o.top = df.top;
    o.fail_above_pct = fail_above;
    o.annotations = gate_annotations;
    if (!gate_annotations.empty() && fail_above < 0) {
      std::cerr << "spyglass diff: --annotation needs --fail-above PCT\n";
      std::exit(2);
    }
    analysis::Diff d;
    Status st;
    {
      Progress progress("diff");
      o.summary.progress = [&](uint64_t a, uint64_t b) { progress(a, b); };
      st = analysis::DiffRuns(base, next, o, &d);
    }
    if (!st.ok()) {
      std::cerr << "spyglass diff: " << st.message() << "\n";
      std::exit(2);
    }
    for (auto [which, path, summary] : {std::tuple{"base", &base, &d.base}, std::tuple{"new", &next, &d.next}}) {
      if (std::string why = NothingSelected(*path, o.summary, *summary); !why.empty()) {
        std::cerr << "spyglass diff: the " << which << " run: " << why << "\n";
        std::exit(2);
      }
    }
    std::cout << (df.json ? analysis::DiffToJson(d) : analysis::DiffToText(d));
    if (!df.json) std::cout << analysis::CpuDiffRowsToText(d.cpu_base, d.cpu_next, d.cpu);  // DiffRuns compared them
    std::cout.flush();
    if (!d.failures.empty()) {
      // The text report lists them already; with --json, say so on stderr too.
      if (df.json)
        for (const std::string& f : d.failures) std::cerr << "spyglass diff: " << f << "\n";
      std::exit(d.gate_error ? 2 : 1);
    }
  });
}

}  // namespace spyglass::cli
