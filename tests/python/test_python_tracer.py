"""python_tracer_level=1: Python calls recorded on their threads, next to annotations."""
import os
import subprocess
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


def here(ev):
  """This thread's events: a test runner's own threads (pytest-xdist's
  channel, reading and writing across the session) are not the test's."""
  line = f"{threading.get_native_id()}:"
  return [e for e in ev if e[0].startswith(line)]


def cut_here(ev):
  """This thread's incomplete events."""
  return [e for e in here(ev) if "incomplete" in e[4]]


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


def test_c_method_names_are_xlas(tmp_path, xplane_pb2):
  # XLA's Python tracer names a C function "$<m_module> <name>" and a method
  # of a builtin type (no module) "$<unknown> <name>": jax.profiler's trace of
  # the same program holds these names, not the type's ("$dict get").
  d, lst = {"a": 1}, []
  with profiler.trace(tmp_path):
    d.get("a")
    lst.append(1)
    len(lst)
  names = {e[1] for e in events(xplane_pb2)}
  assert {"$<unknown> get", "$<unknown> append", "$builtins len"} <= names, sorted(names)
  assert not {"$dict get", "$list append"} & names, sorted(names)

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


def produce(n):
  with profiler.TraceAnnotation("produce", n=n):
    for i in range(n):
      yield leaf(i)


def consume():
  total = 0
  for v in produce(3):
    with profiler.TraceAnnotation("consume"):
      total += v
  return total


def assert_nested(ev):
  """Events of each thread nest (a stack): no two partly overlap."""
  by_line = {}
  for e in ev:
    by_line.setdefault(e[0], []).append(e)
  for line in by_line.values():
    line.sort(key=lambda e: (e[2], -e[3]))
    stack = []
    for e in line:
      while stack and stack[-1][3] <= e[2]:
        stack.pop()
      assert not stack or e[3] <= stack[-1][3], f"{e[1]} overlaps {stack[-1][1]}: {e} {stack[-1]}"
      stack.append(e)


def test_annotation_open_across_yield_nests_in_the_generator(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path):
    assert consume() == 6
  ev = events(xplane_pb2)
  assert_nested(ev)
  gens = sorted((e for e in ev if e[1] == name_of(produce)), key=lambda e: e[2])
  pieces = sorted((e for e in ev if e[1] == "produce"), key=lambda e: e[2])
  consumes = [e for e in ev if e[1] == "consume"]
  assert len(gens) == 4 and len(consumes) == 3
  # One piece per run of the generator (three yields and the end), each
  # inside that run's frame event; the arguments on the first.
  assert len(pieces) == 4
  for g, p in zip(gens, pieces):
    assert g[2] <= p[2] <= p[3] <= g[3]
  assert pieces[0][4].get("n") == 3
  # The consumer's annotations are outside the producer's.
  for c in consumes:
    assert not any(p[2] <= c[2] < p[3] for p in pieces)
  assert not cut_here(ev)


def test_annotation_across_yield_in_a_coroutine(tmp_path, xplane_pb2):
  import asyncio  # pylint: disable=g-import-not-at-top
  async def step(i):
    with profiler.TraceAnnotation("step", i=i):
      await asyncio.sleep(0)
      leaf(i)
  async def main():
    await asyncio.gather(step(1), step(2))
  with profiler.trace(tmp_path):
    asyncio.run(main())
  ev = events(xplane_pb2)
  assert_nested(ev)
  steps = [e for e in ev if e[1] == "step"]
  assert len(steps) == 4  # each coroutine: before and after its await
  assert sorted(e[4]["i"] for e in steps if "i" in e[4]) == [1, 2]


