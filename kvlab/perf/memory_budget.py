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
    num_gpus: int = 1

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
            "each log's overhead predicted from a fit to the others"
            if self.source == "predicted"
            else "with the overhead fixed at 2 GiB per GPU"
        )
        scope = (
            f" (set-ups of at most {overhead_model.FITTED_TENSOR_PARALLEL} GPUs: {self.num_gpus} "
            "per copy is beyond what was measured)"
            if self.num_gpus > overhead_model.FITTED_TENSOR_PARALLEL
            else ""
        )
        return (
            f"KV capacity ±{self.kv_error_max:.0%} (typically ±{self.kv_error_typical:.0%}) on "
            f"{self.num_logs} real vLLM start-up logs{scope}, {how}"
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


def from_log(
    log: VllmLog, num_gpus: int, *, gpu_memory_bytes: float, utilization: float | None,
    spec_weights_bytes: float | None, weights_bytes: float | None = None,
    kv_bytes_per_token: float | None = None, block_size: int = 16, predicted=None,
) -> tuple[dict, list[str]]:  # fmt: skip
    """Total, utilization, weights and overhead (all GPUs) as a log measured them, and notes on
    what had to come from elsewhere (``gpu_memory_bytes``: the card's memory, ``utilization``:
    the caller's, ``spec_weights_bytes``: the model's, ``weights_bytes``: the caller's, all GPUs).

    With a memory profile every figure is the log's. Without one the KV cache is still what the
    log printed (its size, else its blocks or token slots x ``kv_bytes_per_token``, the bytes of
    one token on one GPU): ``"kv_cache_bytes"`` and ``"num_blocks"`` in the result are those
    measured figures (None with a profile, where the blocks are recomputed from it). What such a
    log lacks is not needed for the capacity; the budget around it is then the GPU's memory,
    the weights (the log's, else the model's), an overhead (the log's activation peak and
    non-torch memory, else the rest of a printed or given utilization, else ``predicted()``:
    :func:`predicted_overhead`'s fields, marked "predicted") and the utilization they imply.
    A ValueError names what is missing when the log holds no KV figure at all, and the figures
    that disagree when they cannot all hold on one GPU."""
    notes = []
    per_gpu_total, util = log.total_gpu_memory_gib, log.gpu_memory_utilization
    if util is None and per_gpu_total is not None and log.requested_memory_gib is not None:
        util = log.requested_memory_gib / per_gpu_total
    if per_gpu_total is None:
        per_gpu_total = gpu_memory_bytes / GiB
        if util is None and log.requested_memory_gib is not None:
            util = log.requested_memory_gib / per_gpu_total
        notes.append(f"GPU memory {per_gpu_total:.2f} GiB from the GPU named (the log prints none)")
    if util is None and utilization is not None:
        util = utilization
        notes.append(f"gpu_memory_utilization {util:g} as given (the log prints none)")
    weights = log.weights_gib
    if weights_bytes is not None and not log.has_profile:
        weights = weights_bytes / num_gpus / GiB  # the caller's: the budget is built around them
    elif weights is None:
        if spec_weights_bytes is None:
            raise ValueError("the vLLM log prints no weights and the model has no num_params")
        weights = spec_weights_bytes / num_gpus / GiB
        notes.append(f"weights {weights:.2f} GiB per GPU from the model (the log prints none)")
    fields = {"kv_cache_bytes": None, "num_blocks": None}
    if log.has_profile:  # a profile prints its budget, so util is known
        return _measured(log, num_gpus, per_gpu_total, util, weights,
                         log.kv_cache_bytes_from_profile() / GiB, fields), notes  # fmt: skip
    tokens = log.printed_tokens
    blocks = None if tokens is None else tokens // block_size  # in the plan's blocks (the log's)
    if log.kv_cache_memory_gib is not None:
        kv = log.kv_cache_memory_gib
    elif blocks is not None and kv_bytes_per_token is not None:
        kv = blocks * block_size * kv_bytes_per_token / GiB
        notes.append(
            f"KV cache {kv:.2f} GiB per GPU: the {tokens:,} token slots the log printed x "
            f"{kv_bytes_per_token / 1024:g} KiB per token on one GPU (the model's)"
        )
    else:
        raise ValueError(
            "the vLLM log prints neither its memory profile (activation peak, non-torch memory) "
            "nor its KV cache: no size ('Available KV cache memory'), no '# GPU blocks' and no "
            "'GPU KV cache size' tokens; missing " + ", ".join(log.missing)
        )
    fields["kv_cache_bytes"] = num_gpus * kv * GiB
    fields["num_blocks"] = blocks
    activation, non_torch = log.activation_gib, log.non_torch_memory_gib
    if util is not None:  # the budget is known: the overhead is the rest of it, as measured
        out = _measured(log, num_gpus, per_gpu_total, util, weights, kv, fields)
        if out["overhead_bytes"] < 0:
            raise ValueError(
                f"the vLLM log's KV cache ({kv:.2f} GiB per GPU) and the weights "
                f"({weights:.2f} GiB) are more than {per_gpu_total:.2f} GiB x "
                f"gpu_memory_utilization {util:g}: is the GPU the one the server ran on, and the "
                "weights its own? (quantised weights: give weights_bytes)"
            )
        return out, notes
    if activation is not None and non_torch is not None:  # printed without its budget line
        overhead = {
            "overhead_bytes": num_gpus * (activation + non_torch) * GiB,
            "source": "vllm-log",
            "activation_bytes": num_gpus * activation * GiB,
            "non_torch_bytes": num_gpus * non_torch * GiB,
        }
        said = "the log's activation peak and non-torch memory"
    else:
        overhead = {k: v for k, v in (predicted() if predicted else {}).items()
                    if k not in ("kv_error_max", "kv_error_typical", "num_logs")}  # fmt: skip
        if "overhead_bytes" not in overhead:
            raise ValueError(
                "the vLLM log prints no gpu_memory_utilization and no memory profile: give the "
                "utilization the server ran with"
            )
        said = (
            "kvlab's overhead model" if overhead["source"] == "predicted" else "a fixed assumption"
        )
        notes.append(
            f"overhead {overhead['overhead_bytes'] / num_gpus / GiB:.2f} GiB per GPU "
            f"{overhead['source']} by {said} (the log prints no memory profile; the capacity "
            "does not depend on it)"
        )
    used = weights + overhead["overhead_bytes"] / num_gpus / GiB + kv
    util = used / per_gpu_total
    if util > 1:
        raise ValueError(
            f"the vLLM log's KV cache ({kv:.2f} GiB per GPU) + weights ({weights:.2f} GiB) + "
            f"overhead ({overhead['overhead_bytes'] / num_gpus / GiB:.2f} GiB, {said}) = {used:.2f} GiB, more than the "
            f"{per_gpu_total:.2f} GiB of the GPU named: give the GPU the server ran on (or "
            "gpu_memory_gib), and for quantised weights weights_bytes"
        )
    notes.append(
        f"gpu_memory_utilization {util:.3f} implied: weights + overhead + the log's KV cache over "
        f"{per_gpu_total:.2f} GiB (the log prints none)"
    )
    graphs = log.cuda_graph_gib
    if graphs is not None:
        overhead["cuda_graph_bytes"] = num_gpus * graphs * GiB
    return {
        **fields,
        "total_bytes": num_gpus * per_gpu_total * GiB,
        "utilization": util,
        "weights_bytes": num_gpus * weights * GiB,
        **overhead,
    }, notes


def _measured(log, num_gpus, per_gpu_total, util, weights, kv, fields) -> dict:
    """The budget of a log whose total, utilization, weights and KV cache are all known: the
    overhead is the rest (activation peak and non-torch memory kept where the profile printed)."""
    per_gpu_overhead = per_gpu_total * util - weights - kv
    activation, non_torch = log.activation_gib, log.non_torch_memory_gib
    if activation is None or not log.has_profile:
        activation = None
    if non_torch is None or not log.has_profile:
        non_torch = None
    graphs = log.cuda_graph_gib
    return {
        **fields,
        "total_bytes": num_gpus * per_gpu_total * GiB,
        "utilization": util,
        "weights_bytes": num_gpus * weights * GiB,
        "overhead_bytes": num_gpus * per_gpu_overhead * GiB,
        "source": "vllm-log",
        "activation_bytes": None if activation is None else num_gpus * activation * GiB,
        "non_torch_bytes": None if non_torch is None else num_gpus * non_torch * GiB,
        "cuda_graph_bytes": None if graphs is None else num_gpus * graphs * GiB,
    }
