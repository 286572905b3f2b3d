"""Capacity and cost planning: how many requests a GPU serves at once, and what a token costs.

Two questions a deployment asks, answered analytically and at once (no simulation):

- :func:`kv_capacity`: how many KV blocks and token slots a number of bytes holds, and how many
  requests of full length fit at once (the "Maximum concurrency for N tokens per request" of vLLM's
  start-up log: blocks x block_size / N).
- :func:`plan`: on a model and GPUs, for each of the four caches of Lab 06 (``"contiguous"``:
  Orca-Max, ``"contiguous-pow2"``, ``"contiguous-oracle"``, ``"paged"``: vLLM), how many requests
  run at once on a busy day, the tokens per second that allows, the cost per million generated
  tokens and the GPUs a target load needs.

How :func:`plan` gets there (each step a stated assumption; :func:`compare_with_simulation`
checks the result against :func:`kvlab.serving.simulate` on the same set-up):

1. Memory, as vLLM sizes it: ``KV bytes = num_gpus x memory x gpu_memory_utilization - weights
   - overhead``. Weights are ``num_params x dtype_bytes`` unless given; the overhead (the
   activation peak of vLLM's profiling run and non-torch memory: CUDA context, NCCL buffers) comes
   from a start-up log when one is given (``vllm_log``), else is predicted from the model's MLP
   width and the step's tokens with the spread that prediction shows on real logs
   (:mod:`kvlab.perf.memory_budget`, :mod:`kvlab.perf.overhead`). With tensor parallelism each
   GPU holds its share of the KV heads (at least one head: with more GPUs than KV heads the heads
   are copied, as vLLM does).
2. Concurrency under continuous batching with every request waiting (a saturated server), at
   most ``max_num_seqs`` (vLLM's default for the GPU unless given) and never more than a step's
   ``max_num_batched_tokens`` (each running request needs one); ``min_tokens_per_user`` lowers
   the cap to what leaves each request that speed. A
   running request is seen for as many steps as it generates tokens, so by Little's law the mean
   number running is ``memory / F``, where ``F`` is the *time-weighted* mean footprint: each
   request's tokens booked, averaged over its own steps, weighted by its number of steps
   (``E[output x mean booking] / E[output]``). Per cache:

   - Orca-Max books ``max_seq_len`` for everyone: exactly ``token_slots // max_seq_len`` run.
   - Orca-Pow2 books the output rounded up to a power of two plus the prompt, in a power-of-two
     block (the paper's rule: :func:`kvlab.core.contiguous.booking_size`; at most ``max_seq_len``) and
     Orca-Oracle the exact total, for the whole of the request's life, in one contiguous arena:
     ``ARENA_PACKING x token_slots / F`` (:data:`ARENA_PACKING`: holes left between bookings,
     external fragmentation).
   - Paged holds ``ceil((prompt + generated) / block_size)`` blocks, growing: about prompt + half
     the output + half a block; the pool fills to the last block: ``token_slots / F``.

   ``F`` comes from a fixed sample (:data:`WORKLOAD_SAMPLE` requests, seed :data:`WORKLOAD_SEED`)
   of kvlab's workload generator at that ``max_seq_len``, computed once and cached.
3. Tokens per second from the roofline (:mod:`kvlab.perf.roofline`, the same cost the simulator uses:
   :meth:`Plan.step_time`): a decode step of ``B`` running requests reads every weight once and
   each request's K and V, ``max(FLOPs / peak FLOP/s, bytes / bandwidth)``; on ``num_gpus`` GPUs
   (tensor parallel) weights and KV are split and bandwidth and FLOP/s add up, ignoring the
   communication between them. ``decode_tokens_per_s = B / step`` is the upper bound;
   ``tokens_per_s`` also pays, without overlap, the prefill of the ``B / E[output]`` requests
   that start each step (``2 x params`` FLOPs per prompt token, plus attention): the conservative
   figure that costs and GPU counts use. The simulator, which overlaps prefill with decode but
   also recomputes preempted requests, lands close to or between the two. Both are bounds of
   the hardware: real kernels reach a fraction of the peaks.
4. Cost per million generated tokens: ``price x num_gpus / (tokens_per_s x 3600) x 1e6``; GPUs
   for a target: ``ceil(target / tokens_per_s)`` replicas of ``num_gpus`` GPUs. Both are also
   given for an engine at :data:`REALISTIC_FRACTION` of the roofline, as a range.

Measured against :func:`kvlab.serving.simulate` (``compare_with_simulation``: steady state of a
saturated day, a seed other than the planner's; no cap on requests at once and 2 GiB of overhead per
GPU, the defaults when it was measured, hence the slots below), planned / simulated - 1:

=============================  ==========  ================================  ============
set-up                         workload    concurrency (Max, Pow2, Oracle,   tokens/s
                                           paged)                            (worst)
=============================  ==========  ================================  ============
OPT-13B, A100-40GB, 2k ctx     ShareGPT    0, +2.7, +0.1, -4.3 %             -2.2 %
(13,056 slots)                 Alpaca      0, -3.5, -1.8, -3.3 %             -10.3 %
Llama-3-8B, H100-80GB, 8k ctx  ShareGPT    0, +1.2, +1.4, +0.6 %             -5.3 %
(450,896 slots)                Alpaca      0, -1.4, -0.5, +0.1 %             -5.7 %
=============================  ==========  ================================  ============

So concurrency within 5% and tokens/s within 11% (the planner below the simulator; measured
again when Pow2 took the paper's rule); the stated
tolerance is :data:`SIMULATION_TOLERANCE` (15%), which ``tests/perf/test_planner.py`` checks on
smaller days.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvlab.core.cache_kinds import CACHES, PAPER_NAMES
from kvlab.core.contiguous import booking_size
from kvlab.core.validate import positive_int
from kvlab.models import PRESETS, ModelSpec, preset
from kvlab.models.specs import KV_CACHE_DTYPE_ALIASES
from kvlab.perf import gpus as gpu_catalogue
from kvlab.perf import memory_budget
from kvlab.perf.gpus import GiB, PricedGPU, with_price
from kvlab.perf.kv_groups import KVCacheLayout, describe_group, kv_cache_layout
from kvlab.perf.memory_budget import MemoryBudget
from kvlab.perf.roofline import GPU
from kvlab.perf.vllm_log import StartFailure, VllmLog, kv_bytes_per_token_per_gpu, read_vllm_log
from kvlab.serving.workload import Request, alpaca_like, sharegpt_like

POLICIES = tuple(CACHES)  # "contiguous", "contiguous-pow2", "contiguous-oracle", "paged"
# the overhead assumed per GPU when a model's MLP width is unknown (kvlab.perf.memory_budget)
DEFAULT_OVERHEAD_PER_GPU = memory_budget.DEFAULT_OVERHEAD_PER_GPU

# Share of a contiguous arena that variable-size bookings (pow2, oracle) keep booked when the
# server is saturated: the rest are holes too small for the next request in line. An empirical
# figure: kvlab.serving.simulate's first-fit arena measures 0.88-0.94 on ShareGPT- and Alpaca-like
# days (Knuth's "fifty-percent rule": about one hole per two bookings at equilibrium).
ARENA_PACKING = 0.90
WORKLOAD_SAMPLE = 20_000  # requests drawn to measure a named workload's lengths
WORKLOAD_SEED = 0
SIMULATION_TOLERANCE = 0.15  # stated agreement with kvlab.serving.simulate (relative)

# vLLM's default max_num_seqs when none is given (vllm/engine/arg_utils.py,
# EngineArgs._set_default_args, vLLM main at commit 99d7eb5d6a5, the v0.11 series; the same for
# `vllm serve` and the LLM class): 1024 on a GPU with at least 70 GiB that is not an A100 (H100,
# H200, MI300X), else 256. Older V0 engines used 256 everywhere.
VLLM_MAX_NUM_SEQS_LARGE_GPU = 1024
VLLM_MAX_NUM_SEQS = 256
VLLM_MAX_NUM_BATCHED_TOKENS_LARGE_GPU = 8192  # vllm serve's, beside max_num_seqs 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 2048
VLLM_LARGE_GPU_MEMORY = 70 * GiB
# The block sizes vLLM's --block-size accepted (its BlockSize type: Literal[1, 8, 16, 32, 64, 128]
# in vllm/config.py up to the 0.9 series; 0.10-0.11 added 256 for hybrid models, and the newest
# versions take any positive size, which the attention kernels then accept or refuse).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
# The realistic end of a cost range: a share of the roofline's tokens/s. An assumption, grounded
# in what the course measured: its paged-attention kernel reaches 68-85% of an H200's peak
# bandwidth at batches of 8-32 (benchmarks/attention.json; a plain copy 89%), one kernel at its
# best; a whole step adds the other kernels, sampling, the scheduler and, with tensor parallel,
# communication. Half the roofline is a round figure below that (edit it, or measure your own).
REALISTIC_FRACTION = 0.5
# Below this many generated tokens per second a user waits on the text (people read about 4-5
# words a second, 5-7 tokens): the plan flags it.
SLOW_TOKENS_PER_USER = 10.0
# Sane maxima for what a user types (larger is a typo, and prints absurd GPU counts)
MAX_TARGET_TOKENS_PER_S = 1e9  # a billion generated tokens per second
MAX_PRICE_PER_GPU_HOUR = 1000.0  # dollars
MAX_USERS = 100_000_000
MAX_TOKENS_PER_USER = 10_000.0
# Hugging Face repositories of the presets, for Plan.vllm_command()
HF_REPOS = {
    "OPT-13B": "facebook/opt-13b",
    "Llama-3-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "Llama-3-70B": "meta-llama/Meta-Llama-3-70B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "Mistral-7B": "mistralai/Mistral-7B-Instruct-v0.1",
    "Mistral-7B-v0.3": "mistralai/Mistral-7B-Instruct-v0.3",
    "Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
}

WORKLOADS = {
    "sharegpt": (sharegpt_like, "ShareGPT-like chats"),
    "alpaca": (alpaca_like, "Alpaca-like instructions"),
}


# --- argument checks ------------------------------------------------------------------------


def _number(name: str, value, *, minimum: float = 0.0, strict: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    ok = value > minimum if strict else value >= minimum
    if not (ok and math.isfinite(value)):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {relation} {minimum:g}, got {value!r}")
    return float(value)


def _at_most(name: str, value: float, most: float, unit: str) -> float:
    if value > most:
        raise ValueError(f"{name} must be at most {most:,.0f} {unit}, got {value:g}")
    return value


def vllm_default_max_num_seqs(gpu: GPU) -> int:
    """The ``max_num_seqs`` vLLM picks when none is given: 1024 on a GPU of at least 70 GiB that is
    not an A100, else 256 (see :data:`VLLM_MAX_NUM_SEQS_LARGE_GPU`)."""
    large = gpu.memory_bytes >= VLLM_LARGE_GPU_MEMORY and "a100" not in gpu.name.lower()
    return VLLM_MAX_NUM_SEQS_LARGE_GPU if large else VLLM_MAX_NUM_SEQS


def model_for_repo(name: str) -> ModelSpec | None:
    """The preset a vLLM log's model is (its Hugging Face repository or a preset's name), if any."""
    key = name.strip().rstrip("/").lower()
    for preset_name, repo in HF_REPOS.items():
        if key in (repo.lower(), repo.lower().rsplit("/", 1)[-1], preset_name.lower()):
            return PRESETS[preset_name]
    return next((spec for n, spec in PRESETS.items() if n.lower() == key), None)


def vllm_default_max_num_batched_tokens(gpu: GPU) -> int:
    """The tokens of one step (and of vLLM's profiling run) ``vllm serve`` picks when none is
    given: 8192 on the GPUs that get 1024 sequences, else 2048 (vllm/engine/arg_utils.py,
    ``EngineArgs.get_batch_defaults``, API server)."""
    large = vllm_default_max_num_seqs(gpu) == VLLM_MAX_NUM_SEQS_LARGE_GPU
    return VLLM_MAX_NUM_BATCHED_TOKENS_LARGE_GPU if large else VLLM_MAX_NUM_BATCHED_TOKENS


def _resolve_log(vllm_log) -> VllmLog | None:
    if vllm_log is None or isinstance(vllm_log, VllmLog):
        return vllm_log
    if isinstance(vllm_log, str):
        return read_vllm_log(vllm_log)
    raise TypeError(
        f"vllm_log must be a vLLM start-up log's text or a kvlab.perf.vllm_log.VllmLog, got "
        f"{type(vllm_log).__name__}"
    )


def _from_log(name: str, given, logged):
    """A setting the log fixed: the log's, unless the caller gave another (an error)."""
    if logged is None:
        return given
    if given is not None and given != logged:
        raise ValueError(
            f"{name}={given!r} disagrees with the vLLM log, which ran with {logged!r}: leave "
            f"{name} out to plan the logged set-up"
        )
    return logged


# how far a log's weights per GPU may be from the model's share of them (rounding, buffers)
LOG_WEIGHTS_TOLERANCE = 0.15


def _log_tensor_parallel(log, spec, given, weights_bytes, notes: list[str]) -> int | None:
    """The log's tensor parallel size: printed, else given, else the workers it shows, checked
    against the weights each GPU loaded (a log of another model, or a quantised one, is named)."""
    if log.tensor_parallel_size is not None:
        return _from_log("num_gpus", given, log.tensor_parallel_size)
    if given is not None and given < log.workers_seen:
        raise ValueError(
            f"num_gpus={given} but the vLLM log shows {log.workers_seen} workers' memory: give "
            "the tensor parallel size the server ran with"
        )
    if weights_bytes is not None or spec.weights_bytes is None or log.weights_gib is None:
        if given is None and log.workers_seen > 1:
            notes.append(f"tensor parallel {log.workers_seen}: the workers the log shows")
        return given if given is not None else log.workers_seen
    share = spec.weights_bytes / GiB / log.weights_gib  # GPUs the model's weights are split over

    def fits(tp: int) -> bool:
        return abs(share / tp - 1) <= LOG_WEIGHTS_TOLERANCE

    if given is not None:
        if not fits(given):
            raise ValueError(
                f"the vLLM log's weights ({log.weights_gib:.2f} GiB per GPU) are not "
                f"{spec.name}'s at num_gpus={given} ({spec.weights_bytes / GiB / given:.2f} GiB "
                "per GPU): is it the model the log served? (quantised weights: give weights_bytes)"
            )
        return given
    for tp in (1, 2, 4, 8, 16):
        if tp >= log.workers_seen and fits(tp):
            if tp > 1:
                notes.append(
                    f"tensor parallel {tp}: each GPU loaded 1/{tp} of {spec.name}'s weights "
                    "(the log does not print its size)"
                )
            return tp
    raise ValueError(
        f"the vLLM log's weights ({log.weights_gib:.2f} GiB per GPU) are no whole share of "
        f"{spec.name}'s ({spec.weights_bytes / GiB:.2f} GiB): is it the model the log served? "
        "(give num_gpus, and weights_bytes for quantised weights)"
    )


def _vllm_kv_dtype(spec: ModelSpec, kv_cache_dtype: str | None) -> str:
    """vLLM's spelling of the cache's dtype; "auto" when it is the model's own."""
    if kv_cache_dtype is None or spec.kv_element_bytes == spec.dtype_bytes:
        return "auto"
    key = kv_cache_dtype.strip().lower()
    return KV_CACHE_DTYPE_ALIASES.get(key, key)


def _check_block_size(block_size, max_seq_len: int) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(
            f"block_size must be an int, one of {', '.join(map(str, VLLM_BLOCK_SIZES))} "
            f"(tokens per KV block), got {block_size!r}"
        )
    if block_size not in VLLM_BLOCK_SIZES:
        raise ValueError(
            f"block_size must be one of {', '.join(map(str, VLLM_BLOCK_SIZES))} (the sizes vLLM "
            f"allows on GPUs; 16 is its default), got {block_size!r}"
        )
    if block_size > max_seq_len:
        raise ValueError(
            f"block_size must be at most max_seq_len={max_seq_len:,} (a block longer than the "
            f"longest request is never filled), got {block_size}"
        )
    return int(block_size)


def _resolve_model(model) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        try:
            return preset(model.strip())
        except KeyError:
            raise ValueError(f"unknown model {model!r}; presets are {', '.join(PRESETS)}") from None
    raise TypeError(
        f"model must be a kvlab.models.ModelSpec or a preset's name, got {type(model).__name__} "
        f"{model!r}"
    )


def _resolve_gpu(gpu) -> PricedGPU:
    if isinstance(gpu, PricedGPU):
        return gpu
    if isinstance(gpu, GPU):  # kvlab.perf.roofline's presets: the catalogue's cards, with no price
        return with_price(gpu_catalogue.ROOFLINE_CARDS.get(gpu, gpu), None)
    if isinstance(gpu, str):
        return gpu_catalogue.lookup(gpu)
    raise TypeError(
        f"gpu must be a kvlab.perf.gpus.PricedGPU, a kvlab.perf.roofline.GPU or a preset's name, got "
        f"{type(gpu).__name__} {gpu!r}"
    )


def _check_split(spec: ModelSpec, num_gpus: int) -> None:
    """Tensor parallel splits every layer's heads evenly over the GPUs (KV heads may be copied
    when there are more GPUs than KV heads), as vLLM requires."""
    q, kv = spec.num_q_heads, spec.num_kv_heads
    if num_gpus == 1 or (q % num_gpus == 0 and (kv % num_gpus == 0 or num_gpus % kv == 0)):
        return
    fits = [n for n in range(1, q + 1) if q % n == 0 and (kv % n == 0 or n % kv == 0)]
    raise ValueError(
        f"num_gpus={num_gpus} does not split {spec.name}'s {q} query heads and {kv} KV heads "
        f"evenly (tensor parallel needs that): use one of {', '.join(map(str, fits[:8]))}"
    )


def _resolve_max_seq_len(spec: ModelSpec, max_seq_len, *, required: bool) -> int | None:
    if max_seq_len is None:
        if spec.max_context is None and required:
            raise ValueError(
                f"model {spec.name!r} has no max_context: pass max_seq_len (the longest request, "
                "prompt + output, in tokens)"
            )
        return spec.max_context
    max_seq_len = positive_int("max_seq_len", max_seq_len, minimum=2)
    if spec.max_context is not None and max_seq_len > spec.max_context:
        raise ValueError(
            f"max_seq_len must be <= the model's context of {spec.max_context:,} tokens "
            f"({spec.name}), got {max_seq_len:,}"
        )
    return max_seq_len


# --- capacity -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """What a KV cache of ``kv_cache_bytes`` holds: whole blocks of ``block_size`` token slots.

    A model that is not one full-attention group (``layout``: vLLM v1's groups,
    :mod:`kvlab.perf.kv_groups`) holds blocks of every group in one pool: ``num_blocks`` of the
    pool, ``reserve_blocks`` of them for one request at full length."""

    kv_cache_bytes: float
    bytes_per_token: float  # K and V of one token over all layers (and GPUs)
    block_size: int
    num_blocks: int  # whole blocks that fit
    max_seq_len: int | None
    reserve_blocks: int | None = None  # a request at full length, over every group (hybrids)
    layout: KVCacheLayout | None = field(default=None, repr=False, compare=False)

    @property
    def block_bytes(self) -> float:
        if self.layout is not None:
            return self.layout.block_bytes
        return self.block_size * self.bytes_per_token

    @property
    def token_slots(self) -> int:
        """Token slots; for a hybrid, vLLM's "GPU KV cache size" (the pool's blocks per group)."""
        if self.layout is not None:
            return self.layout.token_slots(self.num_blocks)
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float | None:
        """Requests of ``max_seq_len`` tokens that fit at once (vLLM's start-up log figure; for
        one full-attention group, slots / max_seq_len: vLLM's blocks / cdiv(max_seq_len, block)
        whenever max_seq_len is a multiple of the block)."""
        if self.max_seq_len is None:
            return None
        if self.reserve_blocks is not None:
            return self.num_blocks / self.reserve_blocks
        return self.token_slots / self.max_seq_len

    def __str__(self) -> str:
        line = f"# GPU blocks: {self.num_blocks:,} of {self.block_size} tokens ({self.token_slots:,} token slots)"
        if self.max_seq_len is not None:
            line += (
                f"; Maximum concurrency for {self.max_seq_len} tokens per request: "
                f"{self.max_concurrency:.2f}x"
            )
        return line


def _capacity(kv_bytes: float, bytes_per_token: float, block_size: int, max_seq_len) -> Capacity:
    num_blocks = int(kv_bytes // (block_size * bytes_per_token))
    return Capacity(kv_bytes, bytes_per_token, block_size, num_blocks, max_seq_len)


def kv_capacity(
    model: ModelSpec | str,
    kv_cache_bytes: float,
    *,
    block_size: int = 16,
    max_seq_len: int | None = None,
) -> Capacity:
    """Blocks, token slots and full-length concurrency of ``kv_cache_bytes`` of KV memory.

    ``model``: a :class:`~kvlab.models.ModelSpec` or a preset's name. ``max_seq_len`` defaults to
    the model's context (``max_concurrency`` is None when neither is known). For example the
    PagedAttention paper's OPT-13B with 12 GiB of KV: ``kv_capacity("OPT-13B", 12 * 2**30)``
    holds 983 blocks = 15,728 token slots (800 KiB per token).
    """
    spec = _resolve_model(model)
    kv_bytes = _number("kv_cache_bytes", kv_cache_bytes)
    block_size = positive_int("block_size", block_size)
    max_seq_len = _resolve_max_seq_len(spec, max_seq_len, required=False)
    if spec.is_dense:
        return _capacity(kv_bytes, spec.kv_bytes_per_token, block_size, max_seq_len)
    return _layout_capacity(
        spec, kv_bytes, block_size, max_seq_len, 1, VLLM_MAX_NUM_BATCHED_TOKENS_LARGE_GPU
    )


def _layout_capacity(spec, kv_bytes, block_size, max_seq_len, num_gpus, batched) -> Capacity:
    """Capacity as vLLM v1 groups a hybrid model's layers (kvlab.perf.kv_groups): ``kv_bytes``
    of all ``num_gpus`` GPUs, each holding its share."""
    layout = kv_cache_layout(spec.layer_groups, block_size=block_size, tensor_parallel=num_gpus)
    num_blocks = layout.num_blocks(kv_bytes / num_gpus)
    per_gpu_token = sum(
        g.num_layers * g.spec.token_bytes() for g in layout.groups
    )  # what one more token costs on one GPU
    reserve = None if max_seq_len is None else layout.blocks_reserved(max_seq_len, batched)
    return Capacity(
        kv_bytes, per_gpu_token * num_gpus, block_size, num_blocks, max_seq_len,
        reserve_blocks=reserve, layout=layout,
    )  # fmt: skip


# --- workloads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadStats:
    """The length statistics of a workload that the planner needs (tokens).

    ``footprint[cache]`` is the time-weighted mean of the token slots a running request has booked
    in that cache (``E[output x its mean booking] / E[output]``); ``held_tokens`` the same for the
    slots holding a token; ``context_tokens`` the K/V a running request reads per step.
    """

    name: str
    description: str
    num_requests: int
    max_seq_len: int
    block_size: int
    mean_prompt: float
    mean_output: float
    footprint: Mapping[str, float]  # read-only
    held_tokens: float
    context_tokens: float
    prefill_attended: float  # E[prompt x (prompt + 1) / 2]: attention positions of one prefill
    prefix_hit_rate: float = 0.0  # share of prompt tokens a prefix cache serves (not computed)

    @property
    def computed_prompt(self) -> float:
        """Prompt tokens a request computes: those past the part a prefix cache held."""
        return self.mean_prompt * (1 - self.prefix_hit_rate)

    @property
    def computed_attended(self) -> float:
        """Attention positions of those tokens: the last (1 - h) of a prompt attends to the
        whole prefix before it, so (1 - h^2) of a full prefill's."""
        return self.prefill_attended * (1 - self.prefix_hit_rate**2)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "sample_requests": self.num_requests,
            "mean_prompt_len": self.mean_prompt,
            "mean_output_len": self.mean_output,
            "footprint_tokens": dict(self.footprint),
            "held_tokens": self.held_tokens,
            "context_tokens": self.context_tokens,
            "prefix_hit_rate": self.prefix_hit_rate,
        }


