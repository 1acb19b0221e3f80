"""Compile every kernel the launchers use to real PTX (sm_90 Hopper, sm_87 Orin) without a GPU.

The CUDA simulator runs kernels as Python, so it cannot catch what only the real compiler sees:
typing errors, unsupported features, silent fp64 arithmetic (a float64 literal or mixed int/float
division), or small local arrays that did not become registers. Here every launcher is called on
host arrays with the launch replaced by a PTX compilation of the kernel for the argument types the
launcher chose, and the PTX is checked for `.f64` and `.local`; where the toolkit's `ptxas` is on the
PATH, the PTX is also assembled for the target and must not spill registers. It needs NVVM and NVRTC
(a CUDA toolkit) but no driver, and skips where they are missing. It runs in a subprocess because the
simulator, once chosen by another test module, is fixed for the whole process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

_SKIP = 77  # exit status of the subprocess when no CUDA compiler toolchain is available
_CCS = ((9, 0), (8, 7))  # the subprocess's default: both
_FORBIDDEN = re.compile(r"\.f64\b|\.local\b")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
# Accurate fp32 sin/cos (libdevice __nv_sinf/__nv_cosf, as HF's fp32 RoPE needs) carry a
# large-argument reduction path that uses fp64 and a local array; it runs only for huge angles.
_TRIG_KERNELS = {"_rope_kernel", "_rope_axes_kernel", "_cache_shift_kernel"}  # in kernels/rotary.py


# ~50 s of compiling per target on 2 cores: the slow tier compiles for the robot's GPU (Orin) and for Hopper
# (the GPU checks in bench/gpu_check.sh compile and run there for real).
@pytest.mark.slow
@pytest.mark.parametrize("cc", [pytest.param((8, 7), id="sm_87"), pytest.param((9, 0), id="sm_90")])
def test_kernels_compile_to_ptx_without_fp64_or_local_memory(cc: tuple[int, int]) -> None:
    # The child imports vla_edge_ros.kernels from wherever this process found it.
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, __file__, f"{cc[0]}.{cc[1]}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=Path(__file__).resolve().parent,
    )
    if done.returncode == _SKIP:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"for (({cc[0]}, {cc[1]}),)" in done.stdout  # compiled for the target asked for


class _HostBuffer(np.ndarray):
    """Stands in for a device array: a host array with the DeviceNDArray methods used."""

    def copy_to_host(self, stream: object = 0) -> np.ndarray:
        return np.asarray(self)

    def is_c_contiguous(self) -> bool:
        return bool(self.flags.c_contiguous)


def _zeros(shape: int | tuple[int, ...], dtype: type | np.dtype = np.float32) -> _HostBuffer:
    return np.zeros(shape, dtype).view(_HostBuffer)


def _spilled_bytes(ptx: str, cc: tuple[int, int]) -> int:
    """Register spill bytes (stores + loads) ptxas reports for this PTX; 0 where ptxas is missing."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", str(source), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed: {done.stderr[-2000:]}")
    return sum(int(stores) + int(loads) for stores, loads in _SPILLS.findall(done.stderr))


def _install_compile_only_launch(kernels_compiled: list[str], problems: list[str],
                                 ccs: tuple[tuple[int, int], ...]) -> None:
    """Make `kernel[grid, block, stream](*args)` compile PTX for each cc instead of launching."""
    from numba import cuda, typeof
    from numba.cuda import dispatcher

    def compile_instead(self, args, launch_config):
        signature = tuple(typeof(a) for a in args)
        name = f"{self.py_func.__module__}.{self.py_func.__qualname__}{signature}"
        for cc in ccs:
            dispatcher.get_current_device = lambda cc=cc: types.SimpleNamespace(
                compute_capability=cc
            )
            ptx, _ = cuda.compile_ptx(self.py_func, signature, cc=cc)
            bad = sorted({m.group(0) for m in _FORBIDDEN.finditer(ptx)})
            if bad and self.py_func.__name__ not in _TRIG_KERNELS:
                lines = [ln.strip() for ln in ptx.splitlines() if _FORBIDDEN.search(ln)]
                problems.append(f"{name} sm_{cc[0]}{cc[1]}: {bad}: {lines[:6]}")
            spills = _spilled_bytes(ptx, cc)
            if spills:
                problems.append(f"{name} sm_{cc[0]}{cc[1]}: spills {spills} bytes of registers")
        kernels_compiled.append(name)

    dispatcher.CUDADispatcher.call = compile_instead
    cuda.device_array = lambda shape, dtype=np.float64, stream=0: _zeros(shape, dtype)


