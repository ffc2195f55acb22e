"""What a mount last saw of a Redis server's keys and index ranges, for write transactions to
take their reads' answers without asking (``backends.guesses`` says why and what a name's fact
is; this module adds Redis's ranges and checks).

A write transaction (``driver.RedisTxn``) answers its reads from :class:`Guesses` when every
command of a query can be answered, noting each answer it took (:class:`Taken`), and its commit
checks them on the server with a script (``commit.CHECK``) right before its writes, in one round
trip; the writes happen only when every answer holds. A name without a fact is guessed absent.
A range is a prefix read of a listing index (``ZRANGEBYLEX idx [p (p' LIMIT 0 n`` for a prefix
``p`` ending in ``/``: a folder's first names): its first members and whether they are all; one
never read is guessed empty. Each is learnt from the replies of this mount's reads and from its
own commits; one the change feed reports another client changed, or found wrong, is kept as not
known (:data:`MISS`). Ranges are bounded (:data:`RANGES`), oldest first out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from hashlib import sha1
from itertools import islice
from typing import Any

from ..base import bytes_stop
from ..buffered import DELETED
from ..guesses import BYTES, KEEP, MISS, NAMES
from ..guesses import Guesses as Names

#: Ranges kept at most.
RANGES = 4096
#: Members of a range kept at most; a prefix read asks for as many (it needs the first one or
#: few), so that a removal of the first leaves the next known.
MEMBERS = 8
_UNSEEN = object()


def prefix_of(command: tuple[Any, ...]) -> bytes | None:
    """The prefix of a listing index's prefix read (``ZRANGEBYLEX idx [p hi LIMIT 0 n`` for a
    ``p`` ending in ``/`` and the ``hi`` that bounds it), else None."""
    lo = command[2]
    if len(command) != 7 or lo[:1] != b"[" or lo[-1:] != b"/":
        return None
    raw = lo[1:]
    hi = bytes_stop(raw)
    if command[3] != (b"(" + hi if hi is not None else b"+"):
        return None
    return raw


class Guesses(Names):
    """The facts of one driver's names and index ranges (see the module docstring and
    ``backends.guesses``); every change takes the lock, a transaction's look at a fact does
    not (one dict step)."""

    def __init__(self) -> None:
        super().__init__()
        #: ``(index, prefix)`` -> (whether the members are all of the range, its first members),
        #: or MISS
        self.ranges: dict[tuple[bytes, bytes], Any] = {}

    def missed(self, taken: Taken) -> None:  # type: ignore[override]
        """A commit of guessed reads failed: what it took is not known any more, and the next
        write transactions read for real."""
        super().missed(taken.names)
        with self.lock:
            for key in taken.ranges:
                self.ranges[key] = MISS

    # -- learning -------------------------------------------------------------------------
    def learn(self, commands: Sequence[tuple[Any, ...]], replies: list[Any]) -> None:
        """Keep what the server answered to ``commands`` (a read's pipeline): each ``GET`` and
        ``MGET``, each ``EXISTS`` followed by a ``STRLEN`` of the same name, each prefix read
        of an index. (On every read of the mount: written for few calls a command.)"""
        names = self.names
        exists: tuple[bytes, Any] | None = None  # the EXISTS just before, and its reply
        with self.lock:
            for command, reply in zip(commands, replies, strict=False):
                op = command[0]
                if op == "EXISTS":
                    exists = (command[1], reply) if len(command) == 2 else None
                    continue
                if op == "STRLEN":
                    name = command[1]
                    if exists is not None and exists[0] == name and type(reply) is int:
                        if not exists[1]:
                            self.keep(name, None)
                        else:
                            known = names.get(name)
                            if type(known) is not bytes or len(known) != reply:
                                self.keep(name, reply)
                elif op == "GET":
                    if reply is None or type(reply) is bytes:
                        self.keep(command[1], reply)
                elif op == "MGET":
                    if type(reply) is list:
                        for name, value in zip(command[1:], reply, strict=False):
                            if value is None or type(value) is bytes:
                                self.keep(name, value)
                elif op == "ZRANGEBYLEX" and type(reply) is list:
                    raw = prefix_of(command)
                    if raw is not None:
                        self._range((command[1], raw), len(reply) < command[6], reply)
                exists = None
            if self.full() or len(self.ranges) > RANGES:
                self.bound()

    def _range(self, key: tuple[bytes, bytes], whole: bool, members: list[bytes]) -> None:
        if len(members) > MEMBERS:
            whole, members = False, members[:MEMBERS]
        self.ranges[key] = (whole, members)

    def wrote(self, pending: dict, name_of: Any, index_of: dict, taken: Taken | None = None) -> None:
        """Keep what a commit that held wrote: ``pending`` as the transaction buffered it
        (``(space, raw)`` -> value or ``DELETED``), ``name_of(space, raw)`` its key,
        ``index_of[space]`` the listing index it is listed in; and the answers it ``taken``,
        which its checks found true (a new folder's range, guessed empty, is then known)."""
        keep = self.keep
        with self.lock:
            if taken is not None:
                for name, fact in taken.names.items():
                    keep(name, fact)
                for key, (_whole, members, most) in taken.ranges.items():
                    shown = members[:most]
                    self._range(key, len(shown) < most, shown)
            for (space, raw), value in pending.items():
                if value is DELETED:
                    keep(name_of(space, raw), None)
                    self._listed(index_of[space], raw, False)
                else:
                    keep(name_of(space, raw), value)
                    self._listed(index_of[space], raw, True)
            self.bound()

    def _listed(self, index: bytes, member: bytes, added: bool) -> None:
        """Bring the ranges of ``index`` holding ``member`` up to its addition or removal."""
        ranges = self.ranges
        at = member.find(b"/")
        while at >= 0:
            key = (index, member[: at + 1])
            at = member.find(b"/", at + 1)
            fact = ranges.get(key)
            if fact is None or fact is MISS:
                continue
            whole, members = fact
            if member in members:
                if added:
                    continue
                rest = [m for m in members if m != member]
                # Of a range known in part, the first ones but one are still known.
                ranges[key] = (whole, rest) if whole or rest else MISS
            elif added:
                if whole or (members and member < members[-1]):
                    grown = members[:]
                    bisect.insort(grown, member)
                    if not whole:
                        grown.pop()  # as many as were known
                    self._range(key, whole, grown)
            elif not whole and members and member < members[-1]:
                ranges[key] = MISS  # not as thought: read it again

    def forget(self, names: Iterable[bytes], prefixes: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """Another client changed these names (the change feed): they are not known any more,
        nor the ranges of an index (``(index, raw)``) that hold such a key."""
        with self.lock:
            for name in names:
                self.keep(name, MISS)
            ranges = self.ranges
            for index, raw in prefixes:
                at = raw.find(b"/")
                while at >= 0:
                    ranges[(index, raw[: at + 1])] = MISS
                    at = raw.find(b"/", at + 1)
            self.bound()

    def clear(self) -> None:
        """Forget everything (the feed lost, or a ``FLUSHDB``)."""
        super().clear()
        with self.lock:
            self.ranges.clear()

    def bound(self) -> None:
        """Oldest first out: the names (``backends.guesses``) and to :data:`RANGES` ranges (the
        lock held)."""
        super().bound()
        ranges = self.ranges
        if len(ranges) > RANGES:
            for key in list(islice(ranges, len(ranges) // 8 + 1)):
                del ranges[key]


class Taken:
    """The answers one write transaction took without asking: each name's fact and each
    range's (with the most members it answered), checked by its commit."""

    __slots__ = ("names", "ranges")

    def __init__(self) -> None:
        self.names: dict[bytes, bytes | int | None] = {}
        self.ranges: dict[tuple[bytes, bytes], tuple[bool, list[bytes], int]] = {}

    def __bool__(self) -> bool:
        return bool(self.names or self.ranges)

    def answer(self, guesses: Guesses, commands: tuple[tuple[Any, ...], ...]) -> list[Any] | None:
        """Replies to ``commands`` from this transaction's answers so far and ``guesses``, or
        None when one needs the server (the whole query is then made for real)."""
        names, ranges = len(self.names), dict(self.ranges) if self.ranges else None
        out: list[Any] = []
        for command in commands:
            reply = self._one(guesses, command)
            if reply is MISS:
                # Made for real (and watched): none of this query's answers was taken.
                for name in list(islice(self.names, names, None)):
                    del self.names[name]
                if ranges is None:
                    self.ranges.clear()
                else:
                    self.ranges = ranges
                return None
            out.append(reply)
        return out

    def _fact(self, guesses: Guesses, name: bytes) -> Any:
        fact = self.names.get(name, _UNSEEN)
        if fact is _UNSEEN:
            fact = guesses.names.get(name)  # never seen: guessed absent
            if fact is not MISS:
                self.names[name] = fact
        return fact

    def _one(self, guesses: Guesses, command: tuple[Any, ...]) -> Any:
        op = command[0]
        if op == "GET":
            fact = self._fact(guesses, command[1])
            return MISS if isinstance(fact, int) else fact
        if op == "MGET":
            values = [self._fact(guesses, name) for name in command[1:]]
            return MISS if any(v is MISS or isinstance(v, int) for v in values) else values
        if op == "EXISTS":
            fact = self._fact(guesses, command[1])
            return fact if fact is MISS else 0 if fact is None else 1
        if op == "STRLEN":
            fact = self._fact(guesses, command[1])
            if fact is MISS or isinstance(fact, int):
                return fact
            return 0 if fact is None else len(fact)
        if op == "GETRANGE":
            fact = self._fact(guesses, command[1])
            if fact is MISS or isinstance(fact, int):
                return MISS
            start, end = int(command[2]), int(command[3])
            return b"" if fact is None or start < 0 or end < 0 else fact[start : end + 1]
        if op == "ZRANGEBYLEX":
            raw = prefix_of(command)
            if raw is None:
                return MISS
            limit = int(command[6])
            key = (command[1], raw)
            taken = self.ranges.get(key)
            if taken is None:
                fact = guesses.ranges.get(key, (True, []))  # never read: guessed empty
                if fact is MISS:
                    return MISS
                taken = (fact[0], fact[1], 0)
            whole, members, most = taken
            if not whole and limit > len(members):
                return MISS
            self.ranges[key] = (whole, members, max(most, limit))
            return members[:limit]
        return MISS

    def checks(self) -> tuple[list[bytes], list[Any], int, int]:
        """The commit script's checks: its keys, arguments, and the counts of names and ranges
        (see ``commit.CHECK``): a name's value by its SHA-1, a length as ``#n``, absent as
        ``-``; a range's query and the members it answered."""
        keys: list[bytes] = []
        args: list[Any] = []
        for name, fact in self.names.items():
            keys.append(name)
            if fact is None:
                args.append(b"-")
            elif isinstance(fact, int):
                args.append(b"#%d" % fact)
            else:
                args.append(sha1(fact).hexdigest().encode())
        for (index, raw), (_whole, members, most) in self.ranges.items():
            keys.append(index)
            shown = members[:most]
            hi = bytes_stop(raw)
            args += [b"[" + raw, b"(" + hi if hi is not None else b"+", most, len(shown), *shown]
        return keys, args, len(self.names), len(self.ranges)


__all__ = ["BYTES", "KEEP", "MEMBERS", "MISS", "NAMES", "RANGES", "Guesses", "Taken", "prefix_of"]
