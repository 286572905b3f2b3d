"""11.latent: decode attention over an MLA latent cache with the up-projections absorbed,
``mla_decode(q_nope, q_pe, latent, w_uk, w_uv) -> [heads, v_dim]`` for one guest, checked
against the expanded per-head K/V (:func:`kvlab.ops.mla.mla_decode_expanded`) in fp32 and bf16.

A case (:func:`kvlab.ops.mla.make_mla_case`) is one guest's compressed suitcases (``latent
[tokens, rank + rope]``: the latent, then the rotated key part) and one query. A wrong answer is
named when one usual slip answers as the learner's code does (:data:`SLIPS`: the softmax scale
of the nope dims only, of the latent's width, of the rank, or none; the rope part dropped, or read
from the front of the suitcase; ``W_UK`` transposed; ``W_UV`` transposed, or ``W_UK`` for the
values; the softmax over the heads), told apart on probes where they differ; each slip's answer
is kvlab's steps (:mod:`kvlab.ops.mla`) with that one decision changed.
"""

from __future__ import annotations

import functools

import torch

from kvlab.grading.expect import (
    CheckFailed,
    call_without_mutation,
    expect_tensor_like,
    furthest,
    preview,
)
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import changed, matching, only, quietly, told_apart
from kvlab.ops import mla
from kvlab.ops.testing import TOLERANCE

latent_ex = exercise("11.latent", "latent attention (MLA): W_UK into the query, W_UV after the sum")
OWN = ("mla_decode_absorbed", "mla_decode_expanded", "paged_mla_decode", "expand_kv")
OWN += ("absorb_query", "up_project", "default_scale")
own_answers("11.latent", *(f"kvlab.ops.mla:{name}" for name in OWN))
GUARD = tuple(getattr(mla, name) for name in OWN)
TASK = "attending over the latent with the up-projections absorbed"
INPUTS = ("q_nope", "q_pe", "latent", "w_uk", "w_uv")  # mla_decode's arguments, in order

# --- hints ---------------------------------------------------------------------------------------

SCALE_NOPE = (
    "the scores were scaled by 1/sqrt(nope): the rotated part counts too. A head's expanded key "
    "has nope + rope dims (128 + 64 = 192 for DeepSeek-V3), so the scale is "
    "1/sqrt(q_nope.shape[-1] + q_pe.shape[-1])"
)
SCALE_LATENT = (
    "the scores were scaled by the latent's width (1/sqrt(kv_lora_rank + rope), or of the rank): "
    "absorbing W_UK changes where the dot product runs, not the attention it computes; the scale "
    "stays the expanded key's, 1/sqrt(nope + rope)"
)
NO_SCALE = "no softmax scale: multiply the scores by 1/sqrt(nope + rope)"
SCALE_INVERTED = (
    "the scores were multiplied by sqrt(nope + rope): the softmax scale divides by it, "
    "scores * (1 / sqrt(nope + rope))"
)
ROPE_UNSCALED = (
    "only the latent part of the score was scaled: the scale multiplies the whole score, "
    "(q_lat . c + q_pe . k_pe) / sqrt(nope + rope), the rotated part too"
)
NO_ROPE = (
    "the rope part was left out of the scores: each head's score is q_lat . c plus q_pe . k_pe, "
    "where k_pe is the last rope elements of each cached vector (shared by every head)"
)
ROPE_FIRST = (
    "the suitcase was unpacked from the wrong end: each cached vector is the latent c (its first "
    "kv_lora_rank elements) followed by k_pe (the last rope elements)"
)
UK_TRANSPOSED = (
    "W_UK was applied the wrong way round: the absorbed query is W_UK[h]^T q_nope[h], "
    "q_lat[h, r] = sum_n q_nope[h, n] w_uk[h, n, r] (w_uk is [heads, nope, rank]), so that "
    "q_lat . c = q_nope . (W_UK c)"
)
UV_TRANSPOSED = (
    "W_UV was applied the wrong way round: a head's value is W_UV[h] o_lat[h], "
    "out[h, v] = sum_r w_uv[h, v, r] o_lat[h, r] (w_uv is [heads, v_dim, rank])"
)
UK_FOR_VALUES = (
    "the values came out of W_UK: W_UK belongs to the keys (absorbed into the query), W_UV to the "
    "values (applied to the softmax-weighted latent)"
)
SOFTMAX_OVER_HEADS = (
    "the softmax ran over the heads: each head normalises its scores across the tokens (the last "
    "axis of [heads, tokens])"
)
OVERFLOW = (
    "exp overflowed: a score above about 88 makes exp(score) inf in float32, and inf / inf is "
    "NaN. Subtract each head's largest score before exp (scores - scores.amax(-1, keepdim=True)), "
    "as torch.softmax does: the weights stay the same"
)
LATENT_OUT = (
    "the answer is the weighted latent, [heads, kv_lora_rank]: turn it into each head's value "
    "with W_UV, out[h] = W_UV[h] o_lat[h], [heads, v_dim]"
)
DTYPE = "compute in fp32, then return the output in q_nope's dtype: .to(q_nope.dtype)"
LOW_PRECISION = (
    "right in float32, wrong in bfloat16: compute the scores, the softmax and the sums in "
    "float32 (.float() the inputs), then return the result in q_nope's dtype"
)


