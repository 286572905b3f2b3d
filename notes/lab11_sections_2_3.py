# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---
# Lab 11, sections 2 and 3 (issue 38, exercises 2 and 3), for solutions/11_many_shapes.ipynb.
# Each cell's first line names its id (lab11-20 .. lab11-29: section 2; lab11-30 .. lab11-39:
# section 3). The cells import what they use, so they run after the lab's first cell or alone.

# %% [markdown]
# id: lab11-20
# ## 2. One compressed suitcase per guest: latent KV (MLA)
#
# Every model of Labs 00–10 gives each guest, in every layer, a case of K and a case of V **per KV head**:
# Llama-3-8B packs 8 pairs per token and layer, a model with full multi-head attention one pair per query head.
# DeepSeek-V2 and V3 pack one **compressed suitcase** instead: a latent vector `c` of `kv_lora_rank` = 512
# elements that every head unpacks for itself (its key with `W_UK[h] c`, its value with `W_UV[h] c`), and 64
# more elements of rotated key (`k_pe`, the position-dependent part, shared by every head). That is multi-head
# latent attention (MLA). vLLM stores both parts side by side in one cache of 576 elements per token and layer,
# with no heads at all.
#
# What a guest's luggage weighs, per token, on DeepSeek-V3's shape (61 layers, 128 heads, keys of 128 + 64
# dims, values of 128), against the same model caching per-head K and V of 128 dims (2 × 128 heads × 128):

# %%
# id: lab11-21
import math
from pathlib import Path

import kvlab.models
from kvlab.models.hf_config import spec_from_hf_config
from kvlab.ops import mla

deepseek = spec_from_hf_config(Path(kvlab.models.__file__).parent / "hf_configs" / "DeepSeek-V3.json")
layers = deepseek.num_layers
latent = mla.latent_elements_per_token(kv_lora_rank=512, rope_dim=64)
per_head = mla.expanded_elements_per_token(num_heads=128, qk_head_dim=128, v_head_dim=128)
print(f"DeepSeek-V3, {layers} layers, bf16: a latent of {latent} elements per layer, "
      f"{deepseek.kv_bytes_per_token:,} bytes per token (kvlab's spec)")
print(f"per-head K and V instead: {per_head:,} elements per layer, {layers * per_head * 2:,} bytes per token: "
      f"{per_head / latent:.1f}x the latent")

# %% [markdown]
# id: lab11-22
# The suitcase is 57× lighter than the cases it replaces: 70,272 bytes a token (69 KiB) instead of 4.0 MB, so a
# 128k-token guest holds 9 GB of luggage instead of 512 GB. (The DeepSeek-V2 paper reports 93.3% less KV cache
# than DeepSeek 67B: another model, with 95 layers and grouped-query attention, not the same model with
# per-head K and V as here.)
#
# **Tensor parallelism copies the suitcase to every GPU.** Spread over 8 GPUs, each GPU computes 16 of the 128
# heads. Per-head K and V split with the heads: each GPU keeps its 16 heads' cases, an eighth. The latent does
# not split: every head unpacks the *whole* `c`, so every GPU keeps every guest's whole suitcase (vLLM's
# `MLAAttentionSpec` is the same on every rank). The saving shrinks as the GPUs grow:

# %%
# id: lab11-23
print(f"{'GPUs (TP)':>9} | {'per-head K/V per GPU':>20} | {'latent per GPU':>14} | saving")
for tp in (1, 2, 4, 8, 16):
    expanded_gpu = layers * per_head * 2 // tp  # bytes per token on one GPU
    latent_gpu = deepseek.kv_bytes_per_token  # the whole suitcase, on every GPU
    print(f"{tp:>9} | {expanded_gpu:>20,} | {latent_gpu:>14,} | {expanded_gpu / latent_gpu:5.1f}x")

