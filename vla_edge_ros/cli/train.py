"""``vla-edge train --recipe FILE --out DIR``: fit the simulator policy and its learned memory gates, phase by
phase as the recipe file says (``train/recipe.py``), and write an HF checkpoint.

Every knob that decides the weights is in the recipe, so the file and train_log.json say how a checkpoint was
made. The flags are only how this machine runs it: where to write, torch's threads, progress bars,
``--scale`` for a smoke run of a recipe (the log records the scaled steps), and ``--workers`` / ``--ray`` /
``--resume`` for Meta-World's demonstrations, recorded as units of ``tools/parallel.py`` (one episode each,
saved under ``OUT/demos``): rendering is most of their cost, and the units are independent.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..dependencies import missing
from ..tools.parallel import Job, UnitsFailed, Unit, progress_bar, run_units
from .args import add_parallel_arguments, count

if TYPE_CHECKING:  # the trainer's modules load at run time, after the recipe is checked
    from ..train.arm_demos import ArmEpisode
    from ..train.demos import Demo

DEMOS_DIR = "demos"  # under --out: Meta-World's demonstrations, one .npz an episode (what --resume keeps)


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

    logs = train_recipe(recipe, args.out, progress, _arm_recording(args))
    phases = ", ".join(f"{log.name} {sum(log.seconds.values()):.0f} s" for log in logs)
    print(f"wrote {args.out} (config.json, model.safetensors, train_log.json); {phases}")
    return 0


def _arm_recording(args: argparse.Namespace) -> Callable[[str, list[ArmEpisode]], list[Demo]]:
    """How the phases' Meta-World demonstrations are recorded: as units (``tools/parallel.py``) on ``--workers``
    processes or ``--ray``, each episode saved to ``OUT/demos/<phase>-<task>-<seed>.npz`` and loaded back in
    order; with ``--resume`` the episodes an earlier run of the same settings left are kept."""
    from ..train.arm_demos import episodes_identity, load_demo, record_unit, unit_recorder

    directory = args.out / DEMOS_DIR

    def record(phase: str, episodes: list[ArmEpisode]) -> list[Demo]:
        keys = [f"{phase}-{episode.key}" for episode in episodes]
        units = [Unit(key, (key, episode)) for key, episode in zip(keys, episodes)]
        identity = hashlib.sha256(episodes_identity(episodes).encode()).hexdigest()
        job = Job(unit_recorder, record_unit, str(directory), identity)
        bar = (lambda done, total: None) if args.quiet else progress_bar(f"{phase} demonstrations")
        summary = run_units(job, units, args.out, workers=args.workers, ray_address=args.ray, resume=args.resume,
                            progress=bar)
        if summary.failed:
            key, why = next(iter(summary.failed.items()))
            raise UnitsFailed(f"{len(summary.failed)} of {len(units)} demonstrations failed (first: {key}: {why}); "
                              f"--resume records only those")
        return [load_demo(directory / summary.results[unit.key]["file"]) for unit in units]

    return record


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy on CPU as a recipe file says: the 2-D simulator's (decoder, aura "
                                     "memory, dms gates) or Meta-World's arm")
    p.add_argument("--recipe", type=Path, required=True,
                   help="recipe file: its phases, each a seed, stages and their knobs (models/sim/recipe.yaml "
                        "made the shipped model)")
    p.add_argument("--out", type=Path, required=True,
                   help="output model directory (HF format); every phase but the last writes under OUT/phases")
    p.add_argument("--scale", type=_fraction, default=1.0,
                   help="fraction of every phase's steps and demonstrations (a quick smoke run: 0.02)")
    p.add_argument("--threads", type=count, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_parallel_arguments(p)
    p.set_defaults(func=cmd_train)
