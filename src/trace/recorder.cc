#include "trace/recorder.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <new>

namespace spyglass::internal {

GlobalState g_state;
constinit thread_local ThreadSlot t_slot __attribute__((tls_model("initial-exec"))) = {nullptr, false};

namespace {

constexpr size_t kChunkWords = kChunkBytes / 8;
// Words at the end of each chunk that only end records may use, so that an
// event whose begin fit can almost always be closed after the bound is hit.
constexpr size_t kEndReserveWords = 256;
// Free chunks kept for reuse between sessions (beyond this they are unmapped).
constexpr size_t kMaxCachedChunks = 512;
// Chunks faulted in at session start, so that first events do not page-fault.
constexpr size_t kPrefaultChunks = 16;

uint64_t g_empty_chunk[1];

int64_t current_tid() { return static_cast<int64_t>(syscall(SYS_gettid)); }

// Bounded pool of chunks shared by all threads; touched only on slow paths.
class ChunkPool {
 public:
  // In a forked child: the lock may have been held by a thread that is gone.
  void reset_lock_after_fork() { new (&mu_) std::mutex; }

  uint64_t* acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_use_bytes_ + kChunkBytes > limit_bytes_) return nullptr;
    uint64_t* chunk = nullptr;
    if (!free_.empty()) {
      chunk = free_.back();
      free_.pop_back();
    } else {
      chunk = map_chunk();
      if (chunk == nullptr) return nullptr;
    }
    in_use_bytes_ += kChunkBytes;
    return chunk;
  }

  // Accounts memory held outside chunks (compacted buffers of exited threads).
  void charge(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ += bytes;
  }
  void uncharge(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ -= bytes;
  }

  void release(uint64_t* chunk) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ -= kChunkBytes;
    if (free_.size() < kMaxCachedChunks) free_.push_back(chunk);
    else munmap(chunk, kChunkBytes);
  }

  // Sets the total bound and faults in a few chunks ahead of use.
  void configure(uint64_t limit_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_bytes_ = limit_bytes;
    size_t want = std::min<size_t>(kPrefaultChunks, limit_bytes / kChunkBytes);
    while (free_.size() < want) {
      uint64_t* c = map_chunk();
      if (c == nullptr) break;
      free_.push_back(c);
    }
  }

 private:
  static uint64_t* map_chunk() {
    void* p = mmap(nullptr, kChunkBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint64_t*>(p);
  }

  std::mutex mu_;
  std::vector<uint64_t*> free_;
  uint64_t in_use_bytes_ = 0;
  uint64_t limit_bytes_ = 0;
};

struct ChunkUse {
  uint64_t* begin;
  uint64_t* end;  // valid for all but the current (last) chunk
  uint64_t first_ticks = 0;  // when the thread began writing it (ring mode)
};

// The most chunks one thread holds in ring mode: its chunk list is reserved
// to this at bind, so that it never moves while the crash handler reads it.
constexpr size_t kMaxRingChunksPerThread = std::size(UnlockedView{}.span_begin) - 1;
// Threads whose buffer list is reserved for the crash handler.
constexpr size_t kReservedThreads = 4096;

struct ThreadBufferImpl : ThreadBuffer {
  std::mutex mu;                // guards chunks, bound_word writes, name
  std::vector<ChunkUse> chunks;
  uint64_t bytes = 0;
  // After the thread exited: the records of its last chunk, copied out so
  // that many short-lived threads do not each pin a whole chunk. They follow
  // the records of `chunks`.
  std::vector<uint64_t> compacted;
  bool full = false;            // the bound was hit this session: drop begins fast
  std::atomic<uint64_t> dropped{0};
  uint64_t overwritten = 0;       // ring mode: begins overwritten this session
  uint64_t held_since_ticks = 0;  // ring mode: begins before this were overwritten
  int64_t tid = 0;
  std::string name;
  bool name_overridden = false;
};

struct Registry {
  std::mutex mu;
  std::vector<ThreadBufferImpl*> live;
  std::vector<ThreadBufferImpl*> retired;  // threads that exited, kept until collected
  ChunkPool pool;
  std::atomic<uint64_t> bytes_per_thread{0};
  std::atomic<uint64_t> dropped_after_exit{0};
  uint64_t generation = 0;
  uint64_t released_generation = 0;  // the last session given to recorder_release
  bool collecting = false;  // between recorder_collect and recorder_release
  std::atomic<bool> ring{false};
  // Ring mode: what buffers of exited threads held when they were reclaimed.
  uint64_t reclaimed_overwritten = 0;
  uint64_t reclaimed_held_since_ticks = 0;
};

