"""Why decode is memory-bound: count the FLOPs and bytes of one forward step.

A step is limited by whichever takes longer, computing (FLOPs / peak FLOP/s) or moving data
(bytes / HBM bandwidth). Its arithmetic intensity (FLOPs per byte) against the GPU's ridge point
(peak FLOP/s / bandwidth) tells which. Decoding one token per sequence reads every weight and the
whole KV cache to do about one multiply-add per byte read, far below any GPU's ridge point.

Units, the same in :mod:`kvlab.perf.gpus`: bandwidth in bytes per second (decimal, as data sheets
give it: 2.039e12 is 2,039 GB/s), FLOP/s as counted, and memory in bytes, written in GiB (2**30
bytes). A preset's ``memory_bytes`` is the total that ``nvidia-smi`` reports for the card
(``memory.total``, in MiB: 81,559 MiB = 79.65 GiB on an H100 80GB HBM3): the product's "80GB" is
neither 80e9 bytes nor 80 GiB. CUDA hands a program about half a GiB less (vLLM's start-up log
prints 39.56 GiB of an A100-40GB's 40 GiB); :func:`kvlab.perf.planner.plan` takes a measured figure
where one is known.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.validate import positive_int
from kvlab.models import ModelSpec


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_bytes_per_s: float
    peak_flops: float  # dense bf16 tensor-core FLOP/s
    memory_bytes: float

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound on this GPU."""
        return self.peak_flops / self.hbm_bytes_per_s

    def attainable_flops(self, intensity: float) -> float:
        """The roofline: min(peak, bandwidth x intensity)."""
        return min(self.peak_flops, self.hbm_bytes_per_s * intensity)


MiB = 2**20
GiB = 2**30

# Bandwidth and FLOP/s: vendor data sheets (SXM parts, dense bf16); memory: nvidia-smi's total.
# The A100 80GB SXM's data sheet gives 2,039 GB/s (the 80GB PCIe card 1,935 GB/s; the 40GB 1,555).
A100_40GB = GPU("A100-40GB", 1.555e12, 312e12, 40_960 * MiB)  # the paper's OPT-13B GPU
A100_80GB = GPU("A100-80GB", 2.039e12, 312e12, 81_920 * MiB)
H100_SXM = GPU("H100 SXM", 3.35e12, 989e12, 81_559 * MiB)  # "NVIDIA H100 80GB HBM3"
H200 = GPU("H200", 4.8e12, 989e12, 143_771 * MiB)
# (bench matches a device to the first name here: an A100 of unknown size is taken for 80 GB)
GPUS = {g.name: g for g in (A100_80GB, H100_SXM, H200, A100_40GB)}


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def seconds(self, gpu: GPU) -> float:
        """Lower bound on the step's time: the slower of computing and moving data."""
        return max(self.flops / gpu.peak_flops, self.bytes / gpu.hbm_bytes_per_s)

    def bound(self, gpu: GPU) -> str:
        return "compute" if self.intensity >= gpu.ridge_intensity else "memory"


def step_cost(spec: ModelSpec, new_tokens: int, context: int = 0, batch: int = 1) -> StepCost:
    """FLOPs and HBM bytes of one forward step over ``batch`` sequences.

    Each sequence brings ``new_tokens`` tokens (the prompt in prefill, 1 in decode) on top of
    ``context`` tokens already cached. Weights are read once per step whatever the batch; each
    sequence reads its cached K and V and writes the new tokens' K and V.
    """
    if spec.num_params is None:
        raise ValueError(f"spec {spec.name!r} has no num_params; the weight cost is unknown")
    positive_int("new_tokens", new_tokens)
    positive_int("context", context, minimum=0)
    positive_int("batch", batch)
    tokens = batch * new_tokens
    # causal: the i-th new token attends to context + i + 1 positions
    attended = context + (new_tokens + 1) / 2
    attn_flops = 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended * tokens
    flops = 2 * spec.num_params * tokens + attn_flops
    weight_bytes = spec.num_params * spec.dtype_bytes
    kv_bytes = batch * (context + new_tokens) * spec.kv_bytes_per_token
    return StepCost(flops, weight_bytes + kv_bytes)


