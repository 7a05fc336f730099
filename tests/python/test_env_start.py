"""Profiling started from outside a Python program: the SPYGLASS_* environment
on an unmodified script (spyglass-autostart.pth), captured by spyglass's and
JAX's clients, bad values, and `python -m spyglass run`."""
import glob
import os
import re
import subprocess
import sys
import textwrap

from conftest import json_events

SCRIPT = textwrap.dedent("""\
    import sys
    def leaf(i):
        return i * 2
    def work(n):
        return sum(leaf(i) for i in range(n))
    print("ARGS", sys.argv[1:], flush=True)
    if sys.argv[1:2] == ["serve"]:   # until stdin closes
        print("RUNNING", flush=True)
        import select
        while not select.select([sys.stdin], [], [], 0.01)[0]:
            work(50)
    else:
        for _ in range(3):
            work(10)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "exit" else 0)
    """)


def clean_env(**kv):
  env = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_")}
  env.update(kv)
  return env


def write_script(tmp_path):
  p = tmp_path / "unmodified.py"
  p.write_text(SCRIPT)
  return str(p)


def trace_events(log_dir):
  files = [f for f in glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.trace.json.gz"))
           if not os.path.basename(f).startswith("perfetto")]
  assert len(files) == 1, files
  return json_events(files[0])


def check_script_functions(events):
  names = [e["name"] for e in events]
  assert names.count("$unmodified.py:4 work") >= 3, sorted(set(names))[:40]
  assert "$unmodified.py:2 leaf" in names
  # leaf runs inside work's generator, inside work, on one thread.
  work = next(e for e in events if e["name"] == "$unmodified.py:4 work")
  leaves = [e for e in events if e["name"] == "$unmodified.py:2 leaf" and
            work["ts"] <= e["ts"] <= work["ts"] + work["dur"]]
  assert leaves and all(l["tid"] == work["tid"] for l in leaves)


def test_env_trace_dir_on_an_unmodified_script(tmp_path):
  script = write_script(tmp_path)
  logs = str(tmp_path / "logs")
  r = subprocess.run([sys.executable, script, "a", "b"], capture_output=True, text=True, timeout=120,
                     env=clean_env(SPYGLASS_TRACE_DIR=logs))
  assert r.returncode == 0, r.stderr
  assert "ARGS ['a', 'b']" in r.stdout
  assert "spyglass: trace written to " + logs in r.stderr
  events = trace_events(logs)
  check_script_functions(events)
  # Nothing was cut by the stop: the exit hook's own frames are not recorded.
  assert not [e for e in events if e.get("args", {}).get("incomplete")], \
      [e["name"] for e in events if e.get("args", {}).get("incomplete")]


def test_env_options_turn_the_python_tracer_off(tmp_path):
  script = write_script(tmp_path)
  logs = str(tmp_path / "logs")
  r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120,
                     env=clean_env(SPYGLASS_TRACE_DIR=logs, SPYGLASS_OPTIONS="python_tracer_level=0"))
  assert r.returncode == 0, r.stderr
  assert not [e for e in trace_events(logs) if e["name"].startswith("$")]


