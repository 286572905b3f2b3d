"""The ``kvlab`` Jupyter kernel: ipykernel, started after kvlab has chosen where Triton runs.

Choosing in a notebook cell is too late when an earlier cell imported Triton, so the kernelspec
that ``make lab`` (or ``kvlab kernel``) registers launches ``python -m kvlab.course.jupyter_kernel``:
it sets ``TRITON_INTERPRET=1`` when no CUDA GPU is visible, then starts an ordinary IPython
kernel. Nothing else is imported (no Triton, no kvlab modules in the user namespace).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "kvlab"
DISPLAY_NAME = "kvlab (Python 3)"
MODULE = "kvlab.course.jupyter_kernel"  # what the kernelspec runs with `python -m`


def kernel_argv(python: str = "python") -> list[str]:
    """The kernelspec's command. ``python`` is replaced by Jupyter with its own interpreter."""
    return [python, "-m", MODULE, "-f", "{connection_file}"]


def kernel_json(python: str = "python") -> dict:
    return {
        "argv": kernel_argv(python),
        "display_name": DISPLAY_NAME,
        "language": "python",
        "metadata": {"debugger": True},
    }


def write_kernelspec(directory: str | Path, python: str = "python") -> Path:
    """Write a kernelspec folder (kernel.json and ipykernel's logos) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        from ipykernel.kernelspec import RESOURCES

        for logo in Path(RESOURCES).glob("logo-*.png"):
            (directory / logo.name).write_bytes(logo.read_bytes())
    except ImportError:
        pass
    (directory / "kernel.json").write_text(json.dumps(kernel_json(python), indent=1) + "\n")
    return directory


def install(user: bool = False, prefix: str | None = None) -> str:
    """Register the kernel (by default in this environment, ``sys.prefix``); return its folder."""
    from jupyter_client.kernelspec import KernelSpecManager

    if prefix is None and not user:
        prefix = sys.prefix
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_kernelspec(Path(tmp) / KERNEL_NAME, python=sys.executable)
        return KernelSpecManager().install_kernel_spec(
            str(spec), KERNEL_NAME, user=user, prefix=prefix
        )


def launches_kvlab(argv: list[str]) -> bool:
    """Whether a kernelspec's command starts through this module (so import order is safe).

    A kernelspec registered before the package was grouped by layer names the module's old path,
    which still runs it.
    """
    from kvlab._moved import MOVED

    names = {MODULE} | {old for old, new in MOVED.items() if new == MODULE}
    return any(name in argv for name in names)


def main() -> None:
    from kvlab.ops.runtime import configure_triton

    configure_triton()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
