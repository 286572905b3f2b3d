"""``kvlab bench``: figures, not asserts. Each benchmark prints a table and writes JSON.

``kvlab bench allocator``, ``kvlab bench serve [--requests N]``, ``kvlab bench chunked-prefill``,
``kvlab bench fleet`` (16 replicas x 100,000 requests behind each router),
``kvlab bench attention``, ``kvlab bench attention-grid [--tiny]`` (the decode kernel over
batch x context x GQA, :mod:`kvlab.perf.attention_grid`, merged into attention.json as ``grid``) and
``kvlab bench grade`` (a synthetic class through the judge, :mod:`kvlab.grading.bench_grade`);
the launch-option sweep of the attention kernel (GPU only, a few minutes) runs as
``python -m kvlab.perf.bench attention-sweep [--out PATH] [--budget SECONDS]``.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from kvlab.core import files
from kvlab.core.block_manager import BlockManager


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

    def append_cached(count):
        m = BlockManager(count // 16 + 2, 16, enable_prefix_caching=True)
        m.allocate("a", [0])
        append = m.append_slot
        for i in range(count):
            append("a", i)

    def append_engine(count):  # a decode slot first, its K/V reported computed a step later
        m = BlockManager(count // 16 + 2, 16, enable_prefix_caching=True)
        ids = [0]
        m.allocate("a", ids)
        append, computed = m.append_slot, m.cache_computed
        for i in range(1, count + 1):
            append("a")
            ids.append(i)
            computed("a", ids, i)

    def allocate_hit_free(count, tokens=512):
        m = BlockManager(64, 16, enable_prefix_caching=True)
        prompt = list(range(tokens))
        m.allocate("warm", prompt)
        m.free("warm")
        for i in range(count):
            m.allocate(i, prompt)
            m.free(i)

    results = {
        "append_slot_per_s (one guest)": _rate(append_one_guest, n),
        "append_slot_per_s (prefix caching, a block hashed every 16)": _rate(append_cached, n),
        "append_slot+cache_computed_per_s (prefix caching, as the engine decodes)": _rate(
            append_engine, n
        ),
        "append_slot_per_s (256 guests, round robin)": _rate(append_round_robin, n),
        "allocate+free_per_s (512 tokens = 32 rooms)": _rate(allocate_free, n // 20),
        "fork+free_per_s (32 shared rooms)": _rate(fork_free, n // 20),
        "allocate+free_per_s (prefix caching, 31 of 32 rooms cached)": _rate(
            allocate_hit_free, n // 20
        ),
    }
    return {
        "benchmark": "allocator",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "goal": "append_slot >= 1,000,000 per second",
        "results": {k: round(v) for k, v in results.items()},
    }


# --- serving: the simulator's speed, and the four caches of Lab 06 at equal memory --------------

# OPT-13B with 12 GiB of KV cache on an A100-40GB: the PagedAttention paper's 15.7K token slots
SERVE_SLOTS = 12 * 2**30 // (2 * 40 * 40 * 128 * 2)  # 800 KiB per token (kvlab.models.OPT_13B)
SERVE_MAX_LEN, SERVE_BLOCK = 2048, 16
SERVE_GOAL_S, SERVE_GOAL_N = 10.0, 100_000  # requests through the paged simulation, one core


def serve(n: int = SERVE_GOAL_N, day: int = 1_000, repeats: int = 1, progress: bool = True) -> dict:
    """The paged simulation's speed on ``n`` ShareGPT-like requests, and the four caches on a
    ``day`` of them, on the paper's memory (OPT-13B, 15,728 slots, max_seq_len 2048, 16-token
    blocks). Every request arrives at t=0: the server is saturated from the first step, which is
    what the throughput comparison measures and the slowest case to simulate (the largest
    batches). The speed run counts steps (no cost model: the simulation itself is timed), and
    reports the best of ``repeats`` runs (CPU time, so other programs on a shared machine count
    less), with how many of its steps ran at once (:mod:`kvlab.serving.fast_forward`); the four
    caches are costed with the roofline of OPT-13B on an A100-40GB."""
    from kvlab.core.validate import positive_int
    from kvlab.models import OPT_13B
    from kvlab.perf.roofline import A100_40GB, StepTime
    from kvlab.serving import CACHES, PAPER_NAMES, simulate
    from kvlab.serving.workload import mean_lengths, sharegpt_like

    positive_int("n", n)
    positive_int("day", day)
    positive_int("repeats", repeats)
    options = {
        "kv_capacity_tokens": SERVE_SLOTS,
        "max_seq_len": SERVE_MAX_LEN,
        "block_size": SERVE_BLOCK,
    }
    requests = sharegpt_like(n, seed=0, max_total=SERVE_MAX_LEN)
    wall = cpu = float("inf")
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        paged = simulate(requests, cache="paged", progress=progress, **options)
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start_wall)
    per_goal = cpu * SERVE_GOAL_N / n

    step_time = StepTime(OPT_13B, A100_40GB)
    sample = requests[:day]
    rows = []
    for cache in CACHES:
        start = time.perf_counter()
        r = simulate(sample, cache=cache, step_time=step_time, progress=progress, **options)
        rows.append(
            {
                "cache": cache,
                "paper_name": PAPER_NAMES[cache],
                "mean_batch": round(r.mean_batch, 2),
                "peak_batch": r.peak_batch,
                "tokens_per_step": round(r.throughput, 2),
                "mean_utilization": round(r.mean_utilization, 3),
                "preemptions": r.preemptions,
                "steps": r.steps,
                "simulated_s": round(r.seconds, 1),
                "tokens_per_s": round(r.tokens_per_second),
                "requests_per_s": round(r.completed / r.seconds, 3),
                "latency_p50_s": round(r.latency(50), 1),
                "wall_s": round(time.perf_counter() - start, 2),
            }
        )
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["throughput_vs_contiguous"] = round(row["tokens_per_s"] / base, 2)
    prompt, output = mean_lengths(requests)
    scaled = "" if n == SERVE_GOAL_N else f", scaled from {n:,}"
    return {
        "benchmark": "serve",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "goal": f"{SERVE_GOAL_N:,} ShareGPT-like requests through the paged simulation in "
        f"<= {SERVE_GOAL_S:g} s on one CPU core",
        "workload": {
            "requests": n,
            "generator": "kvlab.serving.workload.sharegpt_like(n, seed=0, max_total=2048)",
            "arrivals": "all at t=0 (a saturated server)",
            "mean_prompt_len": round(prompt, 1),
            "mean_output_len": round(output, 1),
            "kv_capacity_tokens": SERVE_SLOTS,
            "max_seq_len": SERVE_MAX_LEN,
            "block_size": SERVE_BLOCK,
            "preemption": "recompute",
            "timed_runs": repeats,
        },
        "results": {
            "seconds (paged simulation, wall, best)": round(wall, 2),
            "cpu_seconds (paged simulation, one core, best)": round(cpu, 2),
            "requests_per_s (simulated per CPU second)": round(n / cpu),
            "steps": paged.steps,
            "steps_per_s": round(paged.steps / cpu),
            "tokens_generated": paged.tokens_generated,
            "preemptions": paged.preemptions,
            "mean_batch": round(paged.mean_batch, 2),
            "fast_forwarded_steps (run at once)": paged.fast_forward_steps,
            "fast_forward_runs": paged.fast_forward_runs,
        },
        "targets": {
            f"<= {SERVE_GOAL_S:g} s of CPU per {SERVE_GOAL_N:,} requests (paged{scaled})": [
                round(per_goal, 2),
                per_goal <= SERVE_GOAL_S,
            ]
        },
        "caches_day": {
            "requests": len(sample),
            "step_time": f"roofline: {OPT_13B.name} on {A100_40GB.name}",
        },
        "caches": rows,
    }


def print_caches(report: dict) -> None:
    """The four caches on the same day, as a table."""
    day = report["caches_day"]
    print(f"the four caches on {day['requests']:,} requests ({day['step_time']}):")
    header = ("cache", "mean batch", "used", "preempted", "tokens/s", "vs max", "p50 lat. s")
    print(f"  {header[0]:18s}" + "".join(f"{h:>12s}" for h in header[1:]))
    for row in report["caches"]:
        figures = (
            f"{row['mean_batch']:.2f}",
            f"{row['mean_utilization']:.1%}",
            f"{row['preemptions']:,}",
            f"{row['tokens_per_s']:,}",
            f"{row['throughput_vs_contiguous']:.2f}x",
            f"{row['latency_p50_s']:,}",
        )
        print(f"  {row['cache']:18s}" + "".join(f"{f:>12s}" for f in figures))


# a mixed day for chunked prefill: Llama-3-8B on an H100 with 200,000 token slots of KV cache
CHUNKED_DAY = {"n": 400, "rate": 40.0, "document_share": 0.08, "seed": 0}
CHUNKED_SETUP = {"kv_capacity_tokens": 200_000, "max_seq_len": 8_192, "block_size": 16}
CHUNKED_RUNS = (
    ("whole prompts, no budget", {}),
    ("whole prompts, budget 8,192", {"max_num_batched_tokens": 8_192}),
    ("chunked, budget 2,048", {"max_num_batched_tokens": 2_048, "chunked_prefill": True}),
    ("chunked, budget 512", {"max_num_batched_tokens": 512, "chunked_prefill": True}),
)


def chunked_prefill() -> dict:
    """A day of chats with long documents among them (:func:`kvlab.serving.workload.documents_among_chats`),
    served on the paged cache with whole prompts and with chunked prefill under a token budget:
    the gaps between two tokens of a request (p50, p99, the longest), time to first token and
    throughput, from the roofline of Llama-3-8B on an H100-80GB."""
    from kvlab.models import preset
    from kvlab.perf.gpus import lookup
    from kvlab.perf.roofline import StepTime
    from kvlab.serving import simulate
    from kvlab.serving.workload import documents_among_chats

    step_time = StepTime(preset("Llama-3-8B"), lookup("H100-80GB"))
    day = documents_among_chats(**CHUNKED_DAY)
    rows = []
    for label, options in CHUNKED_RUNS:
        r = simulate(day, cache="paged", step_time=step_time, **CHUNKED_SETUP, **options)
        rows.append(
            {
                "run": label,
                "itl_p50_ms": round(r.itl(50) * 1e3, 2),
                "itl_p99_ms": round(r.itl(99) * 1e3, 2),
                "itl_max_ms": round(max(gap for gap, _ in r.token_gaps) * 1e3, 2),
                "ttft_p50_ms": round(r.ttft(50) * 1e3, 1),
                "ttft_p99_ms": round(r.ttft(99) * 1e3, 1),
                "tokens_per_s": round(r.tokens_per_second),
                "steps": r.steps,
                "max_tokens_in_a_step": max(r.scheduled_tokens),
                "preemptions": r.preemptions,
            }
        )
    return {
        "benchmark": "chunked-prefill",
        "day": {**CHUNKED_DAY, "requests": len(day), "documents": "6,000-8,000-token prompts"},
        "setup": {**CHUNKED_SETUP, "step_time": "roofline: Llama-3-8B on H100-80GB"},
        "chunks": rows,
        "python": platform.python_version(),
    }


def print_chunks(report: dict) -> None:
    print(f"{report['day']['requests']} requests, {report['setup']['step_time']}:")
    head = ("ITL p50", "ITL p99", "ITL max", "TTFT p50", "TTFT p99", "tokens/s", "max/step")
    print(f"  {'':30s}" + "".join(f"{h:>10s}" for h in head))
    for row in report["chunks"]:
        figures = (
            row["itl_p50_ms"],
            row["itl_p99_ms"],
            row["itl_max_ms"],
            row["ttft_p50_ms"],
            row["ttft_p99_ms"],
            row["tokens_per_s"],
            row["max_tokens_in_a_step"],
        )
        print(f"  {row['run']:30s}" + "".join(f"{f:>10,}" for f in figures))
    print("  (milliseconds; ITL: the gap between two tokens of a request)")


# --- a fleet: 16 replicas behind each router, on a many-tenant day (Lab 10) ----------------------

FLEET_REPLICAS, FLEET_N = 16, 100_000
# Llama-3-8B on an H100-80GB (roofline), each replica with 8,192 token slots of KV cache: a handful
# of the day's 1,024-token system prompts (64 tenants, zipf 0.5), 25 requests a second per replica
FLEET_DAY = {"tenants": 64, "system_prompt_len": 1_024, "zipf": 0.5, "seed": 0}
FLEET_SETUP = {"kv_capacity_tokens": 8_192, "max_seq_len": 2_048, "block_size": 16}
FLEET_RATE_PER_REPLICA = 25.0


def fleet(
    n: int = FLEET_N,
    replicas: int = FLEET_REPLICAS,
    routers: tuple = ("round_robin", "least_loaded", "prefix_aware"),
    progress: bool = False,
) -> dict:
    """``n`` requests of a many-tenant day (:func:`kvlab.serving.workload.many_tenants`) through
    :func:`kvlab.serving.fleet.simulate_fleet` on ``replicas`` replicas, once per router: the
    simulation's speed (requests simulated per wall and per CPU second, one core: other programs
    on a shared machine count less in CPU time) and what each router
    measured (prefix hit rate, TTFT, throughput), costed on the roofline of Llama-3-8B on an
    H100-80GB. The arrival rate grows with the fleet (25 requests a second per replica)."""
    from kvlab.core.validate import positive_int
    from kvlab.models import preset
    from kvlab.perf.gpus import lookup
    from kvlab.perf.roofline import StepTime
    from kvlab.serving.fleet import simulate_fleet
    from kvlab.serving.workload import many_tenants

    positive_int("n", n)
    positive_int("replicas", replicas)
    rate = FLEET_RATE_PER_REPLICA * replicas
    start = time.perf_counter()
    day = many_tenants(n, rate=rate, **FLEET_DAY)
    day_s = time.perf_counter() - start
    step_time = StepTime(preset("Llama-3-8B"), lookup("H100-80GB"))
    rows = []
    for router in routers:
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        r = simulate_fleet(
            day,
            replicas=replicas,
            router=router,
            step_time=step_time,
            progress=progress,
            **FLEET_SETUP,
        )
        wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        counts = r.requests_per_replica
        rows.append(
            {
                "router": router,
                "completed": r.completed,
                "prefix_hit_rate": round(r.prefix_hit_rate, 4),
                "ttft_p50_ms": round(r.ttft(50) * 1e3, 1),
                "ttft_p99_ms": round(r.ttft(99) * 1e3, 1),
                "tokens_per_s": round(r.tokens_per_second),
                "preemptions": r.preemptions,
                "busiest_replica_share": round(max(counts) / n, 4),
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "requests_per_s (simulated per wall second)": round(n / wall),
                "requests_per_cpu_s (simulated per CPU second, one core)": round(n / cpu),
            }
        )
    return {
        "benchmark": "fleet",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "workload": {
            "requests": n,
            "replicas": replicas,
            "generator": f"kvlab.serving.workload.many_tenants(n, rate={rate:g}, "
            + ", ".join(f"{k}={v!r}" for k, v in FLEET_DAY.items())
            + ")",
            "day_generated_s": round(day_s, 2),
            **FLEET_SETUP,
            "step_time": "roofline: Llama-3-8B on H100-80GB",
            "load_penalty": "default (kvlab.serving.fleet.DEFAULT_LOAD_PENALTY)",
        },
        "routers": rows,
    }


def print_fleet(report: dict) -> None:
    day = report["workload"]
    print(f"{day['requests']:,} requests on {day['replicas']} replicas ({day['step_time']}):")
    head = ("hit rate", "TTFT p50", "TTFT p99", "tokens/s", "busiest", "wall s", "req/CPU s")
    print(f"  {'router':14s}" + "".join(f"{h:>11s}" for h in head))
    for row in report["routers"]:
        figures = (
            f"{row['prefix_hit_rate']:.1%}",
            f"{row['ttft_p50_ms']:,}",
            f"{row['ttft_p99_ms']:,}",
            f"{row['tokens_per_s']:,}",
            f"{row['busiest_replica_share']:.1%}",
            f"{row['wall_s']:,}",
            f"{row['requests_per_cpu_s (simulated per CPU second, one core)']:,}",
        )
        print(f"  {row['router']:14s}" + "".join(f"{f:>11s}" for f in figures))
    print("  (TTFT in milliseconds; busiest: the share of requests its busiest replica got)")


def main(
    name: str,
    out: str | None,
    budget_s: float | None = None,
    requests: int | None = None,
    tiny: bool = False,
    more: dict[str, Callable[[], dict]] | None = None,
) -> int:
    """Run benchmark ``name``, print its figures, write its JSON. ``more``: benchmarks of the
    layers above this one, by name (``kvlab bench`` adds ``grade``, a class through the judge of
    :mod:`kvlab.grading.bench_grade`), so that perf never imports grading."""
    benchmarks = {
        "allocator": allocator,
        "serve": serve,
        "attention": attention,
        "attention-sweep": attention_sweep,
        "attention-grid": attention_grid,
        "chunked-prefill": chunked_prefill,
        "fleet": fleet,
        **(more or {}),
    }
    if name not in benchmarks:
        print(f"kvlab bench: unknown benchmark {name!r}; choose from {', '.join(benchmarks)}")
        return 2
    if requests is not None and (name != "serve" or requests < 1):
        print(f"kvlab bench {name}: --requests takes a count >= 1, for serve only")
        return 2
    if tiny and name != "attention-grid":
        print(f"kvlab bench {name}: --tiny is for attention-grid only")
        return 2
    stem = "attention" if name == "attention-grid" else name  # the grid joins attention.json
    try:
        path = (
            Path(out)
            if out
            else files.checkout_path("benchmarks", f"{stem}.json", purpose=f"kvlab bench {name}")
        )
    except FileNotFoundError as e:
        print(f"kvlab bench {name}: {e}, or pass --out PATH")
        return 2
    try:
        if name == "attention-sweep":
            options = {} if budget_s is None else {"budget_s": budget_s}
            report = attention_sweep(checkpoint=lambda r: _write_json(path, r), **options)
        elif name == "attention-grid":
            return _attention_grid(path, tiny)
        elif name == "serve" and requests is not None:
            report = serve(n=requests, day=min(requests, 1_000), repeats=1)
        else:
            report = benchmarks[name]()
    except RuntimeError as e:
        print(f"kvlab bench {name}: {e}")
        return 2
    for label, value in report.get("results", {}).items():
        print(f"{label:48s} {value:>14,}")
    if "rows" in report:
        print(f"{report['device']} | torch {report['torch']} | triton {report['triton']}")
        print(f"device-to-device copy: {report['copy_GB_per_s']:,} GB/s")
    for row in report.get("rows", []):
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    for row in report.get("prefill_rows", []):
        print("prefill  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    for row in report.get("quantized_rows", []):
        print("quantized  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    if "caches" in report:
        print_caches(report)
    if "chunks" in report:
        print_chunks(report)
    if "routers" in report:
        print_fleet(report)
    for label, (value, met) in report.get("targets", {}).items():
        print(f"target {label}: {value} ({'met' if met else 'NOT met'})")
    _write_json(path, report)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def attention_grid(tiny: bool = False) -> dict:
    """The decode kernel over the grid of :mod:`kvlab.perf.attention_grid` (tiny: the CPU dry run)."""
    from kvlab.perf import attention_grid as grid

    return grid.attention_grid(grid.TINY if tiny else grid.FULL)


def _attention_grid(path: Path, tiny: bool) -> int:
    """Run the grid and put it in the JSON at ``path`` as ``grid``, keeping what else is there
    (``kvlab bench attention``'s rows), so one attention.json holds a GPU run's figures."""
    from kvlab.perf.attention_grid import grid_table, target_line

    report = attention_grid(tiny)
    try:
        whole = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        whole = {}
    if not isinstance(whole, dict):
        whole = {}
    whole.setdefault("benchmark", "attention")
    whole["grid"] = report
    print(f"{report['device']} | copy {report['copy_GB_per_s']:,} GB/s | {report['timing']}")
    for target in report["targets"]:
        print("target " + target_line(target))
    if report["timing"].startswith("triton"):
        print(grid_table(report))
    _write_json(path, whole)
    print(f"wrote the grid into {path}", file=sys.stderr)
    failed = [r for r in report["rows"] if "error" in r]
    if failed:
        print(f"kvlab bench attention-grid: {len(failed)} of {len(report['rows'])} rows failed")
        return 1
    return 0


def _write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# --- paged decode attention on a GPU -------------------------------------------------------------

# The course's target: Llama-3-8B's attention (32 query heads on 8 KV heads, head_dim 128) in bf16,
# rooms of 16 beds, 32 guests of 8,192 tokens.
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
TARGET = (32, 8192)  # (batch, context)
SHAPES = [(1, 8192), (8, 8192), TARGET, (32, 2048), (1, 32768)]


def _need_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "the attention benchmark needs a CUDA GPU; in Triton's interpreter timings mean nothing"
        )


def _header(device, copy: float) -> dict:
    import torch
    import triton

    from kvlab.ops.kernels.dtypes import gpu_arch

    return {
        "device": torch.cuda.get_device_name(device),
        "arch": gpu_arch(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_GB_per_s": round(copy / 1e9, 1),
    }


def attention(device: str | None = None) -> dict:
    """Paged decode attention on a GPU: achieved bandwidth against the device's peak and its
    measured copy bandwidth, the ratio to torch's SDPA on a contiguous cache of the same tokens,
    split-K at batch 1, and the Lab 05 teaching kernel for comparison; then paged prefill (chunks
    of ``PREFILL_CHUNK`` tokens ending at each of ``PREFILL_CONTEXTS``): TFLOP/s against the data
    sheet's dense bf16 peak and against SDPA's causal attention on a contiguous cache; then the
    quantised kernel (fp8 e4m3 from sm_89 on, else int8) against the 16-bit one on the same
    tokens (``QUANTIZED_SHAPES``, target ``QUANTIZED_TARGET``x at B=32, 8k). Kernels are
    timed as a server launches them: planned once (``prepare_paged_decode``,
    ``prepare_paged_prefill``), then launched."""
    import torch

    from kvlab.ops.kernels.prefill import prefill_launch_defaults
    from kvlab.ops.kernels.tiled import launch_defaults
    from kvlab.perf.roofline import GPUS

    _need_gpu()
    device = device or "cuda"
    copy = copy_bandwidth(device)
    header = _header(device, copy)
    name = header["device"]
    peak = next(
        (g.hbm_bytes_per_s for key, g in GPUS.items() if key.split()[0].split("-")[0] in name), None
    )
    hq, hkv, d, bs, dtype = HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.bfloat16
    rows = [
        _attention_row(batch, context, hq, hkv, d, bs, dtype, device, peak, copy)
        for batch, context in SHAPES
    ]
    peak_flops = next(
        (g.peak_flops for key, g in GPUS.items() if key.split()[0].split("-")[0] in name), None
    )
    prefill = [
        _prefill_row(PREFILL_BATCH, PREFILL_CHUNK, context, hq, hkv, d, bs, dtype, device, peak_flops)
        for context in PREFILL_CONTEXTS
    ]  # fmt: skip
    quantized = [
        _quantized_row(batch, context, hq, hkv, d, bs, dtype, device, copy)
        for batch, context in QUANTIZED_SHAPES
    ]
    return {
        "benchmark": "attention",
        **header,
        "launch_defaults": _config_dict(launch_defaults(d, dtype)),
        "launch_options_at_B32_ctx8192": launch_sweep(hq, hkv, d, bs, dtype, device),
        "peak_GB_per_s": peak / 1e9 if peak else None,
        "shape": {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "block_size": bs, "dtype": "bf16"},
        "rows": rows,
        "prefill_launch_defaults": _prefill_config_dict(prefill_launch_defaults(d, dtype)),
        "peak_TFLOP_per_s": peak_flops / 1e12 if peak_flops else None,
        "prefill_shape": {
            "batch": PREFILL_BATCH,
            "chunk": PREFILL_CHUNK,
            "context": "the sequence's length after its chunk (num_computed + chunk)",
            "flops": "4 x q_heads x head_dim x keys each query sees (causal work only)",
            "sdpa": "causal_lower_right on a contiguous copy, K/V expanded to every query head",
        },
        "prefill_rows": prefill,
        "quantized_rows": quantized,
        "targets": {
            **attention_targets(rows),
            **prefill_targets(prefill),
            **quantized_targets(quantized),
        },
    }


def launch_sweep(hq, hkv, d, bs, dtype, device) -> list[dict]:
    """Milliseconds of the tiled kernel at 32 guests of 8,192 tokens for a few (num_warps,
    num_stages); ``attention_sweep`` tries every launch option."""
    import triton.testing

    from kvlab.ops.kernels import prepare_paged_decode

    args = _attention_inputs(*TARGET, hq, hkv, d, bs, dtype, device)
    results = []
    for warps, stages in [(4, 3), (4, 5), (8, 3), (8, 5)]:
        run = prepare_paged_decode(*args, num_warps=warps, num_stages=stages)
        ms = triton.testing.do_bench(run)
        results.append({"num_warps": warps, "num_stages": stages, "ms": round(ms, 4)})
    return results


def _attention_inputs(batch, context, hq, hkv, d, bs, dtype, device):
    """q, a paged cache with every guest's rooms scattered at random, tables and lengths."""
    from kvlab.ops.testing import uniform_case

    return uniform_case(
        batch, context, bs, q_heads=hq, kv_heads=hkv, head_dim=d, dtype=dtype, device=device
    )


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
    big, long = at[TARGET], at[(1, 32768)]
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


def _contiguous_sdpa(args):
    """SDPA on a contiguous copy of the same tokens: what attention without pages costs."""
    import torch

    q, k_cache, v_cache, tables, lens = args
    batch, context = q.shape[0], int(lens[0])
    hkv, d = k_cache.shape[2:]
    k = k_cache[tables.long()].reshape(batch, context, hkv, d).transpose(1, 2).contiguous()
    v = v_cache[tables.long()].reshape(batch, context, hkv, d).transpose(1, 2).contiguous()
    sdpa_args = (q.unsqueeze(2), k, v)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(*sdpa_args, enable_gqa=True)

    return sdpa


def _kv_bytes(args) -> int:
    q, k_cache, _, _, lens = args
    return 2 * int(lens.sum()) * k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()


def _attention_row(batch, context, hq, hkv, d, bs, dtype, device, peak, copy) -> dict:
    """One configuration: the kernel (auto and single split), the teaching kernel, and SDPA on a
    contiguous copy of the same tokens."""
    import triton.testing

    from kvlab.ops.kernels import launch_paged_decode, paged_decode_kernel, prepare_paged_decode

    args = _attention_inputs(batch, context, hq, hkv, d, bs, dtype, device)
    run = prepare_paged_decode(*args)
    ms = triton.testing.do_bench(run)
    one_split = triton.testing.do_bench(prepare_paged_decode(*args, num_splits=1))
    teaching = triton.testing.do_bench(lambda: launch_paged_decode(paged_decode_kernel, *args))
    sdpa = _contiguous_sdpa(args)
    sdpa_ms = triton.testing.do_bench(sdpa)
    error = (run().float() - sdpa().squeeze(2).float()).abs().max().item()
    bytes_per_s = _kv_bytes(args) / (ms * 1e-3)
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


# --- decode attention over a quantised cache (8-bit K/V, a scale per token and KV head) ----------

QUANTIZED_SHAPES = [TARGET, (8, 8192)]
QUANTIZED_TARGET = 1.7  # x the 16-bit kernel's tokens/s at B=32, 8k: the bytes read halve


def quantized_format(device) -> str:
    """fp8 e4m3 where Triton loads it (sm_89 on), else int8."""
    import torch

    from kvlab.ops.kernels.quantized import FP8_MIN_ARCH

    if torch.device(device).type != "cuda":
        return "fp8_e4m3"
    major, minor = torch.cuda.get_device_capability(device)
    return "fp8_e4m3" if major * 10 + minor >= FP8_MIN_ARCH else "int8"


def _quantized_row(batch, context, hq, hkv, d, bs, dtype, device, copy) -> dict:
    """The tiled kernel on the 16-bit cache against the quantised kernel on the same tokens in
    8 bits: tokens/s of each, their ratio, the bytes read, and the quantised answer's error."""
    import triton.testing

    from kvlab.ops.kernels import prepare_paged_decode
    from kvlab.ops.kernels.quantized import prepare_paged_decode_quantized
    from kvlab.ops.quant import quantize

    args = _attention_inputs(batch, context, hq, hkv, d, bs, dtype, device)
    q, k_cache, v_cache, tables, lens = args
    fmt = quantized_format(device)
    (kq, ks), (vq, vs) = quantize(k_cache, fmt), quantize(v_cache, fmt)
    wide, narrow = (
        prepare_paged_decode(*args),
        prepare_paged_decode_quantized(q, kq, vq, ks, vs, tables, lens),
    )
    wide_ms, narrow_ms = triton.testing.do_bench(wide), triton.testing.do_bench(narrow)
    tokens = int(lens.sum())
    narrow_bytes = 2 * tokens * hkv * (d * kq.element_size() + ks.element_size())
    error = (narrow().float() - wide().float()).abs().max().item()
    return {
        "batch": batch,
        "context": context,
        "format": fmt,
        "ms_16_bit": round(wide_ms, 4),
        "ms_quantized": round(narrow_ms, 4),
        "tokens_per_s_16_bit": round(tokens / (wide_ms * 1e-3)),
        "tokens_per_s_quantized": round(tokens / (narrow_ms * 1e-3)),
        "speedup": round(wide_ms / narrow_ms, 3),
        "GB_per_s_quantized": round(narrow_bytes / (narrow_ms * 1e-3) / 1e9, 1),
        "fraction_of_copy_quantized": round(narrow_bytes / (narrow_ms * 1e-3) / copy, 3),
        "max_error_vs_16_bit": float(f"{error:.2g}"),
    }


def quantized_targets(rows: list[dict]) -> dict:
    """The quantised kernel's target: at 32 guests of 8,192 tokens, >= 1.7x the 16-bit kernel's
    tokens/s (the bytes read halve, plus 8 bytes of scales per token and KV head)."""
    at = {(r["batch"], r["context"]): r for r in rows}
    if TARGET not in at:
        return {}
    big = at[TARGET]
    label = f"B=32 ctx 8192: quantised KV ({big['format']}) >= {QUANTIZED_TARGET}x 16-bit tokens/s"
    return {label: [big["speedup"], big["speedup"] >= QUANTIZED_TARGET]}


# --- paged prefill attention on a GPU ------------------------------------------------------------

# Lab 09's chunk: 8 sequences each run a chunk of 512 tokens that ends at 2k or 8k tokens.
PREFILL_BATCH, PREFILL_CHUNK, PREFILL_CONTEXTS = 8, 512, (2048, 8192)
PREFILL_TARGET_VS_SDPA = 0.7


def _prefill_inputs(batch, chunk, context, hq, hkv, d, bs, dtype, device):
    """``batch`` chunks of ``chunk`` queries, each sequence ``context`` tokens long after its
    chunk, in rooms scattered at random: the arguments of ``paged_prefill_attention``."""
    import torch

    from kvlab.ops.testing import uniform_case

    _, k_cache, v_cache, tables, _ = uniform_case(
        batch, context, bs, q_heads=hq, kv_heads=hkv, head_dim=d, dtype=dtype, device=device
    )
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(batch * chunk, hq, d, device=device, dtype=dtype, generator=g)
    starts = torch.arange(0, batch * chunk + 1, chunk, device=device, dtype=torch.int32)
    computed = torch.full((batch,), context - chunk, device=device, dtype=torch.int32)
    return q, k_cache, v_cache, tables, starts, computed


def prefill_flops(batch, chunk, context, hq, d) -> int:
    """FLOPs of the causal work: query i of a chunk sees ``context - chunk + i + 1`` keys, each
    costing 2 x head_dim for QK^T and as much for PV, per query head."""
    keys = chunk * (context - chunk) + chunk * (chunk + 1) // 2
    return 4 * hq * d * keys * batch


def _contiguous_sdpa_prefill(args, batch, chunk, context):
    """SDPA's causal attention (aligned to the bottom right: the chunk is the last queries) on a
    contiguous copy of the same tokens, K/V expanded to every query head (not every backend
    takes GQA with that mask). Returns a function giving ``[num_tokens, q_heads, head_dim]``."""
    import torch
    from torch.nn.attention.bias import causal_lower_right

    q, k_cache, v_cache, tables, _, _ = args
    hq, d = q.shape[1:]
    hkv = k_cache.shape[2]

    def contiguous(cache):
        x = cache[tables.long()].reshape(batch, -1, hkv, d)[:, :context]
        return x.repeat_interleave(hq // hkv, dim=2).transpose(1, 2).contiguous()

    k, v = contiguous(k_cache), contiguous(v_cache)
    queries = q.view(batch, chunk, hq, d).transpose(1, 2)
    mask = causal_lower_right(chunk, context)

    def sdpa():
        out = torch.nn.functional.scaled_dot_product_attention(queries, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(batch * chunk, hq, d)

    return sdpa


def _prefill_row(batch, chunk, context, hq, hkv, d, bs, dtype, device, peak_flops) -> dict:
    """The prefill kernel and SDPA on the same chunks: ms, TFLOP/s, share of the peak, ratio."""
    import triton.testing

    from kvlab.ops.kernels import prepare_paged_prefill

    args = _prefill_inputs(batch, chunk, context, hq, hkv, d, bs, dtype, device)
    run = prepare_paged_prefill(*args)
    ms = triton.testing.do_bench(run)
    sdpa = _contiguous_sdpa_prefill(args, batch, chunk, context)
    sdpa_ms = triton.testing.do_bench(sdpa)
    error = (run().float() - sdpa().float()).abs().max().item()
    flops = prefill_flops(batch, chunk, context, hq, d)
    rate = flops / (ms * 1e-3)
    return {
        "batch": batch,
        "chunk": chunk,
        "context": context,
        "ms": round(ms, 4),
        "TFLOP_per_s": round(rate / 1e12, 1),
        "fraction_of_peak": round(rate / peak_flops, 3) if peak_flops else None,
        "sdpa_ms": round(sdpa_ms, 4),
        "sdpa_TFLOP_per_s": round(flops / (sdpa_ms * 1e-3) / 1e12, 1),
        "speed_vs_sdpa_contiguous": round(sdpa_ms / ms, 3),
        "max_error_vs_sdpa": float(f"{error:.2g}"),
    }


def prefill_targets(rows: list[dict]) -> dict:
    """Lab 09's target for the prefill kernel at each context: at least 0.7x SDPA's speed."""
    goal = PREFILL_TARGET_VS_SDPA
    return {
        f"prefill chunk {r['chunk']} ctx {r['context']}: >= {goal}x SDPA speed": [
            r["speed_vs_sdpa_contiguous"],
            r["speed_vs_sdpa_contiguous"] >= goal,
        ]
        for r in rows
    }


def _prefill_config_dict(config) -> dict:
    return {k: getattr(config, k) for k in ("rows", "tile_k", "num_warps", "num_stages")}


# --- the launch-option sweep ---------------------------------------------------------------------

# Every combination is timed at the target, nearest today's defaults first (each value's first
# entry is tried first). Split counts share one compiled kernel, so they cost only timing.
SWEEP = {
    "tile": (64, 32, 128),
    "num_warps": (4, 8),
    "num_stages": (3, 2, 4, 5),
    "prefetch_table": (False, True),
}
SWEEP_SPLITS = (1, 2, 3, 4, None)  # None: the launcher's own choice ("auto")
RERUN_BEST = 5  # the best launch options, timed again at every shape of SHAPES
TARGET_SHARE = 0.8  # of the time budget, for the target; the rest for the other shapes
SPLIT_SHAPES = {(1, 32768): (16, 32, 48, 64, 96, 128, None), (8, 8192): (1, 2, 4, 8, None)}


def sweep_variants(default) -> list:
    """Every ``LaunchConfig`` the sweep tries: the defaults, then one change away, then two..."""
    from kvlab.ops.kernels import LaunchConfig

    variants = [
        LaunchConfig(**dict(zip(SWEEP, values, strict=True)))
        for values in itertools.product(*SWEEP.values())
    ]
    return sorted(variants, key=lambda c: sum(getattr(c, k) != getattr(default, k) for k in SWEEP))


def _config_dict(config) -> dict:
    return {k: getattr(config, k) for k in SWEEP}


def _median_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


class _Timer:
    """Times one launch option on one batch: its first call (any compile included), then the
    median of many, as a row of the sweep's table. Failures become rows too."""

    def __init__(self, args, copy: float, sdpa_ms=None, reference=None):
        self.args, self.copy, self.sdpa_ms, self.reference = args, copy, sdpa_ms, reference

    def row(self, config: dict, num_splits) -> dict:
        import torch

        from kvlab.ops.kernels import prepare_paged_decode

        row = {**config, "num_splits": "auto" if num_splits is None else num_splits}
        try:
            begin = time.perf_counter()
            run = prepare_paged_decode(*self.args, num_splits=num_splits, **config)
            out = run()
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - begin, 2)
            ms = _median_ms(run)
        except Exception as error:  # a launch the GPU refuses (shared memory, ...): say which
            row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            return row
        bytes_per_s = _kv_bytes(self.args) / (ms * 1e-3)
        row.update(ms=round(ms, 4), GB_per_s=round(bytes_per_s / 1e9, 1))
        row["fraction_of_copy"] = round(bytes_per_s / self.copy, 3)
        if self.sdpa_ms is not None:
            row["speed_vs_sdpa_contiguous"] = round(self.sdpa_ms / ms, 3)
        if self.reference is not None:
            row["max_diff_vs_defaults"] = float(f"{(out.float() - self.reference).abs().max():.2g}")
        return row


def attention_sweep(budget_s: float = 200.0, device: str | None = None, checkpoint=None) -> dict:
    """Every launch option of the tiled kernel at the target shape (tile, num_warps, num_stages,
    prefetch_table, split count), ranked; then the best few at the other shapes and split counts
    at long contexts: the figures to set ``LAUNCH_DEFAULTS`` and the split heuristic from.

    Stops starting new timings at the target after ``TARGET_SHARE`` of ``budget_s`` seconds, and
    at the other shapes after ``budget_s`` (compiles included), and lists what it did not run. ``checkpoint(report)`` is called as results come in, so a run cut short keeps
    them."""
    import torch

    from kvlab.ops.kernels import paged_decode_attention, plan_splits
    from kvlab.ops.kernels.tiled import _multiprocessors, launch_defaults

    _need_gpu()
    start = time.perf_counter()
    device = device or "cuda"
    dtype = torch.bfloat16
    sms = _multiprocessors(torch.device(device))
    copy = copy_bandwidth(device)
    default = launch_defaults(HEAD_DIM, dtype)
    args = _attention_inputs(*TARGET, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)
    sdpa_ms = _median_ms(_contiguous_sdpa(args))
    torch.cuda.empty_cache()  # drop the contiguous copy
    reference = paged_decode_attention(*args).float()
    report = {
        "benchmark": "attention-sweep",
        **_header(device, copy),
        "multiprocessors": sms,
        "shape": {
            "q_heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
            "dtype": "bf16",
        },  # fmt: skip
        "target": {"batch": TARGET[0], "context": TARGET[1]},
        "sdpa_contiguous_ms": round(sdpa_ms, 4),
        # the same launch through paged_decode_attention, whose checks wait for the GPU
        "defaults_with_checks_ms": round(_median_ms(partial(paged_decode_attention, *args)), 4),
        "launch_defaults": _config_dict(default),
        "budget_s": budget_s,
        "configs": [],
        "other_shapes": [],
        "splits": [],
        "not_run": [],
    }

    def out_of_time(share: float = 1.0) -> bool:
        return time.perf_counter() - start > share * budget_s

    print(f"sweep at B={TARGET[0]} ctx {TARGET[1]}: SDPA on a contiguous cache {sdpa_ms:.4f} ms")
    timer = _Timer(args, copy, sdpa_ms, reference)
    for config in map(_config_dict, sweep_variants(default)):
        timed = {}  # split plan -> row, so that "auto" is not timed again under another name
        for num_splits in SWEEP_SPLITS:
            if out_of_time(TARGET_SHARE):
                report["not_run"].append({**config, "num_splits": num_splits})
                continue
            plan = plan_splits(TARGET[0], KV_HEADS, TARGET[1], config["tile"], num_splits, sms)
            if plan in timed:  # the launcher's choice was timed already: say so, time once
                timed[plan]["auto_is_the_same"] = True
                row = {**timed[plan], "num_splits": "auto", "same_as": timed[plan]["num_splits"]}
            else:
                row = timed[plan] = timer.row(config, num_splits)
            row["splits_run"] = plan.num_splits
            report["configs"].append(row)
            print(_sweep_line(row), flush=True)
            if "error" in row:
                break  # the other split counts build the same kernel
        if checkpoint:
            checkpoint(report)
    del args, timer, reference
    torch.cuda.empty_cache()

    ranked = sorted(
        (r for r in report["configs"] if "ms" in r and "same_as" not in r), key=lambda r: r["ms"]
    )
    best = []  # the best distinct launch options, then today's defaults
    for config in [{k: r[k] for k in SWEEP} for r in ranked] + [_config_dict(default)]:
        if config not in best and (len(best) < RERUN_BEST or config == _config_dict(default)):
            best.append(config)
    for batch, context in [s for s in SHAPES if s != TARGET]:
        shape_args = _attention_inputs(batch, context, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)  # fmt: skip
        timer, at = _Timer(shape_args, copy), {"batch": batch, "context": context}
        for config in best:
            if out_of_time():
                report["not_run"].append({**at, **config})
            else:
                report["other_shapes"].append({**at, **timer.row(config, None)})
        for num_splits in SPLIT_SHAPES.get((batch, context), ()) if ranked else ():
            if not out_of_time():
                report["splits"].append({**at, **timer.row(best[0], num_splits)})
        del shape_args, timer
        torch.cuda.empty_cache()
        if checkpoint:
            checkpoint(report)

    report["ranked"] = ranked
    report["best"] = ranked[0] if ranked else None
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    print_sweep(report)
    return report


def _sweep_line(row: dict) -> str:
    splits = str(row["num_splits"])
    if "splits_run" in row and splits != str(row["splits_run"]):
        splits += f"={row['splits_run']}"
    if row.get("auto_is_the_same"):
        splits += "=auto"
    text = (
        f"tile {row['tile']:3d}  warps {row['num_warps']}  stages {row['num_stages']}  "
        f"prefetch {'yes' if row['prefetch_table'] else 'no ':3s}  splits {splits:7s}"
    )
    if "error" in row:
        return f"{text}  FAILED {row['error']}"
    text += (
        f"  {row['ms']:.4f} ms  {row['GB_per_s']:7.1f} GB/s  {row['fraction_of_copy']:.3f} of copy"
    )
    if "speed_vs_sdpa_contiguous" in row:
        text += f"  {row['speed_vs_sdpa_contiguous']:.3f}x SDPA"
    if "first_call_s" in row:
        text += f"  (first call {row['first_call_s']:.1f} s)"
    return text


def print_sweep(report: dict) -> None:
    """The ranked table, the best options at the other shapes, and the line to paste as the
    default."""
    ranked = report["ranked"]
    print(f"\n{report['device']} (sm_{report['arch']}, {report['multiprocessors']} SMs) | torch "
          f"{report['torch']} | triton {report['triton']} | copy {report['copy_GB_per_s']:,} GB/s")  # fmt: skip
    print(f"ranked at B={TARGET[0]} ctx {TARGET[1]}: {len(ranked)} timed, "
          f"{len(report['not_run'])} not run within {report['budget_s']:.0f} s")  # fmt: skip
    for i, row in enumerate(ranked, 1):
        print(f"{i:4d}  {_sweep_line(row)}")
    for row in report["configs"]:
        if "error" in row:
            print(f"   -  {_sweep_line(row)}")
    for row in ranked:
        is_auto = row["num_splits"] == "auto" or row.get("auto_is_the_same")
        if is_auto and {k: row[k] for k in SWEEP} == report["launch_defaults"]:
            print(f"today's defaults: {_sweep_line(row)}")
    print(f"today's defaults through paged_decode_attention (checks included): "
          f"{report['defaults_with_checks_ms']:.4f} ms")  # fmt: skip
    if report["other_shapes"]:
        print("the best launch options at the other shapes (splits: the launcher's choice):")
        for row in sorted(report["other_shapes"], key=lambda r: (r["batch"], r["context"], r.get("ms", 1e9))):  # fmt: skip
            print(f"  B={row['batch']:<3d} ctx {row['context']:<6d} {_sweep_line(row)}")
    if report["splits"]:
        print("split counts with the best launch options:")
        for row in report["splits"]:
            print(f"  B={row['batch']:<3d} ctx {row['context']:<6d} {_sweep_line(row)}")
    best = report["best"]
    if best:
        fields = ", ".join(f"{k}={best[k]!r}" for k in SWEEP)
        print(f"best: {_sweep_line(best)}")
        print(f"as the default, in kvlab/ops/kernels/tiled.py: (128, 2): LaunchConfig({fields})")
        print(f"targets at the best: {best['fraction_of_copy']:.3f} of copy bandwidth (>= 0.8), "
              f"{best.get('speed_vs_sdpa_contiguous', 0):.3f}x SDPA (>= 0.9)")  # fmt: skip
    print(f"sweep took {report['elapsed_s']} s")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "name",
        help="allocator, serve, chunked-prefill, fleet, attention, attention-sweep or "
        "attention-grid (grade runs as `kvlab bench grade`: it is grading's)",
    )
    parser.add_argument("--out", help="JSON path (default: benchmarks/NAME.json)")
    parser.add_argument("--budget", type=float, help="attention-sweep: seconds before it stops")
    parser.add_argument("--requests", type=int, help="serve: requests in the timed run (100,000)")
    parser.add_argument(
        "--tiny", action="store_true", help="attention-grid: the CPU dry run's shapes"
    )
    cli = parser.parse_args()
    sys.exit(main(cli.name, cli.out, cli.budget, cli.requests, cli.tiny))
