// CUPTI records and callback data built in memory with NVIDIA's own struct
// layouts (headers from the pip wheel nvidia-cuda-cupti, never committed),
// converted by the GPU tracer's code into an .xplane.pb that
// gpu_xprof_check.py then reads with XProf's own converter. Also checks that
// our ABI declarations (src/gpu/cupti_abi.h) agree with the headers.
//
//   gpu_records_test <out.xplane.pb>
#include <cupti.h>
#include <cupti_pmsampling.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_target.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "gpu/cupti_abi.h"
#include "gpu/gpu_callback.h"
#include "gpu/gpu_convert.h"
#include "gpu/pm_sampling.h"
#include "memory/pprof.h"
#include "memory/tracker.h"
#include "model/schema.h"
#include "spyglass/memory.h"

namespace abi = spyglass::gpu::abi;

// Our declarations against NVIDIA's.
#define SAME(T, field, ours) static_assert(offsetof(T, field) == (ours), #T "." #field)
SAME(CUpti_ActivityKernel9, registersPerThread, abi::kernel::kRegistersPerThread);
SAME(CUpti_ActivityKernel9, start, abi::kernel::kStart);
SAME(CUpti_ActivityKernel9, end, abi::kernel::kEnd);
SAME(CUpti_ActivityKernel9, deviceId, abi::kernel::kDeviceId);
SAME(CUpti_ActivityKernel9, contextId, abi::kernel::kContextId);
SAME(CUpti_ActivityKernel9, streamId, abi::kernel::kStreamId);
SAME(CUpti_ActivityKernel9, gridX, abi::kernel::kGridX);
SAME(CUpti_ActivityKernel9, blockX, abi::kernel::kBlockX);
SAME(CUpti_ActivityKernel9, staticSharedMemory, abi::kernel::kStaticShared);
SAME(CUpti_ActivityKernel9, dynamicSharedMemory, abi::kernel::kDynamicShared);
SAME(CUpti_ActivityKernel9, correlationId, abi::kernel::kCorrelationId);
SAME(CUpti_ActivityKernel9, name, abi::kernel::kName);
SAME(CUpti_ActivityKernel9, graphId, abi::kernel::kGraphId);
SAME(CUpti_ActivityKernel4, correlationId, abi::kernel::kCorrelationId);
SAME(CUpti_ActivityKernel4, name, abi::kernel::kName);
SAME(CUpti_ActivityMemcpy5, copyKind, abi::memcpy::kCopyKind);
SAME(CUpti_ActivityMemcpy5, srcKind, abi::memcpy::kSrcKind);
SAME(CUpti_ActivityMemcpy5, dstKind, abi::memcpy::kDstKind);
SAME(CUpti_ActivityMemcpy5, flags, abi::memcpy::kFlags);
SAME(CUpti_ActivityMemcpy5, bytes, abi::memcpy::kBytes);
SAME(CUpti_ActivityMemcpy5, start, abi::memcpy::kStart);
SAME(CUpti_ActivityMemcpy5, deviceId, abi::memcpy::kDeviceId);
SAME(CUpti_ActivityMemcpy5, contextId, abi::memcpy::kContextId);
SAME(CUpti_ActivityMemcpy5, streamId, abi::memcpy::kStreamId);
SAME(CUpti_ActivityMemcpy5, correlationId, abi::memcpy::kCorrelationId);
SAME(CUpti_ActivityMemcpy5, graphId, abi::memcpy::kGraphId);
SAME(CUpti_ActivityMemcpyPtoP4, srcDeviceId, abi::memcpy_p2p::kSrcDeviceId);
SAME(CUpti_ActivityMemcpyPtoP4, dstDeviceId, abi::memcpy_p2p::kDstDeviceId);
SAME(CUpti_ActivityMemcpyPtoP4, correlationId, abi::memcpy_p2p::kCorrelationId);
SAME(CUpti_ActivityMemset4, bytes, abi::memset::kBytes);
SAME(CUpti_ActivityMemset4, start, abi::memset::kStart);
SAME(CUpti_ActivityMemset4, deviceId, abi::memset::kDeviceId);
SAME(CUpti_ActivityMemset4, streamId, abi::memset::kStreamId);
SAME(CUpti_ActivityMemset4, correlationId, abi::memset::kCorrelationId);
SAME(CUpti_ActivityMemset4, flags, abi::memset::kFlags);
SAME(CUpti_ActivityMemset4, memoryKind, abi::memset::kMemoryKind);
SAME(CUpti_ActivityGraphTrace2, correlationId, abi::graph_trace::kCorrelationId);
SAME(CUpti_ActivityGraphTrace2, start, abi::graph_trace::kStart);
SAME(CUpti_ActivityGraphTrace2, deviceId, abi::graph_trace::kDeviceId);
SAME(CUpti_ActivityGraphTrace2, graphId, abi::graph_trace::kGraphId);
SAME(CUpti_ActivityGraphTrace2, streamId, abi::graph_trace::kStreamId);
SAME(CUpti_CallbackData, callbackSite, abi::cbdata::kCallbackSite);
SAME(CUpti_CallbackData, functionName, abi::cbdata::kFunctionName);
SAME(CUpti_CallbackData, functionParams, abi::cbdata::kFunctionParams);
SAME(CUpti_CallbackData, functionReturnValue, abi::cbdata::kFunctionReturnValue);
SAME(CUpti_CallbackData, symbolName, abi::cbdata::kSymbolName);
SAME(CUpti_CallbackData, context, abi::cbdata::kContext);
SAME(CUpti_CallbackData, correlationData, abi::cbdata::kCorrelationData);
SAME(CUpti_CallbackData, correlationId, abi::cbdata::kCorrelationId);
static_assert(sizeof(CUpti_CallbackData) == abi::cbdata::kSize);
SAME(CUpti_ActivityMarker2, flags, abi::marker::kFlags);
SAME(CUpti_ActivityMarker2, timestamp, abi::marker::kTimestamp);
SAME(CUpti_ActivityMarker2, id, abi::marker::kId);
SAME(CUpti_ActivityMarker2, objectKind, abi::marker::kObjectKind);
SAME(CUpti_ActivityMarker2, objectId, abi::marker::kObjectId);
SAME(CUpti_ActivityMarker2, name, abi::marker::kName);
SAME(CUpti_ActivityMarker2, domain, abi::marker::kDomain);
static_assert(offsetof(CUpti_ActivityObjectKindId, pt.threadId) == abi::marker::kThreadIdInObjectId);
static_assert(CUPTI_ACTIVITY_FLAG_MARKER_START == abi::marker::kFlagStart &&
              CUPTI_ACTIVITY_FLAG_MARKER_END == abi::marker::kFlagEnd);
