"""kvlab's tiny model: a real (if small) Llama-style decoder whose K/V go through the course's own
caches, so Lab 06 can show a paged cache decoding the same tokens as a contiguous one.

One concept per module: :mod:`~kvlab.models.tiny.model` (the decoder; ``TINY_SPEC`` is its shape as a
``kvlab.models.ModelSpec``), :mod:`~kvlab.models.tiny.tokenizer` (bytes), :mod:`~kvlab.models.tiny.train`
(``python -m kvlab.models.tiny.train`` retrains the shipped weights in ``assets/tiny_model``),
:mod:`~kvlab.models.tiny.executor` (one engine step on a paged or contiguous cache, its K/V in a store
of :mod:`kvlab.kv.tensors`) and
:mod:`~kvlab.models.tiny.generation` (greedy generation through :class:`kvlab.serving.engine.Engine`).

``from kvlab.models.tiny import generate`` is the function; the module's old path
``kvlab.models.tiny.generate`` still imports the module (:mod:`kvlab._moved`), while the package's
attribute stays the function.
"""

from kvlab import _moved
from kvlab.models.tiny import generation
from kvlab.models.tiny.executor import TinyExecutor, make_store
from kvlab.models.tiny.generation import Generation, generate, make_kv_cache, tiny_model
from kvlab.models.tiny.model import TINY_SPEC, TinyConfig, TinyLlama, load_model, model_spec
from kvlab.models.tiny.tokenizer import decode, encode

_moved.keep_old_path("kvlab.models.tiny.generate", generation)

__all__ = [
    "TINY_SPEC",
    "Generation",
    "TinyConfig",
    "TinyExecutor",
    "TinyLlama",
    "decode",
    "encode",
    "generate",
    "load_model",
    "make_kv_cache",
    "make_store",
    "model_spec",
    "tiny_model",
]
