// Our own declarations of the parts of the CUPTI / CUDA driver ABI the GPU
// tracer uses (spec GPU.md §1.2, §1.3, §6.3): result codes, callback ids,
// activity kinds, and the byte offsets of the record fields we read. No NVIDIA
// header is needed to build; tests/gpu/cupti_abi_check.cc compiles the same
// values against the real headers (pip nvidia-cuda-cupti) when they are found
// and static_asserts that they agree.
//
// Record versions only append fields, so one offset serves Kernel4..Kernel10,
// Memcpy5/6, Memset4, GraphTrace2; cuptiActivityGetNextRecord knows the size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace spyglass::gpu::abi {

using CUptiResult = int;
inline constexpr int kSuccess = 0;
inline constexpr int kErrorMaxLimitReached = 12;
inline constexpr int kErrorNotInitialized = 15;
inline constexpr int kErrorInvalidKind = 21;
inline constexpr int kErrorInsufficientPrivileges = 35;
inline constexpr int kErrorMultipleSubscribers = 39;
inline constexpr int kErrorVirtualizedInsufficientPrivileges = 40;
inline constexpr int kErrorUnknown = 999;

// CUpti_CallbackDomain.
inline constexpr int kDomainDriverApi = 1, kDomainRuntimeApi = 2, kDomainResource = 3;
// Resource callbacks (CUpti_CallbackIdResource) for graph nodes, and the
// layouts of CUpti_ResourceData / CUpti_GraphData they pass.
inline constexpr uint32_t kResourceGraphNodeCreated = 13, kResourceGraphNodeCloned = 20;
namespace resource {
inline constexpr size_t kResourceDescriptor = 16;
}
namespace graph_data {
inline constexpr size_t kGraph = 0, kNode = 16, kOriginalNode = 24, kNodeType = 32;
}
// CUpti_ApiCallbackSite.
inline constexpr int kApiEnter = 0;
inline constexpr int kApiExit = 1;

// Driver callback ids (cupti_driver_cbid.h).
namespace cbid {
inline constexpr uint32_t kMemFreeHost = 38, kMemHostAlloc = 39;
inline constexpr uint32_t kMemsetD8Async = 216, kMemsetD16Async = 218, kMemsetD32Async = 220, kMemsetD2D8Async = 222,
                          kMemsetD2D16Async = 224, kMemsetD2D32Async = 226;
inline constexpr uint32_t kMemAlloc = 243, kMemAllocPitch = 244, kMemFree = 245;
inline constexpr uint32_t kMemsetD8 = 249, kMemsetD16 = 250, kMemsetD32 = 251, kMemsetD2D8 = 252, kMemsetD2D16 = 253,
                          kMemsetD2D32 = 254;
inline constexpr uint32_t kMemcpyHtoD = 276, kMemcpyHtoDAsync = 277, kMemcpyDtoH = 278, kMemcpyDtoHAsync = 279,
                          kMemcpyDtoD = 280, kMemcpyDtoDAsync = 281, kMemcpyAtoH = 282, kMemcpyAtoHAsync = 283,
                          kMemcpyAtoD = 284, kMemcpyDtoA = 285, kMemcpyAtoA = 286, kMemcpy2D = 287,
                          kMemcpy2DUnaligned = 288, kMemcpy2DAsync = 289, kMemcpy3D = 290, kMemcpy3DAsync = 291,
                          kMemcpyHtoA = 292, kMemcpyHtoAAsync = 293;
inline constexpr uint32_t kMemAllocHost = 294;
inline constexpr uint32_t kMemcpy = 305, kMemcpyAsync = 306, kLaunchKernel = 307, kMemcpyPeer = 318,
                          kMemcpyPeerAsync = 319;
inline constexpr uint32_t kMemAllocManaged = 371, kLaunchCooperativeKernel = 477,
                          kLaunchCooperativeKernelMultiDevice = 480;
inline constexpr uint32_t kGraphLaunch = 514, kGraphLaunchPtsz = 515;
inline constexpr uint32_t kMemAllocAsync = 598, kMemAllocAsyncPtsz = 599, kMemFreeAsync = 600,
                          kMemFreeAsyncPtsz = 601, kMemAllocFromPoolAsync = 611, kMemAllocFromPoolAsyncPtsz = 612;
inline constexpr uint32_t kLaunchKernelEx = 652;
inline constexpr uint32_t kMemHostUnregister = 302, kMemHostRegister = 379;
// Virtual memory management (physical allocations and their mappings).
inline constexpr uint32_t kMemCreate = 549, kMemRelease = 550, kMemMap = 551, kMemUnmap = 552;
// Calls that make CUDA graph nodes (traced for gpu_dump_graph_node_mapping).
inline constexpr uint32_t kGraphCreate = 501, kGraphAddKernelNode = 502, kGraphAddMemcpyNode = 504,
                          kGraphAddMemsetNode = 506, kGraphInstantiate = 513, kGraphClone = 523,
                          kGraphAddChildGraphNode = 525, kGraphAddEmptyNode = 526, kGraphAddHostNode = 530,
                          kGraphInstantiateV2 = 578, kGraphAddEventRecordNode = 589, kGraphAddEventWaitNode = 590,
                          kGraphAddMemAllocNode = 638, kGraphAddMemFreeNode = 639, kGraphInstantiateWithFlags = 643,
                          kGraphInstantiateWithParams = 656, kGraphInstantiateWithParamsPtsz = 657,
                          kGraphAddBatchMemOpNode = 669, kGraphAddKernelNodeV2 = 689, kGraphAddNode = 712,
                          kGraphAddNodeV2 = 723;
}  // namespace cbid

