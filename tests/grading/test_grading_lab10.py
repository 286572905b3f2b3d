"""Lab 10 checks, tried with learner code: the lab's solutions pass and the stubs are "not
implemented"; each usual slip put into a solution fails with the hint that names it, and only
that hint (later failures fold into "the same problem" or say nothing)."""

import learner_code
import pytest
from learner_code import assert_only_hint, hints_of

from kvlab.grading import Status, run_checks
from kvlab.grading import lab10 as checks

HEADER = "from kvlab.core.prefix_cache.radix_tree import Node, RadixTreeCache\n"

MATCH_PREFIX = """
def match_prefix(tree: RadixTreeCache, token_ids: list[int]) -> Node:
    size = tree.block_size
    limit = (len(token_ids) - 1) // size  # never the page of the prompt's last token
    node, j = tree.root, 0  # j: pages matched so far
    while j < limit:
        child = node.children.get(tuple(token_ids[j * size : (j + 1) * size]))
        if child is None:
            break
        k = 1
        while k < len(child.blocks) and j + k < limit:
            if child.tokens[k] != tuple(token_ids[(j + k) * size : (j + k + 1) * size]):
                break
            k += 1
        if k < len(child.blocks):
            return tree.split(child, k)
        node, j = child, j + k
    return node
"""

PREFIX_ROUTER = """
def prefix_router(request, views, now, load_penalty=128.0):
    best, top = None, float("-inf")
    for view in views:
        score = view.cached_prefix_tokens(request) - load_penalty * view.load
        if score > top:
            best, top = view.index, score
    return best
"""


def learner(source: str, name: str, *edits: str, header: str = HEADER):
    return learner_code.learner(source, name, *edits, header=header)


# --- 10.match_prefix -------------------------------------------------------------------------


def match_prefix(*edits):
    return learner(MATCH_PREFIX, "match_prefix", *edits)


def test_the_walk_passes_and_the_stub_is_not_written_yet():
    result = run_checks("10.match_prefix", match_prefix())
    assert result.ok and result.passed == result.total == 7, result.report()
    stub = learner(
        "def match_prefix(tree, token_ids):\n    raise NotImplementedError\n", "match_prefix"
    )
    assert run_checks("10.match_prefix", stub).status is Status.NOT_IMPLEMENTED


def test_each_slipped_walk_differs_from_the_walk_on_its_own_case():
    for slip in checks.radix.SLIPS:
        differs = [
            name
            for name, case in checks.radix.CASES.items()
            if slip.answer(case) != checks.radix.right_path(case)
        ]
        assert differs, slip.hint


@pytest.mark.parametrize(
    "edits, hint",
    [
        (["(len(token_ids) - 1) // size => len(token_ids) // size"], checks.PAST_LIMIT),
        (["        k = 1\n =>         k = len(child.blocks)\n"], checks.WHOLE_EDGE),
        (
            ["            return tree.split(child, k) =>             return child"],
            checks.NO_SPLIT_CHILD,
        ),
        (
            ["            return tree.split(child, k) =>             return node"],
            checks.NO_SPLIT_PARENT,
        ),
    ],
    ids=["past the limit", "a whole edge", "no split (the child)", "no split (the parent)"],
)
def test_each_walk_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("10.match_prefix", match_prefix(*edits)), hint)


def test_a_walk_that_breaks_the_tree_is_caught_without_a_hint():
    broken = match_prefix(
        "            return tree.split(child, k) =>             "
        "child.blocks[:] = child.blocks[:k]; return child"
    )
    result = run_checks("10.match_prefix", broken)
    assert result.status is Status.FAILED
    assert not hints_of(result), result.report()


# --- 10.prefix_score -------------------------------------------------------------------------


def prefix_router(*edits):
    return learner(PREFIX_ROUTER, "prefix_router", *edits, header="")


