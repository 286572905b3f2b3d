"""Every kvlab kernel compiles with Triton's real compiler, no GPU needed: for an H100/H200 (sm_90)
every kernel and launch option of the sweep with the GPU machine's Triton (3.6, the oldest kvlab
supports, installed by ``make test`` beside ours: the one ``.ci/gpu-check`` sweeps with; ours when
it is missing) and the launchers' defaults with both, the defaults for an A100 (sm_80) with the
Triton installed here, and for a T4 (sm_75: Colab's and Kaggle's GPU; no tensor cores for Triton,
64 KB of shared memory) with both, since a hosted notebook's preinstalled torch may bring an older
Triton. One process per Triton compiles all of its targets.
Catches what the interpreter cannot: API missing from an older Triton, tl.dot shape and dtype
rules, shared memory beyond the chip's limit, TF32 sneaking into fp32 products, K/V loads that are
not double-buffered."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import cpu_limit
import pytest

SCRIPT = Path(__file__).parents[1] / "support" / "gpu_compile.py"
TRITON_GPU_DIR = os.environ.get("KVLAB_TRITON_GPU_DIR", ".venv/triton-3.6.0")
# KVLAB_TRITON_COMPILE_CACHE=DIR (`make test`: in the venv) keeps Triton's own cache between runs,
# a folder per Triton and target. Triton keys each kernel by its source and what it calls, the
# constants and options, the target, and Triton itself (its code hashed, ptxas's version): an
# unchanged kernel is read back as it was compiled, a changed one compiles. Unset, every run
# compiles from scratch.
COMPILE_CACHE = os.environ.get("KVLAB_TRITON_COMPILE_CACHE")
# CPU-seconds a compiling process (with its ptxas runs) may use: CPU time, not wall time, so a
# busy machine (where it waits for a core) cannot fail it; the wall-clock limit is only the
# backstop of cpu_limit (10 x). From scratch it uses about {measured} on an idle machine.
COMPILE_CPU_SECONDS = 1200
# shared memory one program may use (the opt-in maximum per block)
MAX_SHARED = {90: 232_448, 80: 166_912, 75: 65_536}
# compiled with the GPU machine's Triton too (every arch is compiled with ours)
OLDEST_TRITON_ARCHS = (90, 75)
KERNELS = {
    "tiled": {"paged_decode_tiled_kernel"},
    "room_by_room": {"paged_decode_kernel"},
    "write_kv": {"write_kv_kernel"},
    "prefill": {"paged_prefill_kernel"},
    "quantized": {"paged_decode_quant_kernel"},
}


def _start(tmp_path, archs, pythonpath=None, defaults_only=False):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    triton = Path(pythonpath).name if pythonpath else f"triton-{version('triton')}"
    cache = Path(COMPILE_CACHE) if COMPILE_CACHE else tmp_path  # tmp_path: from scratch
    env["TRITON_CACHE_DIR"] = str(cache / triton)  # Triton's keys name the target
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    options = ["--defaults-only"] if defaults_only else []
    return cpu_limit.popen(
        [sys.executable, str(SCRIPT), *options, *map(str, archs)],
        cpu=COMPILE_CPU_SECONDS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(proc):
    out, err = cpu_limit.communicate(proc)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, [r for r in rows if "error" in r] or err[-3000:]
    print(f"\n{' '.join(proc.args[2:])}: about {proc.cpu_used:.0f} CPU-s")
    return rows


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{(arch, Triton): rows}: a process per Triton, both at once (the test run beside them has
    the machine's other core, and more at once only slows everything down). The sm_90 sweep is
    compiled once, with the GPU machine's Triton where it is installed, else with ours."""
    tmp_path = tmp_path_factory.mktemp("triton-cache")
    gpu = TRITON_GPU_DIR if (Path(TRITON_GPU_DIR) / "triton").is_dir() else None
    running = {"installed": _start(tmp_path, list(MAX_SHARED), defaults_only=gpu is not None)}
    if gpu is not None:
        running["gpu machine's"] = _start(tmp_path, OLDEST_TRITON_ARCHS, gpu)
    rows = {}
    for name, proc in running.items():
        for r in _rows(proc):
            assert r["compiled_for"] == r["arch"], (name, r)  # each case for its own target
            rows.setdefault((r["arch"], name), []).append(r)
    targets = {"installed": MAX_SHARED, "gpu machine's": OLDEST_TRITON_ARCHS}
    assert sorted(rows) == sorted((arch, name) for name in running for arch in targets[name])
    return rows


SWEEP = "gpu machine's"  # the Triton that compiles the sm_90 sweep (ours when it is missing)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(MAX_SHARED, reverse=True))
def test_kernels_compile(compiled, arch):
    results = {name: rows for (at, name), rows in compiled.items() if at == arch}
    for name, rows in results.items():
        kernels = {}
        for r in rows:
            kernels.setdefault(r["case"], set()).add(r["kernel"])
            assert r["shared_bytes"] <= MAX_SHARED[arch], (name, r)
            if r["kernel"] in ("paged_decode_tiled_kernel", "paged_prefill_kernel"):
                low_precision = "bf16" in r["case"] or "fp16" in r["case"]
                # tensor cores for bf16/fp16 from sm_80 on (Triton has none before); exact fp32
                # products (no TF32 mma) for fp32
                assert (r["tensor_core_mma"] > 0) == (low_precision and arch >= 80), (name, r)
        for case, names in kernels.items():
            expected = set(KERNELS[case.split()[0]])
            if "split" in case:
                expected.add("merge_splits_kernel")
            assert names == expected, (name, case, names)
        sweep = arch == 90 and (name == SWEEP or len(results) == 1)
        assert len(kernels) >= (18 if sweep else 8), f"{name} Triton compiled {sorted(kernels)}"
        if sweep:
            by_case = {r["case"]: r for r in rows if r["kernel"] == "paged_decode_tiled_kernel"}
            # the next tile's key-card entries read a step early: K and V of 64 tokens x 128 lanes
            # x 2 bytes, twice over, so the compiler loads one tile while the other is used
            assert by_case["tiled bf16 prefetch"]["shared_bytes"] >= 2 * 2 * 64 * 128 * 2, name
    if arch == 90 and len(results) == 1:
        pytest.skip(
            f"compiled with this Triton only: no Triton 3.6 in {TRITON_GPU_DIR} (make triton-gpu)"
        )
