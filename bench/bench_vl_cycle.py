"""One frame cycle of a Qwen2-VL checkpoint on CPU: our runtime against transformers, ratios in one run.

A cycle is what the reasoning thread does per camera frame: the 224 x 224 frame through the vision tower,
its image segment (vision start, 64 merged tokens, vision end) prefilled after a 16-token instruction, and
7 action bins decoded greedily (6 decode steps). Two models with random weights (bf16 on disk, fp32
compute in both), written by ``init-model``'s code:

- ``small``: the ``qwen2-vl-tiny`` preset (4 decoder layers of 256, a 2-block ViT of 64);
- ``2b-slice``: Qwen2-VL-2B's widths, 2 blocks each (ViT 1280 x 16 heads, MLP 5120; decoder 1536, 12 / 2
  heads of 128, MLP 8960), a 2,048-id vocabulary.

Ours (numpy backend) keeps the instruction's KV pinned and evicts the previous frame (fifo, an arena of
one frame), as the runtime does at steady state; transformers (``generate`` with its KV cache) processes
instruction + frame from scratch every cycle, which is how a stateless VLA runs it. Both see the same
context (instruction + this frame), so the difference is the work the runtime does not repeat plus
implementation speed. The vision tower is also timed alone on both sides. Runs alternate between the two
so that machine noise hits both alike; medians, the ratio HF / ours (> 1: we are faster), and whether
the bins agree.

    python bench/bench_vl_cycle.py [--repeats 7] [--json bench/results/bench_vl_cycle.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import transformers

from vla_edge_ros.engine import VlaEngine
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.vl.frames import with_frame_geometry
from vla_edge_ros.worlds.synthetic import SyntheticCamera

CAP = 224 * 224
PROMPT = list(range(11, 27))  # 16 instruction tokens


def configs() -> dict:
    small = preset("qwen2-vl-tiny")
    vl = small.vl
    slice_ = replace(small, hidden_size=1536, intermediate_size=8960, num_hidden_layers=2, num_attention_heads=12,
                     num_key_value_heads=2, head_dim=128,
                     vl=replace(vl, vision=replace(vl.vision, depth=2, embed_dim=1280, num_heads=16, mlp_dim=5120,
                                                   out_hidden_size=1536), mrope_section=(16, 24, 24)))
    return {"small": small, "2b-slice": slice_}


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 3)


def bench(name: str, config, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model(Path(tmp) / name, config, seed=0)
        checkpoint = with_frame_geometry(load_checkpoint(model_dir), CAP)
        tokens_per_frame = checkpoint.config.vision.tokens_per_frame
        engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=len(PROMPT) + tokens_per_frame + 7)
        engine.set_prompt(PROMPT)
        hf = transformers.AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        processor = transformers.AutoImageProcessor.from_pretrained(str(model_dir))
    vl = config.vl
    frames = [SyntheticCamera(height=480, width=640, seed=s).frame() for s in range(repeats + 1)]
    ids = PROMPT + [vl.vision_start_token_id] + [vl.image_token_id] * (tokens_per_frame - 2) + [vl.vision_end_token_id]
    input_ids = torch.tensor([ids])
    bins = engine.head.bin_rows

    def hf_inputs(frame: np.ndarray) -> dict:
        images = processor(images=[engine.encoder.square(frame)], return_tensors="pt")
        return {"input_ids": input_ids, "mm_token_type_ids": (input_ids == vl.image_token_id).int(),
                "pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]}

    def bins_only(_batch, scores):  # greedy over the action bins, as our head decodes
        masked = torch.full_like(scores, -torch.inf)
        masked[:, bins] = scores[:, bins]
        return masked

    def theirs(frame: np.ndarray) -> list[int]:
        with torch.no_grad():
            out = hf.generate(**hf_inputs(frame), max_new_tokens=config.action.dof, do_sample=False,
                              logits_processor=transformers.LogitsProcessorList([bins_only]), pad_token_id=0)
        return out[0, len(ids):].tolist()

    times: dict[str, list[float]] = {"ours_cycle": [], "hf_cycle": [], "ours_tower": [], "hf_tower": []}
    agree = 0
    engine.step(frames[0])  # warm-up both
    theirs(frames[0])
    for frame in frames[1:]:
        t0 = time.perf_counter()
        ours = engine.step(frame).tokens
        t1 = time.perf_counter()
        reference = theirs(frame)
        t2 = time.perf_counter()
        times["ours_cycle"].append(t1 - t0)
        times["hf_cycle"].append(t2 - t1)
        agree += ours == reference
        inputs = hf_inputs(frame)
        t0 = time.perf_counter()
        engine.encode_frame(frame)
        t1 = time.perf_counter()
        with torch.no_grad():
            hf.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
        t2 = time.perf_counter()
        times["ours_tower"].append(t1 - t0)
        times["hf_tower"].append(t2 - t1)
    medians = {key: _median_ms(value) for key, value in times.items()}
    return {"model": name, "tokens_per_frame": tokens_per_frame, "prompt_tokens": len(PROMPT),
            "action_tokens": config.action.dof, **{f"{k}_ms": v for k, v in medians.items()},
            "cycle_ratio_hf_over_ours": round(medians["hf_cycle"] / medians["ours_cycle"], 2),
            "tower_ratio_hf_over_ours": round(medians["hf_tower"] / medians["ours_tower"], 2),
            "bins_agree": f"{agree}/{repeats}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (1: the runtime's default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.threads, user_api="blas"):
        results = [bench(name, config, args.repeats) for name, config in configs().items()]
    for r in results:
        print(f"{r['model']:>9}: cycle ours {r['ours_cycle_ms']:8.1f} ms, transformers {r['hf_cycle_ms']:8.1f} ms "
              f"(x{r['cycle_ratio_hf_over_ours']}); tower ours {r['ours_tower_ms']:7.1f} ms, transformers "
              f"{r['hf_tower_ms']:7.1f} ms (x{r['tower_ratio_hf_over_ours']}); bins agree {r['bins_agree']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": args.threads, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
