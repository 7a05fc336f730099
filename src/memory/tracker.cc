#include "memory/tracker.h"
#include "memory/timeline.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

extern "C" void __libc_free(void*);

namespace spyglass::memory::internal {

std::atomic<uint64_t*> g_filter{nullptr};
constinit thread_local int t_guard __attribute__((tls_model("initial-exec"))) = 0;

namespace {

void* MapBytes(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

class SpinLock {
 public:
  void lock() {
    for (int spins = 0; v_.exchange(1, std::memory_order_acquire) != 0;) {
      while (v_.load(std::memory_order_relaxed) != 0) {
        if (++spins < 64) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
        } else {
          sched_yield();
        }
      }
    }
  }
  bool try_lock() { return v_.load(std::memory_order_relaxed) == 0 && v_.exchange(1, std::memory_order_acquire) == 0; }
  void unlock() { v_.store(0, std::memory_order_release); }
  void reset() { v_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<uint32_t> v_{0};
};

struct LockGuard {
  explicit LockGuard(SpinLock& l) : l_(l) { l_.lock(); }
  ~LockGuard() { l_.unlock(); }
  SpinLock& l_;
};


std::atomic<uint64_t> g_counters[kNumCounters];

// Single-writer mode's pending record (see FlushPending).
struct PendingRecord {
  uint64_t ptr = 0, size = 0;
  uint32_t site = 0;
};
PendingRecord g_pending_rec;
std::atomic<uint64_t> g_pending_live{0};  // its pointer, or 0 (LiveCount, the prefetch hints)
std::atomic<uint64_t> g_single_allocations{0}, g_single_frees{0};
void FlushPending(bool plain);

// Single-writer mode's waiting frees (see RemoveSoon): a ring of the
// writer's latest frees, 0 = none, bit 0 set = settled (erased and counted,
// not yet handed to glibc), bit 1 set = already handed back to its allocator
// by the caller (RemoveLater: Python's), its erase alone waits.
constexpr uint32_t kWaiting = 8;
uintptr_t g_waiting[kWaiting];
uint32_t g_waiting_next = 0;                // the slot the next free takes (its oldest)
constexpr uintptr_t kSettled = 1, kReleased = 2, kWaitFlags = 3;
uint32_t g_released_waiting = 0;            // entries with kReleased (Insert looks for its pointer among them)
std::atomic<uint32_t> g_settling_count{0};  // entries not settled (SettleFrees reads it from any thread)
void SettleAll(bool plain);
void ReleaseWaiting();
void ReusedWhileWaiting(uintptr_t ptr);

// Blocks of kLargeBlock bytes or more are never held back: a counting filter
// of the live ones by address (no false negatives; a false positive, or a
// counter stuck at 255, only frees a small block at once).
constexpr uint64_t kLargeBlock = 16 << 10;
constexpr uint64_t kLargeFilter = 4096;
uint8_t g_large[kLargeFilter];
inline uint8_t* LargeCounter(uintptr_t ptr) { return &g_large[(ptr >> 4) & (kLargeFilter - 1)]; }
inline bool MaybeLarge(uintptr_t ptr) { return __atomic_load_n(LargeCounter(ptr), __ATOMIC_RELAXED) != 0; }
void LargeChange(uintptr_t ptr, uint64_t size, int delta) {
  if (size < kLargeBlock) return;
  uint8_t* c = LargeCounter(ptr);
  uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
  while (v != 255 && !(delta < 0 && v == 0) &&
         !__atomic_compare_exchange_n(c, &v, uint8_t(v + delta), true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// ---- classes -------------------------------------------------------------
constexpr size_t kDeviceChars = 64, kKindChars = 32;
struct ClassNames {
  char device[kMaxClasses + 1][kDeviceChars];
  char kind[kMaxClasses + 1][kKindChars];
  uint8_t device_len[kMaxClasses + 1];
  uint8_t kind_len[kMaxClasses + 1];
};
constinit ClassNames g_classes{};
std::atomic<uint32_t> g_class_count{0};
SpinLock g_class_lock;
// Per class: its device, whether sampled records of it are weighted (the heap
// hook's kind "heap"), and the stats of its records without a stack.
uint8_t g_class_device[kMaxClasses + 1];
bool g_class_weighted[kMaxClasses + 1];
SiteStats g_class_stats[kMaxClasses + 1];

// ---- devices -------------------------------------------------------------------
struct alignas(64) Device {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  std::atomic<uint64_t> epoch{0};
  std::atomic<int64_t> window_max{0};
};
Device g_devices[kMaxDevices];
char g_device_names[kMaxDevices][kDeviceChars];
uint8_t g_device_name_len[kMaxDevices];
std::atomic<uint32_t> g_device_count{0};

// Caller holds g_class_lock.
uint32_t InternDeviceLocked(std::string_view name) {
  uint32_t n = g_device_count.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i)
    if (g_device_name_len[i] == name.size() && std::memcmp(g_device_names[i], name.data(), name.size()) == 0) return i;
  if (n == kMaxDevices) return kMaxDevices - 1;
  std::memcpy(g_device_names[n], name.data(), name.size());
  g_device_name_len[n] = static_cast<uint8_t>(name.size());
  g_device_count.store(n + 1, std::memory_order_release);
  return n;
}

// ---- live table ------------------------------------------------------------
// Slot: ptr (0 = empty), meta = size << 24 | site.
struct Slot {
  uint64_t ptr;
  uint64_t meta;
};
constexpr int kShardBits = 8;
constexpr int kShards = 1 << kShardBits;
constexpr int kRecent = 8;
constexpr uint64_t kDefaultMaxLive = 1ull << 26;

struct alignas(64) Shard {
  SpinLock lock;
  uint32_t recent_pos = 0;
  Slot* slots = nullptr;
  uint64_t cap = 0;
  std::atomic<uint64_t> count{0};
  std::atomic<int64_t> bytes{0};
  // Totals kept per shard (under its lock) rather than in one global atomic,
  // so that threads allocating at once do not all hit one cache line.
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> frees{0};
  uint64_t recent[kRecent] = {};  // pointers freed a moment ago (double-free detection)
};
Shard g_shards[kShards];
uint64_t g_max_per_shard = kDefaultMaxLive / kShards;

// The live table's hash of a pointer: one multiply (Fibonacci hashing) of the
// pointer rotated so that its always-zero alignment bits are dropped by the
// multiply; the top 8 bits pick the shard, the next ones the home slot. The
// deletion's backward shift rehashes every slot it moves: a cheap hash counts.
inline uint64_t PtrHash(uint64_t p) { return ((p >> 4) | (p << 60)) * 0x9E3779B97F4A7C15ull; }

inline uint64_t Home(uint64_t h, uint64_t cap) {
  return static_cast<uint64_t>((static_cast<__uint128_t>(h << kShardBits) * cap) >> 64);
}

// Caller holds the shard lock. Returns the slot index of ptr or the empty slot where it goes.
inline uint64_t Find(const Shard& s, uint64_t ptr, uint64_t h, bool* found) {
  uint64_t i = Home(h, s.cap);
  while (true) {
    uint64_t p = s.slots[i].ptr;
    if (p == ptr) {
      *found = true;
      return i;
    }
    if (p == 0) {
      *found = false;
      return i;
    }
    if (++i == s.cap) i = 0;
  }
}

// The shards' slot arrays are carved out of one reserved region that the
// kernel may back with 2 MiB pages (MADV_HUGEPAGE, where transparent huge
// pages are "madvise" or "always"). A record's slot is a random address in a
// table of tens of MiB: with 4 KiB pages nearly every insert and erase also
// missed the TLB, and the page walk (two-dimensional under a hypervisor) cost
// more than the cache miss (the prefetch of the slot stalled on it: 13% of
// a Python program's profiled time). Arrays are bump-allocated, never
// reused: a shard's old array gives its pages back (MADV_DONTNEED on its
// whole 4 KiB pages; the kernel splits a huge page it shares with other
// arrays, older ones mostly: the current arrays were allocated after it).
// Where the region cannot be reserved (strict overcommit), each array is its
// own mapping as before.
constexpr size_t kSlotRegionBytes = size_t{16} << 30;  // address space; the largest table is ~2 GiB
constexpr size_t kHugePage = size_t{2} << 20;
std::atomic<char*> g_slot_region{nullptr};
std::atomic<bool> g_slot_region_failed{false};
std::atomic<size_t> g_slot_region_used{0};

char* SlotRegion() {
  char* r = g_slot_region.load(std::memory_order_acquire);
  if (r != nullptr || g_slot_region_failed.load(std::memory_order_relaxed)) return r;
  // Aligned to a huge page: reserve one more and trim.
  void* m = mmap(nullptr, kSlotRegionBytes + kHugePage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    g_slot_region_failed.store(true, std::memory_order_relaxed);
    return nullptr;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > base) munmap(m, aligned - base);
  if (aligned + kSlotRegionBytes < base + kSlotRegionBytes + kHugePage)
    munmap(reinterpret_cast<void*>(aligned + kSlotRegionBytes), base + kHugePage - aligned);
  char* region = reinterpret_cast<char*>(aligned);
#ifdef MADV_HUGEPAGE
  madvise(region, kSlotRegionBytes, MADV_HUGEPAGE);
#endif
  char* expected = nullptr;
  if (!g_slot_region.compare_exchange_strong(expected, region, std::memory_order_acq_rel)) {
    munmap(region, kSlotRegionBytes);  // another thread's won
    return expected;
  }
  return region;
}

// Zeroed slots (fresh memory of the region, or a new mapping).
Slot* AllocSlots(uint64_t n) {
  const size_t bytes = (n * sizeof(Slot) + 63) & ~size_t{63};
  if (char* region = SlotRegion()) {
    const size_t at = g_slot_region_used.fetch_add(bytes, std::memory_order_relaxed);
    if (at + bytes <= kSlotRegionBytes) return reinterpret_cast<Slot*>(region + at);
  }
  return static_cast<Slot*>(MapBytes(n * sizeof(Slot)));
}

void FreeSlots(Slot* slots, uint64_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(slots);
  const uintptr_t region = reinterpret_cast<uintptr_t>(g_slot_region.load(std::memory_order_relaxed));
  if (region == 0 || p < region || p >= region + kSlotRegionBytes) {
    munmap(slots, n * sizeof(Slot));
    return;
  }
  // The pages wholly inside this array (its neighbours' are theirs).
  constexpr uintptr_t kPage = 4096;
  const uintptr_t lo = (p + kPage - 1) & ~(kPage - 1);
  const uintptr_t hi = (p + n * sizeof(Slot)) & ~(kPage - 1);
  if (lo < hi) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

bool Grow(Shard& s) {
  uint64_t ncap = s.cap == 0 ? 64 : s.cap + s.cap / 2;
  Slot* ns = AllocSlots(ncap);
  if (ns == nullptr) return false;
  for (uint64_t i = 0; i < s.cap; ++i) {
    uint64_t p = s.slots[i].ptr;
    if (p == 0) continue;
    uint64_t j = Home(PtrHash(p), ncap);
    while (ns[j].ptr != 0)
      if (++j == ncap) j = 0;
    ns[j] = s.slots[i];
  }
  if (s.slots) FreeSlots(s.slots, s.cap);
  // Atomic stores: PrefetchSlot reads these two without the lock.
  __atomic_store_n(&s.slots, ns, __ATOMIC_RELAXED);
  __atomic_store_n(&s.cap, ncap, __ATOMIC_RELAXED);
  return true;
}

// Backward-shift deletion (no tombstones): each record after the hole moves
// back into it unless its home slot lies after the hole (its distance from
// home is below the hole's distance).
void EraseAt(Shard& s, uint64_t i) {
  Slot* const slots = s.slots;  // locals: the moves below do not reload them
  const uint64_t cap = s.cap;
  uint64_t j = i, gap = 0;
  while (true) {
    if (++j == cap) j = 0;
    ++gap;
    const uint64_t p = slots[j].ptr;
    if (p == 0) break;
    const uint64_t k = Home(PtrHash(p), cap);
    if ((j >= k ? j - k : j + cap - k) < gap) continue;
    slots[i] = slots[j];
    i = j;
    gap = 0;
  }
  slots[i].ptr = 0;
  slots[i].meta = 0;
}

// ---- sampled-mode filter ---------------------------------------------------
std::atomic<uint64_t> g_sample_interval{0};

constexpr size_t kFilterBytes = kFilterSlots / 8 + kFilterSlots * sizeof(uint16_t);  // bits, then counts
// A slot's count and its bit change together: no free may find the bit clear
// while a sampled block is in the slot (a lock-free pair of updates could
// clear it after another thread's add). Taken for sampled blocks only.
SpinLock g_filter_lock;
void FilterChange(uintptr_t ptr, int delta) {
  uint64_t* f = g_filter.load(std::memory_order_acquire);
  if (!f) return;
  const uint64_t i = FilterIndex(ptr);
  uint16_t& count = reinterpret_cast<uint16_t*>(f + kFilterSlots / 64)[i];
  LockGuard hold(g_filter_lock);
  if (count == UINT16_MAX || (delta < 0 && count == 0)) return;  // saturated: set for good
  count = static_cast<uint16_t>(count + delta);
  const uint64_t bit = uint64_t{1} << (i % 64);
  const uint64_t word = __atomic_load_n(&f[i / 64], __ATOMIC_RELAXED);
  __atomic_store_n(&f[i / 64], count ? word | bit : word & ~bit, __ATOMIC_RELAXED);
}
void FilterAdd(uintptr_t ptr) { FilterChange(ptr, 1); }
void FilterRemove(uintptr_t ptr) { FilterChange(ptr, -1); }

template <typename T>
T* LazyMap(std::atomic<T*>& slot, size_t bytes) {
  T* p = slot.load(std::memory_order_acquire);
  if (p) return p;
  T* fresh = static_cast<T*>(MapBytes(bytes));
  if (!fresh) return nullptr;
  if (slot.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) return fresh;
  munmap(fresh, bytes);
  return p;
}

// ---- interned records --------------------------------------------------------
// The one intern table of the tracker (stacks and function names): lock-free
// and insert-only. A record is written once into an mmap'd arena and gets an
// id (ptrs[id] points at it); an open-addressing hash table of 64-bit slots
// (40-bit hash tag | 24-bit id) finds it again. Threads racing to insert the
// same record each write one; the first to claim a slot wins, the loser's
// record stays unused. Bounds: `max_ids` ids, `arena_bytes` of records.
struct InternTable {
  const uint64_t slot_count;  // a power of two
  const uint32_t first_id;
  const uint32_t max_ids;
  const uint64_t arena_bytes;
  std::atomic<std::atomic<uint64_t>*> slots{nullptr};
  std::atomic<std::atomic<const void*>*> ptrs{nullptr};
  std::atomic<char*> arena{nullptr};
  std::atomic<uint64_t> arena_used{0};
  std::atomic<uint32_t> next_id;
  std::atomic<uint64_t> published{0};  // distinct records (an id lost in a race is not one)

  // constexpr, and the tables constinit: the heap hook interns from the
  // first malloc, before any dynamic initializer has run.
  constexpr InternTable(uint64_t slots_count, uint32_t first, uint32_t max, uint64_t bytes)
      : slot_count(slots_count), first_id(first), max_ids(max), arena_bytes(bytes), next_id(first) {}

  // The id of the record that `same(record)` recognizes, inserting the
  // `bytes`-long one that `fill(memory)` writes if there is none; 0 when a
  // bound is reached (then nothing is inserted).
  template <typename Same, typename Fill>
  uint32_t Intern(uint64_t hash, size_t bytes, const Same& same, const Fill& fill) {
    auto* s = LazyMap(slots, slot_count * sizeof(uint64_t));
    auto* p = LazyMap(ptrs, max_ids * sizeof(void*));
    char* a = LazyMap(arena, arena_bytes);
    if (!s || !p || !a) return 0;
    bytes = (bytes + 7) & ~size_t{7};
    const uint64_t tag = (hash >> 24) | 1;  // 40 bits, non-zero
    uint32_t mine = 0;
    uint64_t i = hash & (slot_count - 1);
    for (int probes = 0; probes < 4096; ++probes, i = (i + 1) & (slot_count - 1)) {
      uint64_t v = s[i].load(std::memory_order_acquire);
      if (v == 0) {
        if (mine == 0) {
          uint64_t off = arena_used.fetch_add(bytes, std::memory_order_relaxed);
          uint32_t id = next_id.fetch_add(1, std::memory_order_relaxed);
          if (off + bytes > arena_bytes || id >= max_ids) return 0;
          fill(a + off);
          p[id].store(a + off, std::memory_order_release);
          mine = id;
        }
        if (s[i].compare_exchange_strong(v, (tag << 24) | mine, std::memory_order_acq_rel)) {
          published.fetch_add(1, std::memory_order_relaxed);
          return mine;
        }
      }
      if ((v >> 24) == tag) {
        uint32_t id = static_cast<uint32_t>(v & 0xffffff);
        if (const void* r = p[id].load(std::memory_order_acquire); r && same(r)) return id;
      }
    }
    return 0;
  }

  const void* Get(uint32_t id) const {
    if (id < first_id || id >= max_ids) return nullptr;
    auto* p = ptrs.load(std::memory_order_acquire);
    return p ? p[id].load(std::memory_order_acquire) : nullptr;
  }
  uint32_t end_id() const { return std::min(next_id.load(std::memory_order_acquire), max_ids); }
  uint64_t used_bytes() const { return std::min(arena_used.load(std::memory_order_relaxed), arena_bytes); }
};

// ---- sites -----------------------------------------------------------------
constexpr uint32_t kMaxSites = (1u << 22);           // ids (24-bit field; 4M by default)
constexpr uint32_t kFirstSite = kMaxClasses + 1;     // ids < this: "class only, no stack"
// 2^23 hash slots (64 MiB virtual), 512 MiB of stacks at most.
constinit InternTable g_sites(1ull << 23, kFirstSite, kMaxSites, 512ull << 20);

uint32_t InternSite(uint32_t cls, const uintptr_t* frames, int depth, uint64_t h) {
  const size_t frame_bytes = sizeof(uintptr_t) * static_cast<size_t>(depth);
  uint32_t id = g_sites.Intern(
      h, sizeof(Site) + frame_bytes,
      [&](const void* r) {
        auto* s = static_cast<const Site*>(r);
        return s->cls == cls && s->depth == static_cast<uint32_t>(depth) &&
               std::memcmp(s->frames, frames, frame_bytes) == 0;
      },
      [&](void* r) {
        auto* s = static_cast<Site*>(r);
        s->hash = h;
        s->cls = cls;
        s->depth = static_cast<uint32_t>(depth);
        std::memcpy(s->frames, frames, frame_bytes);
      });
  if (id != 0) return id;
  Count(kDroppedStacks);
  return cls;
}

// ---- functions (symbolic frames) ---------------------------------------------
// (name, file) pairs, interned once in the same kind of table.
struct FunctionRecord {
  uint64_t hash;
  uint32_t name_len, file_len;
  char chars[];  // name, then file
};
// 2^21 hash slots (16 MiB virtual), 64 MiB of names at most.
constinit InternTable g_functions(1ull << 21, 1, kMaxFunctions, 64ull << 20);

inline uint64_t HashChars(uint64_t h, std::string_view s) {
  // FNV-1a over the bytes, mixed per 8 bytes: cheap and good enough for names.
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return Mix(h ^ s.size());
}

}  // namespace

uint32_t InternFunction(std::string_view name, std::string_view file) {
  name = name.substr(0, kMaxFunctionChars);
  file = file.substr(0, kMaxFunctionChars);
  const uint64_t h = HashChars(HashChars(0xcbf29ce484222325ull, name), file);
  uint32_t id = g_functions.Intern(
      h, sizeof(FunctionRecord) + name.size() + file.size(),
      [&](const void* p) {
        auto* r = static_cast<const FunctionRecord*>(p);
        return r->hash == h && r->name_len == name.size() && r->file_len == file.size() &&
               std::memcmp(r->chars, name.data(), name.size()) == 0 &&
               std::memcmp(r->chars + name.size(), file.data(), file.size()) == 0;
      },
      [&](void* p) {
        auto* r = static_cast<FunctionRecord*>(p);
        r->hash = h;
        r->name_len = static_cast<uint32_t>(name.size());
        r->file_len = static_cast<uint32_t>(file.size());
        std::memcpy(r->chars, name.data(), name.size());
        std::memcpy(r->chars + name.size(), file.data(), file.size());
      });
  if (id == 0) Count(kDroppedFunctions);
  return id;
}

bool FunctionNames(uint32_t id, std::string_view* name, std::string_view* file) {
  auto* r = static_cast<const FunctionRecord*>(g_functions.Get(id));
  if (!r) return false;
  *name = {r->chars, r->name_len};
  *file = {r->chars + r->name_len, r->file_len};
  return true;
}
uint64_t FunctionCount() { return g_functions.published.load(std::memory_order_relaxed); }
uint64_t FunctionBytes() { return g_functions.used_bytes(); }

namespace {

// ---- counter events --------------------------------------------------------
constexpr uint64_t kMaxCounterEvents = 8ull << 20;
struct AtomicCounterEvent {
  std::atomic<uint64_t> ticks;
  std::atomic<int64_t> delta_and_class;
};
std::atomic<AtomicCounterEvent*> g_counter_buf{nullptr};
std::atomic<uint64_t> g_counter_idx{0};
uint64_t g_counter_cap = 0;

inline uint64_t Ticks() {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
#endif
}

void CounterAppend(uint32_t cls, int64_t delta) {
  AtomicCounterEvent* buf = g_counter_buf.load(std::memory_order_acquire);
  if (!buf) return;
  uint64_t i = g_counter_idx.fetch_add(1, std::memory_order_relaxed);
  if (i >= g_counter_cap) {
    Count(kCounterDropped);
    return;
  }
  buf[i].delta_and_class.store(delta * 256 + cls, std::memory_order_relaxed);
  buf[i].ticks.store(Ticks() | 1, std::memory_order_release);
}

}  // namespace

std::atomic<bool> g_counter_on{false};
std::atomic<bool> g_api_enabled{true};

void Count(Counter c, uint64_t n) { g_counters[c].fetch_add(n, std::memory_order_relaxed); }
uint64_t CounterValue(Counter c) {
  if (c == kAllocations || c == kFrees) {
    uint64_t n = g_counters[c].load(std::memory_order_relaxed);
    for (const Shard& s : g_shards) n += (c == kAllocations ? s.allocations : s.frees).load(std::memory_order_relaxed);
    return n + (c == kAllocations ? g_single_allocations : g_single_frees).load(std::memory_order_relaxed);
  }
  return g_counters[c].load(std::memory_order_relaxed);
}



uint32_t InternClass(std::string_view device, std::string_view kind) {
  device = device.substr(0, kDeviceChars - 1);
  kind = kind.substr(0, kKindChars - 1);
  auto find = [&](uint32_t n) -> uint32_t {
    for (uint32_t i = 1; i <= n; ++i)
      if (g_classes.device_len[i] == device.size() && g_classes.kind_len[i] == kind.size() &&
          std::memcmp(g_classes.device[i], device.data(), device.size()) == 0 &&
          std::memcmp(g_classes.kind[i], kind.data(), kind.size()) == 0)
        return i;
    return 0;
  };
  if (uint32_t c = find(g_class_count.load(std::memory_order_acquire))) return c;
  LockGuard lock(g_class_lock);
  uint32_t n = g_class_count.load(std::memory_order_relaxed);
  if (uint32_t c = find(n)) return c;
  if (n >= kMaxClasses) {
    // Over the bound: everything else shares the last class ("other").
    return kMaxClasses;
  }
  uint32_t c = n + 1;
  g_class_device[c] = static_cast<uint8_t>(InternDeviceLocked(c == kMaxClasses ? "other" : device));
  g_class_weighted[c] = kind == "heap" && c != kMaxClasses;
  std::memcpy(g_classes.device[c], device.data(), device.size());
  g_classes.device_len[c] = static_cast<uint8_t>(device.size());
  std::memcpy(g_classes.kind[c], kind.data(), kind.size());
  g_classes.kind_len[c] = static_cast<uint8_t>(kind.size());
  if (c == kMaxClasses) {
    std::memcpy(g_classes.device[c], "other", 5);
    g_classes.device_len[c] = 5;
    std::memcpy(g_classes.kind[c], "other", 5);
    g_classes.kind_len[c] = 5;
  }
  g_class_count.store(c, std::memory_order_release);
  return c;
}
std::string_view ClassDevice(uint32_t c) {
  if (c == 0 || c > g_class_count.load(std::memory_order_acquire)) return "unknown";
  return {g_classes.device[c], g_classes.device_len[c]};
}
std::string_view ClassKind(uint32_t c) {
  if (c == 0 || c > g_class_count.load(std::memory_order_acquire)) return "unknown";
  return {g_classes.kind[c], g_classes.kind_len[c]};
}
uint32_t ClassCount() { return g_class_count.load(std::memory_order_acquire); }

bool ParseSampleBytes(const char* text, uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  uint64_t v = 0;
  for (const char* c = text; *c; ++c) {
    if (*c < '0' || *c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(*c - '0');
    if (v > kMaxSampleBytes) return false;  // before it could overflow
  }
  *out = v;
  return true;
}

void SetSampleInterval(uint64_t bytes) {
  if (bytes > kMaxSampleBytes) bytes = kMaxSampleBytes;
  if (bytes > 0) LazyMap(g_filter, kFilterBytes);
  g_sample_interval.store(bytes, std::memory_order_release);
}
uint64_t SampleInterval() { return g_sample_interval.load(std::memory_order_relaxed); }
bool MaybeTracked(uintptr_t ptr) { return MaybeTrackedInline(ptr); }

namespace {

// ---- one writing thread: no atomic read-modify-writes ------------------------
// While a single thread records and removes (most programs, and the
// benchmarks), its table and totals updates need no lock and no atomic
// read-modify-write (each costs ~20 cycles; a record/remove pair did eight).
// That thread, the "writer", is the first one to record; it marks each
// operation with g_writer_busy (plain stores) and uses plain loads and stores.
// The first time another thread records, or a reader needs the tables
// consistent (ForEachLive, TableBytes), the process switches to shared mode
// for good: MakeShared sets the mode, then membarrier(PRIVATE_EXPEDITED)
// makes every thread pass a full barrier, so that the writer either sees the
// new mode before its next operation or has its busy mark visible, and
// MakeShared waits for that operation to end. Without membarrier the
// process starts shared. Readers of single values (totals, site stats, the
// timeline) read them with relaxed loads in either mode.
enum : int { kModeSingle = 0, kModeSwitching = 1, kModeShared = 2 };
std::atomic<int> g_mode{kModeShared};
std::atomic<uintptr_t> g_writer{0};
std::atomic<int> g_writer_busy{0};

bool RegisterMembarrier() {
#if defined(__SANITIZE_THREAD__)
  return false;  // TSan does not know membarrier's ordering: shared mode only
#elif defined(SYS_membarrier)
  constexpr int kQuery = 0, kPrivateExpedited = 1 << 3, kRegisterPrivateExpedited = 1 << 4;
  long cmds = syscall(SYS_membarrier, kQuery, 0, 0);
  if (cmds < 0 || (cmds & kPrivateExpedited) == 0) return false;
  return syscall(SYS_membarrier, kRegisterPrivateExpedited, 0, 0) == 0;
#else
  return false;
#endif
}

void MakeSharedSlow() {
  int m = kModeSingle;
  if (g_mode.compare_exchange_strong(m, kModeSwitching, std::memory_order_seq_cst)) {
#ifdef SYS_membarrier
    syscall(SYS_membarrier, 1 << 3 /* PRIVATE_EXPEDITED */, 0, 0);
#endif
    for (int spins = 0; g_writer_busy.load(std::memory_order_acquire) != 0; ++spins)
      if (spins > 64) sched_yield();
    SettleAll(false);     // the writer is quiescent; nobody else touches the tables until kModeShared
    ReleaseWaiting();
    FlushPending(false);
    g_mode.store(kModeShared, std::memory_order_release);
    return;
  }
  for (int spins = 0; g_mode.load(std::memory_order_acquire) != kModeShared; ++spins)
    if (spins > 64) sched_yield();
}
inline void MakeShared() {
  if (g_mode.load(std::memory_order_acquire) != kModeShared) MakeSharedSlow();
}

// One record/remove: whether it may use plain updates (then End() must be called).
struct Op {
  bool plain = false;
  Op() {
    if (__builtin_expect(g_mode.load(std::memory_order_relaxed) != kModeSingle, 0)) {
      MakeShared();
      return;
    }
    const uintptr_t me = reinterpret_cast<uintptr_t>(&t_guard);
    uintptr_t w = g_writer.load(std::memory_order_relaxed);
    if (__builtin_expect(w == 0, 0)) {
      if (!g_writer.compare_exchange_strong(w, me, std::memory_order_acq_rel)) {
        MakeShared();
        return;
      }
      w = me;
    }
    if (w != me) {
      MakeShared();
      return;
    }
    g_writer_busy.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the membarrier on the other side is the hardware fence
    if (g_mode.load(std::memory_order_relaxed) == kModeSingle) {
      plain = true;
      return;
    }
    g_writer_busy.store(0, std::memory_order_release);
    MakeShared();
  }
  ~Op() {
    if (plain) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
      g_writer_busy.store(0, std::memory_order_release);
    }
  }
};

template <typename T>
inline void AddTo(std::atomic<T>& a, T v, bool plain) {
  if (plain)
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  else
    a.fetch_add(v, std::memory_order_relaxed);
}

// A shard lock that the single writer skips.
struct ShardLock {
  ShardLock(SpinLock& l, bool plain) : l_(plain ? nullptr : &l) {
    if (l_) l_->lock();
  }
  ~ShardLock() {
    if (l_) l_->unlock();
  }
  SpinLock* l_;
};

constinit thread_local uint32_t t_timeline_countdown __attribute__((tls_model("initial-exec"))) = 0;
constexpr uint32_t kTimelineCheckOps = 128;

// Inlined into the hook's two hot paths (as TableInsert, FlushPendingInline
// and EraseIn): the calls and the registers they spilled were ~150
// instructions a pair.
#define SPYGLASS_HOT inline __attribute__((always_inline))

// Adds (sign 1) or removes (sign -1) a record of `size` bytes at `site` to
// the site's and its device's totals, remembering the peak lazily
// (tracker.h). Returns the site's class (one lookup of the site for both).
SPYGLASS_HOT uint32_t Account(uint32_t site, uint64_t size, int64_t sign, bool plain) {
  SiteStats* st;
  uint32_t cls;
  if (const Site* s = site >= kFirstSite ? GetSite(site) : nullptr) {
    st = const_cast<SiteStats*>(&s->stats);
    cls = s->cls;
  } else {
    cls = site >= kFirstSite ? 0 : site;
    st = &g_class_stats[cls];
  }
  int64_t b = static_cast<int64_t>(size), c = kCountUnit;
  if (__builtin_expect(g_class_weighted[cls], 1)) {
    if (uint64_t interval = g_sample_interval.load(std::memory_order_relaxed)) {
      // The Poisson sample's weight (as the snapshot's).
      double w = 1.0 / (1.0 - std::exp(-static_cast<double>(size ? size : 1) / static_cast<double>(interval)));
      b = std::llround(static_cast<double>(size) * w);
      c = std::llround(static_cast<double>(kCountUnit) * w);
    }
  }
  Device& d = g_devices[g_class_device[cls]];
  const uint64_t epoch = d.epoch.load(std::memory_order_relaxed);
  if (st->stamp.load(std::memory_order_relaxed) != epoch) {
    // First change of this site since its device's latest peak: its value now is its value at the peak.
    st->peak_bytes.store(st->bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
    st->peak_count.store(st->count.load(std::memory_order_relaxed), std::memory_order_relaxed);
    st->stamp.store(epoch, std::memory_order_release);
  }
  AddTo(st->bytes, sign * b, plain);
  AddTo(st->count, sign * c, plain);
  int64_t v;
  if (plain) {
    v = d.live.load(std::memory_order_relaxed) + sign * b;
    d.live.store(v, std::memory_order_relaxed);
  } else {
    v = d.live.fetch_add(sign * b, std::memory_order_relaxed) + sign * b;
  }
  if (sign > 0) {
    if (__builtin_expect(g_settling_count.load(std::memory_order_relaxed) != 0, 1) &&
        (v > d.window_max.load(std::memory_order_relaxed) || v > d.peak.load(std::memory_order_relaxed))) {
      // Frees still settling make v too high: a new high is only one once
      // they are counted (the peak and the window maximum stay exact).
      SettleAll(plain);
      v = d.live.load(std::memory_order_relaxed);
    }
    if (v > d.window_max.load(std::memory_order_relaxed)) d.window_max.store(v, std::memory_order_relaxed);
    int64_t peak = d.peak.load(std::memory_order_relaxed);
    if (v > peak) {
      if (plain) {
        d.peak.store(v, std::memory_order_relaxed);
        d.epoch.store(d.epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      } else {
        while (v > peak && !d.peak.compare_exchange_weak(peak, v, std::memory_order_relaxed)) {
        }
        d.epoch.fetch_add(1, std::memory_order_release);
      }
    }
  }
  if (__builtin_expect(t_timeline_countdown-- == 0, 0)) {
    t_timeline_countdown = kTimelineCheckOps;
    SettleAll(plain);  // a timeline point sees every free made so far
    TimelineTick();
  }
  return cls;
}

// The shard part of an insert. `count`: +1 a new allocation, -1 a restored
// one (its free is taken back), 0 a record that was counted already. Returns
// false when the table bound drops it; *old_size >= 0 when ptr had a record.
SPYGLASS_HOT bool TableInsert(uintptr_t ptr, uint64_t size, uint32_t site, bool plain, int count_delta,
                              int64_t* old_size, uint32_t* old_site) {
  uint64_t h = PtrHash(ptr);
  Shard& s = g_shards[h >> (64 - kShardBits)];
  ShardLock lock(s.lock, plain);
  uint64_t count = s.count.load(std::memory_order_relaxed);
  if ((count + 1) * 5 > s.cap * 4) {
    if (count >= g_max_per_shard || !Grow(s)) {
      Count(kDroppedTable);
      return false;
    }
  }
  bool found;
  uint64_t i = Find(s, ptr, h, &found);
  if (found) {
    *old_size = static_cast<int64_t>(s.slots[i].meta >> 24);
    *old_site = static_cast<uint32_t>(s.slots[i].meta & 0xffffff);
  } else {
    s.slots[i].ptr = ptr;
    s.count.store(count + 1, std::memory_order_relaxed);
  }
  s.slots[i].meta = (size << 24) | site;
  s.bytes.store(s.bytes.load(std::memory_order_relaxed) + static_cast<int64_t>(size) - (found ? *old_size : 0),
                std::memory_order_relaxed);
  // s.recent is not cleared of ptr here (that loop was a third of the
  // insert): a stale entry only matters when ptr comes back untracked and is
  // then freed, an unknown free that is then counted as a double free.
  if (count_delta < 0)
    s.frees.store(s.frees.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  else if (count_delta > 0)
    s.allocations.store(s.allocations.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return true;
}

void Replaced(uintptr_t ptr, int64_t old_size, uint32_t old_site, bool plain) {
  Count(kReplaced);
  LargeChange(ptr, static_cast<uint64_t>(old_size), -1);
  const uint32_t old_cls = Account(old_site, static_cast<uint64_t>(old_size), -1, plain);
  if (g_counter_on.load(std::memory_order_relaxed)) CounterAppend(old_cls, -old_size);
}

// Single-writer mode: the writer's latest allocation waits here, out of the
// table, until the writer's next allocation puts it in. A block freed before
// that (malloc/free churn: most short-lived blocks) never touches the table.
// It is counted (totals, peak, timeline) from the start. Only the writer
// touches it, in plain mode; MakeSharedSlow moves it into the table once the
// writer is quiescent, so readers (ForEachLive) see it.

SPYGLASS_HOT void FlushPendingInline(bool plain) {
  const PendingRecord r = g_pending_rec;
  if (r.ptr == 0) return;
  g_pending_rec.ptr = 0;
  g_pending_live.store(0, std::memory_order_relaxed);
  int64_t old_size = -1;
  uint32_t old_site = 0;
  if (!TableInsert(r.ptr, r.size, r.site, plain, 0, &old_size, &old_site)) {
    Account(r.site, r.size, -1, plain);  // dropped: no longer counted as live
    LargeChange(r.ptr, r.size, -1);
    return;
  }
  if (old_size >= 0) Replaced(r.ptr, old_size, old_site, plain);
}
void FlushPending(bool plain) { FlushPendingInline(plain); }

// Inserts (or replaces) the record of `ptr`. `restored`: a record Take
// removed goes back (not a new allocation: the free is taken back instead).
void Insert(uintptr_t ptr, uint64_t size, uint32_t site, bool restored) {
  Op op;
  if (op.plain && __builtin_expect(g_released_waiting != 0, 0)) ReusedWhileWaiting(ptr);
  if (op.plain && !restored) {
    if (g_pending_rec.ptr == ptr) {
      Replaced(ptr, static_cast<int64_t>(g_pending_rec.size), g_pending_rec.site, true);
    } else {
      FlushPendingInline(true);
      if (g_filter.load(std::memory_order_relaxed)) FilterAdd(ptr);
    }
    g_pending_rec = {ptr, size, site};
    g_pending_live.store(ptr, std::memory_order_relaxed);
    AddTo(g_single_allocations, uint64_t{1}, true);
  } else {
    int64_t old_size = -1;
    uint32_t old_site = 0;
    if (!TableInsert(ptr, size, site, op.plain, restored ? -1 : 1, &old_size, &old_site)) return;
    if (old_size >= 0)
      Replaced(ptr, old_size, old_site, op.plain);
    else if (g_filter.load(std::memory_order_relaxed))
      FilterAdd(ptr);
  }
  const uint32_t cls = Account(site, size, 1, op.plain);
  LargeChange(ptr, size, 1);
  if (g_counter_on.load(std::memory_order_relaxed)) CounterAppend(cls, static_cast<int64_t>(size));
}
}  // namespace

namespace {
inline void PrefetchSlot(uintptr_t ptr) {
  const uint64_t h = PtrHash(ptr);
  Shard& s = g_shards[h >> (64 - kShardBits)];
  // A torn pair (a Grow in between) only aims the hint elsewhere: a prefetch
  // of any address is harmless.
  Slot* slots = __atomic_load_n(&s.slots, __ATOMIC_RELAXED);
  if (slots) __builtin_prefetch(&slots[Home(h, __atomic_load_n(&s.cap, __ATOMIC_RELAXED))], 1, 3);
}
}  // namespace

// Single-writer mode: the table work of an allocation is the previous
// pending record's insert, and a free of the pending record touches no table
// (churn): nothing to load then.
void PrefetchInsert(uintptr_t ptr) {
  if (g_mode.load(std::memory_order_relaxed) == kModeSingle) ptr = g_pending_live.load(std::memory_order_relaxed);
  if (ptr) PrefetchSlot(ptr);
}
void PrefetchErase(uintptr_t ptr) {
  if (g_mode.load(std::memory_order_relaxed) == kModeSingle && g_pending_live.load(std::memory_order_relaxed) == ptr)
    return;
  PrefetchSlot(ptr);
}

void Record(uintptr_t ptr, uint64_t size, uint32_t cls, const uintptr_t* frames, int depth) {
  if (ptr == 0) return;
  if (size > kMaxSize) size = kMaxSize;
  Insert(ptr, size, depth > 0 ? InternStack(cls, frames, depth, 0) : cls, false);
}

uint32_t InternStack(uint32_t cls, const uintptr_t* frames, int depth, uint64_t hash) {
  if (depth <= 0) return cls;
  if (hash == 0) {
    uint64_t h = kStackHashSeed;
    for (int i = 0; i < depth; ++i) h = StackHashStep(h, frames[i], i);
    hash = StackHashFinish(h, cls, depth);
  }
  return InternSite(cls, frames, depth, hash);
}

void RecordSite(uintptr_t ptr, uint64_t size, uint32_t site) {
  if (ptr == 0) return;
  if (size > kMaxSize) size = kMaxSize;
  Insert(ptr, size, site, false);
}

void Restore(const LiveRecord& r) {
  if (r.ptr != 0) Insert(r.ptr, r.size, r.site, true);
}

namespace {
// Removes the record of `ptr`, in an operation (`plain`: single-writer
// mode). Returns whether it was tracked. `quiet`: an untracked pointer is not
// counted (no unknown/double free). `out`, if given, receives the record.
// `table_only`: a settling free, whose record was in the table when freed
// (the pending record may since be a new block at the same address).
SPYGLASS_HOT bool EraseIn(bool plain, uintptr_t ptr, bool quiet, LiveRecord* out, bool table_only = false) {
  uint64_t h = PtrHash(ptr);
  Shard& s = g_shards[h >> (64 - kShardBits)];
  int64_t size = -1;
  uint32_t site = 0;
  bool double_free = false;
  if (plain && !table_only && g_pending_rec.ptr == ptr) {
    // The writer's latest allocation, freed before it reached the table.
    size = static_cast<int64_t>(g_pending_rec.size);
    site = g_pending_rec.site;
    g_pending_rec.ptr = 0;
    g_pending_live.store(0, std::memory_order_relaxed);
    s.recent[s.recent_pos++ % kRecent] = ptr;
    AddTo(g_single_frees, uint64_t{1}, true);
  } else {
    ShardLock lock(s.lock, plain);
    bool found = false;
    uint64_t i = s.cap ? Find(s, ptr, h, &found) : 0;
    if (found) {
      size = static_cast<int64_t>(s.slots[i].meta >> 24);
      site = static_cast<uint32_t>(s.slots[i].meta & 0xffffff);
      EraseAt(s, i);
      s.count.store(s.count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      s.bytes.store(s.bytes.load(std::memory_order_relaxed) - size, std::memory_order_relaxed);
      s.recent[s.recent_pos++ % kRecent] = ptr;
      s.frees.store(s.frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else if (!quiet) {
      for (uint64_t r : s.recent) double_free |= (r == ptr);
    }
  }
  if (size < 0) {
    if (!quiet) Count(double_free ? kDoubleFrees : kUnknownFrees);
    return false;
  }
  if (g_filter.load(std::memory_order_relaxed)) FilterRemove(ptr);
  LargeChange(ptr, static_cast<uint64_t>(size), -1);
  const uint32_t cls = Account(site, static_cast<uint64_t>(size), -1, plain);
  if (g_counter_on.load(std::memory_order_relaxed)) CounterAppend(cls, -size);
  if (out) *out = {ptr, static_cast<uint64_t>(size), site};
  return true;
}

bool Erase(uintptr_t ptr, bool quiet, LiveRecord* out = nullptr) {
  if (ptr == 0) return false;
  Op op;
  return EraseIn(op.plain, ptr, quiet, out);
}

// ---- waiting frees (single-writer mode, the heap hook) -----------------------------
// A free of a long-lived block costs two cache misses on random addresses:
// the live table's slot (its size and site are there, so neither the erase
// nor the totals can go before it) and glibc's chunk header. Overlapped
// (both prefetched at the free), they still cost one. So the writer's frees
// wait in a ring of kWaiting: RemoveSoon starts loading both and returns the
// block freed kWaiting frees earlier, whose erase then hits the cache, for
// the hook to hand to glibc. A waiting block still counts as live and glibc
// has not got it back (it cannot hand the address out again). Exactness: a
// waiting free is counted ("settled": erased, marked, still waiting for
// glibc) before anything reads what it changes: a possible new peak or
// window maximum (Account), a timeline point, a switch to shared mode
// (MakeSharedSlow: snapshots, other threads; the blocks go to glibc then),
// and SettleFrees (the API's totals and profiles, the heap hook's files).
// Held back from glibc: at most kWaiting blocks, each under kLargeBlock (a
// larger block, in the g_large filter, is freed at once).
void SettleAll(bool plain) {
  for (uint32_t i = 0; i < kWaiting && g_settling_count.load(std::memory_order_relaxed) != 0; ++i) {
    uint32_t k = (g_waiting_next + i) % kWaiting;  // oldest first
    uintptr_t p = g_waiting[k];
    if (p == 0 || (p & kSettled)) continue;
    g_waiting[k] = p | kSettled;
    g_settling_count.store(g_settling_count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    EraseIn(plain, p & ~kWaitFlags, (p & kReleased) != 0, nullptr, true);
  }
}

// After SettleAll, once no operation runs: the waiting blocks go to glibc.
void ReleaseWaiting() {
  for (uintptr_t& w : g_waiting) {
    if (w != 0 && !(w & kReleased)) __libc_free(reinterpret_cast<void*>(w & ~kWaitFlags));
    w = 0;
  }
  g_released_waiting = 0;
}

// Insert, single-writer mode: `ptr` may be a block whose erase waits
// (RemoveLater: its allocator had it back and hands it out again). The erase
// comes first: the table never holds two records of one address.
__attribute__((noinline)) void ReusedWhileWaiting(uintptr_t ptr) {
  for (uintptr_t& w : g_waiting) {
    if (!(w & kReleased) || (w & ~kWaitFlags) != ptr) continue;
    if (!(w & kSettled)) {
      g_settling_count.store(g_settling_count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      EraseIn(true, ptr, true, nullptr, true);
    }
    w = 0;
    --g_released_waiting;
  }
}
}  // namespace

namespace {
// Puts an entry into the ring; returns the oldest one it replaces (0 or
// with its flags), whose erase is done now (its slot was loaded kWaiting
// frees ago). Single-writer mode.
uintptr_t PushWaiting(uintptr_t entry) {
  const uintptr_t oldest = g_waiting[g_waiting_next];
  g_waiting[g_waiting_next] = entry;
  g_waiting_next = (g_waiting_next + 1) % kWaiting;
  if (oldest & kReleased) --g_released_waiting;
  if (oldest == 0 || (oldest & kSettled)) {
    g_settling_count.store(g_settling_count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return oldest;
  }
  EraseIn(true, oldest & ~kWaitFlags, (oldest & kReleased) != 0, nullptr, true);
  return oldest;
}
}  // namespace

int RemoveSoon(uintptr_t ptr, uintptr_t release[2]) {
  Op op;
  if (!op.plain || g_pending_rec.ptr == ptr || g_counter_on.load(std::memory_order_relaxed) || MaybeLarge(ptr)) {
    // Shared mode, the pending record (no table work), a large block, or a
    // trace's counter track running (its events are timed when counted): at once.
    if (op.plain && g_counter_on.load(std::memory_order_relaxed)) SettleAll(true);
    EraseIn(op.plain, ptr, false, nullptr);
    release[0] = ptr;
    return 1;
  }
  bool again = false;
  for (uintptr_t w : g_waiting) again |= (w ^ ptr) <= kSettled;  // ptr, settled or not (not a released one)
  for (uintptr_t& w : g_waiting) {
    if (__builtin_expect(!again, 1)) break;
    if ((w ^ ptr) > kSettled) continue;
    // Freed again while its first free waits (a double free): the first one
    // completes now, then this one, so glibc sees the double free where the
    // program made it.
    if ((w & 1) == 0) {
      g_settling_count.store(g_settling_count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      EraseIn(true, ptr, false, nullptr, true);
    }
    w = 0;
    EraseIn(true, ptr, false, nullptr, true);  // counted as a double free
    release[0] = release[1] = ptr;
    return 2;
  }
  PrefetchSlot(ptr);
  __builtin_prefetch(reinterpret_cast<const char*>(ptr) - sizeof(size_t), 0, 3);  // glibc's chunk header
  const uintptr_t oldest = PushWaiting(ptr);
  if (oldest == 0 || (oldest & kReleased)) return 0;
  release[0] = oldest & ~kWaitFlags;
  return 1;
}

void RemoveLater(uintptr_t ptr) {
  if (ptr == 0) return;
  Op op;
  if (!op.plain || g_pending_rec.ptr == ptr || g_counter_on.load(std::memory_order_relaxed) || MaybeLarge(ptr)) {
    if (op.plain && g_counter_on.load(std::memory_order_relaxed)) SettleAll(true);
    EraseIn(op.plain, ptr, true, nullptr);  // as RemoveIfTracked
    return;
  }
  for (uintptr_t w : g_waiting) {
    if ((w & ~kWaitFlags) != ptr) continue;
    EraseIn(true, ptr, true, nullptr);  // already waiting (freed twice through different paths): at once
    return;
  }
  PrefetchSlot(ptr);
  ++g_released_waiting;
  PushWaiting(ptr | kReleased);
}

void SettleFrees() {
  if (g_settling_count.load(std::memory_order_relaxed) == 0 || Guard::InsideTracking()) return;
  if (g_mode.load(std::memory_order_acquire) == kModeSingle &&
      g_writer.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(&t_guard)) {
    Op op;
    if (op.plain) SettleAll(true);
    return;
  }
  MakeShared();  // settles them once the writer is quiescent
}

void Remove(uintptr_t ptr) { Erase(ptr, false); }
bool RemoveIfTracked(uintptr_t ptr) { return Erase(ptr, true); }
bool Take(uintptr_t ptr, LiveRecord* out) { return Erase(ptr, true, out); }

void ForEachLive(const std::function<void(const LiveRecord&)>& f) {
  MakeShared();  // the tables are read under their locks
  std::vector<LiveRecord> batch;
  for (Shard& s : g_shards) {
    batch.clear();
    {
      // Copy under the lock, call f outside it (f may take other locks).
      s.lock.lock();
      uint64_t n = s.count.load(std::memory_order_relaxed);
      s.lock.unlock();
      batch.reserve(n + 16);
      LockGuard lock(s.lock);
      for (uint64_t i = 0; i < s.cap; ++i) {
        const Slot& sl = s.slots[i];
        if (sl.ptr == 0) continue;
        if (batch.size() == batch.capacity()) break;  // grew meanwhile: keep what fits (no allocation under lock)
        batch.push_back({sl.ptr, sl.meta >> 24, static_cast<uint32_t>(sl.meta & 0xffffff)});
      }
    }
    for (const LiveRecord& r : batch) f(r);
  }
}

uint64_t LiveCount() {
  uint64_t n = g_pending_live.load(std::memory_order_relaxed) != 0;
  for (const Shard& s : g_shards) n += s.count.load(std::memory_order_relaxed);
  return n;
}
uint64_t TableBytes() {
  MakeShared();
  uint64_t n = 0;
  for (Shard& s : g_shards) {
    LockGuard lock(s.lock);
    n += s.cap * sizeof(Slot);
  }
  return n;
}

const Site* GetSite(uint32_t id) { return static_cast<const Site*>(g_sites.Get(id)); }
uint32_t SiteClass(uint32_t id) {
  if (id < kFirstSite) return id;
  const Site* s = GetSite(id);
  return s ? s->cls : 0;
}
uint64_t SiteCount() { return g_sites.published.load(std::memory_order_relaxed); }

std::atomic<uint32_t> g_site_generation{0};

void RewriteSiteFrames(uintptr_t lo, uintptr_t hi, const std::function<uintptr_t(uintptr_t)>& to) {
  g_site_generation.fetch_add(1, std::memory_order_release);
  const uint32_t end = g_sites.end_id();
  for (uint32_t id = kFirstSite; id < end; ++id) {
    // Sites are written once; only their frame words change here (the arena is ours).
    Site* s = const_cast<Site*>(GetSite(id));
    if (!s) continue;
    for (uint32_t i = 0; i < s->depth; ++i) {
      uintptr_t w = __atomic_load_n(&s->frames[i], __ATOMIC_RELAXED);
      if (IsSymbolicFrame(w) || w < lo || w >= hi) continue;
      // A reader sees the old word or the new one, both meaningful; a racing
      // InternSite of the raw stack then just makes a new site.
      if (uintptr_t n = to(w)) __atomic_store_n(&s->frames[i], n, __ATOMIC_RELAXED);
    }
  }
}

uint64_t SiteBytes() { return g_sites.used_bytes(); }

std::vector<int64_t> LiveBytesByClass() {
  std::vector<int64_t> out(kMaxClasses + 1, 0);
  ForEachLive([&](const LiveRecord& r) { out[SiteClass(r.site)] += static_cast<int64_t>(r.size); });
  return out;
}

bool CounterStart(uint64_t capacity) {
  AtomicCounterEvent* buf = LazyMap(g_counter_buf, kMaxCounterEvents * sizeof(AtomicCounterEvent));
  if (!buf || g_counter_on.load()) return false;
  g_counter_cap = capacity < kMaxCounterEvents ? capacity : kMaxCounterEvents;
  g_counter_idx.store(0, std::memory_order_relaxed);
  g_counter_on.store(true, std::memory_order_release);
  return true;
}

void CounterStop(const CounterEvent** events, uint64_t* n, uint64_t* dropped) {
  g_counter_on.store(false, std::memory_order_release);
  uint64_t idx = g_counter_idx.load(std::memory_order_acquire);
  *n = idx < g_counter_cap ? idx : g_counter_cap;
  *dropped = idx > g_counter_cap ? idx - g_counter_cap : 0;
  // Same layout; entries whose ticks are still 0 were not finished and are skipped by the reader.
  *events = reinterpret_cast<const CounterEvent*>(g_counter_buf.load(std::memory_order_acquire));
}

void CounterRelease() {
  AtomicCounterEvent* buf = g_counter_buf.load(std::memory_order_acquire);
  if (!buf) return;
  // Zero (and give back) the pages used; the mapping stays so a late writer never faults.
  uint64_t used = g_counter_idx.load(std::memory_order_relaxed);
  if (used > g_counter_cap) used = g_counter_cap;
  size_t bytes = ((used * sizeof(AtomicCounterEvent)) + 4095) & ~size_t{4095};
  if (bytes) madvise(buf, bytes, MADV_DONTNEED);
  g_counter_idx.store(0, std::memory_order_relaxed);
}

uint32_t DeviceCount() { return g_device_count.load(std::memory_order_acquire); }
std::string_view DeviceName(uint32_t device) {
  if (device >= DeviceCount()) return "unknown";
  return {g_device_names[device], g_device_name_len[device]};
}
uint32_t ClassDeviceIndex(uint32_t cls) { return cls <= kMaxClasses ? g_class_device[cls] : 0; }
DeviceTotals GetDeviceTotals(uint32_t device) {
  DeviceTotals t;
  if (device >= kMaxDevices) return t;
  const Device& d = g_devices[device];
  t.live_bytes = d.live.load(std::memory_order_relaxed);
  t.peak_bytes = d.peak.load(std::memory_order_relaxed);
  t.peak_epoch = d.epoch.load(std::memory_order_acquire);
  return t;
}
int64_t TakeWindowMax(uint32_t device) {
  if (device >= kMaxDevices) return 0;
  Device& d = g_devices[device];
  return d.window_max.exchange(d.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}
const SiteStats* GetSiteStats(uint32_t id) {
  if (id < kFirstSite) return id <= kMaxClasses ? &g_class_stats[id] : nullptr;
  const Site* s = GetSite(id);
  return s ? &s->stats : nullptr;
}
uint32_t FirstSiteId() { return kFirstSite; }
uint32_t EndSiteId() { return g_sites.end_id(); }
SiteValue SiteNow(uint32_t id) {
  const SiteStats* st = GetSiteStats(id);
  if (!st) return {};
  return {st->bytes.load(std::memory_order_relaxed), st->count.load(std::memory_order_relaxed)};
}
SiteValue SiteAtPeak(uint32_t id) {
  const SiteStats* st = GetSiteStats(id);
  if (!st) return {};
  const uint64_t epoch = g_devices[g_class_device[SiteClass(id)]].epoch.load(std::memory_order_acquire);
  if (st->stamp.load(std::memory_order_acquire) == epoch)
    return {st->peak_bytes.load(std::memory_order_relaxed), st->peak_count.load(std::memory_order_relaxed)};
  return {st->bytes.load(std::memory_order_relaxed), st->count.load(std::memory_order_relaxed)};
}
void ResetPeaks() {
  for (Device& d : g_devices) {
    int64_t live = d.live.load(std::memory_order_relaxed);
    d.peak.store(live, std::memory_order_relaxed);
    d.window_max.store(live, std::memory_order_relaxed);
    d.epoch.fetch_add(1, std::memory_order_release);  // every site's value at the peak is its value now
  }
}

namespace {
void PrepareFork() {
  // The shard locks below must mean something: another thread that records
  // without them could be halfway through a change. Not when the forking
  // thread is the single writer itself (it is not inside an operation): the
  // child gets a consistent copy, pending record included, and the parent
  // keeps its single-writer mode.
  if (g_mode.load(std::memory_order_acquire) != kModeSingle ||
      g_writer.load(std::memory_order_relaxed) != reinterpret_cast<uintptr_t>(&t_guard))
    MakeShared();
  Guard::Enter();
  g_class_lock.lock();
  for (Shard& s : g_shards) s.lock.lock();
  g_filter_lock.lock();
}
void ParentFork() {
  g_filter_lock.unlock();
  for (Shard& s : g_shards) s.lock.unlock();
  g_class_lock.unlock();
  Guard::Leave();
}
void ChildFork() {
  for (Shard& s : g_shards) s.lock.reset();
  // One thread now: single-writer mode again if membarrier works here.
  g_writer.store(0, std::memory_order_relaxed);
  g_writer_busy.store(0, std::memory_order_relaxed);
  if (RegisterMembarrier()) {
    g_mode.store(kModeSingle, std::memory_order_release);
  } else {
    SettleAll(true);     // the only thread: counted, and to glibc, before shared mode forgets them
    ReleaseWaiting();
    FlushPending(true);
    g_mode.store(kModeShared, std::memory_order_release);
  }
  g_class_lock.reset();
  g_filter_lock.reset();
  g_counter_on.store(false);  // the parent's session is not the child's
  ResetPeaks();               // nor are its peak and its timeline
  spyglass::memory::TimelineReset();
  Guard::Leave();
}
std::atomic<bool> g_fork_installed{false};
}  // namespace

void InstallForkHandlers() {
  if (g_fork_installed.exchange(true)) return;
  pthread_atfork(PrepareFork, ParentFork, ChildFork);
}

std::atomic<bool> g_initialized{false};

uint32_t ForEachLiveNoAlloc(void (*visit)(const LiveRecord& r, void* ctx), void* ctx) {
  // Single-writer mode: the writer updates without the shard locks. If this
  // thread is that writer (a signal on it, or its allocation failing), no
  // other thread changes the tables until it goes on: read them as they are
  // (from a signal inside one of its own updates, that one may be half done).
  // Otherwise switch to shared mode, which waits for the writer's update in
  // progress, so that the locks below mean something.
  const bool self_writer = g_mode.load(std::memory_order_acquire) != kModeShared &&
                           g_writer.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(&t_guard);
  if (!self_writer) MakeShared();
  // The writer's last record waits outside the table (FlushPending).
  if (self_writer && g_pending_rec.ptr != 0)
    visit({g_pending_rec.ptr, g_pending_rec.size, g_pending_rec.site}, ctx);
  uint32_t skipped = 0;
  for (Shard& s : g_shards) {
    bool locked = false;
    for (int spins = 0; spins < (1 << 16) && !locked; ++spins) {
      locked = s.lock.try_lock();
      if (!locked && spins > 64) sched_yield();
    }
    if (!locked) {
      ++skipped;
      continue;
    }
    for (uint64_t i = 0; i < s.cap; ++i) {
      const Slot& sl = s.slots[i];
      if (sl.ptr == 0) continue;
      bool settling = false;  // freed, its erase waiting (only the writer's own dump sees any)
      for (uint32_t k = 0; self_writer && k < kWaiting; ++k) settling |= (g_waiting[k] & ~kReleased) == sl.ptr;
      if (!settling) visit({sl.ptr, sl.meta >> 24, static_cast<uint32_t>(sl.meta & 0xffffff)}, ctx);
    }
    s.lock.unlock();
  }
  return skipped;
}
uint32_t SiteIdEnd() { return g_sites.end_id(); }
uint32_t FunctionIdEnd() { return g_functions.end_id(); }

__attribute__((constructor)) static void InitAtLoad() {
  ScopedUntracked untracked;
  if (RegisterMembarrier()) g_mode.store(kModeSingle, std::memory_order_release);
  InstallForkHandlers();
  g_initialized.store(true, std::memory_order_release);
}

}  // namespace spyglass::memory::internal
