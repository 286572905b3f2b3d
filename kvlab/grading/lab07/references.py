"""Lab 07's references: the rules the exercises ask for, written on the lab's plain structures
(``cached_prefix`` with the usual slips as options, ``reference_take``), and kvlab's own code a
learner's must not hand the work to."""

from __future__ import annotations

from kvlab.core.block_manager import BlockManager
from kvlab.core.block_pool import ROOT_HASH, BlockPool, hash_block_tokens
from kvlab.grading.given import CachedBlock
from kvlab.grading.lab07 import hints
from kvlab.grading.own_code import methods_of
from kvlab.grading.slips import Slip

KVLAB_CODE = methods_of(BlockManager, BlockPool)  # calling one is handing the work over


def cached_prefix(
    token_ids,
    block_size: int,
    cached: dict,
    *,
    chained: str = "yes",
    stop: bool = True,
    parent_on_miss: bool = True,
    confirm_tokens: bool = True,
    confirm_parent: bool = True,
    blocks: str = "right",
    overlap: bool = False,
) -> list[int]:
    """The lab's rule (with the defaults), or one of its usual slips. ``chained``: "yes" (the
    rule), "root" (every block hashed with ROOT_HASH as its parent), "key" (hashed with
    ROOT_HASH, while the parent a hit is confirmed with follows those keys). ``overlap``: block
    i is ``token_ids[i : i + block_size]``."""
    n = len(token_ids)
    count = {
        "right": (n - 1) // block_size,
        "covers_last": n // block_size,
        "partial": -(-n // block_size),
        "drops_one": n // block_size - 1,
    }[blocks]
    hits, parent = [], ROOT_HASH
    for i in range(max(count, 0)):
        start = i if overlap else i * block_size
        block = tuple(token_ids[start : start + block_size])
        key_parent = parent if chained == "yes" else ROOT_HASH
        key = hash_block_tokens(key_parent, block)
        entry = cached.get(key)
        hit = (
            entry is not None
            and (not confirm_tokens or tuple(entry.token_ids) == block)
            and (
                not confirm_parent
                or entry.parent_hash == (parent if chained == "key" else key_parent)
            )
        )
        if hit:
            hits.append(entry.block_id)
        elif stop:
            break
        if (hit or parent_on_miss) and chained != "root":
            parent = key
    return hits


def chain_hashes(token_ids, block_size: int, count: int) -> list[int]:
    hashes, parent = [], ROOT_HASH
    for i in range(count):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


def cache_prompt(cached: dict, token_ids, block_size: int, room_ids) -> list[int]:
    """Put every full block of a finished guest's tokens in ``cached`` (rooms from ``room_ids``,
    an iterator; a block already cached keeps its room). Returns the rooms, in order."""
    rooms, parent = [], ROOT_HASH
    for i in range(len(token_ids) // block_size):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        key = hash_block_tokens(parent, block)
        if key not in cached:
            cached[key] = CachedBlock(next(room_ids), parent, block)
        rooms.append(cached[key].block_id)
        parent = key
    return rooms


def reference_take(free_queue: list, cached: dict, block_hashes: dict) -> int:
    """The rule the exercise asks for (kvlab's BlockPool.get_new_block on plain structures)."""
    block = free_queue.pop(0)
    if block in block_hashes:
        del cached[block_hashes.pop(block)]
    return block


def _plain_first(queue: list, cached: dict, hashes: dict):
    """With a cached room at the front, the first room that holds no cached block."""
    return next((b for b in queue if b not in hashes), None) if queue[0] in hashes else None


# the wrong rooms a take_block hands out, tried in order: each answers which room
TAKE_SLIPS = (
    Slip(hints.RETURN_HASH, lambda queue, cached, hashes: hashes.get(queue[0])),
    Slip(hints.BACK, lambda queue, cached, hashes: queue[-1]),
    Slip(hints.PLAIN_FIRST, _plain_first),
)
