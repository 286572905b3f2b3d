"""Lab 06 checks, tried with learner code: the lab's solutions pass; each usual mistake put into
them fails with the hint that names it (later failures fold into "the same problem"); code that
hands the work to kvlab's scheduler, raises, loops or returns the wrong thing gets a clean report.
"""

import pathlib
import tempfile
import types

import pytest

from kvlab.grading import Status, run_checks
from kvlab.grading import lab06 as checks
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM
from kvlab.serving.scheduler import Scheduler, SequenceStatus

HEADER = "from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence, SequenceStatus\n"

PREEMPT = '''
def preempt(scheduler):
    """Ask the guest checked in last to leave; they come back first."""
    victim = scheduler.running.pop()
    scheduler.cache.release(victim.seq_id)
    if scheduler.preemption == "recompute":
        victim.num_computed = 0
        victim.status = SequenceStatus.PREEMPTED
    else:
        victim.status = SequenceStatus.SWAPPED
    scheduler.waiting.appendleft(victim)
    return victim
'''

RETIRE = """    for seq in list(scheduler.running):
        if seq.num_generated == seq.output_len:
            scheduler.finish(seq)
            out.finished.append(seq)
"""
DECODE = """    for seq in list(scheduler.running):
        if seq.status is not SequenceStatus.RUNNING:
            continue
        while not scheduler.cache.can_append(seq.seq_id):
            victim = scheduler.preempt()
            out.preempted.append(victim)
            if victim is seq:
                break
        else:
            decode(seq)
"""
ADMIT = """    while not out.preempted and scheduler.waiting and scheduler.waiting[0].arrival <= now:
        if scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch:
            break
        seq = scheduler.waiting[0]
        refusal = scheduler.cache.refusal(seq.num_tokens, seq.remaining)
        if refusal is not None:
            out.refused, out.refusal = seq, refusal
            break
        scheduler.admit(seq)
        out.admitted.append(seq)
        decode(seq)
"""
STEP = f'''
def step(scheduler, now):
    """One engine step: retire, decode every running guest, then admit."""
    out = ScheduledStep()

    def decode(seq):
        scheduler.cache.append(seq.seq_id)
        seq.num_generated += 1
        out.scheduled.append(seq)

{RETIRE}{DECODE}{ADMIT}    return out
'''
# the step in the order of kvlab before vLLM's: admit (no first token), then decode everyone
OLD_ORDER = f"{RETIRE}{ADMIT.replace('not out.preempted and ', '')}{DECODE}".replace(
    "        out.admitted.append(seq)\n        decode(seq)\n", "        out.admitted.append(seq)\n"
)


def learner(source: str, name: str, *edits: str):
    """``name`` from ``source`` with ``edits`` ("old => new") made, run as a notebook cell is:
    from a file outside kvlab, so the checks see it as the learner's code."""
    for edit in edits:
        old, new = edit.split(" => ")
        assert old in source, old
        source = source.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-")) / "cell.py"
    path.write_text(HEADER + source)
    namespace = {}
    exec(compile(HEADER + source, str(path), "exec"), namespace)
    return namespace[name]


def preempt(*edits):
    return learner(PREEMPT, "preempt", *edits)


def step(*edits):
    return learner(STEP, "step", *edits)


def failures(result):
    return [o for o in result.outcomes if not o.passed]


def hint_of(outcome) -> str:
    (hint,) = [d for d in outcome.details if d.startswith("hint:")]
    return hint


def folded(result) -> bool:
    """Every failure after the first says it is probably the same problem as the first."""
    first, *later = failures(result)
    return all(o.details[0] == f"{SAME_PROBLEM} (“{first.name}”)" for o in later)


def first_failure(exercise: str, fn, **kwargs):
    result = run_checks(exercise, fn, **kwargs)
    assert result.status is Status.FAILED, result.report()
    return result, failures(result)[0]


# --- preempt ---------------------------------------------------------------------------------


