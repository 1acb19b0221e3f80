"""Closed-loop evaluation: the simulator's camera feeds the runtime, the runtime's commands drive the robot.

Per memory policy and memory budget, episodes of a ``worlds.sim`` task run through the runtime's
``Driver``, as ``vla-edge replay`` does: the frame buffer, the admission gate and the reasoning cycle,
on a virtual clock that each block advances by its cost. At every camera tick the robot is driven by
exactly what the action publisher would send (``ActionOutput.decide``: the newest ready action while
younger than ``action_timeout_ms``, clipped and mapped to the command type, else a safe stop), read
as velocities the way the simulated robot reads its command topic.
The scripted expert runs through the same loop as a reference for what the task allows.

Rows are policy *variants*: ``aura`` and ``dms`` decide with the checkpoint's learned gate when it has
one (as configured), ``aura:surprise`` and ``dms:novelty`` with their documented scores instead, and
``aura:random`` / ``aura:periodic`` are gates with no notion of surprise. The three ``aura:*`` rows are
matched to the write rate the ``aura`` row measured, so a learned gate is compared with an untrained
one, and with chance, at the same write budget. Aura's KV holds the prompt, one memory token and the
current frame whatever the budget (its memory is the constant fast-weight state), so each aura row
runs once and is reported at ``AURA_BUDGET`` frames.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import MemoryKnobs, Settings
from ..engine import VlaEngine
from ..memory import AuraPolicy, MemoryPolicy, make_policy
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.config import ModelConfig
from ..model.layout import arena_capacity, kv_pages_for
from ..runtime.admission import Verdict
from ..runtime.block_costs import CostModel
from ..runtime.clock import VirtualClock
from ..runtime.driver import Driver
from ..runtime.loader import load_engine
from ..worlds.sim.world import VELOCITY_COMMANDS, CueReachEnv, TaskSpec, velocity_command
from .parallel import Job, Unit, UnitsFailed, run_figures, run_units

EXPERT = "expert"
BAG_START_NS = 1_735_689_600 * 10**9  # recorded episodes start at 2025-01-01, as make-bag's bags do
SCHEMA = "vla_edge_ros.evaluate/2"
VARIANTS = ("fifo", "cosine", "aura", "aura:surprise", "aura:random", "aura:periodic", "dms", "dms:novelty")
MATCHED = ("aura:surprise", "aura:random", "aura:periodic")  # write at the rate the ``aura`` row measured
BASELINE_GATES = {"aura:random": "random", "aura:periodic": "periodic"}
AURA_BUDGET = 1  # the frames aura's KV holds whatever the budget: its rows run once, reported at this budget
AURA_NOTE = (f"aura rows run once, reported at budget_frames {AURA_BUDGET}: their KV holds the prompt, one memory "
             "token and the current frame whatever the budget; their memory is the constant fast-weight state")


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
    safe_stops: int = 0
    memory_peak_bytes: int = 0
    memory_writes: int = 0
    memory_frames: int = 0  # frames the memory processed (a refused cycle's frame never reaches it)


@dataclass
class Cell:
    """All episodes of one (variant, budget) pair."""

    variant: str
    budget_frames: int | None
    gate_rate: float | None = None  # an aura:* row's matched write rate (gate rate, or target_write_rate)
    note: str | None = None
    episodes: list[Episode] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.variant.split(":")[0]

    def summary(self) -> dict[str, Any]:
        n = len(self.episodes)
        wins = [e for e in self.episodes if e.success]
        low, high = wilson_interval(len(wins), n)
        return {
            "policy": self.policy, "variant": self.variant, "budget_frames": self.budget_frames,
            "gate_rate": self.gate_rate, "note": self.note, "episodes": n,
            "success_rate": len(wins) / n if n else 0.0, "success_ci95": [low, high],
            "time_to_reach_s": float(np.mean([e.time_s for e in wins])) if wins else None,
            "path_length": float(np.mean([e.path_length for e in wins])) if wins else None,
            **{key: int(sum(getattr(e, key) for e in self.episodes))
               for key in ("actions", "refused", "missed", "safe_stops", "memory_writes", "memory_frames")},
            "memory_peak_bytes": max((e.memory_peak_bytes for e in self.episodes), default=0),
        }

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


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate (sound at 0 and n successes, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def arena_for(config: ModelConfig, policy: MemoryPolicy, prompt_tokens: int, budget_frames: int | None,
              spec: TaskSpec, page_tokens: int) -> tuple[int, int]:
    """KV slots and pool pages for a budget of ``budget_frames`` frames after the prompt (None: every frame of an
    episode fits, nothing is forced out; the pool is the dense size).

    A budget bounds the bytes of all that the policy holds but what is no frame's (aura's memory token comes
    beside it; dms's window is frame tokens and counts inside it). A policy that holds pages per KV head (dms)
    gets the slots of every frame and the pool pages of a dense F-frame arena: the same bytes as fifo at F
    frames, filled with what its heads keep; the others get the F-frame arena itself."""
    every = arena_capacity(config, prompt_tokens, math.ceil(spec.time_limit_s * spec.rate_hz) + 1,
                           policy.reserved_tokens())
    if budget_frames is None:
        return every, 0
    budget = arena_capacity(config, prompt_tokens, budget_frames, policy.tokens_beside_frames())
    if policy.per_kv_head:
        return max(every, budget), kv_pages_for(config, budget, page_tokens)
    return budget, 0


def run_episode(env: CueReachEnv, seed: int, driver: Driver | None,
                record: Callable[[int, np.ndarray, np.ndarray], None] | None = None) -> Episode:
    """One episode; ``driver`` None drives with the scripted expert. ``record(time_ns, frame, expert
    command)`` sees every camera frame with the expert's command for it (the ground truth)."""
    spec = env.spec
    period_ns = round(1e9 / spec.rate_hz)
    frame = env.reset()
    episode = Episode(seed, False, 0.0, 0.0)
    start = driver.clock() if driver else 0
    if driver:
        driver.new_episode()
    for tick in range(math.ceil(spec.time_limit_s * spec.rate_hz)):
        now = start + tick * period_ns
        if record is not None:
            record(now, frame, env.expert_command())
        if driver is None:
            command = env.expert_command()
        else:
            driver.camera(frame, now, now)
            if driver.clock() <= now:  # the reasoner is free: it takes the newest frame
                driver.clock.wait_until(now)
                result = driver.reason().result
                episode.missed += result.missed
                if result.action is None:
                    episode.refused += result.verdict is not Verdict.STALE
                else:
                    episode.actions += 1
                stats = driver.engine.memory_stats()
                episode.memory_peak_bytes = max(episode.memory_peak_bytes, stats.memory_bytes)
                episode.memory_writes, episode.memory_frames = stats.writes, stats.frames_seen
            published = driver.command(now)  # what the action publisher sends at this tick
            command = velocity_command(published.values or ())
            episode.safe_stops += published.safe_stop
        outcome = env.step(command)
        frame = outcome.frame
        episode.time_s, episode.path_length = outcome.time_s, outcome.path_length
        if outcome.done:
            episode.success = outcome.success
            break
    return episode


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
    spec: TaskSpec
    costs: CostModel
    record_dir: Path | None


