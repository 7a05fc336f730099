#!/usr/bin/env python3
"""Check that an XSpace file (<host>.xplane.pb) opens in the real XProf.

Runs the converters of the pip package `xprof` (the same code the XProf UI
server runs) on one .xplane.pb file, without a browser or server:

  * trace_viewer@           (the trace viewer the UI uses; JSON)
  * overview_page           (JSON DataTables; contains the step-time table)
  * input_pipeline_analyzer (JSON DataTables; per-step breakdown table)
  * trace_viewer            (legacy trace viewer; optional, only reported)

Each conversion runs in a child process so that a converter crash (e.g. a
segfault on a malformed file) is reported as a failure instead of killing
the checker. The input file is copied into a private temporary directory first,
because XProf writes cache files next to the XSpace it converts.

Exit codes: 0 = all checks passed, 1 = a check failed, 77 = xprof not
importable (skip), 2 = bad usage.

Example:
  python3 tests/xprof/xprof_check.py /tmp/log/plugins/profile/RUN/host.xplane.pb \
      --expect-event inner --expect-step "train 1" --json-out /tmp/xprof_out
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_SKIP = 77

# (tool name passed to xspace_to_tool_data, required?)
TOOLS = [
    ("trace_viewer@", True),
    ("overview_page", True),
    ("input_pipeline_analyzer", True),
    ("trace_viewer", False),  # legacy path; may disappear in future xprof
]


def _tool_params(tool: str) -> dict:
  params = {"use_saved_result": False}
  if tool in ("trace_viewer", "trace_viewer@"):
    # resolution 0 = no down-sampling of events (the UI asks for 8000).
    params["trace_viewer_options"] = {
        "resolution": 0,
        "full_dma": True,
        "format": "json",
    }
  return params


def _convert_worker(xspace_path: str, tool: str, out_path: str) -> int:
  """Child-process entry: convert and write the raw tool output to out_path."""
  try:
    from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top
  except Exception as e:  # pylint: disable=broad-except
    sys.stderr.write(f"xprof import failed: {e!r}\n")
    return EXIT_SKIP
  try:
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        [xspace_path], tool, _tool_params(tool))
  except Exception as e:  # pylint: disable=broad-except
    sys.stderr.write(f"XPROF_CHECK_ERROR: converter raised {e!r}\n")
    return 3
  if data is None:
    sys.stderr.write("XPROF_CHECK_ERROR: converter reported failure "
                     "(returned no data)\n")
    return 4
  if isinstance(data, str):
    data = data.encode("utf-8")
  with open(out_path, "wb") as f:
    f.write(data)
  return 0


def _run_tool(xspace_path: str, tool: str, out_path: str, timeout: float,
              verbose: bool) -> tuple[bool, str]:
  cmd = [sys.executable, os.path.abspath(__file__), "--_convert", tool,
         xspace_path, out_path]
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
  except subprocess.TimeoutExpired:
    return False, f"converter timed out after {timeout:.0f}s"
  if verbose and proc.stderr:
    sys.stderr.write(proc.stderr)
  if proc.returncode == 0 and os.path.exists(out_path):
    return True, ""
  if proc.returncode < 0:
    why = f"converter crashed with signal {-proc.returncode}"
  elif proc.returncode == EXIT_SKIP:
    why = "xprof import failed in child process"
  elif proc.returncode == 3:
    why = "converter raised an exception"
  elif proc.returncode == 4:
    why = "converter reported failure (no data returned)"
  else:
    why = f"converter exited with status {proc.returncode}"
  # Drop XProf's routine "no new-style processor, falling back" log noise.
  noise = ("No UnifiedProfileProcessor registered", "No ProfileProcessor registered",
           "falling back to legacy", "Unified processor not found")
  lines = [l for l in proc.stderr.splitlines()
           if l.strip() and not any(n in l for n in noise)]
  marked = [l for l in lines if "XPROF_CHECK_ERROR" in l or l.startswith(("E0", "F0"))]
  tail = (marked or lines)[-8:]
  return False, why + ("\n      " + "\n      ".join(tail) if tail else "")


def _load_json(path: str):
  with open(path, "rb") as f:
    return json.loads(f.read().decode("utf-8"))


def _trace_info(trace) -> tuple[int, set[str], set[str], list[int]]:
  """Returns (#non-metadata events, event names, step names, pids)."""
  if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
    raise ValueError("trace viewer output has no 'traceEvents' list")
  names, steps, pids = set(), set(), set()
  n = 0
  for ev in trace["traceEvents"]:
    if not isinstance(ev, dict) or not ev:
      continue
    if "pid" in ev:
      pids.add(ev["pid"])
    if ev.get("ph") == "M":
      continue
    n += 1
    name = ev.get("name")
    if isinstance(name, str):
      names.add(name)
    args = ev.get("args")
    if isinstance(args, dict) and isinstance(args.get("step_name"), str):
      steps.add(args["step_name"])
  return n, names, steps, sorted(p for p in pids if isinstance(p, int))


def _step_table_names(tables) -> list[str]:
  """Step names from the DataTable(s) having a 'stepnum' column."""
  out = []
  if not isinstance(tables, list):
    return out
  for t in tables:
    if not isinstance(t, dict):
      continue
    cols = [c.get("id") for c in t.get("cols", []) if isinstance(c, dict)]
    if "stepnum" not in cols:
      continue
    idx = cols.index("stepnum")
    for row in t.get("rows", []) or []:
      cells = row.get("c", []) if isinstance(row, dict) else []
      if idx < len(cells) and isinstance(cells[idx], dict):
        v = cells[idx].get("v")
        if v is not None:
          out.append(str(v))
  return out


def main(argv: list[str]) -> int:
  if len(argv) >= 1 and argv[0] == "--_convert":
    if len(argv) != 4:
      return 2
    return _convert_worker(argv[2], argv[1], argv[3])

  ap = argparse.ArgumentParser(
      description="Convert an .xplane.pb with the real XProf and check it.")
  ap.add_argument("xplane", help="path to <host>.xplane.pb")
  ap.add_argument("--expect-event", action="append", default=[],
                  metavar="NAME",
                  help="event name that must appear in the trace viewer")
  ap.add_argument("--expect-step", action="append", default=[],
                  metavar="STEP",
                  help='step name, e.g. "train 5", that must appear in the '
                  "step table or the trace viewer")
  ap.add_argument("--strict-steps", action="store_true",
                  help="each --expect-step must appear in the overview/"
                  "input-pipeline step table AND in the trace viewer")
  ap.add_argument("--json-out", metavar="DIR",
                  help="copy the converter outputs (JSON) into DIR")
  ap.add_argument("--timeout", type=float, default=300.0,
                  help="seconds per conversion (default 300)")
  ap.add_argument("-v", "--verbose", action="store_true",
                  help="show the converter's own log output")
  args = ap.parse_args(argv)

  try:
    import xprof  # pylint: disable=g-import-not-at-top,unused-import
    from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top,unused-import
  except Exception as e:  # pylint: disable=broad-except
    print(f"SKIP: python package 'xprof' is not importable ({e!r}); "
          "install it with `pip install xprof`.")
    return EXIT_SKIP
  try:
    from importlib.metadata import version  # pylint: disable=g-import-not-at-top
    xprof_version = version("xprof")
  except Exception:  # pylint: disable=broad-except
    xprof_version = "?"

  src = os.path.abspath(args.xplane)
  if not os.path.isfile(src):
    print(f"FAIL: no such file: {src}")
    return EXIT_FAIL
  base = os.path.basename(src)
  if not base.endswith(".xplane.pb"):
    print(f"FAIL: file name must end in .xplane.pb (XProf derives the host "
          f"name from it): {base}")
    return EXIT_FAIL

  print(f"xprof {xprof_version}: checking {src} ({os.path.getsize(src)} bytes)")
  failures: list[str] = []
  outputs: dict[str, str] = {}
  with tempfile.TemporaryDirectory(prefix="xprof_check_") as tmp:
    run_dir = os.path.join(tmp, "plugins", "profile", "run")
    os.makedirs(run_dir)
    xspace = os.path.join(run_dir, base)
    shutil.copyfile(src, xspace)
    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir)

    for tool, required in TOOLS:
      out_path = os.path.join(out_dir, tool.replace("@", "_at") + ".json")
      ok, why = _run_tool(xspace, tool, out_path, args.timeout, args.verbose)
      if ok:
        try:
          _load_json(out_path)
        except Exception as e:  # pylint: disable=broad-except
          ok, why = False, f"output is not valid JSON: {e}"
      status = "ok" if ok else ("FAILED" if required else "failed (optional)")
      print(f"  convert {tool:<24} {status}")
      if ok:
        outputs[tool] = out_path
      elif required:
        failures.append(f"conversion '{tool}' failed: {why}")
      else:
        print(f"      note: {why}")

    if args.json_out:
      os.makedirs(args.json_out, exist_ok=True)
      for tool, path in outputs.items():
        shutil.copyfile(path, os.path.join(args.json_out,
                                           os.path.basename(path)))
      print(f"  outputs copied to {os.path.abspath(args.json_out)}")

    # ---- trace viewer -------------------------------------------------
    tv_names: set[str] = set()
    tv_names_ui: set[str] = set()
    tv_steps: set[str] = set()
    for tool in ("trace_viewer@", "trace_viewer"):
      if tool not in outputs:
        continue
      try:
        n, names, steps, pids = _trace_info(_load_json(outputs[tool]))
      except ValueError as e:
        if tool == "trace_viewer@":
          failures.append(f"{tool}: {e}")
        else:
          print(f"  {tool}: {e}")
        continue
      print(f"  {tool}: {n} trace events, {len(names)} distinct names, "
            f"pids {pids}")
      if tool == "trace_viewer@" and n == 0:
        failures.append("trace_viewer@ output contains no trace events")
      tv_names |= names
      if tool == "trace_viewer@":
        tv_names_ui = names
      tv_steps |= steps
    # Grouped step roots are renamed to their step name in the trace viewer
    # (and the legacy viewer also adds args.step_name).
    tv_step_candidates = tv_names | tv_steps

    for ev in args.expect_event:
      if ev in tv_names_ui:
        print(f"  event {ev!r}: found in trace viewer")
      elif ev in tv_names:
        failures.append(f"expected event {ev!r} only in the legacy "
                        "'trace_viewer' output, not in 'trace_viewer@' (UI)")
      else:
        failures.append(f"expected event {ev!r} not found in trace viewer "
                        f"output")

    # ---- step tables --------------------------------------------------
    table_steps: dict[str, list[str]] = {}
    for tool in ("overview_page", "input_pipeline_analyzer"):
      if tool in outputs:
        table_steps[tool] = _step_table_names(_load_json(outputs[tool]))
    for tool, steps in table_steps.items():
      shown = ", ".join(steps[:8]) + (" ..." if len(steps) > 8 else "")
      print(f"  {tool}: {len(steps)} steps in step table"
            + (f": {shown}" if steps else " (empty)"))
    sorted_tv_steps = sorted(s for s in tv_step_candidates
                             if s in tv_steps or _looks_like_step(s))
    if sorted_tv_steps:
      print(f"  trace viewer step names: {', '.join(sorted_tv_steps[:8])}"
            + (" ..." if len(sorted_tv_steps) > 8 else ""))

    all_table_steps = set()
    for steps in table_steps.values():
      all_table_steps |= set(steps)
    for st in args.expect_step:
      where = []
      if st in all_table_steps:
        where.append("step table (" + ", ".join(
            t for t, s in table_steps.items() if st in s) + ")")
      if st in tv_step_candidates:
        where.append("trace viewer")
      if args.strict_steps:
        missing = []
        if st not in all_table_steps:
          missing.append("overview/input-pipeline step table")
        if st not in tv_step_candidates:
          missing.append("trace viewer")
        if missing:
          failures.append(f"expected step {st!r} missing from "
                          + " and ".join(missing))
          continue
      elif not where:
        failures.append(f"expected step {st!r} found neither in the step "
                        "table (overview_page/input_pipeline_analyzer) nor "
                        "in the trace viewer")
        continue
      print(f"  step {st!r}: found in " + " and ".join(where))

  if failures:
    print("FAIL:")
    for f in failures:
      print(f"  - {f}")
    return EXIT_FAIL
  print("PASS")
  return EXIT_OK


def _looks_like_step(name: str) -> bool:
  head, _, tail = name.rpartition(" ")
  return bool(head) and tail.isdigit()


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
