"""device_memory_profile inside a JAX program: jax's buffers and executables and ours, in one pprof.

Each case runs in a fresh interpreter (jax stays out of the test process)
and compares with jax.profiler.device_memory_profile of the same arrays.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import run_python

HERE = os.path.dirname(os.path.abspath(__file__))
JAX_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "SPYGLASS_JAX_MEMORY_INTERVAL_MS": "10",
           "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}


def have_jax():
  try:
    import jax  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


pytestmark = pytest.mark.skipif(not have_jax(), reason="jax not installed")

PROGRAM = r"""
import json, sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import jax.profiler
import spyglass.profiler as profiler
import spyglass.memory as memory
from pprof_decode import parse_profile

def make_weights():
    return jnp.ones((512, 512))

def make_sharded():
    mesh = Mesh(np.array(jax.devices()), ("d",))
    return jax.device_put(jnp.ones((8, 1000)), NamedSharding(mesh, PartitionSpec("d")))

w = make_weights()
y = jax.jit(lambda a: a * 2)(w)
s = make_sharded()
host = bytearray(100_003)
ptr = memory.record_allocation(host, kind="cache")

def key(sample):
    return json.dumps([sample["count"], sample["bytes"], sorted(sample["labels"].items()), sample["frames"]])

theirs = parse_profile(jax.profiler.device_memory_profile())
ours = parse_profile(profiler.device_memory_profile())
path = sys.argv[1]
profiler.save_device_memory_profile(path)
saved = parse_profile(open(path, "rb").read())
live = {}
for a in jax.live_arrays():
    for shard in a.addressable_shards:
        label = f"{shard.device.platform}:{shard.device.id}"
        live[label] = live.get(label, 0) + shard.data.nbytes
print(json.dumps({
    "theirs": sorted(key(x) for x in theirs),
    "ours_jax": sorted(key(x) for x in ours if x["labels"].get("kind") in ("buffer", "executable")),
    "ours_other": [x for x in ours if x["labels"].get("kind") not in ("buffer", "executable")],
    "saved": sorted(key(x) for x in saved),
    "ours_all": sorted(key(x) for x in ours),
    "live": live,
}))
memory.record_free(ptr)
"""


def test_device_memory_profile_holds_jaxs_buffers_and_executables_and_ours(tmp_path):
  p = run_python(PROGRAM, str(tmp_path / "m.prof"), env=JAX_ENV, timeout=300)
  r = json.loads(p.stdout.strip().splitlines()[-1])
  # Every sample of jax's own profile, the same (stack, labels, count, bytes).
  assert r["ours_jax"] == r["theirs"]
  samples = [json.loads(k) for k in r["theirs"]]
  buffers = [s for s in samples if dict(s[2]).get("kind") == "buffer"]
  executables = [s for s in samples if dict(s[2]).get("kind") == "executable"]
  assert executables and all("device" not in dict(s[2]) for s in executables)
  # The bytes per device equal the live arrays' (the sharded one on both devices).
  by_device = {}
  for count, nbytes, labels, _ in buffers:
    by_device[dict(labels)["device"]] = by_device.get(dict(labels)["device"], 0) + nbytes
  assert by_device == r["live"]
  assert set(by_device) == {"cpu:0", "cpu:1"}
  assert any(f[0] == "make_weights" for s in buffers for f in s[3])
  # Plus ours: the buffer recorded from Python, with its stack.
  (cache,) = r["ours_other"]
  assert cache["bytes"] == 100_003 and cache["labels"] == {"kind": "cache", "device": "cpu:0"}
  assert cache["frames"][0][0] == "<module>"
  # save_device_memory_profile writes the same profile.
  assert r["saved"] == r["ours_all"]


MEMDIFF_PROGRAM = r"""
import sys
import jax, jax.numpy as jnp
import spyglass.profiler as profiler

def grow_cache(cache, n):
    for i in range(n):
        cache.append(jnp.full((256, 256), float(i)))

