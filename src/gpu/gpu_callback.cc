#include "gpu/gpu_callback.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "gpu/cupti_abi.h"
#include "memory/tracker.h"
#include "spyglass/memory.h"

namespace spyglass::gpu {

using abi::Field;
namespace cb = abi::cbdata;

bool CallbackSink::Reserve(uint64_t n) {
  Release();
  void* p = mmap(nullptr, n * sizeof(ApiEvent), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return false;
  events = static_cast<ApiEvent*>(p);
  capacity = n;
  next = 0;
  generation.fetch_add(1);
  for (auto& d : dropped) d = 0;
  return true;
}

bool CallbackSink::ReserveNodes(uint64_t n) {
  void* p = mmap(nullptr, n * sizeof(GraphNodeEvent), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  nodes = static_cast<GraphNodeEvent*>(p);
  node_capacity = n;
  next_node = 0;
  nodes_dropped = 0;
  return true;
}

void CallbackSink::Release() {
  generation.fetch_add(1);  // the threads' blocks are of this array
  if (events != nullptr) munmap(events, capacity * sizeof(ApiEvent));
  events = nullptr;
  capacity = 0;
  if (nodes != nullptr) munmap(nodes, node_capacity * sizeof(GraphNodeEvent));
  nodes = nullptr;
  node_capacity = 0;
}

MemoryCall MemoryCallOf(int domain, uint32_t id) {
  auto alloc = [](const char* kind, uintptr_t tag = 0, bool out = true) { return MemoryCall{kind, true, out, tag}; };
  auto release = [](uintptr_t tag = 0) { return MemoryCall{"", false, false, tag}; };
  if (domain == abi::kDomainDriverApi) {
    using namespace abi::cbid;
    switch (id) {
      case kMemAlloc: return alloc("device");
      case kMemAllocPitch: return alloc("pitched");
      case kMemAllocManaged: return alloc("managed");
      case kMemAllocHost: case kMemHostAlloc: return alloc("pinned_host");
      case kMemHostRegister: return alloc("host_registered", kHostRegisteredTag, /*out=*/false);
      case kMemAllocAsync: case kMemAllocAsyncPtsz: case kMemAllocFromPoolAsync: case kMemAllocFromPoolAsyncPtsz:
        return alloc("stream_ordered");
      case kMemCreate: return alloc("vmm", kVmmHandleTag);
      case kMemFree: case kMemFreeHost: case kMemFreeAsync: case kMemFreeAsyncPtsz: return release();
      case kMemHostUnregister: return release(kHostRegisteredTag);
      case kMemRelease: return release(kVmmHandleTag);
      default: return {};
    }
  }
  if (domain == abi::kDomainRuntimeApi) {
    using namespace abi::rt_cbid;
    switch (id) {
      case kMalloc: return alloc("device");
      case kMallocPitch: return alloc("pitched");
      case kMallocManaged: return alloc("managed");
      case kMallocHost: case kHostAlloc: return alloc("pinned_host");
      case kHostRegister: return alloc("host_registered", kHostRegisteredTag, /*out=*/false);
      case kMallocAsync: case kMallocAsyncPtsz: case kMallocFromPoolAsync: case kMallocFromPoolAsyncPtsz:
        return alloc("stream_ordered");
      case kFree: case kFreeHost: case kFreeAsync: case kFreeAsyncPtsz: return release();
      case kHostUnregister: return release(kHostRegisteredTag);
      default: return {};
    }
  }
  return {};
}

uint64_t BytesOfMemoryCall(int domain, uint32_t id, const void* params) {
  if (domain == abi::kDomainDriverApi) return BytesOfCall(id, params);
  if (params == nullptr || domain != abi::kDomainRuntimeApi) return 0;
  using namespace abi::rt_cbid;
  switch (id) {
    // {void** devPtr, size_t* pitch, size_t width, size_t height}
    case kMallocPitch: {
      auto* pitch = Field<const uint64_t*>(params, 8);
      return pitch ? *pitch * Field<uint64_t>(params, 24) : 0;
    }
    // {void** ptr / void* ptr, size_t size, ...}
    case kMalloc: case kMallocHost: case kHostAlloc: case kHostRegister: case kMallocManaged: case kMallocAsync:
    case kMallocAsyncPtsz: case kMallocFromPoolAsync: case kMallocFromPoolAsyncPtsz:
      return Field<uint64_t>(params, 8);
    default: return 0;
  }
}

namespace {

thread_local uint32_t t_tid = 0;
// Inside a runtime allocating call: whether a driver call under it already
// reported the memory (then the runtime's exit does not report it again).
thread_local int t_runtime_depth = 0;
thread_local bool t_driver_reported = false;
// The driver call in progress on this thread (a graph node made now was made by it).
thread_local const char* t_call_function = nullptr;
thread_local uint32_t t_call_correlation = 0;
std::atomic<StackHook> g_stack_hook{nullptr};

// This thread's block of the sink's slots (CallbackSink::kBlock).
struct SlotBlock {
  const CallbackSink* sink = nullptr;
  uint64_t generation = 0, next = 0, end = 0;
};
thread_local SlotBlock t_block;
constexpr uint64_t kNoSlot = UINT64_MAX;
uint64_t ClaimSlot(CallbackSink* sink) {
  SlotBlock& b = t_block;
  const uint64_t generation = sink->generation.load(std::memory_order_relaxed);
  if (b.sink == sink && b.generation == generation && b.next < b.end) return b.next++;
  const uint64_t start = sink->next.fetch_add(CallbackSink::kBlock, std::memory_order_relaxed);
  if (start >= sink->capacity) return kNoSlot;
  b = {sink, generation, start + 1, std::min(start + CallbackSink::kBlock, sink->capacity)};
  return start;
}

void TrackMemory(const MemoryCall& m, const void* cbd, uint32_t device, uint64_t bytes) {
  const void* params = Field<const void*>(cbd, cb::kFunctionParams);
  const void* ret = Field<const void*>(cbd, cb::kFunctionReturnValue);
  if (params == nullptr || (ret != nullptr && Field<int>(ret, 0) != 0)) return;  // the call failed
  if (t_runtime_depth > 0) t_driver_reported = true;
  if (!m.alloc) {
    // {CUdeviceptr dptr / void* p / handle, ...}
    uintptr_t key = Field<uintptr_t>(params, 0);
    if (key != 0) memory::record_free(reinterpret_cast<const void*>(key | m.tag));
    return;
  }
  // {CUdeviceptr* dptr / void** pp / handle*, ...}: the address is there at
  // exit; a registered range is given as {void* p, ...}.
  uintptr_t key;
  if (m.out_pointer) {
    const auto* out = Field<const uintptr_t*>(params, 0);
    if (out == nullptr) return;
    key = *out;
  } else {
    key = Field<uintptr_t>(params, 0);
  }
  if (key == 0) return;
  key |= m.tag;
  char name[16] = "gpu:";
  int n = 4;
  if (device >= 10) name[n++] = static_cast<char>('0' + device / 10 % 10);
  name[n++] = static_cast<char>('0' + device % 10);
  std::string_view dev(name, n);
  if (StackHook hook = g_stack_hook.load(std::memory_order_acquire)) {
    uintptr_t words[64];
    int depth = hook(words, 64);
    if (depth > 0 && memory::internal::g_api_enabled.load(std::memory_order_relaxed)) {
      if (!memory::internal::Guard::Enter()) return;
      memory::internal::Record(key, bytes, memory::internal::InternClass(dev, m.kind), words, depth);
      memory::internal::Guard::Leave();
      return;
    }
  }
  memory::record_allocation(reinterpret_cast<const void*>(key), bytes, dev, m.kind);
}

// The device of a call: its context's, or for cuMemCreate where the
// allocation property puts it.
bool DeviceOf(CallbackSink* sink, int domain, uint32_t cbid, const void* cbd, uint32_t* device) {
  *device = 0;
  if (domain == abi::kDomainDriverApi && cbid == abi::cbid::kMemCreate) {
    const void* params = Field<const void*>(cbd, cb::kFunctionParams);
    const void* prop = params ? Field<const void*>(params, 16) : nullptr;
    if (prop != nullptr && Field<int>(prop, abi::mem_prop::kLocationType) == abi::mem_prop::kLocationDevice) {
      *device = static_cast<uint32_t>(Field<int>(prop, abi::mem_prop::kLocationId));
      return true;
    }
  }
  void* ctx = Field<void*>(cbd, cb::kContext);
  return ctx == nullptr || sink->get_device_id(ctx, device) == 0;
}

// A graph node made or cloned: its ids, and the driver call under which it
// happened (`cbd` is a CUpti_ResourceData whose descriptor is a CUpti_GraphData).
void RecordGraphNode(CallbackSink* sink, uint32_t cbid, const void* cbd) {
  if (sink->nodes == nullptr || sink->get_graph_node_id == nullptr) return;
  const void* g = Field<const void*>(cbd, abi::resource::kResourceDescriptor);
  if (g == nullptr) return;
  GraphNodeEvent e;
  if (void* node = Field<void*>(g, abi::graph_data::kNode); node == nullptr || sink->get_graph_node_id(node, &e.node_id) != 0)
    return;
  if (cbid == abi::kResourceGraphNodeCloned)
    if (void* orig = Field<void*>(g, abi::graph_data::kOriginalNode); orig != nullptr)
      sink->get_graph_node_id(orig, &e.original_node_id);
  if (void* graph = Field<void*>(g, abi::graph_data::kGraph); graph != nullptr && sink->get_graph_id != nullptr)
    sink->get_graph_id(graph, &e.graph_id);
  e.node_type = Field<int32_t>(g, abi::graph_data::kNodeType);
  e.function = t_call_function;
  e.correlation_id = t_call_function ? t_call_correlation : 0;
  sink->get_timestamp(&e.time_ns);
  if (t_tid == 0) t_tid = static_cast<uint32_t>(syscall(SYS_gettid));
  e.tid = t_tid;
  uint64_t i = sink->next_node.fetch_add(1, std::memory_order_relaxed);
  if (i >= sink->node_capacity) {
    sink->nodes_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  sink->nodes[i] = e;
}

}  // namespace

void SetAllocationStackHook(StackHook hook) { g_stack_hook.store(hook, std::memory_order_release); }

void ApiCallback(void* userdata, int domain, uint32_t cbid, const void* cbd) {
  if (cbd == nullptr) return;
  auto* sink = static_cast<CallbackSink*>(userdata);
  bool enter = Field<int>(cbd, cb::kCallbackSite) == abi::kApiEnter;
  if (domain == abi::kDomainRuntimeApi) {
    // Runtime allocating calls, for GPU memory only (their driver calls are
    // the timeline's events): reported at exit unless a driver call under
    // them already did.
    MemoryCall m = MemoryCallOf(domain, cbid);
    if (m.kind == nullptr) return;
    if (enter) {
      ++t_runtime_depth;
      t_driver_reported = false;
      return;
    }
    if (t_runtime_depth > 0) --t_runtime_depth;
    bool reported = t_driver_reported;
    t_driver_reported = false;
    uint32_t device = 0;
    if (reported || !sink->track_memory || !DeviceOf(sink, domain, cbid, cbd, &device) || device >= sink->num_devices)
      return;
    TrackMemory(m, cbd, device, BytesOfMemoryCall(domain, cbid, Field<const void*>(cbd, cb::kFunctionParams)));
    return;
  }
  if (domain == abi::kDomainResource) {
    if (cbid == abi::kResourceGraphNodeCreated || cbid == abi::kResourceGraphNodeCloned) RecordGraphNode(sink, cbid, cbd);
    return;
  }
  if (domain != abi::kDomainDriverApi) return;
  auto* slot = Field<uint64_t*>(cbd, cb::kCorrelationData);
  if (enter) {
    if (slot) sink->get_timestamp(slot);
    t_call_function = Field<const char*>(cbd, cb::kFunctionName);
    t_call_correlation = Field<uint32_t>(cbd, cb::kCorrelationId);
    return;
  }
  t_call_function = nullptr;
  uint64_t end = 0;
  sink->get_timestamp(&end);
  uint32_t device = 0;
  if (!DeviceOf(sink, domain, cbid, cbd, &device)) return;
  if (device >= sink->num_devices) return;  // not profiled (gpu_num_chips_to_profile_per_task)
  uint64_t bytes = BytesOfCall(cbid, Field<const void*>(cbd, cb::kFunctionParams));
  if (sink->track_memory)
    if (MemoryCall m = MemoryCallOf(domain, cbid); m.kind != nullptr) TrackMemory(m, cbd, device, bytes);
  const uint64_t i = ClaimSlot(sink);
  if (i == kNoSlot) {
    sink->dropped[device].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (t_tid == 0) t_tid = static_cast<uint32_t>(syscall(SYS_gettid));
  ApiEvent& e = sink->events[i];
  e.start_ns = slot ? *slot : end;
  e.end_ns = end;
  e.bytes = bytes;
  e.function = Field<const char*>(cbd, cb::kFunctionName);
  e.tid = t_tid;
  e.correlation_id = Field<uint32_t>(cbd, cb::kCorrelationId);
  e.cbid = cbid;
  e.device = device;
}

}  // namespace spyglass::gpu
