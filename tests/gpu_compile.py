"""Compile kvlab's Triton kernels for an NVIDIA GPU on a machine without one.

Triton's compiler (and the ptxas it ships) needs no GPU: only its launcher does. This script swaps
in a driver that names a target architecture, turns every ``kernel[grid](...)`` launch made by
kvlab's own launchers into a compile-only warm-up, and prints one JSON line per compiled kernel.
Run it in a process of its own (``TRITON_INTERPRET`` must be off before any kernel is defined):

    python tests/gpu_compile.py 90      # sm_90: H100 / H200
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class CompileOnlyDriver:
    """Just enough of Triton's CUDA driver to compile: a target, device 0, stream 0."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda


def cases():
    """(label, zero-argument call of a kvlab launcher): every kernel and constexpr variant."""
    from kvlab.kernels import (
        launch_paged_decode,
        paged_decode_attention,
        paged_decode_kernel,
        write_kv,
    )

    def paged(seqs, q_heads, kv_heads, head_dim, block_size, context, dtype):
        q = torch.zeros(seqs, q_heads, head_dim, dtype=dtype)
        cache = torch.zeros(4, block_size, kv_heads, head_dim, dtype=dtype)
        tables = torch.zeros(seqs, -(-context // block_size), dtype=torch.int32)
        lens = torch.full((seqs,), context, dtype=torch.int32)
        return q, cache, cache.clone(), tables, lens

    llama = (32, 32, 8, 128, 16, 8192)
    return [
        ("tiled bf16 llama", lambda: paged_decode_attention(*paged(*llama, torch.bfloat16), num_splits=1)),
        ("tiled bf16 llama split", lambda: paged_decode_attention(*paged(*llama, torch.bfloat16), num_splits=3)),
        ("tiled fp16 llama", lambda: paged_decode_attention(*paged(*llama, torch.float16), num_splits=1)),
        ("tiled fp32 llama", lambda: paged_decode_attention(*paged(*llama, torch.float32), num_splits=1)),
        ("tiled fp32 head_dim 40", lambda: paged_decode_attention(*paged(3, 8, 2, 40, 16, 17, torch.float32), num_splits=1)),
        ("tiled bf16 head_dim 256 rooms 256", lambda: paged_decode_attention(*paged(2, 4, 1, 256, 256, 257, torch.bfloat16), num_splits=1)),
        ("tiled fp32 head_dim 256 rooms 256", lambda: paged_decode_attention(*paged(2, 4, 1, 256, 256, 257, torch.float32), num_splits=1)),
        ("tiled bf16 MQA group 32", lambda: paged_decode_attention(*paged(2, 32, 1, 128, 16, 64, torch.bfloat16), num_splits=1)),
        ("tiled fp32 rooms of 1", lambda: paged_decode_attention(*paged(3, 2, 1, 32, 1, 65, torch.float32), num_splits=1)),
        ("tiled bf16 5 stages", lambda: paged_decode_attention(*paged(*llama, torch.bfloat16), num_splits=1, num_stages=5)),
        ("room_by_room bf16 llama", lambda: launch_paged_decode(paged_decode_kernel, *paged(*llama, torch.bfloat16))),
        ("room_by_room fp32 head_dim 40", lambda: launch_paged_decode(paged_decode_kernel, *paged(3, 8, 2, 40, 4, 17, torch.float32))),
        ("write_kv bf16", lambda: write_kv(*[torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16)] * 2, torch.zeros(3, dtype=torch.int64), *[torch.zeros(3, 8, 128, dtype=torch.bfloat16)] * 2)),
    ]  # fmt: skip


def main(arch: int) -> int:
    driver.set_active(CompileOnlyDriver(arch))
    compiled = []

    def compile_only(self, grid):
        def launch(*args, **kwargs):
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            compiled.append((self.fn.__name__, kernel))
            return kernel

        return launch

    JITFunction.__getitem__ = compile_only
    failed = 0
    for label, call in cases():
        compiled.clear()
        try:
            call()
        except Exception as error:  # report every case, then fail
            failed += 1
            print(json.dumps({"case": label, "error": f"{type(error).__name__}: {error}"[:2000]}))
            continue
        for name, kernel in compiled:
            ptx = kernel.asm["ptx"]
            print(
                json.dumps(
                    {
                        "case": label,
                        "kernel": name,
                        "shared_bytes": kernel.metadata.shared,
                        "num_warps": kernel.metadata.num_warps,
                        "tensor_core_mma": ptx.count("mma.sync") + ptx.count("wgmma.mma_async"),
                        "cubin_bytes": len(kernel.asm["cubin"]),
                    }
                )
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 90))
