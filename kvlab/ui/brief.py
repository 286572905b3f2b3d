"""The leader's brief (Lab 08): a page a technical leader can forward, built from planner results.

It says in plain words what the KV cache is, why a contiguous booking wastes it, what paging and
sharing buy and what they do not, then gives the planner's figures for each set-up and the
assumptions behind them. :func:`brief_markdown` is the text, :func:`brief_figure` the picture,
:func:`write_brief` writes both (Markdown and PNG) beside each other.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.perf.planner import REALISTIC_FRACTION, SLOW_TOKENS_PER_USER, Plan, _gib

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
is a bound from the GPU's data sheet: real engines reach a fraction of it, so costs below are a range, from that
bound to a realistic engine.

**What is left to decide.** vLLM, SGLang, TensorRT-LLM and TGI all page already, so nobody buys paging any more:
the gain is already in the price of any of them. What a team still chooses is how many requests run at once
(`max_num_seqs`: more is cheaper per token and slower for each user), how much GPU memory the engine may take
(`gpu_memory_utilization`), the longest request it accepts (context length), FP8 weights or KV cache (half the
bytes), and prefix caching (shared prompts held once)."""


def _gpus(n: int) -> str:
    return f"{n:,} GPU" if n == 1 else f"{n:,} GPUs"


