"""A trace started from outside survives a program that closes its own
streams: `python -m json.tool in.json` closes sys.stdout when it is done
(`with sys.stdout as out`), and the profiler's exit hook must neither touch
that stream in a way that raises nor lose the trace."""
import glob
import json
import os
import subprocess
import sys

from test_env_start import clean_env


def write_json(tmp_path, n):
  p = tmp_path / "in.json"
  p.write_text(json.dumps({"rows": [{"i": i, "name": f"row{i}", "v": [i, i * 2]} for i in range(n)]}))
  return str(p)


def check_run(r, logs, n):
  assert r.returncode == 0, r.stderr
  assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
  assert json.loads(r.stdout)["rows"][n - 1]["i"] == n - 1  # the program's output, whole
  assert "spyglass: trace written to " + logs in r.stderr, r.stderr
  runs = glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))
  assert len(runs) == 1, (runs, r.stderr)
  names = glob.glob(os.path.join(os.path.dirname(runs[0]), "*.trace.json.gz"))
  assert names, os.listdir(os.path.dirname(runs[0]))


def test_json_tool_closes_stdout_under_python_m_spyglass_run(tmp_path):
  src = write_json(tmp_path, 20000)
  logs = str(tmp_path / "logs")
  r = subprocess.run([sys.executable, "-m", "spyglass", "run", "--trace", logs, "-m", "json.tool", src],
                     capture_output=True, text=True, timeout=300, env=clean_env())
  check_run(r, logs, 20000)


def test_json_tool_closes_stdout_under_the_environment(tmp_path):
  src = write_json(tmp_path, 10)
  logs = str(tmp_path / "logs")
  r = subprocess.run([sys.executable, "-m", "json.tool", src], capture_output=True, text=True, timeout=300,
                     env=clean_env(SPYGLASS_TRACE_DIR=logs))
  check_run(r, logs, 10)


def test_closed_stderr_leaves_the_trace(tmp_path):
  # The program closes both of its streams (and fd 2 stays open): our line
  # still reaches fd 2 and the trace is written.
  logs = str(tmp_path / "logs")
  script = tmp_path / "closer.py"
  script.write_text("import sys\nprint('out')\nsys.stdout.close()\nsys.stderr.close()\n")
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                     env=clean_env(SPYGLASS_TRACE_DIR=logs))
  assert r.returncode == 0, r.stderr
  assert r.stdout == "out\n"
  assert "spyglass: trace written to " + logs in r.stderr, r.stderr
  assert len(glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))) == 1
