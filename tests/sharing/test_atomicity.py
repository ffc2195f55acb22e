"""One transaction, one outcome, observed: every operation the README calls one transaction,
on every driver.

* **Nothing on failure.** A commit made to fail at the driver (``zarrfs.testing.faults``: the
  real database rolls the transaction back) leaves the database exactly as it was, both the
  keys and the bookkeeping; the same operation then succeeds.
* **Before or after, never between.** While a test repeats an operation through a mount (or
  through ``zarrfs.store``), observers in processes of their own (``tests/observers.py``) look
  continuously: through the same mount, through a second mount of the database, and with the
  database's own client in one read transaction. They must only ever see the state before an
  operation or the state after it. A two-step version of any of these operations is caught
  (the sabotages tried are listed in ``docs/testing.md``).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from mounting import DRIVERS, make_url, needs_fuse
from observers import DIR_MODE, FOLDER_PARTS, GROUP_KEYS, Exchanges, content, name

from zarrfs.backends import open_driver
from zarrfs.backends.base import SIDE, VALUES
from zarrfs.fs.commitoptions import CREATE
from zarrfs.fs.errors import to_errno
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.tree import RENAME_EXCHANGE, Tree
from zarrfs.store import DatabaseStore
from zarrfs.testing.faults import failing_commits

HERE = Path(__file__).parents[1]  # tests/, where observers.py is
OPTIONS = ["validate=off", "consolidate=off"]

# --- a failed commit stores nothing ---------------------------------------------------------


def everything(driver) -> tuple[dict, dict]:
    """Every key and side record of the database with its value, read in one transaction."""

    def read(t):
        data = {k: bytes(v) for k, v in t.scan("", None, fetch=VALUES)}
        side = {k: bytes(v) for k, v in t.scan("", None, space=SIDE, fetch=VALUES)}
        return data, side

    return driver.transact(read, write=False)


def _commit(tree, handles):
    fh = handles.create("d/new", 0o640, os.O_WRONLY, 0, 0)
    handles.write(fh, b"x" * 5000, 0)  # spilled to a temporary file
    handles.flush(fh)


def _close(tree, handles):
    fh = handles.open("d/f", os.O_WRONLY | os.O_TRUNC)
    handles.write(fh, b"rewritten", 0)
    handles.flush(fh)


def _fsync(tree, handles):
    fh = handles.open("d/f", os.O_WRONLY)
    handles.write(fh, b"synced", 3)
    handles.fsync(fh)


def _store_set(store):
    from zarr.core.buffer import default_buffer_prototype

    store.set_sync("d/f", default_buffer_prototype().buffer.from_bytes(b"set by the store"))


def _store_delete_dir(store):
    asyncio.run(store.delete_dir("g"))


# Each: what it does, given (tree, handles) or, for the store, the URL.
OPERATIONS = {
    "close": _close,
    "fsync": _fsync,
    "create": _commit,
    "rename_file": lambda tree, h: tree.rename("d/f", "d/f2"),
    "rename_onto": lambda tree, h: tree.rename("d/f", "g/a/0.0"),
    "rename_folder": lambda tree, h: tree.rename("g", "h"),
    "exchange": lambda tree, h: tree.rename("d", "g", RENAME_EXCHANGE),
    "link": lambda tree, h: tree.link("d/f", "g/linked"),
    "unlink": lambda tree, h: tree.unlink("d/f"),
    "rmdir": lambda tree, h: tree.rmdir("g/empty"),
    "mkdir": lambda tree, h: tree.mkdir("d/sub", 0o700),
    "symlink": lambda tree, h: tree.symlink("target", "d/ln"),
    "chmod": lambda tree, h: tree.set_attrs("d/f", mode=0o600),
}
STORE_OPS = {"store_set": _store_set, "store_delete_dir": _store_delete_dir}
OPERATIONS.update(STORE_OPS)


def _populate(tree: Tree) -> None:
    """Files with attributes, a nested folder with an empty folder, a hard link."""
    tree.mkdir("d", 0o755)
    tree.store([("d/f", b"original", None, CREATE)])
    tree.set_attrs("d/f", mode=0o644, uid=5, gid=6)
    tree.mkdir("g", 0o750)
    tree.mkdir("g/a", 0o755)
    tree.store([("g/a/0.0", b"chunk", None, CREATE)])
    tree.store([("g/a/.zarray", b"{}", None, CREATE)])
    tree.mkdir("g/empty", 0o700)
    tree.link("g/a/0.0", "g/a/0.1")


@pytest.fixture(params=["memory", *DRIVERS])
def any_url(request, tmp_path) -> str:
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return make_url(request.param, tmp_path, request)


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_a_failed_commit_stores_nothing(any_url, op):
    """The "nothing" half of every commit: the transaction fails at the driver, the call
    fails with EIO, and the database holds what it held, bookkeeping included; then the same
    operation succeeds (nothing cached of the failed attempt stands in its way)."""
    driver = open_driver(any_url)
    store = DatabaseStore(any_url) if op in STORE_OPS else None
    try:
        tree = Tree(driver, uid=1000, gid=1000)
        _populate(tree)
        before = everything(driver)
        if store is not None:
            target, run = store._db(), lambda: STORE_OPS[op](store)
        else:
            handles = HandleTable(tree, spill_threshold=1024)
            target, run = driver, lambda: OPERATIONS[op](tree, handles)
        with failing_commits(target, count=100) as faults:
            with pytest.raises(Exception) as info:
                run()
        assert faults.failed >= 1, "no commit was attempted"
        assert to_errno(info.value) == errno.EIO, repr(info.value)
        after = everything(driver)
        assert after[0] == before[0], "data keys changed by a failed commit"
        assert after[1] == before[1], "side records changed by a failed commit"
        if store is None:
            handles = HandleTable(tree, spill_threshold=1024)
        run()
        assert everything(driver) != before, "the operation did nothing when it succeeded"
    finally:
        if store is not None:
            store.close()
        driver.close()


# --- observers ------------------------------------------------------------------------------


class Observer:
    """An observer process (``tests/observers.py``) and what it printed so far."""

    def __init__(self, op: str, kind: str, where: str, label: str, counts: str | None = None) -> None:
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "observers.py"), op, kind, where, *([counts] if counts else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        self.seen = self.stale = 0
        self.wrong: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("~"):
                self.stale += 1
            elif line.startswith("!"):
                self.seen += 1
                self.wrong.append(line[2:].strip())
            else:
                self.seen += 1
        self.ready.set()

    def stop(self) -> str:
        """Stop it; its error output, if it failed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=60)
        return self.proc.stderr.read()


