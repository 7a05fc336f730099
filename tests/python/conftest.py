"""Helpers for the Python package's tests: read what a trace wrote."""
import gzip
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def xplane_pb2():
  """xplane_pb2 generated from the repository's proto/xplane.proto (needs protoc)."""
  protoc = shutil.which("protoc")
  # scripts/setup.sh installs it (protobuf-compiler); a missing one is a broken setup, not a skip.
  assert protoc is not None, "protoc not installed (run scripts/setup.sh)"
  out = tempfile.mkdtemp(prefix="sg_pb2_")
  subprocess.run([protoc, f"--python_out={out}", f"-I{REPO}/proto", f"{REPO}/proto/xplane.proto"], check=True)
  sys.path.insert(0, out)
  try:
    return importlib.import_module("xplane_pb2")
  finally:
    sys.path.remove(out)


def read_xspace(xplane_pb2, path):
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  return space


def stat_value(plane, stat):
  kind = stat.WhichOneof("value")
  if kind == "ref_value":
    return plane.stat_metadata[stat.ref_value].name
  return getattr(stat, kind)


def host_events(xplane_pb2, path):
  """[("<tid>:<line name>", event_name, start_ps, end_ps, {stat: typed value})] of /host:CPU."""
  space = read_xspace(xplane_pb2, path)
  plane = next(p for p in space.planes if p.name == "/host:CPU")
  out = []
  for line in plane.lines:
    for e in line.events:
      stats = {plane.stat_metadata[s.metadata_id].name: stat_value(plane, s) for s in e.stats}
      out.append((f"{line.id}:{line.name}", plane.event_metadata[e.metadata_id].name, e.offset_ps,
                  e.offset_ps + e.duration_ps, stats))
  return out


def json_events(path):
  """Complete ('X') events of a trace.json.gz."""
  with gzip.open(path, "rt") as f:
    data = json.load(f)
  return [e for e in data["traceEvents"] if e.get("ph") == "X"]


def run_python(code, *args, env=None, timeout=120):
  """Runs `code` in a fresh interpreter; returns the CompletedProcess (checked)."""
  full_env = dict(os.environ)
  if env:
    full_env.update(env)
  p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                     env=full_env, timeout=timeout)
  assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
  return p


@pytest.fixture(autouse=True)
def no_trace_left():
  """A test that fails mid-trace must not leave the next one "already started"."""
  yield
  import spyglass.profiler as profiler  # pylint: disable=g-import-not-at-top
  try:
    profiler.stop_trace()
  except RuntimeError:
    pass


def pytest_configure(config):
  config.addinivalue_line("markers", "real: programs nobody here wrote, unmodified (test_real_programs.py)")
  # Shares of CPU time checked to 3 points against the truth and a peer, and
  # speedscope's tables of a sampled run: scripts/python_test.sh runs these
  # alone, after the parallel run (two tests at once on two cores left shares
  # 3.1 points off, and a 10% function out of speedscope's sandwich table).
  config.addinivalue_line("markers", "serial: run alone, not beside other tests (scripts/python_test.sh)")
