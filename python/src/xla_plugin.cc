#include "xla_plugin.h"

#include <nanobind/stl/string.h>

#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "export/xplane/xplane_writer.h"
#include "gpu/gpu_options.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "model/xspace_import.h"
#include "sampling/cpu_model.h"
#include "server/options_convert.h"
#include "server/merge.h"
#include "session/env_start.h"
#include "session/flight_recorder.h"
#include "session/session.h"
#include "session/tracer.h"

namespace nb = nanobind;

namespace spyglass::python {
namespace {

// --- XLA's profiler plugin C ABI ---------------------------------------------
// Declared here from the facts of xla/backends/profiler/plugin/profiler_c_api.h
// (PLUGIN_PROFILER_VERSION 1) and xla/pjrt/c/pjrt_c_api_profiler_extension.h
// (PJRT_API_PROFILER_EXTENSION_VERSION 1): every struct starts with its size;
// the Api table is checked by XLA for an exact size (10 pointer-sized fields).
// XLA does not fill struct_size in the argument structs: we never read it.
extern "C" {
struct SgPluginProfiler;  // PLUGIN_Profiler: ours, opaque to XLA
struct SgPluginError;     // PLUGIN_Profiler_Error: ours, opaque to XLA

struct SgErrorDestroyArgs {
  size_t struct_size;
  void* priv;
  SgPluginError* error;
};
struct SgErrorMessageArgs {
  size_t struct_size;
  void* priv;
  const SgPluginError* error;
  const char* message;  // out, lives as long as `error`
  size_t message_size;  // out
};
struct SgErrorGetCodeArgs {
  size_t struct_size;
  void* priv;
  const SgPluginError* error;
  int code;  // out: an absl::StatusCode
};
struct SgCreateArgs {
  size_t struct_size;
  const char* options;  // a serialized ProfileOptions in the newest XLA; unused
  size_t options_size;
  SgPluginProfiler* profiler;  // out
};
struct SgProfilerArgs {  // destroy, start and stop take the same fields
  size_t struct_size;
  SgPluginProfiler* profiler;
};
struct SgCollectDataArgs {
  size_t struct_size;
  SgPluginProfiler* profiler;
  uint8_t* buffer;              // null: ask the size; else receives the bytes
  size_t buffer_size_in_bytes;  // out: a serialized XSpace's size
};

struct SgProfilerApi {
  size_t struct_size;
  void* priv;
  void (*error_destroy)(SgErrorDestroyArgs*);
  void (*error_message)(SgErrorMessageArgs*);
  SgPluginError* (*error_get_code)(SgErrorGetCodeArgs*);
  SgPluginError* (*create)(SgCreateArgs*);
  SgPluginError* (*destroy)(SgProfilerArgs*);
  SgPluginError* (*start)(SgProfilerArgs*);
  SgPluginError* (*stop)(SgProfilerArgs*);
  SgPluginError* (*collect_data)(SgCollectDataArgs*);
};
static_assert(sizeof(SgProfilerApi) == 10 * sizeof(void*));

// PJRT_Extension_Base and PJRT_Profiler_Extension: a list of typed records
// hanging off the PJRT_Api, where XLA looks for type 1 (Profiler).
struct SgExtensionBase {
  size_t struct_size;
  int32_t type;  // PJRT_Extension_Type, a C enum
  SgExtensionBase* next;
};
struct SgProfilerExtension {
  SgExtensionBase base;
  SgProfilerApi* profiler_api;
  int64_t traceme_context_id;  // used only as an args extension
};
// The head of PJRT_Api: XLA's register_plugin_profiler reads extension_start
// only; the version and function table of a real PJRT plugin stay zero.
struct SgPjrtApiHead {
  size_t struct_size;
  SgExtensionBase* extension_start;
  struct {
    size_t struct_size;
    SgExtensionBase* extension_start;
    int major_version;
    int minor_version;
  } version;
};
}  // extern "C"

constexpr int32_t kPjrtExtensionTypeProfiler = 1;
constexpr int kAbslInternal = 13;

struct SgPluginErrorImpl {
  std::string message;
  int code = kAbslInternal;
};

// Set by Python (spyglass.jax.enable/disable): a disabled plugin records nothing.
std::atomic<bool> g_enabled{false};
// While the plugin starts its own session: the XLA-session tracer stays out
// of it (that session belongs to XLA already).
std::atomic<bool> g_plugin_starting{false};
std::atomic<uint64_t> g_owned_sessions{0}, g_passive_sessions{0}, g_bytes_supplied{0};

// The plane XLA merges into its /host:CPU by thread id, after every tracer's
// data is in (as it does for its own Python tracer's plane).
constexpr char kPluginHostPlaneName[] = "/host:python-tracer";

// XLA names a host line by std::hash<std::thread::id> of its thread (jaxlib
// 0.10: TraceMe's thread id), we by the kernel's tid. Python's threads tell
// both (threading's ident is the pthread_t, native_id the tid): the map
// below, filled at every start and stop, joins the two.
std::mutex& thread_map_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<int64_t, int64_t>& tid_to_xla_id() {
  static auto* m = new std::unordered_map<int64_t, int64_t>;
  return *m;
}

int64_t XlaThreadId(uint64_t pthread) {
  std::thread::id id;
  static_assert(sizeof(id) == sizeof(pthread_t));
  pthread_t p = static_cast<pthread_t>(pthread);
  std::memcpy(static_cast<void*>(&id), &p, sizeof p);
  return static_cast<int64_t>(std::hash<std::thread::id>{}(id));
}

// Learns the Python threads alive now (takes the GIL; never while a caller
// of ours may hold a lock the GIL's holder waits for). From the interpreter's
// thread states where they hold both ids (3.11+): no Python code runs, so
// nothing of it shows in the trace being recorded.
void LearnPythonThreads() {
  if (!Py_IsInitialized()) return;
  nb::gil_scoped_acquire gil;
#if PY_VERSION_HEX >= 0x030B0000
  std::lock_guard<std::mutex> lock(thread_map_mu());
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Main()); t != nullptr;
       t = PyThreadState_Next(t)) {
    if (t->native_thread_id != 0 && t->thread_id != 0)
      tid_to_xla_id()[static_cast<int64_t>(t->native_thread_id)] = XlaThreadId(t->thread_id);
  }
#else
  try {
    nb::object threads = nb::module_::import_("threading").attr("enumerate")();
    std::lock_guard<std::mutex> lock(thread_map_mu());
    for (nb::handle t : threads) {
      nb::object native = t.attr("native_id"), ident = t.attr("ident");
      if (native.is_none() || ident.is_none()) continue;
      tid_to_xla_id()[nb::cast<int64_t>(native)] = XlaThreadId(nb::cast<uint64_t>(ident));
    }
  } catch (nb::python_error&) {
    // A thread map is a nicety: lines stay apart without it.
  }
#endif
}

