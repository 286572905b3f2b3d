"""kvlab: reference implementations, autograder checks and widgets for the KV-cache course."""

from kvlab.runtime import configure_triton

KERNEL_MODE = configure_triton()

__version__ = "0.1.0"
__all__ = ["KERNEL_MODE", "__version__"]
