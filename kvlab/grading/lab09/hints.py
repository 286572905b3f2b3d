"""Lab 09's hints: each one belongs to a usual slip, given only where the checks recognise it."""

from kvlab.grading.expect import int_hints

# --- 09.budget_step --------------------------------------------------------------------------

PREFILL_FIRST = (
    "the guests in the hotel go first: walk scheduler.running (decodes, and the next chunk of a "
    "prompt already being read) before checking anyone in; newcomers get what is left of the "
    "budget. Reading a newcomer's prompt first spends the budget the decodes need, and they "
    "stall: the very gap a budget is there to bound"
)
OVER_BUDGET = (
    "a step computes at most scheduler.max_num_batched_tokens tokens in all: give a prompt "
    "min(seq.num_uncomputed, left) tokens, where left = budget - out.num_batched_tokens is what "
    "the guests before it left over (chunk(seq, left) when its prompt does not end in this step)"
)
FORGOTTEN = (
    "a running guest whose prompt is only partly read (seq.num_uncomputed > 1) needs its next "
    "chunk in this step too: it is running, it holds its rooms, and it gets its first token only "
    "once its whole prompt is read. Give it min(seq.num_uncomputed, left) tokens like any other "
    "running guest"
)
MEMORY_CHUNK = (
    "checking in books beds for the guest's whole prompt and its first token, however small its "
    "first chunk: ask scheduler.cache.refusal(seq.num_tokens, seq.remaining) before "
    "scheduler.admit(seq), for a guest whose prompt is read in chunks too"
)
BUDGET_SPENT = (
    "stop when the budget is spent (left == 0): a guest given 0 tokens is not scheduled, and a "
    "newcomer checked in with nothing to compute holds rooms for nothing"
)

# --- 09.almost_free --------------------------------------------------------------------------

WEIGHTS_ONLY = (
    "that is the ridge point with the weights alone: the step also reads every running guest's "
    "K and V (kv_tokens × spec.kv_bytes_per_token more bytes) and computes attention (4 × layers "
    "× q_heads × head_dim FLOPs per position attended), as StepTime counts them"
)
TOTAL_TOKENS = (
    "that is the chunk and the batch's decodes together (batch tokens too many): return the "
    "prompt tokens the step carries on top of its batch decodes, not all the tokens of the step; "
    "and the decodes' own compute counts in the step's FLOPs (2 × params × (batch + k))"
)
NO_ATTENTION = (
    "the attention FLOPs are missing: each new token attends to every position before it (a "
    "decode of a guest holding context tokens attends to context + 1 positions, a chunk's "
    "token i to i + 1), 4 × layers × q_heads × head_dim FLOPs per position"
)
ONE_PAST = (
    "one token too many: that chunk already makes the step compute-bound; return the largest "
    "chunk whose compute time is still at most its memory time"
)
DECODE_OWN_TOKEN = (
    "a decode's own new token was left out: a guest holding context tokens attends to context + 1 "
    "positions and the step reads K and V of context + 1 tokens for it (its new token's too), so "
    "the decodes count batch × (context + 1) in both the attention FLOPs and the bytes moved"
)

# almost_free_tokens's count returned as another type: {kind} is the type's name
TOKENS_TYPE = int_hints("the token count", "k, the prompt tokens the step carries")

# --- 09.choose_chunk -------------------------------------------------------------------------

MEDIAN = (
    "that is the median gap (itl(50)): the target is on the 99th percentile, result.itl(99), the "
    "gap that one token in a hundred waits longer than"
)
PERCENT_AS_FRACTION = (
    "result.itl takes a percentile from 0 to 100: the 99th is result.itl(99), not itl(0.99) "
    "(that is the 0.99th percentile, about the shortest gap)"
)
SMALLEST = (
    "that is the smallest budget under the target: the largest one is the answer (bigger chunks "
    "give lower TTFT and fewer steps, so take the biggest that still keeps p99 under the target)"
)
AT_TARGET = (
    "a p99 exactly at the target meets it: keep the budgets with r.itl(99) <= target, not < target"
)
FIRST_OVER = (
    "the budgets were walked in order and the walk stopped at the first one over the target: the "
    "p99 need not grow with the budget (on a day of chats alone a budget can be over the target "
    "and a larger one under it); keep every budget under the target and take the largest"
)
TTFT = (
    "that compares the time to first token: the target is on the gap between two tokens, "
    "result.itl(99)"
)

# --- 09.chunk_attention and 09.chunk_kernel --------------------------------------------------

CAUSAL_EXCLUDES_SELF = (
    "causal mask off by one: query i of the chunk sits at position num_computed + i and sees "
    "itself too: keep key positions j <= num_computed + i (a mask of j < num_computed + i leaves "
    "the chunk's first query of a prompt with nothing to attend to)"
)
CAUSAL_ONE_AHEAD = (
    "causal mask off by one: query i (position num_computed + i) sees key positions "
    "j <= num_computed + i, not one position further ahead"
)
KEYS_ONE_SHORT = (
    "each tile read one key too few: end, one past the last position the tile's last row sees, "
    "is min(num_computed + (tile + 1) * BLOCK_Q, num_computed + num_tokens), not one less; the "
    "last row of every tile lost its own key (the causal mask itself was right)"
)
NO_CAUSAL = (
    "the chunk's queries saw the tokens after them: within the chunk attention is causal, "
    "query i sees key positions j <= num_computed + i (mask the rest with -inf)"
)
DIAGONAL_TILE = (
    "the causal mask is missing on the diagonal tile: a room that holds the chunk's own tokens "
    "has keys after some of the tile's queries; mask scores where key position > query position "
    "(num_computed + row) in every room the chunk reaches, not only past the tile's last row"
)
PREFIX_FORGOTTEN = (
    "the cached prefix was left out of the causal mask: query i is at position num_computed + i, "
    "not i; it sees every one of the num_computed tokens before the chunk and the chunk up to "
    "itself"
)
KV_HEAD_MODULO = (
    "the query heads took turns over the KV heads (a modulo): query head h reads KV head "
    "h // GROUP, as GROUP = q_heads // kv_heads consecutive query heads share one KV head "
    "(heads 0 and 1 share KV head 0 when GROUP is 2), not h % kv_heads"
)
KV_HEAD_ZERO = (
    "every query head read KV head 0: query head h reads KV head h // GROUP, at h // GROUP * "
    "stride_kh (and stride_vh)"
)
READ_PAST = (
    "memory past the chunk was read: right when it holds zeros, NaN when it holds NaN. Only "
    "positions below num_computed + n hold K and V (the rest of the last room, and the rooms "
    "past the key card's used entries, are unread memory): mask the key loads with position < "
    "num_computed + n as well as the causal mask, and give masked scores -inf"
)
SOFTMAX_LOW = (
    "the softmax ran in q's dtype: scores in the tens rounded to bfloat16 (8 bits of mantissa) "
    "move by a tenth or more, and the weights by as much; compute the scores, the softmax and "
    "the weighted sum in fp32 (.float()), and only the output in q's dtype"
)
ROOM_INT64 = (
    "right with the same rooms numbered low, wrong numbered past 2**31 / stride_kb: the room "
    "number was multiplied by a stride in 32 bits and wrapped around. Load it as "
    "tl.load(bt_ptr + b * stride_btb).to(tl.int64) before room * stride_kb (and stride_vb), "
    "as Lab 05 does"
)
NO_RESCALE = (
    "the online softmax was not rescaled: when a room raises the running max from m to m_new, "
    "multiply acc and l by alpha = exp(m - m_new) before adding the room (Lab 05)"
)