// Our host plane's lines renamed to XLA's ids (direction: ours into XLA's).
void ToXlaLineIds(model::Plane* plane) {
  std::lock_guard<std::mutex> lock(thread_map_mu());
  for (model::Line& l : plane->lines) {
    auto it = tid_to_xla_id().find(l.id);
    if (it != tid_to_xla_id().end()) l.id = it->second;
  }
}

// XLA's host lines renamed to our tids (direction: XLA's into ours).
void FromXlaLineIds(model::Plane* plane) {
  std::unordered_map<int64_t, int64_t> back;
  {
    std::lock_guard<std::mutex> lock(thread_map_mu());
    for (const auto& [tid, xla] : tid_to_xla_id()) back[xla] = tid;
  }
  for (model::Line& l : plane->lines) {
    auto it = back.find(l.id);
    if (it != back.end()) l.id = it->second;
  }
}

struct PluginProfiler {
  std::unique_ptr<session::Session> session;  // null when passive or disabled
  // The advanced_configuration of the options XLA handed to create (newest
  // XLA: jax.profiler's profiler_options), e.g. spyglass_cpu_sample_hz.
  std::map<std::string, profiler::AdvancedValue> advanced;

  std::string bytes;  // the serialized XSpace we supply, kept until destroy
};

SgPluginError* MakeError(std::string message) {
  auto* e = new SgPluginErrorImpl{std::move(message), kAbslInternal};
  return reinterpret_cast<SgPluginError*>(e);
}
PluginProfiler* Of(SgPluginProfiler* p) { return reinterpret_cast<PluginProfiler*>(p); }

