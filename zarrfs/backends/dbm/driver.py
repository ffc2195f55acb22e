"""DBM: ``dbm:///path/to/db``, the layout of zarr-python 2's ``DBMStore``.

zarr-python 2's ``DBMStore`` opens its file with :func:`dbm.open`, which picks ``dbm.gnu``,
``dbm.ndbm`` or ``dbm.dumb`` (whichever this Python was built with, or whichever format an
existing file has); so does this driver, so the two open the same files. Keys are the Zarr key's
bytes (``DBMStore`` writes ASCII, a subset of the UTF-8 stored here), values the value's bytes.
Side data lives in a second DBM file, ``PATH.zarrfs``, which ``DBMStore`` never opens.

DBM files have neither order nor transactions, so this driver keeps the sorted list of keys in
memory (read once at open, kept in step by every commit) and buffers a transaction's writes,
applying them at its end under a process-wide lock. Other processes' writes are not seen while
a driver is open, and a crash in the middle of applying a commit can keep part of it: the
format offers nothing better. So one driver at a time writes a DBM database, with no reader
beside it (``filelock``): a second is refused, never left to lose the first one's writes. For
several writers or crash safety use LMDB or SQLite.
"""

from __future__ import annotations

import bisect
import dbm
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..base import DATA, KEYS, SIDE, SIZES, Driver, Fetch, MissingDatabaseError, Space, Txn, UnavailableError
from ..filelock import FileLock
from ..filespace import statvfs
from ..urloptions import check_options, parse_file_url
from .about import ABOUT

_MISSING = object()


class _File:
    """One DBM file and the sorted list of its keys."""

    def __init__(self, path: str, flag: str) -> None:
        try:
            self.db: Any = dbm.open(path, flag, 0o666)
        except (*dbm.error, OSError) as exc:  # dbm.error: each dbm module's own error class
            raise UnavailableError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        self.keys = sorted(self.db.keys())
        self.dumb = type(self.db).__module__ == "dbm.dumb"
        if self.dumb and flag != "r":
            self.db.sync()  # its index file, which a reader's dbm.open looks for

    def set(self, key: bytes, value: bytes | None) -> None:
        i = bisect.bisect_left(self.keys, key)
        present = i < len(self.keys) and self.keys[i] == key
        if value is None:
            if present:
                del self.db[key]
                del self.keys[i]
        else:
            self.db[key] = value
            if not present:
                self.keys.insert(i, key)

    def close(self) -> None:
        self.db.close()


class DBMTxn(Txn):
    """A transaction: reads see the files and the buffered writes; writes wait for the end."""

    def __init__(self, driver: DBMDriver, write: bool) -> None:
        super().__init__(write, driver.url)
        self._files = driver.files
        self.pending: dict[Space, dict[bytes, bytes | None]] = {DATA: {}, SIDE: {}}

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        value = self.pending[space].get(raw, _MISSING)
        if value is not _MISSING:
            return value  # type: ignore[return-value]
        return self._files[space].db.get(raw)

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        self.pending[space][raw] = bytes(value)

    def _delete(self, raw: bytes, space: Space) -> None:
        self.pending[space][raw] = None

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        stored = self._files[space].keys
        pending = self.pending[space]
        # Re-locate after every yield: the caller may write between two pulls.
        pos, inclusive = lo, True
        while True:
            i = bisect.bisect_left(stored, pos) if inclusive else bisect.bisect_right(stored, pos)
            candidates = [stored[i]] if i < len(stored) else []
            after = (lambda k: k >= pos) if inclusive else (lambda k: k > pos)  # noqa: B023 - used at once
            candidates += [k for k, v in pending.items() if v is not None and after(k)]
            candidates = [k for k in candidates if hi is None or k < hi]
            if not candidates:
                return
            key = min(candidates)
            pos, inclusive = key, False
            value = self._get(key, space)
            if value is None:
                continue  # deleted in this transaction
            yield key, None if fetch is KEYS else len(value) if fetch is SIZES else value


class DBMDriver(Driver):
    """Driver for ``dbm://`` URLs; see the module docstring."""

    #: One writer and no reader beside it (``filelock``): another open is refused.
    shared = False

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        path, options = parse_file_url(url)
        check_options(url, options, set(ABOUT.options))
        if readonly and not _exists(path):
            raise MissingDatabaseError(f"{path}: no such DBM database")
        flag = "r" if readonly else "c"
        self.path = path
        # Locked before it is read, or, when this open creates it, before anything is written.
        found = _data_file(path)
        self.held = FileLock(found, not readonly, "DBM database") if found else None
        data = side = None
        try:
            data = _File(path, flag)
            if self.held is None:
                self.held = FileLock(_data_file(path) or path, True, "DBM database")
            side = _File(path + ".zarrfs", "r" if readonly and _exists(path + ".zarrfs") else "c")
        except BaseException:
            if data is not None:
                data.close()
            if self.held is not None:
                self.held.release()
            raise
        self.files = {DATA: data, SIDE: side}
        self._lock = threading.RLock()

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self._lock:
            txn = DBMTxn(self, write)
            yield txn
            for space, changes in txn.pending.items():
                if changes:
                    f = self.files[space]
                    for key, value in changes.items():
                        f.set(key, value)
                    if f.dumb:  # dbm.dumb writes its index only at sync: a reader needs it
                        f.db.sync()

    def sync(self) -> None:
        """Write the files' buffers to disk (``dbm.gnu`` and ``dbm.dumb`` buffer writes)."""
        with self._lock:
            for f in self.files.values():
                sync = getattr(f.db, "sync", None)
                if sync is not None:
                    sync()

    def statfs(self) -> dict[str, int] | None:
        """Space of the filesystem holding the database files."""
        return statvfs(os.path.dirname(os.path.abspath(self.path)))

    def close(self) -> None:
        """Close both files, then let another process have them."""
        with self._lock:
            for f in self.files.values():
                f.close()
            if self.held is not None:
                self.held.release()


def _data_file(path: str) -> str | None:
    """The file holding the values of the DBM database ``path`` (``dbm.gnu``: ``path``;
    ``dbm.ndbm``: ``path.db`` or ``path.pag``; ``dbm.dumb``: ``path.dat``), if there is one."""
    return next((path + ext for ext in ("", ".db", ".pag", ".dat") if os.path.isfile(path + ext)), None)


def _exists(path: str) -> bool:
    # dbm.dumb keeps PATH.dat and PATH.dir; dbm.ndbm may add .db; dbm.gnu uses PATH itself.
    return any(os.path.exists(path + ext) for ext in ("", ".dat", ".db", ".dir"))


__all__ = ["DBMDriver"]