def _blocks_cumsum(n, block_size: int):
    """sum over t = 1..n of ceil(t / block_size), elementwise (n a NumPy integer array)."""
    q, r = n // block_size, n % block_size
    return block_size * q * (q + 1) // 2 + r * (q + 1)


def _stats(name, description, prompts, outputs, max_seq_len, block_size) -> WorkloadStats:
    import numpy as np

    p = np.asarray(prompts, dtype=np.int64)
    o = np.asarray(outputs, dtype=np.int64)
    total = p + o
    steps = float(o.sum())
    footprint = {}
    for cache, policy in CACHES.items():
        if policy is None:
            # a request holds prompt + g slots in its g-th step (g = 1..output), reads prompt + g - 1
            booked = block_size * (
                _blocks_cumsum(total, block_size) - _blocks_cumsum(p, block_size)
            )
        else:  # the whole booking for each of its steps
            booked = o * [
                booking_size(policy, a, b, max_seq_len)
                for a, b in zip(prompts, outputs, strict=True)
            ]
        footprint[cache] = float(booked.sum() / steps)
    return WorkloadStats(
        name=name,
        description=description,
        num_requests=len(p),
        max_seq_len=max_seq_len,
        block_size=block_size,
        mean_prompt=float(p.mean()),
        mean_output=float(o.mean()),
        footprint=MappingProxyType(footprint),
        held_tokens=float((o * p + o * (o + 1) / 2).sum() / steps),
        context_tokens=float((o * p + o * (o - 1) / 2).sum() / steps),
        prefill_attended=float((p * (p + 1) / 2).mean()),
    )