_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a))


def _write(path: Path, data: bytes) -> None:
    """One open, the data in several writes, one close (the commit)."""
    with open(path, "wb") as fh:
        for i in range(0, len(data), 7000):
            fh.write(data[i : i + 7000])


class Writer:
    """The operation under watch, repeated forward through generations (``observers.name``)."""

    def __init__(self, op: str, root: Path, url: str, exchanges: Exchanges | None = None) -> None:
        self.op, self.root, self.url = op, root, url
        self.store = DatabaseStore(url) if op in ("store_set", "exchange", "delete_dir") else None
        self.exchanges = exchanges  # told when each exchange begins and ends (observers.Exchanges)

    def p(self, rel: str) -> Path:
        return self.root / rel

    def _set(self, key: str, value: bytes) -> None:
        from zarr.core.buffer import default_buffer_prototype

        self.store.set_sync(key, default_buffer_prototype().buffer.from_bytes(value))

    def _group(self, k: int) -> None:
        """Generation k's folder for delete_dir, written in one transaction."""
        keys = [f"{name('delete_dir', k)}/{g}" for g in GROUP_KEYS]
        self.store._db().transact(lambda t: [t.put(key, b"v") for key in keys])

    def setup(self) -> None:
        op, p = self.op, self.p
        if op == "commit":
            _write(p("f"), content(0))
        elif op == "store_set":
            self._set("f", content(0))
        elif op == "exchange":
            self._set("x", content(0))
            self._set("n", content(1))
        elif op == "rename_file":
            p("d").mkdir()
            _write(p("d/f0"), b"moved")
        elif op == "rename_folder":
            for part in FOLDER_PARTS:
                p(f"g0/{part}").parent.mkdir(parents=True, exist_ok=True)
                _write(p(f"g0/{part}"), part.encode())
        elif op == "link":
            _write(p("s"), b"linked")
            os.link(p("s"), p("l0"))
        elif op == "rmdir":
            os.mkdir(p("r0"), DIR_MODE)
        elif op == "delete_dir":
            self._group(0)

    def step(self, k: int) -> None:
        """From generation k to k+1."""
        op, p = self.op, self.p
        if op == "commit":
            _write(p("f"), content(k + 1))
        elif op == "store_set":
            self._set("f", content(k + 1))
        elif op == "exchange":  # x: k -> k+1, n: k+1 -> k, then n rewritten: k+2
            self.exchanges.begin()
            _exchange(p("x"), p("n"))
            self.exchanges.end()
            # Rewritten by the store, in one transaction: a rewrite in place through the mount
            # is seen growing through that mount, as on a local disk.
            self._set("n", content(k + 2))
        elif op in ("rename_file", "rename_folder"):
            os.rename(p(name(op, k)), p(name(op, k + 1)))
        elif op == "link":
            os.link(p("s"), p(name(op, k + 1)))
            os.unlink(p(name(op, k)))
        elif op == "rmdir":
            os.mkdir(p(name(op, k + 1)), DIR_MODE)
            os.rmdir(p(name(op, k)))
        elif op == "delete_dir":
            self._group(k + 1)
            asyncio.run(self.store.delete_dir(name(op, k)))

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


