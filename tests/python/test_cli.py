"""The spyglass CLI in the pip-installed package: the `spyglass` console script
and `python -m spyglass COMMAND` reach every command (summary, diff, report,
memtop, memdiff, collect, run), and what `python -m spyglass run` tells the
user to run next exists."""
import glob
import os
import re
import shlex
import subprocess
import sys

from test_env_start import clean_env, write_script

COMMANDS = ("summary", "diff", "report", "memtop", "memdiff", "collect", "run")
# pip puts console scripts beside the interpreter (the venv's bin/).
SPYGLASS = os.path.join(os.path.dirname(sys.executable), "spyglass")


def sh(*argv, **kw):
  return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, env=kw.pop("env", clean_env()), **kw)


def write_trace(tmp_path):
  logs = str(tmp_path / "logs")
  r = sh(sys.executable, "-m", "spyglass", "run", "--trace", logs, write_script(tmp_path))
  assert r.returncode == 0, r.stderr
  return logs


def test_console_script_lists_the_commands():
  assert os.access(SPYGLASS, os.X_OK), f"pip installed no spyglass script beside {sys.executable}"
  r = sh(SPYGLASS, "--help")
  assert r.returncode == 0, r.stderr
  for c in COMMANDS:
    assert re.search(rf"^\s+{c}\s", r.stdout, re.M), (c, r.stdout)
  r = sh(sys.executable, "-m", "spyglass", "--help")
  assert r.returncode == 0, r.stderr
  for c in COMMANDS:
    assert c in r.stdout, (c, r.stdout)


def test_summary_and_diff_through_both_entries(tmp_path):
  logs = write_trace(tmp_path)
  script = sh(SPYGLASS, "summary", "-n", "0", logs)
  assert script.returncode == 0, script.stderr
  assert "$unmodified.py:4 work" in script.stdout, script.stdout  # the script's function (all rows: -n 0)
  module = sh(sys.executable, "-m", "spyglass", "summary", "-n", "0", logs)
  assert (module.returncode, module.stdout, module.stderr) == (script.returncode, script.stdout, script.stderr)
  diff = sh(sys.executable, "-m", "spyglass", "diff", logs, logs)
  assert diff.returncode == 0 and diff.stdout == sh(SPYGLASS, "diff", logs, logs).stdout, diff.stderr
  # A bad argument is the CLI's own answer (status 2 or CLI11's 1..), through both.
  bad = [sh(*entry, "summary", str(tmp_path / "nowhere")) for entry in ([SPYGLASS], [sys.executable, "-m", "spyglass"])]
  assert bad[0].returncode != 0 and (bad[0].returncode, bad[0].stderr) == (bad[1].returncode, bad[1].stderr)


def test_report_writes_a_page(tmp_path):
  logs = write_trace(tmp_path)
  out = str(tmp_path / "report.html")
  r = sh(sys.executable, "-m", "spyglass", "report", logs, "-o", out)
  assert r.returncode == 0, r.stderr
  assert os.path.getsize(out) > 1000


def test_run_closing_hint_names_commands_that_exist(tmp_path):
  r = sh(sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "mem"), write_script(tmp_path))
  assert r.returncode == 0, r.stderr
  hints = re.findall(r"^(?:Read them with|Over time): (spyglass [^\n]*?)(?:   or   .*)?$", r.stderr, re.M)
  assert len(hints) == 2, r.stderr
  for hint in hints:
    argv = shlex.split(hint)
    assert argv[0] == "spyglass"
    ran = sh(SPYGLASS, *argv[1:])  # what the user types: the installed script
    assert ran.returncode == 0, (hint, ran.stderr)
    assert ran.stdout.strip(), hint


def test_console_script_run_profiles_any_command(tmp_path):
  # `spyglass run` is the CLI's (any program after --), with the heap hook of the package.
  mem = str(tmp_path / "mem")
  r = sh(SPYGLASS, "run", "-o", mem, "--", sys.executable, write_script(tmp_path), "exit", "4")
  assert r.returncode == 4, r.stderr
  assert "ARGS ['exit', '4']" in r.stdout
  assert len(glob.glob(os.path.join(mem, "memory.*.exit.prof"))) == 1, r.stderr


def test_console_script_traces_a_program_that_is_not_python(tmp_path):
  # The hook loads the package's libspyglass.so.0, which writes the trace at the program's exit.
  logs = str(tmp_path / "logs")
  # (true: a program that ends through exit(), with its stderr open.)
  r = sh(SPYGLASS, "run", "--trace", logs, "--", "true")
  assert r.returncode == 0, r.stderr
  assert "cannot be loaded" not in r.stderr and "spyglass: trace written to " + logs in r.stderr, r.stderr
  assert len(glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))) == 1
