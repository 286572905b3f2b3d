"""The hotel widget in a real browser: JupyterLab + headless Chromium, driven by Playwright."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, VENV_BIN

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("KVLAB_ARTIFACTS", ROOT / "tests" / "artifacts"))

SMALL_HOTEL = """\
from kvlab.paged import BlockManager

m = BlockManager(num_blocks=64, block_size=4, record=True)
for i in range(6):
    m.allocate(f"g{i}", 3 + 2 * i)
for _ in range(10):
    for i in range(6):
        m.append_slot(f"g{i}")
    m.snapshot()
m.fork("g0", "g0-copy")
m.append_slot("g0-copy")
m.free("g3")
"""

NOTEBOOK = [
    SMALL_HOTEL
    + """\
from kvlab.widgets import animate

small = animate(m.trace, title="browser test hotel", interval_ms=100)
small""",
    """\
import random
rng = random.Random(0)
big_manager = BlockManager(num_blocks=2000, block_size=16, record=True)
alive = []
while len(big_manager.trace.frames) < 500:
    if alive and (rng.random() < 0.45 or big_manager.num_free_blocks < 40):
        big_manager.free(alive.pop(rng.randrange(len(alive))))
    else:
        name = f"r{len(big_manager.trace.frames)}"
        big_manager.allocate(name, rng.randint(16, 600))
        alive.append(name)
big = animate(big_manager.trace, title="2,000 rooms x 500 frames", interval_ms=50)
big""",
]


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


@pytest.fixture
def lab_server(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(
            "Debian's chromium is not installed (make test installs it where apt-get and root allow)"
        )
    pytest.importorskip("playwright")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "hotel.ipynb")
    write_settings(tmp_path / "settings")
    port, token = free_port(), "kvlab-browser-test-" + os.urandom(8).hex()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    cmd = [
        str(VENV_BIN / "jupyter"),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={tmp_path}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        "--allow-root",
        "--LabApp.expose_app_in_browser=True",
    ]
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 90
    while time.time() < deadline and f":{port}/" not in (tmp_path / "lab.log").read_text():
        assert proc.poll() is None, (tmp_path / "lab.log").read_text()
        time.sleep(0.3)
    yield f"http://127.0.0.1:{port}", token
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle';
}"""

BOOKED_AT_STEP = """(index) => {
  const root = document.querySelectorAll('.kvh')[index];
  return {step: Number(root.dataset.step),
          booked: [...root.querySelectorAll('.kvh-room.kvh-booked')].map(c => Number(c.dataset.room)),
          shared: root.querySelectorAll('.kvh-room.kvh-shared').length};
}"""


def test_hotel_widget_in_jupyterlab(lab_server):
    from playwright.sync_api import sync_playwright

    from kvlab.widgets.frames import encode, room_states

    # the same trace the notebook builds, to know what the browser must show
    scope: dict = {}
    exec(SMALL_HOTEL, scope)
    m = scope["m"]
    data = encode(m.trace)
    booked = [
        sorted(r for r, s in enumerate(room_states(data, step)) if s[0] >= 0)
        for step in range(len(data["frames"]))
    ]

    base, token = lab_server
    errors: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/lab/tree/hotel.ipynb?token={token}")
        try:
            page.wait_for_function(KERNEL_IDLE, timeout=90_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                "document.querySelectorAll('.kvh').length === 2", timeout=120_000
            )
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"))
            raise AssertionError(
                f"the widgets did not render; console errors: {errors[:10]}"
            ) from None

        small = page.locator(".kvh").nth(0)
        assert small.locator(".kvh-room").count() == 64
        assert small.locator(".kvh-title").inner_text() == "browser test hotel"
        state = page.evaluate(BOOKED_AT_STEP, 0)
        assert state["step"] == 0 and state["booked"] == booked[0] == []

        # move the slider to the last step through the linked Play/slider: rooms follow the trace
        last = len(data["frames"]) - 1
        page.locator(".widget-play button").nth(0).click()
        page.wait_for_function(
            f"Number(document.querySelectorAll('.kvh')[0].dataset.step) === {last}", timeout=30_000
        )
        state = page.evaluate(BOOKED_AT_STEP, 0)
        assert state["booked"] == booked[last]
        assert state["shared"] == sum(1 for s in room_states(data, last) if s[2] > 1) > 0
        guests_shown = small.locator(".kvh-card").count()
        assert guests_shown == len(data["frames"][last]["cards"]) == 6  # g3 left, g0-copy joined

        # clicking a guest's key card highlights their rooms
        small.locator(".kvh-card[data-guest='g1']").click()
        page.wait_for_function(
            "document.querySelectorAll('.kvh')[0].querySelectorAll('.kvh-picked').length > 0"
        )
        g1_rooms = len([1 for s in room_states(data, last) if s[0] == data["guests"].index("g1")])
        assert small.locator(".kvh-room.kvh-picked").count() == g1_rooms
        small.screenshot(path=str(ARTIFACTS / "hotel_widget.png"))

        # the big hotel: play it and measure how long each step takes to render
        big = page.locator(".kvh").nth(1)
        assert big.locator(".kvh-room").count() == 2000
        page.locator(".widget-play").nth(1).locator("button").nth(0).click()
        time.sleep(6)
        big_state = page.evaluate(
            "() => { const r = document.querySelectorAll('.kvh')[1]; return {draws: Number(r.dataset.draws), max: Number(r.dataset.maxStepMs), last: Number(r.dataset.lastRenderMs)}; }"
        )
        browser.close()

    widget_errors = [e for e in errors if re.search(r"widget|kvh|anywidget|hotel", e, re.I)]
    assert widget_errors == [], widget_errors
    assert big_state["draws"] > 20, big_state
    figures = {
        "big_hotel_rooms": 2000,
        "big_hotel_frames": 500,
        "steps_drawn": big_state["draws"],
        "max_step_render_ms": big_state["max"],
        "last_step_render_ms": big_state["last"],
    }
    (ARTIFACTS / "widget_timing.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nhotel widget, 2,000 rooms x 500 frames: {figures}")
