"""Lab 09 checks, tried with learner code: the lab's solutions pass and the stubs are "not
implemented"; each usual slip put into a solution fails with the hint that names it, and only
that hint (later failures fold into "the same problem")."""

import learner_code
import pytest
import torch
from learner_code import assert_only_hint, failures, hints_of

from kvlab.grading import Status, run_checks
from kvlab.grading import lab09 as checks
from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab06 import hints as lab06_hints
from kvlab.grading.lab06.step import departure

HEADER = (
    "import math\n"
    "import torch\n"
    "from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence, SequenceStatus\n"
)
KERNEL_HEADER = "import math\nimport torch\nimport triton\nimport triton.language as tl\n"

BUDGET_STEP = 'def budget_step(scheduler: Scheduler, now: float) -> ScheduledStep:\n    """One engine step under the token budget: the running guests first, then newcomers."""\n    out = ScheduledStep()\n    budget = scheduler.max_num_batched_tokens\n    out.finished = scheduler.retire()\n\n    def chunk(seq, n):  # the next n tokens of a prompt that does not end in this step\n        seq.num_scheduled, seq.samples = n, False\n        out.num_batched_tokens += n\n        out.scheduled.append(seq)\n\n    def decode(seq):  # what is left to compute (1, or a prompt\'s last chunk), then the next token\n        seq.num_scheduled, seq.samples = seq.num_uncomputed, True\n        out.num_batched_tokens += seq.num_scheduled\n        scheduler.cache.append(seq.seq_id)\n        seq.num_generated += 1\n        out.scheduled.append(seq)\n\n    for seq in list(scheduler.running):\n        left = budget - out.num_batched_tokens\n        if left == 0:\n            break\n        if seq.status is not SequenceStatus.RUNNING:\n            continue\n        if seq.num_uncomputed > left:\n            chunk(seq, left)\n            continue\n        while not scheduler.cache.can_append(seq.seq_id):\n            victim = scheduler.preempt()\n            out.preempted.append(victim)\n            if victim is seq:\n                break\n        else:\n            decode(seq)\n    while not out.preempted and scheduler.waiting and scheduler.waiting[0].arrival <= now:\n        left = budget - out.num_batched_tokens\n        if left == 0:\n            break\n        if scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch:\n            break\n        seq = scheduler.waiting[0]\n        refusal = scheduler.cache.refusal(seq.num_tokens, seq.remaining)\n        if refusal is not None:\n            out.refused, out.refusal = seq, refusal\n            break\n        scheduler.admit(seq)\n        out.admitted.append(seq)\n        if seq.num_uncomputed > left:\n            chunk(seq, left)\n        else:\n            decode(seq)\n    return out\n'
ALMOST_FREE = "\ndef almost_free_tokens(spec, gpu, batch, context):\n    def compute_and_memory(k):\n        attended = batch * (context + 1) + k * (k + 1) / 2\n        flops = 2 * spec.num_params * (batch + k)\n        flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended\n        moved = spec.num_params * spec.dtype_bytes\n        moved += (batch * (context + 1) + k) * spec.kv_bytes_per_token\n        return flops / gpu.peak_flops, moved / gpu.hbm_bytes_per_s\n\n    k = 0\n    compute, memory = compute_and_memory(0)\n    if compute > memory:\n        return 0\n    while True:\n        compute, memory = compute_and_memory(k + 1)\n        if compute > memory:\n            return k\n        k += 1\n"
CHOOSE_CHUNK = "\ndef choose_chunk(results, target):\n    under = [b for b, r in results.items() if r.itl(99) <= target]\n    return max(under) if under else None\n"
CHUNK_ATTENTION = 'def chunk_attention(q, k_cache, v_cache, block_table, num_computed):\n    """Attention of a chunk\'s queries over the guest\'s cached prefix and, causally, the chunk."""\n    n, q_heads, head_dim = q.shape\n    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]\n    total = num_computed + n\n    positions = torch.arange(total)\n    rooms = block_table[positions // block_size].long()\n    k = k_cache[rooms, positions % block_size].float()  # [total, kv_heads, head_dim]\n    v = v_cache[rooms, positions % block_size].float()\n    group = q_heads // kv_heads\n    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n    scores = torch.einsum("ihd,jhd->hij", q.float(), k) / math.sqrt(head_dim)\n    future = positions[None, :] > num_computed + torch.arange(n)[:, None]\n    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)\n    return torch.einsum("hij,jhd->ihd", weights, v).to(q.dtype)\n'
CHUNK_KERNEL = '@triton.jit\ndef my_chunk_kernel(\n    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr,\n    stride_qt, stride_qh, stride_qd,\n    stride_kb, stride_kt, stride_kh, stride_kd,\n    stride_vb, stride_vt, stride_vh, stride_vd,\n    stride_btb,\n    stride_ot, stride_oh, stride_od,\n    num_computed, num_tokens, scale,\n    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr,\n    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,\n):\n    tile = tl.program_id(0)\n    h = tl.program_id(1)\n    kvh = h // GROUP\n    rows = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)\n    d = tl.arange(0, D_P2)\n    t = tl.arange(0, BLOCK_SIZE)\n    row_ok = rows < num_tokens\n    dmask = d < HEAD_DIM\n    q = tl.load(\n        q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :] * stride_qd,\n        mask=row_ok[:, None] & dmask[None, :], other=0.0,\n    ).to(tl.float32)\n    query_pos = num_computed + rows\n    # the tile\'s last query sees keys up to its own position: no key past it is read\n    end = tl.minimum(num_computed + (tile + 1) * BLOCK_Q, num_computed + num_tokens)\n    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)\n    denom = tl.zeros([BLOCK_Q], tl.float32)\n    acc = tl.zeros([BLOCK_Q, D_P2], tl.float32)\n    for b in range(0, tl.cdiv(end, BLOCK_SIZE)):\n        room = tl.load(bt_ptr + b * stride_btb).to(tl.int64)\n        key_pos = b * BLOCK_SIZE + t\n        kv_mask = (key_pos < end)[:, None] & dmask[None, :]\n        k = tl.load(\n            k_ptr + room * stride_kb + t[:, None] * stride_kt + kvh * stride_kh + d[None, :] * stride_kd,\n            mask=kv_mask, other=0.0,\n        ).to(tl.float32)\n        v = tl.load(\n            v_ptr + room * stride_vb + t[:, None] * stride_vt + kvh * stride_vh + d[None, :] * stride_vd,\n            mask=kv_mask, other=0.0,\n        ).to(tl.float32)\n        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale\n        seen = (key_pos[None, :] <= query_pos[:, None]) & (key_pos < end)[None, :]\n        scores = tl.where(seen, scores, float("-inf"))\n        m_new = tl.maximum(m, tl.max(scores, axis=1))\n        alpha = tl.exp(m - m_new)\n        p = tl.exp(scores - m_new[:, None])\n        denom = denom * alpha + tl.sum(p, axis=1)\n        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)\n        m = m_new\n    out = acc / denom[:, None]\n    tl.store(\n        out_ptr + rows[:, None] * stride_ot + h * stride_oh + d[None, :] * stride_od,\n        out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dmask[None, :],\n    )\n'


