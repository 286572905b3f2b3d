import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import files
from kvlab.serving.workload import (
    ALPACA_MEANS,
    SHAREGPT_MEANS,
    TRACE_RECIPES,
    Request,
    alpaca_like,
    load_trace,
    mean_lengths,
    save_trace,
    sharegpt_like,
)


@pytest.mark.parametrize(
    "generator, means", [(sharegpt_like, SHAREGPT_MEANS), (alpaca_like, ALPACA_MEANS)]
)
def test_means_match_the_paper_within_3_percent(generator, means):
    prompt, output = mean_lengths(generator(20_000, seed=7))
    assert prompt == pytest.approx(means[0], rel=0.03)
    assert output == pytest.approx(means[1], rel=0.03)


def test_sharegpt_is_longer_and_more_spread_than_alpaca():
    share, alpaca = sharegpt_like(2000, seed=1), alpaca_like(2000, seed=1)
    assert max(r.total_len for r in share) > 4 * max(r.total_len for r in alpaca) / 2
    assert mean_lengths(share)[0] > 5 * mean_lengths(alpaca)[0]


def test_seeded_and_deterministic():
    assert sharegpt_like(50, seed=3) == sharegpt_like(50, seed=3)
    assert sharegpt_like(50, seed=3) != sharegpt_like(50, seed=4)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 2**32),
    max_total=st.integers(2, 4096),
    rate=st.one_of(st.none(), st.floats(0.01, 100)),
    generator=st.sampled_from([sharegpt_like, alpaca_like]),
)
def test_every_request_fits_and_arrivals_never_go_back(n, seed, max_total, rate, generator):
    requests = generator(n, seed=seed, rate=rate, max_total=max_total)
    assert len(requests) == n
    for r in requests:
        assert r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= max_total
    arrivals = [r.arrival for r in requests]
    assert arrivals == sorted(arrivals)
    if rate is None:
        assert set(arrivals) == {0.0}


def test_poisson_rate_is_respected():
    requests = sharegpt_like(4000, seed=0, rate=2.0)
    assert requests[-1].arrival / len(requests) == pytest.approx(0.5, rel=0.05)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n": 0}, ValueError, "n must be >= 1"),
        ({"n": 5, "rate": 0}, ValueError, "rate must be > 0"),
        ({"n": 5, "rate": -1.0}, ValueError, "rate must be >= 0"),
        ({"n": 5, "max_total": 1}, ValueError, "max_total must be >= 2"),
        ({"n": 2.5}, TypeError, "n must be an int"),
    ],
)
def test_bad_generator_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        sharegpt_like(**kwargs)


def test_request_validation_names_the_field():
    with pytest.raises(ValueError, match="output_len must be >= 1"):
        Request(10, 0)
    with pytest.raises(ValueError, match="arrival must be >= 0"):
        Request(10, 5, arrival=-1.0)


def test_committed_traces_are_what_the_recipes_generate():
    for name, recipe in TRACE_RECIPES.items():
        assert load_trace(name) == recipe(), (
            f"assets/traces/{name}.csv is stale: python -m kvlab.serving.workload"
        )
        assert (files.traces_dir() / f"{name}.csv").exists()


def test_trace_round_trip(tmp_path):
    requests = alpaca_like(30, seed=2, rate=3.0)
    save_trace(requests, tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv") == requests
    with pytest.raises(FileNotFoundError, match="no trace named 'nope'; named traces are"):
        load_trace("nope")
    with pytest.raises(FileNotFoundError, match="no trace at .*gone.csv"):
        load_trace(tmp_path / "gone.csv")


def test_documents_among_chats_mixes_long_prompts_into_a_poisson_stream():
    from kvlab.serving.workload import documents_among_chats

    day = documents_among_chats(500, seed=1)
    assert day == documents_among_chats(500, seed=1)  # seeded
    documents = [r for r in day if r.prompt_len >= 6_000]
    assert 0.04 < len(documents) / len(day) < 0.12
    assert all(r.prompt_len <= 400 for r in day if r not in documents)
    arrivals = [r.arrival for r in day]
    assert arrivals == sorted(arrivals) and 500 / arrivals[-1] == pytest.approx(40, rel=0.15)
    with pytest.raises(ValueError, match="document_share"):
        documents_among_chats(5, document_share=1.5)
    with pytest.raises(ValueError, match="rate must be > 0"):
        documents_among_chats(5, rate=0)
