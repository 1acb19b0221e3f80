"""``vla-edge train --recipe FILE --out DIR``: fit the simulator policy and its learned memory gates, phase by
phase as the recipe file says (``train/recipe.py``), and write an HF checkpoint.

Every knob that decides the weights is in the recipe, so the file and train_log.json say how a checkpoint was
made. The flags are only how this machine runs it: where to write, torch's threads, progress bars,
``--scale`` for a smoke run of a recipe (the log records the scaled steps), and ``--workers`` / ``--ray`` /
``--resume`` for Meta-World's demonstrations and DAgger's episodes (the dagger and aura stages'), recorded as units of
``tools/parallel.py`` (one episode each, saved under ``OUT/demos``): rendering and the runtime's cycles are most
of their cost, and the units are independent. DAgger's episodes are driven by the runtime
(``tools/policy_rollouts.py``) and labelled by the trainer's ``PlanLabeller`` (the arm) or ``PlanarLabeller`` (the
2-D world): this module is where the two meet. ``--resume`` also keeps the phases an earlier run into ``--out``
finished (``trainer.finished_phases``).
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
    from ..tools.policy_rollouts import PolicyDrive
    from ..train.arm_demos import ArmEpisode
    from ..train.demos import Demo, PlanarEpisode
    from ..train.spec import DaggerSpec, TrainSpec

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
    from ..config import load_settings
    from ..train.recipe import load_recipe

    recipe = load_recipe(args.recipe)  # before torch loads: a bad file is refused at once
    for phase in recipe.phases:  # so is the configuration DAgger drives under, not hours later
        if phase.spec.drives_policy:
            load_settings(phase.spec.dagger.config)
        _check_goal_markers(phase.spec)
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

    logs = train_recipe(recipe, args.out, progress, _arm_recording(args), _rollouts(args), resume=args.resume)
    phases = ", ".join(f"{log['name']} {sum(log['seconds'].values()):.0f} s" for log in logs)
    print(f"wrote {args.out} (config.json, model.safetensors, train_log.json); {phases}")
    return 0


def _check_goal_markers(spec: TrainSpec) -> None:
    """A phase that hides the arm's goal marker (``metaworld.goal_shown_s``) needs tasks that draw one."""
    from ..train.spec import METAWORLD

    if spec.world != METAWORLD:
        return
    from ..worlds.metaworld import ArmSpec, check_goal_marker

    for task in spec.tasks:
        check_goal_marker(ArmSpec(task=task, goal_shown_s=spec.metaworld.goal_shown_s))


def _arm_recording(args: argparse.Namespace) -> Callable[[str, list[ArmEpisode]], list[Demo]]:
    """How the phases' Meta-World demonstrations are recorded: as units (``tools/parallel.py``) on ``--workers``
    processes or ``--ray``, each episode saved to ``OUT/demos/<phase>-<task>-<seed>.npz`` and loaded back in
    order; with ``--resume`` the episodes an earlier run of the same settings left are kept."""
    from ..train.arm_demos import episodes_identity, record_unit, unit_recorder

    directory = args.out / DEMOS_DIR

    def record(phase: str, episodes: list[ArmEpisode]) -> list[Demo]:
        identity = hashlib.sha256(episodes_identity(episodes).encode()).hexdigest()
        job = Job(unit_recorder, record_unit, str(directory), identity)
        return _episode_units(args, job, phase, episodes, "demonstrations")

    return record


