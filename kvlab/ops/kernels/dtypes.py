"""Which dtypes the kernels multiply and store in, wherever they run: the same bits on a CPU (Triton's
interpreter) as on a GPU, and no compiler traceback where a GPU lacks a type."""

from __future__ import annotations

import torch

from kvlab.ops.runtime import kernel_mode

BF16_MIN_ARCH = 80  # bf16 tensor cores and fp32 -> bf16 conversion arrived with Ampere (sm_80)


def gpu_arch() -> int | None:
    """The compute capability kernels are compiled for (90 for an H100/H200), None in the
    interpreter. Asked of Triton's active driver, so a compile-only driver is honoured too."""
    if kernel_mode() == "interpreter":
        return None
    from triton.runtime import driver

    return driver.active.get_current_target().arch


def tensor_core_dtypes() -> tuple:
    """Types that ``tl.dot`` multiplies in directly, with fp32 accumulation. The interpreter gets
    bf16 products wrong (NumPy has no bf16) and GPUs before sm_80 have no bf16 tensor cores: there
    bf16 takes the fp32 path; fp16 still exercises the low-precision one."""
    arch = gpu_arch()
    if arch is None or arch < BF16_MIN_ARCH:
        return (torch.float16,)
    return (torch.float16, torch.bfloat16)


def store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel should store a result of ``dtype`` in. Where Triton cannot round fp32 to
    bf16 as a GPU does (its interpreter truncates, so half the values come out one ulp low;
    GPUs before sm_80 have no conversion), kernels store fp32 and the launcher rounds with
    torch, to nearest even: the bits a GPU gives."""
    arch = gpu_arch()
    if dtype == torch.bfloat16 and (arch is None or arch < BF16_MIN_ARCH):
        return torch.float32
    return dtype
