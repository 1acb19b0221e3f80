"""Slot bookkeeping of the KV arena, shared by both backends.

The arena is a fixed number of slots allocated once. Each slot holds one token's keys and values
in every layer (the storage lives in the backend) and carries the position that token was
rotated to. Tokens can leave from anywhere (eviction), and positions can be re-assigned later,
so a robot episode that never resets never needs more positions than there are slots.

A policy that evicts per KV head (``dms``) turns on *head masks*: ``head_valid[layer, kv_head, slot]``
says which heads still read a slot's token. A slot stays allocated (``valid``, one position for all
heads) while any head reads it and is released when the last one stops. Without head masks (every
other policy) nothing per head is stored or computed.
"""

from __future__ import annotations

import numpy as np


class ArenaFullError(RuntimeError):
    """More tokens were asked for than the arena has free slots."""


class KVArena:
    """Which slots hold a token, and at which RoPE position."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"KV arena capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.positions = np.full(capacity, -1, dtype=np.int32)
        self.valid = np.zeros(capacity, dtype=bool)
        self.head_valid: np.ndarray | None = None  # [layers, kv_heads, capacity] with head masks on
        self.pinned = np.empty(0, dtype=np.int32)  # slots of the pinned prompt: no policy evicts them

    def set_head_masks(self, heads: tuple[int, int] | None) -> None:
        """Turn head masks on for (layers, kv_heads), every valid slot readable by every head; None: off."""
        if heads is None:
            self.head_valid = None
            return
        self.head_valid = np.zeros((*heads, self.capacity), dtype=bool)
        self.head_valid[:, :, self.valid] = True

    @property
    def used(self) -> int:
        return int(np.count_nonzero(self.valid))

    def allocate(self, count: int) -> np.ndarray:
        """The lowest ``count`` free slots (not yet marked valid: ``commit`` does that)."""
        free = np.flatnonzero(~self.valid)
        if count > free.size:
            raise ArenaFullError(f"KV arena full: {count} slots requested, {free.size} of {self.capacity} free")
        return free[:count].astype(np.int32)

    def commit(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """Mark ``slots`` as holding tokens at ``positions``."""
        self.positions[slots] = positions
        self.valid[slots] = True
        if self.head_valid is not None:
            self.head_valid[:, :, slots] = True

    def release(self, slots: np.ndarray) -> None:
        """Evict tokens: their slots become free and invisible to attention."""
        self.valid[slots] = False
        self.positions[slots] = -1
        if self.head_valid is not None:
            self.head_valid[:, :, slots] = False

    def hide(self, slots: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """Stop the heads where ``hidden[layer, kv_head, j]`` from reading ``slots[j]`` (head masks only);
        slots no head reads any more are released. Returns those released slots."""
        if self.head_valid is None:
            raise RuntimeError("hide needs head masks (set_head_masks)")
        slots = np.asarray(slots, dtype=np.int32)
        self.head_valid[:, :, slots] &= ~hidden
        unread = slots[~self.head_valid[:, :, slots].any(axis=(0, 1))]
        self.release(unread)
        return unread

    def next_position(self) -> int:
        """One past the highest position in use (0 for an empty arena)."""
        return int(self.positions[self.valid].max()) + 1 if self.valid.any() else 0

    def slots_in_order(self) -> np.ndarray:
        """Valid slots sorted by position: the order the model reads the context in."""
        slots = np.flatnonzero(self.valid)
        return slots[np.argsort(self.positions[slots], kind="stable")].astype(np.int32)

    def span(self) -> slice:
        """Slots [0, last valid + 1): attention scans this contiguous view and masks the holes."""
        valid = np.flatnonzero(self.valid)
        return slice(0, int(valid[-1]) + 1 if valid.size else 0)

    def visible(self, query_positions: np.ndarray, span: slice) -> np.ndarray:
        """[T, len(span)] mask: slot is valid and not after the query (causality by position)."""
        return self.valid[span][None, :] & (self.positions[span][None, :] <= query_positions[:, None])

    def visible_per_head(self, layer: int, visible: np.ndarray, span: slice) -> np.ndarray:
        """[kv_heads, T, len(span)]: ``visible`` (as ``visible`` returned it) narrowed to what each head reads."""
        return self.head_valid[layer][:, None, span] & visible[None]
