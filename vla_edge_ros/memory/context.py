"""What a memory policy is given of the engine it serves, and what its knobs are checked against.

A policy never sees the engine. ``attach`` hands it a ``MemoryContext``: the model's shapes, the
checkpoint (for the tensors the policy owns: ``aura.*``, the dms gates), the arena (slot
bookkeeping, with the pinned prompt's slots), a reader of cached keys and values, and the device
its own math runs on. The engine calls the policy; the policy never calls the engine.

``MemorySite`` is the static part: the model, the checkpoint, the arena's size (slots, page size and
pool), and the pinned prompt's length. It is all a knob check needs, so a live parameter change is checked against the
running engine's site without building a policy, and a configuration is checked before any engine
exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config import default_of
from ..model.arena import KVArena
from ..model.checkpoint import Checkpoint
from ..model.config import ModelConfig
from ..model.layout import (arena_capacity, frames_in_arena, kv_bytes_per_token, kv_page_bytes, kv_pages_for,
                            scratch_tokens)
from ..numerics import ops


@dataclass(frozen=True)
class MemorySite:
    """Where a policy runs, as far as its knobs care."""

    checkpoint: Checkpoint
    capacity: int  # slots in the arena
    prompt_tokens: int  # slots the pinned prompt takes
    page_tokens: int = field(default_factory=lambda: default_of("reasoning", "kv_page_tokens"))
    pool_pages: int = 0  # pages in the KV pool as configured (0: the dense size)

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config

    def pages_per_head(self, tokens: int) -> int:
        """Pages the pool must have to give every (layer, KV head) ``tokens`` entries."""
        return kv_pages_for(self.config, tokens, self.page_tokens)

    def check_pool(self, name: str, per_kv_head: bool) -> None:
        """ValueError when policy ``name`` cannot run on this pool: only one that holds pages per KV head (dms)
        runs on a pool smaller than every head holding every slot."""
        dense = self.pages_per_head(self.capacity)
        if self.pool_pages and self.pool_pages < dense and not per_kv_head:
            raise ValueError(f"kv_pool_pages={self.pool_pages} is below the {dense} pages that {name} (every KV head "
                             f"holding every one of {self.capacity} slots) needs; only dms runs on a smaller pool")

    def frames(self, reserved_tokens: int = 0) -> int:
        """Whole frames that fit beside the prompt, ``reserved_tokens`` and the action scratch."""
        return frames_in_arena(self.config, self.capacity, self.prompt_tokens, reserved_tokens)

    def free_tokens(self) -> int:
        """Slots left beside the prompt, one frame and the action scratch."""
        return self.capacity - self.least_capacity()

    def least_capacity(self, reserved_tokens: int = 0) -> int:
        """Slots an arena needs for the prompt, ``reserved_tokens`` beside it, one frame and the action scratch."""
        return arena_capacity(self.config, self.prompt_tokens, 1, reserved_tokens)

    def check_capacity(self, reserved_tokens: int = 0, reserved: str = "") -> None:
        """ValueError (``too_small``) when the arena cannot hold the prompt, ``reserved_tokens``, one frame and
        the action tokens: no policy knob can make room then, only a larger arena."""
        if self.capacity < self.least_capacity(reserved_tokens):
            raise self.too_small(reserved_tokens, reserved)

    def too_small(self, reserved_tokens: int = 0, reserved: str = "") -> ValueError:
        """The error that blames ``kv_capacity_tokens`` and says the least it must be: the prompt,
        ``reserved_tokens`` (``reserved`` names what they are), one frame and the action tokens."""
        beside = f", {reserved} ({reserved_tokens})" if reserved_tokens else ""
        c = self.config
        return ValueError(f"kv_capacity_tokens={self.capacity} must be at least {self.least_capacity(reserved_tokens)}"
                          f": the arena holds the prompt ({self.prompt_tokens} tokens){beside}, one frame "
                          f"({c.observation_tokens}) and the action tokens ({scratch_tokens(c)})")


@dataclass(frozen=True)
class MemoryContext:
    """All a policy may touch: shapes and weights, the arena, cached K/V, where its math runs."""

    checkpoint: Checkpoint
    arena: KVArena
    read_kv: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # slots -> keys, values [L, H_kv, n, D]
    device: str  # "numpy" or "cuda": where the policy's signature index and fast weights live

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config

    @property
    def prompt_slots(self) -> np.ndarray:
        return self.arena.pinned

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.config)

    def kv_bytes_held(self) -> int:
        """Bytes of keys and values the arena holds now: with pages per KV head, the pages its heads hold
        (what dms frees is what this stops counting); dense, every head's copy of every valid token."""
        if self.arena.per_head:
            return self.arena.pages.pages_in_use() * kv_page_bytes(self.config, self.arena.page_tokens)
        return self.arena.used * self.kv_bytes_per_token

    def rope_undo(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin [n, head_dim / 2] that turn the cached keys of ``slots`` back to position 0 (``ops.apply_rope``):
        the inverse of the rotation each carries, by its position, or by its M-RoPE ids in a VL checkpoint's arena."""
        c = self.config
        inv_freq = ops.rope_inv_freq(c.head_dim, c.rope_theta)
        if self.arena.rope_positions is None:
            return ops.rope_cos_sin(-self.arena.positions[slots], inv_freq)
        return ops.mrope_cos_sin(-self.arena.rope_positions[:, slots], inv_freq, c.vl.mrope_section)

    def site(self) -> MemorySite:
        return MemorySite(self.checkpoint, self.arena.capacity, self.arena.pinned.size, self.arena.page_tokens,
                          self.arena.pool_pages)
