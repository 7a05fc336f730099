// Bindings of the profiler server (include/spyglass/server.h), the capture
// command (tools/spyglass/collect_command.cc) and memory profiles
// (include/spyglass/memory.h).
// Thin: the Python semantics (JAX's exceptions) are in python/spyglass/.
#include "server_memory.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "errors.h"
#include "jax_memory.h"
#include "export/output_file.h"
#include "memory/pprof_merge.h"
#include "spyglass/memory.h"
#include "spyglass/server.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace spyglass::python {
namespace {

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
    Check(s);
    return profiler::server_port();
  }, "port"_a, "bind_address"_a = "");
  m.def("stop_server", [] {
    Status s;
    {
      nb::gil_scoped_release r;
      s = profiler::stop_server();
    }
    Check(s);
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
    Check(s);
    return r.release();
  }, "pid"_a, "port"_a, "connect_timeout_ms"_a = 30000, nb::rv_policy::take_ownership);

  m.def("device_memory_profile", [](const std::string& backend) {
    std::string out;
    Status s;
    {
      nb::gil_scoped_release rel;
      s = profiler::device_memory_profile(&out, backend);
    }
    Check(s);
    return nb::bytes(out.data(), out.size());
  }, "backend"_a = "");
  m.def("save_device_memory_profile", [](const std::string& path, const std::string& backend) {
    Status s;
    {
      nb::gil_scoped_release rel;
      s = profiler::save_device_memory_profile(path, backend);
    }
    Check(s);
  }, "path"_a, "backend"_a = "");
  BindJaxMemory(m);
  // In a JAX program (profiler.py): our snapshot and PJRT's heap profiles in
  // one, written as every Spyglass output is (never through a link, renamed
  // into place when complete).
  m.def("_merge_pprof", [](const std::vector<nb::bytes>& profiles) {
    std::vector<std::string_view> views;
    for (const nb::bytes& b : profiles) views.emplace_back(b.c_str(), b.size());
    std::string out;
    Status s;
    {
      nb::gil_scoped_release rel;
      s = memory::MergePprof(views, &out);
    }
    Check(s);
    return nb::bytes(out.data(), out.size());
  }, "profiles"_a);
  m.def("_write_output_bytes", [](const std::string& path, nb::bytes data) {
    Status s;
    {
      std::string_view view(data.c_str(), data.size());
      nb::gil_scoped_release rel;
      s = exporter::WriteOutputBytes(path, view);
    }
    Check(s);
  }, "path"_a, "data"_a);
  // record_allocation / record_free (with Python stacks) and numpy tracking: python_memory.cc.

  // `python -m spyglass.collect_profile ARGS`: the CLI's own `collect` (one
  // parser for both). Ctrl-C ends the Perfetto link's wait (KeyboardInterrupt).
  m.def("collect_main", [](const std::vector<std::string>& args) {
    int rc;
    {
      nb::gil_scoped_release rel;
      rc = cli::RunCollectCommand("python -m spyglass.collect_profile", args, [] {
        nb::gil_scoped_acquire gil;
        return PyErr_CheckSignals() != 0;
      });
    }
    if (PyErr_Occurred()) throw nb::python_error();
    return rc;
  }, "args"_a);
}

}  // namespace spyglass::python
