"""Read what vLLM printed at start-up, and predict its KV cache from the memory profile it printed.

vLLM sizes its KV cache per GPU as ``total x gpu_memory_utilization - weights - activation peak -
non-torch memory`` and cuts it into whole blocks (``int(bytes // block_bytes)``). Its logs say
so in several formats (V0 from 0.3 to 0.7, V1 from 0.7 on); :func:`read_vllm_log` reads them
all into one :class:`VllmLog`, and :meth:`VllmLog.predict` recomputes the blocks from the profile
so a planner can be checked against what a real server did. Sizes are GiB as printed ("Loading
model weights took X GB" is GiB too: vLLM divides by 2**30). A log of a server that would not
start (V0: "The model's max seq len (N) is larger than the maximum number of tokens that can be
stored in KV cache (M)"; V1: "To serve at least one request with the model's max seq len (N),
(X GiB KV cache is needed, ..."; or an excerpt whose blocks x block_size are below its
max_model_len) is read as what it had: :meth:`VllmLog.start_failure`.

``BUNDLED_LOGS`` lists the real start-up logs users posted (``kvlab/perf/vllm_logs/``, sources in
its README), with the model facts needed to recompute each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from importlib import resources

from kvlab.core.validate import positive_int
from kvlab.models.hf_config import spec_from_hf_config
from kvlab.models.specs import ModelSpec

GiB = 2**30
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_SIZE = _NUM + r"\s*(GiB|GB|MiB|MB)"
_UNITS = {"GiB": 1.0, "GB": 1.0, "MiB": 1 / 1024, "MB": 1 / 1024}  # vLLM's "GB" and "MB" are binary

# (field, pattern, kind): kind "gib" reads a size (number + unit), "int"/"float" a number
_PATTERNS: tuple[tuple[str, re.Pattern, str], ...] = tuple(
    (name, re.compile(pattern), kind)
    for name, pattern, kind in (
        (
            "model_loading_gib",
            r"(?:Loading model weights took|Model loading took)\s+" + _SIZE,
            "gib",
        ),
        ("total_gpu_memory_gib", r"total_gpu_memory\s*(?:=|\(|\s)\s*" + _SIZE, "gib"),
        ("total_gpu_memory_gib", r"Free memory on device \(" + _NUM + r"/" + _SIZE, "gib2"),
        ("gpu_memory_utilization", r"gpu_memory_utilization'?\s*(?:=|\(|:|\s)\s*" + _NUM, "float"),
        ("gpu_memory_utilization", r"Desired GPU memory utilization is \(" + _NUM, "float"),
        ("requested_memory_gib", r"the current vLLM instance can use.*?" + _SIZE + r"\s*$", "gib"),
        ("requested_memory_gib", r"Desired GPU memory utilization is \([0-9.]+,\s*" + _SIZE, "gib"),
        ("model_weights_gib", r"model weights take\s+" + _SIZE, "gib"),
        ("model_weights_gib", _SIZE + r" for weight", "gib"),
        ("consumed_memory_gib", _SIZE + r" for consumed memory \(weights \+ non-torch\)", "gib"),
        ("peak_torch_memory_gib", r"peak_torch_memory=" + _SIZE, "gib"),
        ("non_torch_memory_gib", r"non_torch_memory(?:\s+takes)?\s*(?:=|\s)\s*" + _SIZE, "gib"),
        ("non_torch_memory_gib", _SIZE + r" for non-torch memory", "gib"),
        ("activation_peak_gib", r"PyTorch activation peak memory(?:\s+takes)?\s+" + _SIZE, "gib"),
        ("activation_peak_gib", _SIZE + r" for peak activation", "gib"),
        (
            "kv_cache_memory_gib",
            r"the rest of the memory reserved for KV Cache is\s+" + _SIZE,
            "gib",
        ),
        ("kv_cache_memory_gib", r"available_kv_cache_memory\s*(?:=|\s)\s*" + _SIZE, "gib"),
        ("kv_cache_memory_gib", r"kv_cache_size=" + _SIZE, "gib"),
        ("kv_cache_memory_gib", r"Available KV cache memory:\s*" + _SIZE, "gib"),
        ("cuda_graph_gib", r"Graph capturing finished in .*?took\s+" + _SIZE, "gib"),
        ("cuda_graph_gib", _SIZE + r" for CUDAGraph memory", "gib"),
        ("num_gpu_blocks", r"(?:GPU|CUDA) blocks:\s*" + _NUM, "int"),
        ("num_cpu_blocks", r"CPU blocks:\s*" + _NUM, "int"),
        ("gpu_kv_cache_tokens", r"GPU KV cache size:\s*" + _NUM + r"\s*tokens", "int"),
        # V0's refusal: "The model's max seq len (29000) is larger than the maximum number of
        # tokens that can be stored in KV cache (23648)": blocks x block_size
        (
            "gpu_kv_cache_tokens",
            r"maximum number of tokens that can be stored in KV cache \(" + _NUM + r"\)",
            "int",
        ),
        ("max_concurrency_tokens", r"Maximum concurrency for\s*" + _NUM + r"\s*tokens", "int"),
        (
            "max_concurrency",
            r"Maximum concurrency for .*?tokens per request:\s*" + _NUM + "x",
            "float",
        ),
        (
            "max_model_len",
            r"(?:\bmax_seq_len=|'max_model_len':\s*|Using max model len\s+)" + _NUM,
            "int",
        ),
        ("max_model_len", r"models?'s max seq len \(" + _NUM + r"\)", "int"),  # a refusal
        ("max_num_batched_tokens", r"max_num_batched_tokens(?:=|'?:\s*)" + _NUM, "int"),
        ("tensor_parallel_size", r"tensor_parallel_size(?:=|'?:\s*)" + _NUM, "int"),
        ("block_size", r"'block_size':\s*" + _NUM, "int"),
        ("kv_cache_dtype", r"kv_cache_dtype(?:=|'?:\s*')([A-Za-z0-9_]+)", "str"),
        ("model", r"(?:\bmodel=|'model':\s*)'([^']+)'", "str"),
        ("version", r"(?:LLM engine \(v|API server version |version\s+)(\d+\.\d+[\w.+-]*)", "str"),
    )
)
# lines only V1 prints (its engine core, GPU model runner and worker, KV cache utils)
_V1_MARKS = re.compile(
    r"V1 LLM engine|EngineCore|gpu_model_runner\.py|gpu_worker\.py|kv_cache_utils\.py|"
    r"Available KV cache memory|GPU KV cache size|Model loading took"
)
_V0_MARKS = re.compile(
    r"Initializing an LLM engine|CPU blocks:|CUDA blocks:|\bworker\.py|\bmodel_runner\.py|"
    r"Memory profiling results|Loading model weights took|VllmWorkerProcess"
)
# worker tags: V1 "(VllmWorker rank=1 pid=..)", 0.10 "(VllmWorker TP1 pid=..)", "(Worker_TP1 pid=..)";
# V0 workers other than the driver print "(VllmWorkerProcess pid=..)" or "(RayWorkerWrapper pid=..)"
# (the driver, rank 0, has no tag)
_RANK = re.compile(
    r"\((?:VllmWorker (?:rank=|TP)(\d+)|Worker(?:_PP\d+)?_TP(\d+)|"
    r"(?:VllmWorkerProcess|RayWorkerWrapper)\s+pid=(\d+))\b"
)
# what each worker prints for itself; the rest (blocks, token slots, the config) is printed once
_PER_WORKER = (
    "model_loading_gib", "total_gpu_memory_gib", "gpu_memory_utilization", "requested_memory_gib",
    "model_weights_gib", "peak_torch_memory_gib", "non_torch_memory_gib", "activation_peak_gib",
    "kv_cache_memory_gib", "cuda_graph_gib", "consumed_memory_gib",
)  # fmt: skip


def _words(text: str) -> str:
    """A phrase as a pattern that also matches it wrapped over lines (as posts often are)."""
    return r"\s+".join(text.split())


# V1's refusal (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory), one message that
# posts often wrap: "To serve at least one request with the model's max seq len (40960), (5.62
# GiB KV cache is needed, which is larger than the available KV cache memory (4.50 GiB). Based on
# the available memory, the estimated maximum model length is 32768."
_V1_REFUSAL = re.compile(
    r"(?:"
    + _words("To serve at least one request with the")
    + r"\s+)?"
    + _words("models?'s max seq len \\(")
    + _NUM
    + r"\),?\s*\(?"
    + _SIZE
    + r"\s+"
    + _words("KV cache is needed, which is larger than the available KV cache memory \\(")
    + _SIZE
    + r"\)\.?(?:\s+"
    + _words("Based on the available memory, the estimated maximum model length is")
    + r"\s+"
    + _NUM
    + ")?"
)
# V0's refusal (vllm/worker/worker.py, raise_if_cache_size_invalid)
_V0_REFUSAL = re.compile(
    _words("The model's max seq len \\(")
    + _NUM
    + r"\)\s+"
    + _words("is larger than the maximum number of tokens that can be stored in KV cache \\(")
    + _NUM
    + r"\)"
)

_FIELDS_REPORTED = (
    "total_gpu_memory_gib",
    "gpu_memory_utilization",
    "model_weights_gib",
    "activation_peak_gib",
    "non_torch_memory_gib",
    "kv_cache_memory_gib",
    "cuda_graph_gib",
    "num_gpu_blocks",
    "gpu_kv_cache_tokens",
    "max_concurrency",
    "max_model_len",
    "max_num_batched_tokens",
    "tensor_parallel_size",
)


@dataclass(frozen=True)
class KVPrediction:
    """The KV cache vLLM would build on one GPU from ``kv_cache_bytes``."""

    kv_cache_bytes: float  # per GPU
    bytes_per_token: int  # K and V of one token over all layers, on one GPU
    block_size: int
    num_blocks: int
    max_concurrency_tokens: int | None  # N of "Maximum concurrency for N tokens per request"

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float | None:
        n = self.max_concurrency_tokens
        return None if not n else self.tokens / n


def kv_bytes_per_token_per_gpu(spec: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """K and V bytes of one token on one GPU: each GPU holds its share of the KV heads, at least
    one (vLLM replicates a KV head when there are fewer KV heads than GPUs)."""
    tp = positive_int("tensor_parallel_size", tensor_parallel_size)
    heads_per_gpu = max(1, spec.num_kv_heads // tp)
    return spec.kv_bytes_per_token // spec.num_kv_heads * heads_per_gpu


def blocks_for(
    spec: ModelSpec,
    kv_cache_bytes: float,
    *,
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    max_concurrency_tokens: int | None = None,
) -> KVPrediction:
    """Blocks of ``block_size`` tokens in ``kv_cache_bytes`` of one GPU, rounded as vLLM does."""
    per_token = kv_bytes_per_token_per_gpu(spec, tensor_parallel_size)
    block_size = positive_int("block_size", block_size)
    num_blocks = max(0, int(kv_cache_bytes // (block_size * per_token)))
    return KVPrediction(kv_cache_bytes, per_token, block_size, num_blocks, max_concurrency_tokens)


@dataclass(frozen=True)
class StartFailure:
    """A server that would not start: one request of ``max_model_len`` tokens did not fit the
    ``token_slots`` its KV cache held, so vLLM refused (V0 and V1 both check it at start-up)."""

    max_model_len: int
    token_slots: int  # blocks x block_size, as printed (or counted from the KV memory)
    block_size: int
    slots_from: str  # "printed" (blocks or tokens), "kv-size" (its KV memory), "estimate" (V1's)
    refusal: str | None = None  # vLLM's words, where the log prints them
    estimated_max_model_len: int | None = None  # V1's own estimate of the longest that fits

    @property
    def num_blocks(self) -> int:
        return self.token_slots // self.block_size

    @property
    def shortfall_tokens(self) -> int:
        """Token slots it lacked for one request of full length."""
        return max(0, self.max_model_len - self.token_slots)

    @property
    def shortfall_blocks(self) -> int:
        """Blocks it lacked: one request of full length holds ceil(max_model_len / block_size)."""
        return max(0, -(-self.max_model_len // self.block_size) - self.num_blocks)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency": blocks x block_size / max_model_len (below 1 here)."""
        return self.num_blocks * self.block_size / self.max_model_len

    @property
    def longest_request(self) -> int:
        """The longest max_model_len that would have started: V1's estimate where printed,
        else the slots (V0 starts when max_model_len <= blocks x block_size)."""
        return self.estimated_max_model_len or self.token_slots

    def __str__(self) -> str:
        return (
            f"the server would not start: its KV cache held {self.token_slots:,} token slots "
            f"({self.num_blocks:,} blocks of {self.block_size}), {self.shortfall_tokens:,} short "
            f"of one request of max_model_len {self.max_model_len:,} "
            f"({self.max_concurrency:.2f}x)"
        )


