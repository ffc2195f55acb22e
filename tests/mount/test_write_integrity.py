"""Writes through real mounts: every byte arrives where it belongs.

Files are written in interleaved, unaligned pieces from two threads, with gaps, appends and
overwrites, into file buffers reused from a pool (``zarrfs/spill.py``: capacity past a file's
content holds an earlier file's bytes, which must never show). The data is random and is
compared by hash with what the mount shows (through a fresh, uncached descriptor while the
file is open), what the database stores, and what a remount shows.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import random
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from mounting import needs_fuse

from zarrfs.backends import open_driver
from zarrfs.cli.main import daemon_pids

pytestmark = needs_fuse

# 1 byte, around a page, a run of pages, exactly MAX_WRITE (254 pages), one byte more (two
# requests), and more than two requests.
PIECES = [1, 4095, 4097, 300_000, 1_040_384, 1_040_385, 2_300_000]
HALF = sum(PIECES)
WATCHDOG = 60  # seconds a test's file operations may take before the daemon is killed


def digest(data) -> str:
    return hashlib.sha256(data).hexdigest()


def random_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@contextmanager
def watchdog(mount, seconds: float = WATCHDOG):
    """Fail instead of hanging when the mount stops answering (a request left without a reply
    leaves the kernel waiting): the daemon is killed, which ends every waiting
    call with ENOTCONN."""
    fired = []

    def fire() -> None:
        fired.append(True)
        for pid in daemon_pids(str(mount.path)):
            os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        assert not fired, f"no answer within {seconds} s; the daemon's log:\n{mount.log_text()[-3000:]}"


def read_uncached(path) -> bytes:
    """The file's content as the daemon answers it: its cached pages are dropped first (they
    are clean: writes go through to the daemon), so every byte is read with a READ."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def stored(url: str, keys) -> dict[str, str | None]:
    """Hashes of the values the database holds (behind the mount and the kernel's cache)."""
    driver = open_driver(url)
    try:
        out = {}
        for key in keys:
            value = driver.get(key)
            out[key] = None if value is None else digest(value)
        return out
    finally:
        driver.close()


def shown(root: Path, keys) -> dict[str, str]:
    return {key: digest(read_uncached(root / key)) for key in keys}


def write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        assert n > 0
        view, offset = view[n:], offset + n


# ---------------------------------------------------------------------- unaligned pieces
def piece_plan(seed: int) -> list[tuple[int, int]]:
    """(offset, size) of every piece of one file: PIECES in a shuffled layout, written in a
    shuffled order (so most land before the end, some past it, leaving a gap filled later)."""
    rng = random.Random(seed)
    sizes = PIECES[:]
    rng.shuffle(sizes)
    plan, offset = [], 0
    for size in sizes:
        plan.append((offset, size))
        offset += size
    first = plan[0]
    rest = plan[1:]
    rng.shuffle(rest)
    return [first, *rest]


def write_files(root: Path, names: list[str], seed: int, shared: memoryview, half: int) -> dict[str, bytes]:
    """Write ``names`` at once, a piece of each in turn, each piece at its offset; and, between
    them, the pieces of one half of the file ``shared`` (``half`` 0 or 1, the other thread
    writes the other), whose content is ``shared``. Returns what each file holds."""
    plans = {name: piece_plan(seed + i) for i, name in enumerate(names)}
    contents = {}
    for i, name in enumerate(names):
        total = sum(size for _, size in plans[name])
        contents[name] = random_bytes(total, seed * 100 + i)
    shared_plan = [(offset + half * HALF, size) for offset, size in piece_plan(seed + 99)]
    fds = {name: os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for name in names}
    fds["shared"] = os.open(root / "shared", os.O_WRONLY)
    try:
        for step in range(len(PIECES)):
            for name in names:
                offset, size = plans[name][step]
                write_all(fds[name], memoryview(contents[name])[offset : offset + size], offset)
            offset, size = shared_plan[step]
            write_all(fds["shared"], shared[offset : offset + size], offset)
        for name in names:  # still open: the pending content, read back by READs
            assert digest(read_uncached(root / name)) == digest(contents[name]), name
    finally:
        for fd in fds.values():
            os.close(fd)
    return contents


