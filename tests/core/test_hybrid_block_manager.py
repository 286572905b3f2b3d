"""The hybrid block manager: per-group tables on one pool, windows that hand blocks back, fixed
states, all-or-nothing changes, prefix hits every group serves, and a dense model that is
today's BlockManager step for step."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import BlockManager, OutOfBlocks
from kvlab.core.hybrid_block_manager import HybridBlockManager
from kvlab.core.kv_spec import (
    FullAttentionSpec,
    LayerGroup,
    MLASpec,
    SlidingWindowSpec,
    StateSpec,
    cdiv,
)

FULL = FullAttentionSpec(8, 128)
MLA = MLASpec(512, 64)
STATE = StateSpec(1 << 20)


def window(w: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(8, 128, window=w)


class Generic(HybridBlockManager):
    """The groups' own managers even for a dense model (no BlockManager behind it)."""

    delegate_dense = False


def snapshot(m):
    """Everything a call may change: tables, tokens, reference counts, the free queue, the
    cached map."""
    pool = m.pool
    return (
        {s: m.block_tables(s) for s in m.seq_ids},
        {s: m.num_tokens(s) for s in m.seq_ids},
        [b.ref_count for b in pool.blocks],
        m.free_block_ids(),
        m.num_free_blocks,
        dict(pool.cached),
        [b.block_hash for b in pool.blocks],
    )


# --- a dense model is today's BlockManager ------------------------------------------------------

op = st.one_of(
    st.tuples(st.just("allocate"), st.lists(st.integers(0, 2), min_size=1, max_size=14)),
    st.tuples(st.just("allocate"), st.integers(1, 14)),
    st.tuples(st.just("append"), st.integers(0, 9), st.none() | st.integers(0, 2)),
    st.tuples(st.just("append"), st.integers(0, 9), st.integers(0, 2)),
    st.tuples(st.just("fork"), st.integers(0, 9)),
    st.tuples(st.just("free"), st.integers(0, 9)),
    st.tuples(st.just("computed"), st.integers(0, 9)),
)


def apply(m, step, live: list, seq_id, shadow_ids: dict):
    """One step on ``m``: what it returned, or the type of what it raised."""
    kind = step[0]
    try:
        if kind == "allocate":
            return "ok", m.allocate(seq_id, step[1])
        target = live[step[1] % len(live)]
        if kind == "append":
            return "ok", m.append_slot(target, step[2])
        if kind == "fork":
            return "ok", m.fork(target, seq_id)
        if kind == "free":
            return "ok", m.free(target)
        ids = shadow_ids.get(target, [])
        return "ok", m.cache_computed(target, ids, m.num_tokens(target))
    except (OutOfBlocks, ValueError) as error:
        return "error", type(error)


def block_manager_view(m: BlockManager):
    return (
        {s: m.block_table(s) for s in m.seq_ids},
        {s: m.num_tokens(s) for s in m.seq_ids},
        m.pool.free_queue.block_ids(),
        m.num_free_blocks,
        m.cached_block_ids(),
        {s: m.num_cached_tokens(s) for s in m.seq_ids},
    )


def hybrid_view(m: HybridBlockManager):
    return (
        {s: m.block_table(s) for s in m.seq_ids},
        {s: m.num_tokens(s) for s in m.seq_ids},
        m.free_block_ids(),
        m.num_free_blocks,
        m.cached_block_ids(),
        {s: m.num_cached_tokens(s) for s in m.seq_ids},
    )


def as_hybrid(kind: str, result):
    """A BlockManager's answer as the hybrid manager gives it."""
    status, value = result
    if status == "error":
        return result
    if kind == "allocate":
        return "ok", (value,)
    if kind == "append":
        return "ok", [] if value is None else [(0, *value)]
    if kind == "fork":
        return "ok", []
    return result


