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


# ---- Python frames in the samples -------------------------------------------
FUNCTIONS = ("burn_a", "burn_b", "burn_c", "squeeze")


# The workload's own time: its two threads' loops (not the interpreter's
# start-up, which py-spy sees and a trace started by the program does not).
WORK = ("main_thread_work", "second_thread_work")


def python_shares(profile):
  """function -> % of the workload's CPU time in samples under it (its Python frame on the stack)."""
  total, inside = 0, dict.fromkeys(FUNCTIONS, 0)
  for s in profile:
    names = {f[0] for f in s["frames"]}
    if not names & set(WORK):
      continue
    total += s["bytes"]
    for fn in FUNCTIONS:
      if fn in names:
        inside[fn] += s["bytes"]
  return {fn: 100.0 * v / total for fn, v in inside.items()}


def pyspy_shares(raw_text):
  total, inside = 0, dict.fromkeys(FUNCTIONS, 0)
  for line in raw_text.splitlines():
    stack, _, count = line.rpartition(" ")
    if not count.isdigit():
      continue
    names = {f.split(" (")[0].rsplit(".", 1)[-1] for f in stack.split(";")}
    if not names & set(WORK):
      continue
    total += int(count)
    for fn in FUNCTIONS:
      if fn in names:
        inside[fn] += int(count)
  return {fn: 100.0 * v / total for fn, v in inside.items()}


def sampled_workload(tmp_path, hz=999, seconds="3"):
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", str(hz), WORKLOAD, seconds, cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  xplane = one(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  with open(one(os.path.join(os.path.dirname(xplane), "cpu.*.prof")), "rb") as f:
    return truth_of(r.stdout), parse_profile(f.read()), xplane


@pytest.mark.serial
def test_python_frames_among_the_native_ones(tmp_path, xplane_pb2):
  truth, profile, xplane = sampled_workload(tmp_path)
  shares = python_shares(profile)
  for fn in FUNCTIONS:
    print(f"{fn}: profile {shares[fn]:.1f}% truth {100 * truth[fn]:.1f}%")
  for fn in FUNCTIONS:
    assert abs(shares[fn] - 100 * truth[fn]) <= 3, (fn, shares, truth)
  # Python frames carry their file and line; the outermost of the main
  # thread's are the script's <module>, with the interpreter's native frames
  # (main, Py_RunMain...) outside them.
  workload_frames = [f for s in profile for f in s["frames"] if f[0] == "burn_a"]
  assert workload_frames and all(f[1] == WORKLOAD and f[2] > 0 for f in workload_frames), workload_frames[:3]
  main_stacks = [s["frames"] for s in profile if any(f[0] == "main_thread_work" for f in s["frames"])]
  assert main_stacks
  for frames in main_stacks[:50]:
    names = [f[0] for f in frames]
    outer = names[names.index("<module>") + 1:]
    assert names.index("main_thread_work") < names.index("<module>"), names
    assert any(n in ("Py_RunMain", "Py_BytesMain", "main") for n in outer), names
  # Time in zlib under squeeze: zlib's native frames inside the Python frame.
  under = [s["frames"] for s in profile if any(f[0] == "squeeze" for f in s["frames"])]
  native_inside = [fr for fr in under
                   if any(("deflate" in f[0] or "compress" in f[0]) and f[1] != WORKLOAD
                          for f in fr[:[g[0] for g in fr].index("squeeze")])]
  assert len(native_inside) >= len(under) // 2, under[:3]
  # The frames' kind in the model.
  plane = host_plane(xplane_pb2, xplane)
  kinds = set()
  for md in plane.event_metadata.values():
    for st in md.stats:
      if plane.stat_metadata[st.metadata_id].name == "cpu_frame_kind":
        kinds.add(stat_value(plane, st))
  assert kinds == {"python", "native"}, kinds


