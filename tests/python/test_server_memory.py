"""start_server / collect_profile / register_subprocess / memory profiles from Python."""
import glob
import gzip
import os
import subprocess
import sys
import time

import pytest

import spyglass.profiler as profiler
from conftest import host_events

LOOP = r"""
import sys, time
import spyglass.profiler as profiler
port = profiler.start_server(0)
print(port, flush=True)
def work(i):
    return sum(range(100))
end = time.time() + 30
while time.time() < end:
    with profiler.TraceAnnotation("served step"):
        work(1)
    time.sleep(0.001)
"""


def start_child(code):
  p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
  port = int(p.stdout.readline())
  return p, port


def test_server_errors_are_jax_s():
  port = profiler.start_server(0)
  try:
    assert port > 0
    with pytest.raises(ValueError, match="Only one profiler server can be active at a time."):
      profiler.start_server(0)
  finally:
    profiler.stop_server()
  with pytest.raises(ValueError, match="No active profiler server."):
    profiler.stop_server()


def test_collect_profile_captures_a_served_process(tmp_path, xplane_pb2):
  child, port = start_child(LOOP)
  try:
    p = subprocess.run([sys.executable, "-m", "spyglass.collect_profile", str(port), "500",
                        "--log_dir", str(tmp_path), "--no_perfetto_link"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"Dumped profiling information in: {tmp_path}" in p.stdout
  finally:
    child.kill()
    child.wait()
  files = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert files
  names = {e[1] for e in host_events(xplane_pb2, files[0])}
  assert "served step" in names
  assert any(n.endswith(" work") for n in names)  # python_tracer_level=1 by default


def test_collect_profile_rejects_positional_extras():
  p = subprocess.run([sys.executable, "-m", "spyglass.collect_profile", "1", "10", "oops"],
                     capture_output=True, text=True, timeout=60)
  assert p.returncode != 0 and "Unknown positional argument encountered: oops" in p.stderr


def test_register_subprocess_merges_the_child(tmp_path, xplane_pb2):
  child, port = start_child(LOOP)
  try:
    unregister = profiler.register_subprocess(child.pid, port)
    with profiler.trace(tmp_path):
      with profiler.TraceAnnotation("parent work"):
        time.sleep(0.3)
    unregister()
  finally:
    child.kill()
    child.wait()
  from conftest import read_xspace  # pylint: disable=g-import-not-at-top
  space = read_xspace(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  planes = [p.name for p in space.planes]
  assert any(name.endswith(f"[{child.pid}]") for name in planes), planes


def test_device_memory_profile_is_gzipped_pprof(tmp_path):
  data = profiler.device_memory_profile()
  assert isinstance(data, bytes) and data[:2] == b"\x1f\x8b"
  gzip.decompress(data)
  path = tmp_path / "memory.prof"
  profiler.save_device_memory_profile(str(path))
  assert path.read_bytes()[:2] == b"\x1f\x8b"
