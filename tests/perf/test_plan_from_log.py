"""`plan(vllm_log=...)` and `kvlab plan --vllm-log / --model-config / --kv-cache-dtype`: a plan
re-made with the memory a real start-up log measured counts the blocks the log printed."""

import json

import pytest

from kvlab.cli import main
from kvlab.models import LLAMA_3_8B
from kvlab.perf.gpus import GiB
from kvlab.perf.planner import plan
from kvlab.perf.vllm_log import BUNDLED_LOGS, bundled_log

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


def test_a_log_without_memory_lines_is_named():
    blocks_only = "INFO # GPU blocks: 1000, # CPU blocks: 2048\n"
    with pytest.raises(ValueError, match="prints no gpu_memory_utilization: give the one"):
        plan(LLAMA_3_8B, "H100-80GB", vllm_log=blocks_only)
    with pytest.raises(ValueError, match="neither its memory profile .* nor its KV cache size"):
        plan(LLAMA_3_8B, "H100-80GB", vllm_log=blocks_only, gpu_memory_utilization=0.9)
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
    with pytest.raises(ValueError, match="prints no gpu_memory_utilization"):
        plan("Llama-3-8B", "H100-80GB", vllm_log=text)
    p = plan("Llama-3-8B", "H100-80GB", vllm_log=text, gpu_memory_utilization=0.9)
    assert p.memory.source == "vllm-log" and p.num_gpus == 1
    assert p.kv_cache_bytes == pytest.approx(54.96 * GiB)
    assert abs(p.log_check["error"]) < 0.001, p.log_check
    assert "GPU memory 79.65 GiB from the GPU named" in p.summary


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
