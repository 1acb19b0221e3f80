"""``vla-edge memory-bench``: can the model forget the right things?

Each episode is a ``CueScene``: one cue frame (class = episode index % K), N near-identical
distractor frames, then a query frame. At the query we ask each KV policy whether what it kept
still holds the cue:

- ``fifo`` / ``cosine`` with a memory budget of F frames (KV arena = prompt + F * tokens_per_frame
  + dof tokens): ``cue_kept`` (the cue frame's slots are still one of the policy's frames; tracked
  by identity of the policy's entry, because slot numbers are reused after evictions) and
  ``cue_attention`` (attention mass of the query frame's last token on the cue's slots, summed
  over them, mean over layers and heads; 0 once evicted), beside ``uniform_attention`` (cue tokens
  / visible tokens: what a reader that looks everywhere equally would give).
- ``aura`` (F does not apply: it keeps no past frames as KV): nearest-prototype readout of what
  the memory adds to the present at the query, r - v_query, where r = W q + b is the read (q from
  the query frame exactly as ``AuraPolicy`` computes it, read before the query is written) and
  v_query the query frame's own value (W_v z_w). Subtracting the present matters: the episodes' own
  tables and clutter move the raw read far more than a small cue does, and a readout of the raw
  read scored chance even on a perfect memory (the ceiling below). Prototypes are per-class mean reads over
  separate prototype episodes (other seeds, same N); a read is classified by its highest cosine
  to (prototype - mean prototype) after subtracting the same mean. Four gates run: the
  ``surprise`` gate (the policy's defaults), ``every_frame`` (a periodic gate of rate 1), and ``random`` / ``periodic``
  at the write rate the surprise gate measured in that N (the same write budget); all but the first are
  evaluation's baselines (``tools/aura_gates.py``).
- ``dms`` with the same F-frame arena as fifo and cosine, per target ratio r (``dms_targets``), on
  episodes of the same scenes with ``dms_lead_in`` look-alike frames before the cue. Without them
  the cue would be an episode's first frame, judged against the text prompt alone and, with no score
  history yet, against its own quantile, so dms would keep 1/r of it whatever it showed; with them
  the cue must stand out from a window of near-duplicates, as it must for cosine (fifo keeps the
  newest F frames, so frames before the cue change nothing for it). Reported: ``cue_kept`` (the
  fraction of episodes in which some KV head still reads some cue token: dms keeps parts of frames),
  ``cue_entries_kept`` (the fraction of the cue's (token, layer, KV head) entries still read),
  ``cue_centre_kept`` (the same for the one token whose grid cell holds the centre of the cue disc:
  did the heads keep the part of the frame that carries the cue, more than the 1/r they keep of
  everything?),
  ``cue_attention`` (as for fifo, over the cue tokens still held; a head that evicted one gives it no
  weight), ``uniform_attention`` (mean over heads of cue entries / tokens the head reads),
  ``compression`` (tokens seen / tokens kept, pooled over heads) and ``forced_evictions``. The
  compression claim is measured apart (``dms_compression``) on a stream of ``compression_frames``
  frames in an arena that holds every token, so what is kept is what the heads chose, never what
  lack of room forced.

Output ``memory_bench.json`` (schema ``vla_edge_ros.memory_bench/2``)::

    schema      "vla_edge_ros.memory_bench/2"
    config      model ("tiny preset, seed S" or the --model path), episodes, distractors [N],
                budgets [F], policies, classes K, seed, prototypes_per_class, prompt_tokens,
                tokens_per_frame, dof, kv_bytes_per_token, frame_hw, dms_targets, dms_window,
                dms_lead_in, compression_frames
    rows        one per policy x N x F (cosine: x signature; aura: x gate, budget_frames null;
                dms: x target ratio):
                  policy, gate (aura: surprise|every_frame|random|periodic, else null),
                  signature (cosine: keys|values|embeddings, else null),
                  gate_rate (aura baselines' write rate, else null), target_ratio (dms, else null),
                  distractors, budget_frames,
                  kv_capacity_tokens, protect_recent_frames (cosine, else null), episodes,
                  cue_kept (fraction of episodes; fifo/cosine/dms, else null),
                  cue_entries_kept, cue_centre_kept, compression, forced_evictions (dms, else null),
                  cue_attention, uniform_attention (means; fifo/cosine/dms, else null),
                  readout_accuracy (aura, else null), chance (1/K),
                  writes_per_frame, evictions (mean per episode; dms: tokens, not frames),
                  memory_bytes, kv_bytes, state_bytes (max over episodes, at the query)
    dms_compression  one per target ratio: target_ratio, window, frames, tokens_seen,
                compression (tokens seen / tokens kept, pooled over every layer and KV head),
                decision_compression (tokens decided / keep decisions: without the window's share),
                slot_compression (tokens seen / slots held), forced_evictions,
                held_per_head [layers][kv_heads], compression_per_head [layers][kv_heads]
                (null for a head that keeps nothing), page_tokens, pages_per_head [layers][kv_heads],
                kv_bytes_held (the pages in use, prompt included), kv_bytes_dense (every token seen and the
                prompt, every head), byte_compression (dense bytes / bytes the pages hold, the prompt's
                share out of both: what memory holds), byte_compression_per_layer [layers]
    aura_readout_ceiling  the aura readout applied to v_cue - v_query (what a memory returning the
                cue's value exactly would give; null without aura). When it is not above chance
                (two binomial standard errors), the aura recall claims are "not tested".
    overhead    one per policy: policy, arena_frames, frames, policy_ms (median per frame of the
                policy's own make_room + add_frame (+ frame_prefix)), add_frame_ms (median full
                engine.add_frame)
    claims      id, claim, verdict ("holds" | "fails" | "not tested"), evidence (the numbers)
    runtime_s   wall time of the run
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import MemoryKnobs, default_of
from ..engine.vla_engine import VlaEngine
from ..memory import POLICIES, AuraPolicy, DmsPolicy, MemoryPolicy, make_policy
from ..memory.cosine import SIGNATURES
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.init_model import preset, write_random_model
from ..model.layout import arena_capacity, kv_bytes_per_token
from ..model.vl_frames import with_frame_geometry
from ..worlds.scenes import COMPRESSION, MAX_CLASSES, OVERHEAD, PROTOTYPE, TEST, CueScene, scene_seed
from .aura_gates import baseline_policy
from .parallel import Job, Unit, UnitsFailed, run_figures, run_units

SCHEMA = "vla_edge_ros.memory_bench/2"
PROMPT = tuple(range(1, 9))  # a fixed 8-token instruction; the bench is about frames, not words
MODEL_SEED = 0
FRAME_HW = (64, 64)
AURA_GATES = ("surprise", "every_frame", "random", "periodic")
NOT_DMS = {"target_ratio": None, "cue_entries_kept": None, "cue_centre_kept": None, "compression": None,
           "forced_evictions": None}
SEVERAL = 3.0  # "several times fewer writes" means at least this factor
REACHES = 0.95  # "dms reaches r x compression" means a measured ratio of at least this times r
FREES = 0.85  # "dms frees the memory it compresses": bytes held shrink at least this share of the token ratio


@dataclass(frozen=True)
class BenchSpec:
    """What to sweep; the defaults keep a run to a few minutes on a 2-core CPU."""

    episodes: int = 32  # two binomial standard errors above chance 1/4 is then 0.40
    distractors: tuple[int, ...] = (4, 16, 64)
    budgets: tuple[int, ...] = (4, 8, 16)
    policies: tuple[str, ...] = POLICIES
    cosine_signatures: tuple[str, ...] = SIGNATURES  # the first is the one the claims judge
    classes: int = 4
    seed: int = 0
    prototypes_per_class: int = 4
    overhead_arena_frames: int = 64
    overhead_frames: int = 200
    dms_targets: tuple[float, ...] = (4.0, 8.0)  # the last is the one the recall claim judges
    dms_window: int = 32
    dms_lead_in: int = 4  # look-alike frames before the cue in dms episodes (see the module doc)
    compression_frames: int = 256

    def validate(self) -> None:
        for name in ("episodes", "prototypes_per_class", "overhead_arena_frames", "overhead_frames", "dms_window",
                     "compression_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dms_lead_in < 0:
            raise ValueError(f"dms_lead_in must be >= 0, got {self.dms_lead_in}")
        for name in ("distractors", "budgets"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        if not self.cosine_signatures or any(sig not in SIGNATURES for sig in self.cosine_signatures):
            raise ValueError(f"cosine_signatures must be a non-empty subset of {SIGNATURES}, "
                             f"got {list(self.cosine_signatures)}")
        unknown = [p for p in self.policies if p not in POLICIES]
        if not self.policies or unknown:
            raise ValueError(f"policies must be a non-empty subset of {POLICIES}, got {list(self.policies)}")
        if not 2 <= self.classes <= MAX_CLASSES:
            raise ValueError(f"classes must be in [2, {MAX_CLASSES}] (chance must be below 1), got {self.classes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not self.dms_targets or min(self.dms_targets) < 1:
            raise ValueError(f"dms_targets must be a non-empty list of ratios >= 1, got {list(self.dms_targets)}")


@dataclass(frozen=True)
class Episode:
    cls: int
    seed: int
    frames: list[np.ndarray]
    cue_index: int = 0  # the cue's frame: after ``lead_in`` look-alike frames


def make_episode(spec: BenchSpec, split: int, index: int, distractors: int, lead_in: int = 0) -> Episode:
    """Episode ``index`` of ``split``, seeded: ``lead_in`` distractor frames, the cue, ``distractors``
    distractors, the query."""
    seed, cls = scene_seed(spec.seed, split, index), index % spec.classes
    scene = CueScene(seed, classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    before = [scene.distractor_frame() for _ in range(lead_in)]
    return Episode(cls, seed, before + scene.episode(cls, distractors), lead_in)


def make_episodes(spec: BenchSpec, split: int, count: int, distractors: int, lead_in: int = 0) -> list[Episode]:
    return [make_episode(spec, split, index, distractors, lead_in) for index in range(count)]


def _engine(checkpoint: Checkpoint, policy: MemoryPolicy, capacity: int) -> VlaEngine:
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt(list(PROMPT))
    return engine


def window_capacity(checkpoint: Checkpoint, frames: int) -> int:
    """KV tokens for ``frames`` frames beside the pinned prompt and the action scratch."""
    return arena_capacity(checkpoint.config, len(PROMPT), frames)


def cosine_protect(frames: int) -> int:
    """The configured default (4), but never more than half the window, so cosine can choose."""
    return min(4, frames // 2)


def _window_policy(name: str, frames: int, signature: str | None = None) -> MemoryPolicy:
    knobs: dict[str, Any] = {"kv.cosine.protect_recent_frames": cosine_protect(frames)}
    if signature is not None:
        knobs["kv.cosine.signature"] = signature
    return make_policy(name, knobs)


def _memory_columns(engine: VlaEngine) -> dict[str, int]:
    stats = engine.memory_stats()
    return {"memory_bytes": stats.memory_bytes, "kv_bytes": stats.kv_bytes, "state_bytes": stats.state_bytes}


def _summarise(per_episode: list[dict[str, Any]]) -> dict[str, Any]:
    """Episode results -> one row's shared columns (means of rates, max of bytes)."""
    return {
        "episodes": len(per_episode),
        "writes_per_frame": float(np.mean([e["writes"] / e["frames"] for e in per_episode])),
        "evictions": float(np.mean([e["evictions"] for e in per_episode])),
        **{key: max(e[key] for e in per_episode) for key in ("memory_bytes", "kv_bytes", "state_bytes")},
    }


