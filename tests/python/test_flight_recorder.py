"""The flight recorder from Python: dump_flight_recorder, a slow step, a crash."""
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import spyglass.profiler as profiler
from conftest import host_events


def ring(seconds=10, **advanced):
  o = profiler.ProfileOptions()
  o.python_tracer_level = 0
  o.ring_buffer_seconds = seconds
  o.ring_buffer_bytes = 8 << 20
  o.advanced_configuration = advanced
  return o


def runs(log_dir):
  d = pathlib.Path(log_dir) / "plugins" / "profile"
  return sorted(p for p in d.iterdir() if p.is_dir()) if d.exists() else []


def wait_for_runs(log_dir, n):
  for _ in range(600):  # bounded: 30 s
    r = runs(log_dir)
    if len(r) >= n and list(r[-1].glob("*.xplane.pb")):
      return r
    time.sleep(0.05)
  raise AssertionError(f"no run in {log_dir} after 30 s")


def names(xplane_pb2, path):
  return [e[1] for e in host_events(xplane_pb2, str(path))]


def test_dump_writes_a_run_and_the_recorder_runs_on(tmp_path, xplane_pb2):
  profiler.start_trace(tmp_path / "a", profiler_options=ring())
  try:
    assert profiler.flight_recorder_active()
    for i in range(3):
      with profiler.StepTraceAnnotation("train", step_num=i):
        with profiler.TraceAnnotation("forward", batch=64):
          pass
    profiler.dump_flight_recorder()
    first = profiler.last_trace_files()
    assert profiler.flight_recorder_active()
    with profiler.TraceAnnotation("after_dump"):
      pass
    profiler.dump_flight_recorder(tmp_path / "b")
    second = profiler.last_trace_files()
  finally:
    profiler.stop_trace()
  assert not profiler.flight_recorder_active()
  got = names(xplane_pb2, first["xplane_path"])
  assert got.count("forward") == 3 and got.count("train") == 3 and "after_dump" not in got
  assert os.path.exists(first["trace_json_path"])
  assert second["run_dir"].startswith(str(tmp_path / "b"))
  assert "after_dump" in names(xplane_pb2, second["xplane_path"])


def test_dump_without_a_flight_recorder_raises(tmp_path):
  with pytest.raises(RuntimeError, match="no flight recorder"):
    profiler.dump_flight_recorder(tmp_path)


def test_slow_python_step_dumps(tmp_path, xplane_pb2):
  profiler.start_trace(tmp_path, profiler_options=ring(spyglass_dump_if_step_slower_than_ms=50))
  try:
    with profiler.StepTraceAnnotation("train", step_num=0):
      pass
    with profiler.StepTraceAnnotation("train", step_num=1):
      time.sleep(0.2)
    run = wait_for_runs(tmp_path, 1)[0]
  finally:
    profiler.stop_trace()
  events = host_events(xplane_pb2, str(next(run.glob("*.xplane.pb"))))
  assert sorted(e[4]["step_num"] for e in events if e[1] == "train") == [0, 1]


def test_python_program_killed_by_sigsegv_leaves_a_run(tmp_path, xplane_pb2):
  script = textwrap.dedent(f"""
      import ctypes
      import spyglass.profiler as profiler
      o = profiler.ProfileOptions()
      o.python_tracer_level = 0
      o.ring_buffer_seconds = 10
      profiler.start_trace({str(tmp_path)!r}, profiler_options=o)
      for i in range(3):
          with profiler.StepTraceAnnotation("train", step_num=i):
              with profiler.TraceAnnotation("forward"):
                  pass
      ctypes.string_at(0)  # SIGSEGV
  """)
  p = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
  assert p.returncode == -signal.SIGSEGV, p.stderr.decode()
  (run,) = runs(tmp_path)
  assert "_crash_" in run.name
  got = names(xplane_pb2, next(run.glob("*.xplane.pb")))
  assert got.count("forward") == 3 and got.count("train") == 3
