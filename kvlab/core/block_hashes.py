"""A prompt's block hashes for the hybrid block manager: one digest per full block, chained, the
same for every layer group (vLLM v1 hashes a request's blocks once and looks each group up by
``(hash, group)``).

The digest is SHA-256 of the parent block's digest and the block's token ids (vLLM's
``sha256`` prefix-caching hash), so a digest names its whole prefix: a sliding-window group can
look up a block whose parent block is long gone. :mod:`kvlab.core.prefix_cache.hash_chain`
instead confirms a hit by the parent *block*, which a window has freed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

ROOT_DIGEST = bytes(32)  # the "parent" of a sequence's first block


def chain_block_hashes(token_ids: Sequence[int], block_size: int, hashes: list[bytes]) -> None:
    """Extend ``hashes`` (the digests of the first ``len(hashes)`` blocks of ``token_ids``) with
    those of the remaining full blocks, in place."""
    parent = hashes[-1] if hashes else ROOT_DIGEST
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        tokens = ",".join(map(str, token_ids[start : start + block_size]))
        parent = hashlib.sha256(parent + tokens.encode()).digest()
        hashes.append(parent)
