"""Where each (layer, KV head) keeps its tokens: a block table of fixed-size pages over one shared pool.

The backend stores keys and values as rows of one pool, ``page_tokens`` rows to a page, and a page
belongs to one (layer, KV head) at a time. Each head has a block table (its pages, in order) and a
length: its entry e is row ``e % page_tokens`` of page ``block_table[head, e // page_tokens]``, and
``entry_slot`` names the arena slot (the token, and through it the position) each entry holds.
Attention reads a head's entries 0..length-1 through its block table, so it costs what the head holds.

Two layouts behind one interface:

- *per head* (``dms``): every head appends the tokens that enter and drops the ones it evicts. A drop
  is filled at once by one of the head's last entries (swap-remove), so a head's entries are always
  0..length-1 without a hole and it holds exactly ceil(length / page_tokens) pages; a page goes back to
  the pool as soon as the head's length falls below it. Fragmentation is bounded by construction: a head
  wastes less than one page, the arena less than layers x kv_heads pages. A move is one key row and one
  value row, copied by whoever stores the rows (``remove`` returns them; the arena hands them on).
- *dense* (every other policy): every head reads the same tokens, so head h owns a fixed run of pages
  and its entry e is slot e; a released slot leaves a hole (``entry_slot`` -1) that the next token given
  that slot fills. Those policies evict whole frames and the next frame takes the same slots, so moving
  rows would buy nothing, and attention keeps summing in slot order (the numbers they produced before
  pages existed).

By default the pool has a page for every block of every head (``layout.kv_pool_pages``), so neither
layout runs out of pages before the arena runs out of slots. A smaller pool serves only the per-head
layout: its heads hold fewer tokens than there are slots, and ``pages_short`` tells the policy how many
pages it must free before the next tokens enter.
"""

from __future__ import annotations

import numpy as np

from .layout import blocks_per_head, kv_pool_pages

NO_ROWS = np.empty(0, dtype=np.int64)


