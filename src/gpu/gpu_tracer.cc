// The NVIDIA GPU tracer (rank kRankDevice): CUPTI activity records for
// kernels, copies, memsets and graph launches, driver-API callbacks for the
// launching calls and GPU memory. CUPTI and the driver are opened with
// dlopen; without them the tracer says why and the host trace goes on.
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gpu/cupti_abi.h"
#include "gpu/cupti_loader.h"
#include "gpu/gpu_callback.h"
#include "gpu/gpu_convert.h"
#include "gpu/gpu_options.h"
#include "gpu/pm_sampling.h"
#include "model/schema.h"
#include "session/tracer.h"
#include "spyglass/internal/recorder.h"

namespace spyglass::gpu {
namespace {

using abi::CUptiResult;

struct Cupti {
  CUptiResult (*GetVersion)(uint32_t*);
  CUptiResult (*Subscribe)(void**, abi::CallbackFunc, void*);
  CUptiResult (*Unsubscribe)(void*);
  CUptiResult (*EnableCallback)(uint32_t, void*, int, uint32_t);
  CUptiResult (*ActivityEnable)(uint32_t);
  CUptiResult (*ActivityDisable)(uint32_t);
  CUptiResult (*ActivityRegisterCallbacks)(abi::BufferRequestedFunc, abi::BufferCompletedFunc);
  CUptiResult (*ActivityFlushAll)(uint32_t);
  CUptiResult (*ActivityGetNextRecord)(uint8_t*, size_t, void**);
  CUptiResult (*ActivityGetNumDroppedRecords)(void*, uint32_t, size_t*);
  CUptiResult (*GetTimestamp)(uint64_t*);
  CUptiResult (*GetResultString)(CUptiResult, const char**);
  CUptiResult (*GetDeviceId)(void*, uint32_t*);
  CUptiResult (*GetGraphNodeId)(void*, uint64_t*);  // optional (graph node mapping)
  CUptiResult (*GetGraphId)(void*, uint32_t*);
};

struct Driver {
  int (*Init)(unsigned);
  int (*DeviceGetCount)(int*);
  int (*DeviceGetName)(char*, int, int);
  int (*DeviceGetAttribute)(int*, int, int);
  int (*DeviceTotalMem)(size_t*, int);
};

// What XProf reads from a /device:GPU:<n> plane to name the GPU and compute
// its peak FLOPs and bandwidth (spec GPU.md §4.5).
struct DeviceProperties {
  std::string name;
  int64_t clock_khz = 0, sm_count = 0, cc_major = 0, cc_minor = 0;
  uint64_t memory_bytes = 0, memory_bandwidth = 0;
};

DeviceProperties QueryDevice(const Driver& d, int dev) {
  DeviceProperties p;
  char name[256] = {};
  if (d.DeviceGetName && d.DeviceGetName(name, sizeof name - 1, dev) == 0) p.name = name;
  auto attr = [&](int a) {
    int v = 0;
    return d.DeviceGetAttribute && d.DeviceGetAttribute(&v, a, dev) == 0 ? int64_t{v} : int64_t{0};
  };
  p.clock_khz = attr(13);  // CU_DEVICE_ATTRIBUTE_CLOCK_RATE
  p.sm_count = attr(16);   // MULTIPROCESSOR_COUNT
  p.cc_major = attr(75);
  p.cc_minor = attr(76);
  int64_t mem_khz = attr(36), bus_bits = attr(37);  // MEMORY_CLOCK_RATE, GLOBAL_MEMORY_BUS_WIDTH
  p.memory_bandwidth = static_cast<uint64_t>(2 * mem_khz * 1000 * bus_bits / 8);  // DDR
  size_t total = 0;
  if (d.DeviceTotalMem && d.DeviceTotalMem(&total, dev) == 0) p.memory_bytes = total;
  return p;
}

template <class F>
bool Resolve(void* h, const char* name, F* f, std::string* missing) {
  *f = reinterpret_cast<F>(dlsym(h, name));
  if (*f == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *f != nullptr;
}

// Callback ids enabled (spec GPU.md §1.2 and §7.2: launches, copies,
// memsets, graph launches, allocations and frees).
constexpr uint32_t kCallbackIds[] = {
    307, 477, 480, 652,                                                       // launches
    276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 288, 289, 290, 291, 292, 293, 305, 306, 318, 319,
    216, 218, 220, 222, 224, 226, 249, 250, 251, 252, 253, 254,               // memsets
    514, 515,                                                                 // graph launches
    243, 244, 371, 294, 39, 245, 38, 598, 599, 600, 601, 611, 612,            // memory
    379, 302, 549, 550, 551, 552,                                             // host register, VMM
};
// Calls that make graph nodes, and the resource callbacks that give the
// nodes' ids (gpu_dump_graph_node_mapping; spec GPU.md §1.2).
constexpr uint32_t kGraphNodeCallIds[] = {501, 502, 504, 506, 513, 523, 525, 526, 530, 578, 589,
                                          590, 638, 639, 643, 656, 657, 669, 689, 712, 723};
constexpr uint32_t kGraphNodeResourceIds[] = {abi::kResourceGraphNodeCreated, abi::kResourceGraphNodeCloned};
// Runtime allocating calls (GPU memory only; spec GPU.md §7.2).
constexpr uint32_t kRuntimeMemoryIds[] = {20, 21, 22, 25, 26, 27, 152, 153, 206, 373, 374, 375, 376, 391, 392};

constexpr size_t kBufferBytes = 1 << 20;

// One GPU session at a time (the session guarantees it); CUPTI's buffer
// callbacks are plain functions and find it here.
struct Active;
std::mutex g_mu;
Active* g_active = nullptr;

struct Active {
  Cupti cupti{};
  GpuCollector collector;
  std::vector<std::array<int64_t, 3>> samples;  // (cupti ns, ticks before, ticks after)
  uint64_t cupti_dropped = 0;
  explicit Active(GpuLimits l) : collector(l, /*copy_names=*/true) {}
};

void TakeSample(Active* a) {
  uint64_t before = internal::now_ticks(), ts = 0;
  a->cupti.GetTimestamp(&ts);
  uint64_t after = internal::now_ticks();
  if (a->samples.size() < 4096 && ts != 0)
    a->samples.push_back({static_cast<int64_t>(ts), static_cast<int64_t>(before), static_cast<int64_t>(after)});
}

// Activity buffers come from a pool filled at start: CUPTI may ask for one on
// the launching thread, which then takes a slot (one atomic exchange) instead
// of calling malloc. Only past kPoolBuffers in flight does it allocate.
constexpr int kPoolBuffers = 16;
std::atomic<uint8_t*> g_pool[kPoolBuffers];

void FillPool() {
  for (auto& slot : g_pool)
    if (slot.load() == nullptr) slot.store(static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes)));
}

void BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = nullptr;
  for (auto& slot : g_pool)
    if ((*buffer = slot.exchange(nullptr)) != nullptr) break;
  if (*buffer == nullptr) *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void GiveBack(uint8_t* buffer) {
  for (auto& slot : g_pool) {
    uint8_t* expected = nullptr;
    if (slot.compare_exchange_strong(expected, buffer)) return;
  }
  std::free(buffer);
}

void BufferCompleted(void* ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_active != nullptr) {
    Active* a = g_active;
    void* record = nullptr;
    for (size_t guard = 0; guard < kBufferBytes && valid > 0; ++guard) {
      if (a->cupti.ActivityGetNextRecord(buffer, valid, &record) != abi::kSuccess) break;
      a->collector.AddRecord(record);
    }
    size_t dropped = 0;
    if (a->cupti.ActivityGetNumDroppedRecords(ctx, stream, &dropped) == abi::kSuccess && dropped != 0) {
      uint32_t dev = 0;
      if (ctx != nullptr) a->cupti.GetDeviceId(ctx, &dev);
      a->collector.CountDropped(dev, "CUPTI's buffers were full (Activity Event dropped by Cupti Lib)", dropped);
    }
    TakeSample(a);  // a clock sample during the session
  }
  GiveBack(buffer);
}