def learner(source: str, name: str, *edits: str, header: str = HEADER):
    return learner_code.learner(source, name, *edits, header=header)


# --- 09.budget_step ----------------------------------------------------------------------------


def budget_step(*edits):
    return learner(BUDGET_STEP, "budget_step", *edits)


def test_the_budget_step_solution_passes_and_the_stub_is_not_written_yet():
    result = run_checks("09.budget_step", budget_step())
    assert result.ok and result.passed == result.total == 7, result.report()
    stub = learner(
        "def budget_step(scheduler, now):\n    raise NotImplementedError\n", "budget_step"
    )
    assert run_checks("09.budget_step", stub).status is Status.NOT_IMPLEMENTED


def test_kvlabs_slipped_reference_with_no_slip_is_kvlabs_scheduler_on_every_day():
    for day in checks.DAYS.values():
        assert departure(checks.slipped_budget_step, day, rules=checks.RULES) is None, day.name


def test_every_slip_departs_on_some_day():
    for slip in checks.SLIPS:
        days = [d for d in checks.DAYS.values() if departure(slip.answer, d, rules=checks.RULES)]
        assert days, slip.answer.keywords


RUNNING_LOOP = """    for seq in list(scheduler.running):
        left = budget - out.num_batched_tokens
        if left == 0:
            break
        if seq.status is not SequenceStatus.RUNNING:
            continue
        if seq.num_uncomputed > left:
            chunk(seq, left)
            continue
        while not scheduler.cache.can_append(seq.seq_id):
            victim = scheduler.preempt()
            out.preempted.append(victim)
            if victim is seq:
                break
        else:
            decode(seq)
"""


