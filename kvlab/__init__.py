"""kvlab: reference implementations, autograder checks and widgets for the KV-cache course.

The package is grouped by layer: ``core`` (memory bookkeeping, no torch), ``serving`` (scheduler,
engine, simulator), ``kv`` (K/V tensors), ``ops`` (attention references and Triton kernels),
``models``, ``perf`` (roofline, planner, benchmarks), ``ui`` (plots and widgets), ``course``
(kernel launcher, doctor, lab generation) and ``grading``. Old flat paths such as
``kvlab.paged`` still import (see ``kvlab._moved``).
"""

from kvlab import _moved
from kvlab._version import __version__
from kvlab.ops.runtime import configure_triton

_moved.install()
KERNEL_MODE = configure_triton()

__all__ = ["KERNEL_MODE", "__version__"]
