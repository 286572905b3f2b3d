"""kvlab.perf.planner and `kvlab plan`: hand-computed cases, real numbers, the simulator, bad input."""

import dataclasses
import json
import math

import cpu_limit
import pytest
from conftest import LEARNER_ENV, ROOT, kvlab_cli

from kvlab.cli import main as cli_main
from kvlab.models import LLAMA_3_8B, LLAMA_3_70B, OPT_13B, ModelSpec
from kvlab.perf import gpus
from kvlab.perf.gpus import GiB, PricedGPU
from kvlab.perf.planner import (
    ARENA_PACKING,
    DEFAULT_OVERHEAD_PER_GPU,
    POLICIES,
    REALISTIC_FRACTION,
    SIMULATION_TOLERANCE,
    SLOW_TOKENS_PER_USER,
    _named_stats,
    compare_with_simulation,
    kv_capacity,
    plan,
    vllm_default_max_num_seqs,
    workload_stats,
)
from kvlab.perf.roofline import GPUS, H100_SXM, StepTime
from kvlab.serving.workload import Request

# A toy model and GPU with round numbers, so every figure below can be worked out by hand.
# K and V of one token: 2 x 1 layer x 1 KV head x 256 dims x 2 bytes = 1,024 bytes.
# Weights: 2**29 parameters x 2 bytes = 1 GiB.
TOY = ModelSpec("toy", 1, 1, 1, 256, dtype_bytes=2, num_params=2**29, max_context=1024)
TOY_GPU = PricedGPU("toy-gpu", 1e12, 1e15, 4 * GiB, price_per_hour=3.6)
# Every request: 100 prompt tokens, 200 generated.
TOY_DAY = [Request(100, 200)] * 10


def toy_plan(model=TOY, **kw):
    args = dict(
        gpu_memory_utilization=0.5,
        overhead_bytes=0.5 * GiB,
        workload=TOY_DAY,
        max_seq_len=1024,
        target_tokens_per_s=1e6,
        max_num_seqs=0,  # no cap: memory decides (vLLM's default would cap the toy GPU at 256)
        max_num_batched_tokens=16_384,  # a step's tokens, which also bound the requests at once
    )
    return plan(model, TOY_GPU, **{**args, **kw})


# --- hand-computed cases ------------------------------------------------------------------------


def test_kv_bytes_and_capacity_by_hand():
    # KV = 4 GiB x 0.5 - 1 GiB weights - 0.5 GiB overhead = 0.5 GiB = 536,870,912 bytes.
    # A block: 16 tokens x 1,024 bytes = 16 KiB, so 0.5 GiB / 16 KiB = 32,768 blocks
    # = 524,288 token slots = 512 requests of 1,024 tokens.
    p = toy_plan()
    assert p.weights_bytes == GiB and p.overhead_bytes == 0.5 * GiB
    assert p.kv_cache_bytes == 0.5 * GiB
    assert p.capacity.bytes_per_token == 1024 and p.capacity.block_bytes == 16 * 1024
    assert p.capacity.num_blocks == 32_768 and p.capacity.token_slots == 524_288
    assert p.capacity.max_concurrency == 512
    # the default overhead: 2 GiB per GPU
    assert toy_plan(overhead_bytes=None, gpu_memory_utilization=1.0).kv_cache_bytes == GiB


def test_footprints_and_concurrency_by_hand():
    # Time-weighted footprint of a 100 + 200 request (all alike, so simply its mean booking):
    #   Orca-Max 1,024; Pow2: next power of two of 300 = 512; Oracle: 300;
    #   paged: in its g-th step it holds ceil((100 + g) / 16) blocks, g = 1..200:
    #   sum_{t=101}^{300} ceil(t/16) = 2,964 - 364 = 2,600 blocks x 16 / 200 steps = 208 tokens
    #   (prompt + half the output + half a block: 100 + 100 + 8).
    p = toy_plan()
    fp = {c: e.footprint_tokens for c, e in p.policies.items()}
    assert fp == {
        "contiguous": 1024,
        "contiguous-pow2": 512,
        "contiguous-oracle": 300,
        "paged": 208,
    }
    conc = {c: e.concurrency for c, e in p.policies.items()}
    assert conc["contiguous"] == 524_288 // 1024 == 512
    assert conc["contiguous-pow2"] == pytest.approx(0.9 * 524_288 / 512)  # 921.6
    assert conc["contiguous-oracle"] == pytest.approx(0.9 * 524_288 / 300)  # 1,572.9
    assert conc["paged"] == pytest.approx(524_288 / 208)  # 2,520.6
    assert ARENA_PACKING == 0.9
    # tokens held: 100 + g in step g, mean 200.5: 512 x 200.5 / 524,288 = 19.6% for Orca-Max
    assert p.contiguous.memory_holding_tokens == pytest.approx(0.19580078125)
    assert p.paged.memory_holding_tokens == pytest.approx(200.5 / 208)
    assert p.concurrency_gain == pytest.approx((524_288 / 208) / 512)