def test_the_preempt_solution_passes_and_the_stub_is_not_written_yet():
    result = run_checks("06.preempt", preempt())
    assert result.ok and result.passed == result.total == 4, result.report()
    stub = learner("def preempt(scheduler):\n    raise NotImplementedError\n", "preempt")
    assert run_checks("06.preempt", stub).status is Status.NOT_IMPLEMENTED


@pytest.mark.parametrize(
    "edits, hint, fails",
    [
        (["running.pop() => running.pop(0)"], checks.OLDEST, None),
        (["    scheduler.cache.release(victim.seq_id)\n => "], checks.LEAK, None),
        (["appendleft(victim) => append(victim)"], checks.BACK_OF_QUEUE, None),
        (["        victim.num_computed = 0\n => "], checks.KEEPS_COMPUTED, "recompute"),
        (
            [
                "        victim.num_computed = 0\n => ",
                "    scheduler.waiting =>     victim.num_computed = 0\n    scheduler.waiting",
            ],
            checks.ZEROES_COMPUTED,
            "swap",
        ),
        (
            [
                "        victim.status = SequenceStatus.PREEMPTED\n => ",
                "    else:\n        victim.status = SequenceStatus.SWAPPED\n => ",
            ],
            checks.STATUS_UNSET,
            None,
        ),
        (["SequenceStatus.SWAPPED => SequenceStatus.PREEMPTED"], "preemption is 'swap'", "swap"),
        (
            ["victim = scheduler.running.pop() => victim = scheduler.running[-1]"],
            checks.NOT_REMOVED,
            None,
        ),
        (["    return victim\n => "], checks.RETURN_NONE, None),
        (["return victim => return victim.seq_id"], checks.RETURN_ID, None),
        (["victim.seq_id) => victim)"], checks.PASS_ID, None),
        (["scheduler.cache.release( => scheduler.cache.free("], checks.FREE, None),
        (  # the hotels where the guest who arrived last is also the one checked in first fold
            [
                "    victim = scheduler.running.pop()\n => "
                "    victim = max(scheduler.running, key=lambda s: s.arrival)\n"
                "    scheduler.running.remove(victim)\n"
            ],
            checks.LAST_ARRIVED,
            None,
        ),
        (
            ["    return victim\n =>     scheduler.num_preemptions += 1\n    return victim\n"],
            checks.COUNTS,
            None,
        ),
        (
            ["    return victim\n =>     victim.num_preemptions += 1\n    return victim\n"],
            checks.COUNTS,
            None,
        ),
        (
            [
                "        victim.num_computed = 0\n => "
                "        scheduler.recompute_tokens += victim.num_computed\n"
                "        victim.num_computed = 0\n"
            ],
            checks.COUNTS,
            "recompute",
        ),
    ],
)
def test_each_preempt_slip_gets_its_hint(edits, hint, fails):
    result, first = first_failure("06.preempt", preempt(*edits))
    assert hint in hint_of(first), first.details
    assert any(d.startswith("input:    PagedCache(") for d in first.details)
    if fails is not None:  # the check of the other mode passes
        other = "swap" if fails == "recompute" else "recompute"
        assert first.name.startswith(fails)
        assert not any(o.name.startswith(other) for o in failures(result))
    assert folded(result)


def test_the_wrong_victim_is_named_with_who_should_leave():
    _, first = first_failure("06.preempt", preempt("running.pop() => running.pop(0)"))
    assert "the wrong guest was asked to leave" in first.details
    assert "expected: bo (checked in last)" in first.details
    assert "got:      cy" in first.details
    assert any("bo (arrived 0.5, 8 tokens, back after a preemption)" in d for d in first.details)


def test_nothing_running_may_raise_anything_or_change_nothing():
    polite = preempt(
        "    victim = scheduler.running.pop() => "
        "    if not scheduler.running:\n        return None\n    victim = scheduler.running.pop()"
    )
    assert run_checks("06.preempt", polite).ok
    typed = preempt(
        "    victim = scheduler.running.pop() => "
        "    if not scheduler.running:\n        raise RuntimeError('empty')\n"
        "    victim = scheduler.running.pop()"
    )
    assert run_checks("06.preempt", typed).ok