# %% [markdown]
# id: lab11-24
# At TP = 8 the latent saves 7× per GPU, not 57×; past 57 GPUs it would cost more. This is why engines serving
# DeepSeek run attention **data-parallel** (SGLang's and vLLM's DP attention): each GPU takes different guests
# and keeps only their suitcases, while the experts are still shared out.
#
# ### Two ways to unpack the suitcase
#
# *Expanded*: build each head's key `k[h] = [W_UK[h] c, k_pe]` and value `v[h] = W_UV[h] c` for every token, then
# attend as Lab 04 did. Correct, but it rebuilds at every step the 4 MB a token that MLA saved.
#
# *Absorbed* (the decode form of DeepSeek's engines and vLLM's MLA backends): the score of head `h` on a token is
#
# $$q[h] \cdot k[h] = q_{nope}[h] \cdot (W_{UK}[h]\, c) + q_{pe}[h] \cdot k_{pe} = (W_{UK}[h]^\top q_{nope}[h]) \cdot c + q_{pe}[h] \cdot k_{pe},$$
#
# so fold `W_UK` into the query once, `q_lat[h] = W_UK[h]^T q_nope[h]` (512 elements), and score it against the
# suitcase as it is. The output works the same way: `Σ p_t W_UV[h] c_t = W_UV[h] (Σ p_t c_t)`, so sum the
# latents with the softmax weights and apply `W_UV` once, after the sum. No key or value of any head is built.
#
# ### Exercise: attention over the latent, absorbed
#
# Write `mla_decode(q_nope, q_pe, latent, w_uk, w_uv)` for one guest's new token:
#
# - `q_nope [heads, nope]`, `q_pe [heads, rope]`: the query's two parts;
# - `latent [tokens, kv_lora_rank + rope]`: the cached suitcases, `c` first (`kv_lora_rank` = `w_uk.shape[2]`
#   elements), then `k_pe`;
# - `w_uk [heads, nope, kv_lora_rank]`, `w_uv [heads, v_dim, kv_lora_rank]`: the up-projections;
# - the softmax scale is that of the expanded keys, `1 / sqrt(nope + rope)` (192 dims for DeepSeek-V3);
# - return `[heads, v_dim]` in `q_nope`'s dtype, computed in float32.
#
# The check compares your answer with the expanded per-head K and V in torch, in fp32 and bf16.

# %%
# id: lab11-25
import torch


def mla_decode(q_nope, q_pe, latent, w_uk, w_uv):
    """One guest's decode attention over its latent cache, W_UK absorbed into the query, W_UV after the sum."""
    ### BEGIN SOLUTION
    rank = w_uk.shape[2]
    c, k_pe = latent[:, :rank].float(), latent[:, rank:].float()
    q_lat = torch.einsum("hn,hnr->hr", q_nope.float(), w_uk.float())  # W_UK[h]^T q_nope[h]
    scores = q_lat @ c.T + q_pe.float() @ k_pe.T  # [heads, tokens]
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_pe.shape[-1])
    o_lat = torch.softmax(scores * scale, dim=-1) @ c  # [heads, kv_lora_rank]
    return torch.einsum("hr,hvr->hv", o_lat, w_uv.float()).to(q_nope.dtype)
    ### END SOLUTION


# %%
# id: lab11-26
from kvlab.grading import check

check("11.latent", mla_decode)

# %% [markdown]
# id: lab11-27
# ### What one decode step reads and computes
#
# At DeepSeek-V3's sizes, per token of context and per layer, the absorbed form reads the 1,152 bytes of the
# suitcase and, for its 128 heads, does 576 multiply-adds for the score and 512 for the weighted sum. The
# expanded form would first build 40,960 elements of K and V (128 heads × (192 + 128)), from the same suitcase.

# %%
# id: lab11-28
from kvlab.perf.roofline import H100_SXM, H200

heads, rank, rope = 128, 512, 64
flops_per_token = 2 * heads * ((rank + rope) + rank)  # scores, then the weighted sum of latents
for fmt, element_bytes in (("bf16", 2), ("fp8", 1)):
    intensity = flops_per_token / ((rank + rope) * element_bytes)
    print(f"latent in {fmt}: {flops_per_token:,} FLOPs per {(rank + rope) * element_bytes:,} bytes read = "
          f"{intensity:.0f} FLOP/byte")
for gpu in (H100_SXM, H200):
    print(f"{gpu.name}: the roofline's ridge at {gpu.peak_flops / gpu.hbm_bytes_per_s:.0f} FLOP/byte (bf16 tensor cores)")

try:  # yours, once written, on one guest of 300 tokens at DeepSeek-V3's head sizes (4 heads here)
    case = mla.make_mla_case(num_tokens=300, heads=4, nope=128, rope=64, rank=512, v_dim=128, seed=0)
    mine = mla_decode(*case)
    print(f"\nyours against the expanded K/V: max difference {(mine - mla.mla_decode_expanded(*case)).abs().max():.2e}")
except NotImplementedError:
    print("\n(write mla_decode above to compare it here)")

