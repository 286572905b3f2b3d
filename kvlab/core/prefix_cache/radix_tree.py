"""The radix-tree prefix cache (SGLang's ``RadixCache``), page-aligned: every edge holds whole
blocks, so a prompt's cached prefix is the blocks along the path its token ids spell.

A node's ``lock_ref`` is how many block tables hold it: a locked node is protected, one nobody
holds is evictable, and every block in the tree is one of the two. The tree keeps its evictable
blocks itself (the pool counts them as free) and evicts leaves, least recently used first, when
the pool's free queue runs short; a parent becomes a leaf, and a candidate, once its children go.
A holder of a node holds every node above it, so a protected node never hangs below an
evictable one.

A use of a node is a use of every node above it. Rather than stamp the whole path on every use
(a long decode grows a path by one node per block), the tree stamps the node used, and a node
evicted hands its stamp to its parent: a parent is a leaf only once its children are gone, and
then its stamp is the latest use of anything below it, as if every use had stamped it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from kvlab.core.block_pool import Block, BlockPool
from kvlab.core.prefix_cache.protocol import PrefixCacheStats, PrefixMatch
from kvlab.core.validate import positive_int


class Node:
    """An edge of the tree and the node it ends in: ``blocks`` (one or more) and the token ids
    each holds, ``children`` keyed by the token ids of their first block. ``depth`` is the
    number of blocks from the root to this node's end; ``last_access`` a tick of the tree's
    logical clock: the last use of this node, or of one below it that is gone."""

    __slots__ = ("parent", "children", "blocks", "tokens", "depth", "last_access", "node_id")

    def __init__(self, parent: Node | None, blocks: list[Block], tokens: list[tuple], node_id: int):
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.blocks = blocks
        self.tokens = tokens
        self.depth = (0 if parent is None else parent.depth) + len(blocks)
        self.last_access = 0
        self.node_id = node_id

    @property
    def lock_ref(self) -> int:
        """Block tables holding this node (each holds all of its blocks, or none)."""
        return self.blocks[0].ref_count if self.blocks else 0

    def path_blocks(self) -> list[Block]:
        """The blocks from the root down to this node's end."""
        parts, node = [], self
        while node.parent is not None:
            parts.append(node.blocks)
            node = node.parent
        return [block for part in reversed(parts) for block in part]

    def __repr__(self) -> str:
        ids = [b.block_id for b in self.blocks]
        return f"Node(blocks={ids}, lock_ref={self.lock_ref}, last_access={self.last_access})"


