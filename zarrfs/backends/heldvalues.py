"""Values read in place: what an open file's descriptors read, without a copy where the driver
can give one (LMDB: a read transaction kept open, whose pages LMDB does not reuse meanwhile).

An open takes the file's content with it (its descriptors read that version whoever replaces
the file, see ``zarrfs.fs.handles``). Copied out of LMDB's memory map, that copy was a large
part of the daemon's work in a fresh mount's read (docs/performance.md); a view of the map
costs nothing, but is valid only while its transaction is open. A driver that can hold such
transactions declares a ``holder`` (``Driver.holder``, a ``Holding``: ``lmdb.holder.Holder``),
which bounds how many it holds and for how long and copies a value out when it lets its
transaction go. A driver that holds a transaction but gives no view (SQLite: ``sqlite.holder``)
holds a :class:`Deferred` value instead, read at its first use: an open whose pages the kernel
holds then reads no content unless the kernel lets them go and asks. Other drivers' values are
copies already (a database client's bytes) and are simply kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .base import Driver, Txn

T = TypeVar("T")

#: ``view(key)``: the value of ``key`` as :func:`hold` keeps it (a view, or bytes).
View = Callable[[str], Any]


class Deferred:
    """A value held by a transaction and not read yet: its :attr:`size`, and :meth:`read`,
    which reads it (once; later calls return the same bytes)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        raise NotImplementedError


class Held:
    """A value kept for as long as descriptors read it: :attr:`data` is a view of the
    database's pages while a transaction holds them, else bytes (a driver without views, or
    once :meth:`let_go` copied it); a :class:`Deferred` value is read at the first look at
    :attr:`data`."""

    __slots__ = ("_value", "_end")

    def __init__(self, data: Any, end: Callable[[Held], None] | None = None) -> None:
        self._value = data
        self._end = end

    @property
    def data(self) -> Any:
        """The value (read now if it was deferred)."""
        value = self._value
        if value.__class__ is not bytes and isinstance(value, Deferred):
            value = self._value = value.read()
        return value

    @property
    def size(self) -> int:
        """The value's length, without reading a deferred value."""
        return len(self._value)

    @property
    def held(self) -> bool:
        """Whether a transaction still holds the value's pages."""
        return self._end is not None

    def let_go(self) -> None:
        """Keep a copy and end the transaction (the driver's bound on holding one)."""
        if self._end is not None:
            self._value = bytes(self.data)
            self._finish()

    def release(self) -> None:
        """Nobody reads the value any more: end the transaction, keep nothing."""
        if self._end is not None:
            self._value = b""  # the view goes before its transaction does
            self._finish()

    def _finish(self) -> None:
        end, self._end = self._end, None
        assert end is not None
        end(self)


def hold(
    driver: Driver, fn: Callable[[Txn, View], tuple[T, Any]], begin: bool = False
) -> tuple[T, Held | None]:
    """Run ``fn(txn, view)`` in a read transaction; it returns ``(result, value)`` with
    ``value`` from ``view(key)`` (or None). Returns ``result`` and the value as a
    :class:`Held` (None for None): in place where the driver can hold it, else a copy.
    ``begin``: a value will most likely be read (``Holding.hold``)."""
    if driver.holder is not None:
        return driver.holder.hold(fn, begin)
    return copied(driver, fn)


def copied(driver: Driver, fn: Callable[[Txn, View], tuple[T, Any]]) -> tuple[T, Held | None]:
    """:func:`hold` by copies: ``fn`` in the driver's retrying read transaction (a holder's
    way when it cannot hold one)."""
    result, value = driver.transact(lambda t: fn(t, t.get), write=False)
    return result, None if value is None else Held(value)


__all__ = ["Deferred", "Held", "View", "copied", "hold"]