def test_bandwidth_bound_cost_and_gpus_by_hand():
    # Orca-Max, 512 running, each reading 100 + (200 - 1)/2 = 199.5 tokens of K/V per step:
    #   bytes = 1 GiB + 512 x 199.5 x 1,024 = 1,178,337,280  -> 1.17833728 ms at 1 TB/s
    #   FLOPs = 512 x (2 x 2**29 + 4 x 256 x 199.5) = 5.4986e11 -> 0.55 ms at 1 PFLOP/s: memory
    #   decode bound: 512 / 1.17833728 ms = 434,510.6 tokens/s
    #   prefill: 512 / 200 = 2.56 requests start per step, each 2**30 x 100 + 1,024 x 5,050 FLOPs
    #   = 107,379,353,600 -> 2.56 x 0.10737935 ms = 0.27489115 ms
    #   tokens/s: 512 / 1.45322843 ms = 352,319.0
    #   cost: $3.60 / (352,319.0 x 3,600 s) x 1e6 = $0.0028383 per million tokens
    #   GPUs for 1e6 tokens/s: ceil(2.838) = 3
    est = toy_plan().contiguous
    assert est.bound == "memory"
    assert est.step_seconds == pytest.approx(1.17833728e-3)
    assert est.decode_tokens_per_s == pytest.approx(434_510.6, rel=1e-6)
    assert est.tokens_per_s == pytest.approx(512 / 1.453228425216e-3)
    assert est.tokens_per_s == pytest.approx(352_319.0, rel=1e-6)
    assert est.tokens_per_s_per_request == pytest.approx(352_319.0 / 512, rel=1e-6)
    assert est.cost_per_million_tokens == pytest.approx(1000 / 352_319.0, rel=1e-6)
    assert est.replicas_needed == 3 and est.gpus_needed == 3
    # no price, no target: no cost, no GPU count
    bare = plan(
        TOY,
        gpus.with_price(TOY_GPU, None),
        gpu_memory_utilization=0.5,
        overhead_bytes=0.5 * GiB,
        workload=TOY_DAY,
        max_num_seqs=0,
    )
    assert bare.contiguous.cost_per_million_tokens is None and bare.contiguous.gpus_needed is None
    assert toy_plan(price_per_gpu_hour=7.2).contiguous.cost_per_million_tokens == pytest.approx(
        2 * est.cost_per_million_tokens
    )


def test_tensor_parallel_splits_weights_and_kv_and_adds_bandwidth():
    # OPT-13B on 2 x A100-80GB: KV = 2 x 80 GiB x 0.9 - 25.8e9 weights - the overhead of both GPUs
    p = plan("OPT-13B", "A100-80GB", num_gpus=2, overhead_bytes=2 * DEFAULT_OVERHEAD_PER_GPU)
    assert p.kv_cache_bytes == pytest.approx(2 * 80 * GiB * 0.9 - 25.8e9 - 4 * GiB)
    assert p.memory.source == "given" and p.memory.spread is None
    predicted = plan("OPT-13B", "A100-80GB", num_gpus=2)
    one = plan("OPT-13B", "A100-80GB", num_gpus=1)
    assert (
        predicted.memory.source == "predicted"
        and "real vLLM start-up logs" in predicted.memory.spread
    )
    # each GPU pays its own activations (a share of the MLP's) and non-torch memory
    assert one.overhead_bytes < predicted.overhead_bytes <= 2 * one.overhead_bytes
    assert predicted.kv_cache_bytes == pytest.approx(
        2 * 80 * GiB * 0.9 - 25.8e9 - predicted.overhead_bytes
    )
    assert p.capacity.bytes_per_token == OPT_13B.kv_bytes_per_token == 819_200
    st = p.step_time()
    assert st.hbm_bytes_per_s == 2 * 2.039e12 and st.peak_flops == 2 * 312e12
    # the decode bound is B / ((weights + B x context x KV bytes) / summed bandwidth)
    b, ctx = p.paged.concurrency, p.workload.context_tokens
    step = (25.8e9 + b * ctx * 819_200) / 4.078e12
    assert p.paged.decode_tokens_per_s == pytest.approx(b / step)
    # cost counts both GPUs of a copy; the target is met in whole copies
    q = plan("OPT-13B", "A100-80GB", num_gpus=2, target_tokens_per_s=10_000)
    assert q.paged.gpus_needed == 2 * math.ceil(10_000 / q.paged.tokens_per_s)
    # more GPUs than KV heads: each GPU keeps a copy of the one head (2 query heads, 1 KV head)
    gqa = dataclasses.replace(TOY, name="toy-gqa", num_q_heads=2)
    assert toy_plan(model=gqa, num_gpus=2).capacity.bytes_per_token == 2 * 1024


def test_tensor_parallel_must_split_the_heads_evenly():
    # Llama-3-8B: 32 query heads, 8 KV heads; vLLM refuses 3 GPUs (8 KV heads do not split in 3)
    with pytest.raises(ValueError, match=r"num_gpus=3 does not split Llama-3-8B's 32 query heads"):
        plan("Llama-3-8B", "H100-80GB", num_gpus=3)
    with pytest.raises(ValueError, match=r"use one of 1, 2, 4, 8, 16, 32"):
        plan("Llama-3-8B", "H100-80GB", num_gpus=6)
    assert plan("Llama-3-8B", "H100-80GB", num_gpus=16).capacity.bytes_per_token == 2 * (
        LLAMA_3_8B.kv_bytes_per_token
    )  # 16 GPUs, 8 KV heads: each head held twice


