"""Which key a store directory belongs to: its key-check file, and the journal of a re-key under way.

Blocks are authenticated one by one, so a store opened with a valid but different key used to look
like a store of damaged blocks: every one missed, was recomputed and was overwritten under the new
key. Binding the directory to its key turns that into one refusal before anything is read or written.

``key-check`` is one block in the block_file format: kind "keycheck", its key field the store key's
id (``keys.key_id``), no payload. It is sealed with AES-256-GCM under the store's key, so its tag
proves the key and no one without the key can forge it; it never holds the key. A store of plain
blocks (``encryption: none``) has a plain key-check (zero id, SHA-256), so neither kind of store
opens as the other. A directory without one (made before binding existed, or new) is bound by the
first open with a key every one of its blocks authenticates under (store.py).

``rekey-journal`` exists only while a re-key is unfinished: the new key sealed under the old one,
then the old key sealed under the new one, each record's key field its sealing key's id. Whoever
opens the store with either key can therefore finish the change, towards the key they hold (rekey.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .block_file import HEADER_BYTES, BlockError, BlockHeader, open_block, parse_header, seal
from .directory import BlockDirectory
from .keys import StoreKeyError, key_id

CHECK_NAME = "key-check"
JOURNAL_NAME = "rekey-journal"
_CHECK_KIND = "keycheck"
_JOURNAL_KIND = "rekey"
_NO_MODEL = bytes(32)  # the fingerprint field: the binding is the store's, not one model's


class StoreBindingError(StoreKeyError):
    """A store opened with a key, or a mode, it is not bound to (nothing was changed), or a damaged binding."""


def show(identity: bytes) -> str:
    """A key id as messages and ``ls`` print it."""
    return identity.hex()[:16]


@dataclass(frozen=True)
class Binding:
    """What a directory is bound to, read from headers alone (no key needed)."""

    encrypted: bool
    key_id: bytes  # while a re-key is unfinished, the id of the key it started from
    rekey_to: bytes | None = None  # the id of the key an unfinished re-key is going to

    def describe(self) -> str:
        if self.rekey_to is not None:
            return (f"re-key from key {show(self.key_id)} to key {show(self.rekey_to)} unfinished: opening it "
                    f"with either key finishes it towards that key")
        return f"bound to key {show(self.key_id)} (aes-256-gcm)" if self.encrypted else "plain (encryption: none)"


def read_binding(directory: Path) -> Binding | None:
    """The directory's binding, or None when it has none yet; StoreBindingError when its files are damaged."""
    journal = _read(directory / JOURNAL_NAME)
    if journal is not None:
        old, new = _journal_records(journal, directory)
        return Binding(True, old[0].key, new[0].key)
    image = _read(directory / CHECK_NAME)
    if image is None:
        return None
    try:
        header = parse_header(image, str(directory / CHECK_NAME))
    except BlockError as exc:
        raise _damaged(directory, CHECK_NAME, exc) from None
    if header.kind != _CHECK_KIND:
        raise _damaged(directory, CHECK_NAME, f"a {header.kind!r} block, not a key check")
    return Binding(header.encrypted, header.key)


def check_key(directory: Path, aes_key: bytes | None) -> None:
    """Return only if the directory is bound to exactly ``aes_key`` (None: to plain blocks), proven by its tag."""
    bound = read_binding(directory)
    if bound is None:
        raise StoreBindingError(f"KV store {directory} is not bound to a key")
    if bound.rekey_to is not None:
        raise StoreBindingError(f"KV store {directory}: {bound.describe()}")
    if bound.encrypted != (aes_key is not None):
        raise StoreBindingError(_mode_mismatch(directory, bound))
    if bound.key_id != key_id(aes_key):
        raise StoreBindingError(
            f"KV store {directory} is bound to another key (the store's key {show(bound.key_id)}, the key given "
            f"{show(key_id(aes_key))}): not opened, nothing was changed. {remedy(directory)}")
    path = directory / CHECK_NAME
    try:
        open_block(path.read_bytes(), str(path), key=bound.key_id, fingerprint=_NO_MODEL, aes_key=aes_key)
    except (BlockError, FileNotFoundError) as exc:
        raise _damaged(directory, CHECK_NAME, exc) from None


