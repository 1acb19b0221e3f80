"""Engine speed on CPU: ours (numpy backend) against HuggingFace transformers (torch, CPU) in one run.

Two workloads, each measured for both engines from the same cache state (a pinned prompt plus a few
earlier frames), in alternating blocks so that machine noise hits both alike:

- frame cycle: prefill one frame's ``tokens_per_frame`` embeddings, then the action: a ``bins`` head
  greedily decodes the ``dof`` bin tokens (logits over the 256 bin ids only, for both engines), a
  ``linear`` head (the shipped ``models/sim``) is tanh(W h + b) on the last hidden state; the cache is
  rolled back after each cycle. Frame encoding is excluded: it is the same NumPy code for both.
- single-token decode: one token through the decoder plus the full-vocabulary lm_head and argmax.

Models: the ``tiny`` default and a 4-layer slice of the Qwen2.5-1.5B shape (random weights, bf16 on
disk, fp32 compute in both engines), then each ``--model DIR`` (default: the shipped, trained models/sim).
transformers runs its eager attention (plain PyTorch operations, the baseline our targets are stated
against). One thread by default on both sides (BLAS, the compiled kernels, torch),
as the runtime runs. Prints medians and the ratio HF / ours (> 1 means we are faster).

    python bench/bench_model.py [--repeats 30] [--presets tiny 1.5b-slice] [--model DIR ...] [--threads 1]
                                [--json bench/results/bench_model.json]
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
from threadpoolctl import threadpool_limits
from transformers import DynamicCache, Qwen2ForCausalLM

from vla_edge_ros.cpu_kernels import set_threads
from vla_edge_ros.model.action_head import ActionHead
from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.model.numpy_backend import NumpyBackend
from vla_edge_ros.model.vision import FrameEncoder
from vla_edge_ros.worlds.synthetic import SyntheticCamera

PROMPT_TOKENS = 32
CONTEXT_FRAMES = 4
ROUNDS = 3
SHIPPED = Path(__file__).resolve().parents[1] / "models" / "sim"
PRESET_MODELS = {"tiny": ("tiny", None), "1.5b-slice": ("qwen2.5-1.5b-shape", 4)}  # name: (preset, layers)


class Ours:
    """The numpy backend over an arena holding prompt + context frames."""

    def __init__(self, checkpoint, prompt: np.ndarray, context: list[np.ndarray]) -> None:
        c = checkpoint.config
        capacity = PROMPT_TOKENS + (CONTEXT_FRAMES + 1) * c.vision.tokens_per_frame + 2 * c.action.dof
        self.backend = NumpyBackend(checkpoint, KVArena(capacity))
        self.bins = slice(c.vocab_size - 256, c.vocab_size)
        self.first_bin = c.vocab_size - 256
        self._append(token_ids=prompt)
        for frame in context:
            self._append(embeddings=frame)
        self.base_used = self.backend.arena.used

    def _append(self, **tokens) -> np.ndarray:
        arena = self.backend.arena
        count = len(next(iter(tokens.values())))
        start = arena.next_position()
        positions = np.arange(start, start + count, dtype=np.int32)
        return self.backend.forward(positions, arena.allocate(count), **tokens).hidden[-1]

    def _rollback(self) -> None:
        arena = self.backend.arena
        arena.release(arena.slots_in_order()[self.base_used:])

    def linear_cycle(self, frame: np.ndarray, head: ActionHead) -> np.ndarray:
        """A linear head's frame cycle: prefill the frame, the action off its last hidden state."""
        action = head.from_hidden(self._append(embeddings=frame))
        self._rollback()
        return action

    def cycle(self, frame: np.ndarray, dof: int) -> list[int]:
        bins = [self.backend.greedy(self._append(embeddings=frame), self.bins)]
        for _ in range(dof - 1):
            hidden = self._append(token_ids=np.array([self.first_bin + bins[-1]]))
            bins.append(self.backend.greedy(hidden, self.bins))
        self._rollback()
        return bins

    def decode(self, token: int) -> int:
        token = self.backend.greedy(self._append(token_ids=np.array([token])))
        self._rollback()
        return token


