#!/usr/bin/env bash
# `spyglass view` end to end: prints a URL on 127.0.0.1 with a token, 403
# without the token, a window of a known run, bad requests refused; then a
# generated trace of SPYGLASS_VIEW_EVENTS events (default 3M) indexed, a
# page and a window served, with peak RSS asserted under the goal of 0.2x the
# file + 200 MB (the index streams; its levels live in a mapped file).
# Timing is printed, not asserted.
#   view_cli_test.sh SPYGLASS_CLI MAKE_KNOWN_RUN
set -euo pipefail
cli=$1 known=$2
T=$(mktemp -d /tmp/spyglass-view-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir "$T/tmp"
export XDG_CACHE_HOME="$T/cache"  # the index cache: this test's own
start() {  # start RUN [ARGS]: sets pid and url
  : > "$T/url"  # emptied here: the child's redirection could come after the first check
  TMPDIR="$T/tmp" "$cli" view "$@" > "$T/url" 2> "$T/err" &
  pid=$!
  for _ in $(seq 1 1200); do
    [ -s "$T/url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$T/err"; fail "spyglass view exited"; }
    sleep 0.1
  done
  url=$(head -1 "$T/url")
  [[ "$url" =~ ^http://127\.0\.0\.1:[0-9]+/\?token=[0-9a-f]{32}$ ]] || fail "URL: $url"
  # The URL comes before the index: /progress says when the timeline is ready.
  local p
  for _ in $(seq 1 1200); do
    p=$(curl -s "${url%%/\?*}/progress?token=${url#*token=}")
    [[ "$p" =~ \"ready\":\ ?true ]] && return
    [[ "$p" =~ \"ready\":false ]] || fail "/progress while indexing: $p"
    kill -0 "$pid" 2>/dev/null || { cat "$T/err"; fail "spyglass view exited"; }
    sleep 0.1
  done
  fail "not ready after 120 s"
}
stop() { kill -INT "$pid"; wait "$pid" || fail "spyglass view did not end cleanly on SIGINT"; pid=; }
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

"$known" "$T/log" > /dev/null
start "$T/log"
base=${url%%/\?*}
token=${url#*token=}
[ "$(code "$url")" = 200 ] || fail "the page with the token"
[ "$(code "$base/")" = 403 ] || fail "no token must be 403"
[ "$(code "$base/?token=${token%?}0")" = 403 ] || [ "${token: -1}" = 0 ] || fail "a wrong token must be 403"
[ "$(code -H 'Host: attacker.example' "$url")" = 403 ] || fail "another Host must be 403"
[ "$(code -X POST "$url")" = 405 ] || fail "POST must be 405"
[ "$(code "$base/window?token=$token&t0=zz&t1=1&px=1")" = 400 ] || fail "a bad window must be 400"
page=$(curl -s "$url")  # read whole: grep -q would close the pipe early (SIGPIPE under pipefail)
grep -q "connect-src 'self'" <<<"$page" || fail "the page's CSP"
curl -s "$base/window?token=$token&t0=32000000&t1=62000000&px=1000" -o "$T/w.bin"
[ "$(stat -c %s "$T/w.bin")" -gt 4 ] || fail "the window answer"
# A TMPDIR where the index cannot be written: an error, not a server.
if [ "$(id -u)" != 0 ]; then
  TMPDIR=/proc "$cli" view --no-cache "$T/log" > /dev/null 2> "$T/err2" && fail "an unwritable TMPDIR must fail"
fi
TMPDIR=/nonexistent-dir "$cli" view --no-cache "$T/log" > /dev/null 2> "$T/err2" && fail "a missing TMPDIR must fail"
grep -q "spyglass view:" "$T/err2" || fail "no message for a missing TMPDIR"
# A second instance gets another port and token; the index cached by the
# first is reused (said so), and serves the same page and windows.
grep -q "index cached in $T/cache/spyglass/view/index-v" "$T/err" || fail "first start: not cached: $(cat "$T/err")"
get() { curl -s "${url%%/\?*}/$1?token=${url#*token=}$2" -o "$3"; }
get "" "" "$T/page1"; get window "&t0=0&t1=200000000&px=1500" "$T/w1"; get window "&t0=32000000&t1=33000000&px=900" "$T/v1"
url1=$url pid1=$pid
start "$T/log"
[ "$url" != "$url1" ] || fail "two servers, one URL"
grep -q "reusing the index cached in $T/cache/spyglass/view/index-v" "$T/err" || fail "second start: not reused: $(cat "$T/err")"
grep -q "summarizing" "$T/err" && fail "second start: summarized again"
get "" "" "$T/page2"; get window "&t0=0&t1=200000000&px=1500" "$T/w2"; get window "&t0=32000000&t1=33000000&px=900" "$T/v2"
cmp "$T/page1" "$T/page2" || fail "the reused index serves another page"
cmp "$T/w1" "$T/w2" && cmp "$T/v1" "$T/v2" || fail "the reused index serves other windows"
stop
pid=$pid1
stop
# A touched run is indexed again; --no-cache neither reads nor writes the cache.
touch "$T/log/plugins/profile/run1/known.xplane.pb"
start "$T/log"
grep -q "index cached in" "$T/err" || fail "a touched run: not indexed again: $(cat "$T/err")"
stop
cached=$(ls "$T/cache/spyglass/view" | sort)
start "$T/log" --no-cache
grep -q "cache" "$T/err" && fail "--no-cache: $(cat "$T/err")"
stop
[ "$(ls "$T/cache/spyglass/view" | sort)" = "$cached" ] || fail "--no-cache wrote to the cache"
# A cache directory writable by others: refused, said, the index temporary.
chmod 0777 "$T/cache/spyglass/view"
start "$T/log"
grep -q "not using the index cache: .* is writable by group or others" "$T/err" || fail "an open cache dir: $(cat "$T/err")"
stop
chmod 0700 "$T/cache/spyglass/view"

# A big trace: bounded memory.
events=${SPYGLASS_VIEW_EVENTS:-3000000}
"$known" "$T/big" --busy "$events" > /dev/null
file=$(ls "$T"/big/plugins/profile/run1/*.xplane.pb)
bytes=$(stat -c %s "$file")
# The URL comes before the index; interrupted while indexing, it ends
# cleanly once the index is built, leaving nothing in TMPDIR.
: > "$T/url"
TMPDIR="$T/tmp" "$cli" view --no-cache "$T/big" > "$T/url" 2> "$T/err" &
pid=$!
until [ -s "$T/url" ]; do kill -0 "$pid" 2>/dev/null || fail "spyglass view exited"; sleep 0.02; done
first=$(curl -s "$(head -1 "$T/url" | sed 's#/?token=#/progress?token=#')")
[[ "$first" =~ \"size\":$bytes || "$first" =~ \"ready\":\ true ]] || fail "/progress while indexing: $first"
kill -INT "$pid"
wait "$pid" || fail "interrupted while indexing: not a clean end"
pid=
[ -z "$(ls -A "$T/tmp")" ] || fail "left in TMPDIR after an interrupt while indexing: $(ls -A "$T/tmp")"
t_start=$(date +%s.%N)
start "$T/big" --no-cache  # the temporary index
t_ready=$(date +%s.%N)
[ "$(code "$url")" = 200 ] || fail "the big page"
curl -s "${url%%/\?*}/window?token=${url#*token=}&t0=1000000&t1=1010000&px=1000" -o /dev/null
hwm_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
# The index file (in $TMPDIR) is mapped and unlinked once built: nothing there while it serves.
[ -z "$(ls -A "$T/tmp")" ] || fail "left in TMPDIR: $(ls -A "$T/tmp")"
maps=$(cat "/proc/$pid/maps")  # read whole: grep -q would close the pipe early (SIGPIPE under pipefail)
grep -q "$T/tmp/spyglass-view-.*\.index (deleted)" <<<"$maps" || fail "the index is not mapped (unlinked)"
stop
goal_kb=$(( bytes / 5 / 1024 + 200 * 1024 ))
echo "view of $events events ($((bytes >> 20)) MiB): ready after $(echo "$t_ready - $t_start" | bc) s, peak RSS $((hwm_kb >> 10)) MiB (goal $((goal_kb >> 10)) MiB)"
[ "$hwm_kb" -le "$goal_kb" ] || fail "peak RSS $hwm_kb KiB over 0.2x the file + 200 MB ($goal_kb KiB)"
echo "view_cli_test: all passed"
