"""Lab 11's 11.latent and 11.quantize, tried with learner code: the solutions pass and the stubs
are "not implemented"; each usual slip put into a solution fails with the hint that names it, and
only that hint; a mistake no slip explains gets none; kvlab's own answer is refused."""

import learner_code
import pytest
import torch
from learner_code import assert_only_hint, hints_of

import kvlab.grading.lab11.latent as latent
import kvlab.grading.lab11.quantize as quantize
from kvlab.grading import Status, run_checks

HEADER = "import math\nimport torch\n"

MLA_DECODE = """
def mla_decode(q_nope, q_pe, latent, w_uk, w_uv):
    rank = w_uk.shape[2]
    c, k_pe = latent[:, :rank].float(), latent[:, rank:].float()
    q_lat = torch.einsum("hn,hnr->hr", q_nope.float(), w_uk.float())
    scores = q_lat @ c.T + q_pe.float() @ k_pe.T
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_pe.shape[-1])
    o_lat = torch.softmax(scores * scale, dim=-1) @ c
    return torch.einsum("hr,hvr->hv", o_lat, w_uv.float()).to(q_nope.dtype)
"""

QUANTIZE = """
FORMATS = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "int8": (torch.int8, 127.0)}


def quantize(x, fmt="fp8_e4m3", scale=None):
    dtype, top = FORMATS[fmt]
    if scale is None:
        amax = x.float().abs().amax(dim=-1)
        scales = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    else:
        scales = torch.full(x.shape[:-1], float(scale))
    y = (x.float() / scales[..., None]).clamp(-top, top)
    if fmt == "int8":
        y = y.round()
    return y.to(dtype), scales
"""


def learner(source, name, *edits):
    return learner_code.learner(source, name, *edits, header=HEADER)


def stub(name, args):
    return learner(f"def {name}({args}):\n    raise NotImplementedError\n", name)


# --- 11.latent -------------------------------------------------------------------------------


def test_absorbed_mla_passes_and_the_stub_is_not_written_yet():
    result = run_checks("11.latent", learner(MLA_DECODE, "mla_decode"))
    assert result.ok and result.passed == result.total == len(latent.CASES), result.report()
    stub_fn = stub("mla_decode", "q_nope, q_pe, latent, w_uk, w_uv")
    assert run_checks("11.latent", stub_fn).status is Status.NOT_IMPLEMENTED


def test_the_expanded_form_written_by_hand_passes_too():
    source = """
def mla_decode(q_nope, q_pe, latent, w_uk, w_uv):
    rank = w_uk.shape[2]
    c, k_pe = latent[:, :rank].float(), latent[:, rank:].float()
    k = torch.cat([torch.einsum("hnr,tr->thn", w_uk.float(), c),
                   k_pe[:, None].expand(-1, w_uk.shape[0], -1)], dim=-1)
    v = torch.einsum("hvr,tr->thv", w_uv.float(), c)
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)
    p = torch.softmax(torch.einsum("hd,thd->ht", q, k) / math.sqrt(q.shape[-1]), dim=-1)
    return torch.einsum("ht,thv->hv", p, v).to(q_nope.dtype)
"""
    assert run_checks("11.latent", learner(source, "mla_decode")).ok


LATENT_SLIPS = [
    (
        "q_nope.shape[-1] + q_pe.shape[-1]) => q_nope.shape[-1])",
        latent.SCALE_NOPE,
    ),
    ("q_nope.shape[-1] + q_pe.shape[-1]) => latent.shape[-1])", latent.SCALE_LATENT),
    ("q_nope.shape[-1] + q_pe.shape[-1]) => rank)", latent.SCALE_LATENT),
    ("scores * scale => scores", latent.NO_SCALE),
    ("scale = 1 / math.sqrt( => scale = math.sqrt(", latent.SCALE_INVERTED),
    (
        "scores = q_lat @ c.T + q_pe.float() @ k_pe.T => "
        "scores = q_lat @ c.T / math.sqrt(q_nope.shape[-1] + q_pe.shape[-1]) + q_pe.float() @ k_pe.T"
        " && scores * scale => scores",
        latent.ROPE_UNSCALED,
    ),
    ("q_lat @ c.T + q_pe.float() @ k_pe.T => q_lat @ c.T", latent.NO_ROPE),
    (
        "c, k_pe = latent[:, :rank].float(), latent[:, rank:].float() => "
        "k_pe, c = latent[:, :-rank].float(), latent[:, -rank:].float()",
        latent.ROPE_FIRST,
    ),
    ('"hn,hnr->hr" => "hn,hrn->hr"', latent.UK_TRANSPOSED),
    ('"hr,hvr->hv" => "hr,hrv->hv"', latent.UV_TRANSPOSED),
    ("o_lat, w_uv.float() => o_lat, w_uk.float()", latent.UK_FOR_VALUES),
    ("scale, dim=-1) => scale, dim=0)", latent.SOFTMAX_OVER_HEADS),
    (".to(q_nope.dtype) => ", latent.DTYPE),
    (
        'return torch.einsum("hr,hvr->hv", o_lat, w_uv.float()).to(q_nope.dtype) => '
        "return o_lat.to(q_nope.dtype)",
        latent.LATENT_OUT,
    ),
    (".float() => ", latent.LOW_PRECISION),
    (
        "torch.softmax(scores * scale, dim=-1) => "
        "(scores * scale).exp() / (scores * scale).exp().sum(-1, keepdim=True)",
        latent.OVERFLOW,
    ),
]


