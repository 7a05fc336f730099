"""Profiling started from outside an unmodified C++ program (env_program links
libspyglass and starts nothing itself). Fails, never skips.

  env_start_test.py CASE ENV_PROGRAM SPYGLASS_CLI
    env_trace_dir           SPYGLASS_TRACE_DIR: a trace from start to exit
    env_server_collect      SPYGLASS_SERVER_PORT=0: `spyglass collect` captures it
    env_server_jax_collect  ... and `python -m jax.collect_profile` (the real peer)
    env_bad_values          each bad value: one line on stderr, the program runs on, nothing written
    env_spyglass_run        `spyglass run --trace / --server / --options` on the same program
    env_flight_recorder     SPYGLASS_FLIGHT_RECORDER + SERVER_PORT: `spyglass collect --flight-recorder`
                            fetches the ring, and the exit writes the last window; `spyglass run
                            --flight-recorder` the same
"""
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def fail(msg):
  print("FAIL: " + msg, flush=True)
  sys.exit(1)


def env_with(**kv):
  env = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_")}
  env.update(kv)
  return env


def trace_json_events(log_dir):
  files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  # The trace JSON is written once: no perfetto_trace.json.gz copy beside it.
  copies = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  if copies:
    fail(f"the trace JSON was written twice: {copies}")
  if len(files) != 1:
    fail(f"expected one trace.json.gz under {log_dir}, found {files}")
  with gzip.open(files[0], "rt") as f:
    return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def check_steps(events, where):
  names = [e["name"] for e in events]
  steps = [e for e in events if e["name"] == "env_step"]
  if not steps or "env_work" not in names:
    fail(f"{where}: no env_step/env_work annotations among {sorted(set(names))[:20]}")
  # Each step holds its work: nesting survived.
  work = [e for e in events if e["name"] == "env_work"]
  s = steps[len(steps) // 2]
  inside = [w for w in work if w["tid"] == s["tid"] and s["ts"] <= w["ts"] and w["ts"] + w["dur"] <= s["ts"] + s["dur"]]
  if len(inside) != 1:
    fail(f"{where}: step {s} holds {len(inside)} env_work events")
  return len(steps)


def run_timed(cmd, env):
  """Runs cmd to its own end (stdin held open: env_program stops on its SECONDS)."""
  r_fd, w_fd = os.pipe()
  try:
    return subprocess.run(cmd, stdin=r_fd, capture_output=True, text=True, env=env, timeout=60)
  finally:
    os.close(r_fd)
    os.close(w_fd)


def start_program(prog, env, seconds=60, cmd_prefix=()):
  p = subprocess.Popen([*cmd_prefix, prog, str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env)
  line = p.stdout.readline().strip()
  if line != "RUNNING":
    p.kill()
    fail(f"program did not start: {line!r} {p.stderr.read()}")
  return p


def server_port(p):
  """The port of the line `spyglass: profiler server on 127.0.0.1:<port> ...` (stderr)."""
  for _ in range(20):
    line = p.stderr.readline()
    m = re.search(r"spyglass: profiler server on 127\.0\.0\.1:(\d+)", line)
    if m:
      return int(m.group(1))
  p.kill()
  fail("no 'profiler server on' line on stderr")


def finish(p):
  out, err = p.communicate(timeout=60)  # closes stdin: the program stops
  if p.returncode != 0 or "DONE" not in out:
    fail(f"program exited {p.returncode}: {out!r} {err!r}")
  return out, err


def trace_dir_case(prog, cli):
  d = tempfile.mkdtemp(prefix="sg-env-trace-")
  r = run_timed([prog, "0.5"], env_with(SPYGLASS_TRACE_DIR=d, SPYGLASS_OPTIONS="host_tracer_level=1"))
  if r.returncode != 0 or "DONE" not in r.stdout:
    fail(f"program exited {r.returncode}: {r.stdout!r} {r.stderr!r}")
  out, err = r.stdout, r.stderr
  n = check_steps(trace_json_events(d), "SPYGLASS_TRACE_DIR")
  done = int(out.split()[-1])
  if n != done:  # from the first step to the last: the trace spans the whole run
    fail(f"the trace has {n} steps, the program ran {done}")
  if "spyglass: trace written to " + d not in err:
    fail(f"no 'trace written to' line: {err!r}")
  print(f"PASS: {n} steps traced from start to exit")


def collect_case(prog, cli, jax):
  p = start_program(prog, env_with(SPYGLASS_SERVER_PORT="0"))
  try:
    port = server_port(p)
    d = tempfile.mkdtemp(prefix="sg-env-collect-")
    if jax:
      cmd = [sys.executable, "-m", "jax.collect_profile", str(port), "400", "--log_dir", d, "--no_perfetto_link"]
    else:
      cmd = [cli, "collect", str(port), "400", "--log_dir", d, "--no_perfetto_link"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if r.returncode != 0:
      fail(f"{cmd[0]} exited {r.returncode}: {r.stdout} {r.stderr}")
  finally:
    finish(p)
  xplanes = glob.glob(os.path.join(d, "plugins", "profile", "*", "*.xplane.pb"))
  if len(xplanes) != 1:
    fail(f"expected one xplane.pb, found {xplanes}")
  if jax:  # read with jaxlib's own reader
    from jax.profiler import ProfileData
    with open(xplanes[0], "rb") as f:
      data = ProfileData.from_serialized_xspace(f.read())
    names = {e.name for line in data.find_plane_with_name("/host:CPU").lines for e in line.events}
    if not {"env_step", "env_work"} <= names:
      fail(f"jax.collect_profile's capture lacks the annotations: {sorted(names)[:20]}")
  else:
    check_steps(trace_json_events(d), "spyglass collect")
  print(f"PASS: {'jax.collect_profile' if jax else 'spyglass collect'} captured the env-started server")


BAD = [
    ("SPYGLASS_SERVER_PORT", "abc"),
    ("SPYGLASS_SERVER_PORT", "70000"),
    ("SPYGLASS_SERVER_PORT", ":99"),
    ("SPYGLASS_FLIGHT_RECORDER", "-1"),
    ("SPYGLASS_FLIGHT_RECORDER", "soon"),
    ("SPYGLASS_OPTIONS", "host_tracer_level"),
    ("SPYGLASS_OPTIONS", "host_tracer_level=9"),
    ("SPYGLASS_OPTIONS", "no_such_key=1"),
    ("SPYGLASS_OPTIONS", "tpu_trace_mode=FAST"),
    ("SPYGLASS_SERVER_PORT", "x" * 100000),
]


def bad_values_case(prog, cli):
  for name, value in BAD:
    d = tempfile.mkdtemp(prefix="sg-env-bad-")
    env = env_with(SPYGLASS_TRACE_DIR=os.path.join(d, "logs"), **{name: value})
    r = run_timed([prog, "0.2"], env)
    what = f"{name}={value[:20]!r}"
    if r.returncode != 0 or "DONE" not in r.stdout:
      fail(f"{what}: the program did not run on: exit {r.returncode} {r.stdout!r}")
    lines = r.stderr.splitlines()
    if len(lines) != 1 or not lines[0].startswith("spyglass: " + name) or "running without profiling" not in lines[0]:
      fail(f"{what}: expected one 'spyglass: {name}...' line, got {r.stderr[:500]!r}")
    if len(lines[0]) > 1200:
      fail(f"{what}: the error line echoes the value ({len(lines[0])} bytes)")
    if os.path.exists(os.path.join(d, "logs")):
      fail(f"{what}: a trace was written although a value was bad")
  print(f"PASS: {len(BAD)} bad values, each one line, the program ran unprofiled")


def spyglass_run_case(prog, cli):
  d = tempfile.mkdtemp(prefix="sg-env-run-")
  r = run_timed([cli, "run", "--trace", d, "--options", "host_tracer_level=1", "--", prog, "0.3"], env_with())
  if r.returncode != 0 or "DONE" not in r.stdout:
    fail(f"spyglass run --trace exited {r.returncode}: {r.stdout} {r.stderr}")
  check_steps(trace_json_events(d), "spyglass run --trace")
  if glob.glob("memory.*.prof"):
    fail("spyglass run --trace also wrote memory profiles")
  if not re.search(r"trace written to \S+ \([1-9][0-9]* annotated events on 1 threads\)", r.stderr):
    fail(f"spyglass run --trace does not say what the trace holds: {r.stderr!r}")
  # A program that annotates nothing (a real one): the trace says so, and how to get more.
  e = tempfile.mkdtemp(prefix="sg-env-run-empty-")
  r = run_timed([cli, "run", "--trace", e, "--", "sqlite3", ":memory:", "select 1;"], env_with())
  if r.returncode != 0 or "(0 annotated events on 0 threads)" not in r.stderr or "--memory --trace" not in r.stderr:
    fail(f"spyglass run --trace of an unannotated program: exit {r.returncode}, {r.stderr!r}")
  # One folder for a run's trace and memory profiles, and the parent says where
  # they went even when the program closes its stderr at exit (sort does).
  f = tempfile.mkdtemp(prefix="sg-env-run-one-")
  r = run_timed([cli, "run", "--memory", "--trace", f, "sort", "/dev/null"], env_with())
  if r.returncode != 0:
    fail(f"spyglass run --memory --trace sort: exit {r.returncode}, {r.stderr!r}")
  if not glob.glob(os.path.join(f, "memory.*.sort.exit.prof")):
    fail(f"the memory profiles are not beside the trace in {f}: {os.listdir(f)}")
  runs = glob.glob(os.path.join(f, "plugins", "profile", "*"))
  if len(runs) != 1 or f"spyglass run: trace in {runs[0]}/" not in r.stderr:
    fail(f"the parent does not say where the trace went ({runs}): {r.stderr!r}")
  # --server: started at load, captured by spyglass collect.
  p = start_program(prog, env_with(), cmd_prefix=(cli, "run", "--server", "0", "--"))
  try:
    port = server_port(p)
    c = tempfile.mkdtemp(prefix="sg-env-run-collect-")
    r = subprocess.run([cli, "collect", str(port), "300", "--log_dir", c, "--no_perfetto_link"],
                       capture_output=True, text=True, timeout=90)
    if r.returncode != 0:
      fail(f"spyglass collect exited {r.returncode}: {r.stderr}")
  finally:
    finish(p)
  check_steps(trace_json_events(c), "spyglass run --server")
  # Bad flags: refused by the CLI before the program runs (exit 2, one line).
  for flags in (["--server", "abc"], ["--flight-recorder", "0"], ["--options", "bogus=1"]):
    r = run_timed([cli, "run", *flags, "--", prog, "0.1"], env_with())
    if r.returncode != 2 or "DONE" in r.stdout or len(r.stderr.splitlines()) != 1:
      fail(f"spyglass run {flags}: exit {r.returncode}, {r.stdout!r}, {r.stderr!r}")
  print("PASS: spyglass run --trace / --server / bad flags")


def flight_recorder_case(prog, cli):
  d = tempfile.mkdtemp(prefix="sg-env-flight-")
  p = start_program(prog, env_with(SPYGLASS_FLIGHT_RECORDER="2", SPYGLASS_TRACE_DIR=d, SPYGLASS_SERVER_PORT="0"))
  try:
    line = p.stderr.readline()
    if f"spyglass: flight recorder on, keeping the last 2 s; dumps go to {d}/plugins/profile/" not in line:
      fail(f"no flight recorder line: {line!r}")
    port = server_port(p)
    c = tempfile.mkdtemp(prefix="sg-env-flight-collect-")
    time.sleep(0.3)  # a few steps recorded first
    r = subprocess.run([cli, "collect", str(port), "--flight-recorder", "--log_dir", c, "--no_perfetto_link"],
                       capture_output=True, text=True, timeout=90)
    if r.returncode != 0:
      fail(f"spyglass collect --flight-recorder exited {r.returncode}: {r.stderr}")
    check_steps(trace_json_events(c), "collect --flight-recorder")
  finally:
    out, err = finish(p)
  if f"spyglass: flight recorder's last window written to {d}/plugins/profile/" not in err:
    fail(f"the exit did not write the last window: {err!r}")
  events = trace_json_events(d)
  check_steps(events, "the flight recorder's window at exit")
  span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e6
  if span > 2.5:
    fail(f"the window at exit spans {span:.2f} s, more than its 2 s (+ the step in flight)")
  r = run_timed([cli, "run", "--flight-recorder", "1", "--trace", d + "/run", "--", prog, "1.5"], env_with())
  if r.returncode != 0 or "last window written to " + d + "/run/" not in r.stderr:
    fail(f"spyglass run --flight-recorder: exit {r.returncode}, {r.stderr!r}")
  events = trace_json_events(d + "/run")
  span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e6
  if span > 1.5:  # the window's events begin in its last second
    fail(f"spyglass run --flight-recorder 1: the window spans {span:.2f} s")
  print("PASS: the env-started flight recorder, fetched by collect and written at exit")


def main():
  case, prog, cli = sys.argv[1:4]
  os.chdir(tempfile.mkdtemp(prefix="sg-env-cwd-"))
  {"env_trace_dir": lambda: trace_dir_case(prog, cli),
   "env_server_collect": lambda: collect_case(prog, cli, jax=False),
   "env_server_jax_collect": lambda: collect_case(prog, cli, jax=True),
   "env_bad_values": lambda: bad_values_case(prog, cli),
   "env_spyglass_run": lambda: spyglass_run_case(prog, cli),
   "env_flight_recorder": lambda: flight_recorder_case(prog, cli)}[case]()


if __name__ == "__main__":
  main()