@pytest.mark.serial
def test_python_shares_agree_with_py_spy(tmp_path):
  """py-spy records the same run (the interpreter running `python -m spyglass
  run --sample`): one truth for both."""
  pyspy = os.path.join(os.path.dirname(sys.executable), "py-spy")
  if not os.access(pyspy, os.X_OK):
    pytest.skip("py-spy not installed (pip install py-spy)")
  out = tmp_path / "pyspy.txt"
  r = sh(pyspy, "record", "-r", "999", "-o", str(out), "--format", "raw", "--", sys.executable, "-m", "spyglass", "run",
         "--sample", "999", WORKLOAD, "3", cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  truth = truth_of(r.stdout)
  xplane = one(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  with open(one(os.path.join(os.path.dirname(xplane), "cpu.*.prof")), "rb") as f:
    ours = python_shares(parse_profile(f.read()))
  theirs = pyspy_shares(out.read_text())
  for fn in FUNCTIONS:
    print(f"{fn}: truth {100 * truth[fn]:.1f}%  spyglass {ours[fn]:.1f}%  py-spy {theirs[fn]:.1f}%")
  for fn in FUNCTIONS:
    assert abs(ours[fn] - 100 * truth[fn]) <= 3, (fn, ours, truth)
    # Within 3 points of py-spy, or py-spy is the farther from the truth: it
    # samples threads that are runnable, not only running, so on a machine
    # with more runnable threads than CPUs it counts time a thread waited for
    # a CPU (this CPU-time sampler does not).
    assert (abs(ours[fn] - theirs[fn]) <= 3 or
            abs(theirs[fn] - 100 * truth[fn]) > abs(ours[fn] - 100 * truth[fn])), (fn, ours, theirs, truth)


# ---- the Firefox Profiler file ----------------------------------------------
def _table(columns, **extra):
  """A processed-format table: `length` and each column an array."""
  props = {"length": {"type": "integer", "minimum": 0}}
  props.update({c: {"type": "array"} for c in columns})
  props.update(extra)
  return {"type": "object", "required": ["length"] + list(columns), "properties": props}


# The fields the Firefox Profiler's processed format (version 54, samply's)
# requires of a profile with samples, stacks and markers.
FIREFOX_SCHEMA = {
    "type": "object",
    "required": ["meta", "libs", "threads"],
    "properties": {
        "meta": {
            "type": "object",
            "required": ["version", "preprocessedProfileVersion", "interval", "startTime", "processType", "product",
                         "categories", "markerSchema", "symbolicated"],
            "properties": {
                "preprocessedProfileVersion": {"const": 54},
                "interval": {"type": "number", "exclusiveMinimum": 0},
                "categories": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["name", "color", "subcategories"]}},
            },
        },
        "libs": {"type": "array"},
        "threads": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["name", "isMainThread", "processType", "pid", "tid", "registerTime", "processStartupTime",
                         "samples", "markers", "stackTable", "frameTable", "funcTable", "resourceTable",
                         "nativeSymbols", "stringArray"],
            "properties": {
                "samples": _table(["stack", "time"], weightType={"enum": ["samples", "tracing-ms", "bytes"]}),
                "markers": _table(["name", "startTime", "endTime", "phase", "category", "data"]),
                "stackTable": _table(["frame", "prefix"]),
                "frameTable": _table(["address", "inlineDepth", "category", "subcategory", "func", "nativeSymbol",
                                      "innerWindowID", "implementation", "line", "column"]),
                "funcTable": _table(["name", "isJS", "relevantForJS", "resource", "fileName", "lineNumber",
                                     "columnNumber"]),
                "resourceTable": _table(["lib", "name", "host", "type"]),
                "nativeSymbols": _table(["libIndex", "address", "name", "functionSize"]),
                "stringArray": {"type": "array", "items": {"type": "string"}},
            },
        }},
    },
}