# %% [markdown]
# id: lab11-29
# Every head reads the same suitcase, so one byte read feeds 128 heads: about 242 FLOPs per byte in bf16, near the
# ridge of an H100 (295) and past half of an H200's (206: its faster memory moves the ridge down). Decode
# attention, memory-bound in every lab so far, is nearly compute-bound under MLA, and with an fp8 latent (484
# FLOP/byte) it is. That is why MLA decode kernels (DeepSeek's FlashMLA, vLLM's FlashMLA, CUTLASS MLA and
# Triton MLA backends) run the 128 heads of a guest together on tensor cores, in tiles of the latent, rather
# than a program per head.
#
# **What real systems do.** vLLM caches `kv_c` and `k_pe` side by side, one 576-element vector per token and
# layer, in rooms of 64 tokens for its MLA kernels; prefill runs the expanded form (many queries share each key
# built), decode the absorbed one. Its `fp8_ds_mla` format packs DeepSeek's fp8 latent with its scales and the
# rope part in 16 bits: 656 bytes a token and layer. Under tensor parallelism the latent is copied to every GPU,
# which is why DeepSeek deployments use data-parallel attention.

# %% [markdown]
# id: lab11-30
# ## 3. Half-size beds with a label: quantised KV
#
# A quantised cache stores each element in 8 bits instead of 16: beds of half the size, so the hotel holds twice
# the guests. Eight bits cannot hold a value's size and its digits at once, so each bed carries a label, a
# **scale**: the vector `x` (one token's K, or V, of one KV head) is stored as `values = x / scale` and read back as
# `values × scale`. The scale is chosen so the largest element of `x` lands on the format's largest value:
# `scale = max|x| / 448` for **fp8 e4m3** (`torch.float8_e4m3fn`, what vLLM's `--kv-cache-dtype fp8` stores:
# 4 exponent bits, 3 mantissa bits, largest value 448), `max|x| / 127` for **int8** (round to the nearest step).
#
# Which format runs where: torch on a CPU casts to fp8 e4m3 and Triton's interpreter loads it, so everything in
# this section runs here in fp8. On a GPU, Triton loads fp8 e4m3 from sm_89 on (Ada, Hopper, Blackwell); an
# A100 or a T4 takes int8 instead (kvlab's kernel says so). One scale per token and KV head costs 4 bytes per
# 128 elements (3%), as the `*_per_token_head` formats of vLLM's `--kv-cache-dtype` keep them. vLLM's plain `fp8`
# keeps one scale per layer for K and one for V (per tensor; per KV head when calibrated with llm-compressor),
# free in bytes but coarse: a vector much smaller than the layer's largest loses its digits, and one larger
# saturates.
#
# ### Exercise: quantise K and V with their scales
#
# Write `quantize(x, fmt="fp8_e4m3", scale=None)` returning `(values, scales)`:
#
# - `x [..., head_dim]` (here `[tokens, kv_heads, head_dim]`, fp32 or bf16); one scale per vector of the last
#   axis, `scales` of shape `x.shape[:-1]`, in float32;
# - `values`: `x / scale` in the format's dtype (`torch.float8_e4m3fn`, or `torch.int8` rounded to the nearest
#   integer), so that `values * scales[..., None]` gives `x` back;
# - `scale = max|x| / 448` (fp8) or `/ 127` (int8); an all-zero vector must get a positive scale, not 0 (0 / 0
#   is NaN);
# - `scale` given (one number: a per-tensor scale): use it for every vector, and clamp `x / scale` to
#   `[-max, max]` before the cast: int8 would wrap around (128 becomes -128).

# %%
# id: lab11-31
FORMATS = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "int8": (torch.int8, 127.0)}


def quantize(x, fmt="fp8_e4m3", scale=None):
    """(values, scales): x in 8 bits with one fp32 scale per vector of its last axis, x ≈ values × scales."""
    ### BEGIN SOLUTION
    dtype, top = FORMATS[fmt]
    if scale is None:
        amax = x.float().abs().amax(dim=-1)
        scales = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    else:
        scales = torch.full(x.shape[:-1], float(scale))
    y = (x.float() / scales[..., None]).clamp(-top, top)
    if fmt == "int8":
        y = y.round()
    return y.to(dtype), scales
    ### END SOLUTION


# %%
# id: lab11-32
check("11.quantize", quantize)