extern "C" void PluginErrorDestroy(SgErrorDestroyArgs* args) {
  delete reinterpret_cast<SgPluginErrorImpl*>(args->error);
}
extern "C" void PluginErrorMessage(SgErrorMessageArgs* args) {
  const auto* e = reinterpret_cast<const SgPluginErrorImpl*>(args->error);
  args->message = e->message.data();
  args->message_size = e->message.size();
}
extern "C" SgPluginError* PluginErrorGetCode(SgErrorGetCodeArgs* args) {
  args->code = reinterpret_cast<const SgPluginErrorImpl*>(args->error)->code;
  return nullptr;
}
extern "C" SgPluginError* PluginCreate(SgCreateArgs* args) {
  auto* p = new PluginProfiler;
  tensorflow::ProfileOptions xla_options;
  if (args->options != nullptr && args->options_size > 0 &&
      xla_options.ParseFromArray(args->options, static_cast<int>(args->options_size))) {
    for (auto& [key, value] : server::FromProto(xla_options).advanced_configuration)
      if (key.rfind("spyglass_", 0) == 0) p->advanced.insert_or_assign(key, value);  // ours; XLA's own keys stay XLA's
  }
  args->profiler = reinterpret_cast<SgPluginProfiler*>(p);
  return nullptr;
}
extern "C" SgPluginError* PluginDestroy(SgProfilerArgs* args) {
  delete Of(args->profiler);  // a session still running stops, its data dropped
  return nullptr;
}

// Our tracers for an XLA session: annotations (C++ and Python), memory
// counters, and what SPYGLASS_OPTIONS and the spyglass_* keys of XLA's
// options turn on (the CPU sampler: spyglass_cpu_sample_hz). XLA's own
// Python tracer records the Python calls and XLA's CUPTI tracer the device:
// ours stay off so that nothing is recorded twice.
profiler::ProfileOptions PluginSessionOptions(const PluginProfiler& p) {
  session::StartSettings env;
  auto only_options = [](const char* name) -> const char* {
    return std::strcmp(name, session::kEnvOptions) == 0 ? std::getenv(name) : nullptr;
  };
  // A bad SPYGLASS_OPTIONS was reported at import; XLA's session runs on with the defaults.
  profiler::ProfileOptions o = session::ParseStartSettings(only_options, &env).ok() ? env.options
                                                                                   : profiler::ProfileOptions{};
  for (const auto& [key, value] : p.advanced) o.advanced_configuration.insert_or_assign(key, value);
  if (!profiler::ValidateOptions(o).ok()) o.advanced_configuration.clear();
  o.python_tracer_level = 0;
  o.device_tracer_level = 0;
  return o;
}

extern "C" SgPluginError* PluginStart(SgProfilerArgs* args) {
  PluginProfiler* p = Of(args->profiler);
  // Passive when disabled, or when a Spyglass session runs: that one drives
  // this XLA session and merges XLA's planes itself.
  if (p == nullptr || !g_enabled.load() || session::SessionActive()) {
    g_passive_sessions.fetch_add(1);
    return nullptr;
  }
  LearnPythonThreads();
  g_plugin_starting.store(true);
  Status s = session::Session::Create(PluginSessionOptions(*p), "Profile has already been started.", &p->session);
  g_plugin_starting.store(false);
  if (!s.ok()) {  // lost a race with a Spyglass start: passive then
    g_passive_sessions.fetch_add(1);
    return nullptr;
  }
  g_owned_sessions.fetch_add(1);
  return nullptr;
}

extern "C" SgPluginError* PluginStop(SgProfilerArgs* args) {
  PluginProfiler* p = Of(args->profiler);
  if (p == nullptr || p->session == nullptr) return nullptr;
  LearnPythonThreads();
  model::Space space;
  session::SessionSummary summary;
  const uint64_t our_start = p->session->start_wall_ns();
  Status s = p->session->Stop(&space, &summary);
  p->session.reset();
  if (!s.ok() && space.planes.empty()) return MakeError("spyglass: " + s.ToString());
  // XLA writes its own Task Environment and /host:metadata planes.
  model::Space out;
  for (model::Plane& plane : space.planes) {
    if (plane.name == model::kTaskEnvPlaneName || plane.name == model::kMetadataPlaneName) continue;
    if (plane.name == model::kHostPlaneName) {
      if (plane.lines.empty()) continue;
      // XLA merges this plane into its /host:CPU by event name: the CPU
      // samples' stacks go by node name too.
      sampling::MakeCpuStacksPortable(&plane);
      plane.name = kPluginHostPlaneName;
      ToXlaLineIds(&plane);
    }
    // Ours count from our start; XLA's are Unix ns (CLOCK_REALTIME) until
    // its post-processing makes all of them relative to its own start.
    for (model::Line& l : plane.lines) l.timestamp_ns += static_cast<int64_t>(our_start);
    out.planes.push_back(std::move(plane));
  }
  out.errors = std::move(space.errors);
  out.warnings = std::move(space.warnings);
  if (!out.planes.empty()) p->bytes = exporter::SerializeXSpace(out);
  g_bytes_supplied.fetch_add(p->bytes.size());
  return nullptr;
}