def write_check(directory: BlockDirectory, aes_key: bytes | None, *, replace: bool) -> None:
    """Bind the directory to ``aes_key``; ``replace=False`` raises FileExistsError if it already is bound."""
    image = seal(_CHECK_KIND, key_id(aes_key), _NO_MODEL, b"", aes_key)
    directory.write_atomically(directory.directory / CHECK_NAME, image, replace=replace)


def write_journal(directory: BlockDirectory, old: bytes, new: bytes) -> None:
    """Record a re-key from ``old`` to ``new`` so that either key can finish it."""
    image = (seal(_JOURNAL_KIND, key_id(old), _NO_MODEL, new, old)
             + seal(_JOURNAL_KIND, key_id(new), _NO_MODEL, old, new))
    directory.write_atomically(directory.directory / JOURNAL_NAME, image, replace=False)


def other_key(directory: Path, aes_key: bytes) -> bytes:
    """The other key of the unfinished re-key ``aes_key`` is one side of; StoreBindingError if it is neither."""
    path = directory / JOURNAL_NAME
    image = path.read_bytes()
    records = _journal_records(image, directory)
    identity = key_id(aes_key)
    for (header, start, end), (theirs, _, _) in ((records[0], records[1]), (records[1], records[0])):
        if header.key != identity:
            continue
        try:
            _, payload = open_block(image[start:end], str(path), key=identity, fingerprint=_NO_MODEL, aes_key=aes_key)
        except BlockError as exc:
            raise _damaged(directory, JOURNAL_NAME, exc) from None
        if key_id(payload) != theirs.key:
            raise _damaged(directory, JOURNAL_NAME, "its two records do not hold each other's keys")
        return payload
    raise StoreBindingError(
        f"KV store {directory}: {Binding(True, records[0][0].key, records[1][0].key).describe()}, and the key given "
        f"({show(identity)}) is neither: not opened, nothing was changed")


def remove(directory: BlockDirectory, name: str) -> None:
    """Delete one binding file, durably (missing is fine)."""
    directory.unlink(directory.directory / name)
    directory.sync()


def remedy(directory: Path) -> str:
    """What an operator can do about a store they cannot open, as commands."""
    return (f"Use the key it was made with, re-key it (vla-edge kv-store rekey --dir {directory} --key-file OLD "
            f"--new-key-file NEW), or discard its blocks (vla-edge kv-store wipe --dir {directory} --yes).")


def _mode_mismatch(directory: Path, bound: Binding) -> str:
    if bound.encrypted:
        return (f"KV store {directory} is encrypted (key {show(bound.key_id)}) but was opened without encryption "
                f"(kv_store.encryption: none): not opened, nothing was changed. Configure its key, or discard its "
                f"blocks (vla-edge kv-store wipe --dir {directory} --yes).")
    return (f"KV store {directory} holds plain blocks (made with kv_store.encryption: none) but was opened with a "
            f"key: not opened, nothing was changed. Set kv_store.encryption: none, or discard its blocks "
            f"(vla-edge kv-store wipe --dir {directory} --yes) to start an encrypted store there.")


def _journal_records(image: bytes, directory: Path) -> tuple[tuple[BlockHeader, int, int], ...]:
    """(header, start, end) of the journal's two records: sealed under the old key, then under the new."""
    records, start = [], 0
    try:
        for _ in range(2):
            header = parse_header(image[start:], str(directory / JOURNAL_NAME))
            end = start + HEADER_BYTES + header.payload_bytes
            records.append((header, start, end))
            start = end
    except BlockError as exc:
        raise _damaged(directory, JOURNAL_NAME, exc) from None
    if start != len(image) or not all(h.encrypted and h.kind == _JOURNAL_KIND for h, _, _ in records):
        raise _damaged(directory, JOURNAL_NAME, "not two re-key records")
    return tuple(records)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _damaged(directory: Path, name: str, problem: object) -> StoreBindingError:
    if name == CHECK_NAME:
        hint = (f"Remove {directory / name} and open the store again: a store without one is bound only to a key "
                f"every one of its blocks authenticates under.")
    else:
        hint = (f"The re-key cannot be finished; discard the store's blocks "
                f"(vla-edge kv-store wipe --dir {directory} --yes).")
    return StoreBindingError(f"KV store {directory}: its {name} file is damaged ({problem}); nothing was changed. "
                             f"{hint}")