def test_handing_preempt_to_kvlab_is_refused():
    for source in (
        "def preempt(scheduler):\n    return scheduler.preempt()\n",
        "def preempt(scheduler):\n    return Scheduler.preempt(scheduler)\n",
    ):
        result, first = first_failure("06.preempt", learner(source, "preempt"))
        assert result.passed == 0
        assert (
            "hands the work to kvlab's `kvlab.serving.scheduler.Scheduler.preempt`"
            in first.details[0]
        )
        assert folded(result)
    assert run_checks("06.preempt", Scheduler.preempt).status is Status.WRONG_KIND
    assert Scheduler.preempt.__qualname__ == "Scheduler.preempt"  # the guard is gone


def test_preempt_that_raises_loops_or_returns_junk_gets_a_clean_report():
    raises = learner("def preempt(scheduler):\n    raise ValueError('boom')\n", "preempt")
    result, first = first_failure("06.preempt", raises)
    assert first.details[0].splitlines() == [
        "ValueError: boom",
        "   at line 3 of your code (preempt): raise ValueError('boom')",
    ]
    assert folded(result)
    loops = learner("def preempt(scheduler):\n    while True:\n        pass\n", "preempt")
    result = run_checks("06.preempt", loops, timeout=0.5)
    assert [o.status for o in result.outcomes] == [Status.TIMED_OUT] + [Status.SKIPPED] * 3
    junk = learner("def preempt(scheduler):\n    return 42\n", "preempt")
    result, first = first_failure("06.preempt", junk)
    assert "nothing changed: a guest should have left" in first.details
    assert any(d.startswith(f"note:     {NO_DIAGNOSIS}") for d in first.details)


def test_a_preempt_that_counts_is_told_kvlab_counts_with_the_numbers():
    _, first = first_failure(
        "06.preempt",
        preempt("    return victim\n =>     scheduler.num_preemptions += 1\n    return victim\n"),
    )
    assert first.details[0] == "scheduler.num_preemptions changed inside preempt"
    assert "expected: 0, as before (kvlab then counts this preemption: 1)" in first.details
    assert "got:      1" in first.details


def _sent_nowhere(scheduler):
    return scheduler.running[-1]


def _oldest(scheduler):
    victim = scheduler.running.pop(0)
    scheduler.cache.release(victim.seq_id)
    victim.num_computed = 0
    victim.status = SequenceStatus.PREEMPTED
    scheduler.waiting.appendleft(victim)
    return victim


@pytest.mark.parametrize(
    "bad, message, hint, judged",
    [
        (
            _sent_nowhere,
            "ValueError: preempt returned r8 without sending it away",
            checks.SENT_AWAY,
            checks.NOT_REMOVED,
        ),
        (
            _oldest,
            "ValueError: preempt chose r0, which already has its token",
            checks.SERVED,
            checks.OLDEST,
        ),
    ],
)
def test_kvlabs_objections_to_a_preempt_in_a_day_become_a_report(bad, message, hint, judged):
    # the checks judge every call of the learner's preempt, so these fail there first, cleanly
    result, first = first_failure("06.preempt", bad)
    assert all(o.status is Status.FAILED for o in failures(result)), result.report()
    assert hint_of(first) == f"hint:     {judged}"
    assert folded(result)
    # unjudged, the scheduler's own checks (Scheduler._counted, _make_room) object in the day:
    # a report with the hint, not a traceback
    with pytest.raises(checks.CheckFailed) as failure:
        checks._serve_day(bad, "recompute")
    assert failure.value.message.startswith(message)
    assert failure.value.hint == hint
    assert "preempt=preempt" in failure.value.input


# --- step ------------------------------------------------------------------------------------

FCFS_ADMIT = """    for seq in list(scheduler.waiting):
        if out.preempted or seq.arrival > now:
            break
        if scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch:
            break
        refusal = scheduler.cache.refusal(seq.num_tokens, seq.remaining)
        if refusal is not None:
            out.refused, out.refusal = seq, refusal
            continue
        scheduler.admit(seq)
        out.admitted.append(seq)
        decode(seq)
"""
INLINE_PREEMPT = """            victim = scheduler.running.pop()
            scheduler.cache.release(victim.seq_id)
            victim.num_computed = 0
            victim.status = SequenceStatus.PREEMPTED
            scheduler.waiting.appendleft(victim)"""