// Runtime callback ids (cupti_runtime_cbid.h): the allocating calls only
// (used for GPU memory when the runtime does not go through a traced driver call).
namespace rt_cbid {
inline constexpr uint32_t kMalloc = 20, kMallocPitch = 21, kFree = 22, kMallocHost = 25, kFreeHost = 26,
                          kHostAlloc = 27, kHostRegister = 152, kHostUnregister = 153, kMallocManaged = 206,
                          kMallocAsync = 373, kMallocAsyncPtsz = 374, kFreeAsync = 375, kFreeAsyncPtsz = 376,
                          kMallocFromPoolAsync = 391, kMallocFromPoolAsyncPtsz = 392;
}  // namespace rt_cbid

// CUmemAllocationProp: where cuMemCreate puts the memory.
namespace mem_prop {
inline constexpr size_t kLocationType = 8, kLocationId = 12;
inline constexpr int kLocationDevice = 1;  // CU_MEM_LOCATION_TYPE_DEVICE
}  // namespace mem_prop

// CUpti_ActivityKind.
namespace kind {
inline constexpr uint32_t kMemcpy = 1, kMemset = 2, kKernel = 3, kConcurrentKernel = 10, kMarker = 12,
                          kMarkerData = 13, kOverhead = 17, kMemcpy2 = 22, kGraphTrace = 51;
}  // namespace kind

// CUpti_ActivityMemcpyKind.
inline constexpr uint8_t kCopyHtoD = 1, kCopyDtoH = 2, kCopyDtoD = 8, kCopyPtoP = 10;
inline constexpr uint8_t kMemcpyFlagAsync = 1;  // CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC
inline constexpr uint16_t kMemsetFlagAsync = 1;  // CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC

// CUpti_CallbackData (LP64).
namespace cbdata {
inline constexpr size_t kCallbackSite = 0, kFunctionName = 8, kFunctionParams = 16, kFunctionReturnValue = 24,
                        kSymbolName = 32, kContext = 40, kContextUid = 48, kCorrelationData = 56,
                        kCorrelationId = 64, kSize = 72;
}  // namespace cbdata

// Field offsets of the activity records (CUpti_ActivityKernel4+, Memcpy5+,
// MemcpyPtoP4, Memset4, GraphTrace2).
namespace kernel {
inline constexpr size_t kRegistersPerThread = 6, kStart = 16, kEnd = 24, kDeviceId = 40, kContextId = 44,
                        kStreamId = 48, kGridX = 52, kBlockX = 64, kStaticShared = 76, kDynamicShared = 80,
                        kCorrelationId = 92, kName = 104, kGraphNodeId = 144, kGraphId = 156;
}
namespace memcpy {
inline constexpr size_t kCopyKind = 4, kSrcKind = 5, kDstKind = 6, kFlags = 7, kBytes = 8, kStart = 16, kEnd = 24,
                        kDeviceId = 32, kContextId = 36, kStreamId = 40, kCorrelationId = 44, kGraphNodeId = 64,
                        kGraphId = 72;
}
namespace memcpy_p2p {
inline constexpr size_t kSrcDeviceId = 44, kDstDeviceId = 52, kCorrelationId = 60;
}
namespace memset {
inline constexpr size_t kBytes = 8, kStart = 16, kEnd = 24, kDeviceId = 32, kContextId = 36, kStreamId = 40,
                        kCorrelationId = 44, kFlags = 48, kMemoryKind = 50, kGraphNodeId = 64, kGraphId = 72;
}
namespace marker {  // CUpti_ActivityMarker2 (NVTX)
inline constexpr size_t kFlags = 4, kTimestamp = 8, kId = 16, kObjectKind = 20, kObjectId = 24, kName = 40,
                        kDomain = 48;
inline constexpr size_t kThreadIdInObjectId = 4;  // CUpti_ActivityObjectKindId.pt.threadId
inline constexpr uint32_t kFlagStart = 2, kFlagEnd = 4;
inline constexpr uint32_t kObjectThread = 2;
}  // namespace marker
namespace graph_trace {
inline constexpr size_t kCorrelationId = 4, kStart = 8, kEnd = 16, kDeviceId = 24, kGraphId = 28, kContextId = 32,
                        kStreamId = 36;
}

// Reads a field of type T at byte `offset` of a record (records are 8-byte
// aligned, but fields are read by memcpy: no aliasing assumptions).
template <class T>
inline T Field(const void* record, size_t offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(record) + offset, sizeof(T));
  return v;
}

