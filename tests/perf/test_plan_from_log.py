"""`plan(vllm_log=...)` and `kvlab plan --vllm-log / --model-config / --kv-cache-dtype`: a plan
re-made with the memory a real start-up log measured counts the blocks the log printed."""

import json

import pytest

from kvlab.cli import main
from kvlab.models import LLAMA_3_8B
from kvlab.perf.gpus import GiB
from kvlab.perf.planner import plan
from kvlab.perf.vllm_log import BUNDLED_LOGS, bundled_log, read_vllm_log

# the bundled logs that print a memory profile and the blocks (or token slots) it gave
CHECKABLE = [
    b
    for b in BUNDLED_LOGS
    if b.read().has_profile and b.read().printed_tokens is not None and b.spec.num_params
]


def test_there_are_logs_to_check_against():
    assert len(CHECKABLE) >= 4, [b.name for b in CHECKABLE]


@pytest.mark.parametrize("bundled", CHECKABLE, ids=lambda b: b.name)
def test_a_plan_from_a_logs_memory_counts_the_blocks_it_printed(bundled):
    log = bundled.read()
    p = plan(
        bundled.spec,
        "H100-80GB",  # bandwidth and FLOP/s only: the memory is the log's
        vllm_log=log,  # tensor parallel: from the workers and the weights each loaded
        max_seq_len=min(log.max_model_len or 2048, bundled.spec.max_context or 2048),
        max_num_seqs=bundled.max_num_seqs,
    )
    check = p.log_check
    assert p.num_gpus == bundled.tensor_parallel_size
    assert check["printed_blocks"] and abs(check["error"]) < 0.01, check
    assert p.memory.source == "vllm-log" and p.memory.spread is None
    assert p.gpu.memory_bytes == pytest.approx(log.total_gpu_memory_gib * GiB)
    assert p.weights_bytes == pytest.approx(bundled.tensor_parallel_size * log.weights_gib * GiB)
    assert "Blocks predicted from its memory" in p.summary and "the log printed" in p.summary


def test_a_log_fixes_the_set_up_it_ran():
    bundled = bundled_log("vllm-15815-qwen25-32b-2xl40s-tp2")
    # the arguments line V1 prints first (this excerpt has none: the post left it out)
    args = "INFO non-default args: {'tensor_parallel_size': 2, 'block_size': 32, 'max_model_len': 4096}\n"
    p = plan(bundled.spec, "H100-80GB", vllm_log=args + bundled.text())
    assert (p.num_gpus, p.block_size, p.max_seq_len) == (2, 32, 4096)
    assert p.weights_bytes == pytest.approx(2 * 30.71 * GiB)
    with pytest.raises(
        ValueError, match=r"num_gpus=4 disagrees with the vLLM log, which ran with 2"
    ):
        plan(bundled.spec, "H100-80GB", vllm_log=args + bundled.text(), num_gpus=4)
    with pytest.raises(ValueError, match="block_size=64 disagrees"):
        plan(bundled.spec, "H100-80GB", vllm_log=args + bundled.text(), block_size=64)


def test_a_log_without_any_kv_figure_is_named():
    weights_only = "INFO model_runner.py:1] Loading model weights took 14.9888 GB\n"
    with pytest.raises(ValueError, match="neither its memory profile .* nor its KV cache"):
        plan(LLAMA_3_8B, "H100-80GB", vllm_log=weights_only)
    with pytest.raises(TypeError, match="vllm_log must be"):
        plan(LLAMA_3_8B, "H100-80GB", vllm_log=b"bytes")


def _cli(capsys, *argv):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_kvlab_plan_reads_a_log(capsys, tmp_path):
    bundled = bundled_log("vllm-10517-llama31-8b-rtx3090-20k")
    path = tmp_path / "startup.log"
    path.write_text(bundled.text())
    code, out, err = _cli(capsys, "--vllm-log", str(path), "--gpu", "L4", "--model", "Llama-3.1-8B")
    assert code == 0, err
    assert "From the vLLM log (V0): GPU memory 23.58 GiB" in out
    assert "Blocks predicted from its memory: 1,951; the log printed 1,952 (-0.05%)" in out
    assert "(measured by the vLLM log)" in out and "requests up to 20,000 tokens" in out
    code, out, err = _cli(
        capsys, "--vllm-log", str(path), "--gpu", "L4", "--model", "Llama-3.1-8B", "--json"
    )
    blob = json.loads(out)
    assert blob["memory"]["source"] == "vllm-log" and blob["vllm_log"]["printed_blocks"] == 1952
    assert {"token_slots", "num_blocks", "max_concurrency"} <= set(blob["capacity"])


