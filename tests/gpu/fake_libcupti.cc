// A stand-in for libcupti for the remote-capture test of GPU planes: what
// CUPTI would report for one kernel launch, one 4 KiB host-to-device copy and
// one memset. When the tracer enables kernel records (its start) the launch's
// driver callback runs (enter, exit) through the subscriber; at
// cuptiActivityFlushAll (its stop) a buffer from the tracer's request
// callback is filled with the three records (laid out at the offsets of
// src/gpu/cupti_abi.h, which gpu_records_test checks against NVIDIA's
// headers) and handed back. Nothing of it is NVIDIA's.
#include <time.h>

#include <cstdint>
#include <cstring>

#include "gpu/cupti_abi.h"

namespace {

namespace abi = spyglass::gpu::abi;
using Callback = abi::CallbackFunc;

Callback g_callback = nullptr;
void* g_userdata = nullptr;
bool g_launch_enabled = false;
abi::BufferRequestedFunc g_request = nullptr;
abi::BufferCompletedFunc g_complete = nullptr;
bool g_flushed = false;
uint64_t g_launch_time = 0;

constexpr size_t kKernelSize = 208, kCopySize = 88;
constexpr uint32_t kCorrelation = 4242;
const char kKernelName[] = "_Z15fake_gpu_kernelPfi";

uint64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(ts.tv_nsec);
}

template <class T>
void Put(uint8_t* r, size_t off, T v) {
  std::memcpy(r + off, &v, sizeof v);
}

void Launch(uint64_t at) {
  if (g_callback == nullptr || !g_launch_enabled) return;
  uint8_t cbd[abi::cbdata::kSize] = {};
  uint64_t scratch = 0;
  int ret = 0;
  Put<const char*>(cbd, abi::cbdata::kFunctionName, "cuLaunchKernel");
  Put<const void*>(cbd, abi::cbdata::kFunctionReturnValue, &ret);
  Put<const char*>(cbd, abi::cbdata::kSymbolName, kKernelName);
  Put<void*>(cbd, abi::cbdata::kContext, reinterpret_cast<void*>(0x1000));
  Put<uint64_t*>(cbd, abi::cbdata::kCorrelationData, &scratch);
  Put<uint32_t>(cbd, abi::cbdata::kCorrelationId, kCorrelation);
  Put<int>(cbd, abi::cbdata::kCallbackSite, abi::kApiEnter);
  g_callback(g_userdata, abi::kDomainDriverApi, abi::cbid::kLaunchKernel, cbd);
  scratch = at;  // the launch's start (the tracer read "now" at enter)
  Put<int>(cbd, abi::cbdata::kCallbackSite, abi::kApiExit);
  g_callback(g_userdata, abi::kDomainDriverApi, abi::cbid::kLaunchKernel, cbd);
}

}  // namespace