@functools.lru_cache(maxsize=64)
def _named_stats(name: str, max_seq_len: int, block_size: int) -> WorkloadStats:
    generate, description = WORKLOADS[name]
    sample = generate(WORKLOAD_SAMPLE, seed=WORKLOAD_SEED, max_total=max_seq_len)
    prompts = [r.prompt_len for r in sample]
    outputs = [r.output_len for r in sample]
    return _stats(name, description, prompts, outputs, max_seq_len, block_size)


def _workload_name(workload: str) -> str:
    key = workload.strip().lower().removesuffix("_like").removesuffix("-like")
    if key not in WORKLOADS:
        raise ValueError(
            f"unknown workload {workload!r}; named workloads are {', '.join(WORKLOADS)} "
            "(or pass a list of kvlab.serving.workload.Request)"
        )
    return key


def workload_stats(workload="sharegpt", *, max_seq_len: int = 2048, block_size: int = 16):
    """:class:`WorkloadStats` of a named workload (``"sharegpt"``, ``"alpaca"``: a fixed sample
    of kvlab's generator with every request within ``max_seq_len``; cached) or of a list of
    :class:`~kvlab.serving.workload.Request` (a trace, e.g. ``kvlab.serving.workload.load_trace(...)``)."""
    max_seq_len = positive_int("max_seq_len", max_seq_len, minimum=2)
    block_size = positive_int("block_size", block_size)
    if isinstance(workload, str):
        return _named_stats(_workload_name(workload), max_seq_len, block_size)
    if not isinstance(workload, list | tuple) or not workload:
        raise TypeError(
            f"workload must be one of {tuple(WORKLOADS)} or a non-empty list of "
            f"kvlab.serving.workload.Request, got {workload!r:.80}"
        )
    for i, r in enumerate(workload):
        if not isinstance(r, Request):
            raise TypeError(
                f"workload[{i}] must be a kvlab.serving.workload.Request, got {r!r:.80}"
            )
        if r.total_len > max_seq_len:
            raise ValueError(
                f"workload[{i}] needs {r.total_len} tokens, more than max_seq_len={max_seq_len}"
            )
    return _stats(
        "trace",
        f"a trace of {len(workload):,} requests",
        [r.prompt_len for r in workload],
        [r.output_len for r in workload],
        max_seq_len,
        block_size,
    )


# --- the step-time model --------------------------------------------------------------------


@dataclass(frozen=True)
class PlanStepTime:
    """The roofline cost of one step on the plan's GPUs (what :func:`kvlab.serving.simulate` takes
    as ``step_time``): equal to :class:`kvlab.perf.roofline.StepTime` on one GPU with weights of
    ``num_params x dtype_bytes``; on several, bandwidth and FLOP/s add up (no communication)."""

    weights_bytes: float
    kv_bytes_per_token: float  # read or written, all GPUs together
    flops_per_token: float  # 2 x params
    attention_flops_per_position: float  # 4 x layers x query heads x head_dim
    hbm_bytes_per_s: float
    peak_flops: float
    pcie_bytes_per_s: float = 25e9

    def compute_seconds(self, new_tokens: float, attended: float) -> float:
        flops = self.flops_per_token * new_tokens + self.attention_flops_per_position * attended
        return flops / self.peak_flops

    def memory_seconds(self, kv_tokens: float) -> float:
        return (self.weights_bytes + kv_tokens * self.kv_bytes_per_token) / self.hbm_bytes_per_s

    def seconds(
        self, new_tokens: int, attended: float, kv_tokens: int, swapped_tokens: int = 0
    ) -> float:
        """A step computing ``new_tokens`` tokens attending to ``attended`` positions in all,
        reading and writing ``kv_tokens`` tokens of K and V (and swapping ``swapped_tokens``)."""
        if min(new_tokens, attended, kv_tokens, swapped_tokens) < 0:
            raise ValueError("new_tokens, attended, kv_tokens and swapped_tokens must be >= 0")
        swap = swapped_tokens * self.kv_bytes_per_token / self.pcie_bytes_per_s
        busy = max(self.compute_seconds(new_tokens, attended), self.memory_seconds(kv_tokens))
        return busy + swap


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyEstimate:
    """One cache policy on the plan's set-up, on a saturated server."""

    cache: str  # "contiguous", "contiguous-pow2", "contiguous-oracle" or "paged"
    system: str  # the PagedAttention paper's name: "Orca (Max)", ..., "vLLM (paged)"
    footprint_tokens: float  # token slots a running request has booked (time-weighted mean)
    concurrency: float  # requests running at once (mean)
    memory_holding_tokens: float  # share of the KV cache holding token states
    step_seconds: float  # one decode step of the running batch
    bound: str  # what limits a decode step: "memory" or "compute"
    decode_tokens_per_s: float  # upper bound: decode steps only
    tokens_per_s: float  # with each request's prefill paid (used for cost and GPUs)
    tokens_per_s_per_request: float  # what one user sees: tokens_per_s / concurrency
    cost_per_million_tokens: float | None  # dollars per million generated tokens (None: no price)
    replicas_needed: int | None  # copies of the set-up for the target (None: no target)
    gpus_needed: int | None
    # the realistic end of each range: the roofline's tokens/s x REALISTIC_FRACTION
    cost_per_million_tokens_realistic: float | None = None
    gpus_needed_realistic: int | None = None
    # copies (and GPUs) for Plan.users requests at once (None: no users given)
    replicas_for_users: int | None = None
    gpus_for_users: int | None = None


# what a log report shows, in this order: VllmLog field, label, unit
_LOG_FIELDS = (
    ("total_gpu_memory_gib", "GPU memory", " GiB"),
    ("gpu_memory_utilization", "x utilization", ""),
    ("requested_memory_gib", "=", " GiB"),
    ("weights_gib", "weights", " GiB"),
    ("activation_peak_gib", "activation peak", " GiB"),
    ("peak_torch_memory_gib", "torch peak", " GiB"),
    ("non_torch_memory_gib", "non-torch", " GiB"),
    ("kv_cache_memory_gib", "KV cache", " GiB"),
    ("cuda_graph_gib", "CUDA graphs", " GiB"),
    ("num_gpu_blocks", "blocks", ""),
    ("gpu_kv_cache_tokens", "token slots", ""),
    ("max_concurrency", "max concurrency", "x"),
    ("max_model_len", "max_model_len", ""),
    ("max_num_batched_tokens", "max_num_batched_tokens", ""),
    ("tensor_parallel_size", "tensor parallel", ""),
    ("block_size", "block size", ""),
    ("kv_cache_dtype", "KV dtype", ""),
)

# what limits a decode step, in words (Plan._verdict)
_LIMITS = {"compute": "arithmetic (FLOP/s)", "memory": "memory bandwidth"}


