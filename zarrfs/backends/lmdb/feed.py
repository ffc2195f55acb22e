"""The LMDB driver's change feed: which keys other writers changed, from the environments'
commit numbers and a change log kept in the side environment.

LMDB numbers every commit (``env.info()["last_txnid"]``, from the lock file's shared memory: no
transaction), so comparing two numbers tells that *somebody* committed. Every zarrfs write
transaction puts, in the side commit with its side records, one entry ``\\xfflog:<side commit
number, hex>`` holding its data commit's number (0: no data changed) and the keys it changed;
the log keeps the last :data:`KEEP` entries. A reader walks the entries after its cursor:

* a data commit number no entry names (a writer that keeps no log: zarr-python's ``LMDBStore``),
  or a side commit number without one (log trimmed, side commit put back): "something changed" (None);
* an entry may name a data commit not made yet (the side commit comes first): the reader stops
  there and takes it at its next look; an entry a killed writer left is fulfilled by the next
  data commit, anybody's (a lookup more, never a stale view);
* the driver's own entries are skipped: the mount knows what it wrote.

The commit numbers come from the meta pages (``env.info()``), but a read transaction takes its
snapshot from the lock file's record of the last commit, which a writer sets a moment *after*
it wrote the meta page, and that write is what wakes the reader (``filewatch``). So the feed
takes, of each environment, only the commits a transaction begun now sees (:func:`visible`,
waiting a moment for a commit in its last step): an entry read past a snapshot that lacks it
made a commit seem to have no entry, "something changed", and the mount dropped every name
the kernel held, the folders processes sit in included (their ``getcwd()`` failed); and a
change taken before the data commit is visible would let the mount read the value before it.
"""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import lmdb

from ..base import DATA, SIDE, Space
from .maps import gate

# Log entries sort after every key and after the long-key store (0xFE, longkeys): no UTF-8 key
# starts with 0xFF, so no API call can name them, and a scan stops before 0xFE (scan).
# An entry names a long key itself, never the records that hold it.
LOG = b"\xfflog:"
KEEP = 4096  # entries of the log kept
MAX_PAYLOAD = 1 << 16  # a commit changing more keys than fit logs "something changed"
EVERYTHING = b"*"
CATCH_UP = 0.005  # seconds a look waits for a commit whose meta page is written to be visible
HEAD = struct.Struct(">Q")  # an entry's head: its data commit number
_SPACE = {b"d": DATA, b"s": SIDE}


def _entry(sid: int) -> bytes:
    return LOG + b"%016x" % sid


def named_data_commit(side: lmdb.Transaction, known: tuple[int, int] | None = None) -> int:
    """The newest data commit an entry of ``side``'s log names (0: none). A side-only commit's
    entry names none, so the log is walked back from its newest entry to the first that names
    one. ``known``: an earlier snapshot's side commit and this answer for it; its entries are
    not walked again. Without it, each reader after a run of side-only commits (``chmod -R``,
    ``touch``, folders' times at the end of ``rsync``) walked the whole run, up to the
    :data:`KEEP` entries of the log: a ``chmod`` of each of 6,000 files went from 0.7 to 4 ms."""
    stop = None if known is None else _entry(known[0])
    with side.cursor() as cur:
        found = cur.last()
        while found:
            key = bytes(cur.key())
            if not key.startswith(LOG):
                return 0
            if stop is not None and key <= stop:
                return known[1]  # type: ignore[index]
            named = HEAD.unpack_from(cur.value())[0]
            if named:
                return named
            found = cur.prev()
    return 0


def changed_keys(data: Iterable[bytes], side: Iterable[bytes], long: Iterable[bytes]) -> list[bytes]:
    """What a log entry names: the data and side keys a transaction changed, and its long keys
    (already as ``b"d"``/``b"s"`` + key); side records of long keys (0xFE, ``longkeys``) are
    named by the keys they hold, in ``long``."""
    changed = [b"d" + raw for raw in data]
    changed += [b"s" + raw for raw in side if raw[:1] != b"\xfe"]
    changed += long
    return changed


def record(side: lmdb.Transaction, changed: list[bytes], data_next: int) -> int:
    """Put the log entry naming ``changed`` into the write transaction ``side`` (before its
    commit), with ``data_next`` the number the data commit gets (0: no data changed); returns
    the side commit number."""
    sid = side.id()  # a write transaction's number is the one its commit gets
    payload = b"\0".join(changed)
    if len(payload) > MAX_PAYLOAD:
        payload = EVERYTHING
    side.put(_entry(sid), HEAD.pack(data_next) + payload)
    if sid > KEEP:
        side.delete(_entry(sid - KEEP))
    return sid


#: The most commits :meth:`Own.made_all` answers for; past it the log is walked.
OWN_RUN = 64


