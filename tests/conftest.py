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

# nbformat as kvlab imports it (kvlab/course/nbformat_quick.py: without the 1.5 s that jsonschema's optional
# rfc3987_syntax costs a process); test modules import it. Already imported where the nbval
# plugin is loaded (`make test` runs the tests with -p no:nbval).
if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
    sys.modules["rfc3987_syntax"] = None
    try:
        import nbformat  # noqa: F401
    finally:
        del sys.modules["rfc3987_syntax"]


@pytest.fixture
def root() -> Path:
    return ROOT


def kvlab_cli() -> list[str]:
    """The kvlab command as a user runs it from this environment."""
    script = VENV_BIN / "kvlab"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvlab"]


# --- both cores: `make test` runs `pytest -n 2 --dist loadscope` (pytest-xdist) ----------------
# A scope (what one worker runs, in one process, in order) is a whole test file, so that module
# fixtures and whatever a file's tests leave for each other stay in one process. The files named
# here are independent runs of notebooks, graders and servers, tens of seconds each: each of their
# tests is a scope of its own, except tests that share a module fixture, which are named with the
# scope they share.
SPLIT_FILES: dict[str, dict[str, str]] = {
    "tests/course/test_notebooks.py": {
        "test_the_unsolved_lab_01_runs_top_to_bottom_and_scores_zero": "course",
        "test_solutions_get_full_marks": "course",
    },
    "tests/grading/test_judge.py": {},
    "tests/grading/test_classroom.py": {},
    "tests/course/test_cli.py": {},
}
# handed out first, in this order (the longest runs): the rest follows, slow tests first
FIRST = ["course", "tests/course/test_wheel.py", "tests/ops/test_kernels_compile.py"]


def scope_of(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    shared = SPLIT_FILES.get(path)
    if shared is None:
        return path
    return shared.get(name.split("[")[0], nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist, in the controller) tell the workers that scopes are ours, for their ordering."""
    if node.config.getvalue("dist") == "loadscope":
        node.workerinput["kvlab_scopes"] = True


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` with the scopes of :func:`scope_of`, handed out in the order the
    workers collected them (see pytest_collection_modifyitems), not by their number of tests."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False
    return Scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    if not getattr(config, "workerinput", {}).get("kvlab_scopes"):
        return  # one process (or another --dist): the files' own order
    for item in items:  # a module fixture in a split file must be shared by a named scope
        path = item.nodeid.partition("::")[0]
        if path not in SPLIT_FILES or scope_of(item.nodeid) != item.nodeid:
            continue
        for name, defs in item._fixtureinfo.name2fixturedefs.items():
            if defs[-1].scope != "function" and defs[-1].baseid == path:
                raise pytest.UsageError(
                    f"{item.nodeid} uses the {defs[-1].scope} fixture {name!r}: name the tests "
                    f"that share it in SPLIT_FILES (tests/conftest.py)"
                )
    scopes: dict[str, int] = {}
    for item in items:
        scope = scope_of(item.nodeid)
        rank = FIRST.index(scope) if scope in FIRST else len(FIRST)
        if rank == len(FIRST) and item.get_closest_marker("slow") is None:
            rank += 1
        scopes[scope] = min(rank, scopes.get(scope, rank))
    first_seen = {s: i for i, s in enumerate(dict.fromkeys(scope_of(i.nodeid) for i in items))}
    items.sort(key=lambda i: (scopes[scope_of(i.nodeid)], first_seen[scope_of(i.nodeid)]))


def pytest_collection_finish(session):
    # `make test` must never pass on an empty run (pytest's exit code 5 also fails make).
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests were collected")


os.environ.setdefault("MPLBACKEND", "Agg")
