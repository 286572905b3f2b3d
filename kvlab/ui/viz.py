"""Matplotlib pictures used by the labs, in the course's colours and hotel words."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlab.models import ModelSpec
from kvlab.perf.roofline import GPU, StepCost
from kvlab.serving.replay import seconds_shut

# The colours and legend words are the widget's (one palette); notebooks use them as viz.COLORS.
from kvlab.ui.widgets.palette import COLORS, GUEST_PALETTE, LEGEND, WASTE_LABELS, guest_colors  # noqa: F401

SERIES_COLORS = ("#6a1b9a", "#1565c0", "#00838f", "#ef6c00")


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
    """Log-log roofline of each GPU with labelled workload points placed on the first GPU's roof.

    Each GPU has its own colour and line style (GPUs of the same peak share the flat roof: the
    dashes show both), and its name is written on its memory slope."""
    import numpy as np

    ax = _axes(ax, figsize=(7.5, 4.5))
    x = np.logspace(-1, 4, 200)
    colors = (SERIES_COLORS[0], SERIES_COLORS[3], SERIES_COLORS[2], SERIES_COLORS[1])
    styles = ("-", "--", "-.", ":")
    drawn = []
    for k, gpu in enumerate(gpus):
        color, style = colors[k % len(colors)], styles[k % len(styles)]
        ax.loglog(
            x,
            [gpu.attainable_flops(i) / 1e12 for i in x],
            color=color,
            linestyle=style,
            linewidth=2.2 if k == 0 else 1.7,
            zorder=2 + 0.1 * k,
            label=f"{gpu.name}: {gpu.hbm_bytes_per_s / 1e12:g} TB/s, "
            f"{gpu.peak_flops / 1e12:g} TFLOP/s, ridge {gpu.ridge_intensity:.0f}",
        )
        ax.axvline(gpu.ridge_intensity, color=color, linestyle=":", linewidth=0.8)
        drawn.append((gpu, color))
    ref = gpus[0]
    for label, cost in points.items():
        y = ref.attainable_flops(cost.intensity) / 1e12
        ax.scatter([cost.intensity], [y], color="black", zorder=3, s=18)
        ax.annotate(
            label, (cost.intensity, y), textcoords="offset points", xytext=(5, -12), fontsize=8
        )
    ax.set_xlim(x[0], x[-1])
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable TFLOP/s (bf16)")
    ax.set_title(f"Roofline; points placed on the {ref.name} roof, dotted lines = ridge points")
    ax.legend(loc="lower right", fontsize=8)
    ax.figure.tight_layout()
    # direct labels on the slopes, turned to the slope as drawn (known once the layout is), each
    # a little further right than the one above it so that no two sit on top of each other
    (x0, y0), (x1, y1) = ax.transData.transform([(1.0, 1.0), (10.0, 10.0)])
    angle = float(np.degrees(np.arctan2(y1 - y0, x1 - x0)))
    by_bandwidth = sorted(drawn, key=lambda drawn_gpu: -drawn_gpu[0].hbm_bytes_per_s)
    for rank, (gpu, color) in enumerate(by_bandwidth):
        at = x[0] * 1.3 * 1.5**rank
        ax.text(
            at,
            gpu.attainable_flops(at) / 1e12,
            gpu.name,
            rotation=angle,
            rotation_mode="anchor",
            ha="left",
            va="center",
            fontsize=7.5,
            color=color,
            zorder=4,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"},
        )
    return ax


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


def _label_bars(ax, groups, fmt: str, fontsize: int) -> None:
    """Write each bar's height above it (bars of NaN height, the paper's missing values, stay bare)."""
    for bars in groups:
        for bar in bars:
            h = bar.get_height()
            if h == h:
                x = bar.get_x() + bar.get_width() / 2
                ax.annotate(fmt.format(h), (x, h), ha="center", va="bottom", fontsize=fontsize)


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
    _label_bars(ax, (b1, b2), "{:.1f}%", fontsize=8)
    ax.set_xticks(x, names)
    ax.set_ylabel("memory holding token states (%)")
    ax.set_ylim(0, 110)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("How much of the KV memory holds tokens")
    ax.figure.tight_layout()
    return ax


def _floor_plan_style(trace, index: int, beds_per_floor: int | None):
    """Checked arguments: frame index, beds per floor, and whether the plan is small enough to
    label every room (a dozen rooms, as in Lab 03) or every booking (a few hundred beds)."""
    from kvlab.core.validate import positive_int
    from kvlab.ui.widgets.frames import RECORD_HOW

    if trace is None:
        raise TypeError(f"trace is None: {RECORD_HOW}")
    if not trace.frames:
        raise ValueError(f"trace has no frames: {RECORD_HOW}")
    count = len(trace.frames)
    if isinstance(index, bool) or not isinstance(index, int) or not -count <= index < count:
        raise ValueError(f"index must be a frame in -{count}..{count - 1}, got {index!r}")
    per_floor = positive_int("beds_per_floor", beds_per_floor or min(trace.capacity, 1024))
    labelled = trace.num_blocks <= 64 if trace.block_size > 1 else trace.capacity <= 256
    return index % count, per_floor, labelled


class _Floors:
    """Draws on an axes where floor f is the row y = f and beds run along x, ``per_floor`` a row."""

    def __init__(self, ax, per_floor: int):
        self.ax, self.per_floor = ax, per_floor

    def span(self, start: int, length: int, **style) -> None:
        """Beds [start, start+length), wrapping onto following floors."""
        from matplotlib.patches import Rectangle

        while length > 0:
            floor, col = divmod(start, self.per_floor)
            width = min(length, self.per_floor - col)
            self.ax.add_patch(Rectangle((col, floor), width, 0.86, **style))
            start, length = start + width, length - width

    def beds(self, start: int, used: int, future: int, internal: int, color: str) -> None:
        """A stretch of one guest's beds: tokens, then reserved for future, then never used."""
        self.span(start, used, facecolor=color, edgecolor="none")
        self.span(start + used, future, facecolor=COLORS["future"], edgecolor="none")
        self.span(start + used + future, internal, facecolor=COLORS["internal"], edgecolor="none")

    def label(self, start: int, length: int, text: str) -> None:
        """``text`` in the middle of beds [start, start+length) on their first floor, legible on
        any guest's colour."""
        from matplotlib import patheffects

        floor, col = divmod(start, self.per_floor)
        width = min(length, self.per_floor - col)
        outline = [patheffects.withStroke(linewidth=2.2, foreground="black")]
        self.ax.text(
            col + width / 2, floor + 0.5, text, ha="center", va="center", color="white",
            fontsize=8, path_effects=outline,
        )  # fmt: skip

    def room(self, room: int, size: int, guests: list) -> None:
        """One room of a small paged plan: its border, its number and who holds it."""
        self.span(room * size, size, facecolor="none", edgecolor="#57606a", lw=0.8)
        floor, col = divmod(room * size, self.per_floor)
        self.ax.text(
            col + 0.05 * size, floor + 0.06, f"room {room}", fontsize=6, va="top",
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"},
        )  # fmt: skip
        if guests:
            self.label(room * size, size, " / ".join(map(str, guests)))


