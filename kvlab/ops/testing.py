"""Inputs and tolerances for paged attention, shared by the tests, the graders, the benchmark and
the notebooks, so that all of them judge kernels on the same cases with the same slack.

- ``make_case``: a small ragged batch on the CPU, seeded, with the awkward corners (padding
  entries that must never be read, NaN in the beds past each guest's end, shared rooms, a key card
  stored column by column).
- ``uniform_case``: every sequence the same length, built where it will run (a GPU's memory for
  the benchmark), with its rooms scattered at random.
- ``make_prefill_case`` and ``PREFILL_CASES``: batches of prefill chunks (and decodes) packed
  varlen, with NaN in every bed, room and key-card entry that must never be read.
- ``TOLERANCE`` and ``close``: how far a kernel may be from the torch reference, per dtype.
"""

from __future__ import annotations

import torch

# (atol, rtol) of a kernel against the fp32-accumulating torch reference, by the output's dtype
TOLERANCE = {
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
FAR = 10**9  # a padding entry no hotel has a room for
NAN_ROOM = "nan room"  # padding entries naming a real room whose keys and values are NaN
SPARE_ROOM = "spare room"  # padding entries naming a real room nobody holds


def tolerance(dtype: torch.dtype) -> dict:
    """``atol`` and ``rtol`` for ``torch.testing.assert_close`` on outputs of this dtype."""
    atol, rtol = TOLERANCE[dtype]
    return {"atol": atol, "rtol": rtol}


def close(got, expected) -> bool:
    """``got`` is a tensor of the expected shape, within the tolerance of the expected dtype."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    atol, rtol = TOLERANCE[expected.dtype]
    return torch.allclose(got.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol)


def make_case(
    seq_lens,
    block_size,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    dtype=torch.float32,
    seed=0,
    garbage=-1,
    shared=False,
    transposed=False,
    nan_beds=False,
):
    """Random q and a paged cache whose rooms are scattered; unused table entries hold ``garbage``:
    a number, ``SPARE_ROOM`` (a room nobody holds) or ``NAN_ROOM`` (the same room, full of NaN).
    ``nan_beds`` fills the beds no guest holds in each guest's last room with NaN (the rest of
    the case is the same as without it). ``transposed`` stores the key cards column by column (a
    transposed view), so their row stride is not their length. Returns ``q, k_cache, v_cache,
    block_tables, seq_lens`` on the CPU; the same arguments always give the same tensors."""
    g = torch.Generator().manual_seed(seed)
    rooms_each = [-(-n // block_size) for n in seq_lens]
    width = max(rooms_each) + 2
    num_blocks = sum(rooms_each) + 5
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    if garbage in (SPARE_ROOM, NAN_ROOM):
        spare = order[-1]  # never on a key card: the cards use the first sum(rooms_each)
        if garbage == NAN_ROOM:
            k_cache[spare] = v_cache[spare] = float("nan")
        garbage = spare
    tables = torch.full((len(seq_lens), width), garbage, dtype=torch.int32)
    for s, n in enumerate(rooms_each):
        rooms = order[:n] if shared else order[sum(rooms_each[:s]) : sum(rooms_each[:s]) + n]
        tables[s, :n] = torch.tensor(rooms, dtype=torch.int32)
    if nan_beds:
        held = {}  # room -> beds some guest holds (shared rooms: the longest guest's)
        for s, n in enumerate(seq_lens):
            for b, room in enumerate(tables[s, : rooms_each[s]].tolist()):
                held[room] = max(held.get(room, 0), min(block_size, n - b * block_size))
        for room, beds in held.items():
            k_cache[room, beds:] = v_cache[room, beds:] = float("nan")
    if transposed:
        tables = tables.t().contiguous().t()
    q = torch.randn(len(seq_lens), q_heads, head_dim, generator=g).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens


def uniform_case(
    num_seqs,
    seq_len,
    block_size,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    dtype=torch.bfloat16,
    device="cpu",
    seed=0,
    num_blocks=None,
):
    """``num_seqs`` sequences of ``seq_len`` tokens, drawn on ``device`` (a benchmark's gigabyte
    of K/V is never made on the CPU). Each sequence's rooms are scattered over the cache, as
    after a day of check-ins and check-outs. ``num_blocks`` smaller than the rooms needed gives
    a cache of that many rooms that the key cards share at random (for compiling: the shapes
    and strides of a large batch, the memory of a small one)."""
    rooms_each = -(-seq_len // block_size)
    needed = num_seqs * rooms_each
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = needed if num_blocks is None else num_blocks
    shape = (blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype, generator=g)
    v_cache = torch.randn(shape, device=device, dtype=dtype, generator=g)
    if blocks >= needed:
        rooms = torch.randperm(blocks, device=device, generator=g)[:needed]
    else:
        rooms = torch.randint(blocks, (needed,), device=device, generator=g)
    tables = rooms.to(torch.int32).view(num_seqs, rooms_each)
    lens = torch.full((num_seqs,), seq_len, device=device, dtype=torch.int32)
    q = torch.randn(num_seqs, q_heads, head_dim, device=device, dtype=dtype, generator=g)
    return q, k_cache, v_cache, tables, lens


def flash_layout(k_cache, v_cache):
    """The same K/V as views into one ``[num_blocks, 2, block_size, kv_heads, head_dim]`` tensor
    (vLLM's flash-attention layout): caches that are not contiguous, as kernels meet them."""
    kv = torch.stack([k_cache, v_cache], dim=1)
    return kv[:, 0], kv[:, 1]


def repaged(case, block_size, seed=0):
    """The same case with its tokens moved into rooms of ``block_size`` beds, scattered anew: q,
    the lengths and every token's K and V stay; only where they live changes, so a kernel's
    answer must not (padding entries are -1)."""
    from kvlab.ops.attention import gather_kv, write_kv_reference

    q, k_cache, v_cache, tables, lens = case
    seq_lens = [int(n) for n in lens]
    rooms_each = [-(-n // block_size) for n in seq_lens]
    order = torch.randperm(sum(rooms_each), generator=torch.Generator().manual_seed(seed))
    shape = (len(order), block_size, *k_cache.shape[2:])
    new_k = torch.zeros(shape, dtype=k_cache.dtype)
    new_v = torch.zeros(shape, dtype=v_cache.dtype)
    new_tables = torch.full((len(seq_lens), max(rooms_each)), -1, dtype=torch.int32)
    first = 0
    for s, n in enumerate(seq_lens):
        rooms = order[first : first + rooms_each[s]]
        first += rooms_each[s]
        new_tables[s, : len(rooms)] = rooms.to(torch.int32)
        slots = (rooms[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        write_kv_reference(
            new_k, new_v, slots, *gather_kv(k_cache.cpu(), v_cache.cpu(), tables[s].cpu(), n)
        )
    return q, new_k, new_v, new_tables, lens


def make_prefill_case(
    chunks,
    block_size,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    dtype=torch.float32,
    seed=0,
    garbage=NAN_ROOM,
    transposed=False,
):
    """A step of chunked prefill: ``chunks`` lists ``(num_computed, chunk_len)`` per sequence (a
    decode is ``(n, 1)``, a chunk of 0 a sequence with nothing to do this step). Every sequence
    has ``num_computed + chunk_len`` tokens of K/V in rooms scattered over the cache; the beds past
    its last token, the rooms nobody holds and the key-card entries past the ones it needs are
    poison: NaN beds and rooms, and entries that are ``garbage`` (``NAN_ROOM``: a room full of NaN;
    a number such as ``FAR``: no room at all). Returns ``q, k_cache, v_cache, block_tables,
    query_start_loc, num_computed`` on the CPU, q packed varlen (``[num_tokens, q_heads,
    head_dim]``); the same arguments always give the same tensors."""
    g = torch.Generator().manual_seed(seed)
    totals = [c + n for c, n in chunks]
    rooms_each = [-(-t // block_size) for t in totals]
    width = max(rooms_each, default=0) + 2
    num_blocks = sum(rooms_each) + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    held, spare = order[: sum(rooms_each)], order[sum(rooms_each) :]
    k_cache[spare] = v_cache[spare] = float("nan")  # rooms nobody holds
    entry = spare[0] if garbage == NAN_ROOM else garbage
    tables = torch.full((len(chunks), width), entry, dtype=torch.int32)
    first = 0
    for s, (rooms, total) in enumerate(zip(rooms_each, totals, strict=True)):
        tables[s, :rooms] = torch.tensor(held[first : first + rooms], dtype=torch.int32)
        first += rooms
        if total % block_size:  # the beds past the sequence's last token
            last = held[first - 1]
            k_cache[last, total % block_size :] = v_cache[last, total % block_size :] = float("nan")
    if transposed:
        tables = tables.t().contiguous().t()
    lengths = [n for _, n in chunks]
    q = torch.randn(sum(lengths), q_heads, head_dim, generator=g).to(dtype)
    starts = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
    computed = torch.tensor([c for c, _ in chunks], dtype=torch.int32)
    return q, k_cache, v_cache, tables, starts, computed


# Batches of chunks every prefill kernel is judged on: (id, chunks as (num_computed, chunk_len),
# block_size, (q_heads, kv_heads), head_dim, dtype). Small, for Triton's interpreter.
PREFILL_CASES = [
    ("one query", [(0, 1)], 16, (4, 4), 32, torch.float32),
    ("chunk = block_size - 1, = , + 1", [(0, 15), (16, 16), (32, 17)], 16, (8, 2), 40, torch.float32),
    ("starts and ends mid-room", [(7, 6), (3, 9)], 5, (8, 1), 24, torch.float16),
    ("decodes among chunks", [(20, 1), (0, 12), (9, 1), (13, 7)], 1, (4, 2), 16, torch.bfloat16),
    ("head_dim 128", [(5, 9)], 16, (2, 2), 128, torch.float32),
    ("an empty chunk", [(4, 0), (0, 3)], 4, (4, 1), 32, torch.float16),
    ("long prefix, several key tiles", [(70, 40), (0, 1)], 5, (6, 2), 40, torch.bfloat16),
    ("whole prompt in one chunk", [(0, 33)], 1, (8, 8), 16, torch.float32),
]  # fmt: skip
