// A memory profile (pprof) as a flame graph: the call tree of its samples,
// root first, each node weighed by the bytes (or, without a bytes value, the
// count) allocated under it, for the report's icicle view.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/pprof.h"

namespace spyglass::report {

struct FlameSite {
  std::string site;  // memory::CallSite: the first frame past allocator plumbing
  int64_t value = 0, count = 0;
};

// A frame as the page shows it: file:line, Python or native, and whether
// the interpreter filter folds it.
struct FlameFrame {
  std::string function, file;
  int64_t line = 0;
  bool python = false;       // a Python function (its file is .py or frozen)
  bool interpreter = false;  // the interpreter's or the import system's (IsInterpreterFrame)
  bool label = false;        // not a frame: the device and kind of a subtree
};

struct FlameGraph {
  std::string title;  // the profile's file name
  std::string unit;   // "bytes" or "count"
  int64_t total = 0;
  std::vector<std::string> names;
  // Preorder, root (index 0, depth 0) first: name id, depth, value.
  // Nodes under kMinShare of the total are left out (their parents keep them).
  std::vector<uint32_t> node_name, node_depth;
  std::vector<int64_t> node_value;
  std::vector<FlameSite> top_sites;  // by value, largest first
  uint64_t negative_samples = 0;     // counted as 0
  uint64_t folded_frames = 0;        // interpreter and import frames left out (FlameOptions)
  // The samples for the page (which builds its views: flame, left-heavy,
  // inverted, sandwich, the interpreter folded or not): each distinct
  // stack once, root first, as ids in `frames`, with its value and count.
  // Bounded: the kMaxFlameStacks largest, the others summed in hidden_*.
  std::vector<FlameFrame> frames;
  std::vector<uint32_t> stack_frames;  // every stack's frames, one after the other
  std::vector<uint32_t> stack_sizes;
  std::vector<int64_t> stack_values, stack_counts;
  uint64_t hidden_stacks = 0;
  int64_t hidden_value = 0;
  bool fold = true;  // the page folds the interpreter's frames at first (FlameOptions)
  // A CPU profile (BuildCpuFlameGraph): values in CPU nanoseconds, counts
  // in samples, and each stack's thread and annotation (ids into threads
  // and annotations; "" when it had none) for the page's selector.
  bool cpu = false;
  std::vector<std::string> threads, annotations;
  std::vector<uint32_t> stack_thread, stack_annotation;
};

struct FlameOptions {
  // In a stack that holds Python frames: leave out the interpreter's own
  // frames (the eval loop, calls between frames, the startup) and those of
  // runpy and importlib, so that the program's code starts near the root.
  bool fold_interpreter = true;
};

inline constexpr double kFlameMinShare = 1e-5;
inline constexpr size_t kFlameTopSites = 20;
inline constexpr size_t kMaxFlameStacks = 20000;
inline constexpr size_t kMaxFlameStackDepth = 512;  // frames kept of a stack: the innermost
inline constexpr size_t kMaxFlameNameLength = 512;

FlameGraph BuildFlameGraph(const memory::PprofProfile& profile, const std::string& title,
                           const FlameOptions& options = {});

// A CPU profile (cpu.<pid>.<comm>.prof: samples/count, cpu/nanoseconds,
// labels thread and annotation) as a flame graph in CPU time, its stacks
// kept apart by thread and annotation.
FlameGraph BuildCpuFlameGraph(const memory::PprofProfile& profile, const std::string& title,
                              const FlameOptions& options = {});

// Whether `frame`, in a stack with Python frames, is the interpreter's or
// the import system's (what fold_interpreter leaves out).
bool IsInterpreterFrame(const memory::PprofFrame& frame);

}  // namespace spyglass::report