// Two protocols meet here. XLA of PLUGIN_PROFILER_VERSION 1 calls once with
// a null buffer and parses the buffer we return (ours until destroy); older
// XLA calls a second time with its own buffer of the size we gave.
extern "C" SgPluginError* PluginCollectData(SgCollectDataArgs* args) {
  PluginProfiler* p = Of(args->profiler);
  if (p == nullptr || p->bytes.empty()) {
    args->buffer_size_in_bytes = 0;
    return nullptr;
  }
  if (args->buffer != nullptr) {
    std::memcpy(args->buffer, p->bytes.data(), p->bytes.size());
  } else {
    args->buffer = reinterpret_cast<uint8_t*>(p->bytes.data());
  }
  args->buffer_size_in_bytes = p->bytes.size();
  return nullptr;
}

SgProfilerApi g_profiler_api = {
    sizeof(SgProfilerApi), nullptr,     PluginErrorDestroy, PluginErrorMessage, PluginErrorGetCode,
    PluginCreate,          PluginDestroy, PluginStart,      PluginStop,         PluginCollectData,
};
SgProfilerExtension g_profiler_extension = {
    {sizeof(SgProfilerExtension), kPjrtExtensionTypeProfiler, nullptr}, &g_profiler_api, 0};
SgPjrtApiHead g_pjrt_api_head = {
    sizeof(SgPjrtApiHead), &g_profiler_extension.base, {sizeof(g_pjrt_api_head.version), nullptr, 0, 0}};

// --- XLA's planes in a Spyglass session ---------------------------------------

// Moves `src`'s lines into `dst`, a plane of the same meaning: names
// interned again, stats remapped, lines of the same id (the same thread)
// joined on one time base (absolute ns).
void MergePlaneInto(model::Plane& src, model::Plane* dst) {
  std::vector<uint32_t> event_ids(src.event_metadata().size(), 0), stat_ids(src.stat_metadata().size(), 0);
  for (size_t i = 1; i < src.event_metadata().size(); ++i) {
    const model::EventMetadata& m = src.event_metadata()[i];
    event_ids[i] = dst->intern_event(m.name);
    model::EventMetadata& d = dst->event_metadata_at(event_ids[i]);
    if (d.display_name.empty()) d.display_name = m.display_name;
  }
  for (size_t i = 1; i < src.stat_metadata().size(); ++i) stat_ids[i] = dst->intern_stat(src.stat_metadata()[i].name);
  const uint64_t string_offset = dst->adopt_strings(src);
  auto remap = [&](model::Stat& s) {
    if (s.metadata_id < stat_ids.size()) s.metadata_id = stat_ids[s.metadata_id];
    if (s.kind == model::StatKind::kRef && s.ref < stat_ids.size()) s.ref = stat_ids[s.ref];
    if (s.kind == model::StatKind::kString || s.kind == model::StatKind::kBytes) s.str_index += string_offset;
  };
  for (model::Stat s : src.stats) {
    remap(s);
    bool have = false;
    for (const model::Stat& d : dst->stats) have = have || d.metadata_id == s.metadata_id;
    if (!have) dst->stats.push_back(s);
  }
  for (model::Line& line : src.lines) {
    for (model::Event& e : line.events)
      if (e.metadata_id < event_ids.size()) e.metadata_id = event_ids[e.metadata_id];
    for (model::Stat& s : line.mutable_stats()) remap(s);
    model::Line& d = dst->line_with_id(line.id);
    if (d.events.empty()) {
      if (d.name.empty()) {
        d.name = line.name;
        d.display_name = line.display_name;
        d.display_id = line.display_id;
      }
      d.timestamp_ns = line.timestamp_ns;
    }
    // One time base: both lines' events as offsets from the earlier timestamp.
    int64_t base = std::min(d.timestamp_ns, line.timestamp_ns);
    for (model::Event& e : d.events) e.offset_ps += (d.timestamp_ns - base) * 1000;
    for (model::Event& e : line.events) e.offset_ps += (line.timestamp_ns - base) * 1000;
    d.timestamp_ns = base;
    d.append(std::move(line));
    d.sort_events();
  }
}

