"""A Python-made trace opens in the real XProf; processes and threads each trace."""
import multiprocessing
import os
import subprocess
import sys

import pytest

import spyglass.profiler as profiler
from conftest import REPO, host_events, json_events


def fib(n):
  return n if n < 2 else fib(n - 1) + fib(n - 2)


def test_xprof_reads_a_python_trace(tmp_path):
  pytest.importorskip("xprof")
  with profiler.trace(tmp_path):  # with the Python tracer
    for step in range(3):
      with profiler.StepTraceAnnotation("train", step_num=step):
        with profiler.TraceAnnotation("forward", batch=32):
          fib(8)
  xplane = profiler.last_trace_files()["xplane_path"]
  p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "xprof", "xprof_check.py"), xplane,
                      "--expect-event", "forward", "--expect-event",
                      f"${os.path.basename(__file__)}:{fib.__code__.co_firstlineno} fib",
                      "--expect-step", "train 1"],
                     capture_output=True, text=True, timeout=600)
  if p.returncode == 77:
    pytest.skip("xprof not importable")
  assert p.returncode == 0, p.stdout + p.stderr


def _child(log_dir, q):
  import spyglass.profiler as prof  # pylint: disable=g-import-not-at-top,reimported
  try:
    with prof.trace(log_dir):
      with prof.TraceAnnotation("child work", pid=os.getpid()):
        fib(5)
    q.put(("ok", prof.last_trace_files()["xplane_path"]))
  except Exception as e:  # pylint: disable=broad-except
    q.put(("error", repr(e)))


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_children_trace_on_their_own(tmp_path, method, xplane_pb2):
  ctx = multiprocessing.get_context(method)
  q = ctx.Queue()
  # The parent traces while its children do.
  with profiler.trace(tmp_path / "parent"):
    procs = [ctx.Process(target=_child, args=(str(tmp_path / f"child{i}"), q)) for i in range(2)]
    for p in procs:
      p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
      p.join(60)
      assert p.exitcode == 0
  for status, path in results:
    assert status == "ok", path
    names = {e[1] for e in host_events(xplane_pb2, path)}
    assert "child work" in names
    assert any(n.endswith(" fib") for n in names)
  parent_names = {e["name"] for e in json_events(profiler.last_trace_files()["trace_json_path"])}
  assert "child work" not in parent_names


def test_many_threads_with_python_tracer(tmp_path, xplane_pb2):
  import threading  # pylint: disable=g-import-not-at-top
  def work(i):
    for _ in range(20):
      with profiler.TraceAnnotation("unit", worker=i):
        fib(4)
  with profiler.trace(tmp_path):
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
      t.start()
    for t in ts:
      t.join()
  ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  units = [e for e in ev if e[1] == "unit"]
  assert len(units) == 160
  assert len({e[0] for e in units}) == 8
  # Every fib call on a worker sits inside one of that thread's "unit" events.
  by_line = {}
  for e in units:
    by_line.setdefault(e[0], []).append(e)
  for e in ev:
    if e[1].endswith(" fib") and e[0] in by_line:
      assert any(u[2] <= e[2] and e[3] <= u[3] for u in by_line[e[0]]), e
