// The driver-API callback (what runs on the application's thread at every
// selected CUDA call): times the call, records it into a preallocated array,
// and reports GPU allocations and frees to the memory tracker with the
// calling stack. No lock and no allocation of ours (the array is mmap'd at
// start; full means counted, not kept).
#pragma once

#include <atomic>
#include <cstdint>

#include "gpu/gpu_convert.h"

namespace spyglass::gpu {

struct CallbackSink {
  // CUPTI functions the callback needs (replaced by fakes in tests).
  int (*get_timestamp)(uint64_t*) = nullptr;
  int (*get_device_id)(void* context, uint32_t* device) = nullptr;
  ApiEvent* events = nullptr;  // capacity entries
  uint64_t capacity = 0;
  std::atomic<uint64_t> next{0};
  static constexpr uint32_t kMaxDevices = 64;
  std::atomic<uint64_t> dropped[kMaxDevices] = {};  // over capacity, per GPU
  uint32_t num_devices = kMaxDevices;  // calls on devices >= this are ignored
  bool track_memory = true;

  // Reserves `n` events (mmap, committed as used); false when that fails.
  bool Reserve(uint64_t n);
  void Release();
  uint64_t size() const { return next.load() < capacity ? next.load() : capacity; }
  ~CallbackSink() { Release(); }
};

// The CUpti_CallbackFunc (userdata = the CallbackSink). `cbdata` is a
// CUpti_CallbackData (read at the offsets of cupti_abi.h).
void ApiCallback(void* sink, int domain, uint32_t cbid, const void* cbdata);

// Where GPU allocations are attributed: by default the native stack of the
// allocating call; a hook set here (the Python extension's, at import) may
// give the interpreter's stack instead, as symbolic frames (memory/tracker.h),
// innermost first. It returns how many it wrote, 0 to fall back to native.
using StackHook = int (*)(uintptr_t* words, int max);
void SetAllocationStackHook(StackHook hook);

// The memory kind of an allocating call ("device", "managed", "pinned_host",
// "stream_ordered"), nullptr for other calls.
const char* MemoryKindOfCallback(uint32_t cbid);

}  // namespace spyglass::gpu
