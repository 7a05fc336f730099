"""python -m spyglass run [--trace DIR] [--server [ADDR:]PORT] [--flight-recorder SECONDS]
                         [--sample [HZ]] [--sample-mode cpu|wall]
                         [--options key=value,...] (script.py | -m module) [args...]
python -m spyglass run [-o DIR] [--python-mode full|light] [--python-allocator pymalloc|malloc]
                         [--sample-bytes N] (script.py | -m module) [args...]

Without --trace, --server or --flight-recorder: memory. The program runs in a
new interpreter (this one) under the heap hook shipped in this package, as
`spyglass run -- python3 script.py` runs it, and writes memory profiles
(DIR/memory.<pid>...exit.prof, and one per SIGUSR2) whose stacks hold the
Python frames (function, file, line) interleaved with the native ones, for
Python's allocators and native extensions' mallocs alike (docs/memory.md).

Otherwise: runs a Python program in this interpreter with profiling started
before its first line: the Python tracer on (every Python function call recorded, as
JAX's python_tracer_level=1), and the program's spyglass.profiler annotations
(TraceAnnotation, StepTraceAnnotation, annotate_function) recorded with them.
--trace writes the trace when the program exits (also through sys.exit or an
exception); --server lets `spyglass collect` / `jax.collect_profile` capture
it on demand; --flight-recorder keeps the last SECONDS for a dump. The flags
are the SPYGLASS_* settings of spyglass/_autostart.py, parsed by the same code.

--sample [HZ] samples every thread's CPU time at HZ per second (99 when no
rate follows; SPYGLASS_OPTIONS' spyglass_cpu_sample_hz): the samples, with
their Python frames among the native ones, go on the trace's threads and into
cpu.<pid>.<comm>.prof beside it. Without --trace, --server or
--flight-recorder a trace is recorded into -o's folder (default .), with the
Python tracer off (python_tracer_level=0: its per-call cost would weigh on
the shares) unless --options names python_tracer_level.

Both (a memory flag with --trace, --server or --flight-recorder): the new
interpreter under the heap hook runs the program as the second form does.

The other commands (summary, diff, report, memtop, memdiff, collect) are the
spyglass CLI shipped in this package (spyglass/_bin/spyglass), which the
`spyglass` console script runs for every command, `run` included
(`spyglass run [--memory] [--trace DIR] -- any command`).
"""
import os
import runpy
import sys

from . import _autostart

USAGE = __doc__.split("\n\n", 1)[0]


_FLAGS = {"--trace": "SPYGLASS_TRACE_DIR", "--server": "SPYGLASS_SERVER_PORT",
          "--flight-recorder": "SPYGLASS_FLIGHT_RECORDER", "--options": "SPYGLASS_OPTIONS"}

# Memory mode's flags (no SPYGLASS_* setting: they shape the child's environment).
_MEMORY_FLAGS = ("-o", "--out", "--python-mode", "--python-allocator", "--sample-bytes")

# The CPU sampler's flags: advanced options of the trace (src/sampling/sampler_options.h).
DEFAULT_SAMPLE_HZ = 99
_SAMPLE_FLAGS = ("--sample", "--sample-mode")

_HELP = """
  -o, --out DIR              memory: where the profiles go (default .)
  --python-mode M            memory: full (default): every object of Python's allocators and every malloc,
                             Python frames interleaved with native ones (memray --native
                             --trace-python-allocators); light: malloc-level blocks and pymalloc's arenas
                             with Python frames only (memray's default mode), close to the program's speed
  --python-allocator A       memory: pymalloc (default) or malloc (PYTHONMALLOC=malloc: every object a
                             malloc block; slower, more memory, the heap as malloc sees it)
  --sample-bytes N           memory: one sample per N bytes on average (0, the default: every allocation)
  --trace DIR                write a trace from start to exit under DIR
  --server [ADDR:]PORT       start the profiler server (127.0.0.1 unless ADDR; 0: a free port)
  --flight-recorder SECONDS  keep the last SECONDS in the flight recorder's ring
  --options KEY=VALUE,...    ProfileOptions fields and advanced keys, as SPYGLASS_OPTIONS
  --sample [HZ]              sample every thread's CPU time at HZ per second (default 99;
                             spyglass_cpu_sample_hz); a trace goes into -o's folder unless --trace says
  --sample-mode MODE         cpu (default) or wall: also the time a thread is blocked in the kernel
                             (sleep, I/O, locks, the GIL) (spyglass_cpu_sample_mode); needs --sample
  -m MODULE                  run a module, as `python -m MODULE`
The flags end at the script (or -m MODULE); what follows is the program's."""


