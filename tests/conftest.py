import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Deterministic property tests: the same examples on every run and machine, no timing deadlines.
settings.register_profile("kvlab", derandomize=True, deadline=None, database=None)
settings.load_profile("kvlab")

ROOT = Path(__file__).resolve().parent.parent
# The tests sit in folders named after kvlab's layers; what several of them share (a notebook
# runner, a browser driver, the compile-only driver, fake classes) is importable by name from here.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
VENV_BIN = Path(sys.executable).parent

# The environment as the user's shell gave it, read before any test imports kvlab (which sets
# TRITON_INTERPRET in this process when there is no GPU). Subprocesses that stand for what a
# learner runs (kvlab grade, doctor, a Jupyter kernel) get this one, never kvlab's setting.
assert "kvlab" not in sys.modules, "conftest must read the environment before kvlab is imported"
LEARNER_ENV = dict(os.environ)


@pytest.fixture
def root() -> Path:
    return ROOT


def kvlab_cli() -> list[str]:
    """The kvlab command as a user runs it from this environment."""
    script = VENV_BIN / "kvlab"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvlab"]


def pytest_collection_finish(session):
    # `make test` must never pass on an empty run (pytest's exit code 5 also fails make).
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests were collected")


os.environ.setdefault("MPLBACKEND", "Agg")
