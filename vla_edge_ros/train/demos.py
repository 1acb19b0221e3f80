"""Demonstrations from the scripted expert, and the frame subsets the decoder is trained on.

An episode is driven by the expert's command plus temporally correlated noise (an Ornstein-Uhlenbeck
process), and every frame is labelled with the clean expert command for the state it shows: the
policy then sees states off the expert's straight line and learns how to come back (DART, Laskey
et al. 2017). A chunked head's label is the world's ``CueReachEnv.expert_chunk`` for that state: for each
of the next H ticks the expert's command then, for the robot going on at the velocity it moves at now (the
noise-free expert, the walls, the chase goal's path and the cue-reach hold all in it; why not the expert's
own plan: its docstring). One formula labels the demonstrations, the perception views and the DAgger
episodes (``PlanarLabeller``), and its first action is the expert's command, the label of a head of one action.
It is defined past an episode's end (the world goes on), so no label is masked: a demonstration stops
recording at success, the expert's chunk does not.

Half the episodes also take one *excursion*: for a few frames after the release the robot is driven in a
random direction at full speed (past the goal, into a wall), still labelled with the expert's command.
Small noise alone never shows such states, and the policy trained on it, having overshot a goal near a
wall, kept driving into the wall: its frame history said "moving that way" and nothing in the data said
otherwise. Frames are stored at the model's image size, resized exactly as the engine resizes.

A training sequence is a subset of an episode's frames in their order, re-numbered contiguously as
the engine's compaction re-numbers what a memory policy kept: all of them (an unbounded cache), a
suffix (a sliding window: fifo), or the first frames plus a suffix (a memory that kept the start and
forgot the middle: cosine, dms). In ``cue-reach`` a suffix that lost the cue leaves the label
unknowable from the sequence; the model learns what a memory-less policy can do there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..model.config import StateConfig
from ..model.vision import resize_frame
from ..worlds.sim.world import ODOMETRY, CueReachEnv, TaskSpec
from .wording import FIXED, Wording

DEMO_SCHEMA = "vla_edge_ros.demo/2"  # what a saved demonstration's .npz holds; part of a parallel run's identity
NOISE_SIGMA = 0.3       # stationary std of the OU command noise, per component
NOISE_THETA = 0.2       # OU mean reversion per step (~5 steps of correlation at 30 Hz)
DEMO_FRAMES = 100       # frames recorded at most, release included (the expert needs ~25 after the release)
EXCURSION_PROB = 0.5    # share of episodes with one excursion
EXCURSION_START = 20    # it starts within this many frames after the release
EXCURSION_FRAMES = (6, 24)  # and lasts this many frames (inclusive range)


@dataclass(frozen=True)
class Demo:
    """One demonstration: frames at the model's image size and the expert's command for each."""

    task: str
    frames: np.ndarray     # [F, S, S, 3] uint8
    chunks: np.ndarray     # [F, H, dof] float32 in [-1, 1]: the expert's chunk for each frame (``expert_chunk``;
                           # Meta-World's: ``arm_demos.py``)
    where: np.ndarray      # [F, 4] float32: robot (x, y) and goal (x, y) in world units, privileged (Meta-World:
                           # the object's and the goal's)
    cue_frames: int        # leading frames that show the cue (every frame in reach)
    success: bool
    states: np.ndarray     # [F, 6] float32: the robot's odometry at each frame (``CueReachEnv.odometry``; the arm's
                           # [F, 4] x, y, z, gripper)
    prompt: tuple[int, ...]  # the ids every sequence of the episode starts with (``wording.py``)

    @property
    def commands(self) -> np.ndarray:
        """[F, dof]: the expert's command at each frame (each chunk's first action)."""
        return self.chunks[:, 0]


def excursion(rng: np.random.Generator, release: int) -> tuple[range, np.ndarray]:
    """The frames of an episode's excursion (empty for none) and its unit direction."""
    angle = rng.uniform(0, 2 * np.pi)
    direction = np.array([np.cos(angle), np.sin(angle)])
    if rng.random() >= EXCURSION_PROB:
        return range(0), direction
    start = release + int(rng.integers(EXCURSION_START))
    return range(start, start + int(rng.integers(EXCURSION_FRAMES[0], EXCURSION_FRAMES[1] + 1))), direction


def record_demo(spec: TaskSpec, seed: int, image_size: int, wording: Wording = FIXED,
                noise_sigma: float = NOISE_SIGMA, chunk: int = 1) -> Demo:
    """Run one expert episode with command noise and maybe an excursion, worded by ``wording``, each frame
    labelled with the expert's ``chunk`` actions; stop at success or after ``DEMO_FRAMES`` frames."""
    env = CueReachEnv(spec, seed)
    rng = np.random.default_rng([seed, 1])
    detour, direction = excursion(rng, spec.release_frames)
    prompt = wording.prompt(wording.instruction(env, np.random.default_rng([seed, 3])))
    frame = env.reset()
    noise = np.zeros(2)
    frames, chunks, where, states = [], [], [], []
    success = False
    for step in range(max(DEMO_FRAMES, spec.release_frames + 1)):
        frames.append(resize_frame(frame, image_size))
        label = env.expert_chunk(chunk)
        command = label[0]
        chunks.append(label)
        where.append(np.concatenate([env.robot, env.targets[env.goal]]))
        states.append(env.odometry())
        noise += -NOISE_THETA * noise + noise_sigma * np.sqrt(2 * NOISE_THETA) * rng.standard_normal(2)
        outcome = env.step(direction if step in detour else command + noise)
        frame = outcome.frame
        if outcome.done:
            success = outcome.success
            break
    return Demo(spec.name, np.stack(frames), np.asarray(chunks, np.float32), np.asarray(where, np.float32),
                cue_frames(spec, len(frames)), success, np.stack(states), prompt)


