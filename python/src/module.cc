// spyglass._spyglass: the binding of the C++ core. The Python-facing API with
// JAX's names lives in python/spyglass/profiler.py; the annotation types are
// raw CPython types (annotation_type.cc) and the Python tracer is a
// session::Tracer (python_tracer.cc).
//
// Errors: a Status becomes an exception at this boundary:
//   FailedPrecondition ("Profile has already been started..." / "No profile
//   started"), Internal, Unavailable, ...  -> RuntimeError (as JAX)
//   InvalidArgument (bad options)          -> spyglass.InvalidArgumentError,
//                                             a ValueError
// Every call into the core that may take the core's locks releases the GIL
// first (the Python tracer's start/stop take the GIL under those locks).
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "analysis/diff.h"
#include "analysis/summary.h"
#include "annotation_type.h"
#include "errors.h"
#include "profile_data.h"
#include "session/profiler_api_internal.h"
#include "sinks/perfetto_link.h"
#include "python_memory.h"
#include "python_tracer.h"
#include "server_memory.h"
#include "xla_plugin.h"
#include "memory/run_summary.h"
#include "session/env_start.h"
#include "spyglass/profiler.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace spyglass::python {
namespace {

nb::dict AdvancedToDict(const profiler::ProfileOptions& o) {
  nb::dict d;
  for (const auto& [k, v] : o.advanced_configuration) {
    if (v.is_bool()) d[nb::str(k.c_str())] = nb::bool_(v.as_bool());
    else if (v.is_int()) d[nb::str(k.c_str())] = nb::int_(v.as_int());
    else d[nb::str(k.c_str())] = nb::str(v.as_string().c_str());
  }
  return d;
}

void AdvancedFromDict(profiler::ProfileOptions& o, nb::handle h) {
  if (!PyDict_Check(h.ptr())) {
    PyErr_Format(PyExc_TypeError, "advanced_configuration must be a dict, not %.100s", Py_TYPE(h.ptr())->tp_name);
    throw nb::python_error();
  }
  std::map<std::string, profiler::AdvancedValue> out;
  for (auto [k, v] : nb::borrow<nb::dict>(h)) {
    if (!PyUnicode_Check(k.ptr())) {
      PyErr_Format(PyExc_TypeError, "advanced_configuration keys must be str, not %.100s", Py_TYPE(k.ptr())->tp_name);
      throw nb::python_error();
    }
    std::string key = nb::cast<std::string>(k);
    if (PyBool_Check(v.ptr())) {
      out.insert_or_assign(key, profiler::AdvancedValue(v.ptr() == Py_True));
    } else if (PyLong_Check(v.ptr())) {
      int overflow = 0;
      long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
      if (overflow != 0) {
        Raise(InvalidArgumentError("advanced_configuration['" + key + "']: " +
                                   nb::cast<std::string>(nb::str(v)) + " does not fit in int64"));
      }
      out.insert_or_assign(key, profiler::AdvancedValue(static_cast<int64_t>(x)));
    } else if (PyUnicode_Check(v.ptr())) {
      out.insert_or_assign(key, profiler::AdvancedValue(nb::cast<std::string>(v)));
    } else {
      PyErr_Format(PyExc_TypeError, "advanced_configuration['%s'] must be a bool, int or str, not %.100s",
                   key.c_str(), Py_TYPE(v.ptr())->tp_name);
      throw nb::python_error();
    }
  }
  o.advanced_configuration = std::move(out);
}

// The Perfetto link's cancellation hook: Ctrl-C (or any signal whose Python
// handler raises) ends the wait, and the exception is raised after it.
bool CtrlCPressed() {
  nb::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

void StartTrace(const std::string& log_dir, bool create_perfetto_link, bool create_perfetto_trace,
                const profiler::ProfileOptions* options, int perfetto_link_timeout_s) {
  profiler::TraceOptions t;
  t.create_perfetto_link = create_perfetto_link;
  t.create_perfetto_trace = create_perfetto_trace || create_perfetto_link;
  if (options != nullptr) t.profiler_options = *options;
  t.perfetto_link_timeout_s = perfetto_link_timeout_s;
  t.perfetto_link_cancelled = CtrlCPressed;
  Status s;
  {
    nb::gil_scoped_release release;
    s = profiler::start_trace(log_dir, t);
  }
  Check(s);
}

void StopTrace() {
  Status s;
  {
    nb::gil_scoped_release release;
    s = profiler::stop_trace();
  }
  if (PyErr_Occurred()) throw nb::python_error();  // KeyboardInterrupt during the Perfetto link's wait
  Check(s);
}

nb::dict LastTraceFiles() {
  profiler::TraceFiles f;
  {
    nb::gil_scoped_release release;
    f = profiler::last_trace_files();
  }
  nb::dict d;
  d["run_dir"] = f.run_dir;
  d["xplane_path"] = f.xplane_path;
  d["trace_json_path"] = f.trace_json_path;
  d["perfetto_trace_path"] = f.perfetto_trace_path;
  d["perfetto_trace_json_path"] = f.perfetto_trace_json_path;
  return d;
}

nb::dict LastTraceStats() {
  profiler::TraceStats st;
  {
    nb::gil_scoped_release release;
    st = profiler::last_trace_stats();
  }
  nb::dict d;
  d["events"] = st.events;
  d["dropped_events"] = st.dropped_events;
  d["incomplete_events"] = st.incomplete_events;
  d["threads"] = st.threads;
  return d;
}

// The SPYGLASS_* settings (session/env_start.h), from the environment
// (`settings` None) or from `python -m spyglass run`'s flags (a dict of the
// same names), started in this process with the Python tracer on unless
// SPYGLASS_OPTIONS says python_tracer_level=0. Bad values raise
// InvalidArgumentError with the one-line message; nothing is started then.
// `settings` (a dict of SPYGLASS_* names, None: the environment) parsed;
// InvalidArgumentError for a bad value.
session::StartSettings ParseSettings(nb::handle settings) {
  session::StartSettings s;
  s.options.python_tracer_level = 1;  // as the package's ProfileOptions (JAX)
  std::map<std::string, std::string> given;
  if (!settings.is_none()) given = nb::cast<std::map<std::string, std::string>>(settings);
  auto get = [&](const char* name) -> const char* {
    if (settings.is_none()) return std::getenv(name);
    auto it = given.find(name);
    return it == given.end() ? nullptr : it->second.c_str();
  };
  Check(session::ParseStartSettings(get, &s));
  return s;
}

nb::dict StartFromSettings(nb::handle settings) {
  session::StartSettings s = ParseSettings(settings);
  session::Started started;
  {
    nb::gil_scoped_release release;  // the Python tracer's start takes the GIL under the core's locks
    started = session::StartFromSettings(s);
  }
  nb::dict d;
  d["trace"] = started.trace;
  d["flight_recorder"] = started.flight_recorder;
  d["server_port"] = started.server_port;
  return d;
}

void StopStarted() {
  nb::gil_scoped_release release;
  session::StopStarted();
}

}  // namespace
}  // namespace spyglass::python

