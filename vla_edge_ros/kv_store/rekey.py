"""The only ways a store's key changes: re-keying it, finishing a re-key a crash interrupted, wiping it.

A re-key from key A to key B, holding the directory alone (no node can have it open):

1. every block must authenticate under A, or nothing happens (a block that does not would be lost);
2. the journal is written (binding.py): B sealed under A, A sealed under B;
3. each block is re-sealed under B, one atomic replace at a time, keeping its mtime (the LRU order);
4. the key-check is replaced by B's;
5. the journal is removed.

A crash before 2 leaves the store as it was. From 2 until 5 is done, whoever opens the store with A
or B recovers the other key from the journal and re-seals every block that is not yet under their
key, then binds the store to it: the old key rolls the re-key back, the new one rolls it forward,
and either way the store ends whole and bound to the key that opened it. Each of those steps is
itself atomic and idempotent, so a crash during the recovery is recovered the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from .binding import (
    CHECK_NAME,
    JOURNAL_NAME,
    StoreBindingError,
    check_key,
    other_key,
    remedy,
    remove,
    show,
    write_check,
    write_journal,
)
from .block_file import BlockError, open_block, seal
from .directory import BlockDirectory
from .keys import StoreKeyError, key_id


def rekey(directory: BlockDirectory, old: bytes | None, new: bytes) -> tuple[int, int]:
    """Re-seal every block of a store bound to ``old`` under ``new`` and bind it to ``new``: (blocks, bytes)."""
    if old is None:
        raise StoreKeyError(f"KV store {directory.directory} holds plain blocks: there is no key to change. Discard "
                            f"them (vla-edge kv-store wipe --dir {directory.directory} --yes) and open the store "
                            f"with a key to start an encrypted one.")
    if key_id(new) == key_id(old):
        raise StoreKeyError(f"the new key is the store's key ({show(key_id(old))}): nothing to change")
    with directory.exclusive():
        check_key(directory.directory, old)
        failing = _failing(directory, old)
        if failing:
            path, problem = failing[0]
            raise StoreKeyError(
                f"{len(failing)} blocks of KV store {directory.directory} do not authenticate under its key (first "
                f"{path.name}: {problem}); re-keying would lose them, so nothing was changed. Remove them (vla-edge "
                f"kv-store rm --dir {directory.directory} PREFIX...) or discard the store, then re-key.")
        write_journal(directory, old, new)
        directory.on_step("journal")
        count, size = _reseal(directory, source=old, target=new)
        write_check(directory, new, replace=True)
        directory.on_step("bound")
        remove(directory, JOURNAL_NAME)
        directory.on_step("rekeyed")
    return count, size


def finish_rekey(directory: BlockDirectory, aes_key: bytes | None) -> int:
    """Complete an unfinished re-key towards ``aes_key`` (either of its two keys); returns the blocks re-sealed."""
    if aes_key is None:
        raise StoreBindingError(f"KV store {directory.directory} is encrypted (a re-key of it is unfinished) but was "
                                f"opened without encryption: not opened, nothing was changed. "
                                f"{remedy(directory.directory)}")
    with directory.exclusive():
        count, _ = _reseal(directory, source=other_key(directory.directory, aes_key), target=aes_key)
        write_check(directory, aes_key, replace=True)
        remove(directory, JOURNAL_NAME)
    return count


def wipe(directory: BlockDirectory) -> tuple[int, int]:
    """Delete every block, then the binding (so a crash leaves a bound store): (blocks, bytes) removed."""
    with directory.exclusive():
        entries = directory.entries(read_headers=False)
        removed = [e for e in entries if directory.remove(e.path)]
        directory.remove_stale_temp_files()
        remove(directory, JOURNAL_NAME)
        remove(directory, CHECK_NAME)
    return len(removed), sum(e.size for e in removed)


def _failing(directory: BlockDirectory, aes_key: bytes) -> list[tuple[Path, str]]:
    """(path, problem) of every block that does not authenticate under ``aes_key``."""
    failing = []
    for entry in directory.entries(read_headers=False):
        try:
            open_block(entry.path.read_bytes(), str(entry.path), key=None, fingerprint=None, aes_key=aes_key)
        except BlockError as exc:
            failing.append((entry.path, str(exc)))
    return failing


def _reseal(directory: BlockDirectory, *, source: bytes, target: bytes) -> tuple[int, int]:
    """Re-seal under ``target`` every block that is not already under it; each must open under ``source``."""
    count = size = 0
    for entry in directory.entries(read_headers=False):
        image = entry.path.read_bytes()
        try:
            open_block(image, str(entry.path), key=None, fingerprint=None, aes_key=target)
            continue  # re-sealed before a crash
        except BlockError:
            pass
        try:
            header, payload = open_block(image, str(entry.path), key=None, fingerprint=None, aes_key=source)
        except BlockError as exc:
            raise StoreKeyError(f"KV store {directory.directory}: block {entry.path.name} authenticates under "
                                f"neither key of the re-key ({exc}). Remove it (vla-edge kv-store rm --dir "
                                f"{directory.directory} {entry.path.name[:16]}) and open the store again.") from None
        resealed = seal(header.kind, header.key, header.fingerprint, payload, target)
        stat = entry.path.stat()
        directory.write_atomically(entry.path, resealed)
        os.utime(entry.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        count, size = count + 1, size + len(resealed)
        directory.on_step("resealed")
    return count, size
