"""One name per cache kind: the table in kvlab.core.cache_kinds, and the modules that read it."""

import importlib

import pytest

from kvlab.core import cache_kinds
from kvlab.core.cache_kinds import (
    CACHES,
    PAPER_NAMES,
    POLICIES,
    POLICY_PAPER_NAMES,
    TINY_CACHES,
    booking_policy,
)


def test_the_table_is_whole():
    assert set(CACHES) == set(PAPER_NAMES)
    assert [p for p in CACHES.values() if p is not None] == list(POLICIES)
    assert POLICY_PAPER_NAMES == {
        "max": "Orca (Max)",
        "pow2": "Orca (Pow2)",
        "oracle": "Orca (Oracle)",
    }
    assert CACHES["contiguous-oracle"] == "oracle" and CACHES["paged"] is None
    assert set(TINY_CACHES) <= set(CACHES) and CACHES[TINY_CACHES[0]] == "max"


def test_exact_is_an_alias_of_oracle():
    assert booking_policy("exact") == booking_policy("oracle") == "oracle"
    assert all(booking_policy(p) == p for p in POLICIES)
    for bad in ("guess", None, 3):
        with pytest.raises(ValueError, match="policy must be one of"):
            booking_policy(bad)


def test_modules_read_the_one_table():
    contiguous = importlib.import_module("kvlab.core.contiguous")
    generation = importlib.import_module("kvlab.models.tiny.generation")

    assert contiguous.POLICIES is cache_kinds.POLICIES
    assert contiguous.PAPER_NAMES is cache_kinds.POLICY_PAPER_NAMES
    assert generation.TINY_CACHES is cache_kinds.TINY_CACHES


def test_the_simulator_names_the_same_kinds():
    serve = importlib.import_module("kvlab.serving")

    assert serve.PAPER_NAMES is PAPER_NAMES
    assert serve.CACHES is CACHES
    assert importlib.import_module("kvlab.serving.simulation").CACHES is CACHES
