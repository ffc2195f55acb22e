"""One version per descriptor, across mounts: a file replaced through one mount while another
mount has it open. The descriptor reads the version it opened, whole, until it is closed; an
open after the replacement reads the new version, whole; the kernel's page cache never mixes
pages of the two."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from mounting import make_url, needs_fuse

pytestmark = needs_fuse

SIZE = 3 << 20  # above the kernel's read-ahead (1 MiB), below the snapshot limit
PAGE = 4096


def _put(path, byte: int) -> None:
    with open(path, "wb") as fh:
        fh.write(bytes([byte]) * SIZE)


@contextmanager
def _opened(path) -> Iterator[int]:
    """A read-only descriptor of ``path``, closed at the end."""
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def _two_mounts(kind, tmp_path, request, mount_factory):
    """A writer mount ``a`` (``-o create``) and a reader mount ``b`` of one fresh database."""
    url = make_url(kind, tmp_path, request)
    return mount_factory(url, ["create"]), mount_factory(url)


def _whole(fd: int) -> set[int]:
    data = os.pread(fd, SIZE, 0)
    assert len(data) == SIZE
    return set(data)


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_a_descriptor_reads_the_version_it_opened(kind, tmp_path, request, mount_factory):
    a, b = _two_mounts(kind, tmp_path, request, mount_factory)
    for i in range(8):
        old, new = 2 * i + 1, 2 * i + 2
        _put(a.path / "f", old)
        with _opened(b.path / "f") as fd:
            # The first read is near the end (the kernel asks for that range alone).
            assert set(os.pread(fd, PAGE, SIZE - PAGE)) == {old}
            _put(a.path / "f", new)  # same size, another value
            assert _whole(fd) == {old}, f"round {i}: pages of two versions"


@pytest.mark.parametrize("kind", ["lmdb", "sqlite", "redis"])
def test_an_open_after_a_change_reads_the_new_version_whole(kind, tmp_path, request, mount_factory):
    a, b = _two_mounts(kind, tmp_path, request, mount_factory)
    for i in range(8):
        old, new = 2 * i + 1, 2 * i + 2
        _put(a.path / "g", old)
        with _opened(b.path / "g") as fd:
            assert _whole(fd) == {old}
            # The kernel drops half of the pages it cached (memory pressure would, too).
            os.posix_fadvise(fd, SIZE // 2, 0, os.POSIX_FADV_DONTNEED)
        _put(a.path / "g", new)  # within the attribute timeout of mount b
        with _opened(b.path / "g") as fd:
            assert _whole(fd) == {new}, f"round {i}: pages of two versions"


@pytest.mark.parametrize("kind", ["lmdb", "redis"])
def test_two_descriptors_of_two_versions_on_one_mount(kind, tmp_path, request, mount_factory):
    a, b = _two_mounts(kind, tmp_path, request, mount_factory)
    for i in range(4):
        old, new = 2 * i + 1, 2 * i + 2
        _put(a.path / "h", old)
        with _opened(b.path / "h") as first:
            assert set(os.pread(first, PAGE, 0)) == {old}
            _put(a.path / "h", new)
            with _opened(b.path / "h") as second:
                assert _whole(second) == {new}
                assert _whole(first) == {old}
                assert _whole(second) == {new}


def test_a_large_value_replaced_under_a_descriptor_fails_with_estale(monkeypatch):
    import errno
    import uuid

    from zarrfs.backends import open_driver
    from zarrfs.fs import handles as handles_module
    from zarrfs.fs.handles import HandleTable
    from zarrfs.fs.tree import Tree

    monkeypatch.setattr(handles_module, "SNAPSHOT_LIMIT", 1024)  # ranges above this
    tree = Tree(open_driver(f"memory://{uuid.uuid4().hex}"))
    table = HandleTable(tree)
    writer = table.create("big", 0o644, os.O_WRONLY, 0, 0)
    table.write(writer, b"a" * 4096, 0)
    table.release(writer)
    fh = table.open("big", os.O_RDONLY)
    assert bytes(table.read(fh, 100, 0)) == b"a" * 100
    other = HandleTable(tree)  # another mount
    writer = other.open("big", os.O_WRONLY | os.O_TRUNC)
    other.write(writer, b"b" * 4096, 0)
    other.release(writer)
    with pytest.raises(OSError) as info:
        table.read(fh, 100, 100)
    assert info.value.errno == errno.ESTALE
