"""Lab 11's hints: each one belongs to a usual slip, given only where the checks recognise it."""

# --- 11.window -------------------------------------------------------------------------------

TOO_MANY = (
    "one room too many went back: the room holding position num_computed - window + 1 (the "
    "first the next token reads) is still in the window; hand back only the rooms before it, "
    "places 0 .. (num_computed - window + 1) // block_size - 1"
)
ROUNDED_UP = (
    "a room went back while some of its beds were still in the window: a room leaves only when "
    "all its beds are before the first position the next token reads, so round down, "
    "(num_computed - window + 1) // block_size rooms, not up"
)
TOO_FEW = (
    "one room too few went back: every room wholly before the window goes, and those are "
    "places 0 .. (num_computed - window + 1) // block_size - 1, the last of them included"
)
EDGE_LATE = (
    "rooms went back one token late: the next token (position num_computed) reads window "
    "tokens counting itself, from first = num_computed - window + 1, and room i goes back as "
    "soon as all its beds are before it, (i + 1) * block_size <= first; a window counted from "
    "num_computed - window, or < for <=, keeps each room a token too long"
)
EDGE_EARLY = (
    "rooms went back one token early: the next token sits at position num_computed (the "
    "tokens computed are 0 .. num_computed - 1) and reads from first = num_computed - window "
    "+ 1, so room i goes back only when its last bed, (i + 1) * block_size - 1, is before "
    "first (< first, not <= first), and first is not one later"
)
DELETED = (
    "the key card got shorter: place i of block_table must stay logical block i (the engine "
    "finds a token's room by position // block_size); put null_block in each handed-back "
    "place instead of removing it"
)
KEPT_ON_CARD = (
    "the rooms went back to the pool but stayed on the key card: the next guest handed one "
    "would share it with this one; put null_block in each place you hand back"
)
NOT_FREED = (
    "the rooms left the key card but never went back to the pool: hand them back with "
    "free([...]) as you put null_block in their places, or the hotel loses them"
)
NULL_AGAIN = (
    "the null room was handed back: the places before the window that went back at earlier "
    "steps hold null_block, which is never freed (it stands in for a room, it is none); stop "
    "at the first null_block going down, or skip it"
)

FREE_A_LIST = (
    "free takes a list of room numbers, as the pool frees several at once: free([room]) for "
    "one room, not free(room)"
)
UP_FROM_ZERO = (
    "nothing went back after the first time: the loop walked up from place 0 and stopped at "
    "the first null_block, but once a room has gone back place 0 holds null_block; walk down "
    "from place first // block_size - 1 and stop at the first null_block (or walk up and skip "
    "the null_blocks)"
)
ONE_A_STEP = (
    "only one room went back at a step: a prompt longer than the window (or several tokens "
    "at once) leaves several rooms behind together; hand back every place from "
    "first // block_size - 1 down to the first null_block, not only the last"
)
REBOUND = (
    "block_table = ... made a new list inside your step: the hotel keeps the card it gave "
    "you, which still holds the rooms you freed; change that list in place "
    "(block_table[i] = null_block, or block_table[:] = ...)"
)
IN_PLACE = (
    "the step built a new key card and returned it: the hotel keeps the card it gave you, so "
    "change block_table in place (block_table[i] = null_block) and return nothing"
)

# --- 11.hybrid -------------------------------------------------------------------------------

RATIO_MIN = (
    "the group size was the fewest layers of any kind even though the commonest kind has "
    "fewer than 1.5 times as many: then vLLM takes the most layers (less padding), e.g. 13 "
    "and 12 layers make groups of 13, not 12 + 12 + 1"
)
RATIO_EDGE = (
    "exactly 1.5 times as many layers took the most: vLLM's test is strict, the commonest kind "
    "must have fewer than 1.5 times the fewest (max < 1.5 x min), so 8 and 12 layers make groups "
    "of 8, not 12"
)
ONE_GROUP_PER_KIND = (
    "each kind of layer became one group: vLLM's groups all have the same number of layer "
    "slots, the fewest layers any kind has (unless the commonest has under 1.5 times as "
    "many), and a kind of n layers is cdiv(n, group_size) groups"
)
WINDOW_AS_FULL = (
    "the sliding-window groups reserved every block of max_model_len, as full attention "
    "does: a window layer holds only its window and a step's new tokens, "
    "cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1 blocks "
    "(spec.blocks_reserved)"
)
WINDOW_ONE_TOKEN = (
    "the window reserved room for one new token only: a step can bring max_num_batched_tokens "
    "new tokens (a prompt's chunk) while the window's last window - 1 are still read, so it "
    "reserves cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1 blocks"
)
NO_EXTRA_BLOCK = (
    "the window reserved one block too few per window group: a window that starts inside a "
    "block holds one block more than its tokens fill, hence the + 1 in "
    "cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1"
)
NO_PADDING = (
    "the bytes counted the real layers only: every block of the pool is page_bytes x "
    "group_size, padding slots included (a group of 8 real layers in slots for 10 still takes "
    "10 pages a block), so bytes_reserved = blocks_reserved x page_bytes x group_size"
)
ONE_PAGE_A_BLOCK = (
    "the bytes counted one page a block: a pool block is one page for each of a group's "
    "layer slots, page_bytes x group_size bytes, so bytes_reserved = blocks_reserved x "
    "page_bytes x group_size"
)
LAST_ENTRY = (
    "a kind's layers are those of all its entries: a model may list its kinds in turns (5 "
    "window, 1 full, 5 window, …), so add each entry's num_layers to its spec's count "
    "(counts.get(spec, 0) + group.num_layers) rather than setting it"
)
ONCE_PER_KIND = (
    "each kind's blocks were counted once: a kind of n layers is cdiv(n, group_size) groups, "
    "each a key card of its own that reserves its kind's blocks, so a kind reserves its "
    "groups x spec.blocks_reserved(...)"
)
NOT_ALIGNED = (
    "the attention block grew to just hold the state: vLLM rounds it to a multiple of 16 "
    "tokens (its kernels' block alignment), 16 x cdiv(state_bytes, 16 x attention bytes per "
    "token), and pads the state to that page"
)