def test_the_step_solution_passes_and_the_stub_is_not_written_yet():
    result = run_checks("06.step", step())
    assert result.ok and result.passed == result.total == 8, result.report()
    stub = learner("def step(scheduler, now):\n    raise NotImplementedError\n", "step")
    assert run_checks("06.step", stub).status is Status.NOT_IMPLEMENTED


BATCH_FULL = """        if scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch:
            break
"""
SKIP_TEST = "        if seq.status is not SequenceStatus.RUNNING:\n"
RUNNING_TEST = "seq.status is not SequenceStatus.RUNNING"
PREEMPTED_TEST = "seq.status == SequenceStatus.PREEMPTED"
WALK_QUEUE = FCFS_ADMIT.replace("list(scheduler.waiting)", "scheduler.waiting").replace(
    "            continue\n", "            break\n"
)  # admit() takes the guest off the deque the loop walks
ADMIT_IN_ORDER = ADMIT.replace("not out.preempted and ", "")  # harmless before the decode loop
FIRST_TOKEN = "out.admitted.append(seq)\n        decode(seq)\n => out.admitted.append(seq)\n"
COUNTED_TWICE = (
    "            out.preempted.append(victim)\n =>             out.preempted.append(victim)\n"
    "            scheduler.num_preemptions += 1\n"
)


