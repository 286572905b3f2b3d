"""``kvlab bench``: figures, not asserts. Each benchmark prints a table and writes JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from kvlab.paged import BlockManager

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


def _rate(fn, n: int, repeats: int = 5) -> float:
    """Best operations per second of ``fn(n)`` over ``repeats`` runs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - start)
    return n / best


def allocator(n: int = 1_000_000) -> dict:
    """Pure-Python throughput of the paged BlockManager's hot operations."""

    def append_one_guest(count):
        m = BlockManager(count // 16 + 2, 16)
        m.allocate("a", 1)
        append = m.append_slot
        for _ in range(count):
            append("a")

    def append_round_robin(count):
        guests = 256
        m = BlockManager(count // 16 + guests + 2, 16)
        for g in range(guests):
            m.allocate(g, 1)
        append = m.append_slot
        for i in range(count):
            append(i % guests)

    def allocate_free(count, tokens=512):
        m = BlockManager(64, 16)
        for i in range(count):
            m.allocate(i, tokens)
            m.free(i)

    def fork_free(count):
        m = BlockManager(64, 16)
        m.allocate("parent", 512)
        for i in range(count):
            m.fork("parent", i)
            m.free(i)

    results = {
        "append_slot_per_s (one guest)": _rate(append_one_guest, n),
        "append_slot_per_s (256 guests, round robin)": _rate(append_round_robin, n),
        "allocate+free_per_s (512 tokens = 32 rooms)": _rate(allocate_free, n // 20),
        "fork+free_per_s (32 shared rooms)": _rate(fork_free, n // 20),
    }
    return {
        "benchmark": "allocator",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "goal": "append_slot >= 1,000,000 per second",
        "results": {k: round(v) for k, v in results.items()},
    }


def main(name: str, out: str | None) -> int:
    benchmarks = {"allocator": allocator, "attention": attention}
    if name not in benchmarks:
        print(f"kvlab bench: unknown benchmark {name!r}; choose from {', '.join(benchmarks)}")
        return 2
    try:
        report = benchmarks[name]()
    except RuntimeError as e:
        print(f"kvlab bench {name}: {e}")
        return 2
    for label, value in report.get("results", {}).items():
        print(f"{label:48s} {value:>14,}")
    if "device" in report:
        print(f"{report['device']} | torch {report['torch']} | triton {report['triton']}")
        print(f"device-to-device copy: {report['copy_GB_per_s']:,} GB/s")
    for row in report.get("rows", []):
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    for label, (value, met) in report.get("targets", {}).items():
        print(f"target {label}: {value} ({'met' if met else 'NOT met'})")
    path = Path(out) if out else BENCH_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def attention(device: str | None = None) -> dict:
    """Paged decode attention on a GPU: achieved bandwidth against the device's peak and its
    measured copy bandwidth, the ratio to torch's SDPA on a contiguous cache of the same tokens,
    split-K at batch 1, and the Lab 05 teaching kernel for comparison."""
    import torch
    import triton

    from kvlab.roofline import GPUS

    if not torch.cuda.is_available():
        raise RuntimeError(
            "the attention benchmark needs a CUDA GPU; in Triton's interpreter timings mean nothing"
        )
    device = device or "cuda"
    name = torch.cuda.get_device_name(device)
    peak = next(
        (g.hbm_bytes_per_s for key, g in GPUS.items() if key.split()[0].split("-")[0] in name), None
    )
    copy = copy_bandwidth(device)
    hq, hkv, d, bs, dtype = 32, 8, 128, 16, torch.bfloat16
    rows = [
        _attention_row(batch, context, hq, hkv, d, bs, dtype, device, peak, copy)
        for batch, context in [(1, 8192), (8, 8192), (32, 8192), (32, 2048), (1, 32768)]
    ]
    return {
        "benchmark": "attention",
        "device": name,
        "launch_options_at_B32_ctx8192": launch_sweep(hq, hkv, d, bs, dtype, device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "peak_GB_per_s": peak / 1e9 if peak else None,
        "copy_GB_per_s": round(copy / 1e9, 1),
        "shape": {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "block_size": bs, "dtype": "bf16"},
        "rows": rows,
        "targets": attention_targets(rows),
    }


def launch_sweep(hq, hkv, d, bs, dtype, device) -> list[dict]:
    """Milliseconds of the tiled kernel at 32 guests of 8,192 tokens for a few (num_warps,
    num_stages): 5 stages let Triton 3.6 double-buffer K and V, fewer load one tile at a time."""
    import triton.testing

    from kvlab.kernels import paged_decode_attention

    args = _attention_inputs(32, 8192, hq, hkv, d, bs, dtype, device)
    results = []
    for warps, stages in [(4, 3), (4, 5), (8, 3), (8, 5)]:

        def run(warps=warps, stages=stages):
            return paged_decode_attention(*args, num_warps=warps, num_stages=stages)

        ms = triton.testing.do_bench(run)
        results.append({"num_warps": warps, "num_stages": stages, "ms": round(ms, 4)})
    return results


def _attention_inputs(batch, context, hq, hkv, d, bs, dtype, device):
    """q, a paged cache with every guest's rooms scattered at random, tables and lengths."""
    import torch

    blocks = batch * context // bs
    g = torch.Generator(device=device).manual_seed(0)
    k_cache = torch.randn(blocks, bs, hkv, d, device=device, dtype=dtype, generator=g)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(blocks, device=device, generator=g).to(torch.int32).view(batch, -1)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, hq, d, device=device, dtype=dtype, generator=g)
    return q, k_cache, v_cache, tables, lens


def copy_bandwidth(device, nbytes: int = 2**30) -> float:
    """Bytes per second a device-to-device copy moves, counting bytes read and written."""
    import torch
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


def attention_targets(rows: list[dict]) -> dict:
    """The course's targets for the kernel, each with the measured figure and whether it was met."""
    at = {(r["batch"], r["context"]): r for r in rows}
    big, long = at[(32, 8192)], at[(1, 32768)]
    return {
        "B=32 ctx 8192: >= 0.8 of copy bandwidth": [
            big["fraction_of_copy"],
            big["fraction_of_copy"] >= 0.8,
        ],
        "B=32 ctx 8192: >= 0.9x SDPA speed": [
            big["speed_vs_sdpa_contiguous"],
            big["speed_vs_sdpa_contiguous"] >= 0.9,
        ],
        "B=1 ctx 32k: split-K >= 3x one split": [
            long["split_k_speedup"],
            long["split_k_speedup"] >= 3,
        ],
    }


def _attention_row(batch, context, hq, hkv, d, bs, dtype, device, peak, copy) -> dict:
    """One configuration: the kernel (auto and single split), the teaching kernel, and SDPA on a
    contiguous copy of the same tokens."""
    import torch
    import triton.testing

    from kvlab.kernels import launch_paged_decode, paged_decode_attention, paged_decode_kernel

    args = _attention_inputs(batch, context, hq, hkv, d, bs, dtype, device)
    q, k_cache, v_cache, tables, lens = args
    kv_bytes = 2 * batch * context * hkv * d * k_cache.element_size()
    ms = triton.testing.do_bench(lambda: paged_decode_attention(*args))
    one_split = triton.testing.do_bench(lambda: paged_decode_attention(*args, num_splits=1))
    teaching = triton.testing.do_bench(lambda: launch_paged_decode(paged_decode_kernel, *args))
    k = k_cache[tables.long()].reshape(batch, context, hkv, d).transpose(1, 2).contiguous()
    v = v_cache[tables.long()].reshape(batch, context, hkv, d).transpose(1, 2).contiguous()
    sdpa_args = (q.unsqueeze(2), k, v)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(*sdpa_args, enable_gqa=True)

    sdpa_ms = triton.testing.do_bench(sdpa)
    error = (paged_decode_attention(*args).float() - sdpa().squeeze(2).float()).abs().max().item()
    bytes_per_s = kv_bytes / (ms * 1e-3)
    return {
        "batch": batch,
        "context": context,
        "ms": round(ms, 4),
        "GB_per_s": round(bytes_per_s / 1e9, 1),
        "fraction_of_peak": round(bytes_per_s / peak, 3) if peak else None,
        "fraction_of_copy": round(bytes_per_s / copy, 3),
        "speed_vs_sdpa_contiguous": round(sdpa_ms / ms, 3),
        "split_k_speedup": round(one_split / ms, 2),
        "speed_vs_room_by_room": round(teaching / ms, 2),
        "max_error_vs_sdpa": float(f"{error:.2g}"),
    }
