// Memory snapshots of a process that is about to die: an allocation failed
// (out of memory) or a fatal signal arrived. Writing a pprof profile needs
// memory and symbolization, neither of which a dying process can count on, so
// the dying process writes a raw dump instead, async-signal-safe: the live
// records, their stacks, the classes and /proc/self/maps, through write(2)
// from memory reserved beforehand (PrepareCrashDump), into a directory opened
// beforehand. `spyglass run` turns the dump into a pprof profile afterwards
// (ConvertCrashDump: the stacks are symbolized against the dead process's
// maps, from the files on disk).
//
// Dump file: memory.<pid>.<comm>.<oom|signal>.raw, written under a temporary
// name and renamed into place when complete. Layout (native endianness, this
// machine only): a DumpHeader, then records {u32 tag, u32 length, payload}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/tracker.h"
#include "spyglass/status.h"

namespace spyglass::memory::internal {

enum class DumpReason : uint32_t { kOutOfMemory = 1, kSignal = 2 };

// Reserves what a dump needs (bitmaps of the stacks and functions in use) and
// takes `dir_fd` (a directory opened by the caller; moved to a high number,
// checked at the dump, common/kept_fd.h). Not signal-safe;
// call once at start. False when the memory cannot be had.
SPYGLASS_MEM_EXPORT bool PrepareCrashDump(int dir_fd);

struct FailedAllocation {
  uint64_t bytes = 0;
  const uintptr_t* frames = nullptr;  // innermost first
  int depth = 0;
};
// Writes the dump; async-signal-safe, allocation-free. Once per process: a
// second call (another thread crashing meanwhile) waits for the first to
// finish (bounded) and returns false. `failed`: the allocation that failed (kOutOfMemory).
SPYGLASS_MEM_EXPORT bool WriteCrashDump(DumpReason reason, int signal, const FailedAllocation* failed);
// Whether this process has written (or is writing) its dump.
SPYGLASS_MEM_EXPORT bool CrashDumpWritten();

// "memory.<pid>.<comm>.<tag><ext>" into out (NUL-terminated, cut to cap):
// <comm> is /proc/self/comm as SafeComm (memory/timeline.h) makes it.
// Async-signal-safe. Returns the length.
SPYGLASS_MEM_EXPORT size_t FormatProfileName(char* out, size_t cap, const char* tag, const char* ext);

// What a dump says about its process.
struct DumpSummary {
  uint32_t pid = 0;
  std::string comm;
  DumpReason reason = DumpReason::kSignal;
  int signal = 0;
  uint64_t failed_bytes = 0;
  std::string failed_site;  // innermost named frame of the failed allocation
  int64_t live_bytes = 0, live_count = 0;
  uint32_t skipped_shards = 0;
};
// Parses a dump (bounded: any inconsistency is InvalidArgument) and makes a
// gzipped pprof profile of it, like a snapshot's; the failed allocation is a
// sample with kind "failed" (count 1, 0 live bytes) and a comment.
SPYGLASS_MEM_EXPORT Status ConvertCrashDump(std::string_view raw, std::string* pprof_gz, DumpSummary* summary);

}  // namespace spyglass::memory::internal
