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
# Guests' colours: cool tones only, so amber (future) and red (internal waste) stay unambiguous.
GUEST_PALETTE = (
    "#1f77b4",
    "#9467bd",
    "#17becf",
    "#393b79",
    "#e377c2",
    "#8c564b",
    "#6b6ecf",
    "#637939",
    "#aec7e8",
    "#c5b0d5",
    "#9edae5",
    "#7f7f7f",
    "#f7b6d2",
    "#c49c94",
    "#5254a3",
    "#b5cf6b",
)


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


WASTE_LABELS = {
    "used": "used: beds holding tokens",
    "future": "reserved for future tokens",
    "internal": "internal fragmentation: booked, never used",
    "free": "free",
}


def plot_usage_over_time(result, ax=None, title: str = "Where the hotel's beds go"):
    """Stacked area of used / reserved-for-future / internal / free shares at every step."""
    ax = _axes(ax, figsize=(8, 3.4))
    parts = ["used", "future", "internal", "free"]
    shares = [[u.share(p) * 100 for u in result.usage] for p in parts]
    ax.stackplot(
        result.times,
        *shares,
        labels=[WASTE_LABELS[p] for p in parts],
        colors=[COLORS[p] for p in parts],
        alpha=0.9,
    )
    busy = [t for t, b in zip(result.times, result.busy, strict=True) if b]
    if busy:
        ax.axvspan(busy[0], busy[-1], color="black", alpha=0.06, lw=0)
        ax.text(busy[0], 101, "guests waiting at the door", fontsize=8, va="bottom")
    ax.set_xlim(result.times[0], result.times[-1])
    ax.set_ylim(0, 100)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of KV memory (%)")
    ax.set_title(title, pad=14)
    ax.legend(loc="upper right", fontsize=7, framealpha=0.9)
    ax.figure.tight_layout()
    return ax


