"""11.quantize: half-size beds with a label for the scale, ``quantize(x, fmt, scale=None) ->
(values, scales)``: K or V ``[tokens, kv_heads, head_dim]`` stored in 8 bits (``"fp8_e4m3"``:
``torch.float8_e4m3fn``; ``"int8"``) with one fp32 scale per token and KV head, ``x ≈ values *
scales[..., None]``; a given ``scale`` (a per-tensor one) is used instead, and what lies beyond it
saturates at the format's largest value. Judged against :mod:`kvlab.ops.quant`.

An answer passes when it has the shapes and dtypes asked, every scale is positive and finite,
each element comes back within the format's rounding (:func:`kvlab.ops.quant.error_bound`: half a
step in int8; 1/16 of the element in fp8), and the largest element of each vector lands on the
format's largest value (the whole range is used). A wrong answer is named when one usual slip
(:data:`SLIPS`, kvlab's steps with one decision changed) answers as the learner's code does.
"""

from __future__ import annotations

import functools

import torch

from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.own_code import call_own
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip, matching, only
from kvlab.ops import quant

quantize_ex = exercise("11.quantize", "quantised K/V: 8-bit values, a scale per token and head")
OWN = ("quantize", "dequantize", "to_format", "scales_for", "vector_amax", "quantize_cache")
own_answers("11.quantize", *(f"kvlab.ops.quant:{name}" for name in OWN))
GUARD = tuple(getattr(quant, name) for name in OWN)
TASK = "quantising K and V with their scales"

# --- hints ---------------------------------------------------------------------------------------

PER_TENSOR = (
    "one scale for the whole tensor: each vector (a token's K or V of one KV head, the last "
    "axis) gets its own, from its own largest magnitude: x.abs().amax(dim=-1) / the format's max, "
    "scales of shape x.shape[:-1]"
)
PER_TOKEN = (
    "one scale per token, over all its KV heads: each KV head's vector gets its own (the heads "
    "differ in size), from the largest magnitude over the last axis only, x.abs().amax(dim=-1), "
    "scales of shape x.shape[:-1]"
)
PER_HEAD = (
    "one scale per KV head, over all the tokens: each token's vector gets its own (a token "
    "written later must not change the scale of those stored), x.abs().amax(dim=-1), scales of "
    "shape x.shape[:-1]"
)
WRONG_AXIS = (
    "the largest magnitude was taken over the tokens: take it over each vector's elements, the "
    "last axis (head_dim), so that scales has shape x.shape[:-1] (tokens, kv_heads)"
)
KEEPDIM = (
    "scales kept the reduced axis ([..., 1]): return one scale per vector, shape x.shape[:-1] "
    "(amax(dim=-1) without keepdim), and broadcast it with scales[..., None] where you divide"
)
NO_ABS = (
    "the scale came from the largest element, not the largest magnitude: a vector's most "
    "negative element may be the biggest; use x.abs().amax(dim=-1)"
)
INVERTED = (
    "the scale is the other way round: store values = x / scale with scale = amax / max, so "
    "that values * scale gives x back (vLLM's k_scale convention), not max / amax"
)
OTHER_MAX = (
    "the largest value of the other format: fp8 e4m3 reaches 448 "
    "(torch.finfo(torch.float8_e4m3fn).max), int8 127; divide amax by the format's own"
)
NO_CLAMP = (
    "past the given scale, int8 wrapped around (128 became -128): clamp x / scale to "
    "[-max, max] before the cast, so what lies beyond saturates"
)
TRUNCATED = (
    "int8 values were truncated, not rounded: .to(torch.int8) cuts toward zero, a whole step "
    "off at worst; round first (torch.round), then cast"
)
ZERO_DIVIDE = (
    "an all-zero vector got scale 0, and 0 / 0 is NaN: give a vector whose largest magnitude is "
    "0 a positive scale (1, say: any scale stores zeros), e.g. torch.where(amax > 0, amax / max, "
    "1.0)"
)
GIVEN_IGNORED = (
    "the given scale was not used: each vector got a scale of its own. With scale given (one "
    "per tensor, as vLLM's plain fp8 keeps), every vector's scale is that number, scales = "
    "torch.full(x.shape[:-1], scale), and what lies beyond max x scale saturates"
)
SCALES_FP32 = (
    "keep the scales in float32 (a scale in bf16 loses 3 digits): .float() before dividing"
)


