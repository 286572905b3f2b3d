"""Checks for Lab 00: KV bytes per token, and one cached decode step."""

from __future__ import annotations

import random

import torch

from kvlab.attention import TinyAttention
from kvlab.grading.core import (
    CheckFailed,
    call_without_mutation,
    exercise,
    expect_equal,
    expect_type,
    short,
)
from kvlab.models import LLAMA_3_8B, LLAMA_3_70B, OPT_13B, ModelSpec

kv_bytes = exercise("00.kv_bytes", "KV bytes per token")


def _describe(spec: ModelSpec) -> str:
    return (
        f"{spec.name}: {spec.num_layers} layers, {spec.num_q_heads} query heads, "
        f"{spec.num_kv_heads} KV heads, head_dim {spec.head_dim}, {spec.dtype_bytes} bytes/element"
    )


def _expect_bytes(fn, spec: ModelSpec, hint: str | None = None):
    got = call_without_mutation(fn, spec, names=("spec",))
    expect_type(
        got, int, "the byte count", input=_describe(spec), hint="return a whole number (int)"
    )
    expect_equal(got, spec.kv_bytes_per_token, "wrong byte count", input=_describe(spec), hint=hint)


@kv_bytes.check(
    "OPT-13B needs 819,200 bytes (800 KB) per token, as in the PagedAttention paper",
    hint="every layer stores a key AND a value vector per KV head: 2 × layers × KV heads × head_dim × bytes",
)
def _opt(fn):
    _expect_bytes(fn, OPT_13B)


@kv_bytes.check(
    "grouped-query attention: Llama-3-8B caches only its 8 KV heads",
    hint="query heads are not cached; use spec.num_kv_heads",
)
def _gqa(fn):
    _expect_bytes(fn, LLAMA_3_8B)
    _expect_bytes(fn, LLAMA_3_70B)


@kv_bytes.check(
    "the element size counts (fp32 = 4 bytes, fp8 = 1 byte)",
    hint="multiply by spec.dtype_bytes",
)
def _dtype(fn):
    for dtype_bytes in (4, 1):
        _expect_bytes(fn, ModelSpec("OPT-13B", 40, 40, 40, 128, dtype_bytes=dtype_bytes))


@kv_bytes.check(
    "the smallest model: 1 layer, 1 head, head_dim 1", hint="K and V: 2 × 1 × 1 × 1 × 2"
)
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


decode = exercise("00.decode_step", "one cached decode step")


def _run_decode(fn, layer: TinyAttention, steps: int, seed: int):
    """Feed ``steps`` tokens one at a time through the learner's step; compare to recompute."""
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(seed))
    expected = layer.forward(x)
    k_cache, v_cache = layer.empty_cache()
    setup = f"{layer!r}, {steps} tokens fed one at a time from an empty cache"
    for t in range(steps):
        result = call_without_mutation(
            fn, layer, x[t], k_cache, v_cache, names=("layer", "x_t", "k_cache", "v_cache")
        )
        if not isinstance(result, tuple) or len(result) != 3:
            raise CheckFailed(
                "decode_step must return a tuple (y_t, k_cache, v_cache)",
                input=setup,
                got=short(result),
            )
        y, k_cache, v_cache = result
        for name, value, shape in (
            ("y_t", y, (layer.d_model,)),
            ("k_cache", k_cache, (t + 1, layer.num_kv_heads, layer.head_dim)),
            ("v_cache", v_cache, (t + 1, layer.num_kv_heads, layer.head_dim)),
        ):
            expect_type(value, torch.Tensor, name, input=f"{setup}; step {t}")
            if tuple(value.shape) != shape:
                raise CheckFailed(
                    f"{name} has the wrong shape after step {t}",
                    input=setup,
                    expected=str(shape),
                    got=str(tuple(value.shape)),
                    hint="the cache gains exactly one row (one token) per step"
                    if name != "y_t"
                    else "project the attention output back with layer.wo",
                )
        if not torch.allclose(y.to(expected.dtype), expected[t], atol=1e-5, rtol=1e-4):
            err = (y.to(expected.dtype) - expected[t]).abs().max().item()
            raise CheckFailed(
                f"output of step {t} differs from recomputing all {t + 1} tokens",
                input=setup,
                expected=short(expected[t]),
                got=f"{short(y)} (max abs error {err:.3g})",
            )


@decode.check(
    "the very first token (empty cache)",
    hint="append this token's k and v to the cache first, then attend over the whole cache",
)
def _first(fn):
    _run_decode(fn, TinyAttention(16, 2, seed=1), steps=1, seed=1)


@decode.check(
    "17 tokens match full recompute at every step", hint="scale scores by 1/sqrt(head_dim)"
)
def _many(fn):
    _run_decode(fn, TinyAttention(32, 4, seed=2), steps=17, seed=2)


@decode.check("a head_dim that is not a power of two (d_model 36, 3 heads of 12)")
def _odd(fn):
    _run_decode(fn, TinyAttention(36, 3, seed=3), steps=9, seed=3)


@decode.check(
    "grouped-query attention (4 query heads share 2 KV heads)",
    hint="the cache holds num_kv_heads heads; query head h reads KV head h // group_size",
)
def _gqa_decode(fn):
    _run_decode(fn, TinyAttention(32, 4, num_kv_heads=2, seed=4), steps=6, seed=4)


@decode.check("a single head")
def _single_head(fn):
    _run_decode(fn, TinyAttention(8, 1, seed=5), steps=5, seed=5)