def test_the_stop_path_is_not_recorded_as_incomplete(tmp_path, xplane_pb2):
  def traced_with():
    with profiler.trace(tmp_path / "a"):
      middle(2)
  traced_with()
  ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  assert [e[1] for e in ev if e[1] == name_of(middle)] == [name_of(middle)]
  assert not cut_here(ev), [e[1] for e in cut_here(ev)]
  assert not [e for e in here(ev) if "profiler.py" in e[1] or "contextlib" in e[1]], [e[1] for e in here(ev)]

  def stops_inside():  # recorded, and still running at the stop: truly incomplete
    middle(1)
    profiler.stop_trace()
  profiler.start_trace(tmp_path / "b")
  stops_inside()
  ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  cut = [e[1] for e in cut_here(ev)]
  assert cut == [name_of(stops_inside)], cut
  assert not [e for e in here(ev) if "stop_trace" in e[1]], [e[1] for e in here(ev)]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_is_the_hook_on_312_and_setprofile_still_works(tmp_path):
  from spyglass import _spyglass  # pylint: disable=g-import-not-at-top
  with profiler.trace(tmp_path):
    assert _spyglass._python_tracer_hook() == "sys.monitoring"
  assert _spyglass._python_tracer_hook() == "off"
  assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is None  # given back
  # The profile-function hook, forced: the same tests pass with it.
  here = os.path.dirname(os.path.abspath(__file__))
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                      "not sys_monitoring", os.path.join(here, "test_python_tracer.py")],
                     capture_output=True, text=True, timeout=300, cwd=here,
                     env=dict(os.environ, SPYGLASS_PYTHON_TRACER="setprofile"))
  assert r.returncode == 0, r.stdout[-3000:]


def fib(n):
  return n if n < 2 else fib(n - 1) + fib(n - 2)


def test_every_call_recorded_across_chunks_and_sessions(tmp_path, xplane_pb2):
  # fib(18): 8,361 calls, 200 KB of records: more than one of the recorder's
  # chunks, so the tracer's fast path hands over to the general one and back.
  for i, annotated in enumerate([False, True]):
    fib(10)  # between sessions: not recorded
    with profiler.trace(tmp_path / str(i)):
      if annotated:  # an annotation open around the calls (the same buffer)
        with profiler.TraceAnnotation("around"):
          fib(18)
      else:
        fib(18)
    fib(10)
    ev = events(xplane_pb2)
    assert_nested(ev)
    assert len([e for e in ev if e[1] == name_of(fib)]) == 8361
    assert not cut_here(ev)
    if annotated:
      around = next(e for e in ev if e[1] == "around")
      assert all(around[2] <= e[2] <= e[3] <= around[3] for e in ev if e[1] == name_of(fib))


@pytest.mark.skipif(sys.version_info >= (3, 12) and os.environ.get("SPYGLASS_PYTHON_TRACER") == "setprofile",
                    reason="3.12+ with the profile-function hook forced: another tool's hooks are replaced during "
                    "the trace (docs/python.md); the default there, sys.monitoring, leaves them alone")
def test_another_profilers_hooks_keep_working_and_are_restored(tmp_path, xplane_pb2):
  # Another tool's sys.setprofile (this thread) and threading.setprofile (new
  # threads): during the trace both keep getting their calls, our events are
  # recorded on both threads, and both hooks are the other tool's again after.
  seen = {"main": 0, "thread": 0}
  def other(frame, event, arg):
    seen["main"] += 1
  def other_for_threads(frame, event, arg):
    seen["thread"] += 1
  sys.setprofile(other)
  threading.setprofile(other_for_threads)
  try:
    with profiler.trace(tmp_path):
      before = dict(seen)
      middle(3)
      t = threading.Thread(target=middle, args=(2,), name="started_during")
      t.start()
      t.join()
      during = {k: seen[k] - before[k] for k in seen}
    hook_after, thread_hook_after = sys.getprofile(), threading._profile_hook  # pylint: disable=protected-access
  finally:
    sys.setprofile(None)
    threading.setprofile(None)
  assert during["main"] > 0, "the other tool's sys.setprofile hook got no calls during the trace"
  assert during["thread"] > 0, "a thread started during the trace never got the other tool's threading hook"
  assert hook_after is other
  assert thread_hook_after is other_for_threads
  mids = [e for e in events(xplane_pb2) if e[1] == name_of(middle)]
  assert len(mids) == 2, mids
  assert any(e[0].endswith(":started_during") for e in mids)
  assert len([e for e in events(xplane_pb2) if e[1] == name_of(leaf)]) == 5
