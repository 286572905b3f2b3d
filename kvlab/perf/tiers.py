"""Fetch or recompute? The rule behind a CPU tier below HBM (Lab 10).

A prompt's prefix that HBM lost but CPU memory kept can come back two ways: copied up over PCIe
(its K/V: ``kv_bytes_per_token`` bytes per token), or computed again (its prefill FLOPs:
``2 x params`` per token plus attention, which grows with the prefix). Both grow with the
prefix, so the answer depends mostly on the model and the link, not on the prompt: per token
a copy costs ``kv_bytes_per_token / pcie_bytes_per_s`` and a recompute at least
``2 x params / peak_flops``. Grouped-query attention makes K/V small for the model's size, so
for Llama-3-8B on an H100 fetching wins at every length over PCIe 4.0 and 5.0; a model with
full multi-head attention (OPT-13B: 800 KB per token) on a fast GPU over PCIe 4.0 does better
computing again, and so does a small model over a slow link. Attention only tips the scale
further towards fetching as the prefix grows. Per block, a copy may also pay a fixed start-up
cost (``transfer_overhead_s``; 0 by default): small blocks make many small copies, one reason
the PagedAttention paper found recomputation faster than swapping for small blocks.

Both sides are lower bounds from peaks (the roofline's): real prefill kernels reach perhaps
half of the GPU's peak FLOP/s and real copies most of the link's, so a measured recompute is
slower than this estimate by more than a measured copy is, and the true break-even sits
further towards fetching.
"""

from __future__ import annotations

import math

from kvlab.core.validate import positive_int
from kvlab.models import ModelSpec
from kvlab.perf.roofline import GPU

# Effective host-to-device bandwidth of one x16 link, in bytes per second (about 80% of the
# raw 32 GB/s of PCIe 4.0 and 64 GB/s of PCIe 5.0); StepTime's default is Gen4's
PCIE_GEN4_X16 = 25e9
PCIE_GEN5_X16 = 50e9


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


class TierRule:
    """The rule's sums, one method per decision, so a variant overrides one (Lab 10's usual
    slips); the module's functions are this class's, their arguments checked first."""

    def kv_bytes(self, spec: ModelSpec) -> float:
        """A cached token's bytes: K and V, every layer."""
        return spec.kv_bytes_per_token

    def link(self, gpu: GPU, pcie_bytes_per_s: float) -> float:
        """The copy's bytes per second: the link's as given (blocks come up over PCIe, not HBM)."""
        return pcie_bytes_per_s

    def attended(self, num_tokens: int, context: int) -> float:
        """Positions the tokens attend to, all told: the i-th attends to ``context + i``."""
        return num_tokens * context + num_tokens * (num_tokens + 1) / 2

    def fetch_wins(self, fetch_s: float, recompute_s: float) -> bool:
        """A tie goes to recomputing: it needs no copy."""
        return fetch_s < recompute_s

    def fetch_seconds(self, spec, num_tokens, pcie_bytes_per_s, block_size, transfer_overhead_s):
        copies = math.ceil(num_tokens / block_size)
        return num_tokens * self.kv_bytes(spec) / pcie_bytes_per_s + copies * transfer_overhead_s

    def recompute_flops(self, spec, num_tokens, context) -> float:
        per_position = 4 * spec.num_layers * spec.num_q_heads * spec.head_dim
        return 2 * spec.num_params * num_tokens + per_position * self.attended(num_tokens, context)

    def fetch_beats_recompute(
        self,
        spec,
        gpu,
        num_tokens,
        pcie_bytes_per_s,
        block_size=16,
        transfer_overhead_s=0.0,
        context=0,
    ) -> bool:
        link = self.link(gpu, pcie_bytes_per_s)
        fetch = self.fetch_seconds(spec, num_tokens, link, block_size, transfer_overhead_s)
        return self.fetch_wins(
            fetch, self.recompute_flops(spec, num_tokens, context) / gpu.peak_flops
        )


def _check_fetch(num_tokens, pcie_bytes_per_s, block_size, transfer_overhead_s) -> float:
    positive_int("num_tokens", num_tokens, minimum=0)
    positive_int("block_size", block_size)
    pcie = _positive("pcie_bytes_per_s", pcie_bytes_per_s)
    if transfer_overhead_s < 0:
        raise ValueError(f"transfer_overhead_s must be >= 0, got {transfer_overhead_s!r}")
    return pcie


def _check_recompute(spec: ModelSpec, num_tokens: int, context: int) -> None:
    if spec.num_params is None:
        raise ValueError(f"spec {spec.name!r} has no num_params; the FLOPs are unknown")
    positive_int("num_tokens", num_tokens, minimum=0)
    positive_int("context", context, minimum=0)


