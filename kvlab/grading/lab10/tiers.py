"""10.fetch_or_recompute: ``fetch_beats_recompute(spec, gpu, num_tokens, pcie_bytes_per_s)``,
the rule behind a CPU tier: whether copying ``num_tokens`` tokens of K/V up over PCIe is faster
than computing them again at the GPU's peak (:func:`kvlab.perf.tiers.fetch_beats_recompute`
with its defaults: blocks of 16, no per-copy overhead, an empty context).

The checks ask on cards of kvlab's own (:mod:`kvlab.models`, :mod:`kvlab.perf.roofline`): a
model with grouped-query attention and one without, on an H100 and an A100, over PCIe 4.0 and
5.0, one with an fp8 KV cache, and a small model on a slow link, at token counts on both sides
of each break-even. A wrong answer is named when exactly one usual slip (:data:`SLIPS`) answers
as the learner's rule does on every input of the checks, the failing one and all the others.
"""

from __future__ import annotations

import functools

from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.lab10 import hints
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip
from kvlab.models import ModelSpec
from kvlab.models.specs import LLAMA_3_8B, OPT_13B
from kvlab.perf.roofline import A100_80GB, GPU, H100_SXM
from kvlab.perf.tiers import PCIE_GEN4_X16, PCIE_GEN5_X16, TierRule, break_even_tokens

fetch_ex = exercise("10.fetch_or_recompute", "fetch or recompute: the rule")
# the tiers' rule and its parts (break_even_tokens answers it too: the lab asks for no overhead)
own_answers(
    "10.fetch_or_recompute",
    *(f"kvlab.perf.tiers:{name}" for name in ("fetch_beats_recompute", "break_even_tokens")),
    *(
        f"kvlab.perf.tiers:{name}"
        for name in ("fetch_seconds", "recompute_flops", "recompute_seconds", "TierRule")
    ),
)

GIB_PER_GB = 1e9 / 2**30
SLOW_LINK = 5e9  # a narrow or shared link
X8_LINK = 12.5e9  # PCIe 4.0 with 8 lanes, not 16
CRAWL_LINK = 0.5e9  # a busy network hop
# its KV cache in fp8 (1 byte per element, the weights still 16-bit): half the bytes over half a
# link breaks even where the 16-bit cache does over PCIe 4.0 x16 (16,131 tokens); counted in the
# model's dtype_bytes its break-even is 95,251, so 16,131 to 65,536 tokens say recompute
OPT_13B_FP8 = OPT_13B.with_kv_dtype("fp8")
# a small GQA model (Llama-3.2-1B's shape): little compute per token, yet K/V to move
SMALL = ModelSpec("small-1B", 16, 32, 8, 64, num_params=1.24e9)
# a tie, exact in floating point whatever the order of the sums: the small model's shape with
# 2**30 - 2**15 x 1025 parameters on a GPU of 2**50 FLOP/s over a link of 2**34 B/s; 1,024 tokens
# take 2**-9 s both ways (2**41 FLOPs, 2**25 bytes: every term a power of two or exact)
TIE = ModelSpec("tie-1B", 16, 32, 8, 64, num_params=2**30 - 2**15 * 1025)
TIE_GPU = GPU("H100 at 2**50 FLOP/s", H100_SXM.hbm_bytes_per_s, 2.0**50, H100_SXM.memory_bytes)
TIE_LINK = 2.0**34


# --- the rule and its slips: kvlab's rule with one decision changed ---------------------------


class NoAttention(TierRule):
    def attended(self, num_tokens, context):  # the weights' FLOPs only
        return 0


class AttentionSquared(TierRule):
    def attended(self, num_tokens, context):  # n x n, not n (n + 1) / 2
        return num_tokens**2


class KOnly(TierRule):
    def kv_bytes(self, spec):
        return spec.kv_bytes_per_token / 2


class ModelDtype(TierRule):
    def kv_bytes(self, spec):  # the model's dtype, not the KV cache's
        return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes


class PerLayer(TierRule):
    def kv_bytes(self, spec):
        return spec.kv_bytes_per_token / spec.num_layers


class Scaled(TierRule):
    """The link in other units: its bytes per second times ``scale``."""

    def __init__(self, scale: float):
        self.scale = scale

    def link(self, gpu, pcie_bytes_per_s):
        return pcie_bytes_per_s * self.scale


class OverHBM(TierRule):
    def link(self, gpu, pcie_bytes_per_s):  # the roofline's memory time
        return gpu.hbm_bytes_per_s


class TieFetches(TierRule):
    def fetch_wins(self, fetch_s, recompute_s):
        return fetch_s <= recompute_s


def asked(rule: TierRule | None = None):
    """``rule`` as the lab asks for it: ``(spec, gpu, num_tokens, pcie_bytes_per_s)``."""
    rule = TierRule() if rule is None else rule
    return lambda spec, gpu, n, link: rule.fetch_beats_recompute(spec, gpu, n, link)


reference_rule = asked()
SLIPS = (
    Slip(hints.NO_ATTENTION, asked(NoAttention())),
    Slip(hints.K_ONLY, asked(KOnly())),
    Slip(hints.GB_GIB, asked(Scaled(1 / GIB_PER_GB))),  # the copy timed in GiB/s
    Slip(hints.GB_GIB, asked(Scaled(GIB_PER_GB))),
    Slip(hints.PER_LAYER, asked(PerLayer())),
    Slip(hints.HBM_NOT_PCIE, asked(OverHBM())),
    Slip(hints.ATTN_SQUARE, asked(AttentionSquared())),
    Slip(hints.TIE_FETCHES, asked(TieFetches())),
    Slip(hints.MODEL_DTYPE, asked(ModelDtype())),
)


