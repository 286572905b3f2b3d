"""11.hybrid: ``hybrid_layout(layer_groups, max_model_len, max_num_batched_tokens,
block_size=16) -> dict``, a model's layers grouped and paged as vLLM v1 does for one pool
(groups of equal layer slots, padding counted, one page size, a state's block grown), and what
one request reserves there at full length (:func:`kvlab.perf.kv_groups.kv_cache_layout`).

The checks ask on the real configs kvlab vendors (Llama-3.1-8B, Mistral-7B-v0.1, gpt-oss,
Gemma-3-27B, Nemotron-H-8B, Qwen3.5-9B) and on two made-up models where a rule of its own
decides (the 1.5 rule; a window with half the heads). A wrong answer is named when one usual
slip (:data:`SLIPS`: kvlab's layout with one rule changed) gives it there and on every other
input of the checks.
"""

from __future__ import annotations

import functools
import numbers

from kvlab.core.kv_spec import (
    FullAttentionSpec,
    KVCacheSpec,
    LayerGroup,
    SlidingWindowSpec,
    StateSpec,
)
from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.lab11 import hints
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise, own_answers
from kvlab.models.hf_config import vendored_spec
from kvlab.perf import kv_groups
from kvlab.perf.kv_groups import KVCacheLayout, KVGroup, kv_cache_layout

hybrid_ex = exercise("11.hybrid", "a hybrid allocator: groups, pages, a request's reservation")
own_answers("11.hybrid", "kvlab.perf.kv_groups:kv_cache_layout")
REFERENCES = (
    kv_cache_layout,
    KVCacheLayout.blocks_reserved,
    KVCacheLayout.max_concurrency,
    KVGroup.blocks_reserved,
)
TASK = "grouping the layers and sizing the pages"
WORDS = {  # the answer's keys, and what each is
    "group_size": "layer slots per group",
    "num_groups": "groups (block tables)",
    "block_size": "tokens per block of the attention groups",
    "page_bytes": "bytes of one layer's page",
    "blocks_reserved": "blocks one request reserves at full length",
    "bytes_reserved": "bytes one request reserves at full length",
}
FIELDS = tuple(WORDS)


# --- kvlab's answer and its slips --------------------------------------------------------------


def reference(layer_groups, max_model_len, max_num_batched_tokens, block_size=16, *,
              counted=tuple, blocks=KVGroup.blocks_reserved, weigh=None, **rules):  # fmt: skip
    """kvlab's answer, or with one decision changed: ``rules`` (one of vLLM's rules, as
    kv_cache_layout's keywords), the groups ``counted(groups)``, what a group reserves,
    ``blocks(group, max_model_len, max_num_batched_tokens)``, or what its blocks weigh,
    ``weigh(layout, group, blocks)``."""
    layout = kv_cache_layout(layer_groups, block_size=block_size, **rules)
    per = [(g, blocks(g, max_model_len, max_num_batched_tokens)) for g in counted(layout.groups)]
    weigh = weigh or (lambda layout, group, n: n * layout.block_bytes)
    return {
        "group_size": layout.group_size,
        "num_groups": len(layout.groups),
        "block_size": layout.block_size,
        "page_bytes": layout.page_bytes,
        "blocks_reserved": sum(n for _, n in per),
        "bytes_reserved": sum(weigh(layout, g, n) for g, n in per),
    }


def _window(group) -> bool:
    return isinstance(group.spec, SlidingWindowSpec)


def _as_full(g, length, batched):  # a window reserving as full attention does
    spec = KVCacheSpec if _window(g) else type(g.spec)
    return spec.blocks_reserved(g.spec, length, g.block_size, batched)


_slip = functools.partial(slips.changed, reference)  # kvlab's layout with one rule changed


def _last_entry(groups, *args, **rules):
    """kvlab's layout with each kind's layers read from its last entry only (a count overwritten,
    not added to, where a model lists its kinds in turns)."""
    return reference(tuple({g.spec: g for g in groups}.values()), *args, **rules)


