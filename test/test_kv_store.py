"""The KV block store: byte-exact round trips, every tampering detected, crash safety, concurrency, disk full."""

from __future__ import annotations

import base64
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.engine import vla_engine as engine_module
from vla_edge_ros.engine.vla_engine import VlaEngine
from vla_edge_ros.kv_store import (
    BlockStore,
    StoreFullError,
    StoreKeyError,
    load_key,
    load_or_prefill_prompt,
    model_fingerprint,
    restore_memory,
    save_memory,
)
from vla_edge_ros.kv_store import store as store_module
from vla_edge_ros.kv_store.block_file import HEADER_BYTES
from vla_edge_ros.kv_store.engine_blocks import memory_key, prompt_key
from vla_edge_ros.kv_store.keys import chain_key, parse_key, write_new_key
from vla_edge_ros.memory import POLICIES, make_policy
from vla_edge_ros.model.checkpoint import load_checkpoint
from vla_edge_ros.worlds.synthetic import SyntheticCamera

AES_KEY = bytes(range(32))
PROMPT = [151, 9, 402, 77, 1030, 12]
FINGERPRINT = b"\x11" * 32


@pytest.fixture(scope="module")
def checkpoint(tiny_model):
    return load_checkpoint(tiny_model)


def _engine(checkpoint, policy: str = "fifo") -> VlaEngine:
    return VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=128, policy=make_policy(policy, {}))


def _store(directory: Path, fingerprint: bytes = FINGERPRINT, aes_key: bytes | None = AES_KEY, **kwargs) -> BlockStore:
    return BlockStore(directory, fingerprint, aes_key=aes_key, budget_bytes=kwargs.pop("budget_bytes", 1 << 30),
                      log=kwargs.pop("log", lambda message: None), **kwargs)


def _arrays(seed: int = 0, size: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"keys": rng.standard_normal((2, size)).astype(np.float32), "ids": np.arange(7, dtype=np.int32),
            "counters": np.array([seed, 2, 3], dtype=np.int64), "name": np.frombuffer(b"fifo", np.uint8).copy()}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


# -- the engine's uses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_episode_memory_round_trip_is_byte_exact_for_every_policy(checkpoint, tmp_path, policy):
    store = _store(tmp_path, model_fingerprint(checkpoint))
    camera = SyntheticCamera(height=48, width=64, seed=1)
    frames = [camera.frame() for _ in range(14)]
    engine = _engine(checkpoint, policy)
    engine.set_prompt(PROMPT)
    for frame in frames[:12]:
        engine.step(frame)
    saved = engine.memory_state()
    assert save_memory(engine, store, "robot_1") > 0

    restarted = _engine(checkpoint, policy)
    restarted.set_prompt(PROMPT)
    assert restore_memory(restarted, store, "robot_1")
    assert _same(saved, restarted.memory_state())
    for frame in frames[12:]:  # and it goes on exactly as the original would have
        assert np.array_equal(engine.step(frame).action, restarted.step(frame).action)


def test_memory_is_bound_to_policy_and_name(checkpoint, tmp_path):
    store = _store(tmp_path, model_fingerprint(checkpoint))
    engine = _engine(checkpoint, "fifo")
    engine.set_prompt(PROMPT)
    engine.step(SyntheticCamera(height=48, width=64).frame())
    save_memory(engine, store, "robot_1")
    other = _engine(checkpoint, "cosine")
    other.set_prompt(PROMPT)
    assert not restore_memory(other, store, "robot_1")
    assert not restore_memory(_with_prompt(_engine(checkpoint), PROMPT), store, "robot_2")
    assert not restore_memory(_with_prompt(_engine(checkpoint), PROMPT[:3]), store, "robot_1")
    assert store.failures == {}  # different keys: plain misses, not failures