class _Usage(Exception):
  pass


def _parse(argv, memory, sample=None):
  """(settings, module or None, program args): the flags stop at the program.
  Memory flags go into `memory`, the sampler's into `sample`."""
  settings, i = {}, 0
  sample = {} if sample is None else sample
  while i < len(argv):
    a = argv[i]
    name, eq, value = a.partition("=")
    if name == "--sample":
      # Its rate is optional: the next word is it when it is a number.
      if not eq and i + 1 < len(argv) and argv[i + 1][:1].isdigit():
        i += 1
        value = argv[i]
      sample[name] = value if (eq or value) else ""
    elif name == "--sample-mode":
      if not eq:
        if i + 1 >= len(argv):
          raise _Usage(f"{name} needs a value")
        i += 1
        value = argv[i]
      sample[name] = value
    elif name in _FLAGS or name in _MEMORY_FLAGS:
      if not eq:
        if i + 1 >= len(argv):
          raise _Usage(f"{name} needs a value")
        i += 1
        value = argv[i]
      if name in _FLAGS:
        settings[_FLAGS[name]] = value
      else:
        memory["--out" if name == "-o" else name] = value
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


def _max_sample_rate():
  try:
    with open("/proc/sys/kernel/perf_event_max_sample_rate") as f:
      return int(f.read().strip()) or 100000
  except (OSError, ValueError):
    return 100000


def _apply_sample(sample, settings, memory):
  """--sample / --sample-mode into the settings: the sampler's advanced
  options, and a trace into -o's folder when nothing else records one."""
  if not sample:
    return
  if "--sample" not in sample:
    raise _Usage("--sample-mode needs --sample")
  rate, limit = sample["--sample"], _max_sample_rate()
  if rate == "":
    hz = DEFAULT_SAMPLE_HZ
  elif not rate.isdigit() or not 1 <= int(rate) <= limit:
    raise _Usage(f"--sample takes a rate from 1 to {limit} per second (the kernel's "
                 f"perf_event_max_sample_rate), got {rate[:32]!r}")
  else:
    hz = int(rate)
  mode = sample.get("--sample-mode")
  if mode is not None and mode not in ("cpu", "wall"):
    raise _Usage(f"--sample-mode must be cpu or wall, not {mode[:64]!r}")
  user = settings.get("SPYGLASS_OPTIONS", "")
  extra = [f"spyglass_cpu_sample_hz={hz}"] + ([f"spyglass_cpu_sample_mode={mode}"] if mode else [])
  if not any(settings.get(k) for k in ("SPYGLASS_TRACE_DIR", "SPYGLASS_SERVER_PORT", "SPYGLASS_FLIGHT_RECORDER")):
    # Samples live in a trace. -o alone names its folder here (no memory profiles then).
    settings["SPYGLASS_TRACE_DIR"] = memory.get("--out", ".")
    if set(memory) == {"--out"}:
      memory.clear()
    if "python_tracer_level" not in user:
      extra.append("python_tracer_level=0")
  settings["SPYGLASS_OPTIONS"] = ",".join([user] + extra if user else extra)


