"""The kernel's page cache through the FUSE session: which opens keep the cached pages, and the
last partial page handed to the kernel after a commit (see :mod:`zarrfs.fs.pagecache` for the
policy alone)."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import pytest
from session_wire import GID, UID, attr_of, entry_of, release_storing, stores, z

from zarrfs.fs.api import DIRECT_ABOVE
from zarrfs.fs.commitoptions import REWRITE
from zarrfs.fs.tree import RENAME_EXCHANGE
from zarrfs.fuse import abi as k


# ---------------------------------------------------------------------- OPEN and the page cache
def test_open_keeps_the_cache_only_while_the_file_is_unchanged(make_wire):
    wire = make_wire(attr_timeout=60)
    # Stored by a driver directly: the first open finds no pages it could trust.
    wire.ops.tree.store([("f", b"one", None, REWRITE)])
    f = wire.lookup(k.ROOT_ID, "f")
    fh, flags = wire.open(f.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    wire.release(f.nodeid, fh)
    fh, flags = wire.open(f.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE  # unchanged since the pages were read
    wire.release(f.nodeid, fh)
    # Another client changes the file; the kernel's next GETATTR sees it, the next open drops pages.
    wire.ops.tree.store([("f", b"three", None, REWRITE)])
    assert wire.getattr(f.nodeid).size == 5
    fh, flags = wire.open(f.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    assert wire.read(f.nodeid, fh) == b"three"
    wire.release(f.nodeid, fh)


def test_a_first_read_only_open_of_a_large_file_goes_past_the_page_cache(make_wire):
    """On a kernel that can map such files (7.39, DIRECT_IO_ALLOW_MMAP), a large file none of
    whose pages the kernel holds is read past its page cache on that open; the next open
    caches it. Writers, small files and kernels without the flag keep the page cache."""
    wire = make_wire(attr_timeout=60)
    assert wire.init(minor=39, flags=k.MAX_PAGES, flags2=k.DIRECT_IO_ALLOW_MMAP >> 32).error == 0
    assert wire.session.agreed.direct_io_mmap
    big = os.urandom(DIRECT_ABOVE)
    wire.ops.tree.store([("big", big, None, REWRITE)])
    wire.ops.tree.store([("small", b"{}", None, REWRITE)])
    f = wire.lookup(k.ROOT_ID, "big")
    fh, flags = wire.open(f.nodeid)
    assert flags & k.FOPEN_DIRECT_IO and not flags & k.FOPEN_KEEP_CACHE
    assert wire.read(f.nodeid, fh, size=4096, offset=4096) == big[4096:8192]
    wire.release(f.nodeid, fh)
    fh, flags = wire.open(f.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE and not flags & k.FOPEN_DIRECT_IO
    wire.release(f.nodeid, fh)
    wire.ops.tree.store([("big", big + b"+", None, REWRITE)])
    assert wire.getattr(f.nodeid).size == len(big) + 1
    # A writer: through the cache. The kernel was shown a second version with nothing dropped
    # since the first (which the mount cannot tell from two answers on their way at once,
    # fs.pagecache.TWO_VERSIONS): the open drops its attributes before the reply.
    unique = wire.send(k.OPEN, f.nodeid, k.OPEN_IN.pack(os.O_RDWR, 0))
    drop, reply = wire.messages()
    assert (drop.unique, drop.error, reply.unique, reply.error) == (0, -k.NOTIFY_INVAL_INODE, unique, 0)
    fh, flags = k.OPEN_REPLY.unpack(reply.raw)[3:5]
    assert not flags & (k.FOPEN_DIRECT_IO | k.FOPEN_KEEP_CACHE)
    wire.release(f.nodeid, fh)
    s = wire.lookup(k.ROOT_ID, "small")
    fh, flags = wire.open(s.nodeid)
    assert not flags & k.FOPEN_DIRECT_IO
    wire.release(s.nodeid, fh)


def test_without_mappable_direct_io_every_open_uses_the_page_cache(make_wire):
    wire = make_wire(attr_timeout=60)
    assert wire.init(minor=39, flags=k.MAX_PAGES).error == 0  # flags2 not offered
    assert not wire.session.agreed.direct_io_mmap
    wire.ops.tree.store([("big", bytes(1 << 20), None, REWRITE)])
    f = wire.lookup(k.ROOT_ID, "big")
    fh, flags = wire.open(f.nodeid)
    assert not flags & k.FOPEN_DIRECT_IO
    wire.release(f.nodeid, fh)


def test_pages_written_through_the_mount_are_kept_after_the_commit(make_wire):
    """The kernel's pages of a file written here are its content: a later open keeps them,
    also when the file was a temporary one stored by its rename (zarr-python's .partial)."""
    wire = make_wire(attr_timeout=60)
    g = wire.put_file(k.ROOT_ID, "g", b"written here")
    assert wire.getattr(g.nodeid).size == 12  # the stored size and mtime are what the commit said
    fh, flags = wire.open(g.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE
    wire.release(g.nodeid, fh)
    tmp = wire.put_file(k.ROOT_ID, "c.partial", b"chunk")
    assert wire.ops.tree.driver.get("c.partial") is None  # held until its rename
    assert wire.rename(k.ROOT_ID, "c.partial", k.ROOT_ID, "c").error == 0
    assert wire.inodes.key(tmp.nodeid) == "c"
    fh, flags = wire.open(tmp.nodeid)
    assert flags & k.FOPEN_KEEP_CACHE
    assert wire.read(tmp.nodeid, fh) == b"chunk"
    wire.release(tmp.nodeid, fh)
    # A commit by someone else afterwards still drops them at the next open.
    wire.ops.tree.store([("c", b"another", None, REWRITE)])
    assert wire.getattr(tmp.nodeid).size == 7
    fh, flags = wire.open(tmp.nodeid)
    assert not flags & k.FOPEN_KEEP_CACHE
    wire.release(tmp.nodeid, fh)


def test_only_a_file_opened_for_writing_is_flushed_at_its_close(wire):
    """A read-only open asks the kernel not to send FLUSH (nothing to store); one that may write
    keeps it, since its close is where its writes are stored and their errors reported."""
    f = wire.put_file(k.ROOT_ID, "f", b"data")
    for flags, flushed in ((os.O_RDONLY, False), (os.O_WRONLY, True), (os.O_RDWR, True)):
        fh, open_flags = wire.open(f.nodeid, flags)
        assert bool(open_flags & k.FOPEN_NOFLUSH) is not flushed, flags
        wire.release(f.nodeid, fh)




def test_a_stored_file_hands_its_last_partial_page_to_the_kernel(wire):
    """The kernel keeps the pages a write covered whole; the last one of a file whose size is
    not a multiple of the page size is handed to it once the file is stored and no descriptor
    of it is open (its last close, or the rename of a held temporary file), before the reply:
    reading the file back then needs no READ."""
    data = bytes(range(256)) * 40  # 10,240 bytes: two full pages and 2,048 bytes
    wire.put_file(k.ROOT_ID, "early", data)  # before INIT there is no kernel to tell
    assert wire.init().error == 0
    entry, fh = wire.create(k.ROOT_ID, "f")
    wire.write(entry.nodeid, fh, data)
    wire.flush(entry.nodeid, fh)  # stored, but the descriptor is still open: one reply only
    assert release_storing(wire, entry.nodeid, fh) == [(entry.nodeid, 8192, data[8192:])]

    wire.put_file(k.ROOT_ID, "pages", b"p" * 8192)  # full pages only: nothing to hand over
    entry, fh = wire.create(k.ROOT_ID, "0.partial")  # held until its rename
    wire.write(entry.nodeid, fh, data[:5000])
    wire.flush(entry.nodeid, fh)
    wire.release(entry.nodeid, fh)
    unique = wire.send(k.RENAME, k.ROOT_ID, k.RENAME_IN.pack(k.ROOT_ID) + z("0.partial") + z("0"))
    out = wire.messages()
    assert [(m.unique, m.error) for m in out] == [(0, -k.NOTIFY_STORE), (unique, 0)]
    assert stores(out) == [(entry.nodeid, 4096, data[4096:5000])]
    assert wire.ops.tree.driver.get("0") == data[:5000]

    # While another descriptor is open, the page waits for that one's close.
    f = wire.lookup(k.ROOT_ID, "f")
    a, _ = wire.open(f.nodeid, os.O_RDWR)
    b, _ = wire.open(f.nodeid, os.O_RDONLY)
    wire.write(f.nodeid, a, b"new", 10_000)
    wire.flush(f.nodeid, a)
    assert release_storing(wire, f.nodeid, a) == []
    assert release_storing(wire, f.nodeid, b) == [
        (f.nodeid, 8192, data[8192:10_000] + b"new" + data[10_003:])
    ]
    # A file opened and closed without a change: nothing stored, nothing handed over.
    a, _ = wire.open(f.nodeid, os.O_RDWR)
    assert release_storing(wire, f.nodeid, a) == []




# ---------------------------------------------------------------------- the size the kernel holds
# An open reads one version; the kernel cuts what its descriptor reads to the size it holds,
# and pads it with zeros up to that size when a read comes back short but the kernel may not
# take the shorter size (a drop reached it while the read was on its way). Each reply with
# attributes gives it a size; a NOTIFY_INVAL_INODE makes it ask again, at its next need, but
# keeps the size meanwhile: a read short of it does not ask. So when an open that reads through
# the page cache is answered, the kernel must hold that version's size, or none, or a smaller
# one (a read past it asks). These tests keep that account of the messages, in order.


class KernelSizes:
    """The size the kernel holds of each node (and whether it trusts it), from the messages
    the session wrote, in order."""

    def __init__(self, wire) -> None:
        self.wire = wire
        self.size: dict[int, tuple[int, bool]] = {}
        self.dropped: list[int] = []  # node IDs, as the notifications came

    def ask(self, opcode: int, nodeid: int, body: bytes = b"", taken: bool = True):
        """One request; its reply, after every message written before it was taken in order.
        ``taken`` False: the kernel ignores the reply's attributes (the request was on its way
        beside another that brings them, whose answer its caller took in first)."""
        unique = self.wire.send(opcode, nodeid, body)
        reply = None
        for m in self.wire.messages():
            if m.unique == 0 and m.error == -k.NOTIFY_INVAL_INODE:
                dropped = k.NOTIFY_INVAL_INODE_OUT.unpack(m.raw)[3]
                self.dropped.append(dropped)
                if dropped in self.size:
                    self.size[dropped] = (self.size[dropped][0], False)
            elif m.unique == unique:
                reply = m
        assert reply is not None and reply.error == 0, (k.OPCODE_NAMES.get(opcode), reply)
        if not taken:
            return reply
        if opcode == k.LOOKUP:
            entry = entry_of(reply)
            self.size[entry.nodeid] = (entry.attr.size, True)
        elif opcode == k.GETATTR:
            self.size[nodeid] = (attr_of(reply).size, True)
        return reply

    def lookup(self, name: str) -> int:
        return entry_of(self.ask(k.LOOKUP, k.ROOT_ID, z(name))).nodeid

    def getattr(self, nodeid: int) -> int:
        return attr_of(self.ask(k.GETATTR, nodeid, k.GETATTR_IN.pack(0, 0, 0))).size

    def open(self, nodeid: int) -> int:
        """A read-only open: past the page cache, or once the kernel holds a size that cannot
        cut or pad what the descriptor reads."""
        reply = self.ask(k.OPEN, nodeid, k.OPEN_IN.pack(os.O_RDONLY, 0))
        fh, flags = k.OPEN_REPLY.unpack(reply.raw)[3:5]
        seen = self.wire.ops.handles.handles[fh].seen
        size, trusted = self.size.get(nodeid, (seen.size, True))
        if not flags & k.FOPEN_DIRECT_IO:
            assert size == seen.size or not trusted and size < seen.size, (
                f"opened at {seen.size} bytes through the page cache, the kernel holds {size}"
                f" ({'trusted' if trusted else 'to ask again past it'})"
            )
        return fh

    def read(self, nodeid: int, fh: int) -> bytes:
        return self.ask(k.READ, nodeid, k.READ_IN.pack(fh, 0, 1 << 16, 0, 0, 0, 0)).body

    def release(self, nodeid: int, fh: int) -> None:
        self.ask(k.RELEASE, nodeid, k.RELEASE_IN.pack(fh, 0, 0, 0))


def mappable_init(wire) -> None:
    """INIT of a kernel that maps files read past its page cache (7.39)."""
    assert wire.init(minor=39, flags=k.MAX_PAGES, flags2=k.DIRECT_IO_ALLOW_MMAP >> 32).error == 0


def _kernel_at(make_wire, init: str):
    """A session whose attributes the kernel keeps an hour, begun at protocol ``init`` (7.39:
    files read past the page cache can be mapped), and the kernel's sizes as it takes them."""
    wire = make_wire(attr_timeout=3600)
    if init == "7.39":
        mappable_init(wire)
    else:
        assert wire.init().error == 0
    return wire, KernelSizes(wire)


@contextmanager
def notifications_held(wire):
    """The session's notification thread kept busy, as when the kernel makes a notification
    wait (one dropping a name waits for its folder's lock, held by a rename the session has
    not answered yet): what is queued meanwhile reaches the kernel after it."""
    gate = threading.Event()
    wire.session.invalidator.send_then([], gate.wait)
    try:
        yield
    finally:
        gate.set()


@pytest.fixture
def followed(tmp_path, make_wire):
    """A session after INIT, with its change feed, over a SQLite database, and the filesystem
    calls of another mount of it: ``(KernelSizes of the session, the other's Operations)``."""
    from zarrfs.backends import open_driver
    from zarrfs.fs.api import ChangeWatcher, Operations
    from zarrfs.fs.handles import HandleTable
    from zarrfs.fs.tree import Tree
    from zarrfs.fuse.coherence import Coherence

    url = f"sqlite://{tmp_path}/shared.sqlite"
    drivers = [open_driver(url), open_driver(url)]
    here, there = (Tree(d, uid=UID, gid=GID) for d in drivers)
    wire = make_wire(Operations(here, HandleTable(here)), attr_timeout=3600)
    wire.session.coherence = Coherence(wire.session, ChangeWatcher(here))
    mappable_init(wire)
    yield KernelSizes(wire), Operations(there, HandleTable(there))
    for d in drivers:
        d.close()


@pytest.mark.parametrize("init", ["7.31", "7.39"])
def test_an_open_drops_the_size_a_lookup_gave_of_an_older_version(make_wire, init):
    """No change feed: the kernel holds the size a lookup gave (the file never opened here);
    another mount rewrites the file, longer; the open reads the new version, and drops that
    size before its reply (a read past it then asks)."""
    wire, kernel = _kernel_at(make_wire, init)
    wire.ops.tree.store([("f", b"old", None, REWRITE)])
    f = kernel.lookup("f")
    wire.ops.tree.store([("f", b"the newer version", None, REWRITE)])  # behind the mount
    fh = kernel.open(f)
    assert f in kernel.dropped
    assert kernel.read(f, fh) == b"the newer version"


@pytest.mark.parametrize("second", ["lookup", "getattr"])
@pytest.mark.parametrize("init", ["7.31", "7.39"])
def test_an_open_after_two_versions_shown_at_once_drops_the_size_the_kernel_took(make_wire, init, second):
    """Two requests that bring a file's attributes on their way at once (two processes' path
    lookups, a lookup and an fstat), another mount's commit between their answers: the kernel
    takes in the answer its caller gets to first and ignores the other (sent before that one
    was taken in), so it may keep the older version's size while the mount answered the newer
    one last. The open of the newer version drops that size before its reply (past the page
    cache where the kernel can map such files). It took the last answer for the size the
    kernel holds, read through the page cache: cut to the older size (CI's
    ``[postgres-exchange]``: the same mount's reader of ``n`` got 2,000 bytes of a
    62,022-byte version, x and n exchanged and n rewritten by ``zarrfs.store`` meanwhile)."""
    wire, kernel = _kernel_at(make_wire, init)
    wire.ops.tree.store([("f", b"old" * 10, None, REWRITE)])
    f = kernel.lookup("f")
    if second == "getattr":  # the file was opened before: its page state answers the getattr
        kernel.release(f, kernel.open(f))
    wire.ops.tree.store([("f", b"the newer version" * 4, None, REWRITE)])  # behind the mount
    if second == "lookup":
        kernel.ask(k.LOOKUP, k.ROOT_ID, z("f"), taken=False)
    else:
        kernel.ask(k.GETATTR, f, k.GETATTR_IN.pack(0, 0, 0), taken=False)
    assert kernel.size[f] == (30, True)
    fh = kernel.open(f)
    assert kernel.read(f, fh) == b"the newer version" * 4
    kernel.release(f, fh)
    assert kernel.getattr(f) == 68  # taken in: the next open may read through the page cache
    fh = kernel.open(f)
    assert kernel.read(f, fh) == b"the newer version" * 4


def test_a_shorter_version_than_the_size_the_kernel_keeps_is_read_past_the_page_cache(followed):
    """Another mount rewrites the file shorter: the change feed drops the size the kernel
    trusted, which it keeps all the same; the next open reads the shorter version past the
    page cache, where that size pads nothing."""
    kernel, other = followed
    other.tree.store([("f", b"long" * 30, None, REWRITE)])
    f = kernel.lookup("f")
    other.tree.store([("f", b"short", None, REWRITE)])
    kernel.wire.session.coherence.poll()
    fh = kernel.open(f)
    assert kernel.read(f, fh) == b"short"


def test_an_exchange_drops_the_sizes_it_changes_before_its_reply(followed):
    """``x`` and ``n`` exchanged: each node keeps its content, so the kernel's sizes stand
    and nothing is dropped. Exchanged again while another mount's rewrite of ``n`` is not
    heard yet, and while the notification thread is held: the node of ``n``, now ``x``, is
    opened at the rewritten version, whose size the kernel holds by then."""
    kernel, other = followed
    other.tree.store([("x", b"x" * 3, None, REWRITE)])
    other.tree.store([("n", b"n" * 50, None, REWRITE)])
    x, n = kernel.lookup("x"), kernel.lookup("n")
    body = k.RENAME2_IN.pack(k.ROOT_ID, RENAME_EXCHANGE, 0) + z("x") + z("n")
    kernel.ask(k.RENAME2, k.ROOT_ID, body)
    assert kernel.dropped == [] and kernel.size == {x: (3, True), n: (50, True)}
    other.tree.store([("x", b"rewritten", None, REWRITE)])  # x is n's node now
    with notifications_held(kernel.wire):
        kernel.ask(k.RENAME2, k.ROOT_ID, body)
        fh = kernel.open(n)
        assert kernel.read(n, fh) == b"rewritten"
        fh = kernel.open(x)
        assert kernel.read(x, fh) == b"x" * 3


def test_the_last_close_of_an_older_version_drops_its_size_before_the_next_open(followed):
    """A descriptor reads the version it opened while another mount's newer, shorter one is
    stored: the file is shown at the older size until that descriptor's release; the open
    after it reads the newer version, with the notification thread held meanwhile."""
    kernel, other = followed
    other.tree.store([("f", b"o" * 90, None, REWRITE)])
    f = kernel.lookup("f")
    old = kernel.open(f)
    assert kernel.read(f, old) == b"o" * 90
    other.tree.store([("f", b"N" * 60, None, REWRITE)])
    kernel.wire.session.coherence.poll()
    assert kernel.getattr(f) == 90  # shown as the version its descriptor reads
    with notifications_held(kernel.wire):
        kernel.release(f, old)
        fh = kernel.open(f)
        assert kernel.read(f, fh) == b"N" * 60


def test_an_exchange_moves_the_older_version_its_page_cached_descriptors_read(followed):
    """``n`` open at a version read through the page cache, then rewritten by another mount
    and opened again (that descriptor reads past the cache); then ``x`` and ``n`` exchanged.
    The node of ``n``, now ``x``, is still shown as the version its first descriptor reads;
    the node of ``x``, now ``n``, as its own stored version: the older version of the other
    file stays with that file (it was left under the name ``n``, and ``n``'s new node was
    shown at its size: reads of it cut or padded to another file's size)."""
    kernel, other = followed
    other.tree.store([("x", b"x" * 3, None, REWRITE)])
    other.tree.store([("n", b"o" * 90, None, REWRITE)])
    x, n = kernel.lookup("x"), kernel.lookup("n")
    old = kernel.open(n)
    assert kernel.read(n, old) == b"o" * 90
    other.tree.store([("n", b"N" * 60, None, REWRITE)])
    kernel.wire.session.coherence.poll()
    newer = kernel.open(n)
    assert kernel.read(n, newer) == b"N" * 60
    body = k.RENAME2_IN.pack(k.ROOT_ID, RENAME_EXCHANGE, 0) + z("x") + z("n")
    kernel.ask(k.RENAME2, k.ROOT_ID, body)
    assert kernel.getattr(n) == 90  # shown as the version its page-cached descriptor reads
    assert kernel.getattr(x) == 3
    fh = kernel.open(x)
    assert kernel.read(x, fh) == b"x" * 3
    kernel.release(n, old)
    kernel.release(n, newer)
    assert kernel.getattr(n) == 60


def test_an_open_after_the_newer_versions_closed_still_leaves_the_page_cache_to_the_older(followed):
    """A descriptor reads version A through the page cache; B is opened past it and closed;
    C is opened (no open state of the name left but A's), then D: the file is shown as A
    until A's last close, whatever C's close does meanwhile. C's state was taken for one
    that reads through the page cache: D's open filed it over A's, and C's close then left
    the file shown at D's size over A's pages (reads of A cut, or two versions' pages)."""
    kernel, other = followed
    poll = kernel.wire.session.coherence.poll
    other.tree.store([("f", b"o" * 90, None, REWRITE)])
    f = kernel.lookup("f")
    old = kernel.open(f)
    assert kernel.read(f, old) == b"o" * 90
    fhs = []
    for value in (b"N" * 60, b"Z" * 30, b"Q" * 45):
        other.tree.store([("f", value, None, REWRITE)])
        poll()
        fhs.append(kernel.open(f))
        assert kernel.read(f, fhs[-1]) == value
        if value == b"N" * 60:
            kernel.release(f, fhs.pop())
    kernel.release(f, fhs[0])  # C's last close
    assert kernel.getattr(f) == 90  # A's descriptor still reads through the page cache
    kernel.release(f, old)
    kernel.release(f, fhs[1])
    assert kernel.getattr(f) == 45


def test_a_change_from_before_a_lock_is_granted_drops_nothing_the_kernel_was_shown_since(tmp_path, make_wire):
    """Another mount commits a line; this mount's lock on the file is granted (its attributes
    dropped before the reply) and a getattr shows the new size; then the change feed tells of
    that change, made before the grant. The kernel holds its version: nothing is dropped. A
    drop there reaches the kernel while it may still be taking in the getattr's answer, which
    it then ignores, keeping the old size: the lock holder's lseek(SEEK_END) wrote its line
    over the other mount's (tests/sharing/test_shared_writes.py's appends, Redis). A change
    made after the grant is dropped as ever (the open file shows the version its lock read
    until its next lock, as NFS's locks do)."""
    from zarrfs.backends import open_driver
    from zarrfs.fs.api import ChangeWatcher, Operations
    from zarrfs.fs.handles import HandleTable
    from zarrfs.fs.locks import LockTable
    from zarrfs.fs.tree import Tree
    from zarrfs.fuse.coherence import Coherence

    url = f"sqlite://{tmp_path}/shared.sqlite"
    drivers = [open_driver(url), open_driver(url)]
    try:
        here, there = (Tree(d, uid=UID, gid=GID) for d in drivers)
        wire = make_wire(Operations(here, HandleTable(here), LockTable(drivers[0])), attr_timeout=3600)
        coherence = wire.session.coherence = Coherence(wire.session, ChangeWatcher(here))
        flags2 = k.DIRECT_IO_ALLOW_MMAP >> 32
        assert wire.init(minor=39, flags=k.MAX_PAGES | k.LOCKS, flags2=flags2).error == 0
        kernel = KernelSizes(wire)
        there.store([("log", b"", None, REWRITE)])
        coherence.poll()
        f = kernel.lookup("log")
        fh = k.OPEN_REPLY.unpack(kernel.ask(k.OPEN, f, k.OPEN_IN.pack(os.O_RDWR, 0)).raw)[3]
        assert kernel.getattr(f) == 0

        there.store([("log", b"p1-00000\n", None, REWRITE)])  # another mount's line
        unique = wire.send(k.SETLK, f, k.LK_IN.pack(fh, 7, 0, 2**63 - 1, k.F_WRLCK, os.getpid(), 0, 0))
        granted = [m for m in wire.messages(wait=60.0, count=3) if m.unique == unique]
        assert granted and granted[0].error == 0
        assert kernel.getattr(f) == 9  # the lock brought the file up to date
        dropped = len(kernel.dropped)
        coherence.poll()
        assert kernel.getattr(f) == 9
        assert f not in kernel.dropped[dropped:]

        there.store([("log", b"p1-00000\np1-00001\n", None, REWRITE)])  # after the grant
        coherence.poll()
        kernel.getattr(f)  # the messages written before its reply are read with it
        assert f in kernel.dropped[dropped:]
    finally:
        for d in drivers:
            d.close()
