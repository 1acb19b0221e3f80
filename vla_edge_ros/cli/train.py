"""``vla-edge train --recipe FILE --out DIR``: fit the simulator policy and its learned memory gates, phase by
phase as the recipe file says (``train/recipe.py``), and write an HF checkpoint.

Every knob that decides the weights is in the recipe, so the file and train_log.json say how a checkpoint was
made. The flags are only how this machine runs it: where to write, torch's threads, progress bars, and
``--scale`` for a smoke run of a recipe (the log records the scaled steps).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..dependencies import missing
from .args import count


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--scale must be in (0, 1], got {text!r}")
    return value


def cmd_train(args: argparse.Namespace) -> int:
    from ..train.recipe import load_recipe

    recipe = load_recipe(args.recipe)  # before torch loads: a bad file is refused at once
    if args.scale < 1:
        recipe = recipe.scaled(args.scale)

    try:
        import torch
    except ModuleNotFoundError:
        raise missing("train", "training") from None
    from tqdm import tqdm

    from ..train.trainer import train_recipe

    if args.threads:
        torch.set_num_threads(args.threads)
    bars: dict[str, tqdm] = {}

    def progress(stage: str, step: int, steps: int, figures: dict[str, float]) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=steps, desc=stage, file=sys.stderr, leave=True, disable=args.quiet,
                                     mininterval=1.0)
        bar.set_postfix({k: f"{v:.4f}" for k, v in figures.items()}, refresh=False)
        bar.update(1)
        if step + 1 == steps:
            bar.close()

    logs = train_recipe(recipe, args.out, progress)
    phases = ", ".join(f"{log.name} {sum(log.seconds.values()):.0f} s" for log in logs)
    print(f"wrote {args.out} (config.json, model.safetensors, train_log.json); {phases}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the 2-D simulator policy (decoder, aura memory, dms gates) on CPU, "
                                     "as a recipe file says")
    p.add_argument("--recipe", type=Path, required=True,
                   help="recipe file: its phases, each a seed, stages and their knobs (models/sim/recipe.yaml "
                        "made the shipped model)")
    p.add_argument("--out", type=Path, required=True,
                   help="output model directory (HF format); every phase but the last writes under OUT/phases")
    p.add_argument("--scale", type=_fraction, default=1.0,
                   help="fraction of every phase's steps and demonstrations (a quick smoke run: 0.02)")
    p.add_argument("--threads", type=count, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)