@dataclass(frozen=True)
class EpisodeSpec:
    """One unit: one episode of one variant at one budget (``gate_rate``: an aura:* row's matched rate)."""

    variant: str
    budget: int | None
    seed: int
    gate_rate: float | None = None

    @property
    def key(self) -> str:
        budget = "all" if self.budget is None else self.budget
        return f"{self.variant.replace(':', '-')}_b{budget}_s{self.seed}"


def prepare(context: EvalContext) -> dict[str, Any]:
    """A worker's state: the checkpoint, loaded once, and an engine per cell, built on first use."""
    return {"context": context, "checkpoint": load_checkpoint(context.settings["reasoning"]["model_dir"]),
            "engines": {}}


def run_unit(state: dict[str, Any], episode: EpisodeSpec) -> dict[str, Any]:
    """One episode, from nothing but its spec: a fresh frame buffer, gate and clock; the cell's engine with
    its memory restarted from the prompt. Its result does not depend on what the worker ran before."""
    context = state["context"]
    spec = context.spec
    if episode.variant == EXPERT:
        return asdict(_expert_episode(spec, episode.seed, context.settings, context.record_dir))
    cell = (episode.variant, episode.budget, episode.gate_rate)
    if cell not in state["engines"]:
        state["engines"][cell] = _cell_runtime(context, episode, state["checkpoint"])
    engine, settings = state["engines"][cell]
    _start_episode(engine, settings["reasoning"], episode.variant, episode.gate_rate, episode.seed)
    driver = Driver(engine, settings, VirtualClock(0), context.costs, (spec.image_size, spec.image_size))
    return asdict(run_episode(CueReachEnv(spec, episode.seed), episode.seed, driver))


