"""GPU timing: our Numba-CUDA backend against torch eager (HF transformers) and the HBM floor.

Workload: a random Qwen2.5-1.5B-shaped model (bf16 weights), prefill 64 tokens, then greedily decode
8 tokens one at a time. Both engines run the same ids on the same GPU in the same process; each is
timed after a warm-up run (our first run also JIT-compiles the kernels), with device synchronisation
around every measurement. The floor is what a decode step cannot beat: every weight byte streamed
once from HBM at the card's peak bandwidth.

    python bench/bench_gpu.py [--layers 28] [--repeats 5] [--bandwidth-tbs 4.8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from numba import cuda
from transformers import DynamicCache, Qwen2ForCausalLM

from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.cuda_backend import CudaBackend
from vla_edge_ros.model.init_model import preset, write_random_model

PREFILL, DECODE = 64, 8


def run_ours(backend: CudaBackend, ids: np.ndarray) -> tuple[float, list[float], list[int]]:
    """(prefill seconds, per-step decode seconds, generated ids) from an empty arena."""
    backend.arena.release(np.arange(backend.arena.capacity))
    cuda.synchronize()
    start = time.perf_counter()
    hidden = backend.forward(np.arange(ids.size, dtype=np.int32), np.arange(ids.size, dtype=np.int32), token_ids=ids).hidden
    token = backend.greedy(hidden[-1])
    cuda.synchronize()
    prefill = time.perf_counter() - start
    steps, tokens = [], [token]
    for i in range(DECODE):
        position = np.array([ids.size + i], dtype=np.int32)
        start = time.perf_counter()
        hidden = backend.forward(position, position, token_ids=np.array([tokens[-1]])).hidden
        tokens.append(backend.greedy(hidden[-1]))
        cuda.synchronize()
        steps.append(time.perf_counter() - start)
    return prefill, steps, tokens


def run_torch(model: Qwen2ForCausalLM, ids: np.ndarray) -> tuple[float, list[float], list[int]]:
    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    with torch.no_grad():
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model(input_ids=torch.from_numpy(ids[None].astype(np.int64)).to(device), cache=cache,
                       use_cache=True, logits_to_keep=1).logits
        token = int(torch.argmax(logits[0, -1]))
        torch.cuda.synchronize()
        prefill = time.perf_counter() - start
        steps, tokens = [], [token]
        for _ in range(DECODE):
            start = time.perf_counter()
            logits = model(input_ids=torch.tensor([[tokens[-1]]], device=device), cache=cache, use_cache=True).logits
            tokens.append(int(torch.argmax(logits[0, -1])))
            torch.cuda.synchronize()
            steps.append(time.perf_counter() - start)
    return prefill, steps, tokens


def summarize(runs: list[tuple[float, list[float], list[int]]]) -> tuple[float, float]:
    """Median prefill ms and median per-token decode ms over the timed runs."""
    return (statistics.median(r[0] for r in runs) * 1e3,
            statistics.median(s for r in runs for s in r[1]) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM peak (H200: 4.8 TB/s)")
    args = parser.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model(Path(tmp) / "m", preset("qwen2.5-1.5b-shape", args.layers), dtype="bfloat16")
        checkpoint = load_checkpoint(model_dir)
        c = checkpoint.config
        ids = np.random.default_rng(0).integers(0, c.vocab_size, PREFILL).astype(np.int32)

        backend = CudaBackend(checkpoint, KVArena(PREFILL + DECODE + 1))
        run_ours(backend, ids)  # JIT-compiles every kernel specialisation
        ours = [run_ours(backend, ids) for _ in range(args.repeats)]
        weight_bytes, kv_bytes = backend.state_bytes()
        del backend

        model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda().eval()
        run_torch(model, ids)
        reference = [run_torch(model, ids) for _ in range(args.repeats)]

    ours_prefill, ours_step = summarize(ours)
    ref_prefill, ref_step = summarize(reference)
    floor_ms = weight_bytes / (args.bandwidth_tbs * 1e12) * 1e3
    print(f"model: {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}; "
          f"weights on device {weight_bytes / 1e9:.2f} GB (bf16), KV arena {kv_bytes / 1e6:.1f} MB (fp32)")
    print(f"same greedy tokens: {ours[-1][2] == reference[-1][2]} (ours {ours[-1][2]}, torch {reference[-1][2]})")
    print(f"{'':24}{'ours (numba)':>14}{'torch eager':>14}{'torch / ours':>14}")
    print(f"{'prefill 64 tokens':24}{ours_prefill:11.2f} ms{ref_prefill:11.2f} ms{ref_prefill / ours_prefill:13.2f}x")
    print(f"{'decode, per token':24}{ours_step:11.3f} ms{ref_step:11.3f} ms{ref_step / ours_step:13.2f}x")
    print(f"HBM floor per decode token: {floor_ms:.3f} ms at {args.bandwidth_tbs} TB/s; "
          f"ours at {floor_ms / ours_step * 100:.1f}% of it, torch at {floor_ms / ref_step * 100:.1f}%")


if __name__ == "__main__":
    main()
