"""Checks for Lab 00: KV bytes per token, and one cached decode step.

Each wrong answer is compared with what the usual slips would have produced (KiB instead of
bytes, query heads instead of KV heads, a fixed 2 bytes per element, a softmax over the heads,
heads joined in the wrong order, d_model // num_heads for head_dim, nn.Linear's ``x @ W.T``, …);
a hint is given only when one slip, and only one, explains it. A shape error is named when the
learner's step runs right on a layer without the trouble (every query head with its own KV head;
heads that tile d_model; a square ``wo``), so knock-on failures of one mistake fold into its
first report.
"""

from __future__ import annotations

import functools
import math
import numbers
import random

import torch

from kvlab.grading import slips
from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import (
    CheckFailed,
    call_without_mutation,
    expect_type,
    plural,
    preview,
    short,
)
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


def _kv_bytes(spec: ModelSpec) -> int:
    return spec.kv_bytes_per_token


# the usual slips, each computing the count from the right one and the spec
KV_SLIPS = (
    Slip("that is KiB (bytes / 1024): return bytes", lambda s: _kv_bytes(s) / 1024),
    Slip("that is kB (bytes / 1000): return bytes", lambda s: _kv_bytes(s) / 1000),
    Slip("that is MiB (bytes / 2**20): return bytes", lambda s: _kv_bytes(s) / 2**20),
    Slip("that is bits (bytes × 8): return bytes", lambda s: _kv_bytes(s) * 8),
    Slip(
        "each token stores a key AND a value vector: multiply by 2 (K and V)",
        lambda s: _kv_bytes(s) / 2,
    ),
    Slip(
        "query heads are not cached: use spec.num_kv_heads (grouped-query attention)",
        lambda s: _kv_bytes(s) / s.num_kv_heads * s.num_q_heads,
    ),
    Slip(
        "each element takes spec.dtype_bytes bytes: multiply by it",
        lambda s: _kv_bytes(s) / s.dtype_bytes,
    ),
    Slip(
        "the element size is spec.dtype_bytes, not always 2 (fp16's): multiply by "
        "spec.dtype_bytes instead of a fixed 2",
        lambda s: _kv_bytes(s) // s.dtype_bytes * 2,
    ),
    Slip(
        "every layer keeps its own keys and values: multiply by spec.num_layers",
        lambda s: _kv_bytes(s) / s.num_layers,
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
    right = spec.kv_bytes_per_token
    where = _describe(spec)
    if got is None:
        raise CheckFailed("no byte count came back", input=where, got="None", hint=RETURNED_NONE)
    if _is_number(got) and got == right:
        expect_type(
            got,
            int,
            "the byte count",
            input=where,
            hint="the count is right but not an int: build it with `*` only, or wrap it in int()",
        )
        return
    if not _is_number(got):
        looks_right = isinstance(got, str) and got.strip().replace(",", "") == str(right)
        expect_type(
            got,
            int,
            "the byte count",
            input=where,
            hint="return the number itself, not its text (no str() or f-string)"
            if looks_right
            else None,
        )
    raise CheckFailed(
        "wrong byte count",
        input=where,
        expected=f"{right:,}",
        got=_bytes_text(got),
        hint=diagnose_kv_bytes(fn, spec, got),
    )


def _bytes_text(value) -> str:
    """A byte count as the checks' titles write it (819,200); anything else as it is."""
    if _is_number(value) and math.isfinite(value):
        return f"{value:,}"
    return short(value)


@kv_bytes.check(
    "OPT-13B needs 819,200 bytes (800 KiB) per token: the PagedAttention paper's 800 KB"
)
def _opt(fn):
    _expect_bytes(fn, OPT_13B)


@kv_bytes.check("grouped-query attention: Llama-3-8B caches only its 8 KV heads")
def _gqa(fn):
    _expect_bytes(fn, LLAMA_3_8B)
    _expect_bytes(fn, LLAMA_3_70B)


@kv_bytes.check("the element size counts (fp32 = 4 bytes, fp8 = 1 byte)")
def _dtype(fn):
    for dtype_bytes in (4, 1):
        _expect_bytes(fn, ModelSpec("OPT-13B", 40, 40, 40, 128, dtype_bytes=dtype_bytes))


@kv_bytes.check("the smallest model: 1 layer, 1 head, head_dim 1")
def _tiny(fn):
    _expect_bytes(fn, ModelSpec("tiny", 1, 1, 1, 1))


@kv_bytes.check("twenty random shapes (odd head sizes, GQA groups, fp8/fp16/fp32)")
def _random(fn):
    rng = random.Random(0)
    for i in range(20):
        kv = rng.choice([1, 2, 3, 5, 8])
        spec = ModelSpec(
            f"random-{i}",
            num_layers=rng.randint(1, 96),
            num_q_heads=kv * rng.choice([1, 2, 4, 7]),
            num_kv_heads=kv,
            head_dim=rng.choice([1, 48, 64, 80, 96, 112, 128, 256]),
            dtype_bytes=rng.choice([1, 2, 4]),
        )
        _expect_bytes(fn, spec)


# --- one cached decode step ------------------------------------------------------------------

decode = exercise("00.decode_step", "one cached decode step")
ATOL, RTOL = 1e-5, 1e-4


def _close(a, b) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and torch.allclose(a.to(b.dtype), b, atol=ATOL, rtol=RTOL)
    )


def step_with(
    layer,
    x_t,
    k_cache,
    v_cache,
    *,
    append=True,
    scale=None,
    softmax_dim=-1,
    heads="h // group",
    dims_first=False,
):
    """The output of one decode step computed as written, or with one of the usual slips:
    ``append=False`` attends without the new token, ``softmax_dim=0`` normalises over the heads,
    ``heads="h % kv_heads"`` maps query heads to KV heads like ``repeat`` instead of
    ``repeat_interleave``, ``dims_first`` joins the heads from ``[head_dim, num_heads]`` (a
    transpose before the reshape). Returns the heads' concatenated output, before ``wo``."""
    q, k, v = layer.qkv(x_t.unsqueeze(0))
    keys = torch.cat([k_cache, k]) if append else k_cache
    values = torch.cat([v_cache, v]) if append else v_cache
    group = layer.num_heads // layer.num_kv_heads
    kv_of = [
        h // group if heads == "h // group" else h % layer.num_kv_heads
        for h in range(layer.num_heads)
    ]
    keys, values = keys[:, kv_of], values[:, kv_of]
    scale = 1 / math.sqrt(layer.head_dim) if scale is None else scale
    scores = torch.einsum("hd,thd->ht", q[0], keys) * scale
    out = torch.einsum("ht,thd->hd", scores.softmax(dim=softmax_dim), values)
    return (out.T if dims_first else out).reshape(-1)


def head_dim_hint(layer) -> str:
    """The hint for a step that takes one head's size to be d_model // num_heads."""
    return (
        f"one head is layer.head_dim = {layer.head_dim} wide, not d_model // num_heads = "
        f"{layer.d_model // layer.num_heads}: here {layer.num_heads} heads × {layer.head_dim} = "
        f"{layer.num_heads * layer.head_dim} ≠ d_model {layer.d_model}. Use layer.head_dim (and "
        "num_heads × head_dim for the joined heads)"
    )


def _output(projection: str, options: dict, layer, x_t, k_cache, v_cache):
    """A slip's output: the heads computed with ``options`` (see ``step_with``), projected as
    ``projection`` says ("x @ W", nn.Linear's "x @ W.T", or "none")."""
    heads = step_with(layer, x_t, k_cache, v_cache, **options)
    if projection == "x @ W":
        return heads @ layer.wo
    return heads @ layer.wo.T if projection == "x @ W.T" else heads


def _step_slip(hint: str, projection: str = "x @ W", **options) -> Slip:
    return Slip(hint, functools.partial(_output, projection, options))


def step_slips(layer) -> list[Slip]:
    """The usual slips of a decode step, for this layer's shape."""
    d = layer.head_dim
    rows = [
        _step_slip(
            "the new token attends to itself too: append its k and v to the caches first, "
            "then attend over all of them",
            append=False,
        ),
        _step_slip(
            "softmax over the wrong axis: normalise each head's scores across the cached "
            "tokens (the token axis), not across the heads",
            softmax_dim=0,
        ),
        _step_slip("scale the scores by 1/sqrt(head_dim)", scale=1.0),
        _step_slip(
            "multiply the scores by 1/sqrt(head_dim), not by sqrt(head_dim)", scale=math.sqrt(d)
        ),
    ]
    if layer.d_model != d:
        rows.append(
            _step_slip(
                "scale by 1/sqrt(head_dim), the size of one head, not 1/sqrt(d_model)",
                scale=1 / math.sqrt(layer.d_model),
            )
        )
    guessed = layer.d_model // layer.num_heads  # what d_model // num_heads takes head_dim for
    if guessed not in (0, d, layer.d_model):
        rows.append(_step_slip(head_dim_hint(layer), scale=1 / math.sqrt(guessed)))
    if layer.num_heads > 1 and d > 1:
        rows.append(
            _step_slip(
                "join the heads in order: reshape the [num_heads, head_dim] output as it is "
                "(`o.reshape(-1)`: head 0's values, then head 1's, …); a transpose before the "
                "reshape interleaves the heads",
                dims_first=True,
            )
        )
    if 1 < layer.num_kv_heads < layer.num_heads:
        group = layer.num_heads // layer.num_kv_heads
        rows.append(
            _step_slip(
                f"query head h reads KV head h // {group} (the group size), not h % "
                f"{layer.num_kv_heads}: use repeat_interleave, not repeat",
                heads="h % kv_heads",
            )
        )
    if tuple(layer.wo.shape) == (layer.d_model, layer.d_model):
        rows.append(_step_slip(LINEAR_HINT, "x @ W.T"))
        rows.append(
            _step_slip("project the heads' output back to d_model with `@ layer.wo`", "none")
        )
    return rows


def diagnose_step(layer, x_t, k_cache, v_cache, y) -> str | None:
    """The one slip whose output matches ``y`` (and differs from the right one), else None."""
    args = (layer, x_t, k_cache, v_cache)
    right = step_with(*args) @ layer.wo
    return slips.hint(slips.only(slips.matching(step_slips(layer), y, args, right, _close)))


NO_GQA = (
    "grouped-query attention: layer.qkv gives k and v num_kv_heads heads, q num_heads. Before "
    "the scores, repeat each KV head for its group of num_heads // num_kv_heads query heads "
    "(`k_cache.repeat_interleave(group, dim=1)`, the same for v); the caches keep num_kv_heads"
)
NO_GQA_CAUSE = "kvlab: KV heads not expanded to query heads"
LINEAR_HINT = (
    "weights act on the right in this lab (x @ W): the output is `o @ layer.wo`; "
    "`o @ layer.wo.T` is nn.Linear's convention"
)


def _steps_quietly(fn, layer, steps: int = 2):
    """The learner's outputs for ``steps`` tokens through ``layer`` from an empty cache (with the
    tokens), or None when their code raises: a probe never fails a check."""
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(7))
    k_cache, v_cache = layer.empty_cache()
    outputs = []
    try:
        for t in range(steps):
            y, k_cache, v_cache = fn(layer, x[t], k_cache, v_cache)
            outputs.append(y)
    except Exception:
        return None
    return x, outputs


