"""Lookups: what is at a path, derived from the keys and side records in a database.

A path is a key: ``/grp/arr/0.0`` is the key ``grp/arr/0.0``. Folders are not stored; they are
derived from key prefixes (``arr/0/0`` makes the folders ``arr`` and ``arr/0``), plus side
markers for folders made with ``mkdir`` so that empty folders persist. When the database holds
both a key ``a`` and keys under ``a/`` (impossible in POSIX), the folder wins and the key is
hidden (logged once, never deleted).

:class:`Lookups` is the part of :class:`zarrfs.fs.tree.Tree` that answers "what is at
this key": one probe (a batch of reads) per name. Listings are in :mod:`zarrfs.fs.listing`,
namespace changes in :mod:`zarrfs.fs.tree`.
"""

from __future__ import annotations

import errno
import logging
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zarrfs.backends.base import DATA, PARTS, SIDE, Driver, Get, HasPrefix, Read, Size, Txn
from zarrfs.backends.heldvalues import Held, View, hold
from zarrfs.format.array_grid import find_grid
from zarrfs.fs import hardlinks, parts
from zarrfs.fs.errors import FsError
from zarrfs.fs.hooks import Hooks
from zarrfs.fs.manifest import part_key
from zarrfs.fs.node import DIR, FILE, LINK, Node, Probe, stamp_of
from zarrfs.fs.sidedata import (
    ENTRY,
    LINK_MARK,
    SPECIAL_MARK,
    Attrs,
    attr_key,
    entry_key,
    pointer_key,
    read_special,
    xattr_key,
)

if TYPE_CHECKING:
    from zarrfs.fs.knownfolders import KnownFolders
    from zarrfs.fs.readahead import Readahead

log = logging.getLogger("zarrfs.fs.tree")

_SIZED = (FILE, DIR, LINK)

#: The largest value an open reads in the same batch as its probe, on a driver where a batch is one
#: round trip, when this mount last saw the file at most this large (see :meth:`Lookups.version`).
SPECULATE = 4 << 20
#: Parts of a file read beside its probe, at most (see Lookups.version).
SPECULATE_PARTS = 4
#: Files whose last seen size :class:`Lookups` remembers (the table is emptied when full).
SIZE_HINTS = 4096


