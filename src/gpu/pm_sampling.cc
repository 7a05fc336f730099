#include "gpu/pm_sampling.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>

#include "gpu/cupti_abi.h"
#include "model/schema.h"

namespace spyglass::gpu {

namespace pm = abi::pm;

bool ResolvePmApi(void* h, PmApi* api, std::string* missing) {
  struct Entry {
    const char* name;
    PmApi::Fn* fn;
  };
  const Entry entries[] = {{"cuptiProfilerInitialize", &api->ProfilerInitialize},
                           {"cuptiProfilerDeInitialize", &api->ProfilerDeInitialize},
                           {"cuptiDeviceGetChipName", &api->DeviceGetChipName},
                           {"cuptiPmSamplingGetCounterAvailability", &api->GetCounterAvailability},
                           {"cuptiProfilerHostInitialize", &api->HostInitialize},
                           {"cuptiProfilerHostDeinitialize", &api->HostDeinitialize},
                           {"cuptiProfilerHostConfigAddMetrics", &api->HostConfigAddMetrics},
                           {"cuptiProfilerHostGetConfigImageSize", &api->HostGetConfigImageSize},
                           {"cuptiProfilerHostGetConfigImage", &api->HostGetConfigImage},
                           {"cuptiProfilerHostEvaluateToGpuValues", &api->HostEvaluateToGpuValues},
                           {"cuptiPmSamplingEnable", &api->Enable},
                           {"cuptiPmSamplingDisable", &api->Disable},
                           {"cuptiPmSamplingSetConfig", &api->SetConfig},
                           {"cuptiPmSamplingGetCounterDataSize", &api->GetCounterDataSize},
                           {"cuptiPmSamplingCounterDataImageInitialize", &api->CounterDataImageInitialize},
                           {"cuptiPmSamplingStart", &api->Start},
                           {"cuptiPmSamplingStop", &api->Stop},
                           {"cuptiPmSamplingDecodeData", &api->DecodeData},
                           {"cuptiPmSamplingGetCounterDataInfo", &api->GetCounterDataInfo},
                           {"cuptiPmSamplingCounterDataGetSampleInfo", &api->GetSampleInfo}};
  missing->clear();
  for (const Entry& e : entries) {
    *e.fn = reinterpret_cast<PmApi::Fn>(dlsym(h, e.name));
    if (*e.fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + e.name;
  }
  return missing->empty();
}

std::string ExplainPmError(const char* call, int r) {
  std::string head = std::string("PM sampling: ") + call + " failed with CUPTI error " + std::to_string(r);
  switch (r) {
    case abi::kErrorInsufficientPrivileges:
    case abi::kErrorVirtualizedInsufficientPrivileges:
      return head + " (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES): GPU performance counters are restricted to admin users "
                    "(ERR_NVGPUCTRPERM). Fix: the nvidia module option NVreg_RestrictProfilingToAdminUsers=0 "
                    "(options nvidia \"NVreg_RestrictProfilingToAdminUsers=0\" in /etc/modprobe.d/, "
                    "update-initramfs -u, reboot), or run as root / with CAP_SYS_ADMIN (containers: "
                    "--cap-add=SYS_ADMIN).";
    case pm::kErrorNotSupported:
      return head + " (CUPTI_ERROR_NOT_SUPPORTED): this GPU or driver cannot sample counters (PM sampling needs a "
                    "Turing or newer GPU, and the time-interval trigger used here Ampere GA10x or newer).";
    case pm::kErrorMigNotSupported: return head + ": not supported on a MIG instance.";
    case pm::kErrorVirtualizedNotSupported: return head + ": not supported on a virtualized GPU (vGPU).";
    case pm::kErrorWslNotSupported: return head + ": not supported under WSL.";
    case pm::kErrorCmpNotSupported: return head + ": not supported on a CMP device.";
    case pm::kErrorConfidentialNotSupported: return head + ": not supported with confidential computing on.";
    case pm::kErrorInvalidMetricName:
      return head + " (CUPTI_ERROR_INVALID_METRIC_NAME): a name in gpu_pm_sample_counters is not a metric of this "
                    "GPU (list them with `ncu --query-metrics`).";
    case pm::kErrorInvalidChipName: return head + ": this CUPTI does not know the GPU (use a newer libcupti).";
    case pm::kErrorHardwareBusy:
      return head + " (CUPTI_ERROR_HARDWARE_BUSY): another profiler holds the counters (Nsight Compute, DCGM "
                    "profiling); stop it.";
    case abi::kErrorMultipleSubscribers: return head + ": another profiler holds the counters.";
    default: return head + ".";
  }
}

PmSampler::PmSampler(const PmApi& api, std::vector<std::string> metrics, int64_t interval_us, int64_t buffer_mb,
                     uint64_t max_samples)
    : api_(api),
      metrics_(std::move(metrics)),
      interval_ns_(static_cast<uint64_t>(std::max<int64_t>(1, interval_us)) * 1000),
      buffer_bytes_(static_cast<size_t>(std::clamp<int64_t>(buffer_mb, 64, 4096)) << 20),
      max_samples_(max_samples) {
  for (const std::string& m : metrics_) names_.push_back(m.c_str());
}

bool PmSampler::StartDevice(Device& d, std::string* why) {
  auto fail = [&](const char* call, int r) {
    *why = "GPU " + std::to_string(d.index) + ": " + ExplainPmError(call, r);
    return false;
  };
  pm::DeviceGetChipNameParams chip{SPYGLASS_CUPTI_STRUCT_SIZE(pm::DeviceGetChipNameParams, pChipName), nullptr, d.index,
                                   nullptr};
  if (int r = api_.DeviceGetChipName(&chip); r != 0) return fail("cuptiDeviceGetChipName", r);
  pm::GetCounterAvailabilityParams avail{
      SPYGLASS_CUPTI_STRUCT_SIZE(pm::GetCounterAvailabilityParams, pCounterAvailabilityImage), nullptr, d.index, 0,
      nullptr};
  if (int r = api_.GetCounterAvailability(&avail); r != 0) return fail("cuptiPmSamplingGetCounterAvailability", r);
  d.availability.resize(avail.counterAvailabilityImageSize);
  avail.pCounterAvailabilityImage = d.availability.data();
  if (int r = api_.GetCounterAvailability(&avail); r != 0) return fail("cuptiPmSamplingGetCounterAvailability", r);
  pm::HostInitializeParams host{SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostInitializeParams, pHostObject), nullptr,
                                pm::kProfilerTypePmSampling, chip.pChipName, d.availability.data(), nullptr};
  if (int r = api_.HostInitialize(&host); r != 0) return fail("cuptiProfilerHostInitialize", r);
  d.host = host.pHostObject;
  pm::HostConfigAddMetricsParams add{SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostConfigAddMetricsParams, numMetrics), nullptr,
                                     d.host, names_.data(), names_.size()};
  if (int r = api_.HostConfigAddMetrics(&add); r != 0) return fail("cuptiProfilerHostConfigAddMetrics", r);
  pm::HostGetConfigImageSizeParams size{SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostGetConfigImageSizeParams, configImageSize),
                                        nullptr, d.host, 0};
  if (int r = api_.HostGetConfigImageSize(&size); r != 0) return fail("cuptiProfilerHostGetConfigImageSize", r);
  d.config.resize(size.configImageSize);
  pm::HostGetConfigImageParams image{SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostGetConfigImageParams, pConfigImage), nullptr,
                                     d.host, d.config.size(), d.config.data()};
  if (int r = api_.HostGetConfigImage(&image); r != 0) return fail("cuptiProfilerHostGetConfigImage", r);
  pm::EnableParams enable{SPYGLASS_CUPTI_STRUCT_SIZE(pm::EnableParams, pPmSamplingObject), nullptr, d.index, nullptr};
  if (int r = api_.Enable(&enable); r != 0) return fail("cuptiPmSamplingEnable", r);
  d.sampler = enable.pPmSamplingObject;
  pm::SetConfigParams config{SPYGLASS_CUPTI_STRUCT_SIZE(pm::SetConfigParams, triggerMode),
                             nullptr,
                             d.sampler,
                             d.config.size(),
                             d.config.data(),
                             buffer_bytes_,
                             interval_ns_,
                             pm::kTriggerGpuTimeInterval};
  if (int r = api_.SetConfig(&config); r != 0) return fail("cuptiPmSamplingSetConfig", r);
  // The counter data image holds what one decode step gets: 100 ms of
  // samples, four times over (decodes can be late on a loaded machine).
  uint32_t max_samples = static_cast<uint32_t>(std::clamp<uint64_t>(4 * 100'000'000 / interval_ns_, 256, 100'000));
  pm::GetCounterDataSizeParams data_size{SPYGLASS_CUPTI_STRUCT_SIZE(pm::GetCounterDataSizeParams, counterDataSize),
                                         nullptr, d.sampler, names_.data(), names_.size(), max_samples, 0};
  if (int r = api_.GetCounterDataSize(&data_size); r != 0) return fail("cuptiPmSamplingGetCounterDataSize", r);
  d.counter_data.resize(data_size.counterDataSize);
  pm::CounterDataImageInitializeParams init{
      SPYGLASS_CUPTI_STRUCT_SIZE(pm::CounterDataImageInitializeParams, pCounterData), nullptr, d.sampler,
      d.counter_data.size(), d.counter_data.data()};
  if (int r = api_.CounterDataImageInitialize(&init); r != 0) return fail("cuptiPmSamplingCounterDataImageInitialize", r);
  pm::ObjectParams start{SPYGLASS_CUPTI_STRUCT_SIZE(pm::ObjectParams, pPmSamplingObject), nullptr, d.sampler};
  if (int r = api_.Start(&start); r != 0) return fail("cuptiPmSamplingStart", r);
  d.started = true;
  return true;
}

bool PmSampler::Start(const std::vector<uint32_t>& devices, std::string* why) {
  if (metrics_.empty()) return *why = "PM sampling: no metric names", false;
  pm::ProfilerInitializeParams init{SPYGLASS_CUPTI_STRUCT_SIZE(pm::ProfilerInitializeParams, pPriv), nullptr};
  if (int r = api_.ProfilerInitialize(&init); r != 0) return *why = ExplainPmError("cuptiProfilerInitialize", r), false;
  initialized_ = true;
  devices_.resize(devices.size());
  samples_.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    devices_[i].index = devices[i];
    samples_[i].device = devices[i];
    if (!StartDevice(devices_[i], why)) {
      Teardown();
      return false;
    }
  }
  stopping_ = false;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
      lock.unlock();
      DecodeAll();
      lock.lock();
    }
  });
  return true;
}