def capture_env_server(tmp_path, client):
  script = write_script(tmp_path)
  p = subprocess.Popen([sys.executable, script, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=clean_env(SPYGLASS_SERVER_PORT="0"))
  try:
    port = None
    for _ in range(20):
      m = re.search(r"spyglass: profiler server on 127\.0\.0\.1:(\d+)", p.stderr.readline())
      if m:
        port = int(m.group(1))
        break
    assert port, "no server line on stderr"
    assert p.stdout.readline().startswith("ARGS")
    assert p.stdout.readline().strip() == "RUNNING"
    logs = str(tmp_path / "capture")
    r = subprocess.run([sys.executable, "-m", client, str(port), "500", "--log_dir", logs, "--no_perfetto_link"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
  finally:
    out, err = p.communicate(timeout=60)
  assert p.returncode == 0, err
  xplanes = glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(xplanes) == 1, xplanes
  return xplanes[0]


def test_env_server_captured_by_spyglass_collect(tmp_path, xplane_pb2):
  from conftest import host_events  # pylint: disable=g-import-not-at-top
  xplane = capture_env_server(tmp_path, "spyglass.collect_profile")
  names = {e[1] for e in host_events(xplane_pb2, xplane)}
  assert "$unmodified.py:4 work" in names and "$unmodified.py:2 leaf" in names, sorted(names)[:40]


def test_env_server_captured_by_jax_collect_profile(tmp_path):
  xplane = capture_env_server(tmp_path, "jax.collect_profile")
  # Read with jaxlib's own reader, in a process of its own (jax stays out of this one).
  r = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
      import sys
      from jax.profiler import ProfileData
      with open(sys.argv[1], "rb") as f:
          data = ProfileData.from_serialized_xspace(f.read())
      names = {e.name for line in data.find_plane_with_name("/host:CPU").lines for e in line.events}
      print("\\n".join(sorted(names)))
      """), xplane], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  names = set(r.stdout.splitlines())
  assert "$unmodified.py:4 work" in names, sorted(names)[:40]


def test_env_bad_values_one_line_and_the_script_runs(tmp_path):
  script = write_script(tmp_path)
  for name, value in [("SPYGLASS_SERVER_PORT", "abc"), ("SPYGLASS_FLIGHT_RECORDER", "0"),
                      ("SPYGLASS_OPTIONS", "python_tracer_level=7"), ("SPYGLASS_OPTIONS", "nope=1"),
                      ("SPYGLASS_SERVER_PORT", "9" * 50000)]:
    logs = tmp_path / f"logs-{name}-{len(value)}"
    r = subprocess.run([sys.executable, script, "x"], capture_output=True, text=True, timeout=120,
                       env=clean_env(SPYGLASS_TRACE_DIR=str(logs), **{name: value}))
    assert r.returncode == 0 and "ARGS ['x']" in r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("spyglass: " + name), r.stderr[:500]
    assert "running without profiling" in lines[0] and len(lines[0]) < 1200
    assert not logs.exists()


def run_module(*args, env=None, cwd=None):
  return subprocess.run([sys.executable, "-m", "spyglass", "run", *args], capture_output=True, text=True,
                        timeout=120, env=env or clean_env(), cwd=cwd)


def test_python_m_spyglass_run_script(tmp_path):
  script = write_script(tmp_path)
  logs = str(tmp_path / "logs")
  r = run_module("--trace", logs, script, "exit", "3")
  assert r.returncode == 3, r.stderr  # the script's own exit status
  assert "ARGS ['exit', '3']" in r.stdout
  events = trace_events(logs)
  check_script_functions(events)
  assert "$unmodified.py:1 <module>" in [e["name"] for e in events]


def test_python_m_spyglass_run_module_with_annotations(tmp_path):
  (tmp_path / "annotated_mod.py").write_text(textwrap.dedent("""\
      import sys
      import spyglass.profiler as profiler   # jax.profiler-style code
      @profiler.annotate_function
      def step(i):
          with profiler.TraceAnnotation("inner", i=i):
              return sum(range(i))
      if __name__ == "__main__":
          print("ARGV", sys.argv, flush=True)
          for i in range(2):
              with profiler.StepTraceAnnotation("train", step_num=i):
                  step(i)
      """))
  logs = str(tmp_path / "logs")
  r = run_module("--trace", logs, "-m", "annotated_mod", "--flag", cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr
  # As `python -m annotated_mod --flag`: argv[0] is the module's file.
  assert re.search(r"ARGV \['[^']*/annotated_mod\.py', '--flag'\]", r.stdout), r.stdout
  events = trace_events(logs)
  trains = [e for e in events if e["name"] == "train"]
  inner = [e for e in events if e["name"] == "inner"]
  steps = [e for e in events if e["name"] == "step"]
  assert len(trains) == 2 and len(inner) == 2 and len(steps) == 2
  # train > step (annotate_function) > inner > $builtins sum, on one thread.
  for t, s, i in zip(trains, steps, inner):
    assert t["ts"] <= s["ts"] <= i["ts"] and i["ts"] + i["dur"] <= s["ts"] + s["dur"] <= t["ts"] + t["dur"]
  sums = [e for e in events if e["name"] == "$builtins sum"]
  assert any(inner[1]["ts"] <= e["ts"] <= inner[1]["ts"] + inner[1]["dur"] for e in sums)


def test_python_m_spyglass_run_bad_flags(tmp_path):
  script = write_script(tmp_path)
  # (No flags at all is memory mode: test_python_heap.py.)
  for flags in (["--server", "nope"], ["--options", "bogus=1"], ["--unknown"], ["--python-allocator", "jemalloc"],
                ["-o", str(tmp_path / "mem"), "--trace", str(tmp_path / "logs"), "--python-allocator", "x"],
                ["-o", str(tmp_path / "mem"), "--trace", str(tmp_path / "logs"), "--options", "bogus=1"]):
    r = run_module(*flags, script)
    assert r.returncode == 2, (flags, r.stdout, r.stderr)
    assert "ARGS" not in r.stdout and r.stderr.startswith("python -m spyglass run: "), r.stderr
    assert "memory profiles" not in r.stderr and not os.path.exists(tmp_path / "mem"), r.stderr  # no child ran


def test_python_m_spyglass_run_flight_recorder(tmp_path):
  script = write_script(tmp_path)
  logs = str(tmp_path / "logs")
  r = run_module("--flight-recorder", "5", "--trace", logs, script)
  assert r.returncode == 0, r.stderr
  assert "spyglass: flight recorder on, keeping the last 5 s; dumps go to " + logs in r.stderr
  assert "spyglass: flight recorder's last window written to " + logs in r.stderr
  check_script_functions(trace_events(logs))


def test_python_m_spyglass_run_trace_and_memory(tmp_path):
  """--trace with -o: a trace and a heap profile of one run of the program."""
  from pprof_decode import parse_profile  # pylint: disable=g-import-not-at-top
  script = write_script(tmp_path)
  logs, mem = str(tmp_path / "logs"), str(tmp_path / "mem")
  r = run_module("--trace", logs, "-o", mem, script, "exit", "3")
  assert r.returncode == 3, r.stderr  # the script's own exit status
  assert "ARGS ['exit', '3']" in r.stdout
  assert "spyglass: trace written to " + logs in r.stderr, r.stderr
  check_script_functions(trace_events(logs))
  [prof] = glob.glob(os.path.join(mem, "memory.*.exit.prof"))
  assert os.path.basename(prof) in r.stderr, r.stderr  # the closing summary names it
  with open(prof, "rb") as f:
    samples = parse_profile(f.read())
  # Python frames of the script in the heap profile: the same program ran under both.
  assert any(path == script for s in samples for _, path, _ in s["frames"]), samples[:3]
