"""The decode kernel across a grid of shapes (``kvlab bench attention-grid``): batch x context x
GQA ratio, each row against the copy bandwidth and SDPA measured in the same run, and the
course's three targets read off the rows as pass or miss, with by how much.

One function, :func:`grid_shapes`, gives every row's shape and the bytes it moves, for the full
grid on a GPU and for the tiny one the CPU dry run (``--tiny``, Triton's interpreter) goes
through: the same code path, on shapes the interpreter finishes in seconds. On the CPU the
times are wall clock of one interpreted call and mean nothing; the report says so.
``python -m kvlab.perf.attention_grid [attention.json]`` prints the grid's Markdown table (Lab 05,
the README), or that it is not yet measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

# Llama-3-70B's attention (64 query heads on 8 KV heads: GQA 8:1) and plain multi-head attention
# (32 on 32: 1:1), head_dim 128, bf16, rooms of 16 beds.
GRID_BATCHES = (1, 8, 32, 128)
GRID_CONTEXTS = (512, 2048, 8192, 32768)
GRID_HEADS = ((64, 8), (32, 32))  # (q_heads, kv_heads)


@dataclass(frozen=True)
class GridSettings:
    """A grid and where its targets are read: ``big_tokens`` is the batch x context from which
    rows must reach ``copy_goal`` of the copy bandwidth; ``split_at`` the (batch, context)
    that split-K must carry to ``split_goal`` of it; ``sdpa_at`` where the kernel must be at
    least ``sdpa_goal`` times SDPA's speed on a contiguous cache."""

    batches: tuple = GRID_BATCHES
    contexts: tuple = GRID_CONTEXTS
    heads: tuple = GRID_HEADS
    head_dim: int = 128
    block_size: int = 16
    big_tokens: int = 65_536
    copy_goal: float = 0.85
    split_at: tuple = (1, 8192)
    split_goal: float = 0.6
    sdpa_at: tuple = (32, 8192)
    sdpa_goal: float = 1.0
    copy_bytes: int = 2**30  # the buffer a device-to-device copy is timed on


FULL = GridSettings()
# The CPU dry run: two batches, two contexts (one room, then several rooms with a partly filled
# last one), both GQA ratios in miniature; the targets read at the scaled shapes.
TINY = GridSettings(
    batches=(1, 2),
    contexts=(16, 40),
    heads=((8, 1), (2, 2)),
    head_dim=16,
    big_tokens=80,
    split_at=(1, 40),
    sdpa_at=(2, 40),
    copy_bytes=2**20,
)

# Every grid row has these fields (more where a part failed: "error", "sdpa_skipped").
ROW_FIELDS = (
    "gqa", "q_heads", "kv_heads", "head_dim", "block_size", "dtype", "batch", "context", "tokens",
    "kv_bytes", "bytes_moved", "num_splits", "ms", "GB_per_s", "fraction_of_copy", "sdpa_ms",
    "speed_vs_sdpa_contiguous", "max_error_vs_sdpa",
)  # fmt: skip
TARGET_FIELDS = ("target", "gqa", "goal", "value", "at", "status", "by", "rows")


def grid_shapes(settings: GridSettings = FULL, dtype_bytes: int = 2) -> list[dict]:
    """Every row's shape and the bytes the kernel must move for it: K and V of every token read
    once, the queries read and the output written (the split partials, which a good kernel keeps
    small, are not counted: the figure is the work's bytes, not the kernel's)."""
    shapes = []
    for q_heads, kv_heads in settings.heads:
        if q_heads % kv_heads:
            raise ValueError(f"heads: q_heads {q_heads} is not a multiple of kv_heads {kv_heads}")
        for batch in settings.batches:
            for context in settings.contexts:
                d = settings.head_dim
                kv_bytes = 2 * batch * context * kv_heads * d * dtype_bytes
                q_and_out = 2 * batch * q_heads * d * dtype_bytes
                shapes.append(
                    {
                        "gqa": f"{q_heads // kv_heads}:1",
                        "q_heads": q_heads,
                        "kv_heads": kv_heads,
                        "head_dim": d,
                        "block_size": settings.block_size,
                        "dtype": "bf16",
                        "batch": batch,
                        "context": context,
                        "tokens": batch * context,
                        "kv_bytes": kv_bytes,
                        "bytes_moved": kv_bytes + q_and_out,
                    }
                )
    return shapes


