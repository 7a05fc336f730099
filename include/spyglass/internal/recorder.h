// The annotation hot path. Users include <spyglass/annotation.h>, not this.
//
// Design: each thread owns a ThreadBuffer of fixed-size chunks of 8-byte
// words. An annotation writes a begin record (name + timestamp) and an end
// record (timestamp) into its own thread's chunk, then publishes the new
// cursor with a release store. No lock, no allocation, no shared cache line:
// the only shared datum read is the global session word, which is written
// only at start/stop. Only when a chunk is full do we leave the inline path
// (grow_slow), where a new chunk comes from a bounded pool; when the
// per-thread or total bound is reached, new events are dropped and counted
// (policy: drop newest, keep what was recorded).
//
// Record encoding (one 64-bit word unless noted; timestamps < 2^63):
//   end:          1<<63 | timestamp
//   begin static: kTagStatic<<56 | name pointer,         then timestamp
//   begin copied: kTagCopied<<56 | byte length,          then name bytes (padded), then timestamp
//   argument:     kTagArg<<56 | type<<48 | key length<<32 | value length,
//                 then key bytes (padded), then value (1 word, or bytes padded)
// An argument applies to the innermost event still open on the thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <time.h>

#include "spyglass/api.h"

#define SPYGLASS_LIKELY(x) __builtin_expect(!!(x), 1)
#define SPYGLASS_UNLIKELY(x) __builtin_expect(!!(x), 0)

