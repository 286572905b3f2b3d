"""The autograder against deliberately bad learner code: it must report, and survive."""

import json
import math
import threading

import pytest
import torch

from kvlab.grading import EXERCISES, Status, check, get_exercise, run_checks
from kvlab.grading.expect import CheckFailed, call_without_mutation, same
from kvlab.grading.limits import CheckTimeout, time_limit


def good_kv_bytes(spec):
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes


def good_decode(layer, x_t, k_cache, v_cache):
    """A learner's own decode step (kvlab's layer.decode_step is refused as the learner's)."""
    q, k, v = layer.qkv(x_t.unsqueeze(0))
    k_cache, v_cache = torch.cat([k_cache, k]), torch.cat([v_cache, v])
    group = layer.num_heads // layer.num_kv_heads
    keys = k_cache.repeat_interleave(group, 1)
    scores = torch.einsum("hd,thd->ht", q[0], keys) / math.sqrt(layer.head_dim)
    mixed = torch.einsum("ht,thd->hd", scores.softmax(-1), v_cache.repeat_interleave(group, 1))
    return mixed.reshape(-1) @ layer.wo, k_cache, v_cache


def test_reference_solutions_get_full_marks(capsys):
    for exercise_id, fn in (("00.kv_bytes", good_kv_bytes), ("00.decode_step", good_decode)):
        result = check(exercise_id, fn)
        assert result.ok and result.passed == result.total == len(EXERCISES[exercise_id].checks)
        assert result.score == 1.0
    out = capsys.readouterr().out
    assert out.count("✔") == 11 and "✘" not in out


def test_wrong_answer_shows_input_expected_got_and_hint(capsys):
    def counts_query_heads(spec):
        return 2 * spec.num_layers * spec.num_q_heads * spec.head_dim * spec.dtype_bytes

    result = check("00.kv_bytes", counts_query_heads)
    out = capsys.readouterr().out
    assert result.status is Status.FAILED and 0 < result.passed < result.total
    assert "✘ grouped-query attention" in out
    assert "expected: 131,072" in out and "got:      524,288" in out
    assert "hint:     query heads are not cached" in out
    assert "Llama-3-8B: 32 layers, 32 query heads, 8 KV heads" in out


def test_wrong_type_is_named(capsys):
    result = check("00.kv_bytes", lambda spec: float(good_kv_bytes(spec)))
    out = capsys.readouterr().out
    assert result.passed == 0
    assert "should be of type int" in out and "got:      float 819200.0" in out


def test_numpy_integers_count_as_int():
    np = pytest.importorskip("numpy")
    assert run_checks("00.kv_bytes", lambda s: np.int64(good_kv_bytes(s))).ok


def test_learner_exception_shows_their_line_not_a_traceback(capsys):
    def broken(spec):
        heads = spec.heads  # AttributeError on purpose
        return heads

    result = check("00.kv_bytes", broken)
    out = capsys.readouterr().out
    assert result.passed == 0
    assert "AttributeError: 'ModelSpec' object has no attribute 'heads'" in out
    assert "heads = spec.heads  # AttributeError on purpose" in out
    assert "Traceback" not in out and "kvlab/grading" not in out
    assert out.count("AttributeError:") == 1  # repeated failures are folded
    assert len(out.splitlines()) < 25


def test_endless_loop_is_stopped_and_later_checks_skipped(capsys):
    def spins(spec):
        while True:
            try:
                pass
            except Exception:  # a learner's catch-all must not swallow the time limit
                pass

    result = check("00.kv_bytes", spins, timeout=0.3)
    out = capsys.readouterr().out
    assert result.passed == 0 and result.status is Status.TIMED_OUT  # not a wrong answer
    assert "stopped at its limit of 0.3 CPU-s" in out and "tried twice" in out
    assert "endless loop" not in out
    assert out.count("skipped: your code was stopped at its limit") == result.total - 1


def test_time_limit_in_a_worker_thread():
    box = {}

    def worker():
        result = run_checks("00.kv_bytes", _spin_forever, timeout=0.3)
        box["status"] = result.status
        box["details"] = result.outcomes[0].details

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)  # a far guard against a hang: the wall backstop is 3 s a try, tried twice
    assert not t.is_alive()
    assert box["status"] is Status.TIMED_OUT and "stopped at its limit" in box["details"][0]


