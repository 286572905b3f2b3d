"""Issue 35, items 3 and 4: kvlab's own code is no answer, and the answer key is out of reach.

Each cheat is built on an unsolved lab (which scores 0) and must score no more than it; the
sandbox's promises in docs/grading-sandbox.md ("What a judged submission sees") are each run
here once. The learner's process is the judge's own (``kvlab.grading.judge.sandboxed``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from test_judge import judged, scores, submission

from kvlab.grading import judge as judge_module
from kvlab.grading import sandbox

pytestmark = pytest.mark.slow

needs_namespaces = pytest.mark.skipif(
    not sandbox.probe().available, reason="the sandbox's namespaces are not available here"
)


def _total(found) -> int:
    return sum(passed for passed, _ in scores(found).values())


# --- what the learner's process sees ---------------------------------------------------------

PROBE = r"""
import json, os, sys
seen = {}
def reads(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        return True
    except OSError:
        return False
seen["uid"] = os.getuid()
seen["shadow"] = reads("/etc/shadow")
seen["root_home"] = [n for n in os.listdir("/root")] if os.path.isdir("/root") else []
seen["solutions"] = reads(sys.argv[1])
seen["git"] = reads(sys.argv[2])
seen["environ"] = sorted(os.environ)
import kvlab.grading
seen["graders"] = sorted(os.listdir(os.path.dirname(kvlab.grading.__file__)))
try:
    import kvlab.grading.lab03
    seen["lab03"] = True
except ImportError:
    seen["lab03"] = False
try:
    with open("big", "wb") as f:
        for _ in range(8):
            f.write(b"x" * (1 << 20))
    seen["disk"] = "wrote 8 MiB"
except OSError as e:
    seen["disk"] = e.strerror
print(json.dumps(seen))
"""


@needs_namespaces
def test_the_learner_process_sees_only_what_it_needs(tmp_path, monkeypatch):
    """One run, as the judge starts it (smaller disk): every line of the docs' table."""
    monkeypatch.setenv("KVLAB_SECRET_TOKEN_FOR_TEST", "x")  # passes: kvlab's own variables
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")  # must not
    package = sandbox.kvlab_package_path()
    hidden, overlay = judge_module.student_view(package)
    run = sandbox.start(
        [sys.executable, "-c", PROBE, str(ROOT / "solutions"), str(ROOT / ".git")],
        tmp_path / "work",
        sandbox.Limits(disk_bytes=4 << 20),
        protected=[package],
        hidden=hidden,
        overlay=overlay,
        env=judge_module._child_env(),
        stdout=subprocess.PIPE,
        mode="namespace",
    )
    out = run.process.stdout.read()
    run.finish()
    import json

    seen = json.loads(out)
    if os.geteuid() == 0:
        assert seen["uid"] == 65534 and not seen["shadow"]
        assert seen["root_home"] in ([], [".pyenv"], [".local"]) or all(
            not n.startswith(".ssh") for n in seen["root_home"]
        )
    assert not seen["solutions"] and not seen["git"]
    assert "AWS_SECRET_ACCESS_KEY" not in seen["environ"]
    assert "KVLAB_SECRET_TOKEN_FOR_TEST" in seen["environ"] and "PATH" in seen["environ"]
    assert not seen["lab03"]
    assert set(seen["graders"]) <= {
        "__init__.py", "judge_child.py", "remote.py", "wire.py", "limits.py", "blame.py",
        "expect.py", "own_code.py", "lab05.py", "lab09", "launchers.py", "given.py",
    }  # fmt: skip
    assert seen["disk"] == "No space left on device"
    if os.geteuid() == 0:
        assert any(line.startswith("memory: at most") for line in run.report), run.report


def test_what_the_learners_side_says_of_an_error_is_cut_to_a_few_lines():
    from kvlab.grading.remote import ERROR_TEXT, rebuild_error

    flood = {
        "mro": [("builtins", "ValueError")],
        "args": ["x" * 10**6] * 100,
        "attrs": {f"a{i}": "y" * 10**5 for i in range(100)},
        "lines": ["z" * 10**5] * 1000,
    }
    error = rebuild_error(flood)
    assert sum(len(a) for a in error.args) <= 8 * ERROR_TEXT
    remote = error.__kvlab_remote__
    assert len(remote["lines"]) <= 8 and all(len(line) <= ERROR_TEXT for line in remote["lines"])
    assert sum(len(v) for k, v in vars(error).items() if isinstance(v, str)) <= 8 * ERROR_TEXT


# --- the cheats of issue 35, each on an unsolved lab ---------------------------------------------

LAB03_CHEAT = """import kvlab.grading.own_code as own
class _Nothing:
    def __init__(self, *a, learner=None, task=""):
        self.seen = []
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
own.refuse_reference = _Nothing
from kvlab.grading.lab03 import _reference_beds
class BlockManager(ReferenceBlockManager):
    pass
"""

LAB03_BEDS = """from kvlab.grading.lab03 import _reference_beds
def beds_report(manager, seq_ids):
    return _reference_beds(manager, seq_ids)
"""

LAB06_CHEAT = """from kvlab.grading.lab06.references import slipped_step
def step(scheduler, now):
    return slipped_step(scheduler, now)
"""

LAB10_SOLUTIONS = """import glob, json, os
for path in glob.glob("{root}/solutions/10_*.ipynb"):
    for cell in json.load(open(path))["cells"]:
        if cell.get("id") == "lab10-05":
            exec("".join(cell["source"]))
"""

LAB10_REFERENCES = """import kvlab.grading.lab10.radix as radix
match_prefix = getattr(radix, "match_prefix", None) or getattr(radix, "reference_match", None)
"""

LAB10_TREE = """def match_prefix(tree, token_ids):
    hit = tree.match(token_ids[:-1])
    node, k = hit.node, hit.num_blocks
    return tree.split(node, k) if 0 < k < len(node.blocks) else node
"""

LAB10_TIERS = """from kvlab.perf import tiers
def fetch_beats_recompute(spec, gpu, num_tokens, pcie_bytes_per_s):
    return tiers.fetch_beats_recompute(spec, gpu, num_tokens, pcie_bytes_per_s=pcie_bytes_per_s)
"""

LAB10_ROUTER = """from kvlab.serving.fleet import make_router
def prefix_router(request, views, now, load_penalty=128.0):
    return make_router("prefix_aware", load_penalty=load_penalty)(request, views, now)
"""

LAB10_ZERO = """def prefix_router(request, views, now, load_penalty=128.0):
    return 0
"""

LAB09_SERVED = """from kvlab.grading.lab09.roofline import almost_free_tokens as kvlab_almost_free
def almost_free_tokens(spec, gpu, batch, context):
    return kvlab_almost_free(spec, gpu, batch, context)
"""

LAB05_FAKE_KERNEL = """class _Fake:
    def __getitem__(self, grid):
        return self
    def __call__(self, *args, **kwargs):
        return None
my_paged_decode_kernel = _Fake()
"""


@needs_namespaces
@pytest.mark.parametrize(
    "number, cells",
    [
        ("03", {"lab03-05": LAB03_CHEAT, "lab03-08": LAB03_BEDS}),
        ("06", {"lab06-12": LAB06_CHEAT}),
        ("10", {"lab10-05": LAB10_SOLUTIONS.format(root=ROOT)}),
        ("10", {"lab10-05": LAB10_REFERENCES}),
        ("05", {"lab05-07": LAB05_FAKE_KERNEL}),
        ("10", {"lab10-05": LAB10_TREE, "lab10-13": LAB10_TIERS, "lab10-22": LAB10_ROUTER}),
        ("10", {"lab10-22": LAB10_ZERO}),
    ],
    ids=[
        "03-own-code-and-beds",
        "06-slipped-step",
        "10-solutions-on-disk",
        "10-graders",
        "05-fake",
        "10-tree-tiers-and-router",
        "10-router-returns-0",
    ],
)
def test_a_cheat_on_an_unsolved_lab_scores_no_more_than_it(tmp_path, number, cells):
    unsolved = judged(submission(tmp_path, number))
    cheat = judged(submission(tmp_path, number, cells))
    assert _total(cheat) <= _total(unsolved), scores(cheat)


@needs_namespaces
def test_the_fake_kernel_is_refused_as_no_triton_kernel(tmp_path):
    found = judged(submission(tmp_path, "05", {"lab05-07": LAB05_FAKE_KERNEL}))
    result = found.results["05.kernel"]
    assert result.status.value == "wrong kind" and "@triton.jit" in result.report()


@needs_namespaces
def test_kvlabs_answer_computed_by_the_judge_is_refused_to_the_learners_code(tmp_path):
    """Lab 09's given cells have kvlab's ``almost_free_tokens`` (the judge computes it for
    them); the learner's code that calls it under a check is refused, and the row is flagged."""
    found = judged(submission(tmp_path, "09", {"lab09-13": LAB09_SERVED}))
    result = found.results["09.almost_free"]
    assert result.passed == 0, result.report()
    assert result.handed_over == "kvlab.grading.lab09.roofline.almost_free_tokens", result.report()


@needs_namespaces
def test_a_solved_lab_still_scores_full_marks_in_the_sandbox(tmp_path):
    solved = ["lab03-05", "lab03-08"]
    found = judged(submission(tmp_path, "03", solved=solved))
    assert scores(found) == {"03.block_manager": (8, 8), "03.beds_report": (4, 4)}, scores(found)
    assert all(r.handed_over is None for r in found.results.values())
    assert any(line.startswith("hidden: ") for line in found.notes)


@needs_namespaces
def test_kvlabs_own_answers_are_refused_and_flagged_by_the_judge(tmp_path):
    """Lab 10: the judge's tree's own walk (refused on the judge's side), the tiers' rule and
    the fleet's router (stand-ins in the learner's copy of kvlab, served by the judge)."""
    cells = {"lab10-05": LAB10_TREE, "lab10-13": LAB10_TIERS, "lab10-22": LAB10_ROUTER}
    found = judged(submission(tmp_path, "10", cells))
    handed = {k: r.handed_over for k, r in found.results.items()}
    assert handed == {
        "10.match_prefix": "kvlab.core.prefix_cache.radix_tree.RadixTreeCache.match",
        "10.fetch_or_recompute": "kvlab.perf.tiers.fetch_beats_recompute",
        "10.prefix_score": "kvlab.serving.fleet.make_router",
    }, scores(found)
    assert _total(found) == 0, scores(found)


@needs_namespaces
def test_the_reference_block_manager_is_no_base_class_in_the_learners_process(tmp_path):
    subclass = "class BlockManager(ReferenceBlockManager):\n    pass\n"
    found = judged(submission(tmp_path, "03", {"lab03-05": subclass}))
    assert scores(found)["03.block_manager"][0] == 0, scores(found)
    assert "lab03-05" in found.error_cells  # the class statement raised: no base class


# Lab 11 through the judge: the window step sees room numbers (its key card travels by value and
# comes back), so a slip there is named as in the learner's kernel; kvlab's layout is refused
LAB11_KEPT_ON_CARD = """def hand_back(block_table, num_computed, *, window, block_size, free, null_block):
    first = max(0, num_computed - window + 1)
    for i in range(first // block_size - 1, -1, -1):
        if block_table[i] == null_block:
            break
        free([block_table[i]])
"""

LAB11_LAYOUT = """from kvlab.perf.kv_groups import kv_cache_layout
def hybrid_layout(layer_groups, max_model_len, max_num_batched_tokens, block_size=16):
    layout = kv_cache_layout(layer_groups, block_size=block_size)
    blocks = layout.blocks_reserved(max_model_len, max_num_batched_tokens)
    return {"group_size": layout.group_size, "num_groups": len(layout.groups),
            "block_size": layout.block_size, "page_bytes": layout.page_bytes,
            "blocks_reserved": blocks, "bytes_reserved": blocks * layout.block_bytes}
"""


@needs_namespaces
def test_lab11_a_slip_is_named_and_kvlabs_layout_refused_through_the_judge(tmp_path):
    from kvlab.grading.lab11 import hints

    cells = {"lab11-05": LAB11_KEPT_ON_CARD, "lab11-16": LAB11_LAYOUT}
    found = judged(submission(tmp_path, "11", cells))
    window = found.results["11.window"]
    assert window.passed == 1, window.report()  # a guest inside its window hands back nothing
    assert " ".join(hints.KEPT_ON_CARD.split()) in " ".join(window.report().split())
    assert found.results["11.hybrid"].handed_over == "kvlab.perf.kv_groups.kv_cache_layout"
    assert found.results["11.hybrid"].passed == 0
