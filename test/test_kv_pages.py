"""The arena's pages: block tables per (layer, KV head) over one pool, how drops free pages, the bound on waste."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.model.arena import KVArena
from vla_edge_ros.model.layout import kv_pool_pages
from vla_edge_ros.model.pages import PageTable


class Rows:
    """A stand-in for the backend's pool: each row remembers the slot written into it, and moves copy it."""

    def __init__(self, table: PageTable) -> None:
        self.table = table
        self.values = np.full(table.num_pages * table.page_tokens, -7, dtype=np.int64)

    def write(self, slots: np.ndarray) -> None:
        rows = self.table.rows(slots)
        self.values[rows] = np.broadcast_to(slots, rows.shape)

    def move(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        assert not np.intersect1d(sources, destinations).size  # the copies may run in parallel
        assert np.unique(destinations).size == destinations.size
        self.values[destinations] = self.values[sources]


def check(table: PageTable, rows: Rows | None = None) -> None:
    """Every invariant of the per-head layout, and the bound on waste: a head holds ceil(length / P) pages."""
    flat, page = table.flat_heads, table.page_tokens
    lengths = table.lengths.reshape(-1)
    blocks = table.block_table.reshape(flat, table.width)
    pages = -(-lengths // page)
    owned = [blocks[h, :pages[h]] for h in range(flat)]
    assert all((o >= 0).all() for o in owned) and all((blocks[h, pages[h]:] == -1).all() for h in range(flat))
    used = np.concatenate(owned)
    assert np.unique(used).size == used.size  # no page in two places
    assert sorted(used.tolist() + table._free) == list(range(table.num_pages))  # nothing lost, nothing twice
    assert (pages * page - lengths < page).all()  # less than one page of waste per head
    assert table.pages_in_use() == used.size
    for h in range(flat):
        entries = np.arange(lengths[h])
        head_rows = blocks[h, entries // page].astype(np.int64) * page + entries % page
        slots = table.entry_slot.reshape(-1)[head_rows]
        assert (slots >= 0).all() and np.unique(slots).size == slots.size  # no hole, no token twice
        of = table.entry_of.reshape(flat, -1)[h]
        np.testing.assert_array_equal(of[slots], entries)
        assert np.count_nonzero(of >= 0) == lengths[h]
        if rows is not None:
            np.testing.assert_array_equal(rows.values[head_rows], slots)  # every row holds its own token's data


def test_the_pool_has_a_page_for_every_block_of_every_head():
    table = PageTable((3, 2), capacity=50, page_tokens=16, per_head=True)
    assert table.width == 4 and table.num_pages == kv_pool_pages(3, 2, 50, 16) == 24


def test_a_head_that_drops_a_token_fills_the_hole_with_its_last_entry_and_gives_back_a_page():
    table = PageTable((1, 2), capacity=16, page_tokens=2, per_head=True)
    rows = Rows(table)
    slots = np.arange(5, dtype=np.int32)
    table.add(slots)
    rows.write(slots)
    assert table.lengths.tolist() == [[5, 5]] and table.pages_in_use() == 6
    drop = np.zeros((1, 2, 2), bool)
    drop[0, 0] = True  # head 0 drops slots 1 and 4; head 1 keeps both
    sources, targets = table.remove(np.array([1, 4], np.int32), drop)
    rows.move(sources, targets)
    assert table.lengths.tolist() == [[3, 5]] and table.pages_in_use() == 5  # head 0 gave a page back
    assert table.holds(np.array([1, 4]))[0].tolist() == [[False, False], [True, True]]
    entries = table.entry_slot.reshape(-1)[table.layer_rows(0)[0, :3]]
    assert entries.tolist() == [0, 3, 2]  # the last entry still held (slot 3) moved into the hole at entry 1
    assert sources.size == 1
    check(table, rows)


def test_the_dense_layout_keeps_entry_e_at_slot_e_and_drops_a_token_from_every_head_at_once():
    table = PageTable((2, 2), capacity=10, page_tokens=4, per_head=False)
    table.add(np.array([0, 1, 2, 3, 4, 5], np.int32))
    assert (table.lengths == 6).all()
    np.testing.assert_array_equal(table.rows(np.array([5]))[1, 0], [(1 * 2 + 0) * 3 * 4 + 5])
    sources, _ = table.remove(np.array([5, 2], np.int32))
    assert sources.size == 0 and (table.lengths == 5).all()  # the span ends after slot 4; slot 2 is a hole
    assert (table.entry_slot.reshape(-1)[table.layer_rows(1)] == [0, 1, -1, 3, 4]).all()
    assert table.held_per_head().tolist() == [[4, 4], [4, 4]]
    with pytest.raises(ValueError, match="every head at once"):
        table.remove(np.array([1], np.int32), np.array([True, False, True, True]).reshape(2, 2, 1))


@pytest.mark.parametrize("page_tokens", [1, 3, 16])
def test_waste_stays_under_a_page_per_head_through_a_long_random_episode(page_tokens):
    """Tokens enter every head; heads drop their own; whole tokens leave; the pool never leaks nor fragments."""
    rng = np.random.default_rng(page_tokens)
    capacity = 64
    table = PageTable((2, 3), capacity=capacity, page_tokens=page_tokens, per_head=True)
    rows = Rows(table)
    valid = np.zeros(capacity, bool)
    for _ in range(400):
        free = np.flatnonzero(~valid)
        new = rng.choice(free, size=min(free.size, int(rng.integers(1, 6))), replace=False).astype(np.int32)
        table.add(new)
        rows.write(new)
        valid[new] = True
        check(table, rows)
        held = np.flatnonzero(valid).astype(np.int32)
        drop = rng.random((2, 3, held.size)) < 0.3
        rows.move(*table.remove(held, drop))
        check(table, rows)
        gone = held[~table.holds(held).any(axis=(0, 1)) | (rng.random(held.size) < 0.05)]
        rows.move(*table.remove(gone))
        valid[gone] = False
        check(table, rows)
        assert table.pages_in_use() <= table.held_per_head().sum() / page_tokens + table.flat_heads


@pytest.mark.parametrize("per_head", [True, False])
def test_what_a_table_holds_restores_to_the_same_entries_in_the_same_order(per_head):
    rng = np.random.default_rng(1)
    table = PageTable((2, 2), capacity=20, page_tokens=3, per_head=per_head)
    table.add(np.arange(12, dtype=np.int32))
    drop = rng.random((2, 2, 12)) < 0.4 if per_head else np.broadcast_to(rng.random(12) < 0.4, (2, 2, 12))
    table.remove(np.arange(12, dtype=np.int32), drop)
    counts, held_rows = table.held()
    slots = table.entry_slot.reshape(-1)[held_rows]
    twin = PageTable((2, 2), capacity=20, page_tokens=3, per_head=per_head)
    twin.restore(counts, slots)
    twin_counts, twin_rows = twin.held()
    np.testing.assert_array_equal(twin_counts, counts)
    np.testing.assert_array_equal(twin.entry_slot.reshape(-1)[twin_rows], slots)
    np.testing.assert_array_equal(twin.holds(np.arange(20)), table.holds(np.arange(20)))
    if per_head:
        check(twin)
    with pytest.raises(ValueError, match="heads"):
        PageTable((2, 2), capacity=20, page_tokens=3, per_head=per_head).restore(counts[:1], slots[:counts[0, 0]])


def test_the_dense_layout_refuses_to_restore_different_tokens_per_head():
    table = PageTable((1, 2), capacity=8, page_tokens=2, per_head=False)
    with pytest.raises(ValueError, match="different tokens per head"):
        table.restore(np.array([[2, 2]]), np.array([0, 1, 0, 2], np.int32))


def test_the_arena_releases_a_slot_when_its_last_head_drops_it_and_hands_the_moves_to_the_storage():
    arena = KVArena(8, page_tokens=2)
    arena.set_layout((1, 2), per_head=True)
    moved = []
    arena.move_rows = lambda sources, targets: moved.append((sources.copy(), targets.copy()))
    slots = arena.allocate(3)
    arena.commit(slots, np.arange(3, dtype=np.int32))
    one_head = np.array([True, False]).reshape(1, 2, 1)
    assert arena.hide(slots[:1], one_head).size == 0  # head 1 still reads it: the slot stays
    assert arena.valid[0] and moved and moved[0][1].tolist() == [0]  # head 0's last entry filled its hole
    assert arena.hide(slots[:1], ~one_head).tolist() == [0]
    assert not arena.valid[0] and arena.positions[0] == -1 and arena.used == 2
    arena.set_layout((1, 2), per_head=False)  # a new layout empties the arena
    assert arena.used == 0 and not arena.per_head
    with pytest.raises(RuntimeError, match="per-head layout"):
        arena.hide(slots[:1], one_head)


def test_a_smaller_pool_says_how_many_pages_the_next_entries_lack():
    table = PageTable((1, 2), capacity=32, page_tokens=4, per_head=True, pool_pages=5)
    assert table.num_pages == 5
    table.add(np.arange(7, dtype=np.int32))  # 2 pages per head, 1 free
    assert table.pages_short(1) == 0  # both heads still have room in their second page
    assert table.pages_short(2) == 1  # each head wants a third page, one is free
    drop = np.zeros((1, 2, 7), bool)
    drop[0, 1, :3] = True  # head 1 falls to 4 entries: its second page goes back
    table.remove(np.arange(7, dtype=np.int32), drop)
    assert table.pages_short(2) == 0 and len(table._free) == 2
    with pytest.raises(RuntimeError, match="pool exhausted"):
        table.add(np.arange(7, 20, dtype=np.int32))
    with pytest.raises(ValueError, match="only dms"):
        PageTable((1, 2), capacity=32, page_tokens=4, per_head=False, pool_pages=5)