cache = []
grow_cache(cache, 1)
jax.block_until_ready(cache)
profiler.save_device_memory_profile(sys.argv[1])
grow_cache(cache, 4)
jax.block_until_ready(cache)
profiler.save_device_memory_profile(sys.argv[2])
"""


def test_memdiff_reads_merged_profiles(tmp_path):
  early, late = tmp_path / "early.prof", tmp_path / "late.prof"
  run_python(MEMDIFF_PROGRAM, str(early), str(late), env=JAX_ENV, timeout=300)
  cli = os.path.join(os.path.dirname(sys.executable), "spyglass")
  if not os.path.exists(cli):
    cli = "spyglass"
  p = subprocess.run([cli, "memdiff", str(early), str(late)], capture_output=True, text=True, timeout=60)
  assert p.returncode == 0, p.stderr
  grew = [l for l in p.stdout.splitlines() if "grow_cache" in l]
  assert grew, p.stdout
  assert "+1.0 MiB" in grew[0] and "+4" in grew[0], p.stdout  # 4 arrays of 256 KiB


def test_no_jax_part_where_jax_is_not_imported():
  code = """
import sys
import spyglass.profiler as profiler
profiler.device_memory_profile()
assert "jax" not in sys.modules and "jaxlib" not in sys.modules, sorted(m for m in sys.modules if "jax" in m)
print("ok")
"""
  assert run_python(code, timeout=120).stdout.strip() == "ok"


TIMELINE_PROGRAM = r"""
import gc, json, sys, time
import jax, jax.numpy as jnp
import spyglass.profiler as profiler

def live_bytes():
    return sum(a.nbytes for a in jax.live_arrays())

profiler.start_trace(sys.argv[1])
base = live_bytes()
keep = []
for i in range(5):
    keep.append(jnp.full((256, 256), float(i)))  # 256 KiB each
    jax.block_until_ready(keep)
    time.sleep(0.05)
peak = live_bytes()
del keep
gc.collect()
time.sleep(0.05)
end = live_bytes()
profiler.stop_trace()
print(json.dumps({"base": base, "peak": peak, "end": end, "files": profiler.last_trace_files()}))
"""


def test_memory_timeline_holds_jaxs_device_bytes(tmp_path, xplane_pb2):
  from conftest import host_events  # pylint: disable=g-import-not-at-top
  p = run_python(TIMELINE_PROGRAM, str(tmp_path / "logs"), env=JAX_ENV, timeout=300)
  r = json.loads(p.stdout.strip().splitlines()[-1])
  events = [e for e in host_events(xplane_pb2, r["files"]["xplane_path"]) if e[1] == "jax memory cpu:0"]
  assert events and all(e[0].endswith(":_counters_") for e in events)
  values = [e[4]["live_bytes"] for e in sorted(events, key=lambda e: e[2])]
  assert r["peak"] - r["base"] == 5 * 256 * 1024
  assert values[-1] == r["end"]  # the last point is taken at the stop
  # Every point is a value the live set had: the base plus whole arrays, and
  # the few bytes of a fill value jax makes on the way (which points a 10 ms
  # period catches depends on the machine's load).
  assert all(r["base"] <= v - (v - r["base"]) // (256 * 1024) * (256 * 1024) <= r["base"] + 64 for v in values), values
  assert all(v <= r["peak"] + 64 for v in values), values


def test_memory_timeline_is_on_by_default(tmp_path, xplane_pb2):
  from conftest import host_events  # pylint: disable=g-import-not-at-top
  env = {k: v for k, v in JAX_ENV.items() if k != "SPYGLASS_JAX_MEMORY_INTERVAL_MS"}
  p = run_python(TIMELINE_PROGRAM, str(tmp_path / "logs"), env=env, timeout=300)
  r = json.loads(p.stdout.strip().splitlines()[-1])
  events = [e for e in host_events(xplane_pb2, r["files"]["xplane_path"]) if e[1] == "jax memory cpu:0"]
  # 5 x 50 ms of sleeps at a 10 ms period, and the last point at the stop.
  assert len(events) >= 3, len(events)
  assert max(e[4]["live_bytes"] for e in events) >= r["base"] + 4 * 256 * 1024


HEAP_PROGRAM = r"""
import json
import jax, jax.numpy as jnp
import spyglass.profiler as profiler
from pprof_decode import parse_profile

