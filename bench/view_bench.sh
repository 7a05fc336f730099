#!/usr/bin/env bash
# `spyglass view` on a generated trace of N events (make_known_run --busy N):
# seconds to the URL (printed at once) and to the index (until /progress
# says ready), then again with the index cached (reopen_s), the page's first paint in
# Debian's chromium (view_check.mjs: ready time, then a zoom to single
# events), peak RSS of the server against 0.2x the file + 200 MB. Baselines:
# the floor (reading the file once) and the naive one (`spyglass report` of
# the same run: the whole timeline in one page), seconds and peak RSS.
#   bench/view_bench.sh BUILD_DIR [N]   (default 10000000)
# VIEW_BENCH_RUN=DIR: a run made before (make_known_run DIR --busy N) instead
# of a new one; VIEW_BENCH_NAIVE=0: no naive baseline (at 100M events
# `spyglass report` needs about 10 GB).
set -euo pipefail
build=$1 n=${2:-10000000}
here=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d /tmp/spyglass-viewbench-XXXXXX)
export XDG_CACHE_HOME="$T/cache"  # a cold index cache, then the second start reuses it
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$T"' EXIT
run=${VIEW_BENCH_RUN:-$T/log}
[ -n "${VIEW_BENCH_RUN:-}" ] || "$build/tests/report/make_known_run" "$run" --busy "$n" > /dev/null
file=$(ls "$run"/plugins/profile/run1/*.xplane.pb)
bytes=$(stat -c %s "$file")
# start: sets pid, url, t0 (started), t_url (URL printed), t1 (/progress says ready).
start() {
  : > "$T/url"
  t0=$(date +%s.%N)
  "$build/spyglass" view "$run" > "$T/url" 2> "$T/err" &
  pid=$!
  until [ -s "$T/url" ]; do kill -0 "$pid" || { cat "$T/err"; exit 1; }; sleep 0.05; done
  t_url=$(date +%s.%N)
  url=$(head -1 "$T/url")
  # The URL comes at once (the page shows the index's progress); the timeline
  # is ready when /progress says so.
  until curl -s "${url%%/\?*}/progress?token=${url#*token=}" | grep -q '"ready": *true'; do
    kill -0 "$pid" || { cat "$T/err"; exit 1; }; sleep 0.05
  done
  t1=$(date +%s.%N)
}
start
# The first response of the page, then of one data request (a window of the whole run), by curl.
base=${url%%/\?*} token=${url#*token=}
page_s=$(curl -s -o /dev/null -w '%{time_total}' "$url")
dur_ns=$(( n / 3 * 4500 ))
window_s=$(curl -s -o /dev/null -w '%{time_total}' "$base/window?token=$token&t0=0&t1=$dur_ns&px=4000")
echo "first page response ${page_s} s, first window (whole run, 4000 px) ${window_s} s"
# VIEW_BENCH_ZOOM_MS: where to zoom to single events (default 90 ms, "outer" #20000).
node "$here/tests/browser/view_check.mjs" "$url" --track busy --zoom-ms "${VIEW_BENCH_ZOOM_MS:-90,90.01}" --expect-name outer | tee "$T/page"
t2=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
kill -INT "$pid"; wait "$pid"; pid=
# The second start: the cached index (and summary) of the unchanged run.
t_first=$t0 t_first_url=$t_url t_first_ready=$t1
start
reopen_s=$(echo "$t1 - $t0" | bc)
grep -q "reusing the index cached" "$T/err" || { cat "$T/err"; echo "second start: the cache not reused"; exit 1; }
reopen_hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
kill -INT "$pid"; wait "$pid"; pid=
t0=$t_first t_url=$t_first_url t1=$t_first_ready
floor_s=$( { /usr/bin/time -f %e cat "$file" > /dev/null; } 2>&1 )
if [ "${VIEW_BENCH_NAIVE:-1}" != 0 ]; then
  naive=$( { /usr/bin/time -f "%e %M" "$build/spyglass" report "$run" -o "$T/r.html" > /dev/null; } 2>&1 | tail -1)
  echo "floor (cat the file): ${floor_s} s; naive (spyglass report): ${naive%% *} s, peak RSS $(( ${naive##* } >> 10 )) MiB, page $(( $(stat -c %s "$T/r.html") >> 10 )) KiB"
else
  echo "floor (cat the file): ${floor_s} s; naive not run (VIEW_BENCH_NAIVE=0)"
fi
echo "events=$n file=$((bytes >> 20))MiB url_s=$(echo "$t_url - $t0" | bc) index_s=$(echo "$t1 - $t0" | bc) url_to_zoomed_s=$(echo "$t2 - $t1" | bc)" \
  "peak_rss=$((hwm >> 10))MiB goal=$(( (bytes / 5 >> 20) + 200 ))MiB reopen_s=$reopen_s reopen_peak_rss=$((reopen_hwm >> 10))MiB"
