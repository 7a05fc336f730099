// What the heap hook (heap_hook.cc) shares with its Python part
// (heap_python.cc); both are in libspyglass_heap.so only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace spyglass::memory::heap {

// Whether to record an allocation of n bytes (tracking on; in sampled mode,
// whether it is a sample).
bool ShouldTrack(size_t n);
// Whether a freed block may be tracked (tracking on; in sampled mode, the
// filter of sampled pointers says so).
bool MaybeTrackedFree(void* p);
// The class ("cpu:0", "heap") of the hook's records.
uint32_t HeapClass();
// The native stack of the caller of the function whose frame is `frame`.
int CaptureNative(void* frame, uintptr_t* out, int max);
// An allocation of n bytes failed: whether a dump is wanted (once per process,
// tracking on, not a worker), and the dump with the allocation's stack
// (memory/crash_dump.h).
bool AllocationFailureWanted(size_t n);
void AllocationFailed(size_t n, const uintptr_t* frames, int depth);
// Writes the exit snapshot unless it was written already (a Python program
// writes it when its main program ends, before the interpreter's teardown).
void WriteExitSnapshotOnce();

// ---- Python frames (heap_python.cc) -----------------------------------------
// Set while a Python program has turned Python frames on and not yet ended.
extern std::atomic<bool> g_python_on;
// Replaces the CPython eval-loop frames of `frames[0..depth)` by the calling
// thread's Python frames (see heap_python.cc); returns the new depth (<= max).
// Only when the thread holds the GIL; else the stack is left as it is.
int SplicePythonFrames(uintptr_t* frames, int depth, int max);
// The light mode (SPYGLASS_PYTHON_MODE=light): the hook's blocks get the
// thread's Python frames only, no native walk, as memray's default mode.
extern std::atomic<bool> g_python_light;
// The calling thread's Python frames, innermost first (0 without the GIL).
// `moving`: a reallocation's (code-object extras read only, see heap_python.cc).
int PythonFramesOnly(uintptr_t* frames, int max, bool moving);
// Light mode, inside pymalloc (a call through Python's MEM/OBJ domains): the
// block is put aside, recorded when pymalloc returns (true), else false.
// Caller holds the guard.
bool StashLightBlock(void* p, size_t n);
// A block put aside and freed before it was recorded: dropped (true).
bool UnstashLightBlock(void* p);

}  // namespace spyglass::memory::heap