std::string ResultText(const Cupti& c, CUptiResult r) {
  const char* s = nullptr;
  if (c.GetResultString) c.GetResultString(r, &s);
  return "CUPTI error " + std::to_string(r) + (s ? std::string(" (") + s + ")" : "");
}

std::string ExplainCuptiError(const Cupti& c, const char* call, CUptiResult r) {
  if (r == abi::kErrorInsufficientPrivileges || r == abi::kErrorVirtualizedInsufficientPrivileges)
    return std::string(call) + ": CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: this user may not profile the GPU. Fix: "
           "allow profiling for all users with the nvidia module option NVreg_RestrictProfilingToAdminUsers=0 "
           "(options nvidia \"NVreg_RestrictProfilingToAdminUsers=0\" in /etc/modprobe.d/, update-initramfs -u, "
           "reboot; /proc/driver/nvidia/params shows RmProfilingAdminOnly), or run as root / with CAP_SYS_ADMIN "
           "(containers: --cap-add=SYS_ADMIN).";
  if (r == abi::kErrorMultipleSubscribers || r == abi::kErrorMaxLimitReached)
    return std::string(call) + ": another CUPTI subscriber is already attached to this process (Nsight Systems "
           "or Nsight Compute, cuda-gdb, compute-sanitizer, or another profiler such as PyTorch's kineto); "
           "only one may trace. Stop the other tool's tracing, or run without it.";
  if (r == abi::kErrorNotInitialized)
    return std::string(call) + ": " + ResultText(c, r) +
           ": libcupti is newer than the NVIDIA driver, or no CUDA context could be made; use the libcupti that "
           "matches the driver (SPYGLASS_CUPTI_PATH).";
  return std::string(call) + ": " + ResultText(c, r);
}

