"""Run a submission's code in a sandbox: its own working folder, no network, kvlab and the
instructor's files protected, and limits on memory, CPU, processes, open files, file size and
wall time. Every run comes with report lines that say what was in force, what was hit and
what could not be done on this machine.

Where Linux lets an ordinary process have namespaces (``unshare --user``), the run gets new
user, mount, PID, network, IPC and UTS namespaces: the file system is read-only but for the
working folder, the host's /tmp, /run and /dev are hidden, the network is gone, and every
process the submission starts dies with it. Elsewhere it falls back
to content hashes of the protected paths (a change is reverted and fails the submission) and
says that the run had network. Either way it is not a VM: see docs/grading-sandbox.md.

:func:`start` returns a :class:`SandboxRun` whose ``process`` is a plain ``subprocess.Popen``
(pipes and ``pass_fds`` as the judge needs them); :meth:`SandboxRun.finish` waits, checks the
protected paths and explains how the run ended. The code that runs inside, before the command,
is :mod:`kvlab.grading.sandbox_shim`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.grading.process_tree import how_it_ended, kill_tree

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

SHIM = Path(__file__).with_name("sandbox_shim.py")
# Covered by an empty tmpfs in namespace mode: other users' files and unix sockets (tmux, X11,
# dbus, docker) live there, and a network namespace does not stop sockets on the filesystem.
# /dev is replaced as a whole (a few devices, the GPUs, a /dev/shm of the run's own).
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run")
# What the child's environment keeps of the judge's when no env is given: the judge's own
# variables (tokens, paths to answer keys) are none of the submission's business.
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
READY_TIMEOUT = 60.0
_serial = itertools.count()


class SandboxUnavailable(RuntimeError):
    """The namespace sandbox was asked for (``mode="namespace"``) and cannot be set up here."""


# ----------------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission; ``None`` means no limit.

    The defaults fit a lab notebook that imports torch and runs Triton's CPU interpreter:
    measured, that needs about 1 GiB of address space with 2 threads and 1.5 GiB with 16
    (each thread's malloc arena reserves address space), so 8 GiB leaves room for the labs'
    tensors. CUDA reserves far more address space than it uses: on a GPU, pass
    ``memory_bytes=None`` (and bound memory with a container instead).

    CPU time, open files and file size are per process (setrlimit); processes counts every
    process and thread of the run. ``memory_bytes`` is per process (address space) and, where a
    memory cgroup is writable (a root judge), for the whole run too (its RAM and its tmpfs
    files together). ``disk_bytes``: in namespace mode the working folder is a tmpfs of that
    size, for all the files of the run together (None: the folder is on disk, unbounded).
    """

    memory_bytes: int | None = 8 * GiB  # address space (RLIMIT_AS), per process; cgroup: total
    cpu_seconds: int | None = 600  # RLIMIT_CPU, per process: SIGXCPU, SIGKILL 5 s later
    processes: int | None = 256  # processes and threads of the run
    open_files: int | None = 1024  # RLIMIT_NOFILE
    output_bytes: int | None = 64 * MiB  # size of any one file written (RLIMIT_FSIZE)
    wall_seconds: float | None = 900.0  # then the whole tree is killed
    disk_bytes: int | None = None  # the working folder as a tmpfs of this size (namespaces)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            number = f.name == "wall_seconds"
            ok = isinstance(value, (int, float) if number else int) and not isinstance(value, bool)
            if not ok or value <= 0 or value != value:
                kind = "number of seconds" if number else "integer"
                raise ValueError(
                    f"Limits.{f.name} must be a positive {kind} or None (no limit), got {value!r}"
                )
        if self.open_files is not None and self.open_files < 16:
            raise ValueError(
                f"Limits.open_files must be at least 16 (Python itself needs a few), "
                f"got {self.open_files!r}"
            )

    def describe(self) -> str:
        """One line for the report (processes have a line of their own)."""

        def show(value, fmt):
            return "unlimited" if value is None else fmt(value)

        return (
            f"memory {show(self.memory_bytes, _size)} per process (address space), "
            f"CPU time {show(self.cpu_seconds, _seconds)} per process, "
            f"open files {show(self.open_files, str)}, "
            f"file size {show(self.output_bytes, _size)}, "
            f"wall time {show(self.wall_seconds, _seconds)}"
            + ("" if self.disk_bytes is None else f", working folder {_size(self.disk_bytes)}")
        )


def _size(n: float) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{int(n)} bytes"


def _seconds(s: float) -> str:
    return f"{s:g} s"


# ------------------------------------------------------------------------------------ probe


@dataclass(frozen=True)
class Probe:
    """Whether the namespace sandbox works on this machine, and if not, why not."""

    available: bool
    reason: str = ""  # why not; empty when available
    unshare: str | None = None


