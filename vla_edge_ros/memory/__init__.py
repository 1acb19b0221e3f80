"""KV memory policies: what the cache keeps of an episode that never ends. See base.py for the contract."""

from __future__ import annotations

from typing import Any

from .aura import AuraPolicy
from .base import DecodedTokens, FrameTokens, MemoryPolicy, MemoryStats
from .cosine import CosinePolicy
from .dms import DmsCompression, DmsPolicy
from .fifo import FifoPolicy

POLICIES = ("fifo", "cosine", "aura", "dms")


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
    elif name == "dms":
        policy = DmsPolicy(window=knobs.get("kv.dms.window", 32),
                           use_learned_gate=knobs.get("kv.dms.use_learned_gate", True))
    else:
        raise ValueError(f"kv.policy must be one of {POLICIES}, got {name!r}")
    policy.configure_from(knobs)
    return policy


def check_knobs(knobs: dict[str, Any]) -> None:
    """ValueError for any policy's ``kv.*`` value its policy would refuse, whichever policy runs now: a
    value the schema's range lets through (``kv.dms.target_ratio`` 0.5) must not wait for a policy switch."""
    for name in POLICIES:
        make_policy(name, knobs)


__all__ = ["POLICIES", "AuraPolicy", "CosinePolicy", "DecodedTokens", "DmsCompression", "DmsPolicy", "FifoPolicy",
           "FrameTokens", "MemoryPolicy", "MemoryStats", "check_knobs", "make_policy"]