# Operations done through mount "a" alone; the others are written (in part) by zarrfs.store,
# so that every mount is another mount to the writer.
THROUGH_THE_MOUNT = {"commit", "rename_file", "rename_folder", "link", "rmdir"}


def _limit(url: str, op: str, label: str) -> str | None:
    """Why an observer may see a state between two on this database (README, "Guarantees"), or
    None: then it never may. A Redis (and Redis Cluster) client reads a transaction's keys and
    records with several commands, and Redis has no read snapshot; another mount's names leave
    this mount's kernel cache one notification at a time (a notification waits for the lookups
    in its folder, and the mount answers them meanwhile). To a change made by ``zarrfs.store``,
    mount "a" is another mount as much as "b" is."""
    redis = url.startswith(("redis", "valkey"))
    if redis and label == "database client" and op not in ("rename_file", "rename_folder"):
        return "a Redis client reads a transaction in several commands"
    others = {"other mount"} | (set() if op in THROUGH_THE_MOUNT else {"same mount"})
    if label in others and op in ("rename_file", "rename_folder", "delete_dir"):
        return "another mount's names leave the kernel's cache one notification at a time"
    return None


WATCHED = ["commit", "store_set", "exchange", "rename_file", "rename_folder", "link", "rmdir", "delete_dir"]
MIN_STEPS = 60  # operations at least
MIN_SEEN = 40  # observations by each observer at least, while the operations go on
DEADLINE = 300  # seconds: a condition waited for, not a bound on speed


@pytest.mark.slow
@pytest.mark.parametrize("op", WATCHED)
@pytest.mark.usefixtures(*needs_fuse[1].args)
@pytest.mark.mount
def test_observers_see_the_state_before_or_after(op, db_url, mount_factory, request):
    _observe(op, db_url, mount_factory, [], request.config.getoption("--observe-steps") or MIN_STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "redis"])
@pytest.mark.usefixtures(*needs_fuse[1].args)
@pytest.mark.mount
def test_observers_see_a_commit_whole_with_request_threads(kind, tmp_path, request, mount_factory):
    """With ``-o workers=16`` two threads may read a close's release and the next open at
    once; the open, run first, emptied the file (``O_TRUNC``) and the late release stored it
    empty: the database's own client saw ``f`` empty between two commits."""
    steps = request.config.getoption("--observe-steps") or MIN_STEPS
    _observe("commit", make_url(kind, tmp_path, request), mount_factory, ["workers=16"], steps)


