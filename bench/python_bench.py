#!/usr/bin/env python3
"""Spyglass's Python package next to jax.profiler (and viztracer), in one run.

  python3 bench/python_bench.py [--quick] [--tracer-only] [--workload fib|mixed|both] [--only ROWS] [--json OUT.json]

Needs `spyglass` importable (pip install .), and for the comparisons
`pip install jax viztracer` (a missing one is reported as n/a). Each figure is
measured in its own fresh interpreter, one after the other, and printed as a
Markdown table (the BENCHMARKS.md "## Python" section):

1. `with TraceAnnotation("x"): pass` in a Python loop, ns per iteration above
   the empty loop: no trace running, and a trace running (python tracer off,
   so only the annotation is recorded). Best of several repeats, by wall time
   and by the thread's CPU time.
2. Python tracer: two pure-Python workloads (--workload): issue 13's recursive
   fib (28,737 calls), and a mixed one (recursive fib, small methods,
   builtins; 514,522 calls), each timed bare (best of --repeat runs), then
   under Spyglass (python_tracer_level=1; on 3.12+ sys.monitoring, and the
   profile-function hook beside it),
   jax.profiler (python_tracer_level=1) and viztracer; slowdown = traced/bare,
   by wall time and by the process's CPU time (which a loaded machine's
   waits for a CPU do not enter). On 3.12+ also the floor of sys.monitoring:
   empty C callbacks (bench/mon_floor.c, compiled here with the C compiler
   Python was built with) for the events Spyglass takes.
3. stop_trace time after 1,000,000 annotations (export of the files).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD_ANNOTATION = r"""
import json, sys, tempfile, time, timeit
impl, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if impl == "spyglass":
    import spyglass.profiler as profiler
else:
    import jax.profiler as profiler
TA = profiler.TraceAnnotation
def annotated():
    for _ in range(n):
        with TA("x"):
            pass
def empty():
    for _ in range(n):
        pass
def best(f, timer):
    return min(timeit.repeat(f, number=1, repeat=repeat, timer=timer)) / n * 1e9
# Wall time, and the thread's CPU time (which a loaded machine's waits for a
# CPU do not enter; page faults do).
timers = {"": time.perf_counter, "_cpu": time.thread_time}
out = {}
base = {k: best(empty, t) for k, t in timers.items()}
for k, t in timers.items():
    out["idle_ns" + k] = best(annotated, t) - base[k]
o = profiler.ProfileOptions()
o.python_tracer_level = 0
profiler.start_trace(tempfile.mkdtemp(), profiler_options=o)
try:
    for k, t in timers.items():
        out["tracing_ns" + k] = best(annotated, t) - base[k]
finally:
    profiler.stop_trace()
print(json.dumps(out))
"""

CHILD_TRACER = r"""
import json, os, sys, tempfile, time
impl, scale, which, repeat = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

class Acc:
    def __init__(self):
        self.total = 0
    def add(self, v):
        self.total += v
        return self

def mixed():
    for _ in range(scale):
        fib(18)
        acc = Acc()
        for i in range(2000):
            acc.add(abs(i - 1000))
        sorted(range(500), key=lambda v: -v)
    return acc.total

def fib_only():  # issue 13's "recursive call-heavy function (28k calls)": 9 x fib(16), 28,737 calls
    for _ in range(9):
        fib(16)

workload = fib_only if which == "fib" else mixed

def timed():  # (wall, CPU of the process: all its threads, none of the time it waits for a CPU)
    t, c = time.perf_counter(), time.process_time()
    workload()
    return time.perf_counter() - t, time.process_time() - c