extern "C" {
int cuptiGetVersion(uint32_t* v) {
  *v = 130001;
  return 0;
}
int cuptiSubscribe(void** subscriber, Callback cb, void* userdata) {
  g_callback = cb;
  g_userdata = userdata;
  *subscriber = &g_callback;
  return 0;
}
int cuptiUnsubscribe(void*) {
  g_callback = nullptr;
  return 0;
}
int cuptiEnableCallback(uint32_t enable, void*, int domain, uint32_t cbid) {
  if (domain == abi::kDomainDriverApi && cbid == abi::cbid::kLaunchKernel) g_launch_enabled = enable != 0;
  return 0;
}
int cuptiActivityEnable(uint32_t kind) {
  if (kind == abi::kind::kConcurrentKernel) {
    g_launch_time = Now();
    Launch(g_launch_time);
  }
  return 0;
}
int cuptiActivityDisable(uint32_t) { return 0; }
int cuptiActivityRegisterCallbacks(abi::BufferRequestedFunc request, abi::BufferCompletedFunc complete) {
  g_request = request;
  g_complete = complete;
  g_flushed = false;  // a new session
  return 0;
}
int cuptiGetTimestamp(uint64_t* t) {
  *t = Now();
  return 0;
}
int cuptiGetResultString(int, const char** s) {
  *s = "fake CUPTI";
  return 0;
}
int cuptiGetDeviceId(void*, uint32_t* d) {
  *d = 0;
  return 0;
}
int cuptiActivityGetNumDroppedRecords(void*, uint32_t, size_t* n) {
  *n = 0;
  return 0;
}
int cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, void** record) {
  uint8_t* r = static_cast<uint8_t*>(*record);
  if (r == nullptr) {
    r = buffer;
  } else {
    uint32_t kind;
    std::memcpy(&kind, r, 4);
    r += kind == abi::kind::kConcurrentKernel ? kKernelSize : kCopySize;
  }
  if (r >= buffer + valid) return abi::kErrorMaxLimitReached;
  *record = r;
  return 0;
}
int cuptiActivityFlushAll(uint32_t) {
  if (g_flushed || g_request == nullptr || g_complete == nullptr) return 0;
  g_flushed = true;
  // The work after the launch: copy, kernel, memset.
  uint64_t t = g_launch_time;
  uint8_t* buf = nullptr;
  size_t size = 0, max_records = 0;
  g_request(&buf, &size, &max_records);
  if (buf == nullptr || size < kKernelSize + 2 * kCopySize) return 0;
  std::memset(buf, 0, kKernelSize + 2 * kCopySize);
  uint8_t* c = buf;
  Put<uint32_t>(c, 0, abi::kind::kMemcpy);
  Put<uint8_t>(c, abi::memcpy::kCopyKind, abi::kCopyHtoD);
  Put<uint8_t>(c, abi::memcpy::kSrcKind, 2);  // pinned
  Put<uint8_t>(c, abi::memcpy::kDstKind, 3);  // device
  Put<uint8_t>(c, abi::memcpy::kFlags, abi::kMemcpyFlagAsync);
  Put<uint64_t>(c, abi::memcpy::kBytes, 4096);
  Put<uint64_t>(c, abi::memcpy::kStart, t + 10'000);
  Put<uint64_t>(c, abi::memcpy::kEnd, t + 20'000);
  Put<uint32_t>(c, abi::memcpy::kStreamId, 7);
  Put<uint32_t>(c, abi::memcpy::kContextId, 1);
  Put<uint32_t>(c, abi::memcpy::kCorrelationId, kCorrelation - 1);
  uint8_t* k = c + kCopySize;
  Put<uint32_t>(k, 0, abi::kind::kConcurrentKernel);
  Put<uint16_t>(k, abi::kernel::kRegistersPerThread, 24);
  Put<uint64_t>(k, abi::kernel::kStart, t + 30'000);
  Put<uint64_t>(k, abi::kernel::kEnd, t + 130'000);  // 100 us
  Put<uint32_t>(k, abi::kernel::kStreamId, 7);
  Put<uint32_t>(k, abi::kernel::kContextId, 1);
  uint32_t grid[3] = {64, 1, 1}, block[3] = {256, 1, 1};
  std::memcpy(k + abi::kernel::kGridX, grid, 12);
  std::memcpy(k + abi::kernel::kBlockX, block, 12);
  Put<uint32_t>(k, abi::kernel::kCorrelationId, kCorrelation);
  Put<const char*>(k, abi::kernel::kName, kKernelName);
  uint8_t* m = k + kKernelSize;
  Put<uint32_t>(m, 0, abi::kind::kMemset);
  Put<uint64_t>(m, abi::memset::kBytes, 4096);
  Put<uint64_t>(m, abi::memset::kStart, t + 140'000);
  Put<uint64_t>(m, abi::memset::kEnd, t + 142'000);
  Put<uint32_t>(m, abi::memset::kStreamId, 7);
  Put<uint32_t>(m, abi::memset::kContextId, 1);
  Put<uint32_t>(m, abi::memset::kCorrelationId, kCorrelation + 1);
  Put<uint16_t>(m, abi::memset::kMemoryKind, 3);
  g_complete(nullptr, 0, buf, size, kKernelSize + 2 * kCopySize);
  return 0;
}
}