def _observe(op: str, db_url: str, mount_factory, extra: list[str], steps: int) -> None:
    old = os.umask(0o022)
    scratch = tempfile.TemporaryDirectory()
    try:
        a = mount_factory(db_url, ["create", *OPTIONS, *extra], name="a")
        b = mount_factory(db_url, OPTIONS, name="b")
        counts = os.path.join(scratch.name, "exchanges") if op == "exchange" else None
        writer = Writer(op, a.path, db_url, None if counts is None else Exchanges(counts, create=True))
        writer.setup()
        # Through the mount that writes, another process sees what is pending in an open file
        # (as on a local disk): the commit's observers there are the other mount and the client.
        kinds = [("mount", str(b.path), "other mount"), ("db", db_url, "database client")]
        if op != "commit":
            kinds.insert(0, ("mount", str(a.path), "same mount"))
        # The writer's exchanges are made through mount "a": only there can a lookup made
        # while one is under way find a node whose content moved on (observers.Exchanges).
        observers = [
            Observer(op, kind, where, label, counts if label == "same mount" else None)
            for kind, where, label in kinds
        ]
        try:
            for o in observers:
                assert o.ready.wait(60), f"{o.label} did not start: {o.stop()}"
            k = 0
            deadline = time.monotonic() + DEADLINE
            while k < steps or any(o.seen < MIN_SEEN for o in observers):
                writer.step(k)
                k += 1
                assert all(o.proc.poll() is None for o in observers), [o.stop() for o in observers]
                assert time.monotonic() < deadline, [(o.label, o.seen) for o in observers]
        finally:
            errors = [o.stop() for o in observers]
            writer.close()
        assert not any(errors), errors
        wrong = {o.label: o.wrong for o in observers if o.wrong and _limit(db_url, op, o.label) is None}
        broken = {label: seen[:5] for label, seen in wrong.items()}
        assert not broken, f"seen between two states after {k} operations: {broken}"
    finally:
        os.umask(old)
        scratch.cleanup()


# --- POSIX ACLs: a change of mode and ACL is one transaction ----------------------------------


def _write_transactions(driver, run) -> int:
    """How many write transactions ``run()`` makes on ``driver`` (each run of one counts)."""
    count = 0
    begin = driver._begin

    def counting(write: bool):
        nonlocal count
        count += bool(write)
        return begin(write)

    driver._begin = counting
    try:
        run()
    finally:
        del driver._begin
    return count


def test_a_change_of_mode_and_acl_is_one_transaction(any_url):
    """``setfacl`` (an access ACL sets the mode's permission bits), ``chmod`` of a node with
    an access ACL (it changes the ACL), and a file or folder made in a folder with a default
    ACL (it is made with its ACLs) each change the mode and the ACL in one transaction: no
    crash or other mount can see one without the other."""
    from zarrfs.fs import acl
    from zarrfs.fs.api import Operations

    driver = open_driver(any_url)
    try:
        tree = Tree(driver, uid=1000, gid=1000)
        _populate(tree)
        ops = Operations(tree, HandleTable(tree))
        ops.acl = True  # as when the kernel enforces ACLs (FUSE_POSIX_ACL agreed)
        entries = [
            (acl.USER_OBJ, 6, 0),
            (acl.USER, 4, 65534),
            (acl.GROUP_OBJ, 4, 0),
            (acl.MASK, 4, 0),
            (acl.OTHER, 0, 0),
        ]
        value = acl.pack(entries)
        assert _write_transactions(driver, lambda: ops.setxattr("d/f", acl.ACCESS, value)) == 1
        assert stat.S_IMODE(tree.lookup("d/f").attrs.mode) == 0o640
        assert _write_transactions(driver, lambda: ops.set_attrs("d/f", mode=0o600)) == 1
        assert acl.parse(tree.xattrs("d/f")[acl.ACCESS]) == acl.chmod(entries, 0o600)
        ops.setxattr("g", acl.DEFAULT, value)
        assert _write_transactions(driver, lambda: ops.mkdir("g/sub", 0o755, 1000, 1000, 0o022)) == 1
        made = tree.xattrs("g/sub")
        assert set(made) == {acl.ACCESS, acl.DEFAULT}
        assert stat.S_IMODE(tree.lookup("g/sub").attrs.mode) == acl.mode_bits(acl.parse(made[acl.ACCESS]))

        def create() -> None:
            ops.release(ops.create("g/new", 0o644, os.O_WRONLY, 1000, 1000, 0o022))

        assert _write_transactions(driver, create) == 1
        assert acl.ACCESS in tree.xattrs("g/new")
    finally:
        driver.close()