def _floor_plan_legend(
    fig,
    drawn: dict,
    present: set,
    shared: bool,
    largest: bool,
    cached: bool = False,
    lengths_known: bool = True,
) -> None:
    """Swatches for what the picture holds, guests in the colours they were drawn in."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.patches import Patch

    if len(drawn) <= 5:  # few guests: by name
        handles = [Patch(facecolor=color, label=str(guest)) for guest, color in drawn.items()]
    else:
        colors = list(dict.fromkeys(drawn.values()))[:4]
        handles = [tuple(Patch(facecolor=c) for c in colors)]
    words = {k: WASTE_LABELS[k].split(": ")[-1] for k in ("future", "internal")}
    if not lengths_known:  # the widget's words: amber is every empty booked bed then
        words["future"] = LEGEND["future_unknown"]
    handles += [
        Patch(facecolor=COLORS[k], label=words[k]) for k in ("future", "internal") if k in present
    ]
    handles.append(Patch(facecolor=COLORS["vacant"], edgecolor=COLORS["edge"], label="free"))
    if cached:
        handles.append(
            Patch(
                facecolor=COLORS["vacant"],
                edgecolor=COLORS["cached"],
                hatch="////",
                lw=0,
                label=LEGEND["cached"],
            )
        )
    if shared:
        handles.append(
            Patch(facecolor="none", edgecolor=COLORS["shared"], lw=2, label="shared room")
        )
    if largest:
        handles.append(Patch(facecolor="none", edgecolor="black", label="largest free extent"))
    labels = [
        "tokens (one colour per guest)" if isinstance(h, tuple) else h.get_label() for h in handles
    ]
    fig.legend(
        handles,
        labels,
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
        loc="lower center",
        ncol=min(len(handles), 6),
        fontsize=7,
        frameon=False,
    )


def plot_floor_plan(trace, index: int = -1, beds_per_floor: int | None = None, ax=None, title=None):
    """A static floor plan of one frame: each floor is a row of beds; guests in their colours.

    Beds holding tokens take the guest's colour (guests drawn next to each other never share
    one); booked beds still to be written are amber; booked beds nobody will use are red; free
    beds are white; cached rooms (prefix caching: free, still holding a past guest's tokens) are
    striped in cyan. Small plans (a dozen rooms) outline every room and write its number and its
    guest. Contiguous bookings also outline the largest free extent; under paging any free room
    serves any guest, so a paged plan does not.
    """
    from kvlab.core.accounting import split_waste
    from kvlab.ui.widgets.frames import default_room_size, is_paged

    index, per_floor, labelled = _floor_plan_style(trace, index, beds_per_floor)
    frame = trace.frames[index]
    size, paged = trace.block_size, is_paged(trace)
    colors = guest_colors(trace, default_room_size(trace))
    floors = -(-trace.capacity // per_floor)
    floor_height = 0.55 if labelled else 0.16
    ax = _axes(ax, figsize=(8, max(1.6, floor_height * floors + 0.9) + 0.35))
    plan = _Floors(ax, per_floor)
    plan.span(0, trace.capacity, facecolor=COLORS["vacant"], edgecolor="none")
    drawn, present, holders = {}, set(), {}
    for guest, table in frame.tables.items():
        used, future, internal = split_waste(
            frame.booked[guest], frame.tokens[guest], frame.final.get(guest)
        )
        drawn[guest] = colors[guest]
        present |= {k for k, n in (("future", future), ("internal", internal)) if n}
        if not paged:  # contiguous booking: one stretch of beds
            start, length = min(table) * size, len(table) * size
            plan.beds(start, used, future, internal, colors[guest])
            plan.span(start, length, facecolor="none", edgecolor="white", lw=0.8)
            if labelled:
                plan.label(start, length, str(guest))
            continue
        for i, room in enumerate(table):  # rooms of a key card, filled in logical order
            room_used = max(0, min(size, used - i * size))
            room_will = max(0, min(size, used + future - i * size))
            plan.beds(room * size, room_used, room_will - room_used, size - room_will, drawn[guest])
            holders.setdefault(room, []).append(guest)
    cached = [room for room in dict.fromkeys(frame.cached) if room not in holders] if paged else []
    for room in cached:
        plan.span(
            room * size,
            size,
            facecolor=COLORS["vacant"],
            edgecolor=COLORS["cached"],
            hatch="////",
            lw=0,
        )
    shared = [room for room, guests in holders.items() if len(guests) > 1]
    for room in shared:
        plan.span(room * size, size, facecolor="none", edgecolor=COLORS["shared"], lw=2)
    if labelled and paged:
        for room in range(trace.num_blocks):
            plan.room(room, size, holders.get(room, []))
    runs = [] if paged else trace.free_runs(index)
    largest = max(runs, key=lambda r: (r[1], -r[0])) if runs else None
    if largest:
        plan.span(largest[0] * size, largest[1] * size, facecolor="none", edgecolor="black", lw=1.2)

    known = all(frame.final.get(guest) is not None for guest in frame.tables)
    _floor_plan_legend(
        ax.figure, drawn, present, bool(shared), bool(largest), bool(cached), lengths_known=known
    )
    ax.set_xlim(0, per_floor)
    ax.set_ylim(floors, 0)
    ax.set_yticks([f + 0.43 for f in range(floors)], [str(f) for f in range(floors)], fontsize=6)
    ax.set_ylabel("floor")
    rooms = f" = {per_floor / size:g} rooms" if paged else ""
    ax.set_xlabel(f"bed within the floor ({per_floor} beds{rooms} per floor)")
    if title is None:
        free = trace.usage(index).free
        if paged:
            tail = f"{trace.num_blocks - len(holders)} rooms free ({free} beds)"
            if cached:
                tail += f", {len(cached)} of them cached"
        else:
            tail = f"{free} beds free, largest free extent {largest[1] * size if largest else 0}"
        note = f" ({frame.note})" if frame.note else ""
        title = f"t = {frame.time:.1f} s, {frame.event}{note}: {len(frame.tables)} guests, {tail}"
    ax.set_title(title, fontsize=9)
    ax.figure.tight_layout(rect=(0, 0.35 / ax.figure.get_figheight(), 1, 1))
    return ax


def plot_fragmentation_over_time(
    runs: dict[str, tuple[list, list, list]], axes=None, step_seconds: float = 0.05
):
    """Per placement policy: external fragmentation over time (left), and the seconds the door
    has been shut by it so far (right), a dot where a new guest is first turned away.

    ``runs`` maps a label to ``(times, fragmentation, blocked)``, one entry per decode step of
    ``step_seconds``: ``blocked`` is the guest refused at that step although enough beds were free
    in total (``ReplayResult.blocked``), or None.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (label, (times, frag, blocked)), color in zip(runs.items(), SERIES_COLORS, strict=False):
        so_far = seconds_shut(blocked, step_seconds)
        shut = so_far[-1] if so_far else 0.0
        first_seen, seen = [], set()
        for time, guest, now in zip(times, blocked, so_far, strict=True):
            if guest is not None and guest not in seen:
                seen.add(guest)
                first_seen.append((time, now))
        guests = f"{len(seen)} guest{'' if len(seen) == 1 else 's'}"
        axes[0].plot(times, [f * 100 for f in frag], label=label, color=color, lw=0.9)
        axes[1].step(
            times, so_far, where="post", color=color, label=f"{label}: {guests}, {shut:.1f} s"
        )
        if first_seen:
            axes[1].scatter(*zip(*first_seen, strict=True), color=color, s=14, zorder=3)
    axes[0].set_ylabel("external fragmentation (%)")
    axes[0].set_title("1 − largest free extent / total free", fontsize=9)
    axes[1].set_ylabel("seconds the door was shut")
    axes[1].set_title(
        "guests refused although enough beds were free\n(a dot: a new guest turned away)",
        fontsize=9,
    )
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
    for (name, shares), color in zip(used.items(), SERIES_COLORS, strict=False):
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


def plot_serving_day(results: dict, title: str = "One day of serving, four caches of equal memory"):
    """Two panels over time, one line per cache: guests running at once, and the share of the
    memory handed out that holds token states (each a :class:`~kvlab.serving.SimResult`)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for (name, result), color in zip(results.items(), SERIES_COLORS, strict=False):
        top.plot(result.times, result.batch, color=color, lw=0.9, label=name)
        bottom.plot(result.times, [u * 100 for u in result.utilization], color=color, lw=0.9)
    unit = "s" if next(iter(results.values())).timed else "steps"
    top.set_ylabel("guests in the hotel")
    top.set_title(title)
    top.legend(fontsize=7, loc="upper right", ncol=2)
    bottom.set_ylabel("booked beds holding\ntokens (%)")
    bottom.set_ylim(0, 105)
    bottom.set_xlabel(f"time ({unit})")
    fig.tight_layout()
    return fig


def plot_batch_vs_paper(measured: dict[str, dict[str, float]], paper: dict[str, dict[str, float]]):
    """Mean guests at once per cache, ours beside the paper's, one panel per workload (Fig. 13)."""
    import numpy as np

    fig, axes = plt.subplots(1, len(measured), figsize=(4.2 * len(measured), 3.4), squeeze=False)
    for ax, (day, ours) in zip(axes[0], measured.items(), strict=True):
        names = list(ours)
        x = np.arange(len(names))
        theirs = [paper.get(day, {}).get(n, float("nan")) for n in names]
        b1 = ax.bar(x - 0.2, list(ours.values()), 0.4, label="simulated here", color=COLORS["used"])
        b2 = ax.bar(x + 0.2, theirs, 0.4, label="PagedAttention paper", color=COLORS["free"])
        _label_bars(ax, (b1, b2), "{:.1f}", fontsize=7)
        ax.set_xticks(x, [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax.set_title(day, fontsize=10)
        ax.set_ylabel("guests in the hotel at once (mean)")
        ax.set_ylim(0, max(max(ours.values()), np.nanmax(theirs)) * 1.18)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_throughput_sweep(budgets: list[int], throughput: dict[str, list[float]], ax=None):
    """Generated tokens per second against the KV memory given, one line per cache."""
    ax = _axes(ax, figsize=(7, 3.6))
    for (name, values), color in zip(throughput.items(), SERIES_COLORS, strict=False):
        ax.plot(budgets, values, marker="o", ms=3, color=color, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV memory (token slots, log scale)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Throughput against the size of the hotel")
    ax.legend(fontsize=7)
    ax.figure.tight_layout()
    return ax


def plot_plan(plan, axes=None, title: str | None = None):
    """A :class:`kvlab.perf.planner.Plan` in two panels: requests served at once per cache, and what a
    million generated tokens cost (tokens per second when the plan has no price)."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
    left, right = axes
    rows = plan.table()
    names = [r["system"].replace(" (paged)", "\n(paged)").replace("Orca ", "Orca\n") for r in rows]
    colors = [COLORS["free"]] * (len(rows) - 1) + [COLORS["used"]]
    at_once = [r["concurrency"] for r in rows]
    _label_bars(left, [left.bar(names, at_once, color=colors)], "{:,.0f}", 7)
    left.set_ylabel("requests served at once")
    priced = all(r["cost_per_million_tokens"] is not None for r in rows)
    values = [r["cost_per_million_tokens"] if priced else r["tokens_per_s"] for r in rows]
    bars = right.bar(names, values, color=colors)
    _label_bars(right, [bars], "${:,.3f}" if priced else "{:,.0f}", 7)
    right.set_ylabel("$ per million generated tokens" if priced else "generated tokens / s")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
        ax.margins(y=0.15)
    fig = left.figure
    fig.suptitle(title or plan.setup, fontsize=9)
    fig.tight_layout()
    return fig
