"""11.dequant: the labels read in the kernel. The learner's Triton kernel is Lab 05's decode
kernel over a quantised cache: each bed's 8-bit K and V come with an fp32 scale per token and KV
head, which the learner loads beside them (the token mask on the load) and multiplies in.
Launched by :func:`kvlab.ops.kernels.launch_paged_decode_quantized` on guarded copies of its
tensors (:mod:`kvlab.grading.guarded`) and compared with
:func:`kvlab.ops.kernels.quantized.paged_decode_quantized_ref` (dequantise, then attend).

A wrong answer is named when one usual slip answers as the kernel does (:data:`SLIPS`): each is
the reference given other scales (none for K, none for V, K's for V, bed 0's for a whole room,
their inverses), kvlab's steps with that one decision changed. The garbage check puts NaN in
the beds and labels no guest holds: a label loaded there without the token mask spoils the
weighted sum (0 × NaN), which the same case without NaN confirms.
"""

from __future__ import annotations

import functools

import torch

from kvlab.grading.attention_diagnosis import differs
from kvlab.grading.expect import CheckFailed
from kvlab.grading.guarded import GuardedLaunch
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip, changed, matching, only
from kvlab.grading.triton_errors import launched
from kvlab.ops.kernels import launch_paged_decode_quantized
from kvlab.ops.kernels.quantized import paged_decode_quantized_ref
from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.quant import quantize_cache
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import NAN_ROOM, SPARE_ROOM, TOLERANCE, make_case

# in the interpreter a wild load or store can corrupt the process: each check runs in a child
dequant_ex = exercise(
    "11.dequant",
    "the labels read in the kernel: 8-bit K/V dequantised as they are loaded",
    isolate=kernel_mode() == "interpreter",
)
DEVICE = "cuda" if kernel_mode() == "compiled" and torch.cuda.is_available() else "cpu"
INPUTS = ("q", "k_values", "v_values", "k_scales", "v_scales")

# --- hints ---------------------------------------------------------------------------------------

ADDRESS = "{s}_ptr + room * stride_{s}b + t * stride_{s}t + kvh * stride_{s}h"
K_UNSCALED = (
    "the keys were used as stored: multiply each bed's K by its label, k * k_scale[:, None] (or "
    f"the score by it: q . (s k) = s (q . k)), k_scale loaded at {ADDRESS.format(s='ks')}"
)
V_UNSCALED = (
    "the values were used as stored: multiply each bed's V by its label, v * v_scale[:, None] "
    f"(or its softmax weight by it), v_scale loaded at {ADDRESS.format(s='vs')}"
)
NEITHER = (
    "neither K nor V was multiplied by its label: 8-bit values are x / scale; x comes back as "
    f"values * scale, with K's labels at {ADDRESS.format(s='ks')} and V's at the vs_ pointer "
    "and strides"
)
V_WITH_K = (
    "V was dequantised with K's labels: V has labels of its own, at "
    f"{ADDRESS.format(s='vs')} (a token's K and V have different scales)"
)
SWAPPED = (
    "K's and V's labels were swapped: K is multiplied by the labels at ks_ptr (stride_ks*), V by "
    "those at vs_ptr (stride_vs*)"
)
ONE_PER_ROOM = (
    "one label for a whole room: each bed has its own (a scale per token and KV head), so load "
    f"a vector of BLOCK_SIZE of them, at {ADDRESS.format(s='ks')} with t = tl.arange(0, "
    "BLOCK_SIZE), masked by the token mask"
)
DIVIDED = (
    "the values were divided by their labels: they were stored as x / scale, so x comes back "
    "as values * scale"
)
LABEL_UNMASKED = (
    "a label no guest holds was read: the beds past seq_len in the last room hold NaN here, "
    "their labels too, and a weight of 0 times a NaN label is NaN. Load the labels with the "
    "token mask, mask=tmask, other=0.0"
)
OUTSIDE = (
    "a label was read outside the scales: bed t of room `room`, KV head kvh, has its label at "
    + ADDRESS.format(s="ks")
    + " (K; the same with vs_ptr and the stride_vs* strides for V): a stride is a step in "
    "memory, and each is used once"
)
UNWRITTEN = "no value stored for guest {seq}, query head {head}: was the given tl.store changed?"

# --- the slips: the reference given other scales -------------------------------------------------