class GpuTracer : public session::Tracer {
 public:
  explicit GpuTracer(const profiler::ProfileOptions& o) : options_(ParseGpuOptions(o)) {}
  ~GpuTracer() override { Disable(); }

  Status Start() override {
    std::string why;
    bool driver_present = false;
    if (!Enable(&why, &driver_present)) {
      off_reason_ = why;
      // Quiet on a machine without an NVIDIA driver unless GPU options were set.
      // One line: the places searched for libcupti go to the profile's warning only.
      if (driver_present || options_.any_gpu_key) {
        std::string first = why.substr(0, why.find('\n'));
        std::fprintf(stderr, "spyglass: GPU tracer off: %s%s\n", first.c_str(),
                     first.size() < why.size() ? " (the places searched are in the profile's warnings)" : "");
      }
      return UnavailableError("GPU tracer off: " + why);
    }
    return Status::Ok();
  }

  Status Stop() override {
    if (active_ == nullptr || stopped_) return Status::Ok();
    stopped_ = true;
    if (pm_ != nullptr) pm_->Stop();  // first, as XLA does
    Cupti& c = active_->cupti;
    if (subscriber_ != nullptr) {
      for (uint32_t id : kCallbackIds) c.EnableCallback(0, subscriber_, abi::kDomainDriverApi, id);
      for (uint32_t id : kRuntimeMemoryIds) c.EnableCallback(0, subscriber_, abi::kDomainRuntimeApi, id);
      if (map_graph_nodes_) {
        for (uint32_t id : kGraphNodeCallIds) c.EnableCallback(0, subscriber_, abi::kDomainDriverApi, id);
        for (uint32_t id : kGraphNodeResourceIds) c.EnableCallback(0, subscriber_, abi::kDomainResource, id);
      }
      c.Unsubscribe(subscriber_);
      subscriber_ = nullptr;
    }
    for (uint32_t k : kinds_)
      if (k != abi::kind::kConcurrentKernel) c.ActivityDisable(k);  // left on: NVIDIA deadlock (spec §1.1)
    c.ActivityFlushAll(1 /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED */);
    std::lock_guard<std::mutex> lock(g_mu);
    TakeSample(active_.get());
    g_active = nullptr;
    return Status::Ok();
  }