void PmSampler::Decode(Device& d, PmDeviceSamples& out) {
  const size_t m = names_.size();
  std::vector<double> values(m);
  // Bounded: each round empties the image, and the hardware buffer is finite.
  for (int round = 0; round < 1024; ++round) {
    pm::DecodeDataParams decode{SPYGLASS_CUPTI_STRUCT_SIZE(pm::DecodeDataParams, overflow), nullptr, d.sampler,
                                d.counter_data.data(), d.counter_data.size(), 0, 0};
    if (int r = api_.DecodeData(&decode); r != 0) {
      if (errors_.size() < devices_.size()) errors_.push_back(ExplainPmError("cuptiPmSamplingDecodeData", r));
      return;
    }
    if (decode.overflow) ++out.overflows;
    pm::GetCounterDataInfoParams info{SPYGLASS_CUPTI_STRUCT_SIZE(pm::GetCounterDataInfoParams, numCompletedSamples),
                                      nullptr, d.counter_data.data(), d.counter_data.size(), 0, 0, 0};
    if (api_.GetCounterDataInfo(&info) != 0) return;
    for (size_t i = 0; i < info.numCompletedSamples; ++i) {
      if (out.start_ns.size() >= max_samples_) {
        out.dropped += info.numCompletedSamples - i;
        break;
      }
      pm::GetSampleInfoParams sample{SPYGLASS_CUPTI_STRUCT_SIZE(pm::GetSampleInfoParams, endTimestamp), nullptr,
                                     d.sampler, d.counter_data.data(), d.counter_data.size(), i, 0, 0};
      pm::HostEvaluateToGpuValuesParams eval{
          SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostEvaluateToGpuValuesParams, pMetricValues), nullptr, d.host,
          d.counter_data.data(), d.counter_data.size(), i, names_.data(), m, values.data()};
      if (api_.GetSampleInfo(&sample) != 0 || api_.HostEvaluateToGpuValues(&eval) != 0) {
        ++out.dropped;
        continue;
      }
      out.start_ns.push_back(sample.startTimestamp);
      out.end_ns.push_back(sample.endTimestamp);
      out.values.insert(out.values.end(), values.begin(), values.end());
    }
    // The image is reused for the next samples.
    pm::CounterDataImageInitializeParams init{
        SPYGLASS_CUPTI_STRUCT_SIZE(pm::CounterDataImageInitializeParams, pCounterData), nullptr, d.sampler,
        d.counter_data.size(), d.counter_data.data()};
    if (api_.CounterDataImageInitialize(&init) != 0) return;
    if (decode.decodeStopReason != pm::kDecodeStopCounterDataFull) return;  // the hardware buffer is empty
  }
}

