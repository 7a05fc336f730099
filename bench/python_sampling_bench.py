#!/usr/bin/env python3
"""The CPU sampler's cost on a Python program, side by side with py-spy.

  python3 bench/python_sampling_bench.py [ROUNDS] [REPEATS] [PYTHON]

Workload: a fixed amount of pure-Python work (recursion, loops, a dict, a
little zlib) in one thread; the same work every run, so a profiler's cost is
more time. The workload times itself: wall time and its thread's CPU time
around the work (interpreter start-up and the profiler's start and export
are outside). Median of REPEATS runs, at 99, 999 and 4000 Hz:
  none             no profiler (the floor)
  naive            a thread in the program that reads sys._current_frames()
                   every 1/HZ s and counts the stacks (what a sampler written
                   in Python does: it takes the GIL from the program)
  spyglass         python -m spyglass run --sample HZ (perf events; Python
                   frames read from the copied stack by the reader thread)
  py-spy           py-spy record -r HZ (outside the process; it stops the
                   process for each sample by default)
  py-spy nonblock  py-spy record -r HZ --nonblocking (reads without stopping:
                   its stacks can be torn)
Slowdown = wall time against none: py-spy's pauses are wall time, not the
program's CPU time; ours is mostly the kernel's stack copy in the thread
(thread CPU) and the reader, on another CPU where one is free.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = r'''
import sys, threading, time, zlib
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
def loops(n):
    d = {}
    for i in range(n):
        d[i % 97] = d.get(i % 97, 0) + i * i
    return d
DATA = bytes(range(256)) * 256
def work(rounds):
    for _ in range(rounds):
        fib(18)
        loops(20000)
        zlib.compress(DATA, 6)
naive = None
if len(sys.argv) > 2 and sys.argv[2] != "0":
    period = 1.0 / float(sys.argv[2])
    seen = {}
    stop = False
    me = threading.get_ident()
    def sampler():
        while not stop:
            for tid, f in sys._current_frames().items():
                if tid == threading.get_ident():
                    continue
                key = []
                while f is not None:
                    key.append((f.f_code.co_filename, f.f_code.co_name, f.f_lineno))
                    f = f.f_back
                key = tuple(key)
                seen[key] = seen.get(key, 0) + 1
            time.sleep(period)
    naive = threading.Thread(target=sampler, daemon=True)
    naive.start()
w0, c0 = time.perf_counter(), time.thread_time()
work(int(sys.argv[1]))
w1, c1 = time.perf_counter(), time.thread_time()
if naive is not None:
    stop = True
    naive.join()
print(f"wall_seconds {w1 - w0:.6f} thread_cpu_seconds {c1 - c0:.6f}")
'''


def run(cmd, cwd):
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd)
  if r.returncode != 0:
    raise SystemExit(f"{cmd}: exit {r.returncode}\n{r.stderr[-3000:]}")
  m = re.search(r"wall_seconds ([\d.]+) thread_cpu_seconds ([\d.]+)", r.stdout)
  if not m:
    raise SystemExit(f"{cmd}: no timing in\n{r.stdout[-2000:]}")
  return float(m.group(1)), float(m.group(2)), r


def samples_in(d):
  """Samples in the run's pprof CPU profile (spyglass), from go tool pprof."""
  go = shutil.which("go") or "/usr/local/go/bin/go"
  for root, _, files in os.walk(d):
    for f in files:
      if f.startswith("cpu.") and f.endswith(".prof"):
        r = subprocess.run([go, "tool", "pprof", "-top", "-sample_index=samples", "-nodecount=1",
                            os.path.join(root, f)], capture_output=True, text=True, timeout=300)
        m = re.search(r"Total samples = (\d+)", r.stdout)
        return int(m.group(1)) if m else 0
  return 0


def main():
  rounds = sys.argv[1] if len(sys.argv) > 1 else "60"
  repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
  python = sys.argv[3] if len(sys.argv) > 3 else sys.executable
  pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(python), "py-spy")
  if not os.access(pyspy, os.X_OK):
    raise SystemExit("py-spy not found (pip install py-spy)")
  work = tempfile.mkdtemp(prefix="sg_pybench_")
  script = os.path.join(work, "workload.py")
  with open(script, "w", encoding="utf-8") as f:
    f.write(WORKLOAD)

  def measure(name, hz):
    walls, cpus, samples = [], [], []
    for i in range(repeats):
      d = os.path.join(work, f"{name.replace(' ', '_')}_{hz}_{i}")
      os.makedirs(d)
      if name == "none":
        cmd = [python, script, rounds]
      elif name == "naive":
        cmd = [python, script, rounds, str(hz)]
      elif name == "spyglass":
        cmd = [python, "-m", "spyglass", "run", "--sample", str(hz), "-o", d, script, rounds]
      else:
        out = os.path.join(d, "pyspy.txt")
        cmd = [pyspy, "record", "-r", str(hz), "-o", out, "--format", "raw"]
        if name == "py-spy nonblock":
          cmd.append("--nonblocking")
        cmd += ["--", python, script, rounds]
      w, c, _ = run(cmd, d)
      walls.append(w)
      cpus.append(c)
      if name == "spyglass":
        samples.append(samples_in(d))
      elif name.startswith("py-spy"):
        with open(out, encoding="utf-8") as f:
          samples.append(sum(int(l.rpartition(" ")[2]) for l in f if l.rpartition(" ")[2].strip().isdigit()))
      shutil.rmtree(d, ignore_errors=True)
    return statistics.median(walls), statistics.median(cpus), (statistics.median(samples) if samples else None)

  base_wall, base_cpu, _ = measure("none", 0)
  print(f"workload: {rounds} rounds on {python}, no profiler: {base_wall * 1e3:.1f} ms wall, "
        f"{base_cpu * 1e3:.1f} ms thread CPU (median of {repeats})")
  print(f"{'rate':>6} {'profiler':<16} {'wall ms':>9} {'slowdown':>9} {'thread CPU ms':>14} {'CPU +':>7} {'samples':>8}")
  for hz in (99, 999, 4000):
    for name in ("naive", "spyglass", "py-spy", "py-spy nonblock"):
      w, c, n = measure(name, hz)
      print(f"{hz:>6} {name:<16} {w * 1e3:>9.1f} {100 * (w / base_wall - 1):>8.2f}% {c * 1e3:>14.1f} "
            f"{100 * (c / base_cpu - 1):>6.2f}% {'' if n is None else int(n):>8}", flush=True)
  shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
