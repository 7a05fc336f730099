#include "errors.h"

namespace nb = nanobind;

namespace spyglass::python {
namespace {

PyObject* g_invalid_argument = nullptr;

}  // namespace

void AddErrorTypes(nb::module_& m) {
  g_invalid_argument = PyErr_NewExceptionWithDoc(
      "spyglass.InvalidArgumentError",
      "Bad profiler options or arguments (an unknown advanced_configuration key, a wrong value type, a bad level, "
      "a bad path). A ValueError; `.code` is 'InvalidArgument'.",
      PyExc_ValueError, nullptr);
  if (g_invalid_argument == nullptr) throw nb::python_error();
  m.attr("InvalidArgumentError") = nb::handle(g_invalid_argument);
}

namespace {

[[noreturn]] void RaiseAs(PyObject* type, const Status& s) {
  nb::object error = nb::steal(PyObject_CallFunction(type, "s", s.message().c_str()));
  if (!error.is_valid()) throw nb::python_error();
  if (PyObject_SetAttrString(error.ptr(), "code", nb::str(StatusCodeName(s.code())).ptr()) != 0)
    throw nb::python_error();
  PyErr_SetObject(type, error.ptr());
  throw nb::python_error();
}

}  // namespace

void Raise(const Status& s) {
  // Plain RuntimeError otherwise, the type jax.profiler raises.
  RaiseAs(s.code() == StatusCode::kInvalidArgument ? g_invalid_argument : PyExc_RuntimeError, s);
}

void RaiseRuntimeError(const Status& s) { RaiseAs(PyExc_RuntimeError, s); }

}  // namespace spyglass::python
