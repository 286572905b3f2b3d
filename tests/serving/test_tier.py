"""A CPU tier below HBM in the simulator (Lab 10): a multi-round QA day whose conversations do
not all fit in HBM, served with and without the tier; copies up costed over PCIe."""

import pytest

from kvlab.models.specs import LLAMA_3_8B
from kvlab.perf.roofline import H100_SXM, StepTime
from kvlab.serving import simulate
from kvlab.serving.scheduler import ScheduledStep, Sequence
from kvlab.serving.simulation import CostedSteps
from kvlab.serving.workload import Request, conversation_tokens, multi_round_qa

STEP = StepTime(LLAMA_3_8B, H100_SXM)
DAY = dict(context_len=1_500, question_len=30, answer_len=40, think_time=20.0)
HBM = 16_000  # tokens: a few users' conversations


def day(users=16, rounds=4, seed=0):
    return multi_round_qa(users, rounds, seed=seed, **DAY)


def run(requests, cpu=None, kind="hash", hbm=HBM, **kw):
    return simulate(
        requests,
        cache="paged",
        kv_capacity_tokens=hbm,
        max_seq_len=2_000,
        step_time=STEP,
        prefix_caching=kind,
        cpu_cache_blocks=cpu,
        **kw,
    )


def test_each_round_carries_the_conversation():
    requests = multi_round_qa(3, 3, context_len=20, question_len=4, answer_len=5, seed=1)
    assert len(requests) == 9
    assert [r.arrival for r in requests] == sorted(r.arrival for r in requests)
    by_user: dict = {}
    for r in requests:
        by_user.setdefault(r.prompt_ids[:20], []).append(r)
    assert len(by_user) == 3
    for rounds in by_user.values():
        for before, after in zip(rounds, rounds[1:], strict=False):
            assert after.prompt_ids[: before.total_len] == before.prompt_ids + before.output_ids
            assert after.prompt_len == before.total_len + 4
            assert after.arrival - before.arrival == pytest.approx(60.0)  # think_time
    assert conversation_tokens(requests) == 3 * (20 + 3 * 9)
    with pytest.raises(ValueError, match="output_ids holds"):
        Request(3, 2, prompt_ids=(1, 2, 3), output_ids=(1,))


def test_hbm_alone_loses_the_conversations_the_tier_keeps():
    requests = day()
    total = conversation_tokens(requests)
    cpu_blocks = 2 * total // 16
    assert total > HBM and total <= HBM + cpu_blocks * 16  # the day's sizing
    without, with_tier = run(requests), run(requests, cpu_blocks)
    assert without.completed == with_tier.completed == len(requests)
    assert with_tier.prefix_tier_hit_tokens > 0 and with_tier.demoted_blocks > 0
    assert with_tier.prefix_hit_rate > without.prefix_hit_rate + 0.3
    assert with_tier.copied_up_bytes == with_tier.prefix_tier_hit_tokens * 131_072
    assert with_tier.ttft(50) < 0.6 * without.ttft(50)
    assert with_tier.prefix_hbm_hit_tokens + with_tier.prefix_tier_hit_tokens == (
        with_tier.prefix_hit_tokens
    )
    row = with_tier.summary()
    assert row["prefix_tier_hit_tokens"] == with_tier.prefix_tier_hit_tokens
    assert "cpu_cache_blocks" not in without.summary()
    radix = run(requests, cpu_blocks, kind="radix")
    assert radix.prefix_tier_hit_tokens > 0 and radix.ttft(50) < 0.7 * without.ttft(50)


def test_a_tier_that_is_never_needed_changes_nothing():
    requests = day(users=4, rounds=2)
    plain, tiered = run(requests, hbm=40_000), run(requests, 500, hbm=40_000)
    assert tiered.prefix_tier_hit_tokens == 0 and tiered.demoted_blocks == 0
    assert tiered.ttfts() == plain.ttfts() and tiered.times == plain.times
    assert tiered.prefix_hit_tokens == plain.prefix_hit_tokens > 0


def test_a_copy_up_costs_its_bytes_over_pcie():
    copied = [0]
    costed = CostedSteps(STEP, lambda: copied[0])
    seq = Sequence("r0", 100, 5, 0.0)
    seq.num_computed, seq.num_scheduled = 96, 4
    step = ScheduledStep(scheduled=[seq])
    base = costed.execute(step)
    copied[0] = 96  # this step's admission copied 96 tokens up
    assert costed.execute(step) - base == pytest.approx(96 * 131_072 / 25e9)
    assert costed.execute(step) == pytest.approx(base)  # paid once


def test_the_tier_needs_prefix_caching():
    with pytest.raises(ValueError, match="prefix_caching"):
        simulate(day(2, 1), cache="paged", kv_capacity_tokens=HBM, max_seq_len=2000,
                 cpu_cache_blocks=10)  # fmt: skip