def evaluate(settings: Settings, spec: TaskSpec, variants: Sequence[str], budgets: Sequence[int | None],
             episodes: int, seed: int, costs: CostModel, out: Path, record_dir: Path | None = None, *,
             workers: int = 1, ray_address: str | None = None, resume: bool = False,
             progress: Callable[[str], None] = lambda line: None,
             bar: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Every (variant, budget) over the same seeded episodes, plus the expert; returns evaluate.json's content.

    Episodes are units (tools/parallel.py): serial, on ``workers`` local processes or on Ray, each result
    written to ``out/units`` as it finishes, with the same report whichever ran where. The aura:* rows run
    in a second pass, at the write rate the aura row measured in the first."""
    spec.validate()
    command_type = settings["action_publisher"]["command_type"]
    if command_type not in VELOCITY_COMMANDS:
        raise ValueError(f"{settings.source}: the simulated robot drives on velocity commands "
                         f"({', '.join(VELOCITY_COMMANDS)}), not action_publisher.command_type {command_type!r}")
    order, added = run_order(variants)
    notes = [AURA_NOTE] if "aura" in order else []
    if added:
        notes.append(f"aura added: it measures the write rate matched by {', '.join(v for v in order if v in MATCHED)}")
        progress(notes[-1])
    seeds = [seed + i for i in range(episodes)]
    context = EvalContext(settings, spec, costs, record_dir)
    job = Job(prepare, run_unit, context, identity=_identity(settings, spec, costs))
    cells = [Cell(EXPERT, None)] + [Cell(v, b) for v in order for b in ([AURA_BUDGET] if v.startswith("aura") else budgets)]
    for cell in cells:
        _, cell.note = fit_to_budget(settings["reasoning"], cell.variant, cell.budget_frames)
    total = len(cells) * len(seeds)
    summaries, done = [], [0]
    for matched_pass in (False, True):
        todo = [cell for cell in cells if (cell.variant in MATCHED) == matched_pass]
        if matched_pass and todo:
            rate, note = next(c for c in cells if c.variant == "aura").matched_rate()
            for cell in todo:
                cell.gate_rate, cell.note = rate, "; ".join(filter(None, (note, cell.note))) or None
        specs = [EpisodeSpec(c.variant, c.budget_frames, s, c.gate_rate) for c in todo for s in seeds]
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
            cell.episodes = [Episode(**summary.results[EpisodeSpec(cell.variant, cell.budget_frames, s,
                                                                   cell.gate_rate).key]) for s in seeds]
            if cell.variant != EXPERT:
                progress(_cell_line(cell))
    run = run_figures(summaries, workers, ray_address)
    return {"schema": SCHEMA, "task": asdict(spec), "seed": seed, "episodes": episodes,
            "cost_model": costs.describe(), "model_dir": settings["reasoning"]["model_dir"], "notes": notes,
            "runtime_s": run.pop("seconds"), "run": run, "cells": [cell.summary() for cell in cells]}


def _identity(settings: Settings, spec: TaskSpec, costs: CostModel) -> str:
    """What an episode's result depends on besides its spec: a unit file of another evaluation never resumes."""
    text = json.dumps([SCHEMA, settings.values, asdict(spec), costs.describe()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cell_line(cell: Cell) -> str:
    summary = cell.summary()
    rate = f", matched write rate {cell.gate_rate:.3f}" if cell.gate_rate is not None else ""
    budget = cell.budget_frames if cell.budget_frames is not None else "all"
    return (f"{cell.variant:>13} budget {budget:>4}: success {summary['success_rate']:.2f} of {len(cell.episodes)}, "
            f"{summary['refused']} refused, {summary['missed']} missed{rate}" + (f" ({cell.note})" if cell.note else ""))


def _expert_episode(spec: TaskSpec, seed: int, settings: Settings, record_dir: Path | None) -> Episode:
    """The scripted expert's episode, also written as a bag (camera + its commands) when ``record_dir`` is set."""
    if record_dir is None:
        return run_episode(CueReachEnv(spec, seed), seed, None)
    from ..bags.writer import BagWriter

    twist = settings["action_publisher"]["twist_dims"][:2]
    dof = max(max(twist) + 1, 1)
    with BagWriter(record_dir / f"{spec.name}_{seed:04d}.mcap", force=True) as writer:
        types = writer.types
        camera = writer.add_topic("/camera/image_raw", "sensor_msgs/msg/Image")
        command = writer.add_topic("/vla/command", "std_msgs/msg/Float32MultiArray")
        layout = types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)

        def record(time_ns: int, frame: np.ndarray, expert: np.ndarray) -> None:
            stamp = BAG_START_NS + time_ns
            height, width = frame.shape[:2]
            writer.write(camera, stamp, types["sensor_msgs/msg/Image"](
                header=writer.header(stamp, "camera"), height=height, width=width, encoding="rgb8",
                is_bigendian=0, step=width * 3, data=frame.reshape(-1)))
            values = np.full(dof, np.nan, dtype=np.float32)
            for dim, value in zip(twist, expert):
                if dim >= 0:
                    values[dim] = value
            writer.write(command, stamp, types["std_msgs/msg/Float32MultiArray"](layout=layout, data=values))

        return run_episode(CueReachEnv(spec, seed), seed, None, record)


def variant_knobs(variant: str, rate: float | None) -> dict[str, Any]:
    """The reasoning node's settings that turn the configured policy into ``variant`` (``rate``: the matched
    write rate of an aura:* row); the baseline gates are installed per episode by ``_start_episode``."""
    knobs: dict[str, Any] = {"kv.policy": variant.split(":")[0], "kv_store.dir": ""}
    if variant == "aura:surprise":
        knobs.update({"kv.aura.use_learned_gate": False, "kv.aura.target_write_rate": rate})
    elif variant == "dms:novelty":
        knobs["kv.dms.use_learned_gate"] = False
    return knobs


def _start_episode(engine: VlaEngine, node: dict[str, Any], variant: str, rate: float | None, seed: int) -> None:
    """A new episode: the memory starts from the prompt. A baseline gate gets a fresh policy seeded by the
    episode (as memory-bench does), so its draws and periodic phase differ between episodes, not between runs."""
    gate = BASELINE_GATES.get(variant)
    if gate is None:
        engine.set_prompt(engine.prompt_ids)
        return
    engine.set_policy(AuraPolicy(MemoryKnobs.of(node).aura, gate=gate, gate_rate=rate, seed=seed))


def fit_to_budget(node: dict[str, Any], variant: str, budget: int | None) -> tuple[dict[str, Any], str | None]:
    """Knobs a budget forces, and why: cosine must be able to evict one of its ``budget`` frames, so it
    protects at most budget - 1 recent frames (a robot's config would be refused instead)."""
    protect = node["kv.cosine.protect_recent_frames"]
    if variant == "cosine" and budget is not None and protect >= budget:
        return ({"kv.cosine.protect_recent_frames": budget - 1},
                f"protect_recent_frames {protect} -> {budget - 1} to fit {budget} frames")
    return {}, None


def _cell_runtime(context: EvalContext, episode: EpisodeSpec, checkpoint: Checkpoint) -> tuple[VlaEngine, Settings]:
    """The engine of one cell: sized for its budget under its variant (and ``fit_to_budget``'s knobs)."""
    settings, spec = context.settings, context.spec
    fitted, _ = fit_to_budget(settings["reasoning"], episode.variant, episode.budget)
    node = dict(settings["reasoning"], **variant_knobs(episode.variant, episode.gate_rate), **fitted)
    node["kv_capacity_tokens"], node["kv_pool_pages"] = arena_for(
        checkpoint.config, make_policy(node["kv.policy"], node), len(node["prompt_token_ids"]), episode.budget, spec,
        node["kv_page_tokens"])
    cell = Settings({**settings.values, "reasoning": node}, settings.source)
    engine = load_engine(cell, policies=(node["kv.policy"],), checkpoint=checkpoint).engine  # this policy's arena
    return engine, cell


def format_table(report: dict[str, Any]) -> str:
    """One row per (variant, budget), then the report's notes and any row's own."""
    lines = [f"{report['task']['name']}: {report['episodes']} episodes per cell, cost model {report['cost_model']}",
             f"{'variant':>13} {'budget':>6} {'success':>8} {'95% CI':>13} {'t reach s':>9} {'path':>6} "
             f"{'memory B':>11} {'writes':>7} {'w rate':>6} {'refused':>7} {'missed':>6}"]
    for c in report["cells"]:
        budget = "all" if c["budget_frames"] is None else str(c["budget_frames"])
        reach = f"{c['time_to_reach_s']:.2f}" if c["time_to_reach_s"] is not None else "-"
        path = f"{c['path_length']:.2f}" if c["path_length"] is not None else "-"
        rate = f"{c['gate_rate']:.3f}" if c["gate_rate"] is not None else "-"
        lines.append(f"{c['variant']:>13} {budget:>6} {c['success_rate']:>8.2f} "
                     f"[{c['success_ci95'][0]:.2f}, {c['success_ci95'][1]:.2f}] {reach:>9} {path:>6} "
                     f"{c['memory_peak_bytes']:>11,} {c['memory_writes']:>7} {rate:>6} {c['refused']:>7} "
                     f"{c['missed']:>6}")
    lines += [f"note: {note}" for note in report["notes"]]
    lines += [f"note ({c['variant']}): {c['note']}" for c in report["cells"] if c["note"]]
    if any(c["gate_rate"] is not None for c in report["cells"]):
        lines.append("w rate: the write rate an aura:* row is matched to (the aura row's writes / frames)")
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: Path) -> Path:
    """evaluate.json and success.png (success rate with its 95 % interval per variant and budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    path = out / "evaluate.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    cells = report["cells"]
    labels = [f"{c['variant']}\n{'all' if c['budget_frames'] is None else c['budget_frames']}" for c in cells]
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