def _time_ms(fn, on_gpu: bool) -> float:
    """The median of many launches on a GPU (``triton.testing.do_bench``: L2 flushed between
    them); one call's wall clock on the CPU, where the interpreter's time means nothing."""
    if on_gpu:
        import triton.testing

        return triton.testing.do_bench(fn, return_mode="median")
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def copy_bandwidth(device, nbytes: int, on_gpu: bool) -> float:
    """Bytes per second a device-to-device copy moves, counting bytes read and written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), on_gpu)
    return 2 * nbytes / (ms * 1e-3)


def _contiguous(cache, tables, batch, context):
    """``[batch, kv_heads, context, head_dim]``: the same tokens as one dense tensor, gathered a
    few sequences at a time into one allocation (a whole gather at once would need it twice)."""
    import torch

    kv_heads, d = cache.shape[2:]
    out = torch.empty(batch, kv_heads, context, d, dtype=cache.dtype, device=cache.device)
    step = max(1, 2**28 // max(1, context * kv_heads * d * cache.element_size()))
    for i in range(0, batch, step):
        rooms = cache[tables[i : i + step].long()]  # [n, rooms, block, kv_heads, d]
        out[i : i + step] = rooms.flatten(1, 2)[:, :context].transpose(1, 2)
        del rooms
    return out


def _sdpa_room(shape: dict, device) -> str | None:
    """Why SDPA's contiguous copy does not fit beside the paged cache, or None when it does."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    need = shape["kv_bytes"] * 1.1 + 2**30
    if need > free:
        return f"its contiguous copy needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return None


def grid_row(shape: dict, device, copy: float, on_gpu: bool) -> dict:
    """One shape: the kernel as a server launches it (planned once, then launched), and SDPA on
    a contiguous copy of the same tokens; a part that fails leaves its reason in the row."""
    import torch

    from kvlab.ops.kernels import plan_splits, prepare_paged_decode
    from kvlab.ops.kernels.tiled import _multiprocessors, launch_config
    from kvlab.ops.testing import uniform_case

    row = {**shape, "num_splits": None, "ms": None, "GB_per_s": None, "fraction_of_copy": None}
    row.update(sdpa_ms=None, speed_vs_sdpa_contiguous=None, max_error_vs_sdpa=None)
    q_heads, kv_heads, d = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    batch, context = shape["batch"], shape["context"]
    args = None
    try:
        args = uniform_case(
            batch, context, shape["block_size"], q_heads=q_heads, kv_heads=kv_heads, head_dim=d,
            dtype=torch.bfloat16, device=device,
        )  # fmt: skip
        tile = launch_config(d, torch.bfloat16).tile
        plan = plan_splits(batch, kv_heads, context, tile, None, _multiprocessors(args[0].device))
        run = prepare_paged_decode(*args)
        out = run().float()  # the first call compiles
        ms = _time_ms(run, on_gpu)
        rate = shape["bytes_moved"] / (ms * 1e-3)
        row.update(num_splits=plan.num_splits, ms=round(ms, 4), GB_per_s=round(rate / 1e9, 1))
        row["fraction_of_copy"] = round(rate / copy, 3)
    except Exception as error:  # out of memory, a launch refused: the row says so, the grid goes on
        row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
        del args
        _release(device)
        return row
    q, k_cache, v_cache, tables, _ = args
    skip = _sdpa_room(shape, device)
    if skip:
        row["sdpa_skipped"] = skip
    else:
        try:
            k = _contiguous(k_cache, tables, batch, context)
            v = _contiguous(v_cache, tables, batch, context)
            queries = q.unsqueeze(2)
            gqa = q_heads != kv_heads

            def sdpa():
                return torch.nn.functional.scaled_dot_product_attention(
                    queries, k, v, enable_gqa=gqa
                )

            want = sdpa().squeeze(2).float()
            sdpa_ms = _time_ms(sdpa, on_gpu)
            row.update(sdpa_ms=round(sdpa_ms, 4), speed_vs_sdpa_contiguous=round(sdpa_ms / ms, 3))
            row["max_error_vs_sdpa"] = float(f"{(out - want).abs().max().item():.2g}")
            del k, v
        except Exception as error:
            row["sdpa_skipped"] = (
                f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            )
    del args, q, k_cache, v_cache, tables
    _release(device)
    return row


