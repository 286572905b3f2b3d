"""``kvlab start [DIR]``: the course's labs in a folder of the learner's, then JupyterLab there.

This is the way in without a checkout (``pip install`` of the wheel). A learner's notebook is
theirs: a lab that is already there and differs from the course's copy is never overwritten; the
course's version goes beside it, named after kvlab's version (``03_paged_allocator.kvlab-0.1.0.ipynb``).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from kvlab.core import files
from kvlab.course.lab_settings import write_overrides

DEFAULT_DIR = "kvlab-labs"


class StartError(Exception):
    """A folder that ``kvlab start`` cannot use (exit status 2)."""


@dataclass(frozen=True)
class Placed:
    """What became of one lab: ``copied``, ``unchanged`` or ``kept`` (the learner's edited copy
    stays; ``beside`` is the course's copy next to it, ``new`` whether it was written now)."""

    name: str
    action: str
    beside: str | None = None
    new: bool = False

    def line(self) -> str:
        if self.action == "kept":
            how = "is now beside it" if self.new else "was already beside it"
            return (
                f"  kept      {self.name} (yours, edited); the course's copy {how}: {self.beside}"
            )
        return f"  {self.action:9s} {self.name}"


def side_names(name: str, version: str):
    """Names for the course's copy beside an edited lab: ``NN_x.kvlab-V.ipynb``, then ``-2``, ..."""
    stem = name.removesuffix(".ipynb")
    yield f"{stem}.kvlab-{version}.ipynb"
    n = 2
    while True:
        yield f"{stem}.kvlab-{version}-{n}.ipynb"
        n += 1


def _write_new(path: Path, data: bytes) -> bool:
    """Write ``data`` to a path that must not exist yet (never clobbers); False if it does."""
    try:
        with open(path, "xb") as f:
            f.write(data)
    except FileExistsError:
        return False
    return True


def _folder(target: Path) -> Path:
    if target.exists() and not target.is_dir():
        raise StartError(f"DIR {target} is a file, not a folder: name a folder (new or existing)")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StartError(f"cannot create the folder DIR {target}: {e.strerror or e}") from None
    if not os.access(target, os.W_OK | os.X_OK):
        raise StartError(f"DIR {target} is not writable: choose a folder of yours")
    return target


def place_labs(target: Path, labs: list[Path], version: str) -> list[Placed]:
    """Copy each lab into ``target``, never overwriting a file that is already there."""
    target = _folder(Path(target))
    placed = []
    for lab in labs:
        data = lab.read_bytes()
        dest = target / lab.name
        try:
            if _write_new(dest, data):
                placed.append(Placed(lab.name, "copied"))
            elif dest.read_bytes() == data:
                placed.append(Placed(lab.name, "unchanged"))
            else:
                for name in side_names(lab.name, version):
                    side = target / name
                    if _write_new(side, data):
                        placed.append(Placed(lab.name, "kept", name, new=True))
                        break
                    if side.read_bytes() == data:
                        placed.append(Placed(lab.name, "kept", name))
                        break
        except OSError as e:
            raise StartError(f"cannot write into DIR {target}: {e.strerror or e}") from None
    return placed


def _this_python(command: str) -> bool:
    """Whether a kernelspec's interpreter is this one (``python``: Jupyter's own, also this one
    when ``kvlab start`` opens JupyterLab)."""
    if command in ("python", "python3"):
        return True
    return os.path.abspath(command) == os.path.abspath(sys.executable)


def ensure_kernel() -> str:
    """Register the ``kvlab`` kernel for this Python unless Jupyter already finds it; say which."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        return "kernel: Jupyter is not installed here (pip install jupyterlab, then `kvlab kernel`)"
    from kvlab.course.jupyter_kernel import DISPLAY_NAME, KERNEL_NAME, install, launches_kvlab

    def found():
        try:
            spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        except NoSuchKernel:
            return None
        return spec, launches_kvlab(spec.argv) and _this_python(spec.argv[0])

    current = found()
    if current and current[1]:
        return f"kernel: '{DISPLAY_NAME}' is registered ({current[0].resource_dir})"
    for where in ({"prefix": sys.prefix}, {"user": True}):
        try:
            path = install(**where)
            break
        except OSError:
            continue
    else:
        return f"kernel: could not register '{DISPLAY_NAME}': run `kvlab kernel --user`"
    current = found()
    if current and not current[1]:
        return (
            f"kernel: registered '{DISPLAY_NAME}' in {path}, but Jupyter finds another "
            f"'{KERNEL_NAME}' kernel first ({current[0].resource_dir}, {current[0].argv[0]})"
        )
    return f"kernel: registered '{DISPLAY_NAME}' in {path}"


def lab_command(
    folder: Path,
    first_lab: str,
    port: int | None = None,
    environ: dict | None = None,
    system: str | None = None,
    uid: int | None = None,
) -> list[str]:
    """JupyterLab on ``folder``, opening ``first_lab``, as ``make lab`` starts it: no browser
    where there is no display (the URL with its token is printed), ``--allow-root`` as root."""
    env = os.environ if environ is None else environ
    system = platform.system() if system is None else system
    uid = (os.getuid() if hasattr(os, "getuid") else None) if uid is None else uid
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ip=127.0.0.1",
        f"--ServerApp.root_dir={folder}",
        f"--LabApp.default_url=/lab/tree/{quote(first_lab)}",
    ]
    if port is not None:
        argv.append(f"--port={port}")
    if system not in ("Darwin", "Windows") and not (
        env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")
    ):
        argv.append("--no-browser")
    if uid == 0:
        argv.append("--allow-root")
    return argv


def main(folder: str | Path = DEFAULT_DIR, lab: bool = True, port: int | None = None) -> int:
    """Copy the labs, register the kernel, open JupyterLab (unless ``lab=False``). Returns the
    exit status: 2 for a folder it cannot use, 1 when the course or JupyterLab is missing."""
    from kvlab._version import __version__
    from kvlab.ops.runtime import child_environ

    target = Path(folder).expanduser().absolute()
    try:
        labs = files.lab_notebooks()
    except FileNotFoundError as e:
        print(f"kvlab start: {e}", file=sys.stderr)
        return 1
    try:
        placed = place_labs(target, labs, __version__)
    except StartError as e:
        print(f"kvlab start: error: {e}", file=sys.stderr)
        return 2
    print(f"kvlab {__version__}: the course's {len(labs)} labs in {target}")
    for p in placed:
        print(p.line())
    print(ensure_kernel())
    try:  # as `make lab` does: no news toast over the outputs, no update check; with --no-lab
        write_overrides(sys.prefix)  # too, for a JupyterLab of the learner's own on this Python
    except OSError:
        pass  # a read-only environment: JupyterLab's own defaults, which is fine
    if not lab:
        print(
            f"to open them: kvlab start {shlex.quote(str(target))}  (or open that folder in Jupyter)"
        )
        return 0
    if importlib.util.find_spec("jupyterlab") is None:
        print(
            "kvlab start: JupyterLab is not installed here: pip install jupyterlab", file=sys.stderr
        )
        return 1
    argv = lab_command(target, labs[0].name, port)
    print(f"starting JupyterLab: {shlex.join(argv)}", flush=True)
    if os.name == "posix":  # JupyterLab takes this process over: Ctrl-C reaches it alone
        os.execve(argv[0], argv, child_environ())
    return subprocess.call(argv, env=child_environ())
