"""KV memory policies: what the cache keeps of an episode that never ends. See base.py for the contract."""

from __future__ import annotations

from typing import Any

from .aura import AuraPolicy
from .base import FrameTokens, MemoryPolicy, MemoryStats
from .cosine import CosinePolicy
from .fifo import FifoPolicy

POLICIES = ("fifo", "cosine", "aura")


def make_policy(name: str, knobs: dict[str, Any] | None = None) -> MemoryPolicy:
    """A policy from its name and the reasoning node's ``kv.*`` settings (other keys are ignored)."""
    knobs = knobs or {}
    if name == "fifo":
        policy: MemoryPolicy = FifoPolicy()
    elif name == "cosine":
        policy = CosinePolicy(signature=knobs.get("kv.cosine.signature", "keys"),
                              signature_layers=tuple(knobs.get("kv.cosine.signature_layers", (-1,))))
    elif name == "aura":
        policy = AuraPolicy()
    else:
        raise ValueError(f"kv.policy must be one of {POLICIES}, got {name!r}")
    policy.configure_from(knobs)
    return policy


__all__ = ["POLICIES", "AuraPolicy", "CosinePolicy", "FifoPolicy", "FrameTokens", "MemoryPolicy", "MemoryStats",
           "make_policy"]
