"""Greedy generation with the tiny model, served by the course's engine on a contiguous or a paged
cache: the same scheduler that the simulator drives, with real tokens.

``generate(prompts, max_new_tokens, cache="paged")`` runs every prompt as a sequence through
:class:`kvlab.serving.engine.Engine` (continuous batching: all running sequences share one forward
per step; preemption by recompute or swap when the cache runs out) and returns the texts with the
step's figures. Greedy decoding makes the output a function of the prompt alone, so both caches,
and any preemption, must give token-identical texts.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from kvlab.core.block_manager import PagedCache
from kvlab.core.cache_kinds import CACHES, TINY_CACHES
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.core.validate import positive_int
from kvlab.models.tiny import tokenizer
from kvlab.models.tiny.executor import TinyExecutor
from kvlab.models.tiny.model import TinyLlama, load_model
from kvlab.serving.scheduler import PREEMPTION_MODES


def default_device() -> str:
    """Where kvlab's kernels run: the CPU under Triton's interpreter, else the GPU (compiled
    kernels need the K/V, and so the model, there)."""
    from kvlab.ops.runtime import kernel_mode

    return "cpu" if kernel_mode() == "interpreter" else "cuda"


@functools.cache
def _loaded(device: str) -> TinyLlama:
    return load_model().to(device)


def tiny_model(device: str | None = None) -> TinyLlama:
    """The shipped model on ``device`` (default: :func:`default_device`), loaded once per process
    and device."""
    return _loaded(str(default_device() if device is None else device))


@dataclass
class Generation:
    """What :func:`generate` returns: the generated texts (prompts not included) and how the run
    went."""

    texts: list[str]
    token_ids: list[list[int]]  # generated ids per prompt
    cache: str
    steps: int = 0
    preemptions: int = 0
    seconds: float = 0.0  # wall time of the whole run
    model_seconds: float = 0.0  # of which in the model's forward (the executor)
    stats: dict = field(default_factory=dict)  # anything more the engine reports

    @property
    def num_generated(self) -> int:
        return sum(len(ids) for ids in self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated / self.seconds if self.seconds else float("nan")


def _check(prompts, max_new_tokens, cache, preemption, max_context) -> tuple[list, list[int]]:
    if not isinstance(prompts, list | tuple) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r}")
    ids = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompts[{i}] must be a non-empty string, got {prompt!r}")
        ids.append(tokenizer.encode(prompt))
    if isinstance(max_new_tokens, list | tuple):
        if len(max_new_tokens) != len(prompts):
            raise ValueError(
                f"max_new_tokens must be one int or one per prompt ({len(prompts)}), got "
                f"{len(max_new_tokens)}"
            )
        new = [positive_int(f"max_new_tokens[{i}]", n) for i, n in enumerate(max_new_tokens)]
    else:
        new = [positive_int("max_new_tokens", max_new_tokens)] * len(prompts)
    if cache not in TINY_CACHES:
        raise ValueError(f"cache must be one of {TINY_CACHES}, got {cache!r}")
    if preemption not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
    for i, (p, n) in enumerate(zip(ids, new, strict=True)):
        if len(p) + n > max_context:
            raise ValueError(
                f"prompts[{i}] ({len(p)} tokens) + max_new_tokens ({n}) exceeds the model's "
                f"context of {max_context} tokens"
            )
    return ids, new


def _check_fits(kv_cache, lengths: list[int]) -> None:
    """Reject up front a prompt that could never run, even alone in the cache (never mid-run)."""
    for i, n in enumerate(lengths):
        if isinstance(kv_cache, PagedCache):
            size = kv_cache.block_size
            need, have = -(-n // size), kv_cache.num_blocks
            what = f"{need} blocks of {size}"
        else:
            need, have, what = n, kv_cache.max_seq_len, f"{n} tokens"
        if need > have:
            raise ValueError(
                f"prompts[{i}] with its new tokens needs {what}, more than the cache's {have}"
            )


def make_kv_cache(
    name: str,
    model: TinyLlama,
    lengths: list[int],
    *,
    num_blocks: int | None = None,
    block_size: int = 16,
    num_slots: int | None = None,
    max_seq_len: int | None = None,
):
    """The cache for sequences of final ``lengths`` (prompt + new tokens). Without a size given,
    it holds every sequence at once: no sequence waits and none is preempted."""
    if name == "paged":
        block_size = positive_int("block_size", block_size)
        if num_blocks is None:
            num_blocks = sum(-(-n // block_size) for n in lengths)
        return PagedCache(positive_int("num_blocks", num_blocks), block_size)
    max_seq_len = model.config.max_context if max_seq_len is None else max_seq_len
    num_slots = len(lengths) if num_slots is None else num_slots
    return ContiguousKVCache(num_slots, max_seq_len, spec=model.spec, policy=CACHES["contiguous"])


def generate(
    prompts: list[str],
    max_new_tokens: int | list[int],
    cache: str = "contiguous",
    *,
    num_blocks: int | None = None,
    block_size: int = 16,
    num_slots: int | None = None,
    max_seq_len: int | None = None,
    max_batch: int | None = None,
    preemption: str = "recompute",
    max_num_batched_tokens: int | None = None,
    chunked_prefill: bool = False,
    model: TinyLlama | None = None,
    device: str | None = None,
    threads: int | None = 1,
) -> Generation:
    """Greedy continuations of ``prompts`` (``max_new_tokens`` each, or one count per prompt).

    ``cache="paged"``: ``num_blocks`` blocks of ``block_size`` token slots (default: enough for
    every sequence at once; fewer forces preemption). ``cache="contiguous"``: ``num_slots``
    max-length bookings of ``max_seq_len`` (default: one per prompt, the model's context).
    ``max_batch`` caps the running sequences; ``preemption`` is ``"recompute"`` or ``"swap"``.
    ``max_num_batched_tokens`` caps the tokens a step computes (the scheduler's token budget;
    None: no cap), and ``chunked_prefill=True`` lets a prompt longer than what is left of it be
    read in chunks over several steps; greedy tokens are the same either way.
    ``model`` defaults to the shipped one on ``device`` (default: the CPU under Triton's
    interpreter, else the GPU); a given model runs where it is. ``threads`` sets torch's CPU
    threads for the run (restored after; None leaves them): a decode step's matrices are too
    small to share out, and on busy cores threads that wait for each other made CPU runs 30-60x
    slower than one thread.
    """
    from kvlab.serving.engine import Engine
    from kvlab.serving.scheduler import Sequence

    model = tiny_model(device) if model is None else model
    ids, new = _check(prompts, max_new_tokens, cache, preemption, model.config.max_context)
    kv_cache = make_kv_cache(
        cache,
        model,
        [len(p) + n for p, n in zip(ids, new, strict=True)],
        num_blocks=num_blocks,
        block_size=block_size,
        num_slots=num_slots,
        max_seq_len=max_seq_len,
    )
    _check_fits(kv_cache, [len(p) + n for p, n in zip(ids, new, strict=True)])
    executor = TinyExecutor(model, kv_cache)
    engine = Engine(
        kv_cache,
        executor,
        max_batch=max_batch,
        preemption=preemption,
        max_num_batched_tokens=max_num_batched_tokens,
        chunked_prefill=chunked_prefill,
    )
    seqs = [
        Sequence(i, len(p), n, token_ids=list(p))
        for i, (p, n) in enumerate(zip(ids, new, strict=True))
    ]
    for seq in seqs:
        engine.add(seq)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(positive_int("threads", threads))
    try:
        start = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    out = [seq.token_ids[len(p) :] for seq, p in zip(seqs, ids, strict=True)]
    scheduler = engine.scheduler
    return Generation(
        texts=[tokenizer.decode(o) for o in out],
        token_ids=out,
        cache=cache,
        steps=engine.num_steps,
        preemptions=scheduler.num_preemptions,
        seconds=seconds,
        model_seconds=executor.seconds,
        stats={
            "recompute_tokens": scheduler.recompute_tokens,
            "swapped_out_tokens": scheduler.swapped_out_tokens,
            "swapped_in_tokens": scheduler.swapped_in_tokens,
        },
    )