def test_kvlab_plan_reads_logs_without_a_profile_and_one_that_would_not_start(capsys):
    from importlib import resources

    logs = resources.files("kvlab.perf").joinpath("vllm_logs")
    with resources.as_file(logs.joinpath("vllm-10517-llama31-8b-rtx3090-29k.log")) as path:
        code, out, err = _cli(
            capsys, "--vllm-log", str(path), "--gpu", "L4", "--model", "Llama-3.1-8B"
        )
    assert code == 0, err
    assert "The logged server would not start (vLLM: \"The model's max seq len (29000)" in out
    assert "23,648 token slots (1,478 blocks of 16), 5,352 short" in out
    assert "requests up to 23,648 tokens" in out
    with resources.as_file(logs.joinpath("rtx4080-qwen25-7b-awq-v1.log")) as path:
        code, out, err = _cli(
            capsys,
            "--vllm-log",
            str(path),
            "--gpu",
            "H100",
            "--model",
            "Qwen2.5-7B-Instruct",
            "--json",
        )
        assert code == 0, err
        blob = json.loads(out)
        assert (
            blob["capacity"]["token_slots"] == 149_712 and blob["memory"]["source"] == "predicted"
        )
        assert blob["vllm_log"]["capacity_from"] == "printed" and blob["memory"]["spread"] is None
        code, out, err = _cli(
            capsys, "--vllm-log", str(path), "--gpu", "T4", "--model", "Qwen2.5-7B-Instruct"
        )
    assert code == 2 and "--weights-gib" in err and "more than the 15.00 GiB" in err


def test_kvlab_plan_without_a_log_says_how_sure_it_is(capsys):
    code, out, err = _cli(capsys, "--model", "Llama-3-8B", "--gpu", "H100-80GB")
    assert code == 0, err
    assert "(predicted for 8,192 tokens a step)" in out
    assert "How sure: KV capacity ±" in out and "real vLLM start-up logs" in out
    blob = json.loads(_cli(capsys, "--model", "Llama-3-8B", "--gpu", "H100-80GB", "--json")[1])
    assert blob["memory"]["source"] == "predicted" and blob["memory"]["kv_error_max"] > 0


def test_kvlab_plan_takes_a_config_json_and_an_fp8_cache(capsys, tmp_path):
    config = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = _cli(capsys, "--model-config", str(path), "--gpu", "H100", "--json")
    assert code == 0, err
    from_config = json.loads(out)
    preset = json.loads(_cli(capsys, "--model", "Llama-3-8B", "--gpu", "H100", "--json")[1])
    assert from_config["capacity"]["bytes_per_token"] == preset["capacity"]["bytes_per_token"]
    fp8 = json.loads(
        _cli(capsys, "--model", "Llama-3-8B", "--gpu", "H100", "--kv-cache-dtype", "fp8", "--json")[
            1
        ]
    )
    assert fp8["capacity"]["bytes_per_token"] * 2 == preset["capacity"]["bytes_per_token"]
    assert fp8["vllm_flags"]["--kv-cache-dtype"] == "fp8"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "H100"], "--model (a preset) or --model-config"),
        (["--gpu", "H100", "--model", "Llama-3-8B", "--model-config", "x"], "not both"),
        (["--gpu", "H100", "--model-config", "/nonexistent/config.json"], "--model-config: cannot"),
        (["--gpu", "H100", "--model", "Llama-3-8B", "--vllm-log", "/nonexistent"], "--vllm-log:"),
        (
            ["--gpu", "H100", "--model", "Llama-3-8B", "--kv-cache-dtype", "int3"],
            "--kv-cache-dtype",
        ),
        (
            ["--gpu", "H100", "--model", "Llama-3-8B", "--max-num-batched-tokens", "0"],
            "--max-num-b",
        ),
    ],
)
def test_kvlab_plan_bad_inputs_name_the_flag(capsys, argv, message):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and message in err and out == "", err


