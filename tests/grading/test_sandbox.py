"""The grading sandbox: each test starts real children and watches what they could and could
not do. Namespace tests are skipped (with the probe's reason) where user namespaces do not
work; the fallback tests run everywhere."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kvlab.grading import sandbox as sb
from kvlab.grading.sandbox import Limits

PROBE = sb.probe()
needs_namespaces = pytest.mark.skipif(
    not PROBE.available, reason=f"namespace sandbox unavailable here: {PROBE.reason}"
)
MODES = [pytest.param("namespace", marks=needs_namespaces), "fallback"]
QUICK = Limits(wall_seconds=30)


def run_python(code, work, limits=QUICK, mode="auto", protected=(), **kw):
    """Run ``code`` in a sandboxed Python; return (outcome, stdout, stderr, run)."""
    run = sb.start(
        [sys.executable, "-c", textwrap.dedent(code)],
        work,
        limits,
        protected,
        mode=mode,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )
    out, err = run.process.communicate(timeout=60)
    outcome = run.finish(err.decode())
    return outcome, out.decode(), err.decode(), run


def line_with(lines, word):
    found = [line for line in lines if word in line]
    assert found, f"no line with {word!r} in {lines}"
    return found[0]


# ------------------------------------------------------------------------------- limits


def test_limits_defaults_fit_a_lab_and_bad_values_name_their_field():
    limits = Limits()
    assert limits.memory_bytes == 8 << 30 and limits.cpu_seconds == 600
    assert limits.processes == 256 and limits.open_files == 1024
    assert limits.output_bytes == 64 << 20 and limits.wall_seconds == 900
    assert Limits(memory_bytes=None).memory_bytes is None
    for name, bad in [
        ("memory_bytes", -1),
        ("cpu_seconds", 1.5),
        ("processes", 0),
        ("open_files", 8),
        ("output_bytes", True),
        ("wall_seconds", float("nan")),
        ("wall_seconds", "10"),
    ]:
        with pytest.raises(ValueError, match=f"Limits.{name}"):
            Limits(**{name: bad})
    assert "memory 8 GiB" in limits.describe() and "wall time 900 s" in limits.describe()
    assert "memory unlimited" in Limits(memory_bytes=None).describe()


def test_explain_exit_names_the_limit_from_the_status_alone():
    limits = Limits(cpu_seconds=5, output_bytes=1 << 20, wall_seconds=2)
    assert "CPU time" in sb.explain_exit(-signal.SIGXCPU, limits, 1.0)
    assert "output size" in sb.explain_exit(-signal.SIGXFSZ, limits, 1.0)
    assert "wall time" in sb.explain_exit(-signal.SIGKILL, limits, 2.0)
    assert sb.explain_exit(-signal.SIGKILL, limits, 0.5) is None  # killed, but not by the clock
    assert sb.explain_exit(0, limits, 5.0) is None
    assert sb.explain_exit(1, limits, 5.0) is None
    lines = sb.explain_output("Traceback ...\nMemoryError\n", limits)
    assert len(lines) == 1 and "memory" in lines[0]
    assert "open files" in sb.explain_output("OSError: [Errno 24] Too many open files", limits)[0]
    assert sb.explain_output("all fine", limits) == []


# ----------------------------------------------------------------------------- the probe


def test_probe_is_cached_and_says_why_not():
    assert sb.probe() is PROBE
    assert PROBE.available or PROBE.reason


def test_auto_mode_falls_back_and_says_the_run_had_network(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "probe", lambda: sb.Probe(False, "no user namespaces (test)"))
    pkg = make_protected(tmp_path)
    outcome, out, _, run = run_python("print('ran')", tmp_path / "w", protected=[pkg])
    assert out == "ran\n" and not run.isolated
    assert line_with(run.report, "network:") == (
        "network: ON — unshare unavailable here: no user namespaces (test)"
    )
    assert "checked by content hash" in line_with(run.report, "kvlab package")


# ------------------------------------------------------------------- protected paths


def make_protected(root: Path) -> Path:
    pkg = root / "instructor"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "answers.py").write_text("ANSWER = 42\n")
    (pkg / "sub" / "keep.txt").write_text("keep me\n")
    return pkg


@needs_namespaces
def test_child_cannot_write_or_unmount_a_protected_folder(tmp_path):
    pkg = make_protected(tmp_path)
    before = sb.digest_tree(pkg)
    code = f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        pkg = {str(pkg)!r}
        tries = {{}}
        def attempt(name, fn):
            try:
                fn()
                tries[name] = "done"
            except OSError as err:
                tries[name] = err.strerror
        attempt("write", lambda: open(pkg + "/answers.py", "w").write("ANSWER = 0"))
        attempt("create", lambda: open(pkg + "/new.py", "w"))
        attempt("remove", lambda: os.remove(pkg + "/sub/keep.txt"))
        attempt("chmod", lambda: os.chmod(pkg, 0o777))
        def libc_call(*args):
            if libc.mount(*args) if len(args) == 5 else libc.umount2(*args):
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        target = pkg.encode()
        attempt("umount", lambda: libc_call(target, 2))  # MNT_DETACH
        attempt("remount rw", lambda: libc_call(None, target, None, 32 | 4096, None))
        # A user namespace of its own gives back every capability, but the mounts it inherits
        # are locked: still no way to peel the read-only one off.
        if libc.unshare(0x10000000 | 0x00020000) == 0:
            attempt("umount in a new userns", lambda: libc_call(target, 2))
            attempt("remount rw in a new userns", lambda: libc_call(None, target, None, 32 | 4096, None))
            attempt("write in a new userns", lambda: open(pkg + "/answers.py", "w").write("0"))
        print(json.dumps(tries))
    """
    outcome, out, err, run = run_python(code, tmp_path / "work", protected=[pkg], mode="namespace")
    tries = json.loads(out)
    assert len(tries) == 9, (tries, err)
    assert all(result != "done" for result in tries.values()), tries
    assert tries["write"] == "Read-only file system"
    assert sb.digest_tree(pkg) == before
    assert "read-only" in line_with(run.report, "kvlab package and instructor files")
    assert not outcome.tampered