def plot_measured_vs_paper(measured: dict[str, float], paper: dict[str, float], ax=None):
    """Grouped bars: share of KV memory holding token states, ours next to the paper's."""
    import numpy as np

    ax = _axes(ax, figsize=(7, 3.4))
    names = list(measured)
    x = np.arange(len(names))
    ours = [measured[n] * 100 for n in names]
    theirs = [paper.get(n, float("nan")) * 100 for n in names]
    b1 = ax.bar(x - 0.2, ours, 0.4, label="measured here", color=COLORS["used"])
    b2 = ax.bar(x + 0.2, theirs, 0.4, label="PagedAttention paper", color=COLORS["free"])
    for bars in (b1, b2):
        for bar in bars:
            h = bar.get_height()
            if h == h:  # not NaN
                ax.annotate(
                    f"{h:.1f}%",
                    (bar.get_x() + bar.get_width() / 2, h),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    ax.set_xticks(x, names)
    ax.set_ylabel("memory holding token states (%)")
    ax.set_ylim(0, 110)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("How much of the KV memory holds tokens")
    ax.figure.tight_layout()
    return ax


def guest_color(guest) -> str:
    """A guest's colour: stable across frames, runs and machines."""
    import zlib

    return GUEST_PALETTE[zlib.crc32(str(guest).encode()) % len(GUEST_PALETTE)]


def plot_floor_plan(trace, index: int = -1, beds_per_floor: int | None = None, ax=None, title=None):
    """A static floor plan of one frame: each floor is a row of beds; guests in their colours.

    Beds holding tokens take the guest's colour; booked beds still to be written are amber; booked
    beds nobody will use are red; free beds are white. The largest run of free beds is outlined.
    """
    from matplotlib.patches import Rectangle

    from kvlab.trace import split_waste

    frame = trace.frames[index]
    beds = trace.capacity
    per_floor = beds_per_floor or min(beds, 1024)
    floors = -(-beds // per_floor)
    height = max(1.6, 0.16 * floors + 0.9) + 0.35
    ax = _axes(ax, figsize=(8, height))

    def span(start: int, length: int, **style):
        """Draw beds [start, start+length), wrapping onto following floors."""
        while length > 0:
            floor, col = divmod(start, per_floor)
            width = min(length, per_floor - col)
            ax.add_patch(Rectangle((col, floor), width, 0.86, **style))
            start, length = start + width, length - width

    span(0, beds, facecolor="white", edgecolor="none")
    for guest, table in frame.tables.items():
        used, future, _ = split_waste(
            frame.booked[guest], frame.tokens[guest], frame.final.get(guest)
        )
        rooms = list(table) if not isinstance(table, range) else None
        size = trace.room_size
        if rooms is None:  # contiguous booking: one stretch of beds
            start = table.start * size
            span(start, used, facecolor=guest_color(guest), edgecolor="none")
            span(start + used, future, facecolor=COLORS["future"], edgecolor="none")
            rest = len(table) * size - used - future
            span(start + used + future, rest, facecolor=COLORS["internal"], edgecolor="none")
            span(start, len(table) * size, facecolor="none", edgecolor="white", lw=0.8)
        else:  # rooms of a block table, filled in logical order
            for i, room in enumerate(rooms):
                filled = max(0, min(size, used - i * size))
                span(room * size, filled, facecolor=guest_color(guest), edgecolor="none")
                span(
                    room * size + filled,
                    size - filled,
                    facecolor=COLORS["future"],
                    edgecolor="none",
                )
    runs = trace.free_runs(index if index >= 0 else len(trace.frames) + index)
    if runs:
        start, length = max(runs, key=lambda r: (r[1], -r[0]))
        span(
            start * trace.room_size,
            length * trace.room_size,
            facecolor="none",
            edgecolor="black",
            lw=1.2,
        )
    from matplotlib.patches import Patch

    legend = [
        Patch(facecolor=GUEST_PALETTE[0], label="tokens (one colour per guest)"),
        Patch(facecolor=COLORS["future"], label="reserved for future tokens"),
        Patch(facecolor=COLORS["internal"], label="booked, never used"),
        Patch(facecolor="white", edgecolor="black", label="largest free run"),
    ]
    ax.figure.legend(handles=legend, loc="lower center", ncol=4, fontsize=7, frameon=False)
    ax.set_xlim(0, per_floor)
    ax.set_ylim(floors, 0)
    ax.set_yticks([f + 0.43 for f in range(floors)], [str(f) for f in range(floors)], fontsize=6)
    ax.set_ylabel("floor")
    ax.set_xlabel(f"bed within the floor ({per_floor} beds per floor)")
    if title is None:
        free = sum(length for _, length in runs) * trace.room_size
        largest = max((length for _, length in runs), default=0) * trace.room_size
        title = (
            f"t = {frame.time:.1f} s, {frame.event}{' (' + frame.note + ')' if frame.note else ''}: "
            f"{len(frame.tables)} guests, {free} beds free, largest free run {largest}"
        )
    ax.set_title(title, fontsize=9)
    ax.figure.tight_layout(rect=(0, 0.35 / ax.figure.get_figheight(), 1, 1))
    return ax


def plot_fragmentation_over_time(runs: dict[str, tuple[list, list, list]], axes=None):
    """Two panels per placement policy: external fragmentation, and impossible allocations so far.

    ``runs`` maps a label to ``(times, fragmentation, impossible_so_far)``.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for (label, (times, frag, impossible)), color in zip(runs.items(), GPU_COLORS, strict=False):
        axes[0].plot(times, [f * 100 for f in frag], label=label, color=color, lw=0.9)
        axes[1].plot(times, impossible, label=label, color=color)
    axes[0].set_ylabel("external fragmentation (%)")
    axes[0].set_title("1 - largest free run / total free", fontsize=9)
    axes[1].set_ylabel("impossible allocations so far")
    axes[1].set_title("refused although enough beds were free", fontsize=9)
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=8)
    axes[0].figure.tight_layout()
    return axes


def plot_block_size_tradeoff(
    sizes: list[int], used: dict[str, list[float]], rooms: dict[str, list[float]]
):
    """Left: share of memory holding tokens per block size; right: key-card length per guest."""
    _, axes = plt.subplots(1, 2, figsize=(9, 3.3))
    for (name, shares), color in zip(used.items(), GPU_COLORS, strict=False):
        axes[0].plot(sizes, [s * 100 for s in shares], marker="o", label=name, color=color)
        axes[1].plot(sizes, rooms[name], marker="o", label=name, color=color)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("block size (beds per room)")
        ax.axvspan(16, 128, color=COLORS["used"], alpha=0.08, lw=0)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("memory holding tokens (%)")
    axes[0].set_title("waste grows with the room size", fontsize=9)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("key-card entries per guest")
    axes[1].set_title("key cards shrink with the room size", fontsize=9)
    axes[0].figure.tight_layout()
    return axes
