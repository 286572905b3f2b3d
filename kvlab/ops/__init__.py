"""Attention ops: torch references, the Triton kernels, their test cases, and where they run.

``runtime`` chooses between compiled kernels and Triton's interpreter and must stay importable
without torch or Triton (``import kvlab`` runs it first).
"""