def _exercise_launchers() -> None:
    """Call each launcher with every argument variant the decoder uses."""
    import vla_edge_ros.kernels as K

    f32 = np.float32
    for kind in K.ELEMENT_KINDS:
        table = _zeros((50, 64), kind.storage_dtype)
        K.embedding_gather(table, _zeros(3, np.int32), _zeros((3, 64), f32))
        for tokens, n_out in ((1, 40), (3, 40), (20, 40), (40, 40), (64, 4096)):
            w = _zeros((n_out, 64), kind.storage_dtype)
            x = _zeros((tokens, 64), f32)
            out = _zeros((tokens, n_out), f32)
            K.linear(x, w, _zeros(n_out, f32), out)
            K.linear(x, w, None, out)
        odd = _zeros((40, 66), kind.storage_dtype)  # K % 4 != 0: the unpacked GEMV
        K.linear(_zeros((1, 66), f32), odd, None, _zeros((1, 40), f32))
        K.linear(
            _zeros((1, 64), f32),
            _zeros((80, 64), kind.storage_dtype)[40:],
            None,
            _zeros((1, 40), f32),
        )
    _exercise_quantized_linear(K)
    for hidden in (64, 1536):  # the norms' smallest and largest blocks (32 and 128 threads per row)
        wide = _zeros((3, hidden))
        K.rmsnorm(wide, _zeros(hidden, f32), 1e-6, wide)
        K.layernorm(wide, _zeros(hidden, f32), _zeros(hidden, f32), 1e-6, wide)
    x = _zeros((3, 64))
    K.add_inplace(x, x)
    K.swiglu(_zeros((3, 64), f32), _zeros((3, 32), f32))
    inv_freq = _zeros(8, f32)
    K.rope(_zeros((3, 4, 16), f32), _zeros(3, np.int32), inv_freq)
    K.rope_cache_shift(_zeros((2, 9, 16), f32), _zeros(2, np.int32), _zeros(2, np.int32), inv_freq)
    pool = _zeros((36, 16), f32)
    K.copy_rows(_zeros((6, 16), f32), _zeros((6, 16), f32), _zeros(3, np.int32), pool, pool, _zeros(3, np.int32))
    for head_dim in (64, 128):
        for tokens, splits in ((1, None), (1, 1), (20, None)):
            for page_tokens in (16, 5):  # pages that line up with the staged chunks, and pages that do not
                pools = [_zeros((40, page_tokens, head_dim), f32) for _ in range(2)]
                K.attention(
                    _zeros((tokens, 12, head_dim), f32),
                    *pools,
                    _zeros((2, 300 // page_tokens), np.int32),
                    _zeros(2, np.int32),
                    _zeros((40, page_tokens), np.int32),
                    _zeros(300, np.int32),
                    _zeros(tokens, np.int32),
                    0.1,
                    _zeros((tokens, 12, head_dim), f32),
                    num_splits=splits,
                )
    # The vision tower's: LayerNorm, GELUs, multi-axis rotary, segment attention (head_dim 80: Qwen2-VL's ViT).
    K.gelu(x, x)
    K.quick_gelu(x, x)
    K.rope_axes(_zeros((3, 4, 16), f32), _zeros((3, 3), np.int32), _zeros(8, np.int32), inv_freq)
    for head_dim in (16, 64, 80, 128):
        qkv = [_zeros((40, 4, head_dim), f32) for _ in range(4)]
        K.segment_attention(*qkv[:3], _zeros(4, np.int32), 0.1, qkv[3])
    K.argmax_rows(_zeros(1000, f32))
    K.cosine_similarities(_zeros((16, 64), f32), 9, _zeros(64, f32), _zeros(16, f32))
    for d_v in (1, 40, 1024):  # the step kernel is built per block size
        w, b = _zeros((d_v, 64), f32), _zeros(d_v, f32)
        K.fast_weight_step(w, b, _zeros(64, f32), _zeros(d_v, f32), 0.5, 1.0, False, _zeros(2, f32))
        K.fast_weight_read(w, b, _zeros(64, f32), _zeros(d_v, f32))


def _exercise_quantized_linear(K: types.ModuleType) -> None:
    """int8 (8, 4 and 1 weights a word) and int4 (each group size) through the GEMV, every GEMM tile and the gather."""
    f32 = np.float32

    def quantized(kind: object, rows: int, depth: int, group: int = 0) -> object:
        if group:
            groups = -(-depth // group)
            return K.DeviceWeight(kind, (rows, depth), _zeros((rows, groups * group // 2), np.uint8),
                                  _zeros((rows, groups), f32), group)
        return K.DeviceWeight(kind, (rows, depth), _zeros((rows, depth), np.int8), _zeros(rows, f32))

    for kind, group in ((K.WeightKind.INT8, 0), (K.WeightKind.INT4, 64)):
        K.embedding_gather(quantized(kind, 50, 64, group), _zeros(3, np.int32), _zeros((3, 64), f32))
        for tokens, n_out in ((1, 40), (3, 40), (20, 40), (40, 40), (64, 4096)):
            K.linear(_zeros((tokens, 64), f32), quantized(kind, n_out, 64, group), _zeros(n_out, f32),
                     _zeros((tokens, n_out), f32))
        K.linear(_zeros((1, 64), f32), quantized(kind, 80, 64, group)[40:], None, _zeros((1, 40), f32))
    for depth in (68, 66):  # int8 four a word (uint32), and unpacked
        K.linear(_zeros((1, depth), f32), quantized(K.WeightKind.INT8, 40, depth), None, _zeros((1, 40), f32))
    for group in (32, 128):
        for tokens in (1, 3):
            K.linear(_zeros((tokens, 100), f32), quantized(K.WeightKind.INT4, 40, 100, group), None,
                     _zeros((tokens, 40), f32))


def main(argv: list[str]) -> int:
    """Compile for the compute capabilities in ``argv`` ("8.7 9.0"; none: both of _CCS)."""
    ccs = tuple(tuple(int(part) for part in arg.split(".")) for arg in argv) or _CCS
    try:
        from numba import cuda, float32

        cuda.compile_ptx(lambda a: None, (float32[:],), cc=ccs[0])
    except Exception as err:  # any missing piece of the toolchain means: cannot check here
        print(f"no CUDA compiler toolchain (NVVM + NVRTC) available: {type(err).__name__}")
        return _SKIP
    compiled: list[str] = []
    problems: list[str] = []
    _install_compile_only_launch(compiled, problems, ccs)
    _exercise_launchers()
    print(f"compiled {len(compiled)} kernel launches for {ccs}")
    for problem in problems:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
