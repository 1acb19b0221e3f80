"""Closed-loop evaluation: the simulator's camera feeds the runtime, the runtime's commands drive the robot.

Per memory policy and memory budget, episodes of a ``worlds.sim`` task run through the runtime's
``Driver``, as ``vla-edge replay`` does: the frame buffer, the admission gate and the reasoning cycle,
on a virtual clock that each block advances by its cost. At every camera tick the robot is driven by
exactly what the action publisher would send (the action timeline under ``action_publisher.execution``:
sync holds the newest action while younger than ``action_timeout_ms``, the chunked modes command each
tick's action of the chunks held; clipped and mapped to the command type, else a safe stop), read as
velocities the way the simulated robot reads its command topic. A chunked model's reasoner waits for its
horizon and is judged against it, as live (``Driver.reason_at``). ``--execution`` runs several modes side
by side. The scripted expert runs through the same loop as a reference for what the task allows.

Each cell reports, beside success and time to reach, how the robot was commanded: the RMS ``jerk`` of the
commanded velocity, the share of ticks starved (every chunk run out), and distinct commands a second
(``distinct_command``, the rule the publisher's live figure counts by).

A checkpoint that reads a robot state gets the robot's odometry (``CueReachEnv.odometry``: x, y, yaw, vx, vy,
wz) with every frame, stamped as the frame is, through the driver's state path as a robot's nav_msgs/Odometry
goes (``simulated_robot_observation`` configures it: state_type odometry, nothing set by hand); one that reads
a state of another size is refused before anything runs.

Rows are policy *variants*: ``aura`` and ``dms`` decide with the checkpoint's learned gate when it has
one (as configured), ``aura:surprise`` and ``dms:novelty`` with their documented scores instead, and
``aura:random`` / ``aura:periodic`` are gates with no notion of surprise (``aura_gates.py``). The
three ``aura:*`` rows are matched to the write rate the ``aura`` row measured, so a learned gate is
compared with an untrained one, and with chance, at the same write budget. ``aura:no-write`` blocks
every write: the memory stays empty and reads zero (the same memory token as zeroing the read, since
``aura.out_proj`` has no bias), the ablation that says whether the policy uses its memory at all.

A budget of F frames bounds the bytes of everything a policy holds (``arena_for``): fifo and cosine
get the arena of the prompt, F frames and the action scratch; dms gets the pool pages of that arena
(its window inside them, each KV head filling them with what it keeps) and a slot for every frame of an
episode, so it holds the same bytes as fifo at F frames; a budget whose pages cannot hold dms's
window beside one frame is refused before anything runs. ``budget_bytes`` is those pages' bytes. Aura's
KV holds the prompt, one memory token and the current frame whatever the budget, plus its constant
fast-weight state, so each aura row runs once, at the smallest budget whose bytes hold all of that
(``aura_budget_frames``: 2 frames for the shipped model).

In ``lang-reach`` the cue swap's place is taken by the language probes of ``lang_reach.py``: each seed's
episode told its goal in words (success per colour), the same episode instruction-blind, and one whose goal
changes mid-way with a live instruction.

Each cell also runs the *cue swap*: per seed, the same layout and noise with each target cued in turn,
the first action after the release read, and counted as picking the target whose direction from the
robot is closest to the action's. A policy that remembers the cue picks the cued target every time;
one that does not picks the same target whichever was cued (1 / K on average). The expert's row runs
it too: it knows the goal, so anything under 1.00 there is a fault of the probe, not of a policy.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..config import MemoryKnobs, Settings
from ..engine import VlaEngine
from ..memory import DmsPolicy, MemoryPolicy, MemorySite, check_knobs, make_policy
from ..memory.aura import fast_weight_bytes
from ..model.checkpoint import Checkpoint
from ..model.config import ModelConfig
from ..model.layout import arena_capacity, kv_bytes_per_token, kv_page_bytes, kv_pages_for
from ..model.memory_tensors import check_aura
from ..runtime.action_output import Outcome
from ..runtime.action_timeline import distinct_command, resolve_execution
from ..runtime.admission import BlockKind, Verdict
from ..runtime.block_costs import CostModel
from ..runtime.clock import VirtualClock
from ..runtime.driver import Driver
from ..runtime.loader import load_engine, load_model, prompt_ids, reads_words
from ..runtime.observation import simulated_robot_observation
from ..runtime.reasoner import block_kinds
from ..runtime.robot_state import odometry_message
from ..worlds.sim.render import COLOUR_NAMES
from ..worlds.sim.world import VELOCITY_COMMANDS, CueReachEnv, TaskSpec, velocity_command
from ..worlds.metaworld import STATE, MetaWorldEnv
from ..worlds.metaworld.backend import load as load_arm_backend
from .arm_world import ARM_STATE_TOPIC, CAMERA_RATE_HZ, ArmTask, ArmWorld, arm_observation, camera_period_steps
from .aura_gates import BASELINE_GATES, baseline_policy
from .lang_reach import PROBES as LANGUAGE_PROBES
from .lang_reach import Instructor, instructor_for, switch_plan
from .parallel import Job, Unit, UnitsFailed, run_figures, run_units

EXPERT = "expert"
BAG_START_NS = 1_735_689_600 * 10**9  # recorded episodes start at 2025-01-01, as make-bag's bags do
CAMERA_TOPIC, COMMAND_TOPIC = "/camera/image_raw", "/vla/command"  # in recorded episodes, as a recorder names them
SCHEMA = "vla_edge_ros.evaluate/7"  # 7: episode_ticks per cell, Meta-World tasks
VARIANTS = ("fifo", "cosine", "aura", "aura:surprise", "aura:random", "aura:periodic", "aura:no-write", "dms",
            "dms:novelty")
MATCHED = ("aura:surprise", "aura:random", "aura:periodic")  # write at the rate the ``aura`` row measured
BASELINES = {f"aura:{gate}": gate for gate in BASELINE_GATES}  # variants whose writes a baseline gate decides
Task = TaskSpec | ArmTask  # a 2-D world task, or a Meta-World one (``arm_world.py``)
AURA_NOTE = ("aura rows run once, at the smallest budget whose bytes hold the prompt, one memory token, the "
             "current frame and the fast-weight state, which they hold whatever the budget")


# what an episode counts and a cell reports summed over its episodes
COUNTS = ("actions", "refused", "missed", "invalid", "safe_stops", "memory_writes", "memory_frames")
MOTION = ("ticks", "warm_ticks", "starved_ticks", "distinct_commands", "jerk_sq_sum", "jerk_terms")  # summed into motion_figures


@dataclass
class Episode:
    """One closed-loop episode's outcome and what the runtime did during it."""

    seed: int
    success: bool
    time_s: float
    path_length: float
    actions: int = 0
    refused: int = 0
    missed: int = 0
    invalid: int = 0  # cycles whose model output held NaN or Inf: no action came of them
    safe_stops: int = 0
    memory_peak_bytes: int = 0  # KV (prompt included) + policy state, the most over the episode's cycles
    memory_writes: int = 0
    memory_frames: int = 0  # frames the memory processed (a refused cycle's frame never reaches it)
    cycles: int = 0  # cycles after which the memory was measured (the sums below are over them)
    bytes_sum: int = 0  # memory bytes as above
    held_sum: int = 0  # tokens the policy holds beside the prompt (slots: memory token, frames, window)
    held_peak: int = 0
    head_held_sum: float = 0.0  # tokens each (layer, KV head) reads beside the prompt, mean over heads (dms)
    seen_sum: int = 0  # frame tokens offered to the memory so far: what an unbounded cache would hold
    goal_colour: str | None = None  # lang-reach: the colour the (last) instruction named
    ticks: int = 0  # control ticks the robot was commanded on
    warm_ticks: int = 0  # ticks from the first that commanded a model's action on (the expert's: every tick)
    starved_ticks: int = 0  # ticks whose command was the safe stop of a timeline whose chunks had all run out
    distinct_commands: int = 0  # warm ticks whose command differed from the tick before (``distinct_command``)
    jerk_sq_sum: float = 0.0  # the sum of squared jerk magnitudes (``jerk``) over the episode's ticks
    jerk_terms: int = 0  # how many: ticks - 2