@needs_namespaces
def test_nothing_outside_the_working_folder_is_writable(tmp_path):
    outside = tmp_path / "judge-writable.txt"
    outside.write_text("grades\n")
    code = f"""
        import json, os
        def write(path):
            try:
                with open(path, "a") as f:
                    f.write("x")
                return "written"
            except OSError as err:
                return err.strerror
        print(json.dumps({{
            "outside": write({str(outside)!r}),
            "next to the working folder": write("../new.txt"),
            "working folder": write("mine.txt"),
            "dev": sorted(os.listdir("/dev")),
        }}))
    """
    # private_tmp off: the judge's /tmp stays visible, and must still be read-only
    _, out, err, run = run_python(code, tmp_path / "work", mode="namespace", private_tmp=False)
    got = json.loads(out)
    assert got["outside"] == got["next to the working folder"] == "Read-only file system", err
    assert got["working folder"] == "written"
    assert outside.read_text() == "grades\n" and not (tmp_path / "new.txt").exists()
    allowed = {"null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout"}
    allowed |= {"stderr", "shm", "pts", "ptmx", "dri", "kfd"}
    assert {d for d in got["dev"] if not d.startswith("nvidia")} <= allowed  # no disks
    assert line_with(run.report, "file system:").startswith("file system: read-only but")


