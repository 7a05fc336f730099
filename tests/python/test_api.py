"""spyglass.profiler: jax.profiler's names, semantics and exceptions."""
import functools
import os
import pathlib
import threading

import pytest

import spyglass
import spyglass.profiler as profiler
from conftest import host_events, json_events

JAX_NAMES = ["ProfileOptions", "StepTraceAnnotation", "TraceAnnotation", "annotate_function",
             "device_memory_profile", "register_subprocess", "save_device_memory_profile",
             "start_server", "start_trace", "stop_server", "stop_trace", "trace"]
ALREADY = "Profile has already been started. Only one profile may be run at a time."


def no_python(**kw):
  o = profiler.ProfileOptions()
  o.python_tracer_level = 0
  for k, v in kw.items():
    setattr(o, k, v)
  return o


def test_names_of_jax_profiler():
  for name in JAX_NAMES:
    assert hasattr(profiler, name), name


def test_names_match_real_jax():
  # Whatever the installed jax has (0.10: no ProfileLine/ProfileSession; 0.12: all), we have.
  jp = pytest.importorskip("jax.profiler")
  ours = {n for n in dir(profiler) if not n.startswith("_")}
  theirs = {n for n in dir(jp) if not n.startswith("_")}
  assert theirs <= ours, theirs - ours


def test_second_start_and_stop_without_start_raise_runtime_error(tmp_path):
  with pytest.raises(RuntimeError, match="^No profile started$"):
    profiler.stop_trace()
  profiler.start_trace(tmp_path, profiler_options=no_python())
  with pytest.raises(RuntimeError) as e:
    profiler.start_trace(tmp_path)
  assert str(e.value) == ALREADY
  profiler.stop_trace()
  with pytest.raises(RuntimeError, match="^No profile started$") as e:
    profiler.stop_trace()
  assert type(e.value) is RuntimeError and e.value.code == "FailedPrecondition"  # one Status->exception path


def test_exception_types_match_real_jax(tmp_path):
  jp = pytest.importorskip("jax.profiler")
  def errors(mod):
    out = []
    try:
      mod.stop_trace()
    except Exception as e:  # pylint: disable=broad-except
      out.append((type(e).__name__, str(e)))
    o = mod.ProfileOptions()
    o.python_tracer_level = 0
    mod.start_trace(str(tmp_path / mod.__name__), profiler_options=o)
    try:
      mod.start_trace(str(tmp_path / "x"))
    except Exception as e:  # pylint: disable=broad-except
      out.append((type(e).__name__, str(e)))
    mod.stop_trace()
    for attr, value in [("host_tracer_level", 2.5), ("advanced_configuration", [1])]:
      try:
        setattr(o, attr, value)
      except Exception as e:  # pylint: disable=broad-except
        out.append((attr, type(e).__name__))
    return out
  assert errors(profiler) == errors(jp)


def test_profile_options_defaults_match_jax():
  o = profiler.ProfileOptions()
  expected = dict(include_dataset_ops=True, host_tracer_level=2, python_tracer_level=1,
                  enable_hlo_proto=True, start_timestamp_ns=0, duration_ms=0, repository_path="",
                  raise_error_on_start_failure=False, session_id="", advanced_configuration={})
  for k, v in expected.items():
    assert getattr(o, k) == v, k
  try:
    import jax.profiler as jp  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  j = jp.ProfileOptions()
  for k in expected:
    assert getattr(o, k) == getattr(j, k), k


def test_advanced_configuration_round_trip_and_type_errors():
  o = profiler.ProfileOptions()
  cfg = {"tpu_trace_mode": "TRACE_ONLY_HOST", "tpu_num_sparse_cores_to_trace": 2, "profile_subprocesses": True}
  o.advanced_configuration = cfg
  got = o.advanced_configuration
  assert got == cfg
  assert type(got["profile_subprocesses"]) is bool and type(got["tpu_num_sparse_cores_to_trace"]) is int
  with pytest.raises(TypeError):
    o.advanced_configuration = [("a", 1)]
  with pytest.raises(TypeError, match="must be a bool, int or str"):
    o.advanced_configuration = {"gpu_max_callback_api_events": 1.5}
  with pytest.raises(TypeError):
    o.host_tracer_level = "2"


