"""A tiny 2-D world with a task that needs memory (``cue-reach``), its no-memory control (``reach``), a
task that needs language (``lang-reach``) and one where latency matters (``chase``).

The world is the unit square [0, 1]^2 seen from above by a fixed camera (``render``): x runs right
along image columns, y runs down along image rows, so a command (vx, vy) is in image directions.
A robot (white disc) must drive onto the goal, one of K targets that all look alike.

- ``reach``: the goal wears a bright ring in every frame and the robot may move from the first step.
- ``cue-reach``: the ring is shown for the first ``cue_s`` only, and the robot is held still (commands
  ignored) from the start until ``cue_s + hold_s``. Holding it during the cue too matters: a robot
  that could already move toward the goal while it is marked would carry the answer in its own
  position, and the task would no longer need memory. During the hold the frames differ only by
  sensor noise.
- ``lang-reach``: the targets differ in colour (each a different one of ``render.COLOUR_NAMES``), nothing
  marks the goal, and the robot may move from the first step: only the instruction says which target to
  reach (``goal_colour`` names it; the harness words the instruction). A harness may reassign ``goal``
  mid-episode and tell the robot so.
- ``chase``: the goal moves. It wears the ring in every frame (as in ``reach``; the other targets stay put)
  and slides at a constant ``goal_speed * max_speed`` in a straight line, bouncing off the walls of the
  box [GOAL_WALL, 1 - GOAL_WALL]^2 (so its square and most of its ring stay in view); it starts where
  the layout put it, in a direction drawn from the seed. The robot is faster (``goal_speed`` < 1), so it
  can always catch it, but what it sees is old by the time it acts: at 0.5 x max_speed the goal moves
  0.075 (about one ``reach_radius``) in 300 ms. The direction is redrawn (``CHASE_TRIES``) until the
  goal's path within the time limit keeps more than 2 * ``reach_radius`` from the robot's start, so
  standing still never catches it. ``targets[goal]`` is where the goal is now; ``goal_position(step)``
  where it is at any step. The scripted expert leads the goal: it heads, at the constant velocity that
  gets there, for the first point of the goal's path that it can reach as soon as the goal does (an
  intercept). It leads rather than steering at where the goal is now because the goal's path is fixed:
  a lead stays right while it is late, so a chunk of the expert's commands remains a plan worth
  executing. Steering on frames 300 ms old (seeds 0-19, ``test_sim.py``), the lead catches the
  goal in 1.33 s against 1.05 s fresh, the wait for the first answer; pursuing the goal's position
  takes 1.93 s. The goal and the expert's path may pass over a look-alike, which ``touched_wrong`` then
  records (3 of the expert episodes of seeds 0-99).

Durations are whole frames: ``round(seconds * rate_hz)``. Commands are clipped per component to [-1, 1]
(NaN -> 0) and move the robot by ``command * max_speed / rate_hz`` per step; the robot stops at the
walls. An episode ends on success (robot centre within ``reach_radius`` of the goal's) or at
``time_limit_s``; touching a wrong target does not end it (a policy may recover), it is recorded in
``StepOutcome.touched_wrong``. ``odometry`` is the robot's state as a planar robot's odometry reports it
(position, and the velocity it moved at over the last step). ``expert_chunk`` (a chunked head's label)
and ``expert_plan`` give the expert's next commands without changing the episode. Everything (layout,
colours, floor, clutter, noise) follows from the seed: layout and noise come from two separate streams
spawned from it, and ``reset`` replays both. Every task draws the same layout from the layout stream;
what only one task needs (lang-reach's colours, chase's direction) is drawn after all of that, so adding
a task leaves the others' layouts and frames as they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import render

TASKS = ("reach", "cue-reach", "lang-reach", "chase")
PLACEMENT_MARGIN = 0.1     # targets and robot start this far from the walls, so all of them stay in view
PLACEMENT_TRIES = 10_000   # at the default reach_radius: K <= 5 fit (50 of 50 seeds), K = 6 in 36 of 50
EXPERT_GAIN = 10.0         # command per world unit of distance: saturated until 0.1 from the goal
ODOMETRY = ("x", "y", "yaw", "vx", "vy", "wz")  # ``odometry``'s order: runtime/robot_state.py reads an Odometry so
GOAL_WALL = 0.08           # chase: the goal's centre bounces inside [GOAL_WALL, 1 - GOAL_WALL]; the layout's
                           # pixel-snapped targets lie within [PLACEMENT_MARGIN - 1 px, 1 - PLACEMENT_MARGIN + 1 px]
CHASE_TRIES = 1_000        # directions drawn until the goal's path misses the robot's start (about 45 % do)


VELOCITY_COMMANDS = ("twist", "float32_multi_array")  # the command types whose values the robot can drive on


def velocity_command(values: tuple[float, ...]) -> np.ndarray:
    """(vx, vy) of a published command, as the simulated robot reads it: a Twist's linear.x and linear.y, or
    an array's first two values; fewer than two values (a safe stop before any action) is zero."""
    return np.array(values[:2], dtype=np.float64) if len(values) >= 2 else np.zeros(2)


