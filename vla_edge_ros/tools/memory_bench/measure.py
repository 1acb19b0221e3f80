"""What one unit of the sweep measures: one episode of a cell, the aura readout's ceiling, or one dms
compression stream (the package doc says what each figure means). Each starts its engine's memory from
the prompt, so a result depends on nothing but the unit's spec; the query frame's attention comes from
the probe (``attention.py``), the runtime's forward keeps none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...engine.vla_engine import VlaEngine
from ...memory import AuraPolicy, DmsPolicy
from ...model.checkpoint import Checkpoint
from ...model.layout import kv_bytes_per_token
from ...worlds.scenes import COMPRESSION
from .attention import probe_frame
from .cells import aura_policy, bench_engine, dms_policy, window_capacity
from .scoring import prototype_accuracy
from .spec import PROMPT, BenchSpec, Episode, cue_token, make_episodes


def memory_columns(engine: VlaEngine) -> dict[str, int]:
    stats = engine.memory_stats()
    return {"memory_bytes": stats.memory_bytes, "kv_bytes": stats.kv_bytes, "state_bytes": stats.state_bytes}


def window_episode(engine: VlaEngine, episode: Episode) -> dict[str, Any]:
    """fifo or cosine, one episode: is the cue still cached and read at the query?"""
    engine.set_prompt(list(PROMPT))
    cue = engine.add_frame(episode.frames[0])
    cue_entry = engine.policy.frames[-1]  # the policy's own record of the cue: identity survives slot reuse
    for image in episode.frames[1:-1]:
        engine.add_frame(image)
    _, attention = probe_frame(engine, episode.frames[-1])
    kept = any(entry is cue_entry for entry in engine.policy.frames)
    read = float(attention[..., cue.slots].sum(axis=-1).mean()) if kept else 0.0
    stats = engine.memory_stats()
    return {"kept": kept, "attention": read, "uniform": cue.slots.size / engine.arena.used,
            "writes": stats.writes, "frames": stats.frames_seen, "evictions": stats.evictions,
            **memory_columns(engine)}


def dms_episode(engine: VlaEngine, spec: BenchSpec, episode: Episode, checkpoint: Checkpoint) -> dict[str, Any]:
    """dms in the same F-frame arena as fifo and cosine, one episode: how much of the cue do the heads read?"""
    engine.set_prompt(list(PROMPT))
    for index, image in enumerate(episode.frames[:-1]):
        prefill = engine.add_frame(image)
        if index == episode.cue_index:
            centre = int(prefill.slots[cue_token(spec, episode, checkpoint)])
    _, attention = probe_frame(engine, episode.frames[-1])
    policy: DmsPolicy = engine.policy
    entries = policy.entries_of_frame(episode.cue_index)  # [layers, kv_heads] cue tokens each head reads
    cue_slots = policy.slots_of_frame(episode.cue_index)
    reads = engine.arena.pages.held_per_head()  # tokens each head reads
    report, stats = policy.compression(), engine.memory_stats()
    return {"kept": bool(entries.sum()), "entries": float(entries.mean()) / engine.observation_tokens,
            "centre": float(engine.arena.holds(np.array([centre])).mean()) if centre in cue_slots else 0.0,
            "attention": float(attention[..., cue_slots].sum(axis=-1).mean()),
            "uniform": float((entries / reads).mean()), "compression": report.ratio,
            "forced": report.forced_evictions, "writes": stats.writes,
            "frames": stats.frames_seen, "evictions": stats.evictions, **memory_columns(engine)}


def aura_read(policy: AuraPolicy) -> np.ndarray:
    """What the aura memory added to the frame it saw last: r - v, the read before that frame's write minus the
    frame's own value (as ``AuraPolicy`` made them, in any feature layout)."""
    if policy.last_read is None or policy.last_value is None:
        raise RuntimeError("aura_read: the policy has seen no frame")
    return policy.last_read - policy.last_value


def aura_episode(engine: VlaEngine, gate: str, rate: float, episode: Episode) -> dict[str, Any]:
    """One episode under a fresh aura policy: its read at the query, writes and bytes."""
    engine.set_policy(aura_policy(gate, rate, episode.seed))
    for image in episode.frames:
        engine.add_frame(image)
    read = aura_read(engine.policy)
    stats = engine.memory_stats()
    return {"cls": episode.cls, "read": [float(x) for x in read], "writes": stats.writes, "frames": stats.frames_seen,
            "evictions": stats.evictions, **memory_columns(engine)}


def readout_ceiling(engine: VlaEngine, spec: BenchSpec, tests: list[Episode], prototypes: list[Episode]) -> float:
    """The aura readout on v_cue - v_query. At chance, the readout cannot tell the classes apart even from a
    perfect memory."""
    def value(image: np.ndarray) -> np.ndarray:
        engine.set_policy(aura_policy("no-write", 1.0, 0))
        engine.add_frame(image)
        return engine.policy.last_value

    def values(episodes: list[Episode]) -> list[dict[str, Any]]:
        return [{"cls": e.cls, "read": (value(e.frames[0]) - value(e.frames[-1])).tolist()} for e in episodes]

    return prototype_accuracy(values(prototypes), values(tests), spec.classes)


def measure_compression(checkpoint: Checkpoint, spec: BenchSpec, target: float) -> dict[str, Any]:
    """dms at ``target`` over ``compression_frames`` frames of back-to-back episodes (largest N) in an arena
    with room for every token, so nothing is forced out and the ratio is the heads' own choice."""
    n = max(spec.distractors)
    episodes = make_episodes(spec, COMPRESSION, math.ceil(spec.compression_frames / (n + 2)), n)
    stream = [image for episode in episodes for image in episode.frames][:spec.compression_frames]
    engine = bench_engine(checkpoint, dms_policy(spec, target), window_capacity(checkpoint, len(stream)))
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