// Leaked on purpose: annotations may run in static destructors and at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// The walk of recorder_collect and recorder_snapshot (r.mu held): each
// thread buffer bound to `word`, live ones then exited ones, under its lock,
// with a RawThread of its name and counts that `spans(tb, exited, &t)` gives
// its records; kept when that returns true. Then the reclaimed buffers of
// exited threads: their overwritten count, on a line of its own.
template <typename Spans>
std::vector<RawThread> walk_threads(const Registry& r, uint64_t word, Spans spans) {
  std::vector<RawThread> out;
  auto one = [&](ThreadBufferImpl* tb, bool exited) {
    std::lock_guard<std::mutex> tlock(tb->mu);
    if (tb->bound_word != word) return;
    RawThread t;
    t.tid = tb->tid;
    t.name = tb->name;
    t.dropped = tb->dropped.load(std::memory_order_relaxed);
    t.overwritten = tb->overwritten;
    t.held_since_ticks = tb->held_since_ticks;
    if (spans(tb, exited, &t)) out.push_back(std::move(t));
  };
  for (ThreadBufferImpl* tb : r.live) one(tb, false);
  for (ThreadBufferImpl* tb : r.retired) one(tb, true);
  if (r.reclaimed_overwritten != 0) {
    RawThread t;
    t.tid = -1;
    t.name = "exited threads";
    t.overwritten = r.reclaimed_overwritten;
    t.held_since_ticks = r.reclaimed_held_since_ticks;
    out.push_back(std::move(t));
  }
  return out;
}

// Where chunk i's records end: the thread's cursor in its current (last) one.
const uint64_t* chunk_end(const ThreadBufferImpl* tb, size_t i) {
  return i + 1 == tb->chunks.size() ? tb->cursor.load(std::memory_order_acquire) : tb->chunks[i].end;
}

std::string os_thread_name() {
  char buf[64] = {0};
  if (pthread_getname_np(pthread_self(), buf, sizeof buf) != 0) return {};
  return buf;
}

// Moves an exited thread's last, partly used chunk into a right-sized block
// and returns the chunk to the pool. Full chunks stay: copying them would
// hold their records twice for a while.
void compact(Registry& r, ThreadBufferImpl* tb) {
  if (tb->chunks.empty()) return;
  ChunkUse last = tb->chunks.back();
  tb->compacted.assign(last.begin, last.end);
  tb->chunks.pop_back();
  r.pool.release(last.begin);
  uint64_t bytes = tb->compacted.size() * 8;
  tb->bytes = tb->bytes - kChunkBytes + bytes;
  r.pool.charge(bytes);
}

void release_chunks(Registry& r, ThreadBufferImpl* tb, size_t keep) {
  if (!tb->compacted.empty()) {
    uint64_t bytes = tb->compacted.size() * 8;
    r.pool.uncharge(bytes);
    tb->bytes -= bytes;
    tb->compacted = {};
  }
  while (tb->chunks.size() > keep) {
    r.pool.release(tb->chunks.back().begin);
    tb->chunks.pop_back();
    tb->bytes -= kChunkBytes;
  }
}

void point_at(ThreadBufferImpl* tb, uint64_t* chunk) {
  tb->cursor.store(chunk, std::memory_order_relaxed);
  tb->soft_limit = chunk + kChunkWords - kEndReserveWords;
  tb->hard_limit = chunk + kChunkWords;
}

void point_at_nothing(ThreadBufferImpl* tb) {
  tb->cursor.store(g_empty_chunk, std::memory_order_relaxed);
  tb->soft_limit = g_empty_chunk;
  tb->hard_limit = g_empty_chunk;
}

// Runs at the thread's exit: hand the buffer to the collector and stop
// recording on this thread.
struct ThreadExitHook {
  ~ThreadExitHook() {
    auto* tb = static_cast<ThreadBufferImpl*>(t_slot.buffer);
    // The main thread's buffer stays: static destructors may still annotate.
    if (tb == nullptr || tb->tid == static_cast<int64_t>(getpid())) return;
    t_slot.buffer = nullptr;
    t_slot.exited = true;
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live.erase(std::find(r.live.begin(), r.live.end(), tb));
    bool keep;
    {
      std::lock_guard<std::mutex> tlock(tb->mu);
      if (!tb->chunks.empty()) tb->chunks.back().end = tb->cursor.load(std::memory_order_relaxed);
      // Events of the current (or just stopped) session must survive the
      // thread, until that session is collected.
      keep = tb->bound_word != 0 && (tb->bound_word >> 8) == r.generation && r.generation != r.released_generation;
      // While a collector parses the chunks, they must stay where they are.
      if (keep && !r.collecting) compact(r, tb);
      else if (!keep) release_chunks(r, tb, 0);
    }
    if (keep) r.retired.push_back(tb);
    else delete tb;
  }
};

