"""The sweep: every cell's episodes as units (``tools/parallel.py``), then the rows, in the sweep's order.

A unit is one episode of one cell, the aura readout's ceiling, or one dms compression stream, and is
named by what it runs (``BenchUnit.key``), so its result does not depend on which worker ran it and a
resumed run keeps what an earlier one finished. The aura baselines run in a second pass: at each N
they write at the rate the surprise gate measured there (the same write budget). The per-policy
overheads are timed afterwards, alone (``overhead.py``).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import default_of
from ...engine.vla_engine import VlaEngine
from ...model.checkpoint import Checkpoint, load_checkpoint
from ...model.init_model import preset, write_random_model
from ...model.vl.frames import with_frame_geometry
from ...worlds.scenes import PROTOTYPE, TEST
from ..parallel import Job, Unit, UnitsFailed, run_figures, run_units
from .cells import aura_capacity, aura_policy, bench_engine, cosine_protect, dms_policy, window_capacity, window_policy
from .measure import aura_episode, dms_episode, measure_compression, readout_ceiling, window_episode
from .overhead import measure_overhead
from .report import SCHEMA, build_report
from .scoring import NOT_DMS, aura_row, dms_row, window_row
from .spec import AURA_GATES, MODEL_SEED, BenchSpec, make_episode, make_episodes


@dataclass(frozen=True)
class BenchUnit:
    """One unit of the sweep (tools/parallel.py): one episode of one cell, the readout ceiling, or one dms
    compression stream. ``split`` and ``index`` name the episode; the rest name the cell."""

    kind: str  # window | dms | aura | ceiling | compression
    n: int = 0  # distractors
    frames: int = 0  # memory budget F (window, dms)
    policy: str = ""  # window: fifo or cosine
    signature: str | None = None  # window, cosine
    target: float = 0.0  # dms target ratio
    gate: str = ""  # aura gate
    rate: float = 1.0  # aura random/periodic gate rate
    split: int = TEST
    index: int = 0

    @property
    def key(self) -> str:
        fields = [self.kind, self.policy, self.signature or "", self.gate, f"n{self.n}", f"f{self.frames}",
                  f"t{self.target:g}", f"r{self.rate!r}", f"s{self.split}", f"e{self.index}"]
        return "_".join(field for field in fields if field)


@dataclass(frozen=True)
class BenchContext:
    spec: BenchSpec
    model_dir: Path | None  # None: the tiny preset, written by each worker from MODEL_SEED (the same bytes)


def prepare(context: BenchContext) -> dict[str, Any]:
    """A worker's state: the checkpoint, read once, and an engine per cell, built on first use."""
    state: dict[str, Any] = {"spec": context.spec, "engines": {}}
    model_dir = context.model_dir
    if model_dir is None:
        state["scratch"] = tempfile.TemporaryDirectory(prefix="vla-memory-bench-")  # removed with the state
        model_dir = write_random_model(Path(state["scratch"].name) / "tiny", preset("tiny"), seed=MODEL_SEED)
    # a VL checkpoint's frames at the schema's default pixel cap, as the runtime would see them
    state["checkpoint"] = with_frame_geometry(load_checkpoint(model_dir), default_of("reasoning", "vision_max_pixels"))
    return state


def run_unit(state: dict[str, Any], unit: BenchUnit) -> dict[str, Any]:
    """One unit's result, from its spec alone: an episode restarts its engine's memory from the prompt."""
    spec, checkpoint, engines = state["spec"], state["checkpoint"], state["engines"]

    def engine(cell: tuple, build: Callable[[], VlaEngine]) -> VlaEngine:
        if cell not in engines:
            engines[cell] = build()
        return engines[cell]

    if unit.kind == "window":
        episode = make_episode(spec, TEST, unit.index, unit.n)
        return window_episode(engine(("window", unit.policy, unit.signature, unit.frames), lambda: bench_engine(
            checkpoint, window_policy(unit.policy, unit.frames, unit.signature),
            window_capacity(checkpoint, unit.frames))), episode)
    if unit.kind == "dms":
        episode = make_episode(spec, TEST, unit.index, unit.n, spec.dms_lead_in)
        return dms_episode(engine(("dms", unit.target, unit.frames), lambda: bench_engine(
            checkpoint, dms_policy(spec, unit.target), window_capacity(checkpoint, unit.frames))),
            spec, episode, checkpoint)

    def aura() -> VlaEngine:
        return engine(("aura",), lambda: bench_engine(checkpoint, aura_policy("surprise", 1.0, 0),
                                                       aura_capacity(checkpoint)))

    if unit.kind == "aura":
        return aura_episode(aura(), unit.gate, unit.rate, make_episode(spec, unit.split, unit.index, unit.n))
    if unit.kind == "ceiling":
        return {"accuracy": readout_ceiling(aura(), spec, make_episodes(spec, TEST, spec.episodes, unit.n),
                                            make_episodes(spec, PROTOTYPE, spec.prototype_episodes, unit.n))}
    return measure_compression(checkpoint, spec, unit.target)