def run_dense_stream(ops, managers):
    reference, others = managers[0], managers[1:]
    live, shadow_ids, next_id = [], {}, 0
    for step in ops:
        if step[0] not in ("allocate",) and not live:
            continue
        if step[0] == "computed" and not reference.enable_prefix_caching:
            continue
        next_id += 1
        expected = apply(reference, step, live, next_id, shadow_ids)
        for m in others:
            got = apply(m, step, live, next_id, shadow_ids)
            assert got == as_hybrid(step[0], expected), (step, expected, got)
        view = block_manager_view(reference)
        for m in others:
            assert hybrid_view(m) == view, step
            m.check_invariants()
        reference.check_invariants()
        if expected[0] == "ok":
            kind = step[0]
            if kind in ("allocate", "fork"):
                live.append(next_id)
                if kind == "allocate" and isinstance(step[1], list):
                    shadow_ids[next_id] = list(step[1])
                elif kind == "fork":
                    parent = live[step[1] % (len(live) - 1)]
                    if parent in shadow_ids:
                        shadow_ids[next_id] = list(shadow_ids[parent])
            elif kind == "free":
                gone = live.pop(step[1] % len(live))
                shadow_ids.pop(gone, None)
            elif kind == "append" and live[step[1] % len(live)] in shadow_ids:
                target = live[step[1] % len(live)]
                shadow_ids[target].append(0 if step[2] is None else step[2])


@settings(max_examples=120, deadline=None)
@given(
    ops=st.lists(op, min_size=10, max_size=50),
    num_blocks=st.integers(1, 20),
    block_size=st.sampled_from([1, 2, 3, 4]),
    caching=st.sampled_from(["off", "hash", "radix"]),
)
def test_one_full_attention_group_is_todays_block_manager(ops, num_blocks, block_size, caching):
    """The same random streams of allocate / append_slot / fork / free / cache_computed on
    BlockManager and on the hybrid manager of one full-attention group: the same tables, free
    queues, cached blocks, answers and refusals at every step. Without prefix caching the
    groups' own managers (no BlockManager behind them) give the same too."""
    kwargs = {"enable_prefix_caching": caching != "off"}
    if caching != "off":
        kwargs["prefix_cache"] = caching
    managers = [
        BlockManager(num_blocks, block_size, **kwargs),
        HybridBlockManager(num_blocks, block_size, [FULL], **kwargs),
        HybridBlockManager(num_blocks, block_size, [LayerGroup(MLA, 61)], **kwargs),
    ]
    assert managers[1].dense is not None
    if caching == "off":
        managers.append(Generic(num_blocks, block_size, [FULL]))
        managers.append(Generic(num_blocks, block_size, [MLA]))
    run_dense_stream(ops, managers)


def test_generic_copy_on_write_matches_block_manager():
    reference, generic = BlockManager(6, 4), Generic(6, 4, [FULL])
    for m in (reference, generic):
        m.allocate("a", 6)
        m.fork("a", "b")
    assert reference.append_slot("b") == (1, 2)
    assert generic.append_slot("b") == [(0, 1, 2)]
    assert hybrid_view(generic) == block_manager_view(reference)


# --- sliding windows hand blocks back ------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 2, 16])
@pytest.mark.parametrize("k_offset", [(0, 1), (1, -1), (1, 0), (1, 1), (3, -1), (3, 1)])
def test_sliding_window_returns_blocks(block_size, k_offset):
    """Window 1, k*block_size and k*block_size ± 1: after every append the table holds exactly
    the blocks of the window of the next token, the null block before them, and the blocks
    handed back are free again."""
    k, offset = k_offset
    w = max(1, k * block_size + offset)
    spec = window(w)
    m = HybridBlockManager(200, block_size, [spec])
    null = m.num_blocks
    m.allocate("s", 1)
    for n in range(2, 6 * w + 3 * block_size):
        m.append_slot("s", None)
        table = m.block_table("s")
        skipped = spec.first_needed(n - 1) // block_size
        assert table[:skipped] == [null] * skipped
        assert null not in table[skipped:]
        # read off the window itself: the newest token (position n - 1) reads n - w .. n - 1,
        # so a block is held exactly when its last slot is one of them
        reads = [(i + 1) * block_size - 1 >= n - w for i in range(len(table))]
        assert [b != null for b in table] == reads
        assert len(table) == cdiv(n, block_size)
        assert m.num_free_blocks == 200 - (len(table) - skipped)
        assert null not in m.free_block_ids()
        m.check_invariants()
    m.free("s")
    assert m.num_free_blocks == 200
    m.check_invariants()


