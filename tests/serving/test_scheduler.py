"""The scheduler: admits in arrival order while the cache has room, preempts the sequence admitted
last when a token finds no room, retires finished sequences; asks before it acts."""

import pytest

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.core.recorder import Recorder
from kvlab.serving.replay import replay
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus
from kvlab.serving.workload import Request, sharegpt_like

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus


class AskedFirst(PagedCache):
    """A paged cache that fails the test if it is asked to do what it would refuse."""

    def admit(self, seq_id, prompt_len, output_len=None):
        assert self.refusal(prompt_len, output_len) is None, "admit called without room"
        super().admit(seq_id, prompt_len, output_len)

    def append(self, seq_id):
        assert self.can_append(seq_id), "append called without room"
        super().append(seq_id)


def test_admits_in_arrival_order_and_the_head_of_the_queue_blocks_the_rest():
    scheduler = Scheduler(AskedFirst(num_blocks=4, block_size=4))
    big, small = Sequence("big", 20, 2), Sequence("small", 2, 2)
    first = Sequence("first", 4, 2)
    for seq in (first, big, small):
        scheduler.add(seq)
    step = scheduler.schedule(now=0.0)
    assert step.admitted == [first] and step.refused is big and not step.refusal.impossible
    assert (first.status, big.status, small.status) == (RUNNING, WAITING, WAITING)
    assert step.scheduled == [first] and first.num_generated == 1 and first.num_tokens == 5


def test_preemption_changes_the_sequence_not_the_workload():
    cache = AskedFirst(num_blocks=4, block_size=4)
    scheduler = Scheduler(cache)
    a, b = Sequence("a", 4, 6), Sequence("b", 4, 6)
    scheduler.add(a)
    scheduler.add(b)
    for _ in range(5):  # both check in with 2 blocks each; a's 9th token finds none free
        step = scheduler.schedule(0.0)
    assert step.preempted == [b] and step.admitted == []
    assert b.status is PREEMPTED and scheduler.waiting[0] is b
    assert (b.prompt_len, b.output_len) == (4, 6)  # the request itself is unchanged
    assert b.num_generated == 4 and a.num_generated == 5  # b's tokens are kept, to recompute
    assert cache.manager.seq_ids == ["a"]


def test_a_sequence_checks_in_only_with_room_for_its_first_token():
    """Admitting means computing the first token in the same step: a prompt that exactly fills
    the free blocks waits, rather than being checked in and sent away at once."""
    scheduler = Scheduler(PagedCache(2, 4))
    scheduler.add(Sequence("a", 4, 2))
    scheduler.add(Sequence("b", 4, 2))
    step = scheduler.schedule(0.0)
    assert [q.seq_id for q in step.admitted] == ["a"] and step.refused.seq_id == "b"
    assert step.preempted == []


def test_finish_retires_only_running_sequences():
    scheduler = Scheduler(PagedCache(4, 4))
    seq = Sequence("s", 3, 1)
    scheduler.add(seq)
    scheduler.schedule(0.0)
    assert seq.remaining == 0
    scheduler.finish(seq)
    assert seq.status is FINISHED and not scheduler.has_unfinished()
    with pytest.raises(ValueError, match="s is finished, not running"):
        scheduler.finish(seq)


def test_the_replay_never_relies_on_exceptions_for_not_now():
    day = sharegpt_like(60, seed=1)
    result = replay(AskedFirst(num_blocks=256, block_size=16), day)
    assert result.preemptions > 0 and result.refusals > 0


def test_a_scheduler_records_through_the_drivers_recorder():
    cache = PagedCache(4, 4)
    recorder = Recorder(cache)
    scheduler = Scheduler(cache, recorder)
    scheduler.add(Sequence("a", 4, 6))
    scheduler.add(Sequence("b", 4, 6))
    for _ in range(5):
        scheduler.schedule(0.0)
    events = [(f.event, f.seq_id) for f in recorder.trace.frames]
    assert events == [
        ("start", None),
        ("check-in", "a"),
        ("check-in", "b"),
        ("out of memory", "a"),
        ("check-out", "b"),
        ("preemption", "b"),
    ]


@pytest.mark.parametrize(
    "cache",
    [
        lambda: ContiguousKVCache(4, 2048, policy="exact"),
        lambda: ContiguousKVCache(4, 2048, policy="max"),
        lambda: PagedCache(256, 16),
    ],
)
def test_every_step_measured_equals_its_recorded_frame(cache):
    """One accounting: the replay's per-step split (the cache's report) and the split of the
    recorded frame at that step are the same numbers, on every step of a busy evening."""
    result = replay(cache(), sharegpt_like(60, seed=2), record=True)
    steps = result.trace.events("step")
    assert len(steps) == result.steps
    for usage, index in zip(result.usage, steps, strict=True):
        assert result.trace.usage(index) == usage


def test_sequences_of_a_replay_finish_with_every_token_written():
    guests = [Request(4, 12), Request(4, 12), Request(4, 12)]
    result = replay(PagedCache(num_blocks=6, block_size=4), guests, record=True)
    final = {}
    for frame in result.trace.frames:
        final.update(frame.tokens)
    assert final == {"r0": 16, "r1": 16, "r2": 16} and result.preemptions > 0
