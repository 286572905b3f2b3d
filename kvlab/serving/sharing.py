"""Memory saved by sharing blocks: parallel sampling and beam search (Lab 07).

Several outputs of one prompt can hold the same rooms: the prompt's blocks are forked (one more
key card per room) and a guest about to write into a shared, partly filled room first moves to a
copy of it (copy-on-write). Everything here drives a real :class:`~kvlab.core.block_manager.BlockManager`: the
forks, copy-on-writes and frees happen, and the blocks in use are read from the manager.

The saving is the PagedAttention paper's measure (Kwon et al., SOSP 2023, §6.3, Fig. 15):
``1 - (blocks in use with sharing) / (blocks the same sequences would hold alone)``, averaged over
the run. Requests run one after another, each in its own steps (one step = one new token for every
live sequence of the request). Summing block-steps over requests is the same as integrating blocks
in use over a day on which the requests run side by side (each step taking the same time): at each
moment the server holds the sum of its in-flight requests' blocks, and each request adds its own
steps whenever it runs. Requests never share with each other, so the order does not matter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from kvlab.core.block_manager import BlockManager
from kvlab.core.validate import non_negative_number, positive_int
from kvlab.serving.workload import Request, alpaca_like, sharegpt_like

PARALLEL, BEAM = "parallel sampling", "beam search"

# Fig. 15 of the paper, OPT-13B: saving (%) over n (or beam width) = 2, 4, 6, low and high end.
PAPER_SAVINGS = {
    "ShareGPT": {PARALLEL: (16.2, 30.5), BEAM: (44.3, 66.3)},
    "Alpaca": {PARALLEL: (6.1, 9.8), BEAM: (37.6, 55.2)},
}

# Spread (log-normal sigma) of a sample's length around its request's recorded output length.
# Samples of one prompt agree on the kind of answer more than different prompts do (the workloads
# spread output lengths across prompts with sigma 0.8-0.9), so the spread within a prompt is taken
# smaller.
SAMPLE_LENGTH_SIGMA = 0.5


@dataclass
class SharingResult:
    """Blocks in use with sharing and without it, summed over every step of a run (requests one
    after another, so a peak is the largest one request needs)."""

    kind: str  # PARALLEL or BEAM
    n: int  # samples per prompt, or beam width
    block_size: int
    num_requests: int = 0
    steps: int = 0
    with_sharing: int = 0  # block-steps: blocks in use (the manager's count) summed over steps
    without_sharing: int = 0  # block-steps: each sequence's own ceil(tokens / block_size)
    peak_with: int = 0  # the most blocks one request held at once
    peak_without: int = 0
    forks: int = 0
    copy_on_writes: int = 0
    frees: int = 0
    series_with: list[int] = field(default_factory=list, repr=False)  # per step, requests in turn
    series_without: list[int] = field(default_factory=list, repr=False)

    @property
    def saving(self) -> float:
        """Share of the blocks that sharing saved, averaged over the run (0 when nothing ran)."""
        if not self.without_sharing:
            return 0.0
        return 1.0 - self.with_sharing / self.without_sharing


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class _Driver:
    """Calls the manager and counts what it did; :meth:`measure` closes a step."""

    def __init__(self, manager, result: SharingResult):
        self.manager = manager
        self.result = result

    def allocate(self, seq_id, num_tokens: int, final: int | None = None) -> None:
        self.manager.allocate(seq_id, num_tokens)
        if final is not None:  # the length it leaves with: the widget tells future from waste
            self.manager.set_expected_len(seq_id, final)

    def fork(self, parent_id, child_id) -> None:
        self.manager.fork(parent_id, child_id)
        self.result.forks += 1

    def free(self, seq_id) -> None:
        self.manager.free(seq_id)
        self.result.frees += 1

    def append(self, seq_id) -> None:
        if self.manager.append_slot(seq_id) is not None:
            self.result.copy_on_writes += 1

    def measure(self) -> None:
        manager, r = self.manager, self.result
        shared = manager.num_blocks - manager.num_free_blocks
        size = manager.block_size
        # the manager holds only the running request's sequences (requests run one at a time)
        alone = sum(_blocks(manager.num_tokens(s), size) for s in manager.seq_ids)
        r.steps += 1
        r.with_sharing += shared
        r.without_sharing += alone
        r.peak_with = max(r.peak_with, shared)
        r.peak_without = max(r.peak_without, alone)
        r.series_with.append(shared)
        r.series_without.append(alone)


def _check(requests, n_name: str, n, block_size, seed) -> None:
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests must be a list of Request, got {type(requests).__name__}")
    if not requests:
        raise ValueError("requests must not be empty")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] must be a Request, got {type(r).__name__}")
    positive_int(n_name, n)
    positive_int("block_size", block_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")


# --- parallel sampling -------------------------------------------------------------------------
def sample_lengths(
    rng: random.Random, output_len: int, n: int, sigma: float = SAMPLE_LENGTH_SIGMA
) -> list[int]:
    """Output lengths of ``n`` samples of one prompt.

    Real samples stop at different lengths (each meets its end-of-sequence token at its own
    time), and a sample that stops early frees its rooms early, which changes how much is shared.
    The request's recorded ``output_len`` is the first sample; each other sample's length is it
    times a log-normal factor of mean 1 (``sigma``, :data:`SAMPLE_LENGTH_SIGMA` unless told), so
    samples are as long as the recorded answer on average; ``sigma = 0`` makes every sample as
    long as it (a benchmark that ignores end-of-sequence). ``n = 1`` gives exactly
    ``[output_len]``.
    """
    others = [
        max(1, round(output_len * math.exp(rng.gauss(-sigma * sigma / 2, sigma))))
        for _ in range(n - 1)
    ]
    return [output_len, *others]


def _parallel_request(driver: _Driver, index: int, prompt_len: int, lengths: list[int]) -> None:
    samples = [(index, k) for k in range(len(lengths))]
    driver.allocate(samples[0], prompt_len)  # the prompt is checked in once...
    for child in samples[1:]:
        driver.fork(samples[0], child)  # ...and every sample holds its rooms
    for step in range(1, max(lengths) + 1):
        live = [s for s, length in zip(samples, lengths, strict=True) if length >= step]
        for seq_id in live:
            driver.append(seq_id)
        driver.measure()
        for seq_id in live:
            if lengths[seq_id[1]] == step:
                driver.free(seq_id)


def parallel_sampling(
    requests: list[Request],
    n: int,
    *,
    block_size: int = 16,
    seed: int = 0,
    length_sigma: float = SAMPLE_LENGTH_SIGMA,
) -> SharingResult:
    """Each request's prompt checked in once and forked into ``n`` samples that each generate
    their own tokens (lengths from :func:`sample_lengths` with ``length_sigma``); a finished
    sample checks out."""
    _check(requests, "n", n, block_size, seed)
    sigma = non_negative_number("length_sigma", length_sigma)
    rng = random.Random(seed)
    lengths = [sample_lengths(rng, r.output_len, n, sigma) for r in requests]
    pairs = list(zip(requests, lengths, strict=True))
    worst = max(n * _blocks(r.prompt_len + max(ls), block_size) for r, ls in pairs)
    result = SharingResult(PARALLEL, n, block_size, num_requests=len(requests))
    driver = _Driver(BlockManager(worst, block_size), result)
    for index, (r, ls) in enumerate(pairs):
        _parallel_request(driver, index, r.prompt_len, ls)
    return result


# --- beam search -------------------------------------------------------------------------------
def proposals(rng: random.Random, width: int) -> list[float]:
    """Log-probabilities of the ``width`` next tokens a beam proposes, from a random model.

    Stick breaking: each proposal takes a uniformly random share of the probability the earlier
    ones left (expected 1/2, 1/4, 1/8, ...). A real model's next-token distribution has that
    shape: a few likely tokens and a long tail, sometimes sure, sometimes torn between two.
    """
    logps, left = [], 1.0  # the probability not yet given out
    for _ in range(width):
        p = left * (rng.random() or 0.5)  # a share never exactly 0
        logps.append(math.log(p))
        left -= p
    return logps


def _beam_request(
    driver: _Driver,
    rng: random.Random,
    prompt_len: int,
    output_len: int,
    width: int,
    name: Callable[[int], Hashable],
    after_step: Callable[[int], None] | None = None,
) -> None:
    made = 1
    driver.allocate(name(0), prompt_len, final=prompt_len + output_len)  # forks inherit it
    beams = [(0.0, name(0))]  # (cumulative log-probability, sequence)
    for step in range(1, output_len + 1):
        candidates = sorted(
            (-score - logp, rank, parent)
            for rank, (score, parent) in enumerate(beams)
            for logp in proposals(rng, width)
        )
        survivors, kept = [], set()
        for minus_score, _, parent in candidates[:width]:
            if parent in kept:  # a second survivor of the same beam: a new sequence shares it
                child, made = name(made), made + 1
                driver.fork(parent, child)
            else:
                child = parent
                kept.add(parent)
            survivors.append((-minus_score, child))
        for _, parent in beams:
            if parent not in kept:
                driver.free(parent)  # a beam nobody continues checks out
        for _, seq_id in survivors:
            driver.append(seq_id)
        driver.measure()
        if after_step is not None:
            after_step(step)
        beams = survivors
    for _, seq_id in beams:
        driver.free(seq_id)


def beam_search(
    requests: list[Request], width: int, *, block_size: int = 16, seed: int = 0
) -> SharingResult:
    """A beam search of ``width`` beams over a seeded random model (:func:`proposals`), for
    ``output_len`` steps per request.

    Each step every live beam proposes ``width`` tokens, and the ``width`` best of all proposals
    by cumulative log-probability survive: a beam chosen by several is forked, a beam chosen by
    none is freed, then every survivor appends its token (copying a shared, partly filled room
    first). ``width`` proposals per beam are enough: no beam can place more survivors than that.
    Beams never stop early, as when a benchmark ignores end-of-sequence.
    """
    _check(requests, "width", width, block_size, seed)
    rng = random.Random(seed)
    worst = max(width * _blocks(r.total_len, block_size) for r in requests)
    result = SharingResult(BEAM, width, block_size, num_requests=len(requests))
    driver = _Driver(BlockManager(worst, block_size), result)
    for index, r in enumerate(requests):
        _beam_request(driver, rng, r.prompt_len, r.output_len, width, lambda k, i=index: (i, k))
    return result


def beam_search_trace(
    prompt_len: int = 6,
    output_len: int = 6,
    width: int = 3,
    block_size: int = 4,
    seed: int = 0,
    num_blocks: int = 24,
):
    """A recorded :class:`~kvlab.core.trace.Trace` of one short beam search in a small hotel, for the
    widget: check-in, forks (shared rooms), copy-on-writes, check-outs and a frame per step.
    Guests are ``"beam k"`` in order of creation; within a step the forks come before the
    check-outs (vLLM's order), so a frame may briefly show more than ``width`` beams."""
    from kvlab.core.recorder import recorded

    request = Request(prompt_len, output_len)
    positive_int("width", width)
    positive_int("num_blocks", num_blocks)
    needed = width * _blocks(request.total_len, positive_int("block_size", block_size))
    if needed > num_blocks:
        raise ValueError(
            f"num_blocks = {num_blocks} is too small: {width} beams of {request.total_len} tokens "
            f"may hold {needed} blocks of {block_size} tokens"
        )
    manager = recorded(BlockManager(num_blocks, block_size))
    driver = _Driver(manager, SharingResult(BEAM, width, block_size))
    step_frame = lambda step: manager.record("step", note=f"token {step}")  # noqa: E731
    rng = random.Random(seed)
    _beam_request(driver, rng, prompt_len, output_len, width, lambda k: f"beam {k}", step_frame)
    return manager.trace


# --- the lab's figures -------------------------------------------------------------------------
def sharing_savings(
    days: dict[str, list[Request]], sizes=(2, 4, 6), *, block_size: int = 16, seed: int = 0
) -> dict[str, dict[str, dict[int, SharingResult]]]:
    """``{workload: {"parallel sampling" | "beam search": {n: SharingResult}}}`` for each day."""
    return {
        day: {
            PARALLEL: {
                n: parallel_sampling(reqs, n, block_size=block_size, seed=seed) for n in sizes
            },
            BEAM: {w: beam_search(reqs, w, block_size=block_size, seed=seed) for w in sizes},
        }
        for day, reqs in days.items()
    }


def lab_days(seed: int = 0) -> dict[str, list[Request]]:
    """The two days Lab 07 measures: 100 ShareGPT-like and 200 Alpaca-like requests (about 4 s of
    one core for n, width = 2, 4, 6; long ShareGPT beams cost the most)."""
    return {"ShareGPT": sharegpt_like(100, seed=seed), "Alpaca": alpaca_like(200, seed=seed)}


def savings_table(results: dict, paper: dict = PAPER_SAVINGS) -> str:
    """The savings as text, one line per workload and kind, with the paper's range beside."""
    lines = []
    for day, kinds in results.items():
        for kind, by_n in kinds.items():
            ours = "  ".join(f"n={n}: {r.saving:6.1%}" for n, r in by_n.items())
            span = paper.get(day, {}).get(kind)
            theirs = "" if span is None else f"   paper {span[0]:.1f}-{span[1]:.1f}%"
            lines.append(f"{day:9} {kind:17} {ours}{theirs}")
    return "\n".join(lines)


if __name__ == "__main__":
    import time

    bigger = {"ShareGPT": sharegpt_like(200, seed=0), "Alpaca": alpaca_like(200, seed=0)}
    for label, days in (("the lab's days", lab_days()), ("200 requests each", bigger)):
        start = time.process_time()
        table = savings_table(sharing_savings(days))
        print(f"{label}: {time.process_time() - start:.1f} s of CPU\n{table}\n")