def fetch_seconds(
    spec: ModelSpec,
    num_tokens: int,
    *,
    pcie_bytes_per_s: float = PCIE_GEN4_X16,
    block_size: int = 16,
    transfer_overhead_s: float = 0.0,
) -> float:
    """Seconds to copy ``num_tokens`` tokens of K/V up over PCIe, in blocks of ``block_size``
    (each copy paying ``transfer_overhead_s`` on top of its bytes)."""
    pcie = _check_fetch(num_tokens, pcie_bytes_per_s, block_size, transfer_overhead_s)
    return TierRule().fetch_seconds(spec, num_tokens, pcie, block_size, transfer_overhead_s)


def recompute_flops(spec: ModelSpec, num_tokens: int, *, context: int = 0) -> float:
    """FLOPs of computing ``num_tokens`` prompt tokens again after ``context`` tokens already
    cached: ``2 x params`` per token, and attention (the i-th token attends to ``context + i``
    positions, ``4 x layers x query heads x head_dim`` FLOPs each), as
    :func:`kvlab.perf.roofline.step_cost` counts them."""
    _check_recompute(spec, num_tokens, context)
    return TierRule().recompute_flops(spec, num_tokens, context)


def recompute_seconds(spec: ModelSpec, gpu: GPU, num_tokens: int, *, context: int = 0) -> float:
    """Seconds to compute ``num_tokens`` prompt tokens again at the GPU's peak FLOP/s (the
    weights are read anyway, for the tokens the step computes in any case)."""
    return recompute_flops(spec, num_tokens, context=context) / gpu.peak_flops


def fetch_beats_recompute(
    spec: ModelSpec,
    gpu: GPU,
    num_tokens: int,
    *,
    pcie_bytes_per_s: float = PCIE_GEN4_X16,
    block_size: int = 16,
    transfer_overhead_s: float = 0.0,
    context: int = 0,
) -> bool:
    """Whether copying ``num_tokens`` tokens of K/V up from CPU memory is faster than computing
    them again (a tie goes to recomputing: it needs no copy)."""
    pcie = _check_fetch(num_tokens, pcie_bytes_per_s, block_size, transfer_overhead_s)
    _check_recompute(spec, num_tokens, context)
    return TierRule().fetch_beats_recompute(
        spec, gpu, num_tokens, pcie, block_size, transfer_overhead_s, context
    )


def break_even_tokens(spec: ModelSpec, gpu: GPU, *, pcie_bytes_per_s: float = PCIE_GEN4_X16) -> int:
    """The fewest tokens (from an empty context, no per-copy overhead) for which fetching beats
    recomputing: 1 when fetching wins at every length. With ``a = 2 x params / peak``,
    ``f = kv_bytes_per_token / pcie`` and ``b = 4 x layers x heads x head_dim / peak``, a copy
    of n tokens costs ``n f`` and a recompute ``n a + b n (n + 1) / 2``: fetching wins once
    ``(n + 1) / 2 > (f - a) / b``."""
    pcie = _positive("pcie_bytes_per_s", pcie_bytes_per_s)
    if spec.num_params is None:
        raise ValueError(f"spec {spec.name!r} has no num_params; the FLOPs are unknown")
    f = spec.kv_bytes_per_token / pcie
    a = 2 * spec.num_params / gpu.peak_flops
    b = 4 * spec.num_layers * spec.num_q_heads * spec.head_dim / gpu.peak_flops
    n = max(1, math.floor(2 * (f - a) / b - 1))  # the formula's answer, then checked exactly
    while n > 1 and fetch_beats_recompute(spec, gpu, n - 1, pcie_bytes_per_s=pcie):
        n -= 1
    while not fetch_beats_recompute(spec, gpu, n, pcie_bytes_per_s=pcie):
        n += 1
    return n


def describe_break_even(
    spec: ModelSpec, gpu: GPU, *, pcie_bytes_per_s: float = PCIE_GEN4_X16
) -> str:
    """The rule for one model, GPU and link, in a sentence written from the numbers."""
    n = break_even_tokens(spec, gpu, pcie_bytes_per_s=pcie_bytes_per_s)
    f = spec.kv_bytes_per_token / pcie_bytes_per_s * 1e6
    a = 2 * spec.num_params / gpu.peak_flops * 1e6
    head = (
        f"{spec.name} on an {gpu.name} over {pcie_bytes_per_s / 1e9:.0f} GB/s: a copy costs "
        f"{f:.1f} µs per token, a recompute at least {a:.1f} µs"
    )
    if n == 1:
        return f"{head}, so fetching wins at every length ({a / f:.1f}x cheaper per token)."
    return (
        f"{head}, so recomputing wins below {n:,} tokens (attention makes long prefixes dearer "
        "to compute), fetching from there on."
    )