def odometry_statistics(spec: TaskSpec) -> StateConfig:
    """``vla.state``'s normalisation of the world's odometry, from its geometry: a position uniform on [0, 1],
    each velocity component uniform within +-max_speed, heading and turn rate always 0 (left at mean 0, std 1)."""
    speed = float(spec.max_speed / np.sqrt(3.0))
    half = float(np.sqrt(1 / 12))
    return StateConfig(len(ODOMETRY), (0.5, 0.5, 0.0, 0.0, 0.0, 0.0), (half, half, 1.0, speed, speed, 1.0))


def cue_frames(spec: TaskSpec, count: int) -> int:
    """``Demo.cue_frames`` of an episode of ``spec`` with ``count`` frames."""
    return spec.frames(spec.cue_s) if spec.name == "cue-reach" else count


def demo_seed(seed: int, episode: int) -> int:
    """The world's seed of a phase's ``episode``-th demonstration, disjoint from evaluation's (which start at 0):
    ``seed * 1_000_003 + 10**6 + episode``."""
    return seed * 1_000_003 + 10**6 + episode


def record_demos(specs: list[TaskSpec], episodes: int, seed: int, image_size: int, wording: Wording = FIXED,
                 chunk: int = 1) -> list[Demo]:
    """``episodes`` demonstrations, tasks alternating, episode seeds ``demo_seed``; each frame labelled with a
    chunk of ``chunk`` actions."""
    return [record_demo(specs[i % len(specs)], demo_seed(seed, i), image_size, wording, chunk=chunk)
            for i in range(episodes)]


@dataclass(frozen=True)
class PlanarEpisode:
    """One episode of the 2-D world the policy drives in the dagger stage (a parallel unit's spec): its task, layout
    and the prompt ids it is told, as a demonstration of that seed is worded."""

    task: str
    seed: int
    image_size: int
    chunk: int
    prompt: tuple[int, ...]

    @property
    def key(self) -> str:
        """File-name safe and unique within a collection: the task and the seed."""
        return f"{self.task}-{self.seed}"


class PlanarLabeller:
    """Labels the frames of an episode someone else drives (the policy, in the dagger stage) as ``record_demo``
    labels a demonstration's: ``see(env, frame)`` as each frame is seen records it at the model's size with the
    expert's chunk for the state it shows, where the robot and the goal are, and the odometry; ``demo`` hands
    them over with the episode's prompt."""

    def __init__(self, episode: PlanarEpisode) -> None:
        self.episode = episode
        self._frames: list[np.ndarray] = []
        self._chunks: list[np.ndarray] = []
        self._where: list[np.ndarray] = []
        self._states: list[np.ndarray] = []

    def see(self, env: CueReachEnv, frame: np.ndarray) -> None:
        self._frames.append(resize_frame(frame, self.episode.image_size))
        self._chunks.append(env.expert_chunk(self.episode.chunk))
        self._where.append(np.concatenate([env.robot, env.targets[env.goal]]))
        self._states.append(env.odometry())

    def demo(self, success: bool) -> Demo:
        """What was seen (at least the first frame)."""
        spec = TaskSpec(name=self.episode.task)
        return Demo(spec.name, np.stack(self._frames), np.asarray(self._chunks, np.float32),
                    np.asarray(self._where, np.float32), cue_frames(spec, len(self._frames)), success,
                    np.stack(self._states), self.episode.prompt)


def planar_identity(episodes: list[PlanarEpisode]) -> str:
    """What the units of ``episodes`` depend on besides their keys, for ``Job.identity``: the schema and every
    episode's settings and prompt, so that an episode told other words is never resumed."""
    return json.dumps([DEMO_SCHEMA, [asdict(episode) for episode in episodes]])


def save_demo(demo: Demo, path: Path) -> None:
    """``demo`` as a compressed .npz (a parallel unit's result file), written whole or not at all."""
    temporary = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(temporary, schema=DEMO_SCHEMA, task=demo.task, frames=demo.frames, chunks=demo.chunks,
                        where=demo.where, cue_frames=demo.cue_frames, states=demo.states, success=demo.success,
                        prompt=np.asarray(demo.prompt, np.int64))
    temporary.replace(path)