def _spin_forever(spec):
    while True:
        pass


def test_time_limit_does_not_fire_late():
    with time_limit(0.5):
        sum(range(1000))
    x = 0
    for _ in range(10**6):  # well after the limit would have passed, nothing is raised
        x += 1
    with pytest.raises(CheckTimeout):
        with time_limit(0.05):
            while True:
                pass


def test_huge_output_is_hidden_and_counted(capsys):
    def noisy(spec):
        print("x" * 100_000)
        return good_kv_bytes(spec)

    result = check("00.kv_bytes", noisy)
    out = capsys.readouterr().out
    assert result.ok
    assert "printed" in out and "(hidden)" in out
    assert len(out) < 2000


def test_unimplemented_exercise_says_so(capsys):
    def todo(spec):
        # YOUR CODE HERE
        raise NotImplementedError

    result = check("00.kv_bytes", todo)
    out = capsys.readouterr().out
    assert result.status is Status.NOT_IMPLEMENTED and result.passed == 0
    assert "not implemented yet" in out and "raise NotImplementedError" in out


def test_wrong_kind_of_object(capsys):
    result = check("00.kv_bytes", 819200)
    out = capsys.readouterr().out
    assert result.status is Status.WRONG_KIND and result.passed == 0
    assert "expected a function, got 819200" in out


def test_wrong_signature_is_explained(capsys):
    check("00.kv_bytes", lambda: 3)
    out = capsys.readouterr().out
    assert "calling your code failed:" in out and "TypeError" in out


def test_exit_in_learner_code_is_caught(capsys):
    def quits(spec):
        raise SystemExit(3)

    assert check("00.kv_bytes", quits).passed == 0
    assert "called exit(3)" in capsys.readouterr().out


def test_mutating_inputs_is_caught(capsys):
    def zeroes_input(layer, x_t, k_cache, v_cache):
        out = good_decode(layer, x_t.clone(), k_cache, v_cache)
        x_t.zero_()
        return out

    result = check("00.decode_step", zeroes_input)
    assert result.passed == 0
    assert "changed its input `x_t` in place" in capsys.readouterr().out


def test_wrong_decode_shapes_and_math(capsys):
    def no_scaling(layer, x_t, k_cache, v_cache):
        q, k, v = layer.qkv(x_t.unsqueeze(0))
        k_cache, v_cache = torch.cat([k_cache, k]), torch.cat([v_cache, v])
        group = layer.num_heads // layer.num_kv_heads
        keys = k_cache.repeat_interleave(group, 1)
        scores = torch.einsum("hd,thd->ht", q[0], keys)  # forgot 1/sqrt(head_dim)
        mixed = torch.einsum("ht,thd->hd", scores.softmax(-1), v_cache.repeat_interleave(group, 1))
        return mixed.reshape(-1) @ layer.wo, k_cache, v_cache

    result = check("00.decode_step", no_scaling)
    out = capsys.readouterr().out
    # the first token attends only to itself, so scaling cannot matter there
    assert result.outcomes[0].passed and not result.outcomes[1].passed
    assert "differs from full recompute" in out and "max abs error" in out
    assert "hint:     scale the scores by 1/sqrt(head_dim)" in out

    def forgets_to_append(layer, x_t, k_cache, v_cache):
        y, _, _ = good_decode(layer, x_t, k_cache, v_cache)
        return y, k_cache, v_cache

    check("00.decode_step", forgets_to_append)
    out = capsys.readouterr().out
    assert "k_cache has the wrong shape after step 0" in out and "expected: (1, 2, 8)" in out
    assert "hint:     return the caches with the new token's row appended" in out

    check("00.decode_step", lambda layer, x_t, k, v: math.pi)
    out = capsys.readouterr().out
    assert "must return a tuple (y_t, k_cache, v_cache)" in out
    assert "replay:   layer = TinyAttention(16, 2, seed=1); x = torch.randn(1, 16" in out


