"""spyglass.analysis: summary and diff as dicts, on known traces written here
(exact durations, checked number by number) and on files written by real JAX
(checked against the raw events read with the generated protobuf classes)."""
import glob
import os

import numpy as np
import pytest

from conftest import host_events, run_python
import spyglass
from spyglass import analysis

MS_PS = 1_000_000_000  # ps in a millisecond


def write_known(xplane_pb2, path, matmul_scale=1.0):
  """Steps "train" 0..9 of 10..100 ms; in each, "forward" (40%) holding
  "matmul" (25%, times matmul_scale), then "backward" (30%)."""
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name="/host:CPU")
  for i, name in enumerate(["train", "forward", "matmul", "backward"], start=1):
    plane.event_metadata[i].id = i
    plane.event_metadata[i].name = name
  plane.stat_metadata[1].id = 1
  plane.stat_metadata[1].name = "step_num"
  line = plane.lines.add(id=1, name="main")
  t = 0
  for i in range(10):
    step = (i + 1) * 10 * MS_PS
    matmul = int(step // 4 * matmul_scale)
    forward = step * 4 // 10 - step // 4 + matmul
    total = step - step // 4 + matmul
    e = line.events.add(metadata_id=1, offset_ps=t, duration_ps=total)
    e.stats.add(metadata_id=1, int64_value=i)
    line.events.add(metadata_id=2, offset_ps=t, duration_ps=forward)
    line.events.add(metadata_id=3, offset_ps=t, duration_ps=matmul)
    line.events.add(metadata_id=4, offset_ps=t + forward, duration_ps=step * 3 // 10)
    t += total
  with open(path, "wb") as f:
    f.write(space.SerializeToString())
  return str(path)


def self_times(events, name):
  """Sum over `name`'s events of their duration less that of the events
  directly inside them on the same line (ps -> ns)."""
  total = 0
  for line, n, start, end, _ in events:
    if n != name:
      continue
    inside = [e for e in events if e[0] == line and e[2] >= start and e[3] <= end and e[2:4] != (start, end)]
    direct = [e for e in inside if not any(o is not e and o[2] <= e[2] and e[3] <= o[3] and o[2:4] != e[2:4]
                                           for o in inside)]
    total += (end - start) - sum(e[3] - e[2] for e in direct)
  return total / 1000


def row(rows, name):
  return next(r for r in rows if r["name"] == name)


def test_summary_known_numbers(xplane_pb2, tmp_path):
  s = analysis.summary(write_known(xplane_pb2, tmp_path / "a.xplane.pb"), top=0)
  d = s["steps"]["duration"]
  assert s["steps"]["name"] == "train"
  assert d["count"] == 10
  assert d["p50_ns"] == 55e6
  assert d["p90_ns"] == pytest.approx(91e6, abs=1e-3)
  assert d["p99_ns"] == pytest.approx(99.1e6, abs=1e-3)
  assert d["max_ns"] == 100e6
  assert [st["number"] for st in s["steps"]["slowest"]] == [9, 8, 7, 6, 5]
  forward = row(s["top_total"], "forward")
  assert (forward["count"], forward["total_ns"], forward["self_ns"]) == (10, 220e6, 82.5e6)
  assert row(s["top_total"], "train")["self_ns"] == 165e6
  assert s["threads"][0]["name"] == "main" and s["threads"][0]["busy_ns"] == 550e6
  only = analysis.summary(str(tmp_path / "a.xplane.pb"), steps=(3, 4))
  assert only["steps"]["duration"]["count"] == 2
  assert row(only["top_total"], "forward")["total_ns"] == 36e6


def test_diff_finds_the_slower_annotation(xplane_pb2, tmp_path):
  base = write_known(xplane_pb2, tmp_path / "base.xplane.pb")
  slow = write_known(xplane_pb2, tmp_path / "slow.xplane.pb", matmul_scale=2)
  d = analysis.diff(base, slow, fail_above=30, annotations=["matmul"])
  assert d["self"][0]["name"] == "matmul"
  assert d["self"][0]["delta_pct"] == pytest.approx(100)
  assert all(abs(r["delta_ns"]) < 1 for r in d["self"][1:])
  assert d["steps"][0]["delta_pct"] == pytest.approx(25)
  assert not d["passed"] and len(d["failures"]) == 1 and "'matmul' regressed +100.0%" in d["failures"][0]
  same = analysis.diff(base, base, fail_above=0, annotations=["matmul"])
  assert same["passed"] and same["failures"] == []


def test_errors(tmp_path):
  bad = tmp_path / "x.xplane.pb"
  bad.write_bytes(b"not a profile at all\n")
  with pytest.raises(spyglass.InvalidArgumentError, match="is not a profile"):
    analysis.summary(str(bad))
  with pytest.raises(RuntimeError, match="no such file"):
    analysis.summary(str(tmp_path / "missing"))


JAX_PROGRAM = """
import sys, time
import {module} as profiler
options = profiler.ProfileOptions()
options.python_tracer_level = 0  # only the annotations: outer's self time is its own sleep
with profiler.trace(sys.argv[1], profiler_options=options):
    for step in range(6):
        with profiler.StepTraceAnnotation("train", step_num=step):
            with profiler.TraceAnnotation("outer"):
                with profiler.TraceAnnotation("inner"):
                    time.sleep(0.004 * (1 + step % 3))
                time.sleep(0.002)
"""


def have_jax():
  try:
    import jax.profiler  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def record(module, log_dir):
  run_python(JAX_PROGRAM.format(module=module), str(log_dir), env={"JAX_PLATFORMS": "cpu"}, timeout=240)
  files = glob.glob(os.path.join(str(log_dir), "plugins", "profile", "*", "*.xplane.pb"))
  assert len(files) == 1, files
  return files[0]


@pytest.mark.skipif(not have_jax(), reason="jax not installed")
def test_jax_written_file(xplane_pb2, tmp_path):
  path = record("jax.profiler", tmp_path / "jax")
  s = analysis.summary(str(tmp_path / "jax"), top=0)  # the log dir: its newest run
  assert s["file"] == path
  assert s["producer"].startswith("jax ")
  # The numbers from the raw events, read here with protobuf.
  events = host_events(xplane_pb2, path)
  steps = sorted((e[3] - e[2]) / 1000 for e in events if e[1] == "train")
  assert len(steps) == 6
  d = s["steps"]["duration"]
  assert s["steps"]["name"] == "train" and d["count"] == 6
  assert d["p50_ns"] == pytest.approx(np.percentile(steps, 50), abs=1)
  assert d["p99_ns"] == pytest.approx(np.percentile(steps, 99), abs=1)
  assert d["max_ns"] == pytest.approx(max(steps), abs=1)
  outer = [(e[3] - e[2]) / 1000 for e in events if e[1] == "outer"]
  r_outer = row(s["top_total"], "outer")
  assert r_outer["count"] == 6
  assert r_outer["total_ns"] == pytest.approx(sum(outer), abs=6)
  # outer's self time: itself less inner, about 2 ms a step.
  assert r_outer["self_ns"] == pytest.approx(self_times(events, "outer"), abs=6)
  assert row(s["top_total"], "train")["self_ns"] == pytest.approx(self_times(events, "train"), abs=6)
  assert r_outer["self_ns"] >= 6 * 2e6 * 0.99
  # A diff of JAX's run against Spyglass's of the same program: rows matched by name.
  ours = record("spyglass.profiler", tmp_path / "ours")
  d = analysis.diff(path, ours, fail_above=1e6)
  assert d["passed"] and d["per_step"]
  names = {r["name"] for r in d["annotations"]}
  assert {"outer", "inner", "train"} <= names
  assert analysis.summary(ours)["producer"].startswith("spyglass ")


XPROF_STEPS = """
import json, sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "input_pipeline_analyzer", {"use_saved_result": False})
for table in json.loads(data):
    cols = [c.get("id") for c in table.get("cols", [])]
    if "stepnum" in cols and "stepTimeMs" in cols:
        print(json.dumps({r["c"][cols.index("stepnum")]["v"]: r["c"][cols.index("stepTimeMs")]["v"] for r in table["rows"]}))
"""


def have_xprof():
  try:
    import xprof.convert  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


@pytest.mark.skipif(not have_jax() or not have_xprof(), reason="jax or xprof not installed")
@pytest.mark.parametrize("module", ["jax.profiler", "spyglass.profiler"])
def test_step_times_match_xprof(module, tmp_path):
  """Our step durations against XProf's own step table (the peer's numbers)."""
  path = record(module, tmp_path / "run")
  p = run_python(XPROF_STEPS, path, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
  xprof_ms = __import__("json").loads(p.stdout.strip().splitlines()[-1])
  s = analysis.summary(path)
  ours = {f"{s['steps']['name']} {st['number']}": st["duration_ns"] for st in s["steps"]["all"]}
  assert len(ours) == 6
  # XProf may leave out the first and last steps (it trims steps at the
  # capture's edges); every step it shows must be ours, with our duration.
  assert len(xprof_ms) >= 4 and set(xprof_ms) <= set(ours), (xprof_ms, ours)
  for name, ms in xprof_ms.items():
    assert ours[name] == pytest.approx(ms * 1e6, abs=2), name  # XProf prints ms to 6 decimals