@dataclass(frozen=True)
class VllmLog:
    """What one vLLM start-up log printed (None: not printed). Sizes in GiB, per GPU."""

    engine: str | None = None  # "V0" or "V1"
    version: str | None = None
    model: str | None = None
    total_gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    requested_memory_gib: float | None = None  # the printed total x utilization
    model_loading_gib: float | None = None  # "Loading model weights took" / "Model loading took"
    model_weights_gib: float | None = None  # the profile's "model weights take"
    peak_torch_memory_gib: float | None = None  # 0.6.4's profile: weights + activation peak
    consumed_memory_gib: float | None = None  # newest V1: weights + non-torch, in one figure
    activation_peak_gib: float | None = None
    non_torch_memory_gib: float | None = None
    kv_cache_memory_gib: float | None = None
    cuda_graph_gib: float | None = None  # allocated after the KV cache, outside the budget
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    gpu_kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int | None = None
    block_size: int | None = None
    kv_cache_dtype: str | None = None
    # a server that would not start: vLLM's refusal as printed, and V1's figures in it
    refusal: str | None = None
    kv_cache_needed_gib: float | None = None  # V1: what one request of max_model_len needs
    estimated_max_model_len: int | None = None  # V1: the longest request its KV cache holds
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    workers_seen: int = 1  # distinct workers whose memory lines the log shows (TP: at least this)

    @property
    def weights_gib(self) -> float | None:
        """Weights on one GPU: the profile's figure, else the loading line's (more digits)."""
        if self.model_loading_gib is not None and self.peak_torch_memory_gib is not None:
            return self.model_loading_gib
        return (
            self.model_weights_gib if self.model_weights_gib is not None else self.model_loading_gib
        )

    @property
    def has_profile(self) -> bool:
        """Whether the log printed enough of its memory profile to recompute the KV budget."""
        return self._profile_missing() == []

    def _budget_gib(self) -> float | None:
        if self.total_gpu_memory_gib is not None and self.gpu_memory_utilization is not None:
            return self.total_gpu_memory_gib * self.gpu_memory_utilization
        return self.requested_memory_gib

    def _profile_missing(self) -> list[str]:
        missing = []
        if self._budget_gib() is None:
            missing.append("total_gpu_memory_gib x gpu_memory_utilization")
        if self.consumed_memory_gib is not None:  # weights + non-torch in one figure
            return missing + (
                [] if self.activation_peak_gib is not None else ["activation_peak_gib"]
            )
        if self.non_torch_memory_gib is None:
            missing.append("non_torch_memory_gib")
        if self.peak_torch_memory_gib is None:
            if self.weights_gib is None:
                missing.append("model_weights_gib")
            if self.activation_peak_gib is None:
                missing.append("activation_peak_gib")
        return missing

    @property
    def activation_gib(self) -> float | None:
        """The activation peak, printed or (0.6.4) the torch peak less the weights."""
        if self.activation_peak_gib is not None:
            return self.activation_peak_gib
        if self.peak_torch_memory_gib is not None and self.model_loading_gib is not None:
            return self.peak_torch_memory_gib - self.model_loading_gib
        return None

    def kv_cache_bytes_from_profile(self) -> float:
        """KV bytes per GPU as vLLM computes them: total x utilization - weights - activation
        peak - non-torch memory (from the printed, rounded figures)."""
        missing = self._profile_missing()
        if missing:
            raise ValueError(
                f"the log lacks {', '.join(missing)}: it did not print its memory profile"
            )
        budget = self._budget_gib()
        if self.consumed_memory_gib is not None:
            used = self.consumed_memory_gib + self.activation_peak_gib
        elif self.peak_torch_memory_gib is not None:  # 0.6.4: the torch peak includes the weights
            used = self.peak_torch_memory_gib + self.non_torch_memory_gib
        else:
            used = self.weights_gib + self.activation_peak_gib + self.non_torch_memory_gib
        return (budget - used) * GiB

    def predict(
        self,
        spec: ModelSpec,
        *,
        block_size: int | None = None,
        tensor_parallel_size: int | None = None,
        from_profile: bool = True,
    ) -> KVPrediction:
        """Blocks, tokens and concurrency vLLM builds for ``spec`` from this log's memory.

        ``from_profile``: recompute the KV bytes from the profile (else use the printed KV
        size). ``block_size`` and ``tensor_parallel_size`` default to the log's, else 16 and 1.
        """
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be a kvlab.models.ModelSpec, got {type(spec).__name__}")
        if from_profile:
            kv_bytes = self.kv_cache_bytes_from_profile()
        elif self.kv_cache_memory_gib is None:
            raise ValueError("the log printed no KV cache size (kv_cache_memory_gib)")
        else:
            kv_bytes = self.kv_cache_memory_gib * GiB
        return blocks_for(
            spec,
            kv_bytes,
            block_size=block_size or self.block_size or 16,
            tensor_parallel_size=tensor_parallel_size or self.tensor_parallel_size or 1,
            max_concurrency_tokens=self.max_concurrency_tokens or self.max_model_len,
        )

    @property
    def printed_tokens(self) -> int | None:
        """Token slots the log states: "GPU KV cache size" (or the tokens V0's refusal names),
        else blocks x block size."""
        if self.gpu_kv_cache_tokens is not None:
            return self.gpu_kv_cache_tokens
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks * (self.block_size or 16)
        return None

    @property
    def printed_blocks(self) -> int | None:
        """Blocks the log states: "# GPU blocks", else its token slots // block size (V1 prints
        tokens only: blocks x block size for a model of one KV cache group)."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        tokens = self.printed_tokens
        return None if tokens is None else tokens // (self.block_size or 16)

    @property
    def logged_max_model_len(self) -> int | None:
        """The longest request the server was started for: its max_model_len, else the N of
        "Maximum concurrency for N tokens per request" (vLLM prints max_model_len there)."""
        return self.max_model_len or self.max_concurrency_tokens

    def start_failure(self, spec: ModelSpec | None = None, tensor_parallel_size: int = 1):
        """A :class:`StartFailure` when this server would not start, else None.

        vLLM refuses to start when one request of ``max_model_len`` tokens does not fit its KV
        cache (V0: ``blocks x block_size < max_model_len``; V1: the bytes it needs are more than
        the KV memory). Read from the refusal where the log prints one, else from the slots it
        printed (an excerpt may stop before the error). Without printed slots (V1's refusal
        prints memory only) ``spec`` counts them from the KV memory, as vLLM would.
        """
        max_len = self.logged_max_model_len
        if max_len is None:
            return None
        block_size = self.block_size or 16
        slots, source = self.printed_tokens, "printed"
        if slots is None and spec is not None and self.kv_cache_memory_gib is not None:
            slots = self.predict(
                spec, tensor_parallel_size=tensor_parallel_size, from_profile=False
            ).tokens
            source = "kv-size"
        if slots is None and self.estimated_max_model_len is not None:
            slots, source = self.estimated_max_model_len, "estimate"
        if slots is None or (slots >= max_len and self.refusal is None):
            return None
        return StartFailure(
            max_model_len=max_len,
            token_slots=slots,
            block_size=block_size,
            slots_from=source,
            refusal=self.refusal,
            estimated_max_model_len=self.estimated_max_model_len,
        )

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _value(match: re.Match, kind: str):
    if kind == "gib2":  # "(free/total GiB)": the total
        return float(match.group(2).replace(",", "")) * _UNITS[match.group(3)]
    raw = match.group(1)
    if kind == "str":
        return raw
    number = raw.replace(",", "")
    if kind == "int":
        return int(float(number))
    if kind == "float":
        return float(number)
    return float(number) * _UNITS[match.group(2)]


def _rank(line: str) -> tuple[int, int]:
    """A worker's place in order: (rank, 0), or (1, pid) for a V0 worker that names only its
    process (some rank other than the driver's)."""
    m = _RANK.search(line)
    if m is None:
        return (0, 0)  # the driver (V0) or the engine core (V1), which print rank 0's figures
    if m.group(1) is not None:
        return (int(m.group(1)), 0)
    if m.group(2) is not None:
        return (int(m.group(2)), 0)
    return (1, int(m.group(3)))


def read_vllm_log(text: str) -> VllmLog:
    """Parse a vLLM start-up log (any prefix: timestamps, ``INFO 01-23 ..``, worker tags, ANSI
    colours). With tensor parallel, rank 0's lines are used (``notes`` says when others differ).

    Raises TypeError for anything but a str and ValueError when no line is vLLM's.
    """
    if isinstance(text, (bytes, bytearray)):
        raise TypeError("text must be a str: decode the log first (text.decode('utf-8'))")
    if not isinstance(text, str):
        raise TypeError(f"text must be the log's text (a str), got {type(text).__name__}")
    found: dict[str, dict[int, object]] = {}
    v0 = v1 = recognised = 0
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if not line:
            continue
        rank = _rank(line)
        hit = False
        for name, pattern, kind in _PATTERNS:
            m = pattern.search(line)
            if m is None:
                continue
            try:
                value = _value(m, kind)
            except (ValueError, KeyError):
                continue
            hit = True
            found.setdefault(name, {}).setdefault(rank, value)  # first line of each rank
        v1 += bool(_V1_MARKS.search(line))
        v0 += bool(_V0_MARKS.search(line))
        recognised += hit
    if not recognised:
        raise ValueError(
            "no vLLM start-up line found (memory profile, weights, KV cache size, GPU blocks or "
            "engine config): is this a vLLM log?"
        )
    # vLLM gives every worker the blocks of the one with the least KV memory: that worker's
    # profile is the one that sized the cache (rank 0's when they agree or only it printed)
    kv_by_rank = found.get("kv_cache_memory_gib", {})
    if kv_by_rank:
        binding = min(kv_by_rank, key=lambda r: (kv_by_rank[r], r))
    else:  # no KV line per worker: the first worker that printed its memory
        profiled = [
            r for n in ("total_gpu_memory_gib", "requested_memory_gib") for r in found.get(n, {})
        ]
        binding = min(profiled, default=(0, 0))
    workers = {r for name in _PER_WORKER for r in found.get(name, {})}
    values, notes = {}, []
    for name, by_rank in found.items():
        rank = binding if binding in by_rank else min(by_rank)
        values[name] = by_rank[rank]
        others = {r: v for r, v in by_rank.items() if r != rank and v != by_rank[rank]}
        if others:
            notes.append(
                f"{name}: {by_rank[rank]!r} used (the worker with the least KV memory); other "
                f"workers printed {sorted(set(map(repr, others.values())))}"
            )
    if len(workers) > 1:
        notes.insert(
            0,
            f"{len(workers)} workers printed their memory (tensor parallel): the figures of the "
            "one with the least KV memory are used, as vLLM sizes every worker's cache by it",
        )
    text_all = _ANSI.sub("", text)
    refusal = _V1_REFUSAL.search(text_all)
    if refusal is not None:
        values.setdefault("max_model_len", _value(refusal, "int"))
        values["kv_cache_needed_gib"] = float(refusal.group(2)) * _UNITS[refusal.group(3)]
        values.setdefault("kv_cache_memory_gib", float(refusal.group(4)) * _UNITS[refusal.group(5)])
        if refusal.group(6) is not None:
            values["estimated_max_model_len"] = int(refusal.group(6).replace(",", ""))
        values["refusal"] = " ".join(refusal.group(0).split())
        v1 += 1
    elif (v0_refusal := _V0_REFUSAL.search(text_all)) is not None:
        values["refusal"] = " ".join(v0_refusal.group(0).split())
    engine = "V1" if v1 and (v1 >= v0 or "V1 LLM engine" in text_all) else ("V0" if v0 else None)
    if "V1 LLM engine" in text_all:
        engine = "V1"
    log = VllmLog(engine=engine, notes=tuple(notes), workers_seen=max(1, len(workers)), **values)
    missing = tuple(
        name
        for name in _FIELDS_REPORTED
        if getattr(log, name) is None
        and not (name == "model_weights_gib" and log.weights_gib is not None)
        and not (name == "activation_peak_gib" and log.activation_gib is not None)
    )
    return _replace(log, missing=missing)


def _replace(log: VllmLog, **changes) -> VllmLog:
    return VllmLog(**{**log.to_dict(), **changes})


# --- the real logs bundled with kvlab ---------------------------------------------------------


@dataclass(frozen=True)
class BundledLog:
    """A start-up log a user posted, with what it takes to recompute it."""

    name: str  # file under kvlab/perf/vllm_logs/, without .log
    url: str
    gpu: str
    vllm: str  # version as stated or dated from the log's format
    spec: ModelSpec
    tensor_parallel_size: int = 1
    max_num_batched_tokens: int | None = None  # the profile's token count (vLLM's default)
    max_num_seqs: int = 256
    fit: bool = True  # used to fit kvlab.perf.overhead (False: says why in ``note``)
    note: str = ""

    def text(self) -> str:
        return (
            resources.files("kvlab.perf")
            .joinpath("vllm_logs", self.name + ".log")
            .read_text(encoding="utf-8")
        )

    def read(self) -> VllmLog:
        return read_vllm_log(self.text())


# config.json facts (Hugging Face) of the logs' models
_LLAMA_3_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
               "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}  # fmt: skip
_QWEN25_32B = {"model_type": "qwen2", "num_hidden_layers": 64, "num_attention_heads": 40,
               "num_key_value_heads": 8, "hidden_size": 5120, "intermediate_size": 27648,
               "vocab_size": 152064, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
               "max_position_embeddings": 32768}  # fmt: skip
_QWEN25_05B = {"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "hidden_size": 896, "intermediate_size": 4864,
               "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
               "max_position_embeddings": 32768}  # fmt: skip
# Mllama keeps its decoder under text_config: 40 layers (32 self- + 8 cross-attention), all cached
_LLAMA_32_11B_VISION = {"model_type": "mllama", "text_config": {
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False}}  # fmt: skip
_LLAMA_31_70B = dict(_LLAMA_3_8B, num_hidden_layers=80, num_attention_heads=64, hidden_size=8192,
                     intermediate_size=28672)  # fmt: skip
_OPT_125M = {"model_type": "opt", "num_hidden_layers": 12, "num_attention_heads": 12,
             "hidden_size": 768, "ffn_dim": 3072, "vocab_size": 50272, "torch_dtype": "float16",
             "max_position_embeddings": 2048}  # fmt: skip
# Qwen2.5-1.5B and Qwen2.5-Math-1.5B share a shape (28 layers, 2 KV heads of 128, tied embeddings)
_QWEN25_15B = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 12,
               "num_key_value_heads": 2, "hidden_size": 1536, "intermediate_size": 8960,
               "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": True}  # fmt: skip
