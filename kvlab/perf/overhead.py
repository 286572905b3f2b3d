"""The memory vLLM keeps out of the KV cache when no log says how much: predicted, with its spread.

Per GPU, vLLM's KV budget is ``total x gpu_memory_utilization - weights - activation peak -
non-torch memory``. Without a start-up log the last two must be predicted:

- activation peak: the profiling run pushes ``max_num_batched_tokens`` tokens through the
  model at once, so it grows with the tokens times the MLP's intermediate tensors (gate and up
  outputs, ``2 x intermediate_size / tp``, plus the hidden state), in the model's dtype; below a
  floor (about 1.3 GiB in the logs: sampler, logits of up to ``max_num_seqs`` sequences, the
  allocator's blocks) it does not shrink. ``max(floor, slope x tokens x dtype x (2 I / tp + H))``.
- non-torch memory (CUDA context, cuBLAS workspaces; NCCL buffers with tensor parallel): one
  constant per GPU, the median of the logs. No tensor-parallel extra: the two bundled TP logs
  disagree (0.30 GiB on 2 L40S, 3.58 GiB on 2 H100), and a fitted extra made the leave-one-out
  error of the TP log 44% against 1% without it (see the README's table).
- CUDA graphs are captured after the KV cache is sized (V0, and V1 before 0.21): outside the
  budget, but they must fit. A stated allowance, not fitted: no bundled log prints it.

:func:`fit_overhead` fits the floor, slope and non-torch constants to the bundled real logs
(:data:`kvlab.perf.vllm_log.BUNDLED_LOGS`); the constants below are its result, and the tests
refit so they cannot drift. Its spread is measured out of sample, by leave-one-out
(:func:`leave_one_out`: fit on every log but one, predict the one left out), and that is what
:func:`predict_overhead` reports; the in-sample error and the fixed 2 GiB's (no fitting, so
already out of sample) come with it, labelled.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

from kvlab.core.validate import positive_int
from kvlab.models.specs import ModelSpec
from kvlab.perf.vllm_log import BUNDLED_LOGS, BundledLog, GiB

# fitted by fit_overhead() on the bundled logs (tests/perf/test_vllm_log.py refits them)
ACTIVATION_FLOOR_GIB = 1.35
ACTIVATION_SLOPE = 1.69
NON_TORCH_GIB = 0.205
NON_TORCH_TP_EXTRA_GIB = 0.0  # not fitted: kept for callers; see the module's docstring
# |KV capacity error| over the logs with a printed KV size (tests recompute them): leave-one-out
# (what predict_overhead reports), in sample, and the fixed 2 GiB's
KV_ERROR_LOO = (0.118, 0.029)  # (max, median)
KV_ERROR_IN_SAMPLE = (0.077, 0.021)  # of the constants above
KV_ERROR_FIXED = (0.465, 0.043)
KV_ERROR_NUM_LOGS = 9
FITTED_TENSOR_PARALLEL = 2  # the most GPUs per copy among the fitted logs (the tests check)
CUDA_GRAPH_GIB = 0.5  # an allowance, not fitted (posted V1 logs show 0.1-0.7 GiB)
FIXED_OVERHEAD_GIB = 2.0  # the planner's assumption before this model, for comparison


def _mlp_token_gib(
    spec: ModelSpec, max_num_batched_tokens: int, tensor_parallel_size: int
) -> float:
    missing = [f for f in ("hidden_size", "intermediate_size") if getattr(spec, f) is None]
    if missing:
        raise ValueError(
            f"model {spec.name!r} has no {' or '.join(missing)}: the activation peak grows with "
            "the MLP width (give a spec from its config.json: kvlab.models.spec_from_hf_config)"
        )
    width = 2 * spec.intermediate_size / tensor_parallel_size + spec.hidden_size
    return max_num_batched_tokens * spec.dtype_bytes * width / GiB


@dataclass(frozen=True)
class OverheadFit:
    activation_floor_gib: float
    activation_slope: float
    non_torch_gib: float
    non_torch_tp_extra_gib: float
    num_logs: int


def _fit_logs(logs) -> list[BundledLog]:
    return [b for b in logs if b.fit and b.max_num_batched_tokens and b.read().has_profile]


def fit_overhead(logs=BUNDLED_LOGS) -> OverheadFit:
    """Least squares of ``max(floor, slope x x)`` on the logs' activation peaks (the split
    between floor and slope chosen by the smallest squared error), and the non-torch median
    (over every log, any tensor parallel size; ``non_torch_tp_extra_gib`` is 0)."""
    used = _fit_logs(logs)
    if len(used) < 2:
        raise ValueError("fit_overhead needs at least two logs with a memory profile")
    points = sorted(
        (
            _mlp_token_gib(b.spec, b.max_num_batched_tokens, b.tensor_parallel_size),
            b.read().activation_gib,
        )
        for b in used
    )
    best = None
    for k in range(1, len(points)):  # points[:k] on the floor, points[k:] on the slope
        floor = statistics.fmean(y for _, y in points[:k])
        slope = sum(x * y for x, y in points[k:]) / sum(x * x for x, _ in points[k:])
        error = sum((max(floor, slope * x) - y) ** 2 for x, y in points)
        if best is None or error < best[0]:
            best = (error, floor, slope)
    _, floor, slope = best
    non_torch = statistics.median(b.read().non_torch_memory_gib for b in used)
    return OverheadFit(floor, slope, non_torch, 0.0, len(used))


@dataclass(frozen=True)
class OverheadEstimate:
    """Predicted memory per GPU outside the KV cache, with the spread measured on real logs."""

    activation_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float  # outside vLLM's budget; reserve it when checking that a plan fits
    kv_error_max: float  # largest |KV capacity error|, leave-one-out over the logs (relative)
    kv_error_typical: float  # median |KV capacity error|, leave-one-out
    num_logs: int
    kv_error_in_sample: tuple[float, float] = KV_ERROR_IN_SAMPLE  # (max, median), fitted on all
    kv_error_fixed_2gib: tuple[float, float] = KV_ERROR_FIXED  # (max, median) of a fixed 2 GiB

    @property
    def overhead_bytes(self) -> float:
        """What vLLM subtracts from its budget besides the weights (per GPU)."""
        return self.activation_bytes + self.non_torch_bytes

    def __str__(self) -> str:
        return (
            f"overhead {self.overhead_bytes / GiB:.2f} GiB per GPU (activations "
            f"{self.activation_bytes / GiB:.2f}, non-torch {self.non_torch_bytes / GiB:.2f}; CUDA "
            f"graphs {self.cuda_graph_bytes / GiB:.2f} outside the budget): KV capacity "
            f"±{self.kv_error_max:.0%} (typically ±{self.kv_error_typical:.0%}) leave-one-out "
            f"from {self.num_logs} real logs (in sample ±{self.kv_error_in_sample[0]:.0%}; a "
            f"fixed 2 GiB ±{self.kv_error_fixed_2gib[0]:.0%})"
        )


def _overhead_gib(spec, max_num_batched_tokens, tensor_parallel_size, fit: OverheadFit):
    x = _mlp_token_gib(spec, max_num_batched_tokens, tensor_parallel_size)
    activation = max(fit.activation_floor_gib, fit.activation_slope * x)
    non_torch = fit.non_torch_gib + (fit.non_torch_tp_extra_gib if tensor_parallel_size > 1 else 0)
    return activation, non_torch


def kv_errors(fit: OverheadFit | None = None, logs=BUNDLED_LOGS) -> dict[str, tuple[float, float]]:
    """Per log with a profile and a printed KV size: (this model's, the fixed 2 GiB's) relative
    error of the KV capacity, predicted / printed - 1 (the log's own weights and budget used)."""
    fit = fit or _constants()
    out = {}
    for b in logs:
        log = b.read()
        if not (b.fit and log.has_profile and log.kv_cache_memory_gib and b.max_num_batched_tokens):
            continue
        budget = (  # total x utilization - weights
            log.kv_cache_bytes_from_profile() / GiB + log.activation_gib + log.non_torch_memory_gib
        )
        activation, non_torch = _overhead_gib(
            b.spec, b.max_num_batched_tokens, b.tensor_parallel_size, fit
        )
        printed = log.kv_cache_memory_gib
        out[b.name] = (
            (budget - activation - non_torch) / printed - 1,
            (budget - FIXED_OVERHEAD_GIB) / printed - 1,
        )
    return out


def leave_one_out(logs=BUNDLED_LOGS) -> dict[str, float]:
    """Per log with a printed KV size: the KV capacity error (predicted / printed - 1) of the
    model fitted on all the other logs, the log left out."""
    logs = tuple(logs)
    names = kv_errors(fit_overhead(logs), logs)
    return {
        name: kv_errors(fit_overhead([b for b in logs if b.name != name]), logs)[name][0]
        for name in names
    }


def spread(errors) -> tuple[float, float]:
    """(max, median) of the absolute relative errors."""
    values = [abs(e) for e in errors]
    if not values:
        raise ValueError("no errors to summarise")
    return max(values), statistics.median(values)


@functools.cache  # the logs are read once: a plan is instant after the first
def _constants() -> OverheadFit:
    return OverheadFit(
        ACTIVATION_FLOOR_GIB, ACTIVATION_SLOPE, NON_TORCH_GIB, NON_TORCH_TP_EXTRA_GIB,
        len(_fit_logs(BUNDLED_LOGS)),
    )  # fmt: skip


def predict_overhead(
    spec: ModelSpec,
    *,
    max_num_batched_tokens: int,
    tensor_parallel_size: int = 1,
    fit: OverheadFit | None = None,
) -> OverheadEstimate:
    """Activation peak, non-torch and CUDA-graph memory per GPU for ``spec`` served by vLLM.

    ``max_num_batched_tokens``: the tokens of the profiling run (V0 without chunked prefill:
    ``max(max_model_len, 2048)``; V1 and chunked prefill: the flag, 2048-16384 by default).
    ``fit``: constants of :func:`fit_overhead` on other logs (default: the bundled logs' fit),
    e.g. to predict a log from a fit that never saw it.
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec must be a kvlab.models.ModelSpec, got {type(spec).__name__}")
    tokens = positive_int("max_num_batched_tokens", max_num_batched_tokens)
    tp = positive_int("tensor_parallel_size", tensor_parallel_size)
    activation, non_torch = _overhead_gib(spec, tokens, tp, fit or _constants())
    return OverheadEstimate(
        activation * GiB,
        non_torch * GiB,
        CUDA_GRAPH_GIB * GiB,
        KV_ERROR_LOO[0],
        KV_ERROR_LOO[1],
        KV_ERROR_NUM_LOGS,
    )