def test_interleaved_unaligned_pieces_from_two_threads(mounted, mount_factory):
    root = mounted.path
    os.makedirs(root / "arr")
    (root / "shared").write_bytes(b"")
    shared = random_bytes(2 * HALF, 1)
    contents: dict[str, bytes] = {"shared": shared}
    errors: list[BaseException] = []
    groups = [["arr/0.0", "arr/0.1", "a"], ["arr/1.0", "b", "arr/1.1"]]

    def writer(names: list[str], seed: int, half: int) -> None:
        try:
            contents.update(write_files(root, names, seed, memoryview(shared), half))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with watchdog(mounted):
        threads = [threading.Thread(target=writer, args=(g, 7 + 10 * i, i)) for i, g in enumerate(groups)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        keys = sorted(contents)
        expected = {key: digest(contents[key]) for key in keys}
        for key in keys:
            assert os.stat(root / key).st_size == len(contents[key]), key
        assert shown(root, keys) == expected
        # reopened, read whole through the page cache as a program would
        for key in keys:
            assert digest((root / key).read_bytes()) == expected[key], key
    assert stored(mounted.url, keys) == expected
    mounted.stop()
    again = mount_factory(mounted.url, name="again")
    with watchdog(again):
        assert shown(again.path, keys) == expected


def test_gaps_appends_and_overwrites(mounted):
    root = mounted.path
    rng = random.Random(3)
    with watchdog(mounted):
        # a file stored and closed first: its buffer, full of random bytes, goes back to the
        # daemon's pool, and the next file's buffer is that one (none of it may show)
        junk = random_bytes(3_500_000, 0)
        (root / "junk").write_bytes(junk)
        model = {"junk": junk}
        # a write far past the end leaves a gap: zeros
        gap = bytearray(5000)
        gap[:] = random_bytes(5000, 1)
        tail = random_bytes(1_040_385, 2)
        with open(root / "gap", "wb", buffering=0) as fh:
            fh.write(gap)
            fh.seek(3_000_003)
            fh.write(tail)
            expected = bytes(gap) + bytes(3_000_003 - 5000) + tail
            assert digest(read_uncached(root / "gap")) == digest(expected)
            # a piece written into the gap afterwards
            inside = random_bytes(4097, 3)
            fh.seek(1_000_001)
            fh.write(inside)
            expected = expected[:1_000_001] + inside + expected[1_000_001 + 4097 :]
        assert digest(read_uncached(root / "gap")) == digest(expected)
        model["gap"] = expected

        # appends to a file with content (loaded into a reused buffer of other bytes)
        base = random_bytes(300_000, 4)
        (root / "log").write_bytes(base)
        appended = bytearray(base)
        fd = os.open(root / "log", os.O_WRONLY | os.O_APPEND)
        try:
            for i, size in enumerate([1, 4097, 1_040_385, 4095, 2_300_000, 300_000]):
                piece = random_bytes(size, 10 + i)
                assert os.write(fd, piece) == size
                appended += piece
            # pwrite on an O_APPEND descriptor appends too (Linux)
            piece = random_bytes(1_040_384, 20)
            os.pwrite(fd, piece, 17)
            appended += piece
            assert os.fstat(fd).st_size == len(appended)
            assert digest(read_uncached(root / "log")) == digest(appended)
        finally:
            os.close(fd)
        model["log"] = bytes(appended)

        # an existing file overwritten in place: pwrites before the end, one across it
        over = bytearray(random_bytes(2_300_000, 5))
        (root / "over").write_bytes(over)
        fd = os.open(root / "over", os.O_RDWR)
        try:
            for i in range(12):
                size = rng.choice(PIECES[:-1])
                offset = rng.randrange(0, len(over) - size)
                piece = random_bytes(size, 30 + i)
                write_all(fd, piece, offset)
                over[offset : offset + size] = piece
            piece = random_bytes(1_040_385, 50)
            write_all(fd, piece, len(over) - 1000)
            over[len(over) - 1000 :] = piece
            # cut short, then extended by a write past the end: zeros between, not old bytes
            os.ftruncate(fd, 1_500_000)
            del over[1_500_000:]
            piece = random_bytes(4097, 51)
            write_all(fd, piece, 1_600_000)
            over += bytes(100_000) + piece
            # extended by truncate, then written inside the new zeros
            os.ftruncate(fd, 2_000_000)
            over += bytes(2_000_000 - len(over))
            piece = random_bytes(300_000, 52)
            write_all(fd, piece, 1_650_000)
            over[1_650_000:1_950_000] = piece
            assert digest(read_uncached(root / "over")) == digest(over)
        finally:
            os.close(fd)
        model["over"] = bytes(over)

        # O_DIRECT: the data comes from the writer's own pages (an unaligned buffer here), not
        # from the page cache
        direct = random_bytes(3_000_000, 53)
        fd = os.open(root / "direct", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            assert os.pwrite(fd, memoryview(direct)[1:], 1) == len(direct) - 1
            assert os.pwrite(fd, direct[:1], 0) == 1
            piece = random_bytes(1_040_385, 54)
            assert os.pwrite(fd, memoryview(piece), 4097) == len(piece)
        finally:
            os.close(fd)
        model["direct"] = direct[:4097] + piece + direct[4097 + len(piece) :]

        # a shared mapping: its dirty pages come as WRITEs at msync
        mapped = bytearray(random_bytes(3_000_000, 55))
        (root / "mapped").write_bytes(mapped)
        fd = os.open(root / "mapped", os.O_RDWR)
        try:
            with mmap.mmap(fd, len(mapped)) as area:
                piece = random_bytes(1_500_001, 56)
                area[1001 : 1001 + len(piece)] = piece
                mapped[1001 : 1001 + len(piece)] = piece
                area.flush()
        finally:
            os.close(fd)
        model["mapped"] = bytes(mapped)

        expected = {key: digest(value) for key, value in model.items()}
        assert shown(root, model) == expected
        for key, value in model.items():
            assert os.stat(root / key).st_size == len(value)
    assert stored(mounted.url, model) == expected


def test_large_file_spills_to_a_temporary_file(db_url, mount_factory):
    # spill= lowers the size past which a file's content moves to a temporary file (64 MiB by
    # default): writes past it go to the file on disk.
    threshold = 3_000_001
    m = mount_factory(db_url, ["create", f"spill={threshold}"])
    root = m.path
    big = bytearray(random_bytes(7_500_000, 60))
    small = random_bytes(threshold - 5, 61)  # stays in memory, next to the big one
    with watchdog(m):
        fd = os.open(root / "big", os.O_WRONLY | os.O_CREAT, 0o644)
        fs = os.open(root / "small", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            offset = 0
            sizes = [4095, 1_040_385, 1, 1_040_384, 300_000, 2_300_000, 4097]
            i = 0
            while offset < len(big):
                size = min(sizes[i % len(sizes)], len(big) - offset)
                write_all(fd, memoryview(big)[offset : offset + size], offset)
                if offset < len(small):
                    write_all(fs, small[offset : offset + size], offset)
                offset += size
                i += 1
            # spilled: writes before the end, and one that crosses it
            for j, (where, size) in enumerate([(10, 4097), (2_999_999, 1_040_385), (7_000_000, 1_040_384)]):
                piece = random_bytes(size, 70 + j)
                write_all(fd, piece, where)
                end = where + size
                if end > len(big):
                    big += bytes(end - len(big))
                big[where:end] = piece
            assert digest(read_uncached(root / "big")) == digest(big)
            assert digest(read_uncached(root / "small")) == digest(small)
        finally:
            os.close(fd)
            os.close(fs)
        expected = {"big": digest(big), "small": digest(small)}
        assert shown(root, expected) == expected
        assert os.stat(root / "big").st_size == len(big)
    assert stored(m.url, expected) == expected


# ---------------------------------------------------------------------- refused writes
# An array of variable-length strings: its chunks have no raw layout, so the decoded view
# refuses to show or change them (EINVAL). Opening a stored chunk for writing succeeds; its
# first WRITE is refused by the daemon when it loads the chunk's content.
STRINGS_ZARRAY = {
    "zarr_format": 2,
    "shape": [8],
    "chunks": [4],
    "dtype": "|O",
    "compressor": None,
    "fill_value": None,
    "order": "C",
    "filters": [{"id": "vlen-utf8"}],
}


def test_a_refused_write_leaves_the_mount_answering(db_url, mount_factory):
    driver = open_driver(db_url)
    try:
        driver.put("s/.zarray", json.dumps(STRINGS_ZARRAY).encode())
        driver.put("s/0", b"\x04\x00\x00\x00" + b"\x01\x00\x00\x00a" * 4)
    finally:
        driver.close()
    m = mount_factory(db_url, ["view=decoded"])
    root = m.path
    model: dict[str, bytes] = {}
    with watchdog(m):
        for i, size in enumerate([1_040_385, 1, 4097, 300_000, 1_040_384, 2_300_000]):
            good = random_bytes(1_040_385 + i, 80 + i)
            (root / f"ok{i}").write_bytes(good)
            model[f"ok{i}"] = good
            fd = os.open(root / "s/0", os.O_WRONLY)
            try:
                with pytest.raises(OSError) as info:
                    os.write(fd, random_bytes(size, 90 + i))
                assert info.value.errno == errno.EINVAL
            finally:
                os.close(fd)
            # the next requests, of every kind, are answered (long names: long requests)
            after = random_bytes(size, 100 + i)
            name = f"written-after-refused-write-{i}-" + "n" * 60
            (root / name).write_bytes(after)
            final = f"renamed-after-refused-write-{i}-" + "r" * 60
            os.rename(root / name, root / final)
            model[final] = after
            assert sorted(os.listdir(root)) == sorted(["s", *model])
            assert os.stat(root / final).st_size == size
            assert digest(read_uncached(root / final)) == digest(after)
            assert not os.path.exists(root / name)
        expected = {key: digest(value) for key, value in model.items()}
        assert shown(root, model) == expected
    assert stored(m.url, model) == expected
    log = m.log_text()
    assert log.count("write /s/0: EINVAL") == 6, log[-3000:]  # refused by the daemon, not the kernel
