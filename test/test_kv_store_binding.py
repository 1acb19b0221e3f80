"""A store is bound to its key: another key, or the other mode, is refused with nothing changed on disk;
old unbound stores are adopted only when every block authenticates; re-key (crash-safe) and wipe."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.kv_store import BlockDirectory, BlockStore, StoreBindingError, StoreBusyError, StoreKeyError
from vla_edge_ros.kv_store.binding import CHECK_NAME, JOURNAL_NAME, Binding, read_binding
from vla_edge_ros.kv_store.block_file import BlockError, open_block
from vla_edge_ros.kv_store.keys import chain_key, key_id
from vla_edge_ros.kv_store.rekey import wipe

OLD, NEW, STRANGER = bytes(range(32)), bytes(range(1, 33)), bytes(32)
FINGERPRINT = b"\x11" * 32
BLOCKS = {chain_key(FINGERPRINT, "prompt", name): seed for seed, name in enumerate("abc")}
LAST_USED = {key: 100.0 + seed for key, seed in BLOCKS.items()}  # distinct, so a lost LRU order would show


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"keys": rng.standard_normal((2, 500)).astype(np.float32), "ids": np.arange(seed + 3, dtype=np.int32)}


def _open(directory: Path, aes_key: bytes | None, log=lambda message: None) -> BlockStore:
    return BlockStore(directory, FINGERPRINT, aes_key=aes_key, budget_bytes=1 << 30, log=log)


def _filled(directory: Path, aes_key: bytes | None = OLD) -> Path:
    """A closed store holding BLOCKS, each with its own last-used time."""
    store = _open(directory, aes_key)
    for key, seed in BLOCKS.items():
        store.put(key, "prompt", _arrays(seed))
        os.utime(store.path_of(key), (LAST_USED[key], LAST_USED[key]))
    store.close()
    return directory


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime: what 'nothing was changed' compares."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def _assert_whole_under(directory: Path, aes_key: bytes) -> None:
    """The store opens with ``aes_key``, is bound to it alone, and every block is there and authentic."""
    store = _open(directory, aes_key)
    try:
        assert read_binding(directory) == Binding(True, key_id(aes_key))
        assert not (directory / JOURNAL_NAME).exists()
        assert store.verify() == []
        assert {e.path.name: e.last_used for e in store.entries()} == \
            {store.path_of(key).name: when for key, when in LAST_USED.items()}  # the LRU order survives
        for key, seed in BLOCKS.items():
            got = store.get(key)
            assert got is not None and all(np.array_equal(got[name], a) for name, a in _arrays(seed).items())
    finally:
        store.close()


def _sealed_under(directory: Path, aes_key: bytes) -> int:
    count = 0
    for path in directory.glob("[!.]*.kvb"):  # blocks, not temp files
        try:
            open_block(path.read_bytes(), str(path), key=None, fingerprint=None, aes_key=aes_key)
            count += 1
        except BlockError:
            pass
    return count


# -- binding and refusal ----------------------------------------------------------------------------------


def test_a_new_store_is_bound_to_the_key_that_first_opens_it(tmp_path):
    _filled(tmp_path)
    assert read_binding(tmp_path) == Binding(True, key_id(OLD))
    assert CHECK_NAME in {p.name for p in tmp_path.iterdir()}
    check = (tmp_path / CHECK_NAME).read_bytes()
    assert OLD not in check and OLD.hex().encode() not in check  # the key-check never holds the key
    _assert_whole_under(tmp_path, OLD)
    plain = _open(tmp_path / "plain", None)
    assert read_binding(plain.directory) == Binding(False, bytes(32))


@pytest.mark.parametrize("made_with, opened_with, expected", [
    (OLD, STRANGER, "is bound to another key"),
    (OLD, None, r"is encrypted \(key "),
    (None, OLD, "holds plain blocks"),
], ids=["another key", "encrypted opened plain", "plain opened encrypted"])
def test_another_key_or_mode_is_refused_and_nothing_changes_on_disk(tmp_path, made_with, opened_with, expected):
    _filled(tmp_path, made_with)
    before = _snapshot(tmp_path)
    with pytest.raises(StoreBindingError, match=expected) as info:
        _open(tmp_path, opened_with)
    assert "not opened, nothing was changed" in str(info.value) and "vla-edge kv-store wipe" in str(info.value)
    assert _snapshot(tmp_path) == before
    store = _open(tmp_path, made_with)  # and the right key (or mode) still works
    assert all(store.get(key) is not None for key in BLOCKS) and store.failures == {}


def test_the_refusal_names_both_keys_and_the_way_out(tmp_path):
    _filled(tmp_path)
    with pytest.raises(StoreBindingError) as info:
        _open(tmp_path, STRANGER)
    message = str(info.value)
    assert key_id(OLD).hex()[:16] in message and key_id(STRANGER).hex()[:16] in message
    assert f"vla-edge kv-store rekey --dir {tmp_path}" in message and OLD.hex() not in message


def _unbound(directory: Path, aes_key: bytes | None = OLD) -> Path:
    """A store as made before key binding existed: blocks, no key-check."""
    _filled(directory, aes_key)
    (directory / CHECK_NAME).unlink()
    return directory


def test_an_unbound_store_is_adopted_by_a_key_every_block_authenticates_under(tmp_path):
    _unbound(tmp_path)
    lines: list[str] = []
    store = _open(tmp_path, OLD, log=lines.append)
    assert read_binding(tmp_path) == Binding(True, key_id(OLD))
    assert len(lines) == 1 and "all 3 blocks authenticate under this key" in lines[0]
    store.close()
    _assert_whole_under(tmp_path, OLD)


@pytest.mark.parametrize("opened_with", [STRANGER, None], ids=["another key", "plain"])
def test_an_unbound_store_is_refused_by_a_key_its_blocks_do_not_authenticate_under(tmp_path, opened_with):
    _unbound(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(StoreBindingError, match="not bound to a key yet, and 3 of its 3 blocks do not"):
        _open(tmp_path, opened_with)
    assert _snapshot(tmp_path) == before


def test_an_unbound_store_with_one_bad_block_is_refused_even_with_its_key(tmp_path):
    _unbound(tmp_path)
    damaged = next(iter(sorted(tmp_path.glob("*.kvb"))))
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    before = _snapshot(tmp_path)
    with pytest.raises(StoreBindingError, match=f"1 of its 3 blocks .* {damaged.name}"):
        _open(tmp_path, OLD)
    assert _snapshot(tmp_path) == before


def test_a_damaged_key_check_is_refused_and_removing_it_lets_the_key_rebind(tmp_path):
    _filled(tmp_path)
    check = tmp_path / CHECK_NAME
    check.write_bytes(check.read_bytes()[:-1])
    with pytest.raises(StoreBindingError, match="key-check file is damaged .* Remove"):
        _open(tmp_path, OLD)
    check.unlink()
    _assert_whole_under(tmp_path, OLD)


# -- re-key -----------------------------------------------------------------------------------------------


def test_rekey_reseals_every_block_under_the_new_key(tmp_path):
    _filled(tmp_path)
    store = _open(tmp_path, OLD)
    count, size = store.rekey(NEW)
    assert count == 3 and size == sum(p.stat().st_size for p in tmp_path.glob("*.kvb"))
    assert store.verify() == []  # the object goes on with the new key
    store.close()
    assert _sealed_under(tmp_path, NEW) == 3 and _sealed_under(tmp_path, OLD) == 0
    _assert_whole_under(tmp_path, NEW)
    with pytest.raises(StoreBindingError, match="bound to another key"):
        _open(tmp_path, OLD)


def test_rekey_refuses_what_it_cannot_do_and_changes_nothing(tmp_path):
    directory = _filled(tmp_path / "store")
    stranger = _open(tmp_path / "elsewhere", STRANGER)
    stranger.put(b"\x07" * 32, "memory", _arrays(9))
    stranger.close()
    shutil.copy2(stranger.path_of(b"\x07" * 32), directory)  # a block its key cannot re-seal
    before = _snapshot(directory)
    store = _open(directory, OLD)
    with pytest.raises(StoreKeyError, match="1 blocks of KV store .* do not authenticate under its key"):
        store.rekey(NEW)
    with pytest.raises(StoreKeyError, match="nothing to change"):
        store.rekey(OLD)
    other = _open(directory, OLD)  # a second open (a running node) holds it too
    with pytest.raises(StoreBusyError, match="open in another process"):
        store.rekey(NEW)
    other.close()
    store.close()
    assert _snapshot(directory) == before
    plain = _open(tmp_path / "plain", None)
    with pytest.raises(StoreKeyError, match="no key to change"):
        plain.rekey(NEW)


_CRASHING_REKEY = textwrap.dedent("""
    import sys, time
    from vla_edge_ros.kv_store import BlockStore
    directory, old, new, stop_at, occurrence = sys.argv[1:6]
    store = BlockStore(directory, b"", aes_key=bytes.fromhex(old), budget_bytes=1 << 30)
    seen = []
    def hook(step):
        seen.append(step)
        if step == stop_at and seen.count(step) == int(occurrence):
            print(step, flush=True)
            time.sleep(60)  # the parent kills us here
    store.on_step = hook
    store.rekey(bytes.fromhex(new))