def test_the_router_passes_and_the_stub_is_not_written_yet():
    result = run_checks("10.prefix_score", prefix_router())
    assert result.ok and result.passed == result.total == 9, result.report()
    stub = learner(
        "def prefix_router(request, views, now, load_penalty=128.0):\n    raise NotImplementedError\n",
        "prefix_router",
        header="",
    )
    assert run_checks("10.prefix_score", stub).status is Status.NOT_IMPLEMENTED


@pytest.mark.parametrize(
    "edits, hint",
    [
        ([" - load_penalty * view.load => "], checks.NO_LOAD),
        (["view.load => view.num_running"], checks.RUNNING_ONLY),
        (["score > top => score < top", 'float("-inf") => float("inf")'], checks.ARGMIN),
        (
            ["view.cached_prefix_tokens(request) - => view.cached_prefix_tokens(request) / 16 -"],
            checks.IN_BLOCKS,
        ),
        (
            [
                "    for view in views:\n =>     for place, view in enumerate(views):\n",
                "best, top = view.index, score => best, top = place, score",
            ],
            checks.POSITION,
        ),
    ],
    ids=["no load", "running only", "lowest score", "in rooms", "place in views"],
)
def test_each_router_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("10.prefix_score", prefix_router(*edits)), hint)


# --- 10.fetch_or_recompute -------------------------------------------------------------------

FETCH_RULE = """
def fetch_beats_recompute(spec, gpu, num_tokens, pcie_bytes_per_s):
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.kv_element_bytes
    fetch = num_tokens * kv_per_token / pcie_bytes_per_s
    attended = num_tokens * (num_tokens + 1) / 2
    flops = 2 * spec.num_params * num_tokens
    flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended
    return fetch < flops / gpu.peak_flops
"""


def fetch_rule(*edits):
    return learner(FETCH_RULE, "fetch_beats_recompute", *edits, header="")


def test_the_rule_passes_and_the_stub_is_not_written_yet():
    result = run_checks("10.fetch_or_recompute", fetch_rule())
    assert result.ok and result.passed == result.total == len(checks.tiers.CARDS), result.report()
    stub = learner(
        "def fetch_beats_recompute(spec, gpu, num_tokens, pcie_bytes_per_s):\n"
        "    raise NotImplementedError\n",
        "fetch_beats_recompute",
        header="",
    )
    assert run_checks("10.fetch_or_recompute", stub).status is Status.NOT_IMPLEMENTED


def test_the_checks_agree_with_kvlab_and_tell_every_slip_apart():
    from kvlab.perf.tiers import fetch_beats_recompute

    rule = checks.tiers.reference_rule
    answers = {None: [rule(*inp) for inp in checks.tiers.INPUTS]}
    for spec, gpu, n, link in checks.tiers.INPUTS:
        assert rule(spec, gpu, n, link) == fetch_beats_recompute(
            spec, gpu, n, pcie_bytes_per_s=link
        )
    for slip in checks.tiers.SLIPS:
        answers[slip] = [slip.answer(*inp) for inp in checks.tiers.INPUTS]
    vectors = list(answers.values())
    assert len({tuple(v) for v in vectors}) == len(vectors)  # no two alike, none right


@pytest.mark.parametrize(
    "edits, hint",
    [
        (["flops += 4 => flops += 0 * 4"], checks.NO_ATTENTION),
        (["kv_per_token = 2 * => kv_per_token = 1 *"], checks.K_ONLY),
        (["/ pcie_bytes_per_s => / (pcie_bytes_per_s / 1e9 * 2**30)"], checks.GB_GIB),
        (
            ["kv_per_token / pcie_bytes_per_s => kv_per_token / 2**30 / (pcie_bytes_per_s / 1e9)"],
            checks.GB_GIB,
        ),
        (["2 * spec.num_layers * spec.num_kv_heads => 2 * spec.num_kv_heads"], checks.PER_LAYER),
        (["/ pcie_bytes_per_s => / gpu.hbm_bytes_per_s"], checks.HBM_NOT_PCIE),
        (["return fetch < flops => return fetch <= flops"], checks.TIE_FETCHES),
        (["spec.kv_element_bytes => spec.dtype_bytes"], checks.MODEL_DTYPE),
    ],
    ids=[
        "no attention",
        "K only",
        "GiB for GB",
        "bytes in GiB",
        "one layer",
        "HBM, not PCIe",
        "a tie fetches",
        "model dtype",
    ],
)
def test_each_rule_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("10.fetch_or_recompute", fetch_rule(*edits)), hint)


