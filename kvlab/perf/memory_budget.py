"""Where a deployment's GPU memory goes before the KV cache gets the rest, and how sure that is.

vLLM sizes its cache as ``total x gpu_memory_utilization - weights - activation peak - non-torch
memory`` on each GPU. The weights follow from the model; the rest (the *overhead*) comes from one
of four places, best first:

- ``"vllm-log"``: a start-up log's memory profile (:func:`kvlab.perf.vllm_log.read_vllm_log`),
  measured on the user's own set-up: exact up to the log's rounding.
- ``"given"``: the caller's ``overhead_bytes``.
- ``"predicted"``: :func:`kvlab.perf.overhead.predict_overhead` from the model's MLP width and
  the profiling run's tokens, with the KV capacity error it makes on real logs.
- ``"assumed"``: a fixed :data:`DEFAULT_OVERHEAD_PER_GPU` when the model's shape is not known
  well enough to predict, with the error that fixed figure makes on the same logs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvlab.models import ModelSpec
from kvlab.perf import overhead as overhead_model
from kvlab.perf.gpus import GiB
from kvlab.perf.vllm_log import VllmLog

DEFAULT_OVERHEAD_PER_GPU = overhead_model.FIXED_OVERHEAD_GIB * GiB
SOURCES = ("vllm-log", "given", "predicted", "assumed")


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes of all GPUs together. ``kv_error_max``/``kv_error_typical``: the relative error of
    the KV capacity this overhead makes on ``num_logs`` real logs (None when measured or given)."""

    total_bytes: float
    utilization: float
    weights_bytes: float
    overhead_bytes: float
    source: str
    activation_bytes: float | None = None
    non_torch_bytes: float | None = None
    cuda_graph_bytes: float | None = None  # outside vLLM's budget (allocated after the cache)
    kv_error_max: float | None = None
    kv_error_typical: float | None = None
    num_logs: int | None = None

    @property
    def usable_bytes(self) -> float:
        return self.total_bytes * self.utilization

    @property
    def kv_cache_bytes(self) -> float:
        return self.usable_bytes - self.weights_bytes - self.overhead_bytes

    @property
    def spread(self) -> str | None:
        """The KV capacity's spread in words, or None when the overhead was measured or given."""
        if self.kv_error_max is None:
            return None
        how = (
            "the overhead predicted for each from a fit to the others"
            if self.source == "predicted"
            else "the overhead a fixed 2 GiB per GPU"
        )
        return (
            f"KV capacity ±{self.kv_error_max:.0%} (typically ±{self.kv_error_typical:.0%}) on "
            f"{self.num_logs} real vLLM start-up logs, {how}"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_cache_bytes": self.kv_cache_bytes, "spread": self.spread}


def _fixed_spread() -> tuple[float, float, int]:
    worst, typical = overhead_model.KV_ERROR_FIXED
    return worst, typical, overhead_model.KV_ERROR_NUM_LOGS


def predicted_overhead(
    spec: ModelSpec, num_gpus: int, max_num_batched_tokens: int
) -> dict[str, float | str | int | None]:
    """The overhead fields of a :class:`MemoryBudget` without a log: predicted from the model's
    shape where it is known, else the fixed assumption; either with its measured spread."""
    if spec.hidden_size is None or spec.intermediate_size is None:
        worst, typical, n = _fixed_spread()
        return {
            "overhead_bytes": num_gpus * DEFAULT_OVERHEAD_PER_GPU,
            "source": "assumed",
            "kv_error_max": worst,
            "kv_error_typical": typical,
            "num_logs": n,
        }
    est = overhead_model.predict_overhead(
        spec, max_num_batched_tokens=max_num_batched_tokens, tensor_parallel_size=num_gpus
    )
    return {
        "overhead_bytes": num_gpus * est.overhead_bytes,
        "source": "predicted",
        "activation_bytes": num_gpus * est.activation_bytes,
        "non_torch_bytes": num_gpus * est.non_torch_bytes,
        "cuda_graph_bytes": num_gpus * est.cuda_graph_bytes,
        "kv_error_max": est.kv_error_max,
        "kv_error_typical": est.kv_error_typical,
        "num_logs": est.num_logs,
    }


def from_log(log: VllmLog, num_gpus: int) -> dict[str, float | str | None]:
    """Total, utilization, weights and overhead (all GPUs) as a log printed them; a
    ValueError naming what is missing when the log cannot size a KV cache."""
    per_gpu_total = log.total_gpu_memory_gib
    util = log.gpu_memory_utilization
    if per_gpu_total is None or util is None:
        if log.requested_memory_gib is None:
            raise ValueError(
                "the vLLM log prints neither total_gpu_memory x gpu_memory_utilization nor "
                "their product: re-planning needs the memory it could use (vLLM prints it in "
                "'Memory profiling takes ...' from 0.6.4 on)"
            )
        per_gpu_total, util = log.requested_memory_gib, 1.0
    weights = log.weights_gib
    if weights is None:
        raise ValueError("the vLLM log prints no weights ('Loading model weights took X GB')")
    if log.has_profile:
        kv = log.kv_cache_bytes_from_profile() / GiB
        per_gpu_overhead = per_gpu_total * util - weights - kv
        activation, non_torch = log.activation_gib, log.non_torch_memory_gib
    elif log.kv_cache_memory_gib is not None:
        per_gpu_overhead = per_gpu_total * util - weights - log.kv_cache_memory_gib
        activation = non_torch = None
    else:
        raise ValueError(
            "the vLLM log prints neither its memory profile (activation peak, non-torch memory) "
            "nor its KV cache size: missing " + ", ".join(log.missing)
        )
    return {
        "total_bytes": num_gpus * per_gpu_total * GiB,
        "utilization": util,
        "weights_bytes": num_gpus * weights * GiB,
        "overhead_bytes": num_gpus * per_gpu_overhead * GiB,
        "source": "vllm-log",
        "activation_bytes": None if activation is None else num_gpus * activation * GiB,
        "non_torch_bytes": None if non_torch is None else num_gpus * non_torch * GiB,
        "cuda_graph_bytes": None
        if log.cuda_graph_gib is None
        else num_gpus * log.cuda_graph_gib * GiB,
    }
