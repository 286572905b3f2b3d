"""Matplotlib pictures used by the labs, in the course's colours and hotel words."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlab.models import ModelSpec
from kvlab.roofline import GPU, StepCost

COLORS = {
    "used": "#2e7d32",  # beds with guests: token states
    "future": "#f9a825",  # booked beds a guest will use later
    "internal": "#c62828",  # booked beds nobody will ever use
    "free": "#b0bec5",
    "accent": "#1565c0",
}
GPU_COLORS = ("#6a1b9a", "#1565c0", "#00838f", "#ef6c00")


def _axes(ax, figsize=(7, 3.6)):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_kv_per_token(specs: list[ModelSpec], ax=None):
    """Bar chart of KV-cache kilobytes per token, one bar per model."""
    ax = _axes(ax)
    names = [s.name for s in specs]
    kib = [s.kv_bytes_per_token / 1024 for s in specs]
    bars = ax.bar(names, kib, color=COLORS["accent"])
    for bar, value in zip(bars, kib, strict=True):
        ax.annotate(
            f"{value:,.0f} KiB",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("KV cache per token (KiB)")
    ax.set_title("What one bed costs: KV bytes per token (16-bit)")
    ax.set_ylim(0, max(kib) * 1.18)
    ax.figure.tight_layout()
    return ax


def plot_roofline(gpus: list[GPU], points: dict[str, StepCost], ax=None):
    """Log-log roofline of each GPU with labelled workload points placed on the first GPU's roof."""
    import numpy as np

    ax = _axes(ax, figsize=(7.5, 4.5))
    x = np.logspace(-1, 4, 200)
    for gpu, color in zip(gpus, GPU_COLORS, strict=False):
        ax.loglog(x, [gpu.attainable_flops(i) / 1e12 for i in x], color=color, label=gpu.name)
        ax.axvline(gpu.ridge_intensity, color=color, linestyle=":", linewidth=0.8)
    ref = gpus[0]
    for label, cost in points.items():
        y = ref.attainable_flops(cost.intensity) / 1e12
        ax.scatter([cost.intensity], [y], color="black", zorder=3, s=18)
        ax.annotate(
            label, (cost.intensity, y), textcoords="offset points", xytext=(5, -12), fontsize=8
        )
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable TFLOP/s (bf16)")
    ax.set_title(f"Roofline; points placed on the {ref.name} roof, dotted lines = ridge points")
    ax.legend(loc="lower right", fontsize=8)
    ax.figure.tight_layout()
    return ax