def _around(n: int) -> tuple[int, ...]:
    """Token counts on both sides of a break-even ``n`` (and short ones)."""
    return (1, 16, 2_048) if n == 1 else tuple(sorted({16, n // 2, n - 1, n, n + 1, 2 * n}))


def _card(story, spec, gpu, link, extra=(), *, around=True):
    n = break_even_tokens(spec, gpu, pcie_bytes_per_s=link) if around else None
    return story, spec, gpu, link, tuple(sorted(set(_around(n) if around else ()) | set(extra)))


# (story, spec, gpu, link, token counts); the extra counts tell the slips apart (9,000 and
# 25,000: a GB/GiB mix-up from attention counted n^2 times, not n (n + 1) / 2)
CARDS = (
    _card("Llama-3-8B on an H100 over PCIe 4.0 (25 GB/s)", LLAMA_3_8B, H100_SXM, PCIE_GEN4_X16),
    _card("Llama-3-8B on an A100-80GB over PCIe 4.0", LLAMA_3_8B, A100_80GB, PCIE_GEN4_X16),
    _card(
        "Llama-3-8B on an H100 over a slow link (5 GB/s)",
        LLAMA_3_8B,
        H100_SXM,
        SLOW_LINK,
        (100, 1_000, 4_096, 25_000, 34_000, 41_000),
    ),
    _card(
        "OPT-13B on an H100 over PCIe 4.0", OPT_13B, H100_SXM, PCIE_GEN4_X16, (2_048, 9_000, 12_000)
    ),
    _card("OPT-13B on an H100 over PCIe 5.0 (50 GB/s)", OPT_13B, H100_SXM, PCIE_GEN5_X16),
    _card("OPT-13B on an A100-80GB over PCIe 4.0", OPT_13B, A100_80GB, PCIE_GEN4_X16),
    _card(
        "OPT-13B with an fp8 KV cache (1 byte per element, 400 KiB per token) on an H100 over "
        "PCIe 4.0 x8 (12.5 GB/s)",
        OPT_13B_FP8,
        H100_SXM,
        X8_LINK,
        (65_536,),
    ),
    _card(
        "a small model (1.24B, 16 layers) on an H100 over a slow link (5 GB/s)",
        SMALL,
        H100_SXM,
        SLOW_LINK,
        (64, 128, 4_096, 8_192, 65_536),
    ),
    _card(
        "the small model over a crawling link (0.5 GB/s; its break-even near a million tokens)",
        SMALL,
        H100_SXM,
        CRAWL_LINK,
        (16, 4_096, 32_768),
        around=False,
    ),
    _card(
        "a tie: 1,024 tokens of a 1.04B model take 2**-9 s to fetch (2**34 B/s) and to recompute "
        "(2**50 FLOP/s)",
        TIE,
        TIE_GPU,
        TIE_LINK,
    ),
)

INPUTS = tuple((spec, gpu, n, link) for _, spec, gpu, link, counts in CARDS for n in counts)


def _where(spec, gpu, n, link) -> str:
    return (
        f"fetch_beats_recompute({spec.name}, {gpu.name}, num_tokens={n:,}, "
        f"pcie_bytes_per_s={link:.3g}): {spec.kv_bytes_per_token:,} bytes of K/V per token, "
        f"{spec.num_params:.3g} parameters, {gpu.peak_flops:.3g} FLOP/s peak"
    )


def _answer(fn, spec, gpu, n, link):
    got = fn(spec, gpu, n, link)
    return bool(got) if type(got).__name__ in ("bool", "bool_") else got  # numpy's too


def _slip(fn, inp, got):
    """The hint of the one slip that answers as ``fn`` does on every input of the checks, the
    failing one and all the others (none where ``fn`` raises on one)."""
    mine = functools.partial(_answer, fn)
    if any(slips.answer_of(mine, *other) is slips.RAISED for other in INPUTS):
        return None
    found = slips.matching(SLIPS, got, inp, reference_rule(*inp))
    found = slips.told_apart(found, mine, INPUTS, reference_rule, always=True)
    return slips.hint(slips.only(found))


def expect_rule(fn, spec, gpu, n, link) -> None:
    where = _where(spec, gpu, n, link)
    want = reference_rule(spec, gpu, n, link)
    got = _answer(fn, spec, gpu, n, link)
    if not isinstance(got, bool):
        raise CheckFailed(
            "the rule returns True (fetch) or False (recompute)",
            input=where,
            expected=str(want),
            got=short(got, typed=True),
        )
    if got != want:
        raise CheckFailed(
            "fetching is faster here" if want else "recomputing is faster here",
            input=where,
            expected=f"{want} ({'fetch' if want else 'recompute'})",
            got=f"{got} ({'fetch' if got else 'recompute'})",
            hint=_slip(fn, (spec, gpu, n, link), got),
        )


for _story, _spec, _gpu, _link, _counts in CARDS:

    def _check(fn, spec=_spec, gpu=_gpu, link=_link, counts=_counts):
        for n in counts:
            expect_rule(fn, spec, gpu, n, link)

    fetch_ex.check(f"{_story}: {', '.join(f'{n:,}' for n in _counts)} tokens")(_check)