def test_firefox_profile_beside_the_trace(tmp_path, xplane_pb2):
  jsonschema = pytest.importorskip("jsonschema")
  import json  # pylint: disable=g-import-not-at-top
  logs = tmp_path / "logs"
  r = sh(sys.executable, "-m", "spyglass", "run", "--trace", str(logs), "--sample", "999", WORKLOAD, "1")
  assert r.returncode == 0, r.stderr
  xplane = one(str(logs / "plugins" / "profile" / "*" / "*.xplane.pb"))
  path = one(os.path.join(os.path.dirname(xplane), "firefox.*.json"))
  with open(path) as f:
    profile = json.load(f)
  jsonschema.validate(profile, FIREFOX_SCHEMA)
  stats = plane_stats(host_plane(xplane_pb2, xplane))
  threads = profile["threads"]
  assert sum(t["samples"]["length"] for t in threads) == stats["cpu_samples"]
  categories = [c["name"] for c in profile["meta"]["categories"]]
  seen_python = set()
  for t in threads:
    s, st, fr, fn, strings = t["samples"], t["stackTable"], t["frameTable"], t["funcTable"], t["stringArray"]
    for table in (s, st, fr, fn, t["markers"]):  # every column as long as its table
      assert all(len(v) == table["length"] for k, v in table.items() if isinstance(v, list)), table.keys()
    assert all(0 <= x < st["length"] for x in s["stack"])
    assert s["time"] == sorted(s["time"])
    assert all(p is None or 0 <= p < i for i, p in enumerate(st["prefix"]))  # callers come first
    assert all(0 <= x < fr["length"] for x in st["frame"])
    assert all(0 <= x < fn["length"] for x in fr["func"])
    assert all(0 <= x < len(strings) for x in fn["name"])
    for i in range(fr["length"]):
      name = strings[fn["name"][fr["func"][i]]]
      if categories[fr["category"][i]] == "Python":
        seen_python.add(name)
        if name == "burn_a":
          assert strings[fn["fileName"][fr["func"][i]]] == WORKLOAD and fr["line"][i] > 0
    # The tracer's Python function events of this thread are its markers.
    marks = {strings[x] for x in t["markers"]["name"]}
    if t["isMainThread"]:
      assert any("main_thread_work" in m for m in marks), sorted(marks)[:10]
      assert all(a <= b for a, b in zip(t["markers"]["startTime"], t["markers"]["endTime"]))
  assert {"burn_a", "burn_b", "burn_c", "squeeze"} <= seen_python, seen_python


# ---- spyglass summary / diff: the CPU tables --------------------------------
STEPS = r"""
import sys
sys.path.insert(0, sys.argv[1])
import sample_workload as w
from spyglass.profiler import StepTraceAnnotation
for step in range(4):
  with StepTraceAnnotation("train", step_num=step):
    for _ in range(40 if step % 2 == 0 else 12):
      w.burn_a()
    for _ in range(12):
      w.burn_b()
"""

SPYGLASS = os.path.join(os.path.dirname(sys.executable), "spyglass")


def cpu_rows(text, scope):
  """{label: total %} of the "top by total" rows of the CPU table whose
  scope starts with `scope` ("all threads:", "step 0:", "thread python")."""
  block = text.split(f"CPU time in {scope}", 1)[1].split("\n\n", 1)[0]
  total_part = block.split("function (top by total)", 1)[1]
  rows = {}
  for line in total_part.splitlines()[1:]:
    parts = line.rsplit(None, 3)
    if len(parts) == 4 and parts[3].endswith("%"):
      rows[parts[0].strip()] = float(parts[3].rstrip("%"))
  return rows


