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
from kvlab._moved import MOVED, MOVED_NAMES, new_name

PACKAGE = Path(kvlab.__file__).parent
# bottom layer first; a layer imports only layers listed before it (the README's "For developers")
LAYERS = ("core", "ops", "kv", "serving", "models", "perf", "ui", "course", "grading")
MAY_IMPORT = {layer: set(LAYERS[:i]) for i, layer in enumerate(LAYERS)}
MAY_IMPORT["serving"] = {"core"}  # the simulator runs without torch: no ops, no kv
# modules outside the layers: the base (any layer may import them; they import no kvlab module
# by name: _moved finds old paths' new homes by string) and the top (no layer imports them: the
# package root imports kvlab.ops.runtime, the command imports everything)
BASE = {"kvlab._moved", "kvlab._version"}
TOP = {"kvlab", "kvlab.cli", "kvlab.__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The module an import of ``name`` runs: ``name`` itself, else its nearest package."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def kvlab_imports(source: str, modules=MODULES):
    """(line, imported name, module it runs) of every import of kvlab in ``source``, wherever it
    is: at module level, inside functions and classes, and under ``if TYPE_CHECKING:``, which
    counts like any other. A type-only import still says this module's meaning depends on that
    one (its annotations name the other's types; a reader and a type checker follow it), so a
    cycle or an upward climb through annotations is one all the same; kvlab has two such blocks,
    both importing downward. A constant ``importlib.import_module("kvlab....")`` counts too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"line {node.lineno}: kvlab imports absolutely")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvlab":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield node.lineno, full, full if full in modules else _resolve(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvlab":
                    yield node.lineno, alias.name, _resolve(alias.name)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).split(".")[0] == "kvlab"
        ):
            yield node.lineno, node.args[0].value, _resolve(node.args[0].value)


IMPORTS = {module: list(kvlab_imports(path.read_text())) for module, path in MODULES.items()}
GRAPH = {m: {target for _, _, target in found if target != m} for m, found in IMPORTS.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_top_level_shows_the_layers():
    top = {
        p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")
    }
    modules = {"__init__.py", "__main__.py", "_moved.py", "_version.py", "cli.py", "py.typed"}
    bundled = {"_bundled"}  # course files copied in when a wheel is built
    assert top - bundled == modules | set(LAYERS)
    assert {m for m in MODULES if _layer(m) is None} == BASE | TOP


def test_every_import_is_read_inside_functions_and_type_checking_blocks_too():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import kvlab.core.errors\n"
        "if TYPE_CHECKING:\n"
        "    from kvlab.serving.scheduler import Sequence\n"
        "def later():\n"
        "    from kvlab.core import block_manager, validate\n"
        "    from kvlab.serving import simulate\n"
        "    return importlib.import_module('kvlab.kv.tensors')\n"
    )
    assert sorted(target for _, _, target in kvlab_imports(source)) == [
        "kvlab.core.block_manager",
        "kvlab.core.errors",
        "kvlab.core.validate",
        "kvlab.kv.tensors",
        "kvlab.serving",  # simulate is the package's function, not a module
        "kvlab.serving.scheduler",
    ]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back():
    """No cycle of imports between kvlab's modules, within a layer or across, a package and its
    own modules included: each module can be read (and imported) after those it names."""
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_one_above_it(layer):
    wrong = []
    for module, found in IMPORTS.items():
        if _layer(module) != layer:
            continue
        for line, name, target in found:
            where = f"{MODULES[module].relative_to(PACKAGE)}:{line} imports {name}"
            if target in TOP:
                wrong.append(f"{where} (above every layer)")
            elif _layer(target) not in (None, layer) and _layer(target) not in MAY_IMPORT[layer]:
                wrong.append(where)
    assert not wrong


def test_the_modules_outside_the_layers_stay_outside():
    for module in BASE:
        assert GRAPH[module] == set(), f"{module} imports {GRAPH[module]}"
    for module in TOP - {"kvlab.cli", "kvlab.__main__"}:  # the root: old paths, runtime, version
        assert GRAPH[module] <= {"kvlab._moved", "kvlab._version", "kvlab.ops.runtime"}


def test_kvlab_itself_uses_no_old_path_or_old_name():
    for module, found in IMPORTS.items():
        for line, name, _ in found:
            home, _, leaf = name.rpartition(".")
            if new_name(name) is not None and new_name(home) is None:
                # `from kvlab.serving import simulate`: the package's function, not the old module
                named = getattr(importlib.import_module(home), leaf, None)
                assert named is not None and not isinstance(named, ModuleType), (
                    f"{module}:{line} still imports the old path {name}"
                )
            else:
                assert new_name(name) is None, f"{module}:{line} imports the old path {name}"
            assert leaf not in MOVED_NAMES.get(home, {}), (
                f"{module}:{line} imports {leaf} from {home}, which it left"
            )


def test_the_core_runs_without_torch():
    code = (
        "import sys, kvlab.core.block_manager, kvlab.core.contiguous, kvlab.serving.simulation, "
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
        "tiny = importlib.import_module('kvlab.models.tiny.generate')\n"
        "print(callable(simulate), callable(generate), module is sys.modules['kvlab.serving.simulate'],"
        " tiny is sys.modules['kvlab.models.tiny.generation'])"
    )
    out = cpu_limit.run(
        [sys.executable, "-c", code], cpu=120, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True", "True"]
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