class Own:
    """This driver's own entries (the last :data:`KEEP` of them): side commit number -> the
    data commit it names (0: none)."""

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._data: dict[int, int] = {}

    def add(self, sid: int, data_next: int = 0) -> None:
        """This driver committed entry ``sid``, naming data commit ``data_next``."""
        self._order.append(sid)
        self._data[sid] = data_next
        if len(self._order) > KEEP:
            self._data.pop(self._order.popleft(), None)

    def __contains__(self, sid: int) -> bool:
        return sid in self._data

    def made_all(self, side0: int, side_id: int, data0: int, data_id: int) -> bool:
        """Whether every commit after ``(data0, side0)`` up to ``(data_id, side_id)`` is this
        driver's own (each side commit its entry, each data commit named by one): then a look
        at the feed finds nothing to tell, and reads no log. A short run only
        (:data:`OWN_RUN`); a writer that keeps no log, or another mount's entry, says no."""
        if side_id - side0 > OWN_RUN or data_id - data0 > OWN_RUN or side_id < side0 or data_id < data0:
            return False
        named = set()
        for sid in range(side0 + 1, side_id + 1):
            data_next = self._data.get(sid)
            if data_next is None:
                return False
            named.add(data_next)
        return all(n in named for n in range(data0 + 1, data_id + 1))


def changes(
    env: lmdb.Environment, side_env: lmdb.Environment | None, own: Own, since: Any
) -> tuple[Any, list[tuple[Space, str]] | None]:
    """:meth:`Driver.changes` for LMDB (see the module docstring): what the environments ``env`` and
    ``side_env`` committed since ``since``, but ``own`` entries. The cursor is the pair of
    commit numbers ``(data, side)`` seen last."""
    data_id = env.info()["last_txnid"]
    side_id = 0 if side_env is None else side_env.info()["last_txnid"]
    if since is None:
        side_id = 0 if side_env is None else visible(side_env, side_id)
        return (visible(env, data_id), side_id), []
    data0, side0 = since
    if data_id == data0 and side_id == side0:
        return since, []
    if own.made_all(side0, side_id, data0, data_id):  # this mount's commits alone: nothing to tell
        return (data_id, side_id), []
    return _walk(env, side_env, own, data0, side0, data_id, side_id)


def _walk(
    env: lmdb.Environment, side_env: lmdb.Environment | None, own: Own,
    data0: int, side0: int, data_id: int, side_id: int,
) -> tuple[Any, list[tuple[Space, str]] | None]:
    """:func:`changes` past the commits it saw last, ``(data0, side0)``: the log's entries after
    them, up to the commits ``data_id`` and ``side_id`` the environments have now."""
    if data_id != data0:
        data_id = visible(env, data_id)
    if side_id != side0 and side_env is not None:
        side_id = visible(side_env, side_id)
    records: list[tuple[Space, str]] = []
    unknown = False
    covered: set[int] = set()
    reached = side0  # the last side commit taken
    waiting = False  # stopped at an entry whose data commit is still to come
    if side_env is not None and side_id > side0:
        with gate.held(), side_env.begin(buffers=False) as txn, txn.cursor() as cur:
            found = cur.set_range(_entry(side0 + 1))
            while found:
                key = cur.key()
                if not key.startswith(LOG):
                    break
                sid = int(key[len(LOG) :], 16)
                if sid > side_id:
                    break
                value = cur.value()
                (data_next,) = HEAD.unpack_from(value)
                if data_next > data_id:
                    waiting = True  # its data commit is still to come: taken at the next look
                    break
                if sid != reached + 1:
                    unknown = True  # commits without an entry (trimmed, or put back)
                reached = sid
                if data_next:
                    covered.add(data_next)
                if sid not in own:
                    payload = value[HEAD.size :]
                    if payload == EVERYTHING:
                        unknown = True
                    elif not unknown:
                        for item in payload.split(b"\0"):
                            records.append((_SPACE[item[:1]], item[1:].decode("utf-8", "surrogateescape")))
                found = cur.next()
    if not waiting and reached < side_id:
        unknown, reached = True, side_id  # side commits with no entry (a commit put back)
    # Data commits that no entry names: a writer that keeps no log.
    for n in range(data0 + 1, data_id + 1):
        if n not in covered:
            unknown = True
            break
    return (data_id, reached), (None if unknown else records)


def seen_commit(env: lmdb.Environment) -> int:
    """The last commit of ``env`` a read transaction begun now sees (the lock file's number,
    which may trail the meta page's ``env.info()["last_txnid"]``)."""
    with gate.held(), env.begin() as txn:
        return txn.id()


def visible(env: lmdb.Environment, newest: int) -> int:
    """The last commit of ``env`` that a read transaction begun now sees, up to ``newest`` (the
    meta page's): a commit whose meta page is written but whose number is not yet in the lock
    file (see the module docstring) is waited for, :data:`CATCH_UP` at most, once (a writer
    killed in between: what is visible; the next writer's commit puts the number right)."""
    deadline = 0.0
    while True:
        seen = seen_commit(env)
        if seen >= newest or _waited.get(id(env)) == newest:
            return min(seen, newest)
        now = time.monotonic()
        if not deadline:
            deadline = now + CATCH_UP
        elif now > deadline:
            _waited[id(env)] = newest
            return seen
        os.sched_yield()


_waited: dict[int, int] = {}  # an environment's commit waited for in vain, by id(env)