// Function types resolved with dlsym (opaque handles are void*).
using CallbackFunc = void (*)(void* userdata, int domain, uint32_t cbid, const void* cbdata);
using BufferRequestedFunc = void (*)(uint8_t** buffer, size_t* size, size_t* max_num_records);
using BufferCompletedFunc = void (*)(void* context, uint32_t stream_id, uint8_t* buffer, size_t size,
                                     size_t valid_size);

}  // namespace spyglass::gpu::abi

// PM sampling (CUPTI 12.6+: cupti_pmsampling.h, cupti_profiler_host.h,
// cupti_profiler_target.h, cupti_target.h). The parameter structs as CUPTI
// lays them out; each call's structSize is the end of the last field we
// set (CUPTI's STRUCT_SIZE), so newer CUPTIs that appended fields accept them.
namespace spyglass::gpu::abi::pm {
struct ProfilerInitializeParams {
  size_t structSize; void* pPriv;
};
struct DeviceGetChipNameParams {
  size_t structSize; void* pPriv; size_t deviceIndex; const char* pChipName;
};
struct GetCounterAvailabilityParams {
  size_t structSize; void* pPriv; size_t deviceIndex; size_t counterAvailabilityImageSize;
  uint8_t* pCounterAvailabilityImage;
};
struct HostInitializeParams {  // (newer CUPTIs append pSinglePassMetricSetName)
  size_t structSize; void* pPriv; int profilerType; const char* pChipName; const uint8_t* pCounterAvailabilityImage;
  void* pHostObject;
};
struct HostDeinitializeParams {
  size_t structSize; void* pPriv; void* pHostObject;
};
struct HostConfigAddMetricsParams {
  size_t structSize; void* pPriv; void* pHostObject; const char** ppMetricNames; size_t numMetrics;
};
struct HostGetConfigImageSizeParams {
  size_t structSize; void* pPriv; void* pHostObject; size_t configImageSize;
};
struct HostGetConfigImageParams {
  size_t structSize; void* pPriv; void* pHostObject; size_t configImageSize; uint8_t* pConfigImage;
};
struct HostEvaluateToGpuValuesParams {
  size_t structSize; void* pPriv; void* pHostObject; const uint8_t* pCounterDataImage; size_t counterDataImageSize;
  size_t rangeIndex; const char** ppMetricNames; size_t numMetrics; double* pMetricValues;
};
struct EnableParams {
  size_t structSize; void* pPriv; size_t deviceIndex; void* pPmSamplingObject;
};
struct ObjectParams {  // Disable, Start, Stop
  size_t structSize; void* pPriv; void* pPmSamplingObject;
};
struct SetConfigParams {  // (newer CUPTIs append hwBufferAppendMode)
  size_t structSize; void* pPriv; void* pPmSamplingObject; size_t configSize; const uint8_t* pConfig;
  size_t hardwareBufferSize; uint64_t samplingInterval; int triggerMode;
};
struct GetCounterDataSizeParams {
  size_t structSize; void* pPriv; void* pPmSamplingObject; const char** pMetricNames; size_t numMetrics;
  uint32_t maxSamples; size_t counterDataSize;
};
struct CounterDataImageInitializeParams {
  size_t structSize; void* pPriv; void* pPmSamplingObject; size_t counterDataSize; uint8_t* pCounterData;
};
struct DecodeDataParams {
  size_t structSize; void* pPriv; void* pPmSamplingObject; uint8_t* pCounterDataImage; size_t counterDataImageSize;
  int decodeStopReason; uint8_t overflow;
};
struct GetCounterDataInfoParams {
  size_t structSize; void* pPriv; const uint8_t* pCounterDataImage; size_t counterDataImageSize;
  size_t numTotalSamples; size_t numPopulatedSamples; size_t numCompletedSamples;
};
struct GetSampleInfoParams {
  size_t structSize; void* pPriv; void* pPmSamplingObject; const uint8_t* pCounterDataImage;
  size_t counterDataImageSize; size_t sampleIndex; uint64_t startTimestamp; uint64_t endTimestamp;
};
inline constexpr int kProfilerTypePmSampling = 1;         // CUPTI_PROFILER_TYPE_PM_SAMPLING
inline constexpr int kTriggerGpuTimeInterval = 1;         // CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL (ns)
inline constexpr int kDecodeStopCounterDataFull = 1;      // CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL
inline constexpr int kErrorNotSupported = 27;             // CUPTI_ERROR_NOT_SUPPORTED
inline constexpr int kErrorInvalidMetricName = 17, kErrorInvalidChipName = 46, kErrorMigNotSupported = 43,
                     kErrorVirtualizedNotSupported = 33, kErrorWslNotSupported = 45, kErrorCmpNotSupported = 42,
                     kErrorConfidentialNotSupported = 41, kErrorHardwareBusy = 26, kErrorInvalidDevice = 2;
}  // namespace spyglass::gpu::abi::pm

// CUPTI's STRUCT_SIZE: where the last field a caller sets ends.
#define SPYGLASS_CUPTI_STRUCT_SIZE(T, last) (offsetof(T, last) + sizeof(static_cast<T*>(nullptr)->last))
