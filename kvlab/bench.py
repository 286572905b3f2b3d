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


BENCHMARKS = {"allocator": allocator}


def main(name: str, out: str | None) -> int:
    if name not in BENCHMARKS:
        print(f"kvlab bench: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
        return 2
    report = BENCHMARKS[name]()
    for label, value in report["results"].items():
        print(f"{label:48s} {value:>14,}")
    path = Path(out) if out else BENCH_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0