def prefill_first():
    """The queue before the running guests (a newcomer already scheduled is skipped after)."""
    source = BUDGET_STEP.replace(RUNNING_LOOP, "")
    admit_end = "            decode(seq)\n    return out"
    assert admit_end in source
    loop = RUNNING_LOOP.replace(
        "        if seq.status is not SequenceStatus.RUNNING:",
        "        if seq.status is not SequenceStatus.RUNNING or seq in out.scheduled:",
    )
    return learner(
        source.replace(admit_end, "            decode(seq)\n" + loop + "    return out"),
        "budget_step",
    )


def skips_a_refused_guest():
    """The queue walked as a list, going on past a guest the cache refused."""
    return budget_step(
        "    while not out.preempted and scheduler.waiting and scheduler.waiting[0].arrival <= now:\n"
        " =>     for seq in list(scheduler.waiting) if not out.preempted else []:\n"
        "        if seq.arrival > now:\n            break\n",
        "        seq = scheduler.waiting[0]\n => ",
        "            out.refused, out.refusal = seq, refusal\n            break\n"
        " =>             if out.refused is None:\n                out.refused, out.refusal = seq, refusal\n"
        "            continue\n",
    )


def test_an_if_around_the_preemption_passes_as_the_lab_says():
    """On Lab 09's days no two guests share a bed, so one guest leaving always frees one and an
    `if` serves them as `while` does: the lab says the checks cannot tell them apart."""
    fn = budget_step(
        "        while not scheduler.cache.can_append(seq.seq_id):\n"
        "            victim = scheduler.preempt()\n            out.preempted.append(victim)\n"
        "            if victim is seq:\n                break\n        else:\n            decode(seq)\n"
        " =>         if not scheduler.cache.can_append(seq.seq_id):\n"
        "            victim = scheduler.preempt()\n            out.preempted.append(victim)\n"
        "        if seq.status is SequenceStatus.RUNNING:\n            decode(seq)\n"
    )
    assert run_checks("09.budget_step", fn).ok
    import json
    import pathlib

    lab = pathlib.Path(__file__).parents[2] / "solutions" / "09_token_budget.ipynb"
    text = " ".join("".join(c["source"]) for c in json.loads(lab.read_text())["cells"])
    assert "the checks cannot\n   tell it from a single `if`" in text


def test_no_stop_when_the_budget_is_spent_is_named_on_every_day_it_shows():
    """A guest checked in with 0 tokens on the simulated day is refused just as when every guest
    may take the whole budget: the hint is still the budget spent, not the budget overrun."""
    fn = budget_step(
        "        left = budget - out.num_batched_tokens\n        if left == 0:\n            break\n"
        " =>         left = budget - out.num_batched_tokens\n"
    )
    with pytest.raises(CheckFailed) as failure:
        checks.budget.lockstep(fn, "simulate")
    assert " ".join(str(failure.value.hint).split()) == checks.BUDGET_SPENT