ThreadBufferImpl* create_buffer() {
  auto* tb = new ThreadBufferImpl;
  tb->tid = current_tid();
  tb->name = os_thread_name();
  point_at_nothing(tb);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.live.push_back(tb);
  }
  static thread_local ThreadExitHook hook;
  (void)&hook;
  t_slot.buffer = tb;
  return tb;
}

}  // namespace

namespace {

// Ring mode, pool exhausted: frees the buffer of the thread that exited
// first (its events are the oldest of a thread nobody extends), counting its
// events as overwritten. Called with `self->mu` held; gives up rather than
// wait for the registry.
bool reclaim_retired(Registry& r) {
  std::unique_lock<std::mutex> lock(r.mu, std::try_to_lock);
  if (!lock.owns_lock() || r.retired.empty() || r.collecting) return false;
  ThreadBufferImpl* old = r.retired.front();
  {
    std::lock_guard<std::mutex> tlock(old->mu);
    uint64_t n = old->overwritten;
    for (const ChunkUse& c : old->chunks) n += count_begins(c.begin, c.end);
    n += count_begins(old->compacted.data(), old->compacted.data() + old->compacted.size());
    r.reclaimed_overwritten += n;
    r.reclaimed_held_since_ticks = std::max(r.reclaimed_held_since_ticks, now_ticks());
    release_chunks(r, old, 0);
  }
  r.retired.erase(r.retired.begin());
  delete old;
  return true;
}

// A thread's oldest chunk, taken for another (its begins counted as
// overwritten); nullptr when it holds only its current one. Called with
// `victim->mu` held.
uint64_t* take_oldest(ThreadBufferImpl* victim) {
  if (victim->chunks.size() < 2) return nullptr;
  ChunkUse old = victim->chunks.front();
  victim->overwritten += count_begins(old.begin, old.end);
  victim->held_since_ticks = victim->chunks[1].first_ticks;
  victim->chunks.erase(victim->chunks.begin());
  victim->bytes -= kChunkBytes;
  return old.begin;
}

// Ring mode, pool exhausted: the oldest chunk of the live thread that holds
// the most, if that is more than `self` holds plus one, so that threads
// share the ring instead of the first one keeping it all. Called with
// `self->mu` held; only try-locks, so it never waits.
uint64_t* steal_chunk(Registry& r, ThreadBufferImpl* self) {
  std::unique_lock<std::mutex> lock(r.mu, std::try_to_lock);
  if (!lock.owns_lock() || r.collecting) return nullptr;
  ThreadBufferImpl* victim = nullptr;
  size_t most = self->chunks.size() + 1;
  for (ThreadBufferImpl* tb : r.live) {
    if (tb == self || !tb->mu.try_lock()) continue;
    if (tb->bound_word == self->bound_word && tb->chunks.size() > most) {
      victim = tb;
      most = tb->chunks.size();
    }
    tb->mu.unlock();
  }
  if (victim == nullptr || !victim->mu.try_lock()) return nullptr;
  std::lock_guard<std::mutex> vlock(victim->mu, std::adopt_lock);
  return take_oldest(victim);
}

// Ring mode, at bind when the pool is empty: as steal_chunk, but waits for
// the locks (the caller holds none), so that a new thread always gets a
// chunk while another thread holds two or more.
uint64_t* steal_chunk_for_bind(Registry& r, ThreadBufferImpl* self, uint64_t word) {
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.collecting) return nullptr;
  ThreadBufferImpl* victim = nullptr;
  size_t most = 1;
  for (ThreadBufferImpl* tb : r.live) {
    if (tb == self) continue;
    std::lock_guard<std::mutex> tlock(tb->mu);
    if (tb->bound_word == word && tb->chunks.size() > most) {
      victim = tb;
      most = tb->chunks.size();
    }
  }
  if (victim == nullptr) return nullptr;
  std::lock_guard<std::mutex> vlock(victim->mu);
  return take_oldest(victim);
}

