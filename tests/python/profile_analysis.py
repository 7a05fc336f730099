"""One analysis script, written against jax.profiler's ProfileData API.

`analyse(profile_data_class, path)` reads a .xplane.pb with either
implementation (jax.profiler.ProfileData or spyglass.profiler.ProfileData) and
prints what a user's script would: every plane, its stats, lines and events
with their times and stats, and per event name the count and total time. The
tests compare its output from both implementations on the same files.
"""


def describe(data):
  out = []
  names = []
  for plane in data.planes:
    names.append(plane.name)
    out.append(f"plane {plane.name!r}")
    for name, value in plane.stats:
      out.append(f"  stat {name!r} = {value!r} ({type(value).__name__})")
    totals = {}
    for line in plane.lines:
      events = list(line.events)
      out.append(f"  line {line.name!r} events={len(events)}")
      for e in events:
        stats = ", ".join(f"{n}={v!r}" for n, v in e.stats)
        out.append(f"    {e.name!r} start={e.start_ns!r} dur={e.duration_ns!r} end={e.end_ns!r} [{stats}]")
        count, total = totals.get(e.name, (0, 0.0))
        totals[e.name] = (count + 1, total + e.duration_ns)
    for name, (count, total) in sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0])):
      out.append(f"  total {name!r} n={count} ns={total!r}")
  for name in names + ["/no such plane"]:
    found = data.find_plane_with_name(name)
    out.append(f"find {name!r}: {None if found is None else found.name!r}")
  return "\n".join(out)


def analyse(profile_data_class, path):
  return describe(profile_data_class.from_file(path))
