#!/usr/bin/env python3
"""`spyglass summary` of a big run against the floor and the peers, in one run.

    python3 bench/summary_bench.py [--events 10000000] [--dir /tmp/summary_bench] [--build build]
                                   [--no-xprof] [--repeat 3]

Makes the run with big_session_bench --steps (a training loop's shape: steps
"train" of 8 nested annotations, 4 threads) unless --dir already holds
big.xplane.pb, then measures, each in its own process, wall time and peak RSS
(getrusage of the child):
  floor     read the file's bytes once (cat > /dev/null); the streaming scan
            alone (read_bench scan: every event decoded, nothing kept)
  naive     the whole file parsed with the generated protobuf classes
            (read_bench protobuf), and our whole model (read_bench model)
  spyglass  `spyglass summary` (text) and `spyglass summary --json`
  jax       jax.profiler.ProfileData.from_file (load only)
  xprof     XProf's converter (xprof pip package): trace_viewer@ and overview_page
The goal: summary at most 2 s and a peak at most 1.5x the file's size.
"""
import argparse
import os
import subprocess
import sys
import time

JAX_LOAD = """
import sys
from jax.profiler import ProfileData
d = ProfileData.from_file(sys.argv[1])
print(sum(1 for _ in d.planes))
"""

XPROF_CONVERT = """
import sys
from xprof.convert import raw_to_tool_data
tool = sys.argv[2]
params = {"use_saved_result": False}
if tool == "trace_viewer@":
    params["trace_viewer_options"] = {"resolution": 8000, "format": "json"}  # what the UI asks for
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], tool, params)
assert data is not None, "converter failed"
print(len(data))
"""


def run_child(cmd, timeout, env=None):
  """Measures with os.wait4 so that each child's own peak is known."""
  t0 = time.monotonic()
  p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
  deadline = t0 + timeout
  while True:
    pid, status, usage = os.wait4(p.pid, os.WNOHANG)
    if pid:
      break
    if time.monotonic() > deadline:
      p.kill()
      os.wait4(p.pid, 0)
      return timeout, 0, False, f"timed out after {timeout} s"
    time.sleep(0.01)
  seconds = time.monotonic() - t0
  err = p.stderr.read().decode(errors="replace").strip().splitlines()
  ok = os.waitstatus_to_exitcode(status) == 0
  return seconds, usage.ru_maxrss * 1024, ok, "" if ok else (err[-1] if err else "failed")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--events", type=int, default=10_000_000)
  ap.add_argument("--dir", default="/tmp/summary_bench")
  ap.add_argument("--build", default="build")
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--no-xprof", action="store_true")
  ap.add_argument("--no-jax", action="store_true")
  ap.add_argument("--timeout", type=int, default=600)
  args = ap.parse_args()
  cli = os.path.join(args.build, "spyglass")
  path = os.path.join(args.dir, "big.xplane.pb")
  if not os.path.exists(path):
    subprocess.run([os.path.join(args.build, "bench", "big_session_bench"), "--events", str(args.events), "--steps",
                    "--dir", args.dir], check=True, stdout=subprocess.DEVNULL)
  size = os.path.getsize(path)
  print(f"summary_bench: {path}, {size / 2**20:.0f} MiB (--events {args.events} --steps); "
        f"load average {os.getloadavg()[0]:.1f}")
  print(f"{'what':44} {'wall s':>8} {'peak MiB':>9} {'peak/file':>9}")

  def row(name, cmd, repeat, env=None):
    best = None
    for _ in range(repeat):
      r = run_child(cmd, args.timeout, env)
      if not r[2]:
        best = r
        break
      if best is None or r[0] < best[0]:
        best = r
    seconds, peak, ok, note = best
    if ok:
      print(f"{name:44} {seconds:8.2f} {peak / 2**20:9.0f} {peak / size:8.2f}x")
    else:
      print(f"{name:44} {'-':>8} {'-':>9} {'-':>9}  ({note})")
    sys.stdout.flush()

  row("floor: cat file > /dev/null", ["sh", "-c", f"cat '{path}' > /dev/null"], args.repeat)
  read_bench = os.path.join(args.build, "bench", "read_bench")
  row("floor: streaming scan, nothing kept", [read_bench, "scan", path], args.repeat)
  row("spyglass summary", [cli, "summary", path], args.repeat)
  row("spyglass summary --json", [cli, "summary", "--json", path], args.repeat)
  row("naive: generated protobuf, whole XSpace", [read_bench, "protobuf", path], 1)
  row("whole model (ProfileReader::Read)", [read_bench, "model", path], 1)
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  if not args.no_jax:
    row("jax ProfileData.from_file (load only)", [sys.executable, "-c", JAX_LOAD, path], 1, env)
  if not args.no_xprof:
    for tool in ("overview_page", "trace_viewer@"):
      row(f"xprof converter {tool}", [sys.executable, "-c", XPROF_CONVERT, path, tool], 1, env)


if __name__ == "__main__":
  main()