# --- what the slips compute: kvlab's steps with one decision changed -----------------------------


# the vectors one scale is taken over, by ``per``: each vector; the whole tensor; a token's
# vectors over its KV heads; a KV head's vectors over the tokens
_OVER = {
    "vector": lambda x: x,
    "tensor": lambda x: x.reshape(1, -1),
    "tensor, expanded": lambda x: x.reshape(1, -1),
    "token": lambda x: x.flatten(-2)[..., None, :],
    "head": lambda x: x.movedim(-2, 0).reshape(x.shape[-2], -1),
}


def slipped(x, fmt, scale=None, *, per="vector", signed=False, invert=False, fmt_max=None,
            clamp=True, rounding="nearest", guard=True):  # fmt: skip
    """kvlab's quantize with one decision changed: the vectors a scale is taken over (``per``,
    see :data:`_OVER`; ``"tensor"`` returned as a 0-d tensor, the others one per vector), the
    largest element rather than magnitude (``signed``), the scale inverted (values still x /
    (amax / max)), the other format's max, no clamp, truncation, no guard for a zero vector."""
    fmt = quant.quant_format(fmt)
    if scale is not None:
        s = torch.as_tensor(scale, dtype=torch.float32).expand(x.shape[:-1]).clone()
        return quant.to_format(x, s, fmt, clamp=clamp, rounding=rounding), s
    over = _OVER[per](x)
    amax = over.float().amax(dim=-1) if signed else quant.vector_amax(over)
    if per.startswith("tensor"):
        amax = amax[0]
    limit = quant.quant_format(fmt if fmt_max is None else fmt_max)
    s = quant.scales_for(amax, limit) if guard else amax / limit.max
    values = quant.to_format(x, s.expand(x.shape[:-1]), fmt, clamp=clamp, rounding=rounding)
    if per != "tensor":
        s = s.expand(x.shape[:-1]).clone()
    return values, (1 / s if invert else s)


SLIPS = (
    Slip(PER_TENSOR, lambda x, f, s=None: slipped(x, f, s, per="tensor")),
    Slip(PER_TENSOR, lambda x, f, s=None: slipped(x, f, s, per="tensor, expanded")),
    Slip(PER_TOKEN, lambda x, f, s=None: slipped(x, f, s, per="token")),
    Slip(PER_HEAD, lambda x, f, s=None: slipped(x, f, s, per="head")),
    Slip(NO_ABS, lambda x, f, s=None: slipped(x, f, s, signed=True)),
    Slip(INVERTED, lambda x, f, s=None: slipped(x, f, s, invert=True)),
    Slip(OTHER_MAX, lambda x, f, s=None: slipped(x, f, s, fmt_max=quant.quant_format(f).other)),
    Slip(NO_CLAMP, lambda x, f, s=None: slipped(x, f, s, clamp=False)),
    Slip(TRUNCATED, lambda x, f, s=None: slipped(x, f, s, rounding="toward zero")),
    Slip(ZERO_DIVIDE, lambda x, f, s=None: slipped(x, f, s, guard=False)),
    Slip(GIVEN_IGNORED, lambda x, f, s=None: slipped(x, f)),
)


def _same(a, b) -> bool:
    """Two answers alike: the same shapes, the same values but for 1% of them (a tie rounded
    the other way), the same scales (NaN where both have NaN)."""
    pairs = isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2
    if not pairs or not all(isinstance(t, torch.Tensor) for t in (*a, *b)):
        return False
    (va, sa), (vb, sb) = a, b
    if va.shape != vb.shape or sa.shape != sb.shape:
        return False
    va, vb = va.float(), vb.float()
    differ = ~((va == vb) | (va.isnan() & vb.isnan()))
    scales = torch.allclose(sa.float(), sb.float(), rtol=1e-5, atol=0, equal_nan=True)
    return scales and differ.float().mean().item() <= 0.01


# --- the cases ------------------------------------------------------------------------------------


