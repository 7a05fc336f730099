#!/usr/bin/env python3
"""The JAX leg of scripts/gpu_check.sh: Spyglass and XLA in one trace on a GPU.

Runs on the GPU machine with the device's own jax (jax-cuda plugin) and the
spyglass wheel the stage carries. Three traces of one jitted program, each
step inside a Spyglass TraceAnnotation:

  drive   spyglass.profiler.start_trace in a JAX process: our session drives
          XLA's; XLA's device tracer traces the device, ours is off.
  env     a session from SPYGLASS_TRACE_DIR, created after jax was imported
          (options not the Python package's): our GPU tracer steps aside
          (the trace's warning says so), XLA's traces the device.
  plugin  jax.profiler.trace with `import spyglass.jax`: XLA's trace holds
          our annotations; our plugin session has no GPU tracer.

Each must hold exactly one /device:GPU:0 plane with XLA's kernels (their
hlo_op stats: only XLA's tracer knows them), each kernel once, and every
step's kernels inside (on the shared clock, a launch's slack allowed) the
step's annotation on /host:CPU.

    python3 tests/gpu/gpu_jax_check.py OUT_DIR [drive env plugin]

Exit 0: all checks passed; 1: a check failed; 77: no GPU backend in jax.
"""
import glob
import os
import subprocess
import sys
import textwrap

STEPS = 5
PROGRAM = textwrap.dedent("""\
    import os, sys
    mode, out = sys.argv[1], sys.argv[2]
    import jax, jax.numpy as jnp
    if mode == "plugin":
        import spyglass.jax  # the one line
    if mode == "env":  # a session from the environment, created at `import spyglass` with jaxlib loaded
        os.environ["SPYGLASS_TRACE_DIR"] = out
    import spyglass.profiler as sp
    assert jax.devices()[0].platform == "gpu", jax.devices()

    @jax.jit
    def step(x):
        return jnp.tanh(x @ x.T).sum(axis=0)

    x = jnp.ones((2048, 2048), jnp.float32)
    step(x).block_until_ready()  # compiled outside the trace

    def work():
        for i in range({steps}):
            with sp.TraceAnnotation("sg_step", i=i):
                step(x + i).block_until_ready()

    if mode == "drive":
        sp.start_trace(out)
        work()
        sp.stop_trace()
    elif mode == "plugin":
        with jax.profiler.trace(out):
            work()
    else:  # env: the session from SPYGLASS_TRACE_DIR runs since `import spyglass`
        work()
    print("OK", mode, flush=True)
    """).format(steps=STEPS)


def xspace_warnings(path):
  """XSpace.warnings (field 3) from the raw bytes: no protobuf runtime needed."""
  data = open(path, "rb").read()
  out, i = [], 0

  def varint(i):
    v = shift = 0
    while True:
      b = data[i]
      i += 1
      v |= (b & 0x7F) << shift
      shift += 7
      if b < 0x80:
        return v, i

  while i < len(data):
    key, i = varint(i)
    field, wire = key >> 3, key & 7
    if wire == 0:
      _, i = varint(i)
    elif wire == 1:
      i += 8
    elif wire == 5:
      i += 4
    elif wire == 2:
      n, i = varint(i)
      if field == 3:
        out.append(data[i:i + n].decode("utf-8", "replace"))
      i += n
    else:
      raise ValueError(f"wire type {wire} at {i}")
  return out


