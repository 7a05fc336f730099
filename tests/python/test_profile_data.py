"""Reading profiles from code: ProfileData & co. and ProfileSession, as jax.profiler has them.

The same analysis script (profile_analysis.py) must print the same text with
jax's classes and ours, on files written by JAX and by Spyglass; sessions keep
their trace in memory and export runs that XProf's converter reads.
"""
import gc
import glob
import os
import subprocess
import sys

import pytest

import spyglass
import spyglass.profiler as profiler
from conftest import REPO, run_python
from profile_analysis import analyse, describe

CLASSES = ["ProfileData", "ProfilePlane", "ProfileLine", "ProfileEvent"]

# Every stat kind, times that truncate (ps -> ns) and go negative, a ref value,
# a plane stat, two lines, an event with a stat list and one without.
TEXT = r"""
planes {
  id: 1 name: "/host:CPU"
  lines { id: 7 name: "main" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 1500 duration_ps: 2999
      stats { metadata_id: 1 int64_value: -3 }
      stats { metadata_id: 2 uint64_value: 18446744073709551615 }
      stats { metadata_id: 3 double_value: 1.5 }
      stats { metadata_id: 4 str_value: "caf\303\251" }
      stats { metadata_id: 5 bytes_value: "raw" }
      stats { metadata_id: 6 ref_value: 7 } }
    events { metadata_id: 2 offset_ps: -2500 duration_ps: 999 } }
  lines { id: 8 name: "worker" timestamp_ns: 5000000000
    events { metadata_id: 2 offset_ps: 123456789 duration_ps: 1000000 } }
  event_metadata { key: 1 value { id: 1 name: "step" } }
  event_metadata { key: 2 value { id: 2 name: "inner" } }
  stat_metadata { key: 1 value { id: 1 name: "i" } }
  stat_metadata { key: 2 value { id: 2 name: "u" } }
  stat_metadata { key: 3 value { id: 3 name: "d" } }
  stat_metadata { key: 4 value { id: 4 name: "s" } }
  stat_metadata { key: 5 value { id: 5 name: "b" } }
  stat_metadata { key: 6 value { id: 6 name: "r" } }
  stat_metadata { key: 7 value { id: 7 name: "referenced" } }
  stats { metadata_id: 1 int64_value: 42 }
}
planes { id: 2 name: "/device:GPU:0" }
"""


def jax_profiler(*needs):
  """The installed jax.profiler; the test is skipped where it lacks `needs` ("ProfileData.from_text_proto")."""
  jp = pytest.importorskip("jax.profiler", reason="jax is not installed")
  for need in needs:
    obj = jp
    for part in need.split("."):
      obj = getattr(obj, part, None)
    if obj is None:
      pytest.skip(f"jax {getattr(sys.modules.get('jax'), '__version__', '?')} has no jax.profiler.{need}")
  return jp


def jax_profiler_or_none(*needs):
  """As jax_profiler, None instead of a skip (for tests whose own checks stand without jax)."""
  try:
    import jax.profiler as jp  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  for need in needs:
    obj = jp
    for part in need.split("."):
      obj = getattr(obj, part, None)
    if obj is None:
      return None
  return jp


def no_python():
  o = profiler.ProfileOptions()
  o.python_tracer_level = 0
  return o


def xprof_reads(xplane, *expect_events):
  """XProf's converters (trace_viewer@, overview_page, ...) on `xplane`, as test_xprof_and_processes does."""
  pytest.importorskip("xprof")
  args = [sys.executable, os.path.join(REPO, "tests", "xprof", "xprof_check.py"), xplane]
  for e in expect_events:
    args += ["--expect-event", e]
  p = subprocess.run(args, capture_output=True, text=True, timeout=600)
  if p.returncode == 77:
    pytest.skip("xprof not importable")
  assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def jax_file(tmp_path_factory):
  """A .xplane.pb written by JAX (a fresh interpreter): jitted work, annotations with arguments, steps."""
  jax_profiler()
  log_dir = str(tmp_path_factory.mktemp("jax_written"))
  run_python("""
import sys
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (x @ x.T).sum())
x = jnp.ones((64, 64))
f(x).block_until_ready()
jax.profiler.start_trace(sys.argv[1])
for step in range(3):
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
        with jax.profiler.TraceAnnotation("forward", batch=32, rate=0.5, tag="x"):
            f(x).block_until_ready()
jax.profiler.stop_trace()
""", log_dir, timeout=300)
  files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(files) == 1, files
  return files[0]


