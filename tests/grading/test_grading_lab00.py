"""Lab 00 checks: each usual mistake gets its own diagnosis, an unknown one the neutral line, a
knock-on failure "probably the same problem as above", and kvlab's own code is never the learner's."""

import json
import math
import pathlib

import pytest
import torch

from kvlab.grading import run_checks
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM
from kvlab.ops.attention import TinyAttention
from kvlab.perf.roofline import describe_measured_rates

ROOT = pathlib.Path(__file__).parents[2]


def failed(result) -> list[str]:
    return [o.name for o in result.outcomes if not o.passed]


def hints(result) -> list[str]:
    return [d for o in result.outcomes for d in o.details if d.startswith("hint:")]


def neutral(result) -> list[bool]:
    """Per failed check: whether it says neutrally that the mistake is not recognised."""
    return [any(NO_DIAGNOSIS in d for d in o.details) for o in result.outcomes if not o.passed]


def first_failure(result) -> str:
    return "\n".join(next(o for o in result.outcomes if not o.passed).details)


# --- KV bytes per token ----------------------------------------------------------------------


def good_kv_bytes(spec):
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes


@pytest.mark.parametrize(
    "mistake, hint",
    [
        (lambda s: good_kv_bytes(s) / 1024, "that is KiB"),
        (lambda s: good_kv_bytes(s) // 1024, "that is KiB"),
        (lambda s: good_kv_bytes(s) / 1000, "that is kB"),
        (lambda s: good_kv_bytes(s) * 8, "that is bits"),
        (lambda s: good_kv_bytes(s) // 2, "a key AND a value vector: multiply by 2"),
        (
            lambda s: 2 * s.num_layers * s.num_q_heads * s.head_dim * s.dtype_bytes,
            "query heads are not cached",
        ),
        (lambda s: good_kv_bytes(s) // s.dtype_bytes, "multiply by it"),
        (
            lambda s: 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2,
            "not always 2 (fp16's): multiply by spec.dtype_bytes instead of a fixed 2",
        ),
        (lambda s: good_kv_bytes(s) // s.num_layers, "multiply by spec.num_layers"),
        (lambda s: float(good_kv_bytes(s)), "the count is right but not an int"),
        (lambda s: str(good_kv_bytes(s)), "not its text"),
        (lambda s: None, "returned None"),
    ],
)
def test_kv_bytes_names_each_mistake(mistake, hint):
    result = run_checks("00.kv_bytes", mistake)
    first = first_failure(result)
    assert hint in first, first
    # every later failure of the same mistake is folded, never given another mistake's hint
    assert len(set(hints(result))) == 1


def test_forgetting_k_and_v_and_the_element_size_are_told_apart():
    """Both halve OPT-13B's bytes (fp16 is 2 bytes): the probe shape separates them."""
    no_kv = run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) // 2)
    no_dtype = run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) // s.dtype_bytes)
    assert "multiply by 2 (K and V)" in first_failure(no_kv)
    assert "spec.dtype_bytes" in first_failure(no_dtype)
    assert "multiply by 2" not in first_failure(no_dtype)


def test_a_fixed_two_bytes_is_told_apart_from_forgetting_k_and_v_and_the_element_size():
    """fp32 (4 bytes) halves the bytes both when the element size is a fixed 2 and when K and V
    are forgotten; the probe's 8-byte elements give the three slips three different numbers."""
    fixed_2 = run_checks(
        "00.kv_bytes", lambda s: 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2
    )
    assert fixed_2.passed == 3  # right wherever the element size is 2 bytes
    first = first_failure(fixed_2)
    assert "4 bytes/element" in first and "got:      819,200" in first
    assert "not always 2" in first and "(K and V)" not in first
    assert len(set(hints(fixed_2))) == 1  # fp8's count too: folded, no other hint
    assert "not always 2" not in first_failure(
        run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) // 2)
    )
    no_dtype = first_failure(run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) // s.dtype_bytes))
    assert "multiply by it" in no_dtype and "not always 2" not in no_dtype


def test_every_kv_slip_gives_its_own_number_on_the_probe():
    from kvlab.grading.lab00 import KV_SLIPS, PROBE

    right = PROBE.kv_bytes_per_token
    values = [slip.answer(PROBE) for slip in KV_SLIPS]
    assert right not in values and len(set(values)) == len(values), values


def test_unknown_kv_mistake_gets_the_neutral_line_and_plurals_are_right():
    result = run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) + 1)
    assert neutral(result) == [True] * result.total and not hints(result)
    tiny = next(o for o in result.outcomes if o.name.startswith("the smallest model"))
    assert "tiny: 1 layer, 1 query head, 1 KV head, head_dim 1, 2 bytes/element" in tiny.details[1]