void PmSampler::DecodeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i].started) Decode(devices_[i], samples_[i]);
}

void PmSampler::Teardown() {
  for (Device& d : devices_) {
    if (d.sampler != nullptr) {
      pm::ObjectParams p{SPYGLASS_CUPTI_STRUCT_SIZE(pm::ObjectParams, pPmSamplingObject), nullptr, d.sampler};
      if (d.started) api_.Stop(&p);
      api_.Disable(&p);
      d.sampler = nullptr;
      d.started = false;
    }
    if (d.host != nullptr) {
      pm::HostDeinitializeParams p{SPYGLASS_CUPTI_STRUCT_SIZE(pm::HostDeinitializeParams, pHostObject), nullptr, d.host};
      api_.HostDeinitialize(&p);
      d.host = nullptr;
    }
  }
  if (initialized_) {
    pm::ProfilerInitializeParams p{SPYGLASS_CUPTI_STRUCT_SIZE(pm::ProfilerInitializeParams, pPriv), nullptr};
    api_.ProfilerDeInitialize(&p);
    initialized_ = false;
  }
}

void PmSampler::Stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stopping_ = true;
    }
    stop_cv_.notify_all();
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device& d = devices_[i];
    if (!d.started) continue;
    pm::ObjectParams p{SPYGLASS_CUPTI_STRUCT_SIZE(pm::ObjectParams, pPmSamplingObject), nullptr, d.sampler};
    api_.Stop(&p);
    Decode(d, samples_[i]);  // what the hardware buffer still holds
    d.started = false;
  }
  Teardown();
}