@dataclass(frozen=True)
class Plan:
    """A deployment's capacity and cost per cache policy; see :func:`plan`.

    ``policies`` maps each cache to its :class:`PolicyEstimate`; :meth:`table` gives them as rows,
    :attr:`summary` in words, :meth:`to_markdown` as a Markdown table, :meth:`to_dict` as JSON.
    """

    model: ModelSpec
    gpu: PricedGPU  # at the price used
    num_gpus: int
    gpu_memory_utilization: float
    weights_bytes: float
    overhead_bytes: float
    capacity: Capacity  # its kv_cache_bytes, block_size and max_seq_len are the plan's
    workload: WorkloadStats
    target_tokens_per_s: float | None
    max_num_seqs: int | None
    policies: dict[str, PolicyEstimate] = field(repr=False)
    _step_time: PlanStepTime = field(repr=False)
    # where max_num_seqs came from: "vllm-default", "given", "min-tokens-per-user" or "none"
    max_num_seqs_source: str = "given"
    engine_max_num_seqs: int | None = None  # the cap before min_tokens_per_user lowered it
    min_tokens_per_user: float | None = None
    speed_cap: int | None = None  # most requests at once at min_tokens_per_user (0: none reach it)
    users: int | None = None
    memory: MemoryBudget | None = None  # where the memory went, and how sure the KV share is
    max_num_batched_tokens: int | None = None
    vllm_log: VllmLog | None = field(default=None, repr=False)
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype
    log_notes: tuple[str, ...] = ()  # what the plan took from elsewhere than the log, and why
    log_start_failure: StartFailure | None = None  # the logged server would not start

    @property
    def log_capacity_source(self) -> str | None:
        """Where a plan from a log took its blocks: ``"profile"`` (recomputed from the memory
        profile, so the printed blocks check it), ``"printed"`` (the blocks or token slots the
        log printed: measured), ``"kv-size"`` (counted from the KV cache size it printed) or
        ``"budget"`` (the rest of a budget with a given overhead); None without a log."""
        log = self.vllm_log
        if log is None:
            return None
        if log.has_profile or (self.memory is not None and self.memory.source == "given"):
            return "profile" if log.has_profile else "budget"
        return "printed" if log.printed_tokens is not None else "kv-size"

    @property
    def kv_groups(self) -> list[dict]:
        """Per kind of layer, as vLLM v1 lays it out: what one token costs and what a request of
        full length reserves (bytes, all GPUs), and the window, latent or state it keeps."""
        spec, cap = self.model, self.capacity
        layout = cap.layout
        n = self.num_gpus
        if layout is None:
            group = spec.layer_groups[0]
            per_token = cap.bytes_per_token
            return [{
                "kind": group.spec.kind, "what": describe_group(group.spec),
                "layers": group.num_layers, "groups": 1, "padding_layers": 0,
                "block_size": self.block_size, "bytes_per_token": per_token,
                "reserved_bytes_per_request": per_token * self.block_size
                * math.ceil(self.max_seq_len / self.block_size),
            }]  # fmt: skip
        rows: dict = {}
        for g in layout.groups:
            row = rows.setdefault(g.spec, {
                "kind": g.spec.kind, "what": describe_group(g.spec), "layers": 0, "groups": 0,
                "padding_layers": 0, "block_size": g.block_size, "bytes_per_token": 0,
                "reserved_bytes_per_request": 0,
            })  # fmt: skip
            row["layers"] += g.num_layers
            row["groups"] += 1
            row["padding_layers"] += layout.group_size - g.num_layers
            row["bytes_per_token"] += n * g.num_layers * g.spec.token_bytes()
            reserved = g.blocks_reserved(self.max_seq_len, self.max_num_batched_tokens)
            row["reserved_bytes_per_request"] += n * reserved * layout.block_bytes
        return list(rows.values())

    def kv_table(self) -> str:
        """The KV layout in aligned text: one row per kind of layer."""
        header = ["layers", "kind", "vLLM groups", "bytes/token", "reserved at full length"]
        rows = [
            [
                f"{r['layers']}",
                r["what"],
                f"{r['groups']} (+{r['padding_layers']} padding)"
                if r["padding_layers"]
                else f"{r['groups']}",
                f"{r['bytes_per_token']:,.0f}",
                _size(r["reserved_bytes_per_request"]),
            ]
            for r in self.kv_groups
        ]
        widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
        return "\n".join(
            "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in
                      enumerate(zip(row, widths, strict=True))).rstrip()
            for row in [header, *rows]
        )  # fmt: skip

    def _kv_line(self) -> str | None:
        """The layout in words, for a model that is not one full-attention group."""
        if self.capacity.layout is None:
            return None
        rows = self.kv_groups
        parts = [f"{r['layers']} layers of {r['what']}" for r in rows]
        layout = self.capacity.layout
        pad = f", {layout.padding_layers} padding" if layout.padding_layers else ""
        reserved = sum(r["reserved_bytes_per_request"] for r in rows)
        return (
            f"KV layout (as vLLM v1): {'; '.join(parts)}; {len(layout.groups)} groups of "
            f"{layout.group_size} layers{pad}, blocks of {layout.block_size} tokens; a request of "
            f"{self.max_seq_len:,} tokens reserves {_size(reserved)} "
            f"({self.capacity.reserve_blocks:,} blocks of the pool's {self.capacity.num_blocks:,})."
        )

    @property
    def log_check(self) -> dict | None:
        """With a vLLM log: the blocks this plan counts against the ones the log printed.

        ``predicted_blocks`` is the count from the log's memory (its profile, else its printed
        KV cache size: None when it printed neither); ``error`` compares it with the printed
        blocks. ``max_concurrency`` is vLLM's figure from the printed blocks: blocks x
        block_size / max_model_len. ``start_failure``: the logged server would not start.
        """
        log = self.vllm_log
        if log is None:
            return None
        printed = log.num_gpu_blocks
        if printed is None and log.printed_tokens is not None:
            printed = log.printed_tokens // self.block_size
        source = self.log_capacity_source
        if source in ("profile", "budget"):
            predicted = self.capacity.num_blocks
        elif log.kv_cache_memory_gib is not None:  # one GPU's share of a block's bytes
            predicted = int(
                log.kv_cache_memory_gib * GiB // (self.capacity.block_bytes / self.num_gpus)
            )
        else:
            predicted = None
        max_len = log.logged_max_model_len
        failure = self.log_start_failure
        return {
            "capacity_from": source,
            "predicted_blocks": predicted,
            "printed_blocks": printed,
            "error": None if not printed or predicted is None else predicted / printed - 1,
            "max_concurrency": (
                None if not printed or not max_len else printed * self.block_size / max_len
            ),
            "start_failure": None
            if failure is None
            else {
                **dataclasses.asdict(failure),
                "shortfall_tokens": failure.shortfall_tokens,
                "shortfall_blocks": failure.shortfall_blocks,
                "max_concurrency": failure.max_concurrency,
                "kv_bytes_short_per_gpu": self._kv_bytes_short(),
            },
            "found": {
                k: v
                for k, v in {**log.to_dict(), "weights_gib": log.weights_gib}.items()
                if v not in (None, (), []) and k not in ("missing", "notes")
            },
            "missing": list(log.missing),
        }

    def _kv_bytes_short(self) -> float | None:
        """KV memory one GPU lacked to start the logged server: its missing blocks' bytes."""
        failure = self.log_start_failure
        if failure is None:
            return None
        return failure.shortfall_blocks * self.capacity.block_bytes / self.num_gpus

    def log_report(self) -> str | None:
        """What the log said, what it did not, and the blocks predicted from it, in lines."""
        check = self.log_check
        if check is None:
            return None
        log = self.vllm_log
        engine = " ".join(x for x in (log.engine, log.version and f"v{log.version}") if x)
        found = "; ".join(
            f"{label} {check['found'][key]:,}{unit}"
            if isinstance(check["found"][key], int)
            else f"{label} {check['found'][key]}{unit}"
            for key, label, unit in _LOG_FIELDS
            if key in check["found"]
        )
        lines = [f"From the vLLM log{f' ({engine})' if engine else ''}: {found}."]
        if check["missing"]:
            lines.append(f"Not in the log: {', '.join(check['missing'])}.")
        for note in (*self.log_notes, *log.notes):
            lines.append(f"Note: {note}.")
        predicted, printed = check["predicted_blocks"], check["printed_blocks"]
        if check["capacity_from"] in ("profile", "budget"):
            line = f"Blocks predicted from its memory: {predicted:,}"
            if printed:
                line += f"; the log printed {printed:,} ({check['error']:+.2%})"
        elif check["capacity_from"] == "printed":
            line = (
                f"Capacity as the log measured it: {printed:,} blocks of {self.block_size} "
                f"({printed * self.block_size:,} token slots), not predicted"
            )
            if predicted is not None:
                line += (
                    f"; its KV cache size ({log.kv_cache_memory_gib:g} GiB) holds {predicted:,} "
                    f"({check['error']:+.2%}: the size is rounded)"
                )
        else:
            line = f"Blocks from the KV cache size it printed: {predicted:,} (it printed none)"
        if check["max_concurrency"] is not None and check["capacity_from"] != "profile":
            line += (
                f"; maximum concurrency {check['max_concurrency']:.2f}x for "
                f"{log.logged_max_model_len:,} tokens per request (blocks x block size / "
                "max_model_len, as vLLM counts it)"
            )
        lines.append(line + ".")
        failure = self.log_start_failure
        if failure is not None:
            said = f' (vLLM: "{failure.refusal}")' if failure.refusal else ""
            short = self._kv_bytes_short()
            per_gpu_total = self.gpu.memory_bytes
            lines.append(
                f"The logged server would not start{said}: its KV cache held "
                f"{failure.token_slots:,} token slots ({failure.num_blocks:,} blocks of "
                f"{failure.block_size}), {failure.shortfall_tokens:,} short of one request of "
                f"max_model_len {failure.max_model_len:,} ({failure.max_concurrency:.2f}x). It "
                f"needed {failure.shortfall_blocks:,} more blocks ({short / GiB:.2f} GiB more KV "
                f"memory per GPU: gpu_memory_utilization "
                f"{self.gpu_memory_utilization + short / per_gpu_total:.3f} or more on this GPU), or "
                f"max_model_len at most {failure.longest_request:,}."
            )
        return "\n".join(lines)

    @property
    def kv_cache_bytes(self) -> float:
        return self.capacity.kv_cache_bytes

    @property
    def max_seq_len(self) -> int:
        return self.capacity.max_seq_len

    @property
    def block_size(self) -> int:
        return self.capacity.block_size

    @property
    def price_per_gpu_hour(self) -> float | None:
        return self.gpu.price_per_hour

    @property
    def paged(self) -> PolicyEstimate:
        return self.policies["paged"]

    @property
    def contiguous(self) -> PolicyEstimate:
        return self.policies["contiguous"]

    @property
    def oracle(self) -> PolicyEstimate:
        """The best contiguous booking (Orca-Oracle: each request books its exact length)."""
        return self.policies["contiguous-oracle"]

    @property
    def concurrency_gain(self) -> float:
        """Requests at once, paged over max-length booking (Orca-Max)."""
        return self.paged.concurrency / self.contiguous.concurrency

    @property
    def concurrency_gain_vs_max_length(self) -> float:
        """The same as :attr:`concurrency_gain`: paged over max-length booking."""
        return self.concurrency_gain

    @property
    def concurrency_gain_vs_oracle(self) -> float:
        """Requests at once, paged over the best contiguous booking (Orca-Oracle): the fair
        comparison (about 2x), since every engine in use pages already."""
        return self.paged.concurrency / self.oracle.concurrency

    @property
    def throughput_gain(self) -> float:
        """Tokens per second (and so cost per token, inverted), paged over Orca-Max."""
        return self.paged.tokens_per_s / self.contiguous.tokens_per_s

    @property
    def throughput_gain_vs_oracle(self) -> float:
        """Tokens per second, paged over the best contiguous booking."""
        return self.paged.tokens_per_s / self.oracle.tokens_per_s

    @property
    def capped(self) -> bool:
        """Whether ``max_num_seqs``, not memory, limits even max-length booking."""
        return self.max_num_seqs is not None and self.contiguous.concurrency >= self.max_num_seqs

    @property
    def tokens_per_user(self) -> float:
        """Generated tokens per second each request gets, paged (the roofline's figure)."""
        return self.paged.tokens_per_s_per_request

    @property
    def slow_for_users(self) -> bool:
        """Whether each paged request gets fewer than :data:`SLOW_TOKENS_PER_USER` tokens/s."""
        return self.tokens_per_user < SLOW_TOKENS_PER_USER

    def speed_at(self, concurrency: float) -> float:
        """Generated tokens per second each request gets with ``concurrency`` running (the plan's
        step-time model, each request's prefill paid). Falls as ``concurrency`` grows."""
        return _speed_at(self._step_time, self.workload, _number("concurrency", concurrency))

    def max_requests_for_speed(self, min_tokens_per_user: float) -> int:
        """The most requests at once that each still get ``min_tokens_per_user`` tokens/s under
        the plan's step-time model (0 when not even one request alone does)."""
        speed = _number("min_tokens_per_user", min_tokens_per_user)
        return _max_requests_for_speed(self._step_time, self.workload, speed)

    def step_time(self) -> PlanStepTime:
        """The cost model behind the plan, for ``kvlab.serving.simulate(step_time=...)``."""
        return self._step_time

    def table(self) -> list[dict]:
        """One row per cache policy (raw numbers; see :class:`PolicyEstimate` for units)."""
        keys = (
            "cache",
            "system",
            "concurrency",
            "memory_holding_tokens",
            "tokens_per_s",
            "tokens_per_s_per_request",
            "decode_tokens_per_s",
            "cost_per_million_tokens",
            "cost_per_million_tokens_realistic",
            "gpus_needed",
            "gpus_needed_realistic",
            "gpus_for_users",
        )
        return [{k: getattr(est, k) for k in keys} for est in self.policies.values()]

    # --- what vLLM needs to run it ---------------------------------------------------------------
    def vllm_flags(self) -> dict[str, str]:
        """The ``vllm serve`` flags that realise this plan, flag -> value (strings).

        ``--max-num-seqs`` is the plan's cap; without one, the requests paging fits at once
        (never more than ``--max-num-batched-tokens``, which vLLM requires). ``--kv-cache-dtype`` appears when
        the cache is not the model's dtype; ``--max-num-batched-tokens`` is the step the memory
        was sized for (vLLM's profiling run).
        """
        flags = {
            "--tensor-parallel-size": str(self.num_gpus),
            "--gpu-memory-utilization": f"{self.gpu_memory_utilization:g}",
            "--max-model-len": str(self.max_seq_len),
            "--max-num-seqs": str(self.max_num_seqs or math.ceil(self.paged.concurrency)),
            "--block-size": str(self.block_size),
        }
        if self.kv_cache_dtype != "auto":
            flags["--kv-cache-dtype"] = self.kv_cache_dtype
        if self.max_num_batched_tokens is not None:
            flags["--max-num-batched-tokens"] = str(self.max_num_batched_tokens)
        return flags

    def vllm_command(self) -> str:
        """``vllm serve MODEL`` with :meth:`vllm_flags` (MODEL: the preset's Hugging Face
        repository, else the spec's name when it is one, else the word MODEL to replace)."""
        name = self.model.name
        repo = getattr(self.model, "hf_repo", None) or HF_REPOS.get(name)
        repo = repo or (name if "/" in name else "MODEL")  # MODEL: no repository known
        flags = " ".join(f"{flag} {value}" for flag, value in self.vllm_flags().items())
        return f"vllm serve {repo} {flags}"

    # --- in words --------------------------------------------------------------------------------
    @property
    def setup(self) -> str:
        """The set-up in a line: model, GPUs, workload, context."""
        gpus = f"{self.num_gpus} x {self.gpu.name}" if self.num_gpus > 1 else self.gpu.name
        return (
            f"{self.model.name} on {gpus}, {self.workload.description}, requests up to "
            f"{self.max_seq_len:,} tokens"
        )

    def cost_range(self, est: PolicyEstimate | None = None) -> str | None:
        """``"$a-$b"`` per million generated tokens (the roofline bound, then
        :data:`REALISTIC_FRACTION` of it); None without a price."""
        est = est or self.paged
        if est.cost_per_million_tokens is None:
            return None
        return f"${est.cost_per_million_tokens:,.3f}–${est.cost_per_million_tokens_realistic:,.3f}"

    def _cap_line(self) -> str | None:
        cap, source = self.max_num_seqs, self.max_num_seqs_source
        if source == "none":
            return (
                "No cap on requests at once (max_num_seqs 0): memory is the limit, and a step's "
                f"tokens (max_num_batched_tokens={self.max_num_batched_tokens:,}: one per running "
                "request)."
            )
        if source == "vllm-default":
            return (
                f"At most {cap:,} requests at once: vLLM's default max_num_seqs here (it picks "
                f"{VLLM_MAX_NUM_SEQS_LARGE_GPU:,} on GPUs of 70 GiB or more other than the A100, "
                f"{VLLM_MAX_NUM_SEQS} on the rest)."
            )
        if source == "min-tokens-per-user":
            return (
                f"At most {cap:,} requests at once, so that each gets at least "
                f"{self.min_tokens_per_user:,.0f} tokens/s at the roofline (more at once would "
                f"slow every user below it); an engine at {REALISTIC_FRACTION:.0%} of the roofline "
                f"gives them about {self.min_tokens_per_user * REALISTIC_FRACTION:,.0f}: ask for "
                f"{self.min_tokens_per_user / REALISTIC_FRACTION:,.0f} to be sure of it there."
            )
        return f"At most {cap:,} requests at once (max_num_seqs given)."

    def _speed_line(self) -> str | None:
        want = self.min_tokens_per_user
        if want is not None and self.speed_cap == 0:
            alone = self.speed_at(1)
            return (
                f"No number of requests at once gives each user {want:,.0f} tokens/s here: one "
                f"request alone gets {alone:,.1f} tokens/s, because every token reads all "
                f"{_gib(self.weights_bytes)} of weights. Use more GPUs per copy (tensor parallel), "
                "faster GPUs or a smaller (or FP8) model; the plan below is not capped for speed."
            )
        if self.slow_for_users:
            hint = self.max_requests_for_speed(20)
            fix = (
                f" At 20 tokens/s each, at most {hint:,} requests fit at once "
                "(min_tokens_per_user=20)."
                if hint
                else " Not even one request alone reaches 20 tokens/s here."
            )
            return (
                f"Too slow for a person: each request gets {self.tokens_per_user:,.1f} tokens/s "
                f"paged, below {SLOW_TOKENS_PER_USER:.0f} tokens/s (people read about 5 to 7 "
                f"tokens a second).{fix}"
            )
        return None

    def _users_line(self) -> str | None:
        if self.users is None:
            return None
        speed = (
            f" at {self.min_tokens_per_user:,.0f} tokens/s or more each"
            if self.min_tokens_per_user and self.speed_cap
            else ""
        )
        if self.min_tokens_per_user and self.speed_cap == 0:
            return (
                f"{self.users:,} users at {self.min_tokens_per_user:,.0f} tokens/s each: not "
                "reachable on this set-up, at any number of GPUs (see above)."
            )
        parts = [
            f"{_gpus_words(est.gpus_for_users)} {label}"
            for est, label in (
                (self.paged, "paged"),
                (self.oracle, "with the best contiguous booking"),
                (self.contiguous, "with max-length booking"),
            )
        ]
        copies = self.paged.replicas_for_users
        return (
            f"For {self.users:,} users at once{speed}: {parts[0]} ({copies:,} "
            f"{'copy' if copies == 1 else 'copies'} of {self.num_gpus}), {parts[1]}, {parts[2]} "
            "(at the roofline)."
        )

    def _cost_line(self) -> str | None:
        paged = self.paged
        if paged.cost_per_million_tokens is None and paged.gpus_needed is None:
            return None
        bits = []
        if paged.cost_per_million_tokens is not None:
            bits.append(
                f"{self.cost_range(paged)} per million generated tokens paged "
                f"({self.cost_range(self.contiguous)} with max-length booking)"
            )
        if paged.gpus_needed is not None:
            bits.append(
                f"{paged.gpus_needed:,}–{paged.gpus_needed_realistic:,} GPUs paged for "
                f"{self.target_tokens_per_s:,.0f} tokens/s"
            )
        return (
            "Ranges: "
            + "; ".join(bits)
            + f". The first figure is the roofline's (data-sheet bandwidth and FLOP/s), the second "
            f"a realistic engine at {REALISTIC_FRACTION:.0%} of it (the course's own paged "
            "attention kernel reaches 68–85% of an H200's bandwidth, alone and at its best)."
        )

    @property
    def summary(self) -> str:
        """The plan in words, for someone who will not read the table."""
        cap = self.capacity
        lines = [
            self.setup + ".",
            f"Memory: {_gib(self.kv_cache_bytes)} for the KV cache after {_gib(self.weights_bytes)} "
            f"of weights and {_gib(self.overhead_bytes)} of overhead{self._overhead_source()}: "
            f"{cap.token_slots:,} token slots, room for {cap.max_concurrency:.2f} requests of "
            "full length.",
        ]
        if self.memory is not None and self.memory.spread:
            lines.append(f"How sure: {self.memory.spread}.")
        kv_line = self._kv_line()
        if kv_line:
            lines.append(kv_line)
        w = self.workload
        if w.prefix_hit_rate:
            lines.append(
                f"Prefix cache: {w.prefix_hit_rate:.0%} of prompt tokens served from it (an input: "
                f"measure yours), so a request computes {w.computed_prompt:,.0f} of its "
                f"{w.mean_prompt:,.0f} prompt tokens; the KV memory it holds is the same."
            )
        report = self.log_report()
        if report:
            lines.append(report)
        for line in (self._speed_line(), self._cap_line()):
            if line:
                lines.append(line)
        for est, label in (
            (self.paged, "Paged (vLLM)"),
            (self.oracle, "Best contiguous booking (Orca, oracle)"),
            (self.contiguous, "Max-length booking (Orca)"),
        ):
            line = (
                f"{label}: about {est.concurrency:,.0f} "
                f"{'request' if round(est.concurrency) == 1 else 'requests'} at once, "
                f"{est.tokens_per_s:,.0f} "
                f"generated tokens/s in all ({est.tokens_per_s_per_request:,.0f} per request; "
                f"{est.memory_holding_tokens:.0%} of the KV memory holds tokens)"
            )
            if est.cost_per_million_tokens is not None:
                line += f", {self.cost_range(est)} per million generated tokens"
            if est.gpus_needed is not None:
                gpus = "GPU" if est.gpus_needed == 1 else "GPUs"
                line += f", {est.gpus_needed:,} {gpus} for {self.target_tokens_per_s:,.0f} tokens/s"
                if est.replicas_needed > 1:  # a fleet: replicas of num_gpus each
                    line += f" ({est.replicas_needed:,} replicas of {self.num_gpus})"
            lines.append(line + ".")
        for line in (self._users_line(), self._verdict(), self._cost_line()):
            if line:
                lines.append(line)
        command = self.vllm_command()
        where = (
            f" (MODEL: {self.model.name}'s repository or folder)" if " MODEL " in command else ""
        )
        lines.append(f"To run it: {command}{where}")
        price = (
            f"${self.price_per_gpu_hour:.2f} per GPU-hour (an assumption: edit it)"
            if self.price_per_gpu_hour is not None
            else "no price given"
        )
        lines.append(
            f"Assumptions: {price}; tokens/s from the roofline (peak bandwidth and FLOP/s: real "
            f"engines reach a fraction of them, {REALISTIC_FRACTION:.0%} assumed for the ranges); "
            "every request waiting (a busy server)."
        )
        return "\n".join(lines)

    def _overhead_source(self) -> str:
        source = None if self.memory is None else self.memory.source
        return {
            "vllm-log": " (measured by the vLLM log)",
            "given": " (given)",
            "predicted": f" (predicted for {self.max_num_batched_tokens:,} tokens a step)",
            "assumed": " (assumed: 2 GiB per GPU)",
        }.get(source, "")

    def _verdict(self) -> str:
        """The bottom line: against the best contiguous booking first, then max-length booking,
        then what a team still decides (every engine in use pages already)."""
        gain, speed = self.concurrency_gain, self.throughput_gain
        levers = (
            " vLLM, SGLang, TensorRT-LLM and TGI all page already: what a team still chooses is "
            "max_num_seqs (requests at once), gpu_memory_utilization, the context length, FP8 "
            "weights or KV cache, and prefix caching."
        )
        if gain < 0.95:
            return (
                f"Paging serves fewer requests at once here ({gain:.2f}x): blocks of "
                f"{self.block_size} tokens waste more than max-length booking on these requests; "
                "use smaller blocks." + levers
            )
        if gain < 1.05:
            why = (
                f"max_num_seqs={self.max_num_seqs} caps every cache, so the KV memory is mostly "
                "idle"
                if self.capped
                else "the requests book nearly max_seq_len whatever the cache"
            )
            return f"Paging changes little on this set-up: {why}." + levers
        oracle = self.concurrency_gain_vs_oracle
        paged = self.paged
        cap = self.max_num_seqs
        if cap is not None and paged.concurrency >= cap and self.oracle.concurrency >= cap:
            free = 1 - paged.concurrency * paged.footprint_tokens / self.capacity.token_slots
            line = (
                f"max_num_seqs={cap:,} caps paging and the best contiguous booking alike here, "
                f"so paging's gain is only against booking every request its full "
                f"{self.max_seq_len:,} tokens: {gain:.1f}x as many requests at once ({free:.0%} "
                "of the KV memory stays free for longer requests or a prefix cache)"
            )
        else:
            line = (
                f"Paging fits {oracle:.1f}x as many requests at once as the best contiguous "
                "booking (an oracle that knows every answer's length in advance, which no system "
                f"can), and {gain:.1f}x as many as booking every request its full "
                f"{self.max_seq_len:,} tokens"
            )
            if cap is not None and paged.concurrency >= cap:
                free = 1 - paged.concurrency * paged.footprint_tokens / self.capacity.token_slots
                line += (
                    f" (capped at {cap:,} at once: {free:.0%} of the KV memory stays free for "
                    "longer requests or a prefix cache)"
                )
        if speed < 1.05:
            line += (
                f". It gives no more tokens per second: the GPUs' {_LIMITS[paged.bound]} is "
                "already the limit with max-length booking, so the extra requests share the same "
                "tokens/s (each is served more slowly) and a token costs the same"
            )
        else:
            line += (
                f"; that is {self.throughput_gain_vs_oracle:.1f}x and {speed:.1f}x the tokens per "
                "second on the same GPUs"
            )
            if self.price_per_gpu_hour:
                line += f", so a token costs {1 - 1 / speed:.0%} less than with max-length booking"
        return line + "." + levers

    def _formatted_rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["cache", "system", "requests at once", "KV holding tokens", "tokens/s"]
        header += ["each", "$ per M generated", "GPUs for target"]
        if self.users is not None:
            header.append(f"GPUs for {self.users:,} users")
        rows = []
        for est in self.policies.values():
            row = [
                est.cache,
                est.system,
                f"{est.concurrency:,.1f}",
                f"{est.memory_holding_tokens:.0%}",
                f"{est.tokens_per_s:,.0f}",
                f"{est.tokens_per_s_per_request:,.1f}",
                "-"
                if est.cost_per_million_tokens is None
                else f"{est.cost_per_million_tokens:,.3f}–{est.cost_per_million_tokens_realistic:,.3f}",
                "-"
                if est.gpus_needed is None
                else f"{est.gpus_needed:,}–{est.gpus_needed_realistic:,}",
            ]
            if self.users is not None:
                row.append("-" if est.gpus_for_users is None else f"{est.gpus_for_users:,}")
            rows.append(row)
        return header, rows

    def to_markdown(self) -> str:
        """The table in Markdown."""
        header, rows = self._formatted_rows()
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)

    def text_table(self) -> str:
        """The table in plain aligned text."""
        header, rows = self._formatted_rows()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

        def fmt(row):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            return "  ".join(cells).rstrip()

        return "\n".join([fmt(header), *(fmt(r) for r in rows)])

    def __str__(self) -> str:
        text = self.summary + "\n\n" + self.text_table()
        if self.capacity.layout is not None:  # a model of several kinds of layer
            text += "\n\n" + self.kv_table()
        return text

    def to_dict(self) -> dict:
        """Everything as plain JSON-able values."""
        return {
            "setup": self.setup,
            "inputs": {
                "model": self.model.name,
                "gpu": self.gpu.name,
                "num_gpus": self.num_gpus,
                "gpu_memory_bytes": self.gpu.memory_bytes,
                "gpu_memory_gib": self.gpu.memory_bytes / GiB,
                "hbm_bytes_per_s": self.gpu.hbm_bytes_per_s,
                "peak_flops": self.gpu.peak_flops,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "weights_bytes": self.weights_bytes,
                "overhead_bytes": self.overhead_bytes,
                "workload": self.workload.name,
                "max_seq_len": self.max_seq_len,
                "block_size": self.block_size,
                "price_per_gpu_hour": self.price_per_gpu_hour,
                "target_tokens_per_s": self.target_tokens_per_s,
                "max_num_seqs": self.max_num_seqs,
                "max_num_seqs_source": self.max_num_seqs_source,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "kv_cache_dtype": self.kv_cache_dtype,
                "min_tokens_per_user": self.min_tokens_per_user,
                "users": self.users,
            },
            "capacity": {
                "kv_cache_bytes": self.kv_cache_bytes,
                "bytes_per_token": self.capacity.bytes_per_token,
                "num_blocks": self.capacity.num_blocks,
                "token_slots": self.capacity.token_slots,
                "max_concurrency": self.capacity.max_concurrency,
                "reserve_blocks": self.capacity.reserve_blocks,
            },
            "kv_groups": self.kv_groups,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "vllm_log": self.log_check,
            "workload": self.workload.to_dict(),
            "policies": [dataclasses.asdict(est) for est in self.policies.values()],
            "concurrency_gain": self.concurrency_gain,
            "throughput_gain": self.throughput_gain,
            "concurrency_gain_vs_oracle": self.concurrency_gain_vs_oracle,
            "throughput_gain_vs_oracle": self.throughput_gain_vs_oracle,
            "tokens_per_user": self.tokens_per_user,
            "slow_for_users": self.slow_for_users,
            "speed_cap": self.speed_cap,
            "realistic_fraction": REALISTIC_FRACTION,
            "vllm_flags": self.vllm_flags(),
            "vllm_command": self.vllm_command(),
            "summary": self.summary,
        }


