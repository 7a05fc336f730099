"""python_tracer_level=1: Python calls recorded on their threads, next to annotations."""
import os
import sys
import threading

import pytest

import spyglass.profiler as profiler
from conftest import host_events, run_python


def leaf(x):
  return x * 2


def middle(n):
  total = 0
  for i in range(n):
    total += leaf(i)
  return total


def gen(n):
  for i in range(n):
    yield leaf(i)


def raises():
  raise ValueError("x")


def events(xplane_pb2):
  return host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])


def name_of(fn):
  code = fn.__code__
  return f"${os.path.basename(code.co_filename)}:{code.co_firstlineno} {code.co_name}"


def test_default_options_trace_python_calls_with_jax_names(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path):  # python_tracer_level=1 by default, as in JAX
    with profiler.TraceAnnotation("region"):
      middle(3)
      len([1, 2])
  ev = events(xplane_pb2)
  names = [e[1] for e in ev]
  assert names.count(name_of(middle)) == 1
  assert names.count(name_of(leaf)) == 3
  assert "$builtins len" in names
  # Nesting: region > middle > leaf, on one thread.
  region = next(e for e in ev if e[1] == "region")
  mid = next(e for e in ev if e[1] == name_of(middle))
  leaves = [e for e in ev if e[1] == name_of(leaf)]
  assert region[0] == mid[0] == leaves[0][0]
  assert region[2] <= mid[2] <= mid[3] <= region[3]
  for l in leaves:
    assert mid[2] <= l[2] <= l[3] <= mid[3]
  # The annotation's own __exit__ is not recorded as a C call.
  assert not any("__exit__" in n and "TraceAnnotation" in n for n in names)


def test_level_zero_records_no_python_events(tmp_path, xplane_pb2):
  o = profiler.ProfileOptions()
  o.python_tracer_level = 0
  with profiler.trace(tmp_path, profiler_options=o):
    middle(3)
  assert not [e for e in events(xplane_pb2) if e[1].startswith("$")]


def test_hooks_are_removed_after_stop(tmp_path):
  assert sys.getprofile() is None
  profiler.start_trace(tmp_path)
  profiler.stop_trace()
  assert sys.getprofile() is None
  assert threading._profile_hook is None  # pylint: disable=protected-access


def test_generators_exceptions_and_c_calls_stay_balanced(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path):
    with profiler.TraceAnnotation("outer"):
      assert list(gen(3)) == [0, 2, 4]
      for _ in range(2):
        try:
          raises()
        except ValueError:
          pass
      sorted([3, 1, 2], key=leaf)
    with profiler.TraceAnnotation("after"):
      pass
  ev = events(xplane_pb2)
  outer = next(e for e in ev if e[1] == "outer")
  after = next(e for e in ev if e[1] == "after")
  assert outer[3] <= after[2]
  assert "incomplete" not in outer[4] and "incomplete" not in after[4]
  inside = [e for e in ev if outer[2] <= e[2] < outer[3] and e is not outer]
  for e in inside:
    assert e[3] <= outer[3], e
  names = [e[1] for e in inside]
  assert names.count(name_of(raises)) == 2
  assert names.count(name_of(gen)) == 4  # resumed 4 times (3 values + the end)
  assert "$builtins sorted" in names


def test_threads_started_before_and_during_the_trace(tmp_path, xplane_pb2):
  go = threading.Event()
  done = threading.Event()
  def early_worker():
    go.wait()
    middle(2)
    done.set()
  early = threading.Thread(target=early_worker, name="early")
  early.start()
  with profiler.trace(tmp_path):
    go.set()
    done.wait()
    late = threading.Thread(target=middle, args=(4,), name="late")
    late.start()
    late.join()
  early.join()
  ev = events(xplane_pb2)
  mids = [e for e in ev if e[1] == name_of(middle)]
  assert len(mids) == 2
  assert len({e[0] for e in mids}) == 2  # two threads, two lines
  late_line = [e[0] for e in mids if e[0].endswith(":late")]
  assert late_line, "the thread started during the trace is named after the Python thread"


def test_dynamic_code_and_lambdas(tmp_path, xplane_pb2):
  f = lambda x: x + 1  # pylint: disable=unnecessary-lambda-assignment
  ns = {}
  exec(compile("def dyn(a):\n  return a\n", "generated.py", "exec"), ns)  # pylint: disable=exec-used
  with profiler.trace(tmp_path):
    f(1)
    ns["dyn"](2)
  names = [e[1] for e in events(xplane_pb2)]
  assert name_of(f) in names
  assert "$generated.py:1 dyn" in names


def test_forked_child_has_no_hooks_and_may_trace(tmp_path):
  if not hasattr(os, "fork"):
    pytest.skip("no fork")
  code = f"""
import os, sys, gzip, json
import spyglass.profiler as profiler
def work(): return 1
profiler.start_trace({str(tmp_path / 'parent')!r})
pid = os.fork()
if pid == 0:
    ok = sys.getprofile() is None and not profiler.TraceAnnotation.is_enabled()
    profiler.start_trace({str(tmp_path / 'child')!r})
    work()
    profiler.stop_trace()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
work()
profiler.stop_trace()
"""
  run_python(code)
  assert list((tmp_path / "child" / "plugins" / "profile").iterdir())
  assert list((tmp_path / "parent" / "plugins" / "profile").iterdir())
