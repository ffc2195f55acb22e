"""What a mount following a change feed on a database server knows of folders without asking
again: a folder's names, its attribute record, the nodes this mount just made or opened and
each node's extended attributes; the feed keeps them true (docs/architecture.md, "Design notes by module")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from zarrfs.backends.base import DATA, SIDE, Space
from zarrfs.fs.node import Node
from zarrfs.fs.sidedata import ATTR, ENTRY, NAMED, XATTR

ENTRIES = 1 << 16  # names held in every folder's set together (the oldest folder goes first)
RECORDS = 4096  # attribute records of folders held (the table is emptied when full)
XATTR_RECORDS = 1 << 16  # extended-attribute records held (the oldest goes first)
LARGE = 4096  # folders remembered as too large to read with a lookup (the set is emptied when full)
NODES = 4096  # nodes held (the table is emptied when full)


class KnownFolders:
    """Folders' names and attribute records, and nodes just made (docs/architecture.md)."""

    def __init__(self, entries: int = ENTRIES, xattr_records: int = XATTR_RECORDS) -> None:
        self.entries = entries
        self.xattr_records = xattr_records
        # Ordered dicts: the oldest goes first in O(1); a dict's first key after many deletions
        # from its front costs a scan over their holes (a listing of 10^6 names spent most of
        # its time there).
        self.names: OrderedDict[str, set[str]] = OrderedDict()  # folder -> a superset of its names
        self.records: dict[str, bytes | None] = {}  # folder -> its raw attribute record
        # key -> the node this mount's last write made there, or an open read since
        self.nodes: dict[str, Node] = {}
        self.xattrs: OrderedDict[str, bytes | None] = OrderedDict()  # key -> its raw x: record
        self.large: set[str] = set()  # folders a lookup found too large to read whole
        self._reading: set[str] = set()  # folders whose names a lookup is reading now
        self.held = 0  # names held in ``names``

    # -- answers ----------------------------------------------------------------------------------
    def missing(self, key: str) -> bool:
        """Whether ``key`` is known to be missing: its folder's names are known, and it is not
        one of them."""
        if not key:
            return False
        folder, _, name = key.rpartition("/")
        names = self.names.get(folder)
        return names is not None and name not in names

    def start_reading(self, folder: str) -> bool:
        """Whether a lookup in ``folder`` that asks the database should read the folder's
        names with it (one batch of its scans, in the same round trip): they are not known,
        no lookup found the folder larger than a batch, and no other lookup is reading them
        now (request threads wait for a server side by side: 16 readers of a new folder read
        its names 16 times, each scan a few hundred microseconds of the server's one thread).
        When it should, the folder counts as being read until :meth:`reading_ended`. A
        program that looks a name up in a folder often creates it next, and the kernel looks
        every new name up first."""
        if folder in self.names or folder in self.large or folder in self._reading:
            return False
        self._reading.add(folder)
        return True

    def reading_ended(self, folder: str) -> None:
        """The lookup :meth:`start_reading` let read ``folder``'s names is done, read or not."""
        self._reading.discard(folder)

    def too_large(self, folder: str) -> None:
        """A lookup found ``folder`` larger than it reads whole."""
        if len(self.large) >= LARGE:
            self.large.clear()
        self.large.add(folder)

    def node(self, key: str) -> Node | None:
        """The node this mount's last write made at ``key``, or an open read there since, if any."""
        return self.nodes.get(key)

    def record(self, folder: str) -> tuple[bool, bytes | None]:
        """``(known, raw)``: the attribute record of ``folder`` when known."""
        if folder in self.records:
            return True, self.records[folder]
        return False, None

    def xattr_record(self, key: str) -> tuple[bool, bytes | None]:
        """``(known, raw)``: the extended-attribute record of ``key`` when known."""
        if key in self.xattrs:
            return True, self.xattrs[key]
        return False, None

    # -- what the mount read ----------------------------------------------------------------------
    def listed(self, folder: str, names: Iterable[str]) -> None:
        """``names`` are every name of ``folder``, read in one transaction."""
        self._set(folder, set(names))

    def read_record(self, folder: str, raw: bytes | None) -> None:
        """``raw`` is the attribute record of ``folder`` as read now."""
        if len(self.records) >= RECORDS:
            self.records.clear()
        self.records[folder] = raw

    def opened(self, key: str, node: Node) -> None:
        """An open read ``node`` at ``key`` just now: the ``fstat`` that follows (a ``GETATTR``,
        the kernel's attributes of the file dropped when it changed) is answered by it. Not a
        file with hard links: another name's change changes its count of names, and the feed
        names only the names that changed."""
        if node.group:
            return
        if len(self.nodes) >= NODES:
            self.nodes.clear()
        self.nodes[key] = node

    def read_xattrs(self, key: str, raw: bytes | None) -> None:
        """``raw`` is the extended-attribute record of ``key`` as read now."""
        table = self.xattrs
        table.pop(key, None)
        if len(table) >= self.xattr_records:
            table.popitem(last=False)
        table[key] = None if raw is None else bytes(raw)

    # -- what the mount wrote ---------------------------------------------------------------------
    def made(self, key: str, node: Node, record: bytes) -> None:
        """This mount made the folder ``key`` (empty; ``node`` and attribute ``record`` as
        stored). Called after :meth:`wrote` of its commit."""
        self._set(key, set())
        self.read_record(key, record)
        self.stored(key, node)

    def stored(self, key: str, node: Node) -> None:
        """This mount's last commit left ``node`` at ``key`` (its attributes changed). Called
        after :meth:`wrote` of that commit."""
        if len(self.nodes) >= NODES:
            self.nodes.clear()
        self.nodes[key] = node

    def wrote(self, writes: Iterable[tuple[Space, str, object]]) -> None:
        """A commit of this mount stored ``writes`` ((space, key, value or None: deleted), as
        the transaction was asked to make them): names it adds join their folders' sets,
        attribute records it writes replace the known ones; the nodes of the names it touches
        (any record of theirs: a link's count of names changes with every name's pointer) and
        of the folders above its keys are forgotten."""
        names, records, nodes = self.names, self.records, self.nodes
        for space, key, value in writes:
            if space == DATA:
                path = key
            elif space == SIDE and key.startswith(ENTRY):
                path = key[len(ENTRY) :]
            else:
                if space == SIDE and key.startswith(ATTR):
                    folder = key[len(ATTR) :]
                    if folder in records:
                        records[folder] = None if value is None else bytes(value)  # type: ignore[arg-type]
                elif space == SIDE and key.startswith(XATTR):
                    # As stored; a record removed is asked for again (the name may be gone).
                    if value is None:
                        self.xattrs.pop(key[len(XATTR) :], None)
                    else:
                        self.read_xattrs(key[len(XATTR) :], value)  # type: ignore[arg-type]
                if nodes and space == SIDE and key[:2] in NAMED:
                    nodes.pop(key[2:], None)
                continue
            if value is None and space == SIDE and path in names:  # a folder's mark removed
                self._drop(path)
            if nodes:
                nodes.pop(path, None)
            # Every folder above the name now holds the name on the way down to it.
            while path:
                folder, _, name = path.rpartition("/")
                held = names.get(folder)
                if held is not None and name not in held:
                    held.add(name)
                    self.held += 1
                if nodes:
                    nodes.pop(folder, None)
                path = folder

    # -- what others changed, and losing track ----------------------------------------------------
    def forget(self, keys: Iterable[str], folders: Iterable[str]) -> None:
        """Another writer changed ``keys`` (paths), in ``folders`` (every folder above them):
        what is known of those is dropped."""
        for key in keys:
            self._drop(key)
            self.records.pop(key, None)
            self.nodes.pop(key, None)
            self.xattrs.pop(key, None)
        for folder in folders:
            self._drop(folder)
            self.records.pop(folder, None)
            self.nodes.pop(folder, None)

    def clear(self) -> None:
        """Forget everything."""
        self.names.clear()
        self.records.clear()
        self.nodes.clear()
        self.xattrs.clear()
        self.large.clear()
        self.held = 0

    def _set(self, folder: str, names: set[str]) -> None:
        self._drop(folder)
        if len(names) > self.entries:
            return
        while self.names and self.held + len(names) > self.entries:
            self._drop(next(iter(self.names)))
        self.names[folder] = names
        self.held += len(names)

    def _drop(self, folder: str) -> None:
        names = self.names.pop(folder, None)
        if names is not None:
            self.held -= len(names)