class PageTable:
    """Block tables, lengths and the slot of every entry, for every (layer, KV head) of one arena."""

    def __init__(self, heads: tuple[int, int], capacity: int, page_tokens: int, per_head: bool,
                 pool_pages: int = 0) -> None:
        layers, kv_heads = heads
        self.heads, self.capacity, self.page_tokens, self.per_head = (layers, kv_heads), capacity, page_tokens, per_head
        self.width = blocks_per_head(capacity, page_tokens)
        dense = kv_pool_pages(layers, kv_heads, capacity, page_tokens)
        self.num_pages = kv_pool_pages(layers, kv_heads, capacity, page_tokens, pool_pages)
        if not per_head and self.num_pages < dense:
            raise ValueError(f"a pool of {self.num_pages} KV pages is smaller than the {dense} pages every head "
                             f"holding every one of {capacity} slots takes: only dms (pages per KV head) runs on it")
        self.lengths = np.zeros(self.heads, dtype=np.int32)  # entries per head (dense: up to the last held slot)
        self.entry_slot = np.full((self.num_pages, page_tokens), -1, dtype=np.int32)  # -1: no token
        self.entry_of = np.full((*self.heads, capacity), -1, dtype=np.int32)  # slot -> entry in each head, -1: none
        if per_head:
            self.block_table = np.full((*self.heads, self.width), -1, dtype=np.int32)
            self._free = list(range(self.num_pages - 1, -1, -1))  # a stack: the page freed last goes first
        else:
            self.block_table = np.arange(dense, dtype=np.int32).reshape(*self.heads, self.width)
            self._free = []

    @property
    def flat_heads(self) -> int:
        return self.heads[0] * self.heads[1]

    def _rows(self, heads: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Pool rows of entries of (flat) heads; only meaningful where the head has a page for the entry."""
        pages = self.block_table.reshape(self.flat_heads, self.width)[heads, entries // self.page_tokens]
        return pages.astype(np.int64) * self.page_tokens + entries % self.page_tokens

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """[layers, kv_heads, n] pool row of each slot's entry in each head, -1 where the head does not hold it."""
        entries = self.entry_of[:, :, np.asarray(slots, dtype=np.int64)]
        heads = np.broadcast_to(np.arange(self.flat_heads).reshape(*self.heads, 1), entries.shape)
        return np.where(entries >= 0, self._rows(heads, np.maximum(entries, 0)), -1)

    def holds(self, slots: np.ndarray) -> np.ndarray:
        """[layers, kv_heads, n]: which heads hold (read) each slot's token."""
        return self.entry_of[:, :, np.asarray(slots, dtype=np.int64)] >= 0

    def held_per_head(self) -> np.ndarray:
        """[layers, kv_heads] tokens each head holds."""
        if self.per_head:
            return self.lengths.copy()
        return np.full(self.heads, np.count_nonzero(self.entry_of[0, 0] >= 0), dtype=np.int32)

    def pages_per_head(self) -> np.ndarray:
        """[layers, kv_heads] pages each head's entries 0..length-1 span (per head: the pages it holds)."""
        return -(-self.lengths // self.page_tokens)

    def pages_in_use(self) -> int:
        return int(self.pages_per_head().sum())

    def pages_short(self, count: int) -> int:
        """Pages missing for ``count`` more entries in every head (per-head layout; 0: they fit)."""
        if not self.per_head:
            return 0
        lengths = self.lengths.reshape(-1)
        wanted = int((-(-(lengths + count) // self.page_tokens) + lengths // -self.page_tokens).sum())
        return max(0, wanted - len(self._free))

    def add(self, slots: np.ndarray) -> None:
        """Every head now holds ``slots``: tokens that just entered, which every head reads at first."""
        slots = np.asarray(slots, dtype=np.int32)
        if not slots.size:
            return
        if not self.per_head:
            self.entry_of[:, :, slots] = slots
            self.entry_slot.reshape(-1)[self.rows(slots)] = slots
            self.lengths[:] = max(int(self.lengths.max()), int(slots.max()) + 1)
            return
        if (self.entry_of[:, :, slots] >= 0).any():
            raise ValueError("a slot entered twice: its token is already held")
        flat = self.flat_heads
        self._append(np.repeat(np.arange(flat), slots.size), np.tile(slots, flat))

    def _append(self, heads: np.ndarray, slots: np.ndarray) -> None:
        """Append ``slots[i]`` to head ``heads[i]`` (heads ascending; each head's slots in entry order),
        taking pages from the pool as lengths cross page boundaries."""
        flat, page = self.flat_heads, self.page_tokens
        count = np.bincount(heads, minlength=flat)
        lengths = self.lengths.reshape(-1)
        have = -(-lengths // page)
        need = -(-(lengths + count) // page) - have
        total = int(need.sum())
        if total > len(self._free):
            raise RuntimeError(f"KV pool exhausted: {total} pages wanted, {len(self._free)} free")
        pages = np.array([self._free.pop() for _ in range(total)], dtype=np.int32)
        owner = np.repeat(np.arange(flat), need)
        self.block_table.reshape(flat, self.width)[owner, have[owner] + np.arange(total) - (np.cumsum(need) - need)[owner]] = pages
        entries = lengths[heads] + np.arange(heads.size) - (np.cumsum(count) - count)[heads]
        self.entry_of.reshape(flat, self.capacity)[heads, slots] = entries
        self.entry_slot.reshape(-1)[self._rows(heads, entries)] = slots
        lengths += count.astype(np.int32)

    def remove(self, slots: np.ndarray, drop: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Heads where ``drop[layer, kv_head, j]`` (None: every head) stop holding ``slots[j]``.

        Returns the pool rows the storage must copy, (sources, destinations), so that every head stays
        without holes (per-head layout; the dense layout moves nothing). Sources and destinations are
        disjoint, so the copies may run in any order."""
        slots = np.asarray(slots, dtype=np.int32)
        entries = self.entry_of[:, :, slots]
        held = entries >= 0
        drop = held if drop is None else np.asarray(drop, dtype=bool) & held
        if not self.per_head:
            gone = drop.any(axis=(0, 1))
            if (drop != (held & gone)).any():
                raise ValueError("the dense layout drops a token from every head at once (per-head drops need "
                                 "the per-head layout)")
            self.entry_slot.reshape(-1)[self.rows(slots[gone])] = -1
            self.entry_of[:, :, slots[gone]] = -1
            held_slots = np.flatnonzero(self.entry_of[0, 0] >= 0)
            self.lengths[:] = int(held_slots[-1]) + 1 if held_slots.size else 0
            return NO_ROWS, NO_ROWS
        flat = self.flat_heads
        heads, columns = np.nonzero(drop.reshape(flat, -1))
        if not heads.size:
            return NO_ROWS, NO_ROWS
        removed = entries.reshape(flat, -1)[heads, columns]
        count = np.bincount(heads, minlength=flat)
        lengths = self.lengths.reshape(-1)
        new = lengths - count
        # holes below the new length are filled by the entries at or above it that stay, in order, head by head
        hole = removed < new[heads]
        order = np.lexsort((removed[hole], heads[hole]))
        hole_heads, hole_entries = heads[hole][order], removed[hole][order]
        tail_heads = np.repeat(np.arange(flat), count)
        tail_entries = new[tail_heads] + np.arange(tail_heads.size) - (np.cumsum(count) - count)[tail_heads]
        key = self.capacity + 1
        staying = ~np.isin(tail_heads.astype(np.int64) * key + tail_entries,
                           heads.astype(np.int64) * key + removed)
        sources = self._rows(tail_heads[staying], tail_entries[staying])
        targets = self._rows(hole_heads, hole_entries)
        tail_rows = self._rows(tail_heads, tail_entries)
        entry_slot, entry_of = self.entry_slot.reshape(-1), self.entry_of.reshape(flat, self.capacity)
        moved = entry_slot[sources]
        entry_of[heads, slots[columns]] = -1
        entry_slot[tail_rows] = -1
        entry_slot[targets] = moved
        entry_of[tail_heads[staying], moved] = hole_entries
        # pages past a head's new length go back to the pool
        table = self.block_table.reshape(flat, self.width)
        blocks = np.arange(self.width)[None, :]
        freed = (blocks >= -(-new // self.page_tokens)[:, None]) & (blocks < -(-lengths // self.page_tokens)[:, None])
        self._free.extend(table[freed][::-1].tolist())
        table[freed] = -1
        lengths[:] = new
        return sources, targets

    def layer_rows(self, layer: int) -> np.ndarray:
        """[kv_heads, n] pool rows of one layer's entries 0..n-1 per head (n: its longest head; -1 past a
        head's length): what attention reads."""
        lengths = self.lengths[layer]
        n = int(lengths.max()) if lengths.size else 0
        kv_heads = self.heads[1]
        heads = np.broadcast_to((layer * kv_heads + np.arange(kv_heads))[:, None], (kv_heads, n))
        entries = np.broadcast_to(np.arange(n), (kv_heads, n))
        inside = entries < lengths[:, None]
        return np.where(inside, self._rows(heads, np.where(inside, entries, 0)), -1)

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens held per head [layers, kv_heads], the pool row of each held entry, head by head in entry order)."""
        flat = self.flat_heads
        lengths = self.lengths.reshape(-1)
        heads = np.repeat(np.arange(flat), lengths)
        entries = np.arange(heads.size) - (np.cumsum(lengths) - lengths)[heads]
        rows = self._rows(heads, entries)
        taken = self.entry_slot.reshape(-1)[rows] >= 0  # dense: skip the holes
        counts = np.bincount(heads[taken], minlength=flat).reshape(self.heads).astype(np.int32)
        return counts, rows[taken]

    def restore(self, counts: np.ndarray, slots: np.ndarray) -> None:
        """Hold again what ``held`` described: ``counts`` [layers, kv_heads] entries, ``slots`` head by head in
        entry order. The table must be empty; ValueError when the description does not fit this layout."""
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        slots = np.asarray(slots, dtype=np.int32)
        if counts.size != self.flat_heads or counts.min(initial=0) < 0 or counts.sum() != slots.size:
            raise ValueError(f"memory state holds {counts.size} heads' entries, this arena has {self.flat_heads}")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"memory state holds slots outside a {self.capacity}-slot arena")
        heads = np.repeat(np.arange(self.flat_heads), counts)
        if self.per_head:
            if np.unique(heads.astype(np.int64) * self.capacity + slots).size != slots.size:
                raise ValueError("memory state holds a token twice in one head")
            wanted = int((-(-counts // self.page_tokens)).sum())
            if wanted > len(self._free):
                raise ValueError(f"memory state holds {wanted} KV pages, this arena's pool has {len(self._free)}")
            self._append(heads, slots)
            return
        if (counts != counts[0]).any() or (slots.reshape(self.flat_heads, counts[0]) != slots[:counts[0]]).any():
            raise ValueError("memory state holds different tokens per head; this arena's layout is dense")
        if (np.diff(slots[:counts[0]]) <= 0).any():
            raise ValueError("memory state's dense entries are not in slot order")
        self.add(slots[:counts[0]])