def _episode_units(args: argparse.Namespace, job: Job, name: str, episodes: list[ArmEpisode] | list[PlanarEpisode],
                   what: str) -> list[Demo]:
    """Each of ``episodes`` as a unit of ``job`` (on ``--workers`` processes or ``--ray``, ``--resume`` keeping those
    an earlier run of the same job left), saved as ``OUT/demos/<name>-<task>-<seed>.npz`` and loaded back in order;
    any failure is one line."""
    from ..train.demos import load_demo

    keys = [f"{name}-{episode.key}" for episode in episodes]
    units = [Unit(key, (key, episode)) for key, episode in zip(keys, episodes)]
    bar = (lambda done, total: None) if args.quiet else progress_bar(f"{name} {what}")
    summary = run_units(job, units, args.out, workers=args.workers, ray_address=args.ray, resume=args.resume,
                        progress=bar)
    if summary.failed:
        key, why = next(iter(summary.failed.items()))
        raise UnitsFailed(f"{len(summary.failed)} of {len(units)} {what} failed (first: {key}: {why}); "
                          f"--resume runs only those")
    return [load_demo(args.out / DEMOS_DIR / summary.results[unit.key]["file"]) for unit in units]


def _rollouts(args: argparse.Namespace
              ) -> Callable[[str, Path, list[ArmEpisode] | list[PlanarEpisode], DaggerSpec, str], list[Demo]]:
    """How DAgger's episodes (the dagger stage's, the aura stage's) are collected: units as the demonstrations are,
    each the runtime driving the world with the collection's checkpoint and memory policy
    (``tools/policy_rollouts.py``) while the world's labeller labels what the policy visits, saved to
    ``OUT/demos/<phase>-<stage><round>-<task>-<seed>.npz``. A unit resumes only for the same episodes, checkpoint
    bytes, configuration, cost model and memory policy."""
    from ..config import load_settings
    from ..runtime.block_costs import parse_cost
    from ..tools.policy_rollouts import PolicyDrive
    from ..train.arm_demos import episodes_identity
    from ..train.demos import PlanarEpisode, planar_identity

    directory = args.out / DEMOS_DIR

    def collect(name: str, checkpoint: Path, episodes: list[ArmEpisode] | list[PlanarEpisode],
                spec: DaggerSpec, policy: str) -> list[Demo]:
        settings = load_settings(spec.config).replace("reasoning", {"model_dir": str(checkpoint)})
        planar = isinstance(episodes[0], PlanarEpisode)
        longest = max(len(episode.prompt) for episode in episodes) if planar else 0
        drive = PolicyDrive(settings, parse_cost(spec.cost), spec.max_steps, longest, policy)
        weights = hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
        described = planar_identity(episodes) if planar else episodes_identity(episodes)
        identity = hashlib.sha256(f"{described} {weights} {settings.values} {spec.cost} "
                                  f"{spec.max_steps} {policy}".encode()).hexdigest()
        job = Job(rollout_driver, rollout_unit, (drive, str(directory)), identity)
        return _episode_units(args, job, name, episodes, f"{policy} episodes")

    return collect


def rollout_driver(context: tuple[PolicyDrive, str]) -> tuple[dict, Path]:
    """A worker's state (``Job.prepare``) for the dagger stage's units: the policy, loaded once, and where the
    episodes go."""
    from ..tools.policy_rollouts import prepare_drive

    drive, directory = context
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return prepare_drive(drive), path


def rollout_unit(state: tuple[dict, Path], spec: tuple[str, ArmEpisode | PlanarEpisode]) -> dict:
    """One unit (``Job.work``): the policy drives the episode, what it visits labelled as a demonstration is, saved
    as ``<key>.npz``; the result names the file and sums it up."""
    from ..tools.policy_rollouts import drive_arm, drive_planar
    from ..train.arm_demos import PlanLabeller
    from ..train.demos import PlanarEpisode, PlanarLabeller, save_demo

    drive, directory = state
    key, episode = spec
    if isinstance(episode, PlanarEpisode):
        labeller = PlanarLabeller(episode)
        outcome = drive_planar(drive, episode.task, episode.seed, episode.prompt, labeller.see)
    else:
        labeller = PlanLabeller(episode)
        outcome = drive_arm(drive, episode.task, episode.seed, labeller.see, episode.goal_shown_s)
    demo = labeller.demo(outcome.success)
    name = f"{key}.npz"
    save_demo(demo, directory / name)
    return {"file": name, "frames": len(demo.frames), "success": demo.success}


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