# Calls per run, counted with a plain profile hook.
calls = [0]
def count(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1
sys.setprofile(count); workload(); sys.setprofile(None)

timed()  # warm-up
bares = [timed() for _ in range(repeat)]
runs = []
for _ in range(repeat):
    if impl.startswith("spyglass"):  # spyglass-setprofile: SPYGLASS_PYTHON_TRACER=setprofile (set by the parent)
        import spyglass.profiler as profiler
        o = profiler.ProfileOptions(); o.python_tracer_level = 1
        profiler.start_trace(tempfile.mkdtemp(), profiler_options=o)
        runs.append(timed())
        profiler.stop_trace()
    elif impl == "jax":
        import jax.profiler as profiler
        o = profiler.ProfileOptions(); o.python_tracer_level = 1
        profiler.start_trace(tempfile.mkdtemp(), profiler_options=o)
        runs.append(timed())
        profiler.stop_trace()
    elif impl.startswith("floor"):  # floor-py / floor-ccall / floor-vectorcall: bench/mon_floor.c's empty callbacks
        sys.path.insert(0, os.environ["MON_FLOOR_DIR"])
        import mon_floor
        mon_floor.start(["floor-py", "floor-ccall", "floor-vectorcall", "floor-clock"].index(impl))
        runs.append(timed())
        mon_floor.stop()
    elif impl == "viztracer":
        from viztracer import VizTracer
        tracer = VizTracer(tracer_entries=5_000_000, verbose=0)
        tracer.start()
        runs.append(timed())
        tracer.stop()
        tracer.clear()
bare, traced = min(b[0] for b in bares), min(r[0] for r in runs)
bare_cpu, traced_cpu = min(b[1] for b in bares), min(r[1] for r in runs)
print(json.dumps({"bare_s": bare, "traced_s": traced, "slowdown": traced / bare, "bare_cpu_s": bare_cpu,
                  "traced_cpu_s": traced_cpu, "slowdown_cpu": traced_cpu / bare_cpu, "calls": calls[0]}))
"""

CHILD_EXPORT = r"""
import json, sys, tempfile, time
impl, n = sys.argv[1], int(sys.argv[2])
if impl == "spyglass":
    import spyglass.profiler as profiler
else:
    import jax.profiler as profiler
TA = profiler.TraceAnnotation
o = profiler.ProfileOptions()
o.python_tracer_level = 0
d = tempfile.mkdtemp()
profiler.start_trace(d, profiler_options=o)
for _ in range(n):
    with TA("x"):
        pass
t = time.perf_counter()
profiler.stop_trace()
print(json.dumps({"stop_s": time.perf_counter() - t}))
"""


def have(module):
  return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def child(code, *args, **extra_env):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", **extra_env)
  p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
  if p.returncode != 0:
    sys.stderr.write(p.stderr[-3000:])
    return None
  return json.loads(p.stdout.strip().splitlines()[-1])


def build_floor():
  """bench/mon_floor.c as an extension of this Python, in a temporary dir (None: no C compiler)."""
  import sysconfig
  out = tempfile.mkdtemp()
  cc = (sysconfig.get_config_var("CC") or "cc").split()
  src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mon_floor.c")
  so = os.path.join(out, "mon_floor" + sysconfig.get_config_var("EXT_SUFFIX"))
  p = subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"], src, "-o", so],
                     capture_output=True, text=True)
  if p.returncode != 0:
    sys.stderr.write(p.stderr[-2000:])
    return None
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
  ap.add_argument("--json", help="also write the figures to this file")
  ap.add_argument("--tracer-only", action="store_true", help="only the Python tracer table")
  ap.add_argument("--workload", choices=["fib", "mixed", "both"], default="both",
                  help="the Python tracer's workload: fib (issue 13's: a recursive function, 28,737 calls), "
                       "mixed (fib, small methods, abs, sorted with a key lambda; 514,522 calls), or both")
  ap.add_argument("--repeat", type=int, default=3, help="the Python tracer's figures: best of this many runs")
  ap.add_argument("--only", help="comma-separated tracer rows to measure (e.g. floor-clock,spyglass,viztracer)")
  args = ap.parse_args()
  n_loop, repeat = (100_000, 3) if args.quick else (500_000, 7)
  scale = 5 if args.quick else 40
  n_export = 100_000 if args.quick else 1_000_000

  impls = ["spyglass"] + (["jax"] if have("jax.profiler") else [])
  workloads = ["fib", "mixed"] if args.workload == "both" else [args.workload]
  results = {"annotation": {}, "tracer": {}, "export": {}}
  for impl in [] if args.tracer_only else impls:
    results["annotation"][impl] = child(CHILD_ANNOTATION, impl, n_loop, repeat)
  # On 3.12+ Spyglass records through sys.monitoring; the profile-function
  # hook (the one before 3.12) is measured beside it.
  tracers = impls[:1] + (["spyglass-setprofile"] if sys.version_info >= (3, 12) else []) + impls[1:]
  # The floor of sys.monitoring (3.12+): empty C callbacks for the same events,
  # then with the one thing every event must add, a timestamp.
  floor = build_floor() if sys.version_info >= (3, 12) else None
  floors = ["floor-py", "floor-ccall", "floor-vectorcall", "floor-clock"] if floor else []
  for impl in floors + tracers + (["viztracer"] if have("viztracer") else []):
    if args.only and impl not in args.only.split(","):
      continue
    extra = {"SPYGLASS_PYTHON_TRACER": "setprofile"} if impl == "spyglass-setprofile" else {}
    if floor:
      extra["MON_FLOOR_DIR"] = floor
    for w in workloads:
      results["tracer"].setdefault(w, {})[impl] = child(CHILD_TRACER, impl, scale, w, args.repeat, **extra)
  for impl in [] if args.tracer_only else impls:
    results["export"][impl] = child(CHILD_EXPORT, impl, n_export)

  def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)

  a = results["annotation"]
  s, j = a.get("spyglass") or {}, a.get("jax") or {}
  print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; loop of {n_loop:,}, best of {repeat}\n")
  if not args.tracer_only:
    print("| `with TraceAnnotation(\"x\"): pass` | Spyglass | jax.profiler | Spyglass / JAX |")
    print("|---|---|---|---|")
  for key, label in [] if args.tracer_only else [("idle_ns", "no trace running"), ("tracing_ns", "trace running"),
                                                  ("idle_ns_cpu", "no trace running, CPU time"),
                                                  ("tracing_ns_cpu", "trace running, CPU time")]:
    ratio = s[key] / j[key] if s.get(key) and j.get(key) else None
    print(f"| {label} (ns per iteration) | {fmt(s.get(key), '.1f')} | {fmt(j.get(key), '.1f')} | "
          f"{fmt(ratio, '.2f')} |")

  for w in workloads:
    print_tracer_table(results["tracer"][w], w, args.repeat, fmt)

  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  if args.tracer_only:
    return
  e = results["export"]
  print(f"\nstop_trace after {n_export:,} annotations\n")
  print("| | Spyglass | jax.profiler |")
  print("|---|---|---|")
  print(f"| stop_trace (s) | {fmt((e.get('spyglass') or {}).get('stop_s'), '.3f')} | "
        f"{fmt((e.get('jax') or {}).get('stop_s'), '.3f')} |")


def print_tracer_table(t, workload, repeat, fmt):
  calls = next((v["calls"] for v in t.values() if v), None)
  what = "recursive fib" if workload == "fib" else "call-heavy mixed"
  print(f"\nPython tracer, {what} workload ({fmt(calls, ',')} calls per run, best of {repeat})\n")
  print("| tracer | bare (ms) | traced (ms) | slowdown | / viztracer's | CPU: bare (ms) | traced (ms) | slowdown "
        "| / viztracer's |")
  print("|---|---|---|---|---|---|---|---|---|")
  viz = (t.get("viztracer") or {}).get("slowdown")
  viz_cpu = (t.get("viztracer") or {}).get("slowdown_cpu")
  hook = "sys.monitoring" if sys.version_info >= (3, 12) else "profile function"
  for impl, label in [("floor-py", "floor: empty C callbacks, PY_* events (bench/mon_floor.c)"),
                      ("floor-ccall", "floor: empty C callbacks, PY_* + CALL/C_RETURN (DISABLE as Spyglass)"),
                      ("floor-vectorcall", "floor: as above, callbacks of a vectorcall type (as Spyglass's)"),
                      ("floor-clock", "floor: as above, and a clock read per event (into a small ring)"),
                      ("spyglass", f"Spyglass python_tracer_level=1 ({hook})"),
                      ("spyglass-setprofile", "Spyglass, profile function (SPYGLASS_PYTHON_TRACER=setprofile)"),
                      ("jax", "jax.profiler python_tracer_level=1"), ("viztracer", "viztracer")]:
    r = t.get(impl)
    if impl in t:
      print(f"| {label} | {fmt(r and r['bare_s'] * 1e3, '.1f')} | {fmt(r and r['traced_s'] * 1e3, '.1f')} | "
            f"{fmt(r and r['slowdown'], '.2f')}x | "
            f"{fmt(r and viz and r['slowdown'] / viz, '.2f')} | {fmt(r and r['bare_cpu_s'] * 1e3, '.1f')} | "
            f"{fmt(r and r['traced_cpu_s'] * 1e3, '.1f')} | {fmt(r and r['slowdown_cpu'], '.2f')}x | "
            f"{fmt(r and viz_cpu and r['slowdown_cpu'] / viz_cpu, '.2f')} |")


if __name__ == "__main__":
  main()
