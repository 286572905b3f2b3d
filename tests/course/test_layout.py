"""The package is grouped by layer; old flat import paths still give the very same modules."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import cpu_limit
import pytest

import kvlab
from kvlab._moved import MOVED, new_name

PACKAGE = Path(kvlab.__file__).parent
LAYERS = ("core", "ops", "kv", "serving", "models", "perf", "ui", "grading", "course")
# what each layer's modules may import at module level (a lower layer never imports a higher one)
MAY_IMPORT = {
    "core": set(),
    "ops": {"core"},
    "kv": {"core", "ops"},
    "serving": {"core"},
    "models": {"core", "ops", "kv", "serving"},
    "perf": {"core", "ops", "kv", "serving", "models"},
    "ui": {"core", "ops", "kv", "serving", "models", "perf"},
    "grading": {"core", "ops", "kv", "serving", "models", "perf", "ui", "course"},
    "course": {"core", "ops", "kv", "serving", "models", "perf", "ui", "grading"},
}


def test_the_top_level_shows_the_layers():
    top = {
        p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")
    }
    modules = {"__init__.py", "__main__.py", "_moved.py", "cli.py", "py.typed"}
    bundled = {"_bundled"}  # course files copied in when a wheel is built
    assert top - bundled == modules | set(LAYERS)


def _module_level_kvlab_imports(path: Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvlab"):
            if node.module == "kvlab":
                yield from (f"kvlab.{a.name}" for a in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("kvlab"))


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_one_above_it(layer):
    wrong = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in _module_level_kvlab_imports(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] in LAYERS and parts[1] != layer:
                if parts[1] not in MAY_IMPORT[layer]:
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {module}")
            assert new_name(module) is None, f"{path} still imports the old path {module}"
    assert not wrong


def test_the_core_runs_without_torch():
    code = (
        "import sys, kvlab.core.block_manager, kvlab.core.contiguous, kvlab.serving.simulate, "
        "kvlab.serving.replay, kvlab.serving.sharing; print('torch' in sys.modules)"
    )
    out = cpu_limit.run(
        [sys.executable, "-c", code], cpu=120, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def _old_and_new_paths():
    """Every old path, and every module below an old package path, with its new home."""
    pairs = []
    for old, new in MOVED.items():
        pairs.append((old, new))
        spec = importlib.util.find_spec(new)
        if spec.submodule_search_locations:
            for info in pkgutil.walk_packages(spec.submodule_search_locations, prefix=new + "."):
                pairs.append((old + info.name[len(new) :], info.name))
    return pairs


@pytest.mark.parametrize(("old", "new"), _old_and_new_paths())
def test_an_old_import_path_is_the_module_at_its_new_home(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    parent, _, leaf = old.rpartition(".")
    attribute = getattr(importlib.import_module(parent), leaf)
    # a package may re-export a function under its module's name (kvlab.serving.simulate)
    assert attribute is importlib.import_module(new) or not isinstance(attribute, ModuleType)


def test_names_imported_the_old_way_are_the_same_objects():
    from kvlab.paged import BlockManager as old_block_manager
    from kvlab.workload import sharegpt_like

    from kvlab.core.block_manager import BlockManager
    from kvlab.models.specs import PRESETS, ModelSpec
    from kvlab.ops.kernels.tiled import paged_decode_attention
    from kvlab.serving.engine import Engine

    assert old_block_manager is BlockManager
    assert importlib.import_module("kvlab.kernels").paged_decode_attention is paged_decode_attention
    assert importlib.import_module("kvlab.serve").Engine is Engine
    assert importlib.import_module("kvlab.models").PRESETS is PRESETS
    assert importlib.import_module("kvlab.models").ModelSpec is ModelSpec
    assert sharegpt_like is importlib.import_module("kvlab.serving.workload").sharegpt_like


def test_old_submodule_paths_leave_a_package_s_functions_alone():
    """kvlab.serving binds `simulate` (and kvlab.models.tiny `generate`) to a function named like
    its module; importing the module by its old path must not rebind it."""
    code = (
        "import kvlab.serve.simulate, kvlab.tiny.generate, kvlab.serving, kvlab.models.tiny\n"
        "from kvlab.serving import simulate\n"
        "from kvlab.models.tiny import generate\n"
        "import importlib, sys\n"
        "module = importlib.import_module('kvlab.serve.simulate')\n"
        "print(callable(simulate), callable(generate), module is sys.modules['kvlab.serving.simulate'])"
    )
    out = cpu_limit.run(
        [sys.executable, "-c", code], cpu=120, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"]
    from kvlab.serving import simulate

    assert callable(simulate)  # after this session's imports of every old path


def test_names_that_never_existed_still_fail_plainly():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kvlab.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kvlab.paged.no_such_submodule")


def test_a_kernelspec_registered_before_the_move_still_starts_the_kernel():
    """`python -m kvlab.jupyter_kernel` (an old kernel.json) runs the launcher at its new home."""
    from kvlab.course.jupyter_kernel import launches_kvlab

    assert launches_kvlab(["python", "-m", "kvlab.jupyter_kernel", "-f", "{connection_file}"])
    assert launches_kvlab(["python", "-m", "kvlab.course.jupyter_kernel", "-f", "x"])
    assert not launches_kvlab(["python", "-m", "ipykernel_launcher", "-f", "x"])
    out = cpu_limit.run(
        [sys.executable, "-m", "kvlab.jupyter_kernel", "--help"],
        cpu=120,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "IPython" in out.stdout