@pytest.mark.parametrize(
    "edits, hint, first_check",
    [
        # where retiring goes
        ([f"{RETIRE}{DECODE} => {DECODE}{RETIRE}"], checks.RETIRE_AT_START, "guests check in"),
        (
            [f"{RETIRE}{DECODE}{ADMIT} => {DECODE}{ADMIT}{RETIRE}"],
            checks.RETIRE_AT_START,
            "guests check in",
        ),
        ([f"{RETIRE} => "], checks.NO_RETIRE, "guests check in"),
        (  # later, never "first come, first served": the early retire explains every day
            ["seq.num_generated == seq.output_len: => seq.num_generated == seq.output_len - 1:"],
            checks.RETIRE_EARLY,
            "guests check in",
        ),
        (
            [
                "            scheduler.finish(seq)\n => "
                "            scheduler.cache.free(seq.seq_id)\n"
                "            scheduler.running.remove(seq)\n"
                "            seq.status = SequenceStatus.FINISHED\n"
            ],
            checks.FREE_STEP,
            "guests check in",
        ),
        (
            [
                "list(scheduler.running):\n        if seq.num_generated => "
                "scheduler.running:\n        if seq.num_generated"
            ],
            checks.RETIRE_COPY,
            "max_batch=3",
        ),
        # the order of decoding and admitting (vLLM's: the guests in the hotel go first)
        ([f"{RETIRE}{DECODE}{ADMIT} => {OLD_ORDER}"], checks.ADMIT_FIRST, "guests check in"),
        (
            [f"{RETIRE}{DECODE}{ADMIT} => {RETIRE}{ADMIT_IN_ORDER}{DECODE}"],
            checks.TWICE,
            "guests check in",
        ),
        ([f"{RETIRE}{DECODE}{ADMIT} => {RETIRE}{ADMIT}{DECODE}"], checks.TWICE, "guests check in"),
        ([FIRST_TOKEN], checks.FIRST_TOKEN, "guests check in"),
        (["not out.preempted and  => "], checks.HOLD, "a full hotel"),
        # admitting
        ([f"{ADMIT} => {FCFS_ADMIT}"], checks.FCFS, "first come"),
        ([" and scheduler.waiting[0].arrival <= now => "], checks.ARRIVAL, "guests check in"),
        (["arrival <= now => arrival < now"], checks.ARRIVAL_STRICT, "guests check in"),
        (["scheduler.max_batch is not None and => False and"], checks.MAX_BATCH, "max_batch=3"),
        (
            ["scheduler.max_batch is not None and len( => len("],
            checks.MAX_BATCH_NONE,
            "guests check in",
        ),
        (
            [
                BATCH_FULL
                + " => "
                + BATCH_FULL.replace("break", "out.refused = seq\n            break")
            ],
            checks.FULL_NOT_REFUSED,
            "max_batch=3",
        ),
        (
            [
                BATCH_FULL
                + " => "
                + BATCH_FULL.replace(
                    "break",
                    "out.refused = seq\n"
                    "            out.refusal = scheduler.cache.refusal(seq.num_tokens, seq.remaining)\n"
                    "            break",
                )
            ],
            checks.FULL_NOT_REFUSED,
            "max_batch=3",
        ),
        (
            [
                "        scheduler.admit(seq)\n => "
                "        scheduler.waiting.popleft()\n        scheduler.admit(seq)\n"
            ],
            checks.POPLEFT,
            "guests check in",
        ),
        ([f"{ADMIT} => {WALK_QUEUE}"], checks.WALK_QUEUE, "guests check in"),
        (
            [
                "        refusal = scheduler.cache.refusal => "
                "        if seq.status is not SequenceStatus.WAITING:\n            break\n"
                "        refusal = scheduler.cache.refusal"
            ],
            checks.READMIT,
            "a full hotel",
        ),
        (
            ["len(scheduler.running) >= => len(scheduler.running) >"],
            checks.MAX_BATCH_OFF,
            "max_batch=3",
        ),
        (
            ["seq.num_tokens, seq.remaining => seq.prompt_len, seq.remaining"],
            checks.REFUSAL_TOKENS,
            "a full hotel",
        ),
        (
            ["seq.num_tokens, seq.remaining => seq.num_tokens"],
            checks.REFUSAL_REMAINING,
            "the same step on",
        ),
        (  # the paged day fails first (no bed counted for the first token); the contiguous folds
            ["seq.num_tokens, seq.remaining => seq.num_tokens, 0"],
            checks.REFUSAL_REMAINING,
            "a full hotel",
        ),
        (
            ["refusal = scheduler.cache.refusal(seq.num_tokens, seq.remaining) => refusal = None"],
            checks.ASK_ADMIT,
            "first come",
        ),
        (
            ["scheduler.admit(seq) => scheduler.admit(seq.seq_id)"],
            checks.SEQ_TO_SCHEDULER,
            "guests check in",
        ),
        # decoding
        (["        seq.num_generated += 1\n => "], checks.COUNT, "guests check in"),
        (
            ["        while not scheduler.cache.can_append(seq.seq_id): =>         while False:"],
            checks.ASK_APPEND,
            "a full hotel",
        ),
        (
            ["        if seq.status is not SequenceStatus.RUNNING:\n            continue\n => "],
            checks.SKIP,
            "a full hotel",
        ),
        (
            ["            if victim is seq:\n                break\n => "],
            checks.SELF,
            "a full hotel",
        ),
        # by swap a guest sent away earlier in the step is SWAPPED: skipping only the PREEMPTED
        # passes every recompute day, then asks the cache about a guest it no longer knows
        (
            [SKIP_TEST + " => " + SKIP_TEST.replace(RUNNING_TEST, PREEMPTED_TEST)],
            checks.SKIP_SWAPPED,
            "the full hotel by swap",
        ),
        (
            [
                SKIP_TEST
                + " => "
                + SKIP_TEST.replace(
                    RUNNING_TEST,
                    "seq.status in (SequenceStatus.PREEMPTED, SequenceStatus.FINISHED)",
                )
            ],
            checks.SKIP_SWAPPED,
            "the full hotel by swap",
        ),
        # skipping only the SWAPPED fails the recompute day first, as skipping nobody does
        (
            [
                SKIP_TEST
                + " => "
                + SKIP_TEST.replace(RUNNING_TEST, "seq.status is SequenceStatus.SWAPPED")
            ],
            checks.SKIP,
            "a full hotel",
        ),
        (["            out.preempted.append(victim)\n => "], checks.NOT_NOTED, "a full hotel"),
        (
            ["            victim = scheduler.preempt() => " + INLINE_PREEMPT],
            checks.USE_PREEMPT,
            "a full hotel",
        ),
        ([COUNTED_TWICE], checks.COUNTED_TWICE, "a full hotel"),
        (  # counted by hand, recompute's traces are only in the tokens kvlab counts at a
            # preemption; by swap the guest sent away by hand is PREEMPTED, not SWAPPED
            [
                "            victim = scheduler.preempt() => "
                + INLINE_PREEMPT
                + "\n            scheduler.num_preemptions += 1"
            ],
            checks.USE_PREEMPT,
            "the full hotel by swap",
        ),
        # the report
        (
            ["            out.finished.append(seq)\n => "],
            checks.REPORTED["out.finished"],
            "guests check in",
        ),
        (
            ["            out.refused, out.refusal = seq, refusal\n => "],
            checks.REPORTED["out.refused"],
            "first come",
        ),
        (
            ["out.admitted.append(seq) => out.admitted.append(seq.seq_id)"],
            checks.SEQ_NOT_ID,
            "guests check in",
        ),
        (["    return out => "], checks.RETURN_STEP, "guests check in"),
        (["    return out\n =>     return out.scheduled\n"], checks.STEP_TYPE, "guests check in"),
    ],
)
def test_each_step_slip_gets_its_hint(edits, hint, first_check):
    result, first = first_failure("06.step", step(*edits))
    assert first.name.startswith(first_check), (first.name, first.details)
    assert hint_of(first) == f"hint:     {hint}", first.details
    assert any(
        d.startswith("input:    ") and ("; step " in d or "schedule=step" in d)
        for d in first.details
    )
    assert folded(result), [o.details for o in failures(result)]


