import pytest

from kvlab.models import LLAMA_3_8B, ModelSpec
from kvlab.perf.roofline import A100_80GB, H100_SXM, H200, measure_matmul_rate, step_cost


def test_ridge_points_from_the_data_sheets():
    assert A100_80GB.ridge_intensity == pytest.approx(153, abs=1)  # 312 TFLOP/s / 2,039 GB/s
    assert H100_SXM.ridge_intensity == pytest.approx(295, abs=1)
    assert H200.ridge_intensity == pytest.approx(206, abs=1)
    assert H100_SXM.attainable_flops(1.0) == 3.35e12
    assert H100_SXM.attainable_flops(1e6) == 989e12


def test_decode_is_memory_bound_and_prefill_compute_bound():
    decode = step_cost(LLAMA_3_8B, new_tokens=1, context=1024)
    prefill = step_cost(LLAMA_3_8B, new_tokens=512)
    assert decode.intensity == pytest.approx(1.0, rel=0.1)  # one multiply-add per weight byte pair
    assert decode.bound(H100_SXM) == "memory"
    assert prefill.bound(H100_SXM) == "compute" and prefill.intensity > 400
    # a memory-bound step's time is the bytes over bandwidth
    assert decode.seconds(H100_SXM) == pytest.approx(decode.bytes / 3.35e12)


def test_batching_raises_intensity_but_kv_reads_cap_it():
    costs = [step_cost(LLAMA_3_8B, 1, context=1024, batch=b) for b in (1, 8, 64, 512)]
    intensities = [c.intensity for c in costs]
    assert intensities == sorted(intensities)
    # with the KV cache read per sequence, intensity stays far below the batch size
    assert costs[-1].intensity < 512 / 4


def test_step_cost_counts_by_hand():
    spec = ModelSpec("toy", 1, 1, 1, 2, dtype_bytes=2, num_params=100)
    cost = step_cost(spec, new_tokens=1, context=3)
    # weights: 2*100 FLOPs; attention: 4*1*1*2*(3+1)=32; bytes: 200 + 4 tokens * 8 bytes
    assert cost.flops == 232 and cost.bytes == 232


def test_bad_arguments():
    with pytest.raises(ValueError, match="no num_params"):
        step_cost(ModelSpec("x", 1, 1, 1, 1), 1)
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        step_cost(LLAMA_3_8B, 0)


def test_measured_matmul_rate_is_real():
    rows = measure_matmul_rate([1, 64], dim=256, repeats=2)
    assert [r[0] for r in rows] == [1, 64]
    assert all(rate > 0 for _, rate, _ in rows)
    assert rows[1][2] > rows[0][2]