""")


@pytest.mark.parametrize("step, occurrence, resealed", [
    ("journal", 1, 0),  # the journal is durable, no block re-sealed yet
    ("written", 3, 1),  # the second block's new image half way: in its temp file, not renamed
    ("resealed", 2, 2),  # two of three blocks under the new key
    ("bound", 1, 3),  # the new key-check written, the journal not yet removed
])
def test_an_interrupted_rekey_leaves_a_store_either_key_opens_whole(tmp_path, step, occurrence, resealed):
    crashed = _filled(tmp_path / "crashed")
    child = subprocess.Popen([sys.executable, "-c", _CRASHING_REKEY, str(crashed), OLD.hex(), NEW.hex(), step,
                              str(occurrence)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == step
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert (crashed / JOURNAL_NAME).exists() and _sealed_under(crashed, NEW) == resealed  # really half way
    assert read_binding(crashed) == Binding(True, key_id(OLD), key_id(NEW))
    copies = {name: shutil.copytree(crashed, tmp_path / name) for name in ("old", "new", "stranger")}

    before = _snapshot(copies["stranger"])
    with pytest.raises(StoreBindingError, match="unfinished.* is neither"):
        _open(copies["stranger"], STRANGER)
    with pytest.raises(StoreBindingError, match="opened without encryption"):
        _open(copies["stranger"], None)
    assert _snapshot(copies["stranger"]) == before
    lines: list[str] = []
    _open(copies["old"], OLD, log=lines.append).close()  # rolls back
    assert "finished an interrupted re-key" in lines[0]
    _assert_whole_under(copies["old"], OLD)
    _open(copies["new"], NEW).close()  # rolls forward
    _assert_whole_under(copies["new"], NEW)


# -- wipe -------------------------------------------------------------------------------------------------


def test_wipe_removes_every_block_and_the_binding_so_any_key_starts_afresh(tmp_path):
    _filled(tmp_path)
    size = sum(p.stat().st_size for p in tmp_path.glob("*.kvb"))
    holder = _open(tmp_path, OLD)
    with pytest.raises(StoreBusyError, match="open in another process"):
        wipe(BlockDirectory(tmp_path))  # not under a running node
    holder.close()
    keyless = BlockDirectory(tmp_path)  # no key needed: the way out when it is lost
    assert wipe(keyless) == (3, size)
    keyless.close()
    assert list(tmp_path.iterdir()) == []
    fresh = _open(tmp_path, STRANGER)
    assert read_binding(tmp_path) == Binding(True, key_id(STRANGER)) and fresh.entries() == []
