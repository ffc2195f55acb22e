"""The page cache policy alone: which opens keep the kernel's pages, and which page a commit
hands over. No FUSE, no database: nodes are stand-ins, the clock is a variable."""

from __future__ import annotations

from types import SimpleNamespace

from zarrfs.fs.api import DIR, FILE, LINK, PageCache, Pages, Stored


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def node(size: int, mtime: int, kind: int = FILE) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, size=size, attrs=SimpleNamespace(mtime=mtime))


def never(key: str):
    raise AssertionError(f"{key} looked up while the kernel's attributes are fresh")


def test_a_file_first_opened_drops_pages_then_keeps_them_while_unchanged():
    clock = Clock()
    policy, pages = PageCache(attr_timeout=1.0, clock=clock), Pages()
    policy.shown(pages, node(3, 10))
    # Never opened: nothing to compare, nothing recorded (a listing shows many such names).
    assert (pages.stamp, pages.stamp_time, pages.cache_ok) == (None, 0.0, False)
    assert policy.opened(pages, lambda key: node(3, 10), "f") is False  # pages of unknown age
    assert pages.stamp == (3, 10) and pages.stamp_time == 100.0
    assert policy.opened(pages, never, "f") is True
    policy.shown(pages, node(3, 10))  # the same attributes again: nothing changes
    assert policy.opened(pages, never, "f") is True
    policy.shown(pages, node(5, 11))  # changed behind the mount
    assert policy.opened(pages, never, "f") is False
    assert policy.opened(pages, never, "f") is True


def test_an_open_after_the_attribute_timeout_looks_at_the_file_again():
    clock = Clock()
    policy, pages = PageCache(attr_timeout=1.0, clock=clock), Pages()
    policy.shown(pages, node(3, 10))
    policy.opened(pages, lambda key: node(3, 10), "f")
    seen = []

    def find(key: str):
        seen.append(key)
        return current

    clock.now += 2
    current = node(3, 10)
    assert policy.opened(pages, find, "f") is True and seen == ["f"]
    assert pages.stamp_time == clock.now  # looked at now: fresh again
    clock.now += 2
    current = node(4, 12)
    assert policy.opened(pages, find, "f") is False
    clock.now += 2
    current = None  # gone: nothing known to say otherwise
    assert policy.opened(pages, find, "f") is True


def test_folders_and_symlinks_have_no_pages_to_judge():
    policy, pages = PageCache(attr_timeout=1.0, clock=Clock()), Pages()
    for kind in (DIR, LINK):
        policy.shown(pages, node(0, 1, kind))
    assert (pages.stamp, pages.stamp_time, pages.cache_ok) == (None, 0.0, False)


def test_a_commit_through_the_mount_keeps_the_pages_and_hands_over_the_partial_last_one():
    clock = Clock()
    policy, pages = PageCache(attr_timeout=1.0, clock=clock), Pages()
    policy.shown(pages, node(0, 1))
    assert policy.stored(pages, Stored(size=8192, mtime=5)) is None  # whole pages only
    assert (pages.stamp, pages.cache_ok) == ((8192, 5), True)
    assert policy.opened(pages, never, "f") is True
    assert policy.stored(pages, Stored(size=5000, mtime=6, tail=b"t" * 904)) == (4096, b"t" * 904)
    policy.shown(pages, node(5000, 6))  # what the kernel sees next is what was stored
    assert policy.opened(pages, never, "f") is True
    policy.shown(pages, node(7, 7))  # then another client's commit
    assert policy.opened(pages, never, "f") is False


def test_only_a_first_read_only_open_of_a_large_file_goes_past_the_page_cache():
    policy = PageCache(attr_timeout=1.0, clock=Clock(), direct_above=64 << 10)
    big, small = node(64 << 10, 1), node((64 << 10) - 1, 1)
    assert policy.direct(False, big, readonly=True)
    assert not policy.direct(True, big, readonly=True)  # the kernel holds its pages: use them
    assert not policy.direct(False, big, readonly=False)  # writes go through the page cache
    assert not policy.direct(False, small, readonly=True)  # metadata: read again and again
    assert not policy.direct(False, None, readonly=True)  # content pending in this mount
    assert not policy.direct(False, node(1 << 20, 1, DIR), readonly=True)
    assert not PageCache(1.0, direct_above=None).direct(False, big, readonly=True)


def test_a_file_read_past_the_cache_is_cached_from_its_second_open():
    """Read once: no pages kept; read again: its pages are kept from then on."""
    clock = Clock()
    policy, pages = PageCache(attr_timeout=1.0, clock=clock, direct_above=1), Pages()
    f = node(4096, 7)
    kept = policy.opened(pages, never, "f", f)
    assert policy.direct(kept, f, readonly=True)
    kept = policy.opened(pages, never, "f", f)
    assert kept and not policy.direct(kept, f, readonly=True)
    changed = node(4096, 8)  # another writer: the next open is a first reading again
    kept = policy.opened(pages, never, "f", changed)
    assert policy.direct(kept, changed, readonly=True)
