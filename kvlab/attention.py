"""Reference attention in plain PyTorch, the ground truth every faster version is checked against.

Shapes follow the token-major convention used throughout the course:
``q: [tokens, q_heads, head_dim]``, ``k, v: [tokens, kv_heads, head_dim]``. With grouped-query
attention each KV head serves ``q_heads // kv_heads`` consecutive query heads.
"""

from __future__ import annotations

import math

import torch

from kvlab.validate import positive_int


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat each KV head for the query heads that share it (GQA)."""
    num_kv_heads = x.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q_heads ({num_q_heads}) must be a multiple of kv_heads ({num_kv_heads})")
    return x.repeat_interleave(num_q_heads // num_kv_heads, dim=1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every token attends to itself and all earlier tokens. Returns ``[tokens, q_heads, head_dim]``."""
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"expected q [T,Hq,D], k and v [T,Hkv,D]; got {q.shape}, {k.shape}, {v.shape}"
        )
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) / math.sqrt(q.shape[-1])
    t = q.shape[0]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), diagonal=1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hts,shd->thd", probs, v.float()).to(q.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """One new token's query ``[q_heads, head_dim]`` against every cached key and value."""
    if q.dim() != 2 or k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [Hq,D], caches [T,Hkv,D]; got {q.shape}, {k_cache.shape}, {v_cache.shape}"
        )
    k, v = _expand_kv(k_cache, q.shape[0]), _expand_kv(v_cache, q.shape[0])
    scores = torch.einsum("hd,shd->hs", q.float(), k.float()) / math.sqrt(q.shape[-1])
    return torch.einsum("hs,shd->hd", scores.softmax(dim=-1), v.float()).to(q.dtype)


class TinyAttention:
    """One seeded attention layer (no MLP, no norm): enough to show what the cache stores."""

    def __init__(
        self, d_model: int, num_heads: int, num_kv_heads: int | None = None, seed: int = 0
    ):
        positive_int("d_model", d_model)
        positive_int("num_heads", num_heads)
        num_kv_heads = (
            num_heads if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
        )
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        g = torch.Generator().manual_seed(seed)
        scale = 1.0 / math.sqrt(d_model)

        def weight(rows, cols):
            return torch.randn(rows, cols, generator=g) * scale

        self.wq = weight(d_model, num_heads * self.head_dim)
        self.wk = weight(d_model, num_kv_heads * self.head_dim)
        self.wv = weight(d_model, num_kv_heads * self.head_dim)
        self.wo = weight(num_heads * self.head_dim, d_model)

    def __repr__(self):
        return (
            f"TinyAttention(d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim})"
        )

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``x: [tokens, d_model]`` to per-head q ``[T,Hq,D]`` and k, v ``[T,Hkv,D]``."""
        t = x.shape[0]
        q = (x @ self.wq).view(t, self.num_heads, self.head_dim)
        k = (x @ self.wk).view(t, self.num_kv_heads, self.head_dim)
        v = (x @ self.wv).view(t, self.num_kv_heads, self.head_dim)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Recompute everything: the output for every position of ``x: [tokens, d_model]``."""
        q, k, v = self.qkv(x)
        return causal_attention(q, k, v).reshape(x.shape[0], -1) @ self.wo

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (0, self.num_kv_heads, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def decode_step(
        self, x_t: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Process one new token ``x_t: [d_model]`` using (and extending) the KV cache."""
        q, k, v = self.qkv(x_t.unsqueeze(0))
        k_cache = torch.cat([k_cache, k])
        v_cache = torch.cat([v_cache, v])
        out = decode_attention(q[0], k_cache, v_cache).reshape(-1) @ self.wo
        return out, k_cache, v_cache