def test_kv_bytes_knock_on_failures_are_folded():
    result = run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) // 1024)
    assert not any(o.passed for o in result.outcomes)
    assert all(o.details[0].startswith(SAME_PROBLEM) for o in result.outcomes[1:])


def test_kvlab_answer_reached_through_the_spec_is_not_the_learners():
    for handover in (lambda s: s.kv_bytes_per_token, lambda s: s.kv_bytes(1)):
        result = run_checks("00.kv_bytes", handover)
        assert result.passed == 0
        assert (
            "hands the work to kvlab's `kvlab.models.specs.ModelSpec.kv_bytes"
            in result.outcomes[0].details[0]
        )
    assert run_checks("00.kv_bytes", good_kv_bytes).ok  # the guard leaves ModelSpec as it was
    assert TinyAttention.decode_step.__module__ == "kvlab.ops.attention"


# --- one cached decode step ------------------------------------------------------------------


def make_decode(slip=None):
    """A learner's decode step, right or with one of the usual slips."""

    def decode_step(layer, x_t, k_cache, v_cache):
        q, k, v = layer.qkv(x_t.unsqueeze(0))
        if slip == "prepend":
            k_cache, v_cache = torch.cat([k, k_cache]), torch.cat([v, v_cache])
        else:
            k_cache, v_cache = torch.cat([k_cache, k]), torch.cat([v_cache, v])
        group = layer.num_heads // layer.num_kv_heads
        spread = (lambda c: c.repeat(1, group, 1)) if slip == "repeat" else None
        spread = (lambda c: c) if slip == "no gqa" else spread  # KV heads never expanded
        spread = spread or (lambda c: c.repeat_interleave(group, dim=1))
        keys, values = spread(k_cache), spread(v_cache)
        if slip == "no append":
            keys, values = spread(k_cache[:-1]), spread(v_cache[:-1])
        head_dim = layer.head_dim
        if slip in ("d_model // num_heads", "d_model // num_heads, reshaped"):
            head_dim = layer.d_model // layer.num_heads  # what the prose warns of
        scale = 1.0 if slip == "no scale" else 1 / math.sqrt(head_dim)
        scores = torch.einsum("hd,thd->ht", q[0], keys) * scale
        probs = scores.softmax(dim=0 if slip == "softmax over heads" else -1)
        mixed = torch.einsum("ht,thd->hd", probs, values)
        if slip == "dims first":
            mixed = mixed.transpose(0, 1)  # [head_dim, num_heads] flattened: heads interleaved
        if slip == "d_model // num_heads, reshaped":
            mixed = mixed.reshape(layer.num_heads * head_dim)
        mixed = mixed.reshape(-1)
        y = mixed @ layer.wo.T if slip == "nn.Linear" else mixed @ layer.wo
        if slip == "unknown":
            y = y * 1.5
        if slip == "swapped caches":
            return y, v_cache, k_cache
        return y, k_cache, v_cache

    return decode_step


def test_decode_step_passes_when_right():
    assert run_checks("00.decode_step", make_decode()).ok