def _pass_one(spec: BenchSpec) -> list[BenchUnit]:
    """Every unit that needs no other's result: all but the aura baselines, which run at the surprise gate's
    measured write rate."""
    units = []
    for n in spec.distractors:
        for name in (p for p in spec.policies if p in ("fifo", "cosine")):
            for signature in spec.cosine_signatures if name == "cosine" else (None,):
                units += [BenchUnit("window", n, frames, name, signature, index=i)
                          for frames in spec.budgets for i in range(spec.episodes)]
        if "dms" in spec.policies:
            units += [BenchUnit("dms", n, frames, target=target, index=i)
                      for target in spec.dms_targets for frames in spec.budgets for i in range(spec.episodes)]
        if "aura" in spec.policies:
            for gate in ("surprise", "every_frame"):
                units += _aura_units(spec, n, gate, 1.0)
    if "aura" in spec.policies:
        units.append(BenchUnit("ceiling", spec.distractors[0]))  # cue frames do not depend on N
    if "dms" in spec.policies:
        units += [BenchUnit("compression", target=target) for target in spec.dms_targets]
    return units


def _aura_units(spec: BenchSpec, n: int, gate: str, rate: float) -> list[BenchUnit]:
    return ([BenchUnit("aura", n, gate=gate, rate=rate, split=TEST, index=i) for i in range(spec.episodes)]
            + [BenchUnit("aura", n, gate=gate, rate=rate, split=PROTOTYPE, index=i)
               for i in range(spec.prototype_episodes)])


def _episodes(results: dict[str, dict], spec: BenchSpec, unit: BenchUnit) -> list[dict[str, Any]]:
    """The results of a cell's episodes, in episode order (``unit`` names the cell, index 0)."""
    count = spec.prototype_episodes if unit.split == PROTOTYPE else spec.episodes
    return [results[BenchUnit(**{**unit.__dict__, "index": i}).key] for i in range(count)]