# %% [markdown]
# id: lab11-33
# ### The error it costs: attention against 16 bits
#
# The tiny model's own K and V (layer 0 of a 180-token text, 2 KV heads of 32 dims), put into rooms of 16 beds,
# quantised with your `quantize` (kvlab's until yours is written), and attended by kvlab's quantised decode
# kernel: Lab 05's fast kernel (tiles of rooms, tensor cores, split-K) reading half-size beds and their labels,
# dequantising in the kernel (a token's K scale multiplies its score after the product, its V scale its softmax
# weight). On the CPU it runs in Triton's interpreter.

# %%
# id: lab11-34
from kvlab.models.tiny import generate, tiny_model
from kvlab.models.tiny.tokenizer import encode
from kvlab.ops import quant
from kvlab.ops.attention import causal_attention, paged_decode_attention_ref
from kvlab.ops.kernels.quantized import paged_decode_attention_quantized

try:
    quantize(torch.ones(1, 4), "int8")
    my_quantize = quantize
except NotImplementedError:
    my_quantize = quant.quantize

model = tiny_model("cpu")
text = "The cache " + generate(["The cache "], 170).texts[0]
captured = {}


def keep_layer0(layer, q, k, v):
    if layer == 0:
        captured.update(q=q, k=k, v=v)
    return causal_attention(q, k, v)


with torch.no_grad():
    ids = torch.tensor(encode(text))
    model.forward_tokens(ids, torch.arange(len(ids)), keep_layer0)

n, block_size = len(ids), 16
rooms = -(-n // block_size)
pad = rooms * block_size - n


def paged(t):  # one guest's tokens in rooms 0 .. rooms - 1, the beds past its end zero
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]).view(rooms, block_size, *t.shape[1:])


k_cache, v_cache = paged(captured["k"]), paged(captured["v"])
q = captured["q"][-1:]  # the last token's query, as a decode step asks it
tables = torch.arange(rooms, dtype=torch.int32)[None]
lens = torch.tensor([n], dtype=torch.int32)
exact = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens)  # fp32
bf16 = paged_decode_attention_ref(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), tables, lens).float()
print(f"{n} tokens in {rooms} rooms of {block_size}; error of attention against fp32 "
      f"(output's largest magnitude {exact.abs().max():.2f}):")
print(f"  bf16 cache              : max {(bf16 - exact).abs().max():.2e}, mean {(bf16 - exact).abs().mean():.2e}")
for fmt in ("fp8_e4m3", "int8"):
    kq, ks = my_quantize(k_cache, fmt)
    vq, vs = my_quantize(v_cache, fmt)
    got = paged_decode_attention_quantized(q, kq, vq, ks, vs, tables, lens)
    print(f"  {fmt:9} (kvlab kernel): max {(got - exact).abs().max():.2e}, mean {(got - exact).abs().mean():.2e}; "
          f"against bf16: max {(got - bf16).abs().max():.2e}")

# %% [markdown]
# id: lab11-35
# fp8 e4m3 keeps 3 bits of mantissa, so each element comes back within 1/16 of itself, and the attention output
# is off by about a percent of its size; int8 with a scale per token and head keeps 7 bits below the vector's
# largest element and lands within a few thousandths, on a par with bf16 itself. What matters is whether the
# model says something else.
#
# ### How often the words change
#
# The tiny model writes eight texts (greedy, fp32 cache); then each text is read again with the cache stored in
# another format, and we count the positions where the model's next-token choice flips (every position reads the
# same text, so one flip does not drag the next ones with it). Then a free run: the same prompts continued with
# the quantised cache from the start, and the words that differ from the fp32 run (from the first difference on,
# a continuation is another one).

# %%
# id: lab11-36
from kvlab.models.tiny.quantized import greedy_texts, next_token_flips, words_changed

prompts = ["The cache ", "A block table ", "Paged attention ", "A guest ", "The scheduler ", "Each room ",
           "When the hotel ", "Copy on write "]
continuations = generate(prompts, 120).texts  # greedy, fp32 cache (the engine, all prompts at once)
texts = [p + t for p, t in zip(prompts, continuations)]
free_fp32 = [t[:32] for t in continuations]  # a byte is a token: the first 32 tokens of each
flip_rates = {}
for fmt in ("bfloat16", "fp8_e4m3", "int8"):
    flips = [next_token_flips(t, fmt, model) for t in texts]
    flip_rates[fmt] = sum(f for f, _ in flips) / sum(n for _, n in flips)
    changed = [words_changed(a, b) for a, b in zip(free_fp32, greedy_texts(prompts, 32, fmt))]
    print(f"{fmt:9}: next token flips at {flip_rates[fmt]:6.2%} of {sum(n for _, n in flips):,} positions; "
          f"free run: {sum(c > 0 for c, _ in changed)} of {len(prompts)} continuations change, "
          f"{sum(c for c, _ in changed)} of {sum(w for _, w in changed)} words")