@pytest.mark.parametrize(
    "slip, first_failing, hint",
    [
        ("softmax over heads", "the very first token", "softmax over the wrong axis"),
        ("nn.Linear", "the very first token", "`o @ layer.wo.T` is nn.Linear's convention"),
        ("no append", "the very first token", "append its k and v to the caches first"),
        ("no scale", "17 tokens", "scale the scores by 1/sqrt(head_dim)"),
        ("repeat", "grouped-query attention", "use repeat_interleave, not repeat"),
        ("prepend", "17 tokens", "add the new token's row at the end, not in front"),
        ("swapped caches", "the very first token", "k_cache and v_cache are swapped"),
        ("dims first", "the very first token", "a transpose before the reshape interleaves"),
        (
            "d_model // num_heads",
            "heads that do not tile d_model",
            "one head is layer.head_dim = 8 wide, not d_model // num_heads = 6",
        ),
    ],
)
def test_decode_step_names_each_mistake(slip, first_failing, hint):
    result = run_checks("00.decode_step", make_decode(slip))
    names = failed(result)
    assert names and names[0].startswith(first_failing), names
    first = first_failure(result)
    assert hint in first, first
    others = [h for h in hints(result) if hint not in h]
    assert not others, others  # no other mistake's hint,
    assert not any(neutral(result)), first  # and no neutral line: it was diagnosed


def test_a_prepending_cache_is_caught_although_every_output_is_right():
    result = run_checks("00.decode_step", make_decode("prepend"))
    first = first_failure(result)
    assert (
        "expected: rows hold tokens [0, 1]" in first
        and "got:      rows hold tokens [1, 0]" in first
    )
    later = [o for o in result.outcomes[2:] if not o.passed]
    assert later and all(o.details[0].startswith(SAME_PROBLEM) for o in later)
    assert all(any(d.startswith("replay:") for d in o.details) for o in later)


def test_nn_linear_convention_on_the_non_square_layer_folds_into_the_first_failure():
    """`o @ wo.T` cannot even run when wo is not square: the shape error there is the same
    mistake the first check named, so it says so instead of showing a new RuntimeError."""
    result = run_checks("00.decode_step", make_decode("nn.Linear"))
    first, wide = result.outcomes[0], result.outcomes[-1]
    assert wide.name.startswith("heads that do not tile d_model") and not wide.passed
    assert wide.details[0] == f"{SAME_PROBLEM} (“{first.name}”)"
    assert any(d.startswith("input:    step 0 of 5") for d in wide.details)
    assert len(hints(result)) == 1 and "nn.Linear's convention" in hints(result)[0]


def test_kv_heads_not_expanded_for_the_query_heads_is_named_and_folds():
    """Without repeat_interleave the scores of a grouped-query layer fail to compute (einsum
    sees 4 query heads and 2 KV heads): a shape error that names the mistake."""
    result = run_checks("00.decode_step", make_decode("no gqa"))
    first, *later = [o for o in result.outcomes if not o.passed]
    assert first.name.startswith("grouped-query attention") and result.passed == 4
    assert first.details[0].startswith("RuntimeError: einsum()")
    assert "\n   this layer has 4 query heads and 2 KV heads" in first.details[0]
    assert "input:    step 0 of 6: 0 tokens cached, token 0 comes in" in first.details
    assert "repeat each KV head for its group" in hints(result)[0] and len(hints(result)) == 1
    assert [o.name for o in later] == [result.outcomes[-1].name]  # the wide layer has GQA too
    assert later[0].details[0] == f"{SAME_PROBLEM} (“{first.name}”)"


def test_heads_joined_from_head_dim_by_num_heads_fail_from_the_first_token_and_fold():
    result = run_checks("00.decode_step", make_decode("dims first"))
    assert failed(result) == [o.name for o in result.outcomes if not o.name.startswith("a single")]
    assert folded_after_first(result) and len(hints(result)) == 1


