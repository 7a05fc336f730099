#!/usr/bin/env bash
# The `real` tier: programs nobody on this project wrote (Debian's sqlite3,
# sort, head, ls, git and gcc, built without frame pointers), run as a new
# user would run them under `spyglass run`.
#   real_native_test.sh <spyglass CLI>
# Checks:
#   - their stdout and exit status are unchanged, under memory, trace and
#     both, with and without `--`;
#   - the heap stacks run from the allocator back to __libc_start_main, and no
#     frame is a bare address;
#   - sqlite3's peak equals massif's (--peak-inaccuracy=0) within 1%;
#   - the live-bytes counter's peak agrees with the peak profile.
set -euo pipefail
cli=$(realpath "$1")
T=$(mktemp -d /tmp/spyglass-real-XXXXXX)
trap 'rm -rf "$T"' EXIT
export GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T} PPROF_TMPDIR=$T GIT_PAGER=cat LC_ALL=C
unset SPYGLASS_TRACE_DIR SPYGLASS_HEAP_PROFILE_DIR SPYGLASS_HEAP SPYGLASS_UNWINDER SPYGLASS_OPTIONS || true
fail() { echo "FAIL: $*"; exit 1; }
for p in sqlite3 sort head ls git gcc valgrind go; do command -v "$p" >/dev/null || fail "$p is not installed (scripts/setup.sh --browser installs it)"; done
cd "$T"

# ---- inputs (made here, the same on every run) ----
python3 - <<'PY'
import random
r = random.Random(1)
def sql(n, path):
    with open(path, "w") as f:
        f.write("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, val REAL, grp INTEGER);\nBEGIN;\n")
        for _ in range(n):
            name = "".join(r.choice("abcdefghij") for _ in range(r.randint(5, 30)))
            f.write("INSERT INTO t(name,val,grp) VALUES('%s',%.3f,%d);\n" % (name, r.random() * 1000, r.randint(0, 99)))
        f.write("COMMIT;\nSELECT count(*), sum(grp) FROM t;\n"
                "SELECT grp, count(*), round(avg(val),2) FROM t GROUP BY grp ORDER BY grp LIMIT 5;\n"
                "SELECT max(length(name)), min(val) FROM t;\n")
sql(200000, "work.sql")
sql(2000, "small.sql")
with open("words", "w") as f:
    for i in range(50000):
        f.write("%08x %s\n" % (r.getrandbits(32), "".join(r.choice("xyzw") for _ in range(r.randint(1, 12)))))
PY
mkdir -p in/listing && touch -d 2020-01-01 in/listing/a in/listing/b && mkdir repo  # in/: its link count stays
git -C repo init -q && git -C repo -c user.name=t -c user.email=t@t commit -q --allow-empty -m first &&
  git -C repo -c user.name=t -c user.email=t@t commit -q --allow-empty -m second
printf '#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n' > hello.c

# ---- output and exit status unchanged ----
n=0
fresh() { rm -f t.db hello.o; n=$((n + 1)); }
# same NAME STDIN -- COMMAND...: the program alone, then under each way of running it.
same() {
  local name=$1 input=$2; shift 3
  fresh; local want rc_want=0
  want=$("$@" < "$input" 2>/dev/null) || rc_want=$?
  local variants=("run -o m$n" "run -o m$n --" "run --trace t$n" "run --trace t$n --" "run --memory --trace b$n --")
  for v in "${variants[@]}"; do
    fresh
    local got rc=0
    # shellcheck disable=SC2086
    got=$("$cli" $v "$@" < "$input" 2>"err$n") || rc=$?
    [ "$rc" = "$rc_want" ] || { cat "err$n"; fail "$name: 'spyglass $v $*' exited $rc, the program alone $rc_want"; }
    [ "$got" = "$want" ] || { diff <(echo "$want") <(echo "$got") | head -5; fail "$name: 'spyglass $v $*' changed the output"; }
  done
  echo "ok: $name: output and exit status unchanged (${#variants[@]} ways)"
}
same sort /dev/null -- sort -r words
same head /dev/null -- head -n 3 words
same ls /dev/null -- ls -la in/listing
same ls-missing /dev/null -- ls -la no-such-file
same git /dev/null -- git -C repo log --format=%s
same sqlite3 small.sql -- sqlite3 t.db
same gcc /dev/null -- gcc -c hello.c -o hello.o

