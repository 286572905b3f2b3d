"""JupyterLab in headless Chromium, for the widget's browser test and the README picture.

Debian's ``chromium`` (apt-get), driven by Playwright-Python; never ``playwright install``.
JupyterLab runs with test settings: every cell stays in the DOM (``windowingMode: none``), no news.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cpu_limit
import nbformat

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VENV_BIN = Path(sys.executable).parent

KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle';
}"""


def why_not() -> str | None:
    """Why the browser cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return "Debian's chromium is not installed (make test installs it where apt-get and root allow)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_settings(settings_dir: Path) -> None:
    """JupyterLab settings for tests: every cell stays in the DOM, no news toast."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }
    for name, content in files.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))


@contextmanager
def jupyter_lab(
    workdir: Path,
    cells: list,
    kernel: str = "kvlab",
    env: dict | None = None,
    metadata: dict | None = None,
    trusted: bool = False,
) -> Iterator[str]:
    """A JupyterLab server on a notebook of ``cells``; yields the notebook's URL (with token).

    A cell is its source, or a code cell with saved outputs (``metadata`` adds to the notebook's,
    widget state for one). ``trusted`` signs the notebook, as JupyterLab signs what it saves, so its
    saved outputs render as trusted when it opens (the signatures live in ``workdir``).

    By default the notebook runs in the learner's `kvlab` kernel, with the environment the user's
    shell gave (never the TRITON_INTERPRET that kvlab set in the calling process)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) if isinstance(c, str) else c for c in cells]
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nb.metadata.update(metadata or {})
    extra = {}
    if trusted:
        from nbformat.sign import NotebookNotary

        (workdir / "data").mkdir(exist_ok=True)
        extra["JUPYTER_DATA_DIR"] = str(workdir / "data")
        NotebookNotary(data_dir=extra["JUPYTER_DATA_DIR"]).sign(nb)
    nbformat.write(nb, workdir / "hotel.ipynb")
    write_settings(workdir / "settings")
    port, token = free_port(), "kvlab-browser-" + os.urandom(8).hex()
    from kvlab.ops.runtime import child_environ

    base = child_environ() if env is None else env
    env = {**base, **extra, "JUPYTER_RUNTIME_DIR": str(workdir / "runtime")}
    cmd = [
        str(VENV_BIN / "jupyter"),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={workdir}",
        f"--LabApp.user_settings_dir={workdir / 'settings'}",
        f"--LabApp.workspaces_dir={workdir / 'workspaces'}",
        "--allow-root",
        "--LabApp.expose_app_in_browser=True",
    ]
    log_path = workdir / "lab.log"
    with open(log_path, "w") as log:
        # the server (and its kernels) held to CPU-seconds, not to a wall-clock wait
        proc = cpu_limit.popen(
            cmd,
            cpu=900,
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # up within 90 CPU-s (a wall backstop of 10 x)
            cpu_limit.until(proc, lambda: f":{port}/" in log_path.read_text(), "jupyter lab", 90)
            yield f"http://127.0.0.1:{port}/lab/tree/hotel.ipynb?token={token}"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def run_all(page, url: str, hotels: int, errors: list[str], failure_png: Path, opened=None) -> None:
    """Open the notebook, run every cell, and wait until ``hotels`` floor plans are drawn.

    ``opened(page)``, if given, looks at the notebook as it opened (its saved outputs) first."""
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    step = "open"  # or "look" (opened), then "run"
    try:
        page.wait_for_function(KERNEL_IDLE, timeout=90_000)
        if opened:
            step = "look"
            opened(page)
        step = "run"
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(
            f"document.querySelectorAll('.kvh').length === {hotels}", timeout=120_000
        )
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    except Exception:
        failure_png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(failure_png))
        if step == "look":
            raise
        raise AssertionError(f"the widgets did not render; console errors: {errors[:10]}") from None


def show_file_browser(page, shown: bool = True) -> None:
    """Open (or close) JupyterLab's file browser in the left sidebar, as a learner has it."""
    page.evaluate(
        """(shown) => {
          const shell = window.jupyterapp.shell;
          if (shown) { shell.activateById('filebrowser'); shell.expandLeft(); }
          else { shell.collapseLeft(); }
        }""",
        shown,
    )
    page.wait_for_timeout(400)
