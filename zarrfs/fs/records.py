"""How a file's content is written into the database, for the mount and for ``zarrfs.store``
alike: its value under every name of its link group (``hardlinks``: the pointer ``h:<key>``
names the group), with one attribute record (``a:<name>``, ``sidedata.Attrs``) per name, kept
in step. Writing through one place keeps the names of a group one file whoever writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zarrfs.backends.base import SIDE, Txn
from zarrfs.fs import hardlinks
from zarrfs.fs.hardlinks import pointer_key
from zarrfs.fs.sidedata import attr_key

#: ``store(t, name, value)``: the bytes to store for ``value`` at ``name`` (the format layer's
#: hook; it may refuse).
Store = Callable[[Txn, str, Any], Any]


def names_of(t: Txn, key: str, pointer: bytes | None = None, *, read_pointer: bool = False) -> list[str]:
    """The names the content of the file at ``key`` is stored under: every name of its link
    group, or ``key`` alone. ``pointer`` is its raw pointer record, read by the caller in its
    own batch, or read here when ``read_pointer``."""
    if read_pointer:
        pointer = t.get(pointer_key(key), SIDE)
    group = hardlinks.load(t, key, pointer)
    return group.names if group is not None else [key]


def write_file(
    t: Txn, names: list[str], value: Any, record: bytes | None, store: Store
) -> list[tuple[str, Any]]:
    """Put ``value`` (as ``store`` makes it) under each of ``names``, with the attribute
    ``record`` (None: the records stay as they are); returns ``(name, stored)`` pairs."""
    out = []
    for name in names:
        stored = store(t, name, value)
        t.put(name, stored)
        if record is not None:
            t.put(attr_key(name), record, SIDE)
        out.append((name, stored))
    return out
