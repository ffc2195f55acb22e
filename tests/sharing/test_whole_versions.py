"""A descriptor reads one whole version of a file, whatever another mount commits meanwhile, and
whatever the kernel cached of it: the steps are taken one after another, so no race is needed
for a wrong answer to show."""

from __future__ import annotations

import os

import pytest
from mounting import eventually, needs_fuse

from zarrfs.daemon.control import query

pytestmark = needs_fuse

OLD = b"old version " * 5000  # 60,000 bytes: several pages
NEW = b"new" * 1000  # 3,000 bytes: shorter, a size that would cut the old pages


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    out = b""
    while chunk := os.read(fd, 1 << 16):
        out += chunk
    return out


def _committed_elsewhere(a, b, data: bytes, marker: str, name: str = "f") -> None:
    """Rewrite ``name`` through mount ``a``, then make ``marker``; return once ``b`` shows the
    marker (its change feed tells of commits in order, so it has heard of ``name`` too)."""
    with open(a.path / name, "wb") as fh:
        fh.write(data)
    (a.path / marker).write_bytes(b"")
    eventually(lambda: (b.path / marker).exists(), "the other mount's commit")


def _two_mounts(db_url, mount_factory):
    """Mounts ``a`` and ``b`` of a new database, ``f`` written through ``a`` with :data:`OLD`
    and seen by ``b``."""
    a = mount_factory(db_url, ["create"], name="a")
    (a.path / "f").write_bytes(OLD)
    b = mount_factory(db_url, name="b")
    eventually(lambda: (b.path / "f").exists(), "the file on the second mount")
    return a, b


def test_a_descriptor_keeps_its_version_while_another_mount_rewrites_the_file(db_url, mount_factory):
    a, b = _two_mounts(db_url, mount_factory)
    old = os.open(b.path / "f", os.O_RDONLY)
    try:
        assert _read_all(old) == OLD  # the kernel holds its pages and its size
        _committed_elsewhere(a, b, NEW, "m1")
        # The old descriptor: the old version, whole, and its size.
        assert os.fstat(old).st_size == len(OLD)
        assert _read_all(old) == OLD
        # A descriptor opened now reads the new version, whole.
        new = os.open(b.path / "f", os.O_RDONLY)
        try:
            assert _read_all(new) == NEW
            again = _read_all(old)
            assert again == OLD, (len(again), again[-20:], os.fstat(old).st_size)
        finally:
            os.close(new)
    finally:
        os.close(old)
    # Once the old version's last descriptor is closed, the file is the new version.
    assert os.stat(b.path / "f").st_size == len(NEW)
    assert (b.path / "f").read_bytes() == NEW


def test_a_file_shown_as_the_version_a_descriptor_reads_is_not_cached_by_the_kernel(db_url, mount_factory):
    """While a descriptor holds the older version the file is shown as that one, and only
    until its last close, whose RELEASE reaches the daemon after close() returned: a stat right
    then must ask the daemon (which reads the requests in order) rather than the kernel's cache,
    or it shows the older size once nobody reads it (a failure seen in CI under load)."""
    a, b = _two_mounts(db_url, mount_factory)
    old = os.open(b.path / "f", os.O_RDONLY)
    try:
        assert _read_all(old) == OLD
        _committed_elsewhere(a, b, NEW, "m1")
        assert os.fstat(old).st_size == len(OLD)
        before = query(str(b.path))["requests"].get("getattr", 0)
        for _ in range(5):
            assert os.fstat(old).st_size == len(OLD)
        asked = query(str(b.path))["requests"].get("getattr", 0) - before
        assert asked >= 5, f"{asked} of 5 fstat calls reached the daemon"
    finally:
        os.close(old)
    eventually(lambda: os.stat(b.path / "f").st_size == len(NEW), "the newer size")


