"""``kvlab grade``'s judge: scores that the submission cannot reach.

The submission's code never runs in this process. A learner's process (``judge_child``) runs
the lab as the instructor ships it, with only the exercise cells taken from the submission
(matched by cell id; every other cell is the instructor's copy, so a forged check cell or a
patched given cell has no effect). Where the lab has a check cell, this process asks for the
object the cell names and runs the exercise's checks here, calling the learner's functions,
classes and kernels across the process boundary (:mod:`kvlab.grading.remote`). The checks,
kvlab's references, the inputs and the results stay here; nothing the learner's process writes
or patches, and no way it ends, changes a score but by the answers its code gives.

A learner's process that dies or hangs is started again and the cells before replayed (seeds are
fixed), so one crash costs the check it happened in, as in the learner's own notebook.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.course.nbformat_quick import nbformat
from kvlab.grading.cell_match import kind_of, match_cells
from kvlab.grading.limits import CheckTimeout, LearnerClock, counting, time_limit
from kvlab.grading.own_answers import Refusing, learner_stand_ins, stand_in_source
from kvlab.grading.process_tree import kill_tree
from kvlab.grading.registry import get_exercise
from kvlab.grading.remote import (
    JUDGE,
    Connection,
    Remote,
    RemoteDied,
    _RemoteMeta,
)
from kvlab.grading.report import CheckResult, Outcome, Status
from kvlab.ops.runtime import child_environ

CHECK_CELL = re.compile(
    r"""^\s*check\(\s*["'](\d\d\.[\w.]+)["']\s*,\s*([A-Za-z_]\w*)\s*\)\s*;?\s*$"""
)
LAB_NAME = re.compile(r"^(\d\d)_")
MAX_RESTARTS = 12  # a submission that needs more has stopped being graded fairly anyway
REPLAY_BUDGET = 120.0  # seconds for replaying cells after restarts, all of them together
ASK_TIMEOUT = 60.0  # wall seconds for the judge's own requests (find an object, forget handles):
# trivial work for an honest process, so only a far backstop that a busy machine never reaches


@dataclass
class Cell:
    id: str
    kind: str  # "given", "exercise", "check" or "added" (a cell the learner added)
    source: str
    exercise: str | None = None  # a check cell's exercise id
    name: str | None = None  # the object a check cell names
    origin: int | None = None  # the submission's cell it came from (index), if any


def lab_notebook(number: str) -> Path:
    """The instructor's copy of a lab: the generated learner notebook kvlab ships."""
    from kvlab.core import files

    labs = files.labs_dir()
    found = sorted(labs.glob(f"{number}_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no Lab {number} in {labs}")
    return found[0]


def lab_for(path: Path) -> Path | None:
    """The instructor's copy for a submission named like a lab (``03_...ipynb``), or None."""
    match = LAB_NAME.match(Path(path).name)
    if not match:
        return None
    try:
        return lab_notebook(match.group(1))
    except FileNotFoundError:
        return None


def program(submission, lab, matched=None) -> list[Cell]:
    """The cells the learner's process runs: the lab's, with the submission's exercise cells in
    place of the lab's stubs (found by id, grade_id or order: :mod:`~kvlab.grading.cell_match`)
    and the cells the learner added in their place. ``matched``: that match, when the caller
    wants to say how it was made."""
    if lab is None:  # not a lab of the course: its own cells, its check cells judged
        cells = []
        for i, cell in enumerate(submission.cells):
            if cell.cell_type != "code":
                continue
            match = CHECK_CELL.match(cell.source)
            cid = cell.get("id") or f"cell-{i + 1}"
            if match:
                cells.append(Cell(cid, "check", cell.source, match.group(1), match.group(2), i))
            else:
                cells.append(Cell(cid, "exercise", cell.source, origin=i))
        return cells
    matched = matched if matched is not None else match_cells(submission, lab)
    added: dict[int | None, list] = {}
    for a in matched.added:
        if a.runs:
            added.setdefault(a.after, []).append(a)
    cells = []
    for k, cell in enumerate(c for c in lab.cells if c.cell_type == "code"):
        cid = cell.get("id") or ""
        origin = matched.where.get(k)
        kind = kind_of(cell)
        if kind == "check":
            match = CHECK_CELL.match(cell.source)
            cells.append(Cell(cid, "check", cell.source, match.group(1), match.group(2), origin))
        elif kind == "exercise":
            cells.append(
                Cell(cid, "exercise", matched.exercise.get(k, cell.source), None, None, origin)
            )
        else:
            cells.append(Cell(cid, "given", cell.source, None, None, origin))
        # the learner's own cells, where they put them (those before every lab cell: after the
        # first, which sets kvlab up)
        for a in added.pop(k, []) + (added.pop(None, []) if k == 0 else []):
            cells.append(Cell(f"added-{a.index + 1}", "added", a.source, origin=a.index))
    return cells


class Session:
    """One learner's process and the channel to it; started again (cells replayed) when it
    dies or must be stopped."""

    def __init__(self, workdir: Path, env: dict | None = None, launcher=None):
        self.workdir = workdir
        self.env = env if env is not None else _child_env()
        self.launcher = launcher  # (argv, pass_fds, cwd, env) -> Popen; plain Popen if None
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.ran: list[str] = []  # sources run so far, replayed after a restart
        self.roots: dict[str, int] = {}
        self.restarts = 0
        self.cell_timeout = 300.0
        self.replay_left = REPLAY_BUDGET
        self.notes: list[str] = []
        self.outcomes: list = []  # the sandbox's account of each run of the learner's process
        self.sandbox_report: list[str] = []  # what the sandbox did (network, files, limits)
        self.clock = LearnerClock()  # the CPU-seconds a check's limit counts (limits.cpu_limit)
        self.start()
        self.clock.follow(self.process.pid)

    def start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        to_judge_r, to_judge_w = os.pipe()
        argv = [sys.executable, "-m", "kvlab.grading.judge_child", str(to_child_r), str(to_judge_w)]
        fds = (to_child_r, to_judge_w)
        if self.launcher is not None:
            self.process = self.launcher(argv, fds, self.workdir, self.env)
        else:
            self.process = subprocess.Popen(
                argv,
                pass_fds=fds,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=_debug_log(),
                start_new_session=True,
            )
        os.close(to_child_r)
        os.close(to_judge_w)
        self.conn = Connection(to_judge_r, to_child_w, JUDGE)
        self.conn.on_printed = _printed
        self.conn.on_died = self.how_it_ended
        self.conn.handlers["kvlab"] = self.serve_kvlab
        self.conn.serve_guard = self.own_answer_guard
        self.roots = {}

    checking: str | None = None  # the exercise whose checks run now (None: the lab's cells)
    stand_ins: dict[str, str] = {}  # kvlab's names stood in for in the learner's process: exercise
    handovers: list[str] = []  # kvlab's functions the learner's code asked the judge for

    def own_answer_guard(self):
        """While an exercise's checks run, every request the learner's code makes of this
        process is served with kvlab's own answer to it (``registry.OWN_ANSWERS``) refused:
        ``tree.match()`` on the judge's tree inside ``match_prefix``. It is this process's
        code, so nothing the learner's process does can lift it."""
        from kvlab.grading.registry import OWN_ANSWERS

        names = OWN_ANSWERS.get(self.checking) if self.checking is not None else None
        return Refusing(self, self.checking, names) if names else None

    def serve_kvlab(self, conn, name, args, kwargs):
        """kvlab's functions the judge computes for the lab's given cells (:data:`SERVED`):
        looked up at each call, so a check's guard in this process sees it; refused while an
        exercise's checks run, when only the learner's code runs there."""
        owner = self.stand_ins.get(name) if isinstance(name, str) else None
        if not isinstance(name, str) or (name not in SERVED and owner is None):
            raise PermissionError(f"kvlab grade's judge computes nothing called {name!r}")
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise TypeError("a malformed call")
        if self.checking is not None and (owner is None or owner == self.checking):
            self.handovers = [*self.handovers, name]
            what = f"kvlab's own answer to {owner}" if owner else "kvlab's answer"
            raise PermissionError(
                f"`{name}` is {what}, computed by the grader: your code may not call it"
            )
        module, _, attribute = name.rpartition(".")
        import importlib

        return (
            getattr(importlib.import_module(module), attribute)(*args, **kwargs),
            False,
            None,
            None,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.clock.ended()
            kill_tree(self.process)
            run = getattr(self.process, "sandbox", None)
            if run is not None:  # what the sandbox did, a limit hit, a protected file changed
                self.outcomes.append(run.finish(timeout=30))
                self.sandbox_report = list(run.report)
            self.process = None
        if self.conn is not None:
            for fd in (self.conn.read_fd, self.conn.write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.conn = None

    def restart(self) -> None:
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise RemoteDied(f"stopped after {MAX_RESTARTS} restarts of your notebook")
        self.stop()
        self.start()
        for source in self.ran:  # each cell within its time, all replays within one budget
            left = min(self.cell_timeout, self.replay_left)
            began = time.monotonic()
            try:
                if left <= 0:
                    raise CheckTimeout(left)
                with time_limit(left):
                    self.conn.request("run_cell", source)
                self.replay_left -= time.monotonic() - began
            except (CheckTimeout, RemoteDied, Exception) as e:
                self.replay_left = 0.0
                self.conn.broken = True
                raise RemoteDied(
                    f"replaying your notebook's cells failed ({type(e).__name__})"
                ) from None
        self.clock.follow(self.process.pid)  # the start and the replay cost no check's time

    def how_it_ended(self) -> str:
        """How the learner's process ended, for a report ("SIGSEGV", "exit status 1")."""
        if self.process is None:
            return "stopped"
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code}"

    def live(self) -> Connection:
        if self.conn is None or self.conn.broken:
            self.restart()
        return self.conn

    def run_cell(self, source: str, timeout: float) -> str | None:
        """Run one cell; returns the error it raised, if any. A cell that hangs or kills the
        process is left out of the replay."""
        self.cell_timeout = timeout
        try:
            conn = self.live()
            with time_limit(timeout):
                error = conn.request("run_cell", source)
        except CheckTimeout:
            self._broken()
            return f"the cell did not finish within {timeout:g} s"
        except RemoteDied:
            return "the notebook's process died in this cell"
        except Exception as e:  # anything else the learner's side sent: its cell, its loss
            self._broken()
            return f"the cell's process answered wrongly ({type(e).__name__})"
        self.ran.append(source)
        return error if isinstance(error, str) or error is None else "error"

    def _broken(self) -> None:
        if self.conn is not None:
            self.conn.broken = True

    def root_handle(self, name: str) -> int:
        """The handle of ``name`` in the live learner's process (found again after a restart)."""
        conn = self.live()
        handle = self.roots.get(name)
        if handle is None:
            handle = self.roots[name] = _handle(self._ask(conn, "resolve", name))
        return handle

    def _ask(self, conn, op, *args):
        """One of the judge's own requests, within :data:`ASK_TIMEOUT`; any failure (a time
        out, an error the learner's side sent) stops that process."""
        try:
            with time_limit(ASK_TIMEOUT):
                return conn.request(op, *args)
        except NameError:
            raise
        except (CheckTimeout, Exception) as e:
            conn.broken = True
            if isinstance(e, RemoteDied):
                raise
            raise RemoteDied(f"it did not answer the grader ({type(e).__name__})") from None

    def ask_root(self, name: str, op: str, *args, **options):
        handle = self.root_handle(name)
        return self.conn.request(op, handle, *args, **options)

    def root(self, name: str):
        """The object ``name`` of the learner's notebook, as a proxy that survives restarts."""
        value = self._ask(self.live(), "resolve", name)
        self.roots[name] = _handle(value)
        if isinstance(value, _RemoteMeta):
            return rooted_class(self, name, value._kvlab_info)
        return Rooted(self, name, value._info)

    def release(self) -> None:
        """Forget the handles of one exercise (both sides)."""
        if self.conn is not None and not self.conn.broken:
            try:
                self._ask(self.conn, "release")
            except (RemoteDied, NameError):
                pass
            self.conn.release_all()
        self.roots = {}


def _handle(value) -> int:
    if isinstance(value, Remote):
        return value._handle
    if isinstance(value, _RemoteMeta):
        return value._kvlab_handle
    raise RemoteDied("the name does not hold an object of yours")


class Rooted(Remote):
    """The exercise's object, found again by name after the learner's process restarts."""

    __slots__ = ("_session", "_root")

    def __init__(self, session: Session, name: str, info: dict):
        super().__init__(None, None, info)
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_root", name)

    def _ask(self, op, *args, **options):
        return self._session.ask_root(self._root, op, *args, **options)

    def _kvlab_pid(self, conn):
        return ("P", self._session.root_handle(self._root))

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)


class _RootedMeta(_RemoteMeta):
    def _kvlab_ask(cls, op, *args, **options):
        return cls._kvlab_session.ask_root(cls._kvlab_root, op, *args, **options)

    def _kvlab_pid(cls, conn):
        return ("P", cls._kvlab_session.root_handle(cls._kvlab_root))


def rooted_class(session: Session, name: str, info: dict):
    namespace = {
        "_kvlab_session": session,
        "_kvlab_root": name,
        "_kvlab_info": info,
        "__module__": info["module"],
        "__qualname__": info["qualname"],
    }
    return _RootedMeta(info["name"], (), namespace)


def _debug_log():
    """KVLAB_JUDGE_LOG=FILE keeps what the learner's process writes to stderr (for kvlab's
    developers); by default it is dropped."""
    path = os.environ.get("KVLAB_JUDGE_LOG")
    return open(path, "a") if path else subprocess.DEVNULL


def _printed(printed) -> None:
    """What the learner's code printed during a check goes where the check's output goes (the
    runner counts it; only the first characters are kept). Outside a check it goes nowhere: the
    judge's own output is never the learner's to write."""
    from kvlab.grading.limits import BoundedBuffer

    if isinstance(sys.stdout, BoundedBuffer):
        hidden = max(0, min(printed.total - len(printed.text), 1 << 20))
        sys.stdout.write(printed.text + " " * hidden)


# what the learner's process gets of the judge's environment: PATH and the locale, and what
# decides where kernels run (kvlab's own settings, Triton's, the GPUs that are visible)
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
PASSED_PREFIXES = ("KVLAB_", "TRITON_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def _child_env() -> dict:
    """A clean environment: nothing of the judge's but :data:`PASSED_ENV` and kvlab's, Triton's
    and the GPUs' settings; PYTHONPATH names the judge's kvlab, so both run the same code."""
    from kvlab.grading.sandbox import kvlab_package_path

    env = {
        k: v for k, v in child_environ().items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)
    }
    env.pop("KVLAB_GRADE_LOG", None)
    env.pop("KVLAB_JUDGE_LOG", None)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED", "0")
    env["PYTHONPATH"] = str(kvlab_package_path().parent)
    return env


# --- grading one submission ----------------------------------------------------------------


@dataclass
class Judged:
    """What the judge found in one submission."""

    results: dict[str, CheckResult] = field(default_factory=dict)
    error_cells: list[str] = field(default_factory=list)  # ids of cells that raised
    notes: list[str] = field(default_factory=list)
    tampered: bool = False  # a protected file changed (and was put back): the run fails
    seconds: float = 0.0
    # how the submission's cells were found (cell_match): id, grade_id, order; "own" for a
    # notebook that is not a lab; what that left out or could not find, said to the learner
    cell_match: str = "own"
    old_version: list[str] = field(default_factory=list)
    cell_notes: list[str] = field(default_factory=list)
    error_origins: list[int] = field(default_factory=list)  # the submission's cells that raised


AUTO = "auto"


def judge(
    submission_path: str | Path,
    cell_timeout: float = 300,
    lab_path=AUTO,
    launcher=None,
    check_timeout: float | None = None,
):
    """Run a submission as the judge does; returns :class:`Judged` (never raises for what the
    submission does). ``lab_path``: the instructor's copy (by default the course's lab of the
    file's number; None judges the notebook's own cells). ``check_timeout``: seconds per check
    (by default :func:`judged_check_timeout`)."""
    from kvlab.grading.runner import run_checks

    started = time.monotonic()
    path = Path(submission_path)
    submission = nbformat.read(path, as_version=4)
    if lab_path == AUTO:
        lab_path = lab_for(path)
    lab = nbformat.read(lab_path, as_version=4) if lab_path is not None else None
    found = Judged()
    cells = []
    matched = None
    if lab is not None:
        from kvlab.grading.cell_match import describe

        matched = match_cells(submission, lab)
        found.cell_match, found.old_version = matched.how, matched.old_version
        found.cell_notes = describe(matched, lab)
    for cell in program(submission, lab, matched):
        if cell.kind == "check":
            try:  # every check's module is imported before the learner's code runs at all
                get_exercise(cell.exercise)
            except KeyError:
                found.notes.append(f"no exercise {cell.exercise!r}: its check cell is left out")
                continue
        cells.append(cell)
    checked = [cell.exercise for cell in cells if cell.kind == "check"]
    cells = cells[: _after_last_check(cells)]  # a given cell after the last check scores nothing
    with (
        tempfile.TemporaryDirectory(prefix="kvlab-judge-") as tmp,
        tempfile.TemporaryDirectory(prefix="kvlab-own-") as own,
    ):
        stand_ins = write_stand_ins(checked, Path(own)) if launcher is None else {}
        session = Session(Path(tmp), launcher=launcher or sandboxed(stand_ins))
        session.stand_ins = {
            f"{module}.{name}": exercise_id
            for module, names in learner_stand_ins(checked).items()
            for name, exercise_id in names.items()
        }
        try:
            for cell in cells:
                if cell.kind != "check":
                    error = session.run_cell(cell.source, cell_timeout)
                    if error is not None:
                        found.error_cells.append(cell.id)
                        if cell.origin is not None:
                            found.error_origins.append(cell.origin)
                    continue
                with counting(session.clock):  # a check's limit: CPU-seconds, both processes
                    found.results[cell.exercise] = _judge_exercise(
                        session, cell, run_checks, check_timeout or judged_check_timeout()
                    )
        finally:
            session.stop()
        found.notes += session.notes
        if session.restarts:
            found.notes.append(
                f"your notebook's process was started again {session.restarts} times"
            )
    found.notes += session.sandbox_report
    for outcome in session.outcomes:  # a limit hit or a protected file changed: said
        if outcome.limits_hit or outcome.tampered:
            found.notes += [line for line in outcome.lines if line not in found.notes]
        found.tampered = found.tampered or outcome.tampered
    found.seconds = time.monotonic() - started
    return found


def _after_last_check(cells: list[Cell]) -> int:
    """How many cells the judge runs: up to the last check cell (all, where there is none)."""
    last = [i for i, cell in enumerate(cells) if cell.kind == "check"]
    return last[-1] + 1 if last else len(cells)


def write_stand_ins(exercise_ids, folder: Path) -> dict[Path, Path]:
    """kvlab's modules holding the checked exercises' own answers, rewritten with stand-ins
    (:func:`kvlab.grading.own_answers.stand_in_source`) into ``folder``: {the package's file:
    its stand-in copy}, for the learner's process to import in their place."""
    import importlib

    written = {}
    for module, names in learner_stand_ins(exercise_ids).items():
        path = Path(importlib.import_module(module).__file__)
        copy = folder / f"{module}.py"
        copy.write_text(stand_in_source(path.read_text(), module, names))
        copy.chmod(0o644)
        written[path] = copy
    if written:
        folder.chmod(0o755)
    return written


def sandboxed(stand_ins: dict[Path, Path] | None = None):
    """How the judge starts the learner's process: in kvlab's sandbox (namespaces where the
    machine allows them, else content hashes of kvlab's package), with its limits."""
    from kvlab.grading import sandbox

    torch = sys.modules.get("torch")
    gpu = torch is not None and torch.cuda.is_available()
    # CUDA reserves far more address space than it uses: no memory limit on a GPU machine
    limits = sandbox.Limits(
        memory_bytes=None if gpu else 8 << 30, wall_seconds=3600.0, disk_bytes=1 << 30
    )
    from kvlab.core import files

    # the course's data (traces, the tiny model) read-only: a checkout's (it may lie under /tmp,
    # which the sandbox otherwise hides); a wheel's bundle is inside the protected package
    package = sandbox.kvlab_package_path()
    where = files.course_root()
    assets = where[1] / "assets" if where else None
    data = [assets] if assets and assets.is_dir() and not assets.is_relative_to(package) else []
    hidden, overlay = student_view(package, stand_ins)
    return sandbox.launcher(
        limits,
        protected=[sandbox.kvlab_package_path()],
        readonly=data,
        stderr=_debug_log(),
        hidden=hidden,
        overlay=overlay,
    )


# Top-level folders a submission needs (the system's programs and libraries); every other one
# (homes, checkouts, data, other submissions) is hidden but for the paths the run needs.
SYSTEM_DIRS = frozenset(
    ("bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "run", "sbin", "sys")
    + ("tmp", "usr", "var")
)
# What the learner's process keeps of kvlab.grading: the judge's channel and its helpers
CHILD_RUNTIME = ("judge_child.py", "remote.py", "wire.py", "limits.py", "blame.py", "expect.py")
CHILD_RUNTIME += ("launchers.py",)  # the given cells' kernel launches, shared with the checks
CHILD_RUNTIME += ("given.py",)  # the classes of the checks' inputs
CHILD_RUNTIME += ("own_code.py",)  # the in-process guard: a first line, never the only one
# the graders' names a lab's given cells import, in the learner's process (student_view/)
STUDENT_VIEW = {
    "__init__.py": "grading_init.py",
    "lab05.py": "lab05.py",
    "lab09/__init__.py": "lab09_init.py",
    "lab09/chunk.py": "lab09_chunk.py",
    "lab09/roofline.py": "lab09_roofline.py",
}
# kvlab's functions the judge computes for a lab's given cells (never for the learner's code)
SERVED = frozenset({"kvlab.grading.lab09.roofline.almost_free_tokens"})


def student_view(
    package: Path, stand_ins: dict[Path, Path] | None = None
) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """(hidden folders, overlay files) for the learner's process: every top-level folder but
    the system's (so the course's ``solutions/``, its tests, its git history, homes and other
    checkouts are out of sight), the package's bundled solutions, and ``kvlab.grading`` but
    the channel's modules, with :mod:`kvlab.grading.student_view`'s files in the graders'
    place."""
    from kvlab.core import files

    root = Path("/")
    hidden = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    hidden = [p for p in hidden if p.name not in SYSTEM_DIRS]
    where = files.course_root()
    if where is not None:  # a checkout under /usr or /opt: hidden all the same
        hidden.append(where[1])
        if (where[1] / "solutions").is_dir():
            hidden.append(where[1] / "solutions")
    grading = package / "grading"
    hidden.append(grading)
    overlay = [(grading / name, grading / name) for name in CHILD_RUNTIME]
    view = grading / "student_view"
    overlay += [(view / source, grading / target) for target, source in STUDENT_VIEW.items()]
    for original, copy in (stand_ins or {}).items():  # kvlab's own answers: stand-ins instead
        folder = original.parent
        if folder != grading and folder not in hidden:
            hidden.append(folder)  # its other files bound back (not its bytecode: the answer's)
            overlay += [(p, p) for p in sorted(folder.iterdir()) if p.name != "__pycache__"]
        overlay = [(s, t) for s, t in overlay if t != original] + [(copy, original)]
    return hidden, overlay


def judged_check_timeout() -> float:
    """A check's limit under the judge, in CPU-seconds (the judge's and the learner's process
    tree's, :class:`~kvlab.grading.limits.LearnerClock`): six times the learner's
    (``KVLAB_CHECK_TIMEOUT``, 10), since every call of the learner's code crosses the process
    boundary (Lab 06's 40-guest day takes 9 s so, 3 s in one process). CPU time does not grow
    on a busy machine, so a class graded several notebooks at a time on shared cores scores as
    one graded alone; the limit is there for endless loops (a check is tried twice before it
    counts), and a wall-time backstop ten times as long for code that waits."""
    from kvlab.grading.runner import DEFAULT_TIMEOUT

    return 6 * DEFAULT_TIMEOUT


def _judge_exercise(session: Session, cell: Cell, run_checks, timeout: float) -> CheckResult:
    result = _judge_checks(session, cell, run_checks, timeout)
    handed = _handover(result, session.handovers)
    session.handovers = []
    result.handed_over = handed  # the gradebook's hand-over flag: kvlab's code given as an answer
    return result


def _handover(result: CheckResult, asked: list[str]) -> str | None:
    """What the learner's code handed to kvlab in this exercise (a check's hand-over failure,
    or kvlab's answer asked of the judge), or None."""
    from kvlab.grading.own_code import HANDOVER

    if asked:
        return asked[0]
    for outcome in result.outcomes:
        if outcome.cause == HANDOVER:
            return next(iter(outcome.details), "kvlab reference")
    return None


def _judge_checks(session: Session, cell: Cell, run_checks, timeout: float) -> CheckResult:
    ex = get_exercise(cell.exercise)
    try:
        obj = session.root(cell.name)
    except RemoteDied as died:
        return _not_run(ex, f"your notebook's process is gone ({died})")
    except NameError:
        return _not_run(ex, f"`{cell.name}` is not defined when its check cell runs")
    except Exception as e:  # noqa: BLE001
        return _not_run(ex, f"`{cell.name}` could not be read ({type(e).__name__})")
    if cell.exercise in TRITON_KERNELS and not _is_jit_function(obj):
        kind = f"{obj._info.get('module')}.{obj._info.get('type')}"
        outcome = Outcome(
            "the exercise's object",
            Status.WRONG_KIND,
            [f"`{cell.name}` is a {kind}, not a Triton kernel: write it with @triton.jit"],
        )
        return CheckResult(ex.id, ex.title, Status.WRONG_KIND, [outcome], len(ex.checks))
    session.checking = cell.exercise
    try:
        return run_checks(cell.exercise, obj, timeout)
    finally:
        session.checking = None
        session.release()


TRITON_KERNELS = frozenset({"05.kernel", "09.chunk_kernel"})  # only a @triton.jit function


def _is_jit_function(obj) -> bool:
    """What ``@triton.jit`` returns (a ``triton.runtime.jit.JITFunction``, or Triton's
    interpreter's wrapper of one), as the learner's process describes it."""
    info = getattr(obj, "_info", None)
    if not isinstance(info, dict) or isinstance(obj, _RemoteMeta):
        return False
    module, text = str(info.get("module", "")), str(info.get("repr", ""))
    return info.get("type") in ("JITFunction", "InterpretedFunction") and (
        module.startswith("triton.") or text.startswith(("JITFunction(", "<triton."))
    )


def _not_run(ex, why: str) -> CheckResult:
    outcome = Outcome("the exercise's object", Status.NOT_RUN, [why])
    return CheckResult(ex.id, ex.title, Status.NOT_RUN, [outcome], len(ex.checks))
