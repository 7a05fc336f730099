"""The CPU sampler from Python: `python -m spyglass run --sample [HZ]`, its
bad values, and the sampler's advanced options through start_trace."""
import glob
import os
import subprocess
import sys

import pytest

from conftest import read_xspace, stat_value
from pprof_decode import parse_profile
from test_env_start import clean_env

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "sample_workload.py")


def sh(*argv, cwd=None, env=None):
  return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, cwd=cwd,
                        env=env or clean_env())


def truth_of(stdout):
  return {k: float(v) for k, v in (l.split() for l in stdout.splitlines() if len(l.split()) == 2)}


def one(pattern):
  found = glob.glob(pattern)
  assert len(found) == 1, (pattern, found)
  return found[0]


def host_plane(xplane_pb2, path):
  space = read_xspace(xplane_pb2, path)
  return next(p for p in space.planes if p.name == "/host:CPU")


def plane_stats(plane):
  return {plane.stat_metadata[s.metadata_id].name: stat_value(plane, s) for s in plane.stats}


def sample_lines(plane):
  return [l for l in plane.lines if l.name == "CPU samples"]


def test_run_sample_writes_samples_and_the_cpu_profile(tmp_path, xplane_pb2):
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "499", WORKLOAD, "1", cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  truth = truth_of(r.stdout)
  assert set(truth) >= {"burn_a", "burn_b", "burn_c", "cpu_seconds"}, r.stdout  # the program's own output
  # No --trace: the trace went into the current folder (-o's default).
  xplane = one(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  prof = one(os.path.join(os.path.dirname(xplane), "cpu.*.prof"))
  plane = host_plane(xplane_pb2, xplane)
  stats = plane_stats(plane)
  assert stats["cpu_sample_period_ns"] == 1000000000 // 499, stats
  assert stats["cpu_sample_mode"] == "cpu", stats
  lines = sample_lines(plane)
  assert lines and sum(len(l.events) for l in lines) == stats["cpu_samples"] > 0, stats
  # Both Python threads were sampled (the main one and "second").
  assert len(lines) >= 2, [l.display_name for l in lines]
  # The Python tracer was off: no Python function events on the host plane.
  names = {plane.event_metadata[e.metadata_id].name for l in plane.lines if l.name != "CPU samples" for e in l.events}
  assert not any(n.startswith("$") and "sample_workload.py" in n for n in names), sorted(names)[:20]
  with open(prof, "rb") as f:
    profile = parse_profile(f.read())
  assert sum(s["count"] for s in profile) == stats["cpu_samples"]
  assert all(s["bytes"] > 0 for s in profile)  # cpu/nanoseconds


def test_run_sample_default_rate_out_folder_and_mode(tmp_path, xplane_pb2):
  out = tmp_path / "out"
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "--sample-mode", "wall", "-o", str(out), WORKLOAD, "0.3",
         cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  xplane = one(str(out / "plugins" / "profile" / "*" / "*.xplane.pb"))
  stats = plane_stats(host_plane(xplane_pb2, xplane))
  assert stats["cpu_sample_period_ns"] == 1000000000 // 99, stats  # the default rate
  assert stats["cpu_sample_mode"] == "wall", stats
  # -o alone with --sample names the trace's folder: no memory profiles there.
  assert not glob.glob(str(out / "memory.*")), os.listdir(out)


def test_run_sample_with_trace_keeps_the_python_tracer(tmp_path, xplane_pb2):
  logs = tmp_path / "logs"
  r = sh(sys.executable, "-m", "spyglass", "run", "--trace", str(logs), "--sample=999", WORKLOAD, "0.3")
  assert r.returncode == 0, r.stderr
  xplane = one(str(logs / "plugins" / "profile" / "*" / "*.xplane.pb"))
  plane = host_plane(xplane_pb2, xplane)
  assert plane_stats(plane)["cpu_sample_period_ns"] == 1000000000 // 999
  names = {plane.event_metadata[e.metadata_id].name for l in plane.lines if l.name != "CPU samples" for e in l.events}
  assert any("burn_a" in n for n in names), sorted(names)[:20]  # the tracer's events are there too
  assert one(str(logs / "plugins" / "profile" / "*" / "cpu.*.prof"))


@pytest.mark.parametrize("args,message", [
    (["--sample", "0"], "--sample takes a rate from 1 to"),
    (["--sample", "99999999999"], "--sample takes a rate from 1 to"),
    (["--sample=-5"], "--sample takes a rate from 1 to"),
    (["--sample=fast"], "--sample takes a rate from 1 to"),
    (["--sample-mode", "wall"], "--sample-mode needs --sample"),
    (["--sample", "--sample-mode", "idle"], "--sample-mode must be cpu or wall"),
])
def test_run_sample_refuses_bad_values(tmp_path, args, message):
  r = sh(sys.executable, "-m", "spyglass", "run", *args, WORKLOAD, "0.1", cwd=str(tmp_path))
  assert r.returncode == 2, (r.returncode, r.stderr)
  assert message in r.stderr, r.stderr
  assert r.stdout == "" and not os.listdir(tmp_path), (r.stdout, os.listdir(tmp_path))


def test_options_key_through_the_environment(tmp_path, xplane_pb2):
  logs = tmp_path / "logs"
  r = sh(sys.executable, WORKLOAD, "0.3",
         env=clean_env(SPYGLASS_TRACE_DIR=str(logs), SPYGLASS_OPTIONS="spyglass_cpu_sample_hz=333"))
  assert r.returncode == 0, r.stderr
  xplane = one(str(logs / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert plane_stats(host_plane(xplane_pb2, xplane))["cpu_sample_period_ns"] == 1000000000 // 333


START_TRACE = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
import spyglass.profiler as p
import sample_workload
opts = p.ProfileOptions()
opts.python_tracer_level = 0
opts.advanced_configuration = {"spyglass_cpu_sample_hz": 777, "spyglass_cpu_sample_mode": "cpu"}
p.start_trace(sys.argv[1], profiler_options=opts)
for _ in range(20):
  sample_workload.burn_a()
p.stop_trace()
"""


def test_start_trace_passes_the_sampler_options(tmp_path, xplane_pb2):
  logs = tmp_path / "logs"
  r = sh(sys.executable, "-c", START_TRACE, str(logs), HERE)
  assert r.returncode == 0, r.stderr
  xplane = one(str(logs / "plugins" / "profile" / "*" / "*.xplane.pb"))
  plane = host_plane(xplane_pb2, xplane)
  assert plane_stats(plane)["cpu_sample_period_ns"] == 1000000000 // 777
  assert sum(len(l.events) for l in sample_lines(plane)) > 0
  assert one(str(logs / "plugins" / "profile" / "*" / "cpu.*.prof"))


BAD_OPTION = r"""
import spyglass.profiler as p
opts = p.ProfileOptions()
opts.advanced_configuration = {"spyglass_cpu_sample_hz": -1}
try:
  p.start_trace("%s", profiler_options=opts)
except Exception as e:
  print(type(e).__name__, e)
else:
  print("started")
"""


def test_start_trace_refuses_a_bad_rate_naming_the_key(tmp_path):
  r = sh(sys.executable, "-c", BAD_OPTION % (tmp_path / "logs"))
  assert r.returncode == 0, r.stderr
  assert "spyglass_cpu_sample_hz" in r.stdout and "started" not in r.stdout, r.stdout
