"""KV memory policies: what the cache keeps of an episode that never ends. See base.py for the contract."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..config import MemoryKnobs, choices_of
from .aura import AuraPolicy
from .base import DecodedTokens, FrameTokens, MemoryPolicy, MemoryStats
from .context import MemoryContext, MemorySite
from .cosine import CosinePolicy
from .dms import DmsCompression, DmsPolicy
from .fifo import FifoPolicy

POLICIES = choices_of("reasoning", "kv.policy")
POLICY_TYPES: dict[str, type[MemoryPolicy]] = {"fifo": FifoPolicy, "cosine": CosinePolicy, "aura": AuraPolicy,
                                               "dms": DmsPolicy}


def build_policy(knobs: MemoryKnobs) -> MemoryPolicy:
    """The policy ``knobs.policy`` with its knob group."""
    if knobs.policy == "fifo":
        return FifoPolicy()
    if knobs.policy == "cosine":
        return CosinePolicy(knobs.cosine)
    if knobs.policy == "aura":
        return AuraPolicy(knobs.aura)
    return DmsPolicy(knobs.dms)


def make_policy(name: str, values: Mapping[str, Any] | None = None) -> MemoryPolicy:
    """A policy from its name and any ``kv.*`` settings (other keys are ignored; missing ones: defaults)."""
    if name not in POLICY_TYPES:
        raise ValueError(f"kv.policy must be one of {POLICIES}, got {name!r}")
    return build_policy(MemoryKnobs.of({**(values or {}), "kv.policy": name}))


def check_knobs(knobs: MemoryKnobs, site: MemorySite, policies: Iterable[str] = POLICIES) -> None:
    """ValueError (or CheckpointError) for any ``kv.*`` value that ``policies`` would refuse at ``site``,
    building nothing: the running policy's knobs and those it could switch to at the next episode alike,
    and the tensors of ``knobs.policy`` and whether it runs on the site's KV pool (a pool below the dense
    size serves dms alone: a live switch to another policy is refused then, with the numbers). An arena
    without room for one frame beside the prompt is blamed on ``kv_capacity_tokens`` first: no policy knob
    is the cause then."""
    site.check_capacity()
    site.check_pool(knobs.policy, POLICY_TYPES[knobs.policy].per_kv_head)  # a switch to another is checked as it comes
    for name in policies:
        POLICY_TYPES[name].check_knobs(getattr(knobs, name, None), site)
    POLICY_TYPES[knobs.policy].check_tensors(site)


__all__ = ["POLICIES", "POLICY_TYPES", "AuraPolicy", "CosinePolicy", "DecodedTokens", "DmsCompression", "DmsPolicy",
           "FifoPolicy", "FrameTokens", "MemoryContext", "MemoryPolicy", "MemorySite", "MemoryStats", "build_policy",
           "check_knobs", "make_policy"]