void AddPmCounters(const std::vector<std::string>& metrics, const std::vector<PmDeviceSamples>& samples,
                   const ClockMap& clock, model::Space* space) {
  const size_t m = metrics.size();
  for (const PmDeviceSamples& s : samples) {
    size_t n = s.start_ns.size();
    if ((n == 0 && s.dropped == 0 && s.overflows == 0) || m == 0 || s.values.size() < n * m) continue;
    model::Plane& p = space->plane(std::string(model::kGpuPlanePrefix) + std::to_string(s.device));
    p.id = s.device;
    model::Line& line = p.line_with_id(INT64_MAX);
    line.name = line.display_name = std::string(model::kCounterLineName);
    std::vector<uint32_t> event_ids(m), stat_ids(m);
    for (size_t k = 0; k < m; ++k) {
      event_ids[k] = p.intern_event(metrics[k]);
      stat_ids[k] = p.intern_stat(metrics[k]);
    }
    line.reserve_exact(n * m, n * m);
    for (size_t i = 0; i < n; ++i) {
      // A sample stands for its interval: shown at its end, when the value is known.
      int64_t ps = std::max<int64_t>(0, clock.ToPs(s.end_ns[i] != 0 ? s.end_ns[i] : s.start_ns[i]));
      for (size_t k = 0; k < m; ++k) {
        model::Event& e = line.events.emplace_back();
        e.offset_ps = ps;
        e.metadata_id = event_ids[k];
        model::Stat st;
        st.metadata_id = stat_ids[k];
        st.kind = model::StatKind::kDouble;
        st.f64 = s.values[i * m + k];
        line.add_stats(e, std::span<const model::Stat>(&st, 1));
      }
    }
    line.sort_events();
    if (s.dropped != 0 || s.overflows != 0)
      space->warnings.push_back("GPU " + std::to_string(s.device) + ": PM sampling lost samples: " +
                                std::to_string(s.dropped) + " over the cap of kept samples, and the hardware buffer "
                                "overflowed " + std::to_string(s.overflows) + " time(s) (raise "
                                "gpu_pm_sample_buffer_size_per_gpu_mb or gpu_pm_sample_interval_us)");
  }
}

}  // namespace spyglass::gpu