def _shape_error(error: Exception) -> bool:
    """torch's complaint about tensors whose shapes do not fit (einsum, @, broadcasting)."""
    text = str(error)
    return isinstance(error, RuntimeError) and ("size" in text or "shape" in text)


def diagnose_error(fn, layer) -> tuple[str, str, str] | None:
    """(message, hint, cause) for an error the learner's step raised on ``layer``, when a probe
    on a layer without the trouble shows what it was: KV heads not expanded for the query heads
    (the step works when every query head has its own KV head), one head's size taken for
    d_model // num_heads (the step works when the heads tile d_model), or nn.Linear's
    ``o @ wo.T`` (which only fails to run when ``wo`` is not square)."""
    if layer.num_kv_heads < layer.num_heads:
        plain = TinyAttention(
            layer.d_model, layer.num_heads, seed=11, head_dim=layer.head_dim
        )  # every query head with its own KV head
        probe = _steps_quietly(fn, plain)
        if probe is not None and all(
            _close(y, right) for y, right in zip(probe[1], plain.forward(probe[0]), strict=True)
        ):
            message = (
                f"this layer has {plural(layer.num_heads, 'query head')} and "
                f"{plural(layer.num_kv_heads, 'KV head')}; your step runs when there are as many KV "
                "heads as query heads"
            )
            return message, NO_GQA, NO_GQA_CAUSE
    if layer.wo.shape[0] != layer.wo.shape[1]:
        width = layer.num_heads * layer.head_dim
        square = TinyAttention(width, layer.num_heads, layer.num_kv_heads, seed=11)
        probe = _steps_quietly(fn, square)
        if probe is not None:
            x, outputs = probe
            if all(_close(y, right) for y, right in zip(outputs, square.forward(x), strict=True)):
                message = (
                    f"{plural(layer.num_heads, 'head')} of {layer.head_dim} make {width} here, "
                    f"not d_model = {layer.d_model}; your step runs when they make d_model"
                )
                hint = head_dim_hint(layer)
                return message, hint, hint
            y, empty = outputs[0], square.empty_cache()
            if (
                isinstance(y, torch.Tensor)
                and diagnose_step(square, x[0], *empty, y) == LINEAR_HINT
            ):
                message = f"layer.wo is {width} × {layer.d_model} here, not square"
                return message, LINEAR_HINT, LINEAR_HINT
    return None


