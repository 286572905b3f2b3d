"""`make lab` serves JupyterLab on 127.0.0.1 with a token, opening Lab 00, without hanging headless."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.request

import cpu_limit
import pytest
from conftest import LEARNER_ENV, ROOT, VENV_BIN

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def installed_from() -> str:
    """Where this venv's kvlab comes from, asked from outside any checkout and without PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = cpu_limit.run(
        [VENV_BIN / "python", "-c", "import kvlab; print(kvlab.__file__)"],
        cpu=60,
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
    )
    return run.stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_lab_00(tmp_path):
    # `make lab` in ROOT may reinstall this venv's kvlab from ROOT: never re-point another checkout's
    where = installed_from()
    if not where.startswith(str(ROOT)):
        pytest.skip(f"this venv's kvlab is installed from {where or 'nowhere'}, not {ROOT}")
    port = free_port()
    env = {k: v for k, v in LEARNER_ENV.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path)
    log = tmp_path / "lab.log"
    venv = VENV_BIN.parent
    with open(log, "w") as out:
        proc = cpu_limit.popen(
            ["make", "lab", f"LAB_PORT={port}", f"VENV={venv}"],
            cpu=600,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def printed_url():
            found = re.search(rf"http://127\.0\.0\.1:{port}/lab\S*\?token=(\w+)", log.read_text())
            return found.group(0) if found else None

        # up within 120 CPU-s of make and JupyterLab (a wall backstop of 10 x), not 120 s
        cpu_limit.until(proc, printed_url, f"make lab (log: {log})", cpu=120, poll=0.5)
        url = printed_url()
        token = re.search(r"token=(\w+)", url).group(1)
        assert len(token) >= 32
        assert "/lab/tree/labs/00_why_kv_cache.ipynb" in url, url

        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/api/kernelspecs")[0] == 403, "the server must require the token"
        status, body = get(f"{base}/api/kernelspecs?token={token}")
        assert status == 200 and "kvlab" in json.loads(body)["kernelspecs"]
        status, body = get(f"{base}/api/contents/labs/00_why_kv_cache.ipynb?token={token}")
        assert status == 200 and json.loads(body)["type"] == "notebook"
        assert get(f"{base}/lab/tree/labs/00_why_kv_cache.ipynb?token={token}")[0] == 200
        # no "Would you like to get notified about official Jupyter news?" toast over the outputs
        plugin = "@jupyterlab/apputils-extension:notification"
        status, body = get(f"{base}/lab/api/settings/{plugin}?token={token}")
        assert status == 200, body
        # overrides.json becomes the schema's defaults (a learner's own choice would still win)
        defaults = {
            k: v.get("default") for k, v in json.loads(body)["schema"]["properties"].items()
        }
        assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults
        assert proc.poll() is None, "JupyterLab stopped on its own (tried to open a browser?)"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """End make and the JupyterLab it started (they share a session)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