SLIPS = (
    _slip(hints.RATIO_MIN, group_size_ratio=1),
    _slip(hints.RATIO_EDGE, group_size_ratio=1.5 + 1e-9),  # 12 < 8 x 1.5: "<=" for "<"
    _slip(hints.ONE_GROUP_PER_KIND, group_size_ratio=float("inf")),
    _slip(hints.WINDOW_AS_FULL, blocks=_as_full),
    _slip(hints.WINDOW_ONE_TOKEN, blocks=lambda g, length, batched: g.blocks_reserved(length, 1)),
    _slip(hints.NO_EXTRA_BLOCK, blocks=lambda g, *a: g.blocks_reserved(*a) - _window(g)),
    _slip(hints.NO_PADDING, weigh=lambda layout, g, n: n * layout.page_bytes * g.num_layers),
    _slip(hints.ONE_PAGE_A_BLOCK, weigh=lambda layout, g, n: n * layout.page_bytes),
    _slip(hints.ONCE_PER_KIND, counted=lambda groups: {g.spec: g for g in groups}.values()),
    _slip(hints.NOT_ALIGNED, block_alignment=1),
    slips.Slip(hints.LAST_ENTRY, _last_entry),
)


# --- the inputs ---------------------------------------------------------------------------------

NEAR_EQUAL = (LayerGroup(FullAttentionSpec(8, 128), 13), LayerGroup(
    SlidingWindowSpec(8, 128, window=2048), 12))  # fmt: skip
AT_RATIO = (LayerGroup(FullAttentionSpec(8, 128), 8), LayerGroup(
    SlidingWindowSpec(8, 128, window=1024), 12))  # fmt: skip
HALF_HEADS = (LayerGroup(FullAttentionSpec(8, 128), 4), LayerGroup(
    SlidingWindowSpec(4, 128, window=512), 20))  # fmt: skip
WINDOW = SlidingWindowSpec(8, 128, window=1024)
# made-up models that tell the rules apart where the real configs agree (a red team's wrong
# answers passed on those): each kind's layers counted whole, the largest state and attention
# token sizing the block, rounded up and never below block_size, a state kind the fewest
MADE_UP = {"13 full + 12 window layers": NEAR_EQUAL, "8 full + 12 window layers": AT_RATIO,
           "4 full layers of 8 KV heads + 20 window layers of 4": HALF_HEADS,
           "7 full + 10 window layers": (LayerGroup(FullAttentionSpec(8, 128), 7),
                                         LayerGroup(WINDOW, 10)),
           "5 window + 1 full layers, three times over, listed in turns":
               (LayerGroup(WINDOW, 5), LayerGroup(FullAttentionSpec(8, 128), 1)) * 3,
           "12 full layers of 2 KV heads + 3 Mamba layers":
               (LayerGroup(FullAttentionSpec(2, 64), 12), LayerGroup(StateSpec(300_000), 3)),
           "8 full layers of 2 KV heads + 8 Mamba layers of 57,344 bytes (112 tokens)":
               (LayerGroup(FullAttentionSpec(2, 64), 8), LayerGroup(StateSpec(16 * 512 * 7), 8)),
           "6 full + 6 Mamba layers": (LayerGroup(FullAttentionSpec(8, 128), 6),
                                       LayerGroup(StateSpec(100_000), 6)),
           "8 full layers of 2 KV heads + 8 Mamba + 8 linear-attention layers":
               (LayerGroup(FullAttentionSpec(2, 64), 8), LayerGroup(StateSpec(200_000), 8),
                LayerGroup(StateSpec(120_000, "linear_attention"), 8)),
           "10 window layers of 4 KV heads + 10 full of 8 + 10 Mamba layers":
               (LayerGroup(SlidingWindowSpec(4, 128, window=512), 10),
                LayerGroup(FullAttentionSpec(8, 128), 10), LayerGroup(StateSpec(400_000), 10))}  # fmt: skip


@functools.cache
def groups_of(name: str) -> tuple[LayerGroup, ...]:
    return MADE_UP[name] if name in MADE_UP else vendored_spec(name).layer_groups


