// Where the time went in a profile: the tables of `spyglass summary`, the
// HTML report and spyglass.analysis.summary(), computed in one streaming pass
// over the .xplane.pb (spyglass/profile_reader.h), so that memory stays near
// the file's size whatever the event count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::analysis {

struct SummaryOptions {
  size_t top = 10;       // rows per table (0: all)
  std::string thread;    // only threads whose name contains this, or whose id is it
  // Only steps first..last (by step number), and only events that start
  // inside one of them.
  std::optional<int64_t> step_first, step_last;
  size_t slowest_steps = 5;
  // (bytes done, bytes in all) now and then, for a progress line.
  std::function<void(uint64_t, uint64_t)> progress;
};

// Nanoseconds, over the durations of many events.
struct Distribution {
  uint64_t count = 0;
  double total_ns = 0, mean_ns = 0, stddev_ns = 0;
  double min_ns = 0, p50_ns = 0, p90_ns = 0, p99_ns = 0, max_ns = 0;
};

struct Step {
  int64_t number = 0;
  double start_ns = 0, duration_ns = 0;
};

struct StepSummary {
  std::string name;            // the step annotation's name ("train" of "train 3")
  Distribution duration;
  std::vector<Step> slowest;   // slowest first
  std::vector<Step> all;       // by start time (the report's chart); JSON
                               // keeps every all_stride-th, at most 10000
};

// One name's events: in one thread, or over all threads when `thread` is empty.
struct AnnotationRow {
  std::string name;
  std::string thread;
  uint64_t count = 0;
  double total_ns = 0;    // an event nested in one of the same name (recursion) counted once, in the outer one
  double self_ns = 0;     // total less the time of events nested in them
  double mean_ns = 0;     // per event, nested ones too
  double share = 0;       // total / wall time
  double self_share = 0;  // self / wall time
};

struct ThreadSummary {
  std::string plane;
  std::string name;  // the line's display name, else its name
  int64_t id = 0;
  uint64_t events = 0;
  double busy_ns = 0;  // the union of its events' intervals
  double busy_share = 0;
  std::vector<AnnotationRow> top_total, top_self;
};

// GPU kernels and copies (device planes "/device:GPU:<n>" and the like).
struct DeviceOpRow {
  std::string device;  // the plane's name; "(all)" when summed over devices
  std::string name;
  std::string kind;    // "kernel" or "copy"
  uint64_t count = 0;
  double total_ns = 0, mean_ns = 0;
  double share = 0;    // total / wall time
};

// A counter track (the memory tracer's live bytes, "_counters_" lines).
struct CounterPeak {
  std::string plane, name;
  uint64_t samples = 0;
  double peak = 0, peak_at_ns = 0, last = 0;
  bool bytes = false;  // the values are bytes (a stat named *bytes, e.g. live_bytes)
};

struct Summary {
  std::string file;
  std::vector<std::string> hostnames;
  std::string producer;   // "spyglass 0.1.0", "jax 0.4.38", or ""
  uint64_t file_bytes = 0;
  uint64_t planes = 0, lines = 0, events = 0;
  double start_ns = 0, end_ns = 0, wall_ns = 0;  // since the session started
  StepSummary steps;
  std::vector<AnnotationRow> top_total, top_self;  // over all threads
  std::vector<ThreadSummary> threads;              // busiest first, the top ones only
  uint64_t threads_left_out = 0;                   // threads past the top (--top)
  std::vector<DeviceOpRow> kernels, copies;        // by device and name, most time first
  std::vector<CounterPeak> counters;
  // What the profile says was lost: stats such as dropped_events (name,
  // value, plane), and the XSpace's errors and warnings.
  struct Dropped {
    std::string plane, name;
    uint64_t value = 0;
  };
  std::vector<Dropped> dropped;
  std::vector<std::string> errors, warnings;
  // A line holds the CPU sampler's samples (their tables: cpu_summary.h,
  // which reads the file again; without samples, no need).
  bool cpu_samples = false;
};

// Summarizes RUN: one .xplane.pb, a run folder (its files together: threads
// named by host, all-thread tables summed, the steps of the first host that
// has steps) or a log dir (its newest run). Errors: NotFound, or
// InvalidArgument for a file that is not a profile, truncated, or newer.
Status Summarize(const std::string& run, const SummaryOptions& options, Summary* out);

// The summary as JSON (an object; the field names of the structs above),
// with the CPU sampler's tables under "cpu" when `cpu` has samples
// (cpu_summary.h: WriteCpuSummaryJson).
struct CpuSummary;
std::string SummaryToJson(const Summary& summary, const CpuSummary* cpu = nullptr);
class JsonWriter;
void WriteSummaryJson(JsonWriter& json, const Summary& summary, const CpuSummary* cpu = nullptr);  // as one value
// The summary as text tables at most `width` columns wide.
std::string SummaryToText(const Summary& summary, size_t width = 100);

}  // namespace spyglass::analysis
