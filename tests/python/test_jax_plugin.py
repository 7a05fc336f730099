"""Spyglass and XLA's profiler in one trace, both ways, with real jax on CPU.

- ``import spyglass.jax`` (or SPYGLASS_JAX_PLUGIN=1): jax.profiler's trace holds
  Spyglass's annotations, on XLA's /host:CPU threads (the plugin of
  python/src/xla_plugin.cc, through XLA's PLUGIN_Profiler_Api).
- spyglass.profiler's trace of a JAX program (start_trace, `spyglass run
  --trace`, a remote capture by `spyglass collect`) holds XLA's events.
Each program runs in a fresh interpreter: XLA's plugin registry is per process.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, read_xspace

pytest.importorskip("jax")

# The same JAX program for both profilers; PROFILER is jax.profiler or spyglass.profiler.
PROGRAM = textwrap.dedent("""\
    import sys
    import jax, jax.numpy as jnp
    import spyglass.profiler as sp
    {setup}
    @jax.jit
    def f(x):
        return jnp.sin(x) @ x
    x = jnp.ones((512, 512))  # long enough that block_until_ready always waits (CommonPjRtBuffer::Await)
    f(x).block_until_ready()
    PROFILER.start_trace(sys.argv[1])
    for i in range(4):
        with PROFILER.StepTraceAnnotation("train", step_num=i):
            with sp.TraceAnnotation("sg_outer", i=i):
                with jax.profiler.TraceAnnotation("jax_inner"):
                    f(x).block_until_ready()
    jax.jit(lambda a: a * 2 + 1)(x).block_until_ready()
    PROFILER.stop_trace()
    print("OK")
    """)

XLA_EVENTS = ("PjitFunction(f)", "ThunkExecutor::Execute (wait for completion)", "jax_inner")
OUR_EVENTS = ("sg_outer",)


def env(**kv):
  e = {k: v for k, v in os.environ.items() if not k.startswith("SPYGLASS_")}
  e["JAX_PLATFORMS"] = "cpu"
  e.update(kv)
  return e


def run_program(tmp_path, setup, name="run", extra_env=None):
  # The same file name in every run: Python frames are named by it.
  (tmp_path / name).mkdir()
  script = tmp_path / name / "prog.py"
  script.write_text(PROGRAM.format(setup=setup))
  log_dir = str(tmp_path / name / "logs")
  cmd = [sys.executable, str(script), log_dir]
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env(**(extra_env or {})))
  assert p.returncode == 0, p.stdout + p.stderr
  files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(files) == 1, (files, p.stderr)
  return files[0]


def planes_and_lines(xplane_pb2, path):
  """{plane name: {line id: [event names]}}, and the plane names in order."""
  space = read_xspace(xplane_pb2, path)
  out, order = {}, []
  for p in space.planes:
    order.append(p.name)
    lines = out.setdefault(p.name, {})
    for line in p.lines:
      lines.setdefault(line.id, []).extend(p.event_metadata[e.metadata_id].name for e in line.events)
  return out, order


def all_names(xplane_pb2, path):
  planes, _ = planes_and_lines(xplane_pb2, path)
  return {n for lines in planes.values() for names in lines.values() for n in names}


def line_of(host, name):
  ids = [i for i, names in host.items() if name in names]
  assert len(ids) == 1, (name, ids)
  return ids[0]


def check_one_trace(xplane_pb2, path):
  planes, order = planes_and_lines(xplane_pb2, path)
  assert order.count("/host:CPU") == 1, order
  assert "/host:python-tracer" not in order, order  # merged into /host:CPU
  assert order.count("Task Environment") == 1 and order.count("/host:metadata") == 1, order
  host = planes["/host:CPU"]
  names = [n for evs in host.values() for n in evs]
  for name in XLA_EVENTS + OUR_EVENTS:
    assert name in names, (name, sorted(set(names))[:50])
  # Ours on XLA's thread: the annotations of one thread are on one line.
  assert line_of(host, "sg_outer") == line_of(host, "jax_inner")
  # Nothing twice: each annotation once per step, one Python tracer's frames.
  assert names.count("sg_outer") == 4 and names.count("jax_inner") == 4, (names.count("sg_outer"),
                                                                          names.count("jax_inner"))
  assert names.count("train") == 4
  return names


def test_plugin_puts_spyglass_annotations_in_jax_profiler_trace(tmp_path, xplane_pb2):
  path = run_program(tmp_path, "import spyglass.jax; PROFILER = jax.profiler")
  names = check_one_trace(xplane_pb2, path)
  # XLA's Python tracer recorded the calls (ours stays off under XLA's session):
  # the program's frames as often as without the plugin.
  plain = run_program(tmp_path, "import spyglass.jax; spyglass.jax.disable(); PROFILER = jax.profiler",
                      name="plain")  # one line as above: the frames' line numbers match
  plain_names = [n for lines in planes_and_lines(xplane_pb2, plain)[0]["/host:CPU"].values() for n in lines]
  assert "sg_outer" not in plain_names
  frames = sorted({n for n in plain_names if n.startswith("$prog.py:")})
  assert any(n.endswith(" <lambda>") for n in frames), frames
  assert [names.count(n) for n in frames] == [plain_names.count(n) for n in frames], frames


def test_plugin_from_the_environment_without_the_line(tmp_path, xplane_pb2):
  # The program never names spyglass.jax: SPYGLASS_JAX_PLUGIN=1 (read at `import spyglass`, which the
  # installed package's .pth does at start for a program that does not import it).
  path = run_program(tmp_path, "PROFILER = jax.profiler", extra_env={"SPYGLASS_JAX_PLUGIN": "1"})
  check_one_trace(xplane_pb2, path)


def test_plugin_from_the_environment_for_an_untouched_program(tmp_path):
  # No spyglass in the program: the installed package's .pth imports it at start.
  import site  # pylint: disable=g-import-not-at-top
  if not any(os.path.exists(os.path.join(d, "spyglass-autostart.pth")) for d in site.getsitepackages()):
    pytest.skip("spyglass is not installed (its .pth starts it in untouched programs)")
  script = tmp_path / "untouched.py"
  script.write_text(textwrap.dedent("""\
      import sys
      import jax, jax.numpy as jnp
      with jax.profiler.trace(sys.argv[1]):
          jax.jit(lambda x: x + 1)(jnp.ones(8)).block_until_ready()
      print(sys.modules["spyglass.jax"].plugin_stats()["owned_sessions"])
      """))
  p = subprocess.run([sys.executable, str(script), str(tmp_path / "logs")], capture_output=True, text=True,
                     timeout=300, env=env(SPYGLASS_JAX_PLUGIN="1"))
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ["1"], p.stdout + p.stderr


def test_plugin_off_without_the_line(tmp_path, xplane_pb2):
  path = run_program(tmp_path, "PROFILER = jax.profiler")
  assert "sg_outer" not in all_names(xplane_pb2, path)


def test_spyglass_trace_holds_what_jax_profiler_records(tmp_path, xplane_pb2):
  ours = run_program(tmp_path, "PROFILER = sp", name="sg")
  names = check_one_trace(xplane_pb2, ours)
  # Python frames once: ours, not XLA's too.
  assert names.count("$prog.py:12 <module>") <= 1
  # XLA's metadata: the HLO of each module (enable_hlo_proto), the versions.
  meta = next(p for p in read_xspace(xplane_pb2, ours).planes if p.name == "/host:metadata")
  hlo = {m.name for m in meta.event_metadata.values()
         if "Hlo Proto" in {meta.stat_metadata[s.metadata_id].name for s in m.stats}}
  assert any(n.startswith("jit_f(") for n in hlo), hlo
  keys = {meta.stat_metadata[s.metadata_id].name for s in meta.stats}
  assert {"jax_version", "jaxlib_version", "cpu_version", "spyglass_version"} <= keys, keys

  # XLA's runtime events depend on timing (a thread pool waits or not): the
  # names of two jax.profiler runs must be in one of two of ours.
  theirs = [all_names(xplane_pb2, run_program(tmp_path, "PROFILER = jax.profiler", name=f"jax{i}"))
            for i in range(2)]
  # The names as they are, C methods included ("$<unknown> get", as XLA
  # names them); jax.profiler's own frames (profiler.py) are only in the run
  # that called it.
  wanted = {n for n in theirs[0] & theirs[1] if not n.startswith("$profiler.py:")}
  missing = wanted - set(all_names(xplane_pb2, ours))
  if missing:
    missing -= set(all_names(xplane_pb2, run_program(tmp_path, "PROFILER = sp", name="sg2")))
  assert not missing, sorted(missing)


def test_spyglass_run_trace_records_xla_of_a_program_importing_jax_later(tmp_path, xplane_pb2):
  # The trace starts before the program imports jax: XLA's session joins at the import.
  script = tmp_path / "later.py"
  script.write_text(textwrap.dedent("""\
      import spyglass.profiler as sp
      import jax, jax.numpy as jnp
      f = jax.jit(lambda x: jnp.sin(x) @ x)
      x = jnp.ones((64, 64))
      for i in range(3):
          with sp.TraceAnnotation("sg_outer"):
              with jax.profiler.TraceAnnotation("jax_inner"):
                  f(x).block_until_ready()
      """))
  log_dir = str(tmp_path / "logs")
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--trace", log_dir, str(script)],
                     capture_output=True, text=True, timeout=300, env=env())
  assert p.returncode == 0, p.stdout + p.stderr
  files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(files) == 1, files
  planes, _ = planes_and_lines(xplane_pb2, files[0])
  host = planes["/host:CPU"]
  assert line_of(host, "sg_outer") == line_of(host, "jax_inner") == line_of(host, "PjitFunction(<lambda>)")
  names = [n for evs in host.values() for n in evs]
  assert "ThunkExecutor::Execute (wait for completion)" in names


def test_a_program_tracing_with_jax_profiler_under_spyglass_run_trace(tmp_path, xplane_pb2):
  # XLA runs one session at a time: the one Spyglass drives makes way for the program's own.
  script = tmp_path / "own.py"
  own = str(tmp_path / "own_logs")
  script.write_text(textwrap.dedent(f"""\
      import jax, jax.numpy as jnp
      f = jax.jit(lambda x: jnp.sin(x) @ x)
      x = jnp.ones((64, 64))
      f(x).block_until_ready()
      with jax.profiler.trace({own!r}):
          with jax.profiler.TraceAnnotation("in_programs_trace"):
              f(x).block_until_ready()
      print("program ok")
      """))
  log_dir = str(tmp_path / "logs")
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--trace", log_dir, str(script)],
                     capture_output=True, text=True, timeout=300, env=env())
  assert p.returncode == 0, p.stdout + p.stderr
  assert p.stdout == "program ok\n", p.stdout
  theirs = glob.glob(os.path.join(own, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(theirs) == 1 and "in_programs_trace" in all_names(xplane_pb2, theirs[0])
  ours = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(ours) == 1
  # XLA's events until the program's session began (the first call of f).
  assert "PjitFunction(<lambda>)" in all_names(xplane_pb2, ours[0])


def served_program(tmp_path, setup):
  script = tmp_path / "served.py"
  script.write_text(textwrap.dedent("""\
      import sys, time
      import jax, jax.numpy as jnp
      import spyglass.profiler as sp
      {setup}
      @jax.jit
      def f(x):
          return jnp.sin(x) @ x
      x = jnp.ones((64, 64))
      f(x).block_until_ready()
      print("PORT", port, flush=True)
      end = time.time() + 20
      while time.time() < end and not sys.stdin.closed:
          with sp.TraceAnnotation("sg_outer"):
              with jax.profiler.TraceAnnotation("jax_inner"):
                  f(x).block_until_ready()
          time.sleep(0.002)
          import select
          if select.select([sys.stdin], [], [], 0)[0]:
              break
      print("OK")
      """).format(setup=setup))
  return str(script)


def capture(tmp_path, setup, client):
  script = served_program(tmp_path, setup)
  p = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env())
  try:
    line = p.stdout.readline()
    m = re.match(r"PORT (\d+)", line)
    assert m, (line, p.stderr.read() if p.poll() is not None else "")
    logs = str(tmp_path / "capture")
    r = subprocess.run(client(int(m.group(1)), logs), capture_output=True, text=True, timeout=180, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
  finally:
    out, err = p.communicate(input="stop\n", timeout=120)
  assert p.returncode == 0, err
  assert "OK" in out, out + err
  files = glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(files) == 1, files
  return files[0]


def test_spyglass_collect_of_a_jax_program_holds_xla_events(tmp_path, xplane_pb2):
  path = capture(tmp_path, "port = sp.start_server(0)",
                 lambda port, logs: [sys.executable, "-m", "spyglass", "collect", str(port), "800",
                                     "--log_dir", logs, "--no_perfetto_link"])
  names = all_names(xplane_pb2, path)
  for name in ("PjitFunction(f)", "jax_inner", "sg_outer"):
    assert name in names, (name, sorted(names)[:40])
  # The capture's options are the client's (device_tracer_level=1): in a JAX
  # process our GPU tracer steps aside for XLA's (one CUPTI subscriber).
  warnings = list(read_xspace(xplane_pb2, path).warnings)
  assert any("GPU tracer off: XLA's device tracer (jax) traces the device" in w for w in warnings), warnings


def test_spyglass_collect_of_a_jax_program_holds_jax_device_bytes(tmp_path, xplane_pb2):
  # The memory timeline's JAX track in a remote capture, by default: the
  # program traced itself once (which starts the sampler thread), then serves.
  path = capture(tmp_path, "with sp.trace(None):\n    jnp.ones(8).block_until_ready()\nport = sp.start_server(0)",
                 lambda port, logs: [sys.executable, "-m", "spyglass", "collect", str(port), "800",
                                     "--log_dir", logs, "--no_perfetto_link"])
  planes, _ = planes_and_lines(xplane_pb2, path)
  counters = [n for names in planes["/host:CPU"].values() for n in names if n == "jax memory cpu:0"]
  assert len(counters) >= 5, len(counters)  # 800 ms at a 10 ms period, on a loaded machine


def test_jax_collect_profile_of_a_jax_program_holds_spyglass_annotations(tmp_path, xplane_pb2):
  pytest.importorskip("xprof")  # jax.collect_profile needs it
  path = capture(tmp_path, "import socket, spyglass.jax\ns = socket.socket(); s.bind(('127.0.0.1', 0))\n"
                 "port = s.getsockname()[1]; s.close()\njax.profiler.start_server(port)",
                 lambda port, logs: [sys.executable, "-m", "jax.collect_profile", str(port), "800",
                                     "--log_dir", logs, "--no_perfetto_link"])
  planes, _ = planes_and_lines(xplane_pb2, path)
  host = planes["/host:CPU"]
  assert line_of(host, "sg_outer") == line_of(host, "PjitFunction(f)")


def test_xprof_converts_the_merged_traces(tmp_path):
  pytest.importorskip("xprof")
  for setup, name in (("import spyglass.jax\nPROFILER = jax.profiler", "plugin"), ("PROFILER = sp", "spyglass")):
    path = run_program(tmp_path, setup, name=name)
    p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "xprof", "xprof_check.py"), path,
                        "--expect-event", "sg_outer", "--expect-event", "PjitFunction(f)",
                        "--expect-event", "jax_inner"], capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
      pytest.skip("xprof not importable")
    assert p.returncode == 0, (name, p.stdout + p.stderr)


def test_a_trace_without_jax_holds_nothing_of_the_bridge(tmp_path):
  # The XLA-session tracer runs in every session: without jax it adds no frame
  # to the trace and leaves the program's import machinery as it was.
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""\
      import sys
      import spyglass.profiler as sp
      before = list(sys.meta_path)
      with sp.trace({str(tmp_path / "logs")!r}) as s:
          sum(range(10))
      names = {{e.name for p in s.profile_data.planes for l in p.lines for e in l.events}}
      assert "jax" not in sys.modules
      assert sys.meta_path == before, (sys.meta_path, before)
      bad = sorted(n for n in names if "threading" in n or "_jax_session" in n or "RLock" in n)
      assert not bad, bad
      assert "$builtins sum" in names, sorted(names)
      print("OK")
      """)], capture_output=True, text=True, timeout=120, env=env())
  assert p.returncode == 0 and p.stdout == "OK\n", p.stdout + p.stderr