def test_a_memory_block_that_does_not_fit_is_logged_in_words(checkpoint, tmp_path):
    """Authentic but lacking an array (another engine version's layout): a miss, logged without a repr."""
    lines: list[str] = []
    store = _store(tmp_path, model_fingerprint(checkpoint), log=lines.append)
    engine = _with_prompt(_engine(checkpoint), PROMPT)
    state = engine.memory_state()
    del state["slots"]
    store.put(memory_key(store, PROMPT, "fifo", "robot_1"), "memory", state)
    assert not restore_memory(engine, store, "robot_1") and store.failures == {"shape": 1}
    assert lines == [f"KV block rejected (shape), recomputing instead: episode memory does not fit this engine: it "
                     f"lacks the array 'slots'"]


def _with_prompt(engine: VlaEngine, prompt: list[int]) -> VlaEngine:
    engine.set_prompt(prompt)
    return engine


def test_prompt_is_loaded_instead_of_prefilled_and_is_byte_exact(checkpoint, tmp_path):
    store = _store(tmp_path, model_fingerprint(checkpoint))
    first = _engine(checkpoint)
    assert not load_or_prefill_prompt(first, store, PROMPT)  # miss: prefilled and stored
    second = _engine(checkpoint)
    assert load_or_prefill_prompt(second, store, PROMPT)
    assert _same(first.prompt_kv(), second.prompt_kv())
    frame = SyntheticCamera(height=48, width=64).frame()
    assert np.array_equal(first.step(frame).action, second.step(frame).action)
    assert (store.hits, store.writes, dict(store.failures)) == (1, 1, {})


