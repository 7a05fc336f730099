// The program scripts/gpu_check.sh runs on a GPU machine: a traced CUDA
// program (public Spyglass API only) and the per-launch overhead measurement.
//
//   gpu_check_program trace <log_dir> <pprof_path>
//     under TraceAnnotation "step" > "copy_in" / "compute" / "copy_out":
//     cuMemAlloc (in allocate_buffers), 1 MiB H2D async, a kernel, a memset,
//     64 KiB D2H; saves the GPU memory profile while the buffers are live.
//   gpu_check_program overhead <launches> <mode>   mode: none | cupti | spyglass
//     launches empty kernels and prints "ns_per_launch <x>" (host time).
//     cupti = CUPTI activity tracing alone (kernel records, no callbacks,
//     nothing converted): the floor the issue compares against.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "spyglass/annotation.h"
#include "spyglass/memory.h"
#include "spyglass/profiler.h"

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void scale_kernel(float* data, int n, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}

__global__ void empty_kernel() {}

constexpr size_t kCopyIn = 1 << 20, kCopyOut = 65536;

// The driver's entry points by name (nothing here links libcuda).
template <class F>
F Driver(const char* name) {
  static void* h = dlopen("libcuda.so.1", RTLD_NOW);
  F f = h ? reinterpret_cast<F>(dlsym(h, name)) : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "libcuda.so.1: no %s\n", name);
    std::exit(1);
  }
  return f;
}

// The call site gpu_check.sh expects in the GPU memory profile.
__attribute__((noinline)) CUdeviceptr allocate_buffers(size_t bytes) {
  CUdeviceptr p = 0;
  if (Driver<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2")(&p, bytes) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuMemAlloc failed\n");
    std::exit(1);
  }
  return p;
}

int Trace(const char* log_dir, const char* pprof_path) {
  CHECK_CUDA(cudaFree(nullptr));  // creates the context before tracing
  spyglass::profiler::TraceOptions opts;
  // GPU_CHECK_PM=1: PM sampling too (gpu_check.sh's second run; where the
  // counters are restricted to admins, the trace goes on and a warning says so).
  if (std::getenv("GPU_CHECK_PM") != nullptr)
    opts.profiler_options.advanced_configuration.emplace("gpu_pm_sample_counters",
                                                         std::string("sm__cycles_active.avg"));
  if (auto s = spyglass::profiler::start_trace(log_dir, opts); !s.ok()) {
    std::fprintf(stderr, "start_trace: %s\n", s.message().c_str());
    return 1;
  }
  float* host = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, kCopyIn));
  std::memset(host, 0, kCopyIn);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CUdeviceptr dev = 0;
  {
    spyglass::profiler::TraceAnnotation step("step");
    {
      spyglass::profiler::TraceAnnotation a("copy_in");
      dev = allocate_buffers(8 << 20);
      CHECK_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(dev), host, kCopyIn, cudaMemcpyHostToDevice, stream));
    }
    {
      spyglass::profiler::TraceAnnotation a("compute");
      int n = static_cast<int>(kCopyIn / sizeof(float));
      scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(reinterpret_cast<float*>(dev), n, 2.0f);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaMemsetAsync(reinterpret_cast<void*>(dev), 0, 4096, stream));
    }
    {
      spyglass::profiler::TraceAnnotation a("copy_out");
      CHECK_CUDA(cudaMemcpy(host, reinterpret_cast<void*>(dev), kCopyOut, cudaMemcpyDeviceToHost));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  if (auto s = spyglass::profiler::save_device_memory_profile(pprof_path, "gpu"); !s.ok()) {
    std::fprintf(stderr, "save_device_memory_profile: %s\n", s.message().c_str());
    return 1;
  }
  if (auto s = spyglass::profiler::stop_trace(); !s.ok()) {
    std::fprintf(stderr, "stop_trace: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("xplane %s\n", spyglass::profiler::last_trace_files().xplane_path.c_str());
  Driver<CUresult (*)(CUdeviceptr)>("cuMemFree_v2")(dev);
  cudaFreeHost(host);
  return 0;
}

// CUPTI activity alone: the floor.
void CUPTIAPI Requested(uint8_t** b, size_t* size, size_t* max) {
  *size = 1 << 20;
  *b = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max = 0;
}
void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* b, size_t, size_t) { std::free(b); }

int Overhead(int launches, const std::string& mode) {
  CHECK_CUDA(cudaFree(nullptr));
  for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 1>>>();  // warm up
  CHECK_CUDA(cudaDeviceSynchronize());
  if (mode == "cupti") {
    if (cuptiActivityRegisterCallbacks(Requested, Completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
      std::fprintf(stderr, "CUPTI activity tracing failed\n");
      return 1;
    }
  } else if (mode == "spyglass") {
    if (auto s = spyglass::profiler::start_trace("/tmp/gpu_check_overhead"); !s.ok()) {
      std::fprintf(stderr, "start_trace: %s\n", s.message().c_str());
      return 1;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) empty_kernel<<<1, 1>>>();
  auto t1 = std::chrono::steady_clock::now();
  CHECK_CUDA(cudaDeviceSynchronize());
  if (mode == "cupti") cuptiActivityFlushAll(1);
  if (mode == "spyglass") (void)spyglass::profiler::stop_trace();
  std::printf("ns_per_launch %.1f\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / launches);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "trace") return Trace(argv[2], argv[3]);
  if (argc == 4 && std::string(argv[1]) == "overhead") return Overhead(std::atoi(argv[2]), argv[3]);
  std::fprintf(stderr, "usage: gpu_check_program trace <log_dir> <pprof> | overhead <n> none|cupti|spyglass\n");
  return 2;
}
