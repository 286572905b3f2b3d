"""The one home of K/V tensors: both stores, the block-table tensor, and the old import paths."""

import sys

import cpu_limit
import pytest
import torch

import kvlab  # noqa: F401  (chooses Triton's interpreter before anything imports triton)
from kvlab.core.block_manager import BlockManager, PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.kv import tensors as kv_tensors
from kvlab.kv.tensors import (
    ContiguousStore,
    PagedKVCache,
    block_tables_tensor,
    kv_layers,
    torch_dtype,
)
from kvlab.models import ModelSpec
from kvlab.ops.attention import causal_attention

SPEC = ModelSpec("toy", num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=6, dtype_bytes=4)


def test_old_import_paths_name_the_same_objects():
    import kvlab.core.block_manager

    for name in ("PagedKVCache", "block_tables_tensor", "flashinfer_page_table"):
        assert getattr(kvlab.core.block_manager, name) is getattr(kv_tensors, name)
        assert name in dir(kvlab.core.block_manager)
    assert torch_dtype(SPEC) is torch.float32
    with pytest.raises(AttributeError, match="no attribute 'PagedStore'"):
        kvlab.core.block_manager.PagedStore  # noqa: B018


@pytest.mark.parametrize(
    "module", ["kvlab.core.block_manager", "kvlab.core.contiguous", "kvlab.core.cache_kinds"]
)
def test_the_accounts_import_no_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    cpu_limit.run([sys.executable, "-c", code], cpu=120, check=True)


def test_kv_layers_are_the_only_allocation():
    k, v = kv_layers(SPEC, (3, 5))
    assert len(k) == len(v) == 2 and k[0].shape == (3, 5, 2, 6) and k[0].dtype == torch.float32
    assert k[0] is not k[1] and k[0] is not v[0] and not k[0].any()
    half, _ = kv_layers(SPEC, (1,), dtype=torch.float16)
    assert half[0].dtype == torch.float16
    cache = ContiguousKVCache(2, 4, spec=SPEC)
    assert cache.k[0].shape == (2, 4, 2, 6)
    with pytest.raises(ValueError, match="dtype_bytes must be 1, 2 or 4"):
        torch_dtype(ModelSpec("odd", 1, 1, 1, 1, dtype_bytes=3))


def test_a_paged_store_over_a_schedulers_block_manager():
    cache = PagedCache(6, 4)
    store = PagedKVCache.over(cache.manager, SPEC)
    assert store.manager is cache.manager and store.k[0].shape == (6, 4, 2, 6)
    cache.admit("a", 6)
    assert store.slots("a", range(6)) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="manager holds 6 blocks of 4 slots"):
        PagedKVCache(SPEC, 8, 4, manager=cache.manager)


def test_block_tables_tensor_on_a_device():
    m = BlockManager(4, 2)
    m.allocate("a", 3)
    tables, lens = block_tables_tensor(m, ["a"], device="cpu")
    assert tables.tolist() == [[0, 1]] and lens.tolist() == [3]
    empty, none = block_tables_tensor(m, [])
    assert empty.shape == (0, 0) and none.shape == (0,)


def _fill(store, seq_id, k, v):
    slot_mapping = torch.tensor(store.slots(seq_id, range(len(k[0]))))
    for layer in range(SPEC.num_layers):
        store.write_slots(layer, slot_mapping, k[layer], v[layer])


def test_both_stores_read_what_they_stored_the_same_way():
    """The same tokens written to a paged and a contiguous store: gather returns them, decode
    and chunk attention give what causal attention over them gives."""
    g = torch.Generator().manual_seed(0)
    n = 11
    k = torch.randn(SPEC.num_layers, n, 2, 6, generator=g)
    v = torch.randn(SPEC.num_layers, n, 2, 6, generator=g)
    q = torch.randn(n, 4, 6, generator=g)
    paged = PagedCache(8, 4)
    paged.admit("filler", 5)  # the sequence's blocks are not the first ones
    paged.admit("a", n)
    contiguous = ContiguousKVCache(2, 16, spec=SPEC, policy="max")
    contiguous.admit("filler", 3)
    contiguous.admit("a", n)
    stores = [PagedKVCache.over(paged.manager, SPEC), ContiguousStore(contiguous)]
    want = causal_attention(q, k[1], v[1])
    for store in stores:
        _fill(store, "a", k, v)
        got_k, got_v = store.gather("a", 1)
        assert torch.equal(got_k, k[1]) and torch.equal(got_v, v[1])
        assert torch.equal(store.gather("a", 0, 4)[0], k[0, :4])
        torch.testing.assert_close(store.attend_chunk(1, q[6:], "a", 6), want[6:])
        torch.testing.assert_close(store.decode(1, q[n - 1 :], ["a"], [n]), want[n - 1 :])


def test_a_contiguous_store_needs_tensors():
    with pytest.raises(ValueError, match="spec="):
        ContiguousStore(ContiguousKVCache(1, 4))
