"""`kvlab plan --model-config` on the 12 real config.json files of issue 34, against vLLM v1's
accounting (vLLM v1 accounting, issue 34: its "requests at full length" column, computed with
vLLM's kv_cache_interface / kv_cache_utils on kvlab's own KV budget, so that only the per-token
and per-request accounting differs): within 5%, 15% for the Mamba / linear-attention hybrids."""

import contextlib
import io
import json
import warnings
from pathlib import Path

import pytest

from kvlab.cli import main as cli_main

CONFIGS = Path(__file__).resolve().parents[2] / "kvlab" / "models" / "hf_configs"

# model, kvlab plan flags, vLLM's figure (vLLM v1 accounting, issue 34), tolerance
SETUPS = [
    ("Llama-3.1-8B", ["--gpu", "H100-80GB"], 3.45, 0.05),
    ("Llama-3.1-70B", ["--gpu", "H100-80GB", "--gpus", "8"], 10.74, 0.05),
    ("Qwen3-8B", ["--gpu", "H100-80GB"], 9.75, 0.05),
    ("Qwen2.5-7B", ["--gpu", "H100-80GB"], 31.97, 0.05),
    ("Mistral-7B-v0.1", ["--gpu", "H100-80GB"], 37.7, 0.05),
    ("Gemma-3-27B", ["--gpu", "H200-141GB"], 5.19, 0.05),
    # mxfp4 checkpoints: their weights as published (13.8 GB and 65.3 GB: 12.8 and 60.8 GiB)
    ("gpt-oss-20b", ["--gpu", "H100-80GB", "--weights-gib", "12.8"], 18.0, 0.05),
    ("gpt-oss-120b", ["--gpu", "H100-80GB", "--gpus", "2", "--weights-gib", "60.8"], 16.6, 0.05),
    ("Qwen3-30B-A3B", ["--gpu", "H100-80GB"], 3.53, 0.05),
    # fp8 checkpoint: 689 GB of weights (642 GiB), one MLA copy on each of 8 GPUs
    ("DeepSeek-V3", ["--gpu", "H200-141GB", "--gpus", "8", "--weights-gib", "642"], 4.16, 0.05),
    # the budget for this row counted Nemotron-H's 52 layers as dense Llama layers
    # (17.0B parameters, 31.66 GiB): the same budget here, so that only the accounting differs
    # (its real 8.1B parameters leave 55 GiB of KV and 310 requests)
    ("Nemotron-H-8B", ["--gpu", "H100-80GB", "--weights-gib", "31.66"], 222, 0.15),
    ("Qwen3.5-9B", ["--gpu", "H100-80GB"], 6.8, 0.15),
]


def run_plan(model: str, flags: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # none of the 12 needs a guess
        code = cli_main(
            ["plan", "--model-config", str(CONFIGS / f"{model}.json"), *flags, "--json"]
        )
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.mark.parametrize("model, flags, vllm, tolerance", SETUPS, ids=[s[0] for s in SETUPS])
def test_max_concurrency_matches_vllms_accounting(model, flags, vllm, tolerance):
    plan = run_plan(model, flags)
    assert plan["capacity"]["max_concurrency"] == pytest.approx(vllm, rel=tolerance)
    groups = plan["kv_groups"]
    assert groups and all(g["layers"] > 0 and g["reserved_bytes_per_request"] > 0 for g in groups)
    config = json.loads((CONFIGS / f"{model}.json").read_text())
    layers = config.get("text_config", config)["num_hidden_layers"]
    cached = sum(g["layers"] for g in groups)
    assert cached <= layers  # Nemotron-H's MLP layers keep no cache


def test_the_summary_names_the_window_latent_and_state():
    words = {
        "Mistral-7B-v0.1": "sliding window of 4,096 tokens",
        "Gemma-3-27B": "sliding window of 1,024 tokens",
        "DeepSeek-V3": "latent attention (MLA), 512 + 64 elements",
        "Nemotron-H-8B": "mamba2 state of 2,158,592 bytes",
        "Qwen3.5-9B": "gated_deltanet state of 1,097,728 bytes",
    }
    setups = {s[0]: s[1] for s in SETUPS}
    for model, said in words.items():
        summary = run_plan(model, setups[model])["summary"]
        assert said in summary and "KV layout (as vLLM v1)" in summary, model


def test_gemma_3_fits_an_h100_at_its_full_context():
    plan = run_plan("Gemma-3-27B", ["--gpu", "H100-80GB"])
    assert plan["capacity"]["max_concurrency"] > 1
    assert plan["inputs"]["max_seq_len"] == 131072


def test_a_quantised_checkpoint_asks_for_its_weights():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(
            ["plan", "--model-config", str(CONFIGS / "gpt-oss-20b.json"), "--gpu", "H100"]
        )
    assert code == 2 and "mxfp4" in err.getvalue() and "--weights-gib" in err.getvalue()


def test_dense_models_keep_todays_figures():
    # one full-attention group: the old formula, the same blocks
    plan = run_plan("Llama-3.1-8B", ["--gpu", "H100-80GB"])
    assert plan["capacity"]["reserve_blocks"] is None
    assert plan["kv_groups"][0]["bytes_per_token"] == 131_072


def test_a_config_file_not_named_config_json_is_named_for_its_file():
    summary = run_plan("Gemma-3-27B", ["--gpu", "H200"])["summary"]
    assert summary.startswith("Gemma-3-27B on H200")