def test_window_blocks_held_are_the_specs_figure():
    """What a window group holds for n tokens is what its spec says a request holds, once
    the next token's blocks are handed back."""
    for w, size in [(1, 1), (5, 4), (8, 4), (9, 4), (1024, 16)]:
        spec = window(w)
        m = HybridBlockManager(300, size, [spec])
        m.allocate("s", 1)
        for n in range(2, 2 * w + 40):
            m.append_slot("s")
            held = m.blocks_held("s")
            # appending the n-th token dropped what token n - 1 no longer reads
            assert held == cdiv(n, size) - spec.first_needed(n - 1) // size
            # the spec's figure for the n - 1 computed tokens, and the block the n-th opened
            assert held == spec.blocks_held(n - 1, size) + cdiv(n, size) - cdiv(n - 1, size)


def test_shared_window_blocks_are_freed_by_their_last_holder():
    m = HybridBlockManager(30, 2, [FULL, window(3)])
    m.allocate("a", 8)
    m.fork("a", "b")
    free = m.num_free_blocks
    m.append_slot("a")  # a's window hands back blocks b still holds: none become free
    m.check_invariants()
    assert m.num_free_blocks == free - 2  # a new block in each group
    m.append_slot("b")
    m.check_invariants()
    m.free("a")
    m.free("b")
    assert m.num_free_blocks == 30
    m.check_invariants()


# --- Gemma-3-like groups on one pool -------------------------------------------------------------

GEMMA_LIKE = [LayerGroup(window(1024), 10)] * 5 + [LayerGroup(FULL, 10)]


def grow_requests(m, length: int, chunk: int = 512) -> int:
    """Requests of ``length`` tokens that fit, one after the other, each allocated with its
    first ``chunk`` tokens and grown a token at a time."""
    count = 0
    while True:
        seq = count
        try:
            m.allocate(seq, min(chunk, length))
            for _ in range(length - min(chunk, length)):
                m.append_slot(seq)
        except OutOfBlocks:
            return count
        count += 1


def test_gemma_like_groups_share_one_pool():
    m = HybridBlockManager(2000, 16, GEMMA_LIKE)
    m.allocate("a", 100)
    for _ in range(2900):
        m.append_slot("a")
    tables = m.block_tables("a")
    assert len(tables) == 6
    assert all(len(t) == cdiv(3000, 16) for t in tables)
    spec = window(1024)
    held_window = cdiv(3000, 16) - spec.first_needed(2999) // 16
    assert [len(t) - t.count(m.num_blocks) for t in tables] == [held_window] * 5 + [188]
    ids = [b for t in tables for b in t if b != m.num_blocks]
    assert len(ids) == len(set(ids))  # no block in two groups
    assert m.num_free_blocks == 2000 - len(ids)
    m.check_invariants()


def test_gemma_like_model_fits_more_requests_than_full_attention():
    """At 4,096 tokens a request holds 256 full-attention blocks and 64 or 65 per window
    group: the same pool fits 2 requests of a full-attention-only model and 7 of the hybrid."""
    full_only = [LayerGroup(FULL, 10)] * 6
    pool = 6 * 256 * 2
    assert grow_requests(Generic(pool, 16, full_only), 4096) == 2
    # finished requests hold 256 + 5 * 64; the last one grows through 256 + 5 * 65
    assert grow_requests(HybridBlockManager(pool, 16, GEMMA_LIKE), 4096) == 1 + (
        pool - (256 + 5 * 65)
    ) // (256 + 5 * 64)


