// The recorder behind the annotation hot path (include/spyglass/internal/
// recorder.h): thread-buffer registry, bounded chunk pool, and the collector
// that a session uses at stop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "spyglass/internal/recorder.h"

namespace spyglass::internal {

struct RecorderLimits {
  uint64_t bytes_per_thread;
  uint64_t bytes_total;
  // Ring mode (flight recorder): at the bounds a thread reuses its oldest
  // chunk (its events counted as overwritten) instead of dropping new events.
  bool ring = false;
};

// Starts recording events of level <= `level` (1..3) with the given bounds;
// returns the new session word. The caller guarantees one session at a time.
uint64_t recorder_start(int level, const RecorderLimits& limits);
// Stops recording (threads still inside a write finish it unseen).
void recorder_stop();

// What one thread recorded under a session word: spans of record words, in
// order; no record straddles two spans.
struct RawThread {
  int64_t tid = 0;
  std::string name;
  std::vector<std::pair<const uint64_t*, const uint64_t*>> spans;
  uint64_t dropped = 0;
  // The first `owned_spans` spans are whole chunks handed over to the
  // collector: it frees each with recorder_free_chunk(span.first) as soon as
  // it has parsed it, so that memory moves from the records to the model
  // instead of holding both.
  size_t owned_spans = 0;
  // Ring mode: begin records overwritten on this thread so far.
  uint64_t overwritten = 0;
  // Ring mode: the tick of the oldest begin still held (0: none lost yet,
  // the thread's records go back to the session start).
  uint64_t held_since_ticks = 0;
  // recorder_snapshot: the copied records the spans point into.
  std::vector<uint64_t> copy;
};

// Snapshot of every thread buffer bound to `word`, including threads that
// exited during the session. Spans not owned stay valid until
// recorder_release(word).
std::vector<RawThread> recorder_collect(uint64_t word);
// Ring mode, while recording: a copy of every thread's records bound to
// `word` whose chunks may hold begins at or after `since_ticks` (older chunks
// are skipped). The recorder runs on; nothing is handed over.
std::vector<RawThread> recorder_snapshot(uint64_t word, uint64_t since_ticks);

// For the crash handler: every thread buffer bound to `word`, visited without
// a lock or an allocation (best effort: a thread may be changing its list).
// Each view's spans are in record order; `name` is NUL-terminated or empty.
struct UnlockedView {
  int64_t tid;
  const char* name;
  uint64_t overwritten;
  uint64_t dropped;
  const uint64_t* span_begin[2048];
  const uint64_t* span_end[2048];
  size_t spans;
};
void recorder_visit_unlocked(uint64_t word, UnlockedView* scratch, void (*fn)(const UnlockedView&, void*), void* ctx);

// Gives back an owned chunk of a RawThread (see above).
void recorder_free_chunk(const uint64_t* chunk);
// Frees buffers of exited threads that `word` kept alive for collection; a
// thread of this session that exits later keeps nothing.
void recorder_release(uint64_t word);

// Names a thread in the outputs (the calling thread).
void recorder_set_thread_name(std::string name);

// Called in a forked child (pthread_atfork): stops recording there and
// forgets the parent's other threads.
void recorder_after_fork_child();

// Events dropped because their thread had already run its exit handlers.
uint64_t recorder_dropped_after_exit();

// Words of the record whose first word is `w`; 0 if it is no record.
inline size_t record_words(uint64_t w) {
  if (w & kEndBit) return 1;
  uint64_t payload = w & kPayloadMask;
  switch (w >> 56) {
    case kTagStatic: return 2;
    case kTagCopied: return 2 + words_for(payload);
    case kTagArg: return 1 + words_for((w >> 32) & 0xffff) + words_for(w & 0xffffffff);
    default: return 0;
  }
}

// Begin records in [p, end). Runs once per overwritten chunk in ring mode,
// so it is a tight loop: a record is read only below `end` (a chunk holds
// whole records).
inline uint64_t count_begins(const uint64_t* p, const uint64_t* end) {
  uint64_t n = 0;
  while (p < end) {
    uint64_t w = *p;
    if (w & kEndBit) {
      ++p;
      continue;
    }
    switch (w >> 56) {
      case kTagStatic: ++n; p += 2; break;
      case kTagArg: p += 1 + words_for((w >> 32) & 0xffff) + words_for(w & 0xffffffff); break;
      case kTagCopied: ++n; p += 2 + words_for(w & kPayloadMask); break;
      default: return n;  // not a record: the rest cannot be trusted
    }
  }
  return n;
}

// Size of one buffer chunk, for tests and benchmarks.
inline constexpr size_t kChunkBytes = 128 * 1024;

}  // namespace spyglass::internal
