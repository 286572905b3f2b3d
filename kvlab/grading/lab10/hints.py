"""Lab 10's hints: each one belongs to a usual slip, given only where the checks recognise it."""

from kvlab.grading.expect import int_hints

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
    "the cached prefix weighed next to nothing against the load: counted in rooms, not tokens, "
    "or left out of the score (a least-loaded router picks alike on these fleets); "
    "load_penalty is in tokens per request, so compare view.cached_prefix_tokens(request) "
    "(tokens) with load_penalty * view.load"
)

POSITION = (
    "the router returned the replica's place in views, not its number: return view.index (views "
    "need not come in index order; here replica 0 is listed last)"
)

# the router's pick returned as another type: {kind} is the type's name
INDEX_TYPE = int_hints("the replica's index", "view.index")

# --- 10.fetch_or_recompute -------------------------------------------------------------------

NO_ATTENTION = (
    "the recompute counted the weights' FLOPs only (2 x num_params per token): attention adds "
    "4 x num_layers x num_q_heads x head_dim FLOPs per position attended, and the i-th token "
    "of the prefix attends to i positions (n (n + 1) / 2 in all), which is what makes a long "
    "prefix dearer to compute than to fetch"
)
K_ONLY = (
    "the copy moved only K: a cached token keeps K and V, so a token's bytes are "
    "2 x num_layers x num_kv_heads x head_dim x bytes per element (spec.kv_bytes_per_token)"
)
GB_GIB = (
    "GB and GiB were mixed: pcie_bytes_per_s is in bytes per second (25e9 is 25 GB/s, not "
    "25 GiB/s); divide bytes by it as they are, with no 2**30 anywhere"
)
PER_LAYER = (
    "the copy moved one layer's K and V: every layer keeps its own, so a token's bytes are "
    "2 x num_layers x num_kv_heads x head_dim x bytes per element (spec.kv_bytes_per_token), "
    "compared with the whole model's FLOPs"
)
HBM_NOT_PCIE = (
    "your rule says fetch on every case, even where recomputing is cheaper: as if the copy were "
    "timed at the GPU's memory bandwidth (gpu.hbm_bytes_per_s, the roofline's memory time), or "
    "at a link scaled up (pcie_bytes_per_s is already in bytes per second: 25e9 is 25 GB/s, "
    "multiply it by nothing), or as if it never compared at all; the blocks come up from CPU "
    "memory over PCIe, at pcie_bytes_per_s as given, a hundred times slower than HBM"
)
TIE_FETCHES = (
    "a tie went to fetching: where the copy and the recompute take exactly the same time, "
    "recompute (it needs no copy, no CPU memory, no link): return fetch < recompute, not <="
)
ATTN_SQUARE = (
    "attention was counted n x n times: the i-th token of the prefix attends to i positions "
    "(i = 1 ... n), n (n + 1) / 2 in all, not n^2, so the recompute came out too dear on long "
    "prefixes"
)
MODEL_DTYPE = (
    "the copy counted the model's dtype, not the KV cache's: a token's bytes are "
    "spec.kv_bytes_per_token, which counts each element in the cache's own dtype (here fp8, "
    "1 byte), not spec.dtype_bytes (the weights' 2 bytes); the two agree only while the cache "
    "keeps the model's dtype"
)
