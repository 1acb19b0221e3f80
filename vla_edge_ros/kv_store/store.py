"""A directory of KV blocks of one model: authenticated reads, atomic durable writes, LRU eviction to a budget.

The files and their atomic writes are directory.py's; this adds the model binding, the key, the
budget and the hit/miss/failure counters a node reports.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..model.safetensors_io import SafetensorsError, pack_arrays, unpack_arrays
from .block_file import BlockError, open_block, seal
from .directory import SUFFIX, BlockDirectory, StoreFullError

_LOG = logging.getLogger("vla_edge_ros.kv_store")


class BlockStore(BlockDirectory):
    """Blocks of one model (``fingerprint``) in ``directory``; encrypted when ``aes_key`` is given."""

    def __init__(self, directory: str | Path, fingerprint: bytes, *, aes_key: bytes | None,
                 budget_bytes: int, min_free_bytes: int = 0, log: Callable[[str], None] | None = None) -> None:
        super().__init__(directory)
        self.fingerprint = fingerprint
        self._aes_key = aes_key
        self.budget_bytes = budget_bytes
        self.min_free_bytes = min_free_bytes
        self.log = log or _LOG.warning  # where rejected blocks are reported (a ROS node passes its logger)
        self._logged: set[tuple[str, str]] = set()
        self.failures: Counter[str] = Counter()
        self.hits = self.misses = self.writes = 0

    @property
    def encrypted(self) -> bool:
        return self._aes_key is not None

    # -- reading -------------------------------------------------------------------------------

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The arrays of block ``key``, or None (a miss, or a failed check: counted and logged)."""
        path = self.path_of(key)
        try:
            with path.open("rb") as handle:
                image = handle.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        try:
            _, payload = open_block(image, str(path), key=key, fingerprint=self.fingerprint, aes_key=self._aes_key)
            arrays = unpack_arrays(payload, str(path))
        except (BlockError, SafetensorsError) as exc:
            self.reject(getattr(exc, "reason", "payload"), path.name, str(exc))
            return None
        self.hits += 1
        try:
            os.utime(path)  # least-recently-used order
        except FileNotFoundError:
            pass  # evicted by another process since we read it: what we read is still whole
        return arrays

    def reject(self, reason: str, block: str, message: str) -> None:
        """Count a block that failed a check as a miss, and log it once per block and reason."""
        self.failures[reason] += 1
        self.misses += 1
        if (block, reason) not in self._logged:
            self._logged.add((block, reason))
            self.log(f"KV block rejected ({reason}), recomputing instead: {message}")

    # -- writing -------------------------------------------------------------------------------

    def put(self, key: bytes, kind: str, arrays: dict[str, np.ndarray]) -> int:
        """Store ``arrays`` as block ``key`` (replacing any old one); returns the bytes written."""
        image = seal(kind, key, self.fingerprint, pack_arrays(arrays), self._aes_key)
        final = self.path_of(key)
        self._make_room(len(image), replacing=final)
        self.write_atomically(final, image)
        self.writes += 1
        return len(image)

    def _make_room(self, size: int, replacing: Path) -> None:
        """Evict least-recently-used blocks until ``size`` more bytes fit the budget and the floor."""
        if size > self.budget_bytes:
            raise StoreFullError(errno.EFBIG, f"a {size}-byte KV block exceeds the store budget "
                                              f"of {self.budget_bytes} bytes")
        entries = sorted((e for e in self.entries(read_headers=False) if e.path != replacing),
                         key=lambda e: e.last_used)
        used = sum(e.size for e in entries)
        free = shutil.disk_usage(self.directory).free
        if free + used - size < self.min_free_bytes:
            raise StoreFullError(errno.ENOSPC, f"writing a {size}-byte KV block would leave less than the "
                                               f"{self.min_free_bytes}-byte free-space floor on {self.directory}")
        for entry in entries:
            if used + size <= self.budget_bytes and free - size >= self.min_free_bytes:
                break
            if self.remove(entry.path):
                used -= entry.size
                free += entry.size

    # -- maintenance -----------------------------------------------------------------------------

    def verify(self, fingerprint: bytes | None = None) -> list[tuple[Path, str]]:
        """Fully check every block (tag or digest, length, version, its name, and ``fingerprint`` if given).

        Returns [(path, problem)] of the bad ones.
        """
        problems = []
        for entry in self.entries(read_headers=False):
            try:
                image = entry.path.read_bytes()
                expected_key = bytes.fromhex(entry.path.name[:-len(SUFFIX)])
                header, payload = open_block(image, str(entry.path), key=expected_key, fingerprint=fingerprint,
                                             aes_key=self._aes_key)
                unpack_arrays(payload, str(entry.path))
            except FileNotFoundError:
                continue
            except ValueError as exc:  # BlockError, SafetensorsError, or a name that is not a hex key
                problems.append((entry.path, str(exc)))
        return problems
