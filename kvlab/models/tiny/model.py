"""A Llama-style decoder small enough to train on two CPU cores: RMSNorm, rotary position
embeddings (RoPE), grouped-query attention and a SwiGLU MLP, with the embedding tied to the output.

The model has two forwards. :meth:`TinyLlama.forward` recomputes every position of a batch of
equal-length windows (training, and the ground truth the cache is checked against).
:meth:`TinyLlama.forward_tokens` runs only the tokens whose K/V are not cached yet, flattened across
sequences; attention is handed to an ``attend(layer, q, k, v)`` callback that stores the new K/V in
whatever cache holds them and attends over everything cached. The model never sees the cache: a
contiguous and a paged cache run the same weights through the same code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kvlab.core import files
from kvlab.models import ModelSpec

WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class TinyConfig:
    """The shape of the model. Defaults are the shipped model's."""

    vocab_size: int = 256  # one token per byte
    d_model: int = 128
    num_layers: int = 4
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    max_context: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def num_params(self) -> int:
        """Parameters of a model of this shape (the embedding counted once: it is tied)."""
        d, attn_width = self.d_model, self.num_q_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        per_layer = 2 * d + 2 * d * attn_width + 2 * d * kv_width + 3 * d * self.d_ff
        return self.vocab_size * d + self.num_layers * per_layer + d


def model_spec(config: TinyConfig) -> ModelSpec:
    """The model as a :class:`~kvlab.models.ModelSpec` (fp32 K/V), so caches can size themselves."""
    return ModelSpec(
        "kvlab-tiny",
        config.num_layers,
        config.num_q_heads,
        config.num_kv_heads,
        config.head_dim,
        dtype_bytes=4,
        num_params=config.num_params,
        max_context=config.max_context,
    )


TINY_SPEC = model_spec(TinyConfig())  # the shipped model's shape, without loading it


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (no mean, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate each pair of dimensions of ``x: [..., tokens, heads, head_dim]`` by an angle that
    grows with the token's position (``positions: [tokens]`` or broadcastable to ``x``'s leading
    axes). Keys are stored already rotated, so a cached key never needs its position again.

    The angle of each element depends only on its own position, so a token gets bit-identical
    rotations whether it is computed in a prefill or in a decode step.
    """
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[..., None] * freqs  # [..., tokens, half]
    cos, sin = angles.cos()[..., None, :], angles.sin()[..., None, :]  # broadcast over heads
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention: ``num_q_heads`` query heads share ``num_kv_heads`` K/V heads, so
    the cache holds ``num_kv_heads`` vectors per token and layer, not ``num_q_heads``."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        c = config
        self.config = c
        self.wq = nn.Linear(c.d_model, c.num_q_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.d_model, c.num_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.d_model, c.num_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.num_q_heads * c.head_dim, c.d_model, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """``x: [..., tokens, d_model]`` -> rotated q ``[..., tokens, Hq, D]``, rotated k and v
        ``[..., tokens, Hkv, D]``."""
        c = self.config
        lead = x.shape[:-1]
        q = self.wq(x).view(*lead, c.num_q_heads, c.head_dim)
        k = self.wk(x).view(*lead, c.num_kv_heads, c.head_dim)
        v = self.wv(x).view(*lead, c.num_kv_heads, c.head_dim)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full causal attention over ``x: [batch, tokens, d_model]`` (no cache)."""
        q, k, v = self.qkv(x, positions)
        group = self.config.num_q_heads // self.config.num_kv_heads
        k, v = k.repeat_interleave(group, dim=-2), v.repeat_interleave(group, dim=-2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).flatten(-2))


class SwiGLU(nn.Module):
    """The Llama MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)


# attend(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]: store the new K/V in
# the cache, attend each new query over its sequence's cached tokens.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TinyLlama(nn.Module):
    """The decoder. Embedding and output projection share one matrix (tied)."""

    def __init__(self, config: TinyConfig | None = None):
        super().__init__()
        self.config = config = config or TinyConfig()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self._init_weights()

    def _init_weights(self) -> None:
        """Small normal weights; residual outputs scaled down with depth (GPT-2's recipe)."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("wo.weight", "down.weight")):
                    std /= math.sqrt(2 * self.config.num_layers)
                nn.init.normal_(p, std=std)

    @property
    def spec(self) -> ModelSpec:
        return model_spec(self.config)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) @ self.embed.weight.T

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Recompute everything: logits ``[batch, tokens, vocab]`` for ``ids: [batch, tokens]``."""
        positions = torch.arange(ids.shape[-1], device=ids.device)
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer.attn(layer.attn_norm(h), positions)
            h = h + layer.mlp(layer.mlp_norm(h))
        return self.logits(h)

    def forward_tokens(
        self, ids: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """The cached forward: hidden states ``[N, d_model]`` for ``N`` new tokens of any number
        of sequences, flattened (``ids``, ``positions``: ``[N]``). Every linear layer runs once for
        all of them; ``attend`` stores their K/V and attends. Call :meth:`logits` on the rows
        whose next token is wanted."""
        h = self.embed(ids)
        for index, layer in enumerate(self.layers):
            q, k, v = layer.attn.qkv(layer.attn_norm(h), positions)
            h = h + layer.attn.wo(attend(index, q, k, v).flatten(-2))
            h = h + layer.mlp(layer.mlp_norm(h))
        return h


def load_model(directory: str | Path | None = None) -> TinyLlama:
    """The trained model from the course's ``assets/tiny_model`` (bundled in a wheel), or from
    ``directory``; weights stored in fp16, loaded as fp32, in eval mode with gradients off."""
    directory = files.tiny_model_dir() if directory is None else Path(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.exists():
        raise FileNotFoundError(
            f"{weights} is missing; train it with `python -m kvlab.models.tiny.train` (a few minutes on CPU)"
        )
    meta = json.loads((directory / CONFIG_FILE).read_text())
    model = TinyLlama(TinyConfig(**meta["config"]))
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict({name: t.float() for name, t in state.items()})
    model.eval().requires_grad_(False)
    return model


def save_model(model: TinyLlama, directory: str | Path, meta: dict) -> Path:
    """Write fp16 weights (half the bytes; fp32 is restored on load) and ``config.json``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(torch.float16) for name, t in model.state_dict().items()}
    path = directory / WEIGHTS_FILE
    torch.save(state, path)
    full = {"config": asdict(model.config), **meta}
    (directory / CONFIG_FILE).write_text(json.dumps(full, indent=2) + "\n")
    return path