class Lookups:
    """What is at a key, read from a driver: probes (one batch of reads per name), nodes,
    values and versions for opens. ``uid``/``gid``/``umask`` and ``epoch`` give the attributes
    of nodes that have none recorded; ``hooks`` the size and bytes a file shows."""

    def __init__(self, driver: Driver, hooks: Hooks, *, uid: int, gid: int, umask: int, epoch: int) -> None:
        self.driver = driver
        self.hooks = hooks
        self.uid, self.gid, self.umask, self.epoch = uid, gid, umask, epoch
        #: Chunks read ahead of a reader in grid order (a Readahead), or None.
        self.readahead: Readahead | None = None
        self._hidden_logged: set[str] = set()
        self._size_hints: dict[str, int] = {}  # key -> size last seen (see version)
        self._part_hints: dict[str, Any] = {}  # key -> its parts last seen, when in parts
        #: What the mount knows of folders without asking (a KnownFolders, kept true by the
        #: change feed), or None.
        self.known: KnownFolders | None = None

    def default_attrs(self, kind: int) -> Attrs:
        """Attributes of a node that has no side record."""
        perm = 0o777 if kind == LINK else (0o777 if kind == DIR else 0o666) & ~self.umask
        return Attrs(kind | perm, self.uid, self.gid, self.epoch, self.epoch, self.epoch)

    def attrs_of(self, t: Txn, key: str, kind: int) -> Attrs:
        raw = t.get(attr_key(key), SIDE)
        attrs = Attrs.unpack(raw) if raw is not None else None
        if attrs is None:
            return self.default_attrs(kind)
        return attrs if stat.S_IFMT(attrs.mode) == kind else attrs.with_type(kind)

    def has_children(self, t: Txn, key: str, side: bool = True) -> bool:
        prefix = key + "/"
        if next(iter(t.scan_prefix(prefix, limit=1)), None) is not None:
            return True
        return side and next(iter(t.scan_prefix(ENTRY + prefix, space=SIDE, limit=1)), None) is not None

    def probe(self, t: Txn, key: str) -> Probe | None:
        """(kind, stored size, link target, raw attributes, link-group pointer) of ``key``, or
        None when nothing is there; for a special file the size slot holds its device number
        (it has no size). One batch of reads where a batch costs one read (a round trip to
        Redis, one SQLite statement); on LMDB, only the reads the answer needs (a file or a
        missing name skips two of six, a folder, symlink or special file the pointer)."""
        if self.driver.batched or key == "":
            return self.probe_many(t, [key])[0]
        size, data_below = t.read_many([Size(key, DATA), HasPrefix(key + "/", DATA)])
        if size is None and not data_below:
            side = [Get(entry_key(key), SIDE), HasPrefix(ENTRY + key + "/", SIDE)]
            mark, side_below = t.read_many(side)
            if mark is None and not side_below:
                return None
        else:
            mark, side_below = None, False
        found = self._judge(key, size, data_below, mark, side_below, t.get(attr_key(key), SIDE))
        if found is not None and found[0] != DIR:
            return (*found[:4], t.get(pointer_key(key), SIDE))
        return found

    def probe_many(self, t: Txn, keys: list[str], also: Sequence[str] = ()) -> list[Probe | None]:
        """:meth:`probe` of several keys in one batch of reads; the batch also reads the data
        keys ``also``, for the transaction to answer again without a round trip. Where a batch
        is one read, it reads each key's link-group pointer too; elsewhere (LMDB) only the
        pointers of what was found and is not a folder are read, after. Where a batch saves no
        round trip (LMDB), each key is read only as far as its answer needs (:meth:`probe`:
        a folder with data below it no side entry, a missing name no attributes)."""
        if not self.driver.batched and not also and "" not in keys:
            return [self.probe(t, key) for key in keys]
        return self._probe_many_reading(t, keys, also)[1]

    def probe_many_with(
        self, t: Txn, keys: list[str], extra: Sequence[Read]
    ) -> tuple[list[Probe | None], list[Any]]:
        """:meth:`probe_many` of ``keys``, and the answers of the reads ``extra`` (a removal's
        checks), in the same batch where a batch is one read, else after it."""
        if not self.driver.batched:
            return self.probe_many(t, keys), t.read_many(extra) if extra else []
        answers, probes = self._probe_many_reading(t, keys, (), extra)
        return probes, answers

    def _probe_many_reading(
        self,
        t: Txn,
        keys: list[str],
        also: Sequence[str] = (),
        extra: Sequence[Read] = (),
        apart: bool = False,
    ) -> tuple[list[Any], list[Probe | None]]:
        """:meth:`probe_many`, and the values of ``also`` it read (then the answers of the
        reads ``extra``, asked in the same batch); ``apart`` as ``Txn.read_many`` takes it."""
        batched = self.driver.batched
        per_key = 6 if batched else 5
        requests: list[Read] = [*extra, *(Get(k, DATA) for k in also)]
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
                if batched:
                    requests.append(Get(pointer_key(key), SIDE))
        answers = t.read_many(requests, apart=apart)
        out: list[Probe | None] = []
        i = len(extra) + len(also)
        for key in keys:
            if key == "":
                out.append((DIR, 0, "", answers[i], None))
                i += 1
            else:
                found = self._judge(key, *answers[i : i + 5])
                if found is not None and found[0] != DIR:
                    pointer = answers[i + 5] if batched else t.get(pointer_key(key), SIDE)
                    found = (*found[:4], pointer)
                out.append(found)
                i += per_key
        return answers[: len(extra) + len(also)], out

    def _judge(self, key: str, size, data_below, mark, side_below, raw_attrs):
        """What a probe's first five answers say is at ``key`` (its pointer is read after).
        Data keys win over side entries (a key, or keys below it, over a symlink's or folder's
        marker of the same name), as they do in listings, and as the probe that reads the side
        only when the data has nothing must agree."""
        if size is not None:
            if not data_below:
                return FILE, size, "", raw_attrs, None
            self.log_hidden(key)
            return DIR, 0, "", raw_attrs, None
        if data_below:
            return DIR, 0, "", raw_attrs, None
        if mark is not None and mark[:1] == LINK_MARK:
            target = bytes(mark[1:]).decode("utf-8", "surrogateescape")
            return LINK, len(target.encode("utf-8", "surrogateescape")), target, raw_attrs, None
        if mark is not None and mark[:1] == SPECIAL_MARK:
            return (*read_special(mark), "", raw_attrs, None)
        if mark is not None or side_below:
            return DIR, 0, "", raw_attrs, None
        return None

    def probe_in_folder(self, t: Txn, key: str, also: Sequence[str] = ()) -> Probe | None:
        """:meth:`probe` of ``key``, and in the same batch a check that its parent is a folder
        (ENOENT / ENOTDIR otherwise), as every call that makes a name needs."""
        return self.probe_with_folder(t, key, also)[1]

    def probe_with_folder(
        self, t: Txn, key: str, also: Sequence[str] = ()
    ) -> tuple[Probe, Probe | None]:
        """:meth:`probe_in_folder`, with the probe of the folder too (its attributes say who
        owns a new entry and are changed by it)."""
        parent, found = self.probe_many(t, [key.rpartition("/")[0], key], also)
        self.folder_check(parent, key)
        assert parent is not None
        return parent, found

    @staticmethod
    def folder_check(parent: tuple | None, key: str) -> None:
        if parent is None:
            raise FsError(errno.ENOENT, f"parent of {key}")
        if parent[0] != DIR:
            raise FsError(errno.ENOTDIR, f"parent of {key}")

    def log_hidden(self, key: str) -> None:
        if key not in self._hidden_logged:
            self._hidden_logged.add(key)
            log.warning("key %r is hidden by the folder %r of the same name (nothing deleted)", key, key)

    def find_in(self, t: Txn, key: str) -> Node | None:
        found = self.probe(t, key)
        if found is None:
            return None
        return self.remember(key, self.node_from(t, key, *found))

    def find_many(self, t: Txn, keys: list[str], apart: bool = False) -> list[Node | None]:
        """:meth:`find_in` of several keys, their probes in one batch of reads; ``apart``: each
        need agree only with itself (``Txn.read_many``; a listing's window read again)."""
        if apart and self.driver.batched:
            probes = self._probe_many_reading(t, keys, apart=True)[1]
        else:
            probes = self.probe_many(t, keys)
        return [
            None if found is None else self.remember(key, self.node_from(t, key, *found))
            for key, found in zip(keys, probes, strict=True)
        ]

    def find_with_xattrs(self, t: Txn, key: str) -> tuple[Node | None, bytes | None, bytes | None]:
        """:meth:`find_in`, and in the same batch of reads the extended-attribute record of
        ``key`` (for the known folders: ``ls -l`` asks for it after the lookup); and the raw
        attribute record read (a folder's: what a new file in it inherits)."""
        (found,), (raw,) = self.probe_many_with(t, [key], [Get(xattr_key(key), SIDE)])
        if found is None:
            return None, None, None
        return self.remember(key, self.node_from(t, key, *found)), raw, found[3]

    def remember(self, key: str, node: Node) -> Node:
        """Note the size of the file ``node`` at ``key``: a hint for its next open (see
        :meth:`version`), never an answer."""
        if node.kind == FILE:
            self.stored_as(key, node.size, node.attrs.parted)
        return node

    def stored_as(self, key: str, size: int, parted: Any = None) -> None:
        """Note that the file at ``key`` was seen (or stored by this mount) ``size`` bytes
        large, stored in parts when ``parted``: a hint for its next open (see :meth:`version`)."""
        hints = self._size_hints
        if len(hints) >= SIZE_HINTS:
            hints.clear()
            self._part_hints.clear()
        # A file stored in parts is opened by reading its manifest: that is what is read,
        # and beside it the parts it named when last seen (see version).
        hints[key] = size if parted is None else parts.MANIFEST_SIZE
        if parted is not None:
            self._part_hints[key] = parted
        elif self._part_hints:
            self._part_hints.pop(key, None)

    def remember_files(self, files: list[tuple[str, Node]]) -> None:
        """:meth:`remember` of many files not stored in parts (a listing's window), in one call."""
        hints = self._size_hints
        part_hints = self._part_hints
        for key, node in files:
            if len(hints) >= SIZE_HINTS:
                hints.clear()
                part_hints.clear()
            hints[key] = node.size
            if part_hints:
                part_hints.pop(key, None)

    def node_from(
        self, t: Txn, key: str, kind: int, size: int, target: str, raw: bytes | None, pointer=None
    ) -> Node:
        nlink, gid, names = 1, "", ()
        attrs = Attrs.unpack(raw) if raw is not None else None
        if attrs is not None and attrs.parted is not None:
            # Stored in parts (zarrfs.fs.parts) while the key holds a manifest's size; else
            # someone else rewrote the key, and the file is what they wrote.
            if kind == FILE and size == parts.MANIFEST_SIZE:
                size = attrs.parted.size
            else:
                attrs.parted = None
        if kind == FILE and self.hooks.transforms:
            size = self.hooks.shown_size(t, key, size)
        if pointer is not None and kind != DIR:  # a linked file (most files have no pointer)
            group = hardlinks.load(t, key, pointer)
            if group is not None and len(group.names) > 1:
                nlink, gid, names = len(group.names), group.gid, tuple(group.names)
        if attrs is None:
            attrs = self.default_attrs(kind)
        elif stat.S_IFMT(attrs.mode) != kind:
            attrs = attrs.with_type(kind)
        if kind not in _SIZED:  # a special file: the size slot held its device number
            return Node(kind, 0, attrs, target, nlink, gid, rdev=size, names=names)
        return Node(kind, size, attrs, target, nlink, gid, names=names)

    def _node(self, t: Txn, key: str) -> Node:
        node = self.find_in(t, key)
        if node is None:
            raise FsError(errno.ENOENT, key, quiet=True)
        return node

    def lookup(self, key: str) -> Node:
        """The node at ``key``; ENOENT when there is none."""
        return self.driver.transact(lambda t: self._node(t, key), write=False)

    def read_value(self, key: str) -> bytes:
        """The whole content of the file at ``key`` as it is shown."""

        def run(t: Txn) -> bytes:
            value = parts.whole(t, key, t.get(key))
            if value is None:
                raise FsError(errno.ENOENT, key, quiet=True)
            return self.hooks.shown_value(t, key, value)

        return self.driver.transact(run, write=False)

    def version(self, key: str, limit: int) -> tuple[Node | None, Held | None]:
        """The file at ``key`` as it is now, for an open: its node and, in the same
        transaction, its content when that is at most ``limit`` bytes, held in place where the
        driver can, or read at its first use (``backends.heldvalues``): release it. (An open
        whose pages the kernel holds may never read it: a view or a deferred read costs little.)

        Where a batch of reads is one round trip, a file this mount last saw (a lookup, a
        folder's snapshot) at most :data:`SPECULATE` bytes large has its value read in the
        same batch as its probe: an open costs one round trip, not two. The size seen is only a
        hint: what the probe finds decides, and a value that turns out larger than ``limit``
        is dropped. A reader in grid order gets the next chunks read ahead in the same batch
        (:mod:`zarrfs.fs.readahead`): their values where they may serve opens, else their
        nodes, which answer their lookups."""
        ahead = self.readahead
        nodes_ahead: list[str] = []
        if ahead is not None and not ahead.values and self.driver.batched and not self.hooks_transform:
            nodes_ahead = ahead.opening(key)
        elif ahead is not None and self.driver.batched and not self.hooks_transform:
            hit = ahead.take(key)
            if hit is None:
                more = ahead.plan(key)
                if more:
                    found = self.versions([key, *more], min(limit, ahead.max_value))
                    ahead.keep((k, n, v) for k, (n, v) in zip(more, found[1:], strict=True))
                    hit = found[0] if found[0][1] is not None else None
            if hit is not None:
                node, value = hit
                return node, Held(value)
        hint = self._size_hints.get(key)
        speculate = (
            hint is not None
            and hint <= min(limit, SPECULATE)
            and self.driver.batched
            # a driver that holds a value reads it only when asked, unless it is small
            and (self.driver.holder is None or hint < self.driver.holder.smallest)
            and not self.hooks_transform
        )

        seen = self._part_hints.get(key) if speculate and hint == parts.MANIFEST_SIZE else None
        if seen is not None and (seen.mapped or seen.count > SPECULATE_PARTS or seen.size > limit):
            seen = None

        probed_ahead: list[tuple[str, Node | None, None]] = []

        def run(t: Txn, view: View) -> tuple[Node | None, Any]:
            if speculate:
                # A file in parts last seen with parts of its own: those are read in the same
                # batch (parts never change; on a spread Redis Cluster the parts' masters are
                # asked while the home slot answers), used if the probe finds that version.
                seen_parts = [] if seen is None else [
                    Get(part_key(seen.id, n), PARTS) for n in range(seen.count)
                ]
                answers, (found, *further) = self._probe_many_reading(
                    t, [key, *nodes_ahead], [key], seen_parts
                )
                probed_ahead[:] = [
                    (k, None if f is None else self.remember(k, self.node_from(t, k, *f)), None)
                    for k, f in zip(nodes_ahead, further, strict=True)
                ]
                value = answers[-1]
                node = None if found is None else self.remember(key, self.node_from(t, key, *found))
                if node is None or node.kind != FILE or node.size > limit:
                    return node, None
                if value is not None and len(value) == parts.MANIFEST_SIZE:
                    got = answers[:-1]
                    if (
                        seen is not None
                        and node.attrs.parted is not None
                        and node.attrs.parted.id == seen.id
                        and not node.attrs.parted.mapped
                        and all(p is not None and len(p) == seen.length(n) for n, p in enumerate(got))
                    ):
                        return node, got[0] if len(got) == 1 else b"".join(got)
                    value = parts.whole(t, key, bytes(value), node.attrs.parted)
                return node, value
            node = self.find_in(t, key)
            if node is None or node.kind != FILE:
                return node, None
            if node.size > limit or self.hooks_transform:
                # A decoded view decodes at the first read, which may refuse it (EINVAL):
                # the open itself succeeds, as it did before it read anything.
                return node, None
            value = view(key)  # shown as stored: no transforming hooks here
            if value is not None and len(value) == parts.MANIFEST_SIZE:
                # a parted file's manifest, maybe (the probe read its record)
                value = parts.whole(t, key, bytes(value), node.attrs.parted)
            return node, value

        # A file last seen small enough (or not seen) has its content read: a transaction that
        # begins only at its second statement may begin before the probe, not run the probe
        # again (SQLite).
        got = hold(self.driver, run, hint is None or hint <= limit)
        if probed_ahead and ahead is not None:
            ahead.keep(probed_ahead)
        return got

    def versions(self, keys: list[str], limit: int) -> list[tuple[Node | None, bytes | None]]:
        """The files at ``keys`` as they are now, in one batch of reads (one round trip where a
        batch is one): each one's node and, when it is a file of at most ``limit`` bytes, its
        content (bytes)."""

        def run(t: Txn) -> list[tuple[Node | None, bytes | None]]:
            values, probes = self._probe_many_reading(t, keys, keys)
            out: list[tuple[Node | None, bytes | None]] = []
            parted: list[tuple[int, Any]] = []  # (index in out, the version) of parted files
            for key, value, found in zip(keys, values, probes, strict=True):
                node = None if found is None else self.remember(key, self.node_from(t, key, *found))
                if node is None or node.kind != FILE or node.size > limit or value is None:
                    out.append((node, None))
                    continue
                if len(value) == parts.MANIFEST_SIZE and node.attrs.parted is not None:
                    version = parts.current(t, key, bytes(value), node.attrs.parted)
                    if version is not None:  # its parts are read below, all in one batch
                        parted.append((len(out), version))
                out.append((node, bytes(value)))
            if parted:
                for (i, _), whole in zip(parted, parts.wholes(t, [v for _, v in parted]), strict=True):
                    out[i] = (out[i][0], whole)
            return out

        return self.driver.transact(run, write=False)

    def read_version(self, key: str, stamp: tuple[int, int], offset: int = 0, size: int = -1) -> bytes:
        """Bytes of the file at ``key`` (all of it, as shown, when ``size`` is negative; else a
        stored range) if it is still the version ``stamp``; ESTALE when it was replaced: a
        descriptor never reads from two versions."""

        def run(t: Txn) -> bytes:
            node = self.find_in(t, key)
            if node is None or node.kind != FILE or stamp_of(node) != stamp:
                raise FsError(errno.ESTALE, f"{key} was replaced since it was opened")
            if size >= 0:
                return parts.read(t, key, offset, size, node.attrs.parted) or b""
            value = parts.whole(t, key, t.get(key))
            if value is None:
                raise FsError(errno.ESTALE, f"{key} was replaced since it was opened")
            return self.hooks.shown_value(t, key, value)

        return self.driver.transact(run, write=False)

    def array_of(self, key: str) -> Any:
        """Where the chunks of the Zarr array enclosing ``key`` are
        (:class:`zarrfs.format.array_grid.ArrayGrid`), or None; its metadata read in as few
        batches as its folders' depth allows, its codecs left alone (numpy and numcodecs stay
        unimported: see that module)."""

        def get_many(keys: list[str]) -> list[Any]:
            return self.driver.transact(lambda t: t.read_many([Get(k) for k in keys]), write=False)

        return find_grid(key, lambda k: get_many([k])[0], get_many)

    def link_names(self, key: str) -> list[str]:
        """Every name of the file at ``key`` (``key`` among them) when it has hard links,
        else an empty list."""

        def run(t: Txn) -> list[str]:
            group = hardlinks.load(t, key, t.get(pointer_key(key), SIDE))
            return group.names if group is not None and len(group.names) > 1 else []

        return self.driver.transact(run, write=False)

    def lookup_attrs(self, key: str) -> Attrs:
        """The attributes of the file at ``key`` (defaults when it has none or is gone)."""
        return self.driver.transact(lambda t: self.attrs_of(t, key, FILE), write=False)

    @property
    def hooks_transform(self) -> bool:
        """Whether files show other bytes than the stored ones (a decoded view)."""
        return self.hooks.transforms

    def stored_size(self, key: str) -> int:
        """The stored size of the value at ``key`` (0 when absent; a parted value's total)."""
        size = self.driver.size(key)  # the driver's one-shot size: no transaction object
        if size != parts.MANIFEST_SIZE:
            return size or 0
        return self.driver.transact(lambda t: parts.size_of(t, key), write=False) or 0

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """Stored bytes of ``key`` from ``offset``, without fetching the whole value."""
        return self.driver.transact(lambda t: parts.read(t, key, offset, size), write=False) or b""

    def readlink(self, key: str) -> str:
        """The target of the symlink at ``key``."""
        node = self.lookup(key)
        if node.kind != LINK:
            raise FsError(errno.EINVAL, f"{key} is not a symlink")
        return node.target
