"""`python -m spyglass run`: everything from the script (or -m MODULE) on is
the program's, its flags too, whether or not they look like run's own
(-o, --trace, --python-allocator), with and without `--`."""
import json
import subprocess
import sys

ARGV_SCRIPT = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"
PROGRAM_ARGS = ["-o", "x", "-r", "--trace", "t", "--python-allocator", "bogus", "--", "-m", "y"]


def run(*args, cwd=None):
  return subprocess.run([sys.executable, "-m", "spyglass", "run", *args], capture_output=True, text=True,
                        timeout=120, cwd=cwd)


def printed_argv(p):
  assert p.returncode == 0, p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_scripts_flags_are_the_scripts(tmp_path):
  script = tmp_path / "show_argv.py"
  script.write_text(ARGV_SCRIPT)
  out = str(tmp_path / "mem")
  for flags in (["-o", out], ["-o", out, "--"], ["--out=" + out, "--sample-bytes", "4096"]):
    assert printed_argv(run(*flags, str(script), *PROGRAM_ARGS)) == PROGRAM_ARGS, flags


def test_a_modules_flags_are_the_modules(tmp_path):
  (tmp_path / "show_argv_mod.py").write_text(ARGV_SCRIPT)
  out = str(tmp_path / "mem")
  assert printed_argv(run("-o", out, "-m", "show_argv_mod", *PROGRAM_ARGS, cwd=tmp_path)) == PROGRAM_ARGS


def test_run_flags_before_the_script_are_still_checked(tmp_path):
  script = tmp_path / "show_argv.py"
  script.write_text(ARGV_SCRIPT)
  p = run("--python-allocator", "bogus", str(script), "-o", "x")
  assert p.returncode == 2 and "--python-allocator" in p.stderr and not p.stdout
  p = run("--bogus", str(script))
  assert p.returncode == 2 and "unknown flag" in p.stderr and not p.stdout