class RadixTreeCache:
    """Prefix caching in a radix tree over token ids, one block per page. Also the pool's
    :class:`~kvlab.core.block_pool.Evictor`: it sets ``pool.evictor`` to itself.

    A sequence's state is the node its path ends in: it holds every block from the root to
    there. A block that fills with the tokens of a block already in the tree is not cached
    twice: the tree keeps its node, and once the copy is surely written (a later block of the
    sequence is known) every block table holding it takes the tree's block instead, so the
    sequence's later blocks enter the tree under that node. SGLang's ``insert`` walks past
    the nodes it matches the same way, and a request then frees its duplicate pages and
    rewrites its table with the tree's. Every table at once, forks included: a fork that kept
    the copy would hold blocks below the tree's node without holding the node, which leaf-first
    eviction cannot allow. ``block_tables`` (the block manager's: every sequence's table) is how
    the tree finds them; without it a copy that forks share waits until one table holds it.
    """

    keeps_free_blocks = True

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        block_tables: Callable[[], Iterable[list[Block]]] | None = None,
    ):
        if pool.evictor is not None:
            raise ValueError("pool already has an evictor: one prefix cache per pool")
        if block_tables is not None and not callable(block_tables):
            raise TypeError(
                f"block_tables must be a function giving every block table, got {block_tables!r}"
            )
        self.pool = pool
        self.block_tables = block_tables
        self.block_size = positive_int("block_size", block_size)
        self.root = Node(None, [], [], 0)
        self.leaves: set[Node] = set()
        self.evictable_blocks = 0
        self.protected_blocks = 0
        self.queries = self.hits = self.evictions = 0
        self._clock = 0  # recency order only: allocators keep no time
        self._node_ids = 0
        pool.evictor = self

    # --- finding a prefix ----------------------------------------------------------------------
    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The blocks along the longest cached path of whole blocks (never the prompt's last
        token); ``end`` is (node, blocks of it matched). Nothing changes."""
        size = self.block_size
        limit = self._page_limit(token_ids)
        node, blocks, j = self.root, [], 0
        while j < limit:
            child = node.children.get(tuple(token_ids[j * size : (j + 1) * size]))
            if child is None:
                break
            k = self._pages_along(child, token_ids, j, limit)
            blocks.extend(child.blocks[:k])
            j += k
            if k < len(child.blocks):
                return PrefixMatch(blocks, (child, k))
            node = child
        return PrefixMatch(blocks, (node, len(node.blocks)))

    # the walk's two decisions, one hook each (Lab 10's usual slips override one)
    def _page_limit(self, token_ids: Sequence[int]) -> int:
        """Pages a match may cover: never the one holding the prompt's last token, which the
        engine computes in any case to get the first answer token."""
        return (len(token_ids) - 1) // self.block_size

    def _pages_along(self, child: Node, token_ids: Sequence[int], j: int, limit: int) -> int:
        """Pages of ``child``'s edge the prompt follows from its page ``j`` (the first matched
        by the key): each compared, up to ``limit``."""
        size, k, n = self.block_size, 1, len(child.blocks)
        while k < n and j + k < limit:
            if child.tokens[k] != tuple(token_ids[(j + k) * size : (j + k + 1) * size]):
                break
            k += 1
        return k

    def start(self, match: PrefixMatch, num_tokens: int) -> Node:
        node, k = match.end
        if k < len(node.blocks):
            node = self._split(node, k)
        self._touch(node)
        self.queries += num_tokens
        self.hits += len(match.blocks) * self.block_size
        return node

    # --- growing the tree ----------------------------------------------------------------------
    def cache_full_blocks(self, state: Node, table: list[Block], token_ids: list[int]) -> Node:
        """Extend the sequence's path over its known full blocks: along blocks the tree has
        (taking the tree's block in place of its own copy, even one a fork shares), then a new
        leaf for the rest."""
        size, node = self.block_size, state
        full = len(token_ids) // size
        j = node.depth
        while j < full:
            child = node.children.get(tuple(token_ids[j * size : (j + 1) * size]))
            if child is None:
                node = self._add(node, table, token_ids, j, full)
                break
            k, n, waiting = 0, len(child.blocks), False
            while k < n and j + k < full:
                tokens = tuple(token_ids[(j + k) * size : (j + k + 1) * size])
                if k and child.tokens[k] != tokens:
                    break
                own, cached = table[j + k], child.blocks[k]
                if own is not cached:
                    # its copy may still be written while it is the last known block
                    if j + k == full - 1 or not self._take_cached(table, j + k, cached):
                        waiting = True
                        break
                k += 1
            if k:
                node = child if k == n else self._split(child, k)
                j += k
            if waiting:
                break
        if node is not state:
            self._touch(node)
        return node

    def _take_cached(self, table: list[Block], i: int, cached: Block) -> bool:
        """Put the tree's block in place of the copy ``table[i]`` in every table holding the
        copy (it is then free); False, changing nothing, if those tables cannot be found."""
        own = table[i]
        if own.ref_count == 1:
            holders = [table]
        elif self.block_tables is None:
            return False
        else:  # forks share the copy, at the same place in their tables
            holders = [t for t in self.block_tables() if len(t) > i and t[i] is own]
            if len(holders) != own.ref_count:
                found = len(holders)
                raise AssertionError(
                    f"block {own.block_id}: {own.ref_count} holders, {found} found"
                )
        for held in holders:
            held[i] = cached
        self.pool.share([cached] * len(holders))
        self.pool.free_blocks([own] * len(holders))
        return True

    def _add(self, parent: Node, table: list[Block], token_ids, start: int, stop: int) -> Node:
        """New nodes under ``parent`` for ``table[start:stop]``, one per run of blocks with the
        same holders (a fork that copied on write holds the first blocks, not the last)."""
        size, node, i = self.block_size, parent, start
        while i < stop:
            end = i + 1
            while end < stop and table[end].ref_count == table[i].ref_count:
                end += 1
            blocks = table[i:end]
            tokens = [tuple(token_ids[b * size : (b + 1) * size]) for b in range(i, end)]
            self._node_ids += 1
            child = Node(node, blocks, tokens, self._node_ids)
            for block in blocks:
                block.node = child
            node.children[tokens[0]] = child
            self.leaves.discard(node)
            self.leaves.add(child)
            self.protected_blocks += len(blocks)
            node, i = child, end
        return node

    def split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` blocks (``0 < k < len(node.blocks)``): the new
        upper node (returned) holds them, ``node`` the rest below it. Lab 10's walk splits an
        edge a prompt leaves part way; nothing else changes (same blocks, holders and order)."""
        if not isinstance(node, Node) or node.parent is None:
            raise TypeError(f"split takes a node of the tree (not the root), got {node!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 < k < len(node.blocks):
            raise ValueError(f"k must be an int in 1..{len(node.blocks) - 1}, got {k!r}")
        return self._split(node, k)

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` blocks; returns the new upper node. ``node`` keeps
        the lower part, so every path that ended in it still does."""
        self._node_ids += 1
        upper = Node(node.parent, node.blocks[:k], node.tokens[:k], self._node_ids)
        upper.last_access = node.last_access
        node.parent.children[node.tokens[0]] = upper
        del node.blocks[:k], node.tokens[:k]
        node.parent = upper
        upper.children[node.tokens[0]] = node
        for block in upper.blocks:
            block.node = upper
        return upper

    def _touch(self, node: Node) -> None:
        self._clock += 1
        node.last_access = self._clock

    def fork(self, state: Node) -> Node:
        return state

    def release(self, state: Node) -> None:
        """The sequence leaves: its path was used until now."""
        self._touch(state)

    # --- the pool's evictor --------------------------------------------------------------------
    def block_held(self, block: Block) -> None:
        self.evictable_blocks -= 1
        self.protected_blocks += 1

    def block_released(self, block: Block) -> None:
        self.evictable_blocks += 1
        self.protected_blocks -= 1

    def _evictable_leaves(self) -> list:
        heap = [(n.last_access, n.node_id, n) for n in self.leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        return heap

    def evict(self, num_blocks: int) -> None:
        """Forget ``num_blocks`` evictable blocks, leaves first, least recently used first (a
        leaf's last blocks before its first), into the pool's free queue."""
        if not 0 <= num_blocks <= self.evictable_blocks:
            raise ValueError(f"cannot evict {num_blocks} blocks: {self.evictable_blocks} evictable")
        heap, left, append = self._evictable_leaves(), num_blocks, self.pool.free_queue.append
        on_evict = self.pool.on_evict
        while left:
            _, _, leaf = heapq.heappop(heap)
            key = leaf.tokens[0]
            for _ in range(min(left, len(leaf.blocks))):
                if on_evict is not None:
                    on_evict(leaf.blocks[-1])
                block = leaf.blocks.pop()
                leaf.tokens.pop()
                block.node = None
                append(block)
                leaf.depth -= 1
                left -= 1
            if leaf.blocks:
                continue
            parent = leaf.parent
            del parent.children[key]
            self.leaves.discard(leaf)
            leaf.parent = None
            parent.last_access = max(parent.last_access, leaf.last_access)
            if parent.parent is not None and not parent.children:
                self.leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self.evictable_blocks -= num_blocks
        self.evictions += num_blocks

    # --- reading it ----------------------------------------------------------------------------
    @property
    def stats(self) -> PrefixCacheStats:
        cached = self.evictable_blocks + self.protected_blocks
        return PrefixCacheStats(self.queries, self.hits, self.evictions, cached)

    def nodes(self) -> Iterable[Node]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def cached_block_ids(self) -> list[int]:
        """The evictable blocks in the order :meth:`evict` would take them."""
        heap, order, children_left, stamps = self._evictable_leaves(), [], {}, {}
        while heap:
            stamp, _, node = heapq.heappop(heap)
            order.extend(block.block_id for block in reversed(node.blocks))
            parent = node.parent
            if parent.parent is None:
                continue
            children_left[parent] = children_left.get(parent, len(parent.children)) - 1
            stamps[parent] = max(stamps.get(parent, parent.last_access), stamp)
            if children_left[parent] == 0 and parent.lock_ref == 0:
                heapq.heappush(heap, (stamps[parent], parent.node_id, parent))
        return order

    def check_invariants(self, sequences: Iterable[tuple[Node, list[Block]]] = ()) -> None:
        """The tree's shape and counts, its blocks' place in the pool, and for each (state,
        block table) of ``sequences``: the table starts with the blocks of its path."""
        size, evictable, protected = self.block_size, 0, 0
        for node in self.nodes():
            parent = node.parent
            assert node.blocks and len(node.tokens) == len(node.blocks), f"{node}: empty edge"
            assert parent.children.get(node.tokens[0]) is node, f"{node}: wrong key in parent"
            assert node.depth == parent.depth + len(node.blocks), f"{node}: depth"
            assert (node in self.leaves) == (not node.children), f"{node}: leaf set"
            refs = {block.ref_count for block in node.blocks}
            assert len(refs) == 1, f"{node}: some holders hold part of the node ({refs})"
            held_below = sum(child.lock_ref for child in node.children.values())
            assert node.lock_ref >= held_below, f"{node}: a holder below does not hold it"
            for block, tokens in zip(node.blocks, node.tokens, strict=True):
                assert block.node is node, f"block {block.block_id}: wrong node"
                assert len(tokens) == size and block.block_hash is None, "not one full block"
                assert block not in self.pool.free_queue, f"block {block.block_id}: queued"
            evictable += len(node.blocks) * (node.lock_ref == 0)
            protected += len(node.blocks) * (node.lock_ref > 0)
        assert not self.root.blocks and self.root not in self.leaves
        assert self.leaves <= set(self.nodes()), "a leaf left the tree"
        assert (evictable, protected) == (self.evictable_blocks, self.protected_blocks), "counts"
        in_tree = sum(block.node is not None for block in self.pool.blocks)
        assert in_tree == evictable + protected, "a block points at a node not in the tree"
        assert len(self.cached_block_ids()) == evictable, "an evictable block cannot be evicted"
        for node, table in sequences:
            path = node.path_blocks()
            assert table[: len(path)] == path, "a block table does not start with its path"
            in_tree = [block.node is not None for block in table]
            assert in_tree == sorted(in_tree, reverse=True), "a tree block after one that is not"