def test_step_time_is_the_roofline_of_the_simulator():
    p = plan("Llama-3-8B", "H100-80GB")
    ours, roofline = p.step_time(), StepTime(LLAMA_3_8B, H100_SXM)
    for new, attended, kv in ((1, 500, 500), (300, 45_150, 300), (900, 450_000, 400_000)):
        assert ours.seconds(new, attended, kv) == pytest.approx(roofline.seconds(new, attended, kv))


# --- real numbers -------------------------------------------------------------------------------


def test_paper_table_1_opt_13b_on_an_a100_40gb():
    # PagedAttention paper, Table 1: 12 GB for KV at 800 KB per token -> 15.7K token slots
    # 12 GiB / (16 x 819,200 bytes) = 983.04 -> 983 blocks = 15,728 slots
    cap = kv_capacity("OPT-13B", 12 * GiB)
    assert OPT_13B.kv_bytes_per_token == 800 * 1024
    assert cap.num_blocks == 983 and cap.token_slots == 15_728
    assert cap.max_concurrency == pytest.approx(15_728 / 2048)  # 7.68 (its context: 2,048)
    # the same from the GPU: 40 GiB, 26 GiB of weights, 2 GiB overhead, all memory used
    p = plan(
        "OPT-13B",
        "A100-40GB",
        gpu_memory_utilization=1.0,
        weights_bytes=26 * GiB,
        overhead_bytes=2 * GiB,
    )
    assert p.capacity.token_slots == 15_728
    # Fig. 13's mean batch on ShareGPT: Orca-Max 7.00 exactly, vLLM 30.42 (ours within 10%)
    assert p.contiguous.concurrency == 7
    assert p.paged.concurrency == pytest.approx(30.42, rel=0.10)


def test_vllm_start_up_log_pr_12569():
    # vLLM PR 12569 (Llama-3.1-70B, KV in 16-bit: 2 x 80 layers x 8 KV heads x 128 x 2 bytes =
    # 320 KiB per token, 5 MiB per block of 16): "# GPU blocks: 1381" and "Maximum concurrency
    # for 2048 tokens per request: 10.79x" = 1,381 x 16 / 2,048
    block = 16 * LLAMA_3_70B.kv_bytes_per_token
    assert block == 5 * 2**20
    cap = kv_capacity(LLAMA_3_70B, 1381 * block + block - 1, max_seq_len=2048)
    assert cap.num_blocks == 1381 and cap.token_slots == 22_096
    assert round(cap.max_concurrency, 2) == 10.79
    assert "Maximum concurrency for 2048 tokens per request: 10.79x" in str(cap)


