"""When the kernel may keep the pages it cached of a file: the policy, without FUSE.

At each open the filesystem says whether the kernel's cached pages of the file may stay or must be
dropped. A file counts as unchanged while its size and mtime are those last shown to the kernel
(as libfuse's ``auto_cache``); content written through the mount is kept too, since the kernel's
pages of it are what was stored, and after such a commit the last partial page can be handed to
the kernel, which then never reads the file back. :class:`PageCache` decides;
:mod:`zarrfs.fuse.session` turns its decisions into ``FOPEN_KEEP_CACHE`` and ``NOTIFY_STORE``; what
it remembers of each file lives in a :class:`Pages` (the session's inodes are ``Pages``). A
read-only open of a file of at least ``direct_above`` bytes the kernel holds no pages of is read
past the page cache (``FOPEN_DIRECT_IO``, :meth:`PageCache.direct`), so a chunk read once crosses
memory once; the next open of that version caches it. What is read once never crowds the cache,
what is read again stays; small files (metadata, read again and again) always use the cache.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from zarrfs.fs.node import FILE, Node
from zarrfs.fs.spill import SpillBuffer

#: Files from this size on are read past the page cache at a first reading (-o direct_above=).
DIRECT_ABOVE = 64 << 10


class Stamped(Protocol):
    """What a commit reports (:class:`Stored` is one)."""

    size: int
    mtime: int
    tail: bytes
    others: bool


class Pages:
    """What the policy remembers of one file the kernel holds: the ``(size, mtime)`` last shown
    to the kernel (``stamp``) and when (``stamp_time``, on the policy's clock), whether
    the pages the kernel holds now are known to be the content (``cache_ok``), whether its
    pages and attributes were dropped with nothing shown since (``bare``), and the mark
    (:func:`version_mark`) of the version whose attributes the kernel was last given and still
    holds (``given``; 0: none), kept for every file, opened or not."""

    __slots__ = ("stamp", "stamp_time", "cache_ok", "bare", "given")

    def __init__(self) -> None:
        self.stamp: tuple[int, int] | None = None
        self.stamp_time = 0.0
        self.cache_ok = False
        self.bare = False
        self.given = 0

    def remembered(self) -> bool:
        """Whether the policy holds anything of the file beside ``given`` (its pages were
        shown, kept or dropped): a node only listed has nothing, and costs nothing more."""
        return self.stamp is not None or self.cache_ok or self.bare


#: :attr:`Pages.given` of a file the kernel was shown two versions of since it last dropped its
#: attributes: it holds one of them, not known which (never a version's mark). Two requests
#: that bring attributes (a lookup, a getattr) may be on their way at once; the kernel takes in
#: the answer its caller gets to first and ignores the other (its ``attr_version`` rule), so
#: when another writer's commit came between the two answers, the later one, which the mount
#: would record, may be the one ignored.
TWO_VERSIONS = 1


def version_mark(size: int, mtime: int) -> int:
    """A number standing for the version ``(size, mtime)`` of a file, never 0 nor
    :data:`TWO_VERSIONS` (8 bytes a node, where a million listed names are a million nodes)."""
    mark = hash((size, mtime)) & 0xFFFF_FFFF_FFFF_FFFF
    return mark if mark > TWO_VERSIONS else 2


def given_after(given: int, mark: int) -> int:
    """:attr:`Pages.given` once the kernel is shown the version ``mark`` of a file whose
    attributes it was given as ``given`` (0: none held): that version, unless another one
    was given and not dropped since (:data:`TWO_VERSIONS`, until the next drop)."""
    return mark if not given or given == mark else TWO_VERSIONS


class PageCache:
    """The page cache policy of one mount. ``attr_timeout`` is how long the kernel trusts the
    attributes it was given: an open after that looks at the file again before it decides."""

    def __init__(
        self,
        attr_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        direct_above: int | None = DIRECT_ABOVE,
    ) -> None:
        self.attr_timeout = attr_timeout
        self.clock = clock
        self.direct_above = direct_above

    def direct(self, kept: bool, seen: Node | None, readonly: bool) -> bool:
        """Whether an open reads past the kernel's page cache: a read-only open that may not
        keep the kernel's pages (``kept`` False: it holds none of this version) of a file
        found in the database (``seen``; None when this mount has content pending for it) of
        at least :attr:`direct_above` bytes. None turns it off."""
        return (
            not kept
            and readonly
            and self.direct_above is not None
            and seen is not None
            and seen.kind == FILE
            and seen.size >= self.direct_above
        )

    def shown(self, pages: Pages, node: Node) -> None:
        """The kernel was given ``node``'s attributes (a lookup, a getattr). A changed size or
        mtime means the pages it holds are of an older content: the next open drops them.
        A file never opened (no stamp, no pages kept, nothing dropped) has no pages to compare:
        only the version given is kept (:attr:`Pages.given`, a number), which keeps the many
        names an ``ls -l`` shows at the size of their node IDs. Shown another version than the
        one it was given and holds, the kernel holds one of the two (:data:`TWO_VERSIONS`):
        the next open drops its attributes and reads past the page cache."""
        if node.kind == FILE:
            pages.given = given_after(pages.given, version_mark(node.size, node.attrs.mtime))
        if pages.remembered():
            self._record(pages, node)

    def differs(self, pages: Pages, node: Node) -> bool:
        """Whether the kernel may hold the attributes of another version of the file than
        ``node``: some were given to it, and not dropped since. Its size over the pages of
        ``node``'s version would cut or pad what a descriptor reads."""
        return bool(pages.given) and pages.given != version_mark(node.size, node.attrs.mtime)

    def holds(self, pages: Pages, node: Node) -> bool:
        """Whether the kernel holds the attributes of ``node``'s version of the file (given,
        and not dropped since): its size is that version's. Else (dropped, or another
        version's) it may read past the end of ``node``'s content the size it last had."""
        return pages.given == version_mark(node.size, node.attrs.mtime)

    def attrs_dropped(self, pages: Pages) -> None:
        """A notification dropping the kernel's attributes of the file was written (the kernel
        holds none now, until it is next shown the file)."""
        pages.given = 0

    def _record(self, pages: Pages, node: Node) -> None:
        pages.bare = False
        if node.kind == FILE:  # folders and symlinks have no pages to keep
            stamp = (node.size, node.attrs.mtime)
            if stamp != pages.stamp:
                pages.stamp = stamp
                pages.cache_ok = False
            pages.stamp_time = self.clock()

    def stored(self, pages: Pages, stored: Stamped) -> tuple[int, bytes] | None:
        """Content written through the mount was stored as ``stored``: the kernel's pages of
        the file are that content, so the next open may keep them. Returns ``(offset, data)``,
        the last partial page to hand to the kernel, or None.

        The kernel marks a page it wrote through as up to date only when the write covered all
        of it; a partial last page would be read back from the database at the next read of the
        file (a Zarr chunk's last page, most of the time). The commit gives that page only once
        no descriptor of the file is open (see :func:`last_page`), so no request of ours can hold
        the page's lock while the kernel takes it.

        When the commit laid this mount's changes on another mount's newer version
        (``stored.others``), the kernel's pages are not the content: they are dropped as by
        :meth:`dropped`, and the caller drops the kernel's."""
        if stored.others:
            self.dropped(pages)
            return None
        # The kernel's size is that of the writes it passed on, the stored size.
        pages.given = version_mark(stored.size, stored.mtime)
        pages.bare = False
        pages.stamp = (stored.size, stored.mtime)
        pages.stamp_time = self.clock()
        pages.cache_ok = True
        if not stored.tail:
            return None
        return stored.size - len(stored.tail), stored.tail

    def dropped(self, pages: Pages) -> None:
        """The kernel's pages and attributes of the file are being dropped (a lock on it was
        granted, or another mount's bytes were stored with this mount's): the next open keeps
        none, and looks at the file again. The caller drops the attributes before it answers
        anything else (its pages may be dropped later: no open keeps them meanwhile). Until
        the kernel is next shown the file, dropping them again is needless
        (:attr:`Pages.bare`); it would even be wrong: the kernel ignores the attributes of a
        reply to a request it sent before a drop, so a late drop could make it keep the size
        it had before the first (an ``lseek(SEEK_END)`` under a lock)."""
        pages.bare = True
        pages.given = 0
        pages.stamp = None
        pages.stamp_time = 0.0
        pages.cache_ok = False

    def opened(
        self, pages: Pages, find: Callable[[str], Node | None], key: str, seen: Node | None = None
    ) -> bool:
        """Whether an open of the file at ``key`` may keep the kernel's pages of it. ``seen``
        is the file as the open read it from the database: the decision is made on it, never
        on attributes the kernel was given earlier (another mount may have replaced the file
        within the attribute timeout). Without it (content pending in this mount), when the
        kernel's attributes may have expired, the file is looked at again (``find(key)``).
        Whatever the answer, the pages the kernel reads from now on are the content seen
        here, so the open after this one may keep them unless the file changes again."""
        if seen is not None:
            self._record(pages, seen)
        elif self.clock() - pages.stamp_time > self.attr_timeout:
            node = find(key)
            if node is not None:
                self._record(pages, node)
        keep, pages.cache_ok = pages.cache_ok, True
        return keep


__all__ = ["TWO_VERSIONS", "PageCache", "Pages", "Stamped", "given_after", "version_mark"]


PAGE = mmap.PAGESIZE


class Stored(NamedTuple):
    """What a commit stored: ``size`` and ``mtime`` decide whether the kernel's cached pages of
    the file still hold; ``tail`` is the content from ``size - len(tail)`` to the end to hand
    to the kernel (its last, partial page, :func:`last_page`; or all of it,
    :func:`whole_content`), given only when no descriptor of the file is open any more, else
    empty. ``others``:
    what was stored holds bytes another mount committed (the commit laid this mount's changes
    on them), so the kernel's pages of the file are not the content."""

    size: int
    mtime: int
    tail: bytes = b""
    others: bool = False


def last_page(buffer: SpillBuffer) -> bytes:
    """The content of the last, partial page of ``buffer`` (empty for whole pages)."""
    # The kernel marks a page it wrote through as up to date only when the write covered all of
    # it: the last page of a file whose size is not a multiple of the page size would be read
    # back from the database at the file's next read, unless it is handed to the kernel. The
    # kernel takes it under the page's lock; with no descriptor open, no request that could
    # hold that lock (a READ, a WRITE) is waiting for the daemon, so it can be handed over
    # before the reply, without a thread.
    cut = buffer.size % PAGE
    return bytes(buffer.read(buffer.size - cut, cut)) if cut else b""


def whole_content(buffer: SpillBuffer) -> bytes:
    """All of ``buffer``, for a file written past the page cache (``FOPEN_DIRECT_IO``): the
    kernel holds none of its pages, and a write through the cache would have left them all
    there. Only while it is in memory: a file larger than the spill threshold is read back
    from the database, as a first reading of a large file is (:meth:`PageCache.direct`)."""
    return bytes(buffer.read(0, buffer.size)) if buffer.in_memory else b""
