"""An allocation-heavy Python workload for the Python memory benchmark
(bench/python_heap_bench.py): builds lists of small dicts (each with a str
and a list), keeping the last round alive. `python_heap_workload.py [rounds]`."""
import sys


def record(i):
  return {"id": i, "name": str(i), "tags": [i, i + 1, i + 2]}


def build(n):
  out = []
  for i in range(n):
    out.append(record(i))
  return out


def main(rounds, n):
  keep = None
  for _ in range(rounds):
    keep = build(n)
  return len(keep)


if __name__ == "__main__":
  main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, 100_000)
