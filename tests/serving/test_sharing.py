import random
from collections import Counter
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import BlockManager
from kvlab.serving import sharing
from kvlab.serving.sharing import (
    BEAM,
    PARALLEL,
    beam_search,
    beam_search_trace,
    parallel_sampling,
    sample_lengths,
    savings_table,
    sharing_savings,
)
from kvlab.serving.workload import Request, alpaca_like


class CheckedManager(BlockManager):
    """A block manager that checks the pool after every change and remembers every instance."""

    made: list = []

    def __init__(self, *args):
        super().__init__(*args)
        CheckedManager.made.append(self)

    def _check(self):
        holders = Counter(b for s in self.seq_ids for b in self.block_table(s))
        assert all(b.ref_count == holders[b.block_id] >= 0 for b in self.pool.blocks)
        assert len(holders) == self.num_blocks - self.num_free_blocks

    def append_slot(self, seq_id):
        moved = super().append_slot(seq_id)
        self._check()
        return moved

    def fork(self, parent_id, child_id):
        super().fork(parent_id, child_id)
        self._check()

    def free(self, seq_id):
        super().free(seq_id)
        self._check()


def checked(run, *args, **kwargs):
    """``run(*args, **kwargs)`` on a CheckedManager; the manager ends with every block free."""
    CheckedManager.made = []
    with mock.patch.object(sharing, "BlockManager", CheckedManager):
        result = run(*args, **kwargs)
    (manager,) = CheckedManager.made
    assert manager.num_free_blocks == manager.num_blocks and not manager.seq_ids
    return result


requests_st = st.lists(
    st.builds(Request, st.integers(1, 40), st.integers(1, 25)), min_size=1, max_size=3
)
block_sizes = st.sampled_from([1, 2, 3, 4, 16])
RUNS = st.sampled_from([parallel_sampling, beam_search])


