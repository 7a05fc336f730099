// Bindings of the profiler server (include/spyglass/server.h), the capture
// client (src/server/client.h) and memory profiles (include/spyglass/memory.h).
// Thin: the Python semantics (JAX's exceptions) are in python/spyglass/.
#include "server_memory.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "server/client.h"
#include "spyglass/memory.h"
#include "spyglass/server.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace spyglass::python {
namespace {

// Status -> exception with the status code's name, so that the Python layer
// can map codes to JAX's exception types.
[[noreturn]] void RaiseCode(const Status& s) {
  std::string code = s.ToString();
  code = code.substr(0, code.find(':'));
  PyErr_SetObject(PyExc_RuntimeError, nb::make_tuple(code, s.message()).ptr());
  throw nb::python_error();
}
void CheckCode(const Status& s) {
  if (!s.ok()) RaiseCode(s);
}

struct Registration {
  profiler::SubprocessRegistration reg;
};

}  // namespace

void BindServerAndMemory(nb::module_& m) {
  m.def("start_server", [](int port, const std::string& bind_address) {
    profiler::ServerOptions o;
    if (!bind_address.empty()) o.bind_address = bind_address;
    Status s;
    {
      nb::gil_scoped_release r;
      s = profiler::start_server(port, o);
    }
    CheckCode(s);
    return profiler::server_port();
  }, "port"_a, "bind_address"_a = "");
  m.def("stop_server", [] {
    Status s;
    {
      nb::gil_scoped_release r;
      s = profiler::stop_server();
    }
    CheckCode(s);
  });
  m.def("server_port", [] { return profiler::server_port(); });

  nb::class_<Registration>(m, "SubprocessRegistration")
      .def("unregister", [](Registration& r) {
        nb::gil_scoped_release rel;
        r.reg.unregister();
      })
      .def("__call__", [](Registration& r) {
        nb::gil_scoped_release rel;
        r.reg.unregister();
      })
      .def_prop_ro("registered", [](const Registration& r) { return r.reg.registered(); })
      .def_prop_ro("pid", [](const Registration& r) { return r.reg.pid(); });
  m.def("register_subprocess", [](int pid, int port, int timeout_ms) {
    auto r = std::make_unique<Registration>();
    Status s;
    {
      nb::gil_scoped_release rel;
      s = profiler::register_subprocess(pid, port, &r->reg, timeout_ms);
    }
    CheckCode(s);
    return r.release();
  }, "pid"_a, "port"_a, "connect_timeout_ms"_a = 30000, nb::rv_policy::take_ownership);

  m.def("device_memory_profile", [](const std::string& backend) {
    std::string out;
    Status s;
    {
      nb::gil_scoped_release rel;
      s = profiler::device_memory_profile(&out, backend);
    }
    CheckCode(s);
    return nb::bytes(out.data(), out.size());
  }, "backend"_a = "");
  // record_allocation / record_free (with Python stacks) and numpy tracking: python_memory.cc.

  m.def("capture", [](const std::vector<std::string>& addresses, uint64_t duration_ms, const std::string& log_dir,
                      int host_tracer_level, int device_tracer_level, int python_tracer_level, uint64_t delay_ms,
                      const std::string& session_id, bool create_perfetto_trace) {
    server::CaptureOptions o;
    o.duration_ms = duration_ms;
    o.delay_ms = delay_ms;
    o.profile.host_tracer_level = host_tracer_level;
    o.profile.device_tracer_level = device_tracer_level;
    o.profile.python_tracer_level = python_tracer_level;
    o.profile.session_id = session_id;
    o.create_perfetto_trace = create_perfetto_trace;
    std::ostringstream log;
    o.log = &log;
    server::CaptureResult result;
    Status s;
    {
      nb::gil_scoped_release rel;
      s = server::Capture(addresses, o, log_dir, &result);
    }
    CheckCode(s);
    nb::list hosts;
    for (const auto& h : result.hosts) {
      nb::dict d;
      d["address"] = h.address;
      d["xplane_path"] = h.xplane_path;
      d["trace_json_path"] = h.trace_json_path;
      d["error"] = h.error;
      hosts.append(d);
    }
    nb::dict out;
    out["run_dir"] = result.run_dir;
    out["hosts"] = hosts;
    out["perfetto_trace_path"] = result.perfetto_trace_path;
    out["warnings"] = nb::cast(result.warnings);
    out["log"] = log.str();
    return out;
  }, "addresses"_a, "duration_ms"_a, "log_dir"_a, "host_tracer_level"_a = 2, "device_tracer_level"_a = 1,
     "python_tracer_level"_a = 1, "delay_ms"_a = 0, "session_id"_a = "", "create_perfetto_trace"_a = false);
}

}  // namespace spyglass::python