def test_head_dim_taken_for_d_model_over_num_heads_is_named_where_the_heads_do_not_tile():
    """As the scale, it changes nothing until a second token is attended (a softmax of one score
    is 1): step 1 of the wide layer. As the size of a reshape, the step cannot run there: the
    shape error names it, because the same step runs right on a layer whose heads tile d_model."""
    scaled = run_checks("00.decode_step", make_decode("d_model // num_heads"))
    assert result_failed_only_on_the_wide_layer(scaled)
    assert "input:    step 1 of 5" in first_failure(scaled)
    shaped = run_checks("00.decode_step", make_decode("d_model // num_heads, reshaped"))
    assert result_failed_only_on_the_wide_layer(shaped)
    first = first_failure(shaped)
    assert first.startswith("RuntimeError: shape '[24]' is invalid for input of size 32")
    assert "\n   4 heads of 8 make 32 here, not d_model = 24" in first
    assert "hint:     one head is layer.head_dim = 8 wide, not d_model // num_heads = 6" in first
    assert hints(scaled) == hints(shaped) and not any(neutral(shaped))


def result_failed_only_on_the_wide_layer(result) -> bool:
    return failed(result) == [result.outcomes[-1].name] and result.outcomes[-1].name.startswith(
        "heads that do not tile d_model"
    )


def folded_after_first(result) -> bool:
    later = [o for o in result.outcomes if not o.passed][1:]
    return bool(later) and all(o.details[0].startswith(SAME_PROBLEM) for o in later)


def test_an_unknown_error_on_a_gqa_layer_is_still_shown_as_it_is():
    def breaks_on_groups(layer, x_t, k_cache, v_cache):
        if layer.num_kv_heads < layer.num_heads:
            raise ZeroDivisionError("a bug of its own")
        return make_decode()(layer, x_t, k_cache, v_cache)

    result = run_checks("00.decode_step", breaks_on_groups)
    first = next(o for o in result.outcomes if not o.passed)
    assert first.details[0] == "ZeroDivisionError: a bug of its own" and not hints(result)
    assert first.details[1].startswith("at line")