def test_long_prompts_prefill_in_chunks_to_the_same_cache(checkpoint, monkeypatch):
    whole = _engine(checkpoint)
    whole.set_prompt(PROMPT)
    monkeypatch.setattr(engine_module, "PREFILL_CHUNK_TOKENS", 4)
    chunked = _engine(checkpoint)
    chunked.set_prompt(PROMPT)
    a, b = whole.prompt_kv(), chunked.prompt_kv()
    assert np.array_equal(a["positions"], b["positions"])
    np.testing.assert_allclose(a["keys"], b["keys"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["values"], b["values"], rtol=1e-5, atol=1e-5)


def test_a_corrupt_prompt_block_is_recomputed_and_replaced(checkpoint, tmp_path):
    store = _store(tmp_path, model_fingerprint(checkpoint))
    load_or_prefill_prompt(_engine(checkpoint), store, PROMPT)
    path = store.path_of(prompt_key(store, PROMPT))
    _flip(path, path.stat().st_size // 2)
    engine = _engine(checkpoint)
    assert not load_or_prefill_prompt(engine, store, PROMPT)
    assert store.failures == {"tag": 1}
    assert load_or_prefill_prompt(_engine(checkpoint), store, PROMPT)  # the recompute rewrote a good block


# -- every tampering is detected, nothing is loaded ---------------------------------------------------------


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("encrypted", [True, False], ids=["aes-256-gcm", "plain"])
def test_one_flipped_byte_anywhere_is_detected(tmp_path, encrypted):
    store = _store(tmp_path, aes_key=AES_KEY if encrypted else None)
    key = chain_key(FINGERPRINT, "prompt", "x")
    store.put(key, "prompt", _arrays(size=64))
    path = store.path_of(key)
    original = path.read_bytes()
    for offset in range(len(original)):  # every byte: header fields, payload, tag or digest
        _flip(path, offset)
        assert store.get(key) is None, f"a flipped byte at offset {offset} was not detected"
        path.write_bytes(original)
    assert _same(store.get(key), _arrays(size=64))
    assert sum(store.failures.values()) == len(original)
    assert set(store.failures) <= {"magic", "version", "key", "fingerprint", "length", "tag", "digest",
                                   "plain", "encrypted"}


def test_truncated_or_extended_files_are_detected(tmp_path):
    store = _store(tmp_path)
    key = chain_key(FINGERPRINT, "prompt", "x")
    store.put(key, "prompt", _arrays())
    path = store.path_of(key)
    original = path.read_bytes()
    for length in (0, 7, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 5, len(original) - 1):
        path.write_bytes(original[:length])
        assert store.get(key) is None
    path.write_bytes(original + b"\0")
    assert store.get(key) is None
    assert store.failures == {"length": 7}


def test_another_keys_block_swapped_name_other_model_and_downgrade_are_refused(tmp_path):
    writer = _store(tmp_path)
    a, b, c = (chain_key(FINGERPRINT, "prompt", name) for name in "abc")
    writer.put(a, "prompt", _arrays(1))
    writer.put(b, "prompt", _arrays(2))

    stranger = _store(tmp_path / "stranger", aes_key=bytes(32))  # a block of another key, planted in this store
    stranger.put(c, "prompt", _arrays(3))
    stranger.path_of(c).replace(writer.path_of(c))
    assert writer.get(c) is None and writer.failures == {"tag": 1}
    assert _store(tmp_path, fingerprint=b"\x22" * 32).get(a) is None  # another model
    writer.path_of(a).replace(writer.path_of(b))  # a's block under b's name
    assert writer.get(b) is None
    assert writer.failures == {"tag": 1, "key": 1}

    plain = _store(tmp_path / "plain", aes_key=None)
    plain.put(a, "prompt", _arrays(1))
    plain.path_of(a).replace(writer.path_of(a))  # an encrypted store never reads plain blocks
    assert writer.get(a) is None and writer.failures["plain"] == 1


def test_failures_are_logged_once_per_block_and_reason(tmp_path):
    lines: list[str] = []
    store = BlockStore(tmp_path, FINGERPRINT, aes_key=AES_KEY, budget_bytes=1 << 30, log=lines.append)
    key = chain_key(FINGERPRINT, "prompt", "x")
    store.put(key, "prompt", _arrays())
    _flip(store.path_of(key), HEADER_BYTES + 3)
    for _ in range(3):
        assert store.get(key) is None
    assert store.failures == {"tag": 3} and len(lines) == 1 and "tag" in lines[0]
    assert AES_KEY.hex() not in lines[0]


# -- keys -----------------------------------------------------------------------------------------------


def test_key_file_must_be_private_and_well_formed(tmp_path, monkeypatch):
    path = tmp_path / "key"
    write_new_key(path)
    assert len(load_key(str(path))) == 32
    with pytest.raises(StoreKeyError, match=f"^key file {path} exists: keygen never replaces a key"):
        write_new_key(path)
    path.chmod(0o644)
    with pytest.raises(StoreKeyError, match="chmod 600"):
        load_key(str(path))
    path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(StoreKeyError, match="not a 256-bit key"):
        load_key(str(path))
    monkeypatch.setenv("TEST_KV_KEY", AES_KEY.hex())
    assert load_key("", "TEST_KV_KEY") == AES_KEY
    monkeypatch.delenv("TEST_KV_KEY")
    with pytest.raises(StoreKeyError, match="TEST_KV_KEY is not set"):
        load_key("", "TEST_KV_KEY")
    with pytest.raises(StoreKeyError, match="needs a key"):
        load_key("", "")


def test_only_an_unambiguous_256_bit_key_is_taken(tmp_path):
    """Hex, base64 and raw bytes overlap: 32 hex digits without a newline are also 32 raw bytes, and were taken
    as such, so a 128-bit key silently bound a new store to a key nobody meant. Raw must not be text."""
    raw = b"\n" + bytes(31)  # binary: whitespace at its ends is part of it
    for text, key in ((AES_KEY.hex().encode() + b"\n", AES_KEY), (AES_KEY.hex().upper().encode(), AES_KEY),
                      (base64.b64encode(AES_KEY) + b"\n", AES_KEY), (AES_KEY, AES_KEY), (raw, raw)):
        assert parse_key(text, "k") == key
    short = tmp_path / "aes128.key"
    for written in (AES_KEY[:16].hex().encode(), AES_KEY[:16].hex().encode() + b"\n"):
        short.write_bytes(written)
        short.chmod(0o600)
        with pytest.raises(StoreKeyError, match=f"^key file {short}: holds 32 hex digits, a 128-bit key; a 256-bit "
                                                 "key is 64 hex digits"):
            load_key(str(short))
    with pytest.raises(StoreKeyError, match="^k: holds 63 hex digits, a 252-bit key"):
        parse_key(AES_KEY.hex().encode()[:-1], "k")
    for text in (b"correct horse battery staple 123", b"  " + b"z" * 30, base64.b64encode(AES_KEY[:24])):
        with pytest.raises(StoreKeyError, match="^k: not a 256-bit key"):
            parse_key(text, "k")


# -- durability, budget, disk full ------------------------------------------------------------------------

_CRASHING_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from vla_edge_ros.kv_store import BlockStore
    directory, stop_at = sys.argv[1], sys.argv[2]
    store = BlockStore(directory, b"\\x11" * 32, aes_key=bytes(range(32)), budget_bytes=1 << 30)
    def hook(step):
        if step == stop_at:
            print(step, flush=True)
            time.sleep(60)  # the parent kills us here
    store.on_step = hook
    store.put(bytes(32), "memory", {"generation": np.full(200_000, 2, dtype=np.int32)})
""")


@pytest.mark.parametrize("step", ["written", "synced", "renamed", "durable"])
def test_a_writer_killed_between_steps_leaves_the_old_or_the_new_block(tmp_path, step):
    store = _store(tmp_path)
    store.put(bytes(32), "memory", {"generation": np.full(200_000, 1, dtype=np.int32)})
    child = subprocess.Popen([sys.executable, "-c", _CRASHING_WRITER, str(tmp_path), step],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == step
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    reopened = _store(tmp_path)  # removes the dead writer's temp file
    generation = reopened.get(bytes(32))["generation"]
    expected = 1 if step in ("written", "synced") else 2
    assert np.array_equal(generation, np.full(200_000, expected, dtype=np.int32))
    assert sorted(p.name for p in tmp_path.iterdir()) == [reopened.path_of(bytes(32)).name, "key-check"]
    assert reopened.verify() == []


_CONCURRENT = textwrap.dedent("""
    import sys, time
    import numpy as np
    from vla_edge_ros.kv_store import BlockStore
    directory, writer_id, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    store = BlockStore(directory, b"\\x11" * 32, aes_key=bytes(range(32)), budget_bytes=1 << 30)
    keys = [bytes([k]) * 32 for k in range(3)]
    reads = bad = 0
    end = time.monotonic() + seconds
    sequence = 0
    while time.monotonic() < end or sequence < 3:  # 3 rounds at least: a read of a key written before
        sequence += 1
        key = keys[sequence % 3]
        store.put(key, "memory", {"data": np.full(50_000, writer_id * 1_000_000 + sequence, dtype=np.int64)})
        got = store.get(keys[(sequence + 1) % 3])
        if got is not None:
            reads += 1
            data = got["data"]
            bad += int(not (data == data[0]).all())
    print(reads, bad, sum(store.failures.values()), flush=True)
""")


def test_two_processes_writing_and_reading_never_corrupt_the_store(tmp_path):
    children = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(tmp_path), str(i), "2.0"],
                                 stdout=subprocess.PIPE, text=True) for i in (1, 2)]
    results = [tuple(int(x) for x in child.communicate(timeout=600)[0].split()) for child in children]
    for reads, inconsistent, failures in results:
        assert reads > 0 and inconsistent == 0 and failures == 0
    assert _store(tmp_path).verify() == []


def test_least_recently_used_blocks_go_first_to_keep_the_budget(tmp_path):
    probe = _store(tmp_path / "probe")
    size = probe.put(bytes(32), "memory", _arrays())
    store = _store(tmp_path / "store", budget_bytes=3 * size)
    keys = [bytes([k]) * 32 for k in range(4)]
    for i, key in enumerate(keys[:3]):
        store.put(key, "memory", _arrays())
        os.utime(store.path_of(key), (1000 + i, 1000 + i))
    assert store.get(keys[0]) is not None  # a hit makes keys[0] the most recently used
    store.put(keys[3], "memory", _arrays())
    assert [store.path_of(k).exists() for k in keys] == [True, False, True, True]
    assert store.evictions == 1
    with pytest.raises(StoreFullError, match="exceeds the store budget"):
        store.put(bytes(32), "memory", _arrays(size=10_000))
    assert store.gc(size) and sum(e.size for e in store.entries()) <= size


def test_the_free_space_floor_evicts_then_refuses(tmp_path, monkeypatch):
    store = _store(tmp_path, min_free_bytes=10_000)
    old = bytes([1]) * 32
    size = store.put(old, "memory", _arrays())
    usage = store_module.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(store_module.shutil, "disk_usage",
                        lambda path: usage._replace(free=10_000 + size // 2))
    store.put(bytes([2]) * 32, "memory", _arrays())  # fits only once the old block is evicted
    assert not store.path_of(old).exists()
    monkeypatch.setattr(store_module.shutil, "disk_usage", lambda path: usage._replace(free=100))
    with pytest.raises(StoreFullError, match="free-space floor"):
        store.put(bytes([3]) * 32, "memory", _arrays())
    assert store.path_of(bytes([2]) * 32).exists()


def test_disk_full_mid_write_leaves_existing_blocks_intact(tmp_path, monkeypatch):
    store = _store(tmp_path)
    key = bytes(32)
    store.put(key, "memory", _arrays(1))
    real_write = os.write

    def write_then_fill(fd, data):
        real_write(fd, bytes(data[:100]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "write", write_then_fill)
    with pytest.raises(StoreFullError, match="disk full"):
        store.put(key, "memory", _arrays(2))
    monkeypatch.undo()
    assert _same(store.get(key), _arrays(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.path_of(key).name, "key-check"]


def test_temp_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".tmp.{int(dead.stdout)}.abc.kvb"
    live = tmp_path / f".tmp.{os.getpid()}.def.kvb"
    stale.write_bytes(b"half a block")
    live.write_bytes(b"being written")
    store = _store(tmp_path)
    assert not stale.exists() and live.exists() and store.entries() == []


def test_the_index_is_the_directory(tmp_path):
    before = time.time()
    store = _store(tmp_path)
    for k in range(3):
        store.put(bytes([k]) * 32, "prompt" if k else "memory", _arrays(k))
    other = _store(tmp_path)  # a second process sees the same blocks without any index file
    assert [(e.header.kind, e.header.key) for e in other.entries()] == \
        [(e.header.kind, e.header.key) for e in store.entries()]
    assert all(e.header.fingerprint == FINGERPRINT and e.header.encrypted for e in other.entries())
    # last use is the file's mtime: the time of its write (1 s either side for file-system timestamp granularity)
    assert all(before - 1.0 <= e.last_used <= time.time() + 1.0 for e in other.entries())


def test_a_prompt_that_cannot_be_stored_still_runs(checkpoint, tmp_path):
    lines: list[str] = []
    store = BlockStore(tmp_path, model_fingerprint(checkpoint), aes_key=AES_KEY, budget_bytes=4096,
                       log=lines.append)  # far too small for the prompt block
    engine = _engine(checkpoint)
    assert not load_or_prefill_prompt(engine, store, PROMPT)
    assert engine.arena.used == len(PROMPT) and store.writes == 0
    assert lines and "prompt KV not stored" in lines[0] and "exceeds the store budget" in lines[0]