@dataclass(frozen=True)
class TaskSpec:
    """One task's world and timing; the defaults are the ``cue-reach`` the evaluation uses."""

    name: str = "cue-reach"
    image_size: int = 96
    targets: int = 3
    rate_hz: float = 30.0
    cue_s: float = 0.3
    hold_s: float = 1.5
    time_limit_s: float = 8.0
    reach_radius: float = 0.08
    max_speed: float = 0.5
    noise_sigma: float = 4.0
    goal_speed: float = 0.5  # chase: the goal's speed as a fraction of max_speed (the robot must be faster)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.name not in TASKS:
            raise ValueError(f"name: unknown task {self.name!r}, expected one of {TASKS}")
        if not isinstance(self.image_size, (int, np.integer)) or self.image_size < 32:
            raise ValueError(f"image_size: need an int >= 32 (pixels per side), got {self.image_size!r}")
        if not isinstance(self.targets, (int, np.integer)) or self.targets < 2:
            raise ValueError(f"targets: need an int >= 2 (one goal and a look-alike), got {self.targets!r}")
        if self.name == "lang-reach" and self.targets > len(render.COLOUR_NAMES):
            raise ValueError(f"targets: lang-reach gives every target its own colour, of "
                             f"{len(render.COLOUR_NAMES)}; got {self.targets}")
        for field in ("rate_hz", "cue_s", "time_limit_s", "max_speed"):
            value = getattr(self, field)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{field}: need a finite value > 0, got {value!r}")
        if not math.isfinite(self.goal_speed) or not 0 <= self.goal_speed < 1:
            raise ValueError(f"goal_speed: need 0 <= goal_speed < 1 (a fraction of max_speed: the robot must be "
                             f"faster than the goal it chases), got {self.goal_speed!r}")
        for field in ("hold_s", "noise_sigma"):
            value = getattr(self, field)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{field}: need a finite value >= 0, got {value!r}")
        if not math.isfinite(self.reach_radius) or not 0 < self.reach_radius < 0.5:
            raise ValueError(f"reach_radius: need 0 < reach_radius < 0.5 (world units), got {self.reach_radius!r}")
        if self.frames(self.cue_s) < 1:
            raise ValueError(f"cue_s: {self.cue_s} s is less than one frame at {self.rate_hz} Hz")
        if self.name == "cue-reach" and self.frames(self.time_limit_s) <= self.release_frames:
            raise ValueError(f"time_limit_s: {self.time_limit_s} s leaves no time to move after "
                             f"cue_s + hold_s = {self.cue_s + self.hold_s} s")

    def frames(self, seconds: float) -> int:
        """A duration in whole simulator steps."""
        return round(seconds * self.rate_hz)

    @property
    def release_frames(self) -> int:
        """Steps during which commands are ignored: cue and hold in ``cue-reach``, none in ``reach``."""
        return self.frames(self.cue_s) + self.frames(self.hold_s) if self.name == "cue-reach" else 0


