"""Demonstrations of Meta-World's scripted experts, for a ``world: metaworld`` phase.

An episode is the wheel's scripted expert solving one task from one seed's layout, recorded as the runtime will
see the arm under ``vla-edge evaluate``: each step's frame from ``MetaWorldSpec.camera`` at evaluation's size
(``ArmSpec``'s 96 x 96), resized to the model's as the engine resizes it, and the arm's 4-D state (x, y, z,
gripper). The instruction is the task's description (the trainer words it: ``wording.arm_corpus``).

The label of every frame is the expert's *plan*: its next H actions, each executed from where the one before
left the arm (``MetaWorldEnv.expert_plan``). Action 0 is the expert's action for the frame's state. On the
expert's own path (``noise`` 0) the plan is what the episode goes on to execute, so it is read off the episode
(and its last frames' from H - 1 steps the expert runs past the recorded end, unrendered); with ``noise`` the
arm is driven by the expert's action plus correlated noise on the displacement (an Ornstein-Uhlenbeck process,
the 2-D world's DART), and each frame's plan is computed from the state it shows, the episode then put back as
it was. The gripper's effort gets no noise: the experts command it fully open or closed.

``where`` (privileged, for the training-only ``where_head``) is the object's and the goal's (x, y), mapped
from the table to about [0, 1]. With ``MetaWorldSpec.goal_shown_s`` (the memory variant) the goal marker is drawn
in the frames of the first that many seconds only, as ``evaluate --goal-shown-s`` draws it; ``cue_frames`` counts
those frames, the cue the aura stage's writes are labelled on, as in the 2-D world's cue-reach. A demonstration
stops at success, or where the plan of its last frame would run past Meta-World's 500-step limit.

Rendering costs about 20 ms a frame on a CPU and the physics under 1 ms a step, so demonstrations are recorded
as units of ``tools/parallel.py`` where the command line runs them (``vla-edge train --workers``): a unit is one
episode (``ArmEpisode``), its result a compressed ``.npz`` file beside the run (``save_demo``); here they are
also recorded in this process, one after the other (``record_arm_demos``). An environment is kept per task and
reused, ``reset(seed)`` posing each layout, so a demonstration depends on its episode alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..model.config import StateConfig
from ..model.vision import resize_frame
from ..worlds.metaworld import STATE, ArmSpec, MetaWorldEnv
from ..worlds.metaworld.spec import MAX_PATH_LENGTH
from .demos import DEMO_SCHEMA, NOISE_THETA, Demo, demo_seed, save_demo
from .spec import TrainSpec

OBJECT, GOAL = slice(4, 6), slice(36, 38)  # the object's and the goal's (x, y) in the 39-value observation
TABLE_LOW, TABLE_SPAN = np.array([-0.5, 0.3]), np.array([1.0, 0.8])  # x, y (m) of the table -> about [0, 1]
MIN_STATE_STD = 1e-3  # a state value that hardly moves in the demonstrations is not blown up by its tiny std


@dataclass(frozen=True)
class ArmEpisode:
    """One demonstration to record: everything its frames, states and labels depend on (a parallel unit's spec)."""

    task: str
    seed: int
    camera: str = "corner2"
    image_size: int = 64
    chunk: int = 1
    noise: float = 0.0
    render: bool = True  # False (a blind model's): every frame is zeros, nothing is drawn
    goal_shown_s: float | None = None  # the goal marker drawn for the first seconds only (None: always)

    @property
    def key(self) -> str:
        """File-name safe and unique within a phase: the task and the seed."""
        return f"{self.task}-{self.seed}"


def arm_episodes(spec: TrainSpec) -> list[ArmEpisode]:
    """A phase's demonstrations: ``spec.episodes`` of them, the tasks alternating, seeds ``demos.demo_seed``."""
    return [arm_episode(spec, i, demo_seed(spec.seed, i), spec.metaworld.noise) for i in range(spec.episodes)]


def arm_episode(spec: TrainSpec, index: int, seed: int, noise: float, tasks: Sequence[str] = ()) -> ArmEpisode:
    """The ``index``-th episode of a phase (its task: ``tasks``, default the phase's, alternating) from ``seed``,
    recorded with the phase's camera, frame size, chunk, blindness and goal marker."""
    tasks = tasks or spec.tasks
    return ArmEpisode(task=tasks[index % len(tasks)], seed=seed, camera=spec.metaworld.camera,
                      image_size=spec.image_size, chunk=spec.chunk, noise=noise, render=not spec.blind,
                      goal_shown_s=spec.metaworld.goal_shown_s)


def arm_where(observation: np.ndarray) -> np.ndarray:
    """(object x, y, goal x, y) from the full observation, mapped from the table to about [0, 1]."""
    return np.concatenate([(observation[OBJECT] - TABLE_LOW) / TABLE_SPAN,
                           (observation[GOAL] - TABLE_LOW) / TABLE_SPAN]).astype(np.float32)


class ArmRecorder:
    """Records episodes, one Meta-World environment per (task, camera) kept open between them."""

    def __init__(self) -> None:
        self._envs: dict[tuple[str, str], MetaWorldEnv] = {}

    def record(self, episode: ArmEpisode) -> Demo:
        """The demonstration of ``episode`` (see the module doc); its prompt is left empty for the trainer."""
        env = self._env(episode)
        env.reset(episode.seed)
        rng = np.random.default_rng([episode.seed, 1])
        limit = MAX_PATH_LENGTH - episode.chunk + 1  # every recorded frame's plan stays within the step limit
        blank = np.zeros((episode.image_size, episode.image_size, 3), np.uint8)
        noise = np.zeros(3)
        frames, plans, executed, where, states = [], [], [], [], []
        shown = 0
        while len(frames) < limit:
            shown += env.goal_drawn
            frames.append(resize_frame(env.frame(), episode.image_size) if episode.render else blank)
            where.append(arm_where(env.observation))
            states.append(env.state.astype(np.float32))
            if episode.noise:
                plans.append(env.expert_plan(episode.chunk))
                command = plans[-1][0].astype(np.float64)
                noise += -NOISE_THETA * noise + episode.noise * np.sqrt(2 * NOISE_THETA) * rng.standard_normal(3)
                command[:3] += noise
            else:
                command = env.expert_action()
            executed.append(env.step(command, render=False).action)
            if env.success:
                break
        success = env.success
        if not episode.noise:  # the expert's own path: the plans are what it executed, and H - 1 steps more
            for _ in range(episode.chunk - 1):
                executed.append(env.step(env.expert_action(), render=False).action)
            plans = [executed[i:i + episode.chunk] for i in range(len(frames))]
        return Demo(episode.task, np.stack(frames), np.asarray(plans, np.float32), np.stack(where), shown,
                    success, np.stack(states), ())

    def _env(self, episode: ArmEpisode) -> MetaWorldEnv:
        key = (episode.task, episode.camera, episode.goal_shown_s)
        if key not in self._envs:
            spec = ArmSpec(task=episode.task, camera=episode.camera, goal_shown_s=episode.goal_shown_s)
            self._envs[key] = MetaWorldEnv(spec, episode.seed)
        return self._envs[key]

    def close(self) -> None:
        """Frees every environment's GL context and simulation."""
        for env in self._envs.values():
            env.close()
        self._envs.clear()


class PlanLabeller:
    """Labels the steps of an episode someone else drives (the policy, in the dagger stage) as a demonstration of
    ``episode``'s settings: ``see(env)`` before each step records what a demonstration records there (frame, state,
    where, the expert's plan from that state), ``demo`` hands it over. A step whose plan would run past the step
    limit is not recorded, as a demonstration stops short of it."""

    def __init__(self, episode: ArmEpisode) -> None:
        self.episode = episode
        self._blank = np.zeros((episode.image_size, episode.image_size, 3), np.uint8)
        self._frames: list[np.ndarray] = []
        self._shown = 0  # the frames that draw the goal marker
        self._plans: list[np.ndarray] = []
        self._where: list[np.ndarray] = []
        self._states: list[np.ndarray] = []

    def see(self, env: MetaWorldEnv) -> None:
        if env.steps + self.episode.chunk > env.spec.max_steps:  # ``record``'s limit: every action of the plan runs
            return
        self._shown += env.goal_drawn
        self._frames.append(resize_frame(env.frame(), self.episode.image_size) if self.episode.render else self._blank)
        self._where.append(arm_where(env.observation))
        self._states.append(env.state.astype(np.float32))
        self._plans.append(env.expert_plan(self.episode.chunk))

    def demo(self, success: bool) -> Demo:
        """What was seen (at least the first step), its prompt left empty for the trainer."""
        return Demo(self.episode.task, np.stack(self._frames), np.asarray(self._plans, np.float32),
                    np.stack(self._where), self._shown, success, np.stack(self._states), ())


def pieces(demo: Demo, window: int) -> list[Demo]:
    """``demo`` cut into consecutive pieces of at most ``window`` frames (``DaggerSpec.window``), each a demonstration
    of its own: bc samples a demonstration's sequences back from its last frame. A piece's ``cue_frames`` are those
    of the goal-drawing frames that fall in it."""
    cuts = [slice(i, i + window) for i in range(0, len(demo.frames), window)]
    return [replace(demo, frames=demo.frames[cut], chunks=demo.chunks[cut], where=demo.where[cut],
                    cue_frames=int(np.clip(demo.cue_frames - cut.start, 0, len(demo.frames[cut]))),
                    states=demo.states[cut]) for cut in cuts]


def record_arm_demos(phase: str, episodes: list[ArmEpisode]) -> list[Demo]:
    """Every episode in this process, in order (the trainer's default; ``vla-edge train`` runs them as units)."""
    recorder = ArmRecorder()
    try:
        return [recorder.record(episode) for episode in episodes]
    finally:
        recorder.close()


def arm_state_statistics(demos: Sequence[Demo]) -> StateConfig:
    """``vla.state``'s normalisation of the arm's state: the mean and std of every frame's state in ``demos``."""
    states = np.concatenate([demo.states for demo in demos]).astype(np.float64)
    std = np.maximum(states.std(axis=0), MIN_STATE_STD)
    return StateConfig(len(STATE), tuple(float(v) for v in states.mean(axis=0)), tuple(float(v) for v in std))


# --- demonstrations as units of tools/parallel.py ---------------------------------------------------------------


def unit_recorder(directory: str) -> tuple[ArmRecorder, Path]:
    """A worker's state (``Job.prepare``): its recorder and where the demonstrations go."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return ArmRecorder(), path


def record_unit(state: tuple[ArmRecorder, Path], spec: tuple[str, ArmEpisode]) -> dict[str, Any]:
    """One unit (``Job.work``) of spec (the unit's key, its episode): the episode recorded and saved as
    ``<key>.npz``; the result names the file and sums it up."""
    recorder, directory = state
    key, episode = spec
    demo = recorder.record(episode)
    name = f"{key}.npz"
    save_demo(demo, directory / name)
    return {"file": name, "frames": len(demo.frames), "success": demo.success}


def episodes_identity(episodes: list[ArmEpisode]) -> str:
    """What a unit's result depends on besides its key (task and seed), for ``Job.identity``: the schema and the
    recording settings, so that a demonstration recorded with other settings is never resumed."""
    settings = sorted({(e.camera, e.image_size, e.chunk, e.noise, e.render, e.goal_shown_s) for e in episodes},
                      key=repr)
    return json.dumps([DEMO_SCHEMA, settings])