def _cache_shape_hint(layer, got: tuple, rows: int) -> str | None:
    """Name the usual cache-shape slips: no new row, query heads stored, heads flattened."""
    if got == (rows - 1, layer.num_kv_heads, layer.head_dim):
        return "return the caches with the new token's row appended: one more row than came in"
    if got == (rows, layer.num_heads, layer.head_dim) and layer.num_heads != layer.num_kv_heads:
        return (
            "cache the num_kv_heads heads that layer.qkv returns, before repeating them for "
            "the query heads (grouped-query attention)"
        )
    if got == (rows, layer.num_kv_heads * layer.head_dim):
        return "keep the cache's shape [tokens, num_kv_heads, head_dim]: do not flatten the heads"
    if len(got) == 4 and got[0] == 1 and got[1:] == (rows, layer.num_kv_heads, layer.head_dim):
        return "no batch axis: the cache is [tokens, num_kv_heads, head_dim]"
    return None


def _output_shape_hint(layer, got: tuple) -> str | None:
    if got == (1, layer.d_model):
        return "return y_t as [d_model]: drop the token axis (y[0] or y.reshape(-1))"
    if got == (layer.num_heads * layer.head_dim,):
        return "project the heads' output back to d_model with `@ layer.wo`"
    if got == (layer.num_heads, layer.head_dim):
        return "join the heads (reshape to num_heads × head_dim), then project with `@ layer.wo`"
    return None


