"""How far Spyglass's events sit from XLA's on the merged time base.

On one thread, N times: a Spyglass TraceAnnotation around a jax
TraceAnnotation around nothing, then the other way round. In the merged trace
each inner event must start after its outer one and end before it; the gaps
(inner start - outer start, outer end - inner end) are each about the cost of
one annotation call. With the two clocks aligned, both kinds of nesting show
the same gaps; an offset d between the clocks adds d to one gap and takes it
from the other, so d is about half their difference (the medians printed).

  JAX_PLATFORMS=cpu python3 bench/jax_alignment_bench.py plugin|spyglass [N]

plugin: jax.profiler's trace with `import spyglass.jax`; spyglass:
spyglass.profiler's trace of the same program (XLA's planes merged into ours).
"""
import glob
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys
import jax
import spyglass.profiler as sp
mode, n, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "plugin":
    import spyglass.jax
    prof = jax.profiler
else:
    prof = sp
prof.start_trace(log)
for i in range(n):
    with sp.TraceAnnotation("sg_outer"):
        with jax.profiler.TraceAnnotation("jax_inner"):
            pass
    with jax.profiler.TraceAnnotation("jax_outer"):
        with sp.TraceAnnotation("sg_inner"):
            pass
prof.stop_trace()
"""


def events(path):
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    data = ProfileData.from_serialized_xspace(f.read())
  out = {}
  for line in data.find_plane_with_name("/host:CPU").lines:
    for e in line.events:
      out.setdefault(e.name, []).append((e.start_ns, e.start_ns + e.duration_ns))
  return {k: sorted(v) for k, v in out.items()}


def main():
  mode = sys.argv[1]
  n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
  with tempfile.TemporaryDirectory() as d:
    subprocess.run([sys.executable, "-c", CHILD, mode, str(n), d], check=True,
                   env=dict(os.environ, JAX_PLATFORMS="cpu"))
    ev = events(glob.glob(os.path.join(d, "plugins", "profile", "*", "*.xplane.pb"))[0])
  gaps = {}
  for outer, inner in (("sg_outer", "jax_inner"), ("jax_outer", "sg_inner")):
    s = statistics.median(i[0] - o[0] for o, i in zip(ev[outer], ev[inner]))
    e = statistics.median(o[1] - i[1] for o, i in zip(ev[outer], ev[inner]))
    gaps[outer] = (s, e)
    print(f"{outer} > {inner}: start gap {s:.0f} ns, end gap {e:.0f} ns (medians of {n})")
  # Spyglass's clock ahead of XLA's by d: sg_outer's start gap shrinks by d and its end gap
  # grows by d; for jax_outer the other way round.
  d = ((gaps["jax_outer"][0] - gaps["jax_outer"][1]) - (gaps["sg_outer"][0] - gaps["sg_outer"][1])) / 4
  print(f"{mode}: Spyglass's events sit {d:+.0f} ns from XLA's (negative: earlier)")


if __name__ == "__main__":
  main()