@dataclass(frozen=True)
class StepTime:
    """The roofline's estimate of one serving step, for :func:`kvlab.serving.simulate`.

    A step reads every weight once, whatever the batch, and each running sequence's cached K and
    V; it computes ``2 x params`` FLOPs per new token plus attention. Decode (one token per
    sequence) is memory-bound, so adding sequences to the batch costs little until the KV reads or
    the FLOPs catch up; a long prefill is compute-bound. Swapping moves K and V over PCIe
    (``pcie_bytes_per_s``; about 25 GB/s for PCIe 4.0 x16 in practice). A lower bound: real
    kernels reach a fraction of the peaks.
    """

    spec: ModelSpec
    gpu: GPU
    pcie_bytes_per_s: float = 25e9

    def __post_init__(self):
        if self.spec.num_params is None:
            raise ValueError(
                f"spec {self.spec.name!r} has no num_params; the weight cost is unknown"
            )
        if not self.pcie_bytes_per_s > 0:
            raise ValueError(f"pcie_bytes_per_s must be > 0, got {self.pcie_bytes_per_s}")

    def seconds(
        self, new_tokens: int, attended: float, kv_tokens: int, swapped_tokens: int = 0
    ) -> float:
        """A step computing ``new_tokens`` tokens in all, which attend to ``attended`` positions in
        all, reading and writing ``kv_tokens`` tokens of K and V, and swapping ``swapped_tokens``."""
        if min(new_tokens, attended, kv_tokens, swapped_tokens) < 0:
            raise ValueError(
                "new_tokens, attended, kv_tokens and swapped_tokens must be >= 0, got "
                f"{new_tokens}, {attended}, {kv_tokens}, {swapped_tokens}"
            )
        spec = self.spec
        flops = 2 * spec.num_params * new_tokens  # as step_cost, for a batch of mixed lengths
        flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended
        moved = spec.num_params * spec.dtype_bytes + kv_tokens * spec.kv_bytes_per_token
        swap = swapped_tokens * spec.kv_bytes_per_token / self.pcie_bytes_per_s
        return StepCost(flops, moved).seconds(self.gpu) + swap


def measure_matmul_rate(
    batches: list[int], dim: int = 2048, device: str = "cpu", repeats: int = 5
) -> list[tuple[int, float, float]]:
    """Time ``W @ X`` for a ``dim x dim`` weight and ``X`` of ``batch`` columns.

    Returns ``(batch, achieved FLOP/s, intensity)`` per batch: the measured version of the
    roofline's left slope. A batch of 1 is a decode step's matrix-vector product. Each figure is
    the median of ``repeats`` timed runs after a warm-up, so one interruption on a busy machine
    does not decide it; pick ``dim`` so that W (4 x dim² bytes) is larger than the CPU's caches.
    """
    import statistics
    import time

    import torch

    positive_int("dim", dim)
    positive_int("repeats", repeats)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(dim, dim, generator=g).to(device)
    rows = []
    for batch in batches:
        positive_int("batch", batch)
        x = torch.randn(dim, batch, generator=g).to(device)
        w @ x  # warm-up
        if device != "cpu":
            torch.cuda.synchronize()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            w @ x
            if device != "cpu":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        flops = 2 * dim * dim * batch
        moved = 4 * (dim * dim + 2 * dim * batch)  # fp32: read W and X, write W @ X
        rows.append((batch, flops / statistics.median(seconds), flops / moved))
    return rows


def describe_measured_rates(rows: list[tuple[int, float, float]], noise: float = 0.10) -> list[str]:
    """What :func:`measure_matmul_rate`'s rows show, in sentences written from the numbers.

    The first says what a batch of 1 pulled from memory; the second whether batching paid (a
    batch doing at least twice the FLOP/s of batch 1), else that the machine was busy. Then one
    sentence per batch that ran more than ``noise`` (a share) below the batch before it: a
    smaller dip is timing noise on a plateau and is not reported. Only a drop from batch 1 is
    put down to batch 1's tuned matrix-vector kernel.
    """
    if not rows:
        raise ValueError("rows must hold at least one (batch, rate, intensity) row")
    if not 0 <= noise < 1:
        raise ValueError(f"noise must be a share in [0, 1), got {noise!r}")
    batch_1, rate_1, intensity_1 = rows[0]
    bandwidth = rate_1 / intensity_1
    lines = [
        f"A batch of {batch_1} read the matrix at about {bandwidth / 1e9:.0f} GB/s and did "
        f"{rate_1 / 1e9:.1f} GFLOP/s."
    ]
    batch_n, rate_n, _ = rows[-1]
    gain = rate_n / rate_1
    if len(rows) > 1 and gain >= 2:
        lines.append(
            f"A batch of {batch_n} did {gain:.0f}x more arithmetic per second: the matrix was "
            f"read once and every weight used {batch_n} times. That is why servers decode many "
            "guests per step."
        )
    elif len(rows) > 1:
        lines.append(
            f"Here a batch of {batch_n} was only {gain:.1f}x faster per FLOP than a batch of "
            f"{batch_1}, less than the roofline allows: something else was using this machine, "
            "or its memory is unusually fast. Run the cell above again."
        )
    dips = [
        (before, after)
        for before, after in zip(rows[:-1], rows[1:], strict=True)
        if after[1] < before[1] * (1 - noise)
    ]
    for (low, low_rate, _), (high, high_rate, _) in dips:
        drop = 1 - high_rate / low_rate
        why = (
            "CPU matrix libraries pick a kernel per shape, and the matrix-vector product of "
            "batch 1 has its own tuned one"
            if low == 1
            else "CPU matrix libraries pick a kernel per shape and not every shape gets a fast "
            "one, or another program took the CPU for a moment (run the cell again to tell which)"
        )
        lines.append(
            f"Batch {high} ({high_rate / 1e9:.1f} GFLOP/s) ran {drop:.0%} below batch {low} "
            f"({low_rate / 1e9:.1f} GFLOP/s): {why}."
        )
    if dips:
        lines.append("The roofline is a ceiling, not a promise.")
    return lines