# --- what the slips compute: kvlab's steps with one decision changed -----------------------------


def absorbed(*case, scale=None, rope=True, rope_first=False, rope_scaled=True, uk=None, uv=None,
             over=-1):  # fmt: skip
    """The absorbed attention on ``case`` built from :mod:`kvlab.ops.mla`'s steps, fp32, with one
    decision changed: ``scale(nope, rope, rank)``, the rope part (dropped, read from the front, or left out of the
    scale), the weight that makes the query (``uk``) or the values (``uv``) of ``(w_uk, w_uv)``,
    the softmax's axis. None where the change does not fit the case's shapes."""
    q_nope, q_pe, latent, w_uk, w_uv = (t.float() for t in case)
    rank, width = w_uk.shape[2], latent.shape[1]
    if rope_first:
        k_pe, c = latent[:, : width - rank], latent[:, width - rank :]
    else:
        c, k_pe = mla.split_latent(latent, rank)
    w_q = w_uk if uk is None else uk(w_uk, w_uv)
    w_v = w_uv if uv is None else uv(w_uk, w_uv)
    if w_q.shape != w_uk.shape or w_v.shape[0::2] != w_uv.shape[0::2]:
        return None
    dims = q_nope.shape[1], q_pe.shape[1], rank
    scale = mla.default_scale(q_nope, q_pe) if scale is None else scale(*dims)
    scores = mla.absorb_query(q_nope, w_q) @ c.T * scale
    if rope:
        scores = scores + q_pe @ k_pe.T * (scale if rope_scaled else 1.0)
    o_lat = scores.softmax(dim=over) @ c
    return mla.up_project(o_lat, w_v)


_slip = functools.partial(changed, absorbed)  # kvlab's steps with one decision changed
SLIPS = (
    _slip(SCALE_NOPE, scale=lambda nope, rope, rank: nope**-0.5),
    _slip(SCALE_LATENT, scale=lambda nope, rope, rank: (rank + rope) ** -0.5),
    _slip(SCALE_LATENT, scale=lambda nope, rope, rank: rank**-0.5),
    _slip(NO_SCALE, scale=lambda *dims: 1.0),
    _slip(SCALE_INVERTED, scale=lambda nope, rope, rank: (nope + rope) ** 0.5),
    _slip(NO_ROPE, rope=False),
    _slip(ROPE_UNSCALED, rope_scaled=False),
    _slip(ROPE_FIRST, rope_first=True),
    _slip(UK_TRANSPOSED, uk=lambda uk, uv: uk.transpose(1, 2)),
    _slip(UV_TRANSPOSED, uv=lambda uk, uv: uv.transpose(1, 2)),
    _slip(UK_FOR_VALUES, uv=lambda uk, uv: uk),
    _slip(SOFTMAX_OVER_HEADS, over=0),
    # no up-projection: the weighted latent returned as it is (an identity W_UV per head)
    _slip(LATENT_OUT, uv=lambda uk, uv: torch.eye(uv.shape[2]).expand(uv.shape[0], -1, -1)),
)