namespace spyglass::internal {

inline constexpr uint64_t kEndBit = 1ull << 63;
inline constexpr uint64_t kTagStatic = 0x01;
inline constexpr uint64_t kTagCopied = 0x02;
inline constexpr uint64_t kTagArg = 0x03;
inline constexpr uint64_t kPayloadMask = (1ull << 56) - 1;

enum class ArgType : uint8_t { kInt64 = 1, kUint64 = 2, kDouble = 3, kString = 4 };

// Longest copied name or string argument kept; longer ones are truncated.
inline constexpr uint32_t kMaxStringBytes = 4096;

// The session word: (generation << 8) | host_tracer_level. Level 0 means no
// session records host events, so the idle check is one relaxed load and a
// compare. Generation changes at every start, so a thread notices a new
// session by comparing the word it bound its buffer to.
struct alignas(64) GlobalState {
  std::atomic<uint64_t> session_word{0};
  bool use_tsc = true;  // false when the TSC is not invariant (then CLOCK_MONOTONIC)
  // Flight recorder: a step longer than this many ticks asks for a dump
  // (0: off); read only by StepTraceAnnotation.
  std::atomic<uint64_t> slow_step_ticks{0};
};
SPYGLASS_API extern GlobalState g_state;

struct Chunk;

// Per-thread buffer. Fields above the line are touched by the owner thread on
// every event; the collector reads `cursor` (acquire) and the chunk list
// under `mutex` (in src/trace/recorder.cc).
struct ThreadBuffer {
  std::atomic<uint64_t*> cursor{nullptr};
  uint64_t* soft_limit = nullptr;  // begins and arguments must end below this
  uint64_t* hard_limit = nullptr;  // ends may use the reserve up to here
  uint64_t bound_word = 0;         // session word this buffer records for
};

struct ThreadSlot {
  ThreadBuffer* buffer;
  bool exited;  // thread-local destructors ran: record nothing more here
};
// initial-exec: a TLS access is one %fs-relative load, also from a shared
// library (no __tls_get_addr call on the hot path).
SPYGLASS_API extern constinit thread_local ThreadSlot t_slot __attribute__((tls_model("initial-exec")));

// Slow paths, out of line.
SPYGLASS_API ThreadBuffer* bind_slow(uint64_t word);
// Makes room for `words` words; returns the cursor or nullptr (dropped).
SPYGLASS_API uint64_t* grow_slow(ThreadBuffer* tb, uint32_t words, bool is_end);

// CLOCK_MONOTONIC in ns.
inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// The clock read with no call (x86's TSC, arm64's counter), where
// ticks_inline_usable(): for paths that must not make one (the callee-saved
// registers a call needs cost as much as the rest of such a path).
inline bool ticks_inline_usable() {
#if defined(__x86_64__)
  return g_state.use_tsc;
#elif defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

inline uint64_t ticks_inline() {
#if defined(__x86_64__)
  return __rdtsc();
#elif defined(__aarch64__)
  uint64_t v;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return monotonic_ns();  // ticks_inline_usable() is false: callers take now_ticks()
#endif
}

inline uint64_t now_ticks() {
  if (SPYGLASS_LIKELY(ticks_inline_usable())) return ticks_inline();
  return monotonic_ns();
}

inline uint64_t words_for(size_t bytes) { return (bytes + 7) / 8; }

// Returns the buffer to record into if a session records events of `level`,
// else nullptr. The common idle case is the first branch.
inline ThreadBuffer* buffer_for(int level) {
  uint64_t word = g_state.session_word.load(std::memory_order_relaxed);
  if (SPYGLASS_LIKELY(static_cast<int>(word & 0xff) < level)) return nullptr;
  ThreadBuffer* tb = t_slot.buffer;
  if (SPYGLASS_UNLIKELY(tb == nullptr || tb->bound_word != word)) tb = bind_slow(word);
  return tb;
}

// Reserves `words` words for a begin/argument record.
inline uint64_t* reserve(ThreadBuffer* tb, uint32_t words) {
  uint64_t* c = tb->cursor.load(std::memory_order_relaxed);
  if (SPYGLASS_UNLIKELY(c + words > tb->soft_limit)) c = grow_slow(tb, words, false);
  return c;
}

inline void publish(ThreadBuffer* tb, uint64_t* end) {
  tb->cursor.store(end, std::memory_order_release);
}

// Begin with a name of static storage duration: two words.
inline uint64_t begin_static(const char* name, int level) {
  ThreadBuffer* tb = buffer_for(level);
  if (tb == nullptr) return 0;
  uint64_t* c = reserve(tb, 2);
  if (SPYGLASS_UNLIKELY(c == nullptr)) return 0;
  c[0] = (kTagStatic << 56) | reinterpret_cast<uint64_t>(name);
  c[1] = now_ticks();
  publish(tb, c + 2);
  return tb->bound_word;
}

// For a recorder of its own events that keeps the thread's buffer while it
// knows the session runs (the Python tracer: from its start to its stop, on
// the thread that bound it) and ticks_inline_usable() held when it took the
// buffer: the begin/end records when they fit in the current chunk, with no
// session check and no call (its fast path then needs no stack frame);
// false: nothing written, take the general path (begin_static/end).
inline bool try_begin_static(ThreadBuffer* tb, const char* name) {
  uint64_t* c = tb->cursor.load(std::memory_order_relaxed);
  if (SPYGLASS_UNLIKELY(c + 2 > tb->soft_limit)) return false;
  c[0] = (kTagStatic << 56) | reinterpret_cast<uint64_t>(name);
  c[1] = ticks_inline();
  publish(tb, c + 2);
  return true;
}

inline bool try_end(ThreadBuffer* tb) {
  uint64_t t = ticks_inline();
  uint64_t* c = tb->cursor.load(std::memory_order_relaxed);
  if (SPYGLASS_UNLIKELY(c + 1 > tb->hard_limit)) return false;
  c[0] = kEndBit | t;
  publish(tb, c + 1);
  return true;
}

// Begin with a name copied into the buffer.
inline uint64_t begin_copied(std::string_view name, int level) {
  ThreadBuffer* tb = buffer_for(level);
  if (tb == nullptr) return 0;
  size_t n = name.size() < kMaxStringBytes ? name.size() : kMaxStringBytes;
  uint32_t words = static_cast<uint32_t>(2 + words_for(n));
  uint64_t* c = reserve(tb, words);
  if (SPYGLASS_UNLIKELY(c == nullptr)) return 0;
  c[0] = (kTagCopied << 56) | n;
  c[words - 2] = 0;  // zero the padding of the last name word
  std::memcpy(c + 1, name.data(), n);
  c[words - 1] = now_ticks();
  publish(tb, c + words);
  return tb->bound_word;
}

// Ends the innermost event begun under session word `word`; a no-op if that
// session has ended since (the event then is either collected as incomplete
// or belongs to no session).
inline void end(uint64_t word) {
  if (word == 0) return;
  ThreadBuffer* tb = t_slot.buffer;
  if (SPYGLASS_UNLIKELY(tb == nullptr || tb->bound_word != word)) return;
  uint64_t t = now_ticks();
  uint64_t* c = tb->cursor.load(std::memory_order_relaxed);
  if (SPYGLASS_UNLIKELY(c + 1 > tb->hard_limit)) {
    c = grow_slow(tb, 1, true);
    if (c == nullptr) return;
  }
  c[0] = kEndBit | t;
  publish(tb, c + 1);
}

// A step took longer than g_state.slow_step_ticks: wakes the flight
// recorder's dump thread (no lock, no allocation).
SPYGLASS_API void step_was_slow();

// Appends one argument to the innermost open event of session `word`.
SPYGLASS_API void add_arg(uint64_t word, std::string_view key, ArgType type, uint64_t bits,
                             std::string_view str);

}  // namespace spyglass::internal
