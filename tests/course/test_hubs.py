"""The course on Binder, a JupyterHub, Colab and Kaggle (docs/hubs.md): what can be checked here.

repo2docker's rules (its docs, "Where to put configuration files"): when a ``binder/`` folder
exists only the files in it count, so Binder builds from ``binder/`` and the top-level
``environment.yml`` stays the conda route. ``binder/postBuild`` is run here for real, in a fresh
virtual environment, offline: its pip command is swapped for one that installs without an
index, every dependency coming from this environment through a ``.pth`` file. Neither a conda
solve nor a Docker build is possible offline; the files they read are checked instead.
"""

import importlib.util
import json
import os
import re
import shutil
import sys
import urllib.parse
from pathlib import Path

import cpu_limit
import pytest
from conftest import LEARNER_ENV, ROOT, kvlab_cli

BINDER = ROOT / "binder"
DOCS = ROOT / "docs" / "hubs.md"
DOCKERFILE = ROOT / "docs" / "hub-image" / "Dockerfile"
FIRST_LAB = "labs/00_why_kv_cache.ipynb"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What the package reads from the checkout at run time: the hub image must copy them
RUNTIME_DIRS = ("kvlab", "assets", "labs")


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def name_of(requirement: str) -> str:
    """The distribution a requirement names, normalised (``Triton>=3.6; …`` -> ``triton``)."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def makefile_torch_spec() -> str:
    return re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


# --- Binder ------------------------------------------------------------------------------------


def test_binder_folder_is_what_repo2docker_reads():
    assert BINDER.is_dir() and not (ROOT / ".binder").exists(), "repo2docker refuses both"
    post_build = BINDER / "postBuild"
    text = post_build.read_text()
    assert os.access(post_build, os.X_OK), "git must keep postBuild executable"
    # repo2docker runs postBuild as a program and does not stop the build on an error by itself
    assert text.startswith("#!/bin/bash\n") and "\nset -euo pipefail\n" in text
    for step in ("-e .", "kvlab kernel", "python -m kvlab.course.lab_settings"):
        assert step in text, step
    # the Python that Binder installs satisfies the package
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    minimum = re.fullmatch(r">=3\.(\d+)", pyproject()["project"]["requires-python"]).group(1)
    assert int(runtime.split(".")[1]) >= int(minimum)


def test_binder_installs_the_makefiles_cpu_torch():
    lines = requirement_lines(BINDER / "requirements.txt")
    assert lines == [f"--index-url {CPU_INDEX}", makefile_torch_spec()], lines
    # no local reference (-e ., -r, file://): repo2docker installs it before copying the repo in,
    # in a layer of its own
    assert not any(line.startswith(("-e", "-r", "-c", ".")) or "file:" in line for line in lines)


def copy_for_postbuild(dest: Path) -> Path:
    """What postBuild needs of the checkout (``pip install -e .`` of it), nothing else."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("kvlab", "binder"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def binder_build(tmp_path_factory):
    """A fresh venv with this environment's packages visible, and binder/postBuild run in it."""
    for module in ("pip", "setuptools"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not importable here: the offline editable install needs it")
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    tmp = tmp_path_factory.mktemp("binder")
    repo = copy_for_postbuild(tmp / "repo")
    venv = tmp / "venv"
    cpu_limit.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cpu=120, check=True)
    python = venv / "bin" / "python"
    purelib = cpu_limit.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        cpu=60,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this interpreter's packages, as a base image's would be: torch, Jupyter, setuptools, pip
    packages = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    Path(purelib, "_kvlab_test_dependencies.pth").write_text("\n".join(packages) + "\n")
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in LEARNER_ENV.items() if not k.startswith(("PYTHON", "JUPYTER", "PIP"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        HOME=str(home),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}",
        PIP_CONFIG_FILE=os.devnull,
        # offline, and never touching the packages the .pth shows (this environment's own kvlab)
        KVLAB_PIP_INSTALL="python -m pip install --no-index --no-deps --no-build-isolation "
        "--ignore-installed --disable-pip-version-check --no-cache-dir",
    )
    run = cpu_limit.run(
        ["./binder/postBuild"], cpu=300, cwd=repo, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return {"repo": repo, "venv": venv, "python": python, "env": env, "log": run.stdout}


def in_venv(build, *argv: str) -> str:
    """Run the venv's Python as the image's notebook server would, in the copied checkout."""
    run = cpu_limit.run(
        [build["python"], *argv],
        cpu=180,
        env=build["env"],
        cwd=build["repo"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow
def test_postbuild_registers_the_labs_kernel_in_the_environment(binder_build):
    venv, python = binder_build["venv"], binder_build["python"]
    # `jupyter kernelspec list --json`, run by the venv's Python (its `jupyter` is not in its bin)
    listed = json.loads(
        in_venv(binder_build, "-m", "jupyter_client.kernelspecapp", "list", "--json")
    )
    metadata = json.loads((ROOT / FIRST_LAB).read_text())["metadata"]["kernelspec"]
    spec = listed["kernelspecs"][metadata["name"]]  # the kernel the labs' metadata name
    assert Path(spec["resource_dir"]) == venv / "share" / "jupyter" / "kernels" / "kvlab"
    assert spec["spec"]["display_name"] == metadata["display_name"]
    assert spec["spec"]["argv"][:3] == [str(python), "-m", "kvlab.course.jupyter_kernel"]
    # the editable install is of the copied checkout, and JupyterLab's defaults are in the venv
    where = in_venv(binder_build, "-c", "import kvlab; print(kvlab.__file__)")
    assert where.startswith(str(binder_build["repo"])), where
    assert (venv / "share" / "jupyter" / "lab" / "settings" / "overrides.json").is_file()
    assert "kernels run in" in binder_build["log"]


START_KERNEL = """
from jupyter_client.manager import start_new_kernel

km, kc = start_new_kernel(
    kernel_name="kvlab", startup_timeout=120, extra_arguments=["--IPKernelApp.log_level=ERROR"]
)
printed = []
try:
    kc.execute_interactive(
        "import sys, kvlab; print(sys.prefix, kvlab.KERNEL_MODE)",
        timeout=120,
        output_hook=lambda msg: printed.append(msg["content"].get("text", "")),
    )
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
print("kernel said:", "".join(printed))
"""


@pytest.mark.slow
def test_the_registered_kernel_starts_and_imports_kvlab(binder_build):
    """Found by name and started from the venv, as the image's JupyterLab starts it."""
    said = in_venv(binder_build, "-c", START_KERNEL).split("kernel said:")[1].split()
    assert len(said) == 2, said
    prefix, mode = said
    assert Path(prefix) == binder_build["venv"] and mode in ("interpreter", "compiled")


# --- the conda route ---------------------------------------------------------------------------


def test_environment_yml_lists_what_pyproject_requires():
    yaml = pytest.importorskip("yaml")  # comes with JupyterLab (jupyter_events)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {name_of(d) for d in conda + pip if not d.startswith("-")}
    required = {name_of(r) for r in pyproject()["project"]["dependencies"]}
    assert required <= listed, f"missing from environment.yml: {sorted(required - listed)}"
    assert "-e ." in pip and f"--extra-index-url {CPU_INDEX}" in pip
    python = next(d for d in conda if name_of(d) == "python")
    assert python.split("=")[1] == (BINDER / "runtime.txt").read_text().strip()[len("python-") :]


# --- the instructors' page ---------------------------------------------------------------------


def github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_hubs_page_links_open_files_that_exist():
    text = DOCS.read_text()
    urls = re.findall(r"https://[^\s)\]`'\"]+", text)
    opened = []
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        if parsed.netloc == "mybinder.org" and "urlpath" in query:
            assert query["urlpath"].startswith("lab/tree/"), url
            opened.append(query["urlpath"].removeprefix("lab/tree/"))
        elif parsed.path.endswith("/hub/user-redirect/git-pull"):
            assert {"repo", "branch", "targetPath", "urlpath"} <= query.keys(), url
            prefix = f"lab/tree/{query['targetPath']}/"
            assert query["urlpath"].startswith(prefix), url  # relative to home: the folder first
            opened.append(query["urlpath"].removeprefix(prefix))
        elif parsed.netloc == "colab.research.google.com" and "/blob/" in parsed.path:
            opened.append(parsed.path.split("/blob/", 1)[1].split("/", 1)[1])
    assert FIRST_LAB in opened and len(opened) >= 4, opened
    for path in opened:
        assert (ROOT / path).is_file(), path
    # relative links and in-page anchors
    anchors = {github_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith("https://"):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (DOCS.parent / path).exists(), target
        else:
            assert anchor in anchors, target


# --- the hub image -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    rows = [line.strip() for line in text.splitlines()]
    return [tuple(r.split(None, 1)) for r in rows if r and not r.startswith("#")]


def test_hub_image_copies_real_files_and_runs_real_commands():
    instructions = dockerfile_instructions()
    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    assert args["TORCH_SPEC"] == makefile_torch_spec() and args["TORCH_INDEX"] == CPU_INDEX
    assert re.fullmatch(r"quay\.io/jupyter/[\w-]+-notebook:[\w.-]+", args["BASE_IMAGE"])
    copied = set()
    for op, rest in instructions:
        if op == "COPY":
            *sources, dest = [w for w in rest.split() if not w.startswith("--")]
            assert dest.startswith("/opt/kvlab"), rest
            for source in sources:
                assert (ROOT / source).exists(), source
                copied.add(source)
    assert set(RUNTIME_DIRS) | {"pyproject.toml", "README.md"} <= copied
    runs = " && ".join(rest for op, rest in instructions if op == "RUN")
    assert "pip install --no-cache-dir -e /opt/kvlab" in runs
    for module in re.findall(r"python -m (kvlab[\w.]*)", runs):
        assert importlib.util.find_spec(module) is not None, module
    commands = set(re.findall(r"(?:^|&&|;)\s*kvlab (\w+)", runs))
    assert commands == {"kernel"}, commands
    for command in commands:
        run = cpu_limit.run(
            [*kvlab_cli(), command, "--help"], cpu=120, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