def test_results_are_logged_for_kvlab_grade(tmp_path, monkeypatch, capsys):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("KVLAB_GRADE_LOG", str(log))
    check("00.kv_bytes", good_kv_bytes)
    record = json.loads(log.read_text())
    report = record.pop("report")  # what the cell printed, for `kvlab grade --out`'s feedback
    assert report == capsys.readouterr().out.rstrip("\n")
    assert record == {
        "exercise": "00.kv_bytes",
        "title": "KV bytes per token",
        "status": "passed",
        "passed": 5,
        "total": 5,
        "timed_out": 0,  # checks stopped at their limit: the gradebook's timeout flag
        "handover": False,  # a check refused a hand-over to kvlab's own: its hand-over flag
        "handed_over": None,  # what of kvlab's the judge refused to the learner's code
    }


def test_result_object():
    result = run_checks("00.kv_bytes", good_kv_bytes)
    assert repr(result) == "<CheckResult 00.kv_bytes: 5/5 passed>"
    assert result._ipython_display_() is None  # shows nothing twice in a notebook


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown exercise '00.nope'.*00.kv_bytes"):
        get_exercise("00.nope")
    with pytest.raises(TypeError, match="exercise_id must be a str"):
        get_exercise(0)


def test_call_without_mutation_and_same():
    def appends(xs):
        xs.append(1)
        return len(xs)

    with pytest.raises(CheckFailed, match="changed its input `xs`"):
        call_without_mutation(appends, [0], names=("xs",))
    assert call_without_mutation(len, [1, 2]) == 2
    assert same({"a": torch.ones(2)}, {"a": torch.ones(2)})
    assert not same(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not same((1, 2), [1, 2])


def test_same_reads_slots_and_follows_cycles():
    """A block pool keeps blocks with __slots__ in a doubly linked free queue: a deep copy of a
    manager must still count as unchanged (the beds report hands kvlab's manager to the learner),
    and a change deep in the queue must still be seen."""
    import copy

    class Block:
        __slots__ = ("block_id", "prev", "next")

        def __init__(self, block_id):
            self.block_id, self.prev, self.next = block_id, None, None

    def queue(n):
        blocks = [Block(i) for i in range(n)]
        for left, right in zip(blocks[:-1], blocks[1:], strict=True):
            left.next, right.prev = right, left
        return {"head": blocks[0], "blocks": blocks}

    small = queue(50)
    assert same(small, copy.deepcopy(small))
    long, other = queue(3000), queue(3000)  # longer than the recursion limit
    assert same(long["head"], other["head"])
    other["blocks"][-1].block_id = -1
    assert not same(long, other)
    unset = Block(0)
    del unset.next
    assert not same(Block(0), unset)


def test_isolated_checks_survive_a_crash_a_hang_and_report_output():
    import os
    import signal

    from kvlab.grading.limits import can_fork
    from kvlab.grading.registry import exercise

    if not can_fork():
        pytest.skip("forking is not available here")
    ex = exercise("99.isolated", "checks in child processes", isolate=True)

    @ex.check("prints and passes")
    def _prints(fn):
        fn("ok")

    @ex.check("crashes")
    def _crash(fn):
        fn("crash")

    @ex.check("hangs")
    def _hang(fn):
        fn("hang")

    def learner(what):
        print("x" * 5000)
        if what == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        while what == "hang":
            pass

    try:
        result = run_checks("99.isolated", learner, timeout=1)
    finally:
        del EXERCISES["99.isolated"]
    passed, crashed, hung = result.outcomes
    assert passed.passed and not crashed.passed and not hung.passed
    assert crashed.details[0] == "your code crashed the process (SIGSEGV)"
    assert hung.details[0].startswith("stopped at its limit of 1 CPU-s")
    assert result.printed_chars >= 10_001  # counted from the children (the crash lost its own)


def test_isolated_check_that_ignores_its_alarm_is_killed_by_the_parent():
    import signal
    import time

    from kvlab.grading.limits import can_fork
    from kvlab.grading.registry import exercise

    if not can_fork():
        pytest.skip("forking is not available here")
    ex = exercise("99.stubborn", "a check that outlives its own time limit", isolate=True)

    @ex.check("ignores SIGALRM")
    def _stubborn(fn):
        fn()

    def learner():
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(60)

    try:
        result = run_checks("99.stubborn", learner, timeout=0.5)
    finally:
        del EXERCISES["99.stubborn"]
    # stopped by the wall-time backstop (10 x 0.5 s, each try), not by the end of its 60 s sleep
    # (which would pass the check): the report names the backstop
    assert not result.outcomes[0].passed
    assert result.outcomes[0].details[0].startswith("stopped at its limit: 5 s passed")