# (what the learner reads, make_mla_case's arguments), in the order of the checks; the first is
# square (rank = nope = v_dim), where a transposed W_UK or W_UV runs and must be told
CASES = {
    "rank = nope = v_dim = 16 (a square W_UK and W_UV), 6 tokens":
        dict(num_tokens=6, heads=4, nope=16, rope=8, rank=16, v_dim=16, seed=1),
    "one token (its softmax weight is 1: the answer is W_UV c)": dict(num_tokens=1, seed=2),
    "9 tokens, 3 heads, nope 12, rope 6, rank 40, v_dim 20":
        dict(num_tokens=9, heads=3, nope=12, rope=6, rank=40, v_dim=20, seed=3),
    "DeepSeek-V3's head sizes (nope 128, rope 64, rank 512, v_dim 128), 2 heads, 11 tokens":
        dict(num_tokens=11, heads=2, nope=128, rope=64, rank=512, v_dim=128, seed=4),
    "DeepSeek-V3's head sizes in bfloat16: the answer in q_nope's dtype":
        dict(num_tokens=11, heads=2, nope=128, rope=64, rank=512, v_dim=128, seed=5,
             dtype=torch.bfloat16),
    "bfloat16, 64 tokens, sharp queries (scores in the hundreds): the sums in fp32":
        dict(num_tokens=64, heads=4, nope=32, rope=16, rank=64, v_dim=32, seed=6,
             dtype=torch.bfloat16, sharpness=12.0),
    "float32, 16 tokens, sharper still (scores above 88, where exp overflows): a stable softmax":
        dict(num_tokens=16, heads=4, nope=32, rope=16, rank=64, v_dim=32, seed=9, sharpness=40.0),
}  # fmt: skip
# where the slips that answer alike on a case differ: non-square (scale by nope vs by rank),
# square (a transposed weight runs)
PROBES = (
    mla.make_mla_case(num_tokens=5, heads=3, nope=12, rope=4, rank=28, v_dim=20, seed=7),
    mla.make_mla_case(num_tokens=5, heads=3, nope=20, rope=4, rank=20, v_dim=20, seed=8),
)


def _close(a, b, dtype=torch.float32) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return False
    atol, rtol = TOLERANCE[dtype]
    return torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol)


def _run(fn, case):
    """``fn`` on copies of the case's tensors; one changed in place fails (the caller's q, or
    its cache, would be changed)."""
    with refuse_reference(*GUARD, learner=fn, task=TASK):
        return call_without_mutation(fn, *(t.clone() for t in case), names=INPUTS)


def _overflowed(fn, case, got) -> bool:
    """Whether ``got`` is not finite while ``fn`` is right on the same case with its queries
    shrunk to scores far below exp's overflow: a softmax without its max subtracted."""
    if torch.isfinite(got).all():
        return False
    tame = (case[0] / 64, case[1] / 64, *case[2:])
    return _close(quietly(lambda: _run(fn, tame)), mla.mla_decode_expanded(*tame), case[0].dtype)


def diagnose(fn, case, got) -> str | None:
    """The hint of the one slip that answers as ``fn`` on ``case`` (the slips computed in fp32,
    compared at the case's tolerance) and on the probes, else of an overflowed exp, else of
    arithmetic in low precision (``fn`` right on the case in fp32), else None."""
    if _overflowed(fn, case, got):
        return OVERFLOW
    dtype = case[0].dtype
    case32 = tuple(t.float() for t in case)
    right = mla.mla_decode_expanded(*case32)
    found = matching(SLIPS, got, case32, right, lambda a, b: _close(a, b, dtype))
    found = told_apart(found, fn, PROBES, mla.mla_decode_expanded, _close, readable=torch.is_tensor)
    hint = getattr(only(found), "hint", None)
    if hint is None and dtype != torch.float32 and _close(quietly(lambda: _run(fn, case32)), right):
        return LOW_PRECISION  # right in fp32: the sums in bf16
    return hint


def expect_latent(fn, what: str, case_args: dict) -> None:
    case = mla.make_mla_case(**case_args)
    want = mla.mla_decode_expanded(*case)
    replay = f"kvlab.ops.mla.make_mla_case(**{case_args})"
    got = _run(fn, case)
    rank, v_dim = case[3].shape[2], case[4].shape[1]
    latent_out = getattr(got, "shape", None) == (case[0].shape[0], rank) and rank != v_dim
    expect_tensor_like(
        got,
        want,
        "the output",
        input=what,
        axes="heads, v_dim",
        shape_hint=LATENT_OUT if latent_out else None,
        dtype_hint=DTYPE,
        replay=replay,
        dtype_of="q_nope",
    )
    if _close(got, want, want.dtype):
        return
    (head,), error = furthest(got, want)
    raise CheckFailed(
        f"head {head} differs from the expanded per-head K/V ({error})",
        input=what,
        expected=preview(want[head].float()),
        got=preview(got[head].float()),
        hint=diagnose(fn, case, got),
        replay=replay,
    )


for _what, _case in CASES.items():
    latent_ex.check(_what)(functools.partial(expect_latent, what=_what, case_args=_case))