def test_a_log_of_another_model_or_size_is_named():
    bundled = bundled_log("vllm-pr10511-llama3-8b-h100")
    with pytest.raises(ValueError, match=r"log's weights \(14.96 GiB per GPU\) are no whole share"):
        plan("OPT-13B", "H100-80GB", vllm_log=bundled.text(), max_seq_len=2048)
    with pytest.raises(ValueError, match=r"are not Llama-3-8B's at num_gpus=2"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=bundled.text(), num_gpus=2)
    with pytest.raises(ValueError, match="gpu_memory_gib=40 disagrees with the vLLM log"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=bundled.text(), gpu_memory_gib=40)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.5 disagrees"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=bundled.text(), gpu_memory_utilization=0.5)
    args = "INFO non-default args: {'kv_cache_dtype': 'auto'}\n"
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' disagrees"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=args + bundled.text(), kv_cache_dtype="fp8")


def test_a_v1_log_that_prints_only_its_kv_cache_plans_with_the_gpu_named():
    # what a V1 server prints at INFO: weights, the KV memory each worker kept, the cache's size
    text = (
        "(EngineCore_0 pid=8) INFO [gpu_model_runner.py:1] Model loading took 14.99 GiB\n"
        "(EngineCore_0 pid=8) INFO [gpu_worker.py:1] Available KV cache memory: 54.96 GiB\n"
        "(EngineCore_0 pid=8) INFO [kv_cache_utils.py:1] GPU KV cache size: 450,256 tokens\n"
    )
    # no utilization line: the capacity is the log's, the overhead predicted, the share implied
    p = plan("Llama-3-8B", "H100-80GB", vllm_log=text)
    assert (p.capacity.token_slots, p.capacity.num_blocks) == (450_256, 450_256 // 16)
    assert p.kv_cache_bytes == pytest.approx(54.96 * GiB)
    assert p.memory.source == "predicted" and p.memory.spread is None  # the KV was measured
    implied = (14.99 * GiB + p.overhead_bytes + 54.96 * GiB) / p.gpu.memory_bytes
    assert p.gpu_memory_utilization == pytest.approx(implied)
    assert f"gpu_memory_utilization {implied:.3f} implied" in p.summary
    assert "predicted by kvlab's overhead model" in p.summary
    assert "GPU memory 79.65 GiB from the GPU named" in p.summary
    # the printed size counts the printed tokens to within its rounding (0.01 GiB)
    assert p.log_check["capacity_from"] == "printed" and abs(p.log_check["error"]) < 0.001
    # with the utilization given, the overhead is the rest of that budget, as before
    given = plan("Llama-3-8B", "H100-80GB", vllm_log=text, gpu_memory_utilization=0.9)
    assert given.memory.source == "vllm-log" and given.num_gpus == 1
    assert given.capacity.token_slots == 450_256
    assert given.overhead_bytes == pytest.approx((0.9 * given.gpu.memory_bytes) - 69.95 * GiB)
    # a share that cannot hold the log's own weights and cache is named, not a negative overhead
    with pytest.raises(ValueError, match=r"more than 79.65 GiB x gpu_memory_utilization 0.5"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=text, gpu_memory_utilization=0.5)


def test_the_149712_token_v1_log_plans_with_nothing_more_given():
    # vLLM 0.26 at INFO: "Available KV cache memory", "GPU KV cache size", "Maximum concurrency"
    bundled = bundled_log("rtx4080-qwen25-7b-awq-v1")
    log = bundled.read()
    assert (log.engine, log.gpu_kv_cache_tokens, log.max_concurrency_tokens) == (
        "V1",
        149_712,
        32_768,
    )
    p = plan("Qwen2.5-7B-Instruct", "H100-80GB", vllm_log=log)
    assert (p.capacity.token_slots, p.capacity.num_blocks, p.max_seq_len) == (149_712, 9357, 32_768)
    # max concurrency as vLLM counts it: blocks x block_size / max_model_len
    assert p.capacity.max_concurrency == 9357 * 16 / 32_768
    assert round(p.capacity.max_concurrency, 2) == log.max_concurrency == 4.57
    assert round(p.log_check["max_concurrency"], 2) == 4.57
    # its 8.0 GiB hold 9,362 blocks of 57,344-byte tokens: the printed size is rounded
    assert p.log_check["predicted_blocks"] == int(8.0 * GiB // (16 * 57_344))
    assert "Capacity as the log measured it: 9,357 blocks of 16 (149,712 token slots)" in p.summary
    assert "weights 14.17 GiB per GPU from the model (the log prints none)" in p.summary
    # its own GPU (15.99 GiB) cannot hold the model's 16-bit weights beside that cache: named
    with pytest.raises(
        ValueError, match=r"more than the 15.99 GiB of the GPU named.*weights_bytes"
    ):
        plan("Qwen2.5-7B-Instruct", "L4-24GB", vllm_log=log, gpu_memory_gib=15.99)
    awq = plan(
        "Qwen2.5-7B-Instruct", "L4-24GB", vllm_log=log, gpu_memory_gib=15.99,
        weights_bytes=5.29 * GiB,  # the post's AWQ weights
    )  # fmt: skip
    assert awq.capacity.token_slots == 149_712 and 0.85 < awq.gpu_memory_utilization < 1


def test_blocks_beside_the_weights_plan_without_a_memory_profile():
    # V1 0.7.1 printed its weights, its blocks and the concurrency, nothing else
    bundled = bundled_log("vllm-pr12569-llama31-70b-w8a8-v1")
    log = bundled.read()
    p = plan(bundled.spec, "H100-80GB", vllm_log=log)
    assert (p.capacity.num_blocks, p.max_seq_len) == (1381, 2048)
    assert round(p.capacity.max_concurrency, 2) == log.max_concurrency == 10.79
    assert p.memory.source == "predicted" and p.log_check["predicted_blocks"] is None
    # 67.72 GiB is half the 16-bit weights: tensor parallel 2 is inferred, and said
    assert p.num_gpus == 2 and "tensor parallel 2: each GPU loaded 1/2" in p.summary
    # the post's set-up: one GPU with 8-bit weights
    one = plan(bundled.spec, "H100-80GB", vllm_log=log, num_gpus=1, weights_bytes=67.7229 * GiB)
    assert (one.num_gpus, one.capacity.num_blocks) == (1, 1381)
    kv = 1381 * 16 * 2 * 80 * 8 * 128 * 2  # blocks x tokens x K and V of 80 layers' 8 heads
    assert one.kv_cache_bytes == pytest.approx(kv)
    assert "the 22,096 token slots the log printed" in one.summary
    assert 0.9 < one.gpu_memory_utilization < 1


def _without(text: str, *words: str) -> str:
    return "\n".join(line for line in text.splitlines() if not any(w in line for w in words))


_UTILIZATION = ("gpu_memory_utilization", "the current vLLM instance can use")
# the profiles that still print the KV cache and the overhead once their utilization line is cut
TRIMMABLE = [
    b
    for b in BUNDLED_LOGS
    if b.spec.num_params
    and (t := read_vllm_log(_without(b.text(), *_UTILIZATION)))
    and t.kv_cache_memory_gib is not None
    and t.activation_gib is not None
    and t.non_torch_memory_gib is not None
]


def test_there_are_logs_to_cut_the_utilization_from():
    assert len(TRIMMABLE) >= 8, [b.name for b in TRIMMABLE]


@pytest.mark.parametrize("bundled", TRIMMABLE, ids=lambda b: b.name)
def test_a_log_without_its_utilization_line_plans_from_its_kv_size(bundled):
    log = bundled.read()
    cut = read_vllm_log(_without(bundled.text(), *_UTILIZATION))
    assert cut.gpu_memory_utilization is None and not cut.has_profile
    p = plan(
        bundled.spec,
        "H100-80GB",
        vllm_log=cut,
        gpu_memory_gib=None if cut.total_gpu_memory_gib else log.total_gpu_memory_gib,
        max_seq_len=min(log.max_model_len or 2048, bundled.spec.max_context or 2048),
        max_num_seqs=bundled.max_num_seqs,
    )
    assert p.num_gpus == bundled.tensor_parallel_size
    # the share the server ran with comes back from its own figures (each rounded to 0.01 GiB)
    assert p.gpu_memory_utilization == pytest.approx(log.gpu_memory_utilization, abs=0.006)
    assert p.memory.source == "vllm-log" and "implied" in p.summary
    if log.num_gpu_blocks:  # the blocks it printed are the capacity
        assert p.capacity.num_blocks == log.num_gpu_blocks
        assert abs(p.log_check["error"]) < 0.01
    else:
        assert p.kv_cache_bytes == pytest.approx(
            bundled.tensor_parallel_size * log.kv_cache_memory_gib * GiB
        )


def test_a_server_that_would_not_start_is_read_as_what_it_had():
    bundled = bundled_log("vllm-10517-llama31-8b-rtx3090-29k")
    log = bundled.read()
    assert log.refusal.startswith("The model's max seq len (29000) is larger than")
    p = plan("Llama-3.1-8B", "L4-24GB", vllm_log=log)
    failure = p.log_start_failure
    assert (failure.token_slots, failure.num_blocks, failure.block_size) == (23_648, 1478, 16)
    assert (failure.max_model_len, failure.shortfall_tokens) == (29_000, 5_352)
    assert failure.shortfall_blocks == -(-29_000 // 16) - 1478 == 335
    assert round(failure.max_concurrency, 2) == log.max_concurrency == 0.82
    # planned for the longest request it could hold, and said so
    assert p.max_seq_len == 23_648 and p.capacity.token_slots >= 23_648
    assert "would not start" in p.summary and "5,352 short of one request" in p.summary
    assert "335 more blocks (0.65 GiB more KV memory per GPU" in p.summary
    assert "gpu_memory_utilization 0.928 or more" in p.summary
    check = p.log_check["start_failure"]
    assert check["kv_bytes_short_per_gpu"] == 335 * 16 * LLAMA_3_8B.kv_bytes_per_token
    # the excerpt without vLLM's error line still shows it: 1,478 x 16 < 29,000
    cut = plan("Llama-3.1-8B", "L4-24GB", vllm_log=_without(bundled.text(), "max seq len"))
    assert cut.log_start_failure.token_slots == 23_648 and cut.log_start_failure.refusal is None
    # a length the caller asks for is planned, or refused, as asked
    assert plan("Llama-3.1-8B", "L4-24GB", vllm_log=log, max_seq_len=2048).max_seq_len == 2048
    with pytest.raises(ValueError, match="could never run"):
        plan("Llama-3.1-8B", "L4-24GB", vllm_log=log, max_seq_len=29_000)


def test_a_v1_server_that_would_not_start_is_read_from_its_refusal():
    # V1 prints memory, not blocks, when it refuses (as posted, wrapped over lines)
    text = (
        "(EngineCore_DP0 pid=18799) ERROR 10-08 20:33:48 [core.py:708] ValueError: \n"
        "To serve at least one request with the models's max seq len (40960), \n"
        "(5.62 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(4.50 GiB). \nBased on the available memory, the estimated maximum model length is "
        "32768. \nTry increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.\n"
    )
    from kvlab.models import ModelSpec

    qwen3_8b = ModelSpec(
        "Qwen3-8B", 36, 32, 8, 128, num_params=8.19e9, max_context=40960, hidden_size=4096,
        intermediate_size=12288, vocab_size=151936,
    )  # fmt: skip
    p = plan(qwen3_8b, "L4-24GB", vllm_log=text)
    failure = p.log_start_failure
    assert (failure.max_model_len, failure.token_slots, failure.slots_from) == (
        40960,
        32768,
        "kv-size",
    )
    assert failure.estimated_max_model_len == 32768 and failure.shortfall_tokens == 8192
    assert p.max_seq_len == 32768 and p.capacity.num_blocks == 2048
    # 40,960 tokens x 144 KiB: the 5.62 GiB it printed
    assert 40960 * qwen3_8b.kv_bytes_per_token / GiB == pytest.approx(5.62, abs=0.006)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"max_num_seqs": 0},
        {"max_num_batched_tokens": 512},
        {"gpu": "L4-24GB", "max_seq_len": 4096},
        {"min_tokens_per_user": 40},
    ],
)
def test_the_printed_vllm_command_passes_vllms_own_checks(kwargs):
    p = plan("Llama-3-8B", kwargs.pop("gpu", "H100-80GB"), **kwargs)
    flags = p.vllm_flags()
    # vLLM's SchedulerConfig: max_num_batched_tokens >= max_num_seqs
    assert int(flags["--max-num-batched-tokens"]) >= int(flags["--max-num-seqs"]), flags
    assert p.paged.concurrency <= int(flags["--max-num-seqs"]) + 1


def test_more_requests_at_once_than_a_steps_tokens_is_refused():
    with pytest.raises(ValueError, match=r"max_num_seqs=4,096 is more than max_num_batched_tokens"):
        plan("Llama-3-8B", "L4-24GB", max_seq_len=4096, max_num_seqs=4096)


def test_the_spread_says_where_it_was_not_measured():
    from kvlab.perf import overhead

    fitted = [
        b for b in BUNDLED_LOGS if b.fit and b.max_num_batched_tokens and b.read().has_profile
    ]
    assert overhead.FITTED_TENSOR_PARALLEL == max(b.tensor_parallel_size for b in fitted)
    assert "beyond what was measured" not in plan("Llama-3-70B", "H200", num_gpus=2).memory.spread
    eight = plan("Llama-3-70B", "H200", num_gpus=8).memory.spread
    assert "set-ups of at most 2 GPUs: 8 per copy is beyond what was measured" in eight
