"""Icechunk repositories on local storage: ``icechunk:///abs/path/repo?branch=main``, or
``?tag=NAME`` or ``?snapshot=ID`` (one of the three; ``branch=main`` when none is given), or
as ZEP 8 names them, ``repo@branch.NAME``, ``repo@tag.NAME``, ``repo@SNAPSHOT_ID``.

A tag or a snapshot is one version, read-only. A branch is written through one writable
Icechunk session, whose writes every read sees; :meth:`IcechunkDriver.commit` (``zarrfs commit``)
makes them a commit of the branch. A commit made elsewhere meanwhile is a :class:`CommitConflict`:
commit again with ``rebase`` (Icechunk's conflict detector) or to a new branch. Writes left
uncommitted at close (unmount) are committed then, rebased if they can be, else to a new branch
``BRANCH.unmounted-TIME``; the log says which.

Icechunk holds Zarr v3 keys only (v2 metadata is :class:`InvalidKeyError`, ``EINVAL``). Other
names (a temporary file before its rename, a chunk before its array's ``zarr.json``) wait in
memory until Icechunk takes them; any left are named in a commit's answer and at unmount in the
log. Side data (mtimes, modes, empty folders) lives in memory for the mount's life. The
session's keys are indexed once at open (``keyindex``): only this driver writes its session.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import icechunk
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import Buffer
from zarr.core.sync import sync

from ..base import DATA, Driver, InvalidKeyError, MissingDatabaseError, Space, Txn
from ..buffered import DELETED
from ..errors import BackendError
from ..filespace import statvfs
from ..keyindex import KeyIndex
from ..overlay import OverlayTxn
from ..urloptions import check_options, parse_file_url
from ..versionpath import split_version
from .about import ABOUT

log = logging.getLogger("zarrfs.backends.icechunk")
T = TypeVar("T")

V2_METADATA = (".zarray", ".zgroup", ".zattrs", ".zmetadata")
METADATA = "zarr.json"


class CommitConflict(BackendError):
    """The branch moved since the session began: the commit is refused, the writes are kept."""


def _leaf(raw: bytes) -> str:
    return raw.decode("utf-8").rpartition("/")[2]


def _is_metadata(raw: bytes) -> bool:
    return _leaf(raw) == METADATA


class IcechunkTxn(OverlayTxn):
    """An :class:`OverlayTxn` that reads a byte range of a chunk without reading it whole."""

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        if space is DATA and (space, raw) not in self.writes:
            return self._driver.read_range(raw, offset, length)
        return super()._read(raw, offset, length, space)


class IcechunkDriver(Driver):
    """Driver for ``icechunk://`` URLs; see the module docstring."""

    versioned = True  # a branch's session is committed by hand (zarrfs commit)

    #: Seconds between two looks at :meth:`changes` (only a commit changes what is seen).
    feed_interval = 0.5

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        path, options = parse_file_url(url)
        check_options(url, options, set(ABOUT.options))
        path, kind, name = split_version(path)
        if kind is not None:
            if kind in options:
                raise BackendError(f"{url}: the {kind} is named twice (@{kind}... and ?{kind}=)")
            options[kind] = name
        named = [k for k in ("branch", "tag", "snapshot") if k in options]
        if len(named) > 1:
            raise BackendError(f"{url}: name one of branch=, tag= or snapshot=, not {' and '.join(named)}")
        self.path = self.where = path
        self.branch = options.get("branch", "main") if not named or named[0] == "branch" else None
        self.tag = options.get("tag")
        self.snapshot_id = options.get("snapshot")
        self.lock = threading.RLock()
        self.side = KeyIndex()  # side records, in memory
        self.scratch: dict[bytes, bytes] = {}  # names Icechunk does not take (yet)
        self.dirty: set[str] = set()  # keys set or deleted in the session since its last commit
        self.generation = 0  # counts the sessions: a new one may show others' commits
        if "ICECHUNK_LOG" not in os.environ:  # its warnings go to stderr, which a daemon has not
            icechunk.set_logs_filter("icechunk=error")
        storage = icechunk.local_filesystem_storage(path)
        try:
            if icechunk.Repository.exists(storage):
                self.repo = icechunk.Repository.open(storage)
            elif readonly or self.branch is None:
                raise MissingDatabaseError(f"{path}: no Icechunk repository")
            else:
                self.repo = icechunk.Repository.create(storage)
            if self.branch is None:
                self.readonly = True  # a tag or a snapshot is one version
                self.session = self.repo.readonly_session(tag=self.tag, snapshot_id=self.snapshot_id)
            elif readonly:
                self.session = self.repo.readonly_session(branch=self.branch)
            else:
                self.session = self.repo.writable_session(self.branch)
        except icechunk.IcechunkError as exc:
            raise BackendError(f"{path}: {_reason(exc)}") from None
        self.data = self._listed()

    # -- what OverlayTxn asks of its driver --------------------------------------------------------
    @contextmanager
    def _begin(self, write: bool) -> Iterator[Txn]:
        with self.lock:
            with IcechunkTxn(self, write) as txn:
                yield txn

    def index(self, space: Space) -> KeyIndex:
        """The index of ``space``."""
        return self.data if space is DATA else self.side

    def load(self, raw: bytes, space: Space) -> bytes | None:
        """The value of ``raw``, or None."""
        if space is not DATA:
            return self.side.info.get(raw)
        if raw not in self.data.info:
            return None
        if raw in self.scratch:
            return self.scratch[raw]
        value = self._call(self.session.store.get(raw.decode(), default_buffer_prototype()))
        return None if value is None else value.to_bytes()

    def size_of(self, raw: bytes, space: Space) -> int | None:
        """The size of ``raw``'s value, or None (asked of the session once, then kept)."""
        if space is not DATA:
            value = self.side.info.get(raw)
            return None if value is None else len(value)
        if raw not in self.data.info:
            return None
        size = self.data.info[raw]
        if size is None:
            size = self._call(self.session.store.getsize(raw.decode()))
            self.data.info[raw] = size
        return size

    def read_range(self, raw: bytes, offset: int, length: int) -> bytes | None:
        """``length`` bytes of ``raw``'s value from ``offset``, or None."""
        if raw not in self.data.info:
            return None
        if raw in self.scratch:
            return self.scratch[raw][offset : offset + length]
        if length <= 0:
            return b""
        request = RangeByteRequest(offset, offset + length)
        value = self._call(self.session.store.get(raw.decode(), default_buffer_prototype(), request))
        return None if value is None else value.to_bytes()

    def apply(self, writes: dict[tuple[Space, bytes], Any]) -> None:
        """Put a committed transaction's writes into the session: new metadata first (an
        array before its chunks), removed metadata last (deepest first); if Icechunk refuses
        one, the ones before are undone and the transaction fails."""
        data = []
        for (space, raw), value in writes.items():
            if space is DATA:
                data.append((raw, value))
            elif value is DELETED:
                self.side.remove(raw)
            else:
                self.side.set(raw, value)

        def order(item: tuple[bytes, Any]) -> tuple[int, int, bytes]:
            raw, value = item
            depth = raw.count(b"/")
            if _is_metadata(raw):
                return (3, -depth, raw) if value is DELETED else (0, depth, raw)
            return (2 if value is DELETED else 1, depth, raw)

        done: list[tuple[bytes, bytes | None]] = []
        try:
            for raw, value in sorted(data, key=order):
                before = self.load(raw, DATA)
                if value is DELETED:
                    self._remove(raw)
                else:
                    self._store(raw, value)
                done.append((raw, before))
        except BaseException:
            for raw, before in reversed(done):
                try:
                    self._remove(raw) if before is None else self._store(raw, before)
                except BackendError as exc:
                    log.warning("%s: %s could not be put back: %s", self.path, raw.decode(), exc)
            raise
        if any(_is_metadata(raw) for raw, _ in data):
            if any(_is_metadata(raw) and value is DELETED for raw, value in data):
                self.data = self._listed()  # a node removed takes its chunks with it
            self._adopt()

    def _store(self, raw: bytes, value: bytes) -> None:
        key = raw.decode()
        if _leaf(raw) in V2_METADATA:
            raise InvalidKeyError(f"{key}: an Icechunk repository holds Zarr v3 only (no {_leaf(raw)})")
        try:
            sync(self.session.store.set(key, Buffer.from_bytes(value)))
        except (icechunk.IcechunkError, KeyError) as exc:
            text = _reason(exc)
            if isinstance(exc, KeyError) or "invalid zarr key format" in text:
                self.scratch[raw] = bytes(value)  # not (yet) a key Icechunk takes
                self.data.set(raw, len(value))
                return
            raise InvalidKeyError(f"{key}: Icechunk refuses it: {text}") from None
        self.scratch.pop(raw, None)
        self.data.set(raw, len(value))
        self.dirty.add(key)

    def _remove(self, raw: bytes) -> None:
        if raw not in self.data.info:
            return
        self.data.remove(raw)
        if self.scratch.pop(raw, None) is not None:
            return
        try:
            sync(self.session.store.delete(raw.decode()))
        except KeyError:
            pass  # gone with its array's metadata
        except icechunk.IcechunkError as exc:
            raise BackendError(f"{self.path}: {raw.decode()}: {_reason(exc)}") from None
        self.dirty.add(raw.decode())

    def _adopt(self) -> None:
        """Move into the session the names kept aside that Icechunk takes now (the chunks of
        an array whose metadata just arrived)."""
        for raw in sorted(self.scratch, key=lambda r: (not _is_metadata(r), r)):
            value = self.scratch.pop(raw)
            self._store(raw, value)

    def _listed(self) -> KeyIndex:
        async def keys() -> list[str]:
            return [k async for k in self.session.store.list()]

        index = KeyIndex()
        for key in self._call(keys()):
            index.set(key.encode("utf-8"), None)
        for raw, value in self.scratch.items():
            index.set(raw, len(value))
        return index

    def _call(self, coro: Any) -> Any:
        try:
            return sync(coro)
        except icechunk.IcechunkError as exc:
            raise BackendError(f"{self.path}: {_reason(exc)}") from None

    # -- versions ------------------------------------------------------------------------------------
    def version(self) -> dict[str, Any]:
        """What this driver serves, for ``zarrfs status``."""
        with self.lock:
            return {
                "kind": "icechunk",
                "branch": self.branch,
                "tag": self.tag,
                "snapshot": self.session.snapshot_id,
                "writable": not self.readonly,
                "uncommitted": bool(self.dirty) and self.session.has_uncommitted_changes,
                "kept_aside": sorted(raw.decode() for raw in self.scratch),
            }

    def commit(self, message: str, rebase: bool = False, branch: str | None = None) -> dict[str, Any]:
        """Commit what the session holds to the branch (``rebase``: on top of commits made
        elsewhere meanwhile), or to the new branch ``branch`` made at the session's start;
        the mount goes on with a new session of the branch committed to."""
        if self.branch is None:
            raise BackendError(f"{self.path}: a tag or a snapshot is read-only: there is nothing to commit")
        if self.readonly:
            raise BackendError(f"{self.path}: branch {self.branch!r} opened read-only: nothing to commit")
        with self.lock:
            aside = sorted(raw.decode() for raw in self.scratch)
            if not self.session.has_uncommitted_changes:
                return {"snapshot": None, "branch": self.branch, "kept_aside": aside}
            if branch is not None:
                snapshot = self._commit_to_new_branch(branch, message)
            else:
                snapshot = self._commit_here(message, rebase)
            self._renew(branch or self.branch)
            return {"snapshot": snapshot, "branch": self.branch, "kept_aside": aside}

    def _commit_here(self, message: str, rebase: bool) -> str:
        try:
            if rebase:
                return self.session.commit(message, rebase_with=icechunk.ConflictDetector())
            return self.session.commit(message)
        except (icechunk.ConflictError, icechunk.RebaseFailedError) as exc:
            what = "both changed the same chunks or metadata" if rebase else "another commit landed on it"
            raise CommitConflict(
                f"the branch {self.branch!r} moved since this mount's session began ({what}: "
                f"{_reason(exc)}); the writes stay in the mount, uncommitted: "
                + (
                    "commit them to a new branch (--branch NAME)"
                    if rebase
                    else "commit again with --rebase to put them on top, or to a new branch (--branch NAME)"
                )
            ) from None
        except icechunk.IcechunkError as exc:
            raise BackendError(f"{self.path}: commit failed: {_reason(exc)}") from None

    def _commit_to_new_branch(self, branch: str, message: str) -> str:
        """Copy the session's changes to a new session of ``branch``, made where the session
        began, and commit that."""
        try:
            self.repo.create_branch(branch, self.session.snapshot_id)
            target = self.repo.writable_session(branch)
            store, source = target.store, self.session.store
            keys = sorted(self.dirty, key=lambda k: (not k.endswith(METADATA), k.count("/"), k))
            for key in keys:
                value = sync(source.get(key, default_buffer_prototype())) if source is not None else None
                if value is None:
                    try:
                        sync(store.delete(key))
                    except KeyError:
                        pass
                else:
                    sync(store.set(key, value))
            return target.commit(message)
        except icechunk.IcechunkError as exc:
            raise BackendError(
                f"{self.path}: cannot commit to a new branch {branch!r}: {_reason(exc)}"
            ) from None

    def _renew(self, branch: str) -> None:
        self.branch = branch
        self.session = self.repo.writable_session(branch)
        self.dirty.clear()
        self.data = self._listed()
        self.generation += 1

    # -- the change feed: only a new session changes what the mount sees ----------------------------
    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """Nothing, until a commit starts a new session (which may hold others' commits)."""
        now = self.generation
        return now, None if since is not None and since != now else []

    def statfs(self) -> dict[str, int] | None:
        """The space of the filesystem holding the repository."""
        return statvfs(self.path if os.path.isdir(self.path) else os.path.dirname(self.path))

    def close(self) -> None:
        """Commit writes not committed yet (see the module docstring), then let go."""
        with self.lock:
            if self.readonly or self.branch is None or not self.dirty:
                self._warn_aside()
                return
            if not self.session.has_uncommitted_changes:
                return
            message = "written through zarrfs, not committed before it closed the repository"
            try:
                snapshot = self._commit_here(message, rebase=True)
                log.warning(
                    "%s: uncommitted writes committed to %r at close: %s", self.path, self.branch, snapshot
                )
            except CommitConflict:
                name = f"{self.branch}.unmounted-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                snapshot = self._commit_to_new_branch(name, message)
                log.warning(
                    "%s: uncommitted writes conflict with the branch %r: committed to the new branch %r: %s",
                    self.path, self.branch, name, snapshot,
                )
            self._warn_aside()
            self.dirty.clear()

    def _warn_aside(self) -> None:
        if self.scratch:
            names = ", ".join(sorted(raw.decode() for raw in self.scratch)[:10])
            log.warning(
                "%s: %d file(s) that are not Zarr v3 keys were never stored in the repository: %s",
                self.path, len(self.scratch), names,
            )


def _reason(exc: BaseException) -> str:
    """The first line of an Icechunk error (its message carries a long context trace)."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip().lstrip("x").strip()
        if line:
            return line
    return type(exc).__name__


__all__ = ["CommitConflict", "IcechunkDriver"]
