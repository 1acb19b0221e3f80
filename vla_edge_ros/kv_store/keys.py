"""The AES-256 key of an encrypted store, its public id, and the chained keys that name its blocks.

The secret comes from a file or an environment variable, never from the config itself, and is
never logged. It is exactly one of: 64 hex digits, base64 of 32 bytes (surrounding whitespace, such as
a final newline, is ignored in both), or 32 raw bytes that are not all printable ASCII text (a random
key is text once in about 10^13). The forms overlap, and a key must never be read two ways: 32 hex
digits written without a newline are also 32 bytes, and were taken raw, binding a new store to a key
nobody meant; text is therefore never raw, and hex digits of another length are refused as the short
key they are. A key file that the group or others can read is refused: a KV cache holds what the
robot saw and was told. A key's id (an HMAC of a fixed label under it) tells keys apart in messages
and in a store's key-check file without revealing anything about the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
import string
from pathlib import Path

import numpy as np

KEY_BYTES = 32
_HEX_DIGITS = frozenset(string.hexdigits.encode())
_TEXT = frozenset(string.printable.encode())


class StoreKeyError(ValueError):
    """A store key that is missing, unreadable, exposed or malformed (the message never holds the key)."""


def parse_key(text: bytes, source: str) -> bytes:
    """The key in ``text`` (see the module doc for the three forms); StoreKeyError naming ``source`` otherwise."""
    stripped = text.strip()
    if stripped and all(byte in _HEX_DIGITS for byte in stripped):
        if len(stripped) == 2 * KEY_BYTES:
            return binascii.unhexlify(stripped)
        raise StoreKeyError(f"{source}: holds {len(stripped)} hex digits, a {4 * len(stripped)}-bit key; a 256-bit "
                            f"key is {2 * KEY_BYTES} hex digits (vla-edge kv-store keygen --out FILE writes one)")
    try:
        decoded = base64.b64decode(stripped, validate=True)
    except binascii.Error:
        decoded = b""
    if len(decoded) == KEY_BYTES:
        return decoded
    if len(text) == KEY_BYTES and not all(byte in _TEXT for byte in text):
        return text
    raise StoreKeyError(f"{source}: not a 256-bit key (expected exactly {2 * KEY_BYTES} hex digits, base64 of "
                        f"{KEY_BYTES} bytes, or {KEY_BYTES} raw bytes that are not text)")


def load_key(key_file: str = "", key_env: str = "") -> bytes:
    """The key from ``key_file`` (owner-only permissions required) or else the variable ``key_env``."""
    if key_file:
        path = Path(key_file)
        try:
            mode = path.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise StoreKeyError(f"key file {path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                                f"run: chmod 600 {path}")
            return parse_key(path.read_bytes(), f"key file {path}")
        except OSError as exc:
            raise StoreKeyError(f"cannot read key file {path}: {exc.strerror}") from exc
    if key_env:
        value = os.environ.get(key_env)
        if not value:
            raise StoreKeyError(f"environment variable {key_env} is not set (it should hold the KV store key)")
        return parse_key(value.encode(), f"environment variable {key_env}")
    raise StoreKeyError("an encrypted KV store needs a key: set kv_store.key_file or kv_store.key_env")


def write_new_key(path: str | Path) -> None:
    """Create ``path`` (owner read/write only) holding a fresh random key in hex; refuses to overwrite, as the
    file may be the only copy of a store's key. StoreKeyError naming the path when it cannot be written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise StoreKeyError(f"key file {path} exists: keygen never replaces a key (it may be the only copy of a "
                            f"store's key); name a new file") from None
    except OSError as exc:
        raise StoreKeyError(f"cannot write key file {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(binascii.hexlify(os.urandom(KEY_BYTES)) + b"\n")
    except OSError as exc:  # a full disk: no half-written key file left behind to be mistaken for a key
        Path(path).unlink(missing_ok=True)
        raise StoreKeyError(f"cannot write key file {path}: {exc.strerror}") from None


def key_id(aes_key: bytes | None) -> bytes:
    """32 bytes naming ``aes_key`` (all zero for a plain store, which has none); shown as its first 16 hex digits."""
    if aes_key is None:
        return bytes(32)
    return hmac.new(aes_key, b"vla_edge_ros kv_store key id", hashlib.sha256).digest()


def chain_key(parent: bytes, kind: str, *parts: bytes | str | np.ndarray) -> bytes:
    """A block's key: SHA-256 of the parent block's key, the block kind and its inputs, length-prefixed."""
    digest = hashlib.sha256()
    for part in (parent, kind, *parts):
        if isinstance(part, str):
            part = part.encode()
        elif isinstance(part, np.ndarray):
            part = np.ascontiguousarray(part).astype(part.dtype.newbyteorder("<")).tobytes()
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()
