"""Slot bookkeeping of the KV arena, shared by both backends, and where each head's tokens sit in pages.

The arena is a fixed number of slots allocated once. A slot stands for one token: it carries the RoPE
position that token was rotated to (one position for every layer and KV head). Tokens can leave from
anywhere (eviction), and positions can be re-assigned later, so a robot episode that never resets never
needs more positions than there are slots.

A VL model's arena (``mrope=True``) keeps two things per slot: the sequence position (the order the
model reads the cache in, which the causal mask uses) and the M-RoPE ids [3] (temporal, height, width)
its key was rotated by. ``repack_rope_ids`` says where the ids go when the kept tokens are re-numbered.

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

    def __init__(self, capacity: int, page_tokens: int | None = None, pool_pages: int = 0, *,
                 mrope: bool = False) -> None:
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
        # M-RoPE ids [3, capacity] of a VL model's tokens (-1: free slot); None for a text decoder
        self.rope_positions = np.full((3, capacity), -1, dtype=np.int32) if mrope else None
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

    def commit(self, slots: np.ndarray, positions: np.ndarray, rope_positions: np.ndarray | None = None) -> None:
        """Mark ``slots`` as holding new tokens at ``positions`` (an M-RoPE arena also keeps ``rope_positions``
        [3, n]), read by every head."""
        self._check_rope(rope_positions)
        if self.rope_positions is not None:
            self.rope_positions[:, slots] = rope_positions
        self.positions[slots] = positions
        self.valid[slots] = True
        self.pages.add(slots)

    def release(self, slots: np.ndarray) -> None:
        """Evict tokens from every head: their slots become free and invisible to attention."""
        self._move(*self.pages.remove(slots))
        self.valid[slots] = False
        self.positions[slots] = -1
        if self.rope_positions is not None:
            self.rope_positions[:, slots] = -1

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
                        entry_slots: np.ndarray, rope_positions: np.ndarray | None = None) -> None:
        """An emptied arena holds ``slots`` at ``positions`` (and ``rope_positions``) again, each head the
        entries ``pages.held`` listed."""
        if self.valid.any():
            raise RuntimeError("restore_entries needs an empty arena")
        if np.setdiff1d(entry_slots, slots).size or np.setdiff1d(slots, entry_slots).size:
            raise ValueError("memory state's per-head entries do not match its slots")
        self._check_rope(rope_positions)
        self.pages.restore(counts, entry_slots)
        if self.rope_positions is not None:
            self.rope_positions[:, slots] = rope_positions
        self.positions[slots] = positions
        self.valid[slots] = True

    def _move(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        if sources.size and self.move_rows is not None:
            self.move_rows(sources, destinations)

    def _check_rope(self, rope_positions: np.ndarray | None) -> None:
        """An M-RoPE arena needs ids with every token; a plain one keeps none (a tool may still rotate by them)."""
        if rope_positions is None and self.rope_positions is not None:
            raise ValueError("an M-RoPE arena needs the M-RoPE ids of every token it takes")

    def next_position(self) -> int:
        """One past the highest position in use (0 for an empty arena)."""
        return int(self.positions[self.valid].max()) + 1 if self.valid.any() else 0

    def next_rope_position(self) -> int:
        """The M-RoPE id of a text token appended now: one past the highest id in use (0 for an empty arena)."""
        if self.rope_positions is None:
            raise RuntimeError("next_rope_position needs an M-RoPE arena")
        return int(self.rope_positions[:, self.valid].max()) + 1 if self.valid.any() else 0

    def slots_in_order(self) -> np.ndarray:
        """Valid slots sorted by position: the order the model reads the context in."""
        slots = np.flatnonzero(self.valid)
        return slots[np.argsort(self.positions[slots], kind="stable")].astype(np.int32)


def repack_rope_ids(ids: np.ndarray) -> np.ndarray:
    """Where M-RoPE ids [3, n] of kept tokens (in cache order) go when the sequence is numbered afresh.

    This is what transformers' ``get_rope_index`` gives the kept sequence. A text token (prompt, vision
    start and end markers, aura's memory token, decoded action tokens) has t = h = w, one past the
    highest id before it; an image's tokens share their temporal id t (the image's base) and add their
    row and column to it for h and w. So the tokens that share an old temporal id form one group (a
    text token, or what is left of an image), and every group moves by one delta: its new base is one
    past the highest new id of the group before it (the first starts at 0). An image whose tokens all
    stayed keeps its shape exactly; one a per-head policy (dms) thinned keeps the rows and columns of
    the tokens left. Moving all three ids by one delta is a 1-D RoPE rotation of the key by that delta
    (``Backend.rotate_keys``), which is why re-numbering stays exact under M-RoPE.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape[1] == 0:
        return ids.astype(np.int32)
    t = ids[0]
    if (np.diff(t) < 0).any():
        raise ValueError("M-RoPE ids must come in cache order (temporal ids never decrease)")
    first = np.flatnonzero(np.concatenate(([True], t[1:] != t[:-1])))  # each group's first token
    group = np.cumsum(np.concatenate(([False], t[1:] != t[:-1])))  # [n]: which group each token is in
    extent = np.maximum.reduceat(ids.max(axis=0) - t, first)  # highest id above its base, per group
    base = np.concatenate(([0], np.cumsum(extent[:-1] + 1)))  # new base of each group
    return (ids + (base - t[first])[group]).astype(np.int32)
