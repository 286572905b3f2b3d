"""Checks for Lab 03: a learner's block manager (judged by the invariants kvlab's obeys) and the
beds report."""

from __future__ import annotations

import numbers
import random

from kvlab.grading.core import CheckFailed, call_without_mutation, exercise, expect_equal, short
from kvlab.paged import BlockManager

manager = exercise("03.block_manager", "allocate, append_slot and free", expects="class")


class _Judge:
    """Runs calls on the learner's manager and checks kvlab's invariants after each one."""

    def __init__(self, cls, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.calls = [f"BlockManager({num_blocks}, {block_size})"]
        self.m = cls(num_blocks, block_size)
        self.tokens: dict = {}
        self.check()

    def where(self) -> str:
        shown = self.calls if len(self.calls) <= 6 else [*self.calls[:2], "…", *self.calls[-3:]]
        return "; ".join(shown)

    def _log(self, method, *args):
        self.calls.append(f".{method}({', '.join(map(repr, args))})")

    def tables(self) -> dict:
        return {s: list(self.m.block_table(s)) for s in self.tokens}

    def check(self, hint=None):
        where = self.where()
        used: dict[int, object] = {}
        for seq, tokens in self.tokens.items():
            table = list(self.m.block_table(seq))
            need = -(-tokens // self.block_size)
            if len(table) != need:
                raise CheckFailed(
                    f"{seq!r} holds {tokens} tokens, so its key card needs ceil({tokens}/{self.block_size}) rooms",
                    input=where,
                    expected=f"{need} rooms",
                    got=f"{len(table)} rooms: {short(table)}",
                    hint=hint
                    or "a room holds block_size tokens; take a new room only when the last is full",
                )
            for block in table:
                integral = isinstance(block, numbers.Integral) and not isinstance(block, bool)
                if not integral or not 0 <= block < self.num_blocks:
                    raise CheckFailed(
                        "room numbers must be ints in range(num_blocks)",
                        input=where,
                        got=short(table),
                    )
                if block in used:
                    raise CheckFailed(
                        f"room {block} is on two key cards ({used[block]!r} and {seq!r})",
                        input=where,
                        hint="take each new room from the free list, so no room is handed out twice",
                    )
                used[block] = seq
            got_tokens = self.m.num_tokens(seq)
            expect_equal(got_tokens, tokens, f"num_tokens({seq!r})", input=where)
        free = self.m.num_free_blocks
        if free + len(used) != self.num_blocks:
            raise CheckFailed(
                "free rooms + rooms on key cards must equal num_blocks",
                input=where,
                expected=str(self.num_blocks),
                got=f"{free} free + {len(used)} held = {free + len(used)}",
                hint="every room is either on the free list or on exactly one key card",
            )

    def allocate(self, seq, n):
        self._log("allocate", seq, n)
        table = self.m.allocate(seq, n)
        self.tokens[seq] = n
        if list(table) != list(self.m.block_table(seq)):
            raise CheckFailed(
                "allocate must return the new key card", input=self.where(), got=short(table)
            )
        self.check()

    def append(self, seq):
        self._log("append_slot", seq)
        others = {s: t for s, t in self.tables().items() if s != seq}
        moved = self.m.append_slot(seq)
        self.tokens[seq] += 1
        if moved is not None:
            raise CheckFailed(
                "append_slot returns None when no room is shared",
                input=self.where(),
                got=short(moved),
            )
        self.check()
        if {s: t for s, t in self.tables().items() if s != seq} != others:
            raise CheckFailed("append_slot changed another guest's key card", input=self.where())

    def free(self, seq):
        self._log("free", seq)
        self.m.free(seq)
        del self.tokens[seq]
        self.check()

    def counts(self) -> dict:
        return {s: self.m.num_tokens(s) for s in self.tokens}

    def refused(self, errors, method, *args, hint):
        before = (self.tables(), self.m.num_free_blocks, self.counts())
        self._log(method, *args)
        try:
            getattr(self.m, method)(*args)
        except errors:
            pass
        else:
            names = " or ".join(e.__name__ for e in errors)
            raise CheckFailed(f"expected {names}", input=self.where(), got="no error", hint=hint)
        if (self.tables(), self.m.num_free_blocks, self.counts()) != before:
            raise CheckFailed(
                "a refused call must change nothing (no half-allocated guest, no lost room)",
                input=self.where(),
                hint="check that enough rooms are free before taking any",
            )


@manager.check(
    "allocate: n tokens get ceil(n / block_size) rooms (n = 1, k·block_size, k·block_size ± 1)",
    hint="rooms = ceil(num_tokens / block_size), popped from the free list",
)
def _allocate(cls):
    judge = _Judge(cls, 32, 4)
    for seq, n in [("one", 1), ("exact", 8), ("minus", 7), ("plus", 9)]:
        judge.allocate(seq, n)


@manager.check(
    "append_slot takes a new room exactly when the last room is full",
    hint="if num_tokens % block_size == 0 the last room is full: take a fresh one; else just count the token",
)
def _append(cls):
    judge = _Judge(cls, 16, 4)
    judge.allocate("a", 3)
    judge.allocate("b", 4)
    for _ in range(6):
        judge.append("a")
        judge.append("b")


@manager.check("block_size 1 and a hotel of one room")
def _tiny(cls):
    judge = _Judge(cls, 5, 1)
    judge.allocate("a", 2)
    judge.append("a")
    judge.free("a")
    single = _Judge(cls, 1, 8)
    single.allocate("only", 8)
    single.free("only")
    single.allocate("again", 1)


@manager.check(
    "free returns every room, and the rooms are reused",
    hint="on free, give each room of the key card back to the free list",
)
def _free(cls):
    judge = _Judge(cls, 6, 2)
    judge.allocate("a", 5)
    judge.allocate("b", 6)
    judge.free("a")
    judge.allocate("c", 6)
    judge.free("b")
    judge.free("c")
    judge.allocate("a", 3)  # an id may check in again after checking out (preemption does)
    judge.free("a")
    if judge.m.num_free_blocks != 6:
        raise CheckFailed("after everyone checks out every room is free", input=judge.where())


@manager.check(
    "out of rooms: OutOfBlocks (a MemoryError), and nothing changes",
    hint="raise kvlab.paged.OutOfBlocks before taking any room",
)
def _out(cls):
    judge = _Judge(cls, 4, 4)
    judge.allocate("a", 9)
    judge.refused((MemoryError,), "allocate", "b", 5, hint="b needs 2 rooms but only 1 is free")
    judge.allocate("b", 4)
    judge.refused((MemoryError,), "append_slot", "b", hint="b's room is full and none is free")


@manager.check(
    "bad input: duplicate id or num_tokens < 1 (ValueError), unknown id (KeyError)",
    hint="validate before changing anything",
)
def _bad(cls):
    judge = _Judge(cls, 8, 4)
    judge.allocate("a", 3)
    judge.refused((ValueError,), "allocate", "a", 2, hint="an id can check in only once")
    judge.refused((ValueError,), "allocate", "z", 0, hint="num_tokens must be at least 1")
    judge.refused((KeyError,), "append_slot", "nobody", hint="unknown ids raise KeyError")
    judge.refused((KeyError,), "free", "nobody", hint="unknown ids raise KeyError")


@manager.check("a random evening: 300 check-ins, tokens and check-outs")
def _random(cls):
    rng = random.Random(11)
    judge = _Judge(cls, 24, 3)
    for step in range(300):
        roll = rng.random()
        free_beds = judge.m.num_free_blocks * 3
        if roll < 0.3 and free_beds:
            judge.allocate(f"g{step}", rng.randint(1, min(free_beds, 10)))
        elif roll < 0.85 and judge.tokens:
            seq = rng.choice(sorted(judge.tokens))
            if judge.tokens[seq] % 3 or judge.m.num_free_blocks:
                judge.append(seq)
        elif judge.tokens:
            judge.free(rng.choice(sorted(judge.tokens)))


beds = exercise("03.beds_report", "measure the paged hotel")


def _reference_beds(m: BlockManager) -> dict:
    used = sum(m.num_tokens(s) for s in m.seq_ids)
    held = sum(len(m.block_table(s)) for s in m.seq_ids) * m.block_size
    return {"used": used, "empty": held - used, "free": m.num_free_blocks * m.block_size}


def _expect_beds(fn, m: BlockManager, what: str):
    got = call_without_mutation(fn, m, list(m.seq_ids), names=("manager", "seq_ids"))
    expect_equal(got, _reference_beds(m), "wrong beds report", input=what)


@beds.check(
    "two guests with partly filled last rooms",
    hint="used = tokens; empty = beds in held rooms without a token; free = free rooms × block_size",
)
def _two(fn):
    m = BlockManager(10, 4)
    m.allocate("a", 5)
    m.allocate("b", 8)
    _expect_beds(fn, m, "BlockManager(10, 4) with a: 5 tokens, b: 8 tokens")


@beds.check("an empty hotel, and a full one")
def _edges(fn):
    _expect_beds(fn, BlockManager(3, 16), "BlockManager(3, 16), nobody checked in")
    m = BlockManager(2, 16)
    m.allocate("a", 32)
    _expect_beds(fn, m, "BlockManager(2, 16) with a: 32 tokens")


@beds.check("block_size 1 never leaves an empty bed in a held room")
def _one(fn):
    m = BlockManager(50, 1)
    for i, n in enumerate([1, 7, 20]):
        m.allocate(i, n)
    _expect_beds(fn, m, "BlockManager(50, 1) with guests of 1, 7 and 20 tokens")


@beds.check("50 random hotels")
def _random_beds(fn):
    rng = random.Random(4)
    for _ in range(50):
        size = rng.choice([1, 2, 16, 64])
        m = BlockManager(rng.randint(5, 40), size)
        for i in range(rng.randint(0, 6)):
            n = rng.randint(1, 3 * size)
            if m.can_allocate(n):
                m.allocate(i, n)
        _expect_beds(fn, m, f"BlockManager({m.num_blocks}, {size}) with {len(m.seq_ids)} guests")
