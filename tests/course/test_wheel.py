"""The course from a built wheel, installed as Colab, Kaggle, conda or a hub image installs it: no
checkout, no editable install, nothing exported.

Once per session: an sdist of a clean copy of the checkout, a wheel of the copy and a wheel of the
sdist (both must carry the course), the latter installed (not editable) into a fresh venv that
borrows this environment's dependencies through a ``.pth`` file (nothing is downloaded). Then,
from a folder outside any checkout: ``kvlab start``, the course's files read from the wheel, and
every lab run in a plain ``python3`` kernel, where only exercise cells may raise.
"""

import importlib.util
import json
import os
import shutil
import site
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import cpu_limit
import nbformat
import pytest
from conftest import LEARNER_ENV, ROOT

pytestmark = pytest.mark.slow

LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
NO_EXERCISES = {"08_leaders_brief.ipynb"}  # the leader's brief: no code to write
# what a clean checkout would not hold: environments, build outputs, caches, run outputs
NOT_IN_A_CHECKOUT = shutil.ignore_patterns(
    *(".git", ".venv*", ".whl", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"),
    *(".hypothesis", ".ipynb_checkpoints", "artifacts", "leader_brief", "_bundled"),
)
# what a learner's shell would not set: kvlab's choice, this test run's PYTHONPATH, a venv
NOT_EXPORTED = {
    *("PYTHONPATH", "PYTHONHOME", "TRITON_INTERPRET", "KVLAB_SET_TRITON_INTERPRET", "VIRTUAL_ENV"),
    *("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR"),
}


def run(argv, *, cwd, env=None, cpu=300, check=True):
    # cpu: CPU-seconds of the whole tree; a wall-clock backstop of 10 x (cpu_limit)
    out = cpu_limit.run(
        [str(a) for a in argv], cpu=cpu, cwd=cwd, env=env, capture_output=True, text=True
    )
    if check:
        assert out.returncode == 0, f"{argv}: {out.stdout}\n{out.stderr}"
    return out


def pip(*args, cwd, env):
    base = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    return run([*base, *args, "--no-deps", "--no-index", "--no-cache-dir"], cwd=cwd, env=env)


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The sdist of a clean copy of the checkout, a wheel of the copy and one of the sdist."""
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in LEARNER_ENV.items() if k not in NOT_EXPORTED}
    src = tmp / "checkout"
    shutil.copytree(ROOT, src, ignore=NOT_IN_A_CHECKOUT)
    sdist = "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])"
    run([sys.executable, "-c", sdist, tmp / "sdist"], cwd=src, env=env)
    wheel = ["wheel", "--no-build-isolation", "-w"]
    pip(*wheel, tmp / "direct", src, cwd=tmp, env=env)
    pip(*wheel, tmp / "from-sdist", only(tmp / "sdist", "kvlab-*.tar.gz"), cwd=tmp, env=env)
    print(f"\nwheel: sdist and two wheels built in {time.monotonic() - started:.1f} s")
    return SimpleNamespace(
        tmp=tmp,
        env=env,
        wheel=only(tmp / "direct", "kvlab-*.whl"),
        sdist_wheel=only(tmp / "from-sdist", "kvlab-*.whl"),
    )


def _dependency_dirs() -> list[str]:
    """Where this environment's packages are: the fresh venv reads its dependencies there."""
    dirs = [*site.getsitepackages()]
    for name in ("torch", "triton", "jupyterlab", "ipykernel", "nbclient"):  # found, not imported
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(str(Path(spec.origin).parents[1]))
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and Path(d) != ROOT]


@pytest.fixture(scope="module")
def venv(build):
    """A fresh venv with the wheel installed, not editable; dependencies borrowed by .pth."""
    root = build.tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", root], cwd=build.tmp, env=build.env)
    python = root / "bin" / "python"
    # installed before the .pth exists, so pip never sees this environment's (editable) kvlab
    pip("--python", python, "install", build.sdist_wheel, cwd=build.tmp, env=build.env)
    site_packages = only(root, "lib/python*/site-packages")
    (site_packages / "_kvlab_test_dependencies.pth").write_text("\n".join(_dependency_dirs()))
    # the venv's own `python3` kernelspec, found first; this environment's labextensions after
    jupyter = [root / "share" / "jupyter", Path(sys.prefix) / "share" / "jupyter"]
    env = {**build.env, "JUPYTER_PATH": os.pathsep.join(map(str, jupyter))}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    kernelspec = ["install", "--prefix", root, "--name", "python3"]
    run([python, "-m", "ipykernel", *kernelspec], cwd=root, env=env)
    home = build.tmp / "home"  # outside any checkout
    home.mkdir()
    return SimpleNamespace(
        root=root,
        python=python,
        kvlab=root / "bin" / "kvlab",
        site=site_packages,
        env=env,
        home=home,
    )


