"""Lab 07's hints: each one belongs to a usual slip, given only where the checks recognise it."""

from kvlab.grading.expect import int_hints

# --- 07.copy_on_write ------------------------------------------------------------------------

FULL_SHARED = (
    "a full room needs no copy: nobody writes into it again, so it stays shared. When the last "
    "room is full (num_tokens % block_size == 0), add a new room for the token and return None, "
    "whatever the full room's ref_count"
)
HELD_ONCE = (
    "only a shared room (ref_count > 1) is copied: a room this guest alone holds "
    "(ref_count == 1) takes the token in its empty bed, with no new room and nothing to copy"
)
NO_COW = (
    "the last room is shared (ref_count > 1): the token's bed is one the other guests read too. "
    "Move to a copy first: take a new room, put it in the shared room's place on this key card "
    "(table[-1] = new), drop one reference to the shared room, return (shared room, new room)"
)
APPENDED_COPY = (
    "the copy replaces the shared room on the key card (table[-1] = new) and the tokens so far "
    "are copied into it, so the key card keeps its length; appending the new room leaves the "
    "shared room on this key card as well"
)
RETURN_PAIR = (
    "return (src, dst) after moving to a copy, the shared room and the new one: the caller "
    "copies the K and V of the tokens already there into the new room, which otherwise holds "
    "whatever its last guest left"
)
SWAPPED = (
    "return (src, dst) = (shared room, new room): the copy goes from the old room to the new one, "
    "and (dst, src) would overwrite the shared room with the new room's stale contents"
)
RETURN_NONE = "return None when nothing is copied: the caller copies whatever append_slot returns"
FULL_PAIR = (
    "return None when the last room was full: the token went to a new room and nothing was "
    "copied, so there is no (src, dst); a pair is returned only after moving to a copy of a "
    "shared, partly filled room"
)
RETURN_TUPLE = (
    "return the pair as a tuple, `return src, dst` (append_slot is annotated "
    "tuple[int, int] | None), not as a list"
)
KEPT_FULL = (
    "the full room stays on this key card (the token went to a new room after it), so this guest "
    "still holds it: leave its ref_count as it is. A reference is dropped only when a shared room "
    "leaves the key card, replaced by its copy"
)
DROP_REF = (
    "drop one reference to the shared room when you move to a copy (ref_counts[src] -= 1): this "
    "key card no longer holds it, and with a ref_count one too high it never goes back to the "
    "free list when the other guests check out"
)
DROP_ONE = (
    "drop exactly one reference to the shared room (ref_counts[src] -= 1): the other guests still "
    "hold it, each with one reference"
)
NEW_REF = (
    "a new room is held by one key card: set its ref_count to 1 when you take it "
    "(self.ref_counts[new] = 1), or free() never gives it back"
)
REF_FIRST = (
    "a reference changed although no room was free: raise OutOfBlocks before dropping the shared "
    "room's reference"
)
NOT_POPPED = (
    "append_slot put a room on the key card without taking it off the free list: pop it "
    "(new = self.free_blocks.pop())"
)
FREED_SHARED = (
    "the shared room went back to the free list while other guests still hold it (its "
    "ref_count is above 0), so a later check-in gets a room someone is reading: after the copy "
    "only drop this guest's reference (ref_counts[src] -= 1); a room goes back to the free list "
    "in free(), when its ref_count reaches 0"
)
NO_ROOM_FOR_COPY = (
    "with no free room for the copy, raise OutOfBlocks and change nothing: writing the token "
    "into the shared room in place changes it for every guest holding it (your append_slot "
    "moves to a copy when a room is free: only the refusal is missing)"
)
ALL_SHARERS = (
    "only the writer moves to the copy: put the new room on this guest's key card alone "
    "(table[-1] = new). The other guests keep the shared room: it holds their tokens, and they "
    "have not written into it"
)

# --- 07.cached_prefix ------------------------------------------------------------------------

