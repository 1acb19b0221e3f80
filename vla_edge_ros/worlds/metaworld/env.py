"""One Meta-World task as a seeded episode: frames, the arm's 4-D state, the 4-D action, success, the expert.

The interface is LeRobot's Meta-World protocol, so that figures measured here read like theirs:

- the state is the end-effector position (x, y, z in metres, world frame) and the gripper's opening
  (0 closed .. 1 open, the fingers' distance over 0.1 m, clipped), the first four values of the
  environment's own observation;
- the action is an end-effector displacement (x, y, z, each in [-1, 1]; 1 moves the hand's target 1 cm
  in one step) and a gripper effort in [-1, 1] (positive closes). It is clipped to [-1, 1] per value, as
  the environment clips the displacement and MuJoCo clamps the gripper's control; a NaN becomes 0 (as
  in the package's 2-D world) instead of poisoning the physics. ``StepOutcome.action`` is what ran;
- a step is 5 physics steps of 2.5 ms: 12.5 ms of simulated time, 80 steps a second;
- success is the environment's ``success`` info of the step; the episode is done at success or at
  ``spec.max_steps`` (Meta-World's limit is 500).

Seeds. An integer seed selects the object and goal positions: the environment draws them from its own
generator, which is seeded on every reset, so the same seed gives the same layout and the same first frame
in any process, and a reset replays the episode. The draw is the environment's (some tasks redraw until the
goal is far enough from the object), not ours, so every layout is one Meta-World itself would pose.

Goal marker. Where the task draws its goal (reach's red ball, push's green one: the scene's ``goal`` site),
``spec.goal_shown_s`` draws it only in the frames of the first that many seconds, as the 2-D world's cue-reach
shows its cue: a policy must then remember where the goal was. The site is only drawn, never simulated, so
hiding it changes no physics and no success.

Privileged state. ``observation`` is the environment's full 39-value vector (hand, gripper, object
positions and orientations, the previous step's, and the goal). The scripted expert reads it; a policy
under evaluation must not: it gets the frame, ``state`` and the description.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import load
from .camera import Camera
from .spec import ArmSpec

STATE = ("x", "y", "z", "gripper")  # ``state``'s order
ACTION = ("dx", "dy", "dz", "grip")  # an action's order
EXPERT_WARNING = r"Constant\(s\) may be too high"  # the experts' gains saturate by design; the env clips
GOAL_SITE = "goal"  # the scene's goal marker, a site drawn at the goal (transparent where a task hides it)


@dataclass(frozen=True)
class StepOutcome:
    frame: np.ndarray | None  # HxWx3 uint8 RGB, the camera's view after the step; None for step(render=False)
    state: np.ndarray         # (4,) float64: end-effector x, y, z (m) and gripper opening (0 closed .. 1 open)
    action: np.ndarray        # (4,) float32: the action as executed, clipped to [-1, 1]
    reward: float             # the environment's shaped reward (0 .. 10), for reference only
    success: bool             # the environment's success info of this step
    done: bool                # success, or the step limit reached
    steps: int                # steps taken since reset
    time_s: float             # simulated time since reset


def clip_action(action: Any) -> np.ndarray:
    """``action`` as the arm executes it: 4 float32 values in [-1, 1], a NaN as 0."""
    values = np.asarray(action, dtype=np.float64).reshape(-1)
    if values.shape != (len(ACTION),):
        raise ValueError(f"action: need {len(ACTION)} values {ACTION}, got shape {np.shape(action)}")
    return np.clip(np.nan_to_num(values, nan=0.0), -1.0, 1.0).astype(np.float32)


class MetaWorldEnv:
    """One seeded episode of ``spec``: ``reset`` replays it (or starts seed ``seed``), ``step`` advances it
    by one action. Owns an OSMesa context: ``close`` it, or use the environment as a context manager."""

    def __init__(self, spec: ArmSpec, seed: int) -> None:
        spec.validate()
        backend = load()
        self.spec = spec
        env_class = backend.environments[spec.task]
        self._env = env_class()  # no render mode: gymnasium's renderer stays unused, ``Camera`` draws
        # the task with the goal in the observation (the expert reads it there), the layout drawn on reset
        # from the environment's seeded generator instead of a fixed list of 50 layouts per task
        self._env.set_task(backend.task(spec.task, pickle.dumps({
            "env_cls": env_class, "rand_vec": None, "partially_observable": False})))
        self._env._freeze_rand_vec = False
        self._env.seeded_rand_vec = True
        self._expert = backend.experts[spec.task]()
        self._goal = self._goal_marker() if spec.goal_shown_s is not None else None
        self._camera = Camera(self._env.model, spec.camera, spec.height, spec.width)
        self.seed = seed
        self.reset(seed)

    @property
    def description(self) -> str:
        """The instruction a policy is given: a short sentence naming the goal, not the way."""
        return self.spec.description

    @property
    def rate_hz(self) -> float:
        """Steps per simulated second (80)."""
        return 1.0 / float(self._env.dt)

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def time_s(self) -> float:
        return self._steps / self.rate_hz

    @property
    def success(self) -> bool:
        """The environment's success info of the last step (False before the first)."""
        return self._success

    @property
    def done(self) -> bool:
        return self._success or self._steps >= self.spec.max_steps

    @property
    def state(self) -> np.ndarray:
        """(4,) float64: end-effector x, y, z (m) and gripper opening (0 closed .. 1 open)."""
        return self._observation[:len(STATE)].copy()

    @property
    def observation(self) -> np.ndarray:
        """The environment's full 39-value observation: privileged, for the expert and for analysis."""
        return self._observation.copy()

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start the episode of ``seed`` (default: this one's again); returns the first frame."""
        seed = self.seed if seed is None else seed
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed: need an int >= 0, got {seed!r}")
        self.seed = int(seed)
        self._env.seed(self.seed)  # the generator the layout is drawn from
        observation, _ = self._env.reset()
        self._observation = np.asarray(observation, dtype=np.float64)
        self._steps, self._success = 0, False
        return self.frame()

    @property
    def goal_drawn(self) -> bool:
        """Whether ``frame`` draws the goal marker now: always, or within the first ``goal_shown_s`` seconds."""
        return self.spec.goal_shown_s is None or self.time_s < self.spec.goal_shown_s

    def frame(self) -> np.ndarray:
        """The camera's view now: HxWx3 uint8 RGB, upright (without the goal marker after ``goal_shown_s``)."""
        if self._goal is not None:
            site, alpha = self._goal
            self._env.model.site_rgba[site, 3] = alpha if self.goal_drawn else 0.0
        return self._camera.frame(self._env.data)

    def _goal_marker(self) -> tuple[int, float]:
        """The goal site's index and its drawn opacity; ValueError for a task that draws no goal marker."""
        model, mujoco = self._env.model, load().mujoco
        site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, GOAL_SITE)
        if site < 0 or model.site_rgba[site, 3] <= 0:
            self._env.close()
            raise ValueError(f"goal_shown_s: {self.spec.task} draws no goal marker to hide")
        return site, float(model.site_rgba[site, 3])

    def raw_frame(self) -> np.ndarray:
        """The camera's view as MuJoCo renders it, not turned upright (for tests of ``frame``)."""
        return self._camera.raw(self._env.data)

    def step(self, action: Any, render: bool = True) -> StepOutcome:
        """Apply ``action`` (clipped, see ``clip_action``) for one step; the frame only when ``render``."""
        if self._steps >= self.spec.max_steps:
            raise RuntimeError(f"the episode ended at its limit of {self.spec.max_steps} steps: reset it")
        executed = clip_action(action)
        observation, reward, _, _, info = self._env.step(executed)
        self._observation = np.asarray(observation, dtype=np.float64)
        self._steps += 1
        self._success = bool(info["success"])
        return StepOutcome(frame=self.frame() if render else None, state=self.state, action=executed,
                           reward=float(reward), success=self._success, done=self.done, steps=self._steps,
                           time_s=self.time_s)

    def expert_action(self) -> np.ndarray:
        """The wheel's scripted expert's action for the current observation, clipped as ``step`` clips it
        (its gains saturate on purpose), so a demonstration records what ran. Changes nothing."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=EXPERT_WARNING)
            return clip_action(self._expert.get_action(self._observation))

    def expert_plan(self, steps: int) -> np.ndarray:
        """[steps, 4]: the expert's next ``steps`` actions, each executed from where the one before left the arm
        (no frames drawn), then the episode put back exactly as it was, so it goes on as if nothing ran. The label
        of a demonstration that strays from the expert's path (``train/arm_demos.py``): what the expert would do
        from the state visited. ValueError when the plan would step past ``spec.max_steps``."""
        if steps < 1 or self._steps + steps - 1 > self.spec.max_steps:
            raise ValueError(f"expert_plan: {steps} actions from step {self._steps} run past the episode's limit of "
                             f"{self.spec.max_steps} steps")
        saved = self._snapshot()
        try:
            plan = [self.expert_action()]
            for _ in range(steps - 1):
                self.step(plan[-1], render=False)
                plan.append(self.expert_action())
        finally:
            self._restore(saved)
        return np.stack(plan)

    def _snapshot(self) -> tuple[Any, ...]:
        """What a step changes: MuJoCo's integration state (positions, velocities, controls, mocap targets, warm
        start), the attributes Meta-World 3.1.1's ``step`` keeps between steps, and this wrapper's own."""
        env, mujoco = self._env, load().mujoco
        what = mujoco.mjtState.mjSTATE_INTEGRATION
        physics = np.empty(mujoco.mj_stateSize(env.model, what))
        mujoco.mj_getState(env.model, env.data, physics, what)
        kept = {name: getattr(env, name) for name in ("curr_path_length", "_prev_obs", "_last_stable_obs",
                                                      "_did_see_sim_exception")}
        return physics, kept, self._observation.copy(), self._steps, self._success

    def _restore(self, saved: tuple[Any, ...]) -> None:
        env, mujoco = self._env, load().mujoco
        physics, kept, self._observation, self._steps, self._success = saved
        mujoco.mj_setState(env.model, env.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(env.model, env.data)  # the derived quantities (site positions a frame draws) follow
        for name, value in kept.items():
            setattr(env, name, value)

    def close(self) -> None:
        """Frees the camera's GL context and the simulation."""
        self._camera.close()
        self._env.close()

    def __enter__(self) -> MetaWorldEnv:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def check_goal_marker(spec: ArmSpec) -> None:
    """Refuse, before anything is recorded or evaluated, a spec that hides the goal marker of a task that draws none
    (ValueError naming the task): only the task's scene tells, so it is opened once and closed."""
    if spec.goal_shown_s is not None:
        MetaWorldEnv(spec, 0).close()