def test_the_tie_card_is_a_tie_in_kvlab_and_in_the_learners_sums():
    """1,024 tokens take exactly as long to fetch as to recompute, in kvlab's sums and in the
    lab's solution (every term a power of two), so only the tie decides."""
    from kvlab.perf.tiers import fetch_seconds, recompute_seconds

    t = checks.tiers
    assert fetch_seconds(t.TIE, 1024, pcie_bytes_per_s=t.TIE_LINK) == 2.0**-9
    assert recompute_seconds(t.TIE, t.TIE_GPU, 1024) == 2.0**-9
    assert 1024 in t.CARDS[-1][-1]
    assert not fetch_rule()(t.TIE, t.TIE_GPU, 1024, t.TIE_LINK)
    assert fetch_rule("fetch < flops => fetch <= flops")(t.TIE, t.TIE_GPU, 1024, t.TIE_LINK)


def test_the_kv_caches_own_dtype_is_asked_for():
    # every other card keeps a 16-bit cache: a rule counting the model's dtype_bytes (or 2
    # bytes) passed them all; the fp8 card fails it, with its hint, and only it
    fp8 = [card for card in checks.tiers.CARDS if card[1].kv_element_bytes == 1]
    assert len(fp8) == 1 and "fp8 KV cache" in fp8[0][0]
    _, spec, gpu, link, counts = fp8[0]
    assert spec.dtype_bytes == 2 and spec.kv_bytes_per_token == 409_600
    assert min(counts) < 16_131 == checks.tiers.break_even_tokens(spec, gpu, pcie_bytes_per_s=link)
    assert max(counts) >= 16_131
    for edit in ("spec.kv_element_bytes => spec.dtype_bytes", "spec.kv_element_bytes => 2"):
        result = run_checks("10.fetch_or_recompute", fetch_rule(edit))
        assert result.passed == result.total - 1, result.report()
        assert_only_hint(result, checks.MODEL_DTYPE)
    fixed = fetch_rule(
        "kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * "
        "spec.kv_element_bytes => kv_per_token = spec.kv_bytes_per_token"
    )
    result = run_checks("10.fetch_or_recompute", fixed)
    assert result.ok and result.passed == result.total == len(checks.tiers.CARDS), result.report()


def test_a_rule_that_is_wrong_another_way_gets_no_hint():
    # (one that always fetches answers as the HBM slip does on every card: that hint it gets)
    always = fetch_rule("return fetch < flops / gpu.peak_flops => return False")
    result = run_checks("10.fetch_or_recompute", always)
    assert result.status is Status.FAILED
    assert not hints_of(result), result.report()


# --- slips the hints did not anticipate (try10) ------------------------------------------------


def test_a_walk_that_checks_the_limit_only_at_an_edge_start_fails():
    # the inner loop runs past the page of the prompt's last token when the prompt ends on a
    # room's last bed inside a longer edge: it passed every check before the "inner" case
    outer_only = match_prefix(
        "while k < len(child.blocks) and j + k < limit: => while k < len(child.blocks):"
    )
    result = run_checks("10.match_prefix", outer_only)
    assert result.status is Status.FAILED, result.report()


def test_a_walk_that_bounds_each_edge_by_the_limit_alone_fails():
    # `k < limit` for `j + k < limit`: right on the first edge, past the last token's page on a
    # second one (a red team's; it passed every check before the "second edge" case)
    per_edge = match_prefix("and j + k < limit: => and k < limit:")
    result = run_checks("10.match_prefix", per_edge)
    assert result.status is Status.FAILED, result.report()


