// Conversion of what CUPTI reports (activity records, driver-API callback
// events) into the model: one /device:GPU:<n> plane per GPU with XProf's line,
// event and stat names (spec GPU.md §4), and the launching host calls on their
// threads' lines of /host:CPU, linked to the device events by correlation_id
// (XProf draws the flow arrows and groups launches with kernels from it).
//
// No CUDA needed here: records are read at the offsets of cupti_abi.h, so the
// tests and the benchmark feed records built in memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
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

// A CUDA graph node as it was made (gpu_dump_graph_node_mapping): under
// which driver call, on which thread, when.
struct GraphNodeEvent {
  uint64_t time_ns = 0;  // CUPTI clock
  uint64_t node_id = 0;
  uint64_t original_node_id = 0;  // a clone's (instantiation's) source node, else 0
  const char* function = nullptr;  // the driver call it was made under (CUPTI's static name)
  uint32_t tid = 0, graph_id = 0, correlation_id = 0;
  int32_t node_type = -1;  // CUgraphNodeType
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
  // The host calls (already bounded by the tracer), read where they are
  // until Export: a copy cost 48 bytes of fresh memory a call, about a tenth
  // of converting a launch. Calls that never returned (end_ns 0) are skipped.
  void SetApiEvents(std::span<const ApiEvent> events) { api_ = events; }
  // A graph node made during the session (gpu_dump_graph_node_mapping).
  void AddGraphNode(const GraphNodeEvent& e) { graph_nodes_.push_back(e); }
  // Records the tracer could not keep, per GPU (reason shown in the warning).
  void CountDropped(uint32_t device, const std::string& reason, uint64_t n);

  // Writes the device planes, the host calls on `space`'s /host:CPU thread
  // lines (annotations open around each launch are read from those lines),
  // and a warning when anything was dropped.
  void Export(const ClockMap& clock, model::Space* space);

  uint64_t records() const { return records_; }
  uint64_t api_calls() const { return api_calls_; }  // the host calls Export found (empty slots skipped)
  uint64_t dropped() const;

 private:
  enum class Type : uint8_t { kKernel, kMemcpy, kMemset, kGraph };
  // One device record as kept until Export (48 bytes; what repeats, the
  // kernel name and the launch configuration / copy details, is interned when
  // the record is added and stored as an index).
  struct DeviceEvent {
    uint64_t start_ns, end_ns;
    uint64_t graph_node_id;
    uint32_t correlation_id, context, graph_id;
    uint32_t detail;  // index into details_
    uint32_t name;    // kernel: index into names_; memcpy: copy kind; memset: memory kind
    Type type;
  };
  static_assert(sizeof(DeviceEvent) == 48);
  // Events of one stream, in chunks that never move (no copy as they grow;
  // the large ones on transparent huge pages: 512 times fewer page faults).
  struct Stream {
    uint32_t id = 0;
    uint64_t count = 0;
    struct Chunk {
      std::unique_ptr<DeviceEvent[], void (*)(DeviceEvent*)> data;
      size_t used, capacity;
    };
    std::vector<Chunk> chunks;
    DeviceEvent* Append();
  };
  static constexpr size_t kMaxStreamsPerGpu = 16384;
  struct Device {
    std::vector<Stream> streams;
    std::unordered_map<uint32_t, uint32_t> stream_index;  // stream id -> index in streams
    std::unordered_map<std::string, uint64_t> dropped;  // reason -> count
  };
  Device& device(uint32_t id);
  Stream* stream(uint32_t dev, uint32_t id);  // nullptr: over kMaxStreamsPerGpu
  uint32_t InternName(const char* cupti_name);
  uint32_t InternDetail(const std::array<uint64_t, 5>& key);

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
  std::span<const ApiEvent> api_;
  std::vector<GraphNodeEvent> graph_nodes_;
  uint64_t records_ = 0;
  uint64_t api_calls_ = 0;
  uint64_t unknown_kinds_ = 0;
  bool copy_names_ = false;
  std::vector<const char*> names_;                       // kernel names (ours when copied)
  std::unordered_map<std::string, uint32_t> name_index_;  // copies, by content
  std::vector<std::unique_ptr<char[]>> name_copies_;
  std::unordered_map<const char*, uint32_t> name_of_;    // CUPTI's pointer -> index
  struct NameSlot {
    const char* name = nullptr;
    uint32_t index = UINT32_MAX;
  };
  std::array<NameSlot, 64> name_cache_{};  // direct-mapped, by pointer
  const char* last_name_ = nullptr;
  uint32_t last_name_index_ = 0;
  struct KeyHash {
    size_t operator()(const std::array<uint64_t, 5>& k) const;
  };
  std::vector<std::array<uint64_t, 5>> details_;  // (type, values) of each distinct detail string
  std::unordered_map<std::array<uint64_t, 5>, uint32_t, KeyHash> detail_index_;
  struct CachedDetail {
    std::array<uint64_t, 5> key;
    uint32_t index = UINT32_MAX;
  };
  std::unique_ptr<CachedDetail[]> detail_cache_{new CachedDetail[256]};  // direct-mapped, by hash
  uint32_t last_dev_ = UINT32_MAX, last_stream_id_ = 0;
  Stream* last_stream_ = nullptr;
};

}  // namespace spyglass::gpu