# (what the learner reads, [(model, max_model_len, max_num_batched_tokens, block_size)]), in
# the checks' order
CHECKS = {
    "a dense model: one group of all its layers (Llama-3.1-8B)":
        [("Llama-3.1-8B", 131_072, 8_192, 16), ("Llama-3.1-8B", 2_049, 2_048, 16)],
    "every layer a window of 4,096 (Mistral-7B-v0.1): one group":
        [("Mistral-7B-v0.1", 32_768, 8_192, 16), ("Mistral-7B-v0.1", 32_768, 2_048, 32)],
    "gpt-oss: window and full layers 1 : 1, groups of 12 (20b) and 18 (120b)":
        [("gpt-oss-20b", 131_072, 8_192, 16), ("gpt-oss-120b", 131_072, 2_048, 16)],
    "Gemma-3-27B: 10 full and 52 window layers, groups of 10 with padding":
        [("Gemma-3-27B", 131_072, 8_192, 16), ("Gemma-3-27B", 32_768, 512, 16),
         ("Gemma-3-27B", 800, 2_048, 16)],
    "the 1.5 rule: 13 full and 12 window layers make groups of 13, 8 and 12 of 8":
        [("13 full + 12 window layers", 65_536, 4_096, 16),
         ("8 full + 12 window layers", 32_768, 2_048, 16)],
    "Nemotron-H-8B: Mamba2 states grow the attention block":
        [("Nemotron-H-8B", 8_192, 8_192, 16), ("Nemotron-H-8B", 131_072, 2_048, 16)],
    "Qwen3.5-9B: Gated-DeltaNet states beside full attention":
        [("Qwen3.5-9B", 262_144, 8_192, 16), ("Qwen3.5-9B", 4_096, 2_048, 64)],
    "a window with half the KV heads: its block holds twice the tokens":
        [("4 full layers of 8 KV heads + 20 window layers of 4", 16_384, 1_024, 16)],
    "layers listed in turns are counted by kind; 10 window layers < 1.5 x 7 full: groups of 10":
        [("5 window + 1 full layers, three times over, listed in turns", 32_768, 2_048, 16),
         ("7 full + 10 window layers", 32_768, 2_048, 16)],
    "made-up states: the largest sizes the block, 16 x cdiv tokens, at least block_size; a "
    "state kind with the fewest layers sets the group":
        [("12 full layers of 2 KV heads + 3 Mamba layers", 8_192, 2_048, 16),
         ("8 full layers of 2 KV heads + 8 Mamba layers of 57,344 bytes (112 tokens)",
          8_192, 2_048, 16),
         ("6 full + 6 Mamba layers", 8_192, 2_048, 128),
         ("8 full layers of 2 KV heads + 8 Mamba + 8 linear-attention layers", 8_192, 2_048, 16)],
    "a state beside two kinds of attention: the most bytes per token grow the block, the "
    "largest page is every page, the smallest block is reported":
        [("10 window layers of 4 KV heads + 10 full of 8 + 10 Mamba layers", 8_192, 2_048, 16)],
}  # fmt: skip
INPUTS = tuple(case for cases in CHECKS.values() for case in cases)


def _args(case) -> tuple:
    return groups_of(case[0]), *case[1:]  # the model's layer groups for its name


def _where(case) -> str:
    name, length, batched, block = case
    kinds = ", ".join(
        f"{g.num_layers} x {kv_groups.describe_group(g.spec)}" for g in groups_of(name)
    )
    return (
        f"hybrid_layout({name}: {kinds}; max_model_len={length:,}, "
        f"max_num_batched_tokens={batched:,}, block_size={block})"
    )


def _readable(got) -> bool:
    return isinstance(got, dict) and all(
        isinstance(got.get(f), numbers.Integral) and not isinstance(got.get(f), bool)
        for f in FIELDS
    )


def _plain(got):
    return {f: int(got[f]) for f in FIELDS} if _readable(got) else got


def diagnose(fn, case, got) -> str | None:
    """The hint of the one slip that answers ``case`` and every other input as ``fn`` does."""
    args = _args(case)
    found = slips.matching(SLIPS, got, args, reference(*args))
    probes = [_args(c) for c in INPUTS if c != case]
    found = slips.told_apart(
        found, lambda *a: _plain(fn(*a)), probes, reference, always=True, readable=_readable
    )
    return slips.hint(slips.only(found))


def expect_layout(fn, cases) -> None:
    """hybrid_layout on each of a check's cases (see :data:`CHECKS`)."""
    for case in cases:
        args = _args(case)
        want = reference(*args)
        with refuse_reference(*REFERENCES, learner=fn, task=TASK):
            got = fn(*args)
        fail = functools.partial(CheckFailed, input=_where(case))
        if not _readable(got):
            message = f"hybrid_layout returns a dict of ints with the keys {', '.join(FIELDS)}"
            raise fail(message, expected=short(want), got=short(got, typed=True))
        got = _plain(got)
        for field in FIELDS:
            if got[field] != want[field]:
                raise fail(
                    f"wrong {field} ({WORDS[field]})",
                    expected=f"{want[field]:,}",
                    got=f"{got[field]:,}",
                    hint=diagnose(fn, case, got),
                )


for _title, _cases in CHECKS.items():
    hybrid_ex.check(_title)(functools.partial(expect_layout, cases=_cases))