// Ring mode: the chunk to write next when no new one may be had: the
// thread's oldest (its current one, if it has only that), its begins counted
// as overwritten. Only while the session records: after the stop, chunks are
// the collector's to read.
uint64_t* recycle_oldest(ThreadBufferImpl* tb) {
  if (tb->chunks.empty() || g_state.session_word.load(std::memory_order_relaxed) != tb->bound_word) return nullptr;
  ChunkUse old = tb->chunks.front();
  const uint64_t* end = tb->chunks.size() == 1 ? tb->cursor.load(std::memory_order_relaxed) : old.end;
  tb->overwritten += count_begins(old.begin, end);
  tb->held_since_ticks = tb->chunks.size() > 1 ? tb->chunks[1].first_ticks : now_ticks();
  tb->chunks.erase(tb->chunks.begin());
  tb->bytes -= kChunkBytes;
  return old.begin;
}

}  // namespace

ThreadBuffer* bind_slow(uint64_t word) {
  // The hot path's load was relaxed; this acquire pairs with the release
  // store of recorder_start, so the collector's reads of the last session
  // happen before we overwrite its chunks.
  word = g_state.session_word.load(std::memory_order_acquire);
  if ((word & 0xff) == 0) return nullptr;
  if (t_slot.exited) {
    registry().dropped_after_exit.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  auto* tb = static_cast<ThreadBufferImpl*>(t_slot.buffer);
  if (tb == nullptr) tb = create_buffer();
  Registry& r = registry();
  // Ring mode: a thread without a chunk takes one now, from the pool or
  // another thread (before its own lock: stealing takes the registry's).
  uint64_t* first = nullptr;
  if (r.ring.load(std::memory_order_relaxed)) {
    bool empty;
    {
      std::lock_guard<std::mutex> lock(tb->mu);
      release_chunks(r, tb, 1);
      empty = tb->chunks.empty();
    }
    if (empty) first = r.pool.acquire();
    if (empty && first == nullptr && reclaim_retired(r)) first = r.pool.acquire();
    if (empty && first == nullptr) first = steal_chunk_for_bind(r, tb, word);
  }
  std::lock_guard<std::mutex> lock(tb->mu);
  // The previous session was collected before this one started, so the old
  // chunks are free to overwrite. Keep one to avoid a pool round trip.
  release_chunks(r, tb, 1);
  if (first != nullptr) {
    tb->chunks.push_back({first, first, now_ticks()});
    tb->bytes += kChunkBytes;
  }
  tb->full = false;
  tb->dropped.store(0, std::memory_order_relaxed);
  if (!tb->name_overridden) tb->name = os_thread_name();
  tb->overwritten = 0;
  tb->held_since_ticks = 0;
  if (r.ring.load(std::memory_order_relaxed)) tb->chunks.reserve(kMaxRingChunksPerThread + 1);
  if (tb->chunks.empty()) {
    if (uint64_t* c = r.pool.acquire()) {
      tb->chunks.push_back({c, c, now_ticks()});
      tb->bytes += kChunkBytes;
    }
  }
  if (!tb->chunks.empty()) tb->chunks.front().first_ticks = now_ticks();
  if (tb->chunks.empty()) point_at_nothing(tb);
  else point_at(tb, tb->chunks.front().begin);
  tb->bound_word = word;
  return tb;
}

uint64_t* grow_slow(ThreadBuffer* base, uint32_t words, bool is_end) {
  auto* tb = static_cast<ThreadBufferImpl*>(base);
  if (tb->full && !is_end) {
    tb->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(tb->mu);
  const bool ring = r.ring.load(std::memory_order_relaxed);
  const uint64_t per_thread = r.bytes_per_thread.load(std::memory_order_relaxed);
  uint64_t* chunk = nullptr;
  if (tb->bytes + kChunkBytes <= per_thread) {
    chunk = r.pool.acquire();
    if (chunk == nullptr && ring && reclaim_retired(r)) chunk = r.pool.acquire();
  }
  if (chunk == nullptr && ring && g_state.session_word.load(std::memory_order_relaxed) == tb->bound_word)
    chunk = steal_chunk(r, tb);
  if (chunk == nullptr && ring) {
    // The current chunk's records end here, before the oldest one goes.
    if (!tb->chunks.empty()) tb->chunks.back().end = tb->cursor.load(std::memory_order_relaxed);
    chunk = recycle_oldest(tb);
  }
  if (chunk == nullptr) {
    tb->full = !ring;
    tb->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (!tb->chunks.empty()) tb->chunks.back().end = tb->cursor.load(std::memory_order_relaxed);
  tb->chunks.push_back({chunk, chunk, ring ? now_ticks() : 0});
  tb->bytes += kChunkBytes;
  point_at(tb, chunk);
  (void)words;  // a record never exceeds a chunk (names are truncated)
  return chunk;
}

void add_arg(uint64_t word, std::string_view key, ArgType type, uint64_t bits, std::string_view str) {
  if (word == 0) return;
  ThreadBuffer* tb = t_slot.buffer;
  if (tb == nullptr || tb->bound_word != word) return;
  size_t klen = std::min<size_t>(key.size(), 255);
  size_t vlen = type == ArgType::kString ? std::min<size_t>(str.size(), kMaxStringBytes) : 8;
  uint32_t words = static_cast<uint32_t>(1 + words_for(klen) + words_for(vlen));
  uint64_t* c = reserve(tb, words);
  if (c == nullptr) return;
  c[0] = (kTagArg << 56) | (uint64_t(type) << 48) | (uint64_t(klen) << 32) | vlen;
  uint64_t* k = c + 1;
  k[words_for(klen) - (klen ? 1 : 0)] = 0;
  std::memcpy(k, key.data(), klen);
  uint64_t* v = k + words_for(klen);
  if (type == ArgType::kString) {
    if (vlen) v[words_for(vlen) - 1] = 0;
    std::memcpy(v, str.data(), vlen);
  } else {
    v[0] = bits;
  }
  publish(tb, c + words);
}

uint64_t recorder_start(int level, const RecorderLimits& limits) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // Exited threads' buffers from an earlier, collected session.
  for (ThreadBufferImpl* tb : r.retired) {
    release_chunks(r, tb, 0);
    delete tb;
  }
  r.retired.clear();
  r.bytes_per_thread.store(limits.ring ? std::min<uint64_t>(limits.bytes_per_thread,
                                                              kMaxRingChunksPerThread * kChunkBytes)
                                       : limits.bytes_per_thread,
                            std::memory_order_relaxed);
  r.ring.store(limits.ring, std::memory_order_relaxed);
  r.reclaimed_overwritten = 0;
  r.reclaimed_held_since_ticks = 0;
  if (limits.ring) {
    r.live.reserve(kReservedThreads);
    r.retired.reserve(kReservedThreads);
  }
  r.pool.configure(limits.bytes_total);
  ++r.generation;
  uint64_t word = (r.generation << 8) | static_cast<uint64_t>(level & 0xff);
  g_state.session_word.store(word, std::memory_order_release);
  return word;
}

void recorder_stop() {
  uint64_t word = g_state.session_word.load(std::memory_order_relaxed);
  g_state.session_word.store(word & ~uint64_t{0xff}, std::memory_order_release);
}

std::vector<RawThread> recorder_collect(uint64_t word) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.collecting = true;
  return walk_threads(r, word, [](ThreadBufferImpl* tb, bool exited, RawThread* t) {
    // The chunks the thread will not write again (all but its current one,
    // all once it exited) are handed over to the collector, to free as it goes.
    size_t handed = exited ? tb->chunks.size() : (tb->chunks.empty() ? 0 : tb->chunks.size() - 1);
    for (size_t i = 0; i < handed; ++i) t->spans.emplace_back(tb->chunks[i].begin, tb->chunks[i].end);
    t->owned_spans = handed;
    tb->chunks.erase(tb->chunks.begin(), tb->chunks.begin() + static_cast<ptrdiff_t>(handed));
    tb->bytes -= handed * kChunkBytes;
    if (!tb->chunks.empty()) t->spans.emplace_back(tb->chunks.back().begin, chunk_end(tb, tb->chunks.size() - 1));
    if (!tb->compacted.empty())
      t->spans.emplace_back(tb->compacted.data(), tb->compacted.data() + tb->compacted.size());
    return !t->spans.empty() || t->dropped > 0;
  });
}

std::vector<RawThread> recorder_snapshot(uint64_t word, uint64_t since_ticks) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return walk_threads(r, word, [&](ThreadBufferImpl* tb, bool, RawThread* t) {
    // A chunk followed by one begun before `since_ticks` holds only older begins.
    size_t first = 0;
    while (first + 1 < tb->chunks.size() && tb->chunks[first + 1].first_ticks < since_ticks) ++first;
    std::vector<std::pair<size_t, size_t>> ranges;  // into t->copy; it may move while it grows
    size_t words = tb->compacted.size();
    for (size_t i = first; i < tb->chunks.size(); ++i) words += chunk_end(tb, i) - tb->chunks[i].begin;
    t->copy.reserve(words);
    auto append = [&](const uint64_t* b, const uint64_t* e) {
      ranges.emplace_back(t->copy.size(), t->copy.size() + (e - b));
      t->copy.insert(t->copy.end(), b, e);
    };
    for (size_t i = first; i < tb->chunks.size(); ++i) append(tb->chunks[i].begin, chunk_end(tb, i));
    if (!tb->compacted.empty()) append(tb->compacted.data(), tb->compacted.data() + tb->compacted.size());
    for (auto [b, e] : ranges) t->spans.emplace_back(t->copy.data() + b, t->copy.data() + e);
    return !t->spans.empty() || t->dropped > 0 || t->overwritten > 0;
  });
}