static_assert(CUPTI_ACTIVITY_OBJECT_THREAD == abi::marker::kObjectThread);
static_assert(CUPTI_ACTIVITY_KIND_MARKER == abi::kind::kMarker);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel == abi::cbid::kLaunchKernel);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx == abi::cbid::kLaunchKernelEx);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2 == abi::cbid::kMemcpyHtoDAsync);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2 == abi::cbid::kMemcpyDtoH);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async == abi::cbid::kMemsetD32Async);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch == abi::cbid::kGraphLaunch);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 == abi::cbid::kMemAlloc);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged == abi::cbid::kMemAllocManaged);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2 == abi::cbid::kMemAllocHost);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync == abi::cbid::kMemAllocAsync);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2 == abi::cbid::kMemFree);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync == abi::cbid::kMemFreeAsync);
static_assert(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL == abi::kind::kConcurrentKernel);
static_assert(CUPTI_ACTIVITY_KIND_MEMCPY == abi::kind::kMemcpy);
static_assert(CUPTI_ACTIVITY_KIND_MEMSET == abi::kind::kMemset);
static_assert(CUPTI_ACTIVITY_KIND_GRAPH_TRACE == abi::kind::kGraphTrace);
static_assert(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES == abi::kErrorInsufficientPrivileges);
static_assert(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED == abi::kErrorMultipleSubscribers);
static_assert(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD == abi::kCopyHtoD && CUPTI_ACTIVITY_MEMCPY_KIND_DTOH == abi::kCopyDtoH);
static_assert(CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC == abi::kMemcpyFlagAsync);
// GPU memory beyond cuMemAlloc: host registration, VMM, the runtime's calls.
static_assert(CUPTI_CB_DOMAIN_RUNTIME_API == abi::kDomainRuntimeApi);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2 == abi::cbid::kMemAllocPitch);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc == abi::cbid::kMemHostAlloc);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost == abi::cbid::kMemFreeHost);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz == abi::cbid::kMemAllocAsyncPtsz);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz == abi::cbid::kMemFreeAsyncPtsz);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync == abi::cbid::kMemAllocFromPoolAsync);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz == abi::cbid::kMemAllocFromPoolAsyncPtsz);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2 == abi::cbid::kMemHostRegister);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister == abi::cbid::kMemHostUnregister);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemCreate == abi::cbid::kMemCreate);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemRelease == abi::cbid::kMemRelease);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemMap == abi::cbid::kMemMap);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuMemUnmap == abi::cbid::kMemUnmap);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020 == abi::rt_cbid::kMalloc);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020 == abi::rt_cbid::kMallocPitch);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020 == abi::rt_cbid::kFree);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020 == abi::rt_cbid::kMallocHost);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020 == abi::rt_cbid::kFreeHost);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020 == abi::rt_cbid::kHostAlloc);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaHostRegister_v4000 == abi::rt_cbid::kHostRegister);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaHostUnregister_v4000 == abi::rt_cbid::kHostUnregister);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000 == abi::rt_cbid::kMallocManaged);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020 == abi::rt_cbid::kMallocAsync);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020 == abi::rt_cbid::kMallocAsyncPtsz);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020 == abi::rt_cbid::kFreeAsync);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020 == abi::rt_cbid::kFreeAsyncPtsz);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020 == abi::rt_cbid::kMallocFromPoolAsync);
static_assert(CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020 == abi::rt_cbid::kMallocFromPoolAsyncPtsz);
SAME(CUmemAllocationProp, location.type, abi::mem_prop::kLocationType);
SAME(CUmemAllocationProp, location.id, abi::mem_prop::kLocationId);
static_assert(CU_MEM_LOCATION_TYPE_DEVICE == abi::mem_prop::kLocationDevice);
// The parameter layouts the memory callback reads (spec GPU.md §7.2).
SAME(cuMemCreate_params, handle, 0);
SAME(cuMemCreate_params, size, 8);
SAME(cuMemCreate_params, prop, 16);
SAME(cuMemRelease_params, handle, 0);
SAME(cuMemMap_params, size, 8);
SAME(cuMemUnmap_params, size, 8);
SAME(cuMemHostRegister_v2_params, p, 0);
SAME(cuMemHostRegister_v2_params, bytesize, 8);
SAME(cuMemHostUnregister_params, p, 0);
SAME(cuMemAllocFromPoolAsync_params, bytesize, 8);
SAME(cuMemFreeAsync_params, dptr, 0);
SAME(cudaMalloc_v3020_params, devPtr, 0);
SAME(cudaMalloc_v3020_params, size, 8);
SAME(cudaMallocPitch_v3020_params, pitch, 8);
SAME(cudaMallocPitch_v3020_params, height, 24);
SAME(cudaFree_v3020_params, devPtr, 0);
SAME(cudaMallocHost_v3020_params, size, 8);
SAME(cudaHostAlloc_v3020_params, size, 8);
SAME(cudaFreeHost_v3020_params, ptr, 0);
SAME(cudaHostRegister_v4000_params, ptr, 0);
SAME(cudaHostRegister_v4000_params, size, 8);
SAME(cudaMallocManaged_v6000_params, size, 8);
SAME(cudaMallocAsync_v11020_params, size, 8);
SAME(cudaFreeAsync_v11020_params, devPtr, 0);
SAME(cudaMallocFromPoolAsync_v11020_params, size, 8);
// PM sampling: our parameter structs against NVIDIA's, field by field, and
// the struct sizes we pass (CUPTI's STRUCT_SIZE up to our last field).
static_assert(offsetof(CUpti_Profiler_Initialize_Params, structSize) == offsetof(abi::pm::ProfilerInitializeParams, structSize), "ProfilerInitializeParams.structSize");
static_assert(offsetof(CUpti_Profiler_Initialize_Params, pPriv) == offsetof(abi::pm::ProfilerInitializeParams, pPriv), "ProfilerInitializeParams.pPriv");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Initialize_Params, pPriv) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::ProfilerInitializeParams, pPriv));
static_assert(offsetof(CUpti_Device_GetChipName_Params, structSize) == offsetof(abi::pm::DeviceGetChipNameParams, structSize), "DeviceGetChipNameParams.structSize");
static_assert(offsetof(CUpti_Device_GetChipName_Params, pPriv) == offsetof(abi::pm::DeviceGetChipNameParams, pPriv), "DeviceGetChipNameParams.pPriv");
static_assert(offsetof(CUpti_Device_GetChipName_Params, deviceIndex) == offsetof(abi::pm::DeviceGetChipNameParams, deviceIndex), "DeviceGetChipNameParams.deviceIndex");
static_assert(offsetof(CUpti_Device_GetChipName_Params, pChipName) == offsetof(abi::pm::DeviceGetChipNameParams, pChipName), "DeviceGetChipNameParams.pChipName");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Device_GetChipName_Params, pChipName) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::DeviceGetChipNameParams, pChipName));
static_assert(offsetof(CUpti_PmSampling_GetCounterAvailability_Params, structSize) == offsetof(abi::pm::GetCounterAvailabilityParams, structSize), "GetCounterAvailabilityParams.structSize");
static_assert(offsetof(CUpti_PmSampling_GetCounterAvailability_Params, pPriv) == offsetof(abi::pm::GetCounterAvailabilityParams, pPriv), "GetCounterAvailabilityParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_GetCounterAvailability_Params, deviceIndex) == offsetof(abi::pm::GetCounterAvailabilityParams, deviceIndex), "GetCounterAvailabilityParams.deviceIndex");
static_assert(offsetof(CUpti_PmSampling_GetCounterAvailability_Params, counterAvailabilityImageSize) == offsetof(abi::pm::GetCounterAvailabilityParams, counterAvailabilityImageSize), "GetCounterAvailabilityParams.counterAvailabilityImageSize");
static_assert(offsetof(CUpti_PmSampling_GetCounterAvailability_Params, pCounterAvailabilityImage) == offsetof(abi::pm::GetCounterAvailabilityParams, pCounterAvailabilityImage), "GetCounterAvailabilityParams.pCounterAvailabilityImage");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_GetCounterAvailability_Params, pCounterAvailabilityImage) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::GetCounterAvailabilityParams, pCounterAvailabilityImage));
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, structSize) == offsetof(abi::pm::HostInitializeParams, structSize), "HostInitializeParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, pPriv) == offsetof(abi::pm::HostInitializeParams, pPriv), "HostInitializeParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, profilerType) == offsetof(abi::pm::HostInitializeParams, profilerType), "HostInitializeParams.profilerType");
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, pChipName) == offsetof(abi::pm::HostInitializeParams, pChipName), "HostInitializeParams.pChipName");
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, pCounterAvailabilityImage) == offsetof(abi::pm::HostInitializeParams, pCounterAvailabilityImage), "HostInitializeParams.pCounterAvailabilityImage");
static_assert(offsetof(CUpti_Profiler_Host_Initialize_Params, pHostObject) == offsetof(abi::pm::HostInitializeParams, pHostObject), "HostInitializeParams.pHostObject");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_Initialize_Params, pHostObject) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostInitializeParams, pHostObject));
static_assert(offsetof(CUpti_Profiler_Host_Deinitialize_Params, structSize) == offsetof(abi::pm::HostDeinitializeParams, structSize), "HostDeinitializeParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_Deinitialize_Params, pPriv) == offsetof(abi::pm::HostDeinitializeParams, pPriv), "HostDeinitializeParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_Deinitialize_Params, pHostObject) == offsetof(abi::pm::HostDeinitializeParams, pHostObject), "HostDeinitializeParams.pHostObject");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_Deinitialize_Params, pHostObject) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostDeinitializeParams, pHostObject));
static_assert(offsetof(CUpti_Profiler_Host_ConfigAddMetrics_Params, structSize) == offsetof(abi::pm::HostConfigAddMetricsParams, structSize), "HostConfigAddMetricsParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_ConfigAddMetrics_Params, pPriv) == offsetof(abi::pm::HostConfigAddMetricsParams, pPriv), "HostConfigAddMetricsParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_ConfigAddMetrics_Params, pHostObject) == offsetof(abi::pm::HostConfigAddMetricsParams, pHostObject), "HostConfigAddMetricsParams.pHostObject");
static_assert(offsetof(CUpti_Profiler_Host_ConfigAddMetrics_Params, ppMetricNames) == offsetof(abi::pm::HostConfigAddMetricsParams, ppMetricNames), "HostConfigAddMetricsParams.ppMetricNames");
static_assert(offsetof(CUpti_Profiler_Host_ConfigAddMetrics_Params, numMetrics) == offsetof(abi::pm::HostConfigAddMetricsParams, numMetrics), "HostConfigAddMetricsParams.numMetrics");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_ConfigAddMetrics_Params, numMetrics) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostConfigAddMetricsParams, numMetrics));
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImageSize_Params, structSize) == offsetof(abi::pm::HostGetConfigImageSizeParams, structSize), "HostGetConfigImageSizeParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImageSize_Params, pPriv) == offsetof(abi::pm::HostGetConfigImageSizeParams, pPriv), "HostGetConfigImageSizeParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImageSize_Params, pHostObject) == offsetof(abi::pm::HostGetConfigImageSizeParams, pHostObject), "HostGetConfigImageSizeParams.pHostObject");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize) == offsetof(abi::pm::HostGetConfigImageSizeParams, configImageSize), "HostGetConfigImageSizeParams.configImageSize");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostGetConfigImageSizeParams, configImageSize));
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImage_Params, structSize) == offsetof(abi::pm::HostGetConfigImageParams, structSize), "HostGetConfigImageParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImage_Params, pPriv) == offsetof(abi::pm::HostGetConfigImageParams, pPriv), "HostGetConfigImageParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImage_Params, pHostObject) == offsetof(abi::pm::HostGetConfigImageParams, pHostObject), "HostGetConfigImageParams.pHostObject");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImage_Params, configImageSize) == offsetof(abi::pm::HostGetConfigImageParams, configImageSize), "HostGetConfigImageParams.configImageSize");
static_assert(offsetof(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage) == offsetof(abi::pm::HostGetConfigImageParams, pConfigImage), "HostGetConfigImageParams.pConfigImage");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostGetConfigImageParams, pConfigImage));
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, structSize) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, structSize), "HostEvaluateToGpuValuesParams.structSize");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pPriv) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, pPriv), "HostEvaluateToGpuValuesParams.pPriv");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pHostObject) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, pHostObject), "HostEvaluateToGpuValuesParams.pHostObject");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pCounterDataImage) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, pCounterDataImage), "HostEvaluateToGpuValuesParams.pCounterDataImage");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, counterDataImageSize) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, counterDataImageSize), "HostEvaluateToGpuValuesParams.counterDataImageSize");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, rangeIndex) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, rangeIndex), "HostEvaluateToGpuValuesParams.rangeIndex");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, ppMetricNames) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, ppMetricNames), "HostEvaluateToGpuValuesParams.ppMetricNames");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, numMetrics) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, numMetrics), "HostEvaluateToGpuValuesParams.numMetrics");
static_assert(offsetof(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pMetricValues) == offsetof(abi::pm::HostEvaluateToGpuValuesParams, pMetricValues), "HostEvaluateToGpuValuesParams.pMetricValues");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pMetricValues) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::HostEvaluateToGpuValuesParams, pMetricValues));
static_assert(offsetof(CUpti_PmSampling_Enable_Params, structSize) == offsetof(abi::pm::EnableParams, structSize), "EnableParams.structSize");
static_assert(offsetof(CUpti_PmSampling_Enable_Params, pPriv) == offsetof(abi::pm::EnableParams, pPriv), "EnableParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_Enable_Params, deviceIndex) == offsetof(abi::pm::EnableParams, deviceIndex), "EnableParams.deviceIndex");
static_assert(offsetof(CUpti_PmSampling_Enable_Params, pPmSamplingObject) == offsetof(abi::pm::EnableParams, pPmSamplingObject), "EnableParams.pPmSamplingObject");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_Enable_Params, pPmSamplingObject) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::EnableParams, pPmSamplingObject));
static_assert(offsetof(CUpti_PmSampling_Start_Params, structSize) == offsetof(abi::pm::ObjectParams, structSize), "ObjectParams.structSize");
static_assert(offsetof(CUpti_PmSampling_Start_Params, pPriv) == offsetof(abi::pm::ObjectParams, pPriv), "ObjectParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_Start_Params, pPmSamplingObject) == offsetof(abi::pm::ObjectParams, pPmSamplingObject), "ObjectParams.pPmSamplingObject");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_Start_Params, pPmSamplingObject) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::ObjectParams, pPmSamplingObject));
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, structSize) == offsetof(abi::pm::SetConfigParams, structSize), "SetConfigParams.structSize");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, pPriv) == offsetof(abi::pm::SetConfigParams, pPriv), "SetConfigParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, pPmSamplingObject) == offsetof(abi::pm::SetConfigParams, pPmSamplingObject), "SetConfigParams.pPmSamplingObject");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, configSize) == offsetof(abi::pm::SetConfigParams, configSize), "SetConfigParams.configSize");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, pConfig) == offsetof(abi::pm::SetConfigParams, pConfig), "SetConfigParams.pConfig");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, hardwareBufferSize) == offsetof(abi::pm::SetConfigParams, hardwareBufferSize), "SetConfigParams.hardwareBufferSize");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, samplingInterval) == offsetof(abi::pm::SetConfigParams, samplingInterval), "SetConfigParams.samplingInterval");
static_assert(offsetof(CUpti_PmSampling_SetConfig_Params, triggerMode) == offsetof(abi::pm::SetConfigParams, triggerMode), "SetConfigParams.triggerMode");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_SetConfig_Params, triggerMode) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::SetConfigParams, triggerMode));
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, structSize) == offsetof(abi::pm::GetCounterDataSizeParams, structSize), "GetCounterDataSizeParams.structSize");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, pPriv) == offsetof(abi::pm::GetCounterDataSizeParams, pPriv), "GetCounterDataSizeParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, pPmSamplingObject) == offsetof(abi::pm::GetCounterDataSizeParams, pPmSamplingObject), "GetCounterDataSizeParams.pPmSamplingObject");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, pMetricNames) == offsetof(abi::pm::GetCounterDataSizeParams, pMetricNames), "GetCounterDataSizeParams.pMetricNames");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, numMetrics) == offsetof(abi::pm::GetCounterDataSizeParams, numMetrics), "GetCounterDataSizeParams.numMetrics");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, maxSamples) == offsetof(abi::pm::GetCounterDataSizeParams, maxSamples), "GetCounterDataSizeParams.maxSamples");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataSize_Params, counterDataSize) == offsetof(abi::pm::GetCounterDataSizeParams, counterDataSize), "GetCounterDataSizeParams.counterDataSize");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_GetCounterDataSize_Params, counterDataSize) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::GetCounterDataSizeParams, counterDataSize));
static_assert(offsetof(CUpti_PmSampling_CounterDataImage_Initialize_Params, structSize) == offsetof(abi::pm::CounterDataImageInitializeParams, structSize), "CounterDataImageInitializeParams.structSize");
static_assert(offsetof(CUpti_PmSampling_CounterDataImage_Initialize_Params, pPriv) == offsetof(abi::pm::CounterDataImageInitializeParams, pPriv), "CounterDataImageInitializeParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_CounterDataImage_Initialize_Params, pPmSamplingObject) == offsetof(abi::pm::CounterDataImageInitializeParams, pPmSamplingObject), "CounterDataImageInitializeParams.pPmSamplingObject");
static_assert(offsetof(CUpti_PmSampling_CounterDataImage_Initialize_Params, counterDataSize) == offsetof(abi::pm::CounterDataImageInitializeParams, counterDataSize), "CounterDataImageInitializeParams.counterDataSize");
static_assert(offsetof(CUpti_PmSampling_CounterDataImage_Initialize_Params, pCounterData) == offsetof(abi::pm::CounterDataImageInitializeParams, pCounterData), "CounterDataImageInitializeParams.pCounterData");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_CounterDataImage_Initialize_Params, pCounterData) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::CounterDataImageInitializeParams, pCounterData));
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, structSize) == offsetof(abi::pm::DecodeDataParams, structSize), "DecodeDataParams.structSize");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, pPriv) == offsetof(abi::pm::DecodeDataParams, pPriv), "DecodeDataParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, pPmSamplingObject) == offsetof(abi::pm::DecodeDataParams, pPmSamplingObject), "DecodeDataParams.pPmSamplingObject");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, pCounterDataImage) == offsetof(abi::pm::DecodeDataParams, pCounterDataImage), "DecodeDataParams.pCounterDataImage");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, counterDataImageSize) == offsetof(abi::pm::DecodeDataParams, counterDataImageSize), "DecodeDataParams.counterDataImageSize");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, decodeStopReason) == offsetof(abi::pm::DecodeDataParams, decodeStopReason), "DecodeDataParams.decodeStopReason");
static_assert(offsetof(CUpti_PmSampling_DecodeData_Params, overflow) == offsetof(abi::pm::DecodeDataParams, overflow), "DecodeDataParams.overflow");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_DecodeData_Params, overflow) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::DecodeDataParams, overflow));
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, structSize) == offsetof(abi::pm::GetCounterDataInfoParams, structSize), "GetCounterDataInfoParams.structSize");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, pPriv) == offsetof(abi::pm::GetCounterDataInfoParams, pPriv), "GetCounterDataInfoParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, pCounterDataImage) == offsetof(abi::pm::GetCounterDataInfoParams, pCounterDataImage), "GetCounterDataInfoParams.pCounterDataImage");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, counterDataImageSize) == offsetof(abi::pm::GetCounterDataInfoParams, counterDataImageSize), "GetCounterDataInfoParams.counterDataImageSize");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, numTotalSamples) == offsetof(abi::pm::GetCounterDataInfoParams, numTotalSamples), "GetCounterDataInfoParams.numTotalSamples");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, numPopulatedSamples) == offsetof(abi::pm::GetCounterDataInfoParams, numPopulatedSamples), "GetCounterDataInfoParams.numPopulatedSamples");
static_assert(offsetof(CUpti_PmSampling_GetCounterDataInfo_Params, numCompletedSamples) == offsetof(abi::pm::GetCounterDataInfoParams, numCompletedSamples), "GetCounterDataInfoParams.numCompletedSamples");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_GetCounterDataInfo_Params, numCompletedSamples) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::GetCounterDataInfoParams, numCompletedSamples));
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, structSize) == offsetof(abi::pm::GetSampleInfoParams, structSize), "GetSampleInfoParams.structSize");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, pPriv) == offsetof(abi::pm::GetSampleInfoParams, pPriv), "GetSampleInfoParams.pPriv");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, pPmSamplingObject) == offsetof(abi::pm::GetSampleInfoParams, pPmSamplingObject), "GetSampleInfoParams.pPmSamplingObject");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, pCounterDataImage) == offsetof(abi::pm::GetSampleInfoParams, pCounterDataImage), "GetSampleInfoParams.pCounterDataImage");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, counterDataImageSize) == offsetof(abi::pm::GetSampleInfoParams, counterDataImageSize), "GetSampleInfoParams.counterDataImageSize");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, sampleIndex) == offsetof(abi::pm::GetSampleInfoParams, sampleIndex), "GetSampleInfoParams.sampleIndex");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, startTimestamp) == offsetof(abi::pm::GetSampleInfoParams, startTimestamp), "GetSampleInfoParams.startTimestamp");
static_assert(offsetof(CUpti_PmSampling_CounterData_GetSampleInfo_Params, endTimestamp) == offsetof(abi::pm::GetSampleInfoParams, endTimestamp), "GetSampleInfoParams.endTimestamp");
static_assert(CUPTI_PROFILER_STRUCT_SIZE(CUpti_PmSampling_CounterData_GetSampleInfo_Params, endTimestamp) == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::GetSampleInfoParams, endTimestamp));
static_assert(CUpti_PmSampling_Stop_Params_STRUCT_SIZE == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::ObjectParams, pPmSamplingObject) &&
              CUpti_PmSampling_Disable_Params_STRUCT_SIZE == SPYGLASS_CUPTI_STRUCT_SIZE(abi::pm::ObjectParams, pPmSamplingObject));