def _token_order(cache, reference) -> str:
    """Which token each row of ``cache`` holds ("?" for none), found by comparing rows."""
    order = []
    for row in cache:
        match = [t for t, ref in enumerate(reference) if _close(row, ref)]
        order.append(str(match[0]) if match else "?")
    note = " (?: a row that is no token's)" if "?" in order else ""
    return f"[{', '.join(order)}]{note}"


def _expect_caches(k_got, v_got, k_in, k_all, v_all, where, replay):
    """Row t of each cache must hold token t's key (value). Knows a new row put in front and
    the two caches returned the other way round."""
    rows = len(k_in) + 1
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
        raise CheckFailed(
            f"{name} does not hold every token's {'key' if name == 'k_cache' else 'value'} in order",
            input=where,
            replay=replay,
            expected=f"rows hold tokens {list(range(rows))}",
            got=f"rows hold tokens {_token_order(got, reference)}",
            hint=hint,
        )


def _run_decode(fn, layer: TinyAttention, steps: int, seed: int, build: str):
    """Feed ``steps`` tokens one at a time through the learner's step; compare each output with
    full recompute and each cache with every token's k and v so far."""
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(seed))
    expected = layer.forward(x)
    _, k_all, v_all = layer.qkv(x)
    replay = (
        f"layer = {build}; x = torch.randn({steps}, {layer.d_model}, generator="
        f"torch.Generator().manual_seed({seed})); feed x[0], x[1], … from layer.empty_cache()"
    )
    k_cache, v_cache = layer.empty_cache()
    for t in range(steps):
        where = f"step {t} of {steps}: {plural(t, 'token')} cached, token {t} comes in"
        try:
            with refuse_reference(
                TinyAttention.decode_step,
                TinyAttention.forward,
                decode_attention,
                causal_attention,
                learner=fn,
                task="writing the decode step",
            ):
                result = call_without_mutation(
                    fn, layer, x[t], k_cache, v_cache, names=("layer", "x_t", "k_cache", "v_cache")
                )
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as error:
            found = diagnose_error(fn, layer) if _shape_error(error) else None
            if found is None:
                raise
            message, hint, cause = found
            raise CheckFailed(
                "\n   ".join([*explain_exception(error), message]),
                input=where,
                replay=replay,
                hint=hint,
                cause=cause,
            ) from None
        if not isinstance(result, tuple) or len(result) != 3:
            hint = RETURNED_NONE if result is None else None
            if isinstance(result, list) and len(result) == 3:
                hint = "return the three values as a tuple: `return y_t, k_cache, v_cache`"
            raise CheckFailed(
                "decode_step must return a tuple (y_t, k_cache, v_cache)",
                input=where,
                got=short(result),
                hint=hint,
            )
        y, k_new, v_new = result
        rows = t + 1
        for name, value, shape, hint_for in (
            ("y_t", y, (layer.d_model,), lambda got: _output_shape_hint(layer, got)),
            ("k_cache", k_new, (rows, layer.num_kv_heads, layer.head_dim), None),
            ("v_cache", v_new, (rows, layer.num_kv_heads, layer.head_dim), None),
        ):
            expect_type(value, torch.Tensor, name, input=where)
            if tuple(value.shape) != shape:
                got = tuple(value.shape)
                raise CheckFailed(
                    f"{name} has the wrong shape after step {t}",
                    input=where,
                    replay=replay,
                    expected=str(shape),
                    got=str(got),
                    hint=hint_for(got) if hint_for else _cache_shape_hint(layer, got, rows),
                )
        if not _close(y, expected[t]):
            err = (y.to(expected.dtype) - expected[t]).abs().max().item()
            raise CheckFailed(
                f"output of step {t} differs from full recompute over {plural(rows, 'token')}",
                input=where,
                replay=replay,
                expected=preview(expected[t]),
                got=f"{preview(y)}, max abs error {err:.3g}",
                hint=diagnose_step(layer, x[t], k_cache, v_cache, y.to(expected.dtype)),
            )
        _expect_caches(k_new, v_new, k_cache, k_all, v_all, where, replay)
        k_cache, v_cache = k_new, v_new


