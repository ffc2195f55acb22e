"""File locks kept in the database: ``flock`` and POSIX record locks taken through one mount
conflict with every other mount's, on any machine; each decision is one transaction, and a
killed mount's locks lapse with its lease (docs/architecture.md, "Locks across mounts")."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from zarrfs.backends.base import SIDE, BackendError, Driver, Get, Txn

log = logging.getLogger("zarrfs.fs.locks")

LEASE = 10.0  # seconds a dead mount's locks stay held at most
LOCK = "lock:"
LEASE_KEY = "lease:"
RDLCK, WRLCK, UNLCK = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK
FIRST_WAIT = 0.002  # seconds before a waiting request is tried again; doubles up to MAX_WAIT
MAX_WAIT = 0.1


class Lock(NamedTuple):
    """One lock: who holds it (``mount`` and the kernel's ``owner`` there), the bytes it covers
    (``start`` to ``end``, inclusive), its ``type``, the ``pid`` that took it, and whether it is
    a ``flock`` lock."""

    mount: str
    owner: int
    start: int
    end: int
    type: int
    pid: int
    flock: bool

    def conflicts(self, other: Lock) -> bool:
        """Whether this lock and ``other`` cannot both be held."""
        return (
            self.flock == other.flock
            and (self.mount, self.owner) != (other.mount, other.owner)
            and self.start <= other.end
            and other.start <= self.end
            and WRLCK in (self.type, other.type)
        )


def _cut(held: Lock, start: int, end: int) -> list[Lock]:
    """What is left of ``held`` outside ``[start, end]``."""
    left = [held._replace(end=start - 1)] if held.start < start else []
    right = [held._replace(start=end + 1)] if held.end > end else []
    return left + right if held.start <= end and start <= held.end else [held]


class LockTable:
    """The lock table of one mount (``mount``: an ID of this run of the daemon) over ``driver``."""

    def __init__(
        self, driver: Driver, mount: str | None = None, lease: float = LEASE, clock=time.time
    ) -> None:
        self.driver = driver
        self.mount = mount or uuid.uuid4().hex[:16]
        self.lease = lease
        self.clock = clock
        self.keys: set[str] = set()  # files this mount may hold locks on (renewal, cleanup)
        self.changed = threading.Condition()  # notified when this mount releases a lock

    # -- reading and writing one file's list ------------------------------------------------
    def _live(self, txn: Txn, key: str) -> tuple[list[Lock], bool]:
        """The locks on ``key`` whose mount's lease runs, and whether dead ones were dropped."""
        raw = txn.get(LOCK + key, SIDE)
        locks = [Lock(*item) for item in json.loads(raw)] if raw else []
        mounts = sorted({lk.mount for lk in locks if lk.mount != self.mount})
        now = self.clock()
        leases = txn.read_many([Get(LEASE_KEY + m, SIDE) for m in mounts]) if mounts else []
        alive = {m for m, v in zip(mounts, leases, strict=True) if v is not None and float(v) > now}
        alive.add(self.mount)
        live = [lk for lk in locks if lk.mount in alive]
        return live, len(live) != len(locks)

    def _store(self, txn: Txn, key: str, locks: list[Lock]) -> None:
        if locks:
            txn.put(LOCK + key, json.dumps([list(lk) for lk in locks]).encode(), SIDE)
        else:
            txn.delete(LOCK + key, SIDE)

    def _renew_in(self, txn: Txn) -> None:
        txn.put(LEASE_KEY + self.mount, repr(self.clock() + self.lease).encode(), SIDE)

    # -- the calls --------------------------------------------------------------------------
    def test(self, key: str, owner: int, start: int, end: int, type: int, flock: bool = False) -> Lock | None:
        """``F_GETLK``: a lock that would block this one (its ``pid`` 0 when another mount
        holds it: a process there is none of this machine's), or None."""
        want = Lock(self.mount, owner, start, end, type, 0, flock)
        live, _ = self.driver.transact(lambda t: self._live(t, key), write=False)
        for lk in live:
            if lk.conflicts(want):
                return lk if lk.mount == self.mount else lk._replace(pid=0)
        return None

    def set(
        self, key: str, owner: int, start: int, end: int, type: int, pid: int, flock: bool = False
    ) -> bool:
        """``F_SETLK`` (or ``flock``): take, change or (``UNLCK``) release this owner's lock on
        ``[start, end]``; False, and nothing changed, when another owner's lock conflicts."""
        want = Lock(self.mount, owner, start, end, type, pid, flock)

        def step(txn: Txn) -> bool:
            live, pruned = self._live(txn, key)
            if type != UNLCK and any(lk.conflicts(want) for lk in live):
                if pruned:
                    self._store(txn, key, live)
                return False
            mine = (self.mount, owner)
            kept: list[Lock] = []
            for lk in live:
                if (lk.mount, lk.owner) != mine or lk.flock != flock:
                    kept.append(lk)
                elif not flock:  # POSIX: the new range replaces this owner's locks in it
                    kept.extend(_cut(lk, start, end))
            if type != UNLCK:
                kept.append(want)
                self._renew_in(txn)
            self._store(txn, key, kept)
            return True

        done = self.driver.transact(step)
        if type != UNLCK:
            self.keys.add(key)
        else:
            self._released()
        return done

    def release(self, key: str, owner: int, flock: bool | None = None) -> None:
        """Drop every lock ``owner`` holds on ``key`` (``flock`` None: both kinds): the close
        of a file (FLUSH carries the POSIX owner; the last RELEASE, the flock owner)."""
        if key not in self.keys:
            return

        def step(txn: Txn) -> None:
            live, pruned = self._live(txn, key)
            kept = [
                lk
                for lk in live
                if (lk.mount, lk.owner) != (self.mount, owner) or (flock is not None and lk.flock != flock)
            ]
            if len(kept) != len(live) or pruned:
                self._store(txn, key, kept)

        self.driver.transact(step)
        self._released()

    def release_all(self) -> None:
        """Drop every lock of this mount and its lease (the end of the mount)."""

        def step(txn: Txn) -> None:
            for key in self.keys:
                live, _ = self._live(txn, key)
                self._store(txn, key, [lk for lk in live if lk.mount != self.mount])
            txn.delete(LEASE_KEY + self.mount, SIDE)

        if self.keys:
            self.driver.transact(step)
            self.keys.clear()
        self._released()

    def renew(self) -> None:
        """Extend this mount's lease (while it may hold locks)."""
        if self.keys:
            self.driver.transact(self._renew_in)

    def renamed(self, src: str, dst: str) -> None:
        """A file with locks was renamed: its locks follow it (locks belong to the open file)."""
        if src not in self.keys:
            return

        def step(txn: Txn) -> None:
            raw = txn.get(LOCK + src, SIDE)
            if raw is not None:
                txn.put(LOCK + dst, raw, SIDE)
                txn.delete(LOCK + src, SIDE)

        self.driver.transact(step)
        self.keys.discard(src)
        self.keys.add(dst)

    def _released(self) -> None:
        with self.changed:
            self.changed.notify_all()


class Waiters:
    """Requests waiting for a lock, retried in a thread that also renews the mount's lease.
    ``answer(request_id, errno)`` is called once for each (0: granted), from that thread, or
    from the caller's for :meth:`cancel`."""

    def __init__(self, table: LockTable, answer: Callable[[int, int], None]) -> None:
        self.table = table
        self.answer = answer
        self.waiting: dict[int, list[Any]] = {}  # id -> [args, next try, delay]
        self.cancelled: set[int] = set()  # interrupts that came before their request
        self._stop = False
        self._renewed = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="zarrfs-locks", daemon=True)
        self._thread.start()

    def wait(self, request: int, args: tuple) -> None:
        """Keep ``request`` (the arguments of :meth:`LockTable.set`) until it is granted."""
        with self.table.changed:
            if request in self.cancelled:
                self.cancelled.discard(request)
                self.answer(request, errno.EINTR)
                return
            self.waiting[request] = [args, time.monotonic() + FIRST_WAIT, FIRST_WAIT]
            self.table.changed.notify_all()

    def cancel(self, request: int) -> None:
        """End the wait of ``request`` with ``EINTR`` (or remember it, if it has not come yet)."""
        with self.table.changed:
            if self.waiting.pop(request, None) is not None:
                self.answer(request, errno.EINTR)
            elif len(self.cancelled) < 1024:
                self.cancelled.add(request)

    def stop(self) -> None:
        """Stop retrying: every request still waiting is answered ``EINTR``."""
        with self.table.changed:
            self._stop = True
            self.table.changed.notify_all()
        self._thread.join(5)

    def _run(self) -> None:
        changed = self.table.changed
        renew_every = self.table.lease / 4
        while True:
            with changed:
                if self._stop:
                    for request in list(self.waiting):
                        self.answer(request, errno.EINTR)
                    self.waiting.clear()
                    return
                now = time.monotonic()
                due = [r for r, w in self.waiting.items() if w[1] <= now]
                renew_at = self._renewed + renew_every
                if not due and now < renew_at:
                    # Sleep until a waiter's retry or the lease renewal is due (both handled
                    # below the lock: a renewal due with nobody waiting must not loop here).
                    nexts = [w[1] for w in self.waiting.values()] + [renew_at]
                    changed.wait(max(0.0, min(nexts) - now))
                    # Woken by a release of this mount: every waiter tries at once.
                    for w in self.waiting.values():
                        w[1] = min(w[1], time.monotonic())
                    continue
            if time.monotonic() - self._renewed >= renew_every:
                self._try(self.table.renew)
                self._renewed = time.monotonic()
            for request in due:
                self._retry(request)

    def _retry(self, request: int) -> None:
        with self.table.changed:
            entry = self.waiting.get(request)
        if entry is None:
            return
        granted = self._try(lambda: self.table.set(*entry[0]))
        with self.table.changed:
            if self.waiting.get(request) is not entry:
                if granted:  # cancelled meanwhile: the caller heard EINTR, so give it back
                    args = entry[0]
                    self._try(lambda: self.table.set(*args[:4], UNLCK, *args[5:]))
                return
            if granted is None or granted:
                del self.waiting[request]
                self.answer(request, 0 if granted else errno.EIO)
            else:
                entry[2] = min(entry[2] * 2, MAX_WAIT)
                entry[1] = time.monotonic() + entry[2]

    def _try(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BackendError as exc:
            log.warning("locks: %s", exc)
            return None