static_assert(CUPTI_PROFILER_TYPE_PM_SAMPLING == abi::pm::kProfilerTypePmSampling &&
              CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL == abi::pm::kTriggerGpuTimeInterval &&
              CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL == abi::pm::kDecodeStopCounterDataFull);
static_assert(CUPTI_ERROR_NOT_SUPPORTED == abi::pm::kErrorNotSupported && CUPTI_ERROR_INVALID_METRIC_NAME == abi::pm::kErrorInvalidMetricName &&
              CUPTI_ERROR_INVALID_CHIP_NAME == abi::pm::kErrorInvalidChipName && CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED == abi::pm::kErrorMigNotSupported &&
              CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED == abi::pm::kErrorVirtualizedNotSupported &&
              CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED == abi::pm::kErrorWslNotSupported && CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED == abi::pm::kErrorCmpNotSupported &&
              CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED == abi::pm::kErrorConfidentialNotSupported &&
              CUPTI_ERROR_HARDWARE_BUSY == abi::pm::kErrorHardwareBusy &&
              CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES == abi::kErrorVirtualizedInsufficientPrivileges);
// Graph node mapping: resource callbacks, the graph node of device records.
static_assert(CUPTI_CB_DOMAIN_RESOURCE == abi::kDomainResource);
static_assert(CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED == abi::kResourceGraphNodeCreated);
static_assert(CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED == abi::kResourceGraphNodeCloned);
SAME(CUpti_ResourceData, resourceDescriptor, abi::resource::kResourceDescriptor);
SAME(CUpti_GraphData, graph, abi::graph_data::kGraph);
SAME(CUpti_GraphData, node, abi::graph_data::kNode);
SAME(CUpti_GraphData, originalNode, abi::graph_data::kOriginalNode);
SAME(CUpti_GraphData, nodeType, abi::graph_data::kNodeType);
SAME(CUpti_ActivityKernel9, graphNodeId, abi::kernel::kGraphNodeId);
SAME(CUpti_ActivityMemcpy5, graphNodeId, abi::memcpy::kGraphNodeId);
SAME(CUpti_ActivityMemset4, graphNodeId, abi::memset::kGraphNodeId);
SAME(CUpti_ActivityMemset4, graphId, abi::memset::kGraphId);
static_assert(CUPTI_DRIVER_TRACE_CBID_cuGraphCreate == abi::cbid::kGraphCreate &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode == abi::cbid::kGraphAddKernelNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddMemcpyNode == abi::cbid::kGraphAddMemcpyNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddMemsetNode == abi::cbid::kGraphAddMemsetNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate == abi::cbid::kGraphInstantiate &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphClone == abi::cbid::kGraphClone &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddChildGraphNode == abi::cbid::kGraphAddChildGraphNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddEmptyNode == abi::cbid::kGraphAddEmptyNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddHostNode == abi::cbid::kGraphAddHostNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2 == abi::cbid::kGraphInstantiateV2 &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddEventRecordNode == abi::cbid::kGraphAddEventRecordNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddEventWaitNode == abi::cbid::kGraphAddEventWaitNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddMemAllocNode == abi::cbid::kGraphAddMemAllocNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddMemFreeNode == abi::cbid::kGraphAddMemFreeNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags == abi::cbid::kGraphInstantiateWithFlags &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams == abi::cbid::kGraphInstantiateWithParams &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz == abi::cbid::kGraphInstantiateWithParamsPtsz &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddBatchMemOpNode == abi::cbid::kGraphAddBatchMemOpNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2 == abi::cbid::kGraphAddKernelNodeV2 &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode == abi::cbid::kGraphAddNode &&
              CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode_v2 == abi::cbid::kGraphAddNodeV2);

