"""The tree's write transactions: :class:`Transactions` runs one over the driver (retried by
the driver on conflicts), lets the format layer's hooks see each data key changed, notes the
other keys the hooks rewrote (a consolidated ``.zmetadata``) so the mount can drop the
kernel's caches of them, and frees after the commit the parts of values the change let go
(each part in its own transaction: :mod:`zarrfs.fs.parts`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from zarrfs.backends.base import DATA, Driver, Txn
from zarrfs.fs import parts, records
from zarrfs.fs.errors import FsError
from zarrfs.fs.hooks import Hooks
from zarrfs.fs.manifest import Parted
from zarrfs.fs.node import Node
from zarrfs.fs.sidedata import Attrs


class _Recording:
    """A transaction as the hooks see it: every data key they write is noted, so that the
    kernel's caches of those files can be dropped after the commit."""

    def __init__(self, txn: Txn, into: set[str], defaults: Callable[[int], Attrs]) -> None:
        self._txn = txn
        self._into = into
        self._defaults = defaults  # the attributes of a file without a record

    def put(self, key: str, value: Any, space: str = DATA) -> None:
        self._txn.put(key, value, space)
        if space == DATA:
            self._into.add(key)
            # A document rewritten on the side is a changed file (its record says so).
            records.restamp(self._txn, key, self._defaults)

    def delete(self, key: str, space: str = DATA) -> None:
        if space == DATA:
            self._into.add(key)
        self._txn.delete(key, space)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class _Logged:
    """A write transaction that notes what it is asked to write, ``(space, key, value or
    None)`` in order, for :attr:`Transactions.on_commit`."""

    def __init__(self, txn: Txn, log: list[tuple[Any, str, Any]]) -> None:
        self._txn = txn
        self._log = log

    def put(self, key: str, value: Any, space: Any = DATA) -> None:
        self._txn.put(key, value, space)
        self._log.append((space, key, value))

    def delete(self, key: str, space: Any = DATA) -> None:
        self._txn.delete(key, space)
        self._log.append((space, key, None))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class Transactions:
    """Runs the tree's writes. ``defaults(kind)``: the attributes of a node without a record;
    ``forget()``: drop the lookup caches (called after every write, committed or not);
    :attr:`on_side_effects` ``(keys)``: told the keys the hooks changed beyond those asked for;
    :attr:`on_commit` ``(writes, left)``: told what a committed transaction wrote (``(space, key,
    value or None)``) and the nodes it left (:meth:`leave`), or ``(None, [])`` when a write
    failed other than by a check's refusal (it may have been stored all the same)."""

    def __init__(
        self, driver: Driver, hooks: Hooks, defaults: Callable[[int], Attrs], forget: Callable[[], None]
    ) -> None:
        self.driver = driver
        self.hooks = hooks
        self.defaults = defaults
        self.forget = forget
        self.on_side_effects: Callable[[list[str]], None] | None = None
        self.on_commit: Callable[[list[tuple[Any, str, Any]] | None, list[tuple[str, Node]]], None] | None
        self.on_commit = None
        self.keeps_nodes = False  # whether the mount keeps the nodes commits leave (:meth:`leave`)
        self._touched: set[str] = set()
        self._garbage: list[Parted | None] = []
        self._left: list[tuple[str, Node]] = []

    @property
    def leaving(self) -> bool:
        """Whether the running transaction should say what nodes it leaves (:meth:`leave`):
        the mount keeps them, and the format layer shows values as stored (a transformed
        value's size is not the stored one's)."""
        return self.keeps_nodes and not self.hooks.transforms

    def run(self, change: Callable[[Txn], Any]) -> Any:
        """Run ``change`` in one write transaction; then report the keys the hooks changed on
        the side and free the parts it let go of."""
        self._touched = touched = set()
        told = self.on_commit
        log: list[tuple[Any, str, Any]] = []

        def attempt(t: Txn) -> Any:
            self._garbage = []  # a transaction run again finds them again
            self._left = []
            if told is None:
                return change(t)
            log.clear()  # an attempt run again writes again
            return change(_Logged(t, log))  # type: ignore[arg-type]

        try:
            result = self.driver.transact(attempt)
        except FsError:  # refused by a check: nothing was sent to be stored
            raise
        except BaseException:
            if told is not None:
                told(None, [])
            raise
        finally:
            self.forget()
        left, self._left = self._left, []
        if told is not None:
            told(log, left)
        garbage, self._garbage = self._garbage, []
        parts.free(self.driver, {p.id: p for p in garbage if p is not None}.values())
        if touched and self.on_side_effects is not None:
            self.on_side_effects(sorted(touched))
        return result

    def changed(self, t: Txn, key: str, value: Any) -> None:
        """Data key ``key`` was set to ``value`` (None: deleted) in ``t``: the hooks follow."""
        self.hooks.changed(_Recording(t, self._touched, self.defaults), key, value)

    def leave(self, key: str, node: Node) -> None:
        """The running transaction, once committed, leaves ``node`` at ``key`` (a node of one
        name whose attributes it wrote): the lookup and the kernel's ``stat`` after it are
        answered from it, without asking the database. Asked only while :attr:`leaving`."""
        self._left.append((key, node))

    def let_go(self, parted: Parted | None) -> None:
        """The version of parts ``parted`` (None: not parted) is no longer referenced once the
        running transaction commits."""
        self._garbage.append(parted)

    def keep(self, parted: Parted | None) -> None:
        """``parted`` is what the running transaction stores: not freed, nor the parts it
        shares with a version let go (:func:`zarrfs.fs.parts.released`)."""
        self._garbage = list(parts.released(self._garbage, parted))


def clock() -> int:
    """The time of a change, in nanoseconds."""
    return time.time_ns()
