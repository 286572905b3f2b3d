"""The core: pure-Python bookkeeping of KV-cache memory, with no torch in sight.

Accounts of where bytes go (``accounting``), traces of allocator calls (``trace``, ``recorder``),
the free-block pool and the paged block manager (``block_pool``, ``block_manager``), the block
manager of a hybrid model over one manager per layer group (``hybrid_block_manager``,
``single_type_manager``, ``block_hashes``), prefix
caches behind one protocol (``prefix_cache``), the contiguous baselines (``contiguous``), the
names of the caches the course compares (``cache_kinds``), typed errors and argument checks.
Everything above (serving, kernels, pictures, grading) is built on these.
"""
