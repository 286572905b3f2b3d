"""Compile kvlab's Triton kernels for an NVIDIA GPU on a machine without one.

Triton's compiler (and the ptxas it ships) needs no GPU: only its launcher does. This script swaps
in a driver that names a target architecture, turns every ``kernel[grid](...)`` launch made by
kvlab's own launchers into a compile-only warm-up, and prints one JSON line per compiled kernel.
Run it in a process of its own (``TRITON_INTERPRET`` must be off before any kernel is defined),
one or more targets per process (each compiled as if it were its own device):

    python tests/support/gpu_compile.py 90      # sm_90: H100 / H200, every kernel and launch option
    python tests/support/gpu_compile.py 80      # sm_80: A100, the defaults of every dtype and head size
    python tests/support/gpu_compile.py 75      # sm_75: T4 (no bf16 tensor cores), the same
    python tests/support/gpu_compile.py --defaults-only 90 80 75   # the defaults only, on all three
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


class CompileOnlyDriver:
    """Just enough of Triton's CUDA driver to compile: a target, device 0, stream 0."""

    def __init__(self, arch: int):
        self.arch = arch
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        # a device per target: Triton keeps its compiled kernels (and their target) per device,
        # so one process compiles for several targets with no kernel of one reused for another
        return self.arch

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda


def cases(arch: int, defaults_only: bool = False):
    """(label, zero-argument call of a kvlab launcher): on sm_90 every kernel and launch option
    the sweep tries one at a time (unless ``defaults_only``); on older GPUs the launchers'
    defaults for each dtype and head size (what a learner's T4 or a rented A100 runs)."""
    from kvlab.ops.kernels import (
        launch_paged_decode,
        paged_decode_attention,
        paged_decode_kernel,
        paged_prefill_attention,
        write_kv,
    )
    from kvlab.ops.testing import flash_layout, uniform_case

    def paged(seqs, context, block_size, q_heads, kv_heads, head_dim, dtype):
        """A batch's shapes and strides over a cache of four rooms: compiling needs no more."""
        return uniform_case(
            seqs, context, block_size, q_heads, kv_heads, head_dim, dtype, num_blocks=4
        )

    def tiled(shape, dtype, **options):
        options.setdefault("num_splits", 1)
        return lambda: paged_decode_attention(*paged(*shape, dtype), **options)

    def room_by_room(shape, dtype):
        return lambda: launch_paged_decode(paged_decode_kernel, *paged(*shape, dtype))

    def write(dtype):
        caches = flash_layout(*[torch.zeros(4, 16, 8, 128, dtype=dtype)] * 2)
        new = [torch.zeros(3, 8, 128, dtype=dtype)] * 2
        return lambda: write_kv(*caches, torch.zeros(3, dtype=torch.int64), *new)

    def quantized(shape, dtype, fmt, **options):
        """The quantised decode kernel: 8-bit K/V (``fmt``) with fp32 scales, q in ``dtype``."""
        from kvlab.ops.kernels.quantized import paged_decode_attention_quantized

        q, k, v, tables, lens = paged(*shape, dtype)
        values = torch.zeros(k.shape, dtype=torch.int8).view(fmt)
        scales = torch.ones(k.shape[:3])
        options.setdefault("num_splits", 1)
        return lambda: paged_decode_attention_quantized(
            q, values, values, scales, scales, tables, lens, **options
        )

    def prefill(shape, dtype, **options):
        """Chunks of ``chunk`` tokens ending at ``context`` (shapes only: a cache of four rooms)."""
        seqs, chunk, context, block_size, q_heads, kv_heads, head_dim = shape
        _, k, v, tables, _ = uniform_case(
            seqs, context, block_size, q_heads, kv_heads, head_dim, dtype, num_blocks=4
        )
        q = torch.zeros(seqs * chunk, q_heads, head_dim, dtype=dtype)
        starts = torch.arange(0, seqs * chunk + 1, chunk, dtype=torch.int32)
        computed = torch.full((seqs,), context - chunk, dtype=torch.int32)
        return lambda: paged_prefill_attention(q, k, v, tables, starts, computed, **options)

    llama = (32, 8192, 16, 32, 8, 128)  # seqs, context, block_size, q_heads, kv_heads, head_dim
    head_40, head_256, mqa = (
        (3, 17, 16, 8, 2, 40),
        (2, 257, 256, 4, 1, 256),
        (2, 64, 16, 32, 1, 128),
    )
    defaults = [
        ("tiled bf16 llama", tiled(llama, BF16)),
        ("tiled fp16 llama", tiled(llama, FP16)),
        ("tiled fp32 llama", tiled(llama, FP32)),
        ("tiled bf16 head_dim 256 rooms 256", tiled(head_256, BF16)),
        ("tiled fp32 head_dim 256 rooms 256", tiled(head_256, FP32)),
        ("tiled bf16 MQA group 32", tiled(mqa, BF16)),
        ("room_by_room bf16 llama", room_by_room(llama, BF16)),
        ("write_kv bf16 flash layout", write(BF16)),
        ("quantized int8 bf16 llama", quantized(llama, BF16, torch.int8)),  # every GPU: int8
    ]
    # seqs, chunk, context, block_size, q_heads, kv_heads, head_dim
    chunks, chunks_256, chunks_mqa = (
        (4, 512, 8192, 16, 32, 8, 128),
        (2, 64, 300, 16, 8, 2, 256),
        (2, 64, 300, 16, 32, 1, 128),
    )
    # one case per launch config (bf16 and fp16 share one from sm_80 on; a T4 runs fp16)
    defaults += [
        ("prefill bf16 llama", prefill(chunks, BF16)),
        ("prefill fp32 llama", prefill(chunks, FP32)),
        ("prefill bf16 head_dim 256", prefill(chunks_256, BF16)),
        ("prefill fp32 head_dim 256", prefill(chunks_256, FP32)),
    ]
    if arch == 75:
        defaults.append(("prefill fp16 llama", prefill(chunks, FP16)))
    if arch == 90:
        defaults.append(("prefill bf16 MQA group 32", prefill(chunks_mqa, BF16)))
        # fp8 e4m3 from sm_89 on (Triton converts it there only)
        defaults.append(("quantized fp8 bf16 llama", quantized(llama, BF16, torch.float8_e4m3fn)))
    if arch != 90 or defaults_only:
        return defaults
    return defaults + [
        ("tiled bf16 llama split", tiled(llama, BF16, num_splits=3)),
        ("quantized fp8 bf16 llama split", quantized(llama, BF16, torch.float8_e4m3fn, num_splits=3)),
        ("quantized int8 fp32 head_dim 40", quantized(head_40, FP32, torch.int8)),
        ("tiled fp32 head_dim 40", tiled(head_40, FP32)),
        ("room_by_room fp32 head_dim 40", room_by_room((3, 17, 4, 8, 2, 40), FP32)),
        ("tiled fp32 rooms of 1", tiled((3, 65, 1, 2, 1, 32), FP32)),
        ("tiled fp32 rooms of 5", tiled((3, 65, 5, 2, 1, 32), FP32)),
        ("tiled bf16 prefetch", tiled(llama, BF16, num_stages=3, prefetch_table=True)),
        ("tiled bf16 prefetch split", tiled(llama, BF16, num_stages=3, prefetch_table=True, num_splits=2)),
        ("tiled bf16 tile 32 stages 2", tiled(llama, BF16, tile=32, num_stages=2)),
        ("tiled bf16 5 stages", tiled(llama, BF16, num_stages=5)),
        ("tiled bf16 8 warps", tiled(llama, BF16, num_warps=8)),
        # the sweep's largest: three K/V buffers of 128 tokens
        ("tiled bf16 tile 128 stages 4 prefetch", tiled(llama, BF16, tile=128, num_stages=4, prefetch_table=True)),
    ]  # fmt: skip


