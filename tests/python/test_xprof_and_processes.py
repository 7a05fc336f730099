"""A Python-made trace opens in the real XProf; processes and threads each trace."""
import collections
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


# ---- children with their own servers, registered with the parent -------------

def _served_child(i, ports, stop):
  """A multiprocessing child: its own profiler server, annotations until `stop`."""
  import time  # pylint: disable=g-import-not-at-top
  import spyglass.profiler as prof  # pylint: disable=g-import-not-at-top,reimported
  port = prof.start_server(0)
  ports.put((i, os.getpid(), port))
  while not stop.is_set():
    with prof.TraceAnnotation(f"child_{i}"):
      time.sleep(0.001)
  prof.stop_server()


def _plane_event_names(space, plane_name):
  plane = next((p for p in space.planes if p.name == plane_name), None)
  assert plane is not None, (plane_name, [p.name for p in space.planes])
  return {plane.event_metadata[e.metadata_id].name for line in plane.lines for e in line.events}


# "fork" is covered below in a fresh interpreter: gRPC (which this pytest
# process has used by now) does not survive fork.
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_children_with_servers_are_registered(tmp_path, method, xplane_pb2):
  import time  # pylint: disable=g-import-not-at-top
  from conftest import read_xspace  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context(method)
  ports = ctx.Queue()
  stop = ctx.Event()
  procs = [ctx.Process(target=_served_child, args=(i, ports, stop)) for i in range(2)]
  for p in procs:
    p.start()
  try:
    started = {}
    for _ in procs:
      i, pid, port = ports.get(timeout=120)
      started[i] = (pid, port)
    assert {started[i][0] for i in started} == {p.pid for p in procs}
    unregisters = [profiler.register_subprocess(pid, port) for pid, port in started.values()]

    with profiler.trace(tmp_path / "registered"):
      end = time.time() + 0.3
      while time.time() < end:
        with profiler.TraceAnnotation("parent work"):
          time.sleep(0.005)
    space = read_xspace(xplane_pb2, profiler.last_trace_files()["xplane_path"])
    assert "parent work" in _plane_event_names(space, "/host:CPU")
    for i, (pid, _) in started.items():
      names = _plane_event_names(space, f"/host:CPU [{pid}]")
      assert f"child_{i}" in names, (i, sorted(names)[:20])
      assert f"child_{1 - i}" not in names
    assert "parent work" not in {n for pid, _ in started.values()
                                 for n in _plane_event_names(space, f"/host:CPU [{pid}]")}

    for unregister in unregisters:
      unregister()
    # The children still run and serve, but are no longer part of our traces.
    with profiler.trace(tmp_path / "unregistered"):
      with profiler.TraceAnnotation("parent alone"):
        time.sleep(0.3)
    space = read_xspace(xplane_pb2, profiler.last_trace_files()["xplane_path"])
    planes = [p.name for p in space.planes]
    assert "parent alone" in _plane_event_names(space, "/host:CPU")
    for pid, _ in started.values():
      assert not any(name.endswith(f"[{pid}]") for name in planes), planes
    assert not any(n.startswith("child_") for n in _plane_event_names(space, "/host:CPU"))
  finally:
    stop.set()
    for p in procs:
      p.join(60)
      if p.exitcode is None:
        p.kill()
        p.join()
  assert [p.exitcode for p in procs] == [0, 0]


_FORK_BEFORE_GRPC = r"""
import multiprocessing, os, sys, time
import spyglass.profiler as profiler

def child(i, ports, stop):
  port = profiler.start_server(0)
  ports.put((i, os.getpid(), port))
  while not stop.is_set():
    with profiler.TraceAnnotation(f"child_{i}"):
      time.sleep(0.001)
  profiler.stop_server()

if __name__ == "__main__":
  ctx = multiprocessing.get_context("fork")
  ports, stop = ctx.Queue(), ctx.Event()
  procs = [ctx.Process(target=child, args=(i, ports, stop)) for i in range(2)]
  for p in procs:
    p.start()
  started = [ports.get(timeout=120) for _ in procs]
  unregister = [profiler.register_subprocess(pid, port) for _, pid, port in started]
  with profiler.trace(sys.argv[1]):
    with profiler.TraceAnnotation("parent work"):
      time.sleep(0.3)
  stop.set()
  for p in procs:
    p.join(60)
  print(profiler.last_trace_files()["xplane_path"])
  print(" ".join(f"{i}:{pid}" for i, pid, _ in started))
  sys.exit(0 if [p.exitcode for p in procs] == [0, 0] else 1)
"""


