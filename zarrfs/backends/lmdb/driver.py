"""LMDB driver: ``lmdb:///abs/path/db.lmdb[?map_size=2**40&map_max=&side_map_size=&sync=0]``
(or a bare path); the maps grow on demand up to their bounds (``maps``).

Data keys live in the main, unnamed database, exactly as zarr-python 2's ``LMDBStore`` writes them:
a folder (``data.mdb`` + ``lock.mdb``) or, for an existing regular file, a single-file environment.
Side data lives in a second environment (a named database would be a record ``LMDBStore.keys()``
lists), ``<dir>/zarrfs-side.mdb`` or ``<file>.zarrfs-side``, made at the first side write; writers
lock data then side, so they cannot deadlock. Keys over 511 bytes go to the side environment
(``longkeys``). Two environments, one outcome (``LMDBTxn.finish``): the side commits first and is
put back if the data commit fails; a kill in between leaves the side one transaction ahead
(advisory, ignored without its file; that transaction's long data keys without the others). As
with ``LMDBStore``, commits are not synced one by one: a machine crash can lose the last ones (and,
per ``MDB_NOSYNC``, corrupt the environment on a filesystem writing pages out of order);
``Driver.sync()`` is the barrier, ``?sync=1`` syncs every commit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import lmdb

from ..base import (
    DATA,
    SIDE,
    SIZES,
    Driver,
    Fetch,
    HasPrefix,
    RetryableError,
    Size,
    Space,
    StalledError,
    Txn,
    check_space,
    encode_key,
)
from ..filespace import statvfs
from ..filewatch import FileWatch
from ..urloptions import check_options, parse_bool, parse_file_url, parse_size
from . import feed, longkeys, pages
from .about import ABOUT, FILES, SIDE_FILE_SUFFIX, SIDE_IN_FOLDER
from .environments import (
    DiskRoom,
    KnownSizes,
    SideEnvironment,
    bare_size,
    environments,
    translate,
    translated,
)
from .feed import Own
from .holder import Holder
from .leaf import value_size, value_view
from .maps import Maps, gate
from .scan import cursor_page, cursor_rows, merged
from .snapshot import hold as hold_snapshot

#: Seconds a read waits for the data commit of side records it found ahead of its data once
#: no writer holds the environment (its writer killed between its two commits).
SIDE_AHEAD_WAIT = 0.5
_NONE: dict[Any, Any] = {}  # what a read transaction changed: nothing (never written to)


class LMDBTxn(Txn):
    """One transaction over the data environment and, lazily, the side environment; its own
    context manager (leaving the block commits, or aborts when the block raised)."""

    max_value = pages.MAX_VALUE
    value_limit = "LMDB's largest value: its pages in one write"

    def __init__(self, driver: LMDBDriver, write: bool) -> None:
        # Txn.__init__ inlined, no tables for a read (one is made per lookup), no key limit.
        self.write, self.where, self.max_key = write, driver.path, None
        self.put_bytes = 0
        self._driver = driver
        self._fit = driver.key_fit
        if write:  # another program's writer: logged, bounded by -o timeout= (writer_wait)
            driver.write_lock.writer.wait(driver.path, driver.timeout, driver.waiting_for_writer)
        gate.enter(self)  # no map is resized while the transaction is open (maps)
        if write:
            driver.write_lock.acquire()
        try:
            self._data = driver.env.begin(write=write, buffers=True)
        except BaseException as exc:
            gate.leave(self)
            if write:
                driver.write_lock.release()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, driver.path) from exc
            raise
        self._side: lmdb.Transaction | None = None
        self._data_cursor: lmdb.Cursor | None = None  # _cursor's
        # The commit whose sizes KnownSizes may answer for: this snapshot's, or for a write
        # transaction the one it follows (for keys it has not changed itself).
        self._id = self._data.id() - 1 if write else self._data.id()
        self._changes: dict[bytes, int | None] = {} if write else _NONE
        # Side records as they were before this transaction first changed them (None: absent),
        # to put back if the data commit fails after the side commit; long keys' included.
        self._side_before: dict[bytes, bytes | None] = {} if write else _NONE
        # Long keys this transaction changed, as the change log names them (b"d"/b"s" + key).
        self._long_changed: dict[bytes, None] = {} if write else _NONE
        self._long_any: dict[Space, bool] | None = None  # per space: whether it has long keys
        self._writes = 0  # writes so far: a scan seeks again after the caller wrote

    def __enter__(self) -> LMDBTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exc_type is None)

    def _known(self, raw: bytes, space: Space) -> int | None:
        if space is not DATA or raw in self._changes:
            return None
        return self._driver.known.get(self._id, raw)

    def _sizes_known(self, space: Space, fetch: Fetch) -> Callable[[bytes], int | None] | None:
        """What gives a scan's sizes without their values (:meth:`_known` of each key), or
        None where nothing can: a read transaction asks :class:`KnownSizes` of its commit
        straight, without a call of this transaction a row, and nothing when they are of
        another commit (a size read from the row is right anyway: known sizes spare reading
        a large value's pages, they never answer otherwise)."""
        if space is not DATA or fetch is not SIZES:
            return None
        if self.write:
            return lambda raw: self._known(raw, DATA)
        known = self._driver.known
        return partial(known.get, self._id) if known.txnid == self._id else None

    def _txn(self, space: Space, create: bool = True) -> lmdb.Transaction | None:
        """The transaction of ``space``'s environment; for the side, None when the environment
        does not exist (a write transaction makes it, when ``create``)."""
        if space is DATA:
            return self._data
        if self._side is None:
            env = self._driver.side.env(create and self.write)
            if env is None:
                return None
            try:  # not translated(): a context manager costs more than the begin (one a lookup)
                self._side = env.begin(write=self.write, buffers=True)
            except lmdb.Error as exc:
                raise translate(exc, self.where, SIDE) from exc
            if not self.write:
                self._check_side(self._side)
        return self._side

    def _check_side(self, side: lmdb.Transaction) -> None:
        """A read transaction's two snapshots must be of one commit. A writer commits its side
        records first, so a side snapshot begun after the data one may hold a commit whose data
        is not in the data snapshot: the newest change-log entry (``feed``) that names a data
        commit (a side-only commit's names none) names one after it. The transaction is then
        read again (``RetryableError``) once that data commit is made. Its writer holds the data
        environment's write lock until then, however long it is descheduled; once no writer
        holds it (one killed between its two commits) the entry is waited for
        :data:`SIDE_AHEAD_WAIT` at most, then read as it is. A live writer is waited for up to
        the driver's ``timeout`` (``-o timeout=``): ``StalledError``. A data commit counts once
        a read begun now sees it (``feed.seen_commit``): one whose meta page is written but
        whose number a killed writer left out of the lock file is one never made."""
        data_id = self._data.id()
        sid = side.id()
        head = self._driver.side_head  # (side commit, the newest data commit its entries name)
        if head is None or head[0] != sid:
            # The newest data commit an entry names: a side-only commit's entry names none
            # (0), and one after a writer's two commits would otherwise hide them. The entries
            # up to the last snapshot checked are not walked again (a later snapshot only).
            known = head if head is not None and head[0] < sid else None
            head = self._driver.side_head = (sid, feed.named_data_commit(side, known))
        data_next = head[1]
        if data_next <= data_id:
            return
        driver = self._driver
        started = time.monotonic()
        pause = 0.0005
        while feed.seen_commit(driver.env) < data_next:
            waited = time.monotonic() - started
            if waited >= SIDE_AHEAD_WAIT:
                if not driver.write_lock.held_elsewhere():
                    if feed.seen_commit(driver.env) >= data_next:
                        break  # made, and let go, between the two looks: read it whole
                    return  # its writer is gone: the side stays one transaction ahead
                if waited >= driver.timeout:
                    raise StalledError(
                        f"{self.where}: a writer holds its commit half made (side records "
                        f"committed, data not) for {waited:.1f} s (-o timeout=)"
                    )
                pause = 0.005
            time.sleep(pause)
        raise RetryableError(f"{self.where}: side records ahead of the data read; read again")

    def _value(self, raw: bytes, space: Space) -> Any:
        """The value of ``raw`` as a buffer into the map (valid in this transaction), or None;
        in a read transaction, a large data value's pages are not touched (``leaf``)."""
        try:
            if len(raw) > self._fit:
                return longkeys.value(self._txn(SIDE, False), raw, space)
            if space is DATA and not self.write:
                return value_view(self._cursor(), raw, self._driver.map_where)
            txn = self._txn(space, False)
            return None if txn is None else txn.get(raw)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _get(self, raw: bytes, space: Space) -> bytes | None:
        value = self._value(raw, space)
        return None if value is None else pages.copied(self._driver, value)

    def _size(self, raw: bytes, space: Space) -> int | None:
        # From the key's leaf node (leaf): a value py-lmdb returns has all its pages read.
        if len(raw) > self._fit:
            with translated(self.where):
                return longkeys.size(self._txn(SIDE, False), raw, space)
        known = self._known(raw, space)
        if known is not None:
            return known
        try:
            if space is DATA:
                return value_size(self._cursor(), raw)
            txn = self._txn(space, False)
            if txn is None:
                return None
            with txn.cursor() as cur:
                return value_size(cur, raw)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _cursor(self) -> lmdb.Cursor:
        """A cursor of the data environment's transaction, kept for its point reads (a size,
        a view: ``leaf``, which needs the key's node) and closed with the transaction."""
        cur = self._data_cursor
        if cur is None:
            cur = self._data_cursor = self._data.cursor()
        return cur

    def _read(self, raw: bytes, offset: int, length: int, space: Space) -> bytes | None:
        value = self._value(raw, space)  # copy only the range out of the map
        return None if value is None else pages.copied(self._driver, value[offset : offset + length])

    def _put(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        self._writes += 1
        if len(raw) > self._fit:
            return self._put_long(raw, value, space)
        txn = self._txn(space)
        assert txn is not None  # a write transaction creates the side environment
        try:  # a plain try, not translated(): a commit makes three puts or more
            if space is SIDE and raw not in self._side_before:
                old = txn.get(raw)
                self._side_before[raw] = None if old is None else pages.copied(self._driver, old)
            txn.put(raw, value)
        except lmdb.Error as exc:
            raise translate(exc, self.where, space) from exc
        if space is DATA:
            n = len(value)
            self._changes[raw] = n if n >= KnownSizes.LARGE else None

    def _put_long(self, raw: bytes, value: bytes | memoryview, space: Space) -> None:
        side = self._txn(SIDE)
        assert side is not None
        with translated(self.where, SIDE):
            longkeys.put(side, raw, value, space, self._side_before)
        self._long_changed[(b"d" if space is DATA else b"s") + raw] = None
        self._long_any = {**(self._long_any or {}), space: True}

    def _delete(self, raw: bytes, space: Space) -> None:
        self._writes += 1
        if len(raw) > self._fit:
            side = self._txn(SIDE, False)
            with translated(self.where, SIDE):
                if side is not None and longkeys.delete(side, raw, space, self._side_before):
                    self._long_changed[(b"d" if space is DATA else b"s") + raw] = None
            return
        txn = self._txn(space)
        assert txn is not None
        try:  # a plain try, as in _put
            if space is SIDE and raw not in self._side_before:
                old = txn.get(raw)
                if old is None:
                    return
                self._side_before[raw] = pages.copied(self._driver, old)
            found = txn.delete(raw)
        except lmdb.Error as exc:
            raise translate(exc, self.where, space) from exc
        if found and space is DATA:  # a delete of nothing changes nothing (no new commit)
            self._changes[raw] = None

    def _any_long(self, space: Space) -> bool:
        """Whether ``space`` has long keys (looked up once per transaction; the caller
        translates ``lmdb`` errors)."""
        seen = self._long_any
        if seen is None:
            seen = self._long_any = {}
        known = seen.get(space)
        if known is None:
            known = seen[space] = self._driver.long_keys.any_in(self._txn(SIDE, False), space, self.write)
        return known

    def _scan_rows(self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int) -> list:
        """A read transaction's scan of at most ``limit`` rows, read by one loop over the
        environment's cursor (:func:`scan.cursor_page`); with long keys in the space, merged
        with theirs by :meth:`_scan`."""
        if hi is None or hi > longkeys.MARK:
            hi = longkeys.MARK
        try:
            if self._any_long(space):
                return super()._scan_rows(lo, hi, space, fetch, limit)
            own = self._txn(space, False)
            if own is None:
                return []
            return cursor_page(own, lo, hi, fetch, self._sizes_known(space, fetch), limit, self._driver)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _scan(
        self, lo: bytes, hi: bytes | None, space: Space, fetch: Fetch, limit: int | None
    ) -> Iterator[tuple[bytes, Any]]:
        """The keys of ``space`` in ``[lo, hi)``: the environment's own merged with the long keys.
        Keys from 0xFE on are the long-key store's records and the change log, never keys, so a
        scan ends there. The caller of a write transaction may write between two pulls; cursors
        are not trusted after a write: both streams are opened again after the last key yielded
        (the keys a write added after it are then seen, the ones it removed are not)."""
        if hi is None or hi > longkeys.MARK:
            hi = longkeys.MARK  # from 0xFE on: the long-key store and the change log, no keys
        try:
            own = self._txn(space, False)
            long = self._any_long(space)
            while True:
                writes = self._writes
                rows: Iterator[tuple[bytes, Any]] = iter(())
                if own is not None:
                    rows = cursor_rows(own, lo, hi, fetch, self._sizes_known(space, fetch), self._driver)
                if long:
                    side = self._txn(SIDE, False)
                    assert side is not None
                    rows = merged(rows, longkeys.rows(side, lo, hi, space, fetch))
                try:
                    if not self.write:  # nothing writes between pulls: no seek again to watch for
                        yield from rows
                        return
                    for raw, x in rows:
                        yield raw, x
                        if self._writes != writes:
                            break  # the caller wrote while we were suspended: seek again after raw
                    else:
                        return
                finally:
                    close = getattr(rows, "close", None)
                    if close is not None:
                        close()
                lo = raw + b"\0"
                long = long or self._any_long(space)
                own = own or self._txn(space, False)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _has_prefix(self, raw: bytes, space: Space) -> bool:
        try:
            txn = self._txn(space, False)
            if txn is not None and len(raw) <= self._fit:
                with txn.cursor() as cur:
                    first = cur.key().tobytes() if cur.set_range(raw) else None
                if first is not None and first.startswith(raw):
                    try:
                        first.decode("utf-8")
                    except UnicodeDecodeError:  # not a key (scan skips it): scan decides
                        return super()._has_prefix(raw, space)
                    return True
            seen = self._long_any  # _any_long's answer when it has one: a miss asks it each time
            long = None if seen is None else seen.get(space)
            if long is None:
                long = self._any_long(space)
            return long and longkeys.has_prefix(self._txn(SIDE, False), raw, space)
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc

    def _read_many(self, plan: list[tuple[type, bytes, Space]]) -> list[Any]:
        # Straight on LMDB, without a method call per read: a lookup makes five of these.
        out: list[Any] = []
        append = out.append
        data, fit = self._data, self._fit
        try:
            for kind, raw, space in plan:
                if space is DATA:
                    txn = data
                else:
                    txn = self._side
                    if txn is None:
                        txn = self._txn(space, False)
                if kind is HasPrefix:
                    append(self._has_prefix(raw, space))
                elif len(raw) > fit:
                    append(self._size(raw, space) if kind is Size else self._get(raw, space))
                elif txn is None:
                    append(None)
                elif kind is Size:
                    known = self._known(raw, space)
                    if known is not None:
                        append(known)
                    elif space is DATA:
                        append(value_size(self._cursor(), raw))
                    else:
                        append(self._size(raw, space))
                else:
                    value = txn.get(raw)
                    append(None if value is None else value.tobytes())
        except lmdb.Error as exc:
            raise translate(exc, self.where) from exc
        return out

    # The commit: two environments, two commits, one outcome. The side environment commits
    # first, and the transaction keeps the side records it overwrote (``_side_before``: side
    # keys, and the records of long keys of either space, see ``longkeys``); then the data
    # commits. If the data commit fails (a full disk), the side records are put back as they
    # were and the error is raised: committed data implies committed side data, and a failed
    # commit leaves nothing new. The change log entry (``feed``) is put in the side commit.

    def finish(self, ok: bool) -> None:
        """Commit (side first, then data) when ``ok``, else abort both; a write transaction
        releases the driver's write lock either way, and the transaction leaves ``maps``'s
        gate."""
        try:
            if not self.write:
                self._data.abort()
                if self._side is not None:
                    self._side.abort()
                return
            try:
                self._finish(ok)
            finally:
                self._driver.write_lock.release()
        finally:
            gate.leave(self)

    def _abort(self) -> None:
        side, self._side = self._side, None
        self._data.abort()
        if side is not None:
            side.abort()

    def _finish(self, commit: bool) -> None:
        if not commit:
            self._abort()
            return
        driver = self._driver
        try:
            logged = self._log() if driver.log_changes else None
        except BaseException as exc:
            self._abort()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where, SIDE) from exc
            raise
        side, self._side = self._side, None  # _log() may have begun it
        try:
            if side is not None:
                sid = side.id()
                side.commit()
                if self._side_before or logged is not None:  # else no snapshot was made
                    driver.long_keys.committed(sid, self._long_changed)
        except BaseException as exc:
            self._data.abort()
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where, SIDE) from exc
            raise
        try:
            self._data.commit()
        except BaseException as exc:
            if self._side_before:
                driver.side.restore(self._side_before)
            if isinstance(exc, lmdb.Error):
                raise translate(exc, self.where, DATA) from exc
            raise
        if self._changes:
            driver.known.committed(self._id + 1, self._changes)
        if logged is not None:
            driver.own.add(logged, self._id + 1 if self._changes else 0)

    def _log(self) -> int | None:
        """Put this transaction's entry in the change log (see ``feed``), before the side commit;
        its side commit number, or None when it changed nothing."""
        changed = feed.changed_keys(self._changes, self._side_before, self._long_changed)
        if not changed:
            return None
        side = self._txn(SIDE)
        assert side is not None  # a write transaction creates the side environment
        return feed.record(side, changed, self._data.id() if self._changes else 0)


