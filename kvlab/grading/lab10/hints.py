"""Lab 10's hints: each one belongs to a usual slip, given only where the checks recognise it."""

# --- 10.match_prefix -------------------------------------------------------------------------

PAST_LIMIT = (
    "the walk matched the room that holds the prompt's last token: the engine must compute at "
    "least that token to get the first answer token, so the walk stops at page "
    "(len(token_ids) - 1) // tree.block_size, in the edge's inner loop too (as tree.match does)"
)
WHOLE_EDGE = (
    "the walk took a whole edge once its first page matched: an edge holds several pages "
    "(node.tokens[k] is page k's token ids); compare the prompt's next page with each of them "
    "and stop at the first that differs"
)
NO_SPLIT_CHILD = (
    "the prompt leaves this edge part way (its first k pages match, not the rest), yet the walk "
    "returned the whole edge: split it with tree.split(child, k) and return the upper node, "
    "whose path is exactly the matched pages"
)
NO_SPLIT_PARENT = (
    "the prompt matches the first k pages of this edge, yet the walk stopped above it and lost "
    "them: split it with tree.split(child, k) and return the upper node"
)

# --- 10.prefix_score -------------------------------------------------------------------------

NO_LOAD = (
    "the load was left out: score each replica by view.cached_prefix_tokens(request) - "
    "load_penalty * view.load, so a replica with many guests in hand loses its cached prefix's "
    "advantage (without it, every request of a tenant piles onto one hot replica)"
)
RUNNING_ONLY = (
    "only the guests in the batch were counted: the load is view.load, running and waiting "
    "together (num_running + num_waiting); a long queue delays a newcomer as much as a full batch"
)
ARGMIN = (
    "the replica with the lowest score was picked: the router returns the index of the highest "
    "score (the most cached prefix, the fewest guests)"
)
IN_BLOCKS = (
    "the cached prefix was counted in rooms, not tokens: load_penalty is in tokens per request, "
    "so compare view.cached_prefix_tokens(request) (tokens) with load_penalty * view.load"
)
