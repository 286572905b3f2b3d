"""Lab 05 checks, tried with slipped kernels: the solution cell with one typical mistake put in
(each a @triton.jit function written to a file, as a learner's is). A wrong answer fails its check,
a recognised slip gets its own hint (confirmed on a second case where it looks like another), the
checks after it fold into "probably the same problem as above"; and the notebook launches a
learner's kernel only where a crash cannot take the notebook down."""

import contextlib
import io
import json
import pathlib
import tempfile

import pytest
import torch

from kvlab.grading import Status, get_exercise, run_checks
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM
from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.kernels import launch_paged_decode, paged_decode_attention, paged_decode_kernel
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import NAN_ROOM, SPARE_ROOM, close, make_case

ROOT = pathlib.Path(__file__).parents[2]
NOTEBOOK = ROOT / "solutions" / "05_triton_kernel.ipynb"
INTERPRETER = kernel_mode() == "interpreter"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GARBAGE_CHECK = "rooms past the key card's end are never read"


def cell(cell_id: str) -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c.get("id") == cell_id)


def kernel(*edits):
    """The solution's kernel with edits ("old => new"), from a file outside kvlab."""
    source = "".join(line for line in cell("lab05-07").splitlines(True) if "### " not in line)
    for edit in edits:
        old, new = edit.split(" => ")
        assert source.count(old) >= 1, old
        source = source.replace(old, new)
    source = "import triton\nimport triton.language as tl\n\n" + source
    path = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-")) / "learner.py"
    path.write_text(source)  # @triton.jit reads the source from a file
    namespace = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace["my_paged_decode_kernel"]


def hints(outcome) -> list[str]:
    return [d for d in outcome.details if d.startswith("hint:")]


def folded_into(outcome, first: str) -> bool:
    return outcome.details[0] == f"{SAME_PROBLEM} (“{first}”)"


ROOM_TOO_MANY = "range(0, tl.cdiv(seq_len, BLOCK_SIZE)) => range(0, seq_len // BLOCK_SIZE + 1)"
ROOM_MORE = "range(0, tl.cdiv(seq_len, BLOCK_SIZE)) => range(0, tl.cdiv(seq_len, BLOCK_SIZE) + 1)"
UNMASKED_BEDS = (
    "kv_mask = tmask[:, None] & dmask[None, :] => kv_mask = (t[:, None] >= 0) & dmask[None, :]"
)


# --- the cases ------------------------------------------------------------------------------


