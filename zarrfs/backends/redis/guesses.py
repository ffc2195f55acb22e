"""What a mount last saw of a Redis server's keys, so that a write transaction can take its
reads' answers without asking, and its commit can check them on the server with its writes.

A new chunk's commit reads its folder, its name and the Zarr metadata above it (one round trip)
and then writes (one more). Those reads almost always answer what this mount last read or
wrote of the same keys, or nothing for a name it never saw (a new file's). A write transaction
(``driver.RedisTxn``) answers such reads from :class:`Guesses`, noting each answer it took
(:class:`Taken`), and its commit checks them on the server with a script (``commit.CHECK``)
right before its writes, in one round trip; the writes happen only when every answer holds. A
wrong guess fails the commit as a changed watched key does, and the transaction runs again reading
for real (:class:`~zarrfs.backends.errors.GuessedWrongError`). Correctness rests on the
script's check alone: what the table holds may be old (another client's change it has not
heard of) at the price of a round trip.

A name's fact is its value (bytes, kept when at most :data:`KEEP` bytes), its length alone (an
int), or None (absent); a name without one is guessed absent. A range is a prefix read of a
listing index (``ZRANGEBYLEX idx [p (p' LIMIT 0 n`` for a prefix ``p`` ending in ``/``: a
folder's first names): its first members and whether they are all; one never read is guessed
empty. Each is learnt from the replies of this mount's reads and from its own commits; one the
change feed reports another client changed, or found wrong, is kept as not known (:data:`MISS`):
read for real, never guessed absent. The table is bounded
(:data:`NAMES`, :data:`RANGES`), oldest first out. Written by hand: no client library guesses
reads for a server-side check.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence
from hashlib import sha1
from itertools import islice
from typing import Any

from ..base import bytes_stop
from ..buffered import DELETED

#: Longest value kept whole (metadata documents, side records); longer: its length alone.
KEEP = 4096
#: Names, bytes of their values and ranges kept at most (a few MiB in all).
NAMES = 16384
BYTES = 2 << 20
RANGES = 4096
#: Members of a range kept at most; a prefix read asks for as many (it needs the first one or
#: few), so that a removal of the first leaves the next known.
MEMBERS = 8
#: Write transactions run reading for real after a wrong guess; doubled at each wrong one
#: in a row, up to :data:`MOST_SKIPS`, and back to this once a guess holds.
SKIPS = 8
MOST_SKIPS = 256


class _Missing:
    """No answer without asking the server; kept as a fact, a name or range not known any more
    (another client changed it, or it was guessed wrong): read for real, not guessed absent."""

    __slots__ = ()


MISS = _Missing()
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


class Guesses:
    """The facts of one driver's names and index ranges (see the module docstring); shared by
    its request threads: every change takes the lock, a transaction's look at a fact does
    not (one dict step)."""

    def __init__(self) -> None:
        self.names: dict[bytes, Any] = {}  # bytes | int | None | MISS
        #: ``(index, prefix)`` -> (whether the members are all of the range, its first members),
        #: or MISS
        self.ranges: dict[tuple[bytes, bytes], Any] = {}
        self._bytes = 0  # of the values in names
        self._lock = threading.Lock()  # every change of the tables
        self._skip = 0
        self._skips = SKIPS
        #: False once the server refused the commit's checks (a script): guessing stops.
        self.usable = True
        #: Commits of guessed reads that held, and guesses found wrong (at a commit or before).
        self.holds = 0
        self.misses = 0

    # -- when to guess --------------------------------------------------------------------
    def wanted(self) -> bool:
        """Whether a write transaction starting now guesses (none for a while after a wrong
        guess: a folder other clients keep changing costs a round trip a miss)."""
        if not self.usable:
            return False
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def held(self) -> None:
        """A commit of guessed reads held."""
        self._skips = SKIPS
        self.holds += 1

    def missed(self, taken: Taken) -> None:
        """A commit of guessed reads failed: what it took is not known any more, and the next
        write transactions read for real."""
        self.misses += 1
        self._skip = self._skips
        self._skips = min(self._skips * 2, MOST_SKIPS)
        with self._lock:
            for name in taken.names:
                self._keep(name, MISS)
            for key in taken.ranges:
                self.ranges[key] = MISS

    # -- learning -------------------------------------------------------------------------
    def _keep(self, name: bytes, fact: Any) -> None:
        """Set a name's fact (the lock held): a value longer than :data:`KEEP`, its length."""
        names = self.names
        old = names.get(name)
        if type(old) is bytes:
            self._bytes -= len(old)
        if fact is None or fact is MISS or type(fact) is int:
            names[name] = fact
            return
        if len(fact) > KEEP:
            names[name] = len(fact)
            return
        fact = bytes(fact)
        self._bytes += len(fact)
        names[name] = fact

    def learn(self, commands: Sequence[tuple[Any, ...]], replies: list[Any]) -> None:
        """Keep what the server answered to ``commands`` (a read's pipeline): each ``GET`` and
        ``MGET``, each ``EXISTS`` followed by a ``STRLEN`` of the same name, each prefix read
        of an index. (On every read of the mount: written for few calls a command.)"""
        names = self.names
        exists: tuple[bytes, Any] | None = None  # the EXISTS just before, and its reply
        with self._lock:
            for command, reply in zip(commands, replies, strict=False):
                op = command[0]
                if op == "EXISTS":
                    exists = (command[1], reply) if len(command) == 2 else None
                    continue
                if op == "STRLEN":
                    name = command[1]
                    if exists is not None and exists[0] == name and type(reply) is int:
                        if not exists[1]:
                            self._keep(name, None)
                        else:
                            known = names.get(name)
                            if type(known) is not bytes or len(known) != reply:
                                self._keep(name, reply)
                elif op == "GET":
                    if reply is None or type(reply) is bytes:
                        self._keep(command[1], reply)
                elif op == "MGET":
                    if type(reply) is list:
                        for name, value in zip(command[1:], reply, strict=False):
                            if value is None or type(value) is bytes:
                                self._keep(name, value)
                elif op == "ZRANGEBYLEX" and type(reply) is list:
                    raw = prefix_of(command)
                    if raw is not None:
                        self._range((command[1], raw), len(reply) < command[6], reply)
                exists = None
            if len(names) > NAMES or self._bytes > BYTES or len(self.ranges) > RANGES:
                self._bound()

    def _range(self, key: tuple[bytes, bytes], whole: bool, members: list[bytes]) -> None:
        if len(members) > MEMBERS:
            whole, members = False, members[:MEMBERS]
        self.ranges[key] = (whole, members)

    def wrote(self, pending: dict, name_of: Any, index_of: dict, taken: Taken | None = None) -> None:
        """Keep what a commit that held wrote: ``pending`` as the transaction buffered it
        (``(space, raw)`` -> value or ``DELETED``), ``name_of(space, raw)`` its key,
        ``index_of[space]`` the listing index it is listed in; and the answers it ``taken``,
        which its checks found true (a new folder's range, guessed empty, is then known)."""
        keep = self._keep
        with self._lock:
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
            self._bound()

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
        with self._lock:
            for name in names:
                self._keep(name, MISS)
            ranges = self.ranges
            for index, raw in prefixes:
                at = raw.find(b"/")
                while at >= 0:
                    ranges[(index, raw[: at + 1])] = MISS
                    at = raw.find(b"/", at + 1)
            self._bound()

    def clear(self) -> None:
        """Forget everything (the feed lost, or a ``FLUSHDB``)."""
        with self._lock:
            self.names.clear()
            self.ranges.clear()
            self._bytes = 0

    def _bound(self) -> None:
        """Oldest first out, to :data:`NAMES` names and :data:`BYTES` of values, and
        :data:`RANGES` ranges (the lock held)."""
        names = self.names
        if len(names) > NAMES or self._bytes > BYTES:
            for name in list(islice(names, len(names) // 8 + 1)):
                self._keep(name, None)
                del names[name]
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
