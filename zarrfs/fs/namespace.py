"""The path <-> key tree: what the filesystem looks like, derived from the keys in a database.

A path is a key: ``/grp/arr/0.0`` is the key ``grp/arr/0.0``. Folders are not stored; they are
derived from key prefixes (``arr/0/0`` makes the folders ``arr`` and ``arr/0``), plus side
markers for folders made with ``mkdir`` so that empty folders persist. When the database holds
both a key ``a`` and keys under ``a/`` (impossible in POSIX), the folder wins and the key is
hidden (logged once, never deleted).

Everything here is one driver transaction per call; nothing here knows about FUSE, so it imports
and tests without a mount. POSIX conditions are raised as :class:`zarrfs.fs.errors.FsError`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zarrfs.backends.base import (
    DATA,
    KEYS,
    SIDE,
    SIZES,
    VALUES,
    Driver,
    Get,
    HasPrefix,
    Read,
    Size,
    Txn,
    prefix_stop,
)
from zarrfs.fs.errors import FsError
from zarrfs.fs.sidedata import DIR_MARK, ENTRY, EPOCH, LINK_MARK, Attrs, attr_key, entry_key

log = logging.getLogger("zarrfs.fs.namespace")

FILE, DIR, LINK = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FOLDER_BATCH = 512  # children per batch of reads when a whole folder is read (SQLite: < 2000 columns)

# The scan position just past every key below a folder ``p + name + "/"``: '0' follows '/'.
_AFTER_SLASH = chr(ord("/") + 1)


@dataclass
class Node:
    """What is at a key: its kind (FILE, DIR or LINK), size in bytes and attributes."""

    kind: int
    size: int
    attrs: Attrs
    target: str = ""


class Hooks:
    """Where the format layer plugs into the tree. This base class accepts everything as is."""

    def check_name(self, txn: Txn, key: str, kind: int) -> None:
        """Refuse (raise) a new file or folder name; called by create, mkdir, rename, link."""

    def store(self, txn: Txn, key: str, value: Any) -> Any:
        """Validate (and possibly transform) bytes written through a file before they are stored;
        return what to store. Raise to refuse: nothing is stored."""
        return value

    def arrive(self, txn: Txn, key: str, value: bytes, source: str) -> bytes:
        """Validate a stored value arriving at ``key`` from ``source`` by rename or link, and
        return what to store there (``source`` is empty when the file moves with its folder).
        Raise to refuse."""
        return value

    def reads(self, key: str) -> list[str]:
        """Data keys :meth:`check_name` and :meth:`store` will read for a new file at ``key``.
        On a remote database the tree fetches them together with its own first reads, so the
        commit of a new file costs one round trip of reads."""
        return []

    def changed(self, txn: Txn, key: str, value: Any) -> None:
        """Called, in the same transaction, after data key ``key`` was set to ``value`` (bytes
        or a buffer) or deleted (``None``)."""

    def shown_size(self, txn: Txn, key: str, size: int) -> int:
        """The size a file shows (a decoded view shows the decoded size)."""
        return size

    def shown_value(self, txn: Txn, key: str, value: bytes) -> bytes:
        """The bytes a file shows when read."""
        return value


class _Recording:
    """A transaction as the hooks see it: every data key they write is noted, so that the
    kernel's caches of those files can be dropped after the commit."""

    def __init__(self, txn: Txn, into: set[str]) -> None:
        self._txn = txn
        self._into = into

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.put(key, value, space)

    def delete(self, key: str, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.delete(key, space)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Tree:
    """The filesystem over one driver: lookups, listings and every namespace change.

    ``uid``/``gid``/``umask`` give the attributes of nodes that have none recorded.
    ``on_side_effects(keys)`` is called after a commit in which the hooks changed other keys
    than the ones asked for (a consolidated ``.zmetadata``), so the mount can drop the
    kernel's cached attributes and pages of those files.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        uid: int = 0,
        gid: int = 0,
        umask: int = 0o022,
        hooks: Hooks | None = None,
    ) -> None:
        self.driver = driver
        self.uid = uid
        self.gid = gid
        self.umask = umask
        self.hooks = hooks or Hooks()
        self.on_side_effects: Any = None
        #: Snapshots of busy folders for :meth:`find` (a FolderCache), or None.
        self.folder_cache: Any = None
        self._side_effects: set[str] = set()
        self._hidden_logged: set[str] = set()
        self.epoch = self._load_epoch()

    # ------------------------------------------------------------------ lookups
    def _load_epoch(self) -> int:
        raw = self.driver.get(EPOCH, SIDE)
        if raw is not None:
            return int(raw)
        now = time.time_ns()
        if not self.driver.readonly:
            self.driver.put(EPOCH, str(now).encode(), SIDE)
        return now

    def default_attrs(self, kind: int) -> Attrs:
        """Attributes of a node that has no side record."""
        perm = 0o777 if kind == LINK else (0o777 if kind == DIR else 0o666) & ~self.umask
        return Attrs(kind | perm, self.uid, self.gid, self.epoch, self.epoch, self.epoch)

    def _attrs(self, t: Txn, key: str, kind: int) -> Attrs:
        raw = t.get(attr_key(key), SIDE)
        attrs = Attrs.unpack(raw) if raw is not None else None
        if attrs is None:
            return self.default_attrs(kind)
        return attrs if stat.S_IFMT(attrs.mode) == kind else attrs.with_type(kind)

    def _has_children(self, t: Txn, key: str, side: bool = True) -> bool:
        prefix = key + "/"
        if next(iter(t.scan_prefix(prefix, limit=1)), None) is not None:
            return True
        return side and next(iter(t.scan_prefix(ENTRY + prefix, space=SIDE, limit=1)), None) is not None

    def _probe(self, t: Txn, key: str) -> tuple[int, int, str, bytes | None] | None:
        """(kind, stored size, link target, raw attributes) of ``key``, or None when nothing
        is there. One batch of reads where a batch costs one read (a round trip to Redis, one
        SQLite statement); on LMDB, only the reads the answer needs (a file or a missing name
        skips two of five)."""
        if self.driver.batched or key == "":
            return self._probe_many(t, [key])[0]
        size, data_below = t.read_many([Size(key, DATA), HasPrefix(key + "/", DATA)])
        if size is None and not data_below:
            side = [Get(entry_key(key), SIDE), HasPrefix(ENTRY + key + "/", SIDE)]
            mark, side_below = t.read_many(side)
            if mark is None and not side_below:
                return None
        else:
            mark, side_below = None, False
        return self._judge(key, size, data_below, mark, side_below, t.get(attr_key(key), SIDE))

    def _probe_many(
        self, t: Txn, keys: list[str], also: Sequence[str] = ()
    ) -> list[tuple[int, int, str, bytes | None] | None]:
        """:meth:`_probe` of several keys in one batch of reads; the batch also reads the data
        keys ``also``, for the transaction to answer again without a round trip."""
        requests: list[Read] = [Get(k, DATA) for k in also]
        for key in keys:
            if key == "":
                requests.append(Get(attr_key(key), SIDE))
            else:
                requests += [
                    Size(key, DATA),
                    HasPrefix(key + "/", DATA),
                    Get(entry_key(key), SIDE),
                    HasPrefix(ENTRY + key + "/", SIDE),
                    Get(attr_key(key), SIDE),
                ]
        answers = t.read_many(requests)
        out: list[tuple[int, int, str, bytes | None] | None] = []
        i = len(also)
        for key in keys:
            if key == "":
                out.append((DIR, 0, "", answers[i]))
                i += 1
            else:
                out.append(self._judge(key, *answers[i : i + 5]))
                i += 5
        return out

    def _judge(self, key: str, size, data_below, mark, side_below, raw_attrs):
        """What a probe's five answers say is at ``key``."""
        if size is not None:
            if not data_below:
                return FILE, size, "", raw_attrs
            self._log_hidden(key)
            return DIR, 0, "", raw_attrs
        if mark is not None and mark[:1] == LINK_MARK:
            target = bytes(mark[1:]).decode("utf-8", "surrogateescape")
            return LINK, len(target.encode("utf-8", "surrogateescape")), target, raw_attrs
        if mark is not None or data_below or side_below:
            return DIR, 0, "", raw_attrs
        return None

    def _probe_in_folder(
        self, t: Txn, key: str, also: Sequence[str] = ()
    ) -> tuple[int, int, str, bytes | None] | None:
        """:meth:`_probe` of ``key``, and in the same batch a check that its parent is a folder
        (ENOENT / ENOTDIR otherwise), as every call that makes a name needs."""
        parent, found = self._probe_many(t, [key.rpartition("/")[0], key], also)
        self._folder_check(parent, key)
        return found

    @staticmethod
    def _folder_check(parent: tuple | None, key: str) -> None:
        if parent is None:
            raise FsError(errno.ENOENT, f"parent of {key}")
        if parent[0] != DIR:
            raise FsError(errno.ENOTDIR, f"parent of {key}")

    def _log_hidden(self, key: str) -> None:
        if key not in self._hidden_logged:
            self._hidden_logged.add(key)
            log.warning("key %r is hidden by the folder %r of the same name (nothing deleted)", key, key)

    def _find(self, t: Txn, key: str) -> Node | None:
        found = self._probe(t, key)
        if found is None:
            return None
        return self._node_from(t, key, *found)

    def _node_from(self, t: Txn, key: str, kind: int, size: int, target: str, raw: bytes | None) -> Node:
        if kind == FILE:
            size = self.hooks.shown_size(t, key, size)
        attrs = Attrs.unpack(raw) if raw is not None else None
        if attrs is None:
            attrs = self.default_attrs(kind)
        elif stat.S_IFMT(attrs.mode) != kind:
            attrs = attrs.with_type(kind)
        return Node(kind, size, attrs, target)

    def _node(self, t: Txn, key: str) -> Node:
        node = self._find(t, key)
        if node is None:
            raise FsError(errno.ENOENT, key, quiet=True)
        return node

    def find(self, key: str) -> Node | None:
        """The node at ``key``, or None when there is none (the lookup of every ``stat``: a
        missing name is common and costs no exception). Answered from a snapshot of the
        folder when :attr:`folder_cache` has one (see :mod:`zarrfs.fs.foldercache`)."""
        cache = self.folder_cache
        if cache is not None and key:
            folder, _, name = key.rpartition("/")
            nodes = cache.snapshot(folder, lambda limit: self.folder_nodes(folder, limit))
            if nodes is not None:
                return nodes.get(name)
        return self.driver.transact(lambda t: self._find(t, key), write=False)

    def folder_nodes(self, key: str, limit: int) -> dict[str, Node] | None:
        """Every child of folder ``key`` by name, read in one transaction (sizes and
        attributes in batches of reads); None when there are more than ``limit``. A missing
        folder has no children."""

        def run(t: Txn) -> dict[str, Node] | None:
            children: list[tuple[str, int]] = []
            # Sizes come with the listing's scan, except from a remote database, where a batch
            # of reads is one round trip and the scan would take one per page of sizes.
            sizes: dict[str, int] | None = None if self.driver.remote else {}
            for name, kind, _ in self._merged_children(t, key, None, sizes):
                children.append((name, kind))
                if len(children) > limit:
                    return None
            prefix = key + "/" if key else ""
            nodes: dict[str, Node] = {}
            for start in range(0, len(children), FOLDER_BATCH):
                part = children[start : start + FOLDER_BATCH]
                requests: list[Read] = []
                for name, kind in part:
                    child = prefix + name
                    if kind == FILE and sizes is None:
                        requests.append(Size(child, DATA))
                    elif kind == LINK:
                        requests.append(Get(entry_key(child), SIDE))
                    requests.append(Get(attr_key(child), SIDE))
                answers = iter(t.read_many(requests))
                for name, kind in part:
                    child = prefix + name
                    size, target = 0, ""
                    if kind == FILE:
                        size = next(answers) if sizes is None else sizes.get(name)
                    elif kind == LINK:
                        mark = next(answers) or LINK_MARK
                        target = bytes(mark[1:]).decode("utf-8", "surrogateescape")
                        size = len(target.encode("utf-8", "surrogateescape"))
                    raw = next(answers)
                    if size is None:  # gone between the listing and the read
                        continue
                    nodes[name] = self._node_from(t, child, kind, size, target, raw)
            return nodes

        return self.driver.transact(run, write=False)

    def lookup(self, key: str) -> Node:
        """The node at ``key``; ENOENT when there is none."""
        return self.driver.transact(lambda t: self._node(t, key), write=False)

    def read_value(self, key: str) -> bytes:
        """The whole content of the file at ``key`` as it is shown."""

        def run(t: Txn) -> bytes:
            value = t.get(key)
            if value is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            return self.hooks.shown_value(t, key, value)

        return self.driver.transact(run, write=False)

    def lookup_attrs(self, key: str) -> Attrs:
        """The attributes of the file at ``key`` (defaults when it has none or is gone)."""
        return self.driver.transact(lambda t: self._attrs(t, key, FILE), write=False)

    @property
    def hooks_transform(self) -> bool:
        """Whether files show other bytes than the stored ones (a decoded view)."""
        return bool(getattr(self.hooks, "transforms", False))

    def stored_size(self, key: str) -> int:
        """The stored size of the value at ``key`` (0 when absent)."""
        return self.driver.size(key) or 0

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """Stored bytes of ``key`` from ``offset``, without fetching the whole value."""
        return self.driver.read(key, offset, size) or b""

    def readlink(self, key: str) -> str:
        """The target of the symlink at ``key``."""
        node = self.lookup(key)
        if node.kind != LINK:
            raise FsError(errno.EINVAL, f"{key} is not a symlink")
        return node.target

    # ------------------------------------------------------------------ listing
    def list_dir(self, key: str, after: str | None = None, limit: int = 1024) -> list[tuple[str, int, str]]:
        """Up to ``limit`` children of folder ``key`` as ``(name, kind, position)``.

        Children come in key order; ``position`` is an opaque resume token: pass the last one
        as ``after`` to continue. A folder of a million keys is listed batch by batch, never
        built as one list. ENOTDIR/ENOENT when ``key`` is not a folder.
        """

        def run(t: Txn) -> list[tuple[str, int, str]]:
            if after is None:
                found = self._probe(t, key)
                if found is None:
                    raise FsError(errno.ENOENT, key, quiet=True)
                if found[0] != DIR:
                    raise FsError(errno.ENOTDIR, key)
            return list(itertools.islice(self._merged_children(t, key, after), limit))

        return self.driver.transact(run, write=False)

    def _merged_children(
        self, t: Txn, key: str, after: str | None, sizes: dict[str, int] | None = None
    ) -> Iterator[tuple[str, int, str]]:
        prefix = key + "/" if key else ""
        data = self._children(t, prefix, after, DATA, sizes)
        side = self._children(t, ENTRY + prefix, after, SIDE)
        a, b = next(data, None), next(side, None)
        while a is not None or b is not None:
            if b is None:  # no side entries (left): the rest is the data stream as it is
                yield a
                yield from data
                return
            if a is not None and a[2] < b[2]:
                yield a
                a = next(data, None)
            elif a is None or b[2] < a[2]:
                yield b
                b = next(side, None)
            else:  # the same folder in both streams
                yield a
                a, b = next(data, None), next(side, None)

    def _children(
        self, t: Txn, prefix: str, after: str | None, space: str, sizes: dict[str, int] | None = None
    ) -> Iterator[tuple[str, int, str]]:
        """Immediate children under ``prefix`` in one space, skipping whole subtrees by seeking.

        A child's position is its name, with a trailing '/' for a folder, so positions sort in
        the order the keys do and a resume skips exactly what was already returned. With
        ``sizes``, the stored size of each file child is put there, read by the same scan.
        """
        stop = prefix_stop(prefix)
        if after is None:
            pos = prefix
        elif after.endswith("/"):
            pos = prefix + after[:-1] + _AFTER_SLASH
        else:
            pos = prefix + after + "\0"
        n = len(prefix)
        batch_size = 256
        # Sizes come with the scan only once a batch held files alone: the scan's sizes are
        # those of every key it passes, also keys deep inside subfolders (zarr's c/0/0, c/1/0,
        # ...), and on LMDB a size costs reading the whole value. Until then the sizes of the
        # folder's own files are looked up one by one.
        flat = False
        while True:
            fetch = VALUES if space == SIDE else (SIZES if sizes is not None and flat else KEYS)
            batch = list(t.scan(pos, stop, space=space, fetch=fetch, limit=batch_size))
            if not batch:
                return
            fetched = len(batch)
            flat = True
            if space == DATA and sizes is None and fetched > 1:
                # A flat run of files (most of a large folder): no key below a subfolder and
                # none extending the one before, so all but the last are plain files.
                rests = [k[n:] for k, _ in batch]
                if "/" not in "\0".join(rests) and not any(
                    b.startswith(a) for a, b in zip(rests[:-1], rests[1:], strict=True)
                ):
                    for rest in itertools.islice(rests, len(rests) - 1):
                        yield rest, FILE, rest
                    batch = batch[-1:]
            # The batch's keys below one subfolder are skipped (the folder is listed once);
            # the keys after them are used, not fetched again: a folder of many subfolders
            # with a key or two each (zarr's c/0/0, c/1/0, ...) costs one scan, not one a
            # subfolder. When the batch ends inside a subfolder, the next seeks past it.
            folder = None
            for i, (k, v) in enumerate(batch):
                rest = k[n:]
                slash = rest.find("/")
                if slash >= 0:
                    flat = False
                    name = rest[:slash]
                    if name != folder:
                        yield name, DIR, name + "/"
                        folder = name
                        pos = prefix + name + _AFTER_SLASH
                    continue
                folder = None
                if space == SIDE:
                    if v[:1] != LINK_MARK:  # a folder marker: its subtree is the same child
                        yield rest, DIR, rest + "/"
                        folder = rest
                        pos = prefix + rest + _AFTER_SLASH
                        continue
                    yield rest, LINK, rest
                else:
                    following = batch[i + 1][0] if i + 1 < len(batch) else None
                    # Only a following key that extends this one can be a folder of the same
                    # name; then the folder wins and it is listed (later) instead of the key.
                    # Keys below "k/" sort before any "k" + a character above '/' ("1" then
                    # "10"): only a following "k/..." or "k" + a lower character ("k.0") leaves
                    # the question open.
                    if following is None:
                        hidden = self._has_children(t, k, False)
                    elif following.startswith(k):
                        after_k = following[len(k)]
                        hidden = after_k == "/" or (after_k < "/" and self._has_children(t, k, False))
                    else:
                        hidden = False
                    if hidden:
                        self._log_hidden(k)
                    else:
                        if sizes is not None:
                            sizes[rest] = v if fetch == SIZES else t.size(k)
                        yield rest, FILE, rest
                pos = k + "\0"
            if fetched < batch_size:
                return

    # ------------------------------------------------------------------ writes
    def _write(self, run: Any) -> Any:
        """Run a write transaction; then report keys the hooks changed on the side."""
        self._side_effects = touched = set()
        try:
            result = self.driver.transact(run)
        finally:
            if self.folder_cache is not None:
                self.folder_cache.clear()
        if touched and self.on_side_effects is not None:
            self.on_side_effects(sorted(touched))
        return result

    def _changed(self, t: Txn, key: str, value: Any) -> None:
        self.hooks.changed(_Recording(t, self._side_effects), key, value)

    def _now(self) -> int:
        return time.time_ns()

    def _keep_parent(self, t: Txn, key: str) -> None:
        """After ``key`` left its folder, keep the folder (POSIX: only rmdir removes one)."""
        parent = key.rpartition("/")[0]
        if not parent:
            return
        marked, data_below, side_below = t.read_many(
            [
                Get(entry_key(parent), SIDE),
                HasPrefix(parent + "/", DATA),
                HasPrefix(ENTRY + parent + "/", SIDE),
            ]
        )
        if marked is None and not data_below and not side_below:
            t.put(entry_key(parent), DIR_MARK, SIDE)

    def commit(
        self, key: str, value: Any, attrs: Attrs | None, create: bool = False, exclusive: bool = False
    ) -> None:
        """Store the content of a file written through the mount, with its attributes, in one
        transaction; the format layer may refuse it (nothing is stored then).

        ``create``: the file may be new here (its folder must exist, a folder or symlink in the
        way is an error); ``exclusive``: it must be new (EEXIST otherwise), as for ``link`` or
        ``RENAME_NOREPLACE``."""

        # Remote: what the format layer will read comes in the probe's round trip.
        also = self.hooks.reads(key) if (create or exclusive) and self.driver.remote else ()

        def run(t: Txn) -> None:
            if create or exclusive:
                found = self._probe_in_folder(t, key, also)
                if found is not None and (exclusive or found[0] != FILE):
                    raise FsError(errno.EISDIR if found[0] == DIR else errno.EEXIST, key)
                if found is None:
                    self.hooks.check_name(t, key, FILE)
            stored = self.hooks.store(t, key, value)
            t.put(key, stored)
            if attrs is not None:
                t.put(attr_key(key), attrs.pack(), SIDE)
            self._changed(t, key, stored)

        self._write(run)

    def check_create(self, key: str) -> None:
        """Raise unless the name ``key`` is valid for a new file. The kernel has just looked up
        the name and its folder; the commit checks both again in its own transaction."""
        self.driver.transact(lambda t: self.hooks.check_name(t, key, FILE), write=False)

    def mkdir(self, key: str, mode: int) -> None:
        """Make an empty folder that persists (EEXIST if taken, ENOENT/ENOTDIR for the parent)."""

        def run(t: Txn) -> None:
            if not key or self._probe_in_folder(t, key) is not None:
                raise FsError(errno.EEXIST, key)
            self.hooks.check_name(t, key, DIR)
            now = self._now()
            t.put(entry_key(key), DIR_MARK, SIDE)
            t.put(attr_key(key), self._new_attrs(DIR, mode, now).pack(), SIDE)

        self._write(run)

    def _new_attrs(self, kind: int, mode: int, now: int, uid: int | None = None, gid: int | None = None):
        return Attrs(
            kind | stat.S_IMODE(mode),
            self.uid if uid is None else uid,
            self.gid if gid is None else gid,
            now,
            now,
            now,
        )

    def symlink(self, target: str, key: str, uid: int | None = None, gid: int | None = None) -> None:
        """Make a symlink at ``key`` pointing to ``target`` (kept as side data: not a Zarr key)."""

        def run(t: Txn) -> None:
            if self._probe_in_folder(t, key) is not None:
                raise FsError(errno.EEXIST, key)
            now = self._now()
            t.put(entry_key(key), LINK_MARK + target.encode("utf-8", "surrogateescape"), SIDE)
            t.put(attr_key(key), self._new_attrs(LINK, 0o777, now, uid, gid).pack(), SIDE)

        self._write(run)

    def unlink(self, key: str) -> None:
        """Remove the file or symlink at ``key`` (EISDIR for a folder)."""

        def run(t: Txn) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] == DIR:
                raise FsError(errno.EISDIR, key)
            if found[0] == FILE:
                t.delete(key)
                self._changed(t, key, None)
            else:
                t.delete(entry_key(key), SIDE)
            t.delete(attr_key(key), SIDE)
            self._keep_parent(t, key)

        self._write(run)

    def rmdir(self, key: str) -> None:
        """Remove the empty folder at ``key`` (ENOTEMPTY, ENOTDIR, ENOENT as POSIX says)."""

        def run(t: Txn) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            if found[0] != DIR:
                raise FsError(errno.ENOTDIR, key)
            if not key:
                raise FsError(errno.EBUSY, "the root folder")
            if self._has_children(t, key):
                raise FsError(errno.ENOTEMPTY, key, quiet=True)
            t.delete(entry_key(key), SIDE)
            t.delete(attr_key(key), SIDE)
            self._keep_parent(t, key)

        self._write(run)

    def set_attrs(
        self,
        key: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime: int | None = None,
        mtime: int | None = None,
    ) -> None:
        """Change mode, owner or times of ``key`` (``-1`` owner means unchanged, as chown)."""

        def run(t: Txn) -> None:
            found = self._probe(t, key)
            if found is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            attrs = self._attrs(t, key, found[0])
            if mode is not None:
                attrs.mode = stat.S_IFMT(attrs.mode) | stat.S_IMODE(mode)
            if uid is not None and uid != -1:
                attrs.uid = uid
            if gid is not None and gid != -1:
                attrs.gid = gid
            if atime is not None:
                attrs.atime = atime
            if mtime is not None:
                attrs.mtime = mtime
            attrs.ctime = self._now()
            t.put(attr_key(key), attrs.pack(), SIDE)

        self._write(run)

    # ------------------------------------------------------------------ rename / link
    def _subtree(self, t: Txn, key: str) -> list[tuple[str, str, bytes]]:
        """Every record of the node at ``key`` and below: (space, key, value)."""
        records: list[tuple[str, str, bytes]] = []
        value = t.get(key)
        if value is not None:
            records.append((DATA, key, value))
        records.extend((DATA, k, v) for k, v in t.scan_prefix(key + "/", fetch=VALUES))
        for side_prefix in (ENTRY, "a:"):
            raw = t.get(side_prefix + key, SIDE)
            if raw is not None:
                records.append((SIDE, side_prefix + key, raw))
            records.extend(
                (SIDE, k, v) for k, v in t.scan_prefix(side_prefix + key + "/", space=SIDE, fetch=VALUES)
            )
        return records

    @staticmethod
    def _moved(record_key: str, src: str, dst: str) -> str:
        for side_prefix in (ENTRY, "a:"):
            if record_key.startswith(side_prefix):
                return side_prefix + dst + record_key[len(side_prefix) + len(src) :]
        return dst + record_key[len(src) :]

    def _remove(self, t: Txn, records: list[tuple[str, str, bytes]]) -> None:
        for space, k, _ in records:
            t.delete(k, space)
            if space == DATA:
                self._changed(t, k, None)

    def _place(self, t: Txn, records: list[tuple[str, str, bytes]], src: str, dst: str) -> None:
        for space, k, v in records:
            new = self._moved(k, src, dst)
            if space == DATA:
                # A file moved with its folder keeps its meaning; only a file moved alone can
                # change what it is (a temporary file becoming a chunk).
                v = self.hooks.arrive(t, new, v, k if k == src else "")
            t.put(new, v, space)
            if space == DATA:
                self._changed(t, new, v)

    def rename(self, src: str, dst: str, flags: int = 0) -> None:
        """Move a file or a whole folder atomically, replacing an existing target atomically;
        honours RENAME_NOREPLACE and RENAME_EXCHANGE."""
        if src == dst:
            return
        if not src or not dst:
            raise FsError(errno.EBUSY, "the root folder")
        if dst.startswith(src + "/") or (flags & RENAME_EXCHANGE and src.startswith(dst + "/")):
            raise FsError(errno.EINVAL, f"cannot move {src} into itself")

        def run(t: Txn) -> None:
            s, d, parent = self._probe_many(t, [src, dst, dst.rpartition("/")[0]])
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if flags & RENAME_EXCHANGE:
                if d is None:
                    raise FsError(errno.ENOENT, dst, quiet=True)
                a, b = self._subtree(t, src), self._subtree(t, dst)
                self._remove(t, a)
                self._remove(t, b)
                self._place(t, a, src, dst)
                self._place(t, b, dst, src)
                return
            if d is not None:
                if flags & RENAME_NOREPLACE:
                    raise FsError(errno.EEXIST, dst)
                if s[0] == DIR and d[0] != DIR:
                    raise FsError(errno.ENOTDIR, dst)
                if s[0] != DIR and d[0] == DIR:
                    raise FsError(errno.EISDIR, dst)
                if d[0] == DIR and self._has_children(t, dst):
                    raise FsError(errno.ENOTEMPTY, dst)
                self._remove(t, self._subtree(t, dst))
            else:
                self._folder_check(parent, dst)
                self.hooks.check_name(t, dst, s[0])
            records = self._subtree(t, src)
            self._remove(t, records)
            self._place(t, records, src, dst)
            self._keep_parent(t, src)

        self._write(run)

    def link(self, src: str, dst: str) -> None:
        """``link(src, dst)``: a new file ``dst`` with the content of ``src``; EEXIST, atomically,
        when ``dst`` exists (zarr-python 3 creates metadata this way). A key/value store has no
        hard links, so this is a copy that is taken in one transaction."""

        def run(t: Txn) -> None:
            s, d, parent = self._probe_many(t, [src, dst, dst.rpartition("/")[0]])
            if s is None:
                raise FsError(errno.ENOENT, src, quiet=True)
            if s[0] == DIR:
                raise FsError(errno.EPERM, f"{src} is a folder")
            if d is not None:
                raise FsError(errno.EEXIST, dst)
            self._folder_check(parent, dst)
            self.hooks.check_name(t, dst, s[0])
            records = [r for r in self._subtree(t, src) if r[1] in (src, entry_key(src), attr_key(src))]
            self._place(t, records, src, dst)

        self._write(run)

    # ------------------------------------------------------------------ filesystem
    def statfs(self) -> dict[str, int]:
        """Block and inode counts for ``statvfs``: the real free space behind the database."""
        info = self.driver.statfs() or {"total": 1 << 40, "free": 1 << 40}
        bsize = 4096
        return {
            "f_bsize": bsize,
            "f_frsize": bsize,
            "f_blocks": info["total"] // bsize,
            "f_bfree": info["free"] // bsize,
            "f_bavail": info["free"] // bsize,
            "f_files": 1 << 32,
            "f_ffree": 1 << 31,
            "f_favail": 1 << 31,
            "f_namemax": 255,
        }
