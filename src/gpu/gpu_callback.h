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
  // Slots are handed to the calling threads in blocks of kBlock: one shared
  // write a block, not a call (two threads launching had each call wait on
  // this counter's cache line and write beside each other's records). A
  // block's slots a thread did not fill stay empty (end_ns 0: skipped).
  static constexpr uint64_t kBlock = 64;
  std::atomic<uint64_t> generation{0};  // changes at each Reserve/Release: blocks of an earlier array are dropped
  alignas(64) std::atomic<uint64_t> next{0};  // a line of its own: written a block at a time, the fields above read every call
  static constexpr uint32_t kMaxDevices = 64;
  std::atomic<uint64_t> dropped[kMaxDevices] = {};  // over capacity, per GPU
  uint32_t num_devices = kMaxDevices;  // calls on devices >= this are ignored
  bool track_memory = true;
  // gpu_dump_graph_node_mapping: graph nodes as they are made (resource
  // callbacks), in a second preallocated array.
  int (*get_graph_node_id)(void* node, uint64_t* id) = nullptr;
  int (*get_graph_id)(void* graph, uint32_t* id) = nullptr;
  GraphNodeEvent* nodes = nullptr;
  uint64_t node_capacity = 0;
  std::atomic<uint64_t> next_node{0};
  std::atomic<uint64_t> nodes_dropped{0};

  // Reserves `n` events (mmap, committed as used); false when that fails.
  bool Reserve(uint64_t n);
  // Reserves `n` graph nodes the same way.
  bool ReserveNodes(uint64_t n);
  uint64_t node_count() const { return next_node.load() < node_capacity ? next_node.load() : node_capacity; }
  void Release();
  // Slots handed out (blocks included: the unfilled ones have end_ns 0).
  uint64_t size() const { return next.load() < capacity ? next.load() : capacity; }
  // Calls recorded (a scan of the slots handed out).
  uint64_t recorded() const {
    uint64_t n = 0;
    for (uint64_t i = 0; i < size(); ++i) n += events[i].end_ns != 0;
    return n;
  }
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

// How an allocating or freeing call (driver or runtime domain) reports its
// memory; kind == nullptr for other calls.
struct MemoryCall {
  // "device", "pitched", "managed", "pinned_host", "host_registered",
  // "stream_ordered", "vmm" (physical memory of cuMemCreate: what the
  // mappings of cuMemMap show is the same memory, so they are not counted).
  const char* kind = nullptr;
  bool alloc = false;
  bool out_pointer = false;  // params[0] points at the address (else it is the address)
  // ORed into the tracker's key: a VMM handle or a registered host range is
  // not an allocation of its own address (the host heap may track that one).
  uintptr_t tag = 0;
};
MemoryCall MemoryCallOf(int domain, uint32_t cbid);
// Bytes an allocating call of either domain asks for (0 when unknown).
uint64_t BytesOfMemoryCall(int domain, uint32_t cbid, const void* params);
// Keys of memory that is not its own address (MemoryCall::tag).
inline constexpr uintptr_t kVmmHandleTag = uintptr_t{1} << 63, kHostRegisteredTag = uintptr_t{1} << 62;

}  // namespace spyglass::gpu