@dataclass(frozen=True)
class StepOutcome:
    frame: np.ndarray        # HxWx3 uint8 RGB, the camera view after the step
    done: bool               # success or time limit (a wrong target does not end the episode)
    success: bool            # robot centre within reach_radius of the goal's, at or before the time limit
    time_s: float            # simulated time since reset
    path_length: float       # distance the robot has moved since reset (world units)
    touched_wrong: bool      # the robot has come within reach_radius of a non-goal target since reset


class CueReachEnv:
    """One seeded episode of ``spec``; ``step`` advances it by one camera frame. ``goal`` is read
    afresh by every frame, the expert and the success test, so a harness may reassign it."""

    def __init__(self, spec: TaskSpec, seed: int) -> None:
        spec.validate()
        self.spec, self.seed = spec, seed
        layout_seed, self._noise_seed = np.random.SeedSequence(seed).spawn(2)
        rng = np.random.default_rng(layout_seed)
        self.start, self.targets = _layout(rng, spec)
        self.goal = int(rng.integers(spec.targets))
        self._plain = render.floor(rng, spec.image_size)
        colour = render.TARGET_COLOURS[rng.integers(len(render.TARGET_COLOURS))]
        # lang-reach draws its colours after everything the other tasks draw: their layouts stay as they were
        self.colours = (rng.permutation(len(render.COLOUR_NAMES))[:spec.targets] if spec.name == "lang-reach"
                        else None)  # each target's index in render.COLOUR_NAMES
        self._colour = colour if self.colours is None else render.TARGET_COLOURS[self.colours]
        self._cue_frames = spec.frames(spec.cue_s)
        self._limit_frames = spec.frames(spec.time_limit_s)
        self.layout = self.targets.copy()  # where the targets start; chase moves targets[goal] away from it
        # chase draws its direction after everything the other tasks draw, so their layouts stay as they were
        self.goal_velocity = _chase_velocity(rng, spec, self.start, self.layout[self.goal]) if spec.name == "chase" \
            else np.zeros(2)  # world units per second at the start; the walls flip its components
        if spec.name != "chase":  # a moving goal is painted where it is in each frame instead
            render.paint_targets(self._plain, self.targets, self._colour)
        self.reset()

    def reset(self) -> np.ndarray:
        """Restart the same episode (layout and noise sequence) and return its first frame."""
        self._noise = np.random.default_rng(self._noise_seed)
        self.targets = self.layout.copy()
        self.robot = self.start.copy()
        self.velocity = np.zeros(2)  # world units per second over the last step
        self._steps = 0
        self.path_length = 0.0
        self._touched_wrong = False
        self._done = False
        return self._frame()

    @property
    def time_s(self) -> float:
        """Simulated seconds since reset (whole steps / rate_hz, so no drift)."""
        return self._steps / self.spec.rate_hz

    @property
    def goal_colour(self) -> str:
        """The goal's colour name, which a ``lang-reach`` instruction says; ValueError for the other tasks."""
        if self.colours is None:
            raise ValueError(f"{self.spec.name} targets all look alike: only lang-reach names the goal's colour")
        return render.COLOUR_NAMES[self.colours[self.goal]]

    @property
    def cue_visible(self) -> bool:
        """Whether the current frame marks the goal (never in ``lang-reach``: the instruction names it)."""
        return self.spec.name in ("reach", "chase") or (self.spec.name == "cue-reach" and self._steps < self._cue_frames)

    @property
    def held(self) -> bool:
        """Whether the next ``step`` ignores its command (cue and hold of ``cue-reach``)."""
        return self._steps < self.spec.release_frames

    def _moved(self, robot: np.ndarray, command: np.ndarray) -> np.ndarray:
        """Where a robot at ``robot`` is after one step of ``command`` (clipped already): the walls stop it."""
        return np.clip(robot + command * self.spec.max_speed / self.spec.rate_hz, 0.0, 1.0)

    def step(self, command: np.ndarray) -> StepOutcome:
        """Apply ``command`` (vx, vy) for one frame period and return what the camera sees after it."""
        if self._done:
            raise RuntimeError("the episode is over; call reset() to replay it")
        command = np.asarray(command, dtype=np.float64)
        if command.shape != (2,):
            raise ValueError(f"a command is (vx, vy), got shape {command.shape}")
        command = np.clip(np.nan_to_num(command, nan=0.0), -1.0, 1.0)
        if not self.held:
            moved = self._moved(self.robot, command)
            self.path_length += float(np.linalg.norm(moved - self.robot))
            self.velocity = (moved - self.robot) * self.spec.rate_hz
            self.robot = moved
        self._steps += 1
        self.targets[self.goal] = self.goal_position(self._steps)
        distances = np.linalg.norm(self.targets - self.robot, axis=1)
        reached = distances <= self.spec.reach_radius
        success = bool(reached[self.goal])
        self._touched_wrong |= bool(np.delete(reached, self.goal).any())
        self._done = success or self._steps >= self._limit_frames
        return StepOutcome(self._frame(), self._done, success, self.time_s, self.path_length, self._touched_wrong)

    def odometry(self) -> np.ndarray:
        """The robot's state in ``ODOMETRY``'s order, float32: position, heading 0 (the disc does not turn), the
        velocity over the last step (zero at the start, while held and against a wall), turn rate 0."""
        x, y = self.robot
        vx, vy = self.velocity
        return np.array([x, y, 0.0, vx, vy, 0.0], dtype=np.float32)

    def place_robot(self, position: np.ndarray, velocity: np.ndarray = (0.0, 0.0)) -> np.ndarray:
        """Put the robot at ``position`` (x, y), clipped into the world, moving at ``velocity`` (what
        ``odometry`` says), and return the camera's view.

        For training data: single frames with the robot anywhere, not only where some policy drove
        it. Time, path length and the episode's outcome are left as they were."""
        self.robot = np.clip(np.asarray(position, dtype=np.float64), 0.0, 1.0)
        self.velocity = np.asarray(velocity, dtype=np.float64)
        return self._frame()

    def set_step(self, step: int) -> None:
        """Put the episode's clock at ``step`` steps since reset, the goal where its path has it then (it moves in
        chase only); the robot stays where it is. For training views: a chase goal anywhere on its path, the
        expert leading it from there. What follows from the clock (the cue, the hold, the time limit) follows."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self._steps = int(step)
        self.targets[self.goal] = self.goal_position(self._steps)

    def goal_position(self, step: int | np.ndarray) -> np.ndarray:
        """Where the goal is after ``step`` steps since reset ([..., 2] for an array of steps): in chase, its start
        moved at ``goal_velocity`` and folded back at the walls (exact, no error builds up over an episode);
        elsewhere the layout's."""
        seconds = np.asarray(step, dtype=np.float64)[..., None] / self.spec.rate_hz
        return bounced(self.layout[self.goal], self.goal_velocity, seconds)

    def expert_command(self) -> np.ndarray:
        """The scripted (privileged: it knows the goal) command: toward the goal, proportional with the
        magnitude saturated at 1, zero within reach_radius / 2. It also points at the goal while the
        robot is held, so demonstrations label the hold with what the cue asked for. The gain is capped
        so one step never overshoots the goal. In chase it leads the goal instead (``_intercept``)."""
        return self._expert(self.robot, self._steps)

    def expert_chunk(self, steps: int) -> np.ndarray:
        """[steps, 2]: for each of the next ``steps`` ticks k (0: now), the expert's command at tick now + k for the
        robot where it will be then if it keeps the velocity it moves at now (``coasted``), the goal where its
        path has it then. The label of a chunked action head (``train/demos.py``), a pure function: the episode is
        left as it was, and the chunk runs on past the episode's end as the world would.

        Why not the expert's own plan (``expert_plan``: its commands executed from now): a chunk is commanded only
        from when it is ready, d ticks after its frame, and until then the robot executes the chunk before it
        (``rtc`` freezes those actions). A plan puts its response to what the frame shows into its first actions,
        which are never executed, and its later ones assume that response happened: a robot that started late
        (nothing to execute before the first chunk) stays short of a still goal, or trails a moving one, by what
        the plan meant to correct in d ticks, chunk after chunk. Measured on the expert itself behind the
        runtime's gate (``test/test_sim.py``), that stalls reach and chase at 300 ms; action k of this chunk is
        instead what the expert would command if its command reached the robot k ticks late, the robot going on
        as it goes, which is what the robot does while the chunk is computed: whatever d turns out to be, the
        first action executed is the expert's for that moment. Action 0 is ``expert_command``."""
        if steps < 1:
            raise ValueError(f"a chunk is at least one step, got {steps}")
        return np.stack([self._expert(robot, self._steps + k) for k, robot in enumerate(self.coasted(steps))])

    def coasted(self, steps: int) -> np.ndarray:
        """[steps, 2]: where the robot is after k = 0 .. steps - 1 more ticks at the velocity it moves at now
        (``odometry``'s), in the world's dynamics: stopped by the walls, still while held."""
        moving = np.maximum(0, self._steps + np.arange(steps) - max(self._steps, self.spec.release_frames))
        return np.clip(self.robot + moving[:, None] * self.velocity / self.spec.rate_hz, 0.0, 1.0)

    def expert_plan(self, steps: int) -> np.ndarray:
        """[steps, 2]: the expert's commands over the next ``steps`` ticks from the state now, each one executed
        without noise in this world's dynamics (the walls stop the robot, the chase goal moves on its path, the
        cue-reach hold ignores commands while it lasts); the episode is left as it was. A state feedback in a
        deterministic world, so the plan from a state this plan reaches later is the rest of this one. Not the
        chunk label: see ``expert_chunk``."""
        if steps < 1:
            raise ValueError(f"a plan is at least one step, got {steps}")
        robot, tick = self.robot.copy(), self._steps
        plan = np.empty((steps, 2))
        for k in range(steps):
            plan[k] = command = self._expert(robot, tick)
            if tick >= self.spec.release_frames:  # ``held``, at that tick
                robot = self._moved(robot, command)
            tick += 1
        return plan

    def _expert(self, robot: np.ndarray, tick: int) -> np.ndarray:
        """``expert_command`` for a robot at ``robot`` after ``tick`` steps (the goal where it is then)."""
        if self.spec.name == "chase":
            return self._intercept(robot, tick)
        delta = self.targets[self.goal] - robot
        if np.linalg.norm(delta) <= self.spec.reach_radius / 2:
            return np.zeros(2)
        command = min(EXPERT_GAIN, self.spec.rate_hz / self.spec.max_speed) * delta
        return command / max(1.0, float(np.linalg.norm(command)))

    def _intercept(self, robot: np.ndarray, tick: int) -> np.ndarray:
        """Chase's expert: the constant velocity (norm <= 1) that puts the robot on the goal at the first step
        n at which the goal's path is within n steps of the robot's reach. Steering at where the goal is
        now would trail behind it; this one meets it. The search ends for sure: the robot crosses the box
        in ``_reach_steps``."""
        step = self.spec.max_speed / self.spec.rate_hz  # how far one step at command norm 1 moves the robot
        ahead = np.arange(1, self._reach_steps() + 1)
        gaps = self.goal_position(tick + ahead) - robot  # [n, 2]
        n = int(np.argmax(np.linalg.norm(gaps, axis=1) <= ahead * step + 1e-12))
        command = gaps[n] / (ahead[n] * step)
        return command / max(1.0, float(np.linalg.norm(command)))

    def _reach_steps(self) -> int:
        """Steps in which the robot can get from anywhere in the world to anywhere (the diagonal, at norm 1)."""
        return math.ceil(math.sqrt(2) * self.spec.rate_hz / self.spec.max_speed) + 1

    def _frame(self) -> np.ndarray:
        image = self._plain.copy()
        if self.spec.name == "chase":
            render.paint_targets(image, self.targets, self._colour)
        if self.cue_visible:
            render.paint_ring(image, self.targets[self.goal])
        render.paint_robot(image, self.robot)
        image += self._noise.normal(0.0, self.spec.noise_sigma, size=image.shape).astype(np.float32)
        return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _layout(rng: np.random.Generator, spec: TaskSpec) -> tuple[np.ndarray, np.ndarray]:
    """Robot start and pixel-snapped targets, pairwise more than 3 * reach_radius apart (standing
    still reaches nothing, no spot is within reach of two targets), and every straight path from the
    start to a target passes more than 2 * reach_radius from the others: the expert never brushes a
    look-alike, so ``touched_wrong`` is the policy's mistake. The rule holds for every target, not
    just the goal, so the layout does not hint at which one is the goal."""
    separation = 3 * spec.reach_radius
    for _ in range(PLACEMENT_TRIES):
        points = rng.uniform(PLACEMENT_MARGIN, 1 - PLACEMENT_MARGIN, size=(spec.targets + 1, 2))
        points[1:] = render.snap(points[1:], spec.image_size)
        gaps = np.linalg.norm(points[:, None] - points[None], axis=-1)[np.triu_indices(len(points), 1)]
        if (gaps > separation).all() and path_clearance(points[0], points[1:]) > 2 * spec.reach_radius:
            return points[0], points[1:]
    raise ValueError(f"targets: could not place {spec.targets} targets and the robot apart in "
                     f"{PLACEMENT_TRIES} tries; use fewer targets or a smaller reach_radius")