@dataclass
class CueSwap:
    """One seed's cue swap: per cued target, whether the first action after the release heads for it."""

    seed: int
    picked: list[bool] = field(default_factory=list)


@dataclass
class Cell:
    """All episodes of one (variant, budget) pair."""

    variant: str
    budget_frames: int | None
    execution: str | None = None  # action_publisher.execution for this cell (None: as configured; the expert)
    gate_rate: float | None = None  # an aura:* row's matched write rate (gate rate, or target_write_rate)
    note: str | None = None
    episodes: list[Episode] = field(default_factory=list)
    swaps: list[CueSwap] = field(default_factory=list)
    blind: list[Episode] = field(default_factory=list)  # lang-reach: the same episodes, instruction-blind
    switched: list[Episode] = field(default_factory=list)  # lang-reach: the goal changed mid-way

    @property
    def policy(self) -> str:
        return self.variant.split(":")[0]

    def summary(self, prompt_bytes: int, token_bytes: int, budget_bytes: int | None, execution: str | None,
                rate_hz: float) -> dict[str, Any]:
        """The cell's figures; ``prompt_bytes`` (the pinned prompt's KV) is left out of both sides of the
        compression, which compares what the policy holds with what an unbounded cache would hold. ``execution``:
        the mode its chunks ran in (None: the expert); ``rate_hz``: the control rate its ticks came at."""
        n = len(self.episodes)
        wins = [e for e in self.episodes if e.success]
        low, high = wilson_interval(len(wins), n)
        total = {key: sum(getattr(e, key) for e in self.episodes)
                 for key in (*COUNTS, *MOTION, "cycles", "bytes_sum", "held_sum", "head_held_sum", "seen_sum")}
        cycles = max(total["cycles"], 1)
        held_bytes = total["bytes_sum"] - total["cycles"] * prompt_bytes  # KV beside the prompt + policy state
        peak = max((e.memory_peak_bytes for e in self.episodes), default=0)
        picked = [p for swap in self.swaps for p in swap.picked]
        return {
            "policy": self.policy, "variant": self.variant, "budget_frames": self.budget_frames,
            "budget_bytes": budget_bytes, "within_budget": None if budget_bytes is None else peak <= budget_bytes,
            "execution": execution, "gate_rate": self.gate_rate, "note": self.note, "episodes": n,
            "success_rate": len(wins) / n if n else 0.0, "success_ci95": [low, high],
            "time_to_reach_s": float(np.mean([e.time_s for e in wins])) if wins else None,
            "episode_ticks": {"mean": float(np.mean([e.ticks for e in self.episodes])) if n else None,
                              "success_mean": float(np.mean([e.ticks for e in wins])) if wins else None},
            **motion_figures(total, rate_hz),
            "path_length": float(np.mean([e.path_length for e in wins])) if wins else None,
            **{key: int(total[key]) for key in COUNTS},
            "writes_per_frame": total["memory_writes"] / total["memory_frames"] if total["memory_frames"] else None,
            "memory_peak_bytes": peak,
            "bytes_held": {"peak": peak, "mean": total["bytes_sum"] / cycles},
            "tokens_held": {"peak": max((e.held_peak for e in self.episodes), default=0),
                            "mean": total["held_sum"] / cycles, "per_head_mean": total["head_held_sum"] / cycles},
            "tokens_seen_mean": total["seen_sum"] / cycles,
            "compression": {"tokens": _ratio(total["seen_sum"], total["held_sum"]),
                            "per_head_tokens": _ratio(total["seen_sum"], total["head_held_sum"]),
                            "bytes": _ratio(total["seen_sum"] * token_bytes, held_bytes)},
            "cue_swap": None if not self.swaps else {
                "seeds": len(self.swaps), "trials": len(picked), "picked": sum(picked),
                "rate": sum(picked) / len(picked) if picked else 0.0,
                "ci95": list(wilson_interval(sum(picked), len(picked)))},
            "language": self._language(),
        }

    def _language(self) -> dict[str, Any] | None:
        """lang-reach's probes: success per named colour, instruction-blind (against chance), goal switched."""
        if not self.blind and not self.switched:
            return None
        colours = sorted({e.goal_colour for e in self.episodes if e.goal_colour})
        return {"per_colour": {colour: rate_of([e for e in self.episodes if e.goal_colour == colour])
                               for colour in colours},
                "blind": rate_of(self.blind), "switch": rate_of(self.switched)}

    def matched_rate(self) -> tuple[float, str | None]:
        """This (``aura``) row's write rate, writes / frames processed over all its episodes, for the aura:*
        rows; a gate rate must be > 0, so a row that wrote nothing gives 1/frames, with a note saying so."""
        frames = sum(e.memory_frames for e in self.episodes)
        writes = sum(e.memory_writes for e in self.episodes)
        if writes == 0:
            smallest = max(frames, 1)
            note = f"aura wrote nothing in {frames} frames: matched to 1/{smallest}, the smallest rate > 0"
            return 1 / smallest, note
        return min(1.0, writes / frames), None