def test_bad_options_raise_value_error_before_starting(tmp_path):
  o = no_python()
  o.advanced_configuration = {"no_such_key": 1}
  with pytest.raises(ValueError, match="no_such_key") as e:
    profiler.start_trace(tmp_path, profiler_options=o)
  assert isinstance(e.value, spyglass.InvalidArgumentError)
  o = no_python(host_tracer_level=7)
  with pytest.raises(spyglass.InvalidArgumentError, match="host_tracer_level"):
    profiler.start_trace(tmp_path, profiler_options=o)
  o = no_python()
  o.advanced_configuration = {"tpu_num_sparse_cores_to_trace": "two"}
  with pytest.raises(ValueError, match="tpu_num_sparse_cores_to_trace"):
    profiler.start_trace(tmp_path, profiler_options=o)
  with pytest.raises(TypeError):
    profiler.start_trace(tmp_path, profiler_options={"host_tracer_level": 2})
  # Nothing started.
  assert not profiler.TraceAnnotation.is_enabled()
  with pytest.raises(RuntimeError, match="No profile started"):
    profiler.stop_trace()


def test_trace_writes_files_and_accepts_pathlib(tmp_path):
  with profiler.trace(pathlib.Path(tmp_path), profiler_options=no_python()):
    with profiler.TraceAnnotation("hello"):
      pass
  files = profiler.last_trace_files()
  run = pathlib.Path(files["run_dir"])
  assert run.parent == tmp_path / "plugins" / "profile"
  assert os.path.exists(files["xplane_path"]) and files["xplane_path"].endswith(".xplane.pb")
  assert os.path.exists(files["trace_json_path"]) and files["trace_json_path"].endswith(".trace.json.gz")
  assert not (run / "perfetto_trace.pb").exists() and not (run / "perfetto_trace.json.gz").exists()
  assert "hello" in [e["name"] for e in json_events(files["trace_json_path"])]


def test_create_perfetto_trace(tmp_path):
  with profiler.trace(tmp_path, create_perfetto_trace=True, profiler_options=no_python()):
    with profiler.TraceAnnotation("p"):
      pass
  files = profiler.last_trace_files()
  path = files["perfetto_trace_path"]
  assert path.endswith("perfetto_trace.pb") and os.path.exists(path)
  with open(path, "rb") as f:
    data = f.read()
  assert data[:1] == b"\x0a"  # Trace.packet records
  assert b"\x12\x01p" in data  # the event's name, interned (EventName.name = "p")
  # JAX's perfetto_trace.json.gz too, the trace JSON written once: a hard
  # link to <host>.trace.json.gz.
  json_path = files["perfetto_trace_json_path"]
  assert json_path == os.path.join(files["run_dir"], "perfetto_trace.json.gz")
  assert os.stat(json_path).st_ino == os.stat(files["trace_json_path"]).st_ino
  assert "p" in [e["name"] for e in json_events(json_path)]
  assert sorted(os.listdir(files["run_dir"])) == sorted([os.path.basename(files["xplane_path"]),
                                                          os.path.basename(files["trace_json_path"]),
                                                          "perfetto_trace.json.gz", "perfetto_trace.pb"])


def test_session_id_names_the_run_dir(tmp_path):
  with profiler.trace(tmp_path, profiler_options=no_python(session_id="my_run")):
    pass
  assert profiler.last_trace_files()["run_dir"] == str(tmp_path / "plugins" / "profile" / "my_run")


def test_trace_stops_on_exception(tmp_path):
  with pytest.raises(KeyError):
    with profiler.trace(tmp_path, profiler_options=no_python()):
      with profiler.TraceAnnotation("inside"):
        raise KeyError("boom")
  assert not profiler.TraceAnnotation.is_enabled()
  names = [e["name"] for e in json_events(profiler.last_trace_files()["trace_json_path"])]
  assert "inside" in names