@pytest.mark.parametrize("mode", MODES)
def test_a_change_to_a_protected_folder_is_reverted_and_fails_the_submission(tmp_path, mode):
    pkg = make_protected(tmp_path)
    before = sb.digest_tree(pkg)
    code = f"""
        import os
        pkg = {str(pkg)!r}
        for name, act in [
            ("edit", lambda: open(pkg + "/answers.py", "w").write("ANSWER = 0\\n")),
            ("add", lambda: open(pkg + "/sub/evil.py", "w").write("x")),
            ("delete", lambda: os.remove(pkg + "/sub/keep.txt")),
            ("lock", lambda: os.chmod(pkg + "/sub", 0)),
        ]:
            try:
                act()
            except OSError as err:
                print(name, err.strerror)
    """
    outcome, out, _, run = run_python(
        code, tmp_path / "work", mode=mode, protected=[pkg], verify=True
    )
    assert sb.digest_tree(pkg) == before  # read-only, or put back
    if mode == "fallback":
        assert out == ""  # every change went through...
        assert outcome.tampered  # ...was seen...
        changed = line_with(outcome.lines, "CHANGED")
        assert "reverted" in changed and "NOT" not in changed
        assert "answers.py" in changed and "sub/evil.py" in changed and "sub/keep.txt" in changed
        assert "this submission fails" in outcome.lines[-1]
    else:
        assert out.count("Read-only file system") == 4 and not outcome.tampered


def test_importing_a_protected_package_is_not_a_change(tmp_path):
    pkg = make_protected(tmp_path)
    code = f"import sys; sys.path.insert(0, {str(pkg)!r}); import answers; print(answers.ANSWER)"
    outcome, out, _, _ = run_python(code, tmp_path / "work", mode="fallback", protected=[pkg])
    assert out == "42\n"
    assert not outcome.tampered and not (pkg / "__pycache__").exists()


def test_the_guard_restores_a_tree_whose_permissions_were_taken(tmp_path):
    pkg = make_protected(tmp_path)
    guard = sb.TreeGuard.take([pkg], tmp_path)
    assert guard.verify_and_restore() == []
    (pkg / "sub" / "keep.txt").write_text("changed\n")
    os.chmod(pkg / "sub", 0)
    lines = guard.verify_and_restore()
    assert len(lines) == 1 and "reverted" in lines[0]
    assert (pkg / "sub" / "keep.txt").read_text() == "keep me\n"
    assert sb.digest_tree(pkg) == guard.digests[pkg]
    guard.close()
    assert not guard.backup.exists()


# ----------------------------------------------------------------------------- network


def connect_code(port):
    return f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
            print("connected")
        except OSError as err:
            print("refused:", err)
    """


@pytest.fixture
def listener():
    """A TCP listener on this machine's loopback, outside any sandbox."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


@pytest.mark.parametrize("loopback", [False, True])
@needs_namespaces
def test_no_network_inside_even_to_this_machine(tmp_path, listener, loopback):
    outcome, out, _, run = run_python(
        connect_code(listener), tmp_path / "ns", mode="namespace", loopback=loopback
    )
    assert out.startswith("refused:"), out
    assert line_with(run.report, "network:").startswith("network: none (network namespace")
    # the same child outside the namespace does reach the listener: the test can fail
    _, out, _, run = run_python(connect_code(listener), tmp_path / "fb", mode="fallback")
    assert out == "connected\n"
    assert line_with(run.report, "network:").startswith("network: ON")


@needs_namespaces
def test_loopback_inside_is_the_runs_own(tmp_path):
    code = """
        import socket
        server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
        socket.create_connection(server.getsockname(), timeout=3).close()
        print("own loopback works")
    """
    _, out, err, _ = run_python(code, tmp_path / "w", mode="namespace", loopback=True)
    assert out == "own loopback works\n", err


