"""Checks for Lab 00: KV bytes per token, and one cached decode step.

Each wrong answer is compared with what the usual slips, kvlab's own answer with one decision
changed, would have produced (KiB for bytes, query heads for KV heads, a fixed 2 bytes per
element, a softmax over the heads, d_model // num_heads for head_dim, nn.Linear's ``x @ W.T``,
…): a hint only when one slip, and only one, explains it. A shape error is named when the step
runs right on a layer without the trouble, so knock-on failures of one mistake fold into it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import random

import torch

from kvlab.grading import expect, slips
from kvlab.grading.attention_twins import decode_attention_over_heads
from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import CheckFailed, call_without_mutation, expect_type, plural
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.models import LLAMA_3_8B, LLAMA_3_70B, OPT_13B, ModelSpec
from kvlab.ops.attention import TinyAttention, causal_attention, decode_attention

RETURNED_NONE = "your function returned None: end it with `return ...`"

# --- KV bytes per token ----------------------------------------------------------------------

kv_bytes = exercise("00.kv_bytes", "KV bytes per token")


def _describe(spec: ModelSpec) -> str:
    return (
        f"{spec.name}: {plural(spec.num_layers, 'layer')}, "
        f"{plural(spec.num_q_heads, 'query head')}, {plural(spec.num_kv_heads, 'KV head')}, "
        f"head_dim {spec.head_dim}, {plural(spec.dtype_bytes, 'byte')}/element"
    )


def _kv_bytes(spec: ModelSpec, unit: float = 1, **changed) -> float:
    """kvlab's count for ``spec`` with the fields ``changed``, in units of ``unit`` bytes."""
    return dataclasses.replace(spec, **changed).kv_bytes_per_token / unit


# the usual slips: kvlab's count in another unit, or of the spec with one field changed
KV_SLIPS = (
    Slip("that is KiB (bytes / 1024): return bytes", lambda s: _kv_bytes(s, 1024)),
    Slip("that is kB (bytes / 1000): return bytes", lambda s: _kv_bytes(s, 1000)),
    Slip("that is MiB (bytes / 2**20): return bytes", lambda s: _kv_bytes(s, 2**20)),
    Slip("that is bits (bytes × 8): return bytes", lambda s: _kv_bytes(s, 1 / 8)),
    Slip(
        "each token stores a key AND a value vector: multiply by 2 (K and V)",
        lambda s: _kv_bytes(s, 2),
    ),
    Slip(
        "query heads are not cached: use spec.num_kv_heads (grouped-query attention)",
        lambda s: _kv_bytes(s, num_kv_heads=s.num_q_heads),
    ),
    Slip(
        "each element takes spec.dtype_bytes bytes: multiply by it",
        lambda s: _kv_bytes(s, dtype_bytes=1),
    ),
    Slip(
        "the element size is spec.dtype_bytes, not always 2 (fp16's): multiply by "
        "spec.dtype_bytes instead of a fixed 2",
        lambda s: _kv_bytes(s, dtype_bytes=2),
    ),
    Slip(
        "every layer keeps its own keys and values: multiply by spec.num_layers",
        lambda s: _kv_bytes(s, num_layers=1),
    ),
)
# a shape on which every slip gives a different number, to tell apart slips that coincide: its
# 8-byte elements (fp64) keep "no K and V" (÷ 2), "a fixed 2 bytes" (÷ 4) and "no element size"
# (÷ 8) apart, which fp32's 4 bytes would not (ModelSpec takes any positive dtype_bytes)
PROBE = ModelSpec(
    "probe", num_layers=3, num_q_heads=10, num_kv_heads=5, head_dim=700, dtype_bytes=8
)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _same_number(got, value) -> bool:
    """``got`` is ``value``, or ``value`` cut to an int (``//`` or ``int()`` or ``round()``)."""
    return math.isclose(got, value, rel_tol=1e-9) or got in (math.floor(value), round(value))


def diagnose_kv_bytes(fn, spec: ModelSpec, got) -> str | None:
    """The one slip that explains ``got`` for ``spec`` (confirmed on :data:`PROBE`), else None."""
    found = slips.matching(KV_SLIPS, got, (spec,), _kv_bytes(spec), _same_number)
    found = slips.told_apart(
        found, fn, [(PROBE,)], _kv_bytes, _same_number, always=True, readable=_is_number
    )
    return slips.hint(slips.only(found))


