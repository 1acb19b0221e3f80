"""A world driven by a checkpoint's policy exactly as ``vla-edge evaluate`` drives it, with a look at the world as
the policy goes: how ``vla-edge train`` collects the policy's own episodes for DAgger (the dagger stage with fifo,
the aura stage with the aura memory).

Nothing here labels or trains: ``drive_arm`` and ``drive_planar`` run one episode of ``evaluate.drive_episode``
(the same frame buffer, gate, virtual clock, memory policy, action timeline and camera rate as an evaluation's
episode) and show the world to a callback: the arm before each of its steps, the 2-D world with each frame it
shows. The command line hands them the trainer's labellers (``train/arm_demos.PlanLabeller``,
``train/demos.PlanarLabeller``), which record what a demonstration records there. Why the runtime and not the
torch model: the states worth labelling are those the policy reaches as it is deployed, chunks executed by the
timeline after the cycle's latency, its memory the engine's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import Settings
from ..runtime.block_costs import CostModel
from ..runtime.loader import load_model
from ..runtime.observation import simulated_robot_observation
from ..worlds.metaworld import MetaWorldEnv
from ..worlds.metaworld.spec import MAX_PATH_LENGTH
from ..worlds.sim.world import CueReachEnv, TaskSpec
from .arm_world import CAMERA_RATE_HZ, ArmStep, ArmTask, ArmWorld, arm_observation, camera_period_steps
from .evaluate import (EvalContext, Episode, EpisodeSpec, aura_budget_frames, drive_episode, episode_start,
                       longest_prompt, run_episode)

ROLLOUT_POLICIES = ("fifo", "aura")
FIFO_BUDGET = 16  # evaluate's Meta-World row (cli/evaluate.py: ARM_POLICIES, ARM_BUDGETS)


@dataclass(frozen=True)
class PolicyDrive:
    """What every worker needs to drive any task (picklable): the configuration, whose ``reasoning.model_dir`` is
    the checkpoint, the cost model its cycles are charged, the steps an arm's episode may take, the longest
    prompt a 2-D episode is told (its memory's arena holds it), and the memory policy: ``fifo`` at
    ``FIFO_BUDGET`` frames, or ``aura`` (its learned gate) at the budget evaluate runs it at."""

    settings: Settings
    costs: CostModel
    max_steps: int = MAX_PATH_LENGTH
    prompt_tokens: int = 0
    policy: str = "fifo"

    def __post_init__(self) -> None:
        if self.policy not in ROLLOUT_POLICIES:
            raise ValueError(f"the policy's episodes are driven with {' or '.join(ROLLOUT_POLICIES)}, not "
                             f"{self.policy!r}")


class WatchedArmWorld(ArmWorld):
    """``ArmWorld`` calling ``before_step(env)`` before each step, the arm as the step finds it."""

    def __init__(self, env: MetaWorldEnv, seed: int, camera_every: int,
                 before_step: Callable[[MetaWorldEnv], None]) -> None:
        super().__init__(env, seed, camera_every)
        self.before_step = before_step

    def step(self, command: Any) -> ArmStep:
        self.before_step(self.env)
        return super().step(command)


def prepare_drive(drive: PolicyDrive) -> dict[str, Any]:
    """A worker's state: the checkpoint, loaded once, the row its episodes run as, and per task (on first use) its
    evaluation context, engines and environment."""
    checkpoint = load_model(drive.settings)
    budget = aura_budget_frames(checkpoint) if drive.policy == "aura" else FIFO_BUDGET
    return {"drive": drive, "checkpoint": checkpoint, "row": (drive.policy, budget), "tasks": {}}


def drive_arm(state: dict[str, Any], task: str, seed: int, before_step: Callable[[MetaWorldEnv], None],
              goal_shown_s: float | None = None) -> Episode:
    """One episode of ``task`` from ``seed``'s layout, the policy driving (the drive's memory policy, the configured
    execution), ``before_step`` seeing the arm before every step; ``goal_shown_s``: the goal marker drawn for the
    first seconds only, as ``evaluate --goal-shown-s`` draws it."""
    key = (task, goal_shown_s)
    if key not in state["tasks"]:
        drive, checkpoint = state["drive"], state["checkpoint"]
        spec = ArmTask(task, max_steps=drive.max_steps, goal_shown_s=goal_shown_s)
        settings = arm_observation(drive.settings, checkpoint.config, spec, "the dagger stage")
        context = EvalContext(settings, spec, drive.costs, None, (), longest_prompt(settings, checkpoint, spec, ()))
        state["tasks"][key] = {"context": context, "checkpoint": checkpoint, "engines": {}, "instructor": None,
                               "arm": MetaWorldEnv(spec.arm, 0)}
    cell = state["tasks"][key]
    world = WatchedArmWorld(cell["arm"], seed, camera_period_steps(CAMERA_RATE_HZ), before_step)
    return drive_episode(world, seed, episode_start(cell, EpisodeSpec(*state["row"], seed))())


def drive_planar(state: dict[str, Any], task: str, seed: int, prompt: tuple[int, ...],
                 see: Callable[[CueReachEnv, np.ndarray], None]) -> Episode:
    """One episode of the 2-D world's ``task`` from ``seed``'s layout, told ``prompt`` (ids), the policy driving
    (the drive's memory policy, the configured execution), ``see(env, frame)`` called with each frame as the robot
    shows it."""
    if task not in state["tasks"]:
        drive, checkpoint = state["drive"], state["checkpoint"]
        spec = TaskSpec(name=task)
        settings = simulated_robot_observation(drive.settings, checkpoint.config.state, "the dagger stage")
        prompt_tokens = max(longest_prompt(settings, checkpoint, spec, ()), drive.prompt_tokens)
        context = EvalContext(settings, spec, drive.costs, None, (), prompt_tokens)
        state["tasks"][task] = {"context": context, "checkpoint": checkpoint, "engines": {}, "instructor": None}
    env = CueReachEnv(TaskSpec(name=task), seed)
    start = episode_start(state["tasks"][task], EpisodeSpec(*state["row"], seed))
    return run_episode(env, seed, start(np.asarray(prompt, np.int64)), record=lambda _now, frame, _expert: see(env, frame))