UNCHAINED = (
    "each block's hash is chained to the block before it: hash_block_tokens(parent, tokens) with "
    "parent = the previous block's hash (ROOT_HASH only for the first). Hashed on their own, the "
    "same tokens after another prefix look cached, but their K and V differ"
)
PARENT_HASH = (
    "the next block's parent is the hash of this block, the key you just looked up (parent = "
    "key), not this block's own parent_hash: that is the hash of the block before it, so your "
    "parent never moves past ROOT_HASH and every later block is looked up as if it opened the "
    "prompt"
)
OVERLAP = (
    "the blocks overlap: block i is token_ids[i * block_size : (i + 1) * block_size], the "
    "block_size tokens after the i blocks before it; token_ids[i : i + block_size] starts only "
    "one token after the block before it"
)
NO_STOP = (
    "stop at the first block that is not cached: the blocks after it follow a prefix whose K and "
    "V are not in the cache, so they must be computed anyway"
)
NO_CONFIRM = (
    "a hash is only a lookup key: confirm a hit by comparing the cached room's token_ids with the "
    "block's tokens (as tuples) and its parent_hash with your parent; a colliding entry is a miss"
)
REHASHED = (
    "hashing the cached room's own tokens and parent_hash again confirms nothing: an entry is "
    "filed under its own hash, so it always matches, even when it holds other tokens or follows "
    "another block whose hash collides. Compare hit.token_ids with the block's tokens and "
    "hit.parent_hash with your parent"
)
ROOT_PARENT = (
    "ROOT_HASH is 0, and 0 is false in an `if`: a test like `hit.parent_hash and ...` skips the "
    "parent check for an entry that opened a prompt, so it confirms after any block. Compare "
    "hit.parent_hash with your parent every time"
)
UNORDERED = (
    "compare the tokens in order (as tuples): a room holds its tokens in order, and the same "
    "tokens in another order are another block"
)
NO_PARENT_CONFIRM = (
    "compare the cached room's parent_hash with the parent you hashed with too: the same tokens "
    "after another prefix are another block, and a collision can hide that"
)
COVERS_LAST = (
    "the prompt's last token is always computed (its logits give the first new token), so a "
    "prompt of exactly k × block_size tokens reuses at most k − 1 rooms: look up only "
    "(len(token_ids) - 1) // block_size blocks"
)
PARTIAL = (
    "only full blocks are cached: look up (len(token_ids) - 1) // block_size blocks, never the "
    "partly filled block at the end of the prompt"
)
DROPS_ONE = (
    "only a prompt of exactly k × block_size tokens must leave its last full block: when the "
    "prompt ends in a partly filled block, the last token is already outside the full blocks. "
    "Look up (len(token_ids) - 1) // block_size blocks"
)
TUPLE_LIST = (
    "a CachedBlock's token_ids is a tuple and a slice of the prompt is a list, and a tuple never "
    "equals a list: compare tuple(entry.token_ids) == tuple(block)"
)
RETURN_HASHES = "return the cached rooms' block ids (entry.block_id), not their hashes"
RETURN_ID_TEXT = "return the room numbers as ints (entry.block_id), not as their text"
RETURN_IDS = (
    "return each entry's block_id (entry.block_id, an int), not the CachedBlock entries: the "
    "caller puts room numbers on the key card"
)
RETURN_LIST = "return a list of room numbers (block ids), [] when nothing is cached"

# --- 07.eviction -----------------------------------------------------------------------------

BACK = (
    "that is the room freed last (the back of the queue): take the front, free_queue.pop(0), "
    "the room freed longest ago, so the rooms freed recently keep their cached blocks longest"
)
PLAIN_FIRST = (
    "taking a room that holds no cached block first is a fair policy (it keeps cached rooms "
    "longer), but this exercise asks for vLLM's rule, strictly: the front of the queue, cached "
    "or not"
)
NOT_TAKEN = (
    "the room you hand out must leave the queue: take it with free_queue.pop(0), which removes "
    "it, or the next call hands the same room to another guest"
)
REBOUND = (
    "take the room off the queue in place (free_queue.pop(0)): the caller keeps using its own "
    "list, and a new list bound to the name stays inside your function"
)
FORGET_BOTH = (
    "the room at the front still holds a cached block: forget its hash in both maps (del "
    "cached[h], del block_hashes[block]), or a later prompt 'hits' a room that is about to hold "
    "another guest's tokens"
)
STALE = (
    "forget the room's hash in cached too (del cached[block_hashes[block]] before you delete it "
    "there): cached still sends a later prompt with those tokens to this room, which is about to "
    "hold another guest's tokens"
)
KEEPS_OWN = (
    "forget the room's entry in block_hashes too (del block_hashes[block]): the room no longer "
    "holds that block, and the next time it is handed out your code would evict a hash that may "
    "by then belong to another room"
)
OVER_EVICT = (
    "evict only the room you hand out: the other cached rooms in the queue keep their hashes, "
    "ready for a prompt that reuses them"
)
KEYED_BY_HASH = (
    "cached is keyed by block hash, not by room number: look the room's hash up first "
    "(h = block_hashes[block]), then del cached[h]"
)
NOT_CACHED = "a room at the front may hold no cached block: evict only `if block in block_hashes`"
EMPTY = (
    "raise OutOfBlocks when free_queue is empty, before taking anything (pop(0) of an empty list "
    "raises IndexError)"
)
_EMPTY_RETURNS = (  # an empty queue's take_block returned something: {} says what
    "an empty queue must raise OutOfBlocks (kvlab.core.block_manager.OutOfBlocks), not return {}: "
    "`if not free_queue: raise OutOfBlocks(...)` before taking anything"
)
EMPTY_NONE, EMPTY_VALUE = _EMPTY_RETURNS.format("None"), _EMPTY_RETURNS.format("a value")
RETURN_ROOM = "return the room number you took"
RETURN_HASH = (
    "return the room number (the block you took), not its hash: block_hashes[block] is the key "
    "of its block in cached"
)

# a room number returned as another type: {kind} is the type's name
RETURN_ALONE, RETURN_TEXT, RETURN_NUMBER = ROOM_TYPE = int_hints("the room number", "return block")
