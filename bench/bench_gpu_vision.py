"""GPU timing of the vision tower: our ``CudaVisionTower`` (Numba-CUDA) against transformers' ``model.visual``.

Workload: one 224x224 camera frame (256 patches, 64 decoder tokens) through Qwen2-VL-2B's and Qwen2.5-VL-3B's
ViT widths with random bf16 weights (``bench_vl_vision.write_model``, ``--depth`` blocks). Ours keeps the
weights in bf16 and computes in fp32; transformers runs in fp32 (the agreement reference) and in bf16 (what a
deployment would run), on the same GPU in the same process. Each is timed after a warm-up (ours JIT-compiles
there), with device synchronisation around every measurement; ours includes the host-side layout, the patch
upload and the token download, i.e. the whole cost of a frame.

    python bench/bench_gpu_vision.py [--depth 32] [--repeats 10] [--torch-device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from bench_vl_vision import GRID, TOWERS, write_model
from numba import cuda

from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.vl.cuda_vision import CudaVisionTower


def timed(run: Callable[[], np.ndarray], sync: Callable[[], None], repeats: int) -> tuple[float, np.ndarray]:
    """(median ms, last output) of ``repeats`` runs after one warm-up."""
    out = run()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        out = run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, out


def bench(family: str, depth: int, repeats: int, device: str) -> dict:
    grid = np.array(GRID)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / family, family, depth)
        ours = CudaVisionTower.from_checkpoint(load_checkpoint(model_dir))
        hf = transformers.AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    patches = np.random.default_rng(0).standard_normal((int(grid.prod(axis=1).sum()), ours.config.patch_dim))
    patches = patches.astype(np.float32)
    visual = hf.model.visual.to(device)
    torch_grid = torch.from_numpy(grid).to(device)
    torch_sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run_hf(dtype: torch.dtype) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            with torch.no_grad():
                out = visual.to(dtype)(torch.from_numpy(patches).to(device, dtype), grid_thw=torch_grid).pooler_output
            return out.float().cpu().numpy()
        return run

    ours_ms, a = timed(lambda: ours.encode(patches, grid), cuda.synchronize, repeats)
    fp32_ms, b = timed(run_hf(torch.float32), torch_sync, repeats)
    bf16_ms, _ = timed(run_hf(torch.bfloat16), torch_sync, repeats)
    cosine = float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return {"family": family, "depth": depth, "tokens": int(a.shape[0]), "ours_ms": ours_ms, "hf_fp32_ms": fp32_ms,
            "hf_bf16_ms": bf16_ms, "cosine": cosine, "weights_mb": ours.state_bytes() / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=32, help="ViT blocks (both real towers have 32)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--torch-device", default="cuda", help="where transformers runs (cuda; cpu for a CPU baseline)")
    args = parser.parse_args()
    if args.torch_device.startswith("cuda"):
        print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print(f"{'':12}{'tokens':>7}{'ours (numba)':>15}{'hf fp32':>12}{'hf bf16':>12}{'bf16 / ours':>13}{'cosine':>11}")
    for family in TOWERS:
        r = bench(family, args.depth, args.repeats, args.torch_device)
        print(f"{family:12}{r['tokens']:7d}{r['ours_ms']:12.2f} ms{r['hf_fp32_ms']:9.2f} ms{r['hf_bf16_ms']:9.2f} ms"
              f"{r['hf_bf16_ms'] / r['ours_ms']:12.2f}x{r['cosine']:11.6f}   ({r['depth']} blocks, "
              f"weights {r['weights_mb']:.0f} MB on device)")


if __name__ == "__main__":
    main()