def _release(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def grid_targets(rows: list[dict], settings: GridSettings = FULL) -> list[dict]:
    """The three targets for each GQA ratio: ``pass`` or ``miss`` with ``by`` (the value minus
    the goal: negative is a miss by that much), ``not measured`` where a row is missing or
    failed. The copy target is judged on its worst row."""
    targets = []
    for gqa in dict.fromkeys(r["gqa"] for r in rows):
        mine = [r for r in rows if r["gqa"] == gqa]
        at = {(r["batch"], r["context"]): r for r in mine}
        big = [r for r in mine if r["tokens"] >= settings.big_tokens]
        timed = [r for r in big if r["fraction_of_copy"] is not None]
        worst = min(timed, key=lambda r: r["fraction_of_copy"]) if timed else None
        targets.append(
            _target(
                f">= {settings.copy_goal} of copy where B*ctx >= {settings.big_tokens:,} tokens",
                gqa, settings.copy_goal, worst, "fraction_of_copy",
                rows=len(big), untimed=len(big) - len(timed),
            )
        )  # fmt: skip
        b, c = settings.split_at
        targets.append(
            _target(f">= {settings.split_goal} of copy at B={b} ctx {c} (split-K)", gqa,
                    settings.split_goal, at.get((b, c)), "fraction_of_copy")
        )  # fmt: skip
        b, c = settings.sdpa_at
        targets.append(
            _target(f">= {settings.sdpa_goal}x SDPA at B={b} ctx {c}", gqa, settings.sdpa_goal,
                    at.get((b, c)), "speed_vs_sdpa_contiguous")
        )  # fmt: skip
    return targets


def _target(label, gqa, goal, row, field, rows=1, untimed=0) -> dict:
    value = None if row is None else row.get(field)
    target = {"target": label, "gqa": gqa, "goal": goal, "value": value, "rows": rows}
    target["at"] = None if row is None else {"batch": row["batch"], "context": row["context"]}
    if value is None:
        target.update(status="not measured", by=None)
    else:
        target.update(status="pass" if value >= goal else "miss", by=round(value - goal, 3))
    if untimed:
        target["untimed_rows"] = untimed
    return target


def attention_grid(settings: GridSettings = FULL, device: str | None = None) -> dict:
    """Every shape of the grid, the copy bandwidth first, then the targets. On the CPU (the dry
    run) only with the interpreter; a GPU run needs CUDA."""
    import torch

    from kvlab.ops.runtime import kernel_mode

    on_gpu = torch.cuda.is_available() and kernel_mode() != "interpreter"
    if device is None:
        device = "cuda" if on_gpu else "cpu"
    if not on_gpu and kernel_mode() != "interpreter":
        raise RuntimeError(
            "the attention grid needs a CUDA GPU, or Triton's interpreter on tiny shapes"
        )
    start = time.perf_counter()
    copy = copy_bandwidth(device, settings.copy_bytes, on_gpu)
    rows = []
    for shape in grid_shapes(settings):
        rows.append(grid_row(shape, device, copy, on_gpu))
        print(_grid_line(rows[-1]), flush=True)
    report = {
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu (Triton's interpreter)",
        "timing": "triton.testing.do_bench, median" if on_gpu
        else "one interpreted call's wall clock: not a measurement",
        "copy_GB_per_s": round(copy / 1e9, 1),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()},
        "bytes_moved": "K and V of every token once, plus the queries and the output",
        "rows": rows,
        "targets": grid_targets(rows, settings),
        "elapsed_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    return report


def _grid_line(row: dict) -> str:
    text = f"GQA {row['gqa']:>4s}  B={row['batch']:<4d} ctx {row['context']:<6d}"
    if "error" in row:
        return f"{text}  FAILED {row['error']}"
    text += (
        f"  splits {row['num_splits']:<3d} {row['ms']:9.4f} ms {row['GB_per_s']:8.1f} GB/s"
        f"  {row['fraction_of_copy']:.3f} of copy"
    )
    if row["speed_vs_sdpa_contiguous"] is not None:
        text += f"  {row['speed_vs_sdpa_contiguous']:.3f}x SDPA"
    else:
        text += f"  SDPA skipped: {row.get('sdpa_skipped')}"
    return text


def target_line(t: dict) -> str:
    """One target as a sentence: its status, by how much, where."""
    where = "" if t["at"] is None else f" (B={t['at']['batch']} ctx {t['at']['context']})"
    if t["status"] == "not measured":
        return f"GQA {t['gqa']}: {t['target']}: not measured"
    return f"GQA {t['gqa']}: {t['target']}: {t['status']} at {t['value']}{where}, by {t['by']:+}"


def grid_table(report: dict | None) -> str:
    """The grid as a Markdown table (fraction of copy bandwidth, and x SDPA, per shape) with the
    targets under it; the plain 'not yet measured' when no GPU run has filled it."""
    rows = (report or {}).get("rows") or []
    if not rows or not report.get("timing", "").startswith("triton"):
        return (
            "Not yet measured: no GPU has been lent since this grid was prepared "
            "(`kvlab bench attention-grid` fills `benchmarks/attention.json`'s `grid`)."
        )
    contexts = sorted({r["context"] for r in rows})
    lines = [
        f"{report['device']}, copy {report['copy_GB_per_s']:,} GB/s; each cell: share of the copy "
        "bandwidth / speed against SDPA on a contiguous cache.",
        "",
        "| GQA | B | " + " | ".join(f"ctx {c:,}" for c in contexts) + " |",
        "|---|---|" + "---|" * len(contexts),
    ]
    for gqa in dict.fromkeys(r["gqa"] for r in rows):
        for batch in sorted({r["batch"] for r in rows if r["gqa"] == gqa}):
            at = {r["context"]: r for r in rows if r["gqa"] == gqa and r["batch"] == batch}
            cells = [_cell(at.get(c)) for c in contexts]
            lines.append(f"| {gqa} | {batch} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {target_line(t)}" for t in report.get("targets", [])]
    return "\n".join(lines)


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    if row.get("fraction_of_copy") is None:
        return "failed"
    sdpa = row.get("speed_vs_sdpa_contiguous")
    return f"{row['fraction_of_copy']:.2f} / " + ("-" if sdpa is None else f"{sdpa:.2f}x")


def render(path) -> str:
    """The grid's table from an attention.json (its ``grid``), for Lab 05 and the README."""
    import json
    from pathlib import Path

    path = Path(path)
    report = json.loads(path.read_text()).get("grid") if path.exists() else None
    return grid_table(report)


if __name__ == "__main__":  # python -m kvlab.perf.attention_grid [benchmarks/attention.json]
    import sys

    print(render(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/attention.json"))