def test_annotation_arguments_are_typed(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path, profiler_options=no_python()):
    with profiler.TraceAnnotation("args", i=7, neg=-3, t=True, f=False, x=2.5, s="text", big=2**70,
                                  obj=[1, 2]) as a:
      assert isinstance(a, profiler.TraceAnnotation)
      a.set_metadata(later=5)
  ev = [e for e in host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"]) if e[1] == "args"]
  assert len(ev) == 1
  stats = ev[0][4]
  assert stats == {"i": 7, "neg": -3, "t": 1, "f": 0, "x": 2.5, "s": "text", "big": str(2**70),
                   "obj": "[1, 2]", "later": 5}


def test_step_trace_annotation_adds_r_before_user_args(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path, profiler_options=no_python()):
    for step in range(3):
      with profiler.StepTraceAnnotation("train", step_num=step):
        pass
  ev = [e for e in host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"]) if e[1] == "train"]
  assert [e[4] for e in ev] == [{"_r": 1, "step_num": s} for s in range(3)]
  assert issubclass(profiler.StepTraceAnnotation, profiler.TraceAnnotation)


def test_annotations_nest_and_time_is_ordered(tmp_path, xplane_pb2):
  with profiler.trace(tmp_path, profiler_options=no_python()):
    with profiler.TraceAnnotation("outer"):
      with profiler.TraceAnnotation("inner"):
        pass
  ev = {e[1]: e for e in host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])}
  assert ev["outer"][2] <= ev["inner"][2] <= ev["inner"][3] <= ev["outer"][3]


def test_annotations_outside_a_trace_are_no_ops(tmp_path):
  with profiler.TraceAnnotation("before", k=1) as a:
    a.set_metadata(x=1)
  assert not profiler.TraceAnnotation.is_enabled()
  with profiler.trace(tmp_path, profiler_options=no_python()):
    assert profiler.TraceAnnotation.is_enabled()
  names = [e["name"] for e in json_events(profiler.last_trace_files()["trace_json_path"])]
  assert "before" not in names


def test_annotation_errors():
  with pytest.raises(TypeError):
    profiler.TraceAnnotation()
  with pytest.raises(TypeError):
    profiler.TraceAnnotation(3)
  with pytest.raises(TypeError):
    profiler.TraceAnnotation("a", "b")
  a = profiler.TraceAnnotation("x")
  with pytest.raises(TypeError):
    a.set_metadata(1)


def test_annotation_does_not_swallow_exceptions():
  with pytest.raises(ZeroDivisionError):
    with profiler.TraceAnnotation("x"):
      1 / 0  # pylint: disable=pointless-statement


def test_enter_and_exit_behave_as_methods(tmp_path):
  # __enter__/__exit__ are bound without a builtin method object: bound,
  # unbound, through super() and with bad arguments they act as methods do.
  a = profiler.TraceAnnotation("m")
  enter, exit_ = a.__enter__, a.__exit__
  assert enter.__self__ is a and enter.__name__ == "__enter__" and exit_.__name__ == "__exit__"
  assert "__enter__" in repr(enter) and "__exit__" in repr(profiler.TraceAnnotation.__exit__)
  assert enter() is a and exit_(None, None, None) is None
  assert profiler.TraceAnnotation.__enter__(a) is a
  assert profiler.TraceAnnotation.__exit__(a, None, None, None) is None
  assert profiler.StepTraceAnnotation.__enter__ is profiler.TraceAnnotation.__enter__
  with pytest.raises(TypeError):
    a.__enter__(1)
  with pytest.raises(TypeError):
    a.__exit__(exc=None)
  with pytest.raises(TypeError):
    profiler.TraceAnnotation.__exit__(3, None, None, None)
  with pytest.raises(TypeError):
    profiler.TraceAnnotation.__dict__["__enter__"].__get__(3)

  exits = []

  class Logged(profiler.TraceAnnotation):
    def __exit__(self, *exc):
      exits.append(exc)
      return super().__exit__(*exc)

  with profiler.trace(tmp_path, profiler_options=no_python()):
    with Logged("logged") as l:
      assert isinstance(l, Logged)
    with profiler.TraceAnnotation("explicit") as e:
      pass
    e.__exit__(None, None, None)  # a second exit ends nothing
  assert exits == [(None, None, None)]
  names = [e["name"] for e in json_events(profiler.last_trace_files()["trace_json_path"])]
  assert names.count("logged") == 1 and names.count("explicit") == 1