def run(argv):
  """`run` with its arguments; returns the exit status."""
  if argv and argv[0] in ("-h", "--help"):
    print(USAGE + "\n" + _HELP)
    return 0
  memory, sample = {}, {}
  try:
    settings, module, program = _parse(argv, memory, sample)
    if module is None and not program:
      raise _Usage("no script given (script.py [args...] or -m module [args...])")
    if memory.get("--python-mode", "full") not in ("full", "light"):
      raise _Usage(f"--python-mode must be full or light, not {memory['--python-mode'][:64]!r}")
    _apply_sample(sample, settings, memory)
    if memory.get("--python-allocator", "pymalloc") not in ("pymalloc", "malloc"):
      raise _Usage(f"--python-allocator must be pymalloc or malloc, not {memory['--python-allocator'][:64]!r}")
    sample = memory.get("--sample-bytes", "0")
    if not sample.isdigit() or int(sample) > (1 << 30):
      raise _Usage(f"--sample-bytes must be an integer from 0 to {1 << 30}, not {sample[:64]!r}")
  except _Usage as e:
    print(f"python -m spyglass run: {e}\nusage: {USAGE}", file=sys.stderr)
    return 2
  if settings and _autostart.started is not None:
    print("python -m spyglass run: the SPYGLASS_* environment already started profiling; "
          "give either the flags or the environment", file=sys.stderr)
    return 2
  if memory and settings:
    from . import _spyglass  # pylint: disable=g-import-not-at-top
    try:  # bad values end here, not in the child after its interpreter started under the hook
      _spyglass._check_settings(settings)
    except ValueError as e:
      print(f"python -m spyglass run: {e}", file=sys.stderr)
      return 2
  if (memory and settings) or (not settings and _autostart.started is None):
    return _run_memory(memory.get("--out", "."), memory.get("--python-allocator", "pymalloc"),
                       int(memory.get("--sample-bytes", "0")), module, program, settings,
                       memory.get("--python-mode", "full"))
  if settings:
    try:
      _autostart.start(settings)
    except ValueError as e:
      print(f"python -m spyglass run: {e}", file=sys.stderr)
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


def memory_env(out_dir, python_allocator="pymalloc", sample_bytes=0, env=None, python_mode="full"):
  """The environment that runs a Python program under the heap hook shipped
  in this package (what `spyglass run` sets up): LD_PRELOAD, the profile
  directory, and the startup module that turns on Python frames."""
  env = dict(os.environ if env is None else env)
  pkg = os.path.dirname(os.path.abspath(__file__))
  hook = os.path.join(pkg, "libspyglass_heap.so")
  startup = os.path.join(pkg, "spyglass_python_startup")
  if not os.path.exists(hook) or not os.path.exists(os.path.join(startup, "sitecustomize.py")):
    raise FileNotFoundError(f"this package has no heap hook ({hook}); reinstall it")
  env["LD_PRELOAD"] = hook + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
  env["SPYGLASS_HEAP"] = "1"
  env["SPYGLASS_HEAP_PROFILE_DIR"] = os.path.abspath(out_dir)
  env["PYTHONPATH"] = startup + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  if sample_bytes:
    env["SPYGLASS_HEAP_SAMPLE_BYTES"] = str(sample_bytes)
  if python_allocator == "malloc":
    env["PYTHONMALLOC"] = "malloc"
  if python_mode == "light":
    env["SPYGLASS_PYTHON_MODE"] = "light"
  else:
    env.pop("SPYGLASS_PYTHON_MODE", None)
  return env


