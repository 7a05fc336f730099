"""Programs written against jax.profiler run unchanged on spyglass.profiler.

Each program below follows an example of the jax.profiler guide (tracing,
annotations, options), rewritten with numpy where the guide computes with
jax.numpy. It is run twice in fresh interpreters: with
`import spyglass.profiler as profiler` and, when JAX is installed, with
`import jax.profiler as profiler`; both must succeed and write a profile that
holds the program's annotations.
"""
import glob
import os
import subprocess
import sys

import pytest

from conftest import host_events

PROGRAMS = {
    "trace_context_manager": ("""
import numpy as np
with profiler.trace(LOG_DIR):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 300))
    with profiler.TraceAnnotation("matmul"):
        b = a @ a
""", ["matmul"]),
    "start_stop": ("""
import numpy as np
profiler.start_trace(LOG_DIR)
a = np.random.default_rng(1).standard_normal((200, 200))
with profiler.TraceAnnotation("my_label"):
    r = np.dot(a, a.T)
profiler.stop_trace()
""", ["my_label"]),
    "options_host_and_python_off": ("""
options = profiler.ProfileOptions()
options.python_tracer_level = 0
options.host_tracer_level = 0
profiler.start_trace(LOG_DIR, profiler_options=options)
sum(range(1000))
profiler.stop_trace()
""", []),
    "advanced_configuration": ("""
options = profiler.ProfileOptions()
options.advanced_configuration = {"tpu_trace_mode": "TRACE_ONLY_HOST", "tpu_num_sparse_cores_to_trace": 2}
assert options.advanced_configuration["tpu_num_sparse_cores_to_trace"] == 2
with profiler.trace(LOG_DIR, profiler_options=options):
    with profiler.TraceAnnotation("configured"):
        pass
""", ["configured"]),
    "training_steps": ("""
import numpy as np
NUM_STEPS = 4
w = np.zeros(10)
def train_step():
    global w
    w = w + np.ones(10) * 0.1
global_step = 0
with profiler.trace(LOG_DIR):
    while global_step < NUM_STEPS:
        with profiler.StepTraceAnnotation("train", step_num=global_step):
            train_step()
        global_step += 1
""", ["train"]),
    "annotate_function": ("""
from functools import partial
import numpy as np

@profiler.annotate_function
def f(x):
    return np.dot(x, x.T)

@partial(profiler.annotate_function, name="event_name")
def g(x):
    return np.dot(x, x.T)

@partial(profiler.annotate_function, name="with_args", phase="eval")
def h(x):
    return x

with profiler.trace(LOG_DIR):
    f(np.ones((50, 50)))
    g(np.ones((50, 50)))
    h(1)
assert f.__name__ == "f"
""", ["f", "event_name", "with_args"]),
    "perfetto_link": ("""
import threading, time, urllib.request
def fetch():
    for _ in range(200):
        try:
            urllib.request.urlopen("http://127.0.0.1:9001/perfetto_trace.json.gz", timeout=5).read()
            return
        except Exception:
            time.sleep(0.05)
fetcher = threading.Thread(target=fetch)
fetcher.start()
with profiler.trace(LOG_DIR, create_perfetto_link=True):
    with profiler.TraceAnnotation("linked"):
        pass
fetcher.join()
""", ["linked"]),
    "one_at_a_time": ("""
profiler.start_trace(LOG_DIR)
try:
    profiler.start_trace(LOG_DIR)
    raise SystemExit("second start_trace did not raise")
except RuntimeError as e:
    assert "Only one profile may be run at a time" in str(e)
profiler.stop_trace()
try:
    profiler.stop_trace()
    raise SystemExit("stop_trace without a trace did not raise")
except RuntimeError as e:
    assert str(e) == "No profile started"
""", []),
}

IMPORTS = {"spyglass": "import spyglass.profiler as profiler", "jax": "import jax.profiler as profiler"}


def have_jax():
  try:
    import jax.profiler  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


@pytest.mark.parametrize("impl", ["spyglass", "jax"])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_program_runs_unchanged(program, impl, tmp_path, xplane_pb2):
  if impl == "jax" and not have_jax():
    pytest.skip("jax not installed")
  body, expected = PROGRAMS[program]
  log_dir = str(tmp_path / "logs")
  code = f"{IMPORTS[impl]}\nLOG_DIR = {log_dir!r}\n{body}"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
  assert p.returncode == 0, f"{impl} failed:\n{p.stdout}\n{p.stderr}"
  files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))
  if program == "one_at_a_time":
    return
  assert len(files) == 1, files
  assert glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  names = {e[1] for e in host_events(xplane_pb2, files[0])}
  for name in expected:
    assert name in names, (impl, name)
  if program == "perfetto_link":
    # JAX's file (and URL, fetched above) for both; Spyglass adds the native trace.
    assert glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
    if impl == "spyglass":
      assert glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "perfetto_trace.pb"))