def _partial_rooms_nan(out: torch.Tensor, case) -> torch.Tensor | None:
    """``out`` with NaN for the guests whose last room is partly filled: there a masked bed
    loads 0 for its value and its label, and 0 / 0 is NaN (None when every guest's is)."""
    lens, block_size = case[-1], case[1].shape[1]
    partial = lens % block_size != 0
    if bool(partial.all()):
        return None  # nothing left to tell it by
    out[partial.to(out.device)] = float("nan")
    return out


def slipped(q, kq, vq, ks, vs, tables, lens, *, k_scales=None, v_scales=None):
    """The reference with K dequantised by ``k_scales(ks, vs)`` and V by ``v_scales(ks, vs)``."""
    k_by = ks if k_scales is None else k_scales(ks, vs)
    v_by = vs if v_scales is None else v_scales(ks, vs)
    return paged_decode_quantized_ref(q.float(), kq, vq, k_by, v_by, tables, lens)


_slip = functools.partial(changed, slipped)  # the reference given other scales
SLIPS = (
    _slip(K_UNSCALED, k_scales=lambda ks, vs: torch.ones_like(ks)),
    _slip(V_UNSCALED, v_scales=lambda ks, vs: torch.ones_like(vs)),
    _slip(NEITHER, k_scales=lambda ks, vs: torch.ones_like(ks), v_scales=lambda ks, vs: torch.ones_like(vs)),
    _slip(V_WITH_K, v_scales=lambda ks, vs: ks),
    _slip(SWAPPED, k_scales=lambda ks, vs: vs, v_scales=lambda ks, vs: ks),
    _slip(ONE_PER_ROOM, k_scales=lambda ks, vs: ks[:, :1].expand_as(ks),  # bed 0's, room by room
          v_scales=lambda ks, vs: vs[:, :1].expand_as(vs)),
    Slip(DIVIDED, lambda *case: _partial_rooms_nan(slipped(*case, k_scales=lambda ks, vs: 1 / ks,
                                                           v_scales=lambda ks, vs: 1 / vs), case)),
)  # fmt: skip

# --- the cases -----------------------------------------------------------------------------------


def make_dequant_case(seq_lens, block_size, fmt="fp8_e4m3", spread=1, dtype=torch.float32, **case):
    """A paged case (:func:`kvlab.ops.testing.make_case`, fp32) whose beds' vectors are scaled by
    10**-spread .. 10**spread (so each bed's label matters), quantised bed by bed:
    ``q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens``, q in ``dtype``."""
    q, k, v, tables, lens = make_case(seq_lens, block_size, **case)
    g = torch.Generator().manual_seed(case.get("seed", 0) + 1)
    sizes = lambda: 10.0 ** torch.randint(-spread, spread + 1, (*k.shape[:3], 1), generator=g)  # noqa: E731
    k_values, v_values, k_scales, v_scales = quantize_cache(k * sizes(), v * sizes(), fmt)
    unheld = k.isnan().all(dim=-1)  # nan_beds, or a NaN room: their labels are NaN too
    k_scales[unheld] = v_scales[unheld] = float("nan")
    return q.to(dtype), k_values, v_values, k_scales, v_scales, tables, lens


