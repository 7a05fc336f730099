#!/usr/bin/env python3
"""What the heap hook costs a program (BENCHMARKS.md, "Memory"): wall time,
peak RSS and loaded shared objects of one command, run plain and under each
given hook, in alternating rounds (a shared VM drifts: each round runs every
configuration once, in an order rotated each round; the last column is the
median, with quartiles, of each round's own CPU ratio to its plain run). Not a test. Peak RSS is the "VmHWM:" line the command
prints (tests/memory/hook_tiny does), if any: the rusage of a child started
by Python counts Python's own pages (vfork).

  hook_cost_bench.py [--rounds N] [--env K=V ...] [--hook NAME=PATH[,K=V...]] ...
                     [--wrap NAME=COMMAND] ... -- command...

The command runs once per configuration per round; "plain" (no hook) is
always included. --hook NAME=PATH,K=V,...: that hook with those extra
environment variables (e.g. sampled=build/libspyglass_heap.so,SPYGLASS_HEAP_SAMPLE_BYTES=524288);
any preloaded library will do (a peer: jemalloc's sampled profiling is
jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2,MALLOC_CONF=prof:true,lg_prof_sample:19).
--wrap NAME=COMMAND: the command run under another tool (e.g.
heaptrack="heaptrack -o /tmp/ht"), the peer, in the same rounds. When the
command prints "(N ns/pair)" (bench/memory_bench does), the loop's own time
is reported too (start-up and exit excluded). Loaded objects are counted from
/proc/<pid>/maps by a first run of `cat /proc/self/maps` under each hook.
"""
import argparse
import glob
import math
import re
import shlex
import os
import statistics
import subprocess
import time


def run_once(cmd, env, cleanup=None):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    p.stdout.close()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed (status {p.returncode}) under {env.get('LD_PRELOAD', 'no hook')}")
    hwm = [line.split()[1] for line in out.splitlines() if line.startswith("VmHWM:")]
    loop = re.search(r"\(([0-9.]+) ns/pair\)", out)
    cpu = ru.ru_utime + ru.ru_stime
    if cleanup:
        for f in glob.glob(cleanup + "*"):
            os.remove(f)
    # s, s, MiB, ns per pair in the loop
    return wall, cpu, (int(hwm[0]) / 1024.0 if hwm else float("nan")), (float(loop.group(1)) if loop else float("nan"))


def loaded_objects(env):
    maps = subprocess.run(["cat", "/proc/self/maps"], env=env, capture_output=True, text=True, check=True).stdout
    return len({line.split()[-1] for line in maps.splitlines() if ".so" in line.split()[-1]})


def rss_text(values):
    m = statistics.median(values)
    return "—" if math.isnan(m) else f"{m:.2f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--env", action="append", default=[], help="K=V for the hooked runs (e.g. sampling)")
    ap.add_argument("--hook", action="append", default=[], help="NAME=PATH[,K=V...] of a libspyglass_heap.so")
    ap.add_argument("--wrap", action="append", default=[], help="NAME=COMMAND to run the command under (a peer)")
    ap.add_argument("command", nargs="+")
    a = ap.parse_args()
    base = dict(os.environ)
    for k in ("LD_PRELOAD", "SPYGLASS_HEAP_PROFILE_DIR", "SPYGLASS_TRACE_DIR"):
        base.pop(k, None)
    configs = [("plain", base, [], None)]
    for h in a.hook:
        name, spec = h.split("=", 1)
        # K=V pairs after the path; a value may hold commas (MALLOC_CONF=prof:true,lg_prof_sample:19)
        path, *extra = re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", spec)
        env = dict(base, LD_PRELOAD=os.path.abspath(path))
        env.update(kv.split("=", 1) for kv in a.env)
        env.update(kv.split("=", 1) for kv in extra)
        configs.append((name, env, [], None))
    for wspec in a.wrap:
        name, cmd = wspec.split("=", 1)
        prefix = shlex.split(cmd)
        # heaptrack -o PATH writes PATH.zst (or .gz): removed after each run
        out = prefix[prefix.index("-o") + 1] if "-o" in prefix else None
        configs.append((name, base, prefix, out))
    walls = {n: [] for n, *_ in configs}
    cpus = {n: [] for n, *_ in configs}
    rss = {n: [] for n, *_ in configs}
    loops = {n: [] for n, *_ in configs}
    for n, env, prefix, out in configs:
        run_once(prefix + a.command, env, out)  # warm the page cache
    for r in range(a.rounds):
        # rotated each round: no configuration always runs right after another
        for n, env, prefix, out in configs[r % len(configs):] + configs[:r % len(configs)]:
            w, c, r, l = run_once(prefix + a.command, env, out)
            walls[n].append(w)
            cpus[n].append(c)
            rss[n].append(r)
            loops[n].append(l)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"command: {' '.join(a.command)}; {a.rounds} alternating rounds; load average {' '.join(load)}")
    has_loop = not math.isnan(statistics.median(loops["plain"]))
    print("| run | wall best | wall median | CPU best | CPU median | peak RSS median | shared objects |"
          + (" loop ns/pair best | loop median |" if has_loop else "") + " CPU / plain, paired by round: median [quartiles] |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if has_loop else "") + " ---: |")
    plain_med = statistics.median(walls["plain"])
    plain_cpu = statistics.median(cpus["plain"])
    plain_loop = statistics.median(loops["plain"])
    ms = lambda v: f"{v * 1000:.1f} ms" if plain_med < 1 else f"{v:.3f} s"
    for n, env, prefix, out in configs:
        wm, cm, lm = statistics.median(walls[n]), statistics.median(cpus[n]), statistics.median(loops[n])
        wr = "" if n == "plain" else f" ({wm / plain_med:.2f}x)"
        cr = "" if n == "plain" else f" ({cm / plain_cpu:.2f}x)"
        lr = "" if n == "plain" else f" ({lm / plain_loop:.2f}x)"
        objs = loaded_objects(env) if not prefix else "—"
        loop = f" {min(loops[n]):.1f} | {lm:.1f}{lr} |" if has_loop else ""
        # The ratio within each round, where both runs met the same machine:
        # steadier than the ratio of medians on a VM whose speed drifts.
        paired = sorted(c / p for c, p in zip(cpus[n], cpus["plain"]))
        q = statistics.quantiles(paired, n=4) if len(paired) >= 2 else [paired[0]] * 3
        pr = "" if n == "plain" else f" {q[1]:.3f}x [{q[0]:.3f}-{q[2]:.3f}]"
        print(f"| {n} | {ms(min(walls[n]))} | {ms(wm)}{wr} | {ms(min(cpus[n]))} | {ms(cm)}{cr} "
              f"| {rss_text(rss[n])} | {objs} |{loop}{pr} |")


if __name__ == "__main__":
    main()