@pytest.fixture(scope="module")
def spyglass_file(tmp_path_factory):
  """A .xplane.pb written by Spyglass: Python tracer on, annotations with every argument type."""
  log_dir = tmp_path_factory.mktemp("spyglass_written")

  def work(n):
    return sum(i * i for i in range(n))

  with profiler.trace(log_dir):
    for step in range(3):
      with profiler.StepTraceAnnotation("train", step_num=step):
        with profiler.TraceAnnotation("forward", batch=32, rate=0.5, tag="x", ok=True):
          work(100)
  return profiler.last_trace_files()["xplane_path"]


def test_names_match_real_jax_classes():
  jp = jax_profiler()
  for cls in CLASSES:
    if not hasattr(jp, cls):
      continue  # this jax has not got it yet (0.10: no ProfileLine in jax.profiler)
    ours = {n for n in dir(getattr(profiler, cls)) if not n.startswith("_")}
    # from_raw_cpp_ptr takes a capsule holding jaxlib's own C++ XSpace: nothing to give it outside jaxlib.
    theirs = {n for n in dir(getattr(jp, cls)) if not n.startswith("_")} - {"from_raw_cpp_ptr"}
    assert theirs <= ours, (cls, theirs - ours)
  for name in ["ProfileSession", "export_profile_data"]:
    assert hasattr(profiler, name)


def test_signatures_match_real_jax(spyglass_file):
  import inspect  # pylint: disable=g-import-not-at-top
  jp = jax_profiler()
  for path in ["trace", "start_trace", "export_profile_data", "ProfileSession.__init__",
               "ProfileSession.export_profile_data", "ProfileSession.start", "ProfileSession.stop"]:
    theirs, ours = jp, profiler
    for part in path.split("."):
      theirs, ours = theirs and getattr(theirs, part, None), getattr(ours, part)
    if theirs is None:
      continue  # not in this jax
    # Ours add perfetto_link_timeout_s, keyword-only. Defaults as the newest jax's (older: trace(log_dir)).
    newest = hasattr(jp, "ProfileSession")
    keep = lambda f: [(p.name, p.kind, p.default if newest else None)
                      for p in inspect.signature(f).parameters.values() if p.kind != p.KEYWORD_ONLY]
    assert keep(ours) == keep(theirs), path
  # The C++ classes' keyword names, by calling with them.
  with open(spyglass_file, "rb") as f:
    raw = f.read()
  for cls in [profiler.ProfileData] + ([jp.ProfileData] if hasattr(jp, "ProfileData") else []):
    a = cls.from_file(proto_file_path=spyglass_file)
    b = cls.from_serialized_xspace(serialized_xspace=raw)
    assert a.find_plane_with_name(name="/host:CPU").name == b.find_plane_with_name(name="/host:CPU").name


def test_same_analysis_as_jax_on_a_jax_file(jax_file):
  jp = jax_profiler("ProfileData.from_file")
  ours = analyse(profiler.ProfileData, jax_file)
  assert ours == analyse(jp.ProfileData, jax_file)
  # The file holds what the program did (the comparison is not of two empty texts).
  assert "'forward'" in ours and "batch=32" in ours and "rate=0.5" in ours and "tag='x'" in ours
  assert "plane '/host:CPU'" in ours


def test_same_analysis_as_jax_on_a_spyglass_file(spyglass_file):
  jp = jax_profiler("ProfileData.from_file")
  ours = analyse(profiler.ProfileData, spyglass_file)
  assert ours == analyse(jp.ProfileData, spyglass_file)
  assert ours.count("    'train' start=") == 3 and ours.count("    'forward' start=") == 3, ours[:2000]
  assert "  total 'train' n=3 " in ours
  assert "batch=32, rate=0.5, tag='x', ok=1" in ours
  assert " work" in ours  # the Python tracer's events


def test_same_analysis_as_jax_from_bytes_and_text(spyglass_file):
  jp = jax_profiler("ProfileData.from_serialized_xspace", "ProfileData.from_text_proto")
  with open(spyglass_file, "rb") as f:
    raw = f.read()
  ours = describe(profiler.ProfileData.from_serialized_xspace(raw))
  assert ours == describe(jp.ProfileData.from_serialized_xspace(raw))
  assert describe(profiler.ProfileData(raw)) == ours
  assert describe(profiler.ProfileData.from_text_proto(TEXT)) == describe(jp.ProfileData.from_text_proto(TEXT))