@pytest.mark.parametrize("edit, hint", LATENT_SLIPS, ids=[h[:40] for _, h in LATENT_SLIPS])
def test_each_latent_slip_gets_its_hint_only(edit, hint):
    assert_only_hint(
        run_checks("11.latent", learner(MLA_DECODE, "mla_decode", *edit.split(" && "))), hint
    )


def test_the_latent_probes_tell_the_scale_slips_apart():
    """On the square case a scale by nope and one by the rank coincide; the first probe parts
    them."""
    square = latent.mla.make_mla_case(**next(iter(latent.CASES.values())))
    nope, rank = latent.SLIPS[0], latent.SLIPS[2]
    assert latent._close(nope.answer(*square), rank.answer(*square))
    probe = latent.PROBES[0]
    assert not latent._close(nope.answer(*probe), rank.answer(*probe))


def test_a_softmax_without_its_max_fails_only_where_exp_overflows():
    # a red team's: every case's scores stayed below exp's overflow in fp32, so it passed
    naive = "torch.softmax(scores * scale, dim=-1) => (scores * scale).exp() / (scores * scale).exp().sum(-1, keepdim=True)"
    result = run_checks("11.latent", learner(MLA_DECODE, "mla_decode", naive))
    assert result.passed == result.total - 1, result.report()
    assert "✘ float32, 16 tokens, sharper still" in result.report(), result.report()


def test_an_unknown_latent_mistake_gets_no_hint():
    result = run_checks("11.latent", learner(MLA_DECODE, "mla_decode", "o_lat = => o_lat = 1.5 *"))
    assert result.status is Status.FAILED and hints_of(result) == [], result.report()


def test_kvlab_mla_behind_a_wrapper_is_refused():
    from kvlab.ops import mla

    for fn in (mla.mla_decode_absorbed, mla.mla_decode_expanded):
        result = run_checks("11.latent", lambda *a, fn=fn: fn(*a))
        assert result.passed == 0 and result.status is Status.FAILED, result.report()
        assert "hands the work to kvlab" in result.report()
    assert run_checks("11.latent", mla.mla_decode_absorbed).status is Status.WRONG_KIND


# --- 11.quantize -----------------------------------------------------------------------------


def test_quantize_passes_and_the_stub_is_not_written_yet():
    result = run_checks("11.quantize", learner(QUANTIZE, "quantize"))
    assert result.ok and result.passed == result.total == len(quantize.CHECKS), result.report()
    stub_fn = stub("quantize", "x, fmt='fp8_e4m3', scale=None")
    assert run_checks("11.quantize", stub_fn).status is Status.NOT_IMPLEMENTED


QUANTIZE_SLIPS = [
    ("x.float().abs().amax(dim=-1) => x.float().abs().amax()", quantize.PER_TENSOR),
    (
        "x.float().abs().amax(dim=-1) => x.float().abs().amax(dim=0) && "
        "scales[..., None] => scales",
        quantize.WRONG_AXIS,
    ),
    ("x.float().abs().amax(dim=-1) => x.float().amax(dim=-1)", quantize.NO_ABS),
    (
        "x.float().abs().amax(dim=-1) => x.float().abs().amax(dim=-1, keepdim=True) && "
        "scales[..., None] => scales && torch.full(x.shape[:-1], => torch.full((*x.shape[:-1], 1),",
        quantize.KEEPDIM,
    ),
    ("x.float().abs().amax(dim=-1) => x.abs().amax(dim=-1)", quantize.SCALES_FP32),
    (
        "torch.where(amax > 0, amax / top, torch.ones_like(amax)) => "
        "torch.where(amax > 0, top / amax, torch.ones_like(amax)) && "
        "x.float() / scales[..., None] => x.float() * scales[..., None]",
        quantize.INVERTED,
    ),
    ("amax / top, => amax / 127.0,", quantize.OTHER_MAX),
    (".clamp(-top, top) => ", quantize.NO_CLAMP),
    ("y = y.round() => pass", quantize.TRUNCATED),
    (
        "torch.where(amax > 0, amax / top, torch.ones_like(amax)) => amax / top",
        quantize.ZERO_DIVIDE,
    ),
    ("if scale is None: => if True:", quantize.GIVEN_IGNORED),
    (
        "x.float().abs().amax(dim=-1) => x.float().abs().amax(dim=(-2, -1)) && "
        "torch.full(x.shape[:-1], => torch.full(x.shape[:-2], && "
        "scales[..., None] => scales[..., None, None]",
        quantize.PER_TOKEN,
    ),
    (
        "x.float().abs().amax(dim=-1) => "
        "x.float().abs().amax(dim=(-2, -1))[:, None].expand(x.shape[:-1])",
        quantize.PER_TOKEN,
    ),
    (
        "x.float().abs().amax(dim=-1) => x.float().abs().amax(dim=(0, -1)) && "
        "torch.full(x.shape[:-1], => torch.full(x.shape[-2:-1],",
        quantize.PER_HEAD,
    ),
    (
        "x.float().abs().amax(dim=-1) => x.float().abs().amax(dim=(0, -1)).expand(x.shape[:-1])",
        quantize.PER_HEAD,
    ),
]


