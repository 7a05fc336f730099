#include "gpu/gpu_convert.h"

#include <cxxabi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "gpu/cupti_abi.h"
#include "model/schema.h"

namespace spyglass::gpu {

using abi::Field;

void ClockMap::AddSample(uint64_t cupti_ns, int64_t host_before, int64_t host_after) {
  double h = (static_cast<double>(host_before) + static_cast<double>(host_after)) / 2;
  bound_ns_ = std::max(bound_ns_, (host_after - host_before + 1) / 2);
  if (n_ == 0) {
    c0_ = cupti_ns;
    h0_ = h;
  }
  c1_ = cupti_ns;
  h1_ = h;
  ++n_;
  // A slope far from 1 means a bad sample (a clock jump): keep the offset only.
  slope_ = c1_ > c0_ ? (h1_ - h0_) / static_cast<double>(c1_ - c0_) : 1.0;
  if (slope_ < 0.99 || slope_ > 1.01) slope_ = 1.0;
}

int64_t ClockMap::ToPs(uint64_t cupti_ns) const {
  double d = static_cast<double>(static_cast<int64_t>(cupti_ns - c0_));
  return static_cast<int64_t>((h0_ + d * slope_) * 1000.0);
}

ApiKind KindOfCallback(uint32_t id) {
  using namespace abi::cbid;
  switch (id) {
    case kLaunchKernel: case kLaunchCooperativeKernel: case kLaunchCooperativeKernelMultiDevice: case kLaunchKernelEx:
      return ApiKind::kLaunch;
    case kGraphLaunch: case kGraphLaunchPtsz: return ApiKind::kGraphLaunch;
    case kMemAlloc: case kMemAllocPitch: case kMemAllocManaged: case kMemAllocHost: case kMemHostAlloc:
    case kMemAllocAsync: case kMemAllocAsyncPtsz: case kMemAllocFromPoolAsync: case kMemAllocFromPoolAsyncPtsz:
      return ApiKind::kAlloc;
    case kMemFree: case kMemFreeHost: case kMemFreeAsync: case kMemFreeAsyncPtsz: return ApiKind::kFree;
    case kMemsetD8Async: case kMemsetD16Async: case kMemsetD32Async: case kMemsetD2D8Async: case kMemsetD2D16Async:
    case kMemsetD2D32Async: case kMemsetD8: case kMemsetD16: case kMemsetD32: case kMemsetD2D8: case kMemsetD2D16:
    case kMemsetD2D32:
      return ApiKind::kMemset;
    default: break;
  }
  return MemcpyTypeOfCallback(id) ? ApiKind::kMemcpy : ApiKind::kOther;
}

const char* MemcpyTypeOfCallback(uint32_t id) {
  using namespace abi::cbid;
  switch (id) {
    case kMemcpyHtoD: case kMemcpyHtoDAsync: case kMemcpyHtoA: case kMemcpyHtoAAsync: return "MemcpyH2D";
    case kMemcpyDtoH: case kMemcpyDtoHAsync: case kMemcpyAtoH: case kMemcpyAtoHAsync: return "MemcpyD2H";
    case kMemcpyDtoD: case kMemcpyDtoDAsync: case kMemcpyAtoD: case kMemcpyDtoA: case kMemcpyAtoA: return "MemcpyD2D";
    case kMemcpyPeer: case kMemcpyPeerAsync: return "MemcpyP2P";
    case kMemcpy2D: case kMemcpy2DUnaligned: case kMemcpy2DAsync: case kMemcpy3D: case kMemcpy3DAsync: case kMemcpy:
    case kMemcpyAsync:
      return "MemcpyOther";
    default: return nullptr;
  }
}

uint64_t BytesOfCall(uint32_t id, const void* params) {
  using namespace abi::cbid;
  if (params == nullptr) return 0;
  switch (id) {
    // {dst, src, size_t ByteCount, ...}
    case kMemcpyHtoD: case kMemcpyHtoDAsync: case kMemcpyDtoH: case kMemcpyDtoHAsync: case kMemcpyDtoD:
    case kMemcpyDtoDAsync: case kMemcpy: case kMemcpyAsync:
      return Field<uint64_t>(params, 16);
    // {dstDevice, dstContext, srcDevice, srcContext, ByteCount, ...}
    case kMemcpyPeer: case kMemcpyPeerAsync: return Field<uint64_t>(params, 32);
    // {CUdeviceptr* dptr / void** pp, size_t bytesize, ...}
    case kMemAlloc: case kMemAllocManaged: case kMemAllocHost: case kMemHostAlloc: case kMemAllocAsync:
    case kMemAllocAsyncPtsz: case kMemAllocFromPoolAsync: case kMemAllocFromPoolAsyncPtsz:
      return Field<uint64_t>(params, 8);
    // {dptr, size_t* pPitch, WidthInBytes, Height, ElementSizeBytes}
    case kMemAllocPitch: {
      auto* pitch = Field<const uint64_t*>(params, 8);
      return pitch ? *pitch * Field<uint64_t>(params, 24) : 0;
    }
    // {dstDevice, value, size_t N, ...}: N elements of 1/2/4 bytes.
    case kMemsetD8: case kMemsetD8Async: return Field<uint64_t>(params, 16);
    case kMemsetD16: case kMemsetD16Async: return Field<uint64_t>(params, 16) * 2;
    case kMemsetD32: case kMemsetD32Async: return Field<uint64_t>(params, 16) * 4;
    default: return 0;
  }
}

GpuCollector::Device& GpuCollector::device(uint32_t id) {
  if (id >= devices_.size()) devices_.resize(id + 1);
  return devices_[id];
}

void GpuCollector::CountDropped(uint32_t dev, const std::string& reason, uint64_t n) {
  if (n != 0 && dev < 1024) device(dev).dropped[reason] += n;
}

uint64_t GpuCollector::dropped() const {
  uint64_t n = 0;
  for (const Device& d : devices_)
    for (const auto& [reason, count] : d.dropped) n += count;
  return n;
}

void GpuCollector::AddRecord(const void* r) {
  uint32_t k = Field<uint32_t>(r, 0);
  DeviceEvent e{};
  uint32_t dev;
  switch (k) {
    case abi::kind::kKernel:
    case abi::kind::kConcurrentKernel: {
      namespace o = abi::kernel;
      e.type = Type::kKernel;
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      e.stream = Field<uint32_t>(r, o::kStreamId);
      std::memcpy(e.grid, static_cast<const char*>(r) + o::kGridX, 12);
      std::memcpy(e.block, static_cast<const char*>(r) + o::kBlockX, 12);
      e.static_shared = Field<uint32_t>(r, o::kStaticShared);
      e.dynamic_shared = Field<uint32_t>(r, o::kDynamicShared);
      e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
      e.name = Field<const char*>(r, o::kName);
      e.registers = Field<uint16_t>(r, o::kRegistersPerThread);
      e.graph_id = Field<uint32_t>(r, o::kGraphId);
      break;
    }
    case abi::kind::kMemcpy:
    case abi::kind::kMemcpy2: {
      namespace o = abi::memcpy;
      e.type = Type::kMemcpy;
      e.copy_kind = Field<uint8_t>(r, o::kCopyKind);
      e.src_kind = Field<uint8_t>(r, o::kSrcKind);
      e.dst_kind = Field<uint8_t>(r, o::kDstKind);
      e.async = (Field<uint8_t>(r, o::kFlags) & abi::kMemcpyFlagAsync) ? 1 : 0;
      e.bytes = Field<uint64_t>(r, o::kBytes);
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      e.stream = Field<uint32_t>(r, o::kStreamId);
      if (k == abi::kind::kMemcpy) {
        e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
        e.graph_id = Field<uint32_t>(r, o::kGraphId);
        e.dst_device = dev;
      } else {
        e.copy_kind = abi::kCopyPtoP;
        e.correlation_id = Field<uint32_t>(r, abi::memcpy_p2p::kCorrelationId);
        e.dst_device = Field<uint32_t>(r, abi::memcpy_p2p::kDstDeviceId);
      }
      break;
    }
    case abi::kind::kMemset: {
      namespace o = abi::memset;
      e.type = Type::kMemset;
      e.bytes = Field<uint64_t>(r, o::kBytes);
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      e.stream = Field<uint32_t>(r, o::kStreamId);
      e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
      e.async = (Field<uint16_t>(r, o::kFlags) & abi::kMemsetFlagAsync) ? 1 : 0;
      e.dst_kind = static_cast<uint8_t>(Field<uint16_t>(r, o::kMemoryKind));
      break;
    }
    case abi::kind::kGraphTrace: {
      namespace o = abi::graph_trace;
      e.type = Type::kGraph;
      e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.graph_id = Field<uint32_t>(r, o::kGraphId);
      e.context = Field<uint32_t>(r, o::kContextId);
      e.stream = Field<uint32_t>(r, o::kStreamId);
      break;
    }
    case abi::kind::kMarker:
      AddMarker(r);
      return;
    default:
      ++unknown_kinds_;  // overhead...: not shown yet
      return;
  }
  if (dev >= 1024) return;  // not a device id: a corrupt record
  if (limits_.num_gpus_to_profile != 0 && dev >= limits_.num_gpus_to_profile) return;
  Device& d = device(dev);
  if (records_ >= limits_.max_activity_events) {
    ++d.dropped["total device(activity) events reaches max (gpu_max_activity_api_events)"];
    return;
  }
  ++records_;
  if (copy_names_ && e.type == Type::kKernel && e.name != nullptr) {
    auto it = name_of_.find(e.name);
    if (it == name_of_.end()) {
      std::string n(e.name, strnlen(e.name, 4096));
      auto copy = names_.find(n);
      if (copy == names_.end()) {
        auto buf = std::make_unique<char[]>(n.size() + 1);
        std::memcpy(buf.get(), n.c_str(), n.size() + 1);
        copy = names_.emplace(n, std::move(buf)).first;
      }
      it = name_of_.emplace(e.name, copy->second.get()).first;
    }
    e.name = it->second;
  }
  d.events.push_back(e);
}

void GpuCollector::AddMarker(const void* r) {
  namespace o = abi::marker;
  if (Field<uint32_t>(r, o::kObjectKind) != o::kObjectThread) return;  // process-wide ranges: not shown
  uint32_t flags = Field<uint32_t>(r, o::kFlags), id = Field<uint32_t>(r, o::kId);
  uint64_t ts = Field<uint64_t>(r, o::kTimestamp);
  if (flags & o::kFlagStart) {
    if (records_ + open_markers_.size() >= limits_.max_activity_events) {
      ++nvtx_dropped_;
      return;
    }
    const char* name = Field<const char*>(r, o::kName);
    const char* domain = Field<const char*>(r, o::kDomain);
    std::string full = "NVTX:";
    if (domain != nullptr && *domain != 0) full.append(domain, strnlen(domain, 256)).push_back(':');
    if (name != nullptr) full.append(name, strnlen(name, 1024));
    open_markers_[id] = {ts, Field<uint32_t>(r, o::kObjectId + o::kThreadIdInObjectId), std::move(full)};
  } else if (flags & o::kFlagEnd) {
    auto it = open_markers_.find(id);
    if (it == open_markers_.end()) return;  // its start came before the session
    ++records_;
    nvtx_.push_back({it->second.start_ns, ts, it->second.tid, std::move(it->second.name)});
    open_markers_.erase(it);
  }
}

namespace {

const char* MemoryKindName(uint8_t k) {
  static const char* const kNames[] = {"unknown", "pageable", "pinned", "device",
                                       "array",   "managed",  "device_static", "managed_static"};
  return k < 8 ? kNames[k] : "unknown";
}

const char* CopyTypeName(uint8_t k) {
  switch (k) {
    case abi::kCopyHtoD: return "MemcpyH2D";
    case abi::kCopyDtoH: return "MemcpyD2H";
    case abi::kCopyDtoD: return "MemcpyD2D";
    case abi::kCopyPtoP: return "MemcpyP2P";
    default: return "MemcpyOther";
  }
}

std::string Demangle(const char* name) {
  if (name == nullptr) return "<unknown kernel>";
  int status = 0;
  char* d = ::abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

// The annotation stack open around a launch, resolved once per distinct stack.
struct Annotation {
  std::string outermost, stack;
};

// For each launch (tid, [start, end] ps), the annotations of its thread's
// host line that enclose it. Host events nest, so one sweep per thread with a
// stack of open events answers all its launches.
std::unordered_map<uint32_t, Annotation> AnnotationsOfLaunches(const model::Plane& host,
                                                               std::vector<std::pair<int64_t, const ApiEvent*>>& launches,
                                                               const ClockMap& clock) {
  std::unordered_map<uint32_t, Annotation> out;
  std::sort(launches.begin(), launches.end(), [](const auto& a, const auto& b) {
    return a.second->tid != b.second->tid ? a.second->tid < b.second->tid : a.first < b.first;
  });
  size_t i = 0;
  while (i < launches.size()) {
    uint32_t tid = launches[i].second->tid;
    size_t j = i;
    while (j < launches.size() && launches[j].second->tid == tid) ++j;
    const model::Line* line = nullptr;
    for (const model::Line& l : host.lines)
      if (l.id == tid) line = &l;
    if (line != nullptr && !line->events.empty()) {
      std::vector<const model::Event*> evs;
      evs.reserve(line->events.size());
      for (const model::Event& e : line->events) evs.push_back(&e);
      std::sort(evs.begin(), evs.end(), [](const model::Event* a, const model::Event* b) {
        return a->offset_ps != b->offset_ps ? a->offset_ps < b->offset_ps : a->duration_ps > b->duration_ps;
      });
      std::vector<const model::Event*> open;
      size_t next = 0;
      for (size_t k = i; k < j; ++k) {
        int64_t start = launches[k].first;
        int64_t end = clock.ToPs(launches[k].second->end_ns);
        while (next < evs.size() && evs[next]->offset_ps <= start) {
          const model::Event* e = evs[next++];
          while (!open.empty() && open.back()->offset_ps + open.back()->duration_ps <= e->offset_ps) open.pop_back();
          open.push_back(e);
        }
        while (!open.empty() && open.back()->offset_ps + open.back()->duration_ps < end) open.pop_back();
        if (open.empty()) continue;
        Annotation a;
        for (const model::Event* e : open) {
          const std::string& n = host.event_metadata()[e->metadata_id].name;
          if (a.stack.empty()) a.outermost = n;
          a.stack += (a.stack.empty() ? "" : "::") + n;
        }
        out.emplace(launches[k].second->correlation_id, std::move(a));
      }
    }
    i = j;
  }
  return out;
}

// Records arrive mostly in time order per stream: check before sorting.
void SortIfNeeded(model::Line& l) {
  bool sorted = std::is_sorted(l.events.begin(), l.events.end(), [](const model::Event& a, const model::Event& b) {
    return a.offset_ps != b.offset_ps ? a.offset_ps < b.offset_ps : a.duration_ps > b.duration_ps;
  });
  if (!sorted) l.sort_events();
}

struct StreamLine {
  uint32_t stream;
  size_t index;
  bool types[6];  // Compute, MemcpyH2D, MemcpyD2H, MemcpyD2D, MemcpyP2P/Other, Memset, (graph as Compute)
};

}  // namespace

void GpuCollector::Export(const ClockMap& clock, model::Space* space) {
  // Launches first: their annotations, read before our events join the lines.
  std::vector<std::pair<int64_t, const ApiEvent*>> launches;
  for (const ApiEvent& a : api_) {
    ApiKind k = KindOfCallback(a.cbid);
    if (k == ApiKind::kLaunch || k == ApiKind::kGraphLaunch || k == ApiKind::kMemcpy || k == ApiKind::kMemset)
      launches.emplace_back(clock.ToPs(a.start_ns), &a);
  }
  std::unordered_map<uint32_t, Annotation> annotations =
      AnnotationsOfLaunches(space->plane(model::kHostPlaneName), launches, clock);
  std::unordered_map<uint32_t, const char*> kernel_of;  // correlation id -> kernel name (launch events' names)

  for (uint32_t dev = 0; dev < devices_.size(); ++dev) {
    Device& d = devices_[dev];
    if (d.events.empty() && d.dropped.empty()) continue;
    model::Plane& p = space->plane(std::string(model::kGpuPlanePrefix) + std::to_string(dev));
    p.id = dev;
    p.stats.push_back(p.str_stat(model::kDeviceVendorStat, "Nvidia"));
    const uint32_t k_corr = p.intern_stat(model::kCorrelationIdStat), k_ctx = p.intern_stat(model::kContextIdStat),
                   k_kernel = p.intern_stat(model::kKernelDetailsStat),
                   k_memcpy = p.intern_stat(model::kMemcpyDetailsStat),
                   k_memset = p.intern_stat(model::kMemsetDetailsStat), k_tf_op = p.intern_stat(model::kTfOpStat),
                   k_stack = p.intern_stat(model::kAnnotationStackStat),
                   k_graph = p.intern_stat(model::kCudaGraphIdStat),
                   k_graph_exec = p.intern_stat(model::kCudaGraphExecIdStat);
    auto ref = [](uint32_t key, uint32_t value) {
      model::Stat s;
      s.metadata_id = key;
      s.kind = model::StatKind::kRef;
      s.ref = value;
      return s;
    };
    auto uint = [](uint32_t key, uint64_t v) {
      model::Stat s;
      s.metadata_id = key;
      s.kind = model::StatKind::kUint64;
      s.u64 = v;
      return s;
    };
    std::vector<StreamLine> streams;
    size_t last = SIZE_MAX;
    // Events per stream first: each line's storage is sized once (growing
    // them by doubling cost more in page faults and copies than converting).
    std::unordered_map<uint32_t, size_t> per_stream;
    for (const DeviceEvent& e : d.events) ++per_stream[e.stream];
    std::unordered_map<const char*, uint32_t> name_ids;
    std::unordered_map<uint32_t, uint32_t> ctx_ids;
    std::unordered_map<std::string, uint32_t> detail_ids;
    // Formatting a detail string per event would cost more than the rest of
    // the conversion: one string per distinct (type, values) key.
    struct KeyHash {
      size_t operator()(const std::array<uint64_t, 5>& k) const {
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (uint64_t v : k) h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        return h ^ (h >> 31);
      }
    };
    std::unordered_map<std::array<uint64_t, 5>, uint32_t, KeyHash> detail_by_key;
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> annotation_ids;  // stack -> (tf_op, stack)
    uint32_t memset_ids[8] = {};
    uint32_t copy_ids[11] = {};
    char buf[256];
    auto detail = [&](int n) {
      std::string s(buf, std::min<int>(n, sizeof(buf) - 1));
      auto it = detail_ids.find(s);
      if (it != detail_ids.end()) return it->second;
      uint32_t id = p.intern_stat(s);
      detail_ids.emplace(std::move(s), id);
      return id;
    };
    for (const DeviceEvent& e : d.events) {
      if (e.start_ns == 0 || e.end_ns < e.start_ns) {
        ++d.dropped["no valid timestamps in the record"];
        continue;
      }
      int64_t start_ps = clock.ToPs(e.start_ns);
      if (start_ps < 0) start_ps = 0;  // queued just before the start: shown at the start
      if (last == SIZE_MAX || streams[last].stream != e.stream) {
        last = SIZE_MAX;
        for (size_t s = 0; s < streams.size(); ++s)
          if (streams[s].stream == e.stream) last = s;
        if (last == SIZE_MAX) {
          streams.push_back({e.stream, p.lines.size(), {}});
          model::Line& l = p.lines.emplace_back();
          l.id = e.stream;
          size_t count = per_stream[e.stream];
          l.events.reserve(count);
          l.reserve_stats(count, count * (annotations.empty() ? 3 : 5));
          last = streams.size() - 1;
        }
      }
      model::Line& line = p.lines[streams[last].index];
      model::Event ev;
      ev.offset_ps = start_ps;
      ev.duration_ps = static_cast<int64_t>(e.end_ns - e.start_ns) * 1000;
      model::Stat stats[6];
      int n = 0;
      switch (e.type) {
        case Type::kKernel: {
          auto it = name_ids.find(e.name);
          if (it == name_ids.end()) it = name_ids.emplace(e.name, p.intern_event(Demangle(e.name))).first;
          ev.metadata_id = it->second;
          if (!annotations.empty() || !api_.empty()) kernel_of.emplace(e.correlation_id, e.name);
          std::array<uint64_t, 5> key{uint64_t{e.registers} << 32 | e.static_shared,
                                      uint64_t{e.dynamic_shared} << 32 | e.grid[0],
                                      uint64_t{e.grid[1]} << 32 | e.grid[2], uint64_t{e.block[0]} << 32 | e.block[1],
                                      uint64_t{e.block[2]} << 32 | 1};
          auto dit = detail_by_key.find(key);
          if (dit == detail_by_key.end()) {
            int len = std::snprintf(buf, sizeof buf,
                                    "regs:%u static_shared:%u dynamic_shared:%u grid:%u,%u,%u block:%u,%u,%u",
                                    e.registers, e.static_shared, e.dynamic_shared, e.grid[0], e.grid[1],
                                    e.grid[2], e.block[0], e.block[1], e.block[2]);
            dit = detail_by_key.emplace(key, detail(len)).first;
          }
          stats[n++] = ref(k_kernel, dit->second);
          streams[last].types[0] = true;
          break;
        }
        case Type::kMemcpy: {
          uint32_t& cid = copy_ids[e.copy_kind < 11 ? e.copy_kind : 0];
          if (cid == 0) cid = p.intern_event(CopyTypeName(e.copy_kind));
          ev.metadata_id = cid;
          std::array<uint64_t, 5> key{e.bytes, uint64_t{e.src_kind} << 16 | uint64_t{e.dst_kind} << 8 | e.async,
                                      e.dst_device, 2, 0};
          auto dit = detail_by_key.find(key);
          if (dit == detail_by_key.end()) {
            int len = std::snprintf(buf, sizeof buf, "kind_src:%s kind_dst:%s size:%llu dest:%u async:%u",
                                    MemoryKindName(e.src_kind), MemoryKindName(e.dst_kind),
                                    static_cast<unsigned long long>(e.bytes), e.dst_device, e.async);
            dit = detail_by_key.emplace(key, detail(len)).first;
          }
          stats[n++] = ref(k_memcpy, dit->second);
          int t = e.copy_kind == abi::kCopyHtoD ? 1 : e.copy_kind == abi::kCopyDtoH ? 2 : e.copy_kind == abi::kCopyDtoD ? 3 : 4;
          streams[last].types[t] = true;
          break;
        }
        case Type::kMemset: {
          std::array<uint64_t, 5> key{e.bytes, uint64_t{e.dst_kind} << 8 | e.async, 0, 3, 0};
          auto dit = detail_by_key.find(key);
          if (dit == detail_by_key.end()) {
            int len = std::snprintf(buf, sizeof buf, "kind:%s num_bytes:%llu async:%u", MemoryKindName(e.dst_kind),
                                    static_cast<unsigned long long>(e.bytes), e.async);
            dit = detail_by_key.emplace(key, detail(len)).first;
          }
          stats[n++] = ref(k_memset, dit->second);
          uint32_t& mid = memset_ids[e.dst_kind < 8 ? e.dst_kind : 0];
          if (mid == 0 || e.dst_kind >= 8) {
            int len = std::snprintf(buf, sizeof buf, "Memset %u", e.dst_kind);
            mid = p.intern_event(std::string_view(buf, len));
          }
          ev.metadata_id = mid;
          streams[last].types[5] = true;
          break;
        }
        case Type::kGraph: {
          int len = std::snprintf(buf, sizeof buf, "CudaGraphExec:%u", e.graph_id);
          ev.metadata_id = p.intern_event(std::string_view(buf, len));
          stats[n++] = uint(k_graph_exec, e.graph_id);
          streams[last].types[0] = true;
          break;
        }
      }
      stats[n++] = uint(k_corr, e.correlation_id);
      auto cit = ctx_ids.find(e.context);
      if (cit == ctx_ids.end()) cit = ctx_ids.emplace(e.context, p.intern_stat("$$" + std::to_string(e.context))).first;
      stats[n++] = ref(k_ctx, cit->second);
      if (e.graph_id != 0 && e.type != Type::kGraph) stats[n++] = uint(k_graph, e.graph_id);
      auto ait = annotations.find(e.correlation_id);
      if (ait != annotations.end()) {
        auto idit = annotation_ids.find(ait->second.stack);
        if (idit == annotation_ids.end() && annotation_ids.size() < limits_.max_annotation_strings)
          idit = annotation_ids
                     .emplace(ait->second.stack,
                              std::pair{p.intern_stat(ait->second.outermost), p.intern_stat(ait->second.stack)})
                     .first;
        if (idit != annotation_ids.end()) {
          stats[n++] = ref(k_tf_op, idit->second.first);
          stats[n++] = ref(k_stack, idit->second.second);
        } else {
          ++d.dropped["its annotation was over gpu_max_annotation_strings (event kept without it)"];
        }
      }
      line.events.push_back(ev);
      line.add_stats(line.events.back(), std::span<const model::Stat>(stats, n));
    }
    static const char* const kTypeNames[] = {"Compute", "MemcpyH2D", "MemcpyD2H", "MemcpyD2D", "MemcpyOther", "Memset"};
    for (const StreamLine& s : streams) {
      std::string types;
      for (int t = 0; t < 6; ++t)
        if (s.types[t]) types += (types.empty() ? "" : ",") + std::string(kTypeNames[t]);
      model::Line& l = p.lines[s.index];
      l.name = "Stream #" + std::to_string(s.stream) + (types.empty() ? "" : "(" + types + ")");
      l.display_name = l.name;
      SortIfNeeded(l);
    }
    std::vector<DeviceEvent>().swap(d.events);
  }

  // Host calls on their threads' lines (the plane is looked up again: adding
  // device planes moved it).
  model::Plane& host = space->plane(model::kHostPlaneName);
  const uint32_t h_corr = host.intern_stat(model::kCorrelationIdStat), h_dev = host.intern_stat(model::kDeviceIdStat),
                 h_memcpy = host.intern_stat(model::kMemcpyDetailsStat),
                 h_alloc = host.intern_stat(model::kMemallocDetailsStat);
  std::map<int64_t, size_t> touched;  // tid -> line index (lines move as they are added)
  std::unordered_map<const char*, uint32_t> names;
  int64_t last_tid = -1;
  size_t last_index = 0;
  auto uint = [](uint32_t key, uint64_t v) {
    model::Stat s;
    s.metadata_id = key;
    s.kind = model::StatKind::kUint64;
    s.u64 = v;
    return s;
  };
  for (const ApiEvent& a : api_) {
    if (a.tid != last_tid) {
      auto [tit, fresh] = touched.emplace(a.tid, 0);
      if (fresh) {
        host.line_with_id(a.tid);
        for (size_t li = 0; li < host.lines.size(); ++li)
          if (host.lines[li].id == a.tid) tit->second = li;
      }
      last_tid = a.tid;
      last_index = tit->second;
    }
    model::Line* line = &host.lines[last_index];
    model::Event ev;
    ev.offset_ps = clock.ToPs(a.start_ns);
    ev.duration_ps = a.end_ns > a.start_ns ? static_cast<int64_t>(a.end_ns - a.start_ns) * 1000 : 0;
    ApiKind kind = KindOfCallback(a.cbid);
    const char* name = a.function ? a.function : "cuda";
    if (kind == ApiKind::kLaunch) {
      // Named by its kernel (XProf's Launch Stats skip names starting with "cu").
      auto it = kernel_of.find(a.correlation_id);
      if (it != kernel_of.end()) name = it->second;
    } else if (kind == ApiKind::kMemcpy) {
      name = MemcpyTypeOfCallback(a.cbid);
    }
    auto nit = names.find(name);
    if (nit == names.end()) nit = names.emplace(name, host.intern_event(kind == ApiKind::kLaunch ? Demangle(name) : name)).first;
    ev.metadata_id = nit->second;
    model::Stat stats[3];
    int n = 0;
    stats[n++] = uint(h_dev, a.device);
    if (kind != ApiKind::kAlloc && kind != ApiKind::kFree) stats[n++] = uint(h_corr, a.correlation_id);
    if (kind == ApiKind::kMemcpy && a.bytes != 0) {
      char buf[96];
      int len = std::snprintf(buf, sizeof buf, "size:%llu", static_cast<unsigned long long>(a.bytes));
      stats[n++] = host.ref_stat(model::kMemcpyDetailsStat, std::string_view(buf, len));
      stats[n - 1].metadata_id = h_memcpy;
    } else if (kind == ApiKind::kAlloc) {
      char buf[96];
      int len = std::snprintf(buf, sizeof buf, "kind:unknown num_bytes:%llu", static_cast<unsigned long long>(a.bytes));
      stats[n++] = host.ref_stat(model::kMemallocDetailsStat, std::string_view(buf, len));
      stats[n - 1].metadata_id = h_alloc;
    }
    line->events.push_back(ev);
    line->add_stats(line->events.back(), std::span<const model::Stat>(stats, n));
  }
  // NVTX ranges: one line per thread beside its own (ids from 2^32, as XLA's
  // /host:NVTX-CUPTI lines are renumbered when merged).
  for (const NvtxRange& r : nvtx_) {
    int64_t id = (int64_t{1} << 32) + r.tid;
    auto [tit, fresh] = touched.emplace(id, 0);
    if (fresh) {
      host.line_with_id(id);
      for (size_t li = 0; li < host.lines.size(); ++li)
        if (host.lines[li].id == id) tit->second = li;
      model::Line& l = host.lines[tit->second];
      if (l.name.empty()) l.name = l.display_name = "Host Threads/" + std::to_string(r.tid) + "/NVTX";
    }
    model::Event ev;
    ev.offset_ps = clock.ToPs(r.start_ns);
    ev.duration_ps = r.end_ns > r.start_ns ? static_cast<int64_t>(r.end_ns - r.start_ns) * 1000 : 0;
    ev.metadata_id = host.intern_event(model::ValidUtf8(r.name));
    host.lines[tit->second].events.push_back(ev);
  }
  if (nvtx_dropped_ != 0) CountDropped(0, "NVTX ranges over gpu_max_activity_api_events", nvtx_dropped_);
  for (auto& [tid, index] : touched) SortIfNeeded(host.lines[index]);

  // Drops, per GPU and reason, as the host tracer reports its own.
  std::string warning;
  for (uint32_t dev = 0; dev < devices_.size(); ++dev)
    for (const auto& [reason, count] : devices_[dev].dropped)
      if (count != 0)
        warning += " GPU " + std::to_string(dev) + ": " + std::to_string(count) + " events dropped because " + reason + ";";
  if (!warning.empty()) {
    warning.back() = '.';
    space->warnings.push_back("Detected GPU events dropped: collected " + std::to_string(api_.size()) +
                              " driver events and " + std::to_string(records_) + " device events." + warning);
    for (uint32_t dev = 0; dev < devices_.size(); ++dev) {
      uint64_t n = 0;
      for (const auto& [reason, count] : devices_[dev].dropped) n += count;
      if (n == 0) continue;
      model::Plane& p = space->plane(std::string(model::kGpuPlanePrefix) + std::to_string(dev));
      p.stats.push_back(p.uint_stat(model::kDroppedEventsStat, n));
    }
  }
  std::vector<ApiEvent>().swap(api_);
}

}  // namespace spyglass::gpu
