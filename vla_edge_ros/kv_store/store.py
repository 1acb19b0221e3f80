"""A directory of KV blocks: atomic durable writes, authenticated reads, LRU eviction to a budget.

One file per block, named by its key, so there is no index file to corrupt: the index is the
directory, rebuilt by scanning it. Every write goes to a private temp file that is written,
fsynced, renamed over the final name and made durable by fsyncing the directory, so a crash at any
point leaves the old block or the new one and at worst a temp file that the next open removes.
Readers read a whole file through one open descriptor, so a concurrent rename or eviction by
another process gives them the old or the new inode, never a mix. Least recently used is the file's
mtime, which a hit refreshes.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.safetensors_io import SafetensorsError, pack_arrays, unpack_arrays
from .block_file import HEADER_BYTES, BlockError, BlockHeader, open_block, parse_header, seal

SUFFIX = ".kvb"
_TEMP_PREFIX = ".tmp."
_TEMP_MAX_AGE_S = 3600.0  # a temp file this old is garbage even if its writer's pid was reused
_LOG = logging.getLogger("vla_edge_ros.kv_store")


class StoreFullError(OSError):
    """A block that does not fit the budget, the free-space floor or the disk; the store is unchanged."""


@dataclass(frozen=True)
class Entry:
    """One file of the store as ``ls`` shows it (``header`` is None when even the header is unreadable)."""

    path: Path
    size: int
    last_used: float
    header: BlockHeader | None
    error: str = ""


class BlockStore:
    """Blocks of one model (``fingerprint``) in ``directory``; encrypted when ``aes_key`` is given."""

    def __init__(self, directory: str | Path, fingerprint: bytes, *, aes_key: bytes | None,
                 budget_bytes: int, min_free_bytes: int = 0, log: Callable[[str], None] | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self._aes_key = aes_key
        self.budget_bytes = budget_bytes
        self.min_free_bytes = min_free_bytes
        self.log = log or _LOG.warning  # where rejected blocks are reported (a ROS node passes its logger)
        self._logged: set[tuple[str, str]] = set()
        self.failures: Counter[str] = Counter()
        self.hits = self.misses = self.writes = self.evictions = 0
        self.on_step: Callable[[str], None] = lambda step: None  # crash tests stop a writer between steps
        self.remove_stale_temp_files()

    @property
    def encrypted(self) -> bool:
        return self._aes_key is not None

    def path_of(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"

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
        temp = self.directory / f"{_TEMP_PREFIX}{os.getpid()}.{os.urandom(6).hex()}{SUFFIX}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(image)
                while view:
                    view = view[os.write(fd, view):]
                self.on_step("written")
                os.fsync(fd)
            finally:
                os.close(fd)
            self.on_step("synced")
            os.replace(temp, final)
            self.on_step("renamed")
            self._sync_directory()
        except OSError as exc:
            temp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(exc.errno, f"disk full writing KV block {final.name}; "
                                                f"existing blocks are intact") from exc
            raise
        self.on_step("durable")
        self.writes += 1
        return len(image)

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
            if self._unlink(entry.path):
                used -= entry.size
                free += entry.size

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False  # another process got there first
        self.evictions += 1
        return True

    # -- maintenance -----------------------------------------------------------------------------

    def entries(self, *, read_headers: bool = True) -> list[Entry]:
        """Every block file, by scanning the directory (the store keeps no other index)."""
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            if path.name.startswith(_TEMP_PREFIX):
                continue
            try:
                info = path.stat()
                header, error = None, ""
                if read_headers:
                    with path.open("rb") as handle:
                        header = parse_header(handle.read(HEADER_BYTES), str(path))
            except FileNotFoundError:
                continue
            except BlockError as exc:
                error = str(exc)
            found.append(Entry(path, info.st_size, info.st_mtime, header, error))
        return sorted(found, key=lambda e: e.path.name)

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

    def gc(self, budget_bytes: int | None = None) -> list[Path]:
        """Evict least-recently-used blocks until the store is within ``budget_bytes`` (default: its budget)."""
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        entries = sorted(self.entries(read_headers=False), key=lambda e: e.last_used)
        used = sum(e.size for e in entries)
        removed = []
        for entry in entries:
            if used <= budget:
                break
            if self._unlink(entry.path):
                used -= entry.size
                removed.append(entry.path)
        return removed

    def remove(self, path: Path) -> bool:
        """Delete one block file of this store (False if another process removed it first)."""
        return self._unlink(path)

    def remove_stale_temp_files(self) -> int:
        """Delete temp files whose writer died (a crash mid-write); a live writer's are left alone."""
        removed = 0
        for path in self.directory.glob(f"{_TEMP_PREFIX}*"):
            try:
                pid = int(path.name.split(".")[2])
                age = time.time() - path.stat().st_mtime
            except (ValueError, IndexError, FileNotFoundError):
                continue
            if age < _TEMP_MAX_AGE_S and _alive(pid):
                continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
