"""Old import paths, kept working after the package was grouped by layer (issue 24).

Learners' saved notebooks and scripts say ``from kvlab.paged import BlockManager``; the module now
lives at ``kvlab.core.block_manager``. An import of an old path (or of anything below an old
package path, such as ``kvlab.kernels.tiled``) returns the module at its new home: the same module
object, so classes, ``isinstance`` checks, monkeypatching and pickles all agree. ``python -m`` on an
old path (a Jupyter kernelspec registered before the move) runs the new module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

MOVED = {
    "kvlab.accounting": "kvlab.core.accounting",
    "kvlab.trace": "kvlab.core.trace",
    "kvlab.recorder": "kvlab.core.recorder",
    "kvlab.block_pool": "kvlab.core.block_pool",
    "kvlab.paged": "kvlab.core.block_manager",
    "kvlab.prefix_cache": "kvlab.core.prefix_cache",
    "kvlab.contiguous": "kvlab.core.contiguous",
    "kvlab.errors": "kvlab.core.errors",
    "kvlab.cache_kinds": "kvlab.core.cache_kinds",
    "kvlab.validate": "kvlab.core.validate",
    "kvlab.interfaces": "kvlab.serving.interfaces",
    "kvlab.scheduler": "kvlab.serving.scheduler",
    "kvlab.serve": "kvlab.serving",
    "kvlab.replay": "kvlab.serving.replay",
    "kvlab.sharing": "kvlab.serving.sharing",
    "kvlab.workload": "kvlab.serving.workload",
    "kvlab.kv_tensors": "kvlab.kv.tensors",
    "kvlab.attention": "kvlab.ops.attention",
    "kvlab.kernels": "kvlab.ops.kernels",
    "kvlab.testing": "kvlab.ops.testing",
    "kvlab.runtime": "kvlab.ops.runtime",
    "kvlab.tiny": "kvlab.models.tiny",
    "kvlab.roofline": "kvlab.perf.roofline",
    "kvlab.gpus": "kvlab.perf.gpus",
    "kvlab.planner": "kvlab.perf.planner",
    "kvlab.bench": "kvlab.perf.bench",
    "kvlab.viz": "kvlab.ui.viz",
    "kvlab.viz_sharing": "kvlab.ui.viz_sharing",
    "kvlab.widgets": "kvlab.ui.widgets",
    "kvlab.brief": "kvlab.ui.brief",
    "kvlab.jupyter_kernel": "kvlab.course.jupyter_kernel",
    "kvlab.doctor": "kvlab.course.doctor",
    "kvlab.labgen": "kvlab.grading.labgen",
    "kvlab.lab_settings": "kvlab.course.lab_settings",
    # labgen gives each exercise its points from the checks: it sits with them (issue 37)
    "kvlab.course.labgen": "kvlab.grading.labgen",
    # a module that shared its name with the function its package exports (issue 37)
    "kvlab.serving.simulate": "kvlab.serving.simulation",
    "kvlab.models.tiny.generate": "kvlab.models.tiny.generation",
}


# Names that left a module for a higher layer and stay readable from it (a module's __getattr__
# asks moved_attribute): old module -> {name: its new module}. kvlab's own code never reads them
# there (tests/course/test_layout.py).
MOVED_NAMES = {
    "kvlab.core.block_manager": dict.fromkeys(
        ("PagedKVCache", "block_tables_tensor", "flashinfer_page_table"), "kvlab.kv.tensors"
    ),
}


def moved_attribute(module: str, name: str):
    """``name`` read from ``module``, which it left (see MOVED_NAMES); imports its new home."""
    home = MOVED_NAMES.get(module, {}).get(name)
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def new_name(fullname: str) -> str | None:
    """The new home of an old module path, or None when ``fullname`` did not move."""
    head, dot, rest = fullname, "", ""
    while head:
        if head in MOVED:
            return MOVED[head] + dot + rest
        head, _, tail = head.rpartition(".")
        rest = tail + dot + rest if rest else tail
        dot = "."
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # the import system hands back whatever sys.modules holds under the old name
        real = sys.modules[module.__name__] = importlib.import_module(self.target)
        if hasattr(real, "__path__"):
            # A package's submodules already loaded get their old names too. Otherwise a later
            # `import kvlab.serve.simulate` would load it anew under the old name and then set the
            # package's attribute `simulate`, which the package binds to a function, to the module.
            old, new = module.__name__, self.target
            for name, loaded in list(sys.modules.items()):
                if name.startswith(new + "."):
                    sys.modules.setdefault(old + name[len(new) :], loaded)

    def get_code(self, fullname):
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds old kvlab module paths and loads their new homes under them."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("kvlab."):
            return None
        new = new_name(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        if found is None:
            return None
        # the new home's file, so that `python -m <old path>` gives its program a real argv[0]
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), origin=found.origin)


def keep_old_path(old: str, module) -> None:
    """Make the old path ``old`` of a module its package has already loaded the same module, before
    anyone imports it. A package whose attribute of that name is a function (``kvlab.serving``
    binds ``simulate``) calls this: were ``import kvlab.serving.simulate`` to load the module, the
    import system would then set the package's attribute to the module; found in ``sys.modules``,
    it is handed back and the attribute stays the function."""
    if MOVED.get(old) != module.__name__:
        raise ValueError(f"{old!r} is not an old path of {module.__name__!r} in MOVED")
    sys.modules.setdefault(old, module)


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