def test_the_first_open_after_a_change_shows_the_new_size_over_new_pages(db_url, mount_factory):
    a, b = _two_mounts(db_url, mount_factory)
    held = os.open(b.path / "f", os.O_RDONLY)
    try:
        assert _read_all(held) == OLD
        _committed_elsewhere(a, b, NEW, "m1")
        assert os.stat(b.path / "f").st_size == len(OLD)  # shown as the version still read
    finally:
        os.close(held)
    _committed_elsewhere(a, b, NEW + b"!", "m2")
    with open(b.path / "f", "rb") as fh:
        assert os.fstat(fh.fileno()).st_size == len(NEW) + 1
        assert fh.read() == NEW + b"!"


def test_a_descriptor_keeps_its_version_across_a_rename_and_a_rewrite_of_the_new_name(db_url, mount_factory):
    """Opened on the second mount (nothing read yet: the kernel holds none of its pages), the
    file renamed there, then rewritten under its new name through the first mount: the
    descriptor reads the version it opened, whole, and shows its size."""
    a, b = _two_mounts(db_url, mount_factory)
    fd = os.open(b.path / "f", os.O_RDONLY)
    try:
        os.rename(b.path / "f", b.path / "g")
        eventually(lambda: (a.path / "g").exists(), "the rename on the first mount")
        _committed_elsewhere(a, b, NEW, "m1", name="g")
        assert _read_all(fd) == OLD
        assert os.fstat(fd).st_size == len(OLD)
    finally:
        os.close(fd)
    assert (b.path / "g").read_bytes() == NEW


@pytest.mark.parametrize("rewrite", ["truncate", "o_trunc"])
def test_reads_during_a_rewrite_in_place_elsewhere_are_one_version(db_url, mount_factory, rewrite):
    """The other mount rewrites the file in place (truncate, then writes): until its close the
    second mount reads the version before, whole."""
    a, b = _two_mounts(db_url, mount_factory)
    assert (b.path / "f").read_bytes() == OLD
    if rewrite == "truncate":
        fd = os.open(a.path / "f", os.O_RDWR)
        os.ftruncate(fd, 0)
    else:
        fd = os.open(a.path / "f", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, NEW[:1000])
        (a.path / "m").write_bytes(b"")  # a commit the feed tells of after any of f's
        eventually(lambda: (b.path / "m").exists(), "the other mount's commit")
        assert (b.path / "f").read_bytes() == OLD
        os.write(fd, NEW[1000:])
    finally:
        os.close(fd)
    eventually(lambda: os.stat(b.path / "f").st_size == len(NEW), "the rewritten file's size")
    assert (b.path / "f").read_bytes() == NEW


def test_an_open_of_a_version_the_kernel_was_not_shown_drops_its_size(db_url, mount_factory):
    """The kernel keeps the size of the version it was shown (no feed here, long cache times:
    nothing tells the mount of the change before the open); the open reads the newer version,
    and its reads are not cut or padded to the older size."""
    a = mount_factory(db_url, ["create"], name="a")
    (a.path / "f").write_bytes(OLD)
    b = mount_factory(db_url, ["feed=0", "cache_timeout=3600"], name="b")
    assert (b.path / "f").read_bytes() == OLD  # opened: its size and pages held
    assert os.stat(b.path / "f").st_size == len(OLD)
    longer = OLD + NEW  # longer: a read past the old size would not correct it (a short one does)
    (a.path / "f").write_bytes(longer)
    with open(b.path / "f", "rb") as fh:
        assert fh.read() == longer
        assert os.fstat(fh.fileno()).st_size == len(longer)


def test_an_open_of_a_version_newer_than_a_lookup_showed_drops_its_size(db_url, mount_factory):
    """The same with the file only looked up on the second mount (``stat``), never opened
    there: the kernel holds the size the lookup gave, and the open of the longer version is
    not cut to it."""
    a = mount_factory(db_url, ["create"], name="a")
    (a.path / "f").write_bytes(OLD)
    b = mount_factory(db_url, ["feed=0", "cache_timeout=3600"], name="b")
    assert os.stat(b.path / "f").st_size == len(OLD)  # a lookup: the size held, no pages
    longer = OLD + NEW
    (a.path / "f").write_bytes(longer)
    with open(b.path / "f", "rb") as fh:
        assert fh.read() == longer
        assert os.fstat(fh.fileno()).st_size == len(longer)
