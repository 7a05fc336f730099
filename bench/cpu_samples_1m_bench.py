#!/usr/bin/env python3
"""1M CPU samples: export, summary and report, each with its time and peak memory.

  python3 bench/cpu_samples_1m_bench.py BUILD_DIR [SAMPLES]   (default 1000000)

The run: bench/cpu_samples_run.cc gen (8 threads at 1 kHz, stacks 8-40 deep
sharing their callers, 5000 distinct leaves, steps with nested annotations on
every thread), written as the session writes its .xplane.pb. Each step runs in
a process of its own; peak = that process's max RSS (wait4).
  export    cpu_samples_run export: read the .xplane.pb, then write the
            .xplane.pb, the trace JSON, the Perfetto trace (PerfSample
            packets), the pprof CPU profile and the Firefox profile
  summary   spyglass summary RUN (the annotation tables and the CPU tables),
            and --json
  report    spyglass report RUN (the page with the CPU profile's flame graph,
            the samples' tracks and their times for range flame graphs)
Baselines, on the same run:
  naive summary   Python: the .xplane.pb parsed whole with protoc's classes,
                  each sample's stack walked up its parents, self and total
                  per function (what a script on the file would do)
  naive export    Python: the same parse, then every sample with its whole
                  stack as JSON (a speedscope/"evented" style file)
  go tool pprof   -top of the pprof CPU profile (the peer that reads it)"""
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measured(cmd):
    """(wall s, peak RSS MiB, stdout): the child's own rusage through wait4."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd}: exit status {status}")
    return wall, ru.ru_maxrss / 1024, out.decode()


def xplane_pb2():
    out = tempfile.mkdtemp(prefix="sg_pb2_")
    subprocess.run(["protoc", f"--python_out={out}", f"-I{REPO}/proto", f"{REPO}/proto/xplane.proto"], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("xplane_pb2")


def parse_samples(path):
    x = xplane_pb2()
    space = x.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {i: m.name for i, m in plane.stat_metadata.items()}
        nodes = {}
        for i, md in plane.event_metadata.items():
            parent = 0
            for s in md.stats:
                if names[s.metadata_id] == "cpu_stack_parent":
                    parent = s.uint64_value
            nodes[i] = (md.display_name or md.name, parent)
        for line in plane.lines:
            if line.name != "CPU samples":
                continue
            for e in line.events:
                yield line.display_name, e.offset_ps, e.duration_ps, e.metadata_id, nodes


def naive_summary(path):
    self_ns, total_ns = {}, {}
    n = 0
    for _, _, dur, leaf, nodes in parse_samples(path):
        n += 1
        seen = set()
        node, first = leaf, True
        while node:
            fn, node = nodes[node]
            if first:
                self_ns[fn] = self_ns.get(fn, 0) + dur
                first = False
            if fn not in seen:
                seen.add(fn)
                total_ns[fn] = total_ns.get(fn, 0) + dur
    top = sorted(self_ns.items(), key=lambda kv: -kv[1])[:10]
    print(n, top[0][0])


def naive_export(path, out):
    with open(out, "w") as f:
        f.write("[")
        first = True
        for thread, at, dur, leaf, nodes in parse_samples(path):
            stack, node = [], leaf
            while node:
                fn, node = nodes[node]
                stack.append(fn)
            f.write(("" if first else ",") + json.dumps({"thread": thread, "t": at, "cpu": dur, "stack": stack[::-1]}))
            first = False
        f.write("]")
    print(os.path.getsize(out))


def main():
    if sys.argv[1] == "--naive-summary":
        return naive_summary(sys.argv[2])
    if sys.argv[1] == "--naive-export":
        return naive_export(sys.argv[2], sys.argv[3])
    build = sys.argv[1]
    samples = sys.argv[2] if len(sys.argv) > 2 else "1000000"
    spyglass = os.path.join(build, "spyglass")
    tool = os.path.join(build, "bench", "cpu_samples_run")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    me = os.path.abspath(__file__)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        wall, rss, out = measured([tool, "gen", d, samples])
        print(f"generated: {out.split()[1]} samples, {out.split()[3]} stack nodes ({wall:.1f} s)")
        run = os.path.join(d, "plugins", "profile", "run")
        xplane = os.path.join(run, "host.xplane.pb")
        print(f".xplane.pb: {os.path.getsize(xplane) / 2**20:.1f} MiB")
        wall, rss, out = measured([tool, "export", xplane, os.path.join(d, "out")])
        steps = dict(line.split() for line in out.splitlines())
        detail = ", ".join(f"{k} {float(v):.2f} s" for k, v in steps.items())
        rows.append(("export (read + all outputs)", wall, rss, detail))
        sizes = {os.path.basename(f): os.path.getsize(f) for f in glob.glob(os.path.join(d, "out", "*"))}
        print("outputs: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(sizes.items())))
        for f in glob.glob(os.path.join(d, "out", "cpu.*.prof")):
            shutil.copy(f, run)
        prof = glob.glob(os.path.join(run, "cpu.*.prof"))[0]
        wall, rss, out = measured([spyglass, "summary", run])
        rows.append(("spyglass summary", wall, rss, ""))
        wall, rss, out = measured([spyglass, "summary", "--json", run])
        rows.append(("spyglass summary --json", wall, rss, f"cpu.samples {json.loads(out)['cpu']['samples']}"))
        page = os.path.join(d, "r.html")
        wall, rss, out = measured([spyglass, "report", run, "-o", page])
        rows.append(("spyglass report", wall, rss, f"page {os.path.getsize(page) / 2**20:.1f} MiB"))
        wall, rss, out = measured([sys.executable, me, "--naive-summary", xplane])
        rows.append(("naive summary (Python, protoc classes)", wall, rss, ""))
        naive = os.path.join(d, "naive.json")
        wall, rss, out = measured([sys.executable, me, "--naive-export", xplane, naive])
        rows.append(("naive export (Python: samples with stacks as JSON)", wall, rss, f"{int(out) / 2**20:.0f} MiB"))
        if os.path.exists(go):
            wall, rss, out = measured([go, "tool", "pprof", "-top", prof])
            rows.append(("go tool pprof -top (peer, the pprof)", wall, rss, ""))
    print(f"\n| step | wall s | peak RSS MiB | detail |\n|---|---:|---:|---|")
    for name, wall, rss, detail in rows:
        print(f"| {name} | {wall:.2f} | {rss:.0f} | {detail} |")


if __name__ == "__main__":
    main()