def main(archs: list[int], defaults_only: bool = False) -> int:
    compiled = []

    def compile_only(self, grid):
        def launch(*args, **kwargs):
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            compiled.append((self.fn.__name__, kernel))
            return kernel

        return launch

    JITFunction.__getitem__ = compile_only
    failed = 0
    for arch in archs:
        driver.set_active(CompileOnlyDriver(arch))
        failed += compile_cases(arch, defaults_only, compiled)
    return 1 if failed else 0


def compile_cases(arch: int, defaults_only: bool, compiled: list) -> int:
    """One JSON line per kernel each case compiled for ``arch``; the number of cases that failed."""
    failed = 0
    for label, call in cases(arch, defaults_only):
        compiled.clear()
        try:
            call()
        except Exception as error:  # report every case, then fail
            failed += 1
            print(
                json.dumps(
                    {
                        "case": label,
                        "arch": arch,
                        "error": f"{type(error).__name__}: {error}"[:2000],
                    }
                )
            )
            continue
        for name, kernel in compiled:
            ptx = kernel.asm["ptx"]
            print(
                json.dumps(
                    {
                        "case": label,
                        "kernel": name,
                        "arch": arch,
                        "compiled_for": kernel.metadata.target.arch,
                        "shared_bytes": kernel.metadata.shared,
                        "num_warps": kernel.metadata.num_warps,
                        "tensor_core_mma": ptx.count("mma.sync") + ptx.count("wgmma.mma_async"),
                        "async_copies": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                        "cubin_bytes": len(kernel.asm["cubin"]),
                    }
                )
            )
    return failed


if __name__ == "__main__":
    args = sys.argv[1:]
    defaults_only = "--defaults-only" in args
    archs = [int(a) for a in args if a != "--defaults-only"] or [90]
    sys.exit(main(archs, defaults_only))
