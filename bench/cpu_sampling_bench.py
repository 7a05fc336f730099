#!/usr/bin/env python3
"""The CPU sampler's cost, side by side with no profiler and perf record.

  python3 bench/cpu_sampling_bench.py BUILD_DIR [ROUNDS] [REPEATS]

Workload: tests/sampling/cpu_workload's fixed-work mode (work_a/b/c, one
thread, no frame pointers): the same work every run, so a profiler's cost is
more time. Measured: the workload thread's own CPU time (it includes what the
kernel does in the thread at each sample: copying the user stack), median of
REPEATS runs. CPU time rather than wall time: the machine is shared, and
wall time moves with its load. For each rate (99, 999, 4000 Hz):
  spyglass           spyglass run --sample HZ
  perf -g fp         perf record --all-user -F HZ -g (frame pointers: the
                     workload has none, the stacks are short; the cheapest)
  perf dwarf         perf record --all-user -F HZ --call-graph dwarf (8 KiB
                     stack copies, as ours; unwound by perf report later)
  spyglass timer     the timer_create fallback (SPYGLASS_SAMPLER_FORCE_TIMER=1):
                     its signal handler copies registers and stack in the
                     thread, at most once per scheduler tick
Cost per sample: capture = (thread CPU with sampling - without) / samples;
unwind = the sampler's reader time unwinding and interning / samples (its
pprof comment cpu_sampler_unwind_ns); reader = the reader thread's whole CPU
time / samples (draining, unwinding, thread rescans)."""
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{cmd}: {r.returncode}\n{r.stderr}")
    return r


def thread_cpu(stdout):
    return float(re.search(r"thread_cpu_seconds ([\d.]+)", stdout).group(1))


def main():
    build = sys.argv[1]
    rounds = sys.argv[2] if len(sys.argv) > 2 else "1500"
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    spyglass = os.path.join(build, "spyglass")
    workload = os.path.join(build, "tests", "sampling", "cpu_workload")
    perf = shutil.which("perf")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    base = statistics.median(thread_cpu(run([workload, "work", rounds]).stdout) for _ in range(repeats))
    print(f"workload: {rounds} rounds, no profiler: {base * 1e3:.1f} ms of thread CPU (median of {repeats})")
    print(f"{'rate':>6} {'profiler':<14} {'thread CPU ms':>14} {'slowdown':>9} {'samples':>8} "
          f"{'capture us':>10} {'unwind us':>9} {'reader us':>9}")
    for hz in (99, 999, 4000):
        rows = []
        # The timer_create fallback (as where perf events are refused), forced.
        for name, env in (("spyglass", None), ("spyglass timer", dict(os.environ, SPYGLASS_SAMPLER_FORCE_TIMER="1"))):
            times, samples, unwind, reader = [], [], [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as d:
                    r = run([spyglass, "run", "--sample", str(hz), "-o", d, "--", workload, "work", rounds], env=env)
                    times.append(thread_cpu(r.stdout))
                    prof = glob.glob(os.path.join(d, "plugins", "profile", "*", "cpu.*.prof"))[0]
                    raw = run([go, "tool", "pprof", "-raw", prof]).stdout
                    samples.append(sum(int(m) for m in re.findall(r"^\s+(\d+)\s+\d+: ", raw, re.M)))
                    unwind.append(int(re.search(r"cpu_sampler_unwind_ns (\d+)", raw).group(1)))
                    reader.append(int(re.search(r"cpu_sampler_reader_cpu_ns (\d+)", raw).group(1)))
            t, n = statistics.median(times), statistics.median(samples)
            rows.append((name, t, n, (t - base) * 1e6 / n if n else 0, statistics.median(unwind) / 1e3 / n,
                         statistics.median(reader) / 1e3 / n))
        if perf:
            for name, args in (("perf -g fp", ["-g"]), ("perf dwarf", ["--call-graph", "dwarf"])):
                times = []
                with tempfile.TemporaryDirectory() as d:
                    for _ in range(repeats):
                        r = run([perf, "record", "--all-user", "-F", str(hz)] + args +
                                ["-o", os.path.join(d, "p.data"), "--", workload, "work", rounds])
                        times.append(thread_cpu(r.stdout))
                    m = re.search(r"\((\d+) samples\)", r.stderr)
                    n = int(m.group(1)) if m else 0
                t = statistics.median(times)
                rows.append((name, t, n, (t - base) * 1e6 / n if n else 0, None, None))
        for name, t, n, capture, uw, rd in rows:
            print(f"{hz:>6} {name:<14} {t * 1e3:>14.1f} {100 * (t / base - 1):>8.2f}% {n:>8} {capture:>10.2f} "
                  f"{'' if uw is None else f'{uw:.2f}':>9} {'' if rd is None else f'{rd:.2f}':>9}")


if __name__ == "__main__":
    main()
