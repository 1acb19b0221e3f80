"""The files of a store directory: scanning, atomic durable writes, removal, and the directory's lock.

One file per block, named by its key, so there is no index file to corrupt: the index is the
directory, rebuilt by scanning it. Every write goes to a private temp file that is written,
fsynced, renamed over the final name (or linked to it, when it must not exist yet) and made durable
by fsyncing the directory, so a crash at any point leaves the old file or the new one and at worst a
temp file that the next open removes. Readers read a whole file through one open descriptor, so a
concurrent rename or removal by another process gives them the old or the new inode, never a mix.
Least recently used is the file's mtime, which a hit refreshes.

An operation the operating system refuses (a read-only or full file system, a permission) is a
StoreIOError: one line naming the store, what it was doing and the file, never a temp file's name.

Every process that opens the directory holds a shared ``flock`` on the directory for as long as it
has it open; changing the store's key or wiping it takes the lock exclusively, so neither can run
under a live node, and a node cannot open a store while one of them runs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .block_file import HEADER_BYTES, BlockError, BlockHeader, parse_header

SUFFIX = ".kvb"
_TEMP_PREFIX = ".tmp."
_TEMP_MAX_AGE_S = 3600.0  # a temp file this old is garbage even if its writer's pid was reused


class StoreIOError(OSError):
    """An OSError of the store, whose message (``strerror``) names the store: ``str`` is that alone, one line
    for a user, while ``errno`` stays for code that tells errors apart."""

    def __str__(self) -> str:
        return str(self.strerror)


class StoreFullError(StoreIOError):
    """A block that does not fit the budget, the free-space floor or the disk; the store is unchanged."""


class StoreBusyError(StoreIOError):
    """The directory is locked by another process for an operation that needs it alone."""


@dataclass(frozen=True)
class Entry:
    """One file of the store as ``ls`` shows it (``header`` is None when even the header is unreadable)."""

    path: Path
    size: int
    last_used: float
    header: BlockHeader | None
    error: str = ""


class BlockDirectory:
    """The block files in ``directory`` (created owner-only if missing), without any key."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock = os.open(self.directory, os.O_RDONLY)  # the lock is on the directory itself: no lock file
        except OSError as exc:
            raise self._refused(exc, "create or open the directory") from None
        self._release = weakref.finalize(self, os.close, self._lock)  # by close(), or with this object
        try:
            fcntl.flock(self._lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self._release()
            raise StoreBusyError(errno.EBUSY, f"KV store {self.directory} is being re-keyed or wiped by another "
                                              f"process; open it again when that is done") from None
        self.evictions = 0
        self.on_step: Callable[[str], None] = lambda step: None  # crash tests stop a writer between steps

    def close(self) -> None:
        """Release the directory's lock (the object must not be used afterwards)."""
        self._release()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the directory alone for the block, or raise StoreBusyError if another process has it open."""
        fd = self._lock
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_SH)  # flock may drop the shared lock while converting: take it back
            raise StoreBusyError(errno.EBUSY, f"KV store {self.directory} is open in another process (a running "
                                              f"node?); stop it first") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_SH)

    def path_of(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"

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

    def write_atomically(self, final: Path, image: bytes, *, replace: bool = True) -> None:
        """Make ``final`` hold ``image`` durably, all or nothing; ``replace=False`` raises FileExistsError
        instead of replacing an existing file (two processes creating it: exactly one wins)."""
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
            if replace:
                os.replace(temp, final)
            else:
                os.link(temp, final)
                temp.unlink()
            self.on_step("renamed")
            self.sync()
        except OSError as exc:
            with suppress(OSError):  # on a read-only file system even this fails, and must not hide why
                temp.unlink(missing_ok=True)
            if isinstance(exc, FileExistsError):  # replace=False lost the race: the caller's to handle
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(exc.errno, f"KV store {self.directory}: disk full writing {final.name}; "
                                                f"existing blocks are intact") from None
            raise self._refused(exc, f"write {final.name}") from None
        self.on_step("durable")

    def sync(self) -> None:
        """Make the directory's entries (renames, removals) durable."""
        try:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._refused(exc, "sync the directory") from None

    def _refused(self, exc: OSError, doing: str) -> StoreIOError:
        """``exc`` as one line naming this store and what it was ``doing`` (e.g. "write key-check")."""
        return StoreIOError(exc.errno, f"KV store {self.directory}: cannot {doing}: {exc.strerror or exc}")

    def gc(self, budget_bytes: int) -> list[Path]:
        """Evict least-recently-used blocks until the store is within ``budget_bytes``."""
        entries = sorted(self.entries(read_headers=False), key=lambda e: e.last_used)
        used = sum(e.size for e in entries)
        removed = []
        for entry in entries:
            if used <= budget_bytes:
                break
            if self.remove(entry.path):
                used -= entry.size
                removed.append(entry.path)
        return removed

    def remove(self, path: Path) -> bool:
        """Delete one block of this store (False if another process removed it first)."""
        if not self.unlink(path):
            return False  # another process got there first
        self.evictions += 1
        return True

    def unlink(self, path: Path) -> bool:
        """Delete one file of this store (False if it is not there)."""
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._refused(exc, f"remove {path.name}") from None
        return True

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
            removed += self.unlink(path)
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
