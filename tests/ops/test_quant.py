"""Quantised K/V: the per-token (and KV head) quantisation in torch, and the decode kernel that
dequantises in the kernel, against the torch reference in Triton's interpreter (small shapes)."""

import pytest
import torch

from kvlab.ops import quant
from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.kernels.quantized import (
    paged_decode_attention_quantized,
    paged_decode_quantized_ref,
)
from kvlab.ops.testing import flash_layout, make_case, tolerance

FORMATS = ("fp8_e4m3", "int8")


def _vectors(seed=0, dtype=torch.float32):
    """[tokens, kv_heads, head_dim] with magnitudes from 1e-3 to 1e3, a zero vector among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, 3, 20, generator=g) * 10.0 ** torch.randint(-3, 4, (9, 3, 1), generator=g)
    x[4, 1] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_within_the_formats_bound(fmt, dtype):
    x = _vectors(dtype=dtype)
    values, scales = quant.quantize(x, fmt)
    assert values.dtype == quant.FORMATS[fmt].dtype and values.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == x.shape[:-1]
    back = quant.dequantize(values, scales)
    assert ((back - x.float()).abs() <= quant.error_bound(x, scales, fmt)).all()
    # the largest element of each non-zero vector lands on the format's largest value
    top = values.float().abs().amax(-1)
    nonzero = x.float().abs().amax(-1) > 0
    assert (top[nonzero] == quant.FORMATS[fmt].max).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_zero_vector_gets_scale_one_and_comes_back_zero(fmt):
    values, scales = quant.quantize(torch.zeros(2, 1, 8), fmt)
    assert (scales == 1).all() and (values.float() == 0).all()
    assert not quant.dequantize(values, scales).isnan().any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_given_scale_saturates_at_the_formats_max(fmt):
    x = torch.tensor([[1.0, -2.0, 1000.0, -1000.0]])
    values, scales = quant.quantize(x, fmt, scale=0.5)
    top = quant.FORMATS[fmt].max
    assert values.float().tolist() == [[2.0, -4.0, top, -top]] and scales.tolist() == [0.5]


def test_int8_without_clamp_wraps_and_truncation_doubles_the_error():
    assert (
        quant.to_format(torch.tensor([[130.0]]), torch.tensor([1.0]), "int8", clamp=False)[0, 0]
        == -126
    )
    x = torch.randn(200, 16, generator=torch.Generator().manual_seed(1))
    scales = quant.scales_for(quant.vector_amax(x), "int8")
    err = {
        r: (quant.dequantize(quant.to_format(x, scales, "int8", rounding=r), scales) - x).abs()
        for r in ("nearest", "toward zero")
    }
    assert err["toward zero"].mean() > 1.8 * err["nearest"].mean()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_nan_vector_spoils_only_itself(fmt):
    x = _vectors(seed=2)
    poisoned = x.clone()
    poisoned[3, 2, 5] = float("nan")
    a, sa = quant.quantize(x, fmt)
    b, sb = quant.quantize(poisoned, fmt)
    keep = torch.ones(x.shape[:-1], dtype=torch.bool)
    keep[3, 2] = False
    assert torch.equal(a[keep].view(torch.uint8), b[keep].view(torch.uint8))
    assert torch.equal(sa[keep], sb[keep])


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="fmt"):
        quant.quantize(torch.ones(2, 4), "fp4")
    with pytest.raises(TypeError, match="x must"):
        quant.quantize(torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="scale"):
        quant.quantize(torch.ones(2, 4), scale=0.0)
    with pytest.raises(ValueError, match="scales"):
        quant.dequantize(torch.ones(2, 4).to(torch.int8), torch.ones(4))


# --- the kernel, in Triton's interpreter on a CPU -------------------------------------------------

KERNEL_CASES = [
    # (seq_lens, block_size, (q_heads, kv_heads), head_dim, dtype, options)
    ([1], 16, (4, 4), 16, torch.float32, {}),
    ([15, 16, 17, 33], 16, (6, 2), 24, torch.float32, {}),  # k * block_size ± 1, head_dim 24
    ([5, 9, 1], 4, (8, 1), 40, torch.float16, {}),
    ([23, 2], 1, (4, 2), 20, torch.bfloat16, {}),
    ([70, 3], 8, (4, 2), 16, torch.float32, {"num_splits": 3, "tile": 16}),  # split-K
    ([31, 6], 16, (2, 2), 128, torch.bfloat16, {"num_splits": 2}),
]


def _poisoned(seq_lens, block_size, heads, head_dim, dtype, fmt, seed=0):
    """A case quantised, with NaN in every value and scale no guest holds (past each guest's
    end, and the spare room that padding entries name)."""
    q, k, v, tables, lens = make_case(
        seq_lens, block_size, *heads, head_dim, dtype=dtype, seed=seed, nan_beds=True,
        garbage="nan room",
    )  # fmt: skip
    kq, ks = quant.quantize(k, fmt)
    vq, vs = quant.quantize(v, fmt)
    unread = k.float().isnan().any(-1)  # beds (and rooms) holding no token: poison them all
    for values, scales in ((kq, ks), (vq, vs)):
        scales[unread] = float("nan")
        # fp8 e4m3's NaN (0x7F); int8 -128, the far end of the grid
        values.view(torch.uint8)[unread] = 0x7F if fmt == "fp8_e4m3" else 0x80
    return q, kq, vq, ks, vs, tables, lens


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "seq_lens, block_size, heads, head_dim, dtype, options",
    KERNEL_CASES,
    ids=[f"{c[0]}-bs{c[1]}-{c[2][0]}on{c[2][1]}-d{c[3]}-{c[4]}" for c in KERNEL_CASES],
)
def test_quantized_kernel_matches_torch(fmt, seq_lens, block_size, heads, head_dim, dtype, options):
    args = _poisoned(seq_lens, block_size, heads, head_dim, dtype, fmt)
    got = paged_decode_attention_quantized(*args, **options)
    want = paged_decode_quantized_ref(*args)
    assert got.dtype == dtype and not got.isnan().any()
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))


def test_quantized_kernel_takes_any_strides():
    q, kq, vq, ks, vs, tables, lens = _poisoned([9, 4], 4, (4, 2), 16, torch.float32, "int8")
    kq, vq = flash_layout(kq, vq)
    ks, vs = flash_layout(ks, vs)
    tables = tables.t().contiguous().t()
    want = paged_decode_quantized_ref(q, kq, vq, ks, vs, tables, lens)
    torch.testing.assert_close(
        paged_decode_attention_quantized(q, kq, vq, ks, vs, tables, lens), want
    )


@pytest.mark.parametrize("fmt, limit", [("fp8_e4m3", 0.1), ("int8", 0.01)])
def test_attention_error_against_sixteen_bits_is_small(fmt, limit):
    q, k, v, tables, lens = make_case([40, 17], 8, 4, 2, 32, dtype=torch.bfloat16, seed=4)
    exact = paged_decode_attention_ref(q, k, v, tables, lens).float()
    kq, ks = quant.quantize(k, fmt)
    vq, vs = quant.quantize(v, fmt)
    got = paged_decode_attention_quantized(q, kq, vq, ks, vs, tables, lens).float()
    assert (got - exact).abs().max() < limit


def test_bad_quantized_inputs_name_the_argument():
    q, kq, vq, ks, vs, tables, lens = _poisoned([5], 4, (2, 1), 16, torch.float32, "int8")
    with pytest.raises(ValueError, match="k_scales"):
        paged_decode_attention_quantized(q, kq, vq, ks[..., None], vs, tables, lens)
    with pytest.raises(TypeError, match="v_scales"):
        paged_decode_attention_quantized(q, kq, vq, ks, vs.half(), tables, lens)
    with pytest.raises(TypeError, match="k_values"):
        paged_decode_attention_quantized(q, kq.float(), vq, ks, vs, tables, lens)


# --- kvlab bench attention's quantised rows, with a stand-in timer (timings need a GPU) -----------


def test_bench_quantized_row_and_target(monkeypatch):
    from kvlab.ops.runtime import kernel_mode
    from kvlab.perf import bench

    if kernel_mode() != "interpreter":
        pytest.skip("kernels on CPU tensors need Triton's interpreter")
    times = iter([2.0, 1.0])  # the 16-bit kernel, then the quantised one
    monkeypatch.setattr("triton.testing.do_bench", lambda fn, **o: (fn(), next(times))[1])
    row = bench._quantized_row(2, 40, 4, 2, 32, 16, torch.bfloat16, "cpu", 1e12)
    assert row["format"] == "fp8_e4m3" and row["speedup"] == 2.0
    assert row["tokens_per_s_quantized"] == 2 * 40 / 1e-3
    assert row["GB_per_s_quantized"] == round(2 * 80 * 2 * (32 + 4) / 1e-3 / 1e9, 1)
    assert row["max_error_vs_16_bit"] < 0.1
    target = bench.quantized_targets([{**row, "batch": 32, "context": 8192}])
    assert list(target.values()) == [[2.0, True]]
    assert bench.quantized_targets([row]) == {}
