#!/usr/bin/env python3
"""Loading a big profile with spyglass.profiler.ProfileData next to jax's, in one run.

  python3 bench/profile_data_bench.py [--events N] [--file X.xplane.pb] [--rounds R]

Needs `spyglass` importable (pip install .); jax and protoc (for the naive
protobuf parse) are compared when present, else reported as n/a. Without
--file, Spyglass first records N annotations (two threads; half with an int
argument) and loads the .xplane.pb it wrote. Each figure is measured in its
own fresh interpreter; rounds interleave the kinds; best of R rounds (time)
and the largest peak memory:

  floor      reading the file's bytes (open().read())
  naive      the generated Python protobuf module's XSpace.ParseFromString
  spyglass   spyglass.profiler.ProfileData.from_file
  jax        jax.profiler.ProfileData.from_file
  ... + walk the same load, then every event's name and duration_ns in Python
             (the loop of an analysis script)

Peak memory is the child's VmHWM above its RSS before loading (after its
imports), printed next to the file's size.
"""
import argparse
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, time
kind, path, pb2_dir = sys.argv[1], sys.argv[2], sys.argv[3]
def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
if kind.startswith("spyglass"):
    from spyglass.profiler import ProfileData
elif kind.startswith("jax"):
    from jax.profiler import ProfileData
elif kind == "naive":
    sys.path.insert(0, pb2_dir)
    import xplane_pb2
before = rss_kb("VmRSS")
t0 = time.perf_counter()
walked = 0
if kind == "floor":
    with open(path, "rb") as f:
        data = f.read()
elif kind == "naive":
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
else:
    data = ProfileData.from_file(path)
    if kind.endswith("walk"):
        total = 0.0
        for plane in data.planes:
            for line in plane.lines:
                for e in line.events:
                    e.name
                    total += e.duration_ns
                    walked += 1
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_kb": rss_kb("VmHWM") - before, "walked": walked}))
"""


def make_file(events, out_dir):
  import spyglass.profiler as profiler  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  o = profiler.ProfileOptions()
  o.python_tracer_level = 0
  o.buffer_bytes_total = 4 << 30
  o.buffer_bytes_per_thread = 2 << 30
  TA = profiler.TraceAnnotation

  def work(n):
    for i in range(n // 2):
      with TA("step", i=i):
        pass
      with TA("inner"):
        pass

  with profiler.trace(out_dir, profiler_options=o):
    threads = [threading.Thread(target=work, args=(events // 2,)) for _ in range(2)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  stats = profiler.last_trace_stats()
  assert stats["dropped_events"] == 0, stats
  return profiler.last_trace_files()["xplane_path"], stats["events"]


def make_pb2(tmp):
  protoc = shutil.which("protoc")
  if protoc is None:
    return None
  subprocess.run([protoc, f"--python_out={tmp}", f"-I{REPO}/proto", f"{REPO}/proto/xplane.proto"], check=True)
  return tmp


def has(module):
  try:
    importlib.import_module(module)
    return True
  except ImportError:
    return False


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--events", type=int, default=2_000_000)
  ap.add_argument("--file", help="an existing .xplane.pb instead of a recorded one")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--no-walk", action="store_true", help="only loading, not the Python walk")
  args = ap.parse_args()
  tmp = tempfile.mkdtemp(prefix="sg_pd_bench_")
  try:
    if args.file:
      path, recorded = args.file, None
    else:
      path, recorded = make_file(args.events, tmp)
    pb2 = make_pb2(tmp)
    size = os.path.getsize(path)
    kinds = ["floor", "naive", "spyglass", "jax"]
    if not args.no_walk:
      kinds += ["spyglass+walk", "jax+walk"]
    print(f"file: {path} ({size / 2**20:.1f} MiB" + (f", {recorded:,} events recorded)" if recorded else ")"))
    print()
    print("| load | best of %d (s) | peak memory above start (MiB) | x file size | events walked |" % args.rounds)
    print("|---|---|---|---|---|")
    kinds = [k for k in kinds
             if not ((k == "naive" and pb2 is None) or (k.startswith("jax") and not has("jax")))]
    runs = {k: [] for k in kinds}
    # Rounds interleaved (every kind once per round), so that a busy spell of
    # a shared machine falls on all of them alike.
    for _ in range(args.rounds):
      for kind in kinds:
        p = subprocess.run([sys.executable, "-c", CHILD, kind, path, pb2 or ""], capture_output=True, text=True,
                           timeout=1800)
        if p.returncode != 0:
          raise SystemExit(f"{kind} failed:\n{p.stderr}")
        runs[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
    for kind in ["floor", "naive", "spyglass", "jax", "spyglass+walk", "jax+walk"]:
      if kind not in runs:
        if args.no_walk and kind.endswith("walk"):
          continue
        print(f"| {kind} | n/a | | | |")
        continue
      best = min(r["seconds"] for r in runs[kind])
      peak = max(r["peak_kb"] for r in runs[kind]) / 1024
      walked = runs[kind][0]["walked"]
      print(f"| {kind} | {best:.3f} | {peak:.0f} | {peak * 2**20 / size:.2f} | {walked or ''} |", flush=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