def blocks(tokens, size):
    return -(-tokens // size)


# --- properties ----------------------------------------------------------------------------
@settings(max_examples=40)
@given(run=RUNS, reqs=requests_st, n=st.integers(1, 4), size=block_sizes, seed=st.integers(0, 3))
def test_invariants(run, reqs, n, size, seed):
    r = checked(run, reqs, n, block_size=size, seed=seed)
    assert 0 <= r.saving < 1
    assert all(w <= wo for w, wo in zip(r.series_with, r.series_without, strict=True))
    assert r.with_sharing == sum(r.series_with) and r.without_sharing == sum(r.series_without)
    assert r.steps == len(r.series_with) and r.num_requests == len(reqs)
    assert r.peak_with == max(r.series_with) and r.peak_without == max(r.series_without)
    assert r.frees == r.forks + len(reqs)  # every sequence made, allocated or forked, checks out
    assert r == run(reqs, n, block_size=size, seed=seed)  # the seed decides everything


@settings(max_examples=20)
@given(run=RUNS, reqs=requests_st, size=block_sizes, seed=st.integers(0, 3))
def test_one_sequence_shares_nothing(run, reqs, size, seed):
    r = run(reqs, 1, block_size=size, seed=seed)
    assert r.saving == 0 and r.with_sharing == r.without_sharing
    assert r.series_with == r.series_without
    assert r.forks == r.copy_on_writes == 0 and r.frees == len(reqs)
    assert r.steps == sum(q.output_len for q in reqs)  # n = 1 generates exactly output_len


@settings(max_examples=25)
@given(reqs=requests_st, n=st.integers(1, 5), size=block_sizes, seed=st.integers(0, 3))
def test_parallel_copies_each_partly_filled_prompt_room_once_per_extra_sample(reqs, n, size, seed):
    r = parallel_sampling(reqs, n, block_size=size, seed=seed)
    assert r.forks == (n - 1) * len(reqs)
    assert r.copy_on_writes == (n - 1) * sum(q.prompt_len % size != 0 for q in reqs)


@settings(max_examples=25)
@given(prompt=st.integers(1, 40), out=st.integers(1, 25), width=st.integers(1, 4), size=block_sizes)
def test_beam_search_keeps_width_beams(prompt, out, width, size):
    r = beam_search([Request(prompt, out)], width, block_size=size)
    assert r.steps == out
    assert r.series_without == [width * blocks(prompt + t, size) for t in range(1, out + 1)]
    assert all(w >= blocks(prompt + t, size) for t, w in enumerate(r.series_with, 1))


@given(n=st.integers(1, 6), out=st.integers(1, 500), seed=st.integers(0, 100))
def test_sample_lengths(n, out, seed):
    lengths = sample_lengths(random.Random(seed), out, n)
    assert len(lengths) == n and lengths[0] == out and min(lengths) >= 1
    assert sample_lengths(random.Random(seed), out, n, sigma=0) == [out] * n


# --- worked by hand --------------------------------------------------------------------------
def test_parallel_prompt_of_full_rooms():
    # Prompt 8 in rooms of 4: 2 full rooms, shared by both samples after the fork. Each sample's
    # one token needs a fresh room (its last room is full, so nothing is copied): 2 + 2 = 4 rooms
    # in use, against 3 + 3 = 6 if each held its own. Saving 1 - 4/6 = 1/3.
    r = checked(parallel_sampling, [Request(8, 1)], 2, block_size=4, length_sigma=0)
    assert (r.with_sharing, r.without_sharing, r.steps) == (4, 6, 1)
    assert (r.forks, r.copy_on_writes, r.frees) == (1, 0, 2)
    assert r.saving == pytest.approx(1 / 3)


def test_parallel_prompt_ending_in_a_partly_filled_room():
    # Prompt 6 in rooms of 4: room A full, room B with 2 tokens, both shared. Step 1: sample 0
    # writes into shared B -> copy-on-write to C; sample 1 now holds B alone and writes in place:
    # A, B, C = 3 in use, 2 + 2 = 4 alone. Step 2: both write in place (8 tokens each): 3 vs 4.
    r = checked(parallel_sampling, [Request(6, 2)], 2, block_size=4, length_sigma=0)
    assert r.series_with == [3, 3] and r.series_without == [4, 4]
    assert (r.forks, r.copy_on_writes, r.frees) == (1, 1, 2)
    assert r.saving == pytest.approx(0.25)


def test_parallel_samples_stopping_early_check_out():
    lengths = sample_lengths(random.Random(5), 10, 3)
    assert len(set(lengths)) > 1  # this seed draws different lengths
    r = checked(parallel_sampling, [Request(6, 10)], 3, block_size=4, seed=5)
    assert r.steps == max(lengths)
    live = [sum(n >= t for n in lengths) for t in range(1, max(lengths) + 1)]
    assert r.series_without == [k * blocks(6 + t, 4) for t, k in enumerate(live, 1)]


@pytest.mark.parametrize("size", [1, 4, 16])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_parallel_awkward_sizes(size, offset):
    # Every sample as long as the answer: at step t the full prompt rooms F = prompt // size stay
    # shared, each sample holds the rest of its ceil((prompt + t) / size) rooms alone.
    prompt, out, n = max(1, 2 * size + offset), 5, 3
    r = checked(parallel_sampling, [Request(prompt, out)], n, block_size=size, length_sigma=0)
    full = prompt // size
    assert r.series_with == [
        full + n * (blocks(prompt + t, size) - full) for t in range(1, out + 1)
    ]
    assert r.series_without == [n * blocks(prompt + t, size) for t in range(1, out + 1)]


def test_beam_first_step_forks_the_prompt():
    # One beam proposes 2 tokens; both survive: one fork. Prompt 5 in rooms of 4: room B holds
    # 1 token and is shared -> the first survivor copies it: A, B, C = 3 rooms, 2 + 2 alone.
    r = checked(beam_search, [Request(5, 1)], 2, block_size=4)
    assert (r.with_sharing, r.without_sharing) == (3, 4)
    assert (r.forks, r.copy_on_writes, r.frees) == (1, 1, 2)
    # Prompt 4: its one room is full; each beam takes a fresh room, nothing copied: 3 vs 4.
    r = checked(beam_search, [Request(4, 1)], 2, block_size=4)
    assert (r.with_sharing, r.without_sharing, r.copy_on_writes) == (3, 4, 0)


def test_beam_step_where_one_beam_wins_both_places():
    # A model that always proposes log-probs -1 and -2. Prompt 5, rooms of 4, width 2.
    # Step 1: beam 0 (score 0) -> -1 (beam 0) and -2 (fork beam 1); beam 0 copies shared room B
    #   to C, beam 1 keeps B: A, B, C = 3 in use, 4 alone.
    # Step 2: beam 0 proposes -2, -3, beam 1 proposes -3, -4: the best two are both beam 0's (ties
    #   go to the better-ranked beam). Beam 0 forks beam 2 (A and C shared), beam 1 checks out
    #   (B freed), beam 0 copies C to D, beam 2 writes into C: A, C, D = 3 in use, 4 alone.
    with mock.patch.object(sharing, "proposals", lambda rng, width: [-1.0, -2.0]):
        r = checked(beam_search, [Request(5, 2)], 2, block_size=4)
    assert r.series_with == [3, 3] and r.series_without == [4, 4]
    assert (r.forks, r.copy_on_writes, r.frees) == (2, 2, 1 + 2)


def test_proposals_are_log_probabilities():
    rng = random.Random(0)
    for width in (1, 2, 6):
        logps = sharing.proposals(rng, width)
        assert len(logps) == width and all(p < 0 for p in logps)
        assert sum(2.718281828459045**p for p in logps) < 1 + 1e-12


# --- trace and figures ---------------------------------------------------------------------
def test_beam_search_trace_shows_sharing():
    trace = beam_search_trace(prompt_len=6, output_len=6, width=3, block_size=4, seed=0)
    assert (trace.num_blocks, trace.block_size) == (24, 4)
    for event in ("check-in", "fork", "copy-on-write", "check-out", "step"):
        assert trace.events(event), event
    assert len(trace.events("step")) == 6
    assert max(max(trace.ref_counts(i).values(), default=0) for i in range(len(trace))) > 1
    assert trace.frames[-1].tables == {}
    fork = trace.frames[trace.events("fork")[0]]
    assert fork.final == {"beam 0": 12, "beam 1": 12}  # beams leave with prompt + output tokens
    assert beam_search_trace(seed=0).frames == trace.frames
    with pytest.raises(ValueError, match="num_blocks"):
        beam_search_trace(prompt_len=20, output_len=20, width=4, num_blocks=24)


def test_sharing_savings_table_and_plot():
    days = {"Alpaca": alpaca_like(3, seed=0)}
    results = sharing_savings(days, sizes=(1, 2))
    assert set(results["Alpaca"]) == {PARALLEL, BEAM}
    assert results["Alpaca"][BEAM][1].saving == 0
    assert "paper 37.6-55.2%" in savings_table(results)

    import matplotlib.pyplot as plt

    from kvlab.ui.viz_sharing import plot_sharing_savings

    fig = plot_sharing_savings(results)
    (ax,) = fig.axes
    assert len(ax.patches) == 2 * 2 + 2  # a bar per n and kind, a shaded paper span per kind
    plt.close(fig)


# --- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("run, name", [(parallel_sampling, "n"), (beam_search, "width")])
def test_bad_input(run, name):
    good = [Request(4, 2)]
    with pytest.raises(ValueError, match="requests"):
        run([], 2)
    with pytest.raises(TypeError, match="requests"):
        run(Request(4, 2), 2)
    with pytest.raises(TypeError, match=r"requests\[1\]"):
        run([Request(4, 2), (4, 2)], 2)
    with pytest.raises(ValueError, match=name):
        run(good, 0)
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match=name):
            run(good, bad)
    with pytest.raises(ValueError, match="block_size"):
        run(good, 2, block_size=0)
    with pytest.raises(TypeError, match="seed"):
        run(good, 2, seed="0")
    if run is parallel_sampling:
        with pytest.raises(ValueError, match="length_sigma"):
            run(good, 2, length_sigma=-1)