@pytest.mark.parametrize(
    "fn, hint",
    [
        (prefill_first, checks.PREFILL_FIRST),
        (
            lambda: budget_step("left = budget - out.num_batched_tokens => left = budget"),
            checks.OVER_BUDGET,
        ),
        (
            lambda: budget_step(
                "        if seq.num_uncomputed > left:\n            chunk(seq, left)\n        else:\n"
                "            decode(seq)\n =>         decode(seq)\n"
            ),
            checks.OVER_BUDGET,
        ),
        (
            lambda: budget_step(
                "        if seq.num_uncomputed > left:\n            chunk(seq, left)\n            continue\n"
                " =>         if seq.num_uncomputed > 1:\n            continue\n"
            ),
            checks.FORGOTTEN,
        ),
        (
            lambda: budget_step(
                "refusal(seq.num_tokens, seq.remaining) => refusal(min(left, seq.num_tokens), seq.remaining)"
            ),
            checks.MEMORY_CHUNK,
        ),
        (lambda: budget_step("while not out.preempted and => while"), lab06_hints.HOLD),
        (
            lambda: budget_step(
                "        if seq.num_uncomputed > left:\n            chunk(seq, left)\n            continue\n"
                " => "
            ),
            checks.OVER_BUDGET,
        ),
        (
            lambda: budget_step(
                "        left = budget - out.num_batched_tokens\n        if left == 0:\n            break\n"
                " =>         left = budget - out.num_batched_tokens\n"
            ),
            checks.BUDGET_SPENT,
        ),
        (skips_a_refused_guest, lab06_hints.FCFS),
        (
            lambda: budget_step(" and scheduler.waiting[0].arrival <= now: => :"),
            lab06_hints.ARRIVAL,
        ),
    ],
    ids=[
        "prefill first",
        "the whole budget each",
        "a newcomer read whole",
        "a partial prompt forgotten",
        "a chunk asks memory for itself",
        "admits after a preemption",
        "a partial prompt read whole",
        "no stop when the budget is spent",
        "past a refused guest",
        "before arrival",
    ],
)
def test_each_budget_slip_gets_its_hint_only(fn, hint):
    assert_only_hint(run_checks("09.budget_step", fn()), hint)


# --- 09.almost_free and 09.choose_chunk ---------------------------------------------------------


def almost_free(*edits):
    return learner(ALMOST_FREE, "almost_free_tokens", *edits)


def choose_chunk(*edits):
    return learner(CHOOSE_CHUNK, "choose_chunk", *edits)


def test_the_roofline_solutions_pass_and_the_stubs_are_not_written_yet():
    for exercise, fn, name, total in (
        ("09.almost_free", almost_free(), "almost_free_tokens", 4),
        ("09.choose_chunk", choose_chunk(), "choose_chunk", 5),
    ):
        result = run_checks(exercise, fn)
        assert result.ok and result.passed == result.total == total, result.report()
        stub = learner(f"def {name}(*args):\n    raise NotImplementedError\n", name)
        assert run_checks(exercise, stub).status is Status.NOT_IMPLEMENTED


@pytest.mark.parametrize(
    "edits, hint",
    [
        (
            [
                "        flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended\n => ",
                "        moved += (batch * (context + 1) + k) * spec.kv_bytes_per_token\n => ",
            ],
            checks.WEIGHTS_ONLY,
        ),
        (
            [
                "        flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended\n => "
            ],
            checks.NO_ATTENTION,
        ),
        (["            return k\n =>             return batch + k\n"], checks.TOTAL_TOKENS),
        (["            return k\n =>             return k + 1\n"], checks.ONE_PAST),
        (
            ["flops = 2 * spec.num_params * (batch + k) => flops = 2 * spec.num_params * k"],
            checks.TOTAL_TOKENS,
        ),
        (
            [
                "attended = batch * (context + 1) => attended = batch * context",
                "moved += (batch * (context + 1) + k) => moved += (batch * context + k)",
            ],
            checks.DECODE_OWN_TOKEN,
        ),
    ],
    ids=[
        "weights only",
        "no attention",
        "the decodes counted",
        "one past",
        "the decodes' FLOPs left out",
        "batch times context",
    ],
)
def test_each_almost_free_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("09.almost_free", almost_free(*edits)), hint)