def test_fork_children_with_servers_when_forked_before_grpc(tmp_path, xplane_pb2):
  """multiprocessing's fork works when the children are forked before this
  process first used gRPC (as a training script that starts its workers
  first): run in a fresh interpreter."""
  from conftest import read_xspace  # pylint: disable=g-import-not-at-top
  script = tmp_path / "fork_before_grpc.py"
  script.write_text(_FORK_BEFORE_GRPC)
  r = subprocess.run([sys.executable, str(script), str(tmp_path / "logs")], capture_output=True, text=True,
                     timeout=240)
  assert r.returncode == 0, r.stdout + r.stderr
  xplane, children = r.stdout.strip().splitlines()[-2:]
  space = read_xspace(xplane_pb2, xplane)
  for entry in children.split():
    i, pid = entry.split(":")
    assert f"child_{i}" in _plane_event_names(space, f"/host:CPU [{pid}]")


def _fork_child_start_server(q):
  try:
    profiler.start_server(0)
    q.put("started")
  except Exception as e:  # pylint: disable=broad-except
    q.put(f"{type(e).__name__}: {e}")


def test_fork_after_grpc_use_fails_clearly_in_the_child():
  """A child forked after this process served gets a clear error, not a
  server that never answers."""
  port = profiler.start_server(0)
  try:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_fork_child_start_server, args=(q,))
    p.start()
    msg = q.get(timeout=60)
    p.join(60)
  finally:
    profiler.stop_server()
  assert port > 0
  assert msg.startswith("RuntimeError") and "forked" in msg and "spawn" in msg, msg


def test_threads_annotate_across_repeated_traces(tmp_path, xplane_pb2):
  """Threads that annotate all along while the main thread starts and stops
  traces: every trace has events of every thread, and nothing crashes."""
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  n = 6
  stop = threading.Event()
  counts = [0] * n

  def work(i):
    while not stop.is_set():
      with profiler.TraceAnnotation("looping", worker=i):
        fib(3)
      counts[i] += 1
      time.sleep(0.0002)

  ts = [threading.Thread(target=work, args=(i,), name=f"looper-{i}") for i in range(n)]
  for t in ts:
    t.start()
  try:
    for k in range(5):
      options = profiler.ProfileOptions()
      options.python_tracer_level = k % 2  # with and without the Python tracer
      with profiler.trace(tmp_path / f"run{k}", profiler_options=options):
        # Counted from inside the trace: until every thread has completed a
        # few iterations that the trace saw.
        before = list(counts)
        deadline = time.time() + 30
        while time.time() < deadline and min(c - b for c, b in zip(counts, before)) < 5:
          time.sleep(0.01)
      ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
      why = (k, collections.Counter(e[1] for e in ev).most_common(8), profiler.last_trace_stats(),
             [c - b for c, b in zip(counts, before)])
      looping = [e for e in ev if e[1] == "looping"]
      assert {e[4]["worker"] for e in looping} == set(range(n)), why
      assert len({e[0] for e in looping}) == n, why
      for line in {e[0] for e in looping}:
        assert len({e[4]["worker"] for e in looping if e[0] == line}) == 1, (line, why)
      if k % 2:
        assert any(e[1].endswith(" fib") for e in ev), why
      else:
        assert not any(e[1].startswith("$") for e in ev), why
  finally:
    stop.set()
    for t in ts:
      t.join(30)
  assert all(not t.is_alive() for t in ts)