def load_demo(path: Path) -> Demo:
    """A demonstration ``save_demo`` wrote; ValueError for a file of another kind."""
    with np.load(path) as stored:
        if str(stored["schema"]) != DEMO_SCHEMA:
            raise ValueError(f"{path}: not a demonstration of this version ({DEMO_SCHEMA})")
        return Demo(str(stored["task"]), stored["frames"], stored["chunks"], stored["where"],
                    int(stored["cue_frames"]), bool(stored["success"]), stored["states"],
                    tuple(int(i) for i in stored["prompt"]))


@dataclass(frozen=True)
class Views:
    """Single frames of one layout that show what to do, as ``perception_samples`` makes them."""

    frames: np.ndarray    # [count, S, S, 3] uint8
    chunks: np.ndarray    # [count, H, 2] the expert's chunk for each (``Demo.chunks``)
    where: np.ndarray     # [count, 4] robot and goal position, as ``Demo.where``
    states: np.ndarray    # [count, 6] odometry: where the robot stands, and a velocity it might have
    prompt: tuple[int, ...]

    @property
    def commands(self) -> np.ndarray:
        """[count, 2]: the expert's command for each view (each chunk's first action)."""
        return self.chunks[:, 0]


def perception_samples(seed: int, image_size: int, count: int, task: str = "reach", wording: Wording = FIXED,
                       chunk: int = 1) -> Views:
    """``count`` views of one fresh layout of ``task`` (``reach`` and ``chase``: the goal marked; ``lang-reach``:
    the instruction names it), the robot anywhere: endless layouts, so the encoder learns where things are,
    not which floor it saw (several views per layout because building a layout costs ~5x rendering a view).
    The robot may stand anywhere the world lets it, up against a wall too (half of it out of view), where an
    overshoot leaves it; its velocity is drawn within the world's speed. The expert's command does not depend
    on it, so a model learns not to steer by it; the rest of a chunk does (the robot goes on as it moves), and
    only a model with the state token (``TrainSpec.state``) can read it from a single view.

    In ``chase`` each view also puts the goal somewhere on its path (a time drawn within the time limit): one
    frame shows where the goal is, never where it is going, so from a view alone a chase chunk, which leads
    the goal, is known only on average over the goal's directions (what a model trained on views alone does:
    heads for the goal's neighbourhood). The direction is in the frame history (``bc``'s sequences: the goal
    moves 0.0083 a frame at 30 Hz, half a pixel of a 64-pixel view); the state token gives the robot's own
    velocity, never the goal's."""
    env = CueReachEnv(TaskSpec(name=task), seed)
    rng = np.random.default_rng([seed, 2])
    positions = rng.uniform(0.0, 1.0, size=(count, 2))
    velocities = rng.uniform(-1.0, 1.0, size=(count, 2)) * env.spec.max_speed
    # drawn after the other tasks' draws, so their views are as they were
    ticks = rng.integers(0, env.spec.frames(env.spec.time_limit_s), size=count) if task == "chase" else None
    prompt = wording.prompt(wording.instruction(env, np.random.default_rng([seed, 3])))
    frames, chunks, states, goals = [], [], [], []
    for k, (position, velocity) in enumerate(zip(positions, velocities)):
        if ticks is not None:
            env.set_step(int(ticks[k]))
        frames.append(resize_frame(env.place_robot(position, velocity), image_size))
        chunks.append(env.expert_chunk(chunk))
        states.append(env.odometry())
        goals.append(env.targets[env.goal].copy())
    where = np.concatenate([positions, np.stack(goals)], axis=1)
    return Views(np.stack(frames), np.asarray(chunks, np.float32), where.astype(np.float32), np.stack(states),
                 prompt)


def whole_episode(demo: Demo, rng: np.random.Generator, max_frames: int, max_stride: int = 1) -> np.ndarray:
    """Indices of a whole episode's frames from its first (the cue), every k-th, k drawn in [1, ``max_stride``]
    (no draw at 1), at most ``max_frames``: the frames a runtime that stores one a cycle holds."""
    step = int(rng.integers(1, max_stride + 1)) if max_stride > 1 else 1
    return np.arange(0, len(demo.frames), step)[:max_frames]


def sample_frames(demo: Demo, rng: np.random.Generator, max_frames: int, max_stride: int = 1) -> np.ndarray:
    """Indices of the frames one training sequence keeps (see the module doc), at most ``max_frames``, every k-th
    of them counted back from the last, k drawn in [1, ``max_stride``] (no draw at 1)."""
    count = len(demo.frames)
    kind = rng.choice(3, p=(0.5, 0.25, 0.25))
    if kind == 1 and count > 1:  # sliding window
        index = np.arange(rng.integers(1, count), count)
    elif kind == 2 and count > 2:  # the start and the recent past (a piece of an episode may hold no cue frame)
        head = int(rng.integers(1, min(max(demo.cue_frames, 1), count - 2) + 1))
        index = np.concatenate([np.arange(head), np.arange(rng.integers(head + 1, count), count)])
    else:
        index = np.arange(count)
    if max_stride > 1:
        index = index[::-1][::int(rng.integers(1, max_stride + 1))][::-1]
    return index[-max_frames:] if index.size > max_frames else index