def _run_memory(out_dir, python_allocator, sample_bytes, module, program, settings=None, python_mode="full"):
  """Memory mode: the program in a child interpreter under the heap hook; the
  child's status, and a summary of the profiles it wrote. With `settings`
  (--trace & co. given with memory flags) the child is `python -m spyglass run`
  with those flags: the trace starts in the child's interpreter, with the
  Python tracer, as without memory. (Not through the SPYGLASS_* environment:
  the hook would load libspyglass, a second core in a process that imports
  this package's.)"""
  try:
    os.makedirs(out_dir, exist_ok=True)
    env = memory_env(out_dir, python_allocator, sample_bytes, python_mode=python_mode)
  except OSError as e:
    print(f"python -m spyglass run: {e}", file=sys.stderr)
    return 2
  from . import _spyglass
  out_dir = os.path.abspath(out_dir)
  before = _spyglass._memory_dir_listing(out_dir)  # files from earlier runs are not this one's
  target = (["-m", module] if module else []) + list(program)
  if settings:
    flags = {env_name: flag for flag, env_name in _FLAGS.items()}
    given = [f"{flags[k]}={os.path.abspath(v) if k == 'SPYGLASS_TRACE_DIR' and v else v}" for k, v in settings.items()]
    target = ["-m", "spyglass", "run"] + given + (["-m", module] if module else ["--"]) + list(program)
  pid, code = _run_as_job([sys.executable] + target, env)
  # The dumps of dying processes become profiles; one line per process, the program first.
  print(_spyglass._memory_run_summary(out_dir, pid, code < 0, -code if code < 0 else code, before),
        file=sys.stderr, end="")
  return code if code >= 0 else _die_like(-code)


_SI_KERNEL = 0x80  # siginfo's si_code of a signal the kernel sent (the terminal's)


