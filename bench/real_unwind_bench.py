#!/usr/bin/env python3
"""The heap hook's unwinders on a program nobody here wrote (BENCHMARKS.md,
"Memory", "Real programs"): Debian's sqlite3 (built without frame pointers)
inserting 200,000 random rows in one transaction, then a few aggregates:

  sqlite3 t.db < work.sql     (a fresh t.db each run)

(t.db in /dev/shm unless --dir) run plain, under each --hook (LD_PRELOAD, with its environment) and under each
--wrap (a peer such as heaptrack), in alternating rounds (a shared machine
drifts: each round runs every configuration once, the order rotated each
round). Prints, per configuration, the median wall time and CPU time
(user + sys of the command and its children: heaptrack's analysis counts)
and their ratios to plain's medians. Not a test.

  real_unwind_bench.py [--rounds N] [--inserts N]
      --hook NAME=PATH[,K=V...] ...  --wrap NAME="COMMAND" ...

e.g. (the figures in BENCHMARKS.md):
  H=build/libspyglass_heap.so
  bench/real_unwind_bench.py --rounds 5 \\
    --hook cfi=$H --hook fp=$H,SPYGLASS_UNWINDER=fp --hook libunwind=$H,SPYGLASS_UNWINDER=libunwind \\
    --wrap heaptrack="heaptrack -o /tmp/rub/ht"
"""
import argparse
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def make_workload(path, inserts, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, val REAL, grp INTEGER);\nBEGIN;\n")
        for _ in range(inserts):
            name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 20)))
            f.write(f"INSERT INTO t(name,val,grp) VALUES('{name}',{rng.random() * 1000:.4f},{rng.randint(0, 99)});\n")
        f.write("COMMIT;\n"
                "SELECT grp, count(*), avg(val), max(name) FROM t GROUP BY grp ORDER BY 2 DESC LIMIT 5;\n"
                "SELECT count(DISTINCT name) FROM t;\n"
                "SELECT sum(val) FROM t WHERE grp < 50;\n")


def run_once(argv, env, sql, db):
    if os.path.exists(db):
        os.unlink(db)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(sql, "rb") as stdin:
        r = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{argv}: exit status {r.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inserts", type=int, default=200000)
    ap.add_argument("--hook", action="append", default=[], help="NAME=PATH[,K=V...]")
    ap.add_argument("--wrap", action="append", default=[], help='NAME="COMMAND" (the sqlite3 command is appended)')
    ap.add_argument("--sqlite3", default=shutil.which("sqlite3") or "sqlite3")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="where t.db and the profiles go (default /dev/shm: the disk's fsync at COMMIT, "
                         "which varies on a shared machine, is no part of the hook's cost)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="spyglass-rub-", dir=args.dir)
    sql, db = os.path.join(tmp, "work.sql"), os.path.join(tmp, "t.db")
    make_workload(sql, args.inserts)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_") and k != "LD_PRELOAD"}
    configs = [("plain", [args.sqlite3, db], base_env)]
    for spec in args.hook:
        name, rest = spec.split("=", 1)
        parts = rest.split(",")
        env = dict(base_env, LD_PRELOAD=os.path.abspath(parts[0]),
                   SPYGLASS_HEAP_PROFILE_DIR=os.path.join(tmp, "prof-" + name))
        for kv in parts[1:]:
            k, v = kv.split("=", 1)
            env[k] = v
        configs.append((name, [args.sqlite3, db], env))
    for spec in args.wrap:
        name, cmd = spec.split("=", 1)
        configs.append((name, shlex.split(cmd) + [args.sqlite3, db], base_env))

    walls = {name: [] for name, _, _ in configs}
    cpus = {name: [] for name, _, _ in configs}
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for name, argv, env in order:
            w, c = run_once(argv, env, sql, db)
            walls[name].append(w)
            cpus[name].append(c)
            print(f"round {rnd + 1} {name}: {w:.2f} s wall, {c:.2f} s CPU", file=sys.stderr)
    pw, pc = statistics.median(walls["plain"]), statistics.median(cpus["plain"])
    print(f"sqlite3 {args.inserts} inserts, {args.rounds} rounds, medians")
    print("| configuration | wall | wall / plain | CPU | CPU / plain | all walls |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in configs:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        all_w = " ".join(f"{x:.2f}" for x in walls[name])
        print(f"| {name} | {w:.2f} s | {w / pw:.2f}x | {c:.2f} s | {c / pc:.2f}x | {all_w} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