class LMDBDriver(Driver):
    """Driver for LMDB environments; see the module docstring."""

    snapshots = True
    snapshot = hold_snapshot  # -o snapshot: the state of now, held
    scan_sizes_free = True  # a scan's size is read from the key's leaf node (leaf)

    def __init__(self, url: str, readonly: bool = False) -> None:
        super().__init__(url, readonly)
        self.file_watch: FileWatch | None = None  # made when the daemon asks (feed_fileno)
        self._where: tuple[int, tuple[int, int, int] | None] | None = None  # map_where's, by map size
        path, options = parse_file_url(url)
        check_options(url, options, set(ABOUT.options))
        path = FILES.database_at(path)
        self.path = path
        self.map_size = parse_size("map_size", options.get("map_size", str(2**40)))
        sync = parse_bool("sync", options.get("sync", "0"))
        self.maps = Maps(self, options)  # its options checked before any file is made
        self._env_options = {"sync": sync, "metasync": sync, "map_async": False, "writemap": False}
        self.subdir = not os.path.isfile(path)
        self.folder = path if self.subdir else os.path.dirname(path)
        self._key, self.env = environments.acquire(
            path, self.subdir, readonly, map_size=self.map_size, meminit=False, **self._env_options
        )
        #: The longest key LMDB holds (511 bytes); longer ones are held in ``longkeys``.
        self.key_fit = self.env.max_key_size()
        self.write_lock = environments.write_lock(self._key)
        self.room = None if readonly else DiskRoom(path, self.subdir)
        side_path = os.path.join(path, SIDE_IN_FOLDER) if self.subdir else path + SIDE_FILE_SUFFIX
        #: The files a commit writes: the data file of each environment (``filewatch``).
        data_file = "data.mdb" if self.subdir else os.path.basename(path)
        self.written_files = (data_file, os.path.basename(side_path))
        self.holder = Holder(self)  # values read in place (holder)
        self.side = SideEnvironment(
            side_path, readonly, {**self._env_options, "map_size": self.maps.side_size}
        )
        self._closed = False
        #: The last side snapshot a read checked, and the data commit its last log entry names.
        self.side_head: tuple[int, int] | None = None
        self.known = KnownSizes()
        self.long_keys = longkeys.Presence()

        # Every write keeps a change log for the other mounts (feed); own: its entries.
        self.log_changes = not readonly
        self.own = Own()

    # The one-shot size skips the Txn object and the retry loop: the mount asks a file's size
    # before each read of it; this measurably halves the call (docs/performance.md).
    def size(self, key: str, space: Space = DATA) -> int | None:
        """One-shot :meth:`Txn.size` in a bare read transaction."""
        raw, sp = encode_key(key), check_space(space)
        if len(raw) > self.key_fit:
            return super().size(key, sp)  # a long key: through a transaction
        env = self.env if sp is DATA else self.side.env(False)
        return None if env is None else bare_size(env, raw, self.known if sp is DATA else None, self.path)

    def _begin(self, write: bool) -> LMDBTxn:
        if write:  # held readers make LMDB grow the file rather than reuse pages (holder)
            self.holder.tidy()
            if self.room is not None:
                self.room.before_write()
        return LMDBTxn(self, write)

    def map_where(self) -> tuple[int, int, int] | None:
        """``(start, end, page size)`` of the data environment's map in this process, found
        in ``/proc/self/maps`` once a map size (``leaf.value_view``); None where it is not
        one mapping. A transaction is open: the map stays where it is meanwhile (``maps``)."""
        size = self.env.info()["map_size"]
        if self._where is None or self._where[0] != size:
            file = pages.data_file(self.env)
            found = pages.mappings({file}) if file is not None else []
            where = (*found[0], self.env.stat()["psize"]) if len(found) == 1 else None
            self._where = (size, where)
        return self._where[1]

    def make_room(self, exc: BaseException) -> bool:
        """Grow the map a transaction found full (see ``maps``; held readers let go)."""
        self.holder.let_go_all()
        return self.maps.grow(exc)

    def free_reserve(self) -> bool:
        """Free the disk room kept for removals on a full disk (see ``filespace.Reserve``)."""
        return self.room is not None and self.room.free()

    def changes(self, since: Any) -> tuple[Any, list[tuple[Space, str]] | None]:
        """What other writers committed since ``since`` (see ``feed``)."""
        if self.file_watch is not None:
            self.file_watch.drain()  # first: a commit after this look wakes the loop again
        self.holder.tidy()
        with translated(self.path):
            return feed.changes(self.env, self.side.env(False), self.own, since)

    def feed_fileno(self) -> int | None:
        """Readable when an environment's data file was written (``filewatch``)."""
        if self.file_watch is None:
            self.file_watch = FileWatch(self.folder, self.written_files)
        return self.file_watch.fileno()

    def sync(self) -> None:
        """Force committed transactions of both environments to disk."""
        with translated(self.path):
            self.env.sync(True)
            self.side.sync()

    def statfs(self) -> dict[str, int] | None:
        """The filesystem's space, capped by what the LMDB map can still hold."""
        fs = statvfs(self.folder)
        info, stat = self.env.info(), self.env.stat()
        map_size = max(info["map_size"], self.maps.data_max)  # the map grows up to it
        used = (info["last_pgno"] + 1) * stat["psize"]
        return {"total": min(fs["total"], map_size), "free": max(0, min(fs["free"], map_size - used))}

    def close(self) -> None:
        """Release both environments (closed when no other driver in the process uses them)."""
        if self._closed:
            return
        self._closed = True
        if self.file_watch is not None:
            self.file_watch.close()
        self.holder.let_go_all()
        if self.room is not None:
            self.room.give_back(self.env, self.write_lock, self.path)
        environments.release(self._key)
        self.side.close()
        if self.room is not None:
            self.room.close()
        pages.forget(self)