# --- state groups --------------------------------------------------------------------------------


def test_state_group_holds_one_fixed_block():
    m = HybridBlockManager(40, 4, [FULL, STATE])
    m.allocate("a", 3)
    state = m.block_table("a", 1)
    for n in range(4, 30):
        m.append_slot("a")
        assert m.block_table("a", 1) == state
        assert len(m.block_table("a", 0)) == cdiv(n, 4)
    copies = m.fork("a", "b")
    (group, src, dst), *rest = copies
    assert not rest and group == 1 and src == state[0] and dst != src
    assert m.block_table("b", 1) == [dst]
    assert m.block_table("b", 0) == m.block_table("a", 0)
    m.check_invariants()
    m.free("a")
    m.free("b")
    assert m.num_free_blocks == 40
    m.check_invariants()


def test_a_model_with_a_state_group_finds_no_prefix():
    """vLLM with mamba_cache_mode="none": the state at a prefix's end is not kept, so nothing
    is cached and no prompt starts from a cached prefix."""
    m = HybridBlockManager(40, 2, [FULL, STATE], enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5, 6, 7])
    m.free("a")
    plan = m.plan_allocation([1, 2, 3, 4, 5, 6, 7])
    assert plan.num_cached_tokens == 0 and not m.pool.cached
    m.allocate("b", [1, 2, 3, 4, 5, 6, 7])
    assert m.num_cached_tokens("b") == 0
    assert m.prefix_cache_stats.queries == 14 and m.prefix_cache_stats.hits == 0


# --- all or nothing ------------------------------------------------------------------------------


def test_allocate_is_all_or_nothing_across_groups():
    m = HybridBlockManager(9, 4, [FULL, window(4), STATE])
    m.allocate("a", 4)  # 1 + 1 + 1 blocks
    before = snapshot(m)
    assert not m.can_allocate(9)  # 3 + 3 + 1 > 6
    with pytest.raises(OutOfBlocks) as refusal:
        m.allocate("b", 9)
    assert refusal.value.needed == 7
    assert snapshot(m) == before and "b" not in m
    m.check_invariants()
    m.allocate("b", 8)  # 2 + 2 + 1 = 5 fit
    m.check_invariants()


def test_append_needs_every_group():
    m = HybridBlockManager(6, 2, [FULL, FULL, STATE])
    m.allocate("a", 4)  # 2 + 2 + 1: one block left
    before = snapshot(m)
    assert not m.can_append("a")  # a new block in both full groups
    with pytest.raises(OutOfBlocks) as refusal:
        m.append_slot("a")
    assert refusal.value.needed == 2
    assert snapshot(m) == before
    m.check_invariants()


def test_fork_needs_a_block_for_each_state():
    m = HybridBlockManager(4, 4, [FULL, STATE, STATE])
    m.allocate("a", 4)  # 1 + 1 + 1: one block left, the fork needs two
    before = snapshot(m)
    with pytest.raises(OutOfBlocks):
        m.fork("a", "b")
    assert snapshot(m) == before and "b" not in m
    m.check_invariants()


def test_copy_on_write_in_every_group_is_all_or_nothing():
    m = HybridBlockManager(5, 4, [FULL, window(8)])
    m.allocate("a", 6)  # 2 + 2 blocks, one left
    m.fork("a", "b")
    before = snapshot(m)
    assert not m.can_append("b")  # its shared, partly filled last block in both groups
    with pytest.raises(OutOfBlocks) as refusal:
        m.append_slot("b")
    assert refusal.value.needed == 2
    assert snapshot(m) == before
    m.free("a")
    assert m.append_slot("b") == []  # b alone holds them now: no copy
    m.check_invariants()


