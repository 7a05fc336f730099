"""The cost of Spyglass's XLA profiler plugin at jax.profiler.stop_trace.

The same JAX program (a jitted function called STEPS times, each call inside a
Spyglass TraceAnnotation and a jax TraceAnnotation) is traced in a fresh
interpreter per run, three ways:

  jax            jax.profiler.start_trace/stop_trace, no plugin (the floor)
  jax+plugin     the same after `import spyglass.jax` (our planes merged into XLA's)
  jax+plugin+cpu the same with the CPU sampler on in the plugin's session
                 (SPYGLASS_OPTIONS=spyglass_cpu_sample_hz=99): the samples'
                 symbolization and stack table at the stop
  spyglass       spyglass.profiler.start_trace/stop_trace (XLA's session driven by ours)
  spyglass+cpu   the same with the CPU sampler on (spyglass_cpu_sample_hz=99):
                 the sampler's own cost at the stop, for jax+plugin+cpu

and reports stop_trace's wall time and the peak memory it adds (VmHWM after
the stop, the peak reset just before it, less VmRSS before it), the median of
RUNS runs each.

  JAX_PLATFORMS=cpu python3 bench/jax_plugin_bench.py [STEPS] [RUNS]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
import jax, jax.numpy as jnp
import spyglass.profiler as sp
mode, steps, log_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode.startswith("jax+plugin"):
    import spyglass.jax
prof = sp if mode.startswith("spyglass") else jax.profiler
options = {}
if mode == "spyglass+cpu":
    o = sp.ProfileOptions()
    o.advanced_configuration = {"spyglass_cpu_sample_hz": 99}
    options = {"profiler_options": o}

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

@jax.jit
def f(x):
    return jnp.sin(x) @ x
x = jnp.ones((32, 32))
f(x).block_until_ready()
prof.start_trace(log_dir, **options)
for i in range(steps):
    with sp.TraceAnnotation("sg_step", i=i):
        with jax.profiler.TraceAnnotation("jax_step"):
            f(x).block_until_ready()
rss = status("VmRSS")
with open("/proc/self/clear_refs", "w") as c:  # peak := now
    c.write("5")
t0 = time.perf_counter()
prof.stop_trace()
t1 = time.perf_counter()
print(json.dumps({"stop_s": t1 - t0, "peak_bytes": status("VmHWM") - rss}))
"""


def run(mode, steps):
  env = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_")}
  env["JAX_PLATFORMS"] = "cpu"
  if mode == "jax+plugin+cpu":
    env["SPYGLASS_OPTIONS"] = "spyglass_cpu_sample_hz=99"
  with tempfile.TemporaryDirectory() as d:
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(steps), d], capture_output=True, text=True,
                       env=env, timeout=600, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
  steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
  runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
  print(f"stop_trace of {steps} steps (median of {runs} runs)")
  print(f"{'mode':<14} {'stop_trace ms':>14} {'peak MiB':>9}")
  for mode in ("jax", "jax+plugin", "jax+plugin+cpu", "spyglass", "spyglass+cpu"):
    r = [run(mode, steps) for _ in range(runs)]
    print(f"{mode:<14} {statistics.median(x['stop_s'] for x in r) * 1e3:>14.1f} "
          f"{statistics.median(x['peak_bytes'] for x in r) / 2**20:>9.1f}")


if __name__ == "__main__":
  main()
