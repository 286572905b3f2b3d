"""Quantised K/V: 8-bit elements with one fp32 scale per token and KV head, in torch.

A cached vector ``x`` (one token's K, or V, of one KV head: ``head_dim`` elements) is stored as
``values = x / scale`` in an 8-bit format and read back as ``values * scale``, where ``scale =
max|x| / FORMAT_MAX``: the largest element lands on the format's largest value, and ``x ≈ values *
scale`` (the convention of vLLM's ``k_scale`` / ``v_scale``). Two formats:

- ``"fp8_e4m3"``: ``torch.float8_e4m3fn``, the fp8 vLLM's ``--kv-cache-dtype fp8`` stores (largest
  value 448, 3 mantissa bits: each element within 1/16 of itself). torch on a CPU casts to it and
  Triton's interpreter loads it, so every kernel test runs here; a GPU needs sm_89 or newer
  (Ada, Hopper) for Triton to load it.
- ``"int8"``: ``torch.int8``, round to nearest (largest 127: each element within half a step,
  ``scale / 2``), for GPUs without fp8 (an A100, a T4).

vLLM's plain fp8 cache keeps one scale per layer for K and one for V (per tensor; 1.0 unless
calibrated), or one per KV head when calibrated; the ``*_per_token_head`` formats keep one per
token and head, as here (``kvlab.core.kv_spec``). A
zero vector gets scale 1 (any positive scale stores zeros): no division by zero, no NaN. A given
``scale`` (a per-tensor one, say) saturates what lies beyond it at the format's largest value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantFormat:
    """An 8-bit element format: its torch dtype, its largest value, and whether it rounds to an
    integer grid."""

    name: str
    dtype: torch.dtype
    max: float
    integer: bool

    @property
    def other(self) -> QuantFormat:
        return FORMATS["int8" if self.name == "fp8_e4m3" else "fp8_e4m3"]


FORMATS = {
    "fp8_e4m3": QuantFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0, integer=False),
    "int8": QuantFormat("int8", torch.int8, 127.0, integer=True),
}
FP8_RELATIVE_ERROR = 2.0**-4  # half of e4m3's 3-bit mantissa step
FP8_SUBNORMAL_STEP = 2.0**-9  # e4m3's smallest step (subnormals), in units of the scale


def quant_format(fmt) -> QuantFormat:
    """``"fp8_e4m3"``, ``"int8"`` or a :class:`QuantFormat`, checked."""
    if isinstance(fmt, QuantFormat):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(map(repr, FORMATS))}, got {fmt!r}")
    return FORMATS[fmt]


def vector_amax(x: torch.Tensor) -> torch.Tensor:
    """The largest magnitude of each vector (the last axis), in fp32: ``x.shape[:-1]``."""
    return x.float().abs().amax(dim=-1)


def scales_for(amax: torch.Tensor, fmt) -> torch.Tensor:
    """``amax / FORMAT_MAX``, and 1 where amax is 0 (a zero vector): fp32, never 0, never NaN."""
    fmt = quant_format(fmt)
    amax = amax.float()
    return torch.where(amax > 0, amax / fmt.max, torch.ones_like(amax))


def to_format(x, scale, fmt, *, clamp: bool = True, rounding: str = "nearest") -> torch.Tensor:
    """``x / scale`` stored in the format (``scale`` broadcasts over the last axis of ``x``).
    ``clamp=False`` and ``rounding="toward zero"`` show what a bare cast does: int8 wraps
    around past 127 (128 becomes -128) and truncates, doubling the error."""
    fmt = quant_format(fmt)
    y = x.float() / torch.as_tensor(scale, dtype=torch.float32, device=x.device)[..., None]
    if clamp:
        y = y.clamp(-fmt.max, fmt.max)
    if fmt.integer:
        if rounding == "nearest":
            y = y.round()
        elif rounding != "toward zero":
            raise ValueError(f"rounding must be 'nearest' or 'toward zero', got {rounding!r}")
    return y.to(fmt.dtype)


def quantize(x: torch.Tensor, fmt="fp8_e4m3", scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, scales)``: ``x [..., head_dim]`` in the format, with one fp32 scale per vector
    (``x.shape[:-1]``: per token and KV head for a ``[tokens, kv_heads, head_dim]`` K or V).
    ``scale`` given (a float, or a tensor that broadcasts to ``x.shape[:-1]``) is used instead of
    each vector's own, and what lies beyond it saturates."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise TypeError(f"x must be a floating-point tensor [..., head_dim], got {x!r:.80}")
    fmt = quant_format(fmt)
    if scale is None:
        scales = scales_for(vector_amax(x), fmt)
    else:
        scales = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        if not bool((scales > 0).all()) or not bool(scales.isfinite().all()):
            raise ValueError("scale must be positive and finite")
        scales = scales.expand(x.shape[:-1]).clone()
    return to_format(x, scales, fmt), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """``values * scales`` (scales over the last axis) in ``dtype``: the cached vectors back."""
    if values.shape[:-1] != scales.shape:
        raise ValueError(
            f"scales must be values.shape[:-1] = {tuple(values.shape[:-1])}, got "
            f"{tuple(scales.shape)}"
        )
    return (values.float() * scales.float()[..., None]).to(dtype)


def error_bound(x: torch.Tensor, scales: torch.Tensor, fmt) -> torch.Tensor:
    """How far each element may come back from ``x`` (elementwise, fp32): half an integer step
    (int8), or 1/16 of the element and half the smallest step (fp8 e4m3), plus fp32 slack."""
    fmt = quant_format(fmt)
    s = scales.float()[..., None].expand(x.shape)
    if fmt.integer:
        bound = s / 2
    else:
        bound = torch.maximum(x.float().abs() * FP8_RELATIVE_ERROR, s * FP8_SUBNORMAL_STEP / 2)
    return bound * (1 + 1e-5) + 1e-30


def quantize_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, fmt="fp8_e4m3"):
    """A whole paged cache ``[num_blocks, block_size, kv_heads, head_dim]`` quantised bed by bed:
    ``(k_values, v_values, k_scales, v_scales)``, scales ``[num_blocks, block_size, kv_heads]``
    (a NaN in one bed's vector spoils that vector only: scales are per vector)."""
    k_values, k_scales = quantize(k_cache, fmt)
    v_values, v_scales = quantize(v_cache, fmt)
    return k_values, v_values, k_scales, v_scales


def quantized_bytes_per_vector(head_dim: int, fmt="fp8_e4m3") -> int:
    """Bytes one cached vector takes: one byte per element and a 4-byte scale."""
    quant_format(fmt)
    return head_dim + 4
