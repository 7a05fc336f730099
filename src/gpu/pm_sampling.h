// GPU performance-counter sampling (gpu_pm_sample_counters, spec GPU.md
// §1.4, §4.5) on CUPTI's PM sampling API (CUPTI 12.6+): the host API turns
// the metric names into a configuration image; the device samples the
// counters into its hardware buffer every gpu_pm_sample_interval_us; a
// thread decodes that buffer every 100 ms into samples (start, end, one
// value per metric). At the end each GPU plane gets a counter line
// (`_counters_`): per metric, a zero-duration event named after it at each
// sample with a double stat of the same name, as XLA writes it.
//
// The CUPTI functions are a table (PmApi), resolved with dlsym or given by
// a test; nothing here needs a GPU to build or to be tested.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_convert.h"
#include "model/xspace.h"

namespace spyglass::gpu {

// Every CUPTI call takes one parameter struct (cupti_abi.h, namespace pm).
struct PmApi {
  using Fn = int (*)(void*);
  Fn ProfilerInitialize, ProfilerDeInitialize, DeviceGetChipName, GetCounterAvailability, HostInitialize,
      HostDeinitialize, HostConfigAddMetrics, HostGetConfigImageSize, HostGetConfigImage, HostEvaluateToGpuValues,
      Enable, Disable, SetConfig, GetCounterDataSize, CounterDataImageInitialize, Start, Stop, DecodeData,
      GetCounterDataInfo, GetSampleInfo;
};
// Resolves the table from libcupti; false (and the missing names) when this
// CUPTI has no PM sampling (older than 12.6).
bool ResolvePmApi(void* libcupti, PmApi* api, std::string* missing);

// The decoded samples of one GPU.
struct PmDeviceSamples {
  uint32_t device = 0;
  std::vector<uint64_t> start_ns, end_ns;  // CUPTI clock, per sample
  std::vector<double> values;              // per sample, one per metric
  uint64_t dropped = 0;                    // samples over the cap
  uint64_t overflows = 0;                  // times the hardware buffer overflowed (samples lost there)
};

// The decode-to-model step: a `_counters_` line on each GPU's plane.
void AddPmCounters(const std::vector<std::string>& metrics, const std::vector<PmDeviceSamples>& samples,
                   const ClockMap& clock, model::Space* space);

// A PM sampling failure in words, with the fix where there is one.
std::string ExplainPmError(const char* call, int result);

class PmSampler {
 public:
  // Samples kept per GPU (beyond: counted as dropped).
  static constexpr uint64_t kMaxSamplesPerGpu = uint64_t{1} << 20;

  PmSampler(const PmApi& api, std::vector<std::string> metrics, int64_t interval_us, int64_t buffer_mb,
            uint64_t max_samples = kMaxSamplesPerGpu);
  ~PmSampler() { Stop(); }

  // Starts sampling on `devices`. On failure says why, and leaves nothing
  // enabled.
  bool Start(const std::vector<uint32_t>& devices, std::string* why);
  // Stops the decode thread, decodes what is left, disables.
  void Stop();
  // Decodes what the hardware buffers hold now (the thread's step; tests call it).
  void DecodeAll();

  const std::vector<std::string>& metrics() const { return metrics_; }
  const std::vector<PmDeviceSamples>& samples() const { return samples_; }
  // Errors met while decoding (the first one per GPU), for the profile's warnings.
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  struct Device {
    uint32_t index = 0;
    void* host = nullptr;     // CUpti_Profiler_Host_Object
    void* sampler = nullptr;  // CUpti_PmSampling_Object
    bool started = false;
    std::vector<uint8_t> availability, config, counter_data;
  };
  bool StartDevice(Device& d, std::string* why);
  void Decode(Device& d, PmDeviceSamples& out);
  void Teardown();

  PmApi api_;
  std::vector<std::string> metrics_;
  std::vector<const char*> names_;
  uint64_t interval_ns_;
  size_t buffer_bytes_;
  uint64_t max_samples_;
  bool initialized_ = false;
  std::vector<Device> devices_;
  std::vector<PmDeviceSamples> samples_;
  std::vector<std::string> errors_;
  std::mutex mu_;  // decoding: the thread's and Stop's
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace spyglass::gpu
