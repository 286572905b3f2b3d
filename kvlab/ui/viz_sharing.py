"""Lab 07's picture: rooms saved by sharing, ours beside the PagedAttention paper's ranges."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlab.serving.sharing import PAPER_SAVINGS
from kvlab.ui.viz import COLORS, SERIES_COLORS, _label_bars

PAPER_LABEL = "paper, n = 2-6 (range)"


def _saving(result) -> float:
    """A :class:`~kvlab.serving.sharing.SharingResult`'s saving, or a saving given as a number."""
    return float(getattr(result, "saving", result))


def _group(ax, x0: float, by_n: dict, span, labelled: set) -> None:
    """The bars of one kind at ``x0``, over the paper's span when there is one."""

    def label(text):
        if text in labelled:
            return None
        labelled.add(text)
        return text

    if span is not None:
        low, high = span
        ax.bar(
            x0,
            high - low,
            0.9,
            bottom=low,
            color=COLORS["free"],
            alpha=0.5,
            edgecolor="#455a64",
            linestyle="--",
            linewidth=0.8,
            zorder=3,
            label=label(PAPER_LABEL),
        )
    width = 0.8 / max(len(by_n), 1)
    for k, (n, result) in enumerate(by_n.items()):
        x = x0 - 0.4 + width * (k + 0.5)
        value = _saving(result) * 100
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        name = label(f"{n} samples or beams")
        bars = ax.bar(x, value, width * 0.9, color=color, zorder=2, label=name)
        _label_bars(ax, [bars], "{:.0f}%", fontsize=7)


def plot_sharing_savings(results_by_workload: dict, paper: dict = PAPER_SAVINGS, title=None):
    """One panel per workload; per kind (parallel sampling, beam search) a bar for each n or beam
    width, behind them a shaded span from the paper's lowest to highest saving over n = 2-6
    (the paper gives the range, not each n).

    ``results_by_workload``: ``{workload: {kind: {n: SharingResult or saving}}}``, the shape
    :func:`kvlab.serving.sharing.sharing_savings` returns; workloads are matched to ``paper`` by name.
    """
    days = list(results_by_workload)
    fig, axes = plt.subplots(1, len(days), figsize=(4.4 * len(days), 3.6), squeeze=False)
    for ax, day in zip(axes[0], days, strict=True):
        kinds = results_by_workload[day]
        labelled: set = set()
        for g, (kind, by_n) in enumerate(kinds.items()):
            _group(ax, g, by_n, paper.get(day, {}).get(kind), labelled)
        ax.set_xticks(range(len(kinds)), list(kinds))
        ax.set_ylim(0, 100)
        ax.set_ylabel("rooms saved by sharing (%)")
        ax.set_title(day, fontsize=10)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title or "Shared rooms: memory saved by forks and copy-on-write", fontsize=11)
    fig.tight_layout()
    return fig


# The paper's Fig. 16: vLLM with a shared prefix over Orca (Oracle), LLaMA-13B translating WMT16.
PAPER_PREFIX_SPEEDUP = {"one-shot": 1.67, "five-shot": 3.58}


def plot_prefix_days(days: dict, baseline: str, paper: dict = PAPER_PREFIX_SPEEDUP, title=None):
    """Tokens per second per cache on each shared-prefix day, each bar labelled with its speed-up
    over ``baseline`` (a cache's label), and the paper's speed-up for the best cache as a mark.

    ``days``: ``{day: {cache label: SimResult with a step-time model}}``.
    """
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    labels = list(next(iter(days.values())))
    width = 0.8 / len(labels)
    for d, (day, results) in enumerate(days.items()):
        base = results[baseline].tokens_per_second
        for k, label in enumerate(labels):
            x = d - 0.4 + width * (k + 0.5)
            value = results[label].tokens_per_second
            color = SERIES_COLORS[k % len(SERIES_COLORS)]
            ax.bar(x, value, width * 0.9, color=color, label=label if d == 0 else None)
            ax.annotate(f"{value / base:.2f}×", (x, value), ha="center", va="bottom", fontsize=7)
        if day in paper:
            x = d - 0.4 + width * (len(labels) - 0.5)
            ax.plot(
                [x - width / 2, x + width / 2],
                [base * paper[day]] * 2,
                color="black",
                lw=1.5,
                ls="--",
                label="paper (vLLM over Orca Oracle)" if d == 0 else None,
            )
    ax.set_xticks(range(len(days)), list(days))
    ax.set_ylabel("generated tokens / s")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title or "A shared prefix: the same day, three hotels", fontsize=10)
    fig.tight_layout()
    return fig


def _hit_rate_lines(xs, hit_rates: dict, xlabel: str, title: str):
    """Hit rate (%) against a log2 axis, one line per entry of ``hit_rates``."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for k, (label, rates) in enumerate(hit_rates.items()):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        ax.plot(xs, [r * 100 for r in rates], marker="o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("prompt tokens found cached (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_hit_rate_by_block_size(sizes, hit_rates: dict, title=None):
    """Share of prompt tokens found cached against the room size (log scale), one line per day.

    ``hit_rates``: ``{day: [hit rate per size]}``.
    """
    xlabel = "beds per room (block size)"
    return _hit_rate_lines(sizes, hit_rates, xlabel, title or "Only whole rooms are shared")


def plot_hit_rate_by_memory(capacities, hit_rates: dict, title=None):
    """Share of prompt tokens found cached against the hotel's size, one line per number of
    distinct prefixes: when their rooms no longer fit beside the guests, eviction takes them.

    ``hit_rates``: ``{label: [hit rate per capacity]}``; ``capacities`` in token slots.
    """
    title = title or "When memory runs short, cached rooms are evicted"
    return _hit_rate_lines(capacities, hit_rates, "beds in the hotel (KV token slots)", title)
