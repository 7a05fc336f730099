"""python -m spyglass run [--trace DIR] [--server [ADDR:]PORT] [--flight-recorder SECONDS]
                         [--options key=value,...] (script.py | -m module) [args...]

Runs a Python program in this interpreter with profiling started before its
first line: the Python tracer on (every Python function call recorded, as
JAX's python_tracer_level=1), and the program's spyglass.profiler annotations
(TraceAnnotation, StepTraceAnnotation, annotate_function) recorded with them.
--trace writes the trace when the program exits (also through sys.exit or an
exception); --server lets `spyglass collect` / `jax.collect_profile` capture
it on demand; --flight-recorder keeps the last SECONDS for a dump. The flags
are the SPYGLASS_* settings of spyglass/_autostart.py, parsed by the same code.
"""
import os
import runpy
import sys

from . import _autostart

USAGE = __doc__.split("\n\n", 1)[0]


_FLAGS = {"--trace": "SPYGLASS_TRACE_DIR", "--server": "SPYGLASS_SERVER_PORT",
          "--flight-recorder": "SPYGLASS_FLIGHT_RECORDER", "--options": "SPYGLASS_OPTIONS"}

_HELP = """
  --trace DIR                write a trace from start to exit under DIR
  --server [ADDR:]PORT       start the profiler server (127.0.0.1 unless ADDR; 0: a free port)
  --flight-recorder SECONDS  keep the last SECONDS in the flight recorder's ring
  --options KEY=VALUE,...    ProfileOptions fields and advanced keys, as SPYGLASS_OPTIONS
  -m MODULE                  run a module, as `python -m MODULE`
The flags end at the script (or -m MODULE); what follows is the program's."""


class _Usage(Exception):
  pass


def _parse(argv):
  """(settings, module or None, program args): the flags stop at the program."""
  settings, i = {}, 0
  while i < len(argv):
    a = argv[i]
    name, eq, value = a.partition("=")
    if name in _FLAGS:
      if not eq:
        if i + 1 >= len(argv):
          raise _Usage(f"{name} needs a value")
        i += 1
        value = argv[i]
      settings[_FLAGS[name]] = value
    elif a == "-m":
      if i + 1 >= len(argv):
        raise _Usage("-m needs a module name")
      return settings, argv[i + 1], argv[i + 2:]
    elif a == "--":
      return settings, None, argv[i + 1:]
    elif a.startswith("-"):
      raise _Usage(f"unknown flag {a[:64]!r}")
    else:
      return settings, None, argv[i:]
    i += 1
  return settings, None, []


def run(argv):
  """`run` with its arguments; returns the exit status."""
  if argv and argv[0] in ("-h", "--help"):
    print(USAGE + "\n" + _HELP)
    return 0
  try:
    settings, module, program = _parse(argv)
    if module is None and not program:
      raise _Usage("no script given (script.py [args...] or -m module [args...])")
  except _Usage as e:
    print(f"python -m spyglass run: {e}\nusage: {USAGE}", file=sys.stderr)
    return 2
  if settings:
    if _autostart.started is not None:
      print("python -m spyglass run: the SPYGLASS_* environment already started profiling; "
            "give either the flags or the environment", file=sys.stderr)
      return 2
    try:
      _autostart.start(settings)
    except ValueError as e:
      print(f"python -m spyglass run: {e}", file=sys.stderr)
      return 2
  elif _autostart.started is None:
    print("python -m spyglass run: nothing to do: give --trace, --server or --flight-recorder "
          "(or set SPYGLASS_TRACE_DIR, ...)", file=sys.stderr)
    return 2
  # As `python script.py` / `python -m module` would: argv, sys.path[0], __main__.
  if module is not None:
    sys.argv = [module] + program
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  else:
    script = program[0]
    sys.argv = list(program)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
  return 0


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(USAGE + "\n\n  python -m spyglass run --help   for the flags\n"
          "  python -m spyglass.collect_profile PORT MS   to capture a running profiler server")
    return 0 if argv else 2
  if argv[0] != "run":
    print(f"python -m spyglass: unknown command {argv[0][:64]!r} (run)", file=sys.stderr)
    return 2
  return run(argv[1:])


if __name__ == "__main__":
  sys.exit(main())
