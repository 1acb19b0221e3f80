"""The engine of each cell of the sweep: its policy, and an arena sized for its memory budget.

fifo, cosine and dms get the arena of the pinned prompt, F frames and the action scratch; aura keeps no
past frames as KV, so its arena holds the prompt, its memory token and one frame whatever F is. Its
gates are the robot's surprise gate and evaluation's baselines (``tools/aura_gates.py``):
``every_frame`` is a periodic gate of rate 1, and the readout ceiling reads values through a memory
that never writes.
"""

from __future__ import annotations

from typing import Any

from ...config import MemoryKnobs
from ...engine.vla_engine import VlaEngine
from ...memory import AuraPolicy, DmsPolicy, MemoryPolicy, make_policy
from ...model.checkpoint import Checkpoint
from ...model.layout import arena_capacity
from ..aura_gates import baseline_policy
from .spec import PROMPT, BenchSpec


def bench_engine(checkpoint: Checkpoint, policy: MemoryPolicy, capacity: int) -> VlaEngine:
    """A numpy engine of ``capacity`` slots running ``policy``, the bench's prompt prefilled."""
    engine = VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=capacity, policy=policy)
    engine.set_prompt(list(PROMPT))
    return engine


def window_capacity(checkpoint: Checkpoint, frames: int) -> int:
    """KV tokens for ``frames`` frames beside the pinned prompt and the action scratch."""
    return arena_capacity(checkpoint.config, len(PROMPT), frames)


def aura_capacity(checkpoint: Checkpoint) -> int:
    return arena_capacity(checkpoint.config, len(PROMPT), 1, reserved_tokens=1)  # aura: one memory token


def cosine_protect(frames: int) -> int:
    """The configured default (4), but never more than half the window, so cosine can choose."""
    return min(4, frames // 2)


def window_policy(name: str, frames: int, signature: str | None = None) -> MemoryPolicy:
    """fifo or cosine (with ``signature``) for a window of ``frames`` frames."""
    knobs: dict[str, Any] = {"kv.cosine.protect_recent_frames": cosine_protect(frames)}
    if signature is not None:
        knobs["kv.cosine.signature"] = signature
    return make_policy(name, knobs)


def dms_policy(spec: BenchSpec, target: float) -> DmsPolicy:
    return make_policy("dms", {"kv.dms.target_ratio": target, "kv.dms.window": spec.dms_window})


def aura_policy(gate: str, rate: float, seed: int) -> AuraPolicy:
    """aura with the bench's ``gate`` (``spec.AURA_GATES``, or ``no-write``) at write rate ``rate``."""
    if gate == "surprise":
        return make_policy("aura")
    if gate == "every_frame":
        return baseline_policy(MemoryKnobs.of().aura, "periodic", 1.0)
    return baseline_policy(MemoryKnobs.of().aura, gate, rate, seed)
