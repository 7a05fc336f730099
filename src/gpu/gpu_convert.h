// Conversion of what CUPTI reports (activity records, driver-API callback
// events) into the model: one /device:GPU:<n> plane per GPU with XProf's line,
// event and stat names (spec GPU.md §4), and the launching host calls on their
// threads' lines of /host:CPU, linked to the device events by correlation_id
// (XProf draws the flow arrows and groups launches with kernels from it).
//
// No CUDA needed here: records are read at the offsets of cupti_abi.h, so the
// tests and the benchmark feed records built in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/xspace.h"

namespace spyglass::gpu {

// CUPTI timestamps (ns, CUPTI's clock) -> ps since the GPU tracer's start.
// Built from anchor samples (cupti_ns, host_ns since start) taken at start,
// during the session and at stop; maps linearly between the first and last
// sample, which corrects a constant drift between the clocks. Error bound:
// half the widest bracket of the host readings around each CUPTI reading
// (measured and reported by bound_ns()) plus non-linear drift.
class ClockMap {
 public:
  // `host_before`/`host_after`: host ns read just before/after `cupti_ns`.
  void AddSample(uint64_t cupti_ns, int64_t host_before, int64_t host_after);
  int64_t ToPs(uint64_t cupti_ns) const;
  int64_t bound_ns() const { return bound_ns_; }
  bool empty() const { return n_ == 0; }
  double slope() const { return slope_; }

 private:
  uint64_t c0_ = 0, c1_ = 0;
  double h0_ = 0, h1_ = 0, slope_ = 1.0;
  int64_t bound_ns_ = 0;
  int n_ = 0;
};

// One driver-API call seen by the callback (written on the calling thread
// into a preallocated array: fixed size, no pointers it owns).
struct ApiEvent {
  uint64_t start_ns = 0;  // CUPTI clock
  uint64_t end_ns = 0;
  uint64_t bytes = 0;        // memcpy/memset/alloc size when known
  const char* function = nullptr;  // CUPTI's static function name
  uint32_t tid = 0;
  uint32_t correlation_id = 0;
  uint32_t cbid = 0;
  uint32_t device = 0;
};

enum class ApiKind : uint8_t { kLaunch, kMemcpy, kMemset, kAlloc, kFree, kGraphLaunch, kOther };
ApiKind KindOfCallback(uint32_t cbid);
// "MemcpyH2D"... for a memcpy callback id, else nullptr.
const char* MemcpyTypeOfCallback(uint32_t cbid);
// Bytes a call moves or allocates, read from its parameter struct (nullptr or
// unknown id: 0). `params` is CUpti_CallbackData::functionParams at exit.
uint64_t BytesOfCall(uint32_t cbid, const void* params);

struct GpuLimits {
  uint64_t max_activity_events = 2ull * 1024 * 1024;  // 0: keep none (as XLA)
  uint32_t num_gpus_to_profile = 0;                   // 0: all
  uint64_t max_annotation_strings = 1024 * 1024;      // distinct annotation stacks kept per GPU
};

class GpuCollector {
 public:
  // `copy_names`: kernel names are copied when the record is added (CUPTI's
  // strings may not outlive its buffers); off for records whose names live on.
  explicit GpuCollector(GpuLimits limits = {}, bool copy_names = false) : limits_(limits), copy_names_(copy_names) {}

  // One activity record (CUpti_Activity*: kind at offset 0). Unknown kinds
  // are counted and skipped.
  void AddRecord(const void* record);
  // A host call (already bounded by the tracer).
  void AddApiEvent(const ApiEvent& e) { api_.push_back(e); }
  // Records the tracer could not keep, per GPU (reason shown in the warning).
  void CountDropped(uint32_t device, const std::string& reason, uint64_t n);

  // Writes the device planes, the host calls on `space`'s /host:CPU thread
  // lines (annotations open around each launch are read from those lines),
  // and a warning when anything was dropped.
  void Export(const ClockMap& clock, model::Space* space);

  uint64_t records() const { return records_; }
  uint64_t dropped() const;

 private:
  enum class Type : uint8_t { kKernel, kMemcpy, kMemset, kGraph };
  struct DeviceEvent {
    uint64_t start_ns, end_ns;
    uint64_t bytes;          // memcpy/memset
    const char* name;        // kernel (CUPTI string, copied at Export)
    uint32_t correlation_id, stream, context, graph_id;
    uint32_t grid[3], block[3];
    uint32_t static_shared, dynamic_shared;
    uint16_t registers;
    uint8_t copy_kind, src_kind, dst_kind;
    uint8_t async;
    Type type;
    uint32_t dst_device;
  };
  struct Device {
    std::vector<DeviceEvent> events;
    std::unordered_map<std::string, uint64_t> dropped;  // reason -> count
  };
  Device& device(uint32_t id);

  // NVTX push/pop ranges (MARKER records, gpu_enable_nvtx_tracking).
  struct OpenMarker {
    uint64_t start_ns;
    uint32_t tid;
    std::string name;
  };
  struct NvtxRange {
    uint64_t start_ns, end_ns;
    uint32_t tid;
    std::string name;
  };
  void AddMarker(const void* record);

  GpuLimits limits_;
  std::vector<Device> devices_;
  std::unordered_map<uint32_t, OpenMarker> open_markers_;  // by marker id
  std::vector<NvtxRange> nvtx_;
  uint64_t nvtx_dropped_ = 0;
  std::vector<ApiEvent> api_;
  uint64_t records_ = 0;
  uint64_t unknown_kinds_ = 0;
  bool copy_names_ = false;
  std::unordered_map<std::string, std::unique_ptr<char[]>> names_;  // copies, by content
  std::unordered_map<const char*, const char*> name_of_;          // CUPTI's pointer -> our copy
};

}  // namespace spyglass::gpu
