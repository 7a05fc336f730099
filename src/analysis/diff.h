// Two runs compared (`spyglass diff`, spyglass.analysis.diff()): the summary
// tables side by side with their deltas, biggest change first, a noise
// estimate from the spread of step times, and the --fail-above gate.
#pragma once

#include <string>
#include <vector>

#include "analysis/cpu_summary.h"
#include "analysis/summary.h"

namespace spyglass::analysis {

struct DiffOptions {
  size_t top = 20;  // rows per table (0: all)
  // The gate: a regression above this many percent fails (< 0: no gate).
  double fail_above_pct = -1;
  // Gate on these annotations (by name, over all threads) too.
  std::vector<std::string> annotations;
  SummaryOptions summary;  // filters applied to both runs (its `top` is ignored)
};

struct DiffRow {
  std::string name;
  std::string kind;  // "step", "annotation", "self", "kernel", "copy", "counter"
  uint64_t base_count = 0, new_count = 0;
  double base_ns = 0, new_ns = 0;  // per step when both runs have steps
  double delta_ns = 0;
  double delta_pct = 0;     // (new - base) / base * 100; 100 when new only
  bool within_noise = false;
  bool bytes = false;  // counters: the values are bytes
};

struct Diff {
  Summary base, next;
  bool per_step = false;      // annotation times are per step (both runs have steps)
  double noise_pct = -1;      // the step mean's standard error, both runs (-1: unknown)
  std::vector<DiffRow> steps;  // mean, p50, p90, p99, max
  std::vector<DiffRow> annotations, self, kernels, copies;  // by |delta_ns|
  // Counter peaks (kind "counter"): base_ns and new_ns hold the peaks, in
  // the counter's unit (bytes for live memory), not per step.
  std::vector<DiffRow> counters;
  std::vector<std::string> failures;  // the gate's findings; empty: passed
  bool gate_error = false;            // nothing to gate on (no steps, no annotation)
  // CPU time by function (the CPU sampler's samples, over the whole runs:
  // the thread and step filters do not apply), both runs' tables (their
  // scopes cut to `top` rows) and the functions compared (CompareCpu).
  CpuSummary cpu_base, cpu_next;
  std::vector<CpuDiffRow> cpu;
};

// Summarizes both runs and compares them.
Status DiffRuns(const std::string& base, const std::string& next, const DiffOptions& options, Diff* out);
// Compares two summaries made with top = 0 (all rows).
Diff CompareSummaries(Summary base, Summary next, const DiffOptions& options);

std::string DiffToJson(const Diff& diff);
std::string DiffToText(const Diff& diff, size_t width = 100);

}  // namespace spyglass::analysis