SAMPLED = textwrap.dedent("""\
    import sys, threading
    import jax, jax.numpy as jnp
    import spyglass.jax
    def burn_python(n):
        t = 0
        for i in range(n):
            t += i * i
        return t
    f = jax.jit(lambda x: jnp.sin(x) @ x)
    x = jnp.ones((256, 256))
    f(x).block_until_ready()
    options = None
    if sys.argv[2] == "options":  # jax's own options: XLA hands them to the plugin
        options = jax.profiler.ProfileOptions()
        options.advanced_configuration = {"spyglass_cpu_sample_hz": 999}
    with jax.profiler.trace(sys.argv[1], profiler_options=options):
        for _ in range(15):
            burn_python(100000)
            f(x).block_until_ready()
    print(threading.get_native_id(), spyglass.jax.plugin_stats()["owned_sessions"])
    """)


@pytest.mark.parametrize("how", ["env", "options"])
def test_plugin_puts_cpu_samples_in_jax_profiler_trace(tmp_path, xplane_pb2, how):
  # The sampler on (SPYGLASS_OPTIONS, or the advanced_configuration of the
  # profiler_options given to jax.profiler): jax.profiler's trace holds its samples
  # on /host:CPU, one "CPU samples" line per thread, and their stacks survive
  # XLA's merge of our plane into its own (by event name: the stack table).
  script = tmp_path / "prog.py"
  script.write_text(SAMPLED)
  logs = tmp_path / "logs"
  extra = {"SPYGLASS_OPTIONS": "spyglass_cpu_sample_hz=999"} if how == "env" else {}
  p = subprocess.run([sys.executable, str(script), str(logs), how], capture_output=True, text=True, timeout=300,
                     env=env(**extra))
  assert p.returncode == 0, p.stdout + p.stderr
  tid, owned = p.stdout.split()
  assert owned == "1", p.stdout
  files = glob.glob(str(logs / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert len(files) == 1, files
  space = read_xspace(xplane_pb2, files[0])
  host = next(pl for pl in space.planes if pl.name == "/host:CPU")
  stats = {host.stat_metadata[s.metadata_id].name: s for s in host.stats}
  assert stats["cpu_sample_period_ns"].uint64_value == 1000000000 // 999, sorted(stats)
  assert "cpu_stack_table" in stats, sorted(stats)
  sample_lines = [l for l in host.lines if l.name == "CPU samples"]
  main = [l for l in sample_lines if l.display_name.endswith(f" {tid} CPU samples")]
  assert len(main) == 1 and len(main[0].events) > 20, [(l.display_name, len(l.events)) for l in sample_lines]
  # Every sample's node is in the table (by name).
  table = {row.split("\t")[0]: row.split("\t") for row in stats["cpu_stack_table"].str_value.splitlines()}
  leaves = {host.event_metadata[e.metadata_id].name for l in sample_lines for e in l.events}
  assert leaves <= set(table), sorted(leaves - set(table))[:5]
  # Spyglass's own readers walk the stacks: the Python function that burned the CPU.
  spyglass = os.path.join(os.path.dirname(sys.executable), "spyglass")
  s = subprocess.run([spyglass, "summary", "-n", "50", str(logs)], capture_output=True, text=True, timeout=300)
  assert s.returncode == 0, s.stderr
  block = s.stdout.split("CPU time in all threads:", 1)[1]
  assert "burn_python (prog.py)" in block, s.stdout[-3000:]
  if importlib.util.find_spec("xprof") is not None:
    x = subprocess.run([sys.executable, os.path.join(REPO, "tests", "xprof", "xprof_check.py"), files[0],
                        "--expect-event", "PjitFunction(<lambda>)"], capture_output=True, text=True, timeout=600)
    assert x.returncode in (0, 77), x.stdout + x.stderr