// XLA's space (its post-processed XSpace) into ours: its /host:CPU joined to
// ours thread by thread, its other planes added (its Task Environment left
// out: ours holds the session's bounds).
void MergeXlaSpace(model::Space&& xla, model::Space* ours) {
  for (model::Plane& plane : xla.planes) {
    if (plane.name == model::kTaskEnvPlaneName) continue;
    if (model::Plane* same = ours->find_plane(plane.name)) {
      MergePlaneInto(plane, same);
    } else {
      ours->planes.push_back(std::move(plane));
    }
  }
  for (std::string& e : xla.errors) ours->errors.push_back("xla: " + e);
  for (std::string& w : xla.warnings) ours->warnings.push_back("xla: " + w);
}

// Python callbacks (spyglass.jax): start(options dict) -> handle or None,
// stop(handle) -> the XSpace bytes of XLA's session.
struct XlaDriver {
  nb::object start, stop;  // touched under the GIL
};
XlaDriver& driver() {
  static auto* d = new XlaDriver;  // never destroyed: Python objects outlive no interpreter
  return *d;
}

// After the memory timeline: the host plane has our lines when XLA's join them.
constexpr int kRankXlaSession = 900;

class XlaSessionTracer : public session::Tracer {
 public:
  explicit XlaSessionTracer(const profiler::ProfileOptions& o) : options_(o) {}
  ~XlaSessionTracer() override {
    if (handle_.is_valid() && Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      handle_.reset();
    } else {
      (void)handle_.release();  // no interpreter left to tell
    }
  }
  Status Start() override {
    if (!Py_IsInitialized()) return Status::Ok();
    LearnPythonThreads();
    nb::gil_scoped_acquire gil;
    try {
      nb::object start = driver().start;
      if (!start.is_valid() || start.is_none()) return Status::Ok();
      nb::dict o;
      o["host_tracer_level"] = options_.host_tracer_level;
      o["device_tracer_level"] = options_.device_tracer_level;
      o["enable_hlo_proto"] = options_.enable_hlo_proto;
      o["include_dataset_ops"] = options_.include_dataset_ops;
      nb::object h = start(o);
      if (!h.is_none()) handle_ = std::move(h);
      if (handle_.is_valid()) xla_created_wall_ns_ = nb::cast<uint64_t>(handle_.attr("created_wall_ns"));
    } catch (nb::python_error& e) {
      std::string what = e.what();
      return InternalError("cannot start XLA's profiler session: " + what);
    }
    return Status::Ok();
  }
  Status Stop() override {
    if (!handle_.is_valid() || !Py_IsInitialized()) return Status::Ok();
    LearnPythonThreads();
    nb::gil_scoped_acquire gil;
    try {
      nb::object r = driver().stop(handle_);
      xla_created_wall_ns_ = nb::cast<uint64_t>(handle_.attr("created_wall_ns"));
      if (nb::isinstance<nb::bytes>(r)) {
        nb::bytes b = nb::borrow<nb::bytes>(r);
        xla_bytes_.assign(b.c_str(), b.size());
      }
    } catch (nb::python_error& e) {
      handle_.reset();
      std::string what = e.what();
      return InternalError("cannot stop XLA's profiler session: " + what);
    }
    handle_.reset();
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    if (xla_bytes_.empty()) return Status::Ok();
    model::Space xla;
    Status s = model::ImportXSpaceBytes(xla_bytes_, &xla);
    xla_bytes_ = {};
    if (!s.ok()) return s;
    if (model::Plane* host = xla.find_plane(model::kHostPlaneName)) FromXlaLineIds(host);
    // XLA's times count from XLA's start (its Task Environment says when),
    // ours from ours.
    uint64_t xla_start = server::ProfileStartTime(xla);
    if (xla_start == 0) xla_start = xla_created_wall_ns_;
    const int64_t shift = static_cast<int64_t>(xla_start) - static_cast<int64_t>(zero().wall_ns);
    for (model::Plane& plane : xla.planes)
      for (model::Line& l : plane.lines) l.timestamp_ns += shift;
    MergeXlaSpace(std::move(xla), space);
    return Status::Ok();
  }