void recorder_visit_unlocked(uint64_t word, UnlockedView* v, void (*fn)(const UnlockedView&, void*), void* ctx) {
  Registry& r = registry();
  auto visit = [&](ThreadBufferImpl* tb) {
    if (tb == nullptr || tb->bound_word != word) return;
    v->tid = tb->tid;
    v->name = tb->name.c_str();
    v->overwritten = tb->overwritten;
    v->dropped = tb->dropped.load(std::memory_order_relaxed);
    v->spans = 0;
    const size_t n = std::min(tb->chunks.size(), std::size(v->span_begin));
    for (size_t i = 0; i < n; ++i) {
      const ChunkUse& c = tb->chunks[i];
      const uint64_t* end = i + 1 == n ? tb->cursor.load(std::memory_order_acquire) : c.end;
      if (c.begin == nullptr || end < c.begin || end > c.begin + kChunkWords) continue;
      v->span_begin[v->spans] = c.begin;
      v->span_end[v->spans] = end;
      ++v->spans;
    }
    fn(*v, ctx);
  };
  for (size_t i = 0; i < r.live.size(); ++i) visit(r.live[i]);
  for (size_t i = 0; i < r.retired.size(); ++i) visit(r.retired[i]);
}

void recorder_free_chunk(const uint64_t* chunk) {
  registry().pool.release(const_cast<uint64_t*>(chunk));
}