def test_values_of_a_known_profile():
  data = profiler.ProfileData.from_text_proto(TEXT)
  planes = list(data.planes)
  assert [p.name for p in planes] == ["/host:CPU", "/device:GPU:0"]
  cpu = planes[0]
  assert list(cpu.stats) == [("i", 42)]
  lines = list(cpu.lines)
  assert [l.name for l in lines] == ["main", "worker"]
  step, inner = list(lines[0].events)
  # ps -> ns truncated toward zero before adding the line's timestamp, as jax does.
  assert (step.name, step.start_ns, step.duration_ns, step.end_ns) == ("step", 1001.0, 2.0, 1003.0)
  assert (inner.name, inner.start_ns, inner.duration_ns, inner.end_ns) == ("inner", 998.0, 0.0, 998.0)
  assert list(step.stats) == [("i", -3), ("u", 2**64 - 1), ("d", 1.5), ("s", "café"), ("b", "raw"),
                              ("r", "referenced")]
  assert [type(v) for _, v in step.stats] == [int, int, float, str, str, str]
  assert list(inner.stats) == []
  (late,) = lines[1].events
  assert (late.start_ns, late.duration_ns) == (5000123456.0, 1000.0)
  assert data.find_plane_with_name("/device:GPU:0").name == "/device:GPU:0"
  assert list(data.find_plane_with_name("/device:GPU:0").lines) == []
  assert data.find_plane_with_name("nope") is None
  # Iterators, as jax's: each property access starts again.
  it = cpu.lines
  assert iter(it) is it and len(list(it)) == 2 and list(it) == [] and len(list(cpu.lines)) == 2


def test_text_proto_round_trip(xplane_pb2):
  raw = profiler.ProfileData.text_proto_to_serialized_xspace(TEXT)
  assert isinstance(raw, bytes)
  space = xplane_pb2.XSpace()
  space.ParseFromString(raw)
  assert [p.name for p in space.planes] == ["/host:CPU", "/device:GPU:0"]
  assert space.planes[0].lines[0].events[0].duration_ps == 2999
  assert describe(profiler.ProfileData.from_serialized_xspace(raw)) == describe(
      profiler.ProfileData.from_text_proto(TEXT))
  jp = jax_profiler_or_none("ProfileData.text_proto_to_serialized_xspace")
  if jp is None:
    return
  theirs = xplane_pb2.XSpace()
  theirs.ParseFromString(jp.ProfileData.text_proto_to_serialized_xspace(TEXT))
  assert theirs == space


def test_objects_keep_the_profile_alive(spyglass_file):
  events = next(l for l in profiler.ProfileData.from_file(spyglass_file).find_plane_with_name("/host:CPU").lines
                if any(True for _ in l.events)).events
  stats = next(e for e in profiler.ProfileData.from_file(spyglass_file).find_plane_with_name(
      "/host:CPU").lines.__next__().events).stats
  gc.collect()
  first = next(events)
  assert isinstance(first.name, str) and first.duration_ns >= 0
  assert all(isinstance(n, str) for n, _ in stats)


def test_from_file_takes_paths(spyglass_file):
  import pathlib  # pylint: disable=g-import-not-at-top
  assert describe(profiler.ProfileData.from_file(pathlib.Path(spyglass_file))) == describe(
      profiler.ProfileData.from_file(spyglass_file))