def window_episode(engine: VlaEngine, episode: Episode) -> dict[str, Any]:
    """fifo or cosine, one episode: is the cue still cached and read at the query?"""
    engine.set_prompt(list(PROMPT))
    cue = engine.add_frame(episode.frames[0])
    cue_entry = engine.policy.frames[-1]  # the policy's own record of the cue: identity survives slot reuse
    for image in episode.frames[1:-1]:
        engine.add_frame(image)
    query = engine.add_frame(episode.frames[-1], probe_attention=True)
    kept = any(entry is cue_entry for entry in engine.policy.frames)
    attention = float(query.attention[..., cue.slots].sum(axis=-1).mean()) if kept else 0.0
    stats = engine.memory_stats()
    return {"kept": kept, "attention": attention, "uniform": cue.slots.size / engine.arena.used,
            "writes": stats.writes, "frames": stats.frames_seen, "evictions": stats.evictions,
            **_memory_columns(engine)}


def window_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One fifo/cosine cell from its episodes."""
    return {
        "cue_kept": float(np.mean([r["kept"] for r in results])),
        "cue_attention": float(np.mean([r["attention"] for r in results])),
        "uniform_attention": float(np.mean([r["uniform"] for r in results])),
        **_summarise(results),
    }


def _dms_policy(spec: BenchSpec, target: float) -> DmsPolicy:
    return make_policy("dms", {"kv.dms.target_ratio": target, "kv.dms.window": spec.dms_window})


def cue_token(spec: BenchSpec, episode: Episode, checkpoint: Checkpoint) -> int:
    """Index of the frame token whose cell of the encoder's grid holds the centre of the cue disc."""
    scene = CueScene(episode.seed, classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    cy, cx, _ = scene.cue_region(episode.cls)
    grid = checkpoint.config.vision.pool_grid
    return int(cy * grid / FRAME_HW[0]) * grid + int(cx * grid / FRAME_HW[1])


def dms_episode(engine: VlaEngine, spec: BenchSpec, episode: Episode, checkpoint: Checkpoint) -> dict[str, Any]:
    """dms in the same F-frame arena as fifo and cosine, one episode: how much of the cue do the heads read?"""
    engine.set_prompt(list(PROMPT))
    for index, image in enumerate(episode.frames[:-1]):
        prefill = engine.add_frame(image)
        if index == episode.cue_index:
            centre = int(prefill.slots[cue_token(spec, episode, checkpoint)])
    query = engine.add_frame(episode.frames[-1], probe_attention=True)
    policy: DmsPolicy = engine.policy
    entries = policy.entries_of_frame(episode.cue_index)  # [layers, kv_heads] cue tokens each head reads
    cue_slots = policy.slots_of_frame(episode.cue_index)
    reads = engine.arena.pages.held_per_head()  # tokens each head reads
    report, stats = policy.compression(), engine.memory_stats()
    return {"kept": bool(entries.sum()), "entries": float(entries.mean()) / engine.tokens_per_frame,
            "centre": float(engine.arena.holds(np.array([centre])).mean()) if centre in cue_slots else 0.0,
            "attention": float(query.attention[..., cue_slots].sum(axis=-1).mean()),
            "uniform": float((entries / reads).mean()), "compression": report.ratio,
            "forced": report.forced_evictions, "writes": stats.writes,
            "frames": stats.frames_seen, "evictions": stats.evictions, **_memory_columns(engine)}


def dms_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One dms cell from its episodes."""
    return {
        "cue_kept": float(np.mean([r["kept"] for r in results])),
        "cue_entries_kept": float(np.mean([r["entries"] for r in results])),
        "cue_centre_kept": float(np.mean([r["centre"] for r in results])),
        "cue_attention": float(np.mean([r["attention"] for r in results])),
        "uniform_attention": float(np.mean([r["uniform"] for r in results])),
        "compression": float(np.mean([r["compression"] for r in results])),
        "forced_evictions": float(np.mean([r["forced"] for r in results])),
        **_summarise(results),
    }


def measure_compression(checkpoint: Checkpoint, spec: BenchSpec, target: float) -> dict[str, Any]:
    """dms at ``target`` over ``compression_frames`` frames of back-to-back episodes (largest N) in an arena
    with room for every token, so nothing is forced out and the ratio is the heads' own choice."""
    n = max(spec.distractors)
    episodes = make_episodes(spec, COMPRESSION, math.ceil(spec.compression_frames / (n + 2)), n)
    stream = [image for episode in episodes for image in episode.frames][:spec.compression_frames]
    engine = _engine(checkpoint, _dms_policy(spec, target), window_capacity(checkpoint, len(stream)))
    for image in stream:
        engine.add_frame(image)
    report = engine.policy.compression()
    return {"target_ratio": target, "window": spec.dms_window, "frames": len(stream),
            "tokens_seen": report.tokens_seen, "compression": report.ratio,
            "decision_compression": report.decision_ratio, "slot_compression": report.slot_ratio,
            "forced_evictions": report.forced_evictions, "held_per_head": report.held_per_head.tolist(),
            "compression_per_head": [[float(r) if math.isfinite(r) else None for r in layer]
                                     for layer in report.ratio_per_head],
            "page_tokens": report.page_tokens, "pages_per_head": report.pages_per_head.tolist(),
            "kv_bytes_held": engine.memory_stats().kv_bytes,
            "kv_bytes_dense": (report.tokens_seen + report.prompt_tokens) * kv_bytes_per_token(checkpoint.config),
            "byte_compression": _finite(report.byte_ratio),
            "byte_compression_per_layer": [_finite(r) for r in report.byte_ratio_per_layer]}


def _finite(ratio: float) -> float | None:
    return float(ratio) if math.isfinite(ratio) else None


def _unit(x: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(x))
    return (x / norm).astype(np.float32) if norm > 0 else x.astype(np.float32)


def aura_read(policy: AuraPolicy) -> np.ndarray:
    """What the aura memory added to the frame it saw last: r - v, the read before that frame's write minus the
    frame's own value (as ``AuraPolicy`` made them, in any feature layout)."""
    if policy.last_read is None or policy.last_value is None:
        raise RuntimeError("aura_read: the policy has seen no frame")
    return policy.last_read - policy.last_value


def aura_policy(gate: str, rate: float, seed: int) -> AuraPolicy:
    if gate == "surprise":
        return make_policy("aura")
    if gate == "every_frame":
        return baseline_policy(MemoryKnobs.of().aura, "periodic", 1.0)
    return baseline_policy(MemoryKnobs.of().aura, gate, rate, seed)


def aura_episode(engine: VlaEngine, gate: str, rate: float, episode: Episode) -> dict[str, Any]:
    """One episode under a fresh aura policy: its read at the query, writes and bytes."""
    engine.set_policy(aura_policy(gate, rate, episode.seed))
    for image in episode.frames:
        engine.add_frame(image)
    read = aura_read(engine.policy)
    stats = engine.memory_stats()
    return {"cls": episode.cls, "read": [float(x) for x in read], "writes": stats.writes, "frames": stats.frames_seen,
            "evictions": stats.evictions, **_memory_columns(engine)}


def prototype_accuracy(prototype_runs: list[dict[str, Any]], test_runs: list[dict[str, Any]], classes: int) -> float:
    """Fraction of test reads whose nearest centred class prototype (by cosine) is their own class."""
    def read(run: dict[str, Any]) -> np.ndarray:  # fp32, as the memory returned it (a result file holds floats)
        return np.asarray(run["read"], dtype=np.float32)

    prototypes = np.stack([np.mean([read(r) for r in prototype_runs if r["cls"] == c], axis=0)
                           for c in range(classes)])
    centre = prototypes.mean(axis=0)
    centred = np.stack([_unit(p - centre) for p in prototypes])
    hits = [int(np.argmax(centred @ _unit(read(r) - centre))) == r["cls"] for r in test_runs]
    return float(np.mean(hits))


def readout_ceiling(engine: VlaEngine, spec: BenchSpec, tests: list[Episode], prototypes: list[Episode]) -> float:
    """The same readout on v_cue - v_query (each value as the aura policy makes it from an empty memory):
    what a memory returning the cue's value exactly would give. At chance, the readout cannot tell the
    classes apart even from a perfect memory."""
    def value(image: np.ndarray) -> np.ndarray:
        engine.set_policy(aura_policy("no-write", 1.0, 0))
        engine.add_frame(image)
        return engine.policy.last_value

    def values(episodes: list[Episode]) -> list[dict[str, Any]]:
        return [{"cls": e.cls, "read": (value(e.frames[0]) - value(e.frames[-1])).tolist()} for e in episodes]

    return prototype_accuracy(values(prototypes), values(tests), spec.classes)


def above_chance(accuracy: float, chance: float, episodes: int) -> bool:
    """More than two binomial standard errors above chance."""
    return accuracy > chance + 2 * math.sqrt(chance * (1 - chance) / episodes)


def aura_capacity(checkpoint: Checkpoint) -> int:
    return arena_capacity(checkpoint.config, len(PROMPT), 1, reserved_tokens=1)  # aura: one memory token


def aura_row(gate: str, rate: float | None, capacity: int, tests: list[dict[str, Any]],
             prototypes: list[dict[str, Any]], classes: int) -> dict[str, Any]:
    """One aura gate at one N, from its test and prototype episodes."""
    return {"policy": "aura", "gate": gate, **NOT_DMS, "gate_rate": rate, "kv_capacity_tokens": capacity,
            "protect_recent_frames": None, "cue_kept": None, "cue_attention": None, "uniform_attention": None,
            "readout_accuracy": prototype_accuracy(prototypes, tests, classes), **_summarise(tests)}


@contextmanager
def _timing(policy: MemoryPolicy, names: tuple[str, ...]) -> Iterator[list[float]]:
    """Accumulate the time spent in ``policy``'s named methods into the yielded one-element list."""
    spent = [0.0]
    originals = {name: getattr(policy, name) for name in names}

    def timed(method: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return call

    for name, method in originals.items():
        setattr(policy, name, timed(method))
    try:
        yield spent
    finally:
        for name in names:
            delattr(policy, name)  # the instance attribute goes; the class's method shows again


def measure_overhead(checkpoint: Checkpoint, name: str, spec: BenchSpec) -> dict[str, Any]:
    """Median per-frame cost of the policy's own work, and of the whole add_frame, on a full arena."""
    arena_frames = spec.overhead_arena_frames
    policy = _dms_policy(spec, spec.dms_targets[0]) if name == "dms" else _window_policy(name, arena_frames)
    engine = _engine(checkpoint, policy, window_capacity(checkpoint, arena_frames))
    scene = CueScene(scene_seed(spec.seed, OVERHEAD, 0), classes=spec.classes, height=FRAME_HW[0], width=FRAME_HW[1])
    for _ in range(arena_frames):  # fill the window first, so every timed frame evicts (dms: decides and enforces)
        engine.add_frame(scene.distractor_frame())
    methods = ("frame_prefix", "make_room", "add_frame") if name == "aura" else ("make_room", "add_frame")
    policy_ms, total_ms = [], []
    images = [scene.distractor_frame() for _ in range(spec.overhead_frames)]
    with _timing(engine.policy, methods) as spent:
        for image in images:
            spent[0] = 0.0
            start = time.perf_counter()
            engine.add_frame(image)
            total_ms.append((time.perf_counter() - start) * 1e3)
            policy_ms.append(spent[0] * 1e3)
    return {"policy": name, "arena_frames": arena_frames, "frames": len(images),
            "policy_ms": float(np.median(policy_ms)), "add_frame_ms": float(np.median(total_ms))}


def evaluate_claims(rows: list[dict[str, Any]], episodes: int, chance: float, ceiling: float | None,
                    compression: list[dict[str, Any]], signature: str = SIGNATURES[0]) -> list[dict[str, Any]]:
    """Each claim's verdict from the measured rows; nothing here knows the answer in advance."""
    def find(policy: str, **where) -> list[dict[str, Any]]:
        return [r for r in rows if r["policy"] == policy and all(r[k] == v for k, v in where.items())]

    def verdict(tested: bool, passed: list[bool]) -> str:
        return "not tested" if not (tested and passed) else "holds" if all(passed) else "fails"

    cells = [{"distractors": f["distractors"], "budget_frames": f["budget_frames"], "fifo_cue_kept": f["cue_kept"],
              "cosine_cue_kept": c["cue_kept"], "cosine_cue_attention": c["cue_attention"],
              "uniform_attention": c["uniform_attention"]}
             for f in find("fifo") if f["cue_kept"] == 0
             for c in find("cosine", distractors=f["distractors"], budget_frames=f["budget_frames"],
                           signature=signature)]
    claims = [{"id": "1", "claim": f"cosine ({signature} signature) keeps the cue (in most episodes) in every cell "
                                    "where fifo lost it in all",
               "verdict": verdict(True, [c["cosine_cue_kept"] > 0.5 for c in cells]), "evidence": cells}]

    sizes = sorted({r["state_bytes"] for r in find("aura")})
    claims.append({"id": "2a", "claim": "aura state bytes are the same for every number of distractors",
                   "verdict": verdict(True, [len(sizes) == 1] if sizes else []),
                   "evidence": {"state_bytes": sizes, "distractors": sorted({r["distractors"] for r in find("aura")})}})
    per_n = []
    for surprise in find("aura", gate="surprise"):
        gates = {r["gate"]: r for r in find("aura", distractors=surprise["distractors"])}
        per_n.append({"distractors": surprise["distractors"], "chance": chance, "readout_ceiling": ceiling,
                      **{f"{g}_accuracy": gates[g]["readout_accuracy"] for g in AURA_GATES},
                      **{f"{g}_writes_per_frame": gates[g]["writes_per_frame"] for g in AURA_GATES}})
    # recall comparisons mean nothing when the readout cannot tell the classes apart from the cue itself
    readable = ceiling is not None and above_chance(ceiling, chance, episodes)
    claims.append({"id": "2b", "claim": f"the surprise gate writes at least {SEVERAL:g}x less than write-every-frame, "
                                         "at equal or better readout accuracy that is above chance, for every N",
                   "verdict": verdict(readable, [
                       c["every_frame_writes_per_frame"] >= SEVERAL * c["surprise_writes_per_frame"]
                       and c["surprise_accuracy"] >= c["every_frame_accuracy"]
                       and above_chance(c["surprise_accuracy"], chance, episodes) for c in per_n]),
                   "evidence": per_n})
    claims.append({"id": "3", "claim": "random and periodic gates at the surprise gate's write budget read out less "
                                        "accurately than the surprise gate, for every N",
                   "verdict": verdict(readable, [
                       c["surprise_accuracy"] > max(c["random_accuracy"], c["periodic_accuracy"]) for c in per_n]),
                   "evidence": per_n})
    targets = " and ".join(f"{c['target_ratio']:g}x" for c in compression) or "its target"
    claims.append({"id": "4", "claim": f"dms reaches {targets} compression: tokens "
                                        f"seen / tokens kept, pooled over every layer and KV head, at least {REACHES:g} "
                                        "x the target ratio, on a stream with no forced evictions",
                   "verdict": verdict(bool(compression), [
                       c["forced_evictions"] == 0 and c["compression"] >= REACHES * c["target_ratio"]
                       for c in compression]),
                   "evidence": compression})
    claims.append({"id": "4c", "claim": f"dms frees the memory it compresses: bytes of a dense cache of every token "
                                         f"seen / bytes of KV its pages hold, pooled over layers and KV heads, at "
                                         f"least {FREES:g} x the token compression, at {targets}",
                   "verdict": verdict(bool(compression), [
                       c["byte_compression"] is not None and c["byte_compression"] >= FREES * c["compression"]
                       for c in compression]),
                   "evidence": [{key: c[key] for key in ("target_ratio", "compression", "byte_compression",
                                                         "byte_compression_per_layer", "kv_bytes_held",
                                                         "kv_bytes_dense")} for c in compression]})
    dms_target = max((r["target_ratio"] for r in find("dms")), default=None)
    dms_cells = [{"distractors": f["distractors"], "budget_frames": f["budget_frames"], "target_ratio": dms_target,
                  "keep_share": 1 / dms_target, "fifo_cue_kept": f["cue_kept"], "dms_cue_kept": d["cue_kept"],
                  "dms_cue_entries_kept": d["cue_entries_kept"], "dms_cue_centre_kept": d["cue_centre_kept"],
                  "dms_cue_attention": d["cue_attention"], "dms_uniform_attention": d["uniform_attention"],
                  "dms_compression": d["compression"]}
                 for f in find("fifo") if f["cue_kept"] == 0
                 for d in find("dms", distractors=f["distractors"], budget_frames=f["budget_frames"],
                               target_ratio=dms_target)]
    target_text = f"{dms_target:g}x target" if dms_target is not None else "not run"
    claims.append({"id": "4b", "claim": f"dms ({target_text}) forgets the right things: in every cell where fifo lost "
                                         "the cue, its heads still read the token under the cue in a larger share of "
                                         "(layer, KV head) entries than the 1/target they keep of everything",
                   "verdict": verdict(True, [c["dms_cue_centre_kept"] > c["keep_share"] for c in dms_cells]),
                   "evidence": dms_cells})
    return claims


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
        return window_episode(engine(("window", unit.policy, unit.signature, unit.frames), lambda: _engine(
            checkpoint, _window_policy(unit.policy, unit.frames, unit.signature),
            window_capacity(checkpoint, unit.frames))), episode)
    if unit.kind == "dms":
        episode = make_episode(spec, TEST, unit.index, unit.n, spec.dms_lead_in)
        return dms_episode(engine(("dms", unit.target, unit.frames), lambda: _engine(
            checkpoint, _dms_policy(spec, unit.target), window_capacity(checkpoint, unit.frames))),
            spec, episode, checkpoint)
    def aura() -> VlaEngine:
        return engine(("aura",), lambda: _engine(checkpoint, make_policy("aura"), aura_capacity(checkpoint)))

    if unit.kind == "aura":
        return aura_episode(aura(), unit.gate, unit.rate, make_episode(spec, unit.split, unit.index, unit.n))
    if unit.kind == "ceiling":
        return {"accuracy": readout_ceiling(aura(), spec, make_episodes(spec, TEST, spec.episodes, unit.n),
                                            make_episodes(spec, PROTOTYPE, _prototypes(spec), unit.n))}
    return measure_compression(checkpoint, spec, unit.target)


def _prototypes(spec: BenchSpec) -> int:
    return spec.classes * spec.prototypes_per_class


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
            + [BenchUnit("aura", n, gate=gate, rate=rate, split=PROTOTYPE, index=i) for i in range(_prototypes(spec))])


def _episodes(results: dict[str, dict], spec: BenchSpec, unit: BenchUnit) -> list[dict[str, Any]]:
    """The results of a cell's episodes, in episode order (``unit`` names the cell, index 0)."""
    count = _prototypes(spec) if unit.split == PROTOTYPE else spec.episodes
    return [results[BenchUnit(**{**unit.__dict__, "index": i}).key] for i in range(count)]


def run_bench(spec: BenchSpec, model_dir: Path | None = None, out: Path | None = None, *, workers: int = 1,
              ray_address: str | None = None, resume: bool = False,
              progress: Callable[[str], None] = lambda line: None,
              bar: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
    """Run the whole sweep and return the report (see the module doc for its schema). Episodes are units
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
        second_size = (2 * (spec.episodes + _prototypes(spec)) * len(spec.distractors)) if "aura" in spec.policies else 0
        total = len(first) + second_size
        summaries = [run_units(job, [Unit(u.key, u) for u in first], out, workers=workers, ray_address=ray_address,
                               resume=resume, progress=lambda done, _t: bar(done, total))]
        results = dict(summaries[0].results)
        if "aura" in spec.policies:
            for n in spec.distractors:
                tests = _episodes(results, spec, BenchUnit("aura", n, gate="surprise", rate=1.0))
                measured = sum(r["writes"] for r in tests) / sum(r["frames"] for r in tests)
                rates[n] = min(1.0, max(measured, 1e-6))
            second = [u for n in spec.distractors for gate in ("random", "periodic") for u in _aura_units(spec, n, gate, rates[n])]
            summaries.append(run_units(job, [Unit(u.key, u) for u in second], out, workers=workers,
                                       ray_address=ray_address, resume=resume,
                                       progress=lambda done, _t: bar(len(first) + done, total)))
            results.update(summaries[-1].results)
        failed = {key: why for summary in summaries for key, why in summary.failed.items()}
        if failed:
            raise UnitsFailed(f"{len(failed)} units failed ({'; '.join(f'{k}: {w.splitlines()[-1]}' for k, w in sorted(failed.items()))}); "
                              f"the finished ones are in {out / 'units'}: --resume runs only what is missing")
        state = prepare(context)
        checkpoint = state["checkpoint"]
        rows = _rows(spec, checkpoint, results, rates, progress)
        ceiling = results[BenchUnit("ceiling", spec.distractors[0]).key]["accuracy"] if "aura" in spec.policies else None
        compression = [results[BenchUnit("compression", target=t).key] for t in spec.dms_targets] \
            if "dms" in spec.policies else []
        for c in compression:
            progress(f"dms    target {c['target_ratio']:g}: {c['compression']:.2f}x over {c['frames']} frames")
        overhead = []
        for name in spec.policies:
            overhead.append(measure_overhead(checkpoint, name, spec))
            progress(f"{name:<6} overhead at {spec.overhead_arena_frames} frames: {overhead[-1]['policy_ms']:.3f} ms")
        config = checkpoint.config
    run = run_figures(summaries, workers, ray_address)
    return {
        "schema": SCHEMA,
        "config": {"model": str(model_dir) if model_dir else f"tiny preset, seed {MODEL_SEED}", "episodes": spec.episodes,
                   "distractors": list(spec.distractors), "budgets": list(spec.budgets), "policies": list(spec.policies),
                   "cosine_signatures": list(spec.cosine_signatures), "classes": spec.classes,
                   "seed": spec.seed, "prototypes_per_class": spec.prototypes_per_class,
                   "prompt_tokens": len(PROMPT), "tokens_per_frame": config.vision.tokens_per_frame,
                   "dof": config.action.dof, "kv_bytes_per_token": kv_bytes_per_token(config),
                   "frame_hw": list(FRAME_HW), "dms_targets": list(spec.dms_targets), "dms_window": spec.dms_window,
                   "dms_lead_in": spec.dms_lead_in, "compression_frames": spec.compression_frames},
        "rows": rows,
        "aura_readout_ceiling": ceiling,
        "dms_compression": compression,
        "overhead": overhead,
        "claims": evaluate_claims(rows, spec.episodes, 1.0 / spec.classes, ceiling, compression,
                                  spec.cosine_signatures[0]),
        "runtime_s": run.pop("seconds"),
        "run": run,
    }


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
                               _episodes(results, spec, BenchUnit(**{**cell.__dict__, "split": PROTOTYPE})), spec.classes)
                rows.append({**row, "signature": None, "distractors": n, "budget_frames": None})
            progress(f"aura   N={n:<4} {len(AURA_GATES)} gates")
    for row in rows:
        row["chance"] = 1.0 / spec.classes
    return rows


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def format_table(report: dict[str, Any]) -> str:
    """The report as text: one row per policy x N x F (aura: x gate), overheads, then the claims."""
    header = (f"{'policy':<6} {'variant':<13} {'N':>4} {'F':>3} {'cue kept':>8} {'entries':>7} {'cue attn':>8} "
              f"{'uniform':>7} {'readout':>7} {'chance':>6} {'ratio':>6} {'writes/fr':>9} {'evict':>6} "
              f"{'memory B':>10} {'kv B':>10} {'state B':>7}")
    lines = [header, "-" * len(header)]
    for r in report["rows"]:
        gate = r["gate"] or (f"sig {r['signature']}" if r["signature"] else "-")
        if r["gate"] in ("random", "periodic"):
            gate += f" {r['gate_rate']:.2f}"
        if r["target_ratio"] is not None:
            gate = f"target {r['target_ratio']:g}"
        lines.append(f"{r['policy']:<6} {gate:<13} {r['distractors']:>4} {_cell(r['budget_frames'], 'd'):>3} "
                     f"{_cell(r['cue_kept'], '.2f'):>8} {_cell(r['cue_entries_kept'], '.2f'):>7} "
                     f"{_cell(r['cue_attention'], '.4f'):>8} "
                     f"{_cell(r['uniform_attention'], '.4f'):>7} {_cell(r['readout_accuracy'], '.2f'):>7} "
                     f"{r['chance']:>6.2f} {_cell(r['compression'], '.2f'):>6} {r['writes_per_frame']:>9.3f} "
                     f"{r['evictions']:>6.1f} {r['memory_bytes']:>10,} {r['kv_bytes']:>10,} {r['state_bytes']:>7,}")
    lines.append("")
    for c in report["dms_compression"]:
        heads = [r for layer in c["compression_per_head"] for r in layer]
        finite = [r for r in heads if r is not None]
        lines.append(f"dms target {c['target_ratio']:g}x over {c['frames']} frames (window {c['window']}): "
                     f"tokens seen / kept {c['compression']:.2f}x pooled over heads (per head "
                     f"{min(finite, default=float('nan')):.2f}..{max(finite, default=float('nan')):.2f}"
                     f"{', ' + str(heads.count(None)) + ' keep nothing' if None in heads else ''}), "
                     f"{c['decision_compression']:.2f}x of the decisions, {c['slot_compression']:.2f}x of the "
                     f"slots held; {c['forced_evictions']} forced")
        layers = ", ".join(_cell(r, ".2f") for r in c["byte_compression_per_layer"])
        lines.append(f"    bytes: {c['kv_bytes_held']:,} B of KV in pages of {c['page_tokens']} against "
                     f"{c['kv_bytes_dense']:,} B dense: {_cell(c['byte_compression'], '.2f')}x pooled "
                     f"(per layer {layers})")
    lines.append("")
    for o in report["overhead"]:
        lines.append(f"overhead {o['policy']:<6} at {o['arena_frames']} frames: policy {o['policy_ms']:.3f} ms/frame "
                     f"(median of {o['frames']}), whole add_frame {o['add_frame_ms']:.2f} ms")
    lines.append("")
    for c in report["claims"]:
        lines.append(f"claim {c['id']:<2} {c['verdict'].upper():<10} {c['claim']}")
    if report["aura_readout_ceiling"] is not None:
        lines.append(f"aura readout ceiling (v_cue - v_query, a perfect memory): {report['aura_readout_ceiling']:.2f} "
                     f"(chance {1 / report['config']['classes']:.2f})")
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "memory_bench.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