@pytest.mark.parametrize("edit, hint", QUANTIZE_SLIPS, ids=[h[:40] for _, h in QUANTIZE_SLIPS])
def test_each_quantize_slip_gets_its_hint_only(edit, hint):
    fn = learner(QUANTIZE, "quantize", *edit.split(" && "))
    assert_only_hint(run_checks("11.quantize", fn), hint)


def test_every_quantize_slip_differs_from_kvlab_somewhere():
    for slip in quantize.SLIPS:
        assert any(
            not quantize._same(
                slip.answer(quantize.make_vectors(**args), fmt, scale),
                quantize.quant.quantize(quantize.make_vectors(**args), fmt, scale),
            )
            for cases in quantize.CHECKS.values()
            for fmt, scale, args in cases
        ), slip.hint


def test_an_unknown_quantize_mistake_gets_no_hint():
    result = run_checks(
        "11.quantize", learner(QUANTIZE, "quantize", "amax / top, => amax / top * 1.3,")
    )
    assert result.status is Status.FAILED and hints_of(result) == [], result.report()


def test_kvlab_quantize_behind_a_wrapper_is_refused():
    from kvlab.ops import quant

    result = run_checks("11.quantize", lambda x, f="fp8_e4m3", s=None: quant.quantize(x, f, s))
    assert result.passed == 0 and "hands the work to kvlab" in result.report()


def test_the_graders_unslipped_answers_are_kvlabs():
    """With no decision changed, what the slips are built from answers as kvlab does."""
    from kvlab.ops import mla, quant

    for args in latent.CASES.values():
        case = tuple(t.float() for t in mla.make_mla_case(**args))
        assert latent._close(latent.absorbed(*case), mla.mla_decode_absorbed(*case))
    for cases in quantize.CHECKS.values():
        for fmt, scale, args in cases:
            x = quantize.make_vectors(**args)
            mine, kvlab = quantize.slipped(x, fmt, scale), quant.quantize(x, fmt, scale)
            assert quantize._same(mine, kvlab) and mine[0].view(-1).view(torch.uint8).equal(
                kvlab[0].view(-1).view(torch.uint8)
            )


def test_a_query_changed_in_place_fails_though_the_answer_is_right():
    """q doubled in place and the scale halved: the right output, but the caller's q (in an
    engine, the next layer's input) comes back changed."""
    doubled = learner(
        MLA_DECODE,
        "mla_decode",
        "    rank = w_uk.shape[2] => "
        + "    q_nope.mul_(2.0)\n    q_pe.mul_(2.0)\n    rank = w_uk.shape[2]",
        "scores * scale => scores * scale / 2",
    )
    result = run_checks("11.latent", doubled)
    assert result.passed == 0, result.report()
    assert "your code changed its input `q_nope` in place" in result.report()


WHOLE_CACHE = next(name for name in quantize.CHECKS if name.startswith("a whole cache"))


@pytest.mark.parametrize(
    "edit",
    [
        "amax(dim=-1) => amax(dim=2) && torch.full(x.shape[:-1], => torch.full(x.shape[:2],",
        "    return y.to(dtype), scales => " + "    return y.to(dtype), scales.squeeze()",
    ],
    ids=["amax(dim=2)", "scales.squeeze()"],
)
def test_a_scale_shape_right_only_for_three_axes_fails_on_a_whole_cache(edit):
    """amax(dim=2) is the last axis of [tokens, kv_heads, head_dim] only, and squeezing the
    scales drops the axis of a single KV head: each passes every check but the whole cache's."""
    result = run_checks("11.quantize", learner(QUANTIZE, "quantize", *edit.split(" && ")))
    assert result.passed == result.total - 1, result.report()
    assert f"✘ {WHOLE_CACHE[:40]}" in result.report(), result.report()