void recorder_release(uint64_t word) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.collecting = false;
  r.released_generation = word >> 8;
  for (ThreadBufferImpl* tb : r.retired) {
    release_chunks(r, tb, 0);
    delete tb;
  }
  r.retired.clear();
  // Live threads would keep their filled chunks until their next session:
  // return all but the current one (the thread may still append an end
  // record there, or to a chunk it adds, both after the collected ones).
  for (ThreadBufferImpl* tb : r.live) {
    std::lock_guard<std::mutex> tlock(tb->mu);
    if (tb->bound_word != word || !tb->compacted.empty() || tb->chunks.size() < 2) continue;
    for (size_t i = 0; i + 1 < tb->chunks.size(); ++i) r.pool.release(tb->chunks[i].begin);
    tb->bytes -= (tb->chunks.size() - 1) * kChunkBytes;
    tb->chunks.erase(tb->chunks.begin(), tb->chunks.end() - 1);
  }
}

void recorder_set_thread_name(std::string name) {
  auto* tb = static_cast<ThreadBufferImpl*>(t_slot.buffer);
  if (tb == nullptr) {
    if (t_slot.exited) return;
    tb = create_buffer();
  }
  std::lock_guard<std::mutex> lock(tb->mu);
  tb->name = std::move(name);
  tb->name_overridden = true;
}

void recorder_after_fork_child() {
  // The child does not take part in the parent's session.
  uint64_t word = g_state.session_word.load(std::memory_order_relaxed);
  g_state.session_word.store(word & ~uint64_t{0xff}, std::memory_order_relaxed);
  Registry& r = registry();
  new (&r.mu) std::mutex;
  r.pool.reset_lock_after_fork();
  // Only the forking thread exists in the child; the other buffers (and
  // their possibly held locks) are abandoned, not touched.
  auto* self = static_cast<ThreadBufferImpl*>(t_slot.buffer);
  r.live.clear();
  r.retired.clear();
  if (self != nullptr) {
    new (&self->mu) std::mutex;
    self->tid = current_tid();
    r.live.push_back(self);
  }
}

uint64_t recorder_dropped_after_exit() {
  return registry().dropped_after_exit.load(std::memory_order_relaxed);
}

}  // namespace spyglass::internal
