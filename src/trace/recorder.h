// The recorder behind the annotation hot path (include/spyglass/internal/
// recorder.h): thread-buffer registry, bounded chunk pool, and the collector
// that a session uses at stop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spyglass/internal/recorder.h"

namespace spyglass::internal {

struct RecorderLimits {
  uint64_t bytes_per_thread;
  uint64_t bytes_total;
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
};

// Snapshot of every thread buffer bound to `word`, including threads that
// exited during the session. Spans not owned stay valid until
// recorder_release(word).
std::vector<RawThread> recorder_collect(uint64_t word);
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

// Size of one buffer chunk, for tests and benchmarks.
inline constexpr size_t kChunkBytes = 128 * 1024;

}  // namespace spyglass::internal
