"""A store on a read-only file system: every refused write is one line naming the store and the file (it was
``[Errno 30] Read-only file system`` and a temp file's name, or nothing at all), nothing is lost, and a store
that cannot be written still serves the blocks it holds."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.cli import main
from vla_edge_ros.kv_store import BlockStore, load_or_prefill_prompt, save_memory
from vla_edge_ros.kv_store.keys import chain_key

KEY = bytes(range(32))
FINGERPRINT = b"\x11" * 32
BLOCK = chain_key(FINGERPRINT, "prompt", "a")
EROFS = os.strerror(errno.EROFS)


@pytest.fixture
def read_only(monkeypatch) -> Callable[[Path], None]:
    """``read_only(directory)`` makes every write under ``directory`` fail as on a read-only mount (EROFS, even
    the unlink of a file that is not there), reads unchanged. These tests run as root, whom chmod does not stop,
    and a test cannot count on being allowed to mount, so the system calls the store makes are refused here."""
    roots: list[Path] = []

    def under(path: object) -> bool:
        return isinstance(path, (str, Path)) and any(Path(path).is_relative_to(root) for root in roots)

    def refuse(name: str, writes: Callable[..., bool] = lambda *args: True) -> None:
        real = getattr(os, name)

        def call(path, *args, **kwargs):
            if under(path) and writes(path, *args):
                raise OSError(errno.EROFS, EROFS, os.fspath(path))
            return real(path, *args, **kwargs)
        monkeypatch.setattr(os, name, call)

    refuse("open", lambda path, flags, *rest: bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
    for name in ("mkdir", "unlink", "replace", "link", "utime"):
        refuse(name)
    return lambda directory: roots.append(Path(directory))


def _filled(directory: Path) -> BlockStore:
    store = BlockStore(directory, FINGERPRINT, aes_key=KEY, budget_bytes=1 << 30, log=lambda message: None)
    store.put(BLOCK, "prompt", {"ids": np.arange(5, dtype=np.int32)})
    return store


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "kv.key"
    path.write_text(KEY.hex() + "\n")
    path.chmod(0o600)
    return path


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Errno" not in err and ".tmp." not in err, err
    return err.removeprefix(f"vla-edge {command}: error: ").rstrip("\n")


def test_opening_a_new_store_names_the_store_and_what_it_could_not_write(tmp_path, read_only, capsys):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    key_file = _key_file(tmp_path)
    read_only(store_dir)
    assert main(["kv-store", "verify", "--dir", str(store_dir), "--key-file", str(key_file)]) == 2
    assert _one_error_line(capsys, "kv-store") == f"KV store {store_dir}: cannot write key-check: {EROFS}"
    with pytest.raises(OSError, match=f"^KV store {store_dir / 'new'}: cannot create or open the directory: {EROFS}$"):
        BlockStore(store_dir / "new", FINGERPRINT, aes_key=KEY, budget_bytes=1 << 30)
    assert main(["kv-store", "keygen", "--out", str(store_dir / "new.key")]) == 2
    assert _one_error_line(capsys, "kv-store") == f"cannot write key file {store_dir / 'new.key'}: {EROFS}"
    assert list(store_dir.iterdir()) == []


def test_a_read_only_store_serves_its_blocks_and_refuses_changes_by_name(tmp_path, read_only, capsys):
    store_dir = tmp_path / "store"
    _filled(store_dir).close()
    before = sorted(p.name for p in store_dir.iterdir())
    read_only(store_dir)
    lines: list[str] = []
    store = BlockStore(store_dir, FINGERPRINT, aes_key=KEY, budget_bytes=1 << 30, log=lines.append)
    for _ in range(2):
        assert store.get(BLOCK)["ids"].tolist() == [0, 1, 2, 3, 4]
    assert store.hits == 2 and lines == [f"KV store {store_dir}: cannot mark {store.path_of(BLOCK).name} used "
                                         f"({EROFS}); served anyway, its least-recently-used order stays as it was"]
    with pytest.raises(OSError, match=f"^KV store {store_dir}: cannot write {store.path_of(bytes(32)).name}: {EROFS}$"):
        store.put(bytes(32), "memory", {"ids": np.zeros(3, np.int32)})
    store.close()
    removing = f"KV store {store_dir}: cannot remove {store.path_of(BLOCK).name}: {EROFS}"
    for argv in (["rm", "--all"], ["gc", "--budget-bytes", "0"], ["wipe", "--yes"]):
        assert main(["kv-store", *argv, "--dir", str(store_dir)]) == 2
        assert _one_error_line(capsys, "kv-store") == removing
    assert sorted(p.name for p in store_dir.iterdir()) == before


def test_the_runtime_logs_what_it_could_not_store_naming_the_store(checkpoint_store, read_only):
    """What ``vla-edge run`` logs: the prompt that could not be stored, the memory that could not be saved."""
    engine, store, lines = checkpoint_store
    read_only(store.directory)
    assert not load_or_prefill_prompt(engine, store, [1, 2, 3])
    with pytest.raises(OSError) as refused:
        save_memory(engine, store, "episode")
    assert [line.split(": KV store ")[0] for line in lines] == ["prompt KV not stored"]
    for message in (lines[0].removeprefix("prompt KV not stored: "), str(refused.value)):
        assert message.startswith(f"KV store {store.directory}: cannot write ") and message.endswith(f": {EROFS}")


@pytest.fixture
def checkpoint_store(tiny_model, tmp_path):
    from vla_edge_ros.engine.vla_engine import VlaEngine
    from vla_edge_ros.kv_store import model_fingerprint
    from vla_edge_ros.memory import make_policy
    from vla_edge_ros.model.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(tiny_model)
    lines: list[str] = []
    store = BlockStore(tmp_path / "store", model_fingerprint(checkpoint), aes_key=KEY, budget_bytes=1 << 30,
                       log=lines.append)
    yield VlaEngine(checkpoint, backend="numpy", kv_capacity_tokens=128, policy=make_policy("fifo", {})), store, lines
    store.close()