def test_byte_counts_are_written_with_thousands_separators():
    result = run_checks("00.kv_bytes", lambda s: 3 * good_kv_bytes(s) // 2)
    first = first_failure(result)
    assert "expected: 819,200" in first and "got:      1,228,800" in first
    kib = first_failure(run_checks("00.kv_bytes", lambda s: good_kv_bytes(s) / 1024))
    assert "expected: 819,200" in kib and "got:      800.0" in kib


# --- the measured roofline's sentences (Lab 00, cell lab00-24b) --------------------------------


def rates(*gflops):
    """Rows as measure_matmul_rate returns them, for batches 1, 4, 16, 64, 256."""
    batches = (1, 4, 16, 64, 256)
    return [(b, r * 1e9, 2 * b / (4 + 8 * b / 4096)) for b, r in zip(batches, gflops, strict=True)]


def test_a_small_dip_on_the_plateau_is_noise_and_not_reported():
    lines = describe_measured_rates(rates(10.7, 20.0, 30.0, 36.8, 36.2))  # 1.6% below
    assert not any(line.startswith("Batch") for line in lines)
    assert "ceiling, not a promise" not in " ".join(lines)
    assert "A batch of 256 did 3x more arithmetic per second" in lines[1]


def test_a_large_dip_is_reported_and_only_batch_1_gets_the_matrix_vector_reason():
    lines = describe_measured_rates(rates(10.7, 20.0, 30.0, 36.8, 30.2))  # 18% below
    (dip,) = [line for line in lines if line.startswith("Batch")]
    assert dip.startswith("Batch 256 (30.2 GFLOP/s) ran 18% below batch 64 (36.8 GFLOP/s)")
    assert "batch 1" not in dip and "not every shape gets a fast one" in dip
    assert lines[-1] == "The roofline is a ceiling, not a promise."

    lines = describe_measured_rates(rates(10.7, 1.6, 20.0, 36.8, 36.2))  # the batch 4
    (dip,) = [line for line in lines if line.startswith("Batch")]
    assert dip.startswith("Batch 4 (1.6 GFLOP/s) ran 85% below batch 1 (10.7 GFLOP/s)")
    assert "the matrix-vector product of batch 1 has its own tuned one" in dip


def test_lab00_prints_the_measured_sentences_from_the_tested_function():
    cells = json.loads((ROOT / "solutions" / "00_why_kv_cache.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if c["id"] == "lab00-24b")
    assert "describe_measured_rates(rows, noise=0.10)" in source and "zip(rows" not in source


def test_unknown_decode_mistake_gets_the_neutral_line_and_a_replay():
    result = run_checks("00.decode_step", make_decode("unknown"))
    assert result.passed == 0
    assert neutral(result) == [True] * result.total and not hints(result)
    first = first_failure(result)
    assert "replay:   layer = TinyAttention(16, 2, seed=1); x = torch.randn(1, 16" in first
    assert "input:    step 0 of 1: 0 tokens cached, token 0 comes in" in first


def test_kvlab_decode_step_reached_through_the_layer_is_not_the_learners():
    for handover in (
        lambda layer, x, k, v: layer.decode_step(x, k, v),
        lambda layer, x, k, v: TinyAttention.decode_step(layer, x, k, v),
    ):
        result = run_checks("00.decode_step", handover)
        assert result.passed == 0
        assert (
            "hands the work to kvlab's `kvlab.ops.attention.TinyAttention.decode_step`"
            in first_failure(result)
        )
        assert all(o.details[0].startswith(SAME_PROBLEM) for o in result.outcomes[1:])
    layer = TinyAttention(16, 2, seed=1)  # the guard is gone again: kvlab's own method works
    y, k, _ = layer.decode_step(torch.ones(16), *layer.empty_cache())
    assert y.shape == (16,) and k.shape == (1, 2, 8)


def test_tiny_attention_head_dim_option_keeps_the_default_layer():
    default, explicit = TinyAttention(32, 4, seed=3), TinyAttention(32, 4, seed=3, head_dim=8)
    assert torch.equal(default.wo, explicit.wo) and torch.equal(default.wq, explicit.wq)
    wide = TinyAttention(24, 4, num_kv_heads=2, seed=6, head_dim=8)
    assert tuple(wide.wq.shape) == (24, 32) and tuple(wide.wo.shape) == (32, 24)
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0))
    k_cache, v_cache = wide.empty_cache()
    for t in range(5):
        y, k_cache, v_cache = wide.decode_step(x[t], k_cache, v_cache)
        assert torch.allclose(y, wide.forward(x[: t + 1])[t], atol=1e-5)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        TinyAttention(24, 5)


# --- the roofline picture (Lab 00, cell lab00-22) ------------------------------------------------


def test_the_roofline_gpus_differ_in_colour_and_line_style_and_are_named_on_their_lines():
    """The A100's and H200's lines were blue and teal, both solid: now each GPU has its own colour
    (far apart), its own dashes (H100 and H200 share the flat roof) and its name on its slope."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    from kvlab.models import LLAMA_3_8B
    from kvlab.perf.roofline import A100_80GB, H100_SXM, H200, step_cost
    from kvlab.ui import viz

    gpus = [H100_SXM, A100_80GB, H200]  # as lab00-22 draws them
    ax = viz.plot_roofline(gpus, {"decode": step_cost(LLAMA_3_8B, new_tokens=1, context=1024)})
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label().split(":")[0] for line in lines] == [g.name for g in gpus]
    assert len({line.get_linestyle() for line in lines}) == len(gpus)
    rgb = [to_rgb(line.get_color()) for line in lines]
    for i, a in enumerate(rgb):
        for b in rgb[i + 1 :]:
            assert sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5 > 0.3, (a, b)
    texts = {t.get_text(): t.get_color() for t in ax.texts}
    for line in lines:
        name = line.get_label().split(":")[0]
        assert texts[name] == line.get_color()  # the direct label, in the line's colour
    assert "4.8 TB/s" in ax.get_legend().get_texts()[2].get_text()
    plt.close("all")
