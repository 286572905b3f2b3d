"""Requests and seeded workloads shaped like the data sets in the PagedAttention paper.

The paper (Kwon et al., SOSP 2023) reports mean lengths of about 161 prompt / 338 output tokens
for ShareGPT and 19 / 58 for Alpaca, with Poisson arrivals. We draw lengths from log-normal
distributions whose *clipped* means hit those figures, so labs get realistic spread without
downloading any data set.
"""

from __future__ import annotations

import csv
import math
import operator
import random
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import files
from kvlab.core.validate import non_negative_number, positive_int

SHAREGPT_MEANS = (161.31, 337.99)  # prompt, output tokens (paper, Table 1 / Fig. 11)
ALPACA_MEANS = (19.31, 58.45)


@dataclass(frozen=True)
class Request:
    """One guest: a prompt to read and a number of tokens to generate. ``prompt_ids``, when
    given, are the prompt's token ids (what prefix caching compares, Lab 07); ``output_ids``
    the answer's, when it is a recorded one (a multi-round chat's next prompt carries it)."""

    prompt_len: int
    output_len: int
    arrival: float = 0.0
    prompt_ids: tuple[int, ...] | None = field(default=None, repr=False)
    output_ids: tuple[int, ...] | None = field(default=None, repr=False)

    def __post_init__(self):
        positive_int("prompt_len", self.prompt_len)
        positive_int("output_len", self.output_len)
        non_negative_number("arrival", self.arrival)
        if self.prompt_ids is not None:
            ids = _token_ids(self.prompt_ids)
            object.__setattr__(self, "prompt_ids", ids)  # frozen: kept as a tuple of ints
            if len(ids) != self.prompt_len:
                raise ValueError(
                    f"prompt_ids holds {len(ids)} ids for prompt_len={self.prompt_len}"
                )
        if self.output_ids is not None:
            ids = _token_ids(self.output_ids, "output_ids")
            object.__setattr__(self, "output_ids", ids)
            if len(ids) != self.output_len:
                raise ValueError(
                    f"output_ids holds {len(ids)} ids for output_len={self.output_len}"
                )

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _token_ids(ids, name: str = "prompt_ids") -> tuple[int, ...]:
    """Token ids as a tuple of ints (NumPy integers too; never bools or strings)."""
    if type(ids) is tuple and set(map(type, ids)) <= {int}:  # already so: a day of 100,000
        return ids
    try:
        if isinstance(ids, (str, bytes)) or any(isinstance(t, bool) for t in ids):
            raise TypeError
        return tuple(operator.index(t) for t in ids)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of int token ids, got {ids!r:.80}") from None


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _clipped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """Mean of min(X, cap) for X ~ LogNormal(mu, sigma)."""
    log_cap = math.log(cap)
    below = math.exp(mu + sigma**2 / 2) * _phi((log_cap - mu - sigma**2) / sigma)
    return below + cap * (1.0 - _phi((log_cap - mu) / sigma))


def _mu_for_mean(target: float, sigma: float, cap: float) -> float:
    """The log-normal mu whose mean after clipping at ``cap`` equals ``target`` (bisection)."""
    lo, hi = -10.0, math.log(cap) + 10 * sigma
    for _ in range(200):
        mid = (lo + hi) / 2
        if _clipped_lognormal_mean(mid, sigma, cap) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _draw(rng: random.Random, mu: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(mu, sigma))))


def _generate(
    n: int,
    seed: int,
    means: tuple[float, float],
    sigmas: tuple[float, float],
    max_total: int,
    rate: float | None,
) -> list[Request]:
    positive_int("n", n)
    positive_int("max_total", max_total, minimum=2)
    if rate is not None and non_negative_number("rate", rate) == 0:
        raise ValueError("rate must be > 0 requests per second (or None for all at t=0)")
    prompt_cap = max_total // 2
    mu_p = _mu_for_mean(means[0], sigmas[0], prompt_cap)
    mu_o = _mu_for_mean(means[1], sigmas[1], max(2.0, max_total - means[0]))
    rng = random.Random(seed)
    t = 0.0
    requests = []
    for _ in range(n):
        prompt = _draw(rng, mu_p, sigmas[0], prompt_cap)
        output = _draw(rng, mu_o, sigmas[1], max_total - prompt)
        if rate is not None:
            t += rng.expovariate(rate)
        requests.append(Request(prompt, output, round(t, 6)))
    return requests


