"""``vla-edge train``: fit the simulator policy and its learned memory gates, write an HF checkpoint."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from .args import count, learning_rate


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--scale must be in (0, 1], got {text!r}")
    return value


def _stages(text: str) -> tuple[str, ...]:
    from ..train.trainer import STAGES

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--stages: expected names from {','.join(STAGES)}, got {text!r}")
    return names


def cmd_train(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ..train.trainer import TrainSpec, train

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = TrainSpec(seed=args.seed, aura_train_decoder=args.aura_train_decoder or args.aura_cue_writes,
                     aura_cue_writes=args.aura_cue_writes, aura_memory_goal=1.0 if args.aura_memory_goal else 0.0,
                     aura_memory_warmup=args.aura_memory_warmup, aura_dagger_episodes=args.aura_dagger,
                     stages=args.stages,
                     init_from=None if args.init_from is None else str(args.init_from))
    if args.aura_decoder_lr is not None:
        spec = replace(spec, aura_decoder_lr=args.aura_decoder_lr)
    if args.scale < 1:
        spec = spec.scaled(args.scale)
    if args.aura_steps is not None:
        spec = replace(spec, aura=replace(spec.aura, steps=args.aura_steps))
    bars: dict[str, tqdm] = {}

    def progress(stage: str, step: int, steps: int, figures: dict[str, float]) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=steps, desc=f"{stage:>4}", file=sys.stderr, leave=True,
                                     disable=args.quiet, mininterval=1.0)
        bar.set_postfix({k: f"{v:.4f}" for k, v in figures.items()}, refresh=False)
        bar.update(1)
        if step + 1 == steps:
            bar.close()

    log = train(spec, args.out, progress)
    stages = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in log.seconds.items())
    print(f"wrote {args.out} (config.json, model.safetensors, train_log.json, loss.png); {stages}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the 2-D simulator policy (decoder, aura memory, dms gates) on CPU")
    p.add_argument("--out", type=Path, required=True, help="output model directory (HF format)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=_fraction, default=1.0,
                   help="fraction of the default steps and demonstrations (a quick smoke run: 0.02)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--aura-train-decoder", action="store_true",
                   help="train the decoder with the aura memory (measured alone: it did not make aura use its memory "
                        "and lowered fifo's success; see --aura-cue-writes)")
    p.add_argument("--aura-cue-writes", action="store_true",
                   help="privileged write labels where the cue appears: forced writes for the first half of the aura "
                        "stage, then the gate decides (BCE toward the labels annealed away); implies "
                        "--aura-train-decoder")
    p.add_argument("--aura-memory-goal", action="store_true",
                   help="also regress the goal's position from aura's memory token (a training-only head)")
    p.add_argument("--aura-memory-warmup", type=lambda text: count(text, minimum=0), default=0, metavar="N",
                   help="with --aura-cue-writes: steps of the memory alone on that goal regression first (models/sim's "
                        "last command: 1000, with --aura-memory-goal --aura-steps 1000 --aura-decoder-lr 3e-4)")
    p.add_argument("--aura-decoder-lr", type=learning_rate, default=None,
                   help="with --aura-train-decoder: the decoder's learning rate in the aura stage (default 1e-3)")
    p.add_argument("--aura-dagger", type=lambda text: count(text, minimum=0), default=0, metavar="N",
                   help="DAgger in the aura stage: 4 times (the first at its start) the policy drives N fresh episodes "
                        "itself, labelled by the expert; half of each aura batch comes from them (N >= the batch's "
                        "half, 4; models/sim's last command: 64)")
    p.add_argument("--aura-steps", type=count, default=None, help="steps of the aura stage (after --scale)")
    p.add_argument("--from", dest="init_from", type=Path, default=None,
                   help="start from this checkpoint's weights (e.g. models/sim with --stages aura)")
    p.add_argument("--stages", type=_stages, default=("perception", "bc", "aura", "dms"),
                   help="comma-separated stages to run, in the recipe's order (default: perception,bc,aura,dms)")
    p.set_defaults(func=cmd_train)
