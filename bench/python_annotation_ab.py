#!/usr/bin/env python3
"""`with TraceAnnotation("x"): pass`: a previous build, this one and jax.profiler, interleaved.

  python bench/python_annotation_ab.py --before DIR [--rounds N]

DIR holds a copy of an earlier installed `spyglass` package (DIR/spyglass/...,
put first on PYTHONPATH); "after" is the `spyglass` this Python imports. Each
round runs python_bench.py's annotation child for before, after and jax, one
after the other, each in a fresh interpreter; the figures are medians over the
rounds, and the ratios to jax are taken within each round (then their median
and range), so that a loaded machine's swings hit all three alike.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_bench as pb  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--before", required=True, help="directory holding an earlier spyglass package")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--loop", type=int, default=500_000)
  ap.add_argument("--repeat", type=int, default=7)
  args = ap.parse_args()
  runs = [("before", "spyglass", {"PYTHONPATH": os.path.abspath(args.before)}), ("after", "spyglass", {}),
          ("jax", "jax", {})]
  res = {name: [] for name, _, _ in runs}
  for r in range(args.rounds):
    for name, impl, env in runs:
      res[name].append(pb.child(pb.CHILD_ANNOTATION, impl, args.loop, args.repeat, **env))
    print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['idle_ns']:.1f} / {v[-1]['tracing_ns']:.1f}"
                                         for k, v in res.items()), flush=True)
  print(f"\n{args.rounds} rounds; loop of {args.loop:,}, best of {args.repeat}; medians (range of the ratios)\n")
  print("| ns per iteration | before | after | jax.profiler | before / jax | after / jax |")
  print("|---|---|---|---|---|---|")
  for key, label in [("idle_ns", "no trace running"), ("tracing_ns", "trace running"),
                     ("idle_ns_cpu", "no trace running, CPU time"), ("tracing_ns_cpu", "trace running, CPU time")]:
    med = {k: statistics.median(x[key] for x in v) for k, v in res.items()}
    cells = []
    for which in ("before", "after"):
      ratios = [a[key] / j[key] for a, j in zip(res[which], res["jax"])]
      cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"| {label} | {med['before']:.1f} | {med['after']:.1f} | {med['jax']:.1f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
  main()