def sharegpt_like(
    n: int, seed: int = 0, rate: float | None = None, max_total: int = 2048
) -> list[Request]:
    """Chat-style requests: long, widely spread prompts and answers (means ~161 / ~338).

    ``rate`` gives Poisson arrivals in requests per second; ``None`` puts every arrival at 0.
    Every request fits in ``max_total`` tokens (prompt at most half of it).
    """
    return _generate(n, seed, SHAREGPT_MEANS, (1.0, 0.9), max_total, rate)


def alpaca_like(
    n: int, seed: int = 0, rate: float | None = None, max_total: int = 2048
) -> list[Request]:
    """Instruction-style requests: short prompts and answers (means ~19 / ~58)."""
    return _generate(n, seed, ALPACA_MEANS, (0.7, 0.8), max_total, rate)


def documents_among_chats(
    n: int,
    seed: int = 0,
    rate: float = 40.0,
    document_share: float = 0.08,
    document_len: tuple[int, int] = (6_000, 8_000),
) -> list[Request]:
    """Chats (prompts of 50-400 tokens, answers of 100-300) with long documents among them
    (prompts of ``document_len`` tokens, short answers of 50-150), arriving as a Poisson stream
    of ``rate`` requests per second: the day on which reading a whole prompt in one step stalls
    every decode of that step, and chunked prefill (Sarathi-Serve) pays."""
    positive_int("n", n)
    if not 0 <= document_share <= 1:
        raise ValueError(f"document_share must be in [0, 1], got {document_share!r}")
    if non_negative_number("rate", rate) == 0:
        raise ValueError("rate must be > 0 requests per second")
    low, high = document_len
    positive_int("document_len[0]", low)
    if high < low:
        raise ValueError(f"document_len must be (low, high) with low <= high, got {document_len}")
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        if rng.random() < document_share:
            prompt, output = rng.randint(low, high), rng.randint(50, 150)
        else:
            prompt, output = rng.randint(50, 400), rng.randint(100, 300)
        requests.append(Request(prompt, output, round(t, 6)))
    return requests


VOCAB_SIZE = 32_000  # token ids are drawn from a Llama-sized vocabulary


