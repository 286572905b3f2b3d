"""The online softmax, written once for the fast kernels (``tiled``'s decode, ``prefill``): the
scores of a tile of keys on the tensor cores, and the fold of a tile into the running maximum,
sum and output of every row (scores in log2 units, so ``exp2`` does the exponentials). Lab 05's
teaching kernel (``room_by_room``) spells the same steps out, as a learner writes them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_scores(q, k, LOW_PRECISION: tl.constexpr):
    """q · kᵀ, [rows, tokens]: in the cache's dtype with fp32 accumulation (``LOW_PRECISION``,
    q already in that dtype), else in fp32 without TF32."""
    if LOW_PRECISION:
        scores = tl.dot(q, tl.trans(k))
    else:
        scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    return scores


@triton.jit
def fold_scores(m, denom, scores):
    """The running maximum and sum with a tile's ``scores`` [rows, tokens] folded in (log2
    units, -inf where a row does not see a token): (m_new, alpha, p, denom), where ``alpha``
    rescales what the rows held and ``p`` are the tile's unnormalised weights."""
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    return m_new, alpha, p, denom * alpha + tl.sum(p, axis=1)


@triton.jit
def weighted_values(p, v, LOW_PRECISION: tl.constexpr):
    """p · v, [rows, lanes]: the weights rounded to the values' dtype (``LOW_PRECISION``) with
    fp32 accumulation, else in fp32 without TF32."""
    if LOW_PRECISION:
        pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return pv


@triton.jit
def fold_tile(acc, m, denom, scores, v, LOW_PRECISION: tl.constexpr):
    """(acc, m, denom) with a tile folded in: ``scores`` [rows, tokens] in log2 units (-inf where
    a row does not see a token) and its values ``v`` [tokens, lanes]; every row must have seen
    some token by now (its maximum finite)."""
    m_new, alpha, p, denom = fold_scores(m, denom, scores)
    return acc * alpha[:, None] + weighted_values(p, v, LOW_PRECISION), m_new, denom