def _gpus_words(n: int) -> str:
    return f"{n:,} GPU" if n == 1 else f"{n:,} GPUs"


def in_words(message: str, names: dict[str, str]) -> str:
    """An error message with the API's argument names replaced by what a user typed (a command's
    flags, a form's labels)."""
    for name, said in names.items():
        message = re.sub(rf"\b{name}\b", said, message)
    return message


def _gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"


def _size(n: float) -> str:
    """Bytes in GiB, or MiB under one GiB (a request's few state blocks)."""
    return _gib(n) if n >= GiB else f"{n / 2**20:,.1f} MiB"


def plan(
    model: ModelSpec | str,
    gpu: GPU | str,
    *,
    num_gpus: int | None = None,
    gpu_memory_utilization: float | None = None,
    weights_bytes: float | None = None,
    overhead_bytes: float | None = None,
    workload="sharegpt",
    max_seq_len: int | None = None,
    block_size: int | None = None,
    price_per_gpu_hour: float | None = None,
    target_tokens_per_s: float | None = None,
    max_num_seqs: int | None = None,
    min_tokens_per_user: float | None = None,
    users: int | None = None,
    gpu_memory_gib: float | None = None,
    max_num_batched_tokens: int | None = None,
    kv_cache_dtype: str | None = None,
    vllm_log: VllmLog | str | None = None,
    prefix_hit_rate: float = 0.0,
) -> Plan:
    """Capacity, throughput and cost of serving ``model`` on ``num_gpus`` x ``gpu``, per cache.

    ``model``: a :class:`~kvlab.models.ModelSpec` or a preset's name ("Llama-3-8B"). ``gpu``: a
    :class:`~kvlab.perf.gpus.PricedGPU`, any :class:`~kvlab.perf.roofline.GPU` or a catalogue name
    ("H100-80GB"; see ``kvlab.perf.gpus.CATALOGUE``). ``num_gpus`` GPUs serve one copy of the model,
    tensor parallel. ``weights_bytes`` defaults to ``num_params x dtype_bytes`` (give it for a
    quantised model), ``overhead_bytes`` (all GPUs together: activations, non-torch memory) is
    predicted (below). ``workload``: ``"sharegpt"``, ``"alpaca"`` or a list of
    :class:`~kvlab.serving.workload.Request` (read as a distribution of lengths: the plan is for a busy
    server with such requests always waiting, however few the list). ``max_seq_len`` (prompt +
    output) defaults to the model's
    context. ``price_per_gpu_hour`` overrides the catalogue's assumed price. ``target_tokens_per_s``
    (generated tokens per second, all users together) sizes ``gpus_needed``. ``max_num_seqs`` caps
    the requests running at once (vLLM's ``--max-num-seqs``); None takes vLLM's own default for the
    GPU (:func:`vllm_default_max_num_seqs`: 1024 or 256), 0 means no cap (memory is the only
    limit). ``min_tokens_per_user`` (tokens/s each request must get) lowers the cap to the most
    requests at once that still leave each that speed under the plan's step-time model
    (:meth:`Plan.max_requests_for_speed`); ``users`` (that many requests at once, each at that
    speed, or at whatever the plan gives) sizes ``gpus_for_users``. ``gpu_memory_gib`` replaces
    the GPU's memory (a card not in the catalogue, or the total your vLLM log prints): its
    bandwidth, FLOP/s and price stay those of ``gpu`` (:func:`kvlab.perf.gpus.with_memory`).
    ``prefix_hit_rate`` (0 to <1): the share of prompt tokens a prefix cache serves, so not
    computed (measure it, or take it from :func:`kvlab.serving.simulate_fleet` behind a
    prefix-aware router); the KV memory a request holds is unchanged.
    ``kv_cache_dtype``: ``"auto"`` (the model's dtype) or ``"fp8"`` (one byte per element, as
    vLLM's ``--kv-cache-dtype fp8``). Without ``overhead_bytes`` the overhead is predicted from the
    model's MLP width and ``max_num_batched_tokens`` (the profiling run's tokens; default vLLM's:
    :func:`vllm_default_max_num_batched_tokens`) with its spread against real logs
    (:mod:`kvlab.perf.memory_budget`). ``vllm_log`` (a start-up log's text or a
    :class:`~kvlab.perf.vllm_log.VllmLog`) replaces all of that with what the log measured: the
    GPU's total memory, utilization, weights and overhead, and its tensor parallel size,
    ``max_model_len``, block size and KV dtype where it prints them; :attr:`Plan.log_check`
    compares the blocks the plan counts with the ones the log printed. A log without a memory
    profile still plans when it prints its KV cache's size, blocks or token slots: those are the
    capacity (measured), and what it lacks is said in the summary (the GPU's memory: the one
    named; weights: the model's; overhead: the log's, else predicted; utilization: implied).
    A log of a server that would not start (``max_model_len`` above the slots it had: vLLM's
    refusal, or ``blocks x block_size < max_model_len``) plans the longest request those slots
    hold unless ``max_seq_len`` is given, and :attr:`Plan.log_start_failure` says by how much it
    missed.
    Analytic: no simulation runs; the first call per workload and ``max_seq_len`` samples the
    workload (a fraction of a second), later calls are instant. See the module docstring for the
    model and :func:`compare_with_simulation` for the check.
    """
    spec = _resolve_model(model)
    card = _resolve_gpu(gpu)
    log = _resolve_log(vllm_log)
    log_notes: list[str] = []
    seq_len_from_log = log is not None and max_seq_len is None
    if log is not None:
        num_gpus = _log_tensor_parallel(log, spec, num_gpus, weights_bytes, log_notes)
        block_size = _from_log("block_size", block_size, log.block_size)
        gpu_memory_utilization = _from_log(
            "gpu_memory_utilization", gpu_memory_utilization, log.gpu_memory_utilization
        )
        logged_dtype = None if log.kv_cache_dtype is None else log.kv_cache_dtype.lower()
        kv_cache_dtype = _from_log(
            "kv_cache_dtype", None if kv_cache_dtype is None else kv_cache_dtype.strip().lower(),
            logged_dtype,
        )  # fmt: skip
        if gpu_memory_gib is not None and log.total_gpu_memory_gib is not None:
            raise ValueError(
                f"gpu_memory_gib={gpu_memory_gib!r} disagrees with the vLLM log, which measured "
                f"{log.total_gpu_memory_gib:g} GiB: leave gpu_memory_gib out"
            )
        if max_seq_len is None:  # "Maximum concurrency for N tokens per request": max_model_len
            max_seq_len = log.logged_max_model_len
        if max_num_batched_tokens is None:
            max_num_batched_tokens = log.max_num_batched_tokens
            if max_num_batched_tokens is None and log.engine == "V0" and max_seq_len:
                max_num_batched_tokens = max(max_seq_len, 2048)  # V0 without chunked prefill
    num_gpus = 1 if num_gpus is None else num_gpus
    block_size = 16 if block_size is None else block_size
    utilization_given = gpu_memory_utilization
    if gpu_memory_utilization is None:
        gpu_memory_utilization = 0.9
    if kv_cache_dtype is not None:
        spec = spec.with_kv_dtype(kv_cache_dtype)
    if gpu_memory_gib is not None:
        memory_gib = _number("gpu_memory_gib", gpu_memory_gib)
        _at_most("gpu_memory_gib", memory_gib, gpu_catalogue.MAX_MEMORY_GIB, "GiB (one GPU)")
        card = gpu_catalogue.with_memory(card, memory_gib)
    num_gpus = positive_int("num_gpus", num_gpus)
    _check_split(spec, num_gpus)
    util = _number("gpu_memory_utilization", gpu_memory_utilization)
    if util > 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1] (the share of each GPU's memory to use), "
            f"got {gpu_memory_utilization!r}"
        )
    max_seq_len = _resolve_max_seq_len(spec, max_seq_len, required=True)
    block_size = _check_block_size(block_size, max_seq_len)
    if price_per_gpu_hour is not None:
        price = _number("price_per_gpu_hour", price_per_gpu_hour, strict=False)
        card = with_price(
            card,
            _at_most("price_per_gpu_hour", price, MAX_PRICE_PER_GPU_HOUR, "dollars per GPU-hour"),
        )
    price = card.price_per_hour
    if target_tokens_per_s is not None:
        target_tokens_per_s = _at_most(
            "target_tokens_per_s",
            _number("target_tokens_per_s", target_tokens_per_s),
            MAX_TARGET_TOKENS_PER_S,
            "generated tokens/s",
        )
    if max_num_batched_tokens is None:
        max_num_batched_tokens = vllm_default_max_num_batched_tokens(card)
    else:
        max_num_batched_tokens = positive_int("max_num_batched_tokens", max_num_batched_tokens)
    if max_num_seqs is None:
        # vLLM's default, never more than a step's tokens (each running request needs one)
        max_num_seqs = min(vllm_default_max_num_seqs(card), max_num_batched_tokens)
        cap_source = "vllm-default"
    elif positive_int("max_num_seqs", max_num_seqs, minimum=0) == 0:
        max_num_seqs, cap_source = None, "none"
    elif max_num_seqs > max_num_batched_tokens:
        raise ValueError(
            f"max_num_seqs={max_num_seqs:,} is more than max_num_batched_tokens="
            f"{max_num_batched_tokens:,}: vLLM refuses to start (every running request needs a "
            "token of each step); raise max_num_batched_tokens or lower max_num_seqs"
        )
    else:
        cap_source = "given"
    if min_tokens_per_user is not None:
        min_tokens_per_user = _at_most(
            "min_tokens_per_user",
            _number("min_tokens_per_user", min_tokens_per_user),
            MAX_TOKENS_PER_USER,
            "tokens/s",
        )
    prefix_hit_rate = _number("prefix_hit_rate", prefix_hit_rate, strict=False)
    if not prefix_hit_rate < 1:
        raise ValueError(
            "prefix_hit_rate must be in [0, 1) (the share of prompt tokens served from a prefix "
            f"cache), got {prefix_hit_rate!r}"
        )
    if users is not None:
        users = positive_int("users", users)
        _at_most("users", users, MAX_USERS, "requests at once")

    # the weights and overhead in words: the argument's name only where the user passed it
    measured = failure = None
    if log is not None:
        failure = log.start_failure(spec, num_gpus)
        measured, notes = memory_budget.from_log(
            log, num_gpus, gpu_memory_bytes=card.memory_bytes, utilization=utilization_given,
            spec_weights_bytes=spec.weights_bytes, weights_bytes=weights_bytes,
            kv_bytes_per_token=kv_bytes_per_token_per_gpu(spec, num_gpus), block_size=block_size,
            predicted=lambda: memory_budget.predicted_overhead(
                spec, num_gpus, max_num_batched_tokens
            ),
        )  # fmt: skip
        log_notes += notes
    if weights_bytes is not None:
        weights = _number("weights_bytes", weights_bytes)
        weights_said = f"weights_bytes = {_gib(weights)}"
    elif measured is not None:
        weights = measured["weights_bytes"]
        weights_said = (
            f"the weights the log measured ({_gib(weights)})"
            if log.weights_gib is not None
            else f"{spec.name}'s weights ({_gib(weights)}; the log prints none)"
        )
    elif spec.num_params is None:
        raise ValueError(
            f"model {spec.name!r} has no num_params: pass weights_bytes (bytes of weights)"
        )
    else:
        weights = spec.num_params * spec.dtype_bytes
        weights_said = (
            f"{spec.name}'s weights ({spec.num_params / 1e9:.3g}B parameters x "
            f"{spec.dtype_bytes} bytes = {_gib(weights)})"
        )
    num_params = spec.num_params if spec.num_params is not None else weights / spec.dtype_bytes
    measured_kv = measured_blocks = None
    if measured is not None:
        del measured["weights_bytes"]
        measured_kv, measured_blocks = measured.pop("kv_cache_bytes"), measured.pop("num_blocks")
        if overhead_bytes is not None:
            overhead = _number("overhead_bytes", overhead_bytes, strict=False)
            measured.update(overhead_bytes=overhead, source="given")
            measured_kv = measured_blocks = None  # the KV cache is the rest of the budget again
        card = gpu_catalogue.with_memory(card, measured.pop("total_bytes") / num_gpus / GiB)
        util = measured.pop("utilization")
        budget = memory_budget.MemoryBudget(
            total_bytes=num_gpus * card.memory_bytes, utilization=util, weights_bytes=weights,
            num_gpus=num_gpus,
            **measured,
        )  # fmt: skip
        overhead_said = (
            f"the overhead the log measured ({_gib(budget.overhead_bytes)})"
            if budget.source == "vllm-log"
            else f"the {budget.source} overhead of {_gib(budget.overhead_bytes / num_gpus)} per GPU"
        )
    elif overhead_bytes is None:
        budget = memory_budget.MemoryBudget(
            total_bytes=num_gpus * card.memory_bytes, utilization=util, weights_bytes=weights,
            num_gpus=num_gpus,
            **memory_budget.predicted_overhead(spec, num_gpus, max_num_batched_tokens),
        )  # fmt: skip
        what = "predicted" if budget.source == "predicted" else "assumed"
        overhead_said = f"the {what} overhead of {_gib(budget.overhead_bytes / num_gpus)} per GPU"
    else:
        budget = memory_budget.MemoryBudget(
            total_bytes=num_gpus * card.memory_bytes, utilization=util, weights_bytes=weights,
            num_gpus=num_gpus,
            overhead_bytes=_number("overhead_bytes", overhead_bytes, strict=False),
            source="given",
        )  # fmt: skip
        overhead_said = f"overhead_bytes = {_gib(budget.overhead_bytes)}"
    overhead = budget.overhead_bytes
    memory = budget.total_bytes
    usable = budget.usable_bytes
    where = f"{num_gpus} x {card.name}" if num_gpus > 1 else f"one {card.name}"
    if weights >= memory:
        raise ValueError(
            f"{weights_said}: more than the GPU memory of {where} "
            f"({_gib(memory)}); raise num_gpus or pick a larger GPU"
        )
    # a log without a memory profile measured the KV cache itself: its size, else its blocks
    kv_bytes = budget.kv_cache_bytes if measured_kv is None else measured_kv
    if kv_bytes <= 0:
        raise ValueError(
            f"{weights_said} and {overhead_said} leave no "
            f"memory for the KV cache: {where} x gpu_memory_utilization {util:g} = "
            f"{_gib(usable)}; raise num_gpus or gpu_memory_utilization, or pick a larger GPU"
        )
    if spec.is_dense:
        # tensor parallel: each GPU keeps its share of the KV heads, at least one (copied beyond)
        bytes_per_token = spec.kv_bytes_per_token * num_gpus / min(num_gpus, spec.num_kv_heads)
        capacity = _capacity(kv_bytes, bytes_per_token, block_size, max_seq_len)
    else:  # windows, latents, states: vLLM v1's groups (kvlab.perf.kv_groups)
        capacity = _layout_capacity(
            spec, kv_bytes, block_size, max_seq_len, num_gpus, max_num_batched_tokens
        )
        bytes_per_token = capacity.bytes_per_token
    if measured_blocks is not None:  # the blocks the log printed, not a count from its memory
        capacity = dataclasses.replace(capacity, num_blocks=measured_blocks)
    longest = None if failure is None else min(failure.longest_request, capacity.token_slots)
    if seq_len_from_log and longest is not None and longest >= block_size:
        # the logged server would not start: plan the longest request it could have served
        max_seq_len = longest
        capacity = dataclasses.replace(capacity, max_seq_len=max_seq_len)
        if capacity.layout is not None:
            reserve = capacity.layout.blocks_reserved(max_seq_len, max_num_batched_tokens)
            capacity = dataclasses.replace(capacity, reserve_blocks=reserve)
        log_notes.append(
            f"planned for requests up to {max_seq_len:,} tokens, the longest that fit the logged "
            f"KV cache (it was started for {failure.max_model_len:,}); give max_seq_len to plan "
            "another length"
        )
    if capacity.layout is not None and capacity.num_blocks < capacity.reserve_blocks:
        raise ValueError(
            f"the KV cache ({_gib(kv_bytes)}) holds {capacity.num_blocks:,} blocks of its pool, "
            f"fewer than the {capacity.reserve_blocks:,} a request of max_seq_len="
            f"{max_seq_len:,} reserves: a request of full length could never run (vLLM "
            "refuses to start); lower max_seq_len or add memory"
        )
    if capacity.token_slots < max_seq_len and capacity.layout is None:
        raise ValueError(
            f"the KV cache ({_gib(kv_bytes)}) holds {capacity.token_slots:,} token slots, fewer "
            f"than max_seq_len={max_seq_len:,}: a request of full length could never run (vLLM "
            "refuses to start); lower max_seq_len or add memory"
        )
    stats = workload_stats(workload, max_seq_len=max_seq_len, block_size=block_size)
    if prefix_hit_rate:
        stats = dataclasses.replace(stats, prefix_hit_rate=prefix_hit_rate)

    step_time = PlanStepTime(
        weights_bytes=weights,
        kv_bytes_per_token=bytes_per_token,
        flops_per_token=2 * num_params,
        attention_flops_per_position=4 * spec.num_layers * spec.num_q_heads * spec.head_dim,
        hbm_bytes_per_s=num_gpus * card.hbm_bytes_per_s,
        peak_flops=num_gpus * card.peak_flops,
        pcie_bytes_per_s=num_gpus * 25e9,
    )
    speed_cap = None
    if min_tokens_per_user is not None:
        speed_cap = _max_requests_for_speed(step_time, stats, min_tokens_per_user)
    engine_cap = max_num_seqs
    if speed_cap:  # 0: no number of requests reaches the speed; the plan says so
        if max_num_seqs is None or speed_cap < max_num_seqs:
            max_num_seqs, cap_source = speed_cap, "min-tokens-per-user"
    slots = capacity.token_slots
    layout = capacity.layout
    policies = {}
    for cache in POLICIES:
        footprint = stats.footprint[cache]
        if layout is not None:
            # a hybrid: each request holds blocks of every group (a window at most its last
            # blocks, a state one); max-length booking reserves what vLLM reserves
            blocks = capacity.num_blocks
            if cache == "contiguous":
                running = float(math.floor(capacity.max_concurrency))
            elif cache == "paged":
                running = blocks / layout.blocks_for(footprint)
            else:
                running = max(1.0, ARENA_PACKING * blocks / layout.blocks_for(footprint))
            held = stats.held_tokens
            slots = held * blocks / layout.blocks_for(held)  # what memory_holding_tokens reads
        elif cache == "contiguous":
            running = float(slots // max_seq_len)
        elif cache == "paged":
            running = slots / footprint
        else:
            running = max(1.0, ARENA_PACKING * slots / footprint)
        # no cap still leaves a step's tokens: one per running request
        running = min(running, float(max_num_seqs or max_num_batched_tokens))
        policies[cache] = _estimate(
            cache,
            footprint,
            running,
            stats,
            slots,
            step_time,
            price,
            num_gpus,
            target_tokens_per_s,
            None if speed_cap == 0 else users,
        )
    return Plan(
        model=spec,
        gpu=card,
        num_gpus=num_gpus,
        gpu_memory_utilization=util,
        weights_bytes=weights,
        overhead_bytes=overhead,
        capacity=capacity,
        workload=stats,
        target_tokens_per_s=target_tokens_per_s,
        max_num_seqs=max_num_seqs,
        policies=policies,
        _step_time=step_time,
        max_num_seqs_source=cap_source,
        engine_max_num_seqs=engine_cap,
        min_tokens_per_user=min_tokens_per_user,
        speed_cap=speed_cap,
        users=users,
        memory=budget,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_log=log,
        kv_cache_dtype=_vllm_kv_dtype(spec, kv_cache_dtype),
        log_notes=tuple(log_notes),
        log_start_failure=failure,
    )


def _step_parts(step_time: PlanStepTime, stats: WorkloadStats) -> tuple[float, float, float, float]:
    """A step of B running requests, prefill of the B / E[output] that start included, takes
    ``max(c x B, m0 + m x B) + p x B`` seconds: returns (c, m0, m, p)."""
    ctx = stats.context_tokens
    c = step_time.compute_seconds(1, ctx)
    m0 = step_time.memory_seconds(0)
    m = step_time.memory_seconds(ctx) - m0
    p = (
        step_time.compute_seconds(stats.computed_prompt, stats.computed_attended)
        / stats.mean_output
    )
    return c, m0, m, p


def _speed_at(step_time: PlanStepTime, stats: WorkloadStats, running: float) -> float:
    """Generated tokens per second that each of ``running`` requests gets (prefill paid)."""
    c, m0, m, p = _step_parts(step_time, stats)
    return 1 / (max(c * running, m0 + m * running) + p * running)


def _max_requests_for_speed(step_time: PlanStepTime, stats: WorkloadStats, speed: float) -> int:
    """The most requests at once (an int) that each still get ``speed`` tokens/s; 0 if not even one
    does. Each request's speed falls as the batch grows, so this solves T(B) <= 1 / speed."""
    c, m0, m, p = _step_parts(step_time, stats)
    budget = 1 / speed
    if budget <= m0:
        return 0
    most = min(budget / (c + p), (budget - m0) / (m + p))
    return max(0, math.floor(most + 1e-9))


def _estimate(cache, footprint, running, stats, slots, step_time, price, num_gpus, target, users):
    ctx = stats.context_tokens
    compute = step_time.compute_seconds(running, running * ctx)
    memory = step_time.memory_seconds(running * ctx)
    step = max(compute, memory)
    # B / E[output] requests start per step; their prompts are computed on top (no overlap)
    starts = running / stats.mean_output
    prefill = starts * step_time.compute_seconds(stats.computed_prompt, stats.computed_attended)
    tokens_per_s = running / (step + prefill)
    cost = None if price is None else price * num_gpus / (tokens_per_s * 3600) * 1e6
    replicas = None if target is None else max(1, math.ceil(target / tokens_per_s - 1e-9))
    realistic = tokens_per_s * REALISTIC_FRACTION
    replicas_real = None if target is None else max(1, math.ceil(target / realistic - 1e-9))
    user_copies = None if users is None else max(1, math.ceil(users / running - 1e-9))
    return PolicyEstimate(
        cache=cache,
        system=PAPER_NAMES[cache],
        footprint_tokens=footprint,
        concurrency=running,
        memory_holding_tokens=running * stats.held_tokens / slots,
        step_seconds=step,
        bound="memory" if memory >= compute else "compute",
        decode_tokens_per_s=running / step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_request=tokens_per_s / running,
        cost_per_million_tokens=cost,
        replicas_needed=replicas,
        gpus_needed=None if replicas is None else replicas * num_gpus,
        cost_per_million_tokens_realistic=None if cost is None else cost / REALISTIC_FRACTION,
        gpus_needed_realistic=None if replicas_real is None else replicas_real * num_gpus,
        replicas_for_users=user_copies,
        gpus_for_users=None if user_copies is None else user_copies * num_gpus,
    )


# --- the check against the simulator --------------------------------------------------------


def _steady_state(result, warmup: float) -> tuple[float, float, int]:
    """Mean batch and tokens/s over the steps after ``warmup`` (a share) of the requests finished
    and before the queue emptied: the saturated server, without the start and the drain."""
    finished = sorted(seq.finish_time for seq in result.sequences)
    start = finished[min(len(finished) - 1, int(warmup * len(finished)))]
    ends = [*result.times[1:], result.end_time]
    batch = seconds = 0.0
    steps = 0
    for t, t_end, b, waiting in zip(result.times, ends, result.batch, result.waiting, strict=True):
        if t >= start and waiting > 0:
            batch += b
            seconds += t_end - t
            steps += 1
    if steps == 0:
        raise ValueError(
            "the simulated day never reached a steady state (the queue emptied before "
            f"{warmup:.0%} of the requests finished): simulate more requests"
        )
    return batch / steps, batch / seconds, steps


def compare_with_simulation(
    p: Plan,
    requests: list[Request] | None = None,
    *,
    num_requests: int | None = None,
    seed: int = 1,
    caches: tuple[str, ...] = POLICIES,
    warmup: float = 0.2,
) -> list[dict]:
    """Run :func:`kvlab.serving.simulate` on the plan's set-up and put its figures beside the plan's.

    Same memory (``capacity.token_slots``), ``max_seq_len``, ``block_size``, ``max_num_seqs`` and
    step-time model (:meth:`Plan.step_time`); ``requests`` (all arriving at once) default to
    ``num_requests`` fresh requests of the plan's named workload with ``seed`` (not the planner's
    own sample), ``num_requests`` to enough for a steady state (30 x the largest concurrency,
    at least 1,000). Figures are the steady state (after ``warmup`` of the requests finished,
    while others still wait). Returns a row per cache with ``planned_*``, ``simulated_*`` and
    ``*_error`` (planned / simulated - 1). Takes seconds for one GPU's worth of a 2048-token
    context; large set-ups simulate many requests (pass ``num_requests`` to bound it).
    """
    from kvlab.serving import simulate

    if not isinstance(p, Plan):
        raise TypeError(f"p must be a kvlab.perf.planner.Plan, got {p!r:.80}")
    for cache in caches:
        if cache not in POLICIES:
            raise ValueError(f"caches must be among {POLICIES}, got {cache!r}")
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup must be a share in [0, 1), got {warmup!r}")
    if requests is not None:
        if not isinstance(requests, list | tuple) or not all(
            isinstance(r, Request) for r in requests
        ):
            raise TypeError("requests must be a list of kvlab.serving.workload.Request")
        requests = [Request(r.prompt_len, r.output_len, 0.0) for r in requests]
    else:
        if p.workload.name not in WORKLOADS:
            raise ValueError("the plan's workload is a trace: pass the requests to simulate")
        if num_requests is None:
            most = max(p.policies[c].concurrency for c in caches)
            num_requests = max(1000, math.ceil(30 * most))
        num_requests = positive_int("num_requests", num_requests)
        generate = WORKLOADS[p.workload.name][0]
        requests = generate(num_requests, seed=seed, max_total=p.max_seq_len)
    rows = []
    for cache in caches:
        result = simulate(
            requests,
            cache=cache,
            kv_capacity_tokens=p.capacity.token_slots,
            max_seq_len=p.max_seq_len,
            block_size=p.block_size,
            max_batch=p.max_num_seqs,
            step_time=p.step_time(),
        )
        batch, tokens_per_s, steps = _steady_state(result, warmup)
        est = p.policies[cache]
        rows.append(
            {
                "cache": cache,
                "requests": len(requests),
                "steady_steps": steps,
                "planned_concurrency": est.concurrency,
                "simulated_concurrency": batch,
                "concurrency_error": est.concurrency / batch - 1,
                "planned_tokens_per_s": est.tokens_per_s,
                "planned_decode_tokens_per_s": est.decode_tokens_per_s,
                "simulated_tokens_per_s": tokens_per_s,
                "tokens_per_s_error": est.tokens_per_s / tokens_per_s - 1,
            }
        )
    return rows