@pytest.fixture(scope="module")
def started(venv):
    """``kvlab start course --no-lab`` from the learner's home: (its output, the folder)."""
    out = run([venv.kvlab, "start", "course", "--no-lab"], cwd=venv.home, env=venv.env)
    return out.stdout, venv.home / "course"


def test_the_wheel_carries_the_course_and_no_solutions(build):
    names = zipfile.ZipFile(build.wheel).namelist()
    assert sorted(zipfile.ZipFile(build.sdist_wheel).namelist()) == sorted(names), (
        "the wheel built from the sdist differs: MANIFEST.in misses something"
    )
    with zipfile.ZipFile(build.sdist_wheel) as wheel:
        for lab in LABS:
            assert wheel.read(f"kvlab/_bundled/labs/{lab.name}") == lab.read_bytes()
        for path in [*ROOT.glob("assets/traces/*.csv"), *ROOT.glob("assets/tiny_model/*")]:
            assert (
                wheel.read(f"kvlab/_bundled/{path.relative_to(ROOT).as_posix()}")
                == path.read_bytes()
            )
    assert {
        "kvlab/ui/widgets/hotel.js",
        "kvlab/ui/widgets/hotel.css",
        "kvlab/core/files.py",
    } <= set(names)
    assert not [n for n in names if "solution" in n.lower() or n.startswith("tests/")]
    size = build.sdist_wheel.stat().st_size
    print(f"\nwheel: {build.sdist_wheel.name}, {size / 2**20:.2f} MiB, {len(names)} files")


PROBE = """
import contextlib, io, json, sys
import kvlab
from kvlab.core import files
from kvlab.course.doctor import diagnose
from kvlab.grading.judge import lab_notebook
from kvlab.models.tiny import load_model
from kvlab.models.tiny.train import main as retrain
from kvlab.serving.workload import load_trace, write_traces
refused = []
for attempt in (write_traces, lambda: retrain([])):
    try:
        attempt()
    except (FileNotFoundError, SystemExit) as e:
        refused.append(str(e))
print(json.dumps({
    "kvlab": kvlab.__file__, "root": [str(p) for p in files.course_root()],
    "trace": len(load_trace("sharegpt_like")), "params": load_model().num_params,
    "judged_lab": str(lab_notebook("01")), "refused": refused,
    "describe": kvlab.ops.runtime.describe(), "sys_path": sys.path,
    "doctor": [(f.ok, f.what, f.fix) for f in diagnose(start_kernel=False)],
}))
"""


def test_python_imports_the_wheel_and_reads_the_course_from_it(started, venv):
    """kvlab is the wheel's; traces, the tiny model, the judge's labs and doctor's findings come
    from its bundle; writers of the checkout refuse with a reason."""
    out = json.loads(run([venv.python, "-c", PROBE], cwd=venv.home, env=venv.env).stdout)
    assert out["kvlab"] == str(venv.site / "kvlab" / "__init__.py"), out["sys_path"]
    assert out["root"] == ["bundle", str(venv.site / "kvlab" / "_bundled")]
    assert out["trace"] == 400 and out["params"] == 820_352
    assert out["judged_lab"] == str(venv.site / "kvlab/_bundled/labs" / LABS[1].name)
    workload, train = out["refused"]  # writers of the checkout say they need one
    assert workload.startswith("python -m kvlab.serving.workload writes into a git checkout")
    assert train.startswith("python -m kvlab.models.tiny.train (it reads solutions/")
    assert out["describe"].startswith("kvlab 0.1.0, torch ") and ": kernels " in out["describe"]
    assert [what for ok, what, fix in out["doctor"] if not ok] == [], out["doctor"]
    course = f"course files: {len(LABS)} labs, 2 traces, the tiny model (bundled in the package"
    assert any(what.startswith(course) for _, what, _ in out["doctor"]), out["doctor"]