def _decode_case(fn, steps: int, x_seed: int, *args, **kwargs):
    """``steps`` tokens (drawn with seed ``x_seed``) through TinyAttention(*args, **kwargs)."""
    shown = [*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]
    build = f"TinyAttention({', '.join(shown)})"
    _run_decode(fn, TinyAttention(*args, **kwargs), steps, x_seed, build)


@decode.check("the very first token (empty cache)")
def _first(fn):
    _decode_case(fn, 1, 1, 16, 2, seed=1)


@decode.check("17 tokens: every output matches full recompute, the cache holds them in order")
def _many(fn):
    _decode_case(fn, 17, 2, 32, 4, seed=2)


@decode.check("a head_dim that is not a power of two (d_model 36, 3 heads of 12)")
def _odd(fn):
    _decode_case(fn, 9, 3, 36, 3, seed=3)


@decode.check("grouped-query attention (4 query heads share 2 KV heads)")
def _gqa_decode(fn):
    _decode_case(fn, 6, 4, 32, 4, num_kv_heads=2, seed=4)


@decode.check("a single head")
def _single_head(fn):
    _decode_case(fn, 5, 5, 8, 1, seed=5)


@decode.check("heads that do not tile d_model: 4 heads of 8 into d_model 24 (wo is 32 × 24)")
def _wide_heads(fn):
    _decode_case(fn, 5, 6, 24, 4, num_kv_heads=2, seed=6, head_dim=8)
