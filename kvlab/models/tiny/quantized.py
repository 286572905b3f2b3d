"""Greedy words of the tiny model with its K/V cache stored in another format: what a quantised
cache costs in words, beside the bytes it saves.

Each layer's K and V go into the cache as the format stores them (``"bfloat16"``: rounded;
``"fp8_e4m3"`` / ``"int8"``: 8 bits with a scale per token and KV head, :mod:`kvlab.ops.quant`)
and every attention reads them back from there, the prompt's own included, as vLLM v1 reads a
quantised cache (it writes a step's K/V first, then attends over the cache). ``None`` keeps the
model's fp32, and gives the tokens :func:`kvlab.models.tiny.generate` gives.
"""

from __future__ import annotations

import torch

from kvlab.core.validate import positive_int
from kvlab.models.tiny import tokenizer
from kvlab.models.tiny.generation import tiny_model
from kvlab.ops.attention import causal_attention, chunk_attention_reference
from kvlab.ops.quant import FORMATS, dequantize, quantize

KV_FORMATS = (None, "bfloat16", *FORMATS)


def stored(x: torch.Tensor, kv_format: str | None) -> torch.Tensor:
    """``x`` as the cache gives it back (fp32) when it stores it in ``kv_format``."""
    if kv_format is None:
        return x
    if kv_format == "bfloat16":
        return x.to(torch.bfloat16).float()
    if kv_format not in FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")
    return dequantize(*quantize(x, kv_format)).to(x.dtype)


@torch.no_grad()
def greedy_ids(
    prompt: str, max_new_tokens: int, kv_format: str | None = None, model=None
) -> list[int]:
    """The tiny model's greedy continuation of ``prompt`` (token ids), its cache in
    ``kv_format``; one sequence, the prompt in one forward, then a token at a time."""
    positive_int("max_new_tokens", max_new_tokens)
    stored(torch.zeros(1, 1), kv_format)  # the format, checked before any work
    model = tiny_model("cpu") if model is None else model
    ids = tokenizer.encode(prompt)
    if not ids or len(ids) + max_new_tokens > model.config.max_context:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) must be 1.."
            f"{model.config.max_context} tokens (the model's context)"
        )
    device = model.embed.weight.device
    caches: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * model.config.num_layers
    one_room = torch.zeros(1, dtype=torch.int64, device=device)

    def attend(layer, q, k, v):
        k, v = stored(k, kv_format), stored(v, kv_format)
        if caches[layer] is not None:
            k, v = torch.cat([caches[layer][0], k]), torch.cat([caches[layer][1], v])
        caches[layer] = (k, v)
        # the new queries are the cache's last positions: a chunk over one room of every bed
        return chunk_attention_reference(q, k[None], v[None], one_room, k.shape[0] - q.shape[0])

    out, new = [], ids
    first = 0
    for _ in range(max_new_tokens):
        positions = torch.arange(first, first + len(new), device=device)
        hidden = model.forward_tokens(torch.tensor(new, device=device), positions, attend)
        token = int(model.logits(hidden[-1:]).argmax(-1))
        out.append(token)
        first += len(new)
        new = [token]
    return out


def _attend_stored(kv_format):
    """An ``attend`` for one forward over a whole text: its K/V stored, then read causally."""

    def attend(layer, q, k, v):
        return causal_attention(q, stored(k, kv_format), stored(v, kv_format))

    return attend


@torch.no_grad()
def next_token_flips(text: str, kv_format: str | None, model=None) -> tuple[int, int]:
    """(positions of ``text`` where the greedy next token changes with the cache in
    ``kv_format``, positions): every position reads the same text (teacher forcing), so one
    flip does not carry into the next, as it does in a free run."""
    model = tiny_model("cpu") if model is None else model
    ids = torch.tensor(tokenizer.encode(text)[: model.config.max_context])
    positions = torch.arange(len(ids))
    picks = [
        model.logits(model.forward_tokens(ids, positions, _attend_stored(f))).argmax(-1)
        for f in (None, kv_format)
    ]
    return int((picks[0] != picks[1]).sum()), len(ids)


def greedy_texts(prompts, max_new_tokens: int, kv_format: str | None = None, model=None):
    """:func:`greedy_ids` for each prompt, decoded (one torch thread: the matrices are tiny)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [tokenizer.decode(greedy_ids(p, max_new_tokens, kv_format, model)) for p in prompts]
    finally:
        torch.set_num_threads(before)


def words_changed(reference: str, text: str) -> tuple[int, int]:
    """(words of ``text`` that differ from ``reference`` at the same place, words compared):
    from the first word that differs on, a continuation is a different one."""
    a, b = reference.split(), text.split()
    n = max(len(a), len(b))
    same = next((i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]), n)
    return n - same, n