@pytest.mark.parametrize(
    "edit, at",
    [
        # fay's prompt fits in the beds left at step 2, her booking does not
        ("seq.num_tokens, seq.remaining => seq.num_tokens, 0", "; step 2 (now=1)"),
        ("seq.num_tokens, seq.remaining => seq.num_tokens", "; step 1 (now=0)"),  # ValueError
    ],
)
def test_the_contiguous_day_catches_a_refusal_without_the_answer(edit, at):
    with pytest.raises(checks.CheckFailed) as failure:
        checks._lockstep(step(edit), checks.DAYS["contiguous"])
    assert failure.value.hint == checks.REFUSAL_REMAINING
    assert at in failure.value.input


def _kvlab_view(day: str, steps: int) -> dict:
    capture = checks._Captured(Scheduler.step, [])
    engine, capture.guests = checks.DAYS[day].start(capture)
    for _ in range(steps):
        engine.step()
    return capture.view


def test_first_come_first_served_is_named_only_for_going_past_a_refused_guest():
    # queue day, step 2: kvlab refuses cat (14 tokens) and dan, behind her, waits
    expected = _kvlab_view("queue", 2)
    assert expected["out.refused"] == "cat"
    day, queue = checks.DAYS["queue"], ["cat", "dan"]

    def direct(**got):
        mine = types.SimpleNamespace(view={**expected, **got}, now=1.0)
        return checks._direct(day, mine, expected, queue)

    assert direct(**{"out.admitted": ["dan"], "scheduler.running": ["ann", "ben", "dan"]}) == (
        checks.FCFS
    )
    assert direct(**{"out.refused": "dan"}) == checks.FCFS  # asked past cat, reported the last
    # refusing a guest further back in another state (a guest retired early, say) is not it
    assert direct(**{"out.refused": "dan", "out.finished": ["ben"]}) != checks.FCFS


def test_only_the_full_hotels_day_preempts():
    # a preemption mistake first fails under a title that names preemption
    preempting = set()
    for name, day in checks.DAYS.items():
        capture = checks._Captured(Scheduler.step, [])
        engine, capture.guests = day.start(capture)
        while engine.has_unfinished():
            engine.step()
            if capture.view["out.preempted"]:
                preempting.add(name)
    assert preempting == {"preemption", "swap", "simulate"}
    names = [c.name for c in checks.step_ex.checks]
    assert [n for n in names if "leaves" in n] == [names[3]]  # the full hotel's check