def _expect_bytes(fn, spec: ModelSpec):
    with refuse_reference(
        ModelSpec.kv_bytes_per_token, ModelSpec.kv_bytes, learner=fn, task="computing the bytes"
    ):
        got = call_without_mutation(fn, spec, names=("spec",))
    right, where, number = spec.kv_bytes_per_token, _describe(spec), _is_number(got)
    if got is None:
        raise CheckFailed("no byte count came back", input=where, got="None", hint=RETURNED_NONE)
    if number and got == right:  # only its type can be wrong
        hint = "the count is right but not an int: build it with `*` only, or wrap it in int()"
        return expect_type(got, int, "the byte count", input=where, hint=hint)
    if not number:  # a bool, a text, ...: never an int
        text = isinstance(got, str) and got.strip().replace(",", "") == str(right)
        hint = "return the number itself, not its text (no str() or f-string)" if text else None
        expect_type(got, int, "the byte count", input=where, hint=hint)
    shown = f"{got:,}" if math.isfinite(got) else expect.short(got)
    hint = diagnose_kv_bytes(fn, spec, got)
    raise CheckFailed("wrong byte count", input=where, expected=f"{right:,}", got=shown, hint=hint)


def _bytes_check(name: str, *specs: ModelSpec) -> None:
    @kv_bytes.check(name)
    def _(fn):
        for spec in specs:
            _expect_bytes(fn, spec)


def _random_specs(seed: int = 0) -> list[ModelSpec]:
    rng, specs = random.Random(seed), []
    for i in range(20):
        kv, layers = rng.choice([1, 2, 3, 5, 8]), rng.randint(1, 96)  # drawn in this order
        q, head_dim = kv * rng.choice([1, 2, 4, 7]), rng.choice([1, 48, 64, 80, 96, 112, 128, 256])
        specs.append(ModelSpec(f"random-{i}", layers, q, kv, head_dim, rng.choice([1, 2, 4])))
    return specs


_bytes_check(
    "OPT-13B needs 819,200 bytes (800 KiB) per token: the PagedAttention paper's 800 KB", OPT_13B
)
_bytes_check(
    "grouped-query attention: Llama-3-8B caches only its 8 KV heads", LLAMA_3_8B, LLAMA_3_70B
)
_bytes_check(
    "the element size counts (fp32 = 4 bytes, fp8 = 1 byte)",
    *(ModelSpec("OPT-13B", 40, 40, 40, 128, dtype_bytes=size) for size in (4, 1)),
)
_bytes_check("the smallest model: 1 layer, 1 head, head_dim 1", ModelSpec("tiny", 1, 1, 1, 1))
_bytes_check("twenty random shapes (odd head sizes, GQA groups, fp8/fp16/fp32)", *_random_specs())

# --- one cached decode step ------------------------------------------------------------------

decode = exercise("00.decode_step", "one cached decode step")
TOL = dict(atol=1e-5, rtol=1e-4)
OUTPUTS = ("y_t", "k_cache", "v_cache")
REFERENCES = (TinyAttention.decode_step, TinyAttention.forward, decode_attention, causal_attention)
NO_GQA = (
    "grouped-query attention: layer.qkv gives k and v num_kv_heads heads, q num_heads. Before "
    "the scores, repeat each KV head for its group of num_heads // num_kv_heads query heads "
    "(`k_cache.repeat_interleave(group, dim=1)`, the same for v); the caches keep num_kv_heads"
)
NO_GQA_CAUSE = "kvlab: KV heads not expanded to query heads"
STEP_HINTS = {  # by slip, for ``step_slips``
    "no append": "the new token attends to itself too: append its k and v to the caches first, "
    "then attend over all of them",
    "softmax over heads": "softmax over the wrong axis: normalise each head's scores across the "
    "cached tokens (the token axis), not across the heads",
    "no scale": "scale the scores by 1/sqrt(head_dim)",
    "scale divided": "multiply the scores by 1/sqrt(head_dim), not by sqrt(head_dim)",
    "d_model scale": "scale by 1/sqrt(head_dim), the size of one head, not 1/sqrt(d_model)",
    "dims first": "join the heads in order: reshape the [num_heads, head_dim] output as it is "
    "(`o.reshape(-1)`: head 0's values, then head 1's, …); a transpose before the reshape "
    "interleaves the heads",
    "kv head modulo": "query head h reads KV head h // {group} (the group size), not h % "
    "{kv_heads}: use repeat_interleave, not repeat",
    "nn.Linear": "weights act on the right in this lab (x @ W): the output is `o @ layer.wo`; "
    "`o @ layer.wo.T` is nn.Linear's convention",
    "no wo": "project the heads' output back to d_model with `@ layer.wo`",
}
LINEAR_HINT, NO_WO = STEP_HINTS["nn.Linear"], STEP_HINTS["no wo"]


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.to(b), b, **TOL)


