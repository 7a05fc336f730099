#!/usr/bin/env bash
# Runs exit_program in both modes under a timeout: each must exit 0, and the
# stopped mode must have written a .xplane.pb.
#
#   exit_program_test.sh <path to exit_program>
set -euo pipefail

prog=${1:?usage: $0 <exit_program>}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/spyglass-exit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# Several runs: exit races are timing dependent.
for run in 1 2 3; do
  rc=0
  timeout -k 5 30 "$prog" "$tmp/stopped-$run" || rc=$?
  [[ $rc -eq 0 ]] || fail "stopped mode (run $run) exited with $rc (124: hang)"
  compgen -G "$tmp/stopped-$run/plugins/profile/*/*.xplane.pb" >/dev/null \
    || fail "stopped mode (run $run) wrote no plugins/profile/<run>/*.xplane.pb"

  rc=0
  timeout -k 5 30 "$prog" "$tmp/running-$run" running || rc=$?
  [[ $rc -eq 0 ]] || fail "running mode (run $run) exited with $rc (124: hang)"
done
echo "PASS: exit_program"