def guarded_launch(fn, args, rows=None) -> GuardedLaunch:
    """The learner's kernel on guarded copies of a case (int8 guards hold 0: no NaN in int8);
    ``rows``: the inputs laid out apart (:class:`GuardedLaunch`)."""
    q, k = args[0], args[1]  # wider than any stray reaches: a lane, a group row, a room's step
    pad = q[0].numel() + pow2(q.shape[1] // k.shape[2]) * pow2(q.shape[2]) + k[0].numel()
    return GuardedLaunch(fn, args, launch_paged_decode_quantized, INPUTS, pad, rows=rows)


def _run(fn, what: str, args, rows=None) -> GuardedLaunch:
    run = launched(what, guarded_launch, fn, [t.to(DEVICE) for t in args], rows)
    if row := run.first_unwritten():
        raise CheckFailed("a row of the output was never stored", input=what,
                          hint=UNWRITTEN.format(seq=row[0], head=row[1]))  # fmt: skip
    if len(run.strays):
        raise CheckFailed(run.stray_report(), input=what)
    return run


def _close(a, b, dtype, equal_nan=False) -> bool:
    """Within the dtype's tolerance, absolute errors measured against the output's size (its
    values reach 10**spread); ``equal_nan`` for a slip that overflows where the code does."""
    if a is None or b is None or a.shape != b.shape:
        return False
    atol, rtol = TOLERANCE[dtype]
    size = max(1.0, float(b.abs().nan_to_num(nan=0.0, posinf=0.0).max())) if b.numel() else 1.0
    return torch.allclose(a, b, atol=atol * size, rtol=rtol, equal_nan=equal_nan)


def _diagnose(fn, run, args, got, clean) -> str | None:
    """The hint of the one slip that answers as the kernel, else of NaN confirmed: a label
    read where no guest is (``clean``, the case without that NaN, comes out right), or an
    address outside the scales (their guards' NaN reached the answer)."""
    dtype = args[0].dtype
    case32 = (args[0].float(), *args[1:])
    same = lambda a, b: _close(a, b, dtype, equal_nan=True)  # noqa: E731
    hint = getattr(only(matching(SLIPS, got, case32, slipped(*case32), same)), "hint", None)
    if hint is not None or not got.isnan().any():
        return hint
    if clean is not None:
        clean_args = make_dequant_case(**clean)
        right = paged_decode_quantized_ref(*clean_args).float()
        if _close(_run(fn, "", clean_args).got.float().cpu(), right, dtype):
            return LABEL_UNMASKED
    return OUTSIDE if run.read_outside("k_scales", "v_scales") else None


def expect_dequantized(fn, what: str, case: dict, clean: dict | None = None, rows=None) -> None:
    """The learner's kernel on ``make_dequant_case(**case)`` against the reference; ``clean``:
    the same case without the NaN no guest holds, which confirms a label read there; ``rows``:
    the inputs laid out apart."""
    args = make_dequant_case(**case)
    run = _run(fn, what, args, rows)
    got, want = run.got.float().cpu(), paged_decode_quantized_ref(*args).float()
    if _close(got, want, args[0].dtype):
        return
    hint = _diagnose(fn, run, args, got, clean)
    replay = f"kvlab.grading.lab11.dequant.make_dequant_case(**{case})"
    raise differs(got, want, what, "the dequantised reference", hint, replay=replay)


GARBAGE = dict(seq_lens=[5, 11], block_size=4, fmt="fp8_e4m3", seed=6)
# (what the learner reads, make_dequant_case's arguments), in the order of the checks
CASES = {
    "fp8 e4m3: one guest of 8 tokens in two rooms of 4 beds, one KV head": dict(
        seq_lens=[8], block_size=4, q_heads=1, kv_heads=1, seed=1
    ),
    "int8: guests of 1, 7 and 9 tokens (rooms partly filled), 2 query heads per KV head": dict(
        seq_lens=[1, 7, 9], block_size=4, fmt="int8", seed=2
    ),
    "labels a thousandfold apart: beds' vectors of 1e-3 .. 1e3": dict(
        seq_lens=[6, 10], block_size=4, spread=3, seed=3
    ),
    "queries in bfloat16 over an fp8 cache": dict(
        seq_lens=[9, 4], block_size=4, dtype=torch.bfloat16, seed=4
    ),
    "rooms of one bed, head_dim 24, 3 query heads per KV head, key cards stored column by column": dict(
        seq_lens=[3, 5], block_size=1, q_heads=6, kv_heads=2, head_dim=24, fmt="int8",
        transposed=True, seed=5,
    ),
}  # fmt: skip

for _what, _case in CASES.items():
    _spare = {"garbage": SPARE_ROOM, **_case}  # padding entries name a real room
    dequant_ex.check(_what)(functools.partial(expect_dequantized, what=_what, case=_spare))


@dequant_ex.check("the beds and labels no guest holds are never read (NaN there)")
def _garbage(fn):
    what = "seq_lens [5, 11], rooms of 4: NaN in the beds past seq_len, and in their labels"
    clean = {"garbage": NAN_ROOM, **GARBAGE}
    expect_dequantized(fn, what, {**clean, "nan_beds": True}, clean=clean)


@dequant_ex.check("V's labels laid out apart from K's: each read with its own strides")
def _apart(fn):
    what = "seq_lens [6, 3], rooms of 4, 2 KV heads: v_scales' rows 37 values apart, k_scales' 32"
    case = dict(seq_lens=[6, 3], block_size=4, q_heads=4, kv_heads=2, head_dim=32, seed=7)
    expect_dequantized(fn, what, {"garbage": SPARE_ROOM, **case}, rows={"v_scales": 37})