@needs_namespaces
def test_host_tmp_and_its_unix_sockets_are_hidden(tmp_path):
    host_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="kvlab-host-"))
    path = host_dir / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    code = f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(path)!r}); print("connected")
        except OSError as err:
            print("hidden:", err.strerror)
    """
    try:
        _, out, _, run = run_python(code, tmp_path / "ns", mode="namespace")
        assert out == "hidden: No such file or directory\n"
        assert "/tmp" in line_with(run.report, "hidden")
        _, out, _, _ = run_python(code, tmp_path / "fb", mode="fallback")
        assert out == "connected\n"
    finally:
        server.close()
        path.unlink()
        host_dir.rmdir()


# -------------------------------------------------------------------------- the limits


@pytest.mark.parametrize("mode", MODES)
def test_cpu_time_limit_is_hit_and_explained(tmp_path, mode):
    limits = Limits(cpu_seconds=1, wall_seconds=30)
    outcome, _, _, run = run_python("while True: pass", tmp_path / "w", limits, mode)
    # SIGXCPU and the CPU limit named, not the 30 s wall limit: stopped by its CPU time (wall
    # time, which a busy machine stretches, is not asserted). The kernel charges RLIMIT_CPU by
    # ticks and rusage reports precise time: on a loaded machine they part by a tenth or more
    assert outcome.returncode == -signal.SIGXCPU
    assert 0.5 <= outcome.cpu_seconds < 3
    assert outcome.limits_hit == ("cpu_seconds",)
    assert "CPU time limit hit" in line_with(outcome.lines, "CPU time")
    assert "CPU time" in sb.explain_exit(outcome.returncode, limits, outcome.elapsed)
    assert "CPU time 1 s per process" in line_with(run.report, "limits:")


@pytest.mark.parametrize("mode", MODES)
def test_file_size_limit_is_hit_and_explained(tmp_path, mode):
    limits = Limits(output_bytes=1 << 20, wall_seconds=30)
    write = "open('big', 'wb').write(b'0' * (2 << 20))"
    # Python ignores SIGXFSZ, so the write fails with "File too large"
    outcome, _, err, _ = run_python(write, tmp_path / "w", limits, mode)
    assert "File too large" in err and outcome.returncode == 1
    assert "output_bytes" in outcome.limits_hit
    assert "output size limit hit" in line_with(outcome.lines, "output size")
    assert (tmp_path / "w" / "big").stat().st_size <= 1 << 20
    # a program with the default action dies of SIGXFSZ (the shim, a Python program, must not
    # pass on its own ignored SIGXFSZ)
    (tmp_path / "w2").mkdir()
    with open(tmp_path / "w2" / "big", "wb") as sink:
        run = sb.start(
            ["head", "-c", str(2 << 20), "/dev/zero"],
            tmp_path / "w2",
            limits,
            mode=mode,
            stdout=sink,
        )
        outcome = run.finish(timeout=30)
    assert outcome.returncode == -signal.SIGXFSZ
    assert outcome.limits_hit == ("output_bytes",)
    assert "output size" in sb.explain_exit(outcome.returncode, limits, outcome.elapsed)


@pytest.mark.parametrize("mode", MODES)
def test_wall_time_kills_the_child_and_a_grandchild_it_forked(tmp_path, mode):
    work = tmp_path / "w"
    # In namespace mode the grandchild even leaves the process group: only the PID namespace
    # can catch it.
    escape = "os.setsid()" if mode == "namespace" else "pass"
    code = f"""
        import os, time
        if os.fork() == 0:
            {escape}
            open("started", "w").close()
            time.sleep(2)
            open("late", "w").close()
            os._exit(0)
        time.sleep(60)
    """
    limits = Limits(wall_seconds=1.0)
    outcome, _, _, _ = run_python(code, work, limits, mode)
    # killed (the child's own end, after its 60 s sleep, is exit status 0) by the wall limit
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.limits_hit == ("wall_seconds",)
    assert "wall time limit hit" in outcome.lines[1]
    assert "wall time" in sb.explain_exit(outcome.returncode, limits, outcome.elapsed)
    assert (work / "started").exists()  # the grandchild did run...
    wrote = (work / "started").stat().st_mtime
    time.sleep(max(0.0, wrote + 2.4 - time.time()))
    assert not (work / "late").exists()  # ...and died with the run


@pytest.mark.parametrize("mode", MODES)
def test_a_judge_killing_the_process_group_stops_everything(tmp_path, mode):
    """What a judge holding only the Popen does: killpg(process.pid) reaches the whole run."""
    work = tmp_path / "w"
    code = """
        import os, time
        if os.fork() == 0:
            open("started", "w").close()
            time.sleep(1.5)
            open("late", "w").close()
            os._exit(0)
        time.sleep(60)
    """
    launch = sb.launcher(QUICK, mode=mode)
    work.mkdir()
    process = launch([sys.executable, "-c", textwrap.dedent(code)], (), work, None)
    deadline = time.monotonic() + 20
    while not (work / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(5) == -signal.SIGKILL
    assert process.sandbox.finish().returncode == -signal.SIGKILL
    time.sleep(max(0.0, (work / "started").stat().st_mtime + 1.9 - time.time()))
    assert not (work / "late").exists()


def processes_limited(run) -> bool:
    return "NOT limited" not in line_with(run.report, "processes:")


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_loop_stops_at_the_process_limit(tmp_path, mode):
    # Safe if the limit failed: 40 children that sleep for 2 s and exit.
    code = """
        import os, time
        started = 0
        try:
            for _ in range(40):
                if os.fork() == 0:
                    time.sleep(2)
                    os._exit(0)
                started += 1
        except OSError as err:
            print(started, err.strerror)
            raise
        print(started)
    """
    limits = Limits(processes=12, wall_seconds=30)
    outcome, out, err, run = run_python(code, tmp_path / "w", limits, mode)
    if not processes_limited(run):
        pytest.skip(line_with(run.report, "processes:"))
    started = int(out.split()[0])
    assert started < 12, (out, err)
    assert "Resource temporarily unavailable" in out
    assert outcome.limits_hit == ("processes",)
    assert "processes limit hit" in line_with(outcome.lines, "processes")


@pytest.mark.parametrize("mode", MODES)
def test_open_files_limit_is_hit_and_explained(tmp_path, mode):
    code = """
        files = []
        try:
            while len(files) < 1000:
                files.append(open("f", "w"))
        finally:
            print(len(files))
    """
    outcome, out, err, _ = run_python(code, tmp_path / "w", Limits(open_files=32), mode)
    assert int(out) < 32 and "Too many open files" in err
    assert outcome.limits_hit == ("open_files",)
    assert "open files limit hit" in line_with(outcome.lines, "open files")


@pytest.mark.parametrize("mode", MODES)
def test_memory_limit_is_hit_and_explained(tmp_path, mode):
    code = "x = bytearray(384 << 20)"
    limits = Limits(memory_bytes=256 << 20)
    outcome, _, err, _ = run_python(code, tmp_path / "w", limits, mode)
    assert "MemoryError" in err
    assert outcome.limits_hit == ("memory_bytes",)
    assert "256 MiB" in line_with(outcome.lines, "memory limit hit")
    # and the same child fits under a higher limit: the test can fail
    outcome, _, _, _ = run_python(code, tmp_path / "w2", Limits(memory_bytes=1 << 30), mode)
    assert outcome.returncode == 0 and outcome.limits_hit == ()


# ---------------------------------------------------------------- what the judge relies on


@pytest.mark.parametrize("mode", MODES)
def test_pipes_and_passed_fds_reach_the_child_and_nothing_else_holds_them(tmp_path, mode):
    read_end, write_end = os.pipe()
    code = f"""
        import os, sys, time
        line = sys.stdin.readline()
        sys.stdout.write(line.upper()); sys.stdout.flush()
        os.write({write_end}, b"result")
        os.close({write_end})
        time.sleep(1.0)
    """
    run = sb.start(
        [sys.executable, "-I", "-c", textwrap.dedent(code)],
        tmp_path / "w",
        QUICK,
        mode=mode,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=[write_end],
    )
    os.close(write_end)
    with run:
        run.process.stdin.write(b"hello\n")
        run.process.stdin.flush()
        assert run.process.stdout.readline() == b"HELLO\n"
        # EOF on the passed pipe as soon as the child closes it: the shim and init hold no copy
        got, deadline = b"", time.monotonic() + 0.6
        with selectors.DefaultSelector() as sel:
            sel.register(read_end, selectors.EVENT_READ)
            while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
                chunk = os.read(read_end, 100)
                if not chunk:
                    break
                got += chunk
            else:
                pytest.fail("no EOF on the passed pipe while the child still runs")
        assert got == b"result" and run.process.poll() is None
        assert run.wait(10) == 0
    os.close(read_end)
    assert run.finish().returncode == 0


@pytest.mark.parametrize("mode", MODES)
def test_working_folder_environment_and_exit_status(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("KVLAB_JUDGE_SECRET", "answer key path")
    work = tmp_path / "new" / "work"
    code = """
        import json, os, sys
        print(json.dumps([os.getcwd(), os.environ.get("HOME"), os.environ.get("TMPDIR"),
                          "KVLAB_JUDGE_SECRET" in os.environ, sys.dont_write_bytecode]))
        sys.exit(7)
    """
    outcome, out, _, run = run_python(code, work, mode=mode)
    assert json.loads(out) == [str(work), str(work), str(work), False, True]
    assert outcome.returncode == 7 == run.process.returncode and outcome.limits_hit == ()
    assert outcome.lines[0].startswith("ended: exit status 7 after")
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    outcome, _, _, _ = run_python(code, work, mode=mode)
    assert outcome.returncode == -signal.SIGTERM
    assert outcome.lines[0].startswith("ended: killed by SIGTERM")


@pytest.mark.parametrize("mode", MODES)
def test_a_missing_command_raises_like_popen(tmp_path, mode):
    with pytest.raises(FileNotFoundError):
        sb.start(["/no/such/program"], tmp_path / "w", QUICK, mode=mode)


def test_kill_stops_the_tree(tmp_path):
    run = sb.start([sys.executable, "-I", "-c", "import time; time.sleep(60)"], tmp_path, QUICK)
    run.kill()
    outcome = run.finish()
    # a signal, not the sleep's own end (exit status 0): kill() stopped it
    assert outcome.returncode in (-signal.SIGTERM, -signal.SIGKILL)
    assert outcome.limits_hit == ()


def test_bad_arguments_are_refused(tmp_path):
    pkg = make_protected(tmp_path)
    with pytest.raises(ValueError, match="inside the protected path"):
        sb.start(["true"], pkg / "work", QUICK, [pkg])
    with pytest.raises(ValueError, match="does not exist"):
        sb.start(["true"], tmp_path / "w", QUICK, [tmp_path / "missing"])
    with pytest.raises(ValueError, match="mode"):
        sb.start(["true"], tmp_path / "w", QUICK, mode="vm")


@pytest.mark.parametrize("mode", MODES)
def test_report_lines_say_what_the_sandbox_did(tmp_path, mode):
    pkg = make_protected(tmp_path)
    _, _, _, run = run_python("pass", tmp_path / "w", Limits(), mode, protected=[pkg])
    report = run.report
    assert line_with(report, "sandbox:").startswith(
        "sandbox: Linux namespaces" if mode == "namespace" else "sandbox: fallback"
    )
    protected_line = line_with(report, "kvlab package and instructor files:")
    network_line = line_with(report, "network:")
    if mode == "namespace":
        assert network_line == "network: none (network namespace)"
        assert protected_line == f"kvlab package and instructor files: read-only ({pkg})"
    else:
        assert network_line.startswith("network: ON — ")
        assert "checked by content hash" in protected_line
    assert line_with(report, "processes:").startswith("processes: ")
    assert line_with(report, "limits:") == f"limits: {Limits().describe()}"
