"""The kernel's page cache through the FUSE session: which opens keep the cached pages, and the
last partial page handed to the kernel after a commit (see :mod:`zarrfs.fs.pagecache` for the
policy alone)."""

from __future__ import annotations

import os

from session_wire import release_storing, stores, z

from zarrfs.fs.api import DIRECT_ABOVE
from zarrfs.fs.commitoptions import REWRITE
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
    fh, flags = wire.open(f.nodeid, os.O_RDWR)  # a writer: through the cache
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


