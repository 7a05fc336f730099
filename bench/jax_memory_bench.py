"""Device memory inside a JAX program: what Spyglass adds to jax's.

    JAX_PLATFORMS=cpu python bench/jax_memory_bench.py [--arrays 1000] [--rounds 5]

- device_memory_profile with N live arrays: jax.profiler's against
  spyglass.profiler's (jax's heap profile merged with our snapshot);
- one sample of JAX's device bytes for the memory timeline (what the
  sampling thread does every 10 ms);
- a traced loop of jitted calls with the JAX memory sampler on (10 ms) and
  off (SPYGLASS_JAX_MEMORY_INTERVAL_MS=0), interleaved rounds, medians.
"""
import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import jax.profiler as jax_profiler

import spyglass.profiler as profiler


def median_ms(fn, n):
  times = []
  for _ in range(n):
    began = time.perf_counter()
    fn()
    times.append(time.perf_counter() - began)
  return statistics.median(times) * 1e3


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--arrays", type=int, default=1000)
  parser.add_argument("--calls", type=int, default=2000)
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  arrays = [jnp.full((64,), float(i)) for i in range(args.arrays)]
  f = jax.jit(lambda x: (x * 2).sum())
  f(arrays[0]).block_until_ready()
  print(f"jax {jax.__version__}, {args.arrays} live arrays, {jax.devices()[0].platform}")
  jax_ms = median_ms(jax_profiler.device_memory_profile, 20)
  ours_ms = median_ms(profiler.device_memory_profile, 20)
  print(f"device_memory_profile: jax {jax_ms:.2f} ms, spyglass {ours_ms:.2f} ms (median of 20)")
  print(f"one JAX memory sample: {median_ms(profiler._jax_device_bytes, 100):.3f} ms (median of 100)")

  def work():
    for i in range(args.calls):
      f(arrays[i % len(arrays)]).block_until_ready()

  options = profiler.ProfileOptions()
  options.python_tracer_level = 0
  results = {"0": [], "10": []}
  for _ in range(args.rounds):
    for interval in ("0", "10"):
      os.environ["SPYGLASS_JAX_MEMORY_INTERVAL_MS"] = interval
      profiler.start_trace(None, profiler_options=options)
      began = time.perf_counter()
      work()
      results[interval].append(time.perf_counter() - began)
      profiler.stop_trace()
  off, on = (statistics.median(results[k]) * 1e3 for k in ("0", "10"))
  print(f"{args.calls} jitted calls in a trace: sampler off {off:.1f} ms, every 10 ms {on:.1f} ms "
        f"({(on / off - 1) * 100:+.1f}%, medians of {args.rounds} interleaved rounds)")


if __name__ == "__main__":
  main()
