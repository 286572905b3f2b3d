"""Models: the attention shapes of real models (``specs``) and a tiny trained model (``tiny``).

The shapes are re-exported here, where the labs import them from (``from kvlab.models import
PRESETS``).
"""

from kvlab.models.hf_config import spec_from_hf_config
from kvlab.models.specs import (
    LLAMA_3_8B,
    LLAMA_3_70B,
    LLAMA_31_8B,
    LLAMA_31_70B,
    MISTRAL_7B,
    MISTRAL_7B_V03,
    OPT_13B,
    PRESETS,
    QWEN_25_7B,
    ModelSpec,
    preset,
)

__all__ = [
    "LLAMA_3_8B",
    "LLAMA_3_70B",
    "LLAMA_31_8B",
    "LLAMA_31_70B",
    "MISTRAL_7B",
    "MISTRAL_7B_V03",
    "OPT_13B",
    "PRESETS",
    "QWEN_25_7B",
    "ModelSpec",
    "preset",
    "spec_from_hf_config",
]
