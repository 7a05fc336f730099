"""Captures a profile from a running profiler server, as `python -m jax.collect_profile`.

  python -m spyglass.collect_profile [--log_dir DIR] [--no_perfetto_link] [--host HOST]
                                     PORT DURATION_IN_MS [--key=value ...]

The program to profile called ``spyglass.profiler.start_server(PORT)`` (or
``jax.profiler.start_server``: the protocol is the same). Writes
``<log_dir>/plugins/profile/<run>/<host>_<port>.xplane.pb`` (and the trace
JSON); unless --no_perfetto_link, also perfetto_trace.json.gz served once on
127.0.0.1:9001 for ui.perfetto.dev. Extra ``--key=value`` flags set capture
options: host_tracer_level (default 2), device_tracer_level (1),
python_tracer_level (1), delay_ms, session_id.
"""
import argparse
import os
import sys
import tempfile

from . import _spyglass


def _parse_value(v):
  low = v.lower()
  if low in ("true", "t", "yes", "y"):
    return True
  if low in ("false", "f", "no", "n"):
    return False
  try:
    return int(v, 0)
  except ValueError:
    return v


def _parse_flags(extra):
  out = {}
  i = 0
  while i < len(extra):
    arg = extra[i]
    if not arg.startswith("--"):
      raise ValueError(f"Unknown positional argument encountered: {arg}")
    key = arg[2:]
    if "=" in key:
      key, value = key.split("=", 1)
      out[key] = _parse_value(value)
    elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
      out[key] = _parse_value(extra[i + 1])
      i += 1
    else:
      out[key] = True
    i += 1
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(
      prog="python -m spyglass.collect_profile",
      description="Collect a profile from a running profiler server "
                  "(default options: --host_tracer_level=2 --device_tracer_level=1 --python_tracer_level=1).")
  ap.add_argument("--log_dir", default=None, help="where to write the profile (default: a new temp dir)")
  ap.add_argument("--no_perfetto_link", action="store_true", help="do not serve a Perfetto link")
  ap.add_argument("--host", default="127.0.0.1", help="the server's host (default 127.0.0.1)")
  ap.add_argument("port", type=int, help="the profiler server's port")
  ap.add_argument("duration_in_ms", type=int, help="capture duration in ms (> 0)")
  args, extra = ap.parse_known_args(argv)
  opts = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 1}
  opts.update(_parse_flags(extra))
  if args.duration_in_ms <= 0:
    ap.error("duration_in_ms must be > 0")
  if not hasattr(_spyglass, "capture"):
    raise NotImplementedError("spyglass.collect_profile is not available: this build of the C++ core has no "
                              "capture client (src/server/client.h)")
  log_dir = args.log_dir or tempfile.mkdtemp()
  hosts = [h[len("grpc://"):] if h.startswith("grpc://") else h for h in args.host.split(",")]
  addresses = [f"{h}:{args.port}" for h in hosts]
  result = _spyglass.capture(
      addresses, args.duration_in_ms, os.path.abspath(log_dir),
      host_tracer_level=int(opts.get("host_tracer_level", 2)),
      device_tracer_level=int(opts.get("device_tracer_level", 1)),
      python_tracer_level=int(opts.get("python_tracer_level", 1)),
      delay_ms=int(opts.get("delay_ms", 0)), session_id=str(opts.get("session_id", "")),
      create_perfetto_trace=not args.no_perfetto_link)
  for w in result["warnings"]:
    print(f"warning: {w}", file=sys.stderr)
  print(f"Dumped profiling information in: {log_dir}")
  if not args.no_perfetto_link and result["perfetto_trace_path"]:
    _spyglass.serve_perfetto_trace(result["perfetto_trace_path"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