@pytest.mark.serial
def test_summary_tables_per_thread_and_step_and_diff(tmp_path):
  steps_dir, work_dir = tmp_path / "steps", tmp_path / "work"
  steps_dir.mkdir()
  work_dir.mkdir()
  script = tmp_path / "steps.py"
  script.write_text(STEPS)
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "999", str(script), HERE, cwd=str(steps_dir))
  assert r.returncode == 0, r.stderr
  s = sh(SPYGLASS, "summary", "-n", "50", str(steps_dir))
  assert s.returncode == 0, s.stderr
  assert "CPU time in all threads:" in s.stdout, s.stdout
  assert "cpu_stack#" not in s.stdout, s.stdout  # samples are not annotations
  # Per step: even steps burn 40 quanta of burn_a to 12 of burn_b, odd ones 12 to 12.
  for step, want in ((0, 100 * 40 / 52), (1, 50.0), (2, 100 * 40 / 52), (3, 50.0)):
    rows = cpu_rows(s.stdout, f"step {step}:")
    got = rows.get("burn_a (sample_workload.py)", 0.0)
    print(f"step {step}: burn_a {got:.1f}% of its CPU time, want {want:.1f}%")
    assert abs(got - want) <= 6, (step, rows)  # ~500 samples a step: 6 points is 3 sigma
  # Per thread: the main thread's table (the only busy one) holds burn_a and burn_b.
  thread_rows = cpu_rows(s.stdout, "thread python")
  assert "burn_a (sample_workload.py)" in thread_rows and "burn_b (sample_workload.py)" in thread_rows, thread_rows

  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "999", WORKLOAD, "2", cwd=str(work_dir))
  assert r.returncode == 0, r.stderr
  truth = truth_of(r.stdout)
  w = sh(SPYGLASS, "summary", "-n", "50", str(work_dir))
  work_all = cpu_rows(w.stdout, "all threads:")
  steps_all = cpu_rows(s.stdout, "all threads:")
  # The workload's functions' total times against its truth (their shares
  # are of all of the process's CPU time, the interpreter's start-up
  # included: compared as a ratio).
  ratio = work_all["burn_a (sample_workload.py)"] / work_all["burn_b (sample_workload.py)"]
  assert abs(ratio / (truth["burn_a"] / truth["burn_b"]) - 1) <= 0.1, (work_all, truth)
  d = sh(SPYGLASS, "diff", "-n", "50", str(steps_dir), str(work_dir))
  assert d.returncode == 0, d.stderr
  assert "CPU time by function" in d.stdout, d.stdout
  row = next(l for l in d.stdout.splitlines() if l.strip().startswith("burn_a (sample_workload.py)"))
  shares = [float(x.rstrip("%")) for x in row.split(")", 1)[1].split()]
  assert shares[2:] == [steps_all["burn_a (sample_workload.py)"], work_all["burn_a (sample_workload.py)"]], (row, shares)

  # The same CPU tables from code (spyglass.analysis) and in `diff --json`.
  import json
  from spyglass import analysis
  cli_summary = json.loads(sh(SPYGLASS, "summary", "--json", "-n", "50", str(steps_dir)).stdout)
  py_summary = analysis.summary(steps_dir, top=50)
  assert "cpu" in py_summary, sorted(py_summary)
  assert py_summary["cpu"] == cli_summary["cpu"]
  assert py_summary["cpu"]["samples"] > 0 and py_summary["cpu"]["steps"], py_summary["cpu"]["samples"]
  dj = sh(SPYGLASS, "diff", "--json", "-n", "50", str(steps_dir), str(work_dir))
  assert dj.returncode == 0, dj.stderr
  cli_diff = json.loads(dj.stdout)
  py_diff = analysis.diff(steps_dir, work_dir, top=50)
  assert py_diff["cpu"] == cli_diff["cpu"]
  c = py_diff["cpu"]
  assert c["base_samples"] == py_summary["cpu"]["samples"], (c["base_samples"], py_summary["cpu"]["samples"])
  burn_a = next(r for r in c["functions"] if r["function"] == "burn_a" and r["python"])
  # As the text diff shows them (total shares, percent to one decimal), and new - base.
  assert [float("%.1f" % (100 * burn_a[k])) for k in ("base_total_share", "new_total_share")] == shares[2:], burn_a
  for what in ("self_ns", "total_ns", "self_share", "total_share"):
    assert burn_a["delta_" + what] == pytest.approx(burn_a["new_" + what] - burn_a["base_" + what]), (what, burn_a)
  assert burn_a["base_samples"] > 0 and burn_a["new_samples"] > 0, burn_a
  # Each run's own tables, as `summary --json` has them.
  assert py_diff["base"]["cpu"]["samples"] == py_summary["cpu"]["samples"]
  assert py_diff["new"]["cpu"]["samples"] == c["new_samples"]


