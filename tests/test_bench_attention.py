"""The attention benchmark's bookkeeping, run on CPU with a stand-in timer (its timings need a GPU:
here only the arithmetic, the SDPA comparison and the report's shape are checked)."""

import pytest
import torch
import triton.testing

from kvlab import bench


def test_attention_refuses_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark runs for real")
    assert bench.main("attention", None) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_attention_row_arithmetic(monkeypatch):
    calls = []

    def one_ms(fn):
        fn()
        calls.append(fn)
        return 1.0

    monkeypatch.setattr(triton.testing, "do_bench", one_ms)
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


def test_launch_sweep_runs_each_option(monkeypatch):
    seen = []

    def fake_bench(fn):
        fn()
        seen.append(fn)
        return 2.0

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(bench, "_attention_inputs", lambda *a: _small_inputs())
    sweep = bench.launch_sweep(4, 2, 32, 16, torch.float32, "cpu")
    assert [(r["num_warps"], r["num_stages"]) for r in sweep] == [(4, 3), (4, 5), (8, 3), (8, 5)]
    assert len(seen) == 4 and all(r["ms"] == 2.0 for r in sweep)


def _small_inputs():
    from kvlab.grading.lab04 import make_case

    return make_case([20, 3], 16, q_heads=4, kv_heads=2, head_dim=32)
