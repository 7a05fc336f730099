#!/usr/bin/env python3
"""Heap stacks of programs nobody here wrote: Debian's sqlite3, sort and git, built
without frame pointers, under the heap hook with its default unwinder, read by
go tool pprof -traces.

  real_stacks_test.py <libspyglass_heap.so> [sqlite3|sort|git ...]

Every stack must be complete (down to __libc_start_main or a thread's start),
the biggest at the peak deep (TOP_DEPTH), and no frame anywhere may be a bare
address (an unwinder that read junk for a return address). Exit 77 (ctest
skip) when the program or go is missing.
"""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

TOP = 5
MAX_FRAMES = 64  # the hook's depth limit (kHeapFrames)
# What the biggest stacks at the peak must exceed: sqlite3's allocations there
# are 10-20 frames deep (the parser, the VDBE, the B-tree); sort's biggest is
# its buffer, allocated from main.
TOP_DEPTH = {"sqlite3": 8, "sort": 3, "git": 8}
ROOTS = ("__libc_start_main", "__libc_start_call_main", "start_thread")
BARE = re.compile(r"^0x[0-9a-f]+$")


def traces(prof):
    """The stacks of a profile: [(bytes text, [frame, ...]), ...] in pprof's order."""
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="")
    out = subprocess.run(["go", "tool", "pprof", "-traces", prof], capture_output=True, text=True, env=env,
                         check=True).stdout
    stacks = []
    for block in out.split("-----------+")[1:]:
        lines = [l for l in block.split("\n")[1:] if l.strip() and not re.match(r"^\s+(kind|device):", l)]
        if not lines:
            continue
        first = lines[0].split(None, 1)
        frames = [first[1].strip() if len(first) > 1 else ""] + [l.strip() for l in lines[1:]]
        stacks.append((first[0], [f for f in frames if f]))
    return stacks, out


def to_bytes(text):
    m = re.match(r"^([0-9.]+)([kMG]?)B$", text)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def check_profile(name, prof, min_depth):
    stacks, text = traces(prof)
    if not stacks:
        sys.exit(f"FAIL {name}: no stacks in {prof}\n{text}")
    for size, frames in stacks:
        bare = [f for f in frames if BARE.match(f.split()[0])]
        if bare:
            sys.exit(f"FAIL {name}: bare addresses {bare} in the stack {frames} ({prof})")
        # A complete stack ends at the program's or a thread's start (or at the hook's depth limit).
        if len(frames) < MAX_FRAMES and not any(f.split()[0] in ROOTS for f in frames):
            sys.exit(f"FAIL {name}: a stack ({size}) does not reach {ROOTS}: {frames} ({prof})")
    top = sorted(stacks, key=lambda s: -to_bytes(s[0]))[:TOP]
    for size, frames in top:
        if len(frames) <= min_depth:
            sys.exit(f"FAIL {name}: a top stack ({size}) has {len(frames)} frames: {frames} ({prof})")
    print(f"ok: {name} {os.path.basename(prof)}: {len(stacks)} stacks, all complete, top {len(top)} with "
          f"{min(len(f) for _, f in top)}-{max(len(f) for _, f in top)} frames, no bare address")


def run_hooked(hook, outdir, argv, stdin_path, tmp, **extra_env):
    env = dict(os.environ, LD_PRELOAD=hook, SPYGLASS_HEAP_PROFILE_DIR=outdir, **extra_env)
    env.pop("SPYGLASS_UNWINDER", None)  # the default unwinder is what is tested
    env.pop("SPYGLASS_HEAP_PID", None)
    with open(stdin_path, "rb") as stdin:
        r = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp)
    if r.returncode != 0:
        sys.exit(f"FAIL {argv[0]}: exit status {r.returncode}: {r.stderr.decode(errors='replace')}")


def main():
    hook = os.path.abspath(sys.argv[1])
    programs = sys.argv[2:] or ["sqlite3", "sort"]
    if not shutil.which("go"):
        print("SKIP: go is not installed (go tool pprof reads the profiles)")
        sys.exit(77)
    missing = [p for p in programs if not shutil.which(p)]
    if missing:
        print(f"SKIP: not installed: {missing} (apt-get install -y sqlite3)")
        sys.exit(77)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="spyglass-real-") as tmp:
        for prog in programs:
            outdir = os.path.join(tmp, prog + ".prof")
            if prog == "sqlite3":
                # The benchmark's workload (bench/real_unwind_bench.py), smaller.
                sql = os.path.join(tmp, "work.sql")
                with open(sql, "w") as f:
                    f.write("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, val REAL, grp INTEGER);\nBEGIN;\n")
                    for _ in range(20000):
                        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 20)))
                        f.write(f"INSERT INTO t(name,val,grp) VALUES('{name}',{rng.random() * 1000:.4f},"
                                f"{rng.randint(0, 99)});\n")
                    f.write("COMMIT;\nSELECT grp, count(*), avg(val) FROM t GROUP BY grp ORDER BY 2 DESC LIMIT 5;\n")
                run_hooked(hook, outdir, [shutil.which("sqlite3"), os.path.join(tmp, "t.db")], sql, tmp)
            elif prog == "sort":
                nums = os.path.join(tmp, "nums.txt")
                values = [str(rng.randint(0, 10**9)) for _ in range(200000)]
                with open(nums, "w") as f:
                    f.write("\n".join(values) + "\n")
                # -S: a small buffer, so that sort merges temporary files too.
                run_hooked(hook, outdir, [shutil.which("sort"), "-S", "1M", "-T", tmp], nums, tmp)
            elif prog == "git":
                # A small repository made unhooked, then its history read hooked.
                repo = os.path.join(tmp, "repo")
                genv = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_NOSYSTEM="1", HOME=tmp)
                genv.pop("LD_PRELOAD", None)
                subprocess.run(["git", "init", "-q", repo], check=True, env=genv)
                for c in range(20):
                    with open(os.path.join(repo, f"f{c % 5}.txt"), "a") as f:
                        f.write("".join(f"line {c} {rng.random()}\n" for _ in range(200)))
                    subprocess.run(["git", "-C", repo, "add", "-A"], check=True, env=genv)
                    subprocess.run(["git", "-C", repo, "commit", "-q", "-m", f"c{c}"], check=True, env=genv)
                run_hooked(hook, outdir, [shutil.which("git"), "-C", repo, "--no-pager", "log", "-p", "--stat"],
                           os.devnull, tmp, HOME=tmp, GIT_CONFIG_NOSYSTEM="1")
            else:
                sys.exit(f"unknown program {prog}")
            profs = sorted(p for p in os.listdir(outdir) if p.endswith((".exit.prof", ".peak.prof")))
            if len(profs) < 2:
                sys.exit(f"FAIL {prog}: profiles missing in {outdir}: {os.listdir(outdir)}")
            for p in profs:
                check_profile(prog, os.path.join(outdir, p), TOP_DEPTH[prog] if p.endswith(".peak.prof") else 0)
    print("PASS")


if __name__ == "__main__":
    main()
