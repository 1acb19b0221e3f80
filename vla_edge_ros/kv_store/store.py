"""A key-bound directory of KV blocks: authenticated reads, atomic durable writes, LRU eviction to a budget.

The files, their atomic writes and the directory's lock are directory.py's; which key the directory
belongs to is binding.py's. A store opens only with the key (or, for plain blocks, the mode) its
directory is bound to, so a wrong key is refused before any block is read or written, instead of
every block failing authentication and being recomputed over. A new directory is bound to the key
that first opens it. One without a binding that already holds blocks (made before binding existed)
is bound to the opening key only if every block authenticates under it; otherwise it may hold blocks
of another key, and it is refused with nothing changed.
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
from .binding import StoreBindingError, check_key, read_binding, remedy, show, write_check
from .block_file import BlockError, open_block, seal
from .directory import SUFFIX, BlockDirectory, StoreFullError
from .keys import key_id
from .rekey import finish_rekey, rekey

_LOG = logging.getLogger("vla_edge_ros.kv_store")


class BlockStore(BlockDirectory):
    """Blocks of one model (``fingerprint``) in ``directory``; encrypted when ``aes_key`` is given.

    Raises StoreBindingError (a ValueError) when the directory is bound to another key or mode.
    """

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
        try:
            self._bind()
        except BaseException:
            self.close()
            raise
        self.remove_stale_temp_files()  # only once the store is known to be ours: a refusal changes nothing

    @property
    def encrypted(self) -> bool:
        return self._aes_key is not None

    def _bind(self) -> None:
        """Open only what is bound to this key: finish an unfinished re-key towards it, bind a new directory,
        adopt an unbound one whose blocks all authenticate under it, refuse everything else."""
        bound = read_binding(self.directory)
        if bound is not None and bound.rekey_to is not None:
            count = finish_rekey(self, self._aes_key)
            self.log(f"KV store {self.directory}: finished an interrupted re-key, {count} blocks re-sealed; "
                     f"bound to key {show(key_id(self._aes_key))}")
        elif bound is not None:
            check_key(self.directory, self._aes_key)
        else:
            self._adopt()

    def _adopt(self) -> None:
        problems = self.verify()
        if problems:
            path, problem = problems[0]
            opened = "authenticate under the key given" if self.encrypted else "open as plain blocks"
            raise StoreBindingError(
                f"KV store {self.directory} is not bound to a key yet, and {len(problems)} of its "
                f"{len(self.entries(read_headers=False))} blocks do not {opened} (first {path.name}: {problem}): it "
                f"may hold another key's blocks, so it was not opened and nothing was changed. "
                f"{remedy(self.directory)} Or remove the failing blocks (vla-edge kv-store verify, rm).")
        try:
            write_check(self, self._aes_key, replace=False)
        except FileExistsError:  # another process bound it first
            check_key(self.directory, self._aes_key)
            return
        count = len(self.entries(read_headers=False))
        if count:
            self.log(f"KV store {self.directory} had no key binding; all {count} blocks authenticate under this "
                     f"key, so it is now bound to it ({show(key_id(self._aes_key))})")

    def rekey(self, new_key: bytes) -> tuple[int, int]:
        """Re-seal every block under ``new_key`` and bind the store to it, crash-safe (rekey.py): (blocks, bytes)."""
        result = rekey(self, self._aes_key, new_key)
        self._aes_key = new_key
        return result

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
        except OSError as exc:  # a read-only store: what it holds is still good to use
            self._log_once(path.name, "last-use", f"KV store {self.directory}: cannot mark {path.name} used "
                                                  f"({exc.strerror}); served anyway, its least-recently-used "
                                                  "order stays as it was")
        return arrays

    def reject(self, reason: str, block: str, message: str) -> None:
        """Count a block that failed a check as a miss, and log it once per block and reason."""
        self.failures[reason] += 1
        self.misses += 1
        self._log_once(block, reason, f"KV block rejected ({reason}), recomputing instead: {message}")

    def _log_once(self, block: str, reason: str, message: str) -> None:
        if (block, reason) not in self._logged:
            self._logged.add((block, reason))
            self.log(message)

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