@functools.cache
def probe() -> Probe:
    """Try the real thing once per process: a child in namespaces that must fail to write a
    read-only folder. Cached: machines do not grow user namespaces mid-run."""
    if not sys.platform.startswith("linux"):
        return Probe(False, f"namespaces are Linux only (this is {sys.platform})")
    unshare = shutil.which("unshare")
    if unshare is None:
        return Probe(False, "no unshare command on PATH (util-linux)")
    try:
        tried = subprocess.run(
            [unshare, "--user", "--map-root-user", "--mount", "--net", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Probe(False, f"unshare could not run: {err}", unshare)
    if tried.returncode != 0:
        said = tried.stderr.strip().splitlines()
        return Probe(False, said[-1] if said else f"unshare exited {tried.returncode}", unshare)
    with tempfile.TemporaryDirectory(prefix="kvlab-sandbox-probe-") as tmp:
        work, locked = Path(tmp, "work"), Path(tmp, "locked")
        locked.mkdir()
        code = "open('../locked/x', 'w')"
        try:
            run = start(
                [sys.executable, "-I", "-S", "-c", code],
                work,
                Limits(wall_seconds=30),
                protected=[locked],
                mode="namespace",
                stderr=subprocess.DEVNULL,
            )
        except SandboxUnavailable as err:
            return Probe(False, str(err), unshare)
        outcome = run.finish()
        if outcome.returncode == 0 or (locked / "x").exists():
            return Probe(False, "a read-only bind mount stayed writable", unshare)
    return Probe(True, "", unshare)


# ------------------------------------------------------------------- protection by content


def digest_tree(path: Path) -> dict[str, str]:
    """Relative path -> a digest of its kind, permission bits and content (or link target)."""
    path = Path(path)
    out: dict[str, str] = {}

    def one(p: Path, rel: str):
        st = p.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = f"link {os.readlink(p)}"
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = f"dir {mode:o}"
            for child in sorted(os.listdir(p)):
                one(p / child, f"{rel}/{child}" if rel != "." else child)
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[rel] = f"file {mode:o} {h.hexdigest()}"
        else:
            out[rel] = f"special {stat.S_IFMT(st.st_mode):o}"

    if path.exists() or path.is_symlink():
        one(path, ".")
    return out


def _describe_changes(before: Mapping[str, str], after: Mapping[str, str], most: int = 5) -> str:
    parts = []
    for word, names in (
        ("changed", [k for k in before if k in after and before[k] != after[k]]),
        ("added", [k for k in after if k not in before]),
        ("removed", [k for k in before if k not in after]),
    ):
        if names:
            shown = ", ".join(names[:most]) + (
                f" and {len(names) - most} more" if len(names) > most else ""
            )
            parts.append(f"{word} {shown}")
    return "; ".join(parts)


def _force_remove(path: Path):
    """Remove a file, link or tree, even one whose permissions were taken away."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return

    def fix(func, p, exc):
        for q in (Path(p).parent, Path(p)):
            with contextlib.suppress(OSError):
                os.chmod(q, 0o700)
        func(p)

    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o700)
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=fix)
    else:
        shutil.rmtree(path, onerror=fix)


@dataclass
class TreeGuard:
    """Content digests and a backup copy of protected paths, taken before a submission runs.

    Where they cannot be made read-only, this is how a change is caught (and undone) after the
    run. It cannot stop a change while the run lasts: the judge must have read what it needs
    from these paths before it starts the submission.
    """

    paths: tuple[Path, ...]
    digests: dict[Path, dict[str, str]]
    backup: Path

    @classmethod
    def take(cls, paths: Iterable[Path], backup_dir: Path | None = None) -> TreeGuard:
        paths = tuple(Path(p) for p in paths)
        backup = Path(tempfile.mkdtemp(prefix="kvlab-sandbox-backup-", dir=backup_dir))
        digests = {}
        for i, p in enumerate(paths):
            digests[p] = digest_tree(p)
            copy = backup / str(i) / p.name
            copy.parent.mkdir()
            if p.is_dir() and not p.is_symlink():
                shutil.copytree(p, copy, symlinks=True)
            else:
                shutil.copy2(p, copy, follow_symlinks=False)
        return cls(paths, digests, backup)

    @property
    def files(self) -> int:
        return sum(len(d) for d in self.digests.values())

    def verify_and_restore(self) -> list[str]:
        """Report lines for each protected path that changed, after putting it back."""
        lines = []
        for i, p in enumerate(self.paths):
            before, after = self.digests[p], digest_tree(p)
            if before == after:
                continue
            what = _describe_changes(before, after)
            copy = self.backup / str(i) / p.name
            try:
                if digest_tree(copy) != before:
                    raise OSError("the backup copy was changed too")
                _force_remove(p)
                if copy.is_dir() and not copy.is_symlink():
                    shutil.copytree(copy, p, symlinks=True)
                else:
                    shutil.copy2(copy, p, follow_symlinks=False)
                if digest_tree(p) != before:
                    raise OSError("the copy put back differs")
                lines.append(f"protected files CHANGED by the submission ({p}: {what}): reverted")
            except OSError as err:
                lines.append(
                    f"protected files CHANGED by the submission ({p}: {what}) and NOT reverted "
                    f"({err}): reinstall them before grading anything else"
                )
        return lines

    def close(self):
        _force_remove(self.backup)


# --------------------------------------------------------------------- process-count limit


def _fresh_cgroup(controller: str, set_limits) -> Path | None:
    """A fresh cgroup for one run on the first hierarchy (v1 or v2) with ``controller`` that
    this process may write, its limits set by ``set_limits(group, version)``; None where there
    is none."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        _dev, mnt, fstype, opts = line.split()[:4]
        base = Path(mnt)
        try:
            if fstype == "cgroup" and controller in opts.split(","):
                version = 1
            elif fstype == "cgroup2" and controller in (
                (base / "cgroup.controllers").read_text().split()
            ):
                control = base / "cgroup.subtree_control"
                if controller not in control.read_text().split():
                    control.write_text(f"+{controller}")
                version = 2
            else:
                continue
            _remove_stale_groups(base)
            group = base / f"kvlab-sandbox-{os.getpid()}-{next(_serial)}"
            group.mkdir()
            try:
                set_limits(group, version)
            except OSError:
                group.rmdir()
                raise
            return group
        except OSError:
            continue
    return None


def _pids_cgroup() -> Path | None:
    """A fresh pids cgroup for one run, or None where none is writable (not root, no pids
    controller). Needed because processes of uid 0 ignore RLIMIT_NPROC, even in a user
    namespace whose root maps to the real root."""

    def set_limits(group: Path, _version: int) -> None:
        (group / "pids.max").write_text("1")  # raised by the caller

    return _fresh_cgroup("pids", set_limits)


# the files of a memory cgroup's limits, by cgroup version: RAM, and RAM with swap (v1) or swap
_MEMORY_FILES = {
    1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
    2: ("memory.max", "memory.swap.max"),
}


def _memory_cgroup(limit: int | None) -> Path | None:
    """A fresh memory cgroup of ``limit`` bytes for one run (RAM, swap where counted, and the
    tmpfs pages it writes, all its processes together), or None where none is writable."""
    if limit is None or os.geteuid() != 0:
        return None

    def set_limits(group: Path, version: int) -> None:
        ram, swap = _MEMORY_FILES[version]
        (group / ram).write_text(str(limit))
        with contextlib.suppress(OSError):  # no swap beyond it (absent without swap accounting)
            (group / swap).write_text(str(limit) if version == 1 else "0")

    return _fresh_cgroup("memory", set_limits)


def _memory_peak(group: Path | None) -> int | None:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        with contextlib.suppress(OSError, ValueError):
            return int((group / name).read_text()) if group is not None else None
    return None


def _memory_refused(group: Path | None) -> bool:
    """Whether the run's memory cgroup stopped it (an OOM kill, or allocations refused)."""
    if group is None:
        return False
    with contextlib.suppress(OSError, ValueError):
        if int((group / "memory.failcnt").read_text()) > 0:
            return True
    with contextlib.suppress(OSError, ValueError):
        for line in (group / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("max", "oom_kill") and int(value) > 0:
                return True
    return False


def _remove_stale_groups(base: Path):
    """Remove the empty cgroups of judges that died without cleaning up."""
    for group in base.glob("kvlab-sandbox-*-*"):
        try:
            os.kill(int(group.name.split("-")[2]), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                group.rmdir()
        except (OSError, ValueError):
            pass


def _user_tasks(uid: int) -> int:
    """Processes and threads this real uid runs now (what RLIMIT_NPROC counts outside a user
    namespace)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = Path("/proc", entry, "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
    return count


def _free_cgroup(group: Path | None) -> int:
    """Kill what is left in the run's cgroup, remove it, and return how many forks it refused."""
    if group is None:
        return 0
    refused = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (group / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                refused = int(value)
    for _ in range(200):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.01)
    return refused


# ----------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class Outcome:
    """How one sandboxed run ended, for the report and for the judge."""

    returncode: int
    elapsed: float  # seconds from start to end, as the shim measured them
    cpu_seconds: float | None
    max_rss_bytes: int | None  # the largest process's peak
    lines: tuple[str, ...]  # how it ended, each limit hit, each protected change
    limits_hit: tuple[str, ...]  # names of Limits fields
    tampered: bool  # a protected path changed: the submission fails


@dataclass
class SandboxRun:
    """A started sandboxed command: ``process`` is the Popen the judge talks to."""

    process: subprocess.Popen
    report: list[str]
    limits: Limits
    isolated: bool  # namespaces (True) or the fallback
    workdir: Path
    started: float = field(default_factory=time.monotonic)
    _status_fd: int | None = None
    _guard: TreeGuard | None = None
    _cgroup: Path | None = None
    _outcome: Outcome | None = None
    _memory_group: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def kill(self):
        """Stop the run and everything it started: SIGTERM first, so that the shim kills the
        tree and reports how the run ended, then SIGKILL for whatever is left 2 s later."""
        if self.process.poll() is None:
            kill_tree(self.process, grace=2)

    def finish(self, stderr_text: str = "", timeout: float | None = None) -> Outcome:
        """Wait for the end (killing the run after ``timeout``), check the protected paths and
        explain the ending. ``stderr_text``: what the judge read from the child's stderr, to
        recognise limits that show only as error messages. Safe to call twice."""
        if self._outcome is not None:
            return self._outcome
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        summary = self._read_status()
        refused = _free_cgroup(self._cgroup)
        memory_refused = _memory_refused(self._memory_group)
        _free_cgroup(self._memory_group)
        returncode = self.process.returncode
        elapsed = summary.get("wall_seconds", self.elapsed())
        cpu = summary.get("cpu_seconds")
        rss = summary["max_rss_kib"] * KiB if "max_rss_kib" in summary else None
        lines = [_ending(returncode, elapsed, cpu, rss)]
        hit: list[str] = []
        limits = self.limits

        def add(name: str, line: str | None):
            if line and name not in hit:
                hit.append(name)
                lines.append(line)

        if summary.get("wall_killed"):
            add("wall_seconds", _WALL.format(_seconds(limits.wall_seconds or elapsed)))
        exit_line = explain_exit(returncode, limits, elapsed)
        if exit_line:
            add(_EXIT_FIELD.get(-returncode, "wall_seconds"), exit_line)
        if (
            returncode == -signal.SIGKILL
            and limits.cpu_seconds is not None
            and cpu is not None
            and cpu >= limits.cpu_seconds
        ):
            add("cpu_seconds", _CPU.format(_seconds(limits.cpu_seconds)))
        if refused:
            add("processes", f"processes limit hit: {limits.processes} reached, {refused} refused")
        if memory_refused:
            add(
                "memory_bytes",
                f"memory limit hit: the run as a whole reached {_size(limits.memory_bytes or 0)} "
                "(memory cgroup: RAM and tmpfs files of all its processes)",
            )
        for name, line in _explain_output(stderr_text, limits):
            add(name, line)
        tampered = False
        if self._guard is not None:
            changes = self._guard.verify_and_restore()
            self._guard.close()
            if changes:
                tampered = True
                lines.extend(changes)
                lines.append("this submission fails: it changed files it must not change")
        self._outcome = Outcome(returncode, elapsed, cpu, rss, tuple(lines), tuple(hit), tampered)
        return self._outcome

    def _read_status(self) -> dict:
        if self._status_fd is None:
            return {}
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := os.read(self._status_fd, 1 << 16):
                chunks.append(chunk)
        os.close(self._status_fd)
        self._status_fd = None
        try:
            return json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            return {}

    def __enter__(self) -> SandboxRun:
        return self

    def __exit__(self, *exc):
        self.kill()
        self.finish()


def sandbox_env(workdir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ``env`` (or a few locale and PATH variables of the judge's),
    with HOME, TMPDIR and PWD in the working folder (so caches land there) and no bytecode
    writing (a benign run leaves protected packages exactly as they were)."""
    base = (
        dict(env) if env is not None else {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    )
    base.setdefault("PATH", os.defpath)
    base.update(HOME=str(workdir), TMPDIR=str(workdir), PWD=str(workdir))
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    return base


@dataclass(frozen=True)
class _Request:
    """What :func:`start` was asked for, checked and resolved."""

    argv: list[str]
    workdir: Path
    limits: Limits
    protected: list[Path]
    readonly: list[Path]
    writable: list[Path]
    visible: list[Path]
    env: dict[str, str]
    popen: dict  # stdin, stdout, stderr, pass_fds
    private_tmp: bool
    readonly_root: bool
    loopback: bool
    verify: bool
    backup_dir: Path | None
    hidden: list[Path] = field(default_factory=list)
    overlay: list[tuple[Path, Path]] = field(default_factory=list)
    drop_root: bool = True


def start(
    argv: Sequence[str],
    workdir: str | os.PathLike,
    limits: Limits | None = None,
    protected: Iterable[str | os.PathLike] = (),
    *,
    readonly: Iterable[str | os.PathLike] = (),
    env: Mapping[str, str] | None = None,
    stdin=None,
    stdout=None,
    stderr=None,
    pass_fds: Sequence[int] = (),
    mode: str = "auto",
    private_tmp: bool = True,
    readonly_root: bool = True,
    writable: Iterable[str | os.PathLike] = (),
    visible: Iterable[str | os.PathLike] = (),
    loopback: bool = False,
    verify: bool = False,
    backup_dir: str | os.PathLike | None = None,
    hidden: Iterable[str | os.PathLike] = (),
    overlay: Iterable[tuple[str | os.PathLike, str | os.PathLike]] = (),
    drop_root: bool = True,
) -> SandboxRun:
    """Start ``argv`` sandboxed in ``workdir`` (created; its cwd, HOME and TMPDIR).

    protected: kvlab's package and the instructor's files: read-only bind mounts in namespace
        mode; in the fallback, content-hashed and backed up before, verified and reverted
        after (``verify=True`` does that in namespace mode too).
    readonly: more paths to make read-only where namespaces allow, too big to hash in the
        fallback (the Python environment: ``environment_paths()``).
    stdin, stdout, stderr, pass_fds: as for ``subprocess.Popen``; the child gets exactly these.
    mode: "auto" (namespaces where :func:`probe` says they work, else the fallback),
        "namespace" (raise :class:`SandboxUnavailable` if it cannot be set up), "fallback".
    private_tmp: in namespace mode, hide the host's /tmp, /var/tmp and /run behind empty
        tmpfs mounts; the working folder, the protected paths, the interpreter and ``visible``
        stay where they are. (/dev is always replaced by a small one: null, zero, full,
        random, urandom, tty, the GPUs, a /dev/shm of the run's own.)
    readonly_root: in namespace mode, make every mount read-only but the working folder,
        ``writable`` and the run's own /tmp, /var/tmp, /run and /dev/shm. Off, the submission
        can write wherever the judge's user can.
    loopback: bring up ``lo`` in the run's network namespace (a Jupyter kernel and its client
        inside the run talk over it); the host's network stays out of reach.
    hidden: folders the run must not see (namespace mode): each is covered by an empty,
        read-only tmpfs, with the paths the run needs (the working folder, the protected,
        readonly and visible paths, the interpreter) and ``overlay`` bound back inside it.
        Outer folders are covered first. Where they cannot be hidden the run does not start.
    overlay: ``(source, target)`` pairs: ``source`` is bound at ``target``, which lies in a
        hidden folder (a file the run sees in place of the one it hides).
    drop_root: when the judge is root, the command runs as ``nobody`` (uid and gid 65534)
        in namespace mode, so the judge's private files (``/root``, ``/etc/shadow``) are
        closed to it; ``/root`` and ``/home`` are hidden too. The working folder is given to
        that user.

    Raises ``OSError`` (as Popen does) when the command cannot be executed. Call
    :meth:`SandboxRun.finish` (or use the run as a context manager) to end it. Start runs from
    a thread that outlives them: the shim dies with the thread that started it
    (PR_SET_PDEATHSIG), so that no sandbox outlives a judge that crashed.
    """
    limits = limits if limits is not None else Limits()
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise ValueError("argv must name a command")
    if mode not in ("auto", "namespace", "fallback"):
        raise ValueError(f"mode must be 'auto', 'namespace' or 'fallback', got {mode!r}")
    workdir = Path(workdir).resolve()
    protected = _existing(protected, "protected")
    readonly = _existing(readonly, "readonly")
    for p in (*protected, *readonly):
        if _inside(str(workdir), str(p)):
            raise ValueError(f"the working folder {workdir} lies inside the protected path {p}")
    workdir.mkdir(parents=True, exist_ok=True)
    request = _Request(
        argv=argv,
        workdir=workdir,
        limits=limits,
        protected=protected,
        readonly=readonly,
        writable=_existing(writable, "writable"),
        visible=[Path(p).resolve() for p in visible],
        env=sandbox_env(workdir, env),
        popen=dict(stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=tuple(pass_fds)),
        private_tmp=private_tmp,
        readonly_root=readonly_root,
        loopback=loopback,
        verify=verify,
        backup_dir=Path(backup_dir) if backup_dir is not None else None,
        hidden=sorted({Path(p).resolve() for p in hidden}, key=lambda p: len(str(p))),
        overlay=[(Path(a).resolve(), Path(b).absolute()) for a, b in overlay],
        drop_root=drop_root,
    )
    why_not = "fallback asked for"
    if mode == "auto":
        found = probe()
        isolated, why_not = found.available, found.reason
    else:
        isolated = mode == "namespace"
    note = None
    if isolated:
        try:
            return _start(request, isolated=True, why_not="")
        except SandboxUnavailable as err:
            if mode == "namespace":
                raise
            why_not, note = str(err), f"sandbox: namespaces failed to set up here ({err})"
    run = _start(dataclasses.replace(request, verify=True), isolated=False, why_not=why_not)
    if note:
        run.report.insert(0, note)
    return run


def launcher(
    limits: Limits | None = None,
    protected: Iterable[str | os.PathLike] = (),
    *,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=None,
    **options,
):
    """A ``(argv, pass_fds, cwd, env) -> Popen`` for a judge that starts its child that way.

    The Popen it returns carries its :class:`SandboxRun` as ``.sandbox`` (the report lines,
    ``finish()``). ``os.killpg(process.pid, SIGKILL)`` stops the whole run in both modes.
    """

    def launch(argv, pass_fds, cwd, env):
        run = start(
            argv,
            cwd,
            limits,
            protected,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=pass_fds,
            **options,
        )
        run.process.sandbox = run
        return run.process

    return launch


def kvlab_package_path() -> Path:
    """kvlab's own package folder: protect it in every run (the judge imports from it)."""
    return Path(__file__).resolve().parents[1]


def environment_paths() -> list[Path]:
    """This Python's installation (the venv and the interpreter it came from): worth making
    read-only for a run, so that one submission cannot change torch for the next."""
    return sorted({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _existing(paths: Iterable, what: str) -> list[Path]:
    out = []
    for p in paths:
        path = Path(p).resolve()
        if not path.exists():
            raise ValueError(f"{what} path {p} does not exist")
        out.append(path)
    return out


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _runtime_paths(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """What the command needs to see to start at all: the interpreter and the command."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]
    paths.append(str(kvlab_package_path()))
    paths.append(os.path.dirname(os.path.realpath(sys.executable)))
    found = shutil.which(argv[0], path=env.get("PATH"))
    if found:
        paths += [os.path.dirname(found), os.path.dirname(os.path.realpath(found))]
    return paths


def _process_limit(limits: Limits, isolated: bool):
    """How the process count is limited here: (pids cgroup or None, RLIMIT_NPROC headroom for
    the shim, or None for no RLIMIT_NPROC, report line)."""
    if limits.processes is None:
        return None, None, "processes: unlimited"
    root = os.geteuid() == 0
    cgroup = _pids_cgroup() if root else None
    if cgroup is not None:
        # the shim (and init) are in the cgroup too: the limit is the submission's own
        with contextlib.suppress(OSError):
            (cgroup / "pids.max").write_text(str(limits.processes + (2 if isolated else 1)))
        return cgroup, None, f"processes: at most {limits.processes} (pids cgroup; threads count)"
    if root:
        return (
            None,
            None,
            (
                "processes: NOT limited: root ignores RLIMIT_NPROC and no pids cgroup is writable here"
            ),
        )
    if isolated:  # the shim and init live in the run's user namespace too
        line = f"processes: at most {limits.processes} (RLIMIT_NPROC in the user namespace; threads count)"
        return None, 2, line
    line = (
        f"processes: at most {limits.processes} more than this user already runs "
        "(RLIMIT_NPROC counts all of the user's processes; threads count)"
    )
    return None, _user_tasks(os.getuid()) + 1, line


@dataclass(frozen=True)
class _Plan:
    """What a run's file system looks like: the folders covered (the host's /tmp, /var/tmp and
    /run; ``hidden``), the paths bound back inside them, and the user it runs as."""

    private: list[str]
    hidden: list[str]
    keep: list[str]
    drop_to: tuple[int, int] | None


def _start(req: _Request, isolated: bool, why_not: str) -> SandboxRun:
    """Start one run in the mode chosen: plan its file system, start the shim, wait for it to
    set the sandbox up (or say why it could not), and write what was in force."""
    guard = (
        TreeGuard.take(req.protected, req.backup_dir) if (req.protected and req.verify) else None
    )
    cgroup, extra_processes, process_line = _process_limit(req.limits, isolated)
    plan = _plan(req, isolated)
    memory_group = (
        _memory_cgroup(req.limits.memory_bytes) if isolated or os.geteuid() == 0 else None
    )
    ready_r, ready_w = os.pipe()
    status_r, status_w = os.pipe()
    spec = _spec(req, isolated, plan, extra_processes, (cgroup, memory_group))
    spec.update(ready_fd=ready_w, status_fd=status_w)
    started = time.monotonic()
    try:
        process = _popen(
            req, _command(spec, req.argv, isolated and plan.drop_to is None), ready_w, status_w
        )
    except BaseException:
        for fd in (ready_r, status_r):
            os.close(fd)
        _cleanup(guard, cgroup)
        _free_cgroup(memory_group)
        raise
    report: list[str] = []
    run = SandboxRun(
        process, report, req.limits, isolated, req.workdir, started, status_r, guard, cgroup
    )
    run._memory_group = memory_group
    notes = _await_setup(run, ready_r, req.argv)
    if isolated:
        report += _namespace_lines(req, plan, guard)
    else:
        report += _fallback_lines(req, why_not, guard, cgroup)
    report.extend(f"sandbox note: {n}" for n in notes)
    report.append(process_line)
    report += _limit_lines(req.limits, memory_group)
    return run


def _plan(req: _Request, isolated: bool) -> _Plan:
    """The folders a run covers, the paths it needs bound back inside them, and whether a
    root judge's run drops to nobody (not where nobody could not reach the working folder)."""
    workdir = req.workdir
    keep = [str(p) for p in (workdir, *req.writable, *req.protected, *req.readonly, *req.visible)]
    keep += _runtime_paths(req.argv, req.env)
    private = [d for d in PRIVATE_DIRS if os.path.isdir(d) and os.path.realpath(d) == d]
    private = private if (isolated and req.private_tmp) else []
    drop_to = _unprivileged_user() if (isolated and req.drop_root and os.geteuid() == 0) else None
    hidden = [str(p) for p in req.hidden if p.is_dir()] if isolated else []
    homes = [d for d in ("/root", "/home") if os.path.isdir(d) and os.path.realpath(d) == d]
    if drop_to is not None and not _reachable(workdir, [*private, *homes, *hidden]):
        drop_to = None  # a working folder nobody cannot reach (under the judge's own /tmp)
    if drop_to is not None:  # the judge's home: closed to nobody, and with it the interpreter
        hidden = sorted({*homes, *hidden}, key=len)
        with contextlib.suppress(OSError):
            os.chown(workdir, *drop_to)
    covered = [*private, *hidden]
    keep = sorted(
        {p for p in keep if os.path.exists(p) and any(_inside(p, d) for d in covered)}, key=len
    )
    return _Plan(private, hidden, keep, drop_to)


def _spec(req: _Request, isolated: bool, plan: _Plan, extra_processes, groups) -> dict:
    """What the shim is told to set up (kvlab.grading.sandbox_shim reads it)."""
    limits = req.limits
    spec_limits = dataclasses.asdict(limits)
    spec_limits.pop("wall_seconds")
    if extra_processes is None:
        spec_limits["processes"] = None
    return {
        "mode": "namespace" if isolated else "fallback",
        "parent": os.getpid(),
        "workdir": str(req.workdir),
        "writable": [str(p) for p in (req.workdir, *req.writable)],
        "readonly_root": req.readonly_root,
        "private": plan.private,
        "keep": plan.keep,
        "tmpfs_bytes": limits.output_bytes or 256 * MiB,
        "readonly": [str(p) for p in (*req.protected, *req.readonly)] if isolated else [],
        "loopback": req.loopback,
        "limits": spec_limits,
        "extra_processes": extra_processes or 0,
        "wall_seconds": limits.wall_seconds,
        "cgroup_procs": [str(g / "cgroup.procs") for g in groups if g],
        "hidden": plan.hidden,
        "overlay": [[str(a), str(b)] for a, b in req.overlay],
        "drop_to": plan.drop_to,
        "workdir_bytes": limits.disk_bytes if isolated else None,
    }


def _command(spec: dict, argv: list[str], unshare: bool) -> list[str]:
    """The shim with its spec and the command; behind ``unshare`` where the run gets its
    namespaces that way (a root judge dropping to nobody: the shim makes them itself)."""
    prefix = []
    if unshare:
        path = shutil.which("unshare") or "unshare"
        prefix = [path, "--user", "--map-root-user", "--mount", "--net", "--ipc", "--uts", "--"]
    return [*prefix, sys.executable, "-I", "-S", str(SHIM), json.dumps(spec), "--", *argv]


def _popen(req: _Request, command: list[str], *shim_fds: int) -> subprocess.Popen:
    """The shim's process, in a session of its own; the shim's ends of its pipes are closed
    here once it has them (or could not start)."""
    try:
        return subprocess.Popen(
            command,
            stdin=req.popen["stdin"],
            stdout=req.popen["stdout"],
            stderr=req.popen["stderr"],
            pass_fds=(*req.popen["pass_fds"], *shim_fds),
            cwd=req.workdir,
            env=req.env,
            start_new_session=True,
        )
    finally:
        for fd in shim_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _await_setup(run: SandboxRun, ready_fd: int, argv: list[str]) -> list[str]:
    """The shim's notes once the command runs; raises (the run stopped) where the sandbox could
    not be set up (:class:`SandboxUnavailable`) or the command not executed (``OSError``)."""
    try:
        messages = _read_ready(ready_fd)
    except SandboxUnavailable:
        run.kill()
        run.finish()
        raise
    setup = [m[len("setup: ") :] for m in messages if m.startswith("setup: ")]
    failed_exec = [m for m in messages if m.startswith("exec: ")]
    if "shim" not in messages and not setup:
        # unshare failed before the shim ran (it said why on the child's stderr).
        run.process.wait()
        setup.append(
            f"unshare exited with status {run.process.returncode} before the sandbox started"
        )
    if setup or failed_exec:
        run.kill()
        run.finish()
        if setup:
            raise SandboxUnavailable("; ".join(setup))
        _, number, text = failed_exec[0].split(": ", 2)
        raise OSError(int(number), text.rsplit(": ", 1)[0], argv[0])
    return [m[len("note: ") :] for m in messages if m.startswith("note: ")]


def _namespace_lines(req: _Request, plan: _Plan, guard: TreeGuard | None) -> list[str]:
    """The report of a run in namespaces: what it sees, writes and runs as."""
    lines = [
        "sandbox: Linux namespaces (user, PID, mount, network, IPC, UTS); "
        f"working folder {req.workdir}",
        "network: none (network namespace"
        + (", with a loopback of its own)" if req.loopback else ")"),
    ]
    if req.protected:
        how = "read-only" + (" and checked by content hash" if guard else "")
        lines.append(f"kvlab package and instructor files: {how} ({_paths(req.protected)})")
    if req.readonly:
        lines.append(f"read-only as well: {_paths(req.readonly)}")
    if req.readonly_root:
        own = ", ".join([*plan.private, "/dev/shm"])
        lines.append(
            "file system: read-only but the working folder"
            + "".join(f", {w}" for w in req.writable)
            + f" and the run's own {own}"
        )
    else:
        lines.append("file system: writable wherever the judge's user can write")
    lines.append(
        f"host's {', '.join([*plan.private, '/dev'])}: hidden "
        "(its /dev has null, zero, full, random, urandom, tty and the GPUs)"
    )
    if plan.hidden:
        lines.append(
            f"hidden: {', '.join(plan.hidden)} (empty, but for the paths this run needs"
            + (f" and {len(req.overlay)} files put in their place)" if req.overlay else ")")
        )
    if plan.drop_to is not None:
        lines.append(f"user: nobody (uid {plan.drop_to[0]}), not the judge's root")
    elif os.geteuid() == 0:
        lines.append(
            "user: ROOT inside the namespaces (the judge's root, without capabilities): "
            "its private files are readable"
        )
    limits = req.limits
    if limits.disk_bytes is not None:
        lines.append(
            f"disk: the working folder is a tmpfs of {_size(limits.disk_bytes)} (all its "
            f"files together); /tmp, /var/tmp, /run and /dev/shm hold "
            f"{_size(limits.output_bytes or 256 * MiB)} each"
        )
    return lines


def _fallback_lines(req: _Request, why_not: str, guard: TreeGuard | None, cgroup) -> list[str]:
    """The report of a run without namespaces: what it could reach, and what was checked."""
    lines = [f"sandbox: fallback, no namespaces ({why_not}); working folder {req.workdir}"]
    if why_not == "fallback asked for":
        lines.append("network: ON — namespaces not used (fallback asked for)")
    else:
        lines.append(f"network: ON — unshare unavailable here: {why_not}")
    if req.protected:
        lines.append(
            f"kvlab package and instructor files: checked by content hash "
            f"({guard.files if guard else 0} entries in {_paths(req.protected)}): a change "
            "is reverted and fails the submission"
        )
    if req.readonly:
        lines.append(f"NOT protected (too big to hash): {_paths(req.readonly)}")
    if os.geteuid() == 0:
        lines.append(
            "file system: WRITABLE as root: the submission can change anything on this "
            "machine but what is hashed above"
        )
    else:
        lines.append("file system: writable wherever this user can write")
    if cgroup is None:
        lines.append(
            "processes that start a session of their own can outlive the run (no PID namespace)"
        )
    else:
        lines.append("processes left behind are killed at the end (pids cgroup)")
    return lines


def _limit_lines(limits: Limits, memory_group: Path | None) -> list[str]:
    """The report's lines on memory and on the limits (the process count has its own)."""
    lines = []
    if memory_group is not None:
        lines.append(
            f"memory: at most {_size(limits.memory_bytes)} for the whole run (memory cgroup: "
            "RAM and tmpfs files of all its processes together)"
        )
    elif limits.memory_bytes is not None:
        lines.append(
            "memory: per process only (no memory cgroup is writable here): "
            f"{limits.processes or 'any number of'} processes of {_size(limits.memory_bytes)} each"
        )
    lines.append(f"limits: {limits.describe()}")
    return lines


NOBODY = 65534


def _reachable(path: Path, covered: list[str]) -> bool:
    """Whether any user may walk down to ``path``: each folder above it is searchable by
    others, or lies in a folder the run covers (whose kept paths are searchable)."""
    for parent in path.parents:
        if any(_inside(str(parent), d) for d in covered):
            continue
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return True


def _unprivileged_user() -> tuple[int, int]:
    """(uid, gid) a root judge's submission runs as: nobody's, else 65534."""
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return NOBODY, NOBODY


def _paths(paths) -> str:
    return ", ".join(str(p) for p in paths)


def _cleanup(guard, cgroup):
    if guard is not None:
        guard.close()
    _free_cgroup(cgroup)


def _read_ready(fd: int) -> list[str]:
    """The shim's setup messages, up to the EOF that the command's exec causes."""
    data = b""
    deadline = time.monotonic() + READY_TIMEOUT
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.close(fd)
                raise SandboxUnavailable("the sandbox shim did not start the command in time")
            if not sel.select(left):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    os.close(fd)
    return data.decode(errors="replace").splitlines()


# ---------------------------------------------------------------------------- explaining

_WALL = (
    "wall time limit hit: still running after {}, so it was stopped with every process it started"
)
_CPU = "CPU time limit hit: a process used more than {} of CPU time"
_EXIT_FIELD = {signal.SIGXCPU: "cpu_seconds", signal.SIGXFSZ: "output_bytes"}


def explain_exit(returncode: int | None, limits: Limits, elapsed: float) -> str | None:
    """A report line when the exit status says a limit stopped the run, else None.

    SIGXCPU is the CPU-time limit, SIGXFSZ the file-size limit (Python programs ignore it and
    get "File too large" instead: see :func:`explain_output`), SIGKILL at or past the wall time
    is the wall-time limit. Running out of memory shows as an error message, not a status.
    """
    if returncode == -signal.SIGXCPU:
        return _CPU.format(_seconds(limits.cpu_seconds) if limits.cpu_seconds else "its limit")
    if returncode == -signal.SIGXFSZ:
        size = _size(limits.output_bytes) if limits.output_bytes else "its limit"
        return f"output size limit hit: a file grew past {size}"
    if (
        returncode == -signal.SIGKILL
        and limits.wall_seconds is not None
        and elapsed >= limits.wall_seconds * 0.99
    ):
        return _WALL.format(_seconds(limits.wall_seconds))
    return None


_OUTPUT_SIGNS = (
    (
        "memory_bytes",
        (
            "MemoryError",
            "Cannot allocate memory",
            "std::bad_alloc",
            "failed to map segment",
            "Memory allocation still failed",
            "DefaultCPUAllocator: can't allocate memory",
        ),
        "memory limit hit (probably): the submission asked for more than {memory} of memory",
    ),
    ("output_bytes", ("File too large",), "output size limit hit: a file grew past {output}"),
    (
        "open_files",
        ("Too many open files",),
        "open files limit hit: more than {files} open at once",
    ),
    (
        "processes",
        (
            "can't start new thread",
            "Thread creation failed",
            "Cannot fork",
            "fork: Resource temporarily unavailable",
            "BlockingIOError: [Errno 11]",
        ),
        "processes limit hit (probably): more than {processes} processes and threads",
    ),
)


def _explain_output(text: str, limits: Limits) -> list[tuple[str, str]]:
    if not text:
        return []
    values = {
        "memory": _size(limits.memory_bytes) if limits.memory_bytes else "what the machine has",
        "output": _size(limits.output_bytes) if limits.output_bytes else "what the disk allows",
        "files": limits.open_files or "the system allows",
        "processes": limits.processes or "the system allows",
    }
    return [
        (name, line.format(**values))
        for name, signs, line in _OUTPUT_SIGNS
        if any(sign in text for sign in signs)
    ]


def explain_output(text: str, limits: Limits) -> list[str]:
    """Report lines for limits that show only as error messages in the child's stderr:
    MemoryError / "Cannot allocate memory", "File too large", "Too many open files", a fork or
    thread that could not start."""
    return [line for _, line in _explain_output(text, limits)]


def _ending(returncode: int, elapsed: float, cpu: float | None, rss: int | None) -> str:
    how = how_it_ended(returncode)
    extra = []
    if cpu is not None:
        extra.append(f"CPU {cpu:.2f} s")
    if rss is not None:
        extra.append(f"peak memory {_size(rss)}")
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"ended: {how} after {elapsed:.2f} s{tail}"


__all__ = [
    "Limits",
    "Outcome",
    "Probe",
    "SandboxRun",
    "SandboxUnavailable",
    "TreeGuard",
    "digest_tree",
    "environment_paths",
    "explain_exit",
    "explain_output",
    "kvlab_package_path",
    "launcher",
    "probe",
    "sandbox_env",
    "start",
]