namespace {

int failures = 0;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;  // CUPTI clock (ns) at the session start
uint64_t At(uint64_t us) { return kT0 + us * 1000; }

uint64_t g_now = 0;
spyglass::gpu::CallbackSink* g_sink = nullptr;
int FakeTimestamp(uint64_t* t) {
  *t = g_now;
  return 0;
}
// Live GPU bytes and allocations per kind in the memory profile of `device`.
std::map<std::string, std::pair<int64_t, int64_t>> LiveByKind(const char* device) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  std::string pprof;
  if (!spyglass::profiler::device_memory_profile(&pprof, device).ok()) return out;
  spyglass::memory::PprofProfile prof;
  if (!spyglass::memory::ParsePprof(pprof, &prof).ok()) return out;
  for (const auto& s : prof.samples) {
    auto kind = s.labels.find("kind"), dev = s.labels.find("device");
    if (kind == s.labels.end() || dev == s.labels.end() || dev->second != device) continue;
    auto& [bytes, count] = out[std::string(kind->second)];
    bytes += s.values[prof.bytes_index];
    count += prof.count_index >= 0 ? s.values[prof.count_index] : 1;
  }
  return out;
}

// Graph and node handles stand for their ids in these tests.
int FakeGraphNodeId(void* node, uint64_t* id) {
  *id = reinterpret_cast<uintptr_t>(node);
  return 0;
}
int FakeGraphId(void* graph, uint32_t* id) {
  *id = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(graph));
  return 0;
}
// CUPTI's resource callback for a graph node made (or cloned from `original`) now.
void NodeMade(spyglass::gpu::CallbackSink& sink, uintptr_t graph, uintptr_t node, CUgraphNodeType type,
              uintptr_t original = 0) {
  CUpti_GraphData g{};
  g.graph = reinterpret_cast<CUgraph>(graph);
  g.node = reinterpret_cast<CUgraphNode>(node);
  g.originalNode = reinterpret_cast<CUgraphNode>(original);
  g.nodeType = type;
  CUpti_ResourceData r{};
  r.resourceDescriptor = &g;
  spyglass::gpu::ApiCallback(&sink, CUPTI_CB_DOMAIN_RESOURCE,
                             original ? CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED : CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, &r);
}

