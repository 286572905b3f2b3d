"""read_vllm_log on real start-up logs (kvlab/perf/vllm_logs/), predictions from their memory
profile, and the overhead model fitted to them."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.models import LLAMA_3_8B
from kvlab.perf import overhead
from kvlab.perf.vllm_log import (
    BUNDLED_LOGS,
    GiB,
    StartFailure,
    blocks_for,
    bundled_log,
    kv_bytes_per_token_per_gpu,
    read_vllm_log,
)

# predicted / printed - 1 of the blocks (or tokens, or KV GiB) from each log's profile
PROFILE_CHECKS = {
    "vllm-10517-llama31-8b-rtx3090-20k": 1952,
    "vllm-10517-llama31-8b-rtx3090-29k": 1478,
    "vllm-pr12126-llama32-11b-vision-h100": 6001,
    "vllm-15815-qwen25-32b-2xl40s-tp2": 3947,
    "rlswarm-92-qwen25-05b-8gb": 19609,
    "t4-qwen25-15b-instruct-fp16": 5519,
    "t4-qwen25-05b-fp16": 58059,
    "a10g-qwen25-math-15b": 36332,
    "v100-deepseek-r1-distill-qwen-7b-fp16": 14984,
    "oci-aqua-llama31-8b-22gb-128k": 2356,
}


def test_every_log_with_a_profile_and_printed_blocks_is_checked():
    checked = {b.name for b in BUNDLED_LOGS if b.read().has_profile and b.read().num_gpu_blocks}
    assert checked == set(PROFILE_CHECKS) and len(checked) >= 10


def test_every_bundled_log_parses_and_is_listed_in_the_readme():
    from importlib import resources

    folder = resources.files("kvlab.perf").joinpath("vllm_logs")
    files = {p.name.removesuffix(".log") for p in folder.iterdir() if p.name.endswith(".log")}
    assert files == {b.name for b in BUNDLED_LOGS} and len(files) >= 8
    readme = folder.joinpath("README.md").read_text(encoding="utf-8")
    engines = set()
    for b in BUNDLED_LOGS:
        log = b.read()
        engines.add(log.engine)
        assert b.url in readme
        assert isinstance(log.missing, tuple) and set(log.missing) <= set(vars(log))
        assert all(getattr(log, n) is None for n in log.missing if n not in ("model_weights_gib",))
    assert engines == {"V0", "V1"}


@pytest.mark.parametrize("name, printed_blocks", PROFILE_CHECKS.items())
def test_blocks_predicted_from_the_profile_within_one_percent(name, printed_blocks):
    b = bundled_log(name)
    log = b.read()
    assert log.num_gpu_blocks == printed_blocks
    pred = log.predict(b.spec, tensor_parallel_size=b.tensor_parallel_size)
    assert pred.num_blocks == pytest.approx(printed_blocks, rel=0.01)
    # the KV bytes vLLM printed agree too (it rounds each figure to 0.01 GiB)
    assert pred.kv_cache_bytes / GiB == pytest.approx(log.kv_cache_memory_gib, abs=0.011)
    # and the wrong TP (no split of the KV heads) would be far off where the log used TP
    if b.tensor_parallel_size > 1:
        assert log.predict(b.spec, tensor_parallel_size=1).num_blocks < 0.6 * printed_blocks


def test_profile_without_blocks_predicts_the_printed_kv_size():
    log = bundled_log("vllm-pr10511-llama3-8b-h100").read()
    assert log.kv_cache_bytes_from_profile() / GiB == pytest.approx(53.29, abs=0.006)
    assert log.num_gpu_blocks is None and "num_gpu_blocks" in log.missing


def test_concurrency_is_blocks_times_block_size_over_tokens():
    log = bundled_log("vllm-pr12569-llama31-70b-w8a8-v1").read()
    assert (log.engine, log.num_gpu_blocks, log.max_concurrency_tokens) == ("V1", 1381, 2048)
    assert round(1381 * 16 / 2048, 2) == log.max_concurrency == 10.79
    assert log.model_loading_gib == pytest.approx(67.7229)
    with pytest.raises(ValueError, match="did not print its memory profile"):
        log.kv_cache_bytes_from_profile()
    for name in ("vllm-10517-llama31-8b-rtx3090-20k", "vllm-10517-llama31-8b-rtx3090-29k"):
        log = bundled_log(name).read()
        assert round(log.num_gpu_blocks * 16 / log.max_concurrency_tokens, 2) == log.max_concurrency


def test_v1_tokens_from_the_printed_kv_size():
    # Qwen3-235B on 4 GPUs: 4 KV heads, one per GPU; 8.11 GiB -> 180,928 tokens against 178,880
    # printed (+1.1%): V1 sizes the cache by the smallest worker's memory, the post shows one
    b = bundled_log("vllm-21348-qwen3-235b-fp8-4xh100-v1")
    log = b.read()
    pred = log.predict(b.spec, tensor_parallel_size=4, from_profile=False)
    assert pred.bytes_per_token == 2 * 94 * 1 * 128 * 2
    assert pred.tokens / log.gpu_kv_cache_tokens - 1 == pytest.approx(0.0114, abs=0.001)


def test_engine_config_line_v0():
    log = bundled_log("vllm-pr3120-opt-125m").read()
    assert (log.engine, log.tensor_parallel_size, log.max_model_len) == ("V0", 1, 2048)
    assert (log.model, log.kv_cache_dtype) == ("facebook/opt-125m", "auto")
    assert log.model_loading_gib == pytest.approx(244.61 / 1024)  # "MB" is MiB
    assert (log.num_gpu_blocks, log.num_cpu_blocks) == (76240, 7281)


def test_v1_non_default_args_and_new_profile_line():
    text = "\n".join([
        "(APIServer pid=1) INFO 08-06 10:08:29 [utils.py:233] non-default args: {'model': "
        "'Qwen/Qwen3-8B', 'max_model_len': 16384, 'gpu_memory_utilization': 0.79, "
        "'kv_cache_dtype': 'fp8', 'tensor_parallel_size': 2, 'max_num_batched_tokens': 8192}",
        # a line a user posted (wtdcode/vllm-backport#34)
        "(Worker_PP1_TP3 pid=4365) INFO 08-31 15:25:55 [gpu_worker.py:805] Free memory on device "
        "(22.93/23.56 GiB) on startup. Desired GPU memory utilization is (0.935, 22.03 GiB). "
        "Actual usage is 19.47 GiB for consumed memory (weights + non-torch), 0.6 GiB for peak "
        "activation, and 0.1 GiB for CUDAGraph memory.",
        "(EngineCore_DP0 pid=5) INFO 08-31 [kv_cache_utils.py:1] GPU KV cache size: 1,234,560 tokens",
        "INFO [kv_cache_utils.py:1] Maximum concurrency for 16,384 tokens per request: 75.35x",
    ])  # fmt: skip
    log = read_vllm_log(text)
    assert log.engine == "V1"
    assert (log.max_model_len, log.tensor_parallel_size, log.max_num_batched_tokens) == (
        16384,
        2,
        8192,
    )
    assert (log.kv_cache_dtype, log.model) == ("fp8", "Qwen/Qwen3-8B")
    assert (log.total_gpu_memory_gib, log.gpu_memory_utilization) == (23.56, 0.935)
    assert (log.activation_peak_gib, log.cuda_graph_gib) == (0.6, 0.1)
    # weights and non-torch memory in one figure: the KV budget is still the rest
    assert log.consumed_memory_gib == 19.47 and log.has_profile
    assert log.kv_cache_bytes_from_profile() == pytest.approx((23.56 * 0.935 - 19.47 - 0.6) * GiB)
    assert (log.gpu_kv_cache_tokens, log.max_concurrency_tokens, log.max_concurrency) == (
        1234560,
        16384,
        75.35,
    )


def test_cuda_graph_line():
    log = read_vllm_log(
        "INFO 09-22 [model_runner.py:960] Graph capturing finished in 5 secs, took 0.11 GiB"
    )
    assert log.cuda_graph_gib == 0.11


def test_tensor_parallel_takes_the_worker_with_the_least_kv_memory_and_says_so():
    # vLLM gives every worker the blocks of the smallest (kv_cache_utils: "the smallest among
    # all ranks"); 0.10 tags workers "(VllmWorker TP1 ..)", and may print TP1 first
    for tag in ("VllmWorker rank={}", "VllmWorker TP{}", "Worker_TP{}"):
        text = (
            f"({tag.format(0)} pid=6) INFO [gpu_worker.py:1] Available KV cache memory: 9.00 GiB\n"
            f"({tag.format(1)} pid=7) INFO [gpu_worker.py:1] Available KV cache memory: 8.50 GiB\n"
        )
        log = read_vllm_log(text)
        assert log.kv_cache_memory_gib == 8.5 and log.workers_seen == 2, tag
        assert any("least KV memory" in n for n in log.notes) and any("9.0" in n for n in log.notes)
    # V0 workers other than the driver name only their process: two of them are two workers
    v0 = (
        "INFO worker.py:1] the current vLLM instance can use total_gpu_memory (44.42GiB) x "
        "gpu_memory_utilization (0.90) = 39.98GiB\n"
        "(VllmWorkerProcess pid=11) INFO worker.py:1] the current vLLM instance can use "
        "total_gpu_memory (44.42GiB) x gpu_memory_utilization (0.90) = 39.98GiB\n"
        "(VllmWorkerProcess pid=12) INFO worker.py:1] the current vLLM instance can use "
        "total_gpu_memory (44.42GiB) x gpu_memory_utilization (0.90) = 39.98GiB\n"
    )
    assert read_vllm_log(v0).workers_seen == 3


def test_v0_refusal_names_the_slots_it_had():
    # vLLM 0.6.4 started for 29,000 tokens with 1,478 blocks of 16: it refused (as posted)
    log = bundled_log("vllm-10517-llama31-8b-rtx3090-29k").read()
    assert (log.max_model_len, log.gpu_kv_cache_tokens, log.num_gpu_blocks) == (29000, 23648, 1478)
    assert log.gpu_kv_cache_tokens == log.num_gpu_blocks * 16 and log.printed_blocks == 1478
    assert log.refusal == (
        "The model's max seq len (29000) is larger than the maximum number of tokens that can be "
        "stored in KV cache (23648)"
    )
    failure = log.start_failure()
    assert (failure.token_slots, failure.shortfall_tokens, failure.longest_request) == (
        23648,
        5352,
        23648,
    )
    # the same refusal of a 131,072-token server in another log
    oci = bundled_log("oci-aqua-llama31-8b-22gb-128k").read()
    assert (oci.max_model_len, oci.gpu_kv_cache_tokens) == (131072, 2356 * 16)
    # servers that started are no failure, even without a max_model_len line
    for name in (
        "vllm-10517-llama31-8b-rtx3090-20k",
        "a10g-qwen25-math-15b",
        "vllm-pr3120-opt-125m",
    ):
        log = bundled_log(name).read()
        assert log.refusal is None and log.start_failure() is None, name


def test_v1_refusal_wrapped_over_lines():
    # as a user posted it (the message broken after each clause); V1 prints memory, not blocks
    text = (
        "(EngineCore_DP0 pid=18799) ERROR 10-08 20:33:48 [core.py:708] ValueError: \n"
        "To serve at least one request with the models's max seq len (40960), \n"
        "(5.62 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(4.50 GiB). \nBased on the available memory, the estimated maximum model length is "
        "32768. \nTry increasing `gpu_memory_utilization` or decreasing `max_model_len`\n"
    )
    log = read_vllm_log(text)
    assert (log.engine, log.max_model_len, log.kv_cache_memory_gib) == ("V1", 40960, 4.5)
    assert (log.kv_cache_needed_gib, log.estimated_max_model_len) == (5.62, 32768)
    assert log.refusal.startswith("To serve at least one request with the models's max seq len")
    # without a model the slots are V1's own estimate; with one, counted from the KV memory
    assert log.start_failure().slots_from == "estimate"
    one_line = " ".join(text.split("\n"))
    assert read_vllm_log(one_line).estimated_max_model_len == 32768


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([1, 8, 16, 32, 64, 128]),
    num_blocks=st.integers(0, 5000),
    extra=st.sampled_from([-1, 0, 1]),
    k=st.integers(1, 6000),
)
def test_a_refusal_is_counted_in_whole_blocks(block_size, num_blocks, extra, k):
    # max_model_len at k x block_size - 1, k x block_size, k x block_size + 1
    max_len = max(1, k * block_size + extra)
    f = StartFailure(max_len, num_blocks * block_size, block_size, "printed")
    assert f.num_blocks == num_blocks
    assert f.max_concurrency == num_blocks * block_size / max_len
    assert f.shortfall_tokens == max(0, max_len - num_blocks * block_size)
    # one request of max_len tokens holds ceil(max_len / block_size) blocks
    need = -(-max_len // block_size)
    assert f.shortfall_blocks == max(0, need - num_blocks)
    assert (f.shortfall_blocks == 0) == (num_blocks * block_size >= max_len)


_CANONICAL = bundled_log("vllm-15815-qwen25-32b-2xl40s-tp2").text()
_prefix = st.sampled_from(
    ["", "2025-01-02T03:04:05.678Z ", "INFO 01-23 12:34:56 ", "\x1b[32mINFO\x1b[0m 01-23 ",
     "llama-1  | ", "[rank0]: ", "(EngineCore_DP0 pid=12) "]
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(prefixes=st.lists(_prefix, min_size=1, max_size=3), colour=st.booleans())
def test_prefixes_do_not_change_what_is_read(prefixes, colour):
    lines = []
    for i, line in enumerate(_CANONICAL.splitlines()):
        if colour:
            line = re.sub(r"(\d+\.\d+GiB)", "\x1b[1m\\1\x1b[0m", line)
        lines.append(prefixes[i % len(prefixes)] + line)
    got, want = read_vllm_log("\n".join(lines)), read_vllm_log(_CANONICAL)
    for name in (
        "total_gpu_memory_gib",
        "activation_peak_gib",
        "num_gpu_blocks",
        "kv_cache_memory_gib",
    ):
        assert getattr(got, name) == getattr(want, name)


def test_missing_lines_are_named():
    text = "\n".join(line for line in _CANONICAL.splitlines() if "blocks" not in line)
    log = read_vllm_log(text)
    assert "num_gpu_blocks" in log.missing and log.has_profile
    assert "max_num_batched_tokens" in log.missing


@given(st.text(alphabet=st.characters(blacklist_characters="0123456789"), max_size=300))
def test_garbage_is_refused(text):
    with pytest.raises(ValueError, match="no vLLM start-up line"):
        read_vllm_log(text)


@pytest.mark.parametrize(
    "bad, error", [(None, TypeError), (b"INFO", TypeError), (42, TypeError), ("", ValueError)]
)
def test_bad_input(bad, error):
    with pytest.raises(error):
        read_vllm_log(bad)


def test_kv_heads_replicated_beyond_their_number():
    # Llama-3-8B has 8 KV heads: 16 GPUs still hold one each, not half of one
    assert kv_bytes_per_token_per_gpu(LLAMA_3_8B, 16) == kv_bytes_per_token_per_gpu(LLAMA_3_8B, 8)
    assert kv_bytes_per_token_per_gpu(LLAMA_3_8B, 2) * 2 == LLAMA_3_8B.kv_bytes_per_token
    block = 16 * LLAMA_3_8B.kv_bytes_per_token
    assert blocks_for(LLAMA_3_8B, 10 * block - 1).num_blocks == 9  # whole blocks only


# --- the overhead model -----------------------------------------------------------------------


def test_constants_are_the_fit_of_the_bundled_logs():
    fit = overhead.fit_overhead()
    assert fit.num_logs >= 9
    assert overhead.ACTIVATION_FLOOR_GIB == pytest.approx(fit.activation_floor_gib, abs=0.006)
    assert overhead.ACTIVATION_SLOPE == pytest.approx(fit.activation_slope, abs=0.006)
    assert overhead.NON_TORCH_GIB == pytest.approx(fit.non_torch_gib, abs=0.0006)
    assert overhead.NON_TORCH_TP_EXTRA_GIB == fit.non_torch_tp_extra_gib == 0.0


def test_the_reported_spread_is_the_leave_one_out_of_the_bundled_logs():
    in_sample = overhead.kv_errors()
    loo = overhead.leave_one_out()
    assert set(loo) == set(in_sample) and len(loo) == overhead.KV_ERROR_NUM_LOGS >= 9
    for stored, errors in (
        (overhead.KV_ERROR_LOO, loo.values()),
        (overhead.KV_ERROR_IN_SAMPLE, [m for m, _ in in_sample.values()]),
        (overhead.KV_ERROR_FIXED, [f for _, f in in_sample.values()]),
    ):
        assert stored == pytest.approx(overhead.spread(errors), abs=0.0006)
    # out of sample is no better than in sample, and the model beats the fixed 2 GiB
    assert overhead.KV_ERROR_LOO[0] >= overhead.KV_ERROR_IN_SAMPLE[0]
    assert overhead.KV_ERROR_LOO[0] < overhead.KV_ERROR_FIXED[0]
    assert overhead.KV_ERROR_LOO[1] < overhead.KV_ERROR_FIXED[1]
    est = overhead.predict_overhead(LLAMA_3_8B, max_num_batched_tokens=8192)
    assert (est.kv_error_max, est.kv_error_typical) == overhead.KV_ERROR_LOO
    assert est.num_logs == len(loo) and est.kv_error_fixed_2gib == overhead.KV_ERROR_FIXED
    assert f"leave-one-out from {len(loo)} real logs" in str(est) and "in sample" in str(est)


def test_leave_one_out_predicts_the_log_left_out_from_the_others():
    name = "t4-qwen25-15b-instruct-fp16"
    others = [b for b in BUNDLED_LOGS if b.name != name]
    fit = overhead.fit_overhead(others)
    assert fit.num_logs == overhead.fit_overhead().num_logs - 1
    assert overhead.leave_one_out()[name] == overhead.kv_errors(fit)[name][0]
    with pytest.raises(ValueError):
        overhead.spread([])


def test_overhead_grows_with_tokens_tp_and_has_a_floor():
    small = overhead.predict_overhead(LLAMA_3_8B, max_num_batched_tokens=512)
    big = overhead.predict_overhead(LLAMA_3_8B, max_num_batched_tokens=32768)
    assert small.activation_bytes == pytest.approx(overhead.ACTIVATION_FLOOR_GIB * GiB)
    assert big.activation_bytes > 3 * GiB > small.activation_bytes
    tp = overhead.predict_overhead(LLAMA_3_8B, max_num_batched_tokens=512, tensor_parallel_size=2)
    assert tp.non_torch_bytes == small.non_torch_bytes  # no TP extra: the logs do not support one
    assert (
        small.cuda_graph_bytes > 0
        and small.overhead_bytes == small.activation_bytes + small.non_torch_bytes
    )
    from kvlab.models import ModelSpec

    with pytest.raises(ValueError, match="intermediate_size"):
        overhead.predict_overhead(
            ModelSpec("x", 2, 2, 2, 64, hidden_size=128), max_num_batched_tokens=8
        )