def test_gpu_catalogue():
    assert set(gpus.CATALOGUE) >= {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L4-24GB"}
    assert gpus.lookup("Tesla T4") is gpus.lookup("t4") is gpus.CATALOGUE["T4-16GB"]
    for g in gpus.CATALOGUE.values():
        assert g.memory_bytes > 0 and g.hbm_bytes_per_s > 0 and g.price_per_hour > 0
    l4 = gpus.lookup("l4")
    # what CUDA reports of an L4's 24 GB (ECC on): 23,034 MiB
    assert (l4.hbm_bytes_per_s, l4.peak_flops, l4.memory_bytes) == (300e9, 121e12, 23_034 * 2**20)
    # kvlab.perf.roofline's presets are planned as the catalogue's cards
    assert plan("Llama-3-8B", H100_SXM).capacity == plan("Llama-3-8B", "H100-80GB").capacity
    assert plan("Llama-3-8B", H100_SXM).price_per_gpu_hour is None
    assert gpus.lookup("H100 SXM") is gpus.lookup("h100-80gb") is gpus.CATALOGUE["H100-80GB"]
    assert gpus.lookup("H100-80GB").hbm_bytes_per_s == H100_SXM.hbm_bytes_per_s
    # roofline's own presets (kvlab bench matches devices against them) are untouched
    assert list(GPUS) == ["A100-80GB", "H100 SXM", "H200", "A100-40GB"]
    # a plain roofline GPU works, with no price
    assert plan("Llama-3-8B", H100_SXM).price_per_gpu_hour is None
    assert gpus.with_price(H100_SXM, 2.0).price_per_hour == 2.0


# --- agreement with the simulator ---------------------------------------------------------------

SMALL_H100 = dict(gpu_memory_utilization=0.25, max_seq_len=2048)  # 24,912 slots: quick to simulate


@pytest.mark.parametrize(
    "model, gpu, workload, options, num_requests",
    [
        ("OPT-13B", "A100-40GB", "sharegpt", {}, 500),
        ("OPT-13B", "A100-40GB", "alpaca", {}, 2500),
        ("Llama-3-8B", "H100-80GB", "sharegpt", SMALL_H100, 600),
        ("Llama-3-8B", "H100-80GB", "alpaca", SMALL_H100, 4000),
    ],
)
def test_agrees_with_the_simulator(model, gpu, workload, options, num_requests):
    """Concurrency and tokens/s within SIMULATION_TOLERANCE of kvlab.serving.simulate on a saturated
    day (its own seed, not the planner's sample), same memory and step-time model."""
    p = plan(model, gpu, workload=workload, **options)
    rows = compare_with_simulation(p, num_requests=num_requests)
    assert [r["cache"] for r in rows] == list(POLICIES)
    for r in rows:
        assert abs(r["concurrency_error"]) <= SIMULATION_TOLERANCE, r
        assert abs(r["tokens_per_s_error"]) <= SIMULATION_TOLERANCE, r
        assert r["planned_decode_tokens_per_s"] >= r["planned_tokens_per_s"]
    assert rows[0]["simulated_concurrency"] == rows[0]["planned_concurrency"]  # Orca-Max: exact


def test_compare_needs_a_steady_state():
    with pytest.raises(ValueError, match="steady state"):
        compare_with_simulation(plan("OPT-13B", "A100-40GB"), num_requests=20, caches=("paged",))


# --- the plan as a leader reads it ---------------------------------------------------------------


def test_table_summary_and_markdown():
    p = plan("Llama-3-8B", "H100-80GB", target_tokens_per_s=100_000)
    rows = p.table()
    assert [r["cache"] for r in rows] == list(POLICIES)
    assert rows[-1]["system"] == "vLLM (paged)" and rows[0]["system"] == "Orca (Max)"
    assert set(rows[0]) >= {"concurrency", "tokens_per_s", "cost_per_million_tokens", "gpus_needed"}
    conc = [r["concurrency"] for r in rows]
    assert conc == sorted(conc) and p.concurrency_gain > 10  # 8k context: Orca-Max books a lot
    text = str(p)
    for words in (
        "requests at once",
        "per million generated tokens",
        "GPUs for 100,000 tokens/s",
        "Paging fits",
        "$2.90 per GPU-hour (an assumption",
    ):
        assert words in text
    md = p.to_markdown().splitlines()
    assert md[0].startswith("| cache |") and md[1].startswith("|---|") and len(md) == 6
    blob = json.loads(json.dumps(p.to_dict()))
    assert blob["capacity"]["token_slots"] == p.capacity.token_slots
    assert blob["policies"][-1]["cache"] == "paged"
    # where a cap, not memory, decides, the plan says paging buys little
    capped = plan("Llama-3-70B", "H200-141GB", num_gpus=8, max_num_seqs=256)
    assert {e.concurrency for e in capped.policies.values()} == {256}
    assert "Paging changes little" in capped.summary


def test_plan_is_instant_once_the_workload_is_sampled():
    plan("Mistral-7B", "L4-24GB", max_seq_len=4096)  # samples the workload at 4,096 tokens
    sampled = _named_stats.cache_info().misses
    for _ in range(20):
        plan("Mistral-7B", "L4-24GB", max_seq_len=4096, price_per_gpu_hour=1.0)
    assert _named_stats.cache_info().misses == sampled  # no plan sampled it again
    stats = workload_stats("alpaca", max_seq_len=2048)
    assert stats.mean_prompt == pytest.approx(19.31, rel=0.05)
    assert stats.mean_output == pytest.approx(58.45, rel=0.05)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("gpt-9", "H100-80GB"), {}, ValueError, "presets are OPT-13B, Llama-3-8B"),
        (("Llama-3-8B", "TPU-v5"), {}, ValueError, "presets are A100-40GB, .*L4-24GB"),
        ((42, "H100-80GB"), {}, TypeError, "model must be"),
        (("Llama-3-8B", None), {}, TypeError, "gpu must be"),
        (
            ("Llama-3-70B", "H100-80GB"),
            {},
            ValueError,
            r"Llama-3-70B's weights \(70.6B parameters x 2 bytes = 131.5 GiB\): more than the GPU",
        ),
        (("Llama-3-8B", "L4-24GB"), {"weights_bytes": 22 * GiB}, ValueError, "leave no memory"),
        (("Llama-3-8B", "H100-80GB"), {"weights_bytes": 0}, ValueError, "weights_bytes must be"),
        (("Llama-3-8B", "H100-80GB"), {"overhead_bytes": -1}, ValueError, "overhead_bytes"),
        (("Llama-3-8B", "H100-80GB"), {"gpu_memory_utilization": 0}, ValueError, "utilization"),
        (("Llama-3-8B", "H100-80GB"), {"gpu_memory_utilization": 1.5}, ValueError, r"\(0, 1\]"),
        (("Llama-3-8B", "H100-80GB"), {"num_gpus": 0}, ValueError, "num_gpus must be >= 1"),
        (("Llama-3-8B", "H100-80GB"), {"num_gpus": 1.5}, TypeError, "num_gpus must be an int"),
        (
            ("Llama-3-8B", "H100-80GB"),
            {"block_size": 0},
            ValueError,
            "block_size must be one of 1, 8",
        ),
        (("Llama-3-8B", "H100-80GB"), {"block_size": 100_000}, ValueError, "32, 64, 128 .*100000"),
        (("Llama-3-8B", "H100-80GB"), {"block_size": 16.0}, TypeError, "block_size must be an int"),
        (
            ("Llama-3-8B", "H100-80GB"),
            {"block_size": 64, "max_seq_len": 32},
            ValueError,
            "block_size must be at most max_seq_len=32",
        ),
        (
            ("Llama-3-8B", "H100-80GB"),
            {"target_tokens_per_s": 1e300},
            ValueError,
            "at most 1,000,0",
        ),
        (("Llama-3-8B", "H100-80GB"), {"price_per_gpu_hour": 1e308}, ValueError, "at most 1,000 d"),
        (("Llama-3-8B", "H100-80GB"), {"users": 0}, ValueError, "users must be >= 1"),
        (("Llama-3-8B", "H100-80GB"), {"users": 10**12}, ValueError, "users must be at most"),
        (("Llama-3-8B", "H100-80GB"), {"min_tokens_per_user": 0}, ValueError, "min_tokens_per"),
        (("Llama-3-8B", "H100-80GB"), {"min_tokens_per_user": 1e6}, ValueError, "at most 10,000"),
        (("Llama-3-8B", "H100-80GB"), {"gpu_memory_gib": -1}, ValueError, "gpu_memory_gib must"),
        (("Llama-3-8B", "H100-80GB"), {"gpu_memory_gib": 1e9}, ValueError, "gpu_memory_gib must"),
        (
            ("Llama-3-8B", "L4-24GB"),
            {"gpu_memory_utilization": 0.6},
            ValueError,
            r"Llama-3-8B's weights .* and the predicted overhead of 1\.\d GiB per GPU leave no memory",
        ),
        (("Llama-3-8B", "H100-80GB"), {"max_seq_len": 1}, ValueError, "max_seq_len must be >= 2"),
        (("OPT-13B", "A100-40GB"), {"max_seq_len": 4096}, ValueError, "context of 2,048"),
        (("Llama-3-8B", "H100-80GB"), {"workload": "wiki"}, ValueError, "sharegpt, alpaca"),
        (("Llama-3-8B", "H100-80GB"), {"price_per_gpu_hour": -1}, ValueError, "price_per_gpu"),
        (("Llama-3-8B", "H100-80GB"), {"target_tokens_per_s": 0}, ValueError, "target_tokens"),
        (("Llama-3-8B", "H100-80GB"), {"max_num_seqs": -1}, ValueError, "max_num_seqs must be >="),
        (("OPT-13B", "A100-40GB"), {"gpu_memory_utilization": 0.66}, ValueError, "fewer than"),
        (
            (ModelSpec("x", 2, 2, 2, 64), "L4-24GB"),
            {"max_seq_len": 64},
            ValueError,
            "weights_bytes",
        ),
        ((ModelSpec("x", 2, 2, 2, 64, num_params=1e9), "L4-24GB"), {}, ValueError, "max_seq_len"),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        plan(*args, **kwargs)