def rate_of(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Episodes, successes, their rate and its 95 % Wilson interval."""
    return success_counts(sum(e.success for e in episodes), len(episodes))


def success_counts(wins: int, n: int) -> dict[str, Any]:
    """``n`` episodes of which ``wins`` succeeded: their rate and its 95 % Wilson interval."""
    return {"episodes": n, "successes": wins, "rate": wins / n if n else 0.0, "ci95": list(wilson_interval(wins, n))}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate (sound at 0 and n successes, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # The interval always holds p; at p = 1 rounding put centre + half an ulp below it (at n = 100, among others).
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))


def _ratio(seen: float, held: float) -> float | None:
    return seen / held if held > 0 else None


def jerk(velocities: np.ndarray, dt_s: float) -> np.ndarray:
    """The jerk of commanded velocities [T, d] sent every ``dt_s``: per tick k in 1..T-2, the magnitude of the
    second difference |v[k+1] - 2 v[k] + v[k-1]| / dt^2 (the velocity's second derivative, in command units per
    s^2). What evaluate reports as smoothness (its RMS over a cell's ticks): a command that jumps at each new
    chunk or stops dead when chunks run out scores high, one that follows a smooth plan low."""
    v = np.asarray(velocities, dtype=np.float64).reshape(len(velocities), -1)
    if len(v) < 3:
        return np.zeros(0)
    return np.linalg.norm(v[2:] - 2 * v[1:-1] + v[:-2], axis=1) / dt_s**2


def motion_figures(total: dict[str, float], rate_hz: float) -> dict[str, float | None]:
    """A cell's motion from its episodes' sums (``MOTION``): the RMS jerk over every tick, the share of ticks
    starved, and distinct commands per second of commanded time once warm (the wait for the first action is
    the model's latency, which the success and the time to reach already pay for)."""
    ticks, warm = total["ticks"], total["warm_ticks"]
    return {"jerk_rms": math.sqrt(total["jerk_sq_sum"] / total["jerk_terms"]) if total["jerk_terms"] else None,
            "starved_share": total["starved_ticks"] / ticks if ticks else None,
            "distinct_commands_hz": total["distinct_commands"] * rate_hz / warm if warm else None}


def episode_ticks(spec: Task) -> int:
    """Control ticks of a whole episode: the arm's step limit, the 2-D world's time limit in frames."""
    return spec.max_steps if isinstance(spec, ArmTask) else math.ceil(spec.time_limit_s * spec.rate_hz)


def episode_frames(spec: Task) -> int:
    """Frames an arena needs to hold a whole episode (the ``all`` budget)."""
    return episode_ticks(spec) + 1


def frame_size(spec: Task) -> tuple[int, int]:
    """(height, width) of the world's camera frames: what the driver's frame buffer holds."""
    return (spec.height, spec.width) if isinstance(spec, ArmTask) else (spec.image_size, spec.image_size)


def arena_for(config: ModelConfig, policy: MemoryPolicy, prompt_tokens: int, budget_frames: int | None,
              spec: Task, page_tokens: int) -> tuple[int, int]:
    """KV slots and pool pages for a budget of ``budget_frames`` frames after the prompt (None: every frame of an
    episode fits, nothing is forced out; the pool is the dense size).

    A budget bounds the bytes of all that the policy holds but what is no frame's (aura's memory token comes
    beside it; dms's window is frame tokens and counts inside it). A policy that holds pages per KV head (dms)
    gets the slots of every frame and the pool pages of a dense F-frame arena: the same bytes as fifo at F
    frames, filled with what its heads keep; the others get the F-frame arena itself."""
    every = arena_capacity(config, prompt_tokens, episode_frames(spec), policy.reserved_tokens())
    if budget_frames is None:
        return every, 0
    budget = arena_capacity(config, prompt_tokens, budget_frames, policy.tokens_beside_frames())
    if policy.per_kv_head:
        return max(every, budget), kv_pages_for(config, budget, page_tokens)
    return budget, 0


def budget_bytes(config: ModelConfig, prompt_tokens: int, budget_frames: int | None, spec: Task,
                 page_tokens: int) -> int:
    """Bytes of a budget: the pages of fifo's arena at ``budget_frames`` frames (None: a whole episode), which
    is also the pool ``arena_for`` gives dms at that budget."""
    frames = budget_frames if budget_frames is not None else episode_frames(spec)
    return kv_pages_for(config, arena_capacity(config, prompt_tokens, frames), page_tokens) * kv_page_bytes(
        config, page_tokens)


def aura_budget_frames(checkpoint: Checkpoint) -> int:
    """The fewest frames whose bytes (as fifo holds them) hold aura's memory token, current frame and state."""
    config = checkpoint.config
    check_aura(checkpoint)  # one line naming what is missing (a checkpoint whose recipe never trained aura)
    d_k, d_v = checkpoint.tensors["aura.k_proj.weight"].shape[0], checkpoint.tensors["aura.v_proj.weight"].shape[0]
    token = kv_bytes_per_token(config)
    held = (1 + config.vision.tokens_per_frame) * token + fast_weight_bytes(d_k, d_v)
    return math.ceil(held / (config.vision.tokens_per_frame * token))


class WorldStep(Protocol):
    """What a world's step reports to the loop."""

    frame: np.ndarray | None  # None: the camera gave no frame this step (the loop observes nothing)
    time_s: float
    path_length: float
    done: bool
    success: bool


class ClosedLoopWorld(Protocol):
    """What the loop needs of a world: ticks at ``rate_hz``, at most ``ticks`` of them; its first frame, the
    scripted expert's command, the published command as the world's own, a step, and the state its robot
    publishes (a message the driver's state reader reads). ``PlanarWorld`` is the 2-D world, ``ArmWorld`` the
    Meta-World arm."""

    rate_hz: float
    ticks: int

    def reset(self) -> np.ndarray: ...

    def expert(self) -> np.ndarray: ...

    def command(self, values: tuple[float, ...]) -> np.ndarray: ...

    def step(self, command: np.ndarray) -> WorldStep: ...

    def state_message(self) -> object: ...


class PlanarWorld:
    """The 2-D world's robot in the loop: velocity commands, odometry as its state."""

    def __init__(self, env: CueReachEnv) -> None:
        self.env = env
        self.rate_hz = env.spec.rate_hz
        self.ticks = episode_ticks(env.spec)

    def reset(self) -> np.ndarray:
        return self.env.reset()

    def expert(self) -> np.ndarray:
        return self.env.expert_command()

    def command(self, values: tuple[float, ...]) -> np.ndarray:
        return velocity_command(values or ())

    def step(self, command: np.ndarray) -> WorldStep:
        return self.env.step(command)

    def state_message(self) -> object:
        """``CueReachEnv.odometry`` as a nav_msgs/Odometry: the state the current frame was seen in."""
        return odometry_message(self.env.odometry())


def run_episode(env: CueReachEnv, seed: int, driver: Driver | None,
                record: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
                at_tick: Callable[[int, int], None] | None = None) -> Episode:
    """One episode of the 2-D world (``drive_episode`` on ``PlanarWorld(env)``)."""
    return drive_episode(PlanarWorld(env), seed, driver, record, at_tick)


def drive_episode(world: ClosedLoopWorld, seed: int, driver: Driver | None,
                  record: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
                  at_tick: Callable[[int, int], None] | None = None) -> Episode:
    """One episode of any world, the loop every task runs; ``driver`` None drives with the scripted expert.
    ``record(time_ns, frame, expert command)`` sees every camera frame with the expert's command for it (the
    ground truth); ``at_tick(tick, time_ns)`` is called before each tick's frame is seen (a goal that changes
    mid-way)."""
    period_ns = round(1e9 / world.rate_hz)
    frame = world.reset()
    episode = Episode(seed, False, 0.0, 0.0)
    start = driver.clock() if driver else 0
    if driver:
        driver.new_episode()
    velocities: list[np.ndarray] = []
    previous: tuple[float, ...] | None = None
    warm = False
    for tick in range(world.ticks):
        now = start + tick * period_ns
        if at_tick is not None:
            at_tick(tick, now)
        if record is not None and frame is not None:
            record(now, frame, world.expert())
        if driver is None:
            command = world.expert()
            values = tuple(float(v) for v in command)
        else:
            if frame is not None:
                observe(driver, world, frame, now)
            cycle = driver.reason_at(now, now + period_ns)  # free: it takes the newest frame (chunks: when due)
            if cycle is not None:
                result = cycle.result
                episode.missed += result.missed
                if result.invalid:
                    episode.invalid += 1
                elif result.action is None:
                    episode.refused += result.verdict is not Verdict.STALE
                else:
                    episode.actions += 1
                _measure(episode, driver.engine)
            published = driver.command(now)  # what the action publisher sends at this tick
            values = published.values
            command = world.command(values)
            episode.safe_stops += published.safe_stop
            episode.starved_ticks += published.outcome is Outcome.STARVED
        episode.ticks += 1
        warm = warm or driver is None or published.outcome is Outcome.FRESH
        if warm:
            episode.warm_ticks += 1
            episode.distinct_commands += distinct_command(values, previous)
        previous = values
        velocities.append(command)
        outcome = world.step(command)
        frame = outcome.frame
        episode.time_s, episode.path_length = outcome.time_s, outcome.path_length
        if outcome.done:
            episode.success = outcome.success
            break
    jerks = jerk(np.asarray(velocities), 1.0 / world.rate_hz)
    episode.jerk_sq_sum, episode.jerk_terms = float(np.sum(jerks**2)), len(jerks)
    return episode


def observe(driver: Driver, world: ClosedLoopWorld, frame: np.ndarray, now_ns: int) -> None:
    """What the simulated robot publishes at ``now_ns``, arriving then: when the model reads a state, the robot's
    state message (``world.state_message``, the state its ``frame`` was seen in) stamped as the frame is, then the
    frame. Both take the live path: the state through ``robot_state``'s reader to the observation assembler,
    which pairs it with the frame under ``state_max_age_ms``."""
    if driver.buffer.state_dim:
        driver.state(world.state_message(), now_ns, now_ns)
    driver.camera(frame, now_ns, now_ns)


def clock_start(settings: Settings) -> int:
    """Where an episode's virtual clock starts: 0, or ``BAG_START_NS`` when the model reads a state, whose header
    stamp is the frame's: a state stamped zero is refused as unstamped (``robot_state.py``), as a robot's is."""
    return BAG_START_NS if settings["camera_subscriber"]["state_topic"] else 0


def _measure(episode: Episode, engine: VlaEngine) -> None:
    """Add what the memory holds after a cycle to the episode's figures."""
    stats = engine.memory_stats()
    prompt = engine.prompt_slots.size
    held = stats.kv_tokens - prompt
    policy = engine.policy
    episode.memory_peak_bytes = max(episode.memory_peak_bytes, stats.memory_bytes)
    episode.memory_writes, episode.memory_frames = stats.writes, stats.frames_seen
    episode.cycles += 1
    episode.bytes_sum += stats.memory_bytes
    episode.held_sum += held
    episode.held_peak = max(episode.held_peak, held)
    episode.head_held_sum += float(policy.compression().held_per_head.mean()) if isinstance(policy, DmsPolicy) else held
    episode.seen_sum += stats.frames_seen * engine.config.vision.tokens_per_frame


def cue_swap(spec: TaskSpec, seed: int, start: Callable[[], Driver] | None) -> CueSwap:
    """Each target of seed's layout cued in turn (same layout, same noise): does the first action after the
    release head for the cued target? ``start`` gives a driver whose memory starts a new episode (None: the
    scripted expert, which knows the goal, so it picks the cued target every time: the probe's own check)."""
    env = CueReachEnv(spec, seed)
    world = PlanarWorld(env)
    swap = CueSwap(seed)
    period_ns = round(1e9 / spec.rate_hz)
    for goal in range(spec.targets):
        env.goal = goal
        frame = env.reset()
        driver = start() if start is not None else None
        begin = driver.clock() if driver else 0
        command = None
        for tick in range(episode_ticks(spec)):
            if driver is None:
                command = env.expert_command() if tick >= spec.release_frames else None
            else:
                now = begin + tick * period_ns
                observe(driver, world, frame, now)
                cycle = driver.reason_at(now, now + period_ns)
                if cycle is not None:
                    result = cycle.result
                    if tick >= spec.release_frames and result.action is not None:
                        command = velocity_command(driver.command(result.ready_ns).values or ())
            if command is not None:
                break
            outcome = env.step(np.zeros(2))  # held until the release; nothing moves the robot before the read
            if outcome.done:
                break
            frame = outcome.frame
        swap.picked.append(command is not None and picks(command, env.robot, env.targets) == goal)
    return swap


def picks(command: np.ndarray, robot: np.ndarray, targets: np.ndarray) -> int | None:
    """The target whose direction from ``robot`` is closest to ``command``'s (None for a zero command)."""
    norm = float(np.linalg.norm(command))
    if norm == 0:
        return None
    towards = targets - robot
    cosines = towards @ command / (np.linalg.norm(towards, axis=1) * norm)
    return int(np.argmax(cosines))


def run_order(variants: Sequence[str]) -> tuple[list[str], bool]:
    """The variants in the order they run, ``aura`` before every row matched to its write rate; the bool
    says whether ``aura`` had to be added because such a row was asked for without it."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}, expected some of {VARIANTS}")
    order = list(dict.fromkeys(variants))
    first = next((i for i, v in enumerate(order) if v in MATCHED), None)
    if first is None:
        return order, False
    added = "aura" not in order
    if not added:
        first = min(first, order.index("aura"))
        order.remove("aura")  # shifts nothing before ``first``
    order.insert(first, "aura")
    return order, added


@dataclass(frozen=True)
class EvalContext:
    """What every worker needs to run any episode of one evaluation (picklable)."""

    settings: Settings
    spec: Task
    costs: CostModel
    record_dir: Path | None
    templates: tuple[str, ...]  # lang-reach's instruction templates (none for the other tasks)
    prompt_tokens: int  # the longest prompt an episode starts with: what every arena must hold beside it


@dataclass(frozen=True)
class EpisodeSpec:
    """One unit: one episode of one variant at one budget (``gate_rate``: an aura:* row's matched rate)."""

    variant: str
    budget: int | None
    seed: int
    gate_rate: float | None = None
    probe: str = "episode"  # or the seed's cue "swap"; lang-reach: "blind" or "switch" (lang_reach.py)
    execution: str | None = None  # action_publisher.execution (None: as configured)

    @property
    def key(self) -> str:
        budget = "all" if self.budget is None else self.budget
        probe = "" if self.probe == "episode" else f"_{self.probe}"
        execution = "" if self.execution is None else f"_x{self.execution}"
        return f"{self.variant.replace(':', '-')}_b{budget}_s{self.seed}{probe}{execution}"


def probes_of(spec: Task) -> tuple[str, ...]:
    """What each seed runs in each cell: its episode and the task's probes. chase has none: its ring is on in
    every frame (no memory to probe) and a policy that leads the moving goal heads past it, which the cue
    swap's nearest-direction rule would misread (the expert would pick the cued target 118 times of 150).
    Meta-World's tasks have none yet: no cue, no goal switched mid-way."""
    if spec.name == "chase" or isinstance(spec, ArmTask):
        return ("episode",)
    return LANGUAGE_PROBES if spec.name == "lang-reach" else ("episode", "swap")


def prepare(context: EvalContext) -> dict[str, Any]:
    """A worker's state: the checkpoint, loaded once, an engine per cell, built on first use, and lang-reach's
    instructor (the checkpoint's tokenizer)."""
    checkpoint = load_model(context.settings)
    instructor = (instructor_for(context.templates, checkpoint, context.settings["reasoning"]["instruction_max_tokens"])
                  if context.templates else None)
    return {"context": context, "checkpoint": checkpoint, "engines": {}, "instructor": instructor}


def run_unit(state: dict[str, Any], episode: EpisodeSpec) -> dict[str, Any]:
    """One episode, from nothing but its spec: a fresh frame buffer, gate and clock; the cell's engine with
    its memory restarted from the prompt. Its result does not depend on what the worker ran before."""
    context, instructor = state["context"], state["instructor"]
    spec, seed, probe = context.spec, episode.seed, episode.probe
    if isinstance(spec, ArmTask):
        recorded = episode.variant == EXPERT and context.record_dir is not None  # a bag of every step
        world = ArmWorld(_arm_env(state, spec), seed, 1 if recorded else camera_period_steps(CAMERA_RATE_HZ))
        if episode.variant == EXPERT:
            return asdict(_arm_expert_episode(world, spec, context.settings, context.record_dir))
        return asdict(drive_episode(world, seed, episode_start(state, episode)()))
    env = CueReachEnv(spec, seed)
    if episode.variant == EXPERT:
        if probe == "swap":
            return asdict(cue_swap(spec, seed, None))
        if probe == "episode":
            return asdict(_named(_expert_episode(spec, seed, context.settings, context.record_dir), env, instructor))
        hook = _switch(env, seed, None, instructor, False) if probe == "switch" else None
        return asdict(_named(run_episode(env, seed, None, at_tick=hook), env, instructor))
    start = episode_start(state, episode)
    if probe == "swap":
        return asdict(cue_swap(spec, seed, start))
    if instructor is None:
        return asdict(run_episode(env, seed, start()))
    driver = start(instructor.prompt(env, seed, probe))
    keep = context.settings["reasoning"]["kv.on_instruction"] == "keep"  # no variant changes it
    hook = _switch(env, seed, driver, instructor, keep) if probe == "switch" else None
    return asdict(_named(run_episode(env, seed, driver, at_tick=hook), env, instructor))


def episode_start(state: dict[str, Any], episode: EpisodeSpec) -> Callable[..., Driver]:
    """What starts a driver for ``episode`` on its cell's engine (built on first use, kept by the worker), its
    memory restarted from a prompt (the engine's own, or the one given), on a fresh virtual clock."""
    context = state["context"]
    cell = (episode.variant, episode.budget, episode.gate_rate)
    if cell not in state["engines"]:
        state["engines"][cell] = _cell_runtime(context, episode, state["checkpoint"])
    engine, settings = state["engines"][cell]
    if episode.execution is not None:  # the engine is the cell's whatever the execution; the publisher's rule is not
        settings = settings.replace("action_publisher", {"execution": episode.execution})

    def start(prompt: np.ndarray | None = None) -> Driver:
        _start_episode(engine, settings["reasoning"], episode.variant, episode.gate_rate, episode.seed, prompt)
        return Driver(engine, settings, VirtualClock(clock_start(settings)), context.costs, frame_size(context.spec))

    return start


def _arm_env(state: dict[str, Any], spec: ArmTask) -> MetaWorldEnv:
    """The worker's Meta-World environment of ``spec``, made once (0.5 s, an OSMesa context) and reset per
    episode to the episode's seed: its result depends on the seed alone."""
    if state.get("arm") is None:
        state["arm"] = MetaWorldEnv(spec.arm, 0)
    return state["arm"]


def _named(episode: Episode, env: CueReachEnv, instructor: Instructor | None) -> Episode:
    """The episode with the colour its (last) goal was named by, in lang-reach."""
    episode.goal_colour = env.goal_colour if instructor is not None else None
    return episode


def _switch(env: CueReachEnv, seed: int, driver: Driver | None, instructor: Instructor,
            keep: bool) -> Callable[[int, int], None]:
    """The ``switch`` probe's hook: at its tick the goal changes, and the driver's engine is re-tasked with the
    new goal's instruction as a live one is (a ``prompt`` block), its memory kept or reset as ``keep`` says."""
    tick, goal = switch_plan(env, seed)

    def at_tick(now_tick: int, now_ns: int) -> None:
        if now_tick != tick:
            return
        env.goal = goal
        if driver is None:
            return
        ids = instructor.prompt(env, seed, "switch")
        engine = driver.engine
        driver.clock.wait_until(max(now_ns, driver.clock()))  # arriving now; a busy reasoner ends its cycle first
        driver.reasoner.retask(lambda: engine.replace_prompt(ids) if keep else engine.set_prompt(ids))

    return at_tick


def evaluate(settings: Settings, spec: Task, variants: Sequence[str], budgets: Sequence[int | None],
             episodes: int, seed: int, costs: CostModel, out: Path, record_dir: Path | None = None, *,
             templates: tuple[str, ...] = (), executions: Sequence[str] = (), workers: int | None = None,
             ray_address: str | None = None, resume: bool = False,
             progress: Callable[[str], None] = lambda line: None,
             bar: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Every (variant, budget) over the same seeded episodes, plus the expert; returns evaluate.json's content.

    Episodes are units (tools/parallel.py): serial, on ``workers`` local processes or on Ray, each result
    written to ``out/units`` as it finishes, with the same report whichever ran where. The aura:* rows run
    in a second pass, at the write rate the aura row measured in the first (of the same execution).
    ``templates``: lang-reach's instruction templates (``lang_reach.read_templates``), which it needs and the
    other tasks refuse. ``executions``: ``action_publisher.execution`` modes run side by side, a cell each per
    (variant, budget); none: the configured one. ``spec``: a 2-D world task, or a Meta-World one (``ArmTask``:
    the arm's frames, state and description in, its 4-D action out, through the same loop)."""
    spec.validate()
    if (spec.name == "lang-reach") != bool(templates):
        raise ValueError("lang-reach needs instruction templates (--instructions FILE)" if not templates else
                         f"{spec.name} takes no instructions (--instructions is for lang-reach)")
    arm = isinstance(spec, ArmTask)
    command_type = settings["action_publisher"]["command_type"]
    if not arm and command_type not in VELOCITY_COMMANDS:
        raise ValueError(f"{settings.source}: the simulated robot drives on velocity commands "
                         f"({', '.join(VELOCITY_COMMANDS)}), not action_publisher.command_type {command_type!r}")
    order, added = run_order(variants)
    checkpoint = load_model(settings)
    # the simulated robot's observation: its camera, and its odometry (the arm: its 4-D state) when the checkpoint
    # reads a state; the arm's description as the instruction
    settings = (arm_observation(settings, checkpoint.config, spec, "evaluate") if arm else
                simulated_robot_observation(settings, checkpoint.config.state, "evaluate"))
    if arm:
        load_arm_backend()  # WorldUnavailable (one line: what to install) before any worker starts
    costs.require(block_kinds(checkpoint.config) + ((BlockKind.PROMPT,) if templates else ()))  # the switch's
    prompt_tokens = longest_prompt(settings, checkpoint, spec, templates)
    aura_budget = aura_budget_frames(checkpoint) if any(v.startswith("aura") for v in order) else None
    notes = [f"{AURA_NOTE} ({aura_budget} frames)"] if aura_budget else []
    if arm and not reads_words(settings, checkpoint):
        notes.append(f"{settings['reasoning']['model_dir']} has no tokenizer.json: its prompt is "
                     "reasoning.prompt_token_ids, not the task's description, whatever the task")
        progress(notes[-1])
    if added:
        notes.append(f"aura added: it measures the write rate matched by {', '.join(v for v in order if v in MATCHED)}")
        progress(notes[-1])
    seeds = [seed + i for i in range(episodes)]
    probes = probes_of(spec)
    context = EvalContext(settings, spec, costs, record_dir, templates, prompt_tokens)
    job = Job(prepare, run_unit, context, identity=_identity(settings, spec, costs, templates))
    modes = list(dict.fromkeys(executions)) or [None]
    cells = [Cell(EXPERT, None)] + [Cell(v, b, x) for v in order
                                    for b in ([aura_budget] if v.startswith("aura") else budgets) for x in modes]
    for cell in cells[1:]:
        _, cell.note = fit_to_budget(settings["reasoning"], cell.variant, cell.budget_frames)
        if cell.execution != modes[0]:  # the same arena as the first mode's cell, checked there
            continue
        node = cell_node(settings["reasoning"], cell.variant, cell.budget_frames, None, checkpoint, spec,
                         prompt_tokens)
        site = MemorySite(checkpoint, node["kv_capacity_tokens"], prompt_tokens, node["kv_page_tokens"],
                          node["kv_pool_pages"])
        try:  # every budget is checked before any episode runs, by the policy's own check of its arena
            check_knobs(MemoryKnobs.of(node), site, (node["kv.policy"],))
        except ValueError as exc:
            budget = "all" if cell.budget_frames is None else f"{cell.budget_frames} frames"
            raise ValueError(f"{cell.variant} cannot run within a budget of {budget}: {exc}") from exc
    page_tokens = settings["reasoning"]["kv_page_tokens"]
    token = kv_bytes_per_token(checkpoint.config)

    configured, chunk_rows = settings["action_publisher"]["execution"], checkpoint.config.action.chunk

    def report(cell: Cell) -> dict[str, Any]:
        if cell.variant == EXPERT:
            return cell.summary(prompt_tokens * token, token, None, None, spec.rate_hz)
        budget = budget_bytes(checkpoint.config, prompt_tokens, cell.budget_frames, spec, page_tokens)
        execution = resolve_execution(cell.execution or configured, chunk_rows)
        return cell.summary(prompt_tokens * token, token, budget, execution, spec.rate_hz)

    total = len(probes) * len(cells) * len(seeds)  # an episode and each probe per cell and seed
    summaries, done = [], [0]
    for matched_pass in (False, True):
        todo = [cell for cell in cells if (cell.variant in MATCHED) == matched_pass]
        for cell in todo if matched_pass else ():
            rate, note = next(c for c in cells if c.variant == "aura" and c.execution == cell.execution).matched_rate()
            cell.gate_rate, cell.note = rate, "; ".join(filter(None, (note, cell.note))) or None
        specs = [EpisodeSpec(c.variant, c.budget_frames, s, c.gate_rate, probe, c.execution) for c in todo
                 for probe in probes for s in seeds]
        units = [Unit(spec.key, spec) for spec in specs]
        base = done[0]
        summary = run_units(job, units, out, workers=workers, ray_address=ray_address, resume=resume,
                            progress=lambda n, _t, base=base: bar(base + n, total))
        done[0] += len(units)
        summaries.append(summary)
        if summary.failed:
            failures = "; ".join(f"{key}: {why.splitlines()[-1]}" for key, why in sorted(summary.failed.items()))
            raise UnitsFailed(f"{len(summary.failed)} of {len(units)} episodes failed ({failures}); the finished "
                              f"ones are in {out / 'units'}: --resume runs only what is missing")
        for cell in todo:
            results = {probe: [summary.results[EpisodeSpec(cell.variant, cell.budget_frames, s, cell.gate_rate,
                                                           probe, cell.execution).key] for s in seeds]
                       for probe in probes}
            cell.episodes = [Episode(**result) for result in results["episode"]]
            cell.swaps = [CueSwap(**result) for result in results.get("swap", ())]
            cell.blind = [Episode(**result) for result in results.get("blind", ())]
            cell.switched = [Episode(**result) for result in results.get("switch", ())]
            if cell.variant != EXPERT:
                progress(_cell_line(report(cell)))
    run = run_figures(summaries, ray_address)
    return {"schema": SCHEMA, "task": {"name": spec.name, **asdict(spec)}, "seed": seed, "episodes": episodes,
            "cost_model": costs.describe(), "model_dir": settings["reasoning"]["model_dir"], "notes": notes,
            "runtime_s": run.pop("seconds"), "run": run, "cells": [report(cell) for cell in cells]}


def longest_prompt(settings: Settings, checkpoint: Checkpoint, spec: Task, templates: tuple[str, ...]) -> int:
    """The longest prompt an episode starts with: the configured one, or the longest of every template with every
    colour and the blind one (lang-reach; each checked as an instruction first, before anything runs)."""
    if not templates:
        return len(prompt_ids(settings, checkpoint))
    return instructor_for(templates, checkpoint, settings["reasoning"]["instruction_max_tokens"]).check(COLOUR_NAMES)


def _identity(settings: Settings, spec: Task, costs: CostModel, templates: tuple[str, ...]) -> str:
    """What an episode's result depends on besides its spec: a unit file of another evaluation never resumes."""
    text = json.dumps([SCHEMA, settings.values, asdict(spec), costs.describe(), templates], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cell_line(cell: dict[str, Any]) -> str:
    rate = f", matched write rate {cell['gate_rate']:.3f}" if cell["gate_rate"] is not None else ""
    budget = cell["budget_frames"] if cell["budget_frames"] is not None else "all"
    swap = f", cue swap {cell['cue_swap']['rate']:.2f}" if cell["cue_swap"] else ""
    starved = cell["starved_share"] or 0.0
    return (f"{cell['variant']:>13} budget {budget:>4} {cell['execution']:>8}: success {cell['success_rate']:.2f} of "
            f"{cell['episodes']}{swap}, {cell['refused']} refused, {cell['missed']} missed, starved {starved:.1%} "
            f"of ticks{rate}"
            + (f", {cell['invalid']} INVALID (model output not finite)" if cell["invalid"] else "")
            + (f" ({cell['note']})" if cell["note"] else ""))


def _expert_episode(spec: TaskSpec, seed: int, settings: Settings, record_dir: Path | None) -> Episode:
    """The scripted expert's episode, also written as a bag when ``record_dir`` is set: the camera, the robot's
    odometry stamped as each frame (``CueReachEnv.odometry``, the state the frame was seen in: what a model that
    reads a state pairs with it) and the expert's commands."""
    env = CueReachEnv(spec, seed)
    if record_dir is None:
        return run_episode(env, seed, None)
    from ..bags.odometry import ODOMETRY_MSGTYPE, STATE_TOPIC, bag_odometry

    twist = settings["action_publisher"]["twist_dims"][:2]

    def command(expert: np.ndarray) -> np.ndarray:
        values = np.full(max(max(twist) + 1, 1), np.nan, dtype=np.float32)  # NaN: what the twist leaves out
        for dim, value in zip(twist, expert):
            if dim >= 0:
                values[dim] = value
        return values

    state = RecordedState(STATE_TOPIC, ODOMETRY_MSGTYPE, lambda writer, stamp: bag_odometry(writer, stamp,
                                                                                           env.odometry()))
    return record_expert(PlanarWorld(env), seed, record_dir / f"{spec.name}_{seed:04d}.mcap", state, command)


def _arm_expert_episode(world: ArmWorld, spec: ArmTask, settings: Settings, record_dir: Path | None) -> Episode:
    """The scripted expert's episode on the arm, also written as a bag when ``record_dir`` is set: the camera, the
    arm's state as the JointState the simulated arm publishes (joints ``STATE``, on the configured state topic or
    ``ARM_STATE_TOPIC``, stamped as each frame) and the expert's 4-D actions as the Float32MultiArray commands."""
    if record_dir is None:
        return drive_episode(world, world.seed, None)
    from ..bags.joint_state import JOINT_STATE_MSGTYPE, bag_joint_state

    topic = "/" + (settings["camera_subscriber"]["state_topic"] or ARM_STATE_TOPIC).lstrip("/")
    state = RecordedState(topic, JOINT_STATE_MSGTYPE, lambda writer, stamp: bag_joint_state(writer, stamp, STATE,
                                                                                            world.env.state))
    return record_expert(world, world.seed, record_dir / f"{spec.task}_{world.seed:04d}.mcap", state,
                         lambda expert: expert)


@dataclass(frozen=True)
class RecordedState:
    """Where a recorded episode's bag holds the robot's state, and the message of it now (for a bag and a stamp)."""

    topic: str
    msgtype: str
    message: Callable[[Any, int], object]


def record_expert(world: ClosedLoopWorld, seed: int, path: Path, state: RecordedState,
                  command: Callable[[np.ndarray], np.ndarray]) -> Episode:
    """The scripted expert's episode of ``world``, written to the bag ``path`` as the robot would publish it: at
    every tick the state (before the camera: see bags/odometry.py), the frame seen in it, and the expert's command
    as a Float32MultiArray (``command``: the expert's output as the action publisher's values), one stamp each."""
    from ..bags.writer import BagWriter

    with BagWriter(path, force=True) as writer:
        states = writer.add_topic(state.topic, state.msgtype)
        camera = writer.add_topic(CAMERA_TOPIC, "sensor_msgs/msg/Image")
        commands = writer.add_topic(COMMAND_TOPIC, "std_msgs/msg/Float32MultiArray")

        def record(time_ns: int, frame: np.ndarray, expert: np.ndarray) -> None:
            stamp = BAG_START_NS + time_ns
            writer.write(states, stamp, state.message(writer, stamp))
            writer.write(camera, stamp, writer.image(stamp, "camera", frame))
            writer.write(commands, stamp, writer.float32_array(command(expert)))

        return drive_episode(world, seed, None, record)


def variant_knobs(variant: str, rate: float | None) -> dict[str, Any]:
    """The reasoning node's settings that turn the configured policy into ``variant`` (``rate``: the matched
    write rate of an aura:* row); the baseline gates are installed per episode by ``_start_episode``."""
    knobs: dict[str, Any] = {"kv.policy": variant.split(":")[0], "kv_store.dir": ""}
    if variant == "aura:surprise":
        knobs["kv.aura.use_learned_gate"] = False
        if rate is not None:  # None: before the aura row measured it (the budget check)
            knobs["kv.aura.target_write_rate"] = rate
    elif variant == "dms:novelty":
        knobs["kv.dms.use_learned_gate"] = False
    return knobs


def _start_episode(engine: VlaEngine, node: dict[str, Any], variant: str, rate: float | None, seed: int,
                   prompt: np.ndarray | None = None) -> None:
    """A new episode: the memory starts from the prompt (``prompt``, or the engine's own). A baseline gate gets
    a fresh policy seeded by the episode (as memory-bench does), so its draws and periodic phase differ between
    episodes, not between runs."""
    engine.set_prompt(engine.prompt_ids if prompt is None else prompt)
    gate = BASELINES.get(variant)
    if gate is None:
        return
    engine.set_policy(baseline_policy(MemoryKnobs.of(node).aura, gate, rate or 1.0, seed))


def fit_to_budget(node: dict[str, Any], variant: str, budget: int | None) -> tuple[dict[str, Any], str | None]:
    """Knobs a budget forces, and why: cosine must be able to evict one of its ``budget`` frames, so it
    protects at most budget - 1 recent frames (a robot's config would be refused instead)."""
    protect = node["kv.cosine.protect_recent_frames"]
    if variant == "cosine" and budget is not None and protect >= budget:
        return ({"kv.cosine.protect_recent_frames": budget - 1},
                f"protect_recent_frames {protect} -> {budget - 1} to fit {budget} frames")
    return {}, None


def cell_node(reasoning: dict[str, Any], variant: str, budget: int | None, gate_rate: float | None,
              checkpoint: Checkpoint, spec: Task, prompt_tokens: int) -> dict[str, Any]:
    """The reasoning settings of one cell: its variant's knobs, ``fit_to_budget``'s, and its arena
    (``arena_for``: slots and pool pages for its budget beside a prompt of ``prompt_tokens``). Every prompt an
    episode starts with or switches to is known beforehand (``_prompt_tokens``), so the arena keeps room for the
    longest of them, not for any instruction of ``instruction_max_tokens`` as a robot's must."""
    fitted, _ = fit_to_budget(reasoning, variant, budget)
    node = dict(reasoning, **variant_knobs(variant, gate_rate), **fitted, instruction_max_tokens=prompt_tokens)
    node["kv_capacity_tokens"], node["kv_pool_pages"] = arena_for(
        checkpoint.config, make_policy(node["kv.policy"], node), prompt_tokens, budget, spec, node["kv_page_tokens"])
    return node


def _cell_runtime(context: EvalContext, episode: EpisodeSpec, checkpoint: Checkpoint) -> tuple[VlaEngine, Settings]:
    """The engine of one cell: sized for its budget under its variant (``cell_node``)."""
    settings = context.settings
    node = cell_node(settings["reasoning"], episode.variant, episode.budget, episode.gate_rate, checkpoint,
                     context.spec, context.prompt_tokens)
    cell = Settings({**settings.values, "reasoning": node}, settings.source)
    engine = load_engine(cell, policies=(node["kv.policy"],), checkpoint=checkpoint).engine  # this policy's arena
    return engine, cell


def format_table(report: dict[str, Any]) -> str:
    """One row per (variant, budget), then the report's notes and any row's own."""
    lines = [f"{report['task']['name']}: {report['episodes']} episodes per cell, cost model {report['cost_model']}",
             f"{'variant':>13} {'budget':>6} {'exec':>8} {'success':>8} {'95% CI':>13} {'swap':>5} {'t reach s':>9} "
             f"{'jerk':>7} {'starved':>7} {'cmd/s':>5} {'peak B':>11} {'mean B':>11} {'x tok':>6} {'x bytes':>7} "
             f"{'w/frame':>7} {'w rate':>6} {'refused':>7} {'missed':>6} {'invalid':>7}"]
    for c in report["cells"]:
        budget = "all" if c["budget_frames"] is None else str(c["budget_frames"])
        reach = f"{c['time_to_reach_s']:.2f}" if c["time_to_reach_s"] is not None else "-"
        jerk_rms, starved, distinct = (f"{x:.{d}f}" if x is not None else "-" for x, d in (
            (c["jerk_rms"], 0), (c["starved_share"], 3), (c["distinct_commands_hz"], 1)))
        rate = f"{c['gate_rate']:.3f}" if c["gate_rate"] is not None else "-"
        swap = f"{c['cue_swap']['rate']:.2f}" if c["cue_swap"] else "-"
        per_frame = f"{c['writes_per_frame']:.3f}" if c["writes_per_frame"] is not None else "-"
        tokens, size = (f"{x:.1f}" if x is not None else "-" for x in (c["compression"]["tokens"],
                                                                      c["compression"]["bytes"]))
        lines.append(f"{c['variant']:>13} {budget:>6} {c['execution'] or '-':>8} {c['success_rate']:>8.2f} "
                     f"[{c['success_ci95'][0]:.2f}, {c['success_ci95'][1]:.2f}] {swap:>5} {reach:>9} "
                     f"{jerk_rms:>7} {starved:>7} {distinct:>5} "
                     f"{c['bytes_held']['peak']:>11,} {round(c['bytes_held']['mean']):>11,} {tokens:>6} {size:>7} "
                     f"{per_frame:>7} {rate:>6} {c['refused']:>7} {c['missed']:>6} {c['invalid']:>7}")
    lines += [_language_line(c, report["task"]["targets"]) for c in report["cells"] if c["language"]]
    lines += [f"note: {note}" for note in report["notes"]]
    lines += [f"error ({c['variant']}): {line}" for c in report["cells"] if (line := invalid_line(c))]
    lines += [f"note ({c['variant']}): {c['note']}" for c in report["cells"] if c["note"]]
    lines.append("exec: how chunks became commands; jerk: RMS over ticks of the commanded velocity's second "
                 "difference / dt^2 (command units / s^2); starved: share of ticks stopped because every chunk had run "
                 "out; cmd/s: commands differing from the tick before, per second once warm (from the first model action)")
    lines.append("swap: share of cue swaps whose first action after the release heads for the cued target; "
                 "peak / mean B: memory held (KV with the prompt + policy state); x tok / x bytes: frame tokens seen "
                 "/ tokens held, and their bytes / bytes held beside the prompt (state included)")
    if any(c["gate_rate"] is not None for c in report["cells"]):
        lines.append("w rate: the write rate an aura:* row is matched to (the aura row's writes / frames)")
    return "\n".join(lines)


def _language_line(cell: dict[str, Any], targets: int) -> str:
    """lang-reach's probes of one cell in one line: success per colour, blind against chance, switched."""
    language, budget = cell["language"], "all" if cell["budget_frames"] is None else cell["budget_frames"]
    colours = ", ".join(f"{colour} {r['rate']:.2f} ({r['episodes']})" for colour, r in language["per_colour"].items())
    return (f"language ({cell['variant']}, budget {budget}): {colours}; blind {language['blind']['rate']:.2f} "
            f"(chance {1 / targets:.2f}); goal switched mid-way {language['switch']['rate']:.2f}")


def invalid_line(cell: dict[str, Any]) -> str:
    """What a cell's invalid outputs mean, or "" when it had none."""
    if not cell["invalid"]:
        return ""
    return (f"the model's output was not finite (NaN or Inf) on {cell['invalid']} cycles: no action came of them, "
            "so its success rate says nothing about the policy; the checkpoint is corrupt or overflows")


def write_json(report: dict[str, Any], out: Path) -> Path:
    """``out/evaluate.json`` (``out`` made if missing): the report of one task, or of Meta-World's tasks."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "evaluate.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def write_report(report: dict[str, Any], out: Path) -> Path:
    """evaluate.json and success.png (success rate with its 95 % interval per variant and budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = write_json(report, out)
    cells = report["cells"]
    modes = {c["execution"] for c in cells if c["execution"] is not None}
    labels = [f"{c['variant']}\n{'all' if c['budget_frames'] is None else c['budget_frames']}"
              + (f"\n{c['execution']}" if len(modes) > 1 and c["execution"] else "") for c in cells]
    rates = [c["success_rate"] for c in cells]
    errors = [[r - c["success_ci95"][0] for r, c in zip(rates, cells)],
              [c["success_ci95"][1] - r for r, c in zip(rates, cells)]]
    fig, ax = plt.subplots(figsize=(max(6, len(cells)), 4))
    ax.bar(range(len(cells)), rates, yerr=errors, capsize=4)
    ax.set_xticks(range(len(cells)), labels)
    ax.set(ylim=(0, 1.05), ylabel="success rate (95 % CI)",
           title=f"{report['task']['name']}: success per KV policy variant and memory budget (frames)")
    fig.tight_layout()
    fig.savefig(out / "success.png", dpi=100)
    plt.close(fig)
    return path
