import pytest

from kvlab.core.accounting import CacheState, Usage, split_waste
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.core.errors import OutOfMemory
from kvlab.core.trace import Trace, intervals
from kvlab.serving.replay import replay
from kvlab.serving.workload import Request, load_trace, sharegpt_like


def test_split_waste():
    assert split_waste(2048, 300, 500) == (300, 200, 1548)
    assert split_waste(77, 77, 77) == (77, 0, 0)
    assert split_waste(64, 10, None) == (10, 54, 0)
    assert split_waste(256, 200, 300) == (200, 56, 0)


def test_intervals_of_key_cards():
    assert intervals(range(5, 9)) == [(5, 4)]
    assert intervals(range(0)) == []
    assert intervals([7, 3, 4, 5, 9]) == [(3, 3), (7, 1), (9, 1)]


def test_paged_style_frames_free_runs_and_ref_counts():
    trace = Trace("paged", num_blocks=8, block_size=4)
    tables = {"a": [5, 1], "b": [1, 2]}
    state = CacheState("paged", 8, 4, tables, {"a": 6, "b": 5}, {"a": 8, "b": 8}, {})
    trace.record("step", None, 0.0, state)
    assert trace.free_runs(0) == [(0, 1), (3, 2), (6, 2)]
    assert trace.ref_counts(0) == {5: 1, 1: 2, 2: 1}
    assert trace.usage(0) == Usage(32, 9, 3, 0, 20)  # room 1 counted once, filled by b
    with pytest.raises(ValueError, match="event must be one of"):
        trace.record("party", None, 0.0, state)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        Trace("paged", 4, 0)


def test_replay_serves_everyone_and_conserves_tokens():
    guests = [Request(3, 4), Request(10, 1, arrival=0.2), Request(1, 9, arrival=0.05)]
    cache = ContiguousKVCache(2, 16, policy="exact")
    result = replay(cache, guests, step_seconds=0.1)
    assert cache.request_ids == [] and cache.memory_report().free == cache.capacity
    # each running guest writes one token per step
    assert sum(result.running) == sum(r.output_len for r in guests)
    assert result.usage[0].used == 3 + 1  # r0's prompt plus its first token


def test_max_length_share_matches_the_paper_range():
    day = [Request(r.prompt_len, r.output_len) for r in load_trace("sharegpt_like")]
    result = replay(ContiguousKVCache(16, 2048, policy="max"), day)
    assert 0.20 <= result.utilization("used") <= 0.40
    assert result.mean_running() == 16
    shares = sum(result.utilization(p) for p in ("used", "future", "internal", "free"))
    assert shares == pytest.approx(1.0)


def test_oracle_beats_pow2_beats_max():
    day = [Request(r.prompt_len, r.output_len) for r in load_trace("sharegpt_like")][:150]
    used = {
        p: replay(ContiguousKVCache(8, 2048, policy=p), day).utilization("used")
        for p in ("max", "pow2", "exact")
    }
    assert used["max"] < used["pow2"] < used["exact"]


class TinyHotel(ContiguousKVCache):
    """A cache that refuses anyone longer than 4 tokens with OutOfMemory, even when empty."""

    def refusal(self, prompt_len, output_len=None):
        if prompt_len + (output_len or 0) > 4:
            return OutOfMemory("too big for this hotel")
        return super().refusal(prompt_len, output_len)


def test_replay_refuses_impossible_and_idle_inputs():
    with pytest.raises(
        ValueError, match="r1 needs 9 token slots and cannot be admitted even into an empty"
    ):
        replay(TinyHotel(1, 16), [Request(2, 2), Request(8, 1)])
    with pytest.raises(ValueError, match="prompt_len \\+ output_len = 9 exceeds max_seq_len = 8"):
        replay(ContiguousKVCache(1, 8), [Request(8, 1)])
    with pytest.raises(ValueError, match="requests must not be empty"):
        replay(ContiguousKVCache(1, 8), [])
    quiet = replay(ContiguousKVCache(4, 8), [Request(1, 1)])
    with pytest.raises(ValueError, match="never filled up"):
        quiet.utilization()


def test_blocked_seq_ids_and_seconds_count_each_guest_once():
    """r2 needs 5 beds; after r0 leaves, 5 are free but in pieces of 4 and 1: refused once for
    fragmentation (the first refusal, with 1 bed free, is plain lack of space)."""
    guests = [Request(3, 1), Request(3, 2), Request(4, 1)]
    result = replay(ContiguousKVCache(1, 10, policy="exact"), guests, step_seconds=0.1)
    assert result.refusals == 2
    assert result.blocked == [None, "r2", None]
    assert result.blocked_seq_ids == ["r2"] and result.blocked_seconds == pytest.approx(0.1)
    assert result.blocked_seconds_so_far() == pytest.approx([0.0, 0.1, 0.1])


def test_lab02_evening_counts_guests_and_seconds_not_retries():
    evening = sharegpt_like(400, seed=3, rate=2.0)
    cache = ContiguousKVCache(16, 2048, policy="exact", placement="first_fit")
    result = replay(cache, evening, record=True)
    retries = len(result.trace.events("impossible allocation"))  # one frame per retry
    assert retries == sum(g is not None for g in result.blocked) > len(result.blocked_seq_ids)
    assert result.blocked_seconds == pytest.approx(retries * result.step_seconds)
    assert 0 < len(result.blocked_seq_ids) < 20


def test_fragmentation_plot_shows_guests_and_seconds():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvlab.ui import viz

    times = [0.0, 0.05, 0.1, 0.15]
    runs = {"first fit": (times, [0.0, 0.5, 0.5, 0.0], [None, "r1", "r1", None])}
    axes = viz.plot_fragmentation_over_time(runs, step_seconds=0.05)
    labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert labels == ["first fit: 1 guest, 0.1 s"]
    assert axes[1].get_ylabel() == "seconds the door was shut"
    plt.close("all")