def test_a_step_failure_says_which_step_what_differs_and_how_to_replay_it():
    retire_late = step(f"{RETIRE}{DECODE} => {DECODE}{RETIRE}")
    _, first = first_failure("06.step", retire_late)
    assert first.details[:3] == [
        "step 2: out.finished differs from kvlab's",
        "input:    PagedCache(16 rooms of 4 beds); guests (prompt+answer@arrival): ann 6+3@0, "
        "ben 5+2@0, cat 9+2@2, dan 3+4@3.5, eve 4+2@10; step 2 (now=1), before it: running, in "
        "check-in order: ann (arrived 0, 7 tokens), ben (arrived 0, 6 tokens); waiting: cat "
        "(arrives 2), dan (arrives 3.5), eve (arrives 10); 12 of 16 rooms free",
        'replay:   `from kvlab.grading.lab06 import show_day; show_day(step, "arrivals")` prints '
        "the day step by step, kvlab's beside yours",
    ]
    assert "expected: []" in first.details and "got:      [ben]" in first.details


def test_show_day_prints_both_steps_up_to_the_first_difference(capsys):
    # admitting before the decoding, the step asks the cache for eve in a step that preempts
    checks.show_day(step(f"{RETIRE}{DECODE}{ADMIT} => {OLD_ORDER}"), "preemption")
    out = capsys.readouterr().out
    assert (
        "step 2 (now=1)\n"
        "  kvlab: finished []  admitted [cat, dan]  refused eve  preempted []  "
        "scheduled [ann, ben, cat, dan]\n"
    ) in out
    assert (
        "step 3 (now=2)\n"
        "  kvlab: finished []  admitted []  refused nobody  preempted [dan, cat]  "
        "scheduled [ann, ben]\n"
        "  yours: finished []  admitted []  refused eve  preempted [dan, cat]  "
        "scheduled [ann, ben]\n"
    ) in out
    assert out.rstrip().endswith("first difference: out.refused: kvlab nobody; yours eve")


def test_an_error_in_a_kvlab_call_is_shown_at_the_learners_line():
    blind = step(
        "        while not scheduler.cache.can_append(seq.seq_id): =>         while False:"
    )
    _, first = first_failure("06.step", blind)
    error, line = first.details[0].splitlines()
    assert error.startswith("OutOfBlocks: ")
    assert line == "   at line 8 of your code (decode): scheduler.cache.append(seq.seq_id)"


def test_handing_step_to_kvlab_is_refused():
    for call in (
        "scheduler.step(now)",
        "scheduler.schedule(now)",
        "Scheduler.step(scheduler, now)",
    ):
        source = f"def step(scheduler, now):\n    return {call}\n"
        result, first = first_failure("06.step", learner(source, "step"))
        assert result.passed == 0
        assert "hands the work to kvlab's `kvlab.serving.scheduler.Scheduler." in first.details[0]
        assert any(d.startswith("input:    PagedCache(16 rooms") for d in first.details)
        assert folded(result)
    retire = step(f"{RETIRE} => {'    out.finished = scheduler.retire()'}\n")
    _, first = first_failure("06.step", retire)
    assert "`kvlab.serving.scheduler.Scheduler.retire`" in first.details[0]
    assert run_checks("06.step", Scheduler.step).status is Status.WRONG_KIND


def test_step_that_raises_loops_or_returns_junk_gets_a_clean_report():
    raises = learner("def step(scheduler, now):\n    return 1 / 0\n", "step")
    result, first = first_failure("06.step", raises)
    assert first.details[0].splitlines() == [
        "ZeroDivisionError: division by zero",
        "   at line 3 of your code (step): return 1 / 0",
    ]
    assert folded(result)
    loops = learner("def step(scheduler, now):\n    while True:\n        pass\n", "step")
    result = run_checks("06.step", loops, timeout=0.5)
    assert [o.status for o in result.outcomes] == [Status.TIMED_OUT] + [Status.SKIPPED] * 7
    junk = learner("def step(scheduler, now):\n    return {'scheduled': []}\n", "step")
    _, first = first_failure("06.step", junk)
    assert "got:      dict {'scheduled': []}" in first.details
    assert hint_of(first) == f"hint:     {checks.STEP_TYPE}"


