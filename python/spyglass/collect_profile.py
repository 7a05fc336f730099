"""Captures a profile from a running profiler server, as `python -m jax.collect_profile`.

  python -m spyglass.collect_profile [--log_dir DIR] [--no_perfetto_link] [--host HOST]
                                     PORT DURATION_IN_MS [--key=value ...]

The program to profile called ``spyglass.profiler.start_server(PORT)`` (or
``jax.profiler.start_server``: the protocol is the same). Writes
``<log_dir>/plugins/profile/<run>/<host>_<port>.xplane.pb`` (and the trace
JSON); unless --no_perfetto_link, also perfetto_trace.json.gz (as JAX; served
once on 127.0.0.1:9001 for ui.perfetto.dev) and perfetto_trace.pb (native
Perfetto, the one to open for big traces). It is the CLI's ``spyglass collect``
(the same C++ parser and flags, ``--help`` lists them): --host_tracer_level
(default 2), --device_tracer_level (1), --python_tracer_level (1),
--delay_ms, --session_id, ...; any other ``--key=value`` is sent as an
advanced option.
"""
import sys

from . import _spyglass


def main(argv=None) -> int:
  """Runs the capture; returns the exit status (2 for bad arguments)."""
  args = sys.argv[1:] if argv is None else list(argv)
  sys.stdout.flush()
  sys.stderr.flush()
  return _spyglass.collect_main([str(a) for a in args])


if __name__ == "__main__":
  sys.exit(main())
