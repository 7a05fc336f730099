#include "gpu/gpu_convert.h"

#include <cxxabi.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <unordered_set>

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
    case kMemCreate: case kMemHostRegister: return ApiKind::kAlloc;
    case kMemFree: case kMemFreeHost: case kMemFreeAsync: case kMemFreeAsyncPtsz: case kMemRelease:
    case kMemHostUnregister:
      return ApiKind::kFree;
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
    // {handle*, size, ...}, {ptr, size, ...}, {void* p, bytesize, Flags}
    case kMemCreate: case kMemMap: case kMemUnmap: case kMemHostRegister:
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

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

template <class T>
void FreeSmall(T* p) { std::free(p); }
template <class T>
void FreeHuge(T* p) { munmap(p, kHugePage); }

// A 2 MiB chunk aligned to 2 MiB, advised as a transparent huge page: one
// page fault instead of 512 when it is first written.
void* AllocHuge() {
  void* raw = mmap(nullptr, 2 * kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw), aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  if (uintptr_t end = start + 2 * kHugePage; end > aligned + kHugePage)
    munmap(reinterpret_cast<void*>(aligned + kHugePage), end - aligned - kHugePage);
  madvise(reinterpret_cast<void*>(aligned), kHugePage, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

void GpuCollector::CountDropped(uint32_t dev, const std::string& reason, uint64_t n) {
  if (n != 0 && dev < 1024) device(dev).dropped[reason] += n;
}

uint64_t GpuCollector::dropped() const {
  uint64_t n = 0;
  for (const Device& d : devices_)
    for (const auto& [reason, count] : d.dropped) n += count;
  return n;
}

GpuCollector::DeviceEvent* GpuCollector::Stream::Append() {
  if (chunks.empty() || chunks.back().used == chunks.back().capacity) {
    // Chunks double from 4 KiB (a stream with a few events costs little)
    // up to 2 MiB huge pages.
    size_t bytes = std::max<size_t>(4 << 10, std::min(kHugePage, count * sizeof(DeviceEvent)));
    void* p = bytes == kHugePage ? AllocHuge() : nullptr;
    if (p != nullptr) {
      chunks.push_back({{static_cast<DeviceEvent*>(p), &FreeHuge<DeviceEvent>}, 0, bytes / sizeof(DeviceEvent)});
    } else {
      bytes = std::min(bytes, kHugePage / 2);
      if ((p = std::malloc(bytes)) == nullptr) return nullptr;
      chunks.push_back({{static_cast<DeviceEvent*>(p), &FreeSmall<DeviceEvent>}, 0, bytes / sizeof(DeviceEvent)});
    }
  }
  ++count;
  return chunks.back().data.get() + chunks.back().used++;
}

GpuCollector::Stream* GpuCollector::stream(uint32_t dev, uint32_t id) {
  if (dev == last_dev_ && id == last_stream_id_ && last_stream_ != nullptr) return last_stream_;
  Device& d = device(dev);
  // Records alternate between a few streams: a scan while they are few.
  if (d.streams.size() <= 16)
    for (Stream& x : d.streams)
      if (x.id == id) {
        last_dev_ = dev, last_stream_id_ = id, last_stream_ = &x;
        return last_stream_;
      }
  auto [it, fresh] = d.stream_index.try_emplace(id, static_cast<uint32_t>(d.streams.size()));
  if (fresh) {
    // Stream ids come from the records: a corrupt buffer could name millions.
    if (d.streams.size() >= kMaxStreamsPerGpu) {
      d.stream_index.erase(it);
      return nullptr;
    }
    d.streams.emplace_back().id = id;
  }
  last_dev_ = dev;
  last_stream_id_ = id;
  last_stream_ = &d.streams[it->second];
  return last_stream_;
}

size_t GpuCollector::KeyHash::operator()(const std::array<uint64_t, 5>& k) const {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (uint64_t v : k) h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

uint32_t GpuCollector::InternDetail(const std::array<uint64_t, 5>& key) {
  // Most records repeat a few launch configurations and copy sizes: a small
  // cache in front of the map.
  CachedDetail& c = detail_cache_[KeyHash{}(key) & 255];
  // Compared field by field (std::array's == is a memcmp call, per record).
  if (c.index != UINT32_MAX && c.key[0] == key[0] && c.key[1] == key[1] && c.key[2] == key[2] && c.key[3] == key[3] &&
      c.key[4] == key[4])
    return c.index;
  c.key = key;
  auto [it, fresh] = detail_index_.try_emplace(key, static_cast<uint32_t>(details_.size()));
  if (fresh) details_.push_back(key);
  return c.index = it->second;
}

uint32_t GpuCollector::InternName(const char* n) {
  if (n == last_name_ && !names_.empty()) return last_name_index_;
  // Kernels alternate among a few names: a small cache by pointer before the map.
  NameSlot& slot = name_cache_[(reinterpret_cast<uintptr_t>(n) >> 3) * 0x9E3779B97F4A7C15ull >> 58];
  if (slot.name == n && slot.index != UINT32_MAX) return slot.index;
  auto it = name_of_.find(n);
  if (it == name_of_.end()) {
    uint32_t index = static_cast<uint32_t>(names_.size());
    if (n == nullptr) {
      names_.push_back(nullptr);
    } else if (copy_names_) {
      // CUPTI's strings may not outlive its buffers: one copy per distinct name.
      std::string text(n, strnlen(n, 4096));
      auto [cit, fresh] = name_index_.emplace(text, index);
      if (fresh) {
        auto buf = std::make_unique<char[]>(text.size() + 1);
        std::memcpy(buf.get(), text.c_str(), text.size() + 1);
        names_.push_back(buf.get());
        name_copies_.push_back(std::move(buf));
      }
      index = cit->second;
    } else {
      names_.push_back(n);
    }
    it = name_of_.emplace(n, index).first;
  }
  last_name_ = n;
  last_name_index_ = it->second;
  slot = {n, it->second};
  return it->second;
}

void GpuCollector::AddRecord(const void* r) {
  uint32_t k = Field<uint32_t>(r, 0);
  DeviceEvent e;
  uint32_t dev, stream_id;
  std::array<uint64_t, 5> key;
  switch (k) {
    case abi::kind::kKernel:
    case abi::kind::kConcurrentKernel: {
      namespace o = abi::kernel;
      e.type = Type::kKernel;
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      stream_id = Field<uint32_t>(r, o::kStreamId);
      uint32_t grid[3], block[3];
      std::memcpy(grid, static_cast<const char*>(r) + o::kGridX, 12);
      std::memcpy(block, static_cast<const char*>(r) + o::kBlockX, 12);
      key = {uint64_t{Field<uint16_t>(r, o::kRegistersPerThread)} << 32 | Field<uint32_t>(r, o::kStaticShared),
             uint64_t{Field<uint32_t>(r, o::kDynamicShared)} << 32 | grid[0], uint64_t{grid[1]} << 32 | grid[2],
             uint64_t{block[0]} << 32 | block[1], uint64_t{block[2]}};
      e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
      e.name = InternName(Field<const char*>(r, o::kName));
      e.graph_id = Field<uint32_t>(r, o::kGraphId);
      e.graph_node_id = Field<uint64_t>(r, o::kGraphNodeId);
      break;
    }
    case abi::kind::kMemcpy:
    case abi::kind::kMemcpy2: {
      namespace o = abi::memcpy;
      e.type = Type::kMemcpy;
      uint32_t copy_kind = Field<uint8_t>(r, o::kCopyKind), dst_device;
      uint64_t flags = uint64_t{Field<uint8_t>(r, o::kSrcKind)} << 16 | uint64_t{Field<uint8_t>(r, o::kDstKind)} << 8 |
                       ((Field<uint8_t>(r, o::kFlags) & abi::kMemcpyFlagAsync) ? 1 : 0);
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      stream_id = Field<uint32_t>(r, o::kStreamId);
      if (k == abi::kind::kMemcpy) {
        e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
        e.graph_id = Field<uint32_t>(r, o::kGraphId);
        e.graph_node_id = Field<uint64_t>(r, o::kGraphNodeId);
        dst_device = dev;
      } else {
        copy_kind = abi::kCopyPtoP;
        e.correlation_id = Field<uint32_t>(r, abi::memcpy_p2p::kCorrelationId);
        e.graph_id = 0;
        e.graph_node_id = 0;
        dst_device = Field<uint32_t>(r, abi::memcpy_p2p::kDstDeviceId);
      }
      e.name = copy_kind;
      key = {uint64_t{1} << 63 | Field<uint64_t>(r, o::kBytes), flags, dst_device, 0, 0};
      break;
    }
    case abi::kind::kMemset: {
      namespace o = abi::memset;
      e.type = Type::kMemset;
      e.start_ns = Field<uint64_t>(r, o::kStart);
      e.end_ns = Field<uint64_t>(r, o::kEnd);
      dev = Field<uint32_t>(r, o::kDeviceId);
      e.context = Field<uint32_t>(r, o::kContextId);
      stream_id = Field<uint32_t>(r, o::kStreamId);
      e.correlation_id = Field<uint32_t>(r, o::kCorrelationId);
      e.graph_id = Field<uint32_t>(r, o::kGraphId);
      e.graph_node_id = Field<uint64_t>(r, o::kGraphNodeId);
      e.name = static_cast<uint8_t>(Field<uint16_t>(r, o::kMemoryKind));
      key = {uint64_t{1} << 62 | Field<uint64_t>(r, o::kBytes),
             uint64_t{e.name} << 8 | ((Field<uint16_t>(r, o::kFlags) & abi::kMemsetFlagAsync) ? 1 : 0), 0, 0, 0};
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
      stream_id = Field<uint32_t>(r, o::kStreamId);
      e.name = 0;
      e.detail = 0;
      e.graph_node_id = 0;
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
  if (records_ >= limits_.max_activity_events) {
    ++device(dev).dropped["total device(activity) events reaches max (gpu_max_activity_api_events)"];
    return;
  }
  if (e.type != Type::kGraph) e.detail = InternDetail(key);
  Stream* st = stream(dev, stream_id);
  if (st == nullptr) {
    ++device(dev).dropped["over " + std::to_string(kMaxStreamsPerGpu) + " streams on the GPU (a corrupt buffer?)"];
    return;
  }
  DeviceEvent* slot = st->Append();
  if (slot == nullptr) {
    ++device(dev).dropped["no memory to keep it"];
    return;
  }
  ++records_;
  *slot = e;
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
  // Only threads with host events can have annotations open; the launches of
  // each such thread, grouped by thread with a stable partition (the
  // callback array is in call order per thread: sorted already, checked).
  std::unordered_set<int64_t> annotated;
  for (const model::Line& l : host.lines)
    if (!l.events.empty()) annotated.insert(l.id);
  launches.erase(std::remove_if(launches.begin(), launches.end(),
                                [&](const auto& a) { return annotated.count(a.second->tid) == 0; }),
                 launches.end());
  std::stable_sort(launches.begin(), launches.end(),
                   [](const auto& a, const auto& b) { return a.second->tid < b.second->tid; });
  for (size_t g = 0; g < launches.size();) {
    size_t h = g;
    while (h < launches.size() && launches[h].second->tid == launches[g].second->tid) ++h;
    auto by_start = [](const auto& a, const auto& b) { return a.first < b.first; };
    if (!std::is_sorted(launches.begin() + g, launches.begin() + h, by_start))
      std::sort(launches.begin() + g, launches.begin() + h, by_start);
    g = h;
  }
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

// Correlation id -> kernel name index, for the launch events' names: a
// vector over the ids' range when they are dense (they count up per
// process), else a hash map.
class CorrelationMap {
 public:
  explicit CorrelationMap(std::span<const ApiEvent> api) {
    if (api.empty()) return;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (const ApiEvent& a : api) lo = std::min(lo, a.correlation_id), hi = std::max(hi, a.correlation_id);
    on_ = true;
    if (uint64_t{hi} - lo < 4 * uint64_t{api.size()} + 1024) {
      lo_ = lo;
      dense_.assign(uint64_t{hi} - lo + 1, 0);
    }
  }
  void Set(uint32_t corr, uint32_t name) {
    if (!on_) return;
    if (!dense_.empty()) {
      if (corr >= lo_ && corr - lo_ < dense_.size()) dense_[corr - lo_] = name + 1;
    } else {
      sparse_.emplace(corr, name);
    }
  }
  // The name index, or -1.
  int64_t Get(uint32_t corr) const {
    if (!dense_.empty()) return corr >= lo_ && corr - lo_ < dense_.size() ? int64_t{dense_[corr - lo_]} - 1 : -1;
    auto it = sparse_.find(corr);
    return it == sparse_.end() ? -1 : int64_t{it->second};
  }

 private:
  bool on_ = false;
  uint32_t lo_ = 0;
  std::vector<uint32_t> dense_;
  std::unordered_map<uint32_t, uint32_t> sparse_;
};

// Graph node id -> the driver call that made it; a clone (a node of an
// instantiated graph, which is what runs) is followed to its source node.
class NodeApiMap {
 public:
  explicit NodeApiMap(const std::vector<GraphNodeEvent>& nodes) {
    for (const GraphNodeEvent& n : nodes) nodes_.emplace(n.node_id, &n);
  }
  const char* Find(uint64_t node) const {
    if (nodes_.empty()) return nullptr;
    const GraphNodeEvent* found = nullptr;
    for (int hops = 0; hops < 16 && node != 0; ++hops) {  // bounded: ids could loop in bad data
      auto it = nodes_.find(node);
      if (it == nodes_.end()) break;
      found = it->second;
      node = found->original_node_id;
    }
    return found ? (found->function ? found->function : "unknown") : nullptr;
  }

 private:
  std::unordered_map<uint64_t, const GraphNodeEvent*> nodes_;
};

const char* NodeTypeName(int32_t t) {
  static const char* const kNames[] = {"kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event",
                                       "event_record", "ext_semas_signal", "ext_semas_wait", "mem_alloc",
                                       "mem_free", "batch_mem_op", "conditional"};
  return t >= 0 && t < static_cast<int32_t>(sizeof kNames / sizeof kNames[0]) ? kNames[t] : "other";
}

}  // namespace

void GpuCollector::Export(const ClockMap& clock, model::Space* space) {
  // Launches first: their annotations, read before our events join the lines.
  std::vector<std::pair<int64_t, const ApiEvent*>> launches;
  for (const ApiEvent& a : api_) {
    if (a.end_ns == 0) continue;  // never returned
    ApiKind k = KindOfCallback(a.cbid);
    if (k == ApiKind::kLaunch || k == ApiKind::kGraphLaunch || k == ApiKind::kMemcpy || k == ApiKind::kMemset)
      launches.emplace_back(clock.ToPs(a.start_ns), &a);
  }
  std::unordered_map<uint32_t, Annotation> annotations =
      AnnotationsOfLaunches(space->plane(model::kHostPlaneName), launches, clock);
  // Correlation id -> kernel name index (to name the launch events), dense
  // when the ids are (they count up per process).
  CorrelationMap kernel_of(api_);
  NodeApiMap node_api(graph_nodes_);

  for (uint32_t dev = 0; dev < devices_.size(); ++dev) {
    Device& d = devices_[dev];
    if (d.streams.empty() && d.dropped.empty()) continue;
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
    // What repeats is formatted and interned once per plane: detail strings,
    // kernel names, event names of copies and memsets, contexts.
    std::vector<uint32_t> detail_ids(details_.size(), 0), name_ids(names_.size(), 0);
    uint32_t copy_ids[11] = {}, memset_ids[8] = {};
    uint32_t last_ctx = UINT32_MAX, last_ctx_id = 0;
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> annotation_ids;  // stack -> (tf_op, stack)
    const uint32_t k_node = p.intern_stat(model::kCudaGraphNodeIdStat);
    uint32_t k_node_api = 0;
    std::unordered_map<const char*, uint32_t> node_api_ids;
    char buf[256];
    auto detail = [&](uint32_t index) {
      uint32_t& id = detail_ids[index];
      if (id != 0) return id;
      const std::array<uint64_t, 5>& k = details_[index];
      int len;
      if (k[0] >> 63) {
        len = std::snprintf(buf, sizeof buf, "kind_src:%s kind_dst:%s size:%llu dest:%llu async:%llu",
                            MemoryKindName(static_cast<uint8_t>(k[1] >> 16)), MemoryKindName(static_cast<uint8_t>(k[1] >> 8)),
                            static_cast<unsigned long long>(k[0] & ~(uint64_t{1} << 63)),
                            static_cast<unsigned long long>(k[2]), static_cast<unsigned long long>(k[1] & 1));
      } else if (k[0] >> 62) {
        len = std::snprintf(buf, sizeof buf, "kind:%s num_bytes:%llu async:%llu", MemoryKindName(static_cast<uint8_t>(k[1] >> 8)),
                            static_cast<unsigned long long>(k[0] & ~(uint64_t{1} << 62)),
                            static_cast<unsigned long long>(k[1] & 1));
      } else {
        len = std::snprintf(buf, sizeof buf, "regs:%u static_shared:%u dynamic_shared:%u grid:%u,%u,%u block:%u,%u,%u",
                            static_cast<unsigned>(k[0] >> 32), static_cast<unsigned>(k[0]), static_cast<unsigned>(k[1] >> 32),
                            static_cast<unsigned>(k[1]), static_cast<unsigned>(k[2] >> 32), static_cast<unsigned>(k[2]),
                            static_cast<unsigned>(k[3] >> 32), static_cast<unsigned>(k[3]), static_cast<unsigned>(k[4]));
      }
      return id = p.intern_stat(std::string_view(buf, std::min<int>(len, sizeof buf - 1)));
    };
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
    static const char* const kTypeNames[] = {"Compute", "MemcpyH2D", "MemcpyD2H", "MemcpyD2D", "MemcpyOther", "Memset"};
    for (Stream& st : d.streams) {
      model::Line& line = p.lines.emplace_back();
      line.id = st.id;
      // Sized once from the count (growing by doubling costs more in page
      // faults and copies than converting).
      line.reserve_exact(st.count, st.count * (annotations.empty() ? 3 : 5));
      bool types[6] = {};
      bool sorted = true;  // checked as the events are added (no second pass)
      for (const Stream::Chunk& chunk : st.chunks) {
        for (const DeviceEvent* e = chunk.data.get(); e != chunk.data.get() + chunk.used; ++e) {
          __builtin_prefetch(e + 16);  // the loop waits on memory more than it computes
          if (e->start_ns == 0 || e->end_ns < e->start_ns) {
            ++d.dropped["no valid timestamps in the record"];
            continue;
          }
          int64_t start_ps = clock.ToPs(e->start_ns);
          if (start_ps < 0) start_ps = 0;  // queued just before the start: shown at the start
          int64_t duration_ps = static_cast<int64_t>(e->end_ns - e->start_ns) * 1000;
          if (!line.events.empty()) {
            const model::Event& prev = line.events.back();
            sorted = sorted && (prev.offset_ps < start_ps || (prev.offset_ps == start_ps && prev.duration_ps >= duration_ps));
          }
          model::Event& ev = line.events.emplace_back();
          ev.offset_ps = start_ps;
          ev.duration_ps = duration_ps;
          model::Stat stats[8];
          int n = 0;
          switch (e->type) {
            case Type::kKernel: {
              uint32_t& nid = name_ids[e->name];
              if (nid == 0) nid = p.intern_event(Demangle(names_[e->name]));
              ev.metadata_id = nid;
              kernel_of.Set(e->correlation_id, e->name);
              stats[n++] = ref(k_kernel, detail(e->detail));
              types[0] = true;
              break;
            }
            case Type::kMemcpy: {
              uint8_t ck = static_cast<uint8_t>(e->name);
              uint32_t& cid = copy_ids[ck < 11 ? ck : 0];
              if (cid == 0) cid = p.intern_event(CopyTypeName(ck));
              ev.metadata_id = cid;
              stats[n++] = ref(k_memcpy, detail(e->detail));
              types[ck == abi::kCopyHtoD ? 1 : ck == abi::kCopyDtoH ? 2 : ck == abi::kCopyDtoD ? 3 : 4] = true;
              break;
            }
            case Type::kMemset: {
              stats[n++] = ref(k_memset, detail(e->detail));
              uint32_t& mid = memset_ids[e->name < 8 ? e->name : 0];
              if (mid == 0 || e->name >= 8) {
                int len = std::snprintf(buf, sizeof buf, "Memset %u", e->name);
                mid = p.intern_event(std::string_view(buf, len));
              }
              ev.metadata_id = mid;
              types[5] = true;
              break;
            }
            case Type::kGraph: {
              int len = std::snprintf(buf, sizeof buf, "CudaGraphExec:%u", e->graph_id);
              ev.metadata_id = p.intern_event(std::string_view(buf, len));
              stats[n++] = uint(k_graph_exec, e->graph_id);
              types[0] = true;
              break;
            }
          }
          stats[n++] = uint(k_corr, e->correlation_id);
          if (e->context != last_ctx) {
            last_ctx = e->context;
            last_ctx_id = p.intern_stat("$$" + std::to_string(e->context));
          }
          stats[n++] = ref(k_ctx, last_ctx_id);
          if (e->graph_id != 0 && e->type != Type::kGraph) stats[n++] = uint(k_graph, e->graph_id);
          if (e->graph_node_id != 0) {
            stats[n++] = uint(k_node, e->graph_node_id);
            // The call that made the node (gpu_dump_graph_node_mapping).
            if (const char* api = node_api.Find(e->graph_node_id)) {
              if (k_node_api == 0) k_node_api = p.intern_stat(model::kCudaGraphNodeApiStat);
              auto [it, fresh] = node_api_ids.emplace(api, 0);
              if (fresh) it->second = p.intern_stat(api);
              stats[n++] = ref(k_node_api, it->second);
            }
          }
          if (!annotations.empty()) {
            auto ait = annotations.find(e->correlation_id);
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
          }
          line.add_stats(ev, std::span<const model::Stat>(stats, n));
        }
      }
      std::string names;
      for (int t = 0; t < 6; ++t)
        if (types[t]) names += (names.empty() ? "" : ",") + std::string(kTypeNames[t]);
      line.name = "Stream #" + std::to_string(st.id) + (names.empty() ? "" : "(" + names + ")");
      line.display_name = line.name;
      if (!sorted) line.sort_events();
    }
    std::vector<Stream>().swap(d.streams);
    d.stream_index.clear();
  }
  last_stream_ = nullptr;
  last_dev_ = UINT32_MAX;

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
  // The calling threads: each one's calls (counted first: its line is sized
  // once, as the device lines) and its line. Calls interleave among a few
  // threads: a scan while they are few, a map beyond.
  struct CallThread {
    uint32_t tid;
    size_t calls = 0, line = SIZE_MAX;
  };
  std::vector<CallThread> call_threads;
  std::unordered_map<uint32_t, size_t> call_thread_index;
  auto thread_of = [&](uint32_t tid) -> size_t {
    if (call_threads.size() <= 16) {
      for (size_t i = 0; i < call_threads.size(); ++i)
        if (call_threads[i].tid == tid) return i;
    } else if (auto it = call_thread_index.find(tid); it != call_thread_index.end()) {
      return it->second;
    }
    call_thread_index.emplace(tid, call_threads.size());
    call_threads.push_back({tid});
    return call_threads.size() - 1;
  };
  size_t counting = SIZE_MAX;
  for (const ApiEvent& a : api_) {
    if (a.end_ns == 0) continue;
    if (counting == SIZE_MAX || call_threads[counting].tid != a.tid) counting = thread_of(a.tid);
    ++call_threads[counting].calls;
  }
  size_t calls = 0;
  for (const ApiEvent& a : api_) {
    if (a.end_ns == 0) continue;
    ++calls;
    if (a.tid != last_tid) {
      CallThread& t = call_threads[thread_of(a.tid)];
      if (t.line == SIZE_MAX) {
        host.line_with_id(a.tid);
        for (size_t li = 0; li < host.lines.size(); ++li)
          if (host.lines[li].id == a.tid) t.line = li;
        host.lines[t.line].reserve_exact(t.calls, 3 * t.calls);
        touched.emplace(a.tid, t.line);
      }
      last_tid = a.tid;
      last_index = t.line;
    }
    model::Line* line = &host.lines[last_index];
    model::Event ev;
    ev.offset_ps = clock.ToPs(a.start_ns);
    ev.duration_ps = a.end_ns > a.start_ns ? static_cast<int64_t>(a.end_ns - a.start_ns) * 1000 : 0;
    ApiKind kind = KindOfCallback(a.cbid);
    const char* name = a.function ? a.function : "cuda";
    if (kind == ApiKind::kLaunch) {
      // Named by its kernel (XProf's Launch Stats skip names starting with "cu").
      if (int64_t k = kernel_of.Get(a.correlation_id); k >= 0 && names_[k] != nullptr) name = names_[k];
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
  // The graph nodes made (gpu_dump_graph_node_mapping): one 1 ns event per
  // node on the thread that made it, named after the call that made it.
  if (!graph_nodes_.empty()) {
    const uint32_t h_graph = host.intern_stat(model::kCudaGraphIdStat), h_node = host.intern_stat(model::kCudaGraphNodeIdStat),
                   h_orig = host.intern_stat(model::kCudaGraphOrigNodeIdStat),
                   h_type = host.intern_stat(model::kCudaGraphNodeTypeStat);
    for (const GraphNodeEvent& g : graph_nodes_) {
      auto [tit, fresh] = touched.emplace(g.tid, 0);
      if (fresh) {
        host.line_with_id(g.tid);
        for (size_t li = 0; li < host.lines.size(); ++li)
          if (host.lines[li].id == g.tid) tit->second = li;
      }
      model::Event ev;
      ev.offset_ps = clock.ToPs(g.time_ns);
      ev.duration_ps = 1000;
      ev.metadata_id = host.intern_event(std::string(model::kCudaGraphNodeMapPrefix) + (g.function ? g.function : "unknown"));
      model::Stat stats[4];
      int n = 0;
      stats[n++] = uint(h_graph, g.graph_id);
      stats[n++] = uint(h_node, g.node_id);
      if (g.original_node_id != 0) stats[n++] = uint(h_orig, g.original_node_id);
      stats[n] = host.ref_stat(model::kCudaGraphNodeTypeStat, NodeTypeName(g.node_type));
      stats[n++].metadata_id = h_type;
      model::Line& l = host.lines[tit->second];
      l.events.push_back(ev);
      l.add_stats(l.events.back(), std::span<const model::Stat>(stats, n));
    }
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
    space->warnings.push_back("Detected GPU events dropped: collected " + std::to_string(calls) +
                              " driver events and " + std::to_string(records_) + " device events." + warning);
    for (uint32_t dev = 0; dev < devices_.size(); ++dev) {
      uint64_t n = 0;
      for (const auto& [reason, count] : devices_[dev].dropped) n += count;
      if (n == 0) continue;
      model::Plane& p = space->plane(std::string(model::kGpuPlanePrefix) + std::to_string(dev));
      p.stats.push_back(p.uint_stat(model::kDroppedEventsStat, n));
    }
  }
  api_calls_ = calls;
  api_ = {};
  std::vector<GraphNodeEvent>().swap(graph_nodes_);
}

}  // namespace spyglass::gpu
