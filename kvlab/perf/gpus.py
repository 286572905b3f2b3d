"""GPUs for capacity and cost planning: memory, peak bandwidth and FLOP/s, and a price per hour.

:class:`PricedGPU` is a :class:`kvlab.perf.roofline.GPU` with a price, so it works wherever the roofline
does (``StepTime(spec, gpu)``). The catalogue below is what :func:`kvlab.perf.planner.plan` looks names
up in; :mod:`kvlab.perf.roofline` keeps its own presets (and ``GPUS``, which ``kvlab bench`` matches
devices against) unchanged.

One convention for memory, the same as :mod:`kvlab.perf.roofline`'s: ``memory_bytes`` is in bytes
and printed in GiB (2**30 bytes, :data:`GiB`); a card's figure is the total ``nvidia-smi`` reports
for it (``memory.total``: 40,960 MiB on an A100-40GB, 81,559 MiB on an H100 80GB HBM3, 143,771 MiB
on an H200, 23,034 MiB on an L4). Bandwidth is in bytes per second as data sheets give it (decimal
GB/s). CUDA hands a program about half a GiB less than nvidia-smi's total (a vLLM start-up log
shows 39.56 GiB on an A100-40GB): for an exact plan give the total that your own vLLM log or
``torch.cuda.mem_get_info()`` prints, with :func:`with_memory` (``kvlab plan --gpu-memory-gib``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from kvlab.perf import roofline
from kvlab.perf.roofline import GPU

GiB = roofline.GiB
MiB = roofline.MiB


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


# Where the figures come from. Bandwidth and dense bf16 tensor-core FLOP/s: NVIDIA data sheets
# (SXM parts; memory: the nvidia-smi totals above, Blackwell's from its data sheets; the first four are
# kvlab.perf.roofline's presets). L4: 300 GB/s GDDR6, 24 GB, 121 TFLOP/s bf16 dense (the data sheet's
# 242 is with sparsity).
#
# PRICES ARE ASSUMPTIONS, NOT FACTS: a typical public on-demand cloud list price per GPU-hour in
# US dollars as of early 2026, rounded, between the large clouds and the GPU clouds. Real prices
# vary by provider, region, commitment and month (spot and reserved are far cheaper): edit them.
#
# ROOFLINE_CARDS: kvlab.perf.roofline's presets as the catalogue's cards (the same figures, priced).
ROOFLINE_CARDS: dict[GPU, PricedGPU] = {
    gpu: PricedGPU(name, gpu.hbm_bytes_per_s, gpu.peak_flops, gpu.memory_bytes, price)
    for name, gpu, price in (
        ("A100-40GB", roofline.A100_40GB, 1.50),
        ("A100-80GB", roofline.A100_80GB, 1.80),
        ("H100-80GB", roofline.H100_SXM, 2.90),
        ("H200-141GB", roofline.H200, 3.70),
    )
}
CATALOGUE: dict[str, PricedGPU] = {
    g.name: g
    for g in (
        *ROOFLINE_CARDS.values(),
        # an L4's "24 GB" leaves 23,034 MiB to CUDA (ECC): a 6% smaller KV cache than 24 GiB
        PricedGPU("L4-24GB", 300e9, 121e12, 23_034 * MiB, price_per_hour=0.80),
        # Colab's and Kaggle's GPU. T4 data sheet: 320 GB/s GDDR6, 16 GB, 65 TFLOP/s fp16 tensor
        # cores (Turing, sm_75: no bf16; Triton's kernels use no tensor cores there, see
        # docs/hubs.md); CUDA sees 15,360 MiB of it
        PricedGPU("T4-16GB", 320e9, 65e12, 15_360 * MiB, price_per_hour=0.35),
        # Blackwell. NVIDIA's data sheets (DGX B200, GB200 NVL72, DGX B300 / HGX B300, per GPU):
        # HBM3e bandwidth 8 TB/s; dense BF16 tensor-core FLOP/s 2.25 PFLOP/s for B200 and
        # B300 (4.5 with sparsity), 2.5 for a GB200's B200 (5 with sparsity); memory as the
        # data sheets print it, in decimal GB (180, 186, 288: no nvidia-smi total measured
        # here, so give yours with --gpu-memory-gib for an exact plan). Prices: assumptions.
        PricedGPU("B200-180GB", 8e12, 2.25e15, 180e9, price_per_hour=5.50),
        PricedGPU("GB200-186GB", 8e12, 2.5e15, 186e9, price_per_hour=6.50),
        PricedGPU("B300-288GB", 8e12, 2.25e15, 288e9, price_per_hour=7.50),
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
    "b200": "B200-180GB",
    "gb200": "GB200-186GB",
    "b300": "B300-288GB",
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


def with_memory(gpu: GPU, memory_gib: float, *, name: str | None = None) -> PricedGPU:
    """The same GPU with ``memory_gib`` GiB of memory (a card not in the catalogue, or the total
    your vLLM log prints): bandwidth, FLOP/s and price are kept. Named ``"<name> (<X> GiB)"``
    unless ``name`` is given. ``kvlab plan --gpu H100-80GB --gpu-memory-gib 94`` uses this."""
    if not isinstance(gpu, GPU):
        raise TypeError(f"gpu must be a kvlab.perf.roofline.GPU, got {gpu!r}")
    memory_gib = _positive("memory_gib", memory_gib)
    if memory_gib > MAX_MEMORY_GIB:
        raise ValueError(
            f"memory_gib must be at most {MAX_MEMORY_GIB:,} GiB (one GPU), got {memory_gib:g}"
        )
    priced = gpu if isinstance(gpu, PricedGPU) else with_price(gpu, None)
    label = name or f"{priced.name} ({memory_gib:g} GiB)"
    return dataclasses.replace(priced, name=label, memory_bytes=memory_gib * GiB)


MAX_MEMORY_GIB = 4096  # no single GPU comes near (an H200 has 140 GiB, a B200 about 180)