def test_a_window_handing_blocks_back_makes_room_for_the_append():
    """The blocks a window hands back serve the same append (vLLM frees skipped blocks before
    it allocates)."""
    m = HybridBlockManager(4, 1, [window(2)])
    m.allocate("a", 4)  # 4 blocks, none free
    assert m.num_free_blocks == 0
    assert m.can_append("a")
    m.append_slot("a")  # hands back blocks 2, 1, 0 (last first, as vLLM), takes one
    assert m.block_table("a") == [4, 4, 4, 3, 2]
    assert m.free_block_ids() == [1, 0]
    m.check_invariants()


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "named"),
    [
        ((0, 4, [FULL, STATE]), {}, ValueError, "num_blocks"),
        ((8, True, [FULL, STATE]), {}, TypeError, "block_size"),
        ((8, 4, []), {}, ValueError, "groups"),
        ((8, 4, "full"), {}, TypeError, "groups"),
        ((8, 4, FULL), {}, TypeError, "groups"),
        ((8, 4, [FULL, 3]), {}, TypeError, "groups[1]"),
        ((8, 4, [FULL, STATE]), {"enable_prefix_caching": "yes"}, TypeError, "enable_prefix"),
        ((8, 4, [FULL, STATE]), {"prefix_cache": "lru"}, ValueError, "prefix_cache"),
        (
            (8, 4, [FULL, window(4)]),
            {"enable_prefix_caching": True, "prefix_cache": "radix"},
            ValueError,
            "prefix_cache",
        ),
    ],
)
def test_bad_construction_names_the_argument(args, kwargs, error, named):
    with pytest.raises(error, match=named.replace("[", r"\[").replace("]", r"\]")):
        HybridBlockManager(*args, **kwargs)


def test_bad_calls_name_the_argument_and_change_nothing():
    m = HybridBlockManager(20, 2, [FULL, window(3), STATE], enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3])
    m.allocate("n", 3)
    before = snapshot(m)
    calls = [
        (lambda: m.allocate("b", []), ValueError, "prompt"),
        (lambda: m.allocate("b", "abc"), TypeError, "prompt"),
        (lambda: m.allocate("b", 0), ValueError, "prompt"),
        (lambda: m.allocate("b", [1, True]), TypeError, r"prompt\[1\]"),
        (lambda: m.allocate("b", [1, 2], num_computed=3), ValueError, "num_computed"),
        (lambda: m.allocate("b", [1, 2], num_computed=-1), ValueError, "num_computed"),
        (lambda: m.allocate("a", 2), ValueError, "already exists"),
        (lambda: m.allocate(["b"], 2), TypeError, "seq_id"),
        (lambda: m.append_slot("a", 1.5), TypeError, "token_id"),
        (lambda: m.append_slot("n", 4), ValueError, "token count"),
        (lambda: m.append_slot("zz"), KeyError, "zz"),
        (lambda: m.fork("a", "a"), ValueError, "already exists"),
        (lambda: m.fork("zz", "c"), KeyError, "zz"),
        (lambda: m.free("zz"), KeyError, "zz"),
        (lambda: m.block_table("a", 3), ValueError, "group"),
        (lambda: m.block_table("a", "0"), TypeError, "group"),
        (lambda: m.ref_count(20), ValueError, "block_id"),
        (lambda: m.cache_computed("a", [1, 2, 3], 9), ValueError, "num_computed"),
    ]
    for call, error, named in calls:
        with pytest.raises(error, match=named):
            call()
        assert snapshot(m) == before, named
    m.check_invariants()


# --- prefix hits across groups against a brute-force shadow --------------------------------------


