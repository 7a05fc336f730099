#!/usr/bin/env bash
# The native Perfetto trace against the .xplane.pb of the same run, decoded
# with the Perfetto project's own classes (PyPI perfetto, installed by
# scripts/setup.sh): a model with every case the writer handles (the
# fixture), then a real session (the demo: steps, nested annotations, two
# threads) through stop_trace with create_perfetto_trace, then a sampled run
# (`spyglass run --sample` of the known workload, its .xplane.pb converted by
# the fixture): every CPU sample a PerfSample with its whole stack, and the
# same counts by thread and stack as its pprof profile, under the annotations
# open on its thread (outermost frames, mapping "[annotation]").
set -euo pipefail
fixture=$1
demo=$2
spyglass=${3:-}
workload=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' ||
  { echo "PyPI perfetto is not installed: run scripts/setup.sh" >&2; exit 1; }

mkdir "$out/fixture"
"$fixture" "$out/fixture" > /dev/null
python3 "$here/compare_with_xplane.py" "$out/fixture/fixture.xplane.pb" "$out/fixture/perfetto_trace.pb" \
  --min-slices 15 --expect-flows 3 --expect-counter-unit bytes --expect-overflow-lane \
  --min-samples 8 --pprof "$out"/fixture/cpu.4242.fixture.prof \
  --expect-annotation-stack "step|forward" --expect-annotation-stack "step|ns::layer"

"$demo" "$out/demo" --steps 3 > "$out/demo.log"
run=$(ls -d "$out"/demo/plugins/profile/*/)
python3 "$here/compare_with_xplane.py" "$run"*.xplane.pb "$run"perfetto_trace.pb --min-slices 10

if [[ -n "$spyglass" ]]; then
  "$spyglass" run --sample 999 -o "$out/sampled" -- "$workload" 1 > "$out/sampled.log" 2>&1 ||
    { cat "$out/sampled.log"; exit 1; }
  run=$(ls -d "$out"/sampled/plugins/profile/*/)
  "$fixture" --from "$run"*.xplane.pb "$run"
  python3 "$here/compare_with_xplane.py" "$run"*.xplane.pb "$run"perfetto_trace.pb --min-slices 0 \
    --min-samples 300 --pprof "$(ls "$run"cpu.*.prof)"
fi