 private:
  profiler::ProfileOptions options_;
  nb::object handle_;
  std::string xla_bytes_;
  uint64_t xla_created_wall_ns_ = 0;  // XLA's session's zero (about: its creation)
};

std::unique_ptr<session::Tracer> MakeXlaSessionTracer(const profiler::ProfileOptions& options) {
  if (g_plugin_starting.load()) return nullptr;  // the plugin's session is XLA's own
  // A flight recorder runs for hours in a bounded ring; XLA's session keeps
  // every event until its stop: not one for the other.
  session::FlightRecorderConfig ring;
  if (session::ResolveFlightRecorder(options, &ring).ok() && ring.seconds > 0) return nullptr;
  return std::make_unique<XlaSessionTracer>(options);
}

// jaxlib's native module is mapped (jax was imported): found without the
// GIL, from the loader's list (jaxlib/_jax.so; xla_extension.so before 0.5).
bool JaxlibLoaded() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, size_t, void*) {
               std::string_view path = info->dlpi_name != nullptr ? info->dlpi_name : "";
               size_t slash = path.rfind('/');
               std::string_view dir = slash == std::string_view::npos ? "" : path.substr(0, slash);
               std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
               const bool in_jaxlib = dir.size() >= 7 && dir.substr(dir.size() - 7) == "/jaxlib";
               return in_jaxlib && (base.rfind("_jax.", 0) == 0 || base.rfind("xla_extension.", 0) == 0) ? 1 : 0;
             },
             nullptr) != 0;
}

// The device's tracer in a JAX process: XLA's, in the XLA session that ours
// drives (docs/jax-plugin.md, "Which tracer traces the device"). Asked by the
// GPU tracer's factory at each session's creation (remote captures and
// `run --trace` too, whose options are not the Python package's). Not in a
// flight recorder's session, which drives no XLA session (MakeXlaSessionTracer).
std::string XlaTracesTheDevice(const profiler::ProfileOptions& options) {
  if (g_plugin_starting.load()) return "";  // the plugin's own session has no device tracer
  session::FlightRecorderConfig ring;
  if (session::ResolveFlightRecorder(options, &ring).ok() && ring.seconds > 0) return "";
  const char* off = std::getenv("SPYGLASS_JAX_SESSION");
  if (off != nullptr && std::strcmp(off, "0") == 0) return "";  // no XLA session: ours traces it
  return JaxlibLoaded() ? "XLA's device tracer (jax)" : "";
}

}  // namespace

void BindXlaPlugin(nb::module_& m) {
  // Whether our GPU tracer holds CUPTI: an XLA session started later in the
  // same session (jax imported after it began) leaves the device to it.
  m.def("_gpu_tracer_active", []() { return gpu::GpuTracerActive(); });
  m.def("_xla_plugin_capsule", []() {
    // What jaxlib's register_plugin_profiler takes: a PJRT_Api in a "pjrt_c_api" capsule.
    return nb::capsule(&g_pjrt_api_head, "pjrt_c_api");
  });
  m.def("_profile_options_copy", [](const profiler::ProfileOptions& o) { return o; });
  m.def("_xla_plugin_set_enabled", [](bool on) { g_enabled.store(on); });
  m.def("_xla_plugin_enabled", []() { return g_enabled.load(); });
  m.def("_xla_plugin_stats", []() {
    nb::dict d;
    d["owned_sessions"] = g_owned_sessions.load();
    d["passive_sessions"] = g_passive_sessions.load();
    d["bytes_supplied"] = g_bytes_supplied.load();
    return d;
  });
  // The XLA-session tracer: registered once; its callbacks decide per session.
  m.def("_set_xla_session_driver", [](nb::object start, nb::object stop) {
    {
      XlaDriver& d = driver();
      d.start = std::move(start);
      d.stop = std::move(stop);
    }
    gpu::SetDeviceOwnerProbe(&XlaTracesTheDevice);
    session::RegisterTracer("xla_session", kRankXlaSession, MakeXlaSessionTracer);
  });
}

}  // namespace spyglass::python
