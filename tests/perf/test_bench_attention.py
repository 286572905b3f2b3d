"""The attention benchmark's bookkeeping, run on CPU with a stand-in timer (its timings need a GPU:
here only the arithmetic, the SDPA comparison and the report's shape are checked). Triton is
reached only through kvlab, which must choose the interpreter before Triton is imported."""

import json
from dataclasses import replace

import pytest
import torch

from kvlab.ops.kernels import LAUNCH_DEFAULTS, LaunchConfig
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import make_case, uniform_case
from kvlab.perf import bench

# these run kernels on CPU tensors, which only Triton's interpreter takes
cpu_only = pytest.mark.skipif(
    kernel_mode() != "interpreter", reason="kernels on CPU tensors need Triton's interpreter"
)


def test_attention_refuses_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark runs for real")
    for name in ("attention", "attention-sweep"):
        assert bench.main(name, None) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().out


def _counting(calls, ms=1.0):
    def do_bench(fn, **options):
        fn()
        calls.append(fn)
        return ms

    return do_bench


@cpu_only
def test_attention_row_arithmetic(monkeypatch):
    calls = []
    monkeypatch.setattr("triton.testing.do_bench", _counting(calls))
    row = bench._attention_row(2, 48, 4, 2, 32, 16, torch.float32, "cpu", 2e12, 1e12)
    kv_bytes = 2 * 2 * 48 * 2 * 32 * 4
    assert len(calls) == 4  # auto splits, one split, the teaching kernel, SDPA
    assert row["GB_per_s"] == round(kv_bytes / 1e-3 / 1e9, 1)
    assert row["fraction_of_copy"] == round(kv_bytes / 1e-3 / 1e12, 3)
    assert row["speed_vs_sdpa_contiguous"] == 1.0 and row["split_k_speedup"] == 1.0
    assert row["max_error_vs_sdpa"] < 1e-5  # the paged kernel equals SDPA on the same tokens


def test_targets_read_the_right_rows():
    rows = [
        {"batch": 32, "context": 8192, "fraction_of_copy": 0.85, "speed_vs_sdpa_contiguous": 0.7},
        {"batch": 1, "context": 32768, "split_k_speedup": 3.5},
    ]
    targets = bench.attention_targets(rows)
    assert [met for _, met in targets.values()] == [True, False, True]


@cpu_only
def test_launch_sweep_runs_each_option(monkeypatch):
    seen = []
    monkeypatch.setattr("triton.testing.do_bench", _counting(seen, ms=2.0))
    monkeypatch.setattr(bench, "_attention_inputs", lambda *a: _small_inputs())
    sweep = bench.launch_sweep(4, 2, 32, 16, torch.float32, "cpu")
    assert [(r["num_warps"], r["num_stages"]) for r in sweep] == [(4, 3), (4, 5), (8, 3), (8, 5)]
    assert len(seen) == 4 and all(r["ms"] == 2.0 for r in sweep)


def test_sweep_starts_at_the_defaults_and_tries_every_combination():
    default = LAUNCH_DEFAULTS[(128, 2)]
    variants = bench.sweep_variants(default)
    assert variants[0] == default and len(set(variants)) == len(variants) == 48
    changes = [sum(getattr(v, k) != getattr(default, k) for k in bench.SWEEP) for v in variants]
    assert changes == sorted(changes)  # one change away before two


