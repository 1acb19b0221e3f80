"""The Meta-World arm as a world of ``vla-edge evaluate``: what an episode is, what the runtime is told, and how
its commands move the arm.

The loop is evaluate's own (``evaluate.drive_episode``); this module gives it the arm as the 2-D world's adapter
gives it the disc robot. What goes in is what a robot's camera, state topic and instruction give the runtime:

- frames of ``ArmTask.camera`` (corner2 by default, upright) at ``width`` x ``height``;
- the 4-D state (x, y, z, gripper) as a sensor_msgs/JointState naming those four joints, stamped as its frame,
  through the live state path (``state_type`` joint_state; set here, nothing by hand);
- the task's description (``worlds.metaworld.DESCRIPTIONS``) as ``reasoning.instruction``.

What comes out is what the action publisher sends as a Float32MultiArray: the 4-D action (dx, dy, dz, grip),
which the arm clips to [-1, 1] as Meta-World does. A safe stop is the zero array: the hand's target stays
where it is and the gripper gets no effort.

Rate. One command per environment step, 80 a second (12.5 ms of simulated time): LeRobot's Meta-World
protocol (its environment config: fps 80, one policy action per ``env.step``, no action repeat), so
``action_publisher.control_rate_hz`` is set to 80 and a chunk's actions are one step apart. An episode ends at
success or at ``max_steps`` (Meta-World's limit, 500, by default; the step limit LeRobot's environment
reports too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import ObservationKnobs, Settings
from ..model.config import ModelConfig
from ..runtime.observation import require_one_camera
from ..runtime.robot_state import joint_state_message
from ..worlds.metaworld import ACTION, MT10, STATE, ArmSpec, MetaWorldEnv, TASKS
from ..worlds.metaworld.spec import MAX_PATH_LENGTH

ARM_RATE_HZ = 80.0  # Meta-World's step: 5 physics steps of 2.5 ms; ``ArmWorld`` checks the environment agrees
PREFIX = "metaworld/"  # --task metaworld/<name>-v3
MT10_TASK = "mt10"  # --task mt10: the ten tasks of ``MT10``
ARM_STATE_TOPIC = "arm/state"  # where the simulated arm's JointState would come from, when the config names none
CAMERA_RATE_HZ = 20.0  # the arm's camera, live (run --sim) and in evaluate: a frame every 4th step (nodes/sim_arm.py)


def camera_period_steps(camera_rate_hz: float) -> int:
    """Steps between the live arm's frames at ``camera_rate_hz``; ValueError for a rate that is not 80 Hz over a
    whole number (each frame is seen right after a step, with that step's state)."""
    steps = ARM_RATE_HZ / camera_rate_hz if camera_rate_hz > 0 else 0.0
    if steps < 1 or abs(steps - round(steps)) > 1e-9:
        raise ValueError(f"the simulated arm's camera rate must be {ARM_RATE_HZ:g} Hz over a whole number of steps "
                         f"(80, 40, 20, 16, 10 ...), got {camera_rate_hz:g} Hz")
    return round(steps)


@dataclass(frozen=True)
class ArmTask:
    """One Meta-World task as evaluate runs it: the task, the camera that sees it, its frames, its step limit."""

    task: str = "push-v3"
    camera: str = "corner2"
    width: int = 96
    height: int = 96
    max_steps: int = MAX_PATH_LENGTH
    goal_shown_s: float | None = None  # the goal marker drawn for the first seconds only (a memory test)

    @property
    def name(self) -> str:
        """How the command line and the report name it: ``metaworld/push-v3``."""
        return PREFIX + self.task

    @property
    def rate_hz(self) -> float:
        """Control ticks (environment steps) per simulated second."""
        return ARM_RATE_HZ

    @property
    def arm(self) -> ArmSpec:
        return ArmSpec(task=self.task, camera=self.camera, width=self.width, height=self.height,
                       max_steps=self.max_steps, goal_shown_s=self.goal_shown_s)

    @property
    def description(self) -> str:
        """The instruction the policy is given."""
        return self.arm.description

    def validate(self) -> None:
        """ValueError naming the first bad field (without importing MuJoCo)."""
        self.arm.validate()


def is_arm_task(name: str) -> bool:
    """Whether ``--task name`` is a Meta-World one (``mt10`` or ``metaworld/<task>``)."""
    return name == MT10_TASK or name.startswith(PREFIX)


def arm_tasks(name: str, *, max_steps: int = MAX_PATH_LENGTH, goal_shown_s: float | None = None) -> list[ArmTask]:
    """The tasks ``--task name`` stands for, each checked; ValueError naming the known ones for another name."""
    if name == MT10_TASK:
        tasks = [ArmTask(task, max_steps=max_steps, goal_shown_s=goal_shown_s) for task in MT10]
    elif name.startswith(PREFIX) and name.removeprefix(PREFIX) in TASKS:
        tasks = [ArmTask(name.removeprefix(PREFIX), max_steps=max_steps, goal_shown_s=goal_shown_s)]
    else:
        raise ValueError(f"unknown task {name!r}: Meta-World's are {MT10_TASK} (its ten tasks) or {PREFIX}<task>, "
                         f"one of {', '.join(TASKS)}")
    for task in tasks:
        task.validate()
    return tasks


def arm_observation(settings: Settings, config: ModelConfig, task: ArmTask, what: str) -> Settings:
    """``settings`` with what the arm gives ``what`` (evaluate): its camera, its 4-D state as a JointState of the
    joints x, y, z, gripper when the checkpoint reads a state, the task's description as the instruction, its
    action as a Float32MultiArray at the arm's step rate. ValueError, one line, for a checkpoint that cannot
    drive the arm: an action of another size than 4, a state of another size than 4, more cameras."""
    model = settings["reasoning"]["model_dir"]
    if config.action.dof != len(ACTION):
        raise ValueError(f"{model} acts in {config.action.dof} values (vla.action.dof), and the Meta-World arm takes "
                         f"{len(ACTION)} ({', '.join(ACTION)}): {what} cannot drive it with this checkpoint")
    if config.cameras != 1:
        raise ValueError(f"{model} reads {config.cameras} cameras (vla.cameras), and {what} gives the arm's one "
                         f"({task.camera})")
    if config.state is not None and config.state.dim != len(STATE):
        raise ValueError(f"{model} reads a robot state of {config.state.dim} values (vla.state), and the Meta-World "
                         f"arm's state is {len(STATE)} ({', '.join(STATE)}): {what} cannot feed it")
    settings = settings.replace("reasoning", {"instruction": task.description})
    settings = settings.replace("action_publisher", {"command_type": "float32_multi_array",
                                                     "control_rate_hz": task.rate_hz})
    if config.state is None:
        settings = settings.replace("camera_subscriber", {"state_topic": ""})
        require_one_camera(settings, what)
        return settings
    knobs = ObservationKnobs.of(settings["camera_subscriber"])
    if knobs.extra_image_topics:
        raise ValueError(f"{settings.source}: camera_subscriber: {what} feeds the arm's one camera and its state, and "
                         f"this configuration's observation has {knobs.cameras} cameras (extra_image_topics)")
    return settings.replace("camera_subscriber", {
        "state_topic": knobs.state_topic or ARM_STATE_TOPIC, "state_type": "joint_state",
        "state_joint_names": list(STATE), "state_joint_velocities": False})


def arm_command(values: Sequence[float]) -> np.ndarray:
    """A published Float32MultiArray's values as the arm's action; an empty one (the action publisher's stop before
    any action, when it does not know the action's size yet) is the zero action."""
    return np.zeros(len(ACTION), dtype=np.float32) if not len(values) else np.asarray(values, dtype=np.float32)


@dataclass(frozen=True)
class ArmStep:
    """What one step did, in the terms the closed loop reads (as the 2-D world's ``StepResult``)."""

    frame: np.ndarray | None  # None between the camera's frames
    time_s: float
    path_length: float  # metres the end effector travelled since reset
    done: bool
    success: bool


class ArmWorld:
    """The episode of ``seed`` on ``env`` (reused across episodes: ``reset`` poses this seed's layout), its camera
    rendering after every ``camera_every``-th step (and on reset): the loop observes nothing in between, as the
    live arm's camera publishes nothing in between."""

    def __init__(self, env: MetaWorldEnv, seed: int, camera_every: int = 1) -> None:
        if env.rate_hz != ARM_RATE_HZ:
            raise ValueError(f"the Meta-World environment steps at {env.rate_hz} Hz, not the {ARM_RATE_HZ} Hz "
                             "evaluate plans its control ticks on")
        self.env, self.seed = env, seed
        self.rate_hz = ARM_RATE_HZ
        self.ticks = env.spec.max_steps
        self._path = 0.0
        self.camera_every, self._steps = camera_every, 0

    def reset(self) -> np.ndarray:
        """The seed's first frame."""
        self._path, self._steps = 0.0, 0
        return self.env.reset(self.seed)

    def expert(self) -> np.ndarray:
        """The scripted expert's action now (it reads the privileged observation; the policy never does)."""
        return self.env.expert_action()

    def command(self, values: tuple[float, ...]) -> np.ndarray:
        return arm_command(values)

    def step(self, command: np.ndarray) -> ArmStep:
        before = self.env.state[:3]
        self._steps += 1
        outcome = self.env.step(command, render=self._steps % self.camera_every == 0)
        self._path += float(np.linalg.norm(outcome.state[:3] - before))
        return ArmStep(outcome.frame, outcome.time_s, self._path, outcome.done, outcome.success)

    def state_message(self) -> object:
        """The arm's state as a JointState of x, y, z, gripper (``robot_state.JointStateReader`` reads it)."""
        return joint_state_message(STATE, self.env.state)
