"""Remote capture against the real peers (JAX and XProf). Fails, never skips,
when a peer cannot capture.

  interop.py server_interop_jax_collect   ANNOTATING_SERVER SPYGLASS_CLI
      python -m jax.collect_profile captures a Spyglass C++ program.
  interop.py server_interop_collect_jax   ANNOTATING_SERVER SPYGLASS_CLI
      spyglass collect captures a JAX program (jax.profiler.start_server);
      XProf's converter opens the result.
  interop.py server_interop_xprof_capture ANNOTATING_SERVER SPYGLASS_CLI
      XProf's CAPTURE PROFILE route (capture_route_impl) captures a Spyglass program.
"""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def start_annotating_server(binary, name):
    p = subprocess.Popen([binary, "0", "--name", name, "--seconds", "100"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("PORT "):
        p.kill()
        fail("annotating_server did not start: %r" % line)
    return p, int(line.split()[1])


def xplanes(log_dir):
    return glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb"))


def event_names(path, plane_name="/host:CPU"):
    """Event names of a plane, read with jaxlib's own XSpace reader."""
    from jax.profiler import ProfileData
    with open(path, "rb") as f:
        data = ProfileData.from_serialized_xspace(f.read())
    names = set()
    plane = data.find_plane_with_name(plane_name)
    if plane is None:
        return names
    for line in plane.lines:
        for e in line.events:
            names.add(e.name)
    return names


def jax_collect(server_bin, cli):
    proc, port = start_annotating_server(server_bin, "spyglass_loop_step")
    try:
        log_dir = tempfile.mkdtemp(prefix="spyglass-jaxcollect-")
        r = subprocess.run([sys.executable, "-m", "jax.collect_profile", str(port), "500",
                            "--log_dir", log_dir, "--no_perfetto_link"],
                           capture_output=True, text=True, timeout=90)
        print(r.stdout, r.stderr)
        if r.returncode != 0:
            fail("jax.collect_profile exited with %d" % r.returncode)
        files = xplanes(log_dir)
        if len(files) != 1:
            fail("expected one xplane.pb, found %r" % files)
        if not os.path.basename(files[0]) == "127.0.0.1_%d.xplane.pb" % port:
            fail("unexpected file name " + files[0])
        names = event_names(files[0])
        if "spyglass_loop_step" not in names:
            fail("annotations missing from the capture: %r" % sorted(names)[:20])
        remote = glob.glob(os.path.join(os.path.dirname(files[0]), "remote.trace.json.gz"))
        if not remote:
            fail("jax.collect_profile did not convert the capture with XProf")
    finally:
        proc.kill()
        proc.wait()


JAX_PROGRAM = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp
    port = int(sys.argv[1])
    jax.profiler.start_server(port)
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    x = jnp.ones((128, 128))
    f(x).block_until_ready()
    print("READY", flush=True)
    end = time.time() + 80
    step = 0
    while time.time() < end:
        with jax.profiler.StepTraceAnnotation("jax_train", step_num=step):
            with jax.profiler.TraceAnnotation("jax_user_annotation"):
                f(x).block_until_ready()
        step += 1
        time.sleep(0.002)
""")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def collect_jax(server_bin, cli):
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", JAX_PROGRAM, str(port)], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        if line != "READY":
            fail("the JAX program did not start: %r" % line)
        log_dir = tempfile.mkdtemp(prefix="spyglass-collectjax-")
        t0 = time.time()
        r = subprocess.run([cli, "collect", str(port), "500", "--log_dir", log_dir, "--no_perfetto_link"],
                           capture_output=True, text=True, timeout=90)
        print(r.stdout, r.stderr)
        if r.returncode != 0:
            fail("spyglass collect exited with %d" % r.returncode)
        files = xplanes(log_dir)
        if len(files) != 1:
            fail("expected one xplane.pb, found %r" % files)
        run = os.path.dirname(files[0])
        if not glob.glob(os.path.join(run, "*.trace.json.gz")):
            fail("no trace JSON written")
        names = event_names(files[0])
        for want in ("jax_user_annotation", "jax_train"):
            if want not in names:
                fail("%s missing from the capture; events: %r" % (want, sorted(names)[:30]))
        if len(names) < 3:
            fail("JAX's own events missing: %r" % sorted(names))
        from xprof.convert import raw_to_tool_data as convert
        data, _ = convert.xspace_to_tool_data([files[0]], "trace_viewer", {})
        if isinstance(data, bytes):
            data = data.decode()
        if "jax_user_annotation" not in data:
            fail("XProf's converter does not show the annotation")
        print("captured in %.1f s, %d distinct events" % (time.time() - t0, len(names)))
    finally:
        proc.kill()
        proc.wait()


def xprof_capture(server_bin, cli):
    proc, port = start_annotating_server(server_bin, "xprof_captured_step")
    try:
        from werkzeug.test import EnvironBuilder
        from werkzeug.wrappers import Request
        from xprof import profile_plugin
        log_dir = tempfile.mkdtemp(prefix="spyglass-xprofcapture-")
        plugin = profile_plugin.ProfilePlugin.__new__(profile_plugin.ProfilePlugin)
        plugin.logdir = log_dir  # what `xprof --logdir` sets
        plugin._tf_profiler = None
        env = EnvironBuilder(path="/data/plugin/profile/capture_profile",
                             query_string={"service_addr": "grpc://127.0.0.1:%d" % port,
                                           "duration": "500"}).get_environ()
        resp = plugin.capture_route_impl(Request(env))
        raw = resp.get_data()
        if raw[:2] == b"\x1f\x8b":  # XProf gzips its replies
            import gzip
            raw = gzip.decompress(raw)
        body = json.loads(raw.decode())
        print(resp.status_code, body)
        if resp.status_code != 200 or "result" not in body:
            fail("XProf's capture failed: %r" % body)
        files = xplanes(log_dir)
        if len(files) != 1:
            fail("expected one xplane.pb, found %r" % files)
        if "xprof_captured_step" not in event_names(files[0]):
            fail("annotations missing from XProf's capture")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    mode, server_bin, cli = sys.argv[1], sys.argv[2], sys.argv[3]
    {"server_interop_jax_collect": jax_collect,
     "server_interop_collect_jax": collect_jax,
     "server_interop_xprof_capture": xprof_capture}[mode](server_bin, cli)
    print("PASS")
