"""Vision tower speed on CPU: ours (NumPy, ``model/vl/vision.py``) against transformers' ``model.visual``.

Workload: one 224x224 camera frame (16x16 patches of 14 px, 2 temporal patches: 256 patches, 64 decoder
tokens) through a tower with real widths and random weights (bf16 on disk, fp32 compute in both):

- ``qwen2_vl``: Qwen2-VL-2B's ViT (1280 wide, 16 heads, MLP 5120, merger into 1536);
- ``qwen2_5_vl``: Qwen2.5-VL-3B's ViT (1280 wide, 16 heads, SwiGLU 3420, windows of 112 px, merger into
  2048), full attention in every 8th block as in the real model.

``--depth`` blocks (the real towers have 32; the default keeps memory small). Both engines run the same
patches in alternating blocks so that machine noise hits both alike; prints medians, the ratio HF / ours
(> 1 means we are faster) and the agreement of the outputs.

    python bench/bench_vl_vision.py [--depth 8] [--repeats 10] [--threads 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.vl.vision import VisionTower

GRID = [[1, 16, 16]]  # one 224x224 frame
TOWERS = {
    "qwen2_vl": dict(embed_dim=1280, num_heads=16, mlp_ratio=4, hidden_size=1536, patch_size=14),
    "qwen2_5_vl": dict(hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=2048, patch_size=14,
                       window_size=112),
}
DECODER = {"qwen2_vl": dict(hidden_size=1536, num_attention_heads=12, mrope=[16, 24, 24]),
           "qwen2_5_vl": dict(hidden_size=2048, num_attention_heads=16, mrope=[16, 24, 24])}


def write_model(out: Path, family: str, depth: int) -> Path:
    """A random-weight VL checkpoint with the real tower widths and a one-layer, small-vocabulary decoder."""
    vision = dict(TOWERS[family], depth=depth)
    if family == "qwen2_5_vl":
        vision["fullatt_block_indexes"] = list(range(7, depth, 8))
    decoder = DECODER[family]
    text = dict(hidden_size=decoder["hidden_size"], intermediate_size=256, num_hidden_layers=1,
                num_attention_heads=decoder["num_attention_heads"], num_key_value_heads=2, vocab_size=512,
                rope_scaling={"type": "mrope", "mrope_section": decoder["mrope"]}, bos_token_id=None, eos_token_id=None)
    config_class, model_class = ((transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration)
                                 if family == "qwen2_vl" else
                                 (transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration))
    config = config_class(text_config=text, vision_config=vision, image_token_id=5, vision_start_token_id=3,
                          vision_end_token_id=4)
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(str(out))
    return out


def bench(family: str, depth: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / family, family, depth)
        ours = VisionTower.from_checkpoint(load_checkpoint(model_dir))
        theirs = transformers.AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    grid = np.array(GRID)
    patches = np.random.default_rng(0).standard_normal((int(grid.prod(axis=1).sum()), ours.config.patch_dim))
    patches = patches.astype(np.float32)
    torch_patches, torch_grid = torch.from_numpy(patches), torch.from_numpy(grid)

    def run_ours() -> np.ndarray:
        return ours.encode(patches, grid)

    def run_theirs() -> np.ndarray:
        with torch.no_grad():
            return theirs.model.visual(torch_patches, grid_thw=torch_grid).pooler_output.numpy()

    a, b = run_ours(), run_theirs()  # warm-up, and the agreement
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for _ in range(repeats):
        for name, run in (("ours", run_ours), ("hf", run_theirs)):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    ours_ms, hf_ms = (statistics.median(times[n]) * 1e3 for n in ("ours", "hf"))
    cosine = float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return {"family": family, "depth": depth, "tokens": int(a.shape[0]), "ours_ms": ours_ms, "hf_ms": hf_ms,
            "hf_over_ours": hf_ms / ours_ms, "threads": torch.get_num_threads(), "cosine": cosine, "max_abs_error": float(np.abs(a - b).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (1: the runtime's default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.threads, user_api="blas"):  # both sides on the same number of threads
        results = [bench(family, args.depth, args.repeats) for family in TOWERS]
    for r in results:
        print(f"{r['family']:>10}  depth {r['depth']}  {r['tokens']} tokens  ours {r['ours_ms']:.1f} ms  "
              f"hf {r['hf_ms']:.1f} ms  hf/ours {r['hf_over_ours']:.2f}  cosine {r['cosine']:.7f}  "
              f"max|err| {r['max_abs_error']:.2e}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