def test_prefix_plots_draw_what_they_are_given():
    import matplotlib

    matplotlib.use("Agg")
    from kvlab.models import OPT_13B
    from kvlab.perf.roofline import A100_40GB, StepTime
    from kvlab.serving import simulate
    from kvlab.serving.workload import shared_prefix_like
    from kvlab.ui.viz_sharing import (
        plot_hit_rate_by_block_size,
        plot_hit_rate_by_memory,
        plot_prefix_days,
    )

    day = shared_prefix_like(20, 40, seed=0)
    setup = dict(kv_capacity_tokens=1024, max_seq_len=512, step_time=StepTime(OPT_13B, A100_40GB))
    runs = {
        "oracle": simulate(day, cache="contiguous-oracle", **setup),
        "cached": simulate(day, cache="paged", prefix_caching=True, **setup),
    }
    fig = plot_prefix_days({"one-shot": runs}, baseline="oracle")
    ax = fig.axes[0]
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == sorted(r.tokens_per_second for r in runs.values())
    notes = [t.get_text() for t in ax.texts]
    ratio = runs["cached"].tokens_per_second / runs["oracle"].tokens_per_second
    assert "1.00×" in notes and f"{ratio:.2f}×" in notes
    assert any(line.get_linestyle() == "--" for line in ax.lines)  # the paper's mark
    fig = plot_hit_rate_by_block_size([1, 16, 64], {"day": [0.9, 0.8, 0.1]})
    assert list(fig.axes[0].lines[0].get_ydata()) == [90.0, 80.0, 10.0]
    fig = plot_hit_rate_by_memory([1024, 2048], {"4 prefixes": [0.25, 0.5]})
    assert list(fig.axes[0].lines[0].get_ydata()) == [25.0, 50.0]
