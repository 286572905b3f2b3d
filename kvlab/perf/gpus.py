"""GPUs for capacity and cost planning: memory, peak bandwidth and FLOP/s, and a price per hour.

:class:`PricedGPU` is a :class:`kvlab.perf.roofline.GPU` with a price, so it works wherever the roofline
does (``StepTime(spec, gpu)``). The catalogue below is what :func:`kvlab.perf.planner.plan` looks names
up in; :mod:`kvlab.perf.roofline` keeps its own presets (and ``GPUS``, which ``kvlab bench`` matches
devices against) unchanged.

Memory is the product's nominal size, its "GB" read as GiB (an "A100-40GB" has 40 GiB of HBM);
CUDA reports a little less on some parts (a vLLM start-up log shows 39.56 GiB on an A100-40GB).
Put what ``torch.cuda.mem_get_info()`` says into ``memory_bytes`` for an exact plan.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from kvlab.perf import roofline
from kvlab.perf.roofline import GPU

GiB = 2**30


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PricedGPU(GPU):
    """A GPU the planner can cost: the roofline's figures plus ``price_per_hour`` (US dollars per
    GPU-hour, or None when unknown). Prices are assumptions: change one with
    ``dataclasses.replace(gpu, price_per_hour=...)`` or :func:`with_price`."""

    price_per_hour: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str, got {self.name!r}")
        for field in ("hbm_bytes_per_s", "peak_flops", "memory_bytes"):
            _positive(field, getattr(self, field))
        if self.price_per_hour is not None:
            price = self.price_per_hour
            if isinstance(price, bool) or not isinstance(price, numbers.Real):
                raise TypeError(f"price_per_hour must be a number or None, got {price!r}")
            if not (price >= 0 and math.isfinite(price)):
                raise ValueError(f"price_per_hour must be >= 0 dollars per hour, got {price!r}")


def with_price(gpu: GPU, price_per_hour: float | None) -> PricedGPU:
    """The same GPU at another price (any roofline GPU becomes a :class:`PricedGPU`)."""
    if not isinstance(gpu, GPU):
        raise TypeError(f"gpu must be a kvlab.perf.roofline.GPU, got {gpu!r}")
    fields = {f.name: getattr(gpu, f.name) for f in dataclasses.fields(GPU)}
    return PricedGPU(**fields, price_per_hour=price_per_hour)


# Bandwidth and dense bf16 tensor-core FLOP/s: NVIDIA data sheets (SXM parts; the first four are
# kvlab.perf.roofline's presets). L4: 300 GB/s GDDR6, 24 GB, 121 TFLOP/s bf16 dense (the data sheet's
# 242 is with sparsity).
#
# PRICES ARE ASSUMPTIONS, NOT FACTS: a typical public on-demand cloud list price per GPU-hour in
# US dollars as of early 2026, rounded, between the large clouds and the GPU clouds. Real prices
# vary by provider, region, commitment and month (spot and reserved are far cheaper): edit them.
#
# ROOFLINE_CARDS: kvlab.perf.roofline's presets as the catalogue's cards (memory in GiB, priced).
ROOFLINE_CARDS: dict[GPU, PricedGPU] = {
    gpu: PricedGPU(name, gpu.hbm_bytes_per_s, gpu.peak_flops, memory_gib * GiB, price)
    for name, gpu, memory_gib, price in (
        ("A100-40GB", roofline.A100_40GB, 40, 1.50),
        ("A100-80GB", roofline.A100_80GB, 80, 1.80),
        ("H100-80GB", roofline.H100_SXM, 80, 2.90),
        ("H200-141GB", roofline.H200, 141, 3.70),
    )
}
CATALOGUE: dict[str, PricedGPU] = {
    g.name: g
    for g in (
        *ROOFLINE_CARDS.values(),
        # an L4's "24 GB" leaves 23,034 MiB to CUDA (ECC): a 6% smaller KV cache than 24 GiB
        PricedGPU("L4-24GB", 300e9, 121e12, 23_034 * 2**20, price_per_hour=0.80),
        # Colab's and Kaggle's GPU. T4 data sheet: 320 GB/s GDDR6, 16 GB, 65 TFLOP/s fp16 tensor
        # cores (Turing, sm_75: no bf16; Triton's kernels use no tensor cores there, see
        # docs/hubs.md); CUDA sees 15,360 MiB of it
        PricedGPU("T4-16GB", 320e9, 65e12, 15_360 * 2**20, price_per_hour=0.35),
    )
}
# other spellings people type (and kvlab.perf.roofline's names)
ALIASES = {
    "h100": "H100-80GB",
    "h100 sxm": "H100-80GB",
    "h100-sxm": "H100-80GB",
    "h200": "H200-141GB",
    "l4": "L4-24GB",
    "t4": "T4-16GB",
    "tesla t4": "T4-16GB",
}


def lookup(name: str) -> PricedGPU:
    """A catalogue GPU by name, case-insensitively ("H100-80GB", "h100", "H100 SXM")."""
    if not isinstance(name, str):
        raise TypeError(f"gpu name must be a str, got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    for gpu_name, gpu in CATALOGUE.items():
        if gpu_name.lower() == key:
            return gpu
    if key in ALIASES:
        return CATALOGUE[ALIASES[key]]
    raise ValueError(f"unknown gpu {name!r}; presets are {', '.join(CATALOGUE)}")