@cpu_only
def test_attention_sweep_report(monkeypatch, tmp_path, capsys):
    """The whole sweep on CPU tensors with a fake clock: every row timed or refused, "auto"
    not timed twice, the best few again at the other shapes, the JSON checkpointed."""
    sweep = {"tile": (64, 32), "num_warps": (4,), "num_stages": (3,), "prefetch_table": (False,)}
    monkeypatch.setattr(bench, "SWEEP", sweep)
    monkeypatch.setattr(bench, "SWEEP_SPLITS", (1, 2, None))
    monkeypatch.setattr(bench, "SHAPES", [(1, 8), bench.TARGET])
    monkeypatch.setattr(bench, "SPLIT_SHAPES", {(1, 8): (1, 2)})
    monkeypatch.setattr(bench, "_need_gpu", lambda: None)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device: 1e12)
    monkeypatch.setattr(bench, "_attention_inputs", lambda *a: _uniform_inputs())
    monkeypatch.setattr(bench, "_header", lambda device, copy: {"device": "cpu", "arch": None,
                        "torch": "t", "triton": "tr", "copy_GB_per_s": 1000.0})  # fmt: skip
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    from kvlab.ops.kernels import tiled

    monkeypatch.setattr(tiled, "_multiprocessors", lambda device: 132)  # "auto" is 2 splits
    # the sweep times the launcher's defaults among its rows: pin them to a row of this sweep
    monkeypatch.setitem(tiled.LAUNCH_DEFAULTS, (128, 2), tiled.LaunchConfig(64, 4, 3))
    monkeypatch.setitem(tiled.LAUNCH_DEFAULTS, (128, 4), tiled.LaunchConfig(64, 4, 3))
    timings = iter(range(1, 1000))
    monkeypatch.setattr(bench, "_median_ms", lambda fn: (fn(), float(next(timings)))[1])
    original = tiled.prepare_paged_decode

    def refuse_tile_32(*args, tile=None, **options):
        if tile == 32:
            raise RuntimeError("out of resource: shared memory\nmore")
        return original(*args, tile=tile, **options)

    monkeypatch.setattr("kvlab.ops.kernels.prepare_paged_decode", refuse_tile_32)
    path = tmp_path / "sweep.json"
    assert bench.main("attention-sweep", str(path), budget_s=600) == 0
    report = json.loads(path.read_text())
    configs = report["configs"]
    assert [(r["tile"], r["num_splits"]) for r in configs] == [
        (64, 1),
        (64, 2),
        (64, "auto"),
        (32, 1),
    ]
    assert configs[2]["same_as"] == 2 and configs[2]["ms"] == configs[1]["ms"]  # timed once
    assert configs[3]["error"] == "RuntimeError: out of resource: shared memory"
    assert [r["ms"] for r in report["ranked"]] == sorted(r["ms"] for r in report["ranked"])
    assert report["best"]["tile"] == 64 and report["not_run"] == []
    assert [(r["batch"], r["num_splits"]) for r in report["other_shapes"]] == [(1, "auto")]
    assert [r["num_splits"] for r in report["splits"]] == [1, 2]
    out = capsys.readouterr().out
    assert "ranked at B=32 ctx 8192" in out and "LaunchConfig(tile=64, num_warps=4" in out
    assert "FAILED RuntimeError: out of resource" in out


@cpu_only
def test_sweep_stops_at_its_budget(monkeypatch):
    monkeypatch.setattr(bench, "SHAPES", [bench.TARGET])
    monkeypatch.setattr(bench, "_need_gpu", lambda: None)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device: 1e12)
    monkeypatch.setattr(bench, "_attention_inputs", lambda *a: _uniform_inputs())
    monkeypatch.setattr(bench, "_header", lambda device, copy: {"device": "cpu", "arch": None,
                        "torch": "t", "triton": "tr", "copy_GB_per_s": 1000.0})  # fmt: skip
    monkeypatch.setattr(bench, "_median_ms", lambda fn: 1.0)
    report = bench.attention_sweep(budget_s=0)
    assert report["configs"] == [] and len(report["not_run"]) == 48 * len(bench.SWEEP_SPLITS)
    assert (
        LaunchConfig(**{k: report["not_run"][0][k] for k in bench.SWEEP})
        == (LAUNCH_DEFAULTS[(128, 2)])
    )


def _small_inputs():
    return make_case([20, 3], 16, q_heads=4, kv_heads=2, head_dim=32)


def _uniform_inputs():
    return uniform_case(2, 48, 16, q_heads=4, kv_heads=2, head_dim=32, dtype=torch.float32)


@cpu_only
def test_prefill_row_arithmetic(monkeypatch):
    """The prefill row on CPU tensors: the kernel and SDPA's bottom-right causal attention on a
    contiguous copy agree, and the FLOPs count only the keys each query sees."""
    calls = []
    monkeypatch.setattr("triton.testing.do_bench", _counting(calls))
    row = bench._prefill_row(2, 8, 20, 4, 2, 16, 4, torch.float32, "cpu", 1e15)
    keys = 8 * 12 + 8 * 9 // 2  # a chunk of 8 after 12 cached tokens
    assert bench.prefill_flops(2, 8, 20, 4, 16) == 4 * 4 * 16 * keys * 2
    assert len(calls) == 2  # the kernel, SDPA
    assert row["TFLOP_per_s"] == round(4 * 4 * 16 * keys * 2 / 1e-3 / 1e12, 1)
    assert row["speed_vs_sdpa_contiguous"] == 1.0
    assert row["max_error_vs_sdpa"] < 1e-5