def step_with(
    layer, x_t, k, v, *, append=True, scale=None, over_heads=False, modulo=False, dims_first=False
):
    """kvlab's decode attention over the caches ``k`` and ``v`` (the heads' joined output, before
    ``wo``), or with one usual slip: ``append=False`` attends without the new token,
    ``over_heads`` normalises over the heads, ``modulo`` maps query head h to KV head h %
    kv_heads (``repeat`` for ``repeat_interleave``), ``dims_first`` joins the heads from
    ``[head_dim, num_heads]`` (a transpose before the reshape)."""
    q, k_t, v_t = layer.qkv(x_t.unsqueeze(0))
    if append:
        k, v = torch.cat([k, k_t]), torch.cat([v, v_t])
    h, group = torch.arange(layer.num_heads), layer.num_heads // layer.num_kv_heads
    kv_of = h % layer.num_kv_heads if modulo else h // group
    attend = decode_attention_over_heads if over_heads else decode_attention
    out = attend(q[0], k[:, kv_of], v[:, kv_of], scale=scale)
    return (out.T if dims_first else out).reshape(-1)


def head_dim_hint(layer) -> str:
    """The hint for a step that takes one head's size to be d_model // num_heads."""
    return (
        f"one head is layer.head_dim = {layer.head_dim} wide, not d_model // num_heads = "
        f"{layer.d_model // layer.num_heads}: here {layer.num_heads} heads × {layer.head_dim} = "
        f"{layer.num_heads * layer.head_dim} ≠ d_model {layer.d_model}. Use layer.head_dim (and "
        "num_heads × head_dim for the joined heads)"
    )


def _output(layer, *inputs, wo=lambda w: w, **slip):
    """A slip's output: the heads ``step_with(**slip)`` computes, through ``wo(layer.wo)``
    (nn.Linear's ``wo.T``; ``wo=None``: not projected)."""
    heads = step_with(layer, *inputs, **slip)
    return heads if wo is None else heads @ wo(layer.wo)


