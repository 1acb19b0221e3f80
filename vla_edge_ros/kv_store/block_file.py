"""The on-disk form of one KV block: a plaintext header that is authenticated, then the sealed payload.

    offset size field
         0    8 magic b"VLAKVBLK"
         8    4 store format version (u32 LE)
        12    4 flags (bit 0: AES-256-GCM; otherwise plain with a SHA-256 trailer)
        16    8 kind, ASCII, NUL-padded ("prompt", "memory")
        24   32 block key (chained hash of the block's inputs)
        56   32 model fingerprint
        88   12 nonce (fresh random per write; zero when plain)
       100    8 payload length (u64 LE)
       108    - payload: AES-GCM ciphertext + 16-byte tag, or plaintext + its SHA-256

The whole header is the AEAD's associated data, so moving a block under another name, replaying it
for another model or format, or cutting it short all fail authentication even where the plaintext
header checks would not catch them. ``ls`` reads headers only and needs no key.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"VLAKVBLK"
STORE_FORMAT_VERSION = 1
FLAG_ENCRYPTED = 1
_HEADER = struct.Struct("<8sII8s32s32s12sQ")
HEADER_BYTES = _HEADER.size
NONCE_BYTES = 12
TAG_BYTES = 16
DIGEST_BYTES = 32


class BlockError(ValueError):
    """A block that failed a check; ``reason`` is one short word for the counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class BlockHeader:
    version: int
    encrypted: bool
    kind: str
    key: bytes
    fingerprint: bytes
    nonce: bytes
    payload_bytes: int

    def pack(self) -> bytes:
        return _HEADER.pack(MAGIC, self.version, FLAG_ENCRYPTED if self.encrypted else 0,
                            self.kind.encode().ljust(8, b"\0"), self.key, self.fingerprint, self.nonce,
                            self.payload_bytes)


def parse_header(raw: bytes, source: str) -> BlockHeader:
    """The header of a block file; BlockError for a short file, wrong magic or unknown version."""
    if len(raw) < HEADER_BYTES:
        raise BlockError("length", f"{source}: {len(raw)} bytes is shorter than a block header ({HEADER_BYTES})")
    magic, version, flags, kind, key, fingerprint, nonce, payload_bytes = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise BlockError("magic", f"{source}: not a KV block (bad magic)")
    if version != STORE_FORMAT_VERSION:
        raise BlockError("version", f"{source}: store format version {version}, this build reads {STORE_FORMAT_VERSION}")
    if flags & ~FLAG_ENCRYPTED:
        raise BlockError("version", f"{source}: unknown header flags {flags:#x}")
    return BlockHeader(version, bool(flags & FLAG_ENCRYPTED), kind.rstrip(b"\0").decode("ascii", "replace"),
                       key, fingerprint, nonce, payload_bytes)


def seal(kind: str, key: bytes, fingerprint: bytes, payload: bytes, aes_key: bytes | None) -> bytes:
    """The complete file image of a block (encrypted when ``aes_key`` is given)."""
    if aes_key is None:
        header = BlockHeader(STORE_FORMAT_VERSION, False, kind, key, fingerprint, bytes(NONCE_BYTES),
                             len(payload) + DIGEST_BYTES).pack()
        return header + payload + hashlib.sha256(header + payload).digest()
    nonce = os.urandom(NONCE_BYTES)
    header = BlockHeader(STORE_FORMAT_VERSION, True, kind, key, fingerprint, nonce, len(payload) + TAG_BYTES).pack()
    return header + AESGCM(aes_key).encrypt(nonce, payload, header)


def open_block(image: bytes, source: str, *, key: bytes | None, fingerprint: bytes | None,
               aes_key: bytes | None) -> tuple[BlockHeader, bytes]:
    """Check a block file image and return its header and plaintext payload, or raise BlockError.

    ``key`` / ``fingerprint``: what the caller asked for (None skips that check, as ``verify`` does
    for blocks of other models). The store's mode must match the block's: an encrypted store never
    accepts a plain block (that would be a downgrade), a plain store cannot read an encrypted one.
    """
    header = parse_header(image, source)
    if len(image) != HEADER_BYTES + header.payload_bytes:
        raise BlockError("length", f"{source}: {len(image)} bytes, the header promises "
                                   f"{HEADER_BYTES + header.payload_bytes}: truncated or extended")
    if key is not None and header.key != key:
        raise BlockError("key", f"{source}: holds block {header.key.hex()[:16]}..., not the one asked for "
                                f"(renamed or swapped file)")
    if fingerprint is not None and header.fingerprint != fingerprint:
        raise BlockError("fingerprint", f"{source}: made by another model, KV layout or engine version")
    head, body = image[:HEADER_BYTES], image[HEADER_BYTES:]
    if header.encrypted != (aes_key is not None):
        reason = "plain" if aes_key is not None else "encrypted"
        raise BlockError(reason, f"{source}: block is {'encrypted' if header.encrypted else 'plain'}, "
                                 f"the store is {'encrypted' if aes_key is not None else 'plain'}")
    if aes_key is None:
        payload, digest = body[:-DIGEST_BYTES], body[-DIGEST_BYTES:]
        if header.payload_bytes < DIGEST_BYTES or hashlib.sha256(head + payload).digest() != digest:
            raise BlockError("digest", f"{source}: content does not match its SHA-256 (corrupt)")
        return header, payload
    if header.payload_bytes < TAG_BYTES:
        raise BlockError("length", f"{source}: payload shorter than an authentication tag")
    try:
        return header, AESGCM(aes_key).decrypt(header.nonce, body, head)
    except InvalidTag:
        raise BlockError("tag", f"{source}: authentication failed (altered, corrupt, or another key)") from None