@pytest.mark.parametrize(
    "returned, hint", [("str(k)", (1, "str")), ("k, memory", (0, "tuple"))], ids=["text", "tuple"]
)
def test_a_count_returned_as_another_type_is_told_so(returned, hint):
    fn = almost_free(f"            return k\n =>             return {returned}\n")
    which, kind = hint
    assert_only_hint(run_checks("09.almost_free", fn), checks.TOKENS_TYPE[which].format(kind=kind))


@pytest.mark.parametrize(
    "edit, hint",
    [
        ("r.itl(99) => r.itl(50)", checks.MEDIAN),
        ("max(under) => min(under)", checks.SMALLEST),
        ("r.itl(99) => r.ttft(99)", checks.TTFT),
        ("r.itl(99) => r.itl(0.99)", checks.PERCENT_AS_FRACTION),
        ("r.itl(99) <= target => r.itl(99) < target", checks.AT_TARGET),
    ],
)
def test_each_choice_slip_gets_its_hint_only(edit, hint):
    assert_only_hint(run_checks("09.choose_chunk", choose_chunk(edit)), hint)


WALK = """
def choose_chunk(results, target):
    best = None
    for budget in sorted(results):
        if results[budget].itl(99) > target:
            break
        best = budget
    return best
"""


def test_a_walk_that_stops_at_the_first_budget_over_the_target_fails_with_its_hint():
    """On the lab's sweep p99 grows with the budget and the walk is right; on a day of chats
    alone it does not, and the walk stops at 256 where 4,096 meets the target."""
    results = checks.roofline.choose_sweep("chats")
    p99 = [results[b].itl(99) for b in checks.roofline.CHOOSE_BUDGETS]
    assert p99[1] > max(p99[2:]), p99  # the sweep the check needs: 512's over the larger ones
    assert_only_hint(
        run_checks("09.choose_chunk", learner(WALK, "choose_chunk")), checks.FIRST_OVER
    )


def test_a_decode_without_its_own_token_differs_on_the_checks_inputs_only_by_one():
    free = checks.roofline.almost_free_tokens
    slipped = [free(*inp, own=0) - free(*inp) for inp in checks.roofline.FREE_INPUTS]
    assert slipped == [0, 0, 0, 0, -1, -1], slipped


def test_attention_counted_at_half_is_not_called_one_past():
    """2 FLOPs per position attended instead of 4 answers one token more on three inputs and 7
    more on the fourth: not the one-past slip (which is one more on every input), so no hint."""
    fn = almost_free(
        "flops += 4 * spec.num_layers => flops += 2 * spec.num_layers",
    )
    result = run_checks("09.almost_free", fn)
    assert result.status is Status.FAILED and hints_of(result) == [], result.report()


@pytest.mark.parametrize("edit", ["r.itl(99) => r.itl(1)", "r.itl(99) => r.itl(5)"])
def test_a_low_percentile_is_not_called_the_median(edit):
    """At a loose target any low percentile picks the largest budget, as the median does; the
    other targets tell them apart, so no hint (it would name a mistake not made)."""
    result = run_checks("09.choose_chunk", choose_chunk(edit))
    assert result.status is Status.FAILED, result.report()
    assert checks.MEDIAN not in [" ".join(h.split()) for h in hints_of(result)], result.report()


# --- 09.chunk_attention and 09.chunk_kernel -----------------------------------------------------


def chunk_attention(*edits):
    return learner(CHUNK_ATTENTION, "chunk_attention", *edits)


def chunk_kernel(*edits):
    return learner(CHUNK_KERNEL, "my_chunk_kernel", *edits, header=KERNEL_HEADER)