NB_MODULE(_spyglass, m) {
  using namespace spyglass;
  using namespace spyglass::python;
  m.doc() = "Spyglass's C++ core (use spyglass.profiler)";

  AddErrorTypes(m);

  if (!AddAnnotationTypes(m.ptr())) throw nb::python_error();
  if (!RegisterPythonTracer(m.ptr())) throw nb::python_error();
  BindServerAndMemory(m);
  BindXlaPlugin(m);
  if (!AddPythonMemory(m.ptr())) throw nb::python_error();

  nb::class_<profiler::ProfileOptions>(m, "ProfileOptions",
                                       "Options of a profiling session (jax.profiler.ProfileOptions's fields).")
      .def(nb::init<>())
      .def_rw("include_dataset_ops", &profiler::ProfileOptions::include_dataset_ops)
      .def_rw("host_tracer_level", &profiler::ProfileOptions::host_tracer_level,
              "0: no host events, 1: user annotations, 2 (default): + runtime details, 3: + verbose")
      .def_rw("python_tracer_level", &profiler::ProfileOptions::python_tracer_level,
              "1: record Python function calls and returns, 0: do not")
      .def_rw("device_tracer_level", &profiler::ProfileOptions::device_tracer_level)
      .def_rw("enable_hlo_proto", &profiler::ProfileOptions::enable_hlo_proto)
      .def_rw("start_timestamp_ns", &profiler::ProfileOptions::start_timestamp_ns)
      .def_rw("duration_ms", &profiler::ProfileOptions::duration_ms)
      .def_rw("repository_path", &profiler::ProfileOptions::repository_path)
      .def_rw("raise_error_on_start_failure", &profiler::ProfileOptions::raise_error_on_start_failure)
      .def_rw("session_id", &profiler::ProfileOptions::session_id)
      .def_rw("buffer_bytes_per_thread", &profiler::ProfileOptions::buffer_bytes_per_thread,
              "Spyglass: bound of one thread's event buffers (bytes)")
      .def_rw("buffer_bytes_total", &profiler::ProfileOptions::buffer_bytes_total,
              "Spyglass: bound of all event buffers (bytes)")
      .def_rw("ring_buffer_seconds", &profiler::ProfileOptions::ring_buffer_seconds,
              "Spyglass flight recorder: > 0 records continuously, keeping this many last seconds")
      .def_rw("ring_buffer_bytes", &profiler::ProfileOptions::ring_buffer_bytes,
              "Spyglass flight recorder: memory budget of the ring (bytes)")
      .def_prop_rw(
          "advanced_configuration", [](const profiler::ProfileOptions& o) { return AdvancedToDict(o); },
          [](profiler::ProfileOptions& o, nb::handle d) { AdvancedFromDict(o, d); },
          "dict[str, bool | int | str]; unknown keys fail start_trace with InvalidArgumentError");

  m.def("start_trace", &StartTrace, "log_dir"_a, "create_perfetto_link"_a = false, "create_perfetto_trace"_a = false,
        "profiler_options"_a = nb::none(), "perfetto_link_timeout_s"_a = 0);
  m.def("stop_trace", &StopTrace);
  m.def("export_last_trace", [](const std::string& log_dir, bool create_perfetto_trace) {
    profiler::TraceOptions t;
    t.create_perfetto_trace = create_perfetto_trace;
    Status s;
    {
      nb::gil_scoped_release release;
      s = profiler::export_last_trace(log_dir, t);
    }
    Check(s);
  }, "log_dir"_a, "create_perfetto_trace"_a = false);
  BindProfileData(m);
  // jax.profiler.export_profile_data's writing step, for a ProfileData.
  m.def("export_profile_data", [](nb::handle data, const std::string& log_dir, const std::string& session_id,
                                  bool create_perfetto_trace, bool create_perfetto_link, int perfetto_link_timeout_s) {
    std::shared_ptr<const model::Space> space = SpaceOf(data);
    profiler::TraceOptions t;
    t.create_perfetto_link = create_perfetto_link;
    t.create_perfetto_trace = create_perfetto_trace || create_perfetto_link;
    t.profiler_options.session_id = session_id;
    t.perfetto_link_timeout_s = perfetto_link_timeout_s;
    t.perfetto_link_cancelled = CtrlCPressed;
    Status s;
    {
      nb::gil_scoped_release release;
      s = session::ExportSpace(*space, log_dir, t);
    }
    if (PyErr_Occurred()) throw nb::python_error();  // KeyboardInterrupt during the Perfetto link's wait
    Check(s);
  }, "profile_data"_a, "log_dir"_a, "session_id"_a = "", "create_perfetto_trace"_a = false,
     "create_perfetto_link"_a = false, "perfetto_link_timeout_s"_a = profiler::kDefaultPerfettoLinkTimeoutS);
  m.def("dump_flight_recorder", [](const std::string& log_dir) {
    Status s;
    {
      nb::gil_scoped_release release;
      s = profiler::dump_flight_recorder(log_dir);
    }
    Check(s);
  }, "log_dir"_a = "");
  m.def("flight_recorder_active", [] { return profiler::flight_recorder_active(); });
  m.def("last_trace_files", &LastTraceFiles);
  // python -m spyglass run (memory): the directory before the run, and the
  // summary after it (memory/run_summary.h, as `spyglass run` prints it).
  m.def("_memory_dir_listing", [](const std::string& dir) { return memory::ListDir(dir); });
  m.def(
      "_memory_run_summary",
      [](const std::string& dir, long pid, bool signaled, int code, const memory::DirListing& before) {
        return memory::SummarizeRun(dir, pid, {signaled, code}, before);
      },
      "dir"_a, "pid"_a, "signaled"_a, "code"_a, "before"_a);
  m.def("last_trace_stats", &LastTraceStats);
  m.def("set_metadata", [](const std::string& k, const std::string& v) { profiler::set_metadata(k, v); });
  m.def("clear_metadata", [] { profiler::clear_metadata(); });
  m.def("set_thread_name", [](const std::string& n) { profiler::set_thread_name(n); });
  m.def("set_process_name", [](const std::string& n) { profiler::set_process_name(n); });
  m.def("serve_perfetto_trace", [](const std::string& path, int timeout_s) {
    sinks::PerfettoLinkOptions o;
    o.timeout_s = timeout_s;
    o.cancelled = CtrlCPressed;
    Status s;
    {
      nb::gil_scoped_release release;
      s = sinks::ServePerfettoTrace(path, o);
    }
    if (PyErr_Occurred()) throw nb::python_error();
    Check(s);
  }, "path"_a, "timeout_s"_a = profiler::kDefaultPerfettoLinkTimeoutS);
  m.def("_start_from_settings", &StartFromSettings, "settings"_a = nb::none());
  m.def("_stop_started", &StopStarted);
  // python -m spyglass run with memory flags: the flags checked before the child runs.
  m.def("_check_settings", [](nb::handle settings) { (void)ParseSettings(settings); }, "settings"_a);
  m.def("_python_tracer_hook", [] { return std::string(PythonTracerHook()); },
        "The hook the Python tracer records with now: sys.monitoring, setprofile or off.");
  m.def("_after_fork_child", [] { PythonTracerAfterForkChild(); });
  // spyglass.analysis: the summary and diff of the CLI, as JSON for json.loads.
  m.def("_summary_json", [](const std::string& run, size_t top, const std::string& thread,
                            std::optional<int64_t> first, std::optional<int64_t> last) {
    analysis::SummaryOptions o;
    o.top = top, o.thread = thread, o.step_first = first, o.step_last = last;
    analysis::Summary s;
    analysis::CpuSummary cpu;
    Status st;
    bool has_cpu = false;
    {
      nb::gil_scoped_release release;
      st = analysis::Summarize(run, o, &s);
      // The CPU tables, as `spyglass summary --json` has them ("cpu", with samples).
      has_cpu = st.ok() && s.cpu_samples && analysis::SummarizeCpu(run, top, &cpu).ok();
    }
    Check(st);
    return analysis::SummaryToJson(s, has_cpu ? &cpu : nullptr);
  }, "run"_a, "top"_a, "thread"_a, "step_first"_a.none(), "step_last"_a.none());
  m.def("_diff_json", [](const std::string& base, const std::string& next, size_t top, double fail_above,
                         const std::vector<std::string>& annotations, const std::string& thread,
                         std::optional<int64_t> first, std::optional<int64_t> last) {
    analysis::DiffOptions o;
    o.top = top, o.fail_above_pct = fail_above, o.annotations = annotations;
    o.summary.top = top, o.summary.thread = thread, o.summary.step_first = first, o.summary.step_last = last;
    analysis::Diff d;
    Status st;
    {
      nb::gil_scoped_release release;
      st = analysis::DiffRuns(base, next, o, &d);
    }
    Check(st);
    return analysis::DiffToJson(d);
  }, "base"_a, "new"_a, "top"_a, "fail_above"_a, "annotations"_a, "thread"_a, "step_first"_a.none(),
     "step_last"_a.none());
  m.attr("__version__") = spyglass::version();
}
