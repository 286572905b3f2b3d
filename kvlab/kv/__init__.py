"""K/V tensors: where the keys and values of paged and contiguous caches live in torch memory."""