def check_trace(mode, path, ProfileData):
  failures = []
  data = ProfileData.from_file(path)
  planes = [p for p in data.planes]
  gpu = [p for p in planes if p.name == "/device:GPU:0"]
  if len(gpu) != 1:
    return [f"{mode}: {len(gpu)} /device:GPU:0 planes (want 1): {[p.name for p in planes]}"]
  lines = {l.name: list(l.events) for l in gpu[0].lines}
  derived = ("XLA Ops", "XLA Modules", "Steps", "Framework Ops", "Framework Name Scope", "Source code",
             "Launch Stats")
  kernels = [(e.start_ns, e.start_ns + e.duration_ns, e.name) for name, evs in lines.items()
             if name not in derived and "Memcpy" not in name and "Memset" not in name for e in evs]
  if not kernels:
    failures.append(f"{mode}: no kernels on /device:GPU:0's stream lines: {sorted(lines)}")
  # XLA's device tracer wrote the plane: its kernels name their HLO op
  # (an hlo_op / hlo_module stat), or its derived "XLA Ops" line is there.
  xla_stats = any(name in ("hlo_op", "hlo_module") for evs in lines.values() for e in evs
                  for name, _ in e.stats)
  if not xla_stats and "XLA Ops" not in lines:
    failures.append(f"{mode}: the device plane is not XLA's (no hlo_op stat, no 'XLA Ops' line): {sorted(lines)}")
  # Each kernel once: no two events of one name at the same start (two
  # subscribers would record each launch twice, on two planes or one).
  seen = set()
  for k in kernels:
    if (k[0], k[2]) in seen:
      failures.append(f"{mode}: kernel {k[2]} at {k[0]} twice")
      break
    seen.add((k[0], k[2]))
  host = [p for p in planes if p.name == "/host:CPU"]
  steps = sorted((e.start_ns, e.start_ns + e.duration_ns) for p in host for l in p.lines for e in l.events
                 if e.name == "sg_step")
  if len(steps) != STEPS:
    failures.append(f"{mode}: {len(steps)} sg_step annotations on /host:CPU (want {STEPS})")
  slack_ns = 2_000_000  # a kernel may start after its launch returned; block_until_ready ends it inside
  for b, e in steps:
    inside = [k for k in kernels if b - slack_ns <= k[0] and k[1] <= e + slack_ns]
    if not inside:
      failures.append(f"{mode}: no kernel inside sg_step [{b}, {e}] (kernels span "
                      f"{min(k[0] for k in kernels) if kernels else '-'}..)")
      break
  warnings = xspace_warnings(path)
  if mode == "env" and not any("GPU tracer off: XLA's device tracer (jax)" in w for w in warnings):
    failures.append(f"{mode}: no step-aside warning in the trace: {warnings}")
  bad = [w for w in warnings if "cupti" in w.lower() and "one subscriber" not in w]
  if bad:
    failures.append(f"{mode}: CUPTI trouble in the trace's warnings: {bad}")
  print(f"{mode}: {len(kernels)} kernels on /device:GPU:0, {len(lines.get('XLA Ops', []))} XLA ops, "
        f"{len(steps)} steps, warnings {warnings}")
  return failures


def main(argv):
  out_dir = argv[1]
  modes = argv[2:] or ["drive", "env", "plugin"]
  probe = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                         capture_output=True, text=True, timeout=300)
  if probe.returncode != 0 or probe.stdout.strip() != "gpu":
    print(f"jax has no GPU backend here: {probe.stdout.strip()} {probe.stderr[-500:]}")
    return 77
  from spyglass.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  script = os.path.join(out_dir, "jax_gpu_program.py")
  os.makedirs(out_dir, exist_ok=True)
  with open(script, "w", encoding="utf-8") as f:
    f.write(PROGRAM)
  failures = []
  for mode in modes:
    logs = os.path.join(out_dir, mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_") and k != "JAX_PLATFORMS"}
    p = subprocess.run([sys.executable, script, mode, logs], capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
      failures.append(f"{mode}: exit {p.returncode}: {p.stderr[-3000:]}")
      continue
    files = glob.glob(os.path.join(logs, "**", "*.xplane.pb"), recursive=True)
    if len(files) != 1:
      failures.append(f"{mode}: {len(files)} .xplane.pb under {logs}: {p.stderr[-2000:]}")
      continue
    failures += check_trace(mode, files[0], ProfileData)
  for f in failures:
    print("FAIL", f)
  print("GPU JAX CHECK", "FAILED" if failures else "PASSED")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
