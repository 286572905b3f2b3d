"""Where the course's files are, so a wheel is the whole course.

A git checkout keeps them in its top-level folders (``labs/``, ``assets/traces/``,
``assets/tiny_model/``); a built wheel carries copies of the same tree inside the package, in
``kvlab/_bundled/`` (``setup.py`` puts them there). Readers (traces, the tiny model, the labs)
ask :func:`course_path`, which tries the checkout, then the bundle. Writers that belong to a
checkout (``kvlab labs``, retraining the tiny model, benchmarks) ask :func:`checkout_path`, which
says so when kvlab was installed from a wheel.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the kvlab package
BUNDLE_DIRNAME = "_bundled"


def bundle_root(package_dir: Path = PACKAGE_DIR) -> Path:
    """Where a wheel keeps its copy of the course (it mirrors the checkout's folders)."""
    return package_dir / BUNDLE_DIRNAME


def checkout_root(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The git checkout this kvlab runs from (an editable install), or None (a wheel)."""
    root = package_dir.parent
    if (root / "pyproject.toml").is_file() and (root / "solutions").is_dir():
        return root
    return None


def course_root(package_dir: Path = PACKAGE_DIR) -> tuple[str, Path] | None:
    """("checkout" | "bundle", its folder) for the course's files here, or None."""
    checkout = checkout_root(package_dir)
    if checkout is not None:
        return "checkout", checkout
    bundle = bundle_root(package_dir)
    return ("bundle", bundle) if bundle.is_dir() else None


def course_path(*parts: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """A course file or folder, e.g. ``course_path("assets", "traces")``, from the checkout (the
    source) or else the wheel's bundle. Raises FileNotFoundError saying what is missing and how
    to get it back."""
    if not parts:
        raise ValueError("course_path needs a relative path, e.g. course_path('labs')")
    relative = Path(*parts)
    where = course_root(package_dir)
    if where is not None and (where[1] / relative).exists():
        return where[1] / relative
    beside = package_dir.parent / relative
    if where is None and relative.parts[0] == "assets" and _course_assets(package_dir.parent):
        # a checkout seen from the grader's sandbox, which shows a submission only the checkout's
        # assets (not its pyproject.toml or solutions/, so it does not look like a checkout)
        if beside.exists():
            return beside
    if where is not None and where[0] == "checkout":
        fix = f"restore it with `git -C {where[1]} checkout -- {relative.as_posix()}`"
        looked = f"in the checkout {where[1]}"
    else:
        fix = (
            "this kvlab was installed without its course files: reinstall it from a wheel built by "
            "`make wheel` (pip install --force-reinstall kvlab-*.whl), or use a git checkout"
        )
        looked = f"in the checkout {package_dir.parent} or the bundle {bundle_root(package_dir)}"
    raise FileNotFoundError(
        f"kvlab's course file {relative.as_posix()} is missing ({looked}): {fix}"
    )


def _course_assets(root: Path) -> bool:
    """Whether ``root/assets`` is this course's (its traces and tiny model), not some other
    project's folder of that name."""
    assets = root / "assets"
    return (assets / "traces" / "sharegpt_like.csv").is_file() and (
        assets / "tiny_model" / "config.json"
    ).is_file()


def labs_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """The learner notebooks (``NN_name.ipynb``)."""
    return course_path("labs", package_dir=package_dir)


def lab_notebooks(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every learner notebook, in lab order."""
    folder = labs_dir(package_dir)
    labs = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not labs:
        raise FileNotFoundError(f"kvlab's labs folder {folder} holds no NN_name.ipynb notebook")
    return labs


def traces_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """The recorded workload traces (``sharegpt_like.csv``, ...)."""
    return course_path("assets", "traces", package_dir=package_dir)


def tiny_model_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """The tiny model's weights, config and README."""
    return course_path("assets", "tiny_model", package_dir=package_dir)


def checkout_path(*parts: str, purpose: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """A path inside the git checkout, for a command that writes the course's sources.
    ``purpose`` names that command in the error raised when kvlab runs from a wheel."""
    root = checkout_root(package_dir)
    if root is None:
        raise FileNotFoundError(
            f"{purpose} writes into a git checkout of kvlab, and this kvlab is installed from a "
            f"wheel ({package_dir}): run it in a checkout (git clone, then `make install`)"
        )
    return root.joinpath(*parts)