def test_walking_the_live_list_while_preempt_pops_its_last_guest_is_harmless():
    # kvlab's preempt takes the last guest, whom the walk has not reached: nobody is skipped
    live = step(
        "    for seq in list(scheduler.running):\n        if seq.status => "
        "    for seq in scheduler.running:\n        if seq.status"
    )
    assert run_checks("06.step", live).ok


def test_an_unrecognised_step_mistake_gets_the_neutral_note():
    # admits only one guest per step: no usual slip does that
    once = step(
        "        decode(seq)\n    return out => "
        + "        decode(seq)\n        break\n    return out"
    )
    result, first = first_failure("06.step", once)
    assert any(d.startswith(f"note:     {NO_DIAGNOSIS}") for d in first.details)


def test_the_swap_day_fails_skipping_only_the_preempted_at_the_guest_it_skips_no_longer():
    _, first = first_failure("06.step", step(f"{RUNNING_TEST} => {PREEMPTED_TEST}"))
    assert first.details[0].splitlines()[0] == "KeyError: seq_id 'dan' is not in the block manager"
    (where,) = [d for d in first.details if d.startswith("input:    ")]
    assert "PagedCache(6 rooms of 4 beds), preemption='swap'; guests" in where
    assert "; step 3 (now=2), before it:" in where
    assert any('show_day(step, "swap")' in d for d in first.details)


def test_only_the_recompute_day_tells_skipping_nobody_from_skipping_only_the_preempted():
    # by swap the two slips are the same step (nobody is ever PREEMPTED): the hint comes from
    # the recompute day, which the learner's step passes as only one of them does
    nobody = checks.slipped(checks.references.SkipNobody)
    preempted = checks.slipped(checks.references.SkipPreemptedOnly)
    swap, recompute = checks.DAYS["swap"], checks.DAYS["preemption"]
    assert swap.second == "preemption"
    assert checks._departure(nobody, swap) == checks._departure(preempted, swap) is not None
    assert checks._departure(preempted, recompute) is None
    assert checks._departure(checks.slipped_step, swap) is None
    assert checks._departure(nobody, recompute)[0] == 3  # dan, sent away in step 3


def test_if_instead_of_while_around_preempt_is_the_same_step_here():
    # kept: nobody shares a room in Lab 06, so one guest sent away frees at least one room and a
    # second ask is never needed (the lab says why while is right in general)
    once = step(
        "        while not scheduler.cache.can_append(seq.seq_id):\n"
        "            victim = scheduler.preempt()\n"
        "            out.preempted.append(victim)\n"
        "            if victim is seq:\n"
        "                break\n"
        "        else:\n"
        "            decode(seq)\n => "
        "        if not scheduler.cache.can_append(seq.seq_id):\n"
        "            victim = scheduler.preempt()\n"
        "            out.preempted.append(victim)\n"
        "            if victim is seq:\n"
        "                continue\n"
        "        decode(seq)\n"
    )
    assert run_checks("06.step", once).ok
    # the reason, on every day of the checks: after any preemption a room is free
    for day in checks.DAYS.values():
        engine, _ = day.start()
        scheduler, freed = engine.scheduler, []

        def preempt(scheduler=scheduler, own=scheduler.preempt, freed=freed):
            victim = own()
            freed.append(scheduler.cache.manager.num_free_blocks)
            return victim

        scheduler.preempt = preempt
        while engine.has_unfinished():
            engine.step()
        assert all(n >= 1 for n in freed), day.name
        assert bool(freed) == (day.name in ("preemption", "swap", "simulate"))


def test_a_booking_one_token_short_fails_on_the_booking_day():
    """Asked for the answer less its last token, the cache admits a guest it cannot hold: the
    allocation fails on the day whose last free beds are one short."""
    short = step("seq.num_tokens, seq.remaining) => seq.num_tokens, max(1, seq.remaining - 1))")
    result, first = first_failure("06.step", short)
    assert first.name.startswith("6 beds free"), (first.name, first.details)
    assert result.passed == result.total - 1, result.report()
