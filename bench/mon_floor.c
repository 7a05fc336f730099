/* The floor of a sys.monitoring tracer (bench/python_bench.py builds and
 * loads it on CPython 3.12+): C callbacks that do nothing, registered for the
 * events Spyglass's Python tracer takes. What a traced run costs with these
 * is the interpreter's own dispatch; the rest of Spyglass's cost is ours.
 *   start(kind): PY_START/RESUME/THROW, PY_RETURN/YIELD/UNWIND, and from
 *   kind 1 on also CALL (DISABLE where the callable is not a C function, as
 *   Spyglass does) and C_RETURN/C_RAISE. Kinds 0, 1: the callbacks are
 *   builtin functions (METH_FASTCALL); 2: objects of a type whose vectorcall
 *   is the callback, as Spyglass's are; 3: as 2, and each callback reads
 *   the clock (x86: rdtsc) into a small ring, the least a tracer that
 *   timestamps its events adds.   stop(): all off. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t Now(void) { return __rdtsc(); }
#else
#include <time.h>
static inline uint64_t Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

static PyObject* g_disable;
static int g_tool = -1;

static PyObject* Nothing(PyObject* self, PyObject* const* args, Py_ssize_t n) { Py_RETURN_NONE; }
static PyObject* Call(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  PyObject* c = args[2];
  if (PyCFunction_Check(c) || Py_IS_TYPE(c, &PyMethodDescr_Type)) Py_RETURN_NONE;
  return Py_NewRef(g_disable);
}
static PyMethodDef g_cb[] = {{"nothing", (PyCFunction)(void (*)(void))Nothing, METH_FASTCALL, NULL},
                             {"call", (PyCFunction)(void (*)(void))Call, METH_FASTCALL, NULL}};

typedef struct {
  PyObject_HEAD
  vectorcallfunc fn;
} Callback;
static PyObject* VcNothing(PyObject* self, PyObject* const* args, size_t n, PyObject* kw) { Py_RETURN_NONE; }
static PyObject* VcCall(PyObject* self, PyObject* const* args, size_t n, PyObject* kw) { return Call(self, args, 0); }
static uint64_t g_ring[4096];
static size_t g_next;
static PyObject* VcClock(PyObject* self, PyObject* const* args, size_t n, PyObject* kw) {
  g_ring[g_next++ % 4096] = Now();
  Py_RETURN_NONE;
}
static PyObject* VcClockCall(PyObject* self, PyObject* const* args, size_t n, PyObject* kw) {
  PyObject* r = Call(self, args, 0);
  if (r == Py_None) g_ring[g_next++ % 4096] = Now();
  return r;
}
static PyTypeObject g_callback_type = {PyVarObject_HEAD_INIT(NULL, 0)};
static int g_vectorcall, g_clock;

static PyObject* NewCallback(PyMethodDef* def) {
  if (!g_vectorcall) return PyCFunction_New(def, NULL);
  if (!g_callback_type.tp_flags) {
    g_callback_type.tp_name = "mon_floor.Callback";
    g_callback_type.tp_basicsize = sizeof(Callback);
    g_callback_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    g_callback_type.tp_vectorcall_offset = offsetof(Callback, fn);
    g_callback_type.tp_call = PyVectorcall_Call;
    if (PyType_Ready(&g_callback_type) < 0) return NULL;
  }
  Callback* cb = PyObject_New(Callback, &g_callback_type);
  if (cb) cb->fn = def == &g_cb[0] ? (g_clock ? VcClock : VcNothing) : (g_clock ? VcClockCall : VcCall);
  return (PyObject*)cb;
}

static int Register(PyObject* mon, PyObject* events, const char* ev, PyMethodDef* def, long* mask) {
  PyObject* bit = PyObject_GetAttrString(events, ev);
  PyObject* fn = NewCallback(def);
  PyObject* r = bit && fn ? PyObject_CallMethod(mon, "register_callback", "iOO", g_tool, bit, fn) : NULL;
  if (r) *mask |= PyLong_AsLong(bit);
  Py_XDECREF(bit);
  Py_XDECREF(fn);
  Py_XDECREF(r);
  return r ? 0 : -1;
}

static PyObject* Start(PyObject* self, PyObject* arg) {
  long kind = PyLong_AsLong(arg);
  int c_calls = kind >= 1;
  g_vectorcall = kind >= 2;
  g_clock = kind == 3;
  PyObject* mon = PySys_GetObject("monitoring");
  if (!mon) return NULL;
  PyObject* r = PyObject_CallMethod(mon, "use_tool_id", "is", 2, "floor");
  if (!r) return NULL;
  Py_DECREF(r);
  g_tool = 2;
  if (!g_disable) g_disable = PyObject_GetAttrString(mon, "DISABLE");
  PyObject* events = PyObject_GetAttrString(mon, "events");
  if (!events) return NULL;
  long mask = 0;
  const char* py[] = {"PY_START", "PY_RESUME", "PY_THROW", "PY_RETURN", "PY_YIELD", "PY_UNWIND"};
  for (int i = 0; i < 6; ++i)
    if (Register(mon, events, py[i], &g_cb[0], &mask)) return NULL;
  if (c_calls && (Register(mon, events, "CALL", &g_cb[1], &mask) || Register(mon, events, "C_RETURN", &g_cb[0], &mask) ||
                  Register(mon, events, "C_RAISE", &g_cb[0], &mask)))
    return NULL;
  Py_DECREF(events);
  return PyObject_CallMethod(mon, "set_events", "il", g_tool, mask);
}

static PyObject* Stop(PyObject* self, PyObject* unused) {
  PyObject* mon = PySys_GetObject("monitoring");
  if (!mon || g_tool < 0) Py_RETURN_NONE;
  PyObject* r = PyObject_CallMethod(mon, "set_events", "ii", g_tool, 0);
  Py_XDECREF(r);
  r = PyObject_CallMethod(mon, "free_tool_id", "i", g_tool);
  Py_XDECREF(r);
  PyObject* r2 = PyObject_CallMethod(mon, "restart_events", NULL);
  Py_XDECREF(r2);
  g_tool = -1;
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef g_methods[] = {{"start", Start, METH_O, NULL}, {"stop", Stop, METH_NOARGS, NULL}, {NULL}};
static struct PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "mon_floor", NULL, -1, g_methods};
PyMODINIT_FUNC PyInit_mon_floor(void) { return PyModule_Create(&g_module); }