# %% [markdown]
# id: lab11-37
# ### The capacity it buys
#
# Half-size beds hold twice the guests. Llama-3.1-8B on an H100 at 8,192 tokens a guest, planned as Lab 08 plans
# (vLLM's memory budget, paged rooms), with its cache in bf16, in fp8 with one scale per layer, and in fp8 with a
# scale per token and head:

# %%
# id: lab11-38
from kvlab.ops.runtime import kernel_mode
from kvlab.perf.planner import plan

for dtype in ("auto", "fp8", "fp8_per_token_head"):
    p = plan("Llama-3.1-8B", "H100-80GB", kv_cache_dtype=dtype, max_seq_len=8192)
    spec = kvlab.models.LLAMA_31_8B.with_kv_dtype(dtype)
    print(f"{dtype:18}: {spec.kv_bytes_per_token:>7,} bytes per token, {p.capacity.max_concurrency:6.1f} guests of "
          f"8,192 tokens at once")

# the kernels' speed: on a GPU, kvlab's 16-bit kernel against the quantised one at 32 guests of 8,192 tokens
if kernel_mode() == "interpreter":
    print("\ntiming the kernels needs a GPU: on this CPU they run in Triton's interpreter (see `kvlab bench attention`)")
else:
    import triton.testing

    from kvlab.ops.kernels import prepare_paged_decode
    from kvlab.ops.kernels.quantized import FP8_MIN_ARCH, prepare_paged_decode_quantized
    from kvlab.ops.testing import uniform_case

    major, minor = torch.cuda.get_device_capability()
    fmt = "fp8_e4m3" if major * 10 + minor >= FP8_MIN_ARCH else "int8"  # Triton's fp8 from sm_89 on
    qg, kg, vg, tg, lg = uniform_case(32, 8192, 16, 32, 8, 128, torch.bfloat16, device="cuda")
    kq, ks = quant.quantize(kg, fmt)
    vq, vs = quant.quantize(vg, fmt)
    t16 = triton.testing.do_bench(prepare_paged_decode(qg, kg, vg, tg, lg))
    t8 = triton.testing.do_bench(prepare_paged_decode_quantized(qg, kq, vq, ks, vs, tg, lg))
    print(f"\n{torch.cuda.get_device_name()}: 32 x 8,192 tokens, bf16 {32 * 8192 / t16 / 1e3:,.0f} M tokens/s, "
          f"{fmt} {32 * 8192 / t8 / 1e3:,.0f} M tokens/s: {t16 / t8:.2f}x")

# %% [markdown]
# id: lab11-39
# fp8 halves the bytes of every token (with a scale per token and head, 3% more than half), so twice the guests
# check in at once; a decode step reads half the bytes, so a memory-bound kernel should go nearly twice as fast
# (the GPU cell above measures it). The
# price, on the tiny model: fp8 e4m3 flips the next word at about 4 positions in a hundred, int8 with a scale per
# token and head at about as few as bf16 itself (0.3%). A real model is larger, and its K vectors carry outlier
# channels: what scales per token, per head or per channel are for. With one scale per layer the scale must be
# right: vLLM's are 1.0 unless calibrated (from a dataset with llm-compressor, the recommended way, or on the fly
# from the first batch with `calculate_kv_scales`), and what lies beyond 448 × scale saturates, the exercise's
# given-scale case.
#
# **What real systems do.** vLLM's `--kv-cache-dtype fp8` (e4m3) stores K and V in one byte with one scale per
# layer for each, which its attention backends multiply in as they read (FlashAttention 3 goes further and
# quantises the queries too, attending in fp8); the `*_per_token_head` formats keep a scale per token and head
# as here. NVFP4 on Blackwell goes to 4 bits, with an fp8 scale per 16 elements. Writing the cache quantises
# (vLLM's reshape-and-cache kernel casts as it stores), so every later read sees the 8-bit values: here the
# prompt's own attention too, as when a step's K/V are written before it attends over the cache.