def test_commands_that_write_a_checkout_say_they_need_one(venv):
    labs = run([venv.kvlab, "labs"], cwd=venv.home, env=venv.env, check=False)
    assert labs.returncode == 2 and "installed from a wheel" in labs.stderr
    bench = run([venv.kvlab, "bench", "allocator"], cwd=venv.home, env=venv.env, check=False)
    assert bench.returncode == 2 and bench.stdout.rstrip().endswith("or pass --out PATH")


def test_start_copies_the_labs_and_registers_the_kernel(started, venv):
    stdout, course = started
    assert [f"  copied    {lab.name}" in stdout for lab in LABS] == [True] * len(LABS), stdout
    for lab in LABS:
        assert (course / lab.name).read_bytes() == lab.read_bytes()
    spec = venv.root / "share" / "jupyter" / "kernels" / "kvlab" / "kernel.json"
    assert f"kernel: registered 'kvlab (Python 3)' in {spec.parent}" in stdout
    assert json.loads(spec.read_text())["argv"][:3] == [
        str(venv.python),
        "-m",
        "kvlab.course.jupyter_kernel",
    ]


def test_start_again_keeps_an_edited_lab_and_puts_the_new_one_beside_it(venv):
    folder = venv.home / "again"
    run([venv.kvlab, "start", folder, "--no-lab"], cwd=venv.home, env=venv.env)
    edited = folder / LABS[3].name
    nb = nbformat.read(edited, as_version=4)
    nb.cells[1].source += "\n# my note"
    nbformat.write(nb, edited)
    mine = edited.read_bytes()
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    out = run([venv.kvlab, "start", folder, "--no-lab"], cwd=venv.home, env=venv.env).stdout
    side = folder / f"{LABS[3].stem}.kvlab-0.1.0.ipynb"
    assert (
        f"kept      {edited.name} (yours, edited); the course's copy is now beside it: {side.name}"
        in out
    )
    assert edited.read_bytes() == mine and side.read_bytes() == LABS[3].read_bytes()
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p != side} == before
    assert out.count("  unchanged ") == len(LABS) - 1
    bad = run([venv.kvlab, "start", edited, "--no-lab"], cwd=venv.home, env=venv.env, check=False)
    assert bad.returncode == 2 and "is a file, not a folder" in bad.stderr


def test_the_kernel_is_a_plain_python3_of_the_venv(venv):
    code = "from jupyter_client.kernelspec import KernelSpecManager as K; print(K().get_kernel_spec('python3').argv)"
    argv = run([venv.python, "-c", code], cwd=venv.home, env=venv.env).stdout
    assert argv.startswith(f"['{venv.python}', ") and "ipykernel_launcher" in argv


def test_every_lab_runs_in_a_plain_python3_kernel(started, venv):
    """Run All in Colab's, Kaggle's or a hub's default kernel, nothing exported: every lab runs
    top to bottom, only its `raises-exception` (exercise) cells raise, and each of its exercises
    (every one it registers: one whose check cell never reported reads "not run") is reported
    "not implemented" by its check cell. This is where every unsolved lab is run: the judge's
    grading in tests/course/test_notebooks.py runs the unsolved Lab 01 only."""
    _, course = started
    started_at = time.monotonic()
    argv = [venv.kvlab, "grade", "--json", "--kernel", "python3", "--jobs", "2", "."]
    out = run(argv, cwd=course, env=venv.env, cpu=900)
    grades = {Path(g["path"]).name: g for g in json.loads(out.stdout)["notebooks"]}
    seconds = ", ".join(f"{name[:2]} {g['seconds']:.0f} s" for name, g in grades.items())
    print(f"\nwheel: labs in a python3 kernel in {time.monotonic() - started_at:.0f} s ({seconds})")
    assert sorted(grades) == [lab.name for lab in LABS]
    for name, g in grades.items():
        assert g["error"] is None, (name, g["error"])
        lab = nbformat.read(course / name, as_version=4)
        for index in g["error_cells"]:
            assert "raises-exception" in lab.cells[index].metadata.get("tags", []), (name, index)
        if name in NO_EXERCISES:
            assert g["exercises"] == [] and g["error_cells"] == [], name
            continue
        assert g["total"] > 0 and g["passed"] == 0, name
        assert {e["status"] for e in g["exercises"]} == {"not implemented"}, (name, g["exercises"])
