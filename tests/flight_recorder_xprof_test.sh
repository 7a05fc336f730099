#!/usr/bin/env bash
# Each flight recorder trigger writes a run that XProf's converter reads:
# the API, a signal sent from outside, a slow step, the profiler server
# (`spyglass collect --flight-recorder`), and a crash (SIGSEGV).
#   flight_recorder_xprof_test.sh <flight_recorder_child> <spyglass CLI>
set -euo pipefail
child=$1
cli=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
pid=
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

# Every run under $1 reads in XProf with the steps and events of the child.
check_runs() {
  local dir=$1 want=$2 n=0
  for x in "$dir"/plugins/profile/*/*.xplane.pb; do
    [[ -f "$x" ]] || continue
    n=$((n + 1))
    python3 "$here/xprof/xprof_check.py" "$x" --expect-event matmul --expect-event relu \
      --expect-event load_batch --expect-step "train 3"
  done
  if (( n < want )); then
    echo "FAIL: $dir holds $n runs, expected at least $want" >&2
    ls -R "$dir" >&2 || true
    exit 1
  fi
  # No temporary file left behind (the crash handler's is removed at stop or exit).
  if ls -A "$dir"/plugins/profile | grep -q '^\.'; then
    echo "FAIL: a temporary file is left in $dir/plugins/profile" >&2
    exit 1
  fi
}

echo "== api"
"$child" "$out/api" api
check_runs "$out/api" 2   # the dump and the stop

echo "== slow step"
"$child" "$out/slow" slow_step 2> "$out/slow.log"
grep -q "dumped (slow step)" "$out/slow.log"
check_runs "$out/slow" 2

echo "== signal (SIGUSR2 from outside)"
coproc SIG { exec "$child" "$out/signal" signal; }
pid=$SIG_PID
read -r -t 60 line <&"${SIG[0]}"
[[ "$line" == READY ]] || { echo "FAIL: child said '$line'" >&2; exit 1; }
kill -USR2 "$pid"
wait "$pid"
pid=
check_runs "$out/signal" 2

echo "== server: spyglass collect --flight-recorder"
coproc SRV { exec "$child" "$out/server_child" server; }
pid=$SRV_PID
read -r -t 60 line <&"${SRV[0]}"
port=${line#PORT }
sleep 1  # a few steps into the ring
"$cli" collect "$port" --flight-recorder --log_dir "$out/server" --no_perfetto_link
exec {SRV[1]}>&-  # closes the child's stdin: it stops
wait "$pid"
pid=
check_runs "$out/server" 1

echo "== crash (SIGSEGV)"
set +e
"$child" "$out/crash" crash
rc=$?
set -e
if (( rc != 139 )); then
  echo "FAIL: the child exited with $rc, not by SIGSEGV (139)" >&2
  exit 1
fi
ls "$out"/crash/plugins/profile/*_crash_*/*.xplane.pb >/dev/null
check_runs "$out/crash" 1
echo "OK: every flight recorder trigger wrote a run that XProf reads"