  Status CollectData(model::Space* space) override {
    if (active_ == nullptr) {
      if (!off_reason_.empty()) space->warnings.push_back("GPU tracer off: " + off_reason_);
      if (!off_reason_.empty() && !options_.pm_sample_counters.empty())
        space->warnings.push_back("gpu_pm_sample_counters: not sampled (the GPU tracer is off: " +
                                  off_reason_.substr(0, off_reason_.find('\n')) + ")");
      return Status::Ok();
    }
    internal::TickConverter ticks = internal::TickConverter::Calibrate();
    ClockMap clock;
    for (const auto& s : active_->samples)
      clock.AddSample(static_cast<uint64_t>(s[0]), ticks.ns_between(start_ticks_, s[1]),
                      ticks.ns_between(start_ticks_, s[2]));
    uint64_t n = sink_.size();
    active_->collector.SetApiEvents({sink_.events, n});  // read in place by Export (released after it)
    for (uint64_t i = 0; i < sink_.node_count(); ++i) active_->collector.AddGraphNode(sink_.nodes[i]);
    if (uint64_t lost = sink_.nodes_dropped.load(); lost != 0)
      active_->collector.CountDropped(0, "graph nodes over gpu_max_callback_api_events (not mapped)", lost);
    for (const std::string& w : warnings_) space->warnings.push_back(w);
    for (uint32_t d = 0; d < CallbackSink::kMaxDevices; ++d)
      active_->collector.CountDropped(d, "total driver(callback) events reaches max (gpu_max_callback_api_events)",
                                      sink_.dropped[d].load());
    dropped_ = active_->collector.dropped();
    active_->collector.Export(clock, space);
    events_ = active_->collector.api_calls() + active_->collector.records();
    if (pm_ != nullptr) {
      AddPmCounters(pm_->metrics(), pm_->samples(), clock, space);
      for (const std::string& e : pm_->errors()) space->warnings.push_back(e);
      pm_.reset();
    }
    for (size_t i = 0; i < devices_.size(); ++i) {
      model::Plane* p = space->find_plane(std::string(model::kGpuPlanePrefix) + std::to_string(i));
      if (p == nullptr) continue;
      const DeviceProperties& d = devices_[i];
      if (!d.name.empty()) p->stats.push_back(p->str_stat(model::kGpuDeviceNameStat, d.name));
      p->stats.push_back(p->int_stat(model::kGpuClockRateStat, d.clock_khz));
      p->stats.push_back(p->int_stat(model::kGpuCoreCountStat, d.sm_count));
      p->stats.push_back(p->uint_stat(model::kGpuMemoryBandwidthStat, d.memory_bandwidth));
      p->stats.push_back(p->uint_stat(model::kGpuMemorySizeStat, d.memory_bytes));
      p->stats.push_back(p->int_stat(model::kGpuComputeCapMajorStat, d.cc_major));
      p->stats.push_back(p->int_stat(model::kGpuComputeCapMinorStat, d.cc_minor));
      // How the CUPTI clock was mapped onto the host's (docs/gpu.md).
      p->stats.push_back(p->int_stat(model::kGpuClockSamplesStat, static_cast<int64_t>(active_->samples.size())));
      p->stats.push_back(p->int_stat(model::kGpuClockBoundStat, clock.bound_ns()));
      p->stats.push_back(p->double_stat(model::kGpuClockSlopeStat, clock.slope()));
    }
    sink_.Release();
    return Status::Ok();
  }

