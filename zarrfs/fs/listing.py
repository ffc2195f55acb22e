"""Folder listings: a folder's children, streamed from the keys and side records, exact for every name.

Children come from the data keys below the folder (``grp/arr/0.0`` makes ``arr`` a child of
``grp``), the side entries below it (``mkdir`` markers, symlinks) and, for ``readdir``, files
created through the mount and not stored yet. Key order is not name order: the keys of ``foo/...``
sort after those of ``foo-max``, ``foo.bar`` or ``foo bar`` (characters below '/' sort first),
while the markers ``e:foo``, ``e:foo-max`` sort by name. So each source is read in key order and
turned into a stream of names in name order, each once: a name whose folder sorts later is settled
when first met, from the batch at hand, the next one, or one probe of ``foo/``. The streams are
merged on names, and unstored files are listed after them unless already named. A resume token is
the last name listed; a listing resumes at the first name after it. A folder is read batch by
batch, never built as one list.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import os
import re
from collections import namedtuple
from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol

from zarrfs.backends.base import DATA, KEYS, SIDE, SIZES, VALUES, Get, Read, Size, Txn, prefix_stop
from zarrfs.fs.errors import FsError
from zarrfs.fs.lookups import Lookups
from zarrfs.fs.node import DIR, FILE, LINK, Node
from zarrfs.fs.sidedata import (
    ATTR,
    ENTRY,
    GROUP,
    LINK_MARK,
    POINTER,
    SPECIAL_MARK,
    XATTR,
    Attrs,
    entry_key,
    named_of,
    read_special,
)

# Keys per scan of a folder's keys. ZARRFS_LISTING_BATCH sets it for a daemon, so that tests
# put every name of a small folder at a batch's edge (docs/testing.md).
SCAN_BATCH = int(os.environ.get("ZARRFS_LISTING_BATCH") or 256)
RANGED_FROM = 64  # children of a batch from which SQLite reads their side records as ranges
FOLDER_BATCH = 512  # children per batch of reads when a whole folder is read (SQLite: < 2000 columns)
#: Most side records a window's range of one kind is read with, on a remote database (one batch
#: of a scan on every driver: PostgreSQL's is 512 rows).
SIDE_RANGE = 500
#: Folders whose last change told by the change feed is kept apart; beyond, every folder
#: counts as changed (a listing's window then reads its nodes again once: never wrong).
TOLD_FOLDERS = 4096
#: Names this mount's commits changed that are kept apart, by folder (:meth:`Listings.wrote`);
#: beyond, every window being given counts as written (it reads its nodes again once: never
#: wrong).
WROTE_KEYS = 4096
FIRST_BATCH = 128  # entries of the first window of a readdir; each next one is 4 times larger
MAX_BATCH = 4096

# The scan position just past every key below a folder ``p + name + "/"``: '0' follows '/'.
_AFTER_SLASH = chr(ord("/") + 1)
# Characters that sort before '/': a name followed by one of them sorts before the name's folder.
_BEFORE_SLASH = re.compile("[\x00-\x2e]")

# A stream of one source: (name, kind, name), in name order (the name twice: a listing's entry
# is (name, kind, resume token), and the token is the name; _merged passes entries on as made).
Names = Iterator[tuple[str, int, str]]


def _common_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _folders_before(name: str, last: str) -> list[str]:
    """The prefixes of ``name`` that sort after ``last`` and whose folder's keys sort after
    ``name``'s (the prefix is followed by a character below '/'), shortest first. When one is a
    folder it is a child to list before ``name``. A prefix sorts after ``last`` only where it
    goes past what ``name`` and ``last`` have in common."""
    if _BEFORE_SLASH.search(name, 1) is None:  # most names (zarr's chunk rows, metadata)
        return []
    start = _common_length(name, last) + 1
    return [name[: m.start()] for m in _BEFORE_SLASH.finditer(name, start)]


class _Batch:
    """One batch of a scan, sorted, and whether any key starts with a prefix that sorts after
    the keys already used: answered from the batch when it runs past the prefix. Otherwise
    only a later batch can tell: the keys from the one that asks on wait for the next batch
    (``resume``), which starts with them, so a listing costs scans alone; the first key of a
    batch cannot wait, and probes."""

    def __init__(self, t: Txn, space: str, keys: list[str], final: bool) -> None:
        self.t, self.space, self.keys, self.final = t, space, keys, final
        self.resume: str | None = None  # where the next batch starts, when keys wait for it

    def settled(self, prefix: str) -> bool:
        """Whether the batch tells if keys start with ``prefix``."""
        return self.final or bisect.bisect_left(self.keys, prefix) < len(self.keys)

    def below(self, prefix: str) -> bool:
        """Whether any key starts with ``prefix`` (from the batch, or probed)."""
        i = bisect.bisect_left(self.keys, prefix)
        if i < len(self.keys):  # the batch runs past the prefix: it holds every key there is
            return self.keys[i].startswith(prefix)
        if self.final:
            return False
        return next(iter(self.t.scan_prefix(prefix, space=self.space, limit=1)), None) is not None


def _start(prefix: str, after: str | None) -> str:
    """Where a scan of the names under ``prefix`` after ``after`` starts: every key of a name
    after ``after`` sorts after ``after`` itself."""
    return prefix if after is None else prefix + after + "\0"


def _announce(t: Txn, prefix: str, after: str | None, sized: bool = False) -> None:
    """Tell ``t`` the first scans :func:`_names` makes of both spaces (``Txn.scan_ahead``): a
    remote database sends them with the transaction's next reads (the folder's probe).
    ``sized``: the data scan reads sizes from its first batch (``_names``)."""
    data = SIZES if sized else KEYS
    for space, start, fetch in ((DATA, prefix, data), (SIDE, ENTRY + prefix, VALUES)):
        t.scan_ahead(_start(start, after), prefix_stop(start), space=space, fetch=fetch, limit=SCAN_BATCH)


class _Ranges:
    """Side records of a window of children read as ranges of the side space, by mark
    (:data:`ATTR`, ...): the records found, by child key, and how far each range is complete
    (the last key it read; None: to the folder's end). A child past a range's end is read
    alone."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.upto: dict[str, str | None] = {}

    @staticmethod
    def bounds(mark: str, prefix: str, after: str | None) -> tuple[str, str]:
        """The range of ``mark``'s records of the children of ``prefix`` after ``after``."""
        return _start(mark + prefix, after), prefix_stop(mark + prefix)

    @classmethod
    def announce(cls, t: Txn, prefix: str, after: str | None, marks: tuple[str, ...], limit: int) -> None:
        """Tell ``t`` the ranges :meth:`read` will scan (sent with the listing's first scans)."""
        for mark in marks:
            start, stop = cls.bounds(mark, prefix, after)
            t.scan_ahead(start, stop, space=SIDE, fetch=VALUES, limit=limit)

    @classmethod
    def read(cls, t: Txn, prefix: str, after: str | None, marks: tuple[str, ...], limit: int) -> _Ranges:
        """Up to ``limit`` records of each mark from the first child after ``after`` on."""
        ranges = cls()
        for mark in marks:
            start, stop = cls.bounds(mark, prefix, after)
            rows = list(t.scan(start, stop, space=SIDE, fetch=VALUES, limit=limit))
            n = len(mark)
            ranges.records[mark] = {key[n:]: value for key, value in rows}
            ranges.upto[mark] = rows[-1][0] if len(rows) >= limit else None
        return ranges

    def covers(self, mark: str, child: str) -> bool:
        """Whether the range of ``mark`` tells whether ``child`` has a record."""
        if mark not in self.records:
            return False
        upto = self.upto[mark]
        return upto is None or mark + child <= upto

    def get(self, mark: str, child: str) -> Any:
        """``child``'s record of ``mark`` (None: it has none); only where :meth:`covers`."""
        return self.records[mark].get(child)


def _names(
    t: Txn,
    prefix: str,
    after: str | None,
    space: str,
    sizes: dict[str, int] | None = None,
    hidden: Callable[[str], None] | None = None,
    sized: bool = False,
) -> Names:
    """The children named by the keys under ``prefix`` in one space, after ``after``, in name
    order, each once. Data: a key is a FILE, or a DIR when keys below it hide it (``hidden``
    is told). Side: an entry is a LINK or a folder marker. With ``sizes``, each file's stored
    size is put there (read by the scan itself once batches hold files alone, or from the
    first batch with ``sized``: on a remote database a size costs the server nothing more,
    on LMDB nothing at all, ``Driver.scan_sizes_free``)."""
    stop = prefix_stop(prefix)
    pos = _start(prefix, after)
    last = after or ""
    # Sizes come with the scan only once a batch held files alone: the scan's sizes are those
    # of every key it passes, also keys deep inside subfolders (zarr's c/0/0, c/1/0, ...), and
    # where a size costs a read of the value that is a read of the subfolders' values. Until
    # then they are looked up one by one.
    flat = sized
    hidden = hidden or (lambda key: None)
    n = len(prefix)
    while True:
        fetch = VALUES if space == SIDE else (SIZES if sizes is not None and flat else KEYS)
        batch = list(t.scan(pos, stop, space=space, fetch=fetch, limit=SCAN_BATCH))
        if not batch:
            return
        keys = [k for k, _ in batch]
        rests = [k[n:] for k in keys]
        final = len(batch) < SCAN_BATCH
        # The next batch starts after this one, or past the rest of the subfolder it ended in.
        tail = rests[-1]
        slash = tail.find("/")
        after_batch = keys[-1] + "\0" if slash < 0 else prefix + tail[:slash] + _AFTER_SLASH
        if _has_dot_names(rests):  # rare: a database another program wrote
            batch, keys, rests = _without_dot_names(batch, keys, rests)
        if keys:
            scope = _Batch(t, space, keys, final)
            flat = space == DATA and "/" not in "\0".join(rests)
            part = _flat if flat else _mixed
            flat = flat or sized
            for item in part(scope, batch, rests, last, fetch, sizes, hidden):
                yield item
                last = item[0]
            if scope.resume is not None:
                pos = scope.resume
                continue
        if final:
            return
        pos = after_batch


def _dot_name(rest: str) -> bool:
    """Whether the key ``rest`` below a folder names ``.`` or ``..`` in it (``.``, ``..``,
    ``./x``, ``../x``): no path reaches such a key, and a listing has its own ``.`` and ``..``."""
    return rest in (".", "..") or rest.startswith(("./", "../"))


def _has_dot_names(rests: list[str]) -> bool:
    """:func:`_dot_name` of any of the sorted ``rests``, by four bisections (a listing's batch
    costs no look at each name)."""
    for probe in (".", "..", "./", "../"):
        i = bisect.bisect_left(rests, probe)
        if i < len(rests) and (rests[i] == probe or (probe[-1] == "/" and rests[i].startswith(probe))):
            return True
    return False


def _without_dot_names(batch: list, keys: list[str], rests: list[str]) -> tuple[list, list[str], list[str]]:
    """The batch less its keys that :func:`_dot_name` names."""
    kept = [i for i, rest in enumerate(rests) if not _dot_name(rest)]
    return [batch[i] for i in kept], [keys[i] for i in kept], [rests[i] for i in kept]


def _flat(scope: _Batch, batch: list, rests: list[str], last: str, fetch: str, sizes, hidden) -> Names:
    """A batch of data keys none of which has a '/' below the folder (most of a large folder):
    files. Only the names whose folder would sort after the batch are open: the last name and
    its prefixes followed by a character below '/' (``3`` and ``3.47`` in ``...``, ``3.46``,
    ``3.47``); any other folder would sort inside the batch, which has no key below a folder.
    The keys from the first open name on wait for the next batch, or, when that is all of
    them, the open names are probed."""
    tail = rests[-1]
    cut, folders = len(batch), set()
    if not scope.final and tail > last:
        open_names = [*_folders_before(tail, last), tail]
        cut = bisect.bisect_left(rests, open_names[0])
        if cut == 0:
            prefix = scope.keys[-1][: len(scope.keys[-1]) - len(tail)]
            folders = {name for name in open_names if scope.below(prefix + name + "/")}
            cut = len(batch)
        else:
            scope.resume = scope.keys[cut]
    # Folders without a key of their own go in their place among the files.
    unkeyed = sorted(folders.difference(rests)) if folders else []
    # Sizes the scan did not fetch: the batch holds files alone, so a scan of a range of it
    # passes no other key. They are read a range at a time as the names are taken, each range
    # as long as all before it (16, 16, 32, ...): a few reads, not one a file (SQLite: a
    # statement each), and few read past what a short listing takes.
    read: dict[str, Any] = {}
    upto = 0  # the keys before it have their sizes in ``read``
    keys = scope.keys
    j = 0
    for i, ((k, v), rest) in enumerate(zip(batch[:cut], rests[:cut], strict=True)):
        if rest <= last:  # an empty name ("a//b"): nothing a folder can list
            continue
        if sizes is not None and fetch != SIZES and i >= upto:
            upto = min(cut, i + max(16, upto))
            read = dict(scope.t.scan(k, keys[upto - 1] + "\0", space=scope.space, fetch=SIZES))
        while j < len(unkeyed) and unkeyed[j] < rest:
            yield unkeyed[j], DIR, unkeyed[j]
            j += 1
        if rest in folders:
            hidden(k)
            yield rest, DIR, rest
            continue
        if sizes is not None:
            if fetch != SIZES:
                v = read.get(k)
                if v is None:  # (not in the range read: a read of its own)
                    v = scope.t.size(k)
            sizes[rest] = v
        yield rest, FILE, rest
    yield from ((name, DIR, name) for name in unkeyed[j:])


def _mixed(scope: _Batch, batch: list, rests: list[str], last: str, fetch: str, sizes, hidden) -> Names:
    """A batch of keys, some below subfolders, name by name. The keys below a subfolder are
    skipped (the folder is listed once); the keys after them are used, not fetched again: a
    folder of many subfolders with a key or two each (zarr's c/0/0, c/1/0, ...) costs one scan,
    not one a subfolder."""
    keys = scope.keys
    prefix = keys[0][: len(keys[0]) - len(rests[0])]
    i = 0
    while i < len(batch):
        k, v = batch[i]
        rest = rests[i]
        slash = rest.find("/")
        name = rest if slash < 0 else rest[:slash]
        if name > last:
            # Folders whose keys sort after this key's ("foo/" after "foo-max/") come first.
            folders = _folders_before(name, last)
            asks = [prefix + f + "/" for f in folders]
            if slash < 0 and scope.space == DATA:
                asks.append(k + "/")  # a folder of the same name hides the key
            if i and not all(scope.settled(a) for a in asks):
                scope.resume = k
                return
            yield from _named(scope, prefix, k, v, name, slash >= 0, folders, fetch, sizes, hidden)
            last = name
        if slash >= 0:  # the rest of this folder's subtree, listed once
            i = bisect.bisect_left(keys, prefix + name + _AFTER_SLASH, i + 1)
        else:
            i += 1


def _named(scope: _Batch, prefix: str, k: str, v: Any, name: str, below: bool, folders, fetch, sizes, hidden):
    """The child ``name`` of key ``k`` (with its value or size ``v``; ``below``: the key is
    below the child), after those of ``folders`` (prefixes of ``name``) that are folders."""
    for folder in folders:
        if scope.below(prefix + folder + "/"):
            yield folder, DIR, folder
    if below:
        yield name, DIR, name
    elif scope.space == SIDE:
        mark = v[:1]
        yield name, LINK if mark == LINK_MARK else read_special(v)[0] if mark == SPECIAL_MARK else DIR, name
    elif scope.below(k + "/"):
        hidden(k)
        yield name, DIR, name
    else:
        if sizes is not None:
            sizes[name] = v if fetch == SIZES else scope.t.size(k)
        yield name, FILE, name


def _merged(data: Names, side: Names) -> Iterator[tuple[str, int, str]]:
    """The two streams as one, in name order: ``(name, kind, resume token)``. A name in both is
    listed once, of the kind a lookup gives it (:meth:`zarrfs.fs.lookups.Lookups._judge`):
    the data's (a file, or a folder of keys), over a side entry's."""
    a, b = next(data, None), next(side, None)
    while a is not None or b is not None:
        if b is None:  # no side entries (left): the rest is the data stream as it is
            yield a
            yield from data
            return
        if a is None or b[0] < a[0]:
            yield b
            b = next(side, None)
            continue
        yield a
        if a[0] == b[0]:
            b = next(side, None)
        a = next(data, None)


class Listings:
    """Folder listings over ``lookups`` (its driver, probes and nodes)."""

    def __init__(self, lookups: Lookups) -> None:
        self.lookups = lookups
        self.driver = lookups.driver
        #: Counts the changes that windows read ahead of a listing's requests may predate
        #: (:meth:`changed`): such a window is read again, not taken.
        self.generation = 0
        self.read_ahead = 0  # windows read ahead (DirListing.read_ahead)
        self.taken = 0  # of those, windows a request took as read
        # Folder -> the generation of the last change in it told by others (told), and the
        # generation from which every folder counts as told of one (None told, or too many).
        self._told: dict[str, int] = {}
        self._told_all = -1
        # Folder -> name -> the generation of this mount's last commit that changed the name's
        # node (wrote), how many names that holds, the generation from which every name
        # counts as written, and of the last commit.
        self._wrote: dict[str, dict[str, int]] = {}
        self._wrote_count = 0
        self._wrote_all = -1
        self.last_write = -1

    def changed(self) -> None:
        """The database changed, or may have: windows read ahead are stale (the window being
        given reads again what :meth:`told` and :meth:`wrote` name)."""
        self.generation += 1

    def told(self, folders: Collection[str] | None) -> None:
        """Another writer changed names in ``folders`` (None: anywhere), as the change feed
        tells, or a lock brings files up to date: a window being given in those folders has
        its nodes read again (the kernel, told already, would keep what the window read for
        its attribute timeout), and windows read ahead are stale."""
        self.changed()
        told = self._told
        if folders is None or len(told) + len(folders) > TOLD_FOLDERS:
            told.clear()
            self._told_all = self.generation
        else:
            for folder in folders:
                told[folder] = self.generation

    def told_since(self, folder: str, generation: int) -> bool:
        """Whether :meth:`told` of a change in ``folder`` after ``generation``."""
        return self._told_all > generation or self._told.get(folder, -1) > generation

    def wrote(self, writes: list[tuple[Any, str, Any]] | None) -> None:
        """This mount committed ``writes`` (``(space, key, value or None)`` as asked; None: a
        write that failed and may have been stored): the window being given looks up again
        the names they changed (:meth:`written`). The kernel holds a node it wrote
        through, and a reply gives such a name without attributes, until memory pressure
        makes it forget the node: then the window's attributes, read before the write, would
        be given and kept for the attribute timeout (a name removed here would even be
        found again)."""
        self.changed()
        generation = self.last_write = self.generation
        if writes is None or not self._keep_written(writes, generation):
            self._wrote.clear()
            self._wrote_count = 0
            self._wrote_all = generation

    def _keep_written(self, writes: list[tuple[Any, str, Any]], generation: int) -> bool:
        """Name each written key's node in its folder, and each folder above it in its own (a
        folder goes when the last key below it does); False where they are not all kept."""
        if self._wrote_count + len(writes) > WROTE_KEYS:  # (a folder's rename: each key below)
            return False
        wrote, count = self._wrote, self._wrote_count
        for space, key, _ in writes:
            path = key if space == DATA else named_of(key) if space == SIDE else None
            if path is None:
                if space == SIDE and not key.startswith(GROUP):
                    return False  # a record of no name the tree knows: any may have changed
                continue  # a part; a link group's names (each one's pointer is written too)
            while path:  # up to a folder this commit named already
                folder, _, name = path.rpartition("/")
                names = wrote.get(folder)
                if names is None:
                    names = wrote[folder] = {}
                at = names.get(name)
                if at == generation:
                    break
                if at is None:
                    count += 1
                names[name] = generation
                path = folder
        self._wrote_count = count
        return count <= WROTE_KEYS

    def written(self, folder: str, generation: int) -> set[str] | None:
        """The names of ``folder`` whose nodes this mount's commits after ``generation``
        changed (a folder's, for a key below it), or None: any of them."""
        if self._wrote_all > generation:
            return None
        names = self._wrote.get(folder)
        return {name for name, at in names.items() if at > generation} if names else set()

    def list_dir(
        self,
        key: str,
        after: str | None = None,
        limit: int = 1024,
        sizes: dict[str, int] | None = None,
        nodes: dict[str, Node] | None = None,
        held: Held | None = None,
        none_held: list[int] | None = None,
    ) -> list[tuple[str, int, str]]:
        """Up to ``limit`` children of folder ``key`` as ``(name, kind, position)``.

        Children come in name order, each once; ``position`` is an opaque resume token: pass
        the last one as ``after`` to continue. A folder of a million keys is listed batch by
        batch, never built as one list. ENOTDIR/ENOENT when ``key`` is not a folder. With
        ``sizes``, the stored sizes of files the scan saw are put there (for :meth:`nodes_of`).
        With ``nodes``, the children's nodes are put there by name, read in the same
        transaction (what READDIRPLUS replies with): on a remote database their side records
        are ranges sent with the listing's first scans, so a window of a folder of files is one
        round trip, its probe included; ``held``: children whose nodes the caller
        holds already, not read; ``none_held``: :attr:`Held.added` from before ``held`` was
        found to hold none of the children is put there (nothing when it holds some).
        """

        record: list[bytes | None] = []
        xattrs: list | None = None
        remote = self.driver.remote
        sized = (remote or self.driver.scan_sizes_free) and sizes is not None
        marks = self._marks() if remote and nodes is not None else ()
        span = min(SIDE_RANGE, 2 * limit)

        def run(t: Txn) -> list[tuple[str, int, str]]:
            nonlocal xattrs
            record.clear()
            prefix = key + "/" if key else ""
            _announce(t, prefix, after, sized)
            _Ranges.announce(t, prefix, after, marks, span)
            if after is None:
                found = self.lookups.probe(t, key)
                if found is None:
                    raise FsError(errno.ENOENT, key, quiet=True)
                if found[0] != DIR:
                    raise FsError(errno.ENOTDIR, key)
                record.append(found[3])
            got = list(itertools.islice(self._merged_children(t, key, after, sizes, sized), limit))
            if nodes is not None:
                nodes.clear()
                xattrs = [] if self.lookups.known is not None else None
                ranges = _Ranges.read(t, prefix, after, marks, span) if marks and got else None
                children, since = _not_held(key, [(n, kind) for n, kind, _ in got], held)
                if none_held is not None:
                    none_held[:] = () if since is None else (since,)
                self._window_nodes(t, prefix, children, sizes, nodes, xattrs, ranges)
            return got

        got = self.driver.transact(run, write=False)
        self._read_xattrs(xattrs)
        known = self.lookups.known
        if known is not None and record:  # the folder's record, and all its names if they fit
            known.read_record(key, record[0])
            if len(got) < limit:
                known.listed(key, (name for name, _, _ in got))
        return got

    def nodes_of(
        self, key: str, children: list[tuple[str, int]], sizes: dict[str, int] | None = None
    ) -> dict[str, Node]:
        """The nodes of ``children`` ((name, kind) of folder ``key``, as a listing gave them)
        by name, in one transaction, sizes and attributes in batches of reads: what a
        READDIRPLUS replies with each name, so that ``ls -l``, ``du`` or ``find -size`` need
        no lookup per name. ``sizes``: those the listing's scan saw (the others are read). A
        name gone meanwhile has no node. Names other than files are looked up, their probes
        in one batch: a listing's kinds are as old as its scan, and a folder goes with the
        last key below it, which no record of its own shows."""

        xattrs: list | None = None
        prefix = key + "/" if key else ""
        files = [child for child in children if child[1] == FILE]
        others = [name for name, kind in children if kind != FILE]

        def run(t: Txn) -> dict[str, Node]:
            nonlocal xattrs
            xattrs = [] if self.lookups.known is not None else None
            nodes: dict[str, Node] = {}
            self._window_nodes(t, prefix, files, sizes, nodes, xattrs)
            if others:
                nodes.update(self._found(t, prefix, others))
            return nodes

        nodes = self.driver.transact(run, write=False)
        self._read_xattrs(xattrs)
        return nodes

    def found(self, key: str, names: list[str]) -> dict[str, Node]:
        """The nodes a lookup finds now of ``names`` of folder ``key``, by name (a name gone,
        a folder too, has none), their probes in one batch of reads: what a listing's window
        gives again for names changed since its read."""
        prefix = key + "/" if key else ""
        return self.driver.transact(lambda t: self._found(t, prefix, names), write=False)

    def _found(self, t: Txn, prefix: str, names: list[str]) -> dict[str, Node]:
        """:meth:`found` in ``t``, of the names of the folder whose keys begin ``prefix``: each
        probe need agree only with itself (a readdir is atomic with nothing)."""
        found = self.lookups.find_many(t, [prefix + name for name in names], apart=True)
        return {name: node for name, node in zip(names, found, strict=True) if node is not None}

    def announce_folder(self, t: Txn, key: str) -> None:
        """Tell ``t`` the first scans of folder ``key`` (:meth:`small_folder` reads them)."""
        _announce(t, key + "/" if key else "", None)

    def small_folder(self, t: Txn, key: str) -> list[str] | None:
        """Every name of folder ``key`` when its first scans (one batch of each space) hold
        them all, else None: read with nothing more than those scans, which
        :meth:`announce_folder` sends with the transaction's next reads."""
        try:
            return [name for name, _, _ in self._merged_children(_FirstScans(t), key, None)]
        except _MoreThanABatch:
            return None

    def _marks(self) -> tuple[str, ...]:
        """The side records read with each child's node: attributes, link-group pointers
        and, on a mount that keeps them (:mod:`zarrfs.fs.knownfolders`), extended attributes."""
        return (ATTR, POINTER, XATTR) if self.lookups.known is not None else (ATTR, POINTER)

    def _window_nodes(
        self,
        t: Txn,
        prefix: str,
        children: list[tuple[str, int]],
        sizes: dict[str, int] | None,
        into: dict[str, Node],
        xattrs: list | None,
        ranges: _Ranges | None = None,
    ) -> None:
        """The nodes of ``children`` (name, kind) into ``into``, a batch of reads a
        :data:`FOLDER_BATCH` of them; ``sizes``: those a scan saw; ``ranges``: side records
        the transaction read already."""
        for start in range(0, len(children), FOLDER_BATCH):
            part = children[start : start + FOLDER_BATCH]
            known = sizes is not None and all(k != FILE or n in sizes for n, k in part)
            self._read_nodes(t, prefix, part, sizes if known else None, into, xattrs, ranges)

    def _read_xattrs(self, xattrs: list | None) -> None:
        """Tell the known folders the extended-attribute records a transaction read."""
        known = self.lookups.known
        if known is not None and xattrs:
            for child, raw in xattrs:
                known.read_xattrs(child, raw)

    def _merged_children(
        self, t: Txn, key: str, after: str | None, sizes: dict[str, int] | None = None, sized: bool = False
    ) -> Iterator[tuple[str, int, str]]:
        prefix = key + "/" if key else ""
        data = _names(t, prefix, after, DATA, sizes, self.lookups.log_hidden, sized)
        side = _names(t, ENTRY + prefix, after, SIDE)
        return _merged(data, side)

    def folder_nodes(self, key: str, limit: int) -> dict[str, Node] | None:
        """Every child of folder ``key`` by name, read in one transaction (sizes and
        attributes in batches of reads); None when there are more than ``limit``. A missing
        folder has no children."""
        nodes, last = self.folder_page(key, None, limit)
        return nodes if last is None else None

    def folder_page(
        self, key: str, after: str | None, limit: int, whole: bool = False
    ) -> tuple[dict[str, Node], str | None]:
        """Up to ``limit`` children of folder ``key`` by name, those after the name ``after``
        (None: from the first), read in one transaction (sizes and attributes in batches of
        reads); and the last name read when the folder has more children after it (None: read
        to its end). A missing folder has no children. ``whole``: no nodes at all when the
        folder has more (only its names were scanned)."""

        xattrs: list | None = None
        remote = self.driver.remote
        marks = self._marks() if remote else ()
        span = min(SIDE_RANGE, 2 * limit)

        def run(t: Txn) -> tuple[dict[str, Node], str | None]:
            nonlocal xattrs
            xattrs = [] if self.lookups.known is not None else None
            prefix = key + "/" if key else ""
            # On a remote database sizes come with the first scan and side records as ranges
            # beside it: a page of a folder of files is one round trip (see list_dir).
            _announce(t, prefix, after, remote)
            _Ranges.announce(t, prefix, after, marks, span)
            children: list[tuple[str, int]] = []
            more = None
            sizes: dict[str, int] = {}
            for name, kind, _ in self._merged_children(t, key, after, sizes, remote):
                if len(children) == limit:
                    more = children[-1][0]
                    break
                children.append((name, kind))
            nodes: dict[str, Node] = {}
            if whole and more is not None:
                return nodes, more
            ranges = _Ranges.read(t, prefix, after, marks, span) if marks and children else None
            self._window_nodes(t, prefix, children, sizes, nodes, xattrs, ranges)
            return nodes, more

        nodes, last = self.driver.transact(run, write=False)
        self._read_xattrs(xattrs)
        known = self.lookups.known
        if known is not None and after is None and last is None:
            known.listed(key, nodes)
        return nodes, last

    def _read_nodes(
        self,
        t: Txn,
        prefix: str,
        part: list,
        sizes: dict | None,
        into: dict,
        xattrs: list | None = None,
        ranges: _Ranges | None = None,
    ) -> None:
        """The nodes of ``part`` (name, kind) into ``into``: sizes, link targets, attributes
        and whether each has extended attributes (``Node.no_xattrs``: ``ls -l`` asks for each
        name's next) in one batch of reads (the side records by range reads where those cost
        less, see :meth:`_side_ranges`, or from ``ranges`` where those tell); with ``xattrs``,
        each name's extended-attribute record, ``(key, raw)``, put there (a mount that keeps
        them)."""
        if ranges is None:
            ranges = self._side_ranges(t, prefix, part)
        # A mark whose range holds every record of the part is read from that range's dict
        # (a listing of a zarr client's chunks: three empty ones, no call a name for them).
        whole = {} if not ranges else {m: ranges.records[m] for m in ranges.records if ranges.upto[m] is None}
        marks = [m for m in (ATTR, POINTER, XATTR) if m not in whole]
        requests: list[Read] = []
        for name, kind in part:
            child = prefix + name
            if kind == FILE and sizes is None:
                requests.append(Size(child, DATA))
            elif kind not in (FILE, DIR):  # a symlink's target, a device's number
                requests.append(Get(entry_key(child), SIDE))
            for mark in marks:
                if not (mark == POINTER and kind == DIR) and not (ranges and ranges.covers(mark, child)):
                    requests.append(Get(mark + child, SIDE))
        # Apart: each name's node agrees with itself, not with its neighbours' (a readdir is
        # atomic with nothing); a server without a read snapshot watches none of them.
        answers = iter(t.read_many(requests, apart=True) if requests else ())

        def record(mark: str, child: str, kind: int) -> Any:
            if mark == POINTER and kind == DIR:
                return None
            if ranges and ranges.covers(mark, child):
                return ranges.get(mark, child)
            return next(answers)

        attrs_of, pointer_of, xattr_of = whole.get(ATTR), whole.get(POINTER), whole.get(XATTR)
        lookups = self.lookups
        node_from, remember = lookups.node_from, lookups.remember
        children = [prefix + name for name, _ in part]
        # Where the window's records came whole and its sizes with the scan, a file or folder
        # with a plain attribute record, no link group and a name of its own is made here
        # (what node_from makes of it), in one loop; the others take node_from's road.
        whole_records = attrs_of is not None and pointer_of is not None
        if whole_records and sizes is not None and not lookups.hooks.transforms:
            raws = [attrs_of.get(child) for child in children]
            plain = Attrs.unpack_plain(raws)
            if None in raws:
                # A file or folder with no attribute record at all (a key written by another
                # program: every chunk of a database zarr-python wrote) has the mount's
                # default attributes, each its own copy (attributes are changed in place).
                defaults = {FILE: lookups.default_attrs(FILE), DIR: lookups.default_attrs(DIR)}
                for i, raw in enumerate(raws):
                    if raw is None and (a := defaults.get(part[i][1])) is not None:
                        plain[i] = Attrs(a.mode, a.uid, a.gid, a.atime, a.mtime, a.ctime)
        else:
            plain = [None] * len(part)
        files: list[tuple[str, Node]] = []
        # Bound once, and each Node made with positional arguments: a call a name with
        # keywords, or a method looked up a name, costs a compiled loop a dict or a bound
        # method each time.
        xattr_get = xattr_of.get if xattr_of is not None else None
        size_get = sizes.get if sizes is not None else None
        add_file = files.append

        for (name, kind), child, attrs in zip(part, children, plain, strict=True):
            if (
                attrs is not None
                and attrs.mode & 0o170000 == kind
                and (kind == DIR or (kind == FILE and child not in pointer_of))
            ):
                xattr = xattr_get(child) if xattr_get is not None else record(XATTR, child, kind)
                if kind == DIR:
                    node = into[name] = Node(DIR, 0, attrs, "", 1, "", 0, (), xattr is None)
                else:
                    size = size_get(name)
                    if size is None:  # gone between the listing and the read
                        continue
                    node = into[name] = Node(FILE, size, attrs, "", 1, "", 0, (), xattr is None)
                    add_file((child, node))
                if xattrs is not None:
                    xattrs.append((child, xattr))
                continue
            size, target = 0, ""
            if kind == FILE:
                size = next(answers) if sizes is None else sizes.get(name)
            elif kind == LINK:
                mark = next(answers)
                if mark is None:
                    size = None  # gone between the listing and the read
                else:
                    target = bytes(mark[1:]).decode("utf-8", "surrogateescape")
                    size = len(target.encode("utf-8", "surrogateescape"))
            elif kind != DIR:  # a special file: _node_from takes its device number as size
                mark = next(answers)
                size = None if mark is None else read_special(mark)[1]
            raw = attrs_of.get(child) if attrs_of is not None else record(ATTR, child, kind)
            if kind == DIR:
                pointer = None
            else:
                pointer = pointer_of.get(child) if pointer_of is not None else record(POINTER, child, kind)
            xattr = xattr_of.get(child) if xattr_of is not None else record(XATTR, child, kind)
            if size is None:  # gone between the listing and the read
                continue
            node = node_from(t, child, kind, size, target, raw, pointer)
            if pointer is not None and node.nlink == 1 and kind != DIR:
                # Its link group does not list it: the name may have left the group after the
                # scan that listed it (a read not checked against later changes, on a server
                # without snapshots); probed again, with its group, in the reads checked.
                node = lookups.find_in(t, child)
                if node is None:  # gone since the listing
                    continue
            if xattrs is not None:
                xattrs.append((child, xattr))
            into[name] = node
            node.no_xattrs = xattr is None
            if kind == FILE:  # an open after the listing reads the content with its probe
                remember(child, node)
        lookups.remember_files(files)

    def _side_ranges(self, t: Txn, prefix: str, part: list) -> _Ranges | None:
        """The attribute, link-group pointer and extended-attribute records of ``part``'s
        names, by key, read as three ranges of the side space: on SQLite a batch of point
        reads is one statement whose every sub-query seeks the index, on LMDB two lookups a
        name, while a range is one seek and then a step per row (none at all for names
        without side records, as a zarr client's chunks). None where point reads cost less
        (a remote database, whose batch is one round trip; a small part) or when the ranges
        hold too many other records (a subfolder's descendants): each name is then read
        alone."""
        if self.driver.remote or len(part) < RANGED_FROM:
            return None
        names = [prefix + name for name, _ in part]
        first, last = min(names), max(names)
        most = 2 * len(part)
        found = _Ranges()
        for mark in (ATTR, POINTER, XATTR):
            rows = t.scan(mark + first, mark + last + "\0", space=SIDE, fetch=VALUES, limit=most + 1)
            cut = len(mark)
            # Records of the range not of the part's names (a subfolder's descendants, between
            # two names in key order) are kept too: nothing asks for them.
            records = {key[cut:]: value for key, value in rows}
            if len(records) > most:
                return None
            found.records[mark], found.upto[mark] = records, None
        return found


class _MoreThanABatch(Exception):
    """A folder read by :class:`_FirstScans` has more than its first batches."""


class _FirstScans:
    """A transaction that answers one scan of each space (a listing's first batches, sent
    ahead) and refuses any more (:class:`_MoreThanABatch`): a folder read through it costs
    no round trip of its own."""

    def __init__(self, t: Txn) -> None:
        self._t = t
        self._scanned: set[str] = set()

    def scan(self, start: str, stop: str | None = None, *, space: str = DATA, **kwargs: Any):
        if space in self._scanned:
            raise _MoreThanABatch
        self._scanned.add(space)
        return self._t.scan(start, stop, space=space, **kwargs)

    def scan_prefix(self, prefix: str, **kwargs: Any):
        raise _MoreThanABatch


class Held(Protocol):
    """The nodes a READDIRPLUS caller holds already (the session's node table): a listing
    reads no node of theirs, and gives them without one."""

    def holds(self, key: str, kind: int) -> bool:
        """Whether the caller holds the node of ``key`` as one of type ``kind``."""
        ...

    def holds_none(self, keys: list[str]) -> bool:
        """Whether the caller holds no node of any of ``keys`` (a folder's first listing):
        then none is asked :meth:`holds` of."""
        ...

    @property
    def added(self) -> int:
        """A count that grows each time the caller comes to hold a node of a name (every
        way): names it held none of are still not held while the count is the same, and a
        window's names found none held when read need not be asked of again at its reply."""
        ...


def _not_held(
    key: str, children: list[tuple[str, int]], held: Held | None
) -> tuple[list[tuple[str, int]], int | None]:
    """Those ``(name, kind)`` children of folder ``key`` whose nodes are not ``held``, and
    :attr:`Held.added` from before ``held`` was found to hold none of them (None: it holds
    some, or there is no ``held``)."""
    if held is None:
        return children, None
    prefix = key + "/" if key else ""
    keys = [prefix + n for n, _ in children]
    added = held.added  # before the ask: a name given a node after it counts
    if held.holds_none(keys):
        return children, added
    holds = held.holds
    return [child for child, k in zip(children, keys, strict=True) if not holds(k, child[1])], None


#: A window of a listing as read: its entries, their nodes (READDIRPLUS) and the sizes its scan
#: saw, the batch it was read with, :attr:`Listings.generation` before the read, and
#: :attr:`Held.added` from before its names were found none held (None: some were). (Only
#: READDIRPLUS reads windows ahead, after it set ``plus``: they all have nodes.)
_Window = namedtuple("_Window", "got nodes sizes batch generation none_held")


class DirListing:
    """The entries of one open folder, with offsets: ``.`` is 1, ``..`` is 2, then 3, 4, ...

    The kernel reads a folder in several calls, each resuming at the offset of the last entry
    it kept. A listing holds one window of entries fetched from the tree and a resume token;
    a rewind (``rewinddir``, ``seekdir`` backwards) starts over. Files created through the
    mount and not stored yet (``extra``: their names, or what gives them now) are listed after
    the stored entries, except those the stored entries already named (a file stored while the
    folder was being read). They are asked for before each window is read, not once at the
    open: a file made between the open and the first read is listed (the kernel keeps the
    listing it reads, labelled as read after that file was made), and one stored between two
    windows, which neither window's read may have found, is listed from the ask before. An
    unstored name first seen once the windows up to it were read (not past the resume token)
    did not exist throughout the listing (it was made, or made again, meanwhile) and is left
    out: the window that covered it may have listed it already."""

    def __init__(
        self, listings: Listings, key: str, extra: list[str] | Callable[[], list[str]] | None = None
    ) -> None:
        self.listings = listings
        self.key = key
        if callable(extra):
            self._unstored = extra
        else:
            names = list(extra or ())
            self._unstored = lambda: names
        #: Whether each window's nodes are read with its names (READDIRPLUS asks for them).
        self.plus = False
        #: The names whose nodes the caller holds already; not read.
        self.held: Held | None = None
        self._reading = False  # a request's read of a window is under way (see read_ahead)
        self._reset()

    def _reset(self) -> None:
        self.window: list[tuple[str, int, str]] = []
        self.nodes: dict[str, Node] | None = None  # the window's nodes, once asked for
        self.nodes_read = -1  # Listings.generation before they were read
        self.nodes_checked = -1  # ... and before the names this mount wrote were read again
        #: :attr:`Held.added` from before the window's names were found none held as its
        #: nodes were read (None: some were, or not asked): :meth:`none_held`.
        self.none_since: int | None = None
        self.sizes: dict[str, int] | None = None  # the window's sizes its scan saw
        self.window_start = 0
        self.token: str | None = None
        self.stored_done = False
        self.exhausted = False
        self.batch = FIRST_BATCH
        self._extra_names: set[str] = set()  # unstored names, asked before each window
        self._listed: set[str] = set()  # unstored names the stored entries named
        self._ahead: list[_Window] = []  # the windows after this one, read ahead (read_ahead)

    def _fetch(self) -> bool:
        if self.exhausted:
            return False
        if self.stored_done:
            self.exhausted = True
            rest = [(name, FILE, name) for name in sorted(self._extra_names - self._listed)]
            if not rest:  # the last window stays: a kernel re-reading its end needs no rewind
                return False
            self.window_start += len(self.window)
            self.window = rest
            self.nodes, self.sizes, self.none_since = None, None, None
            return True
        ahead = self._ahead
        if ahead and ahead[0].generation == self.listings.generation:
            read = ahead.pop(0)  # read ahead, and nothing changed since
            self.listings.taken += 1
        else:
            ahead.clear()
            self._reading = True
            try:
                read = self._read(self.token, self.batch)
            finally:
                self._reading = False
        got = read.got
        if len(got) < read.batch:
            self.stored_done = True
        if not got:
            return self._fetch()
        self.window_start += len(self.window)
        self.window = got
        self.nodes, self.sizes, self.nodes_read = read.nodes, read.sizes, read.generation
        self.nodes_checked = read.generation
        self.none_since = read.none_held
        self.token = got[-1][2]
        if self._extra_names:
            self._listed.update(name for name, _, _ in got if name in self._extra_names)
        self.batch = min(read.batch * 4, MAX_BATCH)
        return True

    def _read(self, after: str | None, batch: int) -> _Window:
        """The window of up to ``batch`` entries after the token ``after``, read now."""
        # Before the read: a file stored after this ask is in what the read finds.
        self._extra_names.update(n for n in self._unstored() if after is None or n > after)
        sizes: dict[str, int] = {}
        nodes: dict[str, Node] | None = {} if self.plus else None
        generation = self.listings.generation
        none_held: list[int] = []
        got = self.listings.list_dir(
            self.key, after=after, limit=batch, sizes=sizes, nodes=nodes, held=self.held, none_held=none_held
        )
        return _Window(got, nodes, sizes, batch, generation, none_held[0] if none_held else None)

    def read_ahead(self, offset: int, count: int) -> bool:
        """Read the next window of entries (and their nodes, for READDIRPLUS) when fewer than
        ``count`` are held past ``offset``, the last one given: what a program walking the
        folder asks for next, read while the kernel takes in the last reply (its CPU and this
        one's overlap; docs/performance.md, "A listing read ahead"). Whether more may be worth
        reading; a window taken is read again when :meth:`Listings.changed` was told of a
        change since. With request threads a request of this listing may run while this read
        waits on the server, and this one while a request's read waits: a window read is kept
        only where it still follows the last one held, and none is read beside a request's."""
        if self.exhausted or self.stored_done or offset < 2 or self._reading:
            return False
        ahead = self._ahead
        if ahead and ahead[0].generation != self.listings.generation:
            ahead.clear()  # the later ones were read after it, the first is the oldest
        kept = self.window_start + len(self.window) - (offset - 2)
        after, batch = self.token, self.batch
        for read in ahead:
            if len(read.got) < read.batch:
                return False  # the folder's end is read
            kept += len(read.got)
            after, batch = read.got[-1][2], min(read.batch * 4, MAX_BATCH)
        if kept >= count:
            return False
        read = self._read(after, batch)
        last = ahead[-1].got[-1][2] if ahead else self.token
        if self._reading or ahead is not self._ahead or after != last:
            return False  # a request read or rewound the listing meanwhile
        ahead.append(read)
        self.listings.read_ahead += 1
        return len(read.got) == batch and kept + len(read.got) < count

    def node(self, name: str) -> Node | None:
        """The node of ``name``, an entry of the window :meth:`rows` took it from (None when it
        is gone); the window's nodes are read at the first ask, in one transaction, so a
        listing holds a window of nodes at most, whatever the size of the folder."""
        return self.window_nodes().get(name)

    def window_nodes(self) -> dict[str, Node]:
        """The nodes of the window's entries by name (see :meth:`node`). Those read before
        another writer's change told since (:meth:`Listings.told`) are read again, and names
        this mount changed since (:meth:`Listings.wrote`) looked up again; a name the kernel
        holds is not read (the reply gives it without attributes)."""
        listings = self.listings
        if self.nodes is not None:
            if listings.told_since(self.key, self.nodes_read):
                self.nodes = self.sizes = None  # read before another writer's change told since
            elif listings.last_write > self.nodes_checked:
                self._read_written()
        if self.nodes is None:
            window = [(n, kind) for n, kind, _ in self.window]
            children, self.none_since = _not_held(self.key, window, self.held)
            self.nodes_read = self.nodes_checked = listings.generation
            self.nodes = listings.nodes_of(self.key, children, self.sizes) if children else {}
        return self.nodes

    def _read_written(self) -> None:
        """Look up again the window's names this mount changed since their nodes were read."""
        listings, nodes = self.listings, self.nodes
        assert nodes is not None
        names = listings.written(self.key, self.nodes_checked)
        if names is None:
            self.nodes = self.sizes = None
            return
        self.nodes_checked = listings.generation
        if not names:
            return
        changed = []
        for name, kind, _ in self.window:
            if name in names:
                nodes.pop(name, None)  # gone, or held by the kernel: given without attributes
                changed.append((name, kind))
        if changed:
            self.sizes = None  # (as the scan saw them: a name missing there counts as gone)
        children = _not_held(self.key, changed, self.held)[0]
        if children:
            nodes.update(listings.found(self.key, [name for name, _ in children]))

    def none_held(self, held: Held) -> bool:
        """Whether ``held`` holds no node of the window's names, known without asking it: it
        held none when their nodes were read, and has come to hold no name's node since."""
        return self.none_since is not None and self.none_since == held.added

    def rows(self, offset: int, most: int) -> list[tuple[str, int, int]]:
        """``(name, kind, offset)`` of up to ``most`` entries after ``offset``, all from one
        window (the one holding the first; a next call goes on from the last offset): a
        request's entries in one list, not a step of a generator each. Empty at the end."""
        if offset < 2:
            return [(".", DIR, 1), ("..", DIR, 2)][max(0, offset) : max(0, offset) + most]
        i = self._at(offset)
        if i < 0:
            return []
        first = self.window_start + 3  # the offset of the window's first entry
        return [(name, kind, first + j) for j, (name, kind, _) in enumerate(self.window[i : i + most], i)]

    def plus_rows(
        self, offset: int, most: int, shown: Callable[[str, Node], Node | None]
    ) -> list[tuple[str, int, int, str, Node | None]]:
        """:meth:`rows` with each entry's key and its node as the window holds it (None for a
        name gone since it was listed; ``.`` and ``..`` with neither), a folder's node as
        ``shown`` gives it: a READDIRPLUS reply's entries in one loop here, before the
        caller's checks of what the kernel holds and of open files."""
        if offset < 2:
            return [(name, kind, at, "", None) for name, kind, at in self.rows(offset, most)]
        i = self._at(offset)
        if i < 0:
            return []
        first = self.window_start + 3
        get = self.window_nodes().get
        prefix = self.key + "/" if self.key else ""
        out = []
        append = out.append
        for j, (name, kind, _) in enumerate(self.window[i : i + most], i):
            key = prefix + name
            node = get(name)
            if node is not None and node.kind == DIR:
                node = shown(key, node)
            append((name, kind, first + j, key, node))
        return out

    def _at(self, offset: int) -> int:
        """Where the entry after ``offset`` (2 or more) is in the window, which is fetched
        until it holds it (a rewind starts over); -1 past the listing's end."""
        want = offset - 2
        if want < self.window_start:
            self._reset()
        while True:
            i = want - self.window_start
            if i < len(self.window):
                return i
            if not self._fetch():
                return -1

    def entries(self, offset: int) -> Iterator[tuple[str, int, int]]:
        """Yield ``(name, kind, offset)`` for every entry after ``offset``, a slice of
        :meth:`rows` at a time (a READDIR reply takes a hundred or so, not a window)."""
        while rows := self.rows(offset, FIRST_BATCH):
            yield from rows
            offset = rows[-1][2]