int FakeDeviceId(void*, uint32_t* d) {
  *d = 0;
  return 0;
}

// One driver call through the real callback: enter at `start_us`, exit at `end_us`.
void Call(spyglass::gpu::CallbackSink& sink, uint32_t id, const char* fn, uint32_t corr, void* params,
          uint64_t start_us, uint64_t end_us, int ret = CUDA_SUCCESS, CUpti_CallbackDomain domain = CUPTI_CB_DOMAIN_DRIVER_API,
          void (*inside)() = nullptr) {
  uint64_t scratch = 0;
  CUpti_CallbackData d{};
  d.functionName = fn;
  d.functionParams = params;
  d.functionReturnValue = &ret;
  d.context = reinterpret_cast<CUcontext>(0x1000);
  d.correlationData = &scratch;
  d.correlationId = corr;
  d.callbackSite = CUPTI_API_ENTER;
  g_now = At(start_us);
  spyglass::gpu::ApiCallback(&sink, domain, id, &d);
  if (inside) inside();
  d.callbackSite = CUPTI_API_EXIT;
  g_now = At(end_us);
  spyglass::gpu::ApiCallback(&sink, domain, id, &d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpu_records_test <out.xplane.pb>\n");
    return 2;
  }
  using namespace spyglass;
  const uint32_t tid = static_cast<uint32_t>(gettid());

  // What the host tracer wrote: train > layer1 on this thread, in ps since start.
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  model::Line& line = host.line_with_id(tid);
  line.name = line.display_name = "main";
  model::Event train{0, 1'000'000'000, host.intern_event("train"), model::kNoStats};      // 0..1000 us
  model::Event layer{10'000'000, 500'000'000, host.intern_event("layer1"), model::kNoStats};  // 10..510 us
  line.events = {train, layer};

  // Callbacks on this thread, through the real callback with NVIDIA's layouts.
  gpu::CallbackSink sink;
  CHECK(sink.Reserve(1024));
  sink.get_timestamp = &FakeTimestamp;
  sink.get_device_id = &FakeDeviceId;
  CUdeviceptr dptr = 0x7f0000100000ull;
  cuMemAlloc_v2_params alloc{&dptr, 4u << 20};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, "cuMemAlloc_v2", 1, &alloc, 12, 14);
  CUdeviceptr managed = 0x7f0000900000ull;
  cuMemAllocManaged_params man{&managed, 1u << 20, 1};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged, "cuMemAllocManaged", 2, &man, 15, 16);
  CUdeviceptr failed = 0x7f0000a00000ull;
  cuMemAlloc_v2_params bad{&failed, 8u << 20};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, "cuMemAlloc_v2", 3, &bad, 16, 17, CUDA_ERROR_OUT_OF_MEMORY);
  char host_src[16];
  cuMemcpyHtoDAsync_v2_params h2d{dptr, host_src, 1u << 20, nullptr};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync_v2", 10, &h2d, 20, 22);
  cuLaunchKernel_params launch{};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", 11, &launch, 30, 33);
  cuMemsetD32Async_params ms{dptr, 0, 1024, nullptr};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async, "cuMemsetD32Async", 12, &ms, 34, 35);
  cuMemcpyDtoH_v2_params d2h{host_src, dptr, 65536};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", 13, &d2h, 600, 700);  // outside layer1
  CHECK(sink.recorded() == 7);  // (the stream-ordered allocation below makes 9 with the free)

  // GPU memory: the live allocation is in the profile as gpu:0 / device with a
  // stack; the failed call is not; the freed one goes.
  cuMemFree_v2_params fr{managed};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2", 14, &fr, 800, 801);
  std::string pprof;
  CHECK(profiler::device_memory_profile(&pprof, "gpu").ok());
  memory::PprofProfile prof;
  CHECK(memory::ParsePprof(pprof, &prof).ok());
  int gpu_samples = 0;
  for (const auto& s : prof.samples) {
    auto dev = s.labels.find("device"), kind = s.labels.find("kind");
    if (dev == s.labels.end() || dev->second != "gpu:0") continue;
    ++gpu_samples;
    CHECK(kind != s.labels.end() && kind->second == "device");
    CHECK(prof.bytes_index >= 0 && s.values[prof.bytes_index] == (4 << 20));
    CHECK(!s.frames.empty());
  }
  CHECK(gpu_samples == 1);

  // Called from Python: the extension's hook gives the interpreter's frames.
  gpu::SetAllocationStackHook([](uintptr_t* words, int max) {
    if (max < 1) return 0;
    words[0] = memory::internal::SymbolicFrame(memory::internal::InternFunction("train_step", "model.py"), 12);
    return 1;
  });
  CUdeviceptr py_ptr = 0x7f0000c00000ull;
  cuMemAllocAsync_params py_alloc{&py_ptr, 3u << 20, nullptr};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync, "cuMemAllocAsync", 4, &py_alloc, 18, 19);
  gpu::SetAllocationStackHook(nullptr);
  CHECK(profiler::device_memory_profile(&pprof, "gpu:0").ok());
  memory::PprofProfile prof2;
  CHECK(memory::ParsePprof(pprof, &prof2).ok());
  bool python_site = false;
  for (const auto& smp : prof2.samples) {
    auto kind = smp.labels.find("kind");
    if (kind != smp.labels.end() && kind->second == "stream_ordered" && !smp.frames.empty())
      python_site = smp.frames[0].function == "train_step" && smp.frames[0].file == "model.py" &&
                    smp.frames[0].line == 12 && smp.values[prof2.bytes_index] == (3 << 20);
  }
  CHECK(python_site);

  // Every other kind of GPU memory, each under its own kind, through the real
  // callback with NVIDIA's parameter layouts. A runtime call counts once,
  // whether a driver call under it reports the memory or not.
  g_sink = &sink;
  CUdeviceptr pitched = 0x7f0001000000ull;
  size_t pitch = 512;
  cuMemAllocPitch_v2_params pp{&pitched, &pitch, 500, 100, 4};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2, "cuMemAllocPitch_v2", 30, &pp, 100, 101);
  void* pinned = reinterpret_cast<void*>(0x7f0002000000ull);
  cuMemHostAlloc_params hp{&pinned, 2u << 20, 0};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc, "cuMemHostAlloc", 31, &hp, 102, 103);
  // Registering host memory the heap tracker already holds: both records stay.
  static char registered[8192];
  memory::record_allocation(registered, sizeof registered, "cpu:0", "buffer");
  cuMemHostRegister_v2_params hr{registered, sizeof registered, 0};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2, "cuMemHostRegister_v2", 32, &hr, 104, 105);
  CUdeviceptr pooled = 0x7f0003000000ull;
  cuMemAllocFromPoolAsync_params pa{&pooled, 5u << 20, nullptr, nullptr};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 33, &pa, 106, 107);
  // VMM: physical memory on the device of its property (no context); the
  // handle's value equals a live device address: the keys must not collide.
  CUmemGenericAllocationHandle handle = dptr;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  cuMemCreate_params mc{&handle, 6u << 20, &prop, 0};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemCreate, "cuMemCreate", 34, &mc, 108, 109);
  cuMemMap_params mm{0x7f0010000000ull, 6u << 20, 0, handle, 0};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemMap, "cuMemMap", 35, &mm, 109, 110);
  // The runtime alone...
  void* rt = reinterpret_cast<void*>(0x7f0004000000ull);
  cudaMalloc_v3020_params rm{&rt, 7u << 20};
  Call(sink, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, "cudaMalloc_v3020", 36, &rm, 110, 111, cudaSuccess,
       CUPTI_CB_DOMAIN_RUNTIME_API);
  // ...and with its driver call under it.
  static CUdeviceptr nested_ptr = 0x7f0005000000ull;
  static cuMemAllocManaged_params nested{&nested_ptr, 9u << 20, 1};
  void* rt_managed = reinterpret_cast<void*>(nested_ptr);
  cudaMallocManaged_v6000_params rmm{&rt_managed, 9u << 20, 1};
  Call(sink, CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000, "cudaMallocManaged_v6000", 37, &rmm, 112, 116,
       cudaSuccess, CUPTI_CB_DOMAIN_RUNTIME_API, [] {
         Call(*g_sink, CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged, "cuMemAllocManaged", 37, &nested, 113, 114);
       });
  // A failed runtime call is not memory.
  void* rt_failed = reinterpret_cast<void*>(0x7f0006000000ull);
  cudaMallocHost_v3020_params rfail{&rt_failed, 1u << 20};
  Call(sink, CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, "cudaMallocHost_v3020", 38, &rfail, 117, 118,
       cudaErrorMemoryAllocation, CUPTI_CB_DOMAIN_RUNTIME_API);
  auto live = LiveByKind("gpu:0");
  auto Is = [&](const char* kind, int64_t bytes, int64_t count) {
    auto it = live.find(kind);
    bool ok = it != live.end() && it->second.first == bytes && it->second.second == count;
    if (!ok)
      std::fprintf(stderr, "kind %s: %lld bytes in %lld, wanted %lld in %lld\n", kind,
                   static_cast<long long>(it == live.end() ? -1 : it->second.first),
                   static_cast<long long>(it == live.end() ? -1 : it->second.second), static_cast<long long>(bytes),
                   static_cast<long long>(count));
    return ok;
  };
  CHECK(Is("device", (4 << 20) + (7 << 20), 2));
  CHECK(Is("pitched", 512 * 100, 1));
  CHECK(Is("pinned_host", 2 << 20, 1));
  CHECK(Is("host_registered", 8192, 1));
  CHECK(Is("stream_ordered", (3 << 20) + (5 << 20), 2));
  CHECK(Is("vmm", 6 << 20, 1));
  CHECK(Is("managed", 9 << 20, 1));
  CHECK(live.size() == 7);
  // Frees of each kind, by the driver and the runtime.
  cuMemRelease_params rel{handle};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemRelease, "cuMemRelease", 40, &rel, 120, 121);
  cuMemHostUnregister_params hu{registered};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister, "cuMemHostUnregister", 41, &hu, 122, 123);
  cudaFree_v3020_params rf{rt};
  Call(sink, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, "cudaFree_v3020", 42, &rf, 124, 125, cudaSuccess,
       CUPTI_CB_DOMAIN_RUNTIME_API);
  cudaFreeAsync_v11020_params rfa{reinterpret_cast<void*>(pooled), nullptr};
  Call(sink, CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, "cudaFreeAsync_v11020", 43, &rfa, 126, 127, cudaSuccess,
       CUPTI_CB_DOMAIN_RUNTIME_API);
  cuMemFreeHost_params fh{pinned};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost, "cuMemFreeHost", 44, &fh, 128, 129);
  live = LiveByKind("gpu:0");
  CHECK(Is("device", 4 << 20, 1));
  CHECK(Is("stream_ordered", 3 << 20, 1));
  CHECK(live.count("vmm") == 0 && live.count("host_registered") == 0 && live.count("pinned_host") == 0);
  auto heap = LiveByKind("cpu:0");
  CHECK(heap.count("buffer") == 1 && heap["buffer"].first >= 8192);  // the heap's record of the registered range
  memory::record_free(registered);

  // Device records with NVIDIA's layouts.
  gpu::GpuCollector collector;
  CUpti_ActivityKernel9 k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = At(40);
  k.end = At(140);  // 100 us
  k.deviceId = 0;
  k.contextId = 1;
  k.streamId = 7;
  k.gridX = 256, k.gridY = 2, k.gridZ = 1;
  k.blockX = 128, k.blockY = 1, k.blockZ = 1;
  k.registersPerThread = 32;
  k.staticSharedMemory = 1024;
  k.dynamicSharedMemory = 0;
  k.correlationId = 11;
  k.name = "_Z10vector_addPfS_S_i";
  collector.AddRecord(&k);
  CUpti_ActivityMemcpy5 c{};
  c.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  c.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  c.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  c.dstKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  c.flags = CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC;
  c.bytes = 1u << 20;
  c.start = At(25);
  c.end = At(35);
  c.contextId = 1;
  c.streamId = 7;
  c.correlationId = 10;
  collector.AddRecord(&c);
  CUpti_ActivityMemcpy5 c2 = c;
  c2.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
  c2.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  c2.dstKind = CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
  c2.flags = 0;
  c2.bytes = 65536;
  c2.start = At(610);
  c2.end = At(650);
  c2.streamId = 8;
  c2.correlationId = 13;
  collector.AddRecord(&c2);
  CUpti_ActivityMemset4 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.bytes = 4096;
  m.start = At(150);
  m.end = At(152);
  m.contextId = 1;
  m.streamId = 7;
  m.correlationId = 12;
  m.flags = CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  collector.AddRecord(&m);
  CUpti_ActivityGraphTrace2 g{};
  g.kind = CUPTI_ACTIVITY_KIND_GRAPH_TRACE;
  g.start = At(700);
  g.end = At(720);
  g.graphId = 5;
  g.contextId = 1;
  g.streamId = 9;
  g.correlationId = 20;
  collector.AddRecord(&g);
  // An NVTX push/pop range on this thread (MARKER start + end).
  CUpti_ActivityMarker2 mk{};
  mk.kind = CUPTI_ACTIVITY_KIND_MARKER;
  mk.flags = CUPTI_ACTIVITY_FLAG_MARKER_START;
  mk.timestamp = At(45);
  mk.id = 77;
  mk.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  mk.objectId.pt.processId = static_cast<uint32_t>(getpid());
  mk.objectId.pt.threadId = tid;
  mk.name = "nvtx_forward";
  mk.domain = "app";
  collector.AddRecord(&mk);
  mk.flags = CUPTI_ACTIVITY_FLAG_MARKER_END;
  mk.timestamp = At(90);
  mk.name = nullptr;
  collector.AddRecord(&mk);
  CHECK(collector.records() == 6);

  // CUDA graph nodes (gpu_dump_graph_node_mapping): one made by
  // cuGraphAddKernelNode, one by a launch under stream capture, then both
  // cloned by cuGraphInstantiate; what runs are the clones.
  CHECK(sink.ReserveNodes(64));
  sink.get_graph_node_id = &FakeGraphNodeId;
  sink.get_graph_id = &FakeGraphId;
  cuGraphAddKernelNode_v2_params add{};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2, "cuGraphAddKernelNode_v2", 50, &add, 200, 202, CUDA_SUCCESS,
       CUPTI_CB_DOMAIN_DRIVER_API, [] { NodeMade(*g_sink, 42, 1001, CU_GRAPH_NODE_TYPE_KERNEL); });
  cuLaunchKernel_params captured{};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", 51, &captured, 203, 204, CUDA_SUCCESS,
       CUPTI_CB_DOMAIN_DRIVER_API, [] { NodeMade(*g_sink, 42, 1002, CU_GRAPH_NODE_TYPE_KERNEL); });
  cuGraphInstantiateWithFlags_params inst{};
  Call(sink, CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 52, &inst, 205, 208,
       CUDA_SUCCESS, CUPTI_CB_DOMAIN_DRIVER_API, [] {
         NodeMade(*g_sink, 43, 2001, CU_GRAPH_NODE_TYPE_KERNEL, 1001);
         NodeMade(*g_sink, 43, 2002, CU_GRAPH_NODE_TYPE_KERNEL, 1002);
       });
  NodeMade(sink, 44, 3001, CU_GRAPH_NODE_TYPE_MEMSET);  // outside any traced call
  CHECK(sink.node_count() == 5);
  for (uint64_t i = 0; i < sink.node_count(); ++i) collector.AddGraphNode(sink.nodes[i]);
  // The graph's launch runs the clones' kernels.
  CUpti_ActivityKernel9 gk = k;
  gk.start = At(300), gk.end = At(310), gk.streamId = 9, gk.correlationId = 60, gk.graphId = 43, gk.graphNodeId = 2001;
  gk.name = "_Z7captureddPf";
  collector.AddRecord(&gk);
  gk.start = At(311), gk.end = At(320), gk.graphNodeId = 2002, gk.name = "_Z8capturedPf";
  collector.AddRecord(&gk);
  CHECK(collector.records() == 8);

  collector.SetApiEvents({sink.events, sink.size()});
  gpu::ClockMap clock;
  clock.AddSample(kT0, 0, 0);
  clock.AddSample(At(1000), 1'000'000, 1'000'000);
  collector.Export(clock, &space);
  space.hostnames.push_back("gpuhost");

  const model::Plane* dev = space.find_plane("/device:GPU:0");
  CHECK(dev != nullptr);
  if (dev != nullptr) {
    CHECK(dev->lines.size() == 3);
    bool kernel_annotated = false;
    for (const model::Line& l : dev->lines)
      for (const model::Event& e : l.events)
        if (dev->event_metadata()[e.metadata_id].name == "vector_add(float*, float*, float*, int)") {
          CHECK(l.name == "Stream #7(Compute,MemcpyH2D,Memset)");
          CHECK(e.duration_ps == 100'000'000);
          for (const model::Stat& s : l.stats_of(e))
            if (dev->stat_name(s) == model::kAnnotationStackStat) kernel_annotated = dev->stat_text(s) == "train::layer1";
        }
    CHECK(kernel_annotated);
  }
  // The launch on this thread's line, named by its kernel.
  bool launch_found = false;
  const model::Plane& host_after = *space.find_plane(model::kHostPlaneName);
  for (const model::Event& e : host_after.lines[0].events)
    if (host_after.event_metadata()[e.metadata_id].name == "vector_add(float*, float*, float*, int)") {
      launch_found = true;
      CHECK(e.offset_ps == 30'000'000 && e.duration_ps == 3'000'000);
    }
  CHECK(launch_found);
  bool nvtx = false;
  for (const model::Line& l : host_after.lines)
    if (l.id == (int64_t{1} << 32) + tid)
      for (const model::Event& e : l.events)
        nvtx |= host_after.event_metadata()[e.metadata_id].name == "NVTX:app:nvtx_forward" &&
                e.offset_ps == 45'000'000 && e.duration_ps == 45'000'000;
  CHECK(nvtx);

  // Graph node mapping: each graph kernel names its node and the call that
  // made it; each node made is an event on the thread that made it.
  int graph_kernels = 0;
  if (dev != nullptr)
    for (const model::Line& l : dev->lines)
      for (const model::Event& e : l.events) {
        std::string node, api;
        for (const model::Stat& s : l.stats_of(e)) {
          if (dev->stat_name(s) == model::kCudaGraphNodeIdStat) node = std::to_string(s.u64);
          if (dev->stat_name(s) == model::kCudaGraphNodeApiStat) api = dev->stat_text(s);
        }
        if (node == "2001") graph_kernels += api == "cuGraphAddKernelNode_v2";
        if (node == "2002") graph_kernels += api == "cuLaunchKernel";
      }
  CHECK(graph_kernels == 2);
  int node_events = 0;
  for (const model::Line& l : host_after.lines)
    for (const model::Event& e : l.events) {
      const std::string& name = host_after.event_metadata()[e.metadata_id].name;
      if (name.rfind(model::kCudaGraphNodeMapPrefix, 0) != 0) continue;
      std::string node, orig, type;
      for (const model::Stat& s : l.stats_of(e)) {
        if (host_after.stat_name(s) == model::kCudaGraphNodeIdStat) node = std::to_string(s.u64);
        if (host_after.stat_name(s) == model::kCudaGraphOrigNodeIdStat) orig = std::to_string(s.u64);
        if (host_after.stat_name(s) == model::kCudaGraphNodeTypeStat) type = host_after.stat_text(s);
      }
      CHECK(l.id == tid);
      if (name == "CudaGraphNodeMap: cuGraphAddKernelNode_v2" && node == "1001" && type == "kernel" &&
          e.offset_ps == 200'000'000)
        ++node_events;
      if (name == "CudaGraphNodeMap: cuLaunchKernel" && node == "1002") ++node_events;
      if (name == "CudaGraphNodeMap: cuGraphInstantiateWithFlags" && node == "2002" && orig == "1002") ++node_events;
      if (name == "CudaGraphNodeMap: unknown" && node == "3001" && type == "memset") ++node_events;
    }
  CHECK(node_events == 4);

  // Our own trace JSON: a flow arrow from the launch to the kernel.
  std::string json = exporter::TraceJsonString(space);
  CHECK(json.find("\"bind_id\":11,\"flow_out\":true") != std::string::npos);
  CHECK(json.find("\"bind_id\":11,\"flow_in\":true") != std::string::npos);

  // PM sampling's counter line on the same plane (XProf reads the file with it).
  gpu::PmDeviceSamples pm;
  pm.start_ns = {At(100), At(600)};
  pm.end_ns = {At(600), At(1000)};
  pm.values = {42.5, 17.0};
  gpu::AddPmCounters({"sm__cycles_active.avg"}, {pm}, clock, &space);
  CHECK(space.find_plane("/device:GPU:0")->lines.back().name == model::kCounterLineName);

  Status s = exporter::WriteXSpaceFile(space, argv[1]);
  CHECK(s.ok());
  if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
  else std::printf("ok: wrote %s\n", argv[1]);
  return failures ? 1 : 0;
}