class Reference:
    """transformers' Qwen2 with a DynamicCache cropped back after each measurement."""

    def __init__(self, model_dir: Path, prompt: np.ndarray, context: list[np.ndarray]) -> None:
        self.model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                      attn_implementation="eager").eval()
        vocab = self.model.config.vocab_size
        self.bin_weight = self.model.lm_head.weight[vocab - 256:].detach()
        self.first_bin = vocab - 256
        self.cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            self._run(input_ids=torch.from_numpy(prompt[None].astype(np.int64)))
            for frame in context:
                self._run(inputs_embeds=torch.from_numpy(frame[None]))
        self.base_len = self.cache.get_seq_length()

    def _run(self, **inputs) -> torch.Tensor:
        return self.model.model(**inputs, cache=self.cache, use_cache=True).last_hidden_state[0, -1]

    def linear_cycle(self, frame: np.ndarray, head: ActionHead) -> np.ndarray:
        """A linear head's frame cycle: prefill, then tanh(W h + b) on the last hidden state, in torch."""
        with torch.no_grad():
            hidden = self._run(inputs_embeds=torch.from_numpy(frame[None]))
            action = head.unnormalize(torch.tanh(torch.from_numpy(head.weight) @ hidden
                                                 + torch.from_numpy(head.bias)).numpy())
        self.cache.crop(self.base_len - self.cache.get_seq_length())
        return action

    def cycle(self, frame: np.ndarray, dof: int) -> list[int]:
        with torch.no_grad():
            bins = [int(torch.argmax(self.bin_weight @ self._run(inputs_embeds=torch.from_numpy(frame[None]))))]
            for _ in range(dof - 1):
                hidden = self._run(input_ids=torch.tensor([[self.first_bin + bins[-1]]]))
                bins.append(int(torch.argmax(self.bin_weight @ hidden)))
        self.cache.crop(self.base_len - self.cache.get_seq_length())
        return bins

    def decode(self, token: int) -> int:
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([[token]]), cache=self.cache, use_cache=True, logits_to_keep=1)
            token = int(torch.argmax(out.logits[0, -1]))
        self.cache.crop(self.base_len - self.cache.get_seq_length())
        return token


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench_model(name: str, model_dir: Path, repeats: int) -> dict:
    checkpoint = load_checkpoint(model_dir)
    config = checkpoint.config
    encoder = FrameEncoder.from_checkpoint(checkpoint)
    camera = SyntheticCamera(seed=0)
    context = [encoder.encode(camera.frame()) for _ in range(CONTEXT_FRAMES)]
    prompt = np.random.default_rng(0).integers(0, config.vocab_size - 256, PROMPT_TOKENS).astype(np.int32)
    ours, reference = Ours(checkpoint, prompt, context), Reference(model_dir, prompt, context)
    frame = encoder.encode(camera.frame())
    dof = config.action.dof
    if config.action.head == "linear":
        head = ActionHead(config.action, config.vocab_size, checkpoint.float32("action_head.weight"),
                          checkpoint.float32("action_head.bias"))
        ours_cycle, hf_cycle = (lambda: ours.linear_cycle(frame, head)), (lambda: reference.linear_cycle(frame, head))
        agree = bool(np.allclose(ours_cycle(), hf_cycle(), atol=1e-4))  # also warms both up
    else:
        ours_cycle, hf_cycle = (lambda: ours.cycle(frame, dof)), (lambda: reference.cycle(frame, dof))
        agree = ours_cycle() == hf_cycle()  # also warms both up
    ours.decode(7), reference.decode(7)
    runs = {"ours_cycle": ours_cycle, "hf_cycle": hf_cycle,
            "ours_decode": lambda: ours.decode(7), "hf_decode": lambda: reference.decode(7)}
    timings: dict[str, list[float]] = {key: [] for key in runs}
    # Blocks, not call-by-call interleaving: torch's OpenMP workers spin after each call and would
    # steal both cores from OpenBLAS (and the reverse). Rounds of blocks still spread drift over both.
    for _ in range(ROUNDS):
        for key, run in runs.items():
            run()  # first call after the other library ran absorbs its spinning threads
            for _ in range(max(1, repeats // ROUNDS)):
                start = time.perf_counter()
                run()
                timings[key].append(time.perf_counter() - start)
    medians = {key: _median_ms(values) for key, values in timings.items()}
    return {
        "model": name, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
        "context_tokens": PROMPT_TOKENS + CONTEXT_FRAMES * config.vision.tokens_per_frame,
        "tokens_per_frame": config.vision.tokens_per_frame, "head": config.action.head, "dof": dof,
        "same_action": agree,
        **{f"{key}_ms": value for key, value in medians.items()},
        "cycle_ratio_hf_over_ours": medians["hf_cycle"] / medians["ours_cycle"],
        "decode_ratio_hf_over_ours": medians["hf_decode"] / medians["ours_decode"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--presets", nargs="*", choices=sorted(PRESET_MODELS), default=list(PRESET_MODELS),
                        help="random-weight models to measure (default: all; none: only --model)")
    parser.add_argument("--model", type=Path, nargs="*", default=[SHIPPED], metavar="DIR",
                        help="checkpoints to measure after the presets (default: the shipped models/sim; none: no "
                             "checkpoint)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS, compiled-kernel and torch threads")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_threads(args.threads)
    print(f"torch {torch.__version__}, numpy {np.__version__}; {args.threads} thread(s) each (BLAS, kernels, torch)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(limits=args.threads, user_api="blas"):
        models = [(name, write_random_model(Path(tmp) / name, preset(*PRESET_MODELS[name]), seed=0))
                  for name in args.presets]
        models += [("models/sim" if path == SHIPPED else str(path), path) for path in args.model]
        for name, model_dir in models:
            rows.append(bench_model(name, model_dir, args.repeats))
            _print_row(rows[-1])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": args.threads, "results": rows}, indent=2) + "\n")


def _print_row(r: dict) -> None:
    action = f"{r['dof']} bin tokens" if r["head"] == "bins" else f"a linear head ({r['dof']} values)"
    print(f"\n{r['model']}: {r['layers']} layers, hidden {r['hidden']}, context {r['context_tokens']} tokens, "
          f"frame {r['tokens_per_frame']} tokens + {action}; same action: {r['same_action']}")
    print(f"  {'':20} {'ours (numpy)':>14} {'HF (torch CPU)':>15} {'HF / ours':>10}")
    for label, key in (("frame cycle", "cycle"), ("single-token decode", "decode")):
        print(f"  {label:20} {r[f'ours_{key}_ms']:11.2f} ms {r[f'hf_{key}_ms']:12.2f} ms "
              f"{r[f'{key}_ratio_hf_over_ours']:9.2f}x")


if __name__ == "__main__":
    main()
