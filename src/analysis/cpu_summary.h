// Where the CPU time went, from the CPU sampler's samples of a run (the
// "CPU samples" lines of its host planes, sampling/cpu_model.h): the top
// functions by self CPU time (the sample's innermost frame) and by total CPU
// time (anywhere on the sample's stack), over all threads, per thread and
// per step (the step, StepTraceAnnotation's step_num, open at the sample's
// time on any thread). `spyglass summary` prints them after the annotation
// tables and `spyglass diff` compares two runs' functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::analysis {

struct CpuFunctionRow {
  std::string function;
  std::string file;  // source file (Python, or native with DWARF); may be empty
  bool python = false;
  uint64_t samples = 0;    // samples with it on the stack
  double self_ns = 0, total_ns = 0;
  double self_share = 0, total_share = 0;  // of the scope's CPU time
};

struct CpuScope {
  std::string name;  // "all threads", "thread <name> <tid>", "step <n>"
  uint64_t samples = 0;
  double cpu_ns = 0;
  std::vector<CpuFunctionRow> top_self, top_total;
};

struct CpuSummary {
  uint64_t samples = 0;
  double cpu_ns = 0;
  CpuScope all;
  std::vector<CpuScope> threads;  // most CPU first
  std::vector<CpuScope> steps;    // by step number
};

// The CPU tables of RUN (a .xplane.pb, run folder or log dir), `top` rows
// each (0: all). A run without samples: Ok, samples 0.
Status SummarizeCpu(const std::string& run, size_t top, CpuSummary* out);
// "" without samples.
std::string CpuSummaryToText(const CpuSummary& s);
// As one JSON value: {samples, cpu_ns, all, threads, steps}, each scope
// {name, samples, cpu_ns, top_self, top_total}, each row the fields of
// CpuFunctionRow (`spyglass summary --json`'s "cpu").
class JsonWriter;
void WriteCpuSummaryJson(JsonWriter& json, const CpuSummary& s);
// A function's CPU time in two runs (`spyglass diff`): self and total, in
// ns and as shares of each run's CPU time, and their differences (new - base).
struct CpuDiffRow {
  std::string function;
  std::string file;
  bool python = false;
  uint64_t base_samples = 0, new_samples = 0;  // samples with it on the stack
  double base_self_ns = 0, new_self_ns = 0, base_total_ns = 0, new_total_ns = 0;
  double base_self_share = 0, new_self_share = 0, base_total_share = 0, new_total_share = 0;
  double delta_self_ns = 0, delta_total_ns = 0, delta_self_share = 0, delta_total_share = 0;
};
// Every function of either run's "all threads" scope (summaries made with
// top 0), biggest change of share (self or total) first, `top` rows (0: all).
std::vector<CpuDiffRow> CompareCpu(const CpuSummary& base, const CpuSummary& next, size_t top);
// As one JSON value (`spyglass diff --json`'s "cpu"): {base_samples,
// new_samples, base_cpu_ns, new_cpu_ns, functions: [the CpuDiffRow fields]}.
void WriteCpuDiffJson(JsonWriter& json, const CpuSummary& base, const CpuSummary& next,
                      const std::vector<CpuDiffRow>& rows);
// Those rows as text; "" when neither run has samples.
std::string CpuDiffRowsToText(const CpuSummary& base, const CpuSummary& next, const std::vector<CpuDiffRow>& rows);
// Functions by self CPU time in both runs, biggest change first; "" when neither has samples.
std::string CpuDiffToText(const CpuSummary& base, const CpuSummary& next, size_t top);

}  // namespace spyglass::analysis
