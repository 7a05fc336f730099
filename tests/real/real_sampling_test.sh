#!/usr/bin/env bash
# The `real` tier for the CPU sampler: Debian's sqlite3 (built without frame
# pointers) under `spyglass run --sample 1999` and under `perf record
# --all-user -g` at the same rate, on the same SQL. Checks:
#   - the same top function;
#   - every function perf gives 5% or more of the samples is within 3
#     points in our profile (self time, read by `go tool pprof`);
#   - no more time in unnamed functions (bare addresses) than perf's.
#   real_sampling_test.sh <spyglass CLI>
set -euo pipefail
cli=$(realpath "$1")
T=$(mktemp -d /tmp/spyglass-real-sampling-XXXXXX)
trap 'rm -rf "$T"' EXIT
export GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T} PPROF_TMPDIR=$T LC_ALL=C
unset SPYGLASS_TRACE_DIR SPYGLASS_OPTIONS SPYGLASS_UNWINDER || true
fail() { echo "FAIL: $*"; exit 1; }
trap 'echo "FAIL: line $LINENO exited with $?"' ERR
for p in sqlite3 perf go; do command -v "$p" >/dev/null || fail "$p is not installed"; done
cd "$T"
cat > work.sql <<'SQL'
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, val REAL, grp INTEGER);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000000)
INSERT INTO t(name,val,grp) SELECT printf('%08X%08X', (x * 2654435761) % 4294967296, (x * 40503) % 65536),
  ((x * 7919) % 100000) / 7.0, x % 97 FROM c;
CREATE INDEX ig ON t(grp, val);
CREATE INDEX iname ON t(name);
SELECT grp, count(*), round(avg(val),2) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3;
SELECT count(*), max(substr(name, 3, 5)) FROM t WHERE name LIKE '%AB%';
SQL

"$cli" run --sample 1999 -o s -- sqlite3 :memory: < work.sql > /dev/null 2> s.err || fail "spyglass run: $(cat s.err)"
prof=$(ls s/plugins/profile/*/cpu.*.prof)
go tool pprof -top -sample_index=cpu -nodecount=200 "$prof" 2>/dev/null |
  awk '$2 ~ /%$/ && $1 != "flat" { n = $2; sub("%", "", n); name = $6; for (i = 7; i <= NF; i++) name = name " " $i; print name "\t" n }' > ours.tsv
perf record --all-user -F 1999 -g -o perf.data -- sqlite3 :memory: < work.sql > /dev/null 2> perf.err || fail "perf record: $(cat perf.err)"
perf report -i perf.data --no-children --sort sym -F overhead,sym --stdio -g none 2>/dev/null |
  awk '$2 == "[.]" { n = $1; sub("%", "", n); name = $3; for (i = 4; i <= NF; i++) name = name " " $i; print name "\t" n }' > perf.tsv
echo "top functions (spyglass | perf):"
paste <(sort -t$'\t' -k2 -gr ours.tsv | head -8) <(sort -t$'\t' -k2 -gr perf.tsv | head -8)
# (The largest share by awk: `sort | head -1` could end sort by SIGPIPE,
# which pipefail turned into a silent exit.)
top() { awk -F'\t' 'NR == 1 || $2 + 0 > best { best = $2 + 0; name = $1 } END { print name }' "$1"; }
top_ours=$(top ours.tsv)
top_perf=$(top perf.tsv)
[ "$top_ours" = "$top_perf" ] || fail "top function: ours $top_ours, perf's $top_perf"
# Symbol tables of sqlite3 and the libraries it runs, with their separate
# debug files (libc6-dbg): "file address name" for every function symbol.
for obj in $(command -v sqlite3) $(ldd "$(command -v sqlite3)" | awk '$3 ~ /^\// { print $3 }'); do
  id=$(readelf -n "$obj" 2>/dev/null | awk '/Build ID/ { print $3 }')
  for f in "$obj" ${id:+/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug}; do
    [ -r "$f" ] || continue
    { nm "$f"; nm -D "$f"; } 2>/dev/null | awk -v o="$obj" '$2 ~ /^[tTwWiI]$/ { print o, $1, $3 }'
  done
done | sort -u > symbols.txt
# aliases NAME: the other names of the function(s) called NAME.
aliases() {
  awk -v n="$1" 'NR == FNR { if ($3 == n) at[$1 " " $2] = 1; next } ($1 " " $2) in at && $3 != n { print $3 }' \
    symbols.txt symbols.txt | sort -u
}
while IFS=$'\t' read -r fn share; do
  awk -v s="$share" 'BEGIN { exit !(s >= 5) }' || continue
  case "$fn" in 0x*) continue ;; esac  # unnamed: compared in all below
  ours=$(awk -F'\t' -v f="$fn" '$1 == f { print $2 }' ours.tsv)
  if [ -z "$ours" ]; then
    # One address can carry several names (glibc's memcpy and memmove
    # variants are one function): either name is right, so take ours under
    # any of the names the symbol tables give that address.
    for a in $(aliases "$fn"); do
      ours=$(awk -F'\t' -v f="$a" '$1 == f { print $2 }' ours.tsv)
      if [ -n "$ours" ]; then echo "($fn is also named $a)"; break; fi
    done
  fi
  [ -n "$ours" ] || fail "$fn: $share% in perf's profile, absent from ours (names at its address: $(aliases "$fn" | tr '\n' ' '))"
  awk -v a="$ours" -v b="$share" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 3) }' ||
    fail "$fn: ours $ours%, perf's $share%"
  echo "ok: $fn ours $ours% perf $share%"
done < perf.tsv
# Functions no symbol table names (static ones of a stripped library) are
# addresses in both profiles: ours may not leave more unnamed than perf does.
bare_ours=$(awk -F'\t' '$1 ~ /^0x|\+0x/ { s += $2 } END { print s + 0 }' ours.tsv)
bare_perf=$(awk -F'\t' '$1 ~ /^0x/ { s += $2 } END { print s + 0 }' perf.tsv)
echo "unnamed: ours $bare_ours%, perf's $bare_perf%"
awk -v a="$bare_ours" -v b="$bare_perf" 'BEGIN { exit !(a <= b + 3) }' || fail "unnamed frames: ours $bare_ours%, perf's $bare_perf%"
echo PASS