def _table(p: Plan) -> str:
    """The plan's rows in a leader's words (no internal names)."""
    priced = p.price_per_gpu_hour is not None
    head = ["booking", "requests at once", "memory holding tokens", "tokens/s (all users)"]
    head += ["tokens/s per user"] + (["$ per million generated tokens*"] if priced else [])
    head += ["GPUs for the target*"] if p.target_tokens_per_s else []
    head += [f"GPUs for {p.users:,} users"] if p.users is not None else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in p.table():
        cells = [row["system"], f"{row['concurrency']:,.0f}", f"{row['memory_holding_tokens']:.0%}"]
        cells += [f"{row['tokens_per_s']:,.0f}", f"{row['tokens_per_s_per_request']:,.0f}"]
        if priced:
            low, high = row["cost_per_million_tokens"], row["cost_per_million_tokens_realistic"]
            cells.append(f"{low:,.3f}–{high:,.3f}")
        if p.target_tokens_per_s:
            cells.append(f"{row['gpus_needed']:,}–{row['gpus_needed_realistic']:,}")
        if p.users is not None:
            users = row["gpus_for_users"]
            cells.append("-" if users is None else f"{users:,}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plan_lines(name: str, p: Plan) -> list[str]:
    paged, oracle, orca = p.paged, p.oracle, p.contiguous
    lines = [f"### {name}", "", p.setup + ".", "", _table(p), ""]
    line = (
        f"Paged: about **{paged.concurrency:,.0f}** requests at once against "
        f"{oracle.concurrency:,.0f} with the best contiguous booking "
        f"({p.concurrency_gain_vs_oracle:.1f}×) and {orca.concurrency:,.0f} with max-length booking "
        f"({p.concurrency_gain:.1f}×); {paged.tokens_per_s:,.0f} generated tokens/s against "
        f"{oracle.tokens_per_s:,.0f} and {orca.tokens_per_s:,.0f}, "
        f"{paged.tokens_per_s_per_request:,.0f} tokens/s for each user."
    )
    if paged.cost_per_million_tokens is not None:
        line += (
            f" A million tokens cost {p.cost_range(paged)} instead of {p.cost_range(oracle)} and "
            f"{p.cost_range(orca)}."
        )
    if paged.gpus_needed is not None:
        line += (
            f" For {p.target_tokens_per_s:,.0f} tokens/s: {paged.gpus_needed:,}–"
            f"{_gpus(paged.gpus_needed_realistic)} paged, {orca.gpus_needed:,}–"
            f"{_gpus(orca.gpus_needed_realistic)} with max-length booking."
        )
    extra = [line for line in (p._speed_line(), p._users_line()) if line]
    return lines + [line, "", *extra, *([""] if extra else []), p._verdict(), "", _flags(p)]


def _flags(p: Plan) -> str:
    return f"To run it with vLLM: `{p.vllm_command()}`"


def _lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def _spread(values, digits: int = 0) -> str:
    low, high = min(values), max(values)
    same = round(low, digits) == round(high, digits)
    return f"about {low:.{digits}f}×" if same else f"{low:.{digits}f}–{high:.{digits}f}×"


def _bottom_line(plans: dict[str, Plan]) -> list[str]:
    """What a reader who stops here takes away: paging against the best contiguous booking first,
    then against max-length booking, who pages already, the costs as a range, and the levers."""
    oracle = _spread([p.concurrency_gain_vs_oracle for p in plans.values()], 1)
    fits = _spread([p.concurrency_gain for p in plans.values()])
    contexts = sorted({p.max_seq_len for p in plans.values()})
    at = " and ".join(f"{c:,}" for c in contexts)
    best = max(plans, key=lambda name: plans[name].throughput_gain)
    flat = {name: p for name, p in plans.items() if p.throughput_gain < 1.05}
    lines = [
        "**Bottom line**",
        "",
        f"- Paging fits {oracle} as many requests at once as the best contiguous booking (an oracle "
        "that knows each answer's length in advance), and "
        f"{fits} as many as booking every request its maximum length ({at} tokens here).",
        "- vLLM, SGLang, TensorRT-LLM and TGI all page already: this is a reason to use one of them, "
        "not a purchase. The levers a team still holds are max_num_seqs (requests at once), "
        "gpu_memory_utilization, the context length, FP8 weights or KV cache, and prefix caching.",
    ]
    if len(flat) < len(plans):
        lines.append(
            f"- Where memory is the limit it turns them into up to "
            f"{plans[best].throughput_gain:.1f}× the tokens per second ({_lower_first(best)}): "
            "cheaper tokens, fewer GPUs for a load."
        )
    for name, p in flat.items():
        lines.append(f"- {name}: more requests, not more tokens per second: {_why_flat(p)}.")
    priced = {name: p for name, p in plans.items() if p.paged.cost_per_million_tokens is not None}
    if priced:
        costs = "; ".join(f"{_lower_first(name)} {p.cost_range()}" for name, p in priced.items())
        lines.append(
            f"- A million generated tokens cost, paged: {costs} (from the data-sheet bound to a "
            f"realistic engine at {REALISTIC_FRACTION:.0%} of it)."
        )
    slow = [name for name, p in plans.items() if p.slow_for_users]
    for name in slow:
        lines.append(
            f"- {name}: each user gets {plans[name].tokens_per_user:,.1f} tokens/s, below "
            f"{SLOW_TOKENS_PER_USER:.0f}: too slow to read along; cap the requests at once."
        )
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
    spreads = sorted({p.memory.spread for p in plans.values() if p.memory and p.memory.spread})
    how_sure = f" How sure: {'; '.join(spreads)}." if spreads else ""
    return "- Memory: " + "; ".join(parts) + "." + how_sure


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
        "- \\* Costs and GPU counts are ranges: the first figure is the data-sheet bound (the roofline: peak"
        f" bandwidth and FLOP/s), the second a realistic engine at {REALISTIC_FRACTION:.0%} of it. The"
        " fraction is an assumption: the course's own paged-attention kernel reaches 68–85% of an H200's"
        " bandwidth alone and at its best (benchmarks/attention.json), and a whole serving step loses more"
        " (other kernels, sampling, scheduling, communication between GPUs). Measure yours.",
        "- Requests at once are capped at vLLM's default max_num_seqs where none is given (1,024 on GPUs"
        " of 70 GiB or more other than the A100, 256 on the rest).",
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
        # the bottom line travels with the picture: leaders forward the PNG on its own
        row[0].set_title(
            f"{name}\npaged: {p.concurrency_gain_vs_oracle:.1f}x the best contiguous, "
            f"{p.concurrency_gain_vs_max_length:.1f}x max-length",
            fontsize=8.5,
            loc="left",
        )
        _cost_ranges(row[1], p)
    fig.suptitle(
        "Requests served at once and what a million tokens cost, per set-up\n"
        f"(costs: bar = data-sheet bound, line up to a realistic engine at {REALISTIC_FRACTION:.0%} "
        "of it)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def _cost_ranges(ax, p: Plan) -> None:
    """On the cost panel: a line from each bar (the roofline's cost) up to the realistic cost, and
    the range written above it in place of the single figure."""
    rows = p.table()
    if any(r["cost_per_million_tokens"] is None for r in rows):
        return
    for text in list(ax.texts):
        text.remove()
    for bar, row in zip(ax.patches, rows, strict=True):
        low, high = row["cost_per_million_tokens"], row["cost_per_million_tokens_realistic"]
        x = bar.get_x() + bar.get_width() / 2
        ax.plot([x, x], [low, high], color="#37474f", linewidth=1.2)
        ax.plot([x - bar.get_width() / 4, x + bar.get_width() / 4], [high, high], color="#37474f")
        ax.annotate(f"${low:,.3f}–{high:,.3f}", (x, high), ha="center", va="bottom", fontsize=6)
    ax.set_ylim(0, 1.2 * max(r["cost_per_million_tokens_realistic"] for r in rows))


def brief_directory(name: str = "leader_brief") -> Path:
    """Where Lab 08 writes the brief (absolute): ``$KVLAB_BRIEF_DIR`` when set; in a notebook
    server (JupyterLab, Notebook: ``$JPY_SESSION_NAME`` is set) ``name`` beside the notebook (the
    kernel's working directory); run headless (``jupyter nbconvert --execute``, nbval, papermill),
    ``name`` in the directory the command was run from (``$PWD``: such runners start the kernel in
    the source notebook's folder, whatever ``--output-dir`` says, and the brief does not belong
    among the sources)."""
    import os

    chosen = os.environ.get("KVLAB_BRIEF_DIR")
    if chosen:
        return Path(chosen).resolve()
    shell = os.environ.get("PWD")
    if not os.environ.get("JPY_SESSION_NAME") and shell and Path(shell).is_dir():
        return (Path(shell) / name).resolve()
    return (Path.cwd() / name).resolve()


def write_brief(
    plans: dict[str, Plan], directory=".", stem: str = "leader_brief"
) -> tuple[Path, Path]:
    """Write ``stem.md`` and ``stem.png`` into ``directory`` (relative: to the working directory);
    return their absolute paths."""
    import matplotlib.pyplot as plt

    folder = Path(directory).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    markdown, picture = folder / f"{stem}.md", folder / f"{stem}.png"
    text = brief_markdown(plans)
    markdown.write_text(text + f"\n![The figures as a picture]({picture.name})\n")
    fig = brief_figure(plans)
    fig.savefig(picture, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return markdown, picture