def test_a_walk_that_advances_one_page_per_edge_gets_no_split_hint():
    # it splits where it should, yet on the "deep" case it returns the node a walk that never
    # splits would: the no-split hint named a mistake it did not make
    one_page = match_prefix("node, j = child, j + k => node, j = child, j + 1")
    result = run_checks("10.match_prefix", one_page)
    assert result.status is Status.FAILED
    assert not hints_of(result), result.report()


@pytest.mark.parametrize(
    "edits",
    [
        ["- load_penalty * view.load => - load_penalty / (view.load + 1)"],
        ["- load_penalty * view.load => + load_penalty * view.load"],
        ["- load_penalty * view.load => - load_penalty * view.load + view.free_tokens"],
    ],
    ids=["penalty over load", "load added", "free tokens added"],
)
def test_a_router_scored_another_way_gets_no_hint(edits):
    # each picked as one slip does on one fleet (no load, or rooms for tokens) and got its hint
    result = run_checks("10.prefix_score", prefix_router(*edits))
    assert result.status is Status.FAILED
    assert not hints_of(result), result.report()


@pytest.mark.parametrize("default", ["127.0", "129.0"])
def test_a_default_penalty_off_by_a_token_fails_that_check(default):
    # a red team's: with every cached prefix in whole rooms of 16, defaults of 124 to 132 passed
    result = run_checks(
        "10.prefix_score", prefix_router(f"load_penalty=128.0 => load_penalty={default}")
    )
    assert result.passed == result.total - 1, result.report()
    assert "✘ the default load_penalty, 128" in result.report(), result.report()


@pytest.mark.parametrize(
    "returned, hint",
    [("str(best)", (1, "str")), ("best, top", (0, "tuple"))],
    ids=["text", "tuple"],
)
def test_an_index_returned_as_another_type_is_told_so(returned, hint):
    which, kind = hint
    fn = prefix_router(f"return best => return {returned}")
    assert_only_hint(run_checks("10.prefix_score", fn), checks.INDEX_TYPE[which].format(kind=kind))


def test_a_least_loaded_router_is_told_both_slips_it_cannot_be_told_from():
    least = prefix_router("view.cached_prefix_tokens(request) - => 0 -")
    result = run_checks("10.prefix_score", least)
    assert_only_hint(result, checks.IN_BLOCKS)
    assert "least-loaded" in checks.IN_BLOCKS and "rooms" in checks.IN_BLOCKS


def test_attention_counted_n_squared_gets_its_own_hint_not_gib():
    # it answered as the GB/GiB slip did on every input before 9,000 and 25,000 were asked
    square = fetch_rule("attended = num_tokens * (num_tokens + 1) / 2 => attended = num_tokens**2")
    assert_only_hint(run_checks("10.fetch_or_recompute", square), checks.ATTN_SQUARE)


def test_a_link_taken_for_gb_per_s_is_named_in_the_always_fetch_hint():
    scaled = fetch_rule("/ pcie_bytes_per_s => / (pcie_bytes_per_s * 1e9)")
    assert_only_hint(run_checks("10.fetch_or_recompute", scaled), checks.HBM_NOT_PCIE)
    assert "multiply it by nothing" in checks.HBM_NOT_PCIE


@pytest.mark.parametrize(
    "edit",
    [
        "- load_penalty * view.load => - 128 * view.load",
        "score = view.cached_prefix_tokens(request) - load_penalty * view.load => "
        "score = int(view.cached_prefix_tokens(request) - load_penalty * view.load)",
    ],
    ids=["penalty ignored", "score truncated"],
)
def test_a_router_wrong_only_for_a_penalty_given_fails_that_check(edit):
    # a red team's: each passed every check while the checks called with the default penalty
    result = run_checks("10.prefix_score", prefix_router(edit))
    assert result.passed == result.total - 1, result.report()
    assert "✘ load_penalty passed in" in result.report(), result.report()
