"""The torch twins of decode attention that the slips of Labs 04 and 05 are set against: each
computes kvlab's attention (``kvlab.ops.attention``) on a case of ``kvlab.ops.testing.make_case``
with one decision a usual slip changes given as a parameter (which beds a guest attends, the scale,
the KV head a query head reads, an online softmax that forgets to rescale, ...). Without one they
answer as ``paged_decode_attention_ref`` (``tests/grading/test_grading_references.py`` checks it
on random cases), so a slip's answer moves with kvlab's reference."""

from __future__ import annotations

import math

import torch

from kvlab.ops.attention import decode_attention, gather_kv

ANY = math.inf  # in a slip's answer: a value the slip leaves to chance (two programs race for it)


def attend_beds(
    args,
    beds_of=None,
    zero_tail=False,
    scale=None,
    kv_of_head=None,
    softmax_over_heads=False,
    row_of=None,
):
    """fp32 attention where guest s attends its first ``beds_of(seq_len, block_size)`` beds (the
    beds past seq_len zeroed with ``zero_tail``), listed in row ``row_of(s)`` of the key cards
    (its own row by default): what the usual slips compute. NaN where a guest attends no bed
    (code gets 0 or NaN there)."""
    q, k_cache, v_cache, tables, lens = args
    q, k_cache, v_cache = q.float().cpu(), k_cache.float().cpu(), v_cache.float().cpu()
    size = k_cache.shape[1]
    out = torch.full(q.shape, float("nan"))
    for s in range(q.shape[0]):
        n = int(lens[s])
        beds = n if beds_of is None else beds_of(n, size)
        if beds < 1:
            continue
        row = s if row_of is None else row_of(s)
        rooms = tables[row, : -(-beds // size)].long().cpu()
        k = k_cache[rooms].flatten(0, 1)[:beds].clone()
        v = v_cache[rooms].flatten(0, 1)[:beds].clone()
        if zero_tail:
            k[n:], v[n:] = 0.0, 0.0
        if kv_of_head is not None:
            k, v = k[:, kv_of_head], v[:, kv_of_head]
        if softmax_over_heads:
            out[s] = decode_attention_over_heads(q[s], k, v, scale)
        else:
            out[s] = decode_attention(q[s], k, v, scale=scale)
    return out


def decode_attention_over_heads(q, k, v, scale=None):
    """One guest's attention with each token's scores normalised across the query heads."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("hd,thd->ht", q, k) * scale
    return torch.einsum("ht,thd->hd", scores.softmax(dim=0), v)


def guest_kv(args, s: int):
    """Guest s's keys and values, fp32 on the CPU: [seq_len, kv_heads, head_dim] each."""
    _, k_cache, v_cache, tables, lens = args
    k, v = gather_kv(k_cache, v_cache, tables[s], int(lens[s]))
    return k.float().cpu(), v.float().cpu()


def attend_room_by_room(args, rescale_acc=True, rescale_l=True, keep_max=True):
    """The kernel's loop in torch: an online softmax over one room at a time, optionally
    without rescaling acc or l by alpha = exp(m - m_new), or without m = m_new."""
    q, k_cache = args[0].float().cpu(), args[1]
    size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    kv_of = torch.arange(q.shape[1]) // group
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.full(q.shape, float("nan"))
    for s in range(q.shape[0]):
        k_all, v_all = guest_kv(args, s)
        m = torch.full((q.shape[1],), -math.inf)
        denom, acc = torch.zeros(q.shape[1]), torch.zeros(q.shape[1:])
        for start in range(0, k_all.shape[0], size):
            k, v = k_all[start : start + size, kv_of], v_all[start : start + size, kv_of]
            scores = torch.einsum("hd,thd->ht", q[s], k) * scale
            m_new = torch.maximum(m, scores.amax(dim=1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[:, None])
            denom = (alpha * denom if rescale_l else denom) + p.sum(dim=1)
            acc = (alpha[:, None] * acc if rescale_acc else acc) + torch.einsum("ht,thd->hd", p, v)
            if keep_max:
                m = m_new
        out[s] = acc / denom[:, None]
    return out


def attend_overlapping_heads(args, ordered: bool):
    """What programs serving the query rows kvh + g (not kvh * GROUP + g) store. ``ordered``:
    the programs run one after another (the interpreter), so the last one to store a row wins;
    else rows stored by two programs are left to chance (``ANY``). Rows nobody stores are NaN."""
    q, k_cache = args[0].float().cpu(), args[1]
    kv_heads = k_cache.shape[2]
    group = q.shape[1] // kv_heads
    out = torch.full(q.shape, float("nan"))
    stores = torch.zeros(q.shape[:2], dtype=torch.int64)
    for s in range(q.shape[0]):
        k, v = guest_kv(args, s)
        for kvh in range(kv_heads):
            rows = list(range(kvh, kvh + group))
            out[s, rows] = decode_attention(q[s, rows], k[:, kvh : kvh + 1], v[:, kvh : kvh + 1])
            stores[s, rows] += 1
    if not ordered:
        out[stores > 1] = ANY
    return out


def attend_read(args, keys=None, values=None, normalise=True, exp2=False):
    """fp32 attention of each guest over its seq_len tokens, with the keys and values a kernel
    reads: ``keys(args, s)`` / ``values(args, s)`` give guest s's ``[seq_len, q_heads, head_dim]``
    (one row per query head; None: the right ones, or None when the slip would read past the
    cache). ``normalise=False`` leaves acc undivided; ``exp2`` takes 2**x for e**x."""
    q = args[0].float().cpu()
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.empty(q.shape)
    for s in range(q.shape[0]):
        k = (keys or own_kv)(args, s)
        v = (values or own_values)(args, s)
        if k is None or v is None:
            return None
        scores = torch.einsum("hd,thd->ht", q[s], k) * scale
        p = torch.exp2 if exp2 else torch.exp
        w = p(scores - scores.amax(dim=1, keepdim=True))
        acc = torch.einsum("ht,thd->hd", w, v)
        out[s] = acc / w.sum(dim=1, keepdim=True) if normalise else acc
    return out


def _per_query_head(args, kv):
    """A guest's ``[seq_len, kv_heads, head_dim]`` spread over the query heads (h reads h // GROUP)."""
    group = args[0].shape[1] // args[1].shape[2]
    return kv.repeat_interleave(group, dim=1)


def own_kv(args, s):
    return _per_query_head(args, guest_kv(args, s)[0])


def own_values(args, s):
    return _per_query_head(args, guest_kv(args, s)[1])


# --- what a kernel that misreads memory attends ----------------------------------------------


def attend_with_unit_step(args):
    """The answer of a kernel that reads entry b of row seq at ``seq * stride_bts + b``."""
    q, k_cache, v_cache, tables, lens = args
    memory = torch.as_strided(tables, (tables.numel(),), (1,)).cpu()  # the entries as stored
    misread = torch.zeros_like(tables, device="cpu")
    size = k_cache.shape[1]
    for s in range(tables.shape[0]):
        for b in range(-(-int(lens[s]) // size)):
            at = s * tables.stride(0) + b
            if at >= memory.numel():
                return None  # past the table: nothing to compare
            misread[s, b] = memory[at]
    if int(misread.max()) >= k_cache.shape[0] or int(misread.min()) < 0:
        return None  # a crash, not an answer
    return attend_beds((q, k_cache, v_cache, misread, lens))


def swapped_reader(cache_at):
    """A reader of guest s's keys (``cache_at`` 1) or values (2) at bed t of KV head h found where
    t * stride_h + h * stride_t points: vector ``t + h * kv_heads`` of the room (None when that
    is past the cache)."""

    def read(args, s):
        cache, tables, lens = args[cache_at], args[3], args[4]
        blocks, size, kv_heads = cache.shape[:3]
        group = args[0].shape[1] // kv_heads
        vectors = cache.float().cpu().reshape(blocks * size * kv_heads, -1)
        n = int(lens[s])
        rooms = tables[s, : -(-n // size)].long().cpu()
        token = torch.arange(n)
        kv_of = torch.arange(args[0].shape[1]) // group
        at = (rooms[token // size] * size * kv_heads + token % size)[:, None] + kv_of * kv_heads
        return None if int(at.max()) >= len(vectors) else vectors[at]

    return read