def test_bad_capacity_input():
    with pytest.raises(ValueError, match="kv_cache_bytes must be"):
        kv_capacity("OPT-13B", 0)
    with pytest.raises(TypeError, match="kv_cache_bytes must be a number"):
        kv_capacity("OPT-13B", "12GB")
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        kv_capacity("OPT-13B", GiB, block_size=0)
    with pytest.raises(ValueError, match="context"):
        kv_capacity("OPT-13B", GiB, max_seq_len=4096)
    with pytest.raises(ValueError, match="more than max_seq_len"):
        toy_plan(workload=[Request(1000, 100)])
    with pytest.raises(ValueError, match="price_per_hour"):
        PricedGPU("g", 1e12, 1e15, GiB, price_per_hour=-1)
    custom = ModelSpec("no-context", 2, 2, 2, 64)
    assert kv_capacity(custom, GiB).max_concurrency is None


# --- the command line ---------------------------------------------------------------------------


def test_cli_prints_the_table(capsys):
    assert (
        cli_main(
            [
                "plan",
                "--model",
                "Llama-3-8B",
                "--gpu",
                "H100-80GB",
                "--price",
                "2.5",
                "--target",
                "50000",
                "--workload",
                "alpaca",
                "--max-seq-len",
                "4096",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Llama-3-8B on H100-80GB, Alpaca-like instructions, requests up to 4,096 tokens" in out
    assert "$2.50 per GPU-hour" in out and "vLLM (paged)" in out and "GPUs for target" in out
    assert (
        cli_main(["plan", "--model", "OPT-13B", "--gpu", "A100-40GB", "--gpus", "2", "--json"]) == 0
    )
    blob = json.loads(capsys.readouterr().out)
    assert blob["inputs"]["num_gpus"] == 2 and len(blob["policies"]) == 4


def test_cli_errors_exit_2_with_the_message(capsys):
    assert cli_main(["plan", "--model", "Llama-3-8B", "--gpu", "TPU-v5"]) == 2
    err = capsys.readouterr().err
    assert "kvlab plan: error: unknown gpu 'TPU-v5'; presets are A100-40GB" in err
    assert cli_main(["plan", "--model", "Llama-3-8B", "--gpu", "L4", "--utilization", "2"]) == 2
    assert "--utilization must be in (0, 1]" in capsys.readouterr().err


def test_cli_entry_point():
    out = cpu_limit.run(
        [*kvlab_cli(), "plan", "--model", "Llama-3-70B", "--gpu", "H200-141GB", "--gpus", "8"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=LEARNER_ENV,
        cpu=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Llama-3-70B on 8 x H200-141GB" in out.stdout and "Orca (Max)" in out.stdout
    bad = cpu_limit.run(
        [*kvlab_cli(), "plan", "--model", "Llama-3-70B", "--gpu", "H100-80GB"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=LEARNER_ENV,
        cpu=120,
    )
    assert (
        bad.returncode == 2
        and "weights (70.6B parameters x 2 bytes = 131.5 GiB): more" in bad.stderr
    )
    assert "weights_bytes" not in bad.stderr  # an argument the user never passed


def test_cli_output_piped_into_head_ends_quietly():
    """`kvlab plan ... | head -1`: the reader leaves early (here, before anything is written); no
    BrokenPipeError traceback."""
    import shlex

    command = " ".join(
        map(shlex.quote, [*kvlab_cli(), "plan", "--model", "OPT-13B", "--gpu", "A100-40GB"])
    )
    out = cpu_limit.run(
        ["bash", "-o", "pipefail", "-c", f"{command} | true"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=LEARNER_ENV,
        cpu=120,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


# --- what a leader decides (issue 25) ------------------------------------------------------------


def test_vllm_default_max_num_seqs_is_the_planners_default():
    # vLLM (vllm/engine/arg_utils.py, EngineArgs._set_default_args): 1024 on a GPU of >= 70 GiB
    # other than an A100, else 256
    defaults = {name: vllm_default_max_num_seqs(g) for name, g in gpus.CATALOGUE.items()}
    assert defaults == {
        "A100-40GB": 256,
        "A100-80GB": 256,  # an A100, however large
        "H100-80GB": 1024,
        "H200-141GB": 1024,
        "L4-24GB": 256,
        "T4-16GB": 256,
        "B200-180GB": 1024,
        "GB200-186GB": 1024,
        "B300-288GB": 1024,
    }
    assert vllm_default_max_num_seqs(gpus.with_memory(gpus.lookup("L4"), 80)) == 1024
    p = plan("Llama-3-8B", "H100-80GB")
    assert p.max_num_seqs == 1024 and p.max_num_seqs_source == "vllm-default"
    opt = plan("OPT-13B", "A100-40GB")
    assert opt.max_num_seqs == 256 and "vLLM's default max_num_seqs" in opt.summary
    # 0: no cap; memory alone decides, and the 70B on 8 H200s runs far more than 1,024 paged
    free = plan("Llama-3-70B", "H200-141GB", num_gpus=8, max_num_seqs=0)
    capped = plan("Llama-3-70B", "H200-141GB", num_gpus=8)
    assert free.max_num_seqs is None and free.paged.concurrency > 5000
    assert capped.paged.concurrency == 1024 and "No cap" in free.summary


def test_the_bottom_line_compares_with_the_oracle_first():
    p = plan("Llama-3-8B", "H100-80GB", price_per_gpu_hour=2.90)
    assert 1.5 < p.concurrency_gain_vs_oracle < 2.5  # the paper's "about 2x"
    assert p.concurrency_gain_vs_oracle == pytest.approx(p.paged.concurrency / p.oracle.concurrency)
    assert p.concurrency_gain > 10 and p.concurrency_gain_vs_max_length == p.concurrency_gain
    verdict = p._verdict()
    oracle_at = verdict.index("best contiguous booking")
    assert oracle_at < verdict.index("its full 8,192 tokens")
    assert f"{p.concurrency_gain_vs_oracle:.1f}x" in verdict[: verdict.index("booking")]
    assert "vLLM, SGLang, TensorRT-LLM and TGI all page already" in verdict
    for lever in ("max_num_seqs", "gpu_memory_utilization", "context length", "FP8", "prefix"):
        assert lever in verdict
    blob = json.loads(json.dumps(p.to_dict()))
    assert blob["concurrency_gain_vs_oracle"] == pytest.approx(p.concurrency_gain_vs_oracle)
    assert blob["concurrency_gain"] == pytest.approx(p.concurrency_gain)  # old keys stay
    # at a short context max-length booking wastes less: the second figure shrinks, not the first
    short = plan("OPT-13B", "A100-40GB")
    assert 3 < short.concurrency_gain < 6 and 1.5 < short.concurrency_gain_vs_oracle < 2.5


def test_costs_are_a_range():
    p = plan("Llama-3-8B", "H100-80GB", price_per_gpu_hour=2.90, target_tokens_per_s=100_000)
    for est in p.policies.values():
        assert est.cost_per_million_tokens_realistic == pytest.approx(
            est.cost_per_million_tokens / REALISTIC_FRACTION
        )
        assert est.gpus_needed_realistic == math.ceil(
            100_000 / (est.tokens_per_s * REALISTIC_FRACTION)
        )
    low, high = p.paged.cost_per_million_tokens, p.paged.cost_per_million_tokens_realistic
    assert f"{low:,.3f}–{high:,.3f}" in p.text_table()
    assert p.cost_range() == f"${low:,.3f}–${high:,.3f}" and p.cost_range() in p.summary
    assert "50% of it" in p.summary and "68–85%" in p.summary  # the fraction and its source
    assert plan("Llama-3-8B", H100_SXM).cost_range() is None  # no price, no range


def test_the_fewest_tokens_per_user_caps_the_batch_by_hand():
    # The toy's step with B requests (each reads 199.5 tokens of K/V, 1 of 200 starting a step):
    #   memory: 2**30 / 1e12 + B x 199.5 x 1,024 / 1e12 = 1.073741824 ms + B x 0.204288 us
    #   compute: B x (2**30 + 1,024 x 199.5) / 1e15 = B x 1.074 us
    #   prefill: B / 200 x (2**30 x 100 + 1,024 x 5,050) / 1e15 = B x 0.5369 us
    # 500 tokens/s each -> a step of at most 2 ms: memory allows (2 - 1.0737) / (0.2043 +
    # 0.5369) us = 1,249.7, compute 2 / (1.0740 + 0.5369) us = 1,241.5: at most 1,241 at once
    p = toy_plan(min_tokens_per_user=500, users=3000)
    assert p.speed_cap == 1241 and p.max_num_seqs == 1241
    assert p.max_num_seqs_source == "min-tokens-per-user"
    assert p.speed_at(1241) >= 500 > p.speed_at(1242)
    assert p.paged.concurrency == 1241 and p.paged.tokens_per_s_per_request >= 500
    assert p.contiguous.concurrency == 512  # memory binds it first, below the speed cap
    # 3,000 users at once: 3 copies paged (1,241 each), 6 with max-length booking (512 each)
    assert (p.paged.replicas_for_users, p.contiguous.gpus_for_users) == (3, 6)
    assert "For 3,000 users at once at 500 tokens/s or more each: 3 GPUs paged" in p.summary
    assert "At most 1,241 requests at once, so that each gets at least 500 tokens/s" in p.summary
    # a given max_num_seqs below the speed cap stays
    assert toy_plan(min_tokens_per_user=500, max_num_seqs=100).max_num_seqs == 100
    # 1,000 tokens/s: even the weights alone take 1.07 ms per token, so no batch reaches it
    none = toy_plan(min_tokens_per_user=1000, users=10)
    assert none.speed_cap == 0 and none.max_requests_for_speed(1000) == 0
    assert "No number of requests at once gives each user 1,000 tokens/s" in none.summary
    assert none.paged.gpus_for_users is None and "not reachable" in none.summary


def test_a_plan_too_slow_for_a_person_says_so():
    # the 70B on 8 H200s with no cap: ~5,200 requests at once at ~7 tokens/s each
    slow = plan("Llama-3-70B", "H200-141GB", num_gpus=8, max_num_seqs=0)
    assert slow.tokens_per_user < SLOW_TOKENS_PER_USER and slow.slow_for_users
    assert "Too slow for a person" in slow.summary and "min_tokens_per_user=20" in slow.summary
    fast = plan("Llama-3-70B", "H200-141GB", num_gpus=8, max_num_seqs=0, min_tokens_per_user=20)
    assert fast.tokens_per_user >= 20 and not fast.slow_for_users
    assert fast.max_num_seqs == slow.max_requests_for_speed(20) < slow.paged.concurrency
    assert "Too slow" not in fast.summary
    assert json.loads(json.dumps(fast.to_dict()))["inputs"]["min_tokens_per_user"] == 20


def test_the_vllm_flags_that_realise_a_plan():
    p = plan("Llama-3-70B", "H200-141GB", num_gpus=8, gpu_memory_utilization=0.85)
    assert p.vllm_flags() == {
        "--tensor-parallel-size": "8",
        "--gpu-memory-utilization": "0.85",
        "--max-model-len": "8192",
        "--max-num-seqs": "1024",
        "--block-size": "16",
        "--max-num-batched-tokens": "8192",
    }
    assert p.vllm_command().startswith("vllm serve meta-llama/Meta-Llama-3-70B-Instruct --tensor")
    assert p.vllm_command() in p.summary
    capped = plan("Llama-3-8B", "H100-80GB", min_tokens_per_user=60, block_size=32)
    assert capped.vllm_flags()["--max-num-seqs"] == str(capped.speed_cap)
    assert capped.vllm_flags()["--block-size"] == "32"
    fp8 = plan("Llama-3-8B", "H100-80GB", kv_cache_dtype="fp8")
    assert fp8.vllm_flags()["--kv-cache-dtype"] == "fp8"
    # one byte per element: twice the token slots in the same memory, the weights unchanged
    auto = plan("Llama-3-8B", "H100-80GB")
    assert fp8.capacity.bytes_per_token * 2 == auto.capacity.bytes_per_token
    assert fp8.weights_bytes == auto.weights_bytes
    assert fp8.capacity.token_slots == pytest.approx(2 * auto.capacity.token_slots, abs=16)
    assert "--kv-cache-dtype" not in p.vllm_flags()
    blob = json.loads(json.dumps(p.to_dict()))
    assert blob["vllm_flags"]["--max-num-seqs"] == "1024" and blob["vllm_command"].startswith(
        "vllm"
    )


def test_one_memory_convention_and_a_gpu_of_any_memory():
    # every size in bytes from nvidia-smi's MiB total; the roofline's presets and the catalogue agree
    assert H100_SXM.memory_bytes == 81_559 * 2**20 == gpus.lookup("H100-80GB").memory_bytes
    for card, gpu in gpus.ROOFLINE_CARDS.items():
        assert (gpu.memory_bytes, gpu.hbm_bytes_per_s) == (card.memory_bytes, card.hbm_bytes_per_s)
    assert gpus.lookup("A100-80GB").hbm_bytes_per_s == 2.039e12  # SXM data sheet
    assert gpus.lookup("A100-40GB").memory_bytes == 40 * GiB
    big = plan("Llama-3-8B", "H100-80GB", gpu_memory_gib=94)
    assert big.gpu.name == "H100-80GB (94 GiB)" and big.gpu.memory_bytes == 94 * GiB
    assert big.gpu.hbm_bytes_per_s == H100_SXM.hbm_bytes_per_s and big.price_per_gpu_hour == 2.90
    assert big.kv_cache_bytes == pytest.approx(
        94 * GiB * 0.9 - LLAMA_3_8B.num_params * 2 - big.overhead_bytes
    )
    assert "H100-80GB (94 GiB)" in big.setup


def test_cli_sizes_for_users_at_a_speed(capsys):
    argv = ["plan", "--model", "Llama-3-70B", "--gpu", "H200", "--gpus", "8"]
    assert cli_main([*argv, "--min-tokens-per-user", "20", "--users", "5000", "--json"]) == 0
    blob = json.loads(capsys.readouterr().out)
    assert blob["inputs"]["max_num_seqs_source"] == "vllm-default"  # 1,024 is below the speed cap
    assert blob["tokens_per_user"] >= 20 and blob["policies"][-1]["gpus_for_users"] == 40
    assert cli_main([*argv, "--max-num-seqs", "0", "--min-tokens-per-user", "20"]) == 0
    out = capsys.readouterr().out
    assert "so that each gets at least 20 tokens/s" in out and "vllm serve meta-llama/" in out
    assert "--max-num-seqs 1875" in out
    assert (
        cli_main(["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--gpu-memory-gib", "94"]) == 0
    )
    assert "H100-80GB (94 GiB)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--target", "1e300"], "--target must be at most 1,000,000,000 generated tokens/s"),
        (["--price", "1e308"], "--price must be at most 1,000 dollars per GPU-hour"),
        (["--block-size", "100000"], "--block-size must be one of 1, 8, 16, 32, 64, 128"),
        (["--max-seq-len", "8"], "--block-size must be at most --max-seq-len=8"),
        (["--gpu-memory-gib", "0"], "--gpu-memory-gib must be a finite number > 0"),
        (["--min-tokens-per-user", "-5"], "--min-tokens-per-user must be a finite number > 0"),
        (["--users", "0"], "--users must be >= 1"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_flag(capsys, flags, said):
    assert cli_main(["plan", "--model", "Llama-3-8B", "--gpu", "H100-80GB", *flags]) == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""


def test_a_prefix_hit_rate_cuts_the_prefill_a_fleet_computes_and_nothing_else():
    base = plan("Llama-3-8B", "H100-80GB", target_tokens_per_s=100_000)
    hit = plan("Llama-3-8B", "H100-80GB", target_tokens_per_s=100_000, prefix_hit_rate=0.6)
    # the KV memory a request holds is the same: as many requests at once
    assert hit.paged.concurrency == base.paged.concurrency
    # each request computes 40% of its prompt, whose positions attend to the cached 60% too
    w, st, b = hit.workload, hit.step_time(), hit.paged.concurrency
    assert w.computed_prompt == pytest.approx(0.4 * w.mean_prompt)
    assert w.computed_attended == pytest.approx((1 - 0.36) * w.prefill_attended)
    step = max(st.compute_seconds(b, b * w.context_tokens), st.memory_seconds(b * w.context_tokens))
    prefill = b / w.mean_output * st.compute_seconds(w.computed_prompt, w.computed_attended)
    assert hit.paged.tokens_per_s == pytest.approx(b / (step + prefill))
    assert hit.paged.tokens_per_s > base.paged.tokens_per_s
    assert hit.paged.gpus_needed <= base.paged.gpus_needed
    assert "Prefix cache: 60% of prompt tokens served from it" in hit.summary
    assert "replicas of 1" in hit.summary and "Prefix cache" not in base.summary
    assert json.loads(json.dumps(hit.to_dict()))["workload"]["prefix_hit_rate"] == 0.6
    for bad in (1.0, -0.1, 2):
        with pytest.raises(ValueError, match="prefix_hit_rate must be"):
            plan("Llama-3-8B", "H100-80GB", prefix_hit_rate=bad)
