"""Lab 04 checks against slips that used to pass or get another mistake's hint: arithmetic in fp16
(caught by a long fp16 case with large scores, on the CPU, every time), the scale taken from the
block size (told apart from no scale where rooms hold one bed), the first guest's key card read
for every guest (also when its padding is 10**9); and the notebook's facts and chart.
"""

import json
import math
import pathlib

import pytest
import torch
from grading_notebook import failures, folded, hints

from kvlab.grading import lab04, run_checks
from kvlab.grading.expect import CheckFailed
from kvlab.ops.attention import decode_attention, paged_decode_attention_ref
from kvlab.ops.testing import FAR, TOLERANCE

ROOT = pathlib.Path(__file__).parents[2]
NOTEBOOK = ROOT / "solutions" / "04_paged_attention.ipynb"
FP16_CHECK = "fp16: head_dim 40, and 4,096 tokens with large scores"


def own_gather(kc, vc, row, n):
    """One guest's K and V from the rooms of key-card row ``row`` (the learner's own gather)."""
    rooms = row[: -(-n // kc.shape[1])].long()
    return kc[rooms].flatten(0, 1)[:n], vc[rooms].flatten(0, 1)[:n]


def per_guest(attend, row_of=lambda s: s):
    """A learner's paged attention: ``attend(q_s, k, v)`` for each guest s on the rooms of
    key-card row ``row_of(s)``."""

    def paged(q, kc, vc, bt, sl):
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            out[s] = attend(q[s], *own_gather(kc, vc, bt[row_of(s)], int(sl[s])))
        return out

    return paged


def expand(k, v, q):
    group = q.shape[0] // k.shape[1]
    return k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)


def fp16_scaled_after(q, k, v):  # q·k in q's dtype, then the scale: no upcast at all
    k, v = expand(k, v, q)
    scores = torch.einsum("hd,thd->ht", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)


def fp16_scaled_first(q, k, v):  # q scaled, then matmuls in q's dtype
    k, v = expand(k, v, q)
    scores = (q[:, None, :] * (1 / math.sqrt(q.shape[-1]))) @ k.permute(1, 2, 0)
    return (scores.softmax(dim=-1) @ v.transpose(0, 1))[:, 0]


def fp16_scores_only(q, k, v):  # scores in fp16, the softmax and the sum in fp32
    k, v = expand(k, v, q)
    scores = torch.einsum("hd,thd->ht", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("ht,thd->hd", scores.float().softmax(dim=-1), v.float()).to(q.dtype)


def fp32_by_hand(q, k, v):  # right: upcast, own matmuls (another order than kvlab's)
    k, v = expand(k.float(), v.float(), q)
    scores = (q.float()[:, None, :] / math.sqrt(q.shape[-1])) @ k.permute(1, 2, 0)
    return (scores.softmax(dim=-1) @ v.transpose(0, 1))[:, 0].to(q.dtype)


FP16_SLIPS = [fp16_scaled_after, fp16_scaled_first, fp16_scores_only]
RIGHT = [decode_attention, fp32_by_hand]


def worst(got, expected) -> float:
    """The largest error as a share of the fp16 tolerance at that value (above 1 fails)."""
    atol, rtol = TOLERANCE[expected.dtype]
    error = (got.float() - expected.float()).abs()
    return (error / (atol + rtol * expected.float().abs())).max().item()


# --- fp16 arithmetic -------------------------------------------------------------------------


@pytest.mark.parametrize("attend", RIGHT, ids=lambda f: f.__name__)
def test_fp32_arithmetic_passes_every_check(attend):
    assert run_checks("04.paged_attention", per_guest(attend)).ok


@pytest.mark.parametrize("attend", FP16_SLIPS, ids=lambda f: f.__name__)
def test_fp16_arithmetic_fails_the_fp16_check_with_its_hint(attend):
    result = run_checks("04.paged_attention", per_guest(attend))
    (only,) = failures(result)
    assert only.name.startswith(FP16_CHECK), result.report()
    assert any(d.startswith("input:    fp16, seq_lens [4096, 1000]") for d in only.details)
    assert hints(only) == [
        "hint:     right in float32, wrong in float16: compute the scores and the softmax in "
        "float32, then cast the result back to q.dtype"
    ]


def test_the_long_fp16_case_parts_fp16_from_fp32_arithmetic_by_a_wide_margin():
    """On this CPU torch rounds every fp16 op's result to fp16 (matmuls may add up in fp32, the
    scores are still stored in fp16): 10× the tolerance or more for the slips, under half of it
    for fp32 arithmetic rounded once."""
    args = lab04.make_case(**lab04.LONG_FP16)
    expected = paged_decode_attention_ref(*args)
    for attend in FP16_SLIPS:
        assert worst(per_guest(attend)(*args), expected) > 10, attend.__name__
    for attend in RIGHT:
        assert worst(per_guest(attend)(*args), expected) < 0.5, attend.__name__


def test_the_scaled_case_is_kvlabs_case_with_q_and_v_scaled():
    plain = lab04.make_case([5, 9], 4, dtype=torch.float16)
    scaled = lab04.make_case([5, 9], 4, dtype=torch.float16, q_scale=16.0, v_scale=8.0)
    assert torch.equal(scaled[0], (plain[0].float() * 16).half())
    assert torch.equal(scaled[2], (plain[2].float() * 8).half())
    assert all(torch.equal(a, b) for a, b in zip(plain[3:], scaled[3:], strict=True))
    assert torch.equal(scaled[1], plain[1])


# --- the scale -------------------------------------------------------------------------------


def by_block_size(q, kc, vc, bt, sl):
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        k, v = own_gather(kc, vc, bt[s], int(sl[s]))
        out[s] = decode_attention(q[s], k, v, scale=1 / math.sqrt(kc.shape[1]))
    return out


BLOCK_SIZE_HINT = (
    "hint:     scale by 1/sqrt(head_dim) (q.shape[-1]), not the block size: k_cache.shape[1] is "
    "block_size, the beds of a room"
)


def test_a_scale_by_the_block_size_is_named_and_folds():
    result = run_checks("04.paged_attention", by_block_size)
    first = failures(result)[0]
    assert result.passed == 0 and first.name == "one guest in one room"
    assert hints(first) == [BLOCK_SIZE_HINT]
    assert folded(result)


def test_the_lengths_check_has_rooms_smaller_than_head_dim():
    """block_size 16 = head_dim 16 let the block-size scale pass it: head_dim is 32 now."""
    with pytest.raises(CheckFailed) as failed:
        lab04._lengths(by_block_size)
    assert failed.value.cause == "block size scale"
    assert "head_dim 32" in failed.value.input


@pytest.mark.parametrize(
    "learner, cause",
    [
        (by_block_size, "block size scale"),
        (per_guest(lambda q, k, v: decode_attention(q, k, v, scale=1.0)), "no scale"),
    ],
    ids=["block size", "no scale"],
)
def test_rooms_of_one_bed_tell_the_block_size_from_no_scale(learner, cause):
    """With block_size 1 both slips give the same answer: rooms of another size tell them apart,
    so the block_size-1 check names the one the code makes."""
    with pytest.raises(CheckFailed) as failed:
        lab04._size_one(learner)
    assert failed.value.cause == cause
    assert failed.value.hint == lab04.HINTS[cause]


def test_a_scale_right_only_with_rooms_of_one_bed_is_not_named():
    """No scale with rooms of one bed, the right one otherwise: neither slip on other rooms."""

    def odd(q, kc, vc, bt, sl):
        out = per_guest(decode_attention)(q, kc, vc, bt, sl)
        if kc.shape[1] == 1:
            out = per_guest(lambda q, k, v: decode_attention(q, k, v, scale=1.0))(q, kc, vc, bt, sl)
        return out

    with pytest.raises(CheckFailed) as failed:
        lab04._size_one(odd)
    assert failed.value.hint is None


# --- one key card for every guest ------------------------------------------------------------

FIRST_CARD = per_guest(decode_attention, row_of=lambda s: 0)
FIRST_CARD_HINT = (
    "hint:     every guest read the first guest's key card (block_tables[0]): guest s's rooms "
    "are in its own row, block_tables[s]"
)


def test_the_first_guests_key_card_for_every_guest_is_named_and_folds():
    result = run_checks("04.paged_attention", FIRST_CARD)
    first = failures(result)[0]
    assert result.outcomes[0].passed  # one guest: its own key card is the first
    assert first.name == "lengths 1, k·block_size and k·block_size ± 1"
    assert hints(first) == [FIRST_CARD_HINT]
    assert folded(result)


def test_the_first_key_card_reaching_a_padding_of_10_to_the_9_is_named_so():
    """A longer guest reading the first guest's key card reaches its padding: with 10**9 there
    the code raises, and the same case with padding -1 says which slip it was."""
    with pytest.raises(CheckFailed) as failed:
        lab04._expect_case(FIRST_CARD, "padding 10**9", garbage=FAR, seq_lens=[5, 17], block_size=4)
    assert (
        failed.value.message == f"a padding entry of a key card ({FAR}) was used as a room number"
    )
    assert failed.value.cause == "one key card"
    assert failed.value.got.startswith("IndexError")


# --- the notebook ----------------------------------------------------------------------------


def cells() -> dict:
    return {c["id"]: "".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]}


def test_the_notebook_says_which_rooms_dave_gets_and_why():
    source = cells()
    namespace: dict = {}
    exec(source["lab04-01"] + "\n" + source["lab04-03"], namespace)
    assert namespace["cache"].manager.block_table("dave") == [7, 8]
    assert "dave gets rooms 7 and 8" in source["lab04-03"]
    assert "dave gets\nrooms 7 and 8" in source["lab04-02"]
    assert "freed longest ago first" in source["lab04-02"]
    assert "both of them" not in source["lab04-03"]


def test_every_bar_of_the_gather_chart_is_readable_and_labelled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source = cells()
    namespace: dict = {}
    exec(source["lab04-01"] + "\n" + source["lab04-11"], namespace)
    fig = namespace["fig"]
    ax = fig.axes[0]
    fig.canvas.draw()
    bars = [bar for container in ax.containers for bar in container]
    heights = [bar.get_window_extent().height for bar in bars]
    values = [*namespace["in_place"], *namespace["gathered"]]
    plt.close(fig)
    assert len(bars) == 8 and ax.get_yscale() == "log"
    assert min(heights) > 0.15 * max(heights)  # the 0.27 GB bar beside the 103 GB one
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:.3g}" for v in values)