def make_weights():
    return jnp.ones((512, 512))

def make_host_blob():
    return bytearray(3 << 20)

w = make_weights()
blob = make_host_blob()
out = {}
for s in parse_profile(profiler.device_memory_profile()):
    kind = s["labels"].get("kind")
    out.setdefault(kind, []).append([s["bytes"], [f[0] for f in s["frames"]]])
print("RESULT " + json.dumps(out))
"""


def test_under_the_heap_hook_the_profile_also_holds_the_host_heap(tmp_path):
  script = tmp_path / "prog.py"
  script.write_text(HEAP_PROGRAM)
  env = dict(os.environ, **JAX_ENV)
  # Sampled (one sample per 512 KiB on average): every allocation of jax's
  # import tracked would take a minute of CPU.
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--sample-bytes", "524288", "-o", str(tmp_path / "mem"),
                      "--", str(script)],
                     capture_output=True, text=True, env=env, timeout=300)
  assert p.returncode == 0, p.stderr
  line = next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))
  kinds = json.loads(line[len("RESULT "):])
  assert {"heap", "buffer", "executable"} <= set(kinds), kinds.keys()
  assert any(b == 1 << 20 and "make_weights" in frames for b, frames in kinds["buffer"])
  assert any(b >= 1 << 20 and "make_host_blob" in frames for b, frames in kinds["heap"])  # 3 MiB, sampled


def test_no_jax_track_when_sampling_is_off(tmp_path, xplane_pb2):
  from conftest import host_events  # pylint: disable=g-import-not-at-top
  # Off from the start, and off again after a session that sampled.
  code = TIMELINE_PROGRAM.replace("profiler.start_trace(sys.argv[1])", """import os
os.environ["SPYGLASS_JAX_MEMORY_INTERVAL_MS"] = "10"
with profiler.trace(None):
    time.sleep(0.05)
os.environ["SPYGLASS_JAX_MEMORY_INTERVAL_MS"] = "0"
profiler.start_trace(sys.argv[1])""")
  p = run_python(code, str(tmp_path / "logs"), env=JAX_ENV, timeout=300)
  r = json.loads(p.stdout.strip().splitlines()[-1])
  names = {e[1] for e in host_events(xplane_pb2, r["files"]["xplane_path"])}
  assert not any(n.startswith("jax memory") for n in names), names


SAMPLER_QUIET_PROGRAM = r"""
import json, threading, time
import jax, jax.numpy as jnp
import spyglass.profiler as profiler
x = jnp.ones(10)
out = []
for i in range(6):  # back to back: the sampler's steps cross from one session into the next
    profiler.start_trace(None)
    time.sleep(0.013 if i % 2 else 0.05)
    data = profiler.stop_trace()
    lines = {}
    for line in data.find_plane_with_name("/host:CPU").lines:
        # Lines where the Python tracer recorded something ("$..." events);
        # XLA's own TraceMe events (jaxlib's live_arrays on the sampler's
        # thread) are not ours to hide.
        if any(e.name.startswith("$") for e in line.events) or line.name == "_counters_":
            lines[line.name] = lines.get(line.name, 0) + 1
    out.append({"lines": lines, "incomplete": profiler.last_trace_stats()["incomplete_events"]})
print(json.dumps(out))
"""


def test_the_sampler_thread_is_not_traced():
  p = run_python(SAMPLER_QUIET_PROGRAM, env=JAX_ENV, timeout=300)
  sessions = json.loads(p.stdout.strip().splitlines()[-1])
  for s in sessions:
    assert s["incomplete"] == 0, sessions
    assert s["lines"].get("python") == 1, sessions  # the main thread's only
  assert any(s["lines"].get("_counters_") for s in sessions), sessions
