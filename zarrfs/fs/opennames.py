"""What namespace changes do to open files: a rename or link settles their pending content
first, open descriptors follow a rename, an unlinked file stays readable (and ``fstat``-able)
through its descriptors, and attribute changes reach a file not stored yet.

:class:`OpenNames` does it for the namespace calls of :class:`zarrfs.fs.api.Operations`, over
the table of open files of its :class:`zarrfs.fs.handles.HandleTable`.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from typing import Any

from zarrfs.fs import acl
from zarrfs.fs.errors import FsError
from zarrfs.fs.openfiles import FileState, OpenFiles
from zarrfs.fs.pagecache import Stored
from zarrfs.fs.sidedata import Attrs
from zarrfs.fs.tree import Tree

# Values larger than this are read by range instead of being held whole by an open handle.
SNAPSHOT_LIMIT = 64 << 20


class OpenNames:
    """Open files across namespace changes: ``files`` is the table of open files, ``tree`` the
    filesystem, ``commit(state)`` stores a file's pending content."""

    def __init__(self, files: OpenFiles, tree: Tree, commit: Callable[[FileState], Stored | None]) -> None:
        self.files = files
        self.states = files.states
        self.deferred = files.deferred
        self.tree = tree
        self.commit = commit

    def settle(self, key: str, below: bool = True) -> None:
        """Commit pending content under ``key`` (the file, or with ``below`` anything in the
        folder) before a rename or link moves it or its record changes; a held temporary file
        stored so is held no more."""
        if not below and key not in self.states:
            return
        for k, state in list(self.states.items()):
            if k == key or k.startswith(key + "/"):
                self.commit(state)
                if self.deferred.get(k) is state and not state.handles:
                    self.files.forget(state)

    def before_rename(self, src: str, dst: str, exchange: bool, unstored_below: bool) -> None:
        """A rename of ``src`` to ``dst`` is about to be done: what is open under ``src`` is
        stored first, and under ``dst`` too for an exchange or when a file made here and not
        stored yet is in it (``unstored_below``: a folder holding one is not empty); an open
        file the rename replaces at ``dst`` keeps what it holds."""
        self.settle(src)
        if exchange or unstored_below:
            self.settle(dst)
        if not exchange:
            self.replacing(dst)

    def access_acl_set(self, key: str, value: bytes) -> None:
        """The access ACL ``value`` was stored for ``key``: the record a file open there
        commits with takes the permission bits it sets (:mod:`zarrfs.fs.acl`)."""
        state = self.states.get(key)
        if state is not None and state.attrs is not None:
            self.set_attrs(key, mode=(state.attrs.mode & ~0o777) | acl.mode_bits(acl.parse(value)))

    def linked(self, src: str, dst: str) -> None:
        """``dst`` is a hard link of ``src``: a file open under ``src`` is open under both."""
        if src in self.states:
            self.states[dst] = self.states[src]
            self.states[dst].linked = True

    def _keep(self, state: Any, key: str) -> None:
        """The open file ``state`` is about to lose its name ``key`` (unlinked, or replaced by
        a rename): keep what its descriptors read, the value and the attributes."""
        if state.attrs is None:
            state.attrs = self.tree.lookup_attrs(key)
        if state.buffer is None and state.snapshot is None and not state.created:
            try:
                if self.tree.stored_size(key) <= SNAPSHOT_LIMIT:
                    version = state.version
                    state.snapshot = (
                        self.tree.read_value(key) if version is None else self.tree.read_version(key, version)
                    )
            except FsError:
                pass  # already gone

    def replacing(self, key: str) -> None:
        """A rename is about to replace ``key``: a file open there keeps what it holds (unless
        it lives on under another name, a hard link)."""
        state = self.states.get(key)
        if state is not None and not (state.linked and len(self.files.names_of(state)) > 1):
            self._keep(state, key)

    def seen_at(self, key: str) -> tuple[int, int] | None:
        """The version (size, mtime) of the file open under ``key`` as this mount last knew it
        stored (its last commit here, else what its descriptors read); None when none is."""
        state = self.states.get(key)
        if state is None:
            return None
        return state.version if state.stored is None else (state.stored.size, state.stored.mtime)

    def left_elsewhere(self, key: str) -> None:
        """Another mount took the name ``key`` from a file with hard links (an unlink, a rename
        onto it): a file open here under it and other names lives on under those (its
        commits go there). One open under that name alone is left as it is."""
        state = self.states.get(key)
        if state is not None and state.linked and len(self.files.names_of(state)) > 1:
            self.files.drop_name(key)

    def set_open_attrs(self, fh: int, changes: dict[str, int | None]) -> str | None:
        """Apply mode/owner/times to the file open as ``fh`` when its name is gone (its
        descriptors see them; nothing is stored): None; else its name, to change it by."""
        state = self.files.handle(fh).state
        if not state.orphan:
            return state.key
        if state.attrs is None:
            state.attrs = self.tree.default_attrs(stat.S_IFREG)
        self._apply(state.attrs, changes)
        return None

    def set_attrs(self, key: str, **changes: int | None) -> bool:
        """Apply mode/owner/times to a file not yet stored; False when the key has no such file
        (the tree then changes the stored attributes)."""
        state = self.states.get(key)
        if state is None or not state.created:
            if state is not None and state.attrs is not None:
                self._apply(state.attrs, changes)  # keep the pending record in step
            return False
        assert state.attrs is not None
        self._apply(state.attrs, changes)
        return True

    @staticmethod
    def _apply(attrs: Attrs, changes: dict[str, int | None]) -> None:
        mode = changes.get("mode")
        if mode is not None:
            attrs.mode = stat.S_IFMT(attrs.mode) | stat.S_IMODE(mode)
        for name in ("uid", "gid"):
            value = changes.get(name)
            if value is not None and value != -1:
                setattr(attrs, name, value)
        for name in ("atime", "mtime"):
            value = changes.get(name)
            if value is not None:
                setattr(attrs, name, value)
        attrs.ctime = time.time_ns()

    def unlinked(self, key: str) -> bool:
        """Detach open state from a removed key; True when the file existed only here.
        Descriptors still open go on reading what the file held."""
        state = self.states.get(key)
        if state is None:
            return False
        if state.linked and len(self.files.names_of(state)) > 1:
            self.files.drop_name(key)  # the file lives on under its other names
            return False
        self._keep(state, key)
        del self.states[key]
        state.orphan = True
        if self.deferred.pop(key, None) is not None and not state.handles:
            self.files.forget(state)
        return state.created

    def renamed(self, src: str, dst: str, exchange: bool = False) -> None:
        """Open files follow a rename (of the file or of a folder holding it); with
        ``exchange`` (RENAME_EXCHANGE) those under ``dst`` move to ``src`` as well, else an
        open file replaced at ``dst`` is orphaned."""
        moves = [(src, dst), (dst, src)] if exchange else [(src, dst)]
        # An older version's descriptors reading through the kernel's page cache (a newer one
        # open past it holds the name in ``states``) follow their file as well: left under the
        # old name, the file now there would be shown at their version's size.
        paged = self.files.paged
        moved = [m for a, b in moves for m in _taken_under(self.states, a, b)]
        moved_paged = [m for a, b in moves for m in _taken_under(paged, a, b)]
        if not exchange:
            self.files.drop_name(dst)
            _taken_under(paged, dst, dst)  # the replaced file's: its descriptors read it, nameless now
        for table, pairs in ((self.states, moved), (paged, moved_paged)):
            for new_key, state in pairs:
                state.key = new_key  # what its descriptors hold stays theirs: the content moved too
                table[new_key] = state


def _taken_under(table: dict[str, FileState], a: str, b: str) -> list[tuple[str, FileState]]:
    """The entries of ``table`` at ``a`` or below it, taken out, with their keys moved to ``b``."""
    under = [(k, s) for k, s in table.items() if k == a or k.startswith(a + "/")]
    for k, _ in under:
        del table[k]
    return [(b + k[len(a) :], s) for k, s in under]