def shared_prefix_like(
    n: int,
    prefix_len: int,
    *,
    num_prefixes: int = 1,
    seed: int = 0,
    rate: float | None = None,
    means: tuple[float, float] = (30.0, 30.0),
    max_total: int = 2048,
) -> list[Request]:
    """Requests whose prompts start with a shared prefix (a system prompt with few-shot examples)
    followed by the request's own text, with token ids, for prefix caching.

    The paper's shared-prefix experiment (Sec. 6.4) translates WMT16 sentences after a one-shot
    prefix of 80 tokens or a five-shot prefix of 341; the defaults give short inputs and answers
    (means ~30 tokens) in that spirit. Each request uses one of ``num_prefixes`` prefixes, chosen
    at random (several tenants, each with its own system prompt). Token ids are seeded draws from
    a 32,000-token vocabulary.
    """
    positive_int("n", n)
    positive_int("prefix_len", prefix_len)
    positive_int("num_prefixes", num_prefixes)
    if rate is not None and non_negative_number("rate", rate) == 0:
        raise ValueError("rate must be > 0 requests per second (or None for all at t=0)")
    if max_total < prefix_len + 2:
        raise ValueError(f"max_total ({max_total}) must leave room beyond prefix_len={prefix_len}")
    rng = random.Random(seed)
    prefixes = [
        tuple(rng.randrange(VOCAB_SIZE) for _ in range(prefix_len)) for _ in range(num_prefixes)
    ]
    sigma = 0.5
    room = max_total - prefix_len
    mu_in = _mu_for_mean(means[0], sigma, room // 2)
    mu_out = _mu_for_mean(means[1], sigma, room // 2)
    t = 0.0
    requests = []
    for _ in range(n):
        prefix = prefixes[rng.randrange(num_prefixes)]
        own = tuple(rng.randrange(VOCAB_SIZE) for _ in range(_draw(rng, mu_in, sigma, room // 2)))
        output = _draw(rng, mu_out, sigma, room - len(own))
        if rate is not None:
            t += rng.expovariate(rate)
        ids = prefix + own
        requests.append(Request(len(ids), output, round(t, 6), prompt_ids=ids))
    return requests


def many_tenants(
    num_requests: int,
    *,
    tenants: int = 32,
    system_prompt_len: int = 1_024,
    user_len: tuple[int, int] = (16, 128),
    output_len: tuple[int, int] = (16, 128),
    rate: float | None = None,
    seed: int = 0,
    zipf: float = 1.0,
) -> list[Request]:
    """A day of many tenants (Lab 10's fleet): ``tenants`` system prompts of
    ``system_prompt_len`` token ids each, and every request is its tenant's system prompt followed
    by ids of its own (``user_len`` tokens, drawn uniformly from the inclusive range), with an
    answer of ``output_len`` tokens (likewise). A tenant's share of the requests falls as
    ``1 / rank ** zipf`` (``zipf=0``: every tenant alike; 1: the first of 32 tenants sends about a
    quarter of them). Sized for a fleet whose every replica holds only a few tenants' prompts:
    a router that sends each tenant to the replica holding its prompt finds it cached, one that
    spreads every tenant over every replica mostly does not. ``rate`` gives Poisson arrivals
    (requests per second, or per step without a cost model); None puts every arrival at 0.
    Token ids are seeded draws from a 32,000-token vocabulary; the same arguments give the same
    day, and the tenants' prompts do not depend on ``num_requests``."""
    positive_int("num_requests", num_requests)
    positive_int("tenants", tenants)
    positive_int("system_prompt_len", system_prompt_len)
    user_low, user_high = _length_range("user_len", user_len, minimum=0)
    out_low, out_high = _length_range("output_len", output_len, minimum=1)
    if rate is not None and non_negative_number("rate", rate) == 0:
        raise ValueError("rate must be > 0 requests per second (or None for all at t=0)")
    non_negative_number("zipf", zipf)
    rng = random.Random(seed)
    prompts = [
        tuple(rng.randrange(VOCAB_SIZE) for _ in range(system_prompt_len)) for _ in range(tenants)
    ]
    weights = [1.0 / (rank + 1) ** zipf for rank in range(tenants)]
    chosen = rng.choices(range(tenants), weights=weights, k=num_requests)
    draw = rng.randrange
    t, requests = 0.0, []
    for tenant in chosen:
        own = tuple(draw(VOCAB_SIZE) for _ in range(rng.randint(user_low, user_high)))
        ids = prompts[tenant] + own
        if rate is not None:
            t += rng.expovariate(rate)
        requests.append(
            Request(len(ids), rng.randint(out_low, out_high), round(t, 6), prompt_ids=ids)
        )
    return requests


def _length_range(name: str, pair, *, minimum: int) -> tuple[int, int]:
    """``(low, high)`` token counts with ``minimum <= low <= high``."""
    try:
        low, high = pair
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a pair (low, high) of token counts, got {pair!r}"
        ) from None
    for value in (low, high):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a pair (low, high) of ints, got {pair!r}")
    if not minimum <= low <= high:
        raise ValueError(f"{name} must be (low, high) with {minimum} <= low <= high, got {pair!r}")
    return low, high


def multi_round_qa(
    num_users: int,
    rounds: int,
    *,
    context_len: int = 2_000,
    question_len: int = 50,
    answer_len: int = 150,
    think_time: float = 60.0,
    seed: int = 0,
) -> list[Request]:
    """A multi-round QA day (LMCache's benchmark in spirit): ``num_users`` users, each with a
    document of its own (``context_len`` tokens), ask ``rounds`` questions in turn. Each
    question's prompt carries the whole conversation so far: the document, every earlier
    question and answer, then the new question (``question_len`` tokens). So a round's prompt
    starts with the previous round's prompt and answer (``output_ids``: the answer is replayed,
    ``answer_len`` tokens), the prefix a cache can keep.

    Users start spread over one ``think_time`` (seconds; user ``u`` at about ``u / num_users``
    of it, seeded jitter) and come back ``think_time`` after their last question: enough, on
    any GPU the course models, for the answer to be done, so the conversation is all cached
    by then, if the cache kept it. With many users a cache in HBM keeps only the most recent
    conversations: least-recently-used eviction drops exactly the user who asks next. Requests
    come sorted by arrival; token ids are seeded draws from a 32,000-token vocabulary.
    """
    positive_int("num_users", num_users)
    positive_int("rounds", rounds)
    for name, value in (("context_len", context_len), ("question_len", question_len)):
        positive_int(name, value)
    positive_int("answer_len", answer_len)
    if non_negative_number("think_time", think_time) == 0:
        raise ValueError("think_time must be > 0 seconds")
    rng = random.Random(seed)

    def draw(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(VOCAB_SIZE) for _ in range(n))

    requests = []
    gap = think_time / num_users
    for user in range(num_users):
        history = draw(context_len)
        start = gap * (user + rng.random() * 0.5)
        for r in range(rounds):
            prompt = history + draw(question_len)
            answer = draw(answer_len)
            arrival = round(start + r * think_time, 6)
            requests.append(
                Request(len(prompt), answer_len, arrival, prompt_ids=prompt, output_ids=answer)
            )
            history = prompt + answer
    requests.sort(key=lambda r: r.arrival)
    return requests


def conversation_tokens(requests: list[Request]) -> int:
    """Tokens a cache must keep to hold every conversation of a :func:`multi_round_qa` day
    whole: the prompt and answer of each request that no later prompt carries on (each
    user's last round; earlier rounds are prefixes of it)."""
    ended = {r.prompt_ids + (r.output_ids or ()) for r in requests if r.prompt_ids is not None}
    lengths = {len(ids) for ids in ended}
    carried = {
        r.prompt_ids[:n]
        for r in requests
        if r.prompt_ids is not None
        for n in lengths
        if n < r.prompt_len
    }
    return sum(len(ids) for ids in ended - carried)


def mean_lengths(requests: list[Request]) -> tuple[float, float]:
    """Mean prompt and output length."""
    if not requests:
        raise ValueError("requests must not be empty")
    n = len(requests)
    return sum(r.prompt_len for r in requests) / n, sum(r.output_len for r in requests) / n


# Small recorded traces that later labs load by name; `python -m kvlab.serving.workload` rewrites them.
# Seed 3 is the first whose 400-request samples have both means within 2% of the paper's.
TRACE_RECIPES = {
    "sharegpt_like": lambda: sharegpt_like(400, seed=3, rate=1.0),
    "alpaca_like": lambda: alpaca_like(400, seed=3, rate=4.0),
}


def save_trace(requests: list[Request], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["arrival", "prompt_len", "output_len"])
        for r in requests:
            writer.writerow([f"{r.arrival:.6f}", r.prompt_len, r.output_len])


def load_trace(name_or_path: str | Path) -> list[Request]:
    """Load a trace by name (``"sharegpt_like"``: the course's ``assets/traces``, bundled in a
    wheel) or from a CSV path."""
    path = Path(name_or_path)
    known = ", ".join(sorted(TRACE_RECIPES))
    if path.suffix != ".csv":
        if name_or_path not in TRACE_RECIPES:
            raise FileNotFoundError(f"no trace named {name_or_path!r}; named traces are {known}")
        path = files.traces_dir() / f"{name_or_path}.csv"
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}; named traces are {known}")
    with open(path, newline="") as f:
        return [
            Request(int(row["prompt_len"]), int(row["output_len"]), float(row["arrival"]))
            for row in csv.DictReader(f)
        ]


def write_traces(directory: str | Path | None = None) -> list[Path]:
    """Rewrite the recorded traces (by default the checkout's ``assets/traces``)."""
    if directory is None:
        directory = files.checkout_path(
            "assets", "traces", purpose="python -m kvlab.serving.workload"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, recipe in TRACE_RECIPES.items():
        path = directory / f"{name}.csv"
        save_trace(recipe(), path)
        written.append(path)
    return written


if __name__ == "__main__":
    try:
        written = write_traces()
    except FileNotFoundError as e:  # run from a wheel: say so, no traceback
        raise SystemExit(str(e)) from None
    for p in written:
        print(f"wrote {p}")