def test_bad_input_raises_runtime_error_as_jax(tmp_path, spyglass_file):
  with open(spyglass_file, "rb") as f:
    good = f.read()
  truncated = tmp_path / "truncated.xplane.pb"
  truncated.write_bytes(good[: len(good) // 2])
  garbage = tmp_path / "garbage.xplane.pb"
  garbage.write_bytes(b"\xff" * 64)
  json_file = tmp_path / "trace.json"
  json_file.write_text('{"traceEvents": []}')
  cases = [
      (lambda p: p.from_file(str(tmp_path / "missing.xplane.pb")), "missing.xplane.pb"),
      (lambda p: p.from_file(str(tmp_path)), "not a regular file"),
      (lambda p: p.from_file(str(truncated)), "truncated"),
      (lambda p: p.from_file(str(garbage)), "not a profile"),
      (lambda p: p.from_file(str(json_file)), "not a profile"),
      (lambda p: p.from_serialized_xspace(good[:-3]), "not a serialized XSpace"),
      (lambda p: p(b"\x0a\x05abc"), "not a serialized XSpace"),
  ]
  jp = jax_profiler_or_none("ProfileData.from_file", "ProfileData.from_serialized_xspace")
  for make, message in cases:
    with pytest.raises(RuntimeError, match=message):
      make(profiler.ProfileData)
    if jp is not None:  # jax fails on the same inputs, with a RuntimeError too
      with pytest.raises(RuntimeError):
        make(jp.ProfileData)
  with pytest.raises(TypeError):
    profiler.ProfileData.from_serialized_xspace("not bytes")
  # Over the 1 GiB bound: refused before anything is read (a sparse file).
  huge = tmp_path / "huge.xplane.pb"
  with open(huge, "wb") as f:
    f.truncate((1 << 30) + 1)
  with pytest.raises(RuntimeError, match="too large"):
    profiler.ProfileData.from_file(huge)
  # An empty file is an empty XSpace, for jax too.
  empty = tmp_path / "empty.xplane.pb"
  empty.write_bytes(b"")
  assert list(profiler.ProfileData.from_file(str(empty)).planes) == []


def test_from_file_of_a_fifo_is_an_error_not_a_hang(tmp_path):
  # Opening a FIFO waited for a writer, for ever: in a child, under a timeout.
  fifo = tmp_path / "pipe.xplane.pb"
  os.mkfifo(fifo)
  code = ("import spyglass.profiler as p, sys\n"
          "try:\n  p.ProfileData.from_file(sys.argv[1])\nexcept RuntimeError as e:\n  print(e)\n")
  out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
  assert "not a regular file but a FIFO" in out.stdout, out.stdout + out.stderr


def test_names_that_are_not_utf8_are_read_as_the_cli_reads_them(tmp_path):
  raw = profiler.ProfileData.text_proto_to_serialized_xspace(TEXT)
  # Same lengths, so that the framing holds: a bad byte, an overlong NUL.
  raw = raw.replace(b"worker", b"wor\xff\xc0\x80").replace(b"\x04step", b"\x04st\xffp")
  path = tmp_path / "bad_utf8.xplane.pb"
  path.write_bytes(raw)
  for data in (profiler.ProfileData.from_file(str(path)), profiler.ProfileData.from_serialized_xspace(raw)):
    cpu = data.find_plane_with_name("/host:CPU")
    assert [l.name for l in cpu.lines] == ["main", "wor\ufffd\ufffd\ufffd"]
    assert [e.name for e in list(cpu.lines)[0].events] == ["st\ufffdp", "inner"]


def test_bad_text_proto_is_an_error_with_its_place():
  # jax logs the parse error and returns what it parsed so far; a script then reads a wrong profile.
  with pytest.raises(RuntimeError, match=r"line 2 column \d+: .*no_such_field"):
    profiler.ProfileData.from_text_proto('planes { name: "a" }\nno_such_field: 1')
  with pytest.raises(RuntimeError, match="not an XSpace"):
    profiler.ProfileData.text_proto_to_serialized_xspace("planes {")


def test_error_messages_quote_a_bounded_prefix(tmp_path):
  long_name = "x" * 5000 + ".xplane.pb"
  with pytest.raises(RuntimeError) as e:
    profiler.ProfileData.from_file(str(tmp_path / "d" / long_name))
  assert len(str(e.value)) < 400 and "bytes)" in str(e.value)


# --- ProfileSession ----------------------------------------------------------

def host_annotations(data):
  plane = data.find_plane_with_name("/host:CPU")
  return [(e.name, dict(e.stats)) for l in plane.lines for e in l.events if not e.name.startswith("$")]


def test_session_in_memory_start_stop(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # nothing may be written anywhere
  session = profiler.ProfileSession(profiler_options=no_python())
  assert not session.is_running and session.profile_data is None
  assert session.start() is session and session.is_running
  with profiler.TraceAnnotation("in memory", n=3):
    pass
  data = session.stop()
  assert not session.is_running and data is session.profile_data
  assert isinstance(data, profiler.ProfileData)
  assert ("in memory", {"n": 3}) in host_annotations(data)
  assert os.listdir(tmp_path) == []
  with pytest.raises(RuntimeError, match="^No profile started$"):
    session.stop()


def test_trace_yields_the_session_and_stop_trace_returns_the_data(tmp_path):
  with profiler.trace(profiler_options=no_python()) as session:
    assert isinstance(session, profiler.ProfileSession) and session.is_running
    with profiler.TraceAnnotation("block"):
      pass
  assert ("block", {}) in host_annotations(session.profile_data)
  started = profiler.start_trace(tmp_path, profiler_options=no_python())
  assert isinstance(started, profiler.ProfileSession) and started.is_running
  with profiler.TraceAnnotation("written"):
    pass
  data = profiler.stop_trace()
  assert data is started.profile_data and ("written", {}) in host_annotations(data)
  # Written as before, and the file reads back as the same profile.
  written = profiler.ProfileData.from_file(profiler.last_trace_files()["xplane_path"])
  assert host_annotations(written) == host_annotations(data)


def test_one_session_at_a_time():
  a = profiler.ProfileSession(profiler_options=no_python()).start()
  b = profiler.ProfileSession(profiler_options=no_python())
  with pytest.raises(RuntimeError, match="^Profile has already been started"):
    b.start()
  with pytest.raises(RuntimeError, match="^Profile has already been started"):
    a.start()
  assert not b.is_running
  with pytest.raises(RuntimeError, match="^No profile started$"):
    b.stop()
  a.stop()
  with b:  # an early stop inside the block is fine, as in jax
    b.stop()


def test_export_profile_data_of_a_session_is_read_by_xprof(tmp_path):
  o = no_python()
  o.session_id = "my_run"
  with profiler.ProfileSession(profiler_options=o) as session:
    with profiler.TraceAnnotation("exported", k="v"):
      pass
  with pytest.raises(RuntimeError, match="^Cannot export a ProfileSession while it is running"):
    running = profiler.ProfileSession(profiler_options=no_python()).start()
    try:
      profiler.export_profile_data(running, tmp_path)
    finally:
      running.stop()
  with pytest.raises(RuntimeError, match="^No profile data to export"):
    profiler.export_profile_data(profiler.ProfileSession(), tmp_path)
  with pytest.raises(TypeError, match="^Expected ProfileData or ProfileSession, got int$"):
    profiler.export_profile_data(3, tmp_path)

  session.export_profile_data(tmp_path, create_perfetto_trace=True)
  run = tmp_path / "plugins" / "profile" / "my_run"  # the session's session_id
  files = profiler.last_trace_files()
  assert files["run_dir"] == str(run)
  assert sorted(os.listdir(run)) == sorted([os.path.basename(files["xplane_path"]),
                                            os.path.basename(files["trace_json_path"]),
                                            "perfetto_trace.json.gz", "perfetto_trace.pb"])
  assert describe(profiler.ProfileData.from_file(files["xplane_path"])) == describe(session.profile_data)
  xprof_reads(files["xplane_path"], "exported")
  profiler.export_profile_data(session, tmp_path, session_id="other")
  assert os.path.isdir(tmp_path / "plugins" / "profile" / "other")
  with pytest.raises(spyglass.InvalidArgumentError):
    profiler.export_profile_data(session, tmp_path, session_id="../escape")


def test_export_profile_data_of_a_jax_file_is_read_by_xprof(tmp_path, jax_file):
  data = profiler.ProfileData.from_file(jax_file)
  profiler.export_profile_data(data, tmp_path, session_id="from_jax")
  xplane = profiler.last_trace_files()["xplane_path"]
  assert xplane.startswith(str(tmp_path / "plugins" / "profile" / "from_jax"))
  assert describe(profiler.ProfileData.from_file(xplane)) == describe(data)
  xprof_reads(xplane, "forward")


def test_session_semantics_match_real_jax(tmp_path):
  jp = jax_profiler()
  if not hasattr(jp, "ProfileSession"):
    pytest.skip("this jax has no ProfileSession (jax 0.12 has it)")
  script = """
out = []
def attempt(f):
    try:
        r = f()
        out.append(("ok", type(r).__name__))
    except Exception as e:
        out.append((type(e).__name__, str(e)))
s = profiler.ProfileSession()
attempt(lambda: profiler.export_profile_data(s, LOG))
attempt(lambda: s.stop())
attempt(lambda: s.start())
attempt(lambda: s.is_running)
attempt(lambda: profiler.ProfileSession().start())
attempt(lambda: profiler.export_profile_data(s, LOG))
attempt(lambda: s.stop())
attempt(lambda: (s.is_running, s.profile_data is not None))
attempt(lambda: profiler.export_profile_data(s.profile_data, LOG, session_id="x"))
attempt(lambda: profiler.export_profile_data("x", LOG))
attempt(lambda: profiler.stop_trace())
with profiler.trace() as t:
    pass
attempt(lambda: (type(t).__name__, t.is_running, type(t.profile_data).__name__))
print(out)
"""
  outputs = []
  for module in ["jax.profiler", "spyglass.profiler"]:
    log = str(tmp_path / module)
    p = run_python(f"import {module} as profiler\nLOG = {log!r}\n" + script, timeout=300)
    outputs.append(p.stdout.replace("ProfileData", "<data>").strip())
  assert outputs[0] == outputs[1]
  assert os.path.isdir(tmp_path / "spyglass.profiler" / "plugins" / "profile" / "x")
