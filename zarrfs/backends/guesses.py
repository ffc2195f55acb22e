"""What a server driver's mount last saw of the keys, so that a write transaction can take its
reads' answers without asking and its commit can check them on the server with its writes.

A commit reads its folder, its names and the Zarr metadata above them (one round trip) and then
writes (one more). Those reads almost always answer what this mount last read or wrote of the
same keys, or nothing for a name it never saw (a new file's). A driver that guesses answers a
write transaction's reads from a :class:`Guesses` table, notes each answer it took, and sends
a check of them with its writes, in one round trip; the writes happen only when every answer
holds (Redis: ``redis.guesses``, a script; PostgreSQL: ``postgres.guesses``, a statement that
aborts the transaction). A wrong guess fails the commit as a changed read does, and the
transaction runs again reading for real (:class:`~.errors.GuessedWrongError`, retried at once
by ``Driver.transact``). Correctness rests on the check alone: what the table holds may be old
(another client's change not heard of yet) at the price of a round trip.

This module holds what the drivers share: a name's fact (its value, kept when at most
:data:`KEEP` bytes; its length alone; None, absent; :data:`MISS`, not known: read for real,
never guessed absent), the table's bounds (oldest first out), when to guess (none for a while
after a wrong guess), and :class:`Reading` (a run after a wrong guess reads). Written by hand:
no client library guesses reads for a server-side check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from itertools import islice
from typing import Any

from .errors import GuessedWrongError

log = logging.getLogger("zarrfs.backends.guesses")

#: Longest value kept whole (metadata documents, side records); longer: its length alone.
KEEP = 4096
#: Names and bytes of their values kept at most (a few MiB in all).
NAMES = 16384
BYTES = 2 << 20
#: Write transactions run reading for real after a wrong guess; doubled at each wrong one
#: in a row, up to :data:`MOST_SKIPS`, and back to this once a guess holds.
SKIPS = 8
MOST_SKIPS = 256


class _Missing:
    """No answer without asking the server; kept as a fact, a name not known any more
    (another client changed it, or it was guessed wrong): read for real, not guessed absent."""

    __slots__ = ()


MISS = _Missing()


class Guesses:
    """The facts of one driver's names (see the module docstring); shared by its request
    threads: every change takes :attr:`lock`, a transaction's look at a fact does not (one
    dict step). A driver's table adds what else its reads ask (Redis: index ranges;
    PostgreSQL: whether a prefix holds keys)."""

    def __init__(self) -> None:
        self.names: dict[Hashable, Any] = {}  # bytes | int | None | MISS
        self._bytes = 0  # of the values in names
        self.lock = threading.Lock()  # every change of the tables
        self._skip = 0
        self._skips = SKIPS
        #: False once the server refused the commit's checks: guessing stops.
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

    def missed(self, names: Any = ()) -> None:
        """A commit of guessed reads failed: the ``names`` it took are not known any more, and
        the next write transactions read for real."""
        self.misses += 1
        self._skip = self._skips
        self._skips = min(self._skips * 2, MOST_SKIPS)
        with self.lock:
            for name in names:
                self.keep(name, MISS)

    # -- the names ------------------------------------------------------------------------
    def keep(self, name: Hashable, fact: Any) -> None:
        """Set a name's fact (:attr:`lock` held): a value longer than :data:`KEEP`, its length."""
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

    def full(self) -> bool:
        """Whether the names are past their bounds (:meth:`bound` then drops the oldest)."""
        return len(self.names) > NAMES or self._bytes > BYTES

    def bound(self) -> None:
        """Oldest first out, to :data:`NAMES` names and :data:`BYTES` of values (:attr:`lock`
        held)."""
        names = self.names
        if len(names) > NAMES or self._bytes > BYTES:
            for name in list(islice(names, len(names) // 8 + 1)):
                self.keep(name, None)
                del names[name]

    def clear(self) -> None:
        """Forget everything (the feed lost, or the database emptied by another client)."""
        with self.lock:
            self.names.clear()
            self._bytes = 0


class Reading(threading.local):
    """Per thread, whether its next write transaction reads for real (it runs again after a
    wrong guess, or after a guessing run failed otherwise)."""

    next = False

    def keep(self) -> None:
        self.next = True

    def take(self) -> bool:
        now, self.next = self.next, False
        return now


#: Errors of the code itself, not of what a run read: logged when a guessed run raises them.
_BUGS = (TypeError, AttributeError, NameError, AssertionError)
_logged: set[type] = set()


def run_again(where: str, exc: Exception, reading: Reading) -> GuessedWrongError:
    """What a run on guessed answers that raised ``exc`` (not a driver's error: a folder
    guessed absent, say) becomes: a wrong guess, run again at once by the calling thread,
    reading, so that it raises what holds. An error of the code itself is logged too, once
    a kind: the run again reading would hide it."""
    reading.keep()
    if isinstance(exc, _BUGS) and type(exc) not in _logged:
        _logged.add(type(exc))
        log.error("%s: a run on guessed answers failed (%r); ran again reading (please report)", where, exc)
    return GuessedWrongError(f"{where}: a guessed read was wrong ({exc!r})")


__all__ = ["BYTES", "KEEP", "MISS", "MOST_SKIPS", "NAMES", "SKIPS", "Guesses", "Reading", "run_again"]