def test_python_subclass_may_compute_the_name(tmp_path):
  class Layer(profiler.TraceAnnotation):
    def __init__(self, i, **kw):
      super().__init__(f"layer {i}", **kw)
  with profiler.trace(tmp_path, profiler_options=no_python()):
    with Layer(3, units=8):
      pass
  ev = [e for e in json_events(profiler.last_trace_files()["trace_json_path"]) if e["name"] == "layer 3"]
  assert len(ev) == 1 and ev[0]["args"]["units"] == "8"


def test_annotate_function_bare_and_partial(tmp_path, xplane_pb2):
  @profiler.annotate_function
  def plain(x, name="kept"):
    return x + 1, name

  @functools.partial(profiler.annotate_function, name="renamed", model="mlp", layers=4)
  def configured(x):
    return 2 * x

  class K:
    @profiler.annotate_function
    def method(self):
      return "m"

  assert plain.__name__ == "plain" and configured.__name__ == "configured"
  with profiler.trace(tmp_path, profiler_options=no_python()):
    assert plain(1) == (2, "kept")
    assert plain(1, name="call kwarg") == (2, "call kwarg")
    assert configured(3) == 6
    assert K().method() == "m"
  ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  names = [e[1] for e in ev]
  assert names.count("test_annotate_function_bare_and_partial.<locals>.plain") == 2
  assert "test_annotate_function_bare_and_partial.<locals>.K.method" in names
  renamed = [e for e in ev if e[1] == "renamed"]
  assert renamed[0][4] == {"model": "mlp", "layers": 4}


def test_annotations_from_threads_land_on_their_threads(tmp_path, xplane_pb2):
  def work(i):
    for _ in range(50):
      with profiler.TraceAnnotation(f"thread {i}"):
        pass
  with profiler.trace(tmp_path, profiler_options=no_python()):
    ts = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(4)]
    for t in ts:
      t.start()
    for t in ts:
      t.join()
  ev = host_events(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  lines = {}
  for line, name, *_ in ev:
    lines.setdefault(name, set()).add(line)
  for i in range(4):
    assert len(lines[f"thread {i}"]) == 1
  assert len({next(iter(lines[f"thread {i}"])) for i in range(4)}) == 4
  assert profiler.last_trace_stats()["events"] == 200


def test_trace_from_another_thread(tmp_path):
  err = []
  def run():
    try:
      with profiler.trace(tmp_path, profiler_options=no_python()):
        with profiler.TraceAnnotation("in thread"):
          pass
    except Exception as e:  # pylint: disable=broad-except
      err.append(e)
  t = threading.Thread(target=run)
  t.start()
  t.join()
  assert not err
  assert "in thread" in [e["name"] for e in json_events(profiler.last_trace_files()["trace_json_path"])]


def test_metadata_plane(tmp_path, xplane_pb2):
  from conftest import read_xspace  # pylint: disable=g-import-not-at-top
  with profiler.trace(tmp_path, profiler_options=no_python()):
    profiler.set_metadata("model", "resnet")
  space = read_xspace(xplane_pb2, profiler.last_trace_files()["xplane_path"])
  md = next(p for p in space.planes if p.name == "/host:metadata")
  stats = {md.stat_metadata[s.metadata_id].name: s.str_value for s in md.stats}
  assert stats["model"] == "resnet" and "python_version" in stats


def test_server_and_memory_names_do_not_pretend():
  # (register_subprocess is left to test_server_memory.py: here it would wait
  # its whole connect timeout for a server that never comes.)
  for call in [lambda: profiler.start_server(9999), profiler.stop_server,
               profiler.device_memory_profile,
               lambda: profiler.save_device_memory_profile("/tmp/x.prof")]:
    try:
      call()
    except NotImplementedError as e:
      assert "not available" in str(e)
    except (ValueError, RuntimeError):
      pass  # bound to the core: covered by their own tests