def brute_force_hit(m: HybridBlockManager, shadow: dict, prompt: list[int]) -> int:
    """The longest prefix (whole blocks, never the last token) that every group can serve,
    read off what each group's cached blocks hold."""
    size = m.block_size
    cached = [set() for _ in m.specs]
    for (group, block_id), prefix in shadow.items():
        block_hash = m.pool.blocks[block_id].block_hash
        if block_hash is not None and block_hash[0] == group:
            cached[group].add(prefix)

    def serves(group: int, length: int) -> bool:
        spec = m.specs[group]
        if spec.kind == "state":
            return length == 0
        first = spec.first_needed(length) // size if spec.kind == "sliding_window" else 0
        return all(
            tuple(prompt[: (j + 1) * size]) in cached[group] for j in range(first, length // size)
        )

    longest = (len(prompt) - 1) // size * size
    return max(
        L for L in range(0, longest + 1, size) if all(serves(g, L) for g in range(len(m.specs)))
    )


def note_blocks(m: HybridBlockManager, shadow: dict) -> None:
    """What each block of a live table holds, where its tokens are known and full."""
    size, null = m.block_size, m.num_blocks
    for seq_id in m.seq_ids:
        ids = m.token_ids(seq_id)
        if ids is None:
            continue
        for group, table in enumerate(m.block_tables(seq_id)):
            for j, block_id in enumerate(table[: len(ids) // size]):
                if block_id != null and m.specs[group].kind != "state":
                    shadow[(group, block_id)] = tuple(ids[: (j + 1) * size])


MODELS = {
    "full+window": [FULL, window(3)],
    "window only": [window(4)],
    "two windows": [window(2), window(5), FULL],
    "full+mla": [FULL, MLA],
    "window 1": [window(1), FULL],
}

hit_op = st.one_of(
    st.tuples(st.just("allocate"), st.lists(st.integers(0, 1), min_size=1, max_size=16)),
    st.tuples(st.just("append"), st.integers(0, 9), st.integers(0, 1)),
    st.tuples(st.just("append"), st.integers(0, 9), st.integers(0, 1)),
    st.tuples(st.just("fork"), st.integers(0, 9)),
    st.tuples(st.just("free"), st.integers(0, 9)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(hit_op, min_size=10, max_size=50),
    model=st.sampled_from(sorted(MODELS)),
    num_blocks=st.integers(4, 40),
    block_size=st.sampled_from([1, 2, 3]),
)
def test_prefix_hit_is_the_longest_every_group_serves(ops, model, num_blocks, block_size):
    m = HybridBlockManager(num_blocks, block_size, MODELS[model], enable_prefix_caching=True)
    shadow, live, next_id = {}, [], 0
    for step in ops:
        kind = step[0]
        if kind == "allocate":
            prompt = step[1]
            plan = m.plan_allocation(prompt)
            assert plan.num_cached_tokens == brute_force_hit(m, shadow, prompt), prompt
            for group, blocks in enumerate(plan.hit_blocks):
                for j, block in enumerate(blocks):
                    if block is not m.null_block:
                        assert shadow[(group, block.block_id)] == tuple(
                            prompt[: (j + 1) * block_size]
                        )
            next_id += 1
            try:
                m.allocate(next_id, prompt)
            except OutOfBlocks:
                assert plan.blocks_needed > plan.available
            else:
                live.append(next_id)
                assert m.num_cached_tokens(next_id) == plan.num_cached_tokens
        elif not live:
            continue
        elif kind == "append":
            try:
                m.append_slot(live[step[1] % len(live)], step[2])
            except OutOfBlocks:
                pass
        elif kind == "fork":
            next_id += 1
            try:
                m.fork(live[step[1] % len(live)], next_id)
            except OutOfBlocks:  # pragma: no cover - no state group here
                pass
            else:
                live.append(next_id)
        else:
            m.free(live.pop(step[1] % len(live)))
        m.check_invariants()
        note_blocks(m, shadow)


def test_window_hit_needs_only_its_last_blocks():
    """A window's early blocks can be long gone: the prefix still hits if its last
    ``window - 1`` tokens' blocks are cached."""
    m = HybridBlockManager(12, 2, [window(3)], enable_prefix_caching=True)
    prompt = list(range(1, 12))  # 11 tokens: 5 full blocks
    m.allocate("a", prompt[:2])
    for t in prompt[2:]:
        m.append_slot("a", t)
    m.free("a")
    for k in range(10):  # hand out the blocks of the prompt's first four blocks (and others)
        m.allocate(f"x{k}", [99, k])
    assert m.cached_block_ids() == [4]  # all that is left of the prompt: its last full block
    plan = m.plan_allocation(prompt + [50])
    assert plan.num_cached_tokens == 10
    assert [b is m.null_block for b in plan.hit_blocks[0]] == [True] * 4 + [False]


def test_cache_computed_with_a_bad_id_changes_nothing():
    """A bad id anywhere in the new part is refused before any id is kept, as BlockManager
    does: a partly extended list would make later blocks findable under ids never checked."""
    m = HybridBlockManager(20, 2, [FULL, window(3)], enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3])
    m.append_slot("a")  # slots reserved before their ids are known
    m.append_slot("a")
    before = snapshot(m)
    with pytest.raises(TypeError, match=r"token_ids\[4\]"):
        m.cache_computed("a", [1, 2, 3, 4, "x"], 5)
    assert m.token_ids("a") == [1, 2, 3]
    assert snapshot(m) == before
    m.cache_computed("a", [1, 2, 3, 4, 5], 5)
    assert m.token_ids("a") == [1, 2, 3, 4, 5]
    m.check_invariants()


# --- a window's hand-back written elsewhere (Lab 11) -------------------------------------------


def _room_numbers_step(block_table, num_computed, *, window, block_size, free, null_block):
    first = max(0, num_computed - window + 1)
    for i in range(first // block_size - 1, -1, -1):
        if block_table[i] == null_block:
            break
        free([block_table[i]])
        block_table[i] = null_block


@given(
    window=st.integers(1, 12),
    size=st.integers(1, 5),
    grows=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9)), min_size=1, max_size=12),
)
def test_a_window_step_on_room_numbers_keeps_kvlabs_books(window, size, grows):
    specs = [FullAttentionSpec(1, 8), SlidingWindowSpec(1, 8, window=window)]
    ours = HybridBlockManager(400, size, specs)
    stepped = HybridBlockManager(400, size, specs, window_step=_room_numbers_step)
    for m in (ours, stepped):
        for g in range(3):
            m.allocate(g, 1 + g * 5)
    for guest, n in grows:
        for _ in range(n):
            ours.append_slot(guest)
            stepped.append_slot(guest)
        assert stepped.block_tables(guest) == ours.block_tables(guest)
        assert stepped.free_block_ids() == ours.free_block_ids()
        stepped.check_invariants()
    state = stepped.state()
    for guest in range(3):  # the floor plan's rooms: every group's non-null rooms, beds in them
        assert state.block_tables[guest] == [
            b for t in stepped.block_tables(guest) for b in t if b != stepped.num_blocks
        ]
        assert state.tokens[guest] <= state.booked[guest] == stepped.blocks_held(guest) * size


def test_a_window_step_is_told_what_a_card_holds():
    def writes_a_name(block_table, num_computed, *, window, block_size, free, null_block):
        block_table[0] = "room"

    def frees_an_int(block_table, num_computed, *, window, block_size, free, null_block):
        free(block_table[0])

    def writes_no_room(block_table, num_computed, *, window, block_size, free, null_block):
        block_table[0] = 999

    for step, kind, match in [
        (writes_a_name, TypeError, "room numbers"),
        (frees_an_int, TypeError, "list of room numbers"),
        (writes_no_room, ValueError, "not in the hotel"),
    ]:
        m = HybridBlockManager(8, 2, [SlidingWindowSpec(1, 8, window=2)], window_step=step)
        m.allocate("a", 3)
        with pytest.raises(kind, match=match):
            m.append_slot("a")
    with pytest.raises(TypeError, match="window_step"):
        HybridBlockManager(8, 2, [SlidingWindowSpec(1, 8, window=2)], window_step=3)