# ---- stacks: from the allocator back to __libc_start_main, no bare address ----
# stacks_ok PROFILE NAME: no bare address anywhere; the sample holding the most bytes has a whole stack.
stacks_ok() {
  local prof=$1 name=$2
  go tool pprof -traces -sample_index=space "$prof" > "$name.traces" 2>/dev/null || true
  [ -s "$name.traces" ] || fail "$name: go tool pprof read nothing from $prof"
  # Blocks are separated by dashes; the frames are the lines after the labels.
  python3 - "$name" "$name.traces" <<'PY' || exit 1
import re, sys
name = sys.argv[1]
text = open(sys.argv[2]).read()
blocks = [b for b in text.split("-----------+-------------------------------------------------------") if b.strip()]
units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
best = None
for b in blocks:
    lines = [l for l in b.splitlines() if l.strip() and ":" not in l.split()[0]]
    if not lines:
        continue
    m = re.match(r"\s*([0-9.]+)(B|kB|MB|GB)\s+(.*)", lines[0])
    if not m:
        continue
    frames = [m.group(3).strip()] + [l.strip() for l in lines[1:]]
    size = float(m.group(1)) * units[m.group(2)]
    bare = [f for f in frames if re.fullmatch(r"0x[0-9a-f]+", f)]
    if bare:
        print(f"FAIL: {name}: a frame that is only an address: {bare[0]} in {frames}")
        sys.exit(1)
    if best is None or size > best[0]:
        best = (size, frames)
if best is None:
    print(f"FAIL: {name}: no stack in the profile"); sys.exit(1)
frames = best[1]
if len(frames) < 4 or not any("__libc_start_main" in f for f in frames):
    print(f"FAIL: {name}: the largest site's stack is not whole: {frames}"); sys.exit(1)
print(f"ok: {name}: {len(frames)} frames, {frames[0]} ... {frames[-1]}")
PY
}
fresh
"$cli" run -o big -- sqlite3 t.db < work.sql > big.out 2> big.err || { cat big.err; fail "sqlite3 under spyglass run"; }
stacks_ok "$(ls big/memory.*.sqlite3.peak.prof)" sqlite3
"$cli" run -o s -- sort words > /dev/null 2> s.err || { cat s.err; fail "sort under spyglass run"; }
stacks_ok "$(ls s/memory.*.sort.peak.prof)" sort
"$cli" run -o g -- git -C repo log --stat > /dev/null 2> g.err || { cat g.err; fail "git under spyglass run"; }
stacks_ok "$(ls g/memory.*.git.peak.prof)" git

# ---- sqlite3's peak against massif's ----
peak_of() { zcat "$1" | strings | sed -n 's/.*spyglass: peak cpu:0 \([0-9]*\) bytes.*/\1/p' | head -1; }
ours=$(peak_of "$(ls big/memory.*.sqlite3.peak.prof)")
fresh
valgrind --tool=massif --peak-inaccuracy=0 --massif-out-file=massif.out sqlite3 t.db < work.sql > /dev/null 2>&1 ||
  fail "massif on sqlite3"
theirs=$(sed -n 's/^mem_heap_B=//p' massif.out | sort -n | tail -1)
python3 -c "
o, t = $ours, $theirs
d = abs(o - t) / t
print(f'sqlite3 peak: spyglass {o:,} B, massif {t:,} B ({100 * d:.2f}% apart)')
raise SystemExit(0 if d <= 0.01 else 'FAIL: the peaks differ by more than 1%')"

# ---- the counter's peak agrees with the peak profile ----
fresh
"$cli" run --memory --trace both -- sqlite3 t.db < work.sql > /dev/null 2> both.err || { cat both.err; fail "sqlite3 under --memory --trace"; }
profile_peak=$(peak_of "$(ls both/memory.*.sqlite3.peak.prof)")
"$cli" summary --json both > both.json || fail "summary of the trace"
python3 - "$profile_peak" <<'PY'
import json, sys
want = int(sys.argv[1])
d = json.load(open("both.json"))
c = [c for c in d["counters"] if c["name"] == "memory cpu:0"]
if not c:
    sys.exit(f"FAIL: no 'memory cpu:0' counter in the trace: {[c['name'] for c in d['counters']]}")
peak, last = c[0]["peak"], c[0]["last"]
if abs(peak - want) > 0.01 * want:
    sys.exit(f"FAIL: the counter's peak {peak} is not the peak profile's {want}")
if last > 0.05 * want:
    sys.exit(f"FAIL: the counter ends at {last} B, but sqlite3 frees nearly everything (peak {want})")
print(f"ok: counter peak {peak:,} B, peak profile {want:,} B, last {last:,} B")
PY
echo "PASS"