def _chase_velocity(rng: np.random.Generator, spec: TaskSpec, robot: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """The goal's starting velocity in chase: ``goal_speed * max_speed`` in the first direction drawn whose
    path within the time limit keeps more than 2 * reach_radius from the robot's start ``robot``."""
    speed = spec.goal_speed * spec.max_speed
    seconds = np.arange(spec.frames(spec.time_limit_s) + 1)[:, None] / spec.rate_hz
    for _ in range(CHASE_TRIES):
        angle = rng.uniform(0.0, 2 * np.pi)
        velocity = speed * np.array([math.cos(angle), math.sin(angle)])
        if np.linalg.norm(bounced(goal, velocity, seconds) - robot, axis=1).min() > 2 * spec.reach_radius:
            return velocity
    raise ValueError(f"goal_speed: no direction in {CHASE_TRIES} tries keeps the goal's path "
                     f"{2 * spec.reach_radius} from the robot's start; use a lower goal_speed or time_limit_s")


def bounced(start: np.ndarray, velocity: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Where a point leaving ``start`` at ``velocity`` is after ``seconds`` ([..., 1] -> [..., 2]), bouncing off
    the walls of [GOAL_WALL, 1 - GOAL_WALL]^2: the straight path folded back into the box, per axis a
    triangle wave, so any step is computed directly and no error builds up over an episode."""
    width = 1.0 - 2 * GOAL_WALL
    unfolded = np.mod(np.asarray(start) - GOAL_WALL + np.asarray(velocity) * seconds, 2 * width)
    return GOAL_WALL + np.where(unfolded <= width, unfolded, 2 * width - unfolded)


def path_clearance(start: np.ndarray, targets: np.ndarray) -> float:
    """How close any target comes to the straight segment from ``start`` to another target."""
    paths = targets - start                                                   # [K, 2]
    along = np.clip(paths @ paths.T / (paths ** 2).sum(axis=1), 0.0, 1.0)     # [j, i]: target j on path i
    distance = np.linalg.norm(paths[:, None] - along[..., None] * paths[None], axis=-1)
    np.fill_diagonal(distance, np.inf)
    return float(distance.min())
