// Memory profiles: which allocations are alive now, and which code made them.
//
//   spyglass::memory::record_allocation(ptr, bytes, "gpu:0", "buffer");
//   ...
//   spyglass::memory::record_free(ptr);
//   std::string prof;
//   if (auto s = spyglass::profiler::device_memory_profile(&prof); s.ok()) ...   // gzipped pprof
//   spyglass::profiler::save_device_memory_profile("/tmp/memory.prof");          // go tool pprof -top
//
// Host heap memory (malloc/free, new/delete) is tracked by preloading or
// linking libspyglass_heap.so (`LD_PRELOAD=.../libspyglass_heap.so ./prog`,
// or `spyglass run --memory -- ./prog`).
//
// Thread safety: every function here may be called from any thread at any
// time, also from a signal handler and during thread exit (a call made while
// the same thread is already inside the tracker, e.g. from a signal handler,
// is skipped and counted). Tracking takes no global lock: the live table is
// sharded (a short spinlock per shard) and stacks are deduplicated in a
// lock-free table. Bad input (unknown pointer, double free) is counted, never
// fatal. Implemented in src/memory/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spyglass/api.h"
#include "spyglass/status.h"

namespace spyglass::memory {

// Records that `bytes` at `ptr` are now held on `device` ("cpu:0", "gpu:1",
// any text up to 63 bytes) for `kind` ("buffer", "executable" as in JAX, or
// any other word). The calling stack is captured. Recording the same pointer
// again replaces the old record (counted as `replaced`).
SPYGLASS_API void record_allocation(const void* ptr, size_t bytes, std::string_view device = "cpu:0",
                       std::string_view kind = "buffer");
// A frame of a stack given by the caller (a Python frame, an interpreter's
// call site, ...) instead of a captured native one. The strings are copied
// (interned once per distinct (function, file) pair).
struct Frame {
  std::string_view function;  // "train_step"
  std::string_view file;      // "/src/model.py"
  int line = 0;               // 0: unknown
};
// record_allocation with an explicit stack, innermost frame first (at most 64
// kept). Such stacks are deduplicated like captured ones; in the profile each
// frame is a Function(function, file) with a Location at `line`, so
// `go tool pprof -top` names the function and `-lines` gives file:line.
SPYGLASS_API void record_allocation_with_frames(const void* ptr, size_t bytes, std::string_view device, std::string_view kind,
                                   std::span<const Frame> frames);

// Records that the allocation at `ptr` is gone. Unknown pointers and double
// frees are counted (TrackingStats), not fatal. nullptr is ignored.
SPYGLASS_API void record_free(const void* ptr);

// RAII form: records at construction, frees at destruction. Move-only.
class TrackedAllocation {
 public:
  TrackedAllocation() = default;
  TrackedAllocation(const void* ptr, size_t bytes, std::string_view device = "cpu:0",
                    std::string_view kind = "buffer")
      : ptr_(ptr) {
    record_allocation(ptr, bytes, device, kind);
  }
  TrackedAllocation(TrackedAllocation&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  TrackedAllocation& operator=(TrackedAllocation&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  TrackedAllocation(const TrackedAllocation&) = delete;
  TrackedAllocation& operator=(const TrackedAllocation&) = delete;
  ~TrackedAllocation() { reset(); }
  // Records the free now (idempotent).
  void reset() {
    if (ptr_) record_free(ptr_);
    ptr_ = nullptr;
  }
  // Stops owning the record without freeing it.
  const void* release() {
    const void* p = ptr_;
    ptr_ = nullptr;
    return p;
  }
  const void* get() const { return ptr_; }

 private:
  const void* ptr_ = nullptr;
};

// Turns recording by the explicit API on or off (default on). Records made
// while on stay until freed. The heap hook has its own switch
// (SPYGLASS_HEAP=0 in the environment).
SPYGLASS_API void set_tracking_enabled(bool enabled);
SPYGLASS_API bool tracking_enabled();

// What the tracker counted since the process started (or forked).
struct TrackingStats {
  uint64_t allocations = 0;       // recorded
  uint64_t frees = 0;             // matched a live record
  uint64_t live_allocations = 0;  // now
  uint64_t live_bytes = 0;        // now
  uint64_t unknown_frees = 0;     // free of a pointer never recorded (or dropped)
  uint64_t double_frees = 0;      // free of a pointer freed a moment ago
  uint64_t replaced = 0;          // allocation over a live record of the same pointer
  uint64_t reentrant_skipped = 0; // calls made from inside the tracker (signal handler, own allocations)
  uint64_t dropped_table_full = 0;  // not recorded: live-table bound reached
  uint64_t dropped_stacks = 0;      // recorded without a stack: stack-table bound reached
  uint64_t counter_events_dropped = 0;  // trace counter samples over the session's bound
  uint64_t distinct_stacks = 0;
  uint64_t table_bytes = 0;       // memory of the live table
  uint64_t stack_bytes = 0;       // memory of the shared stacks
  uint64_t sample_interval_bytes = 0;  // heap hook sampling (0: every allocation)
  uint64_t distinct_functions = 0;  // (function, file) pairs of explicit frames
  uint64_t dropped_functions = 0;   // explicit frames recorded as "<unknown>": function-table bound reached
};
SPYGLASS_API TrackingStats tracking_stats();

// The live set at the high-water mark of live bytes, per device: for each
// device selected by `backend` (as device_memory_profile: "" = all, "gpu" =
// every "gpu:N", "gpu:1"), what was alive, with its stacks, at the moment that
// device's live bytes were highest since the process started (or forked), as
// gzipped pprof in the same form as device_memory_profile. No snapshot is
// taken at each new peak: each call site keeps its live bytes and count, and
// the values at the peak are kept lazily (the first change of a site after a
// new peak saves the value it had). Exact in a single-threaded program; with
// threads a site may be off by the allocations other threads were making at
// the instant of the peak. A comment line per device gives the peak in bytes
// (`go tool pprof -comments`; device_memory_profile's carry it too). The heap hook writes it at exit as
// memory.<pid>.<comm>.peak.prof.
SPYGLASS_API Status peak_memory_profile(std::string* out, std::string_view backend = "");
// The same bytes written to `path` (overwritten).
SPYGLASS_API Status save_peak_profile(const std::string& path, std::string_view backend = "");

// Live bytes now and their high-water mark, per device name ("cpu:0", "gpu:1").
struct DeviceMemory {
  std::string device;
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
SPYGLASS_API std::vector<DeviceMemory> device_memory();

}  // namespace spyglass::memory

namespace spyglass::profiler {

// jax.profiler.device_memory_profile: a snapshot of what is alive now, as
// gzipped pprof bytes (sample types allocations/count and space/bytes; labels
// kind and device). `backend` selects devices: "" = all, "gpu" = every
// "gpu:N", "gpu:1" = that device only. Always available, no session needed.
SPYGLASS_API Status device_memory_profile(std::string* out, std::string_view backend = "");
// The same bytes written to `path` (overwritten).
SPYGLASS_API Status save_device_memory_profile(const std::string& path, std::string_view backend = "");

}  // namespace spyglass::profiler
