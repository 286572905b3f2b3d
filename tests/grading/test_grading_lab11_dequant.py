"""11.dequant: the solution's kernel passes, each usual slip (the solution with one edit) gets its
own hint and no other, a mistake no slip explains gets none, and the launcher refuses bad input."""

import pathlib

import pytest
import torch
from grading_notebook import cell_sources, edited, run_cell

from kvlab.grading import Status, run_checks
from kvlab.grading.lab11 import dequant
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM
from kvlab.ops.kernels import launch_paged_decode_quantized
from kvlab.ops.kernels.quantized import paged_decode_quantized_ref

NOTEBOOK = pathlib.Path(__file__).parents[2] / "solutions" / "11_many_shapes.ipynb"
K_MASK = "t * stride_kst + kvh * stride_ksh,\n                          mask=tmask, other=0.0)"
V_MASK = "t * stride_vst + kvh * stride_vsh,\n                          mask=tmask, other=0.0)"


def kernel(*edits):
    """The solution's kernel with edits ("old => new"), run as the learner's notebook cell."""
    source = edited(cell_sources(NOTEBOOK)["lab11-41"], *edits)
    return run_cell(source, "my_paged_decode_quant_kernel")


def hints(result) -> list[str]:
    return [d for o in result.outcomes for d in o.details if d.startswith("hint:")]


def test_the_solution_passes_and_so_does_the_scale_moved_past_the_product():
    assert run_checks("11.dequant", kernel()).ok
    after_the_product = kernel(
        "        k = k * k_scale[:, None]\n => ",
        "        v = v * v_scale[:, None]\n => ",
        "axis=2) * scale => axis=2) * (k_scale * scale)[None, :]",
        "tl.sum(p[:, :, None] * v[None, :, :], axis=1) => "
        "tl.sum((p * v_scale[None, :])[:, :, None] * v[None, :, :], axis=1)",
    )
    assert run_checks("11.dequant", after_the_product).ok


def test_the_stub_is_not_implemented():
    stub = kernel("k_scale = tl.load( => raise NotImplementedError\n        k_scale = tl.load(")
    result = run_checks("11.dequant", stub)
    assert {o.status for o in result.outcomes} == {Status.NOT_IMPLEMENTED}


SLIPS = [
    (["k = k * k_scale[:, None] => k = k"], dequant.K_UNSCALED),
    (["v = v * v_scale[:, None] => v = v"], dequant.V_UNSCALED),
    (["k = k * k_scale[:, None] => k = k", "v = v * v_scale[:, None] => v = v"], dequant.NEITHER),
    (["v = v * v_scale[:, None] => v = v * k_scale[:, None]"], dequant.V_WITH_K),
    (
        ["k = k * k_scale[:, None] => k = k * v_scale[:, None]",
         "v = v * v_scale[:, None] => v = v * k_scale[:, None]"],
        dequant.SWAPPED,
    ),
    (
        [f"{K_MASK} => kvh * stride_ksh)",
         f"{V_MASK} => kvh * stride_vsh)",
         "k = k * k_scale[:, None] => k = k * k_scale",
         "v = v * v_scale[:, None] => v = v * v_scale"],
        dequant.ONE_PER_ROOM,
    ),
    (
        ["k = k * k_scale[:, None] => k = k / k_scale[:, None]",
         "v = v * v_scale[:, None] => v = v / v_scale[:, None]"],
        dequant.DIVIDED,
    ),
    (
        ["t * stride_kst + kvh * stride_ksh => t * stride_ksh + kvh * stride_kst",
         "t * stride_vst + kvh * stride_vsh => t * stride_vsh + kvh * stride_vst"],
        dequant.OUTSIDE,
    ),
]  # fmt: skip


@pytest.mark.parametrize("edits, hint", SLIPS, ids=[h[:40] for _, h in SLIPS])
def test_each_slip_is_named_by_the_first_check_and_no_other_hint_is_given(edits, hint):
    result = run_checks("11.dequant", kernel(*edits))
    first = next(o for o in result.outcomes if o.status != Status.PASSED)
    assert f"hint:     {hint}" in first.details, first.details
    assert set(hints(result)) == {f"hint:     {hint}"}
    assert result.passed < len(result.outcomes)


def test_a_label_loaded_without_the_token_mask_fails_the_garbage_check_only():
    result = run_checks("11.dequant", kernel(f"{V_MASK} => t * stride_vst + kvh * stride_vsh)"))
    failed = [o for o in result.outcomes if o.status != Status.PASSED]
    assert [o.name for o in failed] == [
        "the beds and labels no guest holds are never read (NaN there)"
    ]
    assert hints(result) == [f"hint:     {dequant.LABEL_UNMASKED}"]


def test_v_labels_read_with_k_strides_fail_the_check_that_lays_them_apart():
    # a red team's: every other check lays out K's and V's labels alike, so it passed them all
    with_k_strides = kernel(
        "vs_ptr + room * stride_vsb + t * stride_vst + kvh * stride_vsh => "
        "vs_ptr + room * stride_ksb + t * stride_kst + kvh * stride_ksh"
    )
    result = run_checks("11.dequant", with_k_strides)
    failed = [o.name for o in result.outcomes if o.status != Status.PASSED]
    assert failed == ["V's labels laid out apart from K's: each read with its own strides"]
    assert hints(result) == [f"hint:     {dequant.OUTSIDE}"]


def test_a_mistake_no_slip_explains_gets_no_hint():
    mean_label = kernel("k = k * k_scale[:, None] => k = k * tl.sum(k_scale) / BLOCK_SIZE")
    result = run_checks("11.dequant", mean_label)
    assert not result.ok and not hints(result)
    assert any(NO_DIAGNOSIS in d for o in result.outcomes for d in o.details)
    later = [o for o in result.outcomes if o.status != Status.PASSED][1:]
    assert not any(d.startswith(SAME_PROBLEM) for o in later for d in o.details)


def test_the_slips_unslipped_are_the_reference():
    for case in dequant.CASES.values():
        args = dequant.make_dequant_case(**case)
        unslipped = dequant.slipped(*args).to(args[0].dtype)
        assert torch.equal(unslipped, paged_decode_quantized_ref(*args))


def test_the_garbage_case_holds_nan_only_where_no_guest_is():
    q, kq, vq, ks, vs, tables, lens = dequant.make_dequant_case(
        **dequant.GARBAGE, garbage="nan room", nan_beds=True
    )
    for s, n in enumerate(lens.tolist()):
        rooms = tables[s, : -(-n // 4)].tolist()
        held = torch.cat([ks[r] for r in rooms])[:n]
        assert not held.isnan().any() and torch.cat([ks[r] for r in rooms])[n:].isnan().all()
    assert not paged_decode_quantized_ref(q, kq, vq, ks, vs, tables, lens).isnan().any()


def test_the_launcher_names_the_argument_it_refuses():
    q, kq, vq, ks, vs, tables, lens = dequant.make_dequant_case([3], 4)
    with pytest.raises(TypeError, match="k_scales must be a float32 tensor"):
        launch_paged_decode_quantized(None, q, kq, vq, ks.half(), vs, tables, lens)
    with pytest.raises(ValueError, match=r"v_scales must be \[num_blocks, block_size, kv_heads\]"):
        launch_paged_decode_quantized(None, q, kq, vq, ks, vs[:, :2], tables, lens)
    with pytest.raises(TypeError, match="k_values and v_values"):
        launch_paged_decode_quantized(None, q, kq.float(), vq, ks, vs, tables, lens)