# DeepSeek-R1-Distill-Qwen-7B is a Qwen2.5-Math-7B: 28 layers, 4 KV heads, untied embeddings
_QWEN25_7B_DISTILL = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28,
                      "num_key_value_heads": 4, "hidden_size": 3584, "intermediate_size": 18944,
                      "vocab_size": 152064, "torch_dtype": "bfloat16",
                      "tie_word_embeddings": False}  # fmt: skip
# Qwen3-235B-A22B is a mixture of experts: its attention shape by hand (94 layers, 4 KV heads)
_QWEN3_235B = ModelSpec("Qwen3-235B-A22B-FP8", 94, 64, 4, 128, dtype_bytes=2, hidden_size=4096,
                        vocab_size=151936)  # fmt: skip

BUNDLED_LOGS: tuple[BundledLog, ...] = (
    BundledLog(
        "vllm-10517-llama31-8b-rtx3090-20k",
        "https://github.com/vllm-project/vllm/issues/10517",
        "RTX 3090 (24 GB)",
        "0.6.4 (V0, its one-line profile format)",
        spec_from_hf_config(_LLAMA_3_8B, name="Llama-3.1-8B-Instruct"),
        max_num_batched_tokens=20000,
    ),  # fmt: skip
    BundledLog(
        "vllm-10517-llama31-8b-rtx3090-29k",
        "https://github.com/vllm-project/vllm/issues/10517",
        "RTX 3090 (24 GB)",
        "0.6.4 (V0, its one-line profile format)",
        spec_from_hf_config(_LLAMA_3_8B, name="Llama-3.1-8B-Instruct"),
        max_num_batched_tokens=29000,
    ),  # fmt: skip
    BundledLog(
        "vllm-pr10511-llama3-8b-h100",
        "https://github.com/vllm-project/vllm/pull/10511",
        "H100-80GB",
        "0.6.5 dev (V0, the profiling overhaul)",
        spec_from_hf_config(_LLAMA_3_8B, name="Meta-Llama-3-8B"),
        max_num_batched_tokens=8192,
    ),  # fmt: skip
    BundledLog(
        "vllm-pr10511-llama3-8b-2xh100-tp2",
        "https://github.com/vllm-project/vllm/pull/10511",
        "2 x H100-80GB",
        "0.6.5 dev (V0)",
        spec_from_hf_config(_LLAMA_3_8B, name="Meta-Llama-3-8B"),
        tensor_parallel_size=2,
        max_num_batched_tokens=8192,
        note="the post cut its KV line off: the profile only",
    ),  # fmt: skip
    BundledLog(
        "vllm-pr12126-llama32-11b-vision-h100",
        "https://github.com/vllm-project/vllm/pull/12126",
        "H100-80GB",
        "0.6.6 dev (V0)",
        spec_from_hf_config(_LLAMA_32_11B_VISION, name="Llama-3.2-11B-Vision"),
        max_num_batched_tokens=65536,
        max_num_seqs=128,
        fit=False,
        note="multimodal: the vision encoder's profile (36.63 GiB) is not a text "
        "model's activation peak",
    ),  # fmt: skip
    BundledLog(
        "vllm-15815-qwen25-32b-2xl40s-tp2",
        "https://github.com/vllm-project/vllm/issues/15815",
        "2 x L40S (48 GB)",
        "0.7.x (V0, executor_base.py CUDA blocks)",
        spec_from_hf_config(_QWEN25_32B, name="Qwen2.5-32B-Instruct"),
        tensor_parallel_size=2,
        max_num_batched_tokens=10000,
    ),  # fmt: skip
    BundledLog(
        "rlswarm-92-qwen25-05b-8gb",
        "https://github.com/gensyn-ai/rl-swarm/issues/92",
        "8 GiB GPU under WSL",
        "0.7.x (V0)",
        spec_from_hf_config(_QWEN25_05B, name="Qwen2.5-0.5B-Instruct"),
        max_num_batched_tokens=32768,
    ),  # fmt: skip
    BundledLog(
        "vllm-pr12569-llama31-70b-w8a8-v1",
        "https://github.com/vllm-project/vllm/pull/12569",
        "not stated",
        "0.7.1 dev (V1)",
        spec_from_hf_config(_LLAMA_31_70B, name="Meta-Llama-3.1-70B-Instruct-quantized.w8a8"),
        fit=False,
        note="no profile and no GPU named: blocks and concurrency only",
    ),  # fmt: skip
    BundledLog(
        "vllm-21348-qwen3-235b-fp8-4xh100-v1",
        "https://github.com/vllm-project/vllm/issues/21348",
        "4 x H100-80GB",
        "V1 (0.9/0.10, July 2025)",
        _QWEN3_235B,
        tensor_parallel_size=4,
        fit=False,
        note="KV size and tokens only; a mixture of experts",
    ),  # fmt: skip
    BundledLog(
        "vllm-pr3120-opt-125m",
        "https://github.com/vllm-project/vllm/pull/3120",
        "not stated",
        "0.3.3 (V0)",
        spec_from_hf_config(_OPT_125M, name="OPT-125M"),
        fit=False,
        note="weights and blocks only (no profile printed in 0.3)",
    ),  # fmt: skip
    BundledLog(
        "t4-qwen25-15b-instruct-fp16",
        "kvlab search index, public GitHub file id 55594152188",
        "Tesla T4 (14.56 GiB; the log says so)",
        "0.7.2 (V0; the log says so)",
        spec_from_hf_config(_QWEN25_15B, name="Qwen2.5-1.5B-Instruct"),
        max_num_batched_tokens=32768,  # max_seq_len, chunked prefill off (printed)
        note="fp16 (cast from bf16 on Turing); gpu_memory_utilization 0.50",
    ),  # fmt: skip
    BundledLog(
        "t4-qwen25-05b-fp16",
        "kvlab search index, public GitHub file id 69421856836",
        "Tesla T4 (14.56 GiB; Turing per the log)",
        "0.6.6.post1 (V0; the log says so)",
        spec_from_hf_config(_QWEN25_05B, name="Qwen2.5-0.5B"),
        max_num_batched_tokens=32768,
        note="fp16 (cast from bf16)",
    ),  # fmt: skip
    BundledLog(
        "a10g-qwen25-math-15b",
        "kvlab search index, public GitHub file id 60663571995",
        "not named (22.06 GiB: an A10G-class 24 GB card)",
        "0.7.2 (V0; the log says so)",
        spec_from_hf_config(_QWEN25_15B, name="Qwen2.5-Math-1.5B"),
        max_num_batched_tokens=4096,  # max(max_seq_len, 2048), chunked prefill off
    ),  # fmt: skip
    BundledLog(
        "v100-deepseek-r1-distill-qwen-7b-fp16",
        "kvlab search index, public GitHub file id 4922787267",
        "V100-32GB (31.74 GiB; Volta per the log)",
        "0.7.1 (V0; the log says so)",
        spec_from_hf_config(_QWEN25_7B_DISTILL, name="DeepSeek-R1-Distill-Qwen-7B"),
        max_num_batched_tokens=2048,  # max(max_seq_len 2048, 2048)
        note="fp16 (cast from bf16 on Volta)",
    ),  # fmt: skip
    BundledLog(
        "rtx4080-qwen25-7b-awq-v1",
        "kvlab search index, public GitHub file id 57722428709",
        "RTX 4080 (16 GB; 15.99 GiB per the post)",
        "0.26.0 (V1; the post says so)",
        spec_from_hf_config(
            dict(_QWEN25_7B_DISTILL, max_position_embeddings=32768), name="Qwen2.5-7B-Instruct-AWQ"
        ),
        fit=False,
        note="the KV cache's size and tokens only (V1 at INFO, `--max-model-len 32768`); AWQ "
        "weights (5.29 GiB per the post, not in the log)",
    ),  # fmt: skip
    BundledLog(
        "oci-aqua-llama31-8b-22gb-128k",
        "https://github.com/oracle-samples/oci-data-science-ai-samples/blob/main/"
        "ai-quick-actions/troubleshooting-tips.md",
        "not named (22.07 GiB: an A10-class 24 GB card)",
        "0.7.x (V0, executor_base.py CUDA blocks; inferred from the format)",
        spec_from_hf_config(_LLAMA_3_8B, name="Llama-3.1-8B (inferred: 14.9888 GB, 128K)"),
        fit=False,
        note="the model is not named (its weights and 128K context are Llama-3.1-8B's); at "
        "131072 tokens V0 chunks the prefill, and the log does not print the chunk "
        "(max_num_batched_tokens): blocks from the profile only",
    ),  # fmt: skip
)


def bundled_log(name: str) -> BundledLog:
    for log in BUNDLED_LOGS:
        if log.name == name:
            return log
    raise KeyError(f"no bundled log {name!r}; there are {', '.join(b.name for b in BUNDLED_LOGS)}")
