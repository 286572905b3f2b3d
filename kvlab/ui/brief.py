"""The leader's brief (Lab 08): a page a technical leader can forward, built from planner results.

It says in plain words what the KV cache is, why a contiguous booking wastes it, what paging and
sharing buy and what they do not, then gives the planner's figures for each set-up and the
assumptions behind them. :func:`brief_markdown` is the text, :func:`brief_figure` the picture,
:func:`write_brief` writes both (Markdown and PNG) beside each other.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.perf.planner import Plan, _gib

STORY = """\
**The hotel.** Every request a model serves keeps a running memory of its conversation on the GPU, the
*KV cache*, and it grows by one slot per generated token. Think of GPU memory as a hotel and requests as
guests. A serving system that books every guest the largest suite they might ever need (a whole maximum-length
request) leaves most of its beds empty: the PagedAttention paper measured only 20–38% of KV memory holding
real tokens in such systems, against 96% with paging.

**Why adding GPUs is the expensive fix.** When the hotel looks full, guests queue and the GPUs' arithmetic sits
idle waiting for memory. Buying more GPUs adds rooms, but they are booked the same wasteful way.

**What paging buys.** Paging (vLLM's PagedAttention) hands out small rooms of 16 beds only as a guest needs them,
so almost every bed holds a token and several times more requests run at once on the same GPU. The model's
weights are read from memory once per step for all of them, so more requests per step give more tokens per
second and a cheaper token, while memory bandwidth is the limit. Each request is served more slowly, which is why
servers cap how many run at once.

**What sharing buys.** Requests that start alike (the same system prompt, the same examples, several answers
to one prompt) can share rooms instead of holding copies, which frees more memory still (prefix caching).

**What it does not buy.** A single request is not faster: one guest alone takes as long in any hotel. Once the
GPUs' arithmetic is the limit, more requests at once only share the same tokens per second. And every figure here
is a bound from the GPU's data sheet: real engines reach a fraction of it, so compare the ratios, not the
absolutes."""


def _gpus(n: int) -> str:
    return f"{n:,} GPU" if n == 1 else f"{n:,} GPUs"


def _table(p: Plan) -> str:
    """The plan's rows in a leader's words (no internal names)."""
    priced = p.price_per_gpu_hour is not None
    head = ["booking", "requests at once", "memory holding tokens", "tokens/s (all users)"]
    head += ["tokens/s per user"] + (["$ per million generated tokens*"] if priced else [])
    head += ["GPUs for the target"] if p.target_tokens_per_s else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in p.table():
        cells = [row["system"], f"{row['concurrency']:,.0f}", f"{row['memory_holding_tokens']:.0%}"]
        cells += [f"{row['tokens_per_s']:,.0f}", f"{row['tokens_per_s_per_request']:,.0f}"]
        if priced:
            cells.append(f"{row['cost_per_million_tokens']:,.3f}")
        if p.target_tokens_per_s:
            cells.append(f"{row['gpus_needed']:,}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plan_lines(name: str, p: Plan) -> list[str]:
    paged, orca = p.paged, p.contiguous
    lines = [f"### {name}", "", p.setup + ".", "", _table(p), ""]
    line = (
        f"Paged: about **{paged.concurrency:,.0f}** requests at once against {orca.concurrency:,.0f} "
        f"with max-length booking ({p.concurrency_gain:.1f}×), "
        f"{paged.tokens_per_s:,.0f} against {orca.tokens_per_s:,.0f} generated tokens/s "
        f"({p.throughput_gain:.1f}×)."
    )
    if paged.cost_per_million_tokens is not None:
        line += (
            f" A million tokens cost ${paged.cost_per_million_tokens:,.3f} instead of "
            f"${orca.cost_per_million_tokens:,.3f}."
        )
    if paged.gpus_needed is not None:
        line += (
            f" For {p.target_tokens_per_s:,.0f} tokens/s: {_gpus(paged.gpus_needed)} paged, "
            f"{_gpus(orca.gpus_needed)} with max-length booking."
        )
    return lines + [line, "", p._verdict()]


def _lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def _bottom_line(plans: dict[str, Plan]) -> list[str]:
    """Three lines a reader who stops here takes away."""
    low = min(p.concurrency_gain for p in plans.values())
    high = max(p.concurrency_gain for p in plans.values())
    fits = f"about {low:.0f}×" if round(low) == round(high) else f"{low:.0f}–{high:.0f}×"
    best = max(plans, key=lambda name: plans[name].throughput_gain)
    flat = {name: p for name, p in plans.items() if p.throughput_gain < 1.05}
    lines = [
        "**Bottom line**",
        "",
        f"- Paging fits {fits} as many requests at once on the same GPUs.",
    ]
    if len(flat) < len(plans):
        lines.append(
            f"- Where memory is the limit it turns them into up to "
            f"{plans[best].throughput_gain:.1f}× the tokens per second ({_lower_first(best)}): "
            "cheaper tokens, fewer GPUs for a load."
        )
    for name, p in flat.items():
        lines.append(f"- {name}: more requests, not more tokens per second: {_why_flat(p)}.")
    lines.append("- One request is never faster: the gain is in how many are served at once.")
    return lines


def _why_flat(p: Plan) -> str:
    if p.capped:
        return f"the cap of {p.max_num_seqs:,} requests at once binds every booking"
    if p.paged.bound == "compute":
        return "the GPUs' arithmetic is already the limit"
    return "the requests book nearly their maximum length whatever the booking"


def _memory_assumptions(plans: dict[str, Plan]) -> str:
    """How each plan's memory was split, from the plans themselves."""
    parts = []
    for name, p in plans.items():
        parts.append(
            f"{_lower_first(name)}: {p.gpu_memory_utilization:.0%} of GPU memory used, "
            f"{_gib(p.weights_bytes)} of weights, {_gib(p.overhead_bytes)} of overhead, "
            f"{_gib(p.kv_cache_bytes)} of KV cache, {p.paged.memory_holding_tokens:.0%} "
            "of it holding tokens when paged"
        )
    return "- Memory: " + "; ".join(parts) + "."


def brief_markdown(
    plans: dict[str, Plan], title: str = "KV-cache memory: the leader's brief"
) -> str:
    """The one-page brief for ``plans`` (``{set-up name: Plan}``), as Markdown."""
    if not isinstance(plans, dict) or not plans:
        raise ValueError("plans must be a dict naming at least one kvlab.perf.planner.Plan")
    for name, p in plans.items():
        if not isinstance(p, Plan):
            raise TypeError(f"plans[{name!r}] must be a kvlab.perf.planner.Plan, got {p!r}")
    lines = [f"# {title}", "", *_bottom_line(plans), "", STORY, "", "## What the planner says", ""]
    for name, p in plans.items():
        lines += _plan_lines(name, p) + [""]
    prices = sorted(
        {
            f"{p.gpu.name} ${p.price_per_gpu_hour:.2f}"
            for p in plans.values()
            if p.price_per_gpu_hour is not None
        }
    )
    lines += [
        "## Assumptions",
        "",
        "- \\* Costs are data-sheet bounds (the roofline: peak bandwidth and FLOP/s); real engines reach a"
        " fraction of them, so expect real costs a few times higher. Compare the ratios.",
        "- Every request waiting (a busy server); lengths like the ShareGPT or Alpaca data sets the paper used.",
        "- Tokens per second from the roofline: the GPU's peak memory bandwidth and FLOP/s (tensor parallel: summed,"
        " communication ignored). Real engines reach a fraction of them.",
        f"- Prices per GPU-hour are assumptions to edit: {', '.join(prices) or 'none given'}.",
        _memory_assumptions(plans),
        "",
        "Source of the measured figures: Kwon et al., *Efficient Memory Management for Large Language Model Serving"
        " with PagedAttention*, SOSP 2023. Computed with the kvlab course's planner (`kvlab plan`).",
    ]
    return "\n".join(lines) + "\n"


def brief_figure(plans: dict[str, Plan]):
    """One row of :func:`kvlab.ui.viz.plot_plan` panels per set-up."""
    import matplotlib.pyplot as plt

    from kvlab.ui import viz

    fig, axes = plt.subplots(len(plans), 2, figsize=(8.4, 2.9 * len(plans)), squeeze=False)
    for row, (name, p) in zip(axes, plans.items(), strict=True):
        viz.plot_plan(p, axes=row)
        row[0].set_title(name, fontsize=9, loc="left")
    fig.suptitle("Requests served at once and what a million tokens cost, per set-up", fontsize=10)
    fig.tight_layout()
    return fig


def write_brief(
    plans: dict[str, Plan], directory=".", stem: str = "leader_brief"
) -> tuple[Path, Path]:
    """Write ``stem.md`` and ``stem.png`` into ``directory``; return their paths."""
    import matplotlib.pyplot as plt

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    markdown, picture = folder / f"{stem}.md", folder / f"{stem}.png"
    text = brief_markdown(plans)
    markdown.write_text(text + f"\n![The figures as a picture]({picture.name})\n")
    fig = brief_figure(plans)
    fig.savefig(picture, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return markdown, picture
