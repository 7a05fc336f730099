#include "gpu/gpu_callback.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

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
  for (auto& d : dropped) d = 0;
  return true;
}

void CallbackSink::Release() {
  if (events != nullptr) munmap(events, capacity * sizeof(ApiEvent));
  events = nullptr;
  capacity = 0;
}

const char* MemoryKindOfCallback(uint32_t id) {
  using namespace abi::cbid;
  switch (id) {
    case kMemAlloc: case kMemAllocPitch: return "device";
    case kMemAllocManaged: return "managed";
    case kMemAllocHost: case kMemHostAlloc: return "pinned_host";
    case kMemAllocAsync: case kMemAllocAsyncPtsz: case kMemAllocFromPoolAsync: case kMemAllocFromPoolAsyncPtsz:
      return "stream_ordered";
    default: return nullptr;
  }
}

namespace {

thread_local uint32_t t_tid = 0;
std::atomic<StackHook> g_stack_hook{nullptr};

void TrackMemory(uint32_t cbid, ApiKind kind, const void* cbd, uint32_t device, uint64_t bytes) {
  const void* params = Field<const void*>(cbd, cb::kFunctionParams);
  const void* ret = Field<const void*>(cbd, cb::kFunctionReturnValue);
  if (params == nullptr || (ret != nullptr && Field<int>(ret, 0) != 0)) return;  // the call failed
  if (kind == ApiKind::kFree) {
    // {CUdeviceptr dptr / void* p, ...}
    memory::record_free(reinterpret_cast<const void*>(Field<uintptr_t>(params, 0)));
    return;
  }
  // {CUdeviceptr* dptr / void** pp, ...}: the address is there at exit.
  const auto* out = Field<const uintptr_t*>(params, 0);
  if (out == nullptr || *out == 0) return;
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
      memory::internal::Record(*out, bytes, memory::internal::InternClass(dev, MemoryKindOfCallback(cbid)), words,
                               depth);
      memory::internal::Guard::Leave();
      return;
    }
  }
  memory::record_allocation(reinterpret_cast<const void*>(*out), bytes, dev, MemoryKindOfCallback(cbid));
}

}  // namespace

void SetAllocationStackHook(StackHook hook) { g_stack_hook.store(hook, std::memory_order_release); }

void ApiCallback(void* userdata, int domain, uint32_t cbid, const void* cbd) {
  if (domain != abi::kDomainDriverApi || cbd == nullptr) return;
  auto* sink = static_cast<CallbackSink*>(userdata);
  auto* slot = Field<uint64_t*>(cbd, cb::kCorrelationData);
  if (Field<int>(cbd, cb::kCallbackSite) == abi::kApiEnter) {
    if (slot) sink->get_timestamp(slot);
    return;
  }
  uint64_t end = 0;
  sink->get_timestamp(&end);
  void* ctx = Field<void*>(cbd, cb::kContext);
  uint32_t device = 0;
  if (ctx != nullptr && sink->get_device_id(ctx, &device) != 0) return;
  if (device >= sink->num_devices) return;  // not profiled (gpu_num_chips_to_profile_per_task)
  ApiKind kind = KindOfCallback(cbid);
  uint64_t bytes = BytesOfCall(cbid, Field<const void*>(cbd, cb::kFunctionParams));
  if (sink->track_memory && (kind == ApiKind::kAlloc || kind == ApiKind::kFree))
    TrackMemory(cbid, kind, cbd, device, bytes);
  uint64_t i = sink->next.fetch_add(1, std::memory_order_relaxed);
  if (i >= sink->capacity) {
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
