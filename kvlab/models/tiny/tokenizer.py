"""A byte-level tokenizer: every UTF-8 byte is one token (ids 0..255).

Nothing to download or train, and what the model writes is legible as it is written. The price
is length: a token carries one byte, not a word piece, so sequences are 3-4x longer than with a
real tokenizer (which only makes the cache work harder, as a lab wants).
"""

from __future__ import annotations

VOCAB_SIZE = 256


def encode(text: str) -> list[int]:
    """Token ids of ``text``'s UTF-8 bytes."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Text of token ids; a multi-byte character cut short (the model may write one) becomes
    U+FFFD rather than an error."""
    bad = [i for i in ids if not 0 <= int(i) < VOCAB_SIZE]
    if bad:
        raise ValueError(f"token ids must be in 0..{VOCAB_SIZE - 1}, got {bad[:5]}")
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