@pytest.mark.serial
def test_speedscope_reads_the_python_cpu_profile(tmp_path):
  """speedscope's web app in headless chromium (tests/browser) opens the
  pprof of a Python program and lists its Python and native functions."""
  browser = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "browser")
  if not os.path.isdir(os.path.join(browser, "node_modules", "speedscope")):
    pytest.skip("no tests/browser/node_modules (scripts/setup.sh runs npm ci there)")
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "999", WORKLOAD, "1", cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  prof = one(str(tmp_path / "plugins" / "profile" / "*" / "cpu.*.prof"))
  c = subprocess.run(["node", os.path.join(browser, "speedscope_check.mjs"), prof, "burn_a", "burn_b", "squeeze",
                      "main_thread_work"], capture_output=True, text=True, timeout=240,
                     env=dict(os.environ, SORT_BY_TOTAL="1"))
  assert c.returncode == 0, c.stdout + c.stderr


# ---- Python frames in off-CPU (wall mode) samples ----------------------------
BLOCKED_PROGRAM = '''\
import sys
import threading
import time

released = threading.Event()


def sleeper_sleeps():
  time.sleep(1.2)  # SLEEP_LINE


def waiter_waits():
  released.wait()  # WAIT_LINE


sleeper = threading.Thread(target=sleeper_sleeps, name="sleeper")
waiter = threading.Thread(target=waiter_waits, name="waiter")
sleeper.start()
waiter.start()
sleeper.join()
released.set()
waiter.join()
print("slept and waited")
sys.exit(3)
'''


@pytest.mark.parametrize("mechanism", ["perf", "timer"])
def test_off_cpu_samples_carry_the_blocked_threads_python_frames(tmp_path, mechanism):
  """Wall mode reads a blocked thread's Python frames without a signal: the
  sleeping thread's and the waiting thread's samples name their functions
  (file:line) above the off-CPU leaf; the program's output and exit stay its
  own. Both on-CPU mechanisms (perf events, the timer fallback) take them."""
  env = clean_env(**({"SPYGLASS_SAMPLER_FORCE_TIMER": "1"} if mechanism == "timer" else {}))
  prog = tmp_path / "blocked.py"
  prog.write_text(BLOCKED_PROGRAM)
  lines = BLOCKED_PROGRAM.splitlines()
  sleep_line = next(i + 1 for i, l in enumerate(lines) if "SLEEP_LINE" in l)
  wait_line = next(i + 1 for i, l in enumerate(lines) if "WAIT_LINE" in l)
  r = sh(sys.executable, "-m", "spyglass", "run", "--sample", "499", "--sample-mode", "wall", str(prog),
         cwd=str(tmp_path), env=env)
  assert r.returncode == 3, r.stderr
  assert r.stdout == "slept and waited\n", r.stdout
  xplane = one(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  with open(one(os.path.join(os.path.dirname(xplane), "cpu.*.prof")), "rb") as f:
    profile = parse_profile(f.read())

  def blocked_under(function, line):
    """Samples whose stack has `function` at prog:line above an off-CPU leaf frame."""
    found = 0
    for s in profile:
      names = [f[0] for f in s["frames"]]
      if function not in names:
        continue
      at = names.index(function)
      frame = s["frames"][at]
      off = [i for i, n in enumerate(names) if n.startswith("[off CPU")]
      if off and off[0] < at and frame[1] == str(prog) and frame[2] == line:
        found += s["count"]
    return found

  sleeping = blocked_under("sleeper_sleeps", sleep_line)
  waiting = blocked_under("waiter_waits", wait_line)
  off_names = sorted({n for s in profile for n, _, _ in s["frames"] if n.startswith("[off CPU")})
  # 1.2 s blocked at 499 Hz: hundreds of samples each.
  assert sleeping >= 100, (sleeping, off_names)
  assert waiting >= 100, (waiting, off_names)
  # The Python frames sit among the native ones: the thread's bootstrap frames outside the function.
  for s in profile:
    names = [f[0] for f in s["frames"]]
    if "sleeper_sleeps" in names and names[0].startswith("[off CPU"):
      assert names.index("sleeper_sleeps") < names.index("_bootstrap_inner"), names