def run_bench(spec: BenchSpec, model_dir: Path | None = None, out: Path | None = None, *, workers: int | None = None,
              ray_address: str | None = None, resume: bool = False,
              progress: Callable[[str], None] = lambda line: None,
              bar: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Run the whole sweep and return the report (``report.py`` says its schema). Episodes are units
    (tools/parallel.py) written to ``out/units`` as they finish; the report does not depend on which worker
    ran what. The per-policy overheads are timed afterwards, here, alone, since they are timings."""
    spec.validate()
    with tempfile.TemporaryDirectory(prefix="vla-memory-bench-") as scratch:
        out = out or Path(scratch)
        context = BenchContext(spec, model_dir)
        identity = hashlib.sha256(json.dumps([SCHEMA, repr(spec), str(model_dir)]).encode()).hexdigest()
        job = Job(prepare, run_unit, context, identity)
        first = _pass_one(spec)
        rates = {}
        second_size = (2 * (spec.episodes + spec.prototype_episodes) * len(spec.distractors)) \
            if "aura" in spec.policies else 0
        total = len(first) + second_size
        summaries = [run_units(job, [Unit(u.key, u) for u in first], out, workers=workers, ray_address=ray_address,
                               resume=resume, progress=lambda done, _t: bar(done, total))]
        results = dict(summaries[0].results)
        if "aura" in spec.policies:
            for n in spec.distractors:
                tests = _episodes(results, spec, BenchUnit("aura", n, gate="surprise", rate=1.0))
                measured = sum(r["writes"] for r in tests) / sum(r["frames"] for r in tests)
                rates[n] = min(1.0, max(measured, 1e-6))
            second = [u for n in spec.distractors for gate in ("random", "periodic")
                      for u in _aura_units(spec, n, gate, rates[n])]
            summaries.append(run_units(job, [Unit(u.key, u) for u in second], out, workers=workers,
                                       ray_address=ray_address, resume=resume,
                                       progress=lambda done, _t: bar(len(first) + done, total)))
            results.update(summaries[-1].results)
        failed = {key: why for summary in summaries for key, why in summary.failed.items()}
        if failed:
            raise UnitsFailed(f"{len(failed)} units failed "
                              f"({'; '.join(f'{k}: {w.splitlines()[-1]}' for k, w in sorted(failed.items()))}); "
                              f"the finished ones are in {out / 'units'}: --resume runs only what is missing")
        state = prepare(context)
        checkpoint = state["checkpoint"]
        rows = _rows(spec, checkpoint, results, rates, progress)
        ceiling = results[BenchUnit("ceiling", spec.distractors[0]).key]["accuracy"] \
            if "aura" in spec.policies else None
        compression = [results[BenchUnit("compression", target=t).key] for t in spec.dms_targets] \
            if "dms" in spec.policies else []
        for c in compression:
            progress(f"dms    target {c['target_ratio']:g}: {c['compression']:.2f}x over {c['frames']} frames")
        overhead = []
        for name in spec.policies:
            overhead.append(measure_overhead(checkpoint, name, spec))
            progress(f"{name:<6} overhead at {spec.overhead_arena_frames} frames: {overhead[-1]['policy_ms']:.3f} ms")
        config = checkpoint.config
    return build_report(spec, model_dir, config, rows, ceiling, compression, overhead,
                        run_figures(summaries, ray_address))


def _rows(spec: BenchSpec, checkpoint: Checkpoint, results: dict[str, dict], rates: dict[int, float],
          progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """The report's rows from the episodes' results, in the sweep's order: per N, the windows, dms, aura."""
    rows = []
    for n in spec.distractors:
        for name in (p for p in spec.policies if p in ("fifo", "cosine")):
            for signature in spec.cosine_signatures if name == "cosine" else (None,):
                for frames in spec.budgets:
                    row = window_row(_episodes(results, spec, BenchUnit("window", n, frames, name, signature)))
                    rows.append({"policy": name, "gate": None, "gate_rate": None, "signature": signature, **NOT_DMS,
                                 "distractors": n, "budget_frames": frames,
                                 "kv_capacity_tokens": window_capacity(checkpoint, frames),
                                 "protect_recent_frames": cosine_protect(frames) if name == "cosine" else None,
                                 **row, "readout_accuracy": None})
                    progress(f"{name:<6} {signature or '':<10} N={n:<4} F={frames:<3} cue kept {row['cue_kept']:.2f}")
        if "dms" in spec.policies:
            for target in spec.dms_targets:
                for frames in spec.budgets:
                    row = dms_row(_episodes(results, spec, BenchUnit("dms", n, frames, target=target)))
                    rows.append({"policy": "dms", "gate": None, "gate_rate": None, "signature": None,
                                 "target_ratio": target, "distractors": n, "budget_frames": frames,
                                 "kv_capacity_tokens": window_capacity(checkpoint, frames),
                                 "protect_recent_frames": None, **row, "readout_accuracy": None})
                    progress(f"dms    target {target:<4g} N={n:<4} F={frames:<3} cue kept {row['cue_kept']:.2f}, "
                             f"entries {row['cue_entries_kept']:.2f}")
        if "aura" in spec.policies:
            for gate in AURA_GATES:
                rate = 1.0 if gate in ("surprise", "every_frame") else rates[n]
                cell = BenchUnit("aura", n, gate=gate, rate=rate)
                row = aura_row(gate, None if gate == "surprise" else rate, aura_capacity(checkpoint),
                               _episodes(results, spec, cell),
                               _episodes(results, spec, BenchUnit(**{**cell.__dict__, "split": PROTOTYPE})),
                               spec.classes)
                rows.append({**row, "signature": None, "distractors": n, "budget_frames": None})
            progress(f"aura   N={n:<4} {len(AURA_GATES)} gates")
    for row in rows:
        row["chance"] = 1.0 / spec.classes
    return rows