def step_slips(layer) -> list[Slip]:
    """The usual slips of a decode step that this layer's shape can show."""
    d, width, heads, kv = layer.head_dim, layer.d_model, layer.num_heads, layer.num_kv_heads
    guessed = width // heads  # what d_model // num_heads takes head_dim for
    square = tuple(layer.wo.shape) == (width, width)
    rows = (
        ("no append", True, dict(append=False)),
        ("softmax over heads", True, dict(over_heads=True)),
        ("no scale", True, dict(scale=1.0)),
        ("scale divided", True, dict(scale=math.sqrt(d))),
        ("d_model scale", width != d, dict(scale=1 / math.sqrt(width))),
        (head_dim_hint(layer), guessed not in (0, d, width), dict(scale=(guessed or 1) ** -0.5)),
        ("dims first", heads > 1 and d > 1, dict(dims_first=True)),
        ("kv head modulo", 1 < kv < heads, dict(modulo=True)),
        ("nn.Linear", square, dict(wo=lambda w: w.T)),
        ("no wo", square, dict(wo=None)),
    )
    fill = dict(group=heads // kv, kv_heads=kv)
    return [
        Slip(STEP_HINTS.get(key, key).format(**fill), functools.partial(_output, **options))
        for key, shown, options in rows
        if shown
    ]


def diagnose_step(layer, x_t, k_cache, v_cache, y) -> str | None:
    """The one slip whose output matches ``y`` (and differs from the right one), else None."""
    args = (layer, x_t, k_cache, v_cache)
    right = step_with(*args) @ layer.wo
    return slips.hint(slips.only(slips.matching(step_slips(layer), y, args, right, _close)))


def _two_steps(fn, layer):
    """(x, the learner's first output, whether both are full recompute's) for two tokens x
    through ``layer`` from an empty cache."""
    x = torch.randn(2, layer.d_model, generator=torch.Generator().manual_seed(7))
    y_0, k_cache, v_cache = fn(layer, x[0], *layer.empty_cache())
    y_1, _, _ = fn(layer, x[1], k_cache, v_cache)
    return x, y_0, all(_close(y, r) for y, r in zip((y_0, y_1), layer.forward(x), strict=True))


def diagnose_error(fn, layer) -> tuple[str, str, str | None] | None:
    """(message, hint, cause; None: the hint) for a shape error the learner's step raised on
    ``layer``, when their step runs right on a layer without the trouble (a probe that raises
    tells nothing): KV heads not expanded for the query heads (a KV head per query head), one
    head's size taken for d_model // num_heads (heads that tile d_model), or nn.Linear's ``o @
    wo.T`` (a square ``wo``, where the step answers as that slip)."""
    heads, kv, d, width = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.d_model
    if kv < heads:
        plain = TinyAttention(width, heads, seed=11, head_dim=d)  # a KV head per query head
        probe = slips.quietly(lambda: _two_steps(fn, plain))
        if probe is not None and probe[2]:
            return (
                f"this layer has {plural(heads, 'query head')} and {plural(kv, 'KV head')}; "
                "your step runs when there are as many KV heads as query heads",
                NO_GQA,
                NO_GQA_CAUSE,
            )
    if heads * d != width:
        square = TinyAttention(heads * d, heads, kv, seed=11)
        probe = slips.quietly(lambda: _two_steps(fn, square))
        if probe is not None and probe[2]:
            message = f"{plural(heads, 'head')} of {d} make {heads * d} here, not d_model = {width}"
            return f"{message}; your step runs when they make d_model", head_dim_hint(layer), None
        y = None if probe is None else probe[1]
        if isinstance(y, torch.Tensor) and (
            diagnose_step(square, probe[0][0], *square.empty_cache(), y) == LINEAR_HINT
        ):
            return f"layer.wo is {heads * d} × {width} here, not square", LINEAR_HINT, None
    return None


def _shape_hint(layer, name: str, got: tuple, rows: int) -> str | None:
    """Name the usual shape slips: y_t with a token axis, not projected, or its heads not joined;
    a cache without the new row, with the query heads, its heads flattened, a batch axis (of two
    equal shapes the later one is named)."""
    kv, heads, d, width = layer.num_kv_heads, layer.num_heads, layer.head_dim, layer.d_model
    if name == "y_t":
        return {
            (heads, d): "join the heads (reshape to num_heads × head_dim), then project with "
            "`@ layer.wo`",
            (heads * d,): NO_WO,
            (1, width): "return y_t as [d_model]: drop the token axis (y[0] or y.reshape(-1))",
        }.get(got)
    return {
        (rows - 1, kv, d): "return the caches with the new token's row appended: one more row "
        "than came in",
        (rows, heads, d): "cache the num_kv_heads heads that layer.qkv returns, before repeating "
        "them for the query heads (grouped-query attention)",
        (rows, kv * d): "keep the cache's shape [tokens, num_kv_heads, head_dim]: do not flatten "
        "the heads",
        (1, rows, kv, d): "no batch axis: the cache is [tokens, num_kv_heads, head_dim]",
    }.get(got)


def _token_order(cache, reference) -> str:
    """Which token each row of ``cache`` holds ("?" for none), found by comparing rows."""
    order = [
        next((str(t) for t, r in enumerate(reference) if _close(row, r)), "?") for row in cache
    ]
    note = " (?: a row that is no token's)" if "?" in order else ""
    return f"[{', '.join(order)}]{note}"


def _expect_caches(fail, k_got, v_got, k_all, v_all):
    """Row t of each cache must hold token t's key (value). Knows a new row put in front and
    the two caches returned the other way round."""
    rows = len(k_got)
    for name, got, reference, other in (
        ("k_cache", k_got, k_all[:rows], v_all[:rows]),
        ("v_cache", v_got, v_all[:rows], k_all[:rows]),
    ):
        if _close(got, reference):
            continue
        hint = None
        if _close(got, other):
            hint = "k_cache and v_cache are swapped: return (y_t, k_cache, v_cache) in that order"
        elif rows > 1 and _close(got, torch.cat([reference[-1:], reference[:-1]])):
            hint = "row t must hold token t: add the new token's row at the end, not in front"
        raise fail(
            f"{name} does not hold every token's {'key' if name == 'k_cache' else 'value'} in order",
            expected=f"rows hold tokens {list(range(rows))}",
            got=f"rows hold tokens {_token_order(got, reference)}",
            hint=hint,
        )


def _run_decode(fn, layer: TinyAttention, steps: int, seed: int, build: str):
    """Feed ``steps`` tokens one at a time through the learner's step; compare each output with
    full recompute and each cache with every token's k and v so far."""
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(seed))
    expected, (_, k_all, v_all) = layer.forward(x), layer.qkv(x)
    replay = (
        f"layer = {build}; x = torch.randn({steps}, {layer.d_model}, generator="
        f"torch.Generator().manual_seed({seed})); feed x[0], x[1], … from layer.empty_cache()"
    )
    k_cache, v_cache, width = *layer.empty_cache(), layer.d_model
    for t in range(steps):
        where = f"step {t} of {steps}: {plural(t, 'token')} cached, token {t} comes in"
        fail = functools.partial(CheckFailed, input=where, replay=replay)
        try:
            with refuse_reference(*REFERENCES, learner=fn, task="writing the decode step"):
                names = ("layer", "x_t", "k_cache", "v_cache")
                result = call_without_mutation(fn, layer, x[t], k_cache, v_cache, names=names)
        except RuntimeError as error:  # torch's complaint about shapes that do not fit
            shapes = "size" in str(error) or "shape" in str(error)
            found = shapes and not isinstance(error, NotImplementedError)
            found = found and diagnose_error(fn, layer)
            if not found:
                raise
            message = "\n   ".join([*explain_exception(error), found[0]])
            raise fail(message, hint=found[1], cause=found[2]) from None
        if not isinstance(result, tuple) or len(result) != 3:
            hint = RETURNED_NONE if result is None else None
            if isinstance(result, list) and len(result) == 3:
                hint = "return the three values as a tuple: `return y_t, k_cache, v_cache`"
            what = "decode_step must return a tuple (y_t, k_cache, v_cache)"
            raise fail(what, got=expect.short(result), hint=hint)
        y, k_new, v_new = result
        cache = (t + 1, layer.num_kv_heads, layer.head_dim)
        for name, value, shape in zip(OUTPUTS, result, ((width,), cache, cache), strict=True):
            expect_type(value, torch.Tensor, name, input=where)
            if tuple(value.shape) != shape:
                got, what = tuple(value.shape), f"{name} has the wrong shape after step {t}"
                hint = _shape_hint(layer, name, got, t + 1)
                raise fail(what, expected=str(shape), got=str(got), hint=hint)
        if not _close(y, expected[t]):
            err = (y.to(expected.dtype) - expected[t]).abs().max().item()
            raise fail(
                f"output of step {t} differs from full recompute over {plural(t + 1, 'token')}",
                expected=expect.preview(expected[t]),
                got=f"{expect.preview(y)}, max abs error {err:.3g}",
                hint=diagnose_step(layer, x[t], k_cache, v_cache, y.to(expected.dtype)),
            )
        _expect_caches(fail, k_new, v_new, k_all, v_all)
        k_cache, v_cache = k_new, v_new


def _decode_check(name: str, steps: int, *args, **kwargs) -> None:
    """A check: ``steps`` tokens through TinyAttention(*args, **kwargs), drawn with its seed."""
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    build, layer = f"TinyAttention({shown})", functools.partial(TinyAttention, *args, **kwargs)
    decode.check(name)(lambda fn: _run_decode(fn, layer(), steps, kwargs["seed"], build))


_decode_check("the very first token (empty cache)", 1, 16, 2, seed=1)
_decode_check(
    "17 tokens: every output matches full recompute, the cache holds them in order",
    *(17, 32, 4),
    seed=2,
)
_decode_check("a head_dim that is not a power of two (d_model 36, 3 heads of 12)", 9, 36, 3, seed=3)
_decode_check(
    "grouped-query attention (4 query heads share 2 KV heads)", 6, 32, 4, num_kv_heads=2, seed=4
)
_decode_check("a single head", 5, 8, 1, seed=5)
_decode_check(
    "heads that do not tile d_model: 4 heads of 8 into d_model 24 (wo is 32 × 24)",
    *(5, 24, 4),
    num_kv_heads=2,
    seed=6,
    head_dim=8,
)