def test_prefill_targets():
    rows = [
        {"chunk": 512, "context": 2048, "speed_vs_sdpa_contiguous": 0.75},
        {"chunk": 512, "context": 8192, "speed_vs_sdpa_contiguous": 0.5},
    ]
    targets = bench.prefill_targets(rows)
    assert list(targets) == [
        "prefill chunk 512 ctx 2048: >= 0.7x SDPA speed",
        "prefill chunk 512 ctx 8192: >= 0.7x SDPA speed",
    ]
    assert [met for _, met in targets.values()] == [True, False]


# --- the decode grid (kvlab.perf.attention_grid) -----------------------------------------------


def test_grid_shapes_and_bytes():
    from kvlab.perf.attention_grid import FULL, ROW_FIELDS, grid_shapes

    shapes = grid_shapes()
    assert len(shapes) == 4 * 4 * 2 and {s["gqa"] for s in shapes} == {"8:1", "1:1"}
    one = next(s for s in shapes if (s["gqa"], s["batch"], s["context"]) == ("8:1", 32, 8192))
    assert one["kv_bytes"] == 2 * 32 * 8192 * 8 * 128 * 2  # K and V, bf16
    assert one["bytes_moved"] == one["kv_bytes"] + 2 * 32 * 64 * 128 * 2  # + queries and output
    assert set(one) <= set(ROW_FIELDS) and one["tokens"] == 32 * 8192
    with pytest.raises(ValueError, match="kv_heads"):
        grid_shapes(replace(FULL, heads=((6, 4),)))


def _grid_rows(copy_share, sdpa_speed=1.1):
    from kvlab.perf.attention_grid import grid_shapes

    return [
        {**s, "fraction_of_copy": copy_share(s), "speed_vs_sdpa_contiguous": sdpa_speed}
        for s in grid_shapes()
    ]


def test_grid_targets_pass_miss_and_by_how_much():
    from kvlab.perf.attention_grid import grid_targets

    rows = _grid_rows(lambda s: 0.9 if s["tokens"] >= 65_536 else 0.55, sdpa_speed=0.95)
    rows[-1]["fraction_of_copy"] = 0.8  # 1:1, B=128 x 32k: the worst big row
    targets = {(t["gqa"], t["target"].split()[1]): t for t in grid_targets(rows)}
    big = targets[("1:1", "0.85")]
    assert big["status"] == "miss" and big["by"] == -0.05 and big["rows"] == 9
    assert big["at"] == {"batch": 128, "context": 32768}
    assert targets[("8:1", "0.85")]["status"] == "pass" and targets[("8:1", "0.85")]["by"] == 0.05
    split = targets[("8:1", "0.6")]
    assert split["status"] == "miss" and split["by"] == -0.05 and split["at"]["batch"] == 1
    assert targets[("8:1", "1.0x")]["status"] == "miss" and targets[("8:1", "1.0x")]["by"] == -0.05
    rows = [r for r in rows if (r["batch"], r["context"]) != (32, 8192)]
    assert {t["status"] for t in grid_targets(rows) if "SDPA" in t["target"]} == {"not measured"}


def test_grid_table_says_plainly_when_not_measured(tmp_path):
    from kvlab.perf.attention_grid import grid_table, grid_targets, render

    assert grid_table(None).startswith("Not yet measured: no GPU has been lent")
    cpu = {"timing": "one interpreted call's wall clock: not a measurement", "rows": [{}]}
    assert grid_table(cpu).startswith("Not yet measured")  # a dry run's times are not figures
    assert render(tmp_path / "absent.json").startswith("Not yet measured")
    rows = _grid_rows(lambda s: 0.9)
    report = {"device": "GPU", "timing": "triton.testing.do_bench, median", "copy_GB_per_s": 1.0,
              "rows": rows, "targets": grid_targets(rows)}  # fmt: skip
    (tmp_path / "attention.json").write_text(json.dumps({"grid": report}))
    table = render(tmp_path / "attention.json")
    assert table.count("\n| 8:1 |") == 4 and "| 1:1 | 128 | 0.90 / 1.10x |" in table
    assert "pass at 0.9" in table


def test_tiny_is_for_the_grid_only(capsys):
    assert bench.main("allocator", None, tiny=True) == 2
    assert "--tiny is for attention-grid only" in capsys.readouterr().out
