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
// Functions by self CPU time in both runs, biggest change first; "" when neither has samples.
std::string CpuDiffToText(const CpuSummary& base, const CpuSummary& next, size_t top);

}  // namespace spyglass::analysis
