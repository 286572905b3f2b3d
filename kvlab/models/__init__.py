"""Models: the attention shapes of real models (``specs``) and a tiny trained model (``tiny``).

The shapes are re-exported here, where the labs import them from (``from kvlab.models import
PRESETS``).
"""

from kvlab.models.specs import (
    LLAMA_3_8B,
    LLAMA_3_70B,
    MISTRAL_7B,
    OPT_13B,
    PRESETS,
    ModelSpec,
    preset,
)

__all__ = ["LLAMA_3_8B", "LLAMA_3_70B", "MISTRAL_7B", "OPT_13B", "PRESETS", "ModelSpec", "preset"]
