"""Slot bookkeeping of the KV arena, shared by both backends, and where each head's tokens sit in pages.

The arena is a fixed number of slots allocated once. A slot stands for one token: it carries the RoPE
position that token was rotated to (one position for every layer and KV head). Tokens can leave from
anywhere (eviction), and positions can be re-assigned later, so a robot episode that never resets never
needs more positions than there are slots.

The keys and values themselves live in pages of a pool the backend stores (``pages.PageTable``): each
(layer, KV head) has a block table over that pool. With the dense layout (every policy but ``dms``)
every head holds every valid slot. With the per-head layout (``dms``) a head can stop reading a token
on its own (``hide``): its entry leaves that head's pages at once, the head's last entry fills the hole
(the backend copies the row, through ``move_rows``), and a page no entry needs goes back to the pool; the
slot itself is released when the last head has dropped its token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..config import default_of
from .pages import PageTable

RowMover = Callable[[np.ndarray, np.ndarray], None]
"""Copies pool rows ``sources[i]`` to ``destinations[i]`` (keys and values): the storage's part of a move."""


class ArenaFullError(RuntimeError):
    """More tokens were asked for than the arena has free slots."""


class KVArena:
    """Which slots hold a token, at which RoPE position, and which heads read it where."""

    def __init__(self, capacity: int, page_tokens: int | None = None, pool_pages: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"KV arena capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.page_tokens = page_tokens if page_tokens is not None else default_of("reasoning", "kv_page_tokens")
        if self.page_tokens <= 0:
            raise ValueError(f"KV page size must be positive, got {self.page_tokens}")
        if pool_pages < 0:
            raise ValueError(f"KV pool pages must be >= 0 (0: the dense size), got {pool_pages}")
        self.pool_pages = pool_pages  # as configured; 0: a page for every block of every head
        self.positions = np.full(capacity, -1, dtype=np.int32)
        self.valid = np.zeros(capacity, dtype=bool)
        self.pinned = np.empty(0, dtype=np.int32)  # slots of the pinned prompt: no policy evicts them
        self.move_rows: RowMover | None = None  # set by the backend that stores the rows
        self.pages = PageTable((1, 1), capacity, self.page_tokens, per_head=False)  # until a backend lays it out

    def set_layout(self, heads: tuple[int, int], per_head: bool) -> None:
        """Lay the pages out for (layers, kv_heads), per head or dense; the arena is emptied (an episode boundary)."""
        self.release(np.flatnonzero(self.valid).astype(np.int32))
        self.pages = PageTable(heads, self.capacity, self.page_tokens, per_head, self.pool_pages)

    @property
    def per_head(self) -> bool:
        return self.pages.per_head

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
        """Mark ``slots`` as holding new tokens at ``positions``, read by every head."""
        self.positions[slots] = positions
        self.valid[slots] = True
        self.pages.add(slots)

    def release(self, slots: np.ndarray) -> None:
        """Evict tokens from every head: their slots become free and invisible to attention."""
        self._move(*self.pages.remove(slots))
        self.valid[slots] = False
        self.positions[slots] = -1

    def hide(self, slots: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """Stop the heads where ``hidden[layer, kv_head, j]`` from reading ``slots[j]`` (per-head layout);
        slots no head reads any more are released. Returns those released slots."""
        if not self.per_head:
            raise RuntimeError("hide needs the per-head layout (set_layout(..., per_head=True))")
        slots = np.asarray(slots, dtype=np.int32)
        self._move(*self.pages.remove(slots, hidden))
        unread = slots[~self.pages.holds(slots).any(axis=(0, 1))]
        self.release(unread)
        return unread

    def holds(self, slots: np.ndarray) -> np.ndarray:
        """[layers, kv_heads, n]: which heads read each slot's token."""
        return self.pages.holds(slots)

    def restore_entries(self, slots: np.ndarray, positions: np.ndarray, counts: np.ndarray,
                        entry_slots: np.ndarray) -> None:
        """An emptied arena holds ``slots`` at ``positions`` again, each head the entries ``pages.held`` listed."""
        if self.valid.any():
            raise RuntimeError("restore_entries needs an empty arena")
        if np.setdiff1d(entry_slots, slots).size or np.setdiff1d(slots, entry_slots).size:
            raise ValueError("memory state's per-head entries do not match its slots")
        self.pages.restore(counts, entry_slots)
        self.positions[slots] = positions
        self.valid[slots] = True

    def _move(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        if sources.size and self.move_rows is not None:
            self.move_rows(sources, destinations)

    def next_position(self) -> int:
        """One past the highest position in use (0 for an empty arena)."""
        return int(self.positions[self.valid].max()) + 1 if self.valid.any() else 0

    def slots_in_order(self) -> np.ndarray:
        """Valid slots sorted by position: the order the model reads the context in."""
        slots = np.flatnonzero(self.valid)
        return slots[np.argsort(self.positions[slots], kind="stable")].astype(np.int32)