  void AddStats(session::SessionSummary* summary) const override {
    summary->events += events_;
    summary->dropped_events += dropped_;
  }

 private:
  bool Enable(std::string* why, bool* driver_present) {
    void* driver = LoadDriver(why);
    if (driver == nullptr) return false;
    *driver_present = true;
    Driver d{};
    std::string missing;
    Resolve(driver, "cuInit", &d.Init, &missing);
    Resolve(driver, "cuDeviceGetCount", &d.DeviceGetCount, &missing);
    if (!missing.empty()) return *why = "the NVIDIA driver lacks " + missing, false;
    int count = 0;
    if (int r = d.Init(0); r != 0) return *why = "cuInit failed with CUDA error " + std::to_string(r) + " (no usable GPU)", false;
    if (d.DeviceGetCount(&count) != 0 || count <= 0) return *why = "no NVIDIA GPU found", false;
    std::string optional;
    Resolve(driver, "cuDeviceGetName", &d.DeviceGetName, &optional);
    Resolve(driver, "cuDeviceGetAttribute", &d.DeviceGetAttribute, &optional);
    Resolve(driver, "cuDeviceTotalMem_v2", &d.DeviceTotalMem, &optional);
    devices_.clear();
    for (int i = 0; i < count && i < static_cast<int>(CallbackSink::kMaxDevices); ++i)
      devices_.push_back(QueryDevice(d, i));
    Loaded lib = LoadCupti();
    if (lib.handle == nullptr) return *why = lib.error, false;
    auto active = std::make_unique<Active>(GpuLimits{static_cast<uint64_t>(options_.max_activity_api_events),
                                                     static_cast<uint32_t>(options_.num_chips_to_profile_per_task),
                                                     static_cast<uint64_t>(options_.max_annotation_strings)});
    Cupti& c = active->cupti;
    void* h = lib.handle;
    Resolve(h, "cuptiGetVersion", &c.GetVersion, &missing);
    Resolve(h, "cuptiSubscribe", &c.Subscribe, &missing);
    Resolve(h, "cuptiUnsubscribe", &c.Unsubscribe, &missing);
    Resolve(h, "cuptiEnableCallback", &c.EnableCallback, &missing);
    Resolve(h, "cuptiActivityEnable", &c.ActivityEnable, &missing);
    Resolve(h, "cuptiActivityDisable", &c.ActivityDisable, &missing);
    Resolve(h, "cuptiActivityRegisterCallbacks", &c.ActivityRegisterCallbacks, &missing);
    Resolve(h, "cuptiActivityFlushAll", &c.ActivityFlushAll, &missing);
    Resolve(h, "cuptiActivityGetNextRecord", &c.ActivityGetNextRecord, &missing);
    Resolve(h, "cuptiActivityGetNumDroppedRecords", &c.ActivityGetNumDroppedRecords, &missing);
    Resolve(h, "cuptiGetTimestamp", &c.GetTimestamp, &missing);
    Resolve(h, "cuptiGetResultString", &c.GetResultString, &missing);
    Resolve(h, "cuptiGetDeviceId", &c.GetDeviceId, &missing);
    if (!missing.empty()) return *why = lib.path + " lacks " + missing, false;
    uint32_t version = 0;
    if (CUptiResult r = c.GetVersion(&version); r != abi::kSuccess) return *why = ExplainCuptiError(c, "cuptiGetVersion", r), false;

    if (!sink_.Reserve(static_cast<uint64_t>(options_.max_callback_api_events)))
      return *why = "cannot reserve the callback event array", false;
    // Graph node mapping needs CUPTI's id getters (CUDA 12+); without them
    // the session goes on and a warning says why the mapping is missing.
    std::string no_graph;
    Resolve(h, "cuptiGetGraphNodeId", &c.GetGraphNodeId, &no_graph);
    Resolve(h, "cuptiGetGraphId", &c.GetGraphId, &no_graph);
    map_graph_nodes_ = options_.dump_graph_node_mapping && no_graph.empty() &&
                       sink_.ReserveNodes(static_cast<uint64_t>(options_.max_callback_api_events));
    if (options_.dump_graph_node_mapping && !map_graph_nodes_)
      warnings_.push_back("gpu_dump_graph_node_mapping: off, " +
                          (no_graph.empty() ? std::string("cannot reserve the node array") : lib.path + " lacks " + no_graph));
    sink_.get_graph_node_id = map_graph_nodes_ ? c.GetGraphNodeId : nullptr;
    sink_.get_graph_id = map_graph_nodes_ ? c.GetGraphId : nullptr;
    sink_.get_timestamp = c.GetTimestamp;
    sink_.get_device_id = c.GetDeviceId;
    sink_.num_devices = options_.num_chips_to_profile_per_task > 0
                            ? static_cast<uint32_t>(options_.num_chips_to_profile_per_task)
                            : CallbackSink::kMaxDevices;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_active = active.get();
    }
    active_ = std::move(active);
    start_ticks_ = zero().ticks;
    TakeSample(active_.get());
    if (CUptiResult r = c.Subscribe(&subscriber_, &ApiCallback, &sink_); r != abi::kSuccess) {
      subscriber_ = nullptr;
      return Fail(why, ExplainCuptiError(c, "cuptiSubscribe", r));
    }
    for (uint32_t id : kCallbackIds)
      if (CUptiResult r = c.EnableCallback(1, subscriber_, abi::kDomainDriverApi, id); r != abi::kSuccess)
        return Fail(why, ExplainCuptiError(c, "cuptiEnableCallback", r));
    for (uint32_t id : kRuntimeMemoryIds)
      if (CUptiResult r = c.EnableCallback(1, subscriber_, abi::kDomainRuntimeApi, id); r != abi::kSuccess)
        return Fail(why, ExplainCuptiError(c, "cuptiEnableCallback", r));
    if (map_graph_nodes_) {
      for (uint32_t id : kGraphNodeCallIds)
        if (CUptiResult r = c.EnableCallback(1, subscriber_, abi::kDomainDriverApi, id); r != abi::kSuccess)
          return Fail(why, ExplainCuptiError(c, "cuptiEnableCallback", r));
      for (uint32_t id : kGraphNodeResourceIds)
        if (CUptiResult r = c.EnableCallback(1, subscriber_, abi::kDomainResource, id); r != abi::kSuccess)
          return Fail(why, ExplainCuptiError(c, "cuptiEnableCallback (graph nodes)", r));
    }
    FillPool();
    if (CUptiResult r = c.ActivityRegisterCallbacks(&BufferRequested, &BufferCompleted); r != abi::kSuccess)
      return Fail(why, ExplainCuptiError(c, "cuptiActivityRegisterCallbacks", r));
    kinds_ = {abi::kind::kConcurrentKernel, abi::kind::kMemcpy, abi::kind::kMemcpy2, abi::kind::kMemset};
    if (options_.enable_activity_graph_trace) kinds_.push_back(abi::kind::kGraphTrace);
    if (options_.enable_nvtx_tracking) {
      kinds_.push_back(abi::kind::kMarker);
      // NVTX reaches CUPTI only through its injection library, found from
      // this variable at the program's first NVTX call (a later set is too late).
      if (lib.path.find('/') != std::string::npos) setenv("NVTX_INJECTION64_PATH", lib.path.c_str(), 0);
    }
    for (uint32_t k : kinds_)
      if (CUptiResult r = c.ActivityEnable(k); r != abi::kSuccess)
        return Fail(why, ExplainCuptiError(c, "cuptiActivityEnable", r));
    if (!options_.pm_sample_counters.empty()) StartPmSampling(h, lib.path);
    return true;
  }

  // Counter sampling is an extra: when it cannot start, the trace goes on
  // and a warning (and, as a GPU key was set, one stderr line) says why.
  void StartPmSampling(void* libcupti, const std::string& path) {
    PmApi api{};
    std::string missing, why;
    if (!ResolvePmApi(libcupti, &api, &missing)) {
      why = "PM sampling needs CUPTI 12.6 or newer; " + path + " lacks " + missing.substr(0, 200);
    } else {
      std::vector<uint32_t> devices;
      for (uint32_t d = 0; d < devices_.size(); ++d)
        if (options_.num_chips_to_profile_per_task <= 0 || d < options_.num_chips_to_profile_per_task)
          devices.push_back(d);
      auto pm = std::make_unique<PmSampler>(api, options_.pm_sample_counters, options_.pm_sample_interval_us,
                                            options_.pm_sample_buffer_size_per_gpu_mb);
      if (pm->Start(devices, &why)) {
        pm_ = std::move(pm);
        return;
      }
    }
    std::fprintf(stderr, "spyglass: gpu_pm_sample_counters: not sampled: %s\n", why.c_str());
    warnings_.push_back("gpu_pm_sample_counters: not sampled: " + why);
  }

  bool Fail(std::string* why, std::string text) {
    *why = std::move(text);
    stopped_ = false;
    (void)Stop();
    std::lock_guard<std::mutex> lock(g_mu);
    g_active = nullptr;
    active_.reset();
    pm_.reset();
    sink_.Release();
    return false;
  }

  void Disable() {
    if (active_ != nullptr && !stopped_) (void)Stop();
  }

  GpuOptions options_;
  std::unique_ptr<Active> active_;
  CallbackSink sink_;
  void* subscriber_ = nullptr;
  std::vector<uint32_t> kinds_;
  uint64_t start_ticks_ = 0;
  bool stopped_ = false;
  std::string off_reason_;
  bool map_graph_nodes_ = false;
  std::unique_ptr<PmSampler> pm_;
  std::vector<std::string> warnings_;
  std::vector<DeviceProperties> devices_;
  uint64_t events_ = 0, dropped_ = 0;
};