def make_vectors(tokens=5, kv_heads=2, head_dim=16, seed=0, spread=0, dtype=torch.float32,
                 zero=None, nan=None, rooms=None):  # fmt: skip
    """K or V ``[tokens, kv_heads, head_dim]``, seeded; ``spread`` k: each vector's magnitude
    10**-k .. 10**k; ``zero``/``nan``: (token, head) of a vector of zeros / with a NaN;
    ``rooms``: the tokens as a cache of that many rooms, ``[rooms, beds, kv_heads, head_dim]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, kv_heads, head_dim, generator=g)
    if spread:
        x = x * 10.0 ** torch.randint(-spread, spread + 1, (tokens, kv_heads, 1), generator=g)
    if zero is not None:
        x[zero] = 0.0
    if nan is not None:
        x[nan][head_dim // 3] = float("nan")
    if rooms is not None:
        x = x.reshape(rooms, tokens // rooms, kv_heads, head_dim)
    return x.to(dtype)


def _describe(x, fmt, scale, args) -> str:
    spread, zero, nan = (args.get(key) for key in ("spread", "zero", "nan"))
    extra = [f"magnitudes 1e-{spread} .. 1e{spread}"] if spread else []
    extra += [f"x[{zero[0]}, {zero[1]}] all zeros"] if zero is not None else []
    extra += [f"a NaN in x[{nan[0]}, {nan[1]}]"] if nan is not None else []
    kind = "" if x.dtype == torch.float32 else f" {x.dtype}"
    more = f" ({', '.join(extra)})" if extra else ""
    given = "" if scale is None else f", scale={scale} given"
    return f"quantize(x{kind} of shape {tuple(x.shape)}{more}, {fmt!r}{given})"


def _judge(x, fmt, scale, got):
    """(message, expected, got, hint) of what is wrong with ``got``, else None. The vectors
    holding a NaN are not judged (nothing can be asked of them)."""
    fmt = quant.quant_format(fmt)
    if not (isinstance(got, tuple | list) and len(got) == 2):
        return "quantize returns (values, scales)", "a tuple of 2 tensors", short(got), None
    values, scales = got
    if not isinstance(values, torch.Tensor) or not isinstance(scales, torch.Tensor):
        return "values and scales are tensors", "(Tensor, Tensor)", short(got), None
    if values.dtype != fmt.dtype or values.shape != x.shape:
        want, shown = f"{tuple(x.shape)}, {fmt.dtype}", f"{tuple(values.shape)}, {values.dtype}"
        return "values are x's shape in the format's dtype", want, shown, None
    if scales.shape != x.shape[:-1]:
        shapes = ((x.shape[1:], WRONG_AXIS), ((*x.shape[:-1], 1), KEEPDIM),
                  (x.shape[:-2], PER_TOKEN), (x.shape[-2:-1], PER_HEAD))  # fmt: skip
        named = {h for shape, h in shapes if tuple(scales.shape) == tuple(shape)}
        want, shown = str(tuple(x.shape[:-1])), str(tuple(scales.shape))
        hint = named.pop() if len(named) == 1 else None
        return "one scale per vector: scales has shape x.shape[:-1]", want, shown, hint
    if scales.dtype != torch.float32:
        return "scales are float32", "torch.float32", str(scales.dtype), SCALES_FP32
    judged = ~x.float().isnan().any(dim=-1)
    s = scales.float()[judged]
    if not bool((s > 0).all() & s.isfinite().all()):
        bad = s[~((s > 0) & s.isfinite())][0].item()
        return "every scale is positive and finite", "scale > 0", f"a scale of {bad}", None
    if scale is not None and not torch.allclose(s, torch.full_like(s, scale), rtol=1e-6, atol=0):
        bad = s[(s - scale).abs() > 1e-6 * scale][0].item()
        return "a given scale is every vector's scale", f"{scale:g} for each", f"{bad:.4g}", None
    xs = x.float()[judged]
    if scale is not None:  # saturated: the round trip gives back x clamped to the scale's range
        xs = torch.maximum(torch.minimum(xs, fmt.max * s[:, None]), -fmt.max * s[:, None])
    back = values.float()[judged] * s[:, None]
    bound = quant.error_bound(xs, s, fmt)
    off = ((back - xs).abs() > bound) | back.isnan()
    if off.any():
        i = int(off.any(dim=-1).nonzero()[0])
        j, at = int(off[i].nonzero()[0]), ", ".join(map(str, judged.nonzero()[i].tolist()))
        want = f"x[{at}, {j}] = {xs[i, j]:.4g} back, within ±{bound[i, j]:.3g}"
        shown = f"{back[i, j]:.4g} (values[{at}, {j}] * scales[{at}])"
        return "values * scales do not give x back within the format's rounding", want, shown, None
    top = values.float()[judged].abs().amax(dim=-1)
    used = (xs.abs().amax(dim=-1) == 0) | (top == fmt.max)
    if scale is None and not bool(used.all()):
        i = int((~used).nonzero()[0])
        message = f"the largest element of each vector is stored as ±{fmt.max:g} (the whole range)"
        return message, f"{fmt.max:g}", f"{top[i].item():g}", None
    return None


def expect_quantized(fn, cases) -> None:
    """The learner's quantize on each case: (fmt, scale, make_vectors' arguments)."""
    for fmt, scale, args in cases:
        x = make_vectors(**args)
        where = _describe(x, fmt, scale, args)
        extra = () if scale is None else (scale,)
        got, error = call_own(fn, x.clone(), fmt, *extra, guard=GUARD, task=TASK, where=where)
        if error is not None:
            raise error
        wrong = _judge(x, fmt, scale, got)
        if wrong is None:
            continue
        message, expected, shown, hint = wrong
        if hint is None and isinstance(got, tuple | list):
            right = quant.quantize(x, fmt, scale)
            found = matching(SLIPS, tuple(got), (x, fmt, *extra), right, _same)
            hint = getattr(only(found), "hint", None)
        raise CheckFailed(
            message,
            input=where,
            expected=expected,
            got=shown,
            hint=hint,
            replay=f"kvlab.grading.lab11.quantize.make_vectors(**{args})",
        )


# (what the learner reads, [(fmt, scale, make_vectors' arguments)]), in the order of the checks
CHECKS = {
    "fp8 e4m3: values in torch.float8_e4m3fn, one fp32 scale per token and KV head":
        [("fp8_e4m3", None, dict(seed=1))],
    "int8: values rounded to the nearest step": [("int8", None, dict(seed=2))],
    "vectors of every size (1e-3 .. 1e3): each uses the format's whole range":
        [("fp8_e4m3", None, dict(tokens=8, kv_heads=3, head_dim=24, seed=3, spread=3)),
         ("int8", None, dict(tokens=8, kv_heads=3, head_dim=24, seed=4, spread=3))],
    "K and V in bfloat16, as a model caches them":
        [("fp8_e4m3", None, dict(seed=5, dtype=torch.bfloat16)),
         ("int8", None, dict(seed=6, dtype=torch.bfloat16, head_dim=40))],
    "an all-zero vector: a positive scale, zeros back, no division by zero":
        [("fp8_e4m3", None, dict(seed=7, zero=(2, 1))), ("int8", None, dict(seed=8, zero=(0, 0)))],
    "a given scale (one per tensor): what lies beyond it saturates at ±max":
        [("int8", 0.01, dict(seed=9, head_dim=12)), ("fp8_e4m3", 0.002, dict(seed=10, head_dim=12))],
    "a NaN in one token's vector spoils that vector only: each scale reads its own":
        [("fp8_e4m3", None, dict(seed=11, nan=(3, 0))), ("int8", None, dict(seed=12, nan=(1, 1)))],
    "a whole cache [rooms, beds, kv_heads, head_dim], one KV head too: a scale per vector of the "
    "last axis, whatever the axes before it":
        [("fp8_e4m3", None, dict(tokens=12, kv_heads=2, head_dim=8, seed=15, spread=2, rooms=3)),
         ("int8", 0.01, dict(tokens=8, kv_heads=1, head_dim=8, seed=16, rooms=2))],
    "300 random vectors in both formats":
        [("fp8_e4m3", None, dict(tokens=50, kv_heads=3, head_dim=20, seed=13, spread=2)),
         ("int8", None, dict(tokens=50, kv_heads=3, head_dim=20, seed=14, spread=2))],
}  # fmt: skip

for _name, _cases in CHECKS.items():
    quantize_ex.check(_name)(functools.partial(expect_quantized, cases=_cases))