def _run_as_job(argv, env):
  """Runs the program as `spyglass run` does (tools/spyglass/run_command.cc,
  Forward and Job): the signals sent to this process (SIGINT, SIGTERM,
  SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2: a snapshot now, the real-time ones) are
  passed on once, and the program never shares a process group with this
  process, so a signal sent to a whole group (Ctrl-C, `kill -TERM -PGID`,
  `timeout`) reaches it once. Leading its group (a shell's job, setsid), this
  process gives the program a group of its own, and the terminal when the
  job is in the foreground (its stops stop the job; `fg` continues both);
  inside another's group it steps out and leaves the program there.
  Returns (pid, returncode as Popen's: -N for a death by signal N)."""
  import ctypes
  import signal
  import subprocess
  forwarded = [s for s in [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                           signal.SIGUSR2] + list(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
               # One this process was started ignoring (nohup) the program ignores too.
               if signal.getsignal(s) != signal.SIG_IGN]
  self_pid, group = os.getpid(), os.getpgrp()
  own_group, tty, stepped_out = group == self_pid, -1, False
  if own_group:
    try:
      tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
      pass
  else:
    try:
      os.setpgid(0, 0)
      stepped_out = True
    except OSError:
      pass
  foreground = tty >= 0 and os.tcgetpgrp(tty) == group
  prctl = ctypes.CDLL(None, use_errno=True).prctl
  # Blocked and taken by sigwaitinfo (with their siginfo); SIGTTOU blocked lets
  # this process hand the terminal over and back from the background.
  waited = set(forwarded) | {signal.SIGCHLD} | ({signal.SIGCONT} if tty >= 0 else set())
  old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited | {signal.SIGTTOU})
  old_chld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)

  def place(pid):  # both sides, a shell's way: whichever runs first
    try:
      if own_group:
        os.setpgid(pid, pid)
        if foreground:
          os.tcsetpgrp(tty, pid)
      elif stepped_out:
        os.setpgid(pid, group)
    except OSError:
      pass

  def in_child():
    place(os.getpid())
    if own_group:  # a SIGKILL of the job cannot be passed on: the parent's death brings it
      prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
      if os.getppid() != self_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

  def stop_like(sig):  # the job stops as the program did; returns once continued
    was = signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    signal.signal(sig, was)

  def resume(pid):
    if os.tcgetpgrp(tty) == group:
      os.tcsetpgrp(tty, pid)
    os.kill(-pid, signal.SIGCONT)

  child = None
  try:
    child = subprocess.Popen(argv, env=env, preexec_fn=in_child)
    place(child.pid)
    while True:
      # With a terminal, looked at every 0.1 s: `fg` of a running job sends no signal.
      info = signal.sigtimedwait(waited, 0.1) if tty >= 0 else signal.sigwaitinfo(waited)
      if info is not None and info.si_signo in forwarded:
        # A terminal's signal went to its foreground group: the program's,
        # unless this job just came to the foreground. One the program sent goes back to nobody.
        ours = info.si_code != _SI_KERNEL or (tty >= 0 and os.tcgetpgrp(tty) == group)
        if ours and not (info.si_code <= 0 and info.si_pid == child.pid):
          os.kill(child.pid, info.si_signo)
      pid, status = os.waitpid(child.pid, os.WNOHANG | (os.WUNTRACED if tty >= 0 else 0))
      if pid and os.WIFSTOPPED(status):
        sig = os.WSTOPSIG(status)
        if os.tcgetpgrp(tty) != group or sig not in (signal.SIGTTIN, signal.SIGTTOU):
          if os.tcgetpgrp(tty) == child.pid:
            os.tcsetpgrp(tty, group)
          stop_like(sig)
        resume(child.pid)
      elif pid:
        child.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return child.pid, child.returncode
      elif info is not None and info.si_signo == signal.SIGCONT:
        resume(child.pid)
      elif tty >= 0 and os.tcgetpgrp(tty) == group:
        os.tcsetpgrp(tty, child.pid)
  finally:
    if tty >= 0:
      try:
        if child is not None and os.tcgetpgrp(tty) == child.pid:
          os.tcsetpgrp(tty, group)
      except OSError:
        pass
      os.close(tty)
    if stepped_out:
      try:
        os.setpgid(0, group)
      except OSError:
        pass
    signal.signal(signal.SIGCHLD, old_chld)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _die_like(sig):
  """Ends this process by the program's signal, so that its parent sees the
  same death (a shell 130 for SIGINT, Python -2), without a core file of its
  own. Returns the shell's 128+N if that did not end it."""
  import resource
  import signal
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  try:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  except (OSError, ValueError):
    pass
  signal.signal(sig, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
  os.kill(os.getpid(), sig)
  return 128 + sig


# The C++ CLI's commands, run by the binary this package carries.
CLI_COMMANDS = ("summary", "diff", "report", "memtop", "memdiff", "collect", "run")


def cli_path():
  """The spyglass CLI inside this package (None if this install has none)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "spyglass")
  return path if os.access(path, os.X_OK) else None


def _exec_cli(argv, caller):
  """Replaces this process by the CLI with `argv` (its status, signals and
  streams are the command's own). Returns 2 if there is no CLI."""
  path = cli_path()
  if path is None:
    print(f"{caller}: this spyglass package has no CLI (spyglass/_bin/spyglass); reinstall it", file=sys.stderr)
    return 2
  pkg = os.path.dirname(os.path.abspath(__file__))
  # `spyglass run` looks for the heap hook beside itself or in ../lib; here it
  # lies in the package directory, with its Python startup module.
  if not os.environ.get("SPYGLASS_HEAP_LIB"):
    os.environ["SPYGLASS_HEAP_LIB"] = os.path.join(pkg, "libspyglass_heap.so")
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except (OSError, ValueError):
    pass
  os.execv(path, ["spyglass"] + list(argv))
  return 2  # not reached


def cli(argv=None):
  """The `spyglass` console script: the CLI, every command (`run` as the C++
  tool's: any program after --)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  return _exec_cli(argv, "spyglass")


def main(argv=None):
  """python -m spyglass: `run` (a Python program, this module's), and the CLI's other commands."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(USAGE + "\n\n  python -m spyglass run --help   for the flags\n"
          "  python -m spyglass.collect_profile PORT MS   to capture a running profiler server\n\n"
          "Commands: run (above), and the spyglass CLI's " + ", ".join(c for c in CLI_COMMANDS if c != "run") +
          "\n  python -m spyglass COMMAND --help   (or the `spyglass` command this package installs)")
    return 0 if argv else 2
  if argv[0] == "run":
    return run(argv[1:])
  return _exec_cli(argv, "python -m spyglass")  # which answers an unknown command itself


if __name__ == "__main__":
  sys.exit(main())
