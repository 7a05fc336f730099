// The allocation tracker: a sharded live table (pointer -> size, site) and a
// lock-free table of deduplicated sites (device/kind class + stack).
//
// Memory: a live record is 16 bytes (pointer; size:40 | site:24) in an open-
// addressing table kept between 53% and 80% full, i.e. 20-30 bytes per live
// allocation; a site is stored once (24 + 8 * frames bytes). All tables are
// mmap'd, never malloc'd, so the heap hook can use them at any time (before
// constructors, after destructors, inside malloc).
//
// Locks: a spinlock per shard (256 shards by pointer hash), held for a few
// dozen instructions and never across a call that may allocate. The site
// table is insert-only and lock-free. A thread-local guard makes calls from
// inside the tracker (a signal handler interrupting it, the profiler's own
// allocations) pass through untracked and counted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#define SPYGLASS_MEM_EXPORT __attribute__((visibility("default")))

namespace spyglass::memory::internal {

inline constexpr int kMaxFrames = 128;
inline constexpr uint32_t kMaxClasses = 255;     // (device, kind) pairs
inline constexpr uint64_t kMaxSize = (1ull << 40) - 1;

// A (device, kind) pair, interned. Index 0 is never used.
SPYGLASS_MEM_EXPORT uint32_t InternClass(std::string_view device, std::string_view kind);
SPYGLASS_MEM_EXPORT std::string_view ClassDevice(uint32_t cls);
SPYGLASS_MEM_EXPORT std::string_view ClassKind(uint32_t cls);
SPYGLASS_MEM_EXPORT uint32_t ClassCount();  // classes are 1..ClassCount()

// Thread-local reentrancy guard. Enter() returns false when the thread is
// already inside (then the caller must not track).
struct Guard {
  SPYGLASS_MEM_EXPORT static bool Enter();
  SPYGLASS_MEM_EXPORT static void Leave();
  SPYGLASS_MEM_EXPORT static bool Inside();
  // The profiler's own work (snapshots): its allocations are untracked and not counted.
  SPYGLASS_MEM_EXPORT static bool EnterOwn();
  // Whether the thread is inside a tracking operation (not the profiler's own work).
  SPYGLASS_MEM_EXPORT static bool InsideTracking();
};
// RAII guard for the profiler's own work (snapshots): allocations inside are untracked.
class ScopedUntracked {
 public:
  ScopedUntracked() : entered_(Guard::EnterOwn()) {}
  ~ScopedUntracked() {
    if (entered_) Guard::Leave();
  }

 private:
  bool entered_;
};

// Records an allocation whose stack is `frames[0..depth)` (innermost first,
// return addresses). Caller holds the guard. `sampled` marks heap-hook
// samples (weighted at snapshot time).
SPYGLASS_MEM_EXPORT void Record(uintptr_t ptr, uint64_t size, uint32_t cls, const uintptr_t* frames, int depth);
// Removes `ptr`; counts unknown/double frees. Caller holds the guard.
SPYGLASS_MEM_EXPORT void Remove(uintptr_t ptr);
// Sampled mode: a quick test whether `ptr` may be tracked (no false negatives).
SPYGLASS_MEM_EXPORT bool MaybeTracked(uintptr_t ptr);
SPYGLASS_MEM_EXPORT void SetSampleInterval(uint64_t bytes);
SPYGLASS_MEM_EXPORT uint64_t SampleInterval();

// Counted events (relaxed counters).
enum Counter : int {
  kAllocations, kFrees, kUnknownFrees, kDoubleFrees, kReplaced, kReentrant, kDroppedTable, kDroppedStacks,
  kCounterDropped, kNumCounters
};
SPYGLASS_MEM_EXPORT void Count(Counter c, uint64_t n = 1);
SPYGLASS_MEM_EXPORT uint64_t CounterValue(Counter c);

// One live record, as a snapshot sees it.
struct LiveRecord {
  uintptr_t ptr;
  uint64_t size;
  uint32_t site;
};
// Calls `f` for each live record, shard by shard (each shard locked while
// read; `f` must not allocate through the tracker: call with ScopedUntracked).
SPYGLASS_MEM_EXPORT void ForEachLive(const std::function<void(const LiveRecord&)>& f);
SPYGLASS_MEM_EXPORT uint64_t LiveCount();
SPYGLASS_MEM_EXPORT uint64_t TableBytes();

struct Site {
  uint64_t hash;
  uint32_t cls;
  uint32_t depth;
  uintptr_t frames[];  // innermost first
};
// nullptr for id 0 (no stack) or an id being published.
SPYGLASS_MEM_EXPORT const Site* GetSite(uint32_t id);
SPYGLASS_MEM_EXPORT uint32_t SiteClass(uint32_t id);
SPYGLASS_MEM_EXPORT uint64_t SiteCount();
SPYGLASS_MEM_EXPORT uint64_t SiteBytes();

// Trace counter samples: while a session runs, every record/remove appends
// (ticks, class, delta) to a bounded buffer (lock-free: one fetch_add).
struct CounterEvent {
  uint64_t ticks;
  int64_t delta_and_class;  // delta << 8 | class
};
SPYGLASS_MEM_EXPORT extern std::atomic<bool> g_counter_on;
// Starts recording (capacity events); returns false if already recording.
SPYGLASS_MEM_EXPORT bool CounterStart(uint64_t capacity);
// Stops; returns the events (the buffer is released afterwards by CounterRelease).
SPYGLASS_MEM_EXPORT void CounterStop(const CounterEvent** events, uint64_t* n, uint64_t* dropped);
SPYGLASS_MEM_EXPORT void CounterRelease();

// Live bytes per class now (index = class).
SPYGLASS_MEM_EXPORT std::vector<int64_t> LiveBytesByClass();

// Explicit API switch.
SPYGLASS_MEM_EXPORT extern std::atomic<bool> g_api_enabled;

// fork: the child keeps the parent's live records (its copy of the heap) and
// resets the locks.
SPYGLASS_MEM_EXPORT void InstallForkHandlers();

}  // namespace spyglass::memory::internal