def test_the_chunk_solutions_pass_and_the_stubs_are_not_written_yet():
    for exercise, fn, checks_ in (
        ("09.chunk_attention", chunk_attention(), 7),
        ("09.chunk_kernel", chunk_kernel(), 6),
    ):
        result = run_checks(exercise, fn)
        assert result.ok and result.passed == result.total == checks_, result.report()
    stub = learner(
        "def chunk_attention(q, k, v, t, n):\n    raise NotImplementedError\n", "chunk_attention"
    )
    assert run_checks("09.chunk_attention", stub).status is Status.NOT_IMPLEMENTED
    kernel_stub = (
        "@triton.jit\ndef my_chunk_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, stride_qt, stride_qh, "
        "stride_qd, stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd, "
        "stride_btb, stride_ot, stride_oh, stride_od, num_computed, num_tokens, scale, GROUP: tl.constexpr, "
        "BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_P2: tl.constexpr):\n"
        "    # YOUR CODE HERE\n    raise NotImplementedError\n"
    )
    stub_kernel = learner(kernel_stub, "my_chunk_kernel", header=KERNEL_HEADER)
    assert run_checks("09.chunk_kernel", stub_kernel).status is Status.NOT_IMPLEMENTED


FUTURE = "future = positions[None, :] > num_computed + torch.arange(n)[:, None]"


@pytest.mark.parametrize(
    "edits, hint",
    [
        ([FUTURE + " => " + FUTURE.replace(" > ", " >= ")], checks.CAUSAL_EXCLUDES_SELF),
        (
            [FUTURE + " => " + FUTURE.replace("num_computed + torch", "num_computed + 1 + torch")],
            checks.CAUSAL_ONE_AHEAD,
        ),
        ([FUTURE + " => " + FUTURE.replace("num_computed + ", "")], checks.PREFIX_FORGOTTEN),
        (['scores.masked_fill(future, float("-inf")) => scores'], checks.NO_CAUSAL),
        (
            [
                "k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1) => "
                "k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)"
            ],
            checks.KV_HEAD_MODULO,
        ),
        (
            [
                "positions = torch.arange(total) => positions = torch.arange(-(-total // block_size) * block_size)",
            ],
            checks.READ_PAST,
        ),
        (
            [
                'scores.masked_fill(future, float("-inf")).softmax(dim=-1) => '
                'scores.masked_fill(future, float("-inf")).to(q.dtype).softmax(dim=-1).float()'
            ],
            checks.SOFTMAX_LOW,
        ),
    ],
    ids=[
        "excludes itself",
        "one ahead",
        "prefix forgotten",
        "no causal mask",
        "kv head modulo",
        "reads past",
        "softmax in q's dtype",
    ],
)
def test_each_chunk_attention_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("09.chunk_attention", chunk_attention(*edits)), hint)


def test_an_answer_left_in_fp32_fails_the_bfloat16_check():
    result = run_checks(
        "09.chunk_attention",
        chunk_attention(
            'return torch.einsum("hij,jhd->ihd", weights, v).to(q.dtype) => return torch.einsum("hij,jhd->ihd", weights, v)'
        ),
    )
    # (both bfloat16 checks: the second folds into the first)
    assert result.status is Status.FAILED and result.passed == result.total - 2, result.report()
    assert "not q's dtype" in failures(result)[0].details[0], result.report()


SEEN = "seen = (key_pos[None, :] <= query_pos[:, None]) & (key_pos < end)[None, :]"