def test_nan_beds_fill_only_the_beds_no_guest_holds():
    plain = make_case([5, 11, 8], 4)
    nan = make_case([5, 11, 8], 4, nan_beds=True)
    q, k, v, tables, lens = nan
    for s, n in enumerate([5, 11, 8]):
        last = int(tables[s, (n - 1) // 4])
        held = n - (n - 1) // 4 * 4
        assert k[last, held:].isnan().all() and v[last, held:].isnan().all()
        assert not k[last, :held].isnan().any()
    assert int(k.isnan().flatten(1).any(1).sum()) == 2  # guest 2 fills its rooms
    held = ~k.isnan()
    for a, b in zip(plain, nan, strict=True):  # the rest of the case is the same
        if a.dtype.is_floating_point and a.dim() == 4:
            assert torch.equal(a[held], b[held])
        else:
            assert torch.equal(a, b)
    assert torch.equal(paged_decode_attention_ref(*plain), paged_decode_attention_ref(*nan))


def test_nan_beds_leave_a_shared_room_full_for_the_longer_guest():
    q, k, v, tables, lens = make_case([6, 3], 4, shared=True, nan_beds=True)
    assert int(tables[0, 0]) == int(tables[1, 0])  # guest 1's only room is guest 0's first
    assert not k[int(tables[0, 0])].isnan().any()
    assert k[int(tables[0, 1]), 2:].isnan().all()
    plain = make_case([6, 3], 4, shared=True)
    assert torch.equal(
        paged_decode_attention_ref(q, k, v, tables, lens), paged_decode_attention_ref(*plain)
    )


NEW_CASES = [
    dict(seq_lens=[8, 4], block_size=4, garbage=NAN_ROOM),  # whole rooms, NaN room past the end
    dict(seq_lens=[5, 11], block_size=4, nan_beds=True, garbage=SPARE_ROOM),
    dict(seq_lens=[5, 11], block_size=4, nan_beds=True, garbage=NAN_ROOM, transposed=True),
    dict(seq_lens=[6, 13], block_size=4, q_heads=8, kv_heads=2, head_dim=40, nan_beds=True),
    dict(seq_lens=[9, 12], block_size=4, shared=True, nan_beds=True, dtype=torch.bfloat16),
    dict(seq_lens=[64, 33, 1], block_size=16, nan_beds=True, garbage=NAN_ROOM),
]


@pytest.mark.parametrize("case", NEW_CASES)
def test_kvlab_kernels_never_read_the_garbage(case):
    args = [t.to(DEVICE) for t in make_case(**case)]
    expected = paged_decode_attention_ref(*args)
    assert close(launch_paged_decode(paged_decode_kernel, *args), expected)
    for splits in (1, 2, 3):
        assert close(paged_decode_attention(*args, num_splits=splits), expected)


def test_kvlab_room_by_room_kernel_passes_every_check():
    """run_checks refuses kvlab's own kernel, so the checks' functions are called directly."""
    for check in get_exercise("05.kernel").checks:
        check.func(paged_decode_kernel)


def test_the_solution_passes_every_check():
    result = run_checks("05.kernel", kernel())
    assert result.status is Status.PASSED, result.report()


# --- garbage that must never be read ----------------------------------------------------------


def test_one_room_too_many_with_loads_not_masked_by_token_fails_the_garbage_check():
    """Reported by a tester: it passed 7/7 and returned NaN on make_case([8, 4], 4,
    garbage=NAN_ROOM). Only lengths that fill whole rooms reach the padding entry."""
    args = make_case([8, 4], 4, garbage=NAN_ROOM)
    assert launch_paged_decode(kernel(ROOM_TOO_MANY, UNMASKED_BEDS), *args).isnan().any()
    result = run_checks("05.kernel", kernel(ROOM_TOO_MANY, UNMASKED_BEDS))
    (outcome,) = [o for o in result.outcomes if not o.passed]
    assert outcome.name.startswith(GARBAGE_CHECK)
    assert outcome.details[0].endswith("a padding entry of its key card was read")
    assert "seq_lens [8, 4] (whole rooms)" in outcome.details[1]
    (hint,) = hints(outcome)
    assert "only where seq_len is a multiple of BLOCK_SIZE" in hint
    assert "seq_len // BLOCK_SIZE + 1 rooms instead of tl.cdiv(seq_len, BLOCK_SIZE)" in hint
    assert "not masked by the token mask" in hint


def test_loads_not_masked_by_token_fail_on_nan_in_the_beds_past_seq_len():
    result = run_checks("05.kernel", kernel(UNMASKED_BEDS))
    (outcome,) = [o for o in result.outcomes if not o.passed]
    assert outcome.name.startswith(GARBAGE_CHECK)
    assert outcome.details[0].endswith("a bed past seq_len was read")
    assert "the beds past seq_len in each last room hold NaN" in outcome.details[1]
    assert "0 × NaN is NaN" in hints(outcome)[0]
    assert "Mask the K and V loads with the token mask" in hints(outcome)[0]
    replay = next(d for d in outcome.details if d.startswith("replay:"))
    call = replay.removeprefix("replay:").removesuffix(" builds these inputs").strip()
    import kvlab.grading.lab04

    q, k_cache, *_ = eval(call, {"kvlab": kvlab, "torch": torch})
    assert "nan_beds=True" in call and k_cache.isnan().any()


def test_one_room_too_many_with_masked_loads_still_passes():
    """Lenient, on purpose: every load of the extra room is masked, so no tensor and no answer
    changes (the extra key-card entry read is within the table)."""
    assert run_checks("05.kernel", kernel(ROOM_MORE)).status is Status.PASSED


# --- slips named once, knock-ons folded -------------------------------------------------------

SLIPS = [
    (
        ["b * BLOCK_SIZE + t < seq_len => b * BLOCK_SIZE + t <= seq_len"],
        "one bed past seq_len was scored",
    ),
    (["kvh * stride_kh => 0 * stride_kh", "kvh * stride_vh => 0 * stride_vh"], "KV head 0"),
    (
        [
            "kvh * stride_kh => (kvh // GROUP) * stride_kh",
            "kvh * stride_vh => (kvh // GROUP) * stride_vh",
        ],
        "the programs read KV head kvh // GROUP",
    ),
    (["out = acc / denom[:, None] => out = acc"], "not divided by the running sum"),
    (
        ["t[:, None] * stride_kt + kvh * stride_kh => t[:, None] * stride_kh + kvh * stride_kt"],
        "stride_kt and stride_kh were swapped",
    ),
    (
        ["t[:, None] * stride_vt + kvh * stride_vh => t[:, None] * stride_vh + kvh * stride_vt"],
        "stride_vt and stride_vh were swapped",
    ),
    (
        [
            "t[:, None] * stride_kt + kvh * stride_kh => t[:, None] * stride_kh + kvh * stride_kt",
            "t[:, None] * stride_vt + kvh * stride_vh => t[:, None] * stride_vh + kvh * stride_vt",
        ],
        "the token and head strides were swapped",
    ),
    (["p[:, :, None] * v[None, :, :] => p[:, :, None] * k[None, :, :]"], "summed keys, not values"),
    (
        [
            "tl.exp(m - m_new) => tl.exp2(m - m_new)",
            "tl.exp(scores - m_new[:, None]) => tl.exp2(scores - m_new[:, None])",
        ],
        "tl.exp2(x) is 2**x, not e**x",
    ),
]


@pytest.mark.parametrize("edits, named", SLIPS, ids=[s[1] for s in SLIPS])
def test_kernel_slip_is_named_by_the_first_check_and_folds_the_rest(edits, named):
    result = run_checks("05.kernel", kernel(*edits))
    first, *rest = result.outcomes
    assert result.passed == 0
    assert named in hints(first)[0], first.details
    assert all(folded_into(o, first.name) for o in rest), [o.details for o in rest]
    assert not any(NO_DIAGNOSIS in d for o in result.outcomes for d in o.details)


def test_the_two_kv_head_slips_are_told_apart_where_they_look_alike():
    """With 2 KV heads, KV head 0 and KV head kvh // GROUP read the same: every case of the checks
    has kv_heads <= GROUP. Each hint is confirmed on 8 query heads over 4 KV heads."""
    from kvlab.grading.lab05 import LOOKALIKE_VARIANTS, _kv_head_divided, attend_beds

    case = make_case([3], 4)
    assert torch.equal(
        attend_beds(case, kv_of_head=[0] * 4), attend_beds(case, kv_of_head=_kv_head_divided(case))
    )
    variant = make_case([3], 4, **LOOKALIKE_VARIANTS[0])
    zero = attend_beds(variant, kv_of_head=[0] * 8)
    assert not torch.allclose(zero, attend_beds(variant, kv_of_head=_kv_head_divided(variant)))


def test_arithmetic_in_bf16_is_named_where_the_kernel_is_right_in_fp32():
    """Loads kept in bf16 and bf16 accumulators: right on fp32 inputs, wrong on bf16 ones. The
    rerun on fp32 inputs is compared with the reference on those inputs, not the bf16 answer."""
    in_bf16 = kernel(
        ").to(tl.float32) => )",
        "acc = tl.zeros([GROUP_P2, D_P2], tl.float32) => "
        "acc = tl.zeros([GROUP_P2, D_P2], q_ptr.dtype.element_ty)",
        "denom = tl.zeros([GROUP_P2], tl.float32) => "
        "denom = tl.zeros([GROUP_P2], q_ptr.dtype.element_ty)",
    )
    *fp32, bf16 = run_checks("05.kernel", in_bf16).outcomes
    assert all(o.status is Status.PASSED for o in fp32), [o.details for o in fp32]
    assert "right in float32, wrong in bfloat16" in hints(bf16)[0], bf16.details


def test_every_look_alike_answers_on_the_variants_heads_not_the_cases():
    """The slips are listed for the failing case, then answered on the variants: each one reads
    the variant's own heads (h % kv_heads for 8 query heads over 4 KV heads, not over 2)."""
    from kvlab.grading.lab05 import LOOKALIKE_VARIANTS, _lookalike_slips, attend_beds

    table = list(_lookalike_slips(make_case([5, 9], 4, q_heads=6, kv_heads=2)))
    variant = make_case([5, 9], 4, **LOOKALIKE_VARIANTS[0])
    modulo = attend_beds(variant, kv_of_head=[h % 4 for h in range(8)])
    assert torch.equal(table[-1].answer(variant), modulo)
    assert all(slip.answer(variant).shape == modulo.shape for slip in table)


def test_the_whole_last_room_is_still_named_where_one_bed_too_many_looks_the_same():
    """seq_lens [3] in rooms of 4: scoring the whole last room and one bed too many agree; the
    variant tells them apart, so a kernel that scores every bed is not told about <=."""
    unmasked = kernel(
        'scores = tl.where(tmask[None, :], scores, float("-inf")) => pass', UNMASKED_BEDS
    )
    first = run_checks("05.kernel", unmasked).outcomes[0]
    assert "the beds past seq_len in the last room were scored" in hints(first)[0]


# --- the notebook ---------------------------------------------------------------------------


def run_cell(cell_id: str, namespace: dict) -> str:
    """What a cell of the notebook prints, run in ``namespace`` after the first cell."""
    out = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()):
        exec(cell("lab05-01"), namespace)
    with contextlib.redirect_stdout(out):
        exec(cell(cell_id), namespace)
    return out.getvalue()


def section_3(learner) -> str:
    """What the notebook's section 3 cell prints with ``learner`` as the exercise's kernel."""
    return run_cell("lab05-10", {"my_paged_decode_kernel": learner})


def test_section_3_runs_the_learners_kernel_once_it_passes():
    assert section_3(kernel()).startswith("your kernel vs the reference: max error")


def test_section_3_uses_kvlabs_kernel_while_the_check_fails():
    """The tester's kernel killed the notebook's kernel here: on the Llama-shaped batch a length
    of 16 fills its room, and the room past the key card's end is 10**9."""
    said = section_3(kernel(ROOM_TOO_MANY, UNMASKED_BEDS)).splitlines()
    assert said[0] == (
        "your kernel is not ready (its check does not pass yet): kvlab's paged_decode_kernel "
        "runs instead"
    )
    assert len(said) == 2 and said[1].startswith("kvlab's kernel vs the reference: max error")


@pytest.mark.skipif(not INTERPRETER, reason="compiled kernels do not crash the process")
def test_section_3_survives_a_kernel_that_passes_its_check_and_crashes_there():
    """Wild only at head_dim 128, which no check uses: the launch runs in a child, as the checks
    do, and its crash is reported."""
    wild = kernel(
        "out_ptr + seq.to(tl.int64) => out_ptr + (HEAD_DIM // 128) * 2**40 + seq.to(tl.int64)"
    )
    assert run_checks("05.kernel", wild).status is Status.PASSED
    said = section_3(wild).splitlines()
    assert said[0].startswith("your kernel is not ready (it crashed its process (SIG"), said
    assert said[0].endswith("): kvlab's paged_decode_kernel runs instead")


def test_launch_isolated_reports_what_went_wrong():
    from kvlab.grading.lab05 import launch_isolated

    args = make_case([5, 8], 4)
    out, problem = launch_isolated(kernel(), *args)
    assert problem is None and close(out, paged_decode_attention_ref(*args))
    raising = kernel(
        "seq_len = tl.load(lens_ptr + seq) => seq_len = tl.load(lens_ptr + seq) + nope"
    )
    out, problem = launch_isolated(raising, *args)
    assert out is None and problem.startswith("it raised ") and "nope" in problem


def test_the_lab_says_the_checks_cannot_see_a_missing_int64():
    text = cell("lab05-06")
    assert "The checks cannot see a missing `.to(tl.int64)`" in text
    assert "2³¹" in text


def test_the_split_k_demo_shows_what_differs():
    """bf16 rounding printed 0.0 for every split count: the demo is fp32 and shows each split's
    max and sum."""
    source = cell("lab05-12")
    assert "bfloat16" not in source and "m_i" in source and "l_i" in source
    lines = run_cell("lab05-12", {}).splitlines()
    differences = [float(line.rsplit(" ", 1)[1]) for line in lines if "vs one pass (fp32)" in line]
    assert len(differences) == 3 and all(d < 1e-5 for d in differences)
    assert any(d > 0 for d in differences)  # fp32 shows the other order of the additions
    maxima = [line.split("m_i = ")[1].split()[0] for line in lines if line.startswith("split ")]
    assert len(maxima) == 3 and len(set(maxima)) == 3  # each split hands the merge its own max
    merged = next(line for line in lines if line.startswith("merged splits vs one pass"))
    assert float(merged.rsplit(" ", 1)[1]) < 1e-5