std::atomic<DeviceOwnerProbe> g_owner_probe{nullptr};

// In place of the GPU tracer when another profiler traces the device: the
// trace says so (a second subscriber would fail, or take the other's
// activity buffers: CUPTI's buffer callbacks are one per process).
class SteppedAsideTracer : public session::Tracer {
 public:
  explicit SteppedAsideTracer(std::string owner) : owner_(std::move(owner)) {}
  Status Start() override { return Status::Ok(); }
  Status Stop() override { return Status::Ok(); }
  Status CollectData(model::Space* space) override {
    space->warnings.push_back("GPU tracer off: " + owner_ +
                              " traces the device in this process (CUPTI takes one subscriber); its device "
                              "planes are in this trace where it runs");
    return Status::Ok();
  }

 private:
  std::string owner_;
};

std::unique_ptr<session::Tracer> MakeGpuTracer(const profiler::ProfileOptions& options) {
  if (options.device_tracer_level == 0) return nullptr;
  if (DeviceOwnerProbe probe = g_owner_probe.load(); probe != nullptr) {
    if (std::string owner = probe(options); !owner.empty()) return std::make_unique<SteppedAsideTracer>(std::move(owner));
  }
  return std::make_unique<GpuTracer>(options);
}

}  // namespace

void SetDeviceOwnerProbe(DeviceOwnerProbe probe) { g_owner_probe.store(probe); }

bool GpuTracerActive() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_active != nullptr;
}
}  // namespace spyglass::gpu

SPYGLASS_REGISTER_TRACER_WITH_OPTIONS(device, spyglass::session::kRankDevice, spyglass::gpu::MakeGpuTracer,
                                      spyglass::gpu::GpuOptionSpec());