@pytest.mark.parametrize(
    "edits, hint",
    [
        ([SEEN + " => " + SEEN.replace(" <= ", " < ")], checks.CAUSAL_EXCLUDES_SELF),
        (
            [SEEN + " => seen = (key_pos < end)[None, :] & (query_pos[:, None] >= 0)"],
            checks.DIAGONAL_TILE,
        ),
        (
            [
                "kv_mask = (key_pos < end)[:, None] & dmask[None, :] => kv_mask = dmask[None, :] & (t < BLOCK_SIZE)[:, None]"
            ],
            checks.READ_PAST,
        ),
        (["kvh = h // GROUP => kvh = 0"], checks.KV_HEAD_ZERO),
        (["kvh = h // GROUP => kvh = h % (tl.num_programs(1) // GROUP)"], checks.KV_HEAD_MODULO),
        (
            [SEEN + " => " + SEEN.replace("query_pos[:, None]", "query_pos[:, None] + 1")],
            checks.CAUSAL_ONE_AHEAD,
        ),
        (
            [
                SEEN + " => " + SEEN.replace("query_pos[:, None]", "query_pos[:, None] + 1"),
                "end = tl.minimum(num_computed + (tile + 1) * BLOCK_Q, num_computed + num_tokens) => "
                "end = num_computed + num_tokens",
            ],
            checks.CAUSAL_ONE_AHEAD,
        ),
        (
            [
                "denom = denom * alpha + tl.sum(p, axis=1) => denom = denom + tl.sum(p, axis=1)",
                "acc = acc * alpha[:, None] + => acc = acc +",
            ],
            checks.NO_RESCALE,
        ),
        (
            [
                "room = tl.load(bt_ptr + b * stride_btb).to(tl.int64) => "
                "room = tl.load(bt_ptr + b * stride_btb)"
            ],
            checks.ROOM_INT64,
        ),
        (
            [
                "end = tl.minimum(num_computed + (tile + 1) * BLOCK_Q, num_computed + num_tokens) => "
                "end = tl.minimum(num_computed + (tile + 1) * BLOCK_Q, num_computed + num_tokens) - 1"
            ],
            checks.KEYS_ONE_SHORT,
        ),
    ],
    ids=[
        "causal off by one",
        "no mask on the diagonal tile",
        "reads past the chunk",
        "kv head 0",
        "kv head modulo",
        "one ahead (keys up to the tile's last row)",
        "one ahead (keys up to the chunk's end)",
        "no rescale",
        "room number in 32 bits",
        "end one short",
    ],
)
def test_each_chunk_kernel_slip_gets_its_hint_only(edits, hint):
    assert_only_hint(run_checks("09.chunk_kernel", chunk_kernel(*edits)), hint)


def test_the_far_rooms_case_reads_what_the_near_one_does_from_a_few_pages():
    case = checks.chunk.far_rooms_case()
    near = checks.chunk.make_chunk_case(**checks.chunk.FAR_CASE)
    from kvlab.ops.attention import chunk_attention_reference

    assert int(case[3].min()) * case[1].stride(0) >= 2**31
    assert case[1].untyped_storage().nbytes() < 4.01 * 2**30  # within the judge's 8 GiB
    assert torch.equal(chunk_attention_reference(*case), chunk_attention_reference(*near))


def test_the_far_rooms_check_passes_the_solution_in_the_judges_address_space():
    """The judge bounds each process to 8 GiB of address space (RLIMIT_AS): the far case's
    mapping, and the kernel run on it, fit."""
    import resource

    from kvlab.grading.limits import in_child_process

    solution = chunk_kernel()

    def far_rooms():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        try:
            checks.chunk._far_rooms(solution)
        except CheckFailed as failure:
            return str(failure)
        return "passed"

    assert in_child_process(far_rooms, 300.0) == "passed"


def test_launch_isolated_says_an_unwritten_kernel_is_not_written_yet():
    stub = learner(
        CHUNK_KERNEL.split("    tile = tl.program_id(0)")[0] + "    raise NotImplementedError\n",
        "my_chunk_kernel",
        header=KERNEL_HEADER,
    )
    case = checks.chunk.make_chunk_case(num_computed=6, n=7, q_heads=4, kv_heads=2, seed=9)
    out, trouble = checks.chunk.launch_isolated(stub, *case)
    assert out is None and "not written yet" in trouble, trouble
    out, trouble = checks.chunk.launch_isolated(chunk_kernel(), *case)
    assert trouble is None and out.shape == case[0].shape
