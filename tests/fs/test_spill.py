"""SpillBuffer: content in a pooled ``bytearray`` with room beyond it, and the move to a
temporary file past the threshold. Bytes of the
capacity beyond the content (left there by an earlier file of the pool) must never show."""

from __future__ import annotations

import gc
import os

import pytest

from zarrfs.fs import spill
from zarrfs.fs.spill import SpillBuffer

GRAIN = 64 << 10
OLD = 0xAB  # what a pooled buffer held before: must never show through


@pytest.fixture(autouse=True)
def fresh_pool(monkeypatch):
    """An empty pool of freed buffers for each test, and the module's limits restored after."""
    monkeypatch.setattr(spill, "_pool", [])
    monkeypatch.setattr(spill, "_pooled", 0)
    monkeypatch.setattr(spill, "POOL_BYTES", spill.POOL_BYTES)
    monkeypatch.setattr(spill, "POOL_EACH", spill.POOL_EACH)
    yield
    gc.collect()


def pool_ids() -> list[int]:
    return [id(m) for m in spill._pool]


def content(buf: SpillBuffer) -> bytes:
    return bytes(buf.view())


def mem_id(buf: SpillBuffer) -> int:
    """Which bytearray holds the content (the test keeps no reference: one would keep the
    buffer out of the pool, as a live view does)."""
    assert buf._mem is not None
    return id(buf._mem)


def capacity(buf: SpillBuffer) -> int:
    assert buf._mem is not None
    return len(buf._mem)


def dirty_pool(size: int) -> int:
    """Put a buffer of ``size`` bytes full of OLD in the pool (what the next file gets)."""
    b = SpillBuffer(bytes([OLD]) * size)
    mid = mem_id(b)
    b.close()
    assert pool_ids() == [mid]
    return mid


def assert_pool_accounting() -> None:
    assert spill._pooled == sum(len(m) for m in spill._pool)


# ---------------------------------------------------------------------- write / read / truncate
def test_write_read_and_capacity_beyond_content():
    b = SpillBuffer()
    assert b.size == 0 and content(b) == b"" and b.read(0, 10) == b""
    assert b.write(0, b"hello") == 5
    assert capacity(b) >= GRAIN > b.size  # room beyond the content...
    assert b.size == 5 and content(b) == b"hello"
    assert bytes(b.read(0, 100)) == b"hello"  # ...never read past the content
    assert bytes(b.read(3, 100)) == b"lo"
    assert b.read(5, 10) == b"" and b.read(500, 10) == b""
    b.write(2, bytearray(b"LL"))  # overwrite inside
    b.write(4, memoryview(b"O, world"))  # overlapping the end, from a memoryview
    assert content(b) == b"heLLO, world" and b.size == 12
    b.close()


def test_initial_content_and_a_reused_buffer_shows_nothing_old():
    mid = dirty_pool(200_000)
    b = SpillBuffer(b"seed")
    assert mem_id(b) == mid  # the pooled buffer, still full of OLD past 4 bytes
    assert b.size == 4 and content(b) == b"seed"
    assert bytes(b.read(0, 1 << 20)) == b"seed"
    # a write past the end leaves a gap: zeros, not OLD
    b.write(10, b"X")
    assert content(b) == b"seed" + bytes(6) + b"X"
    # truncate-extend: zeros
    b.truncate(5000)
    assert content(b) == b"seed" + bytes(6) + b"X" + bytes(5000 - 11)
    # cut, then extend again: what was cut reads as zeros
    b.truncate(2)
    assert content(b) == b"se"
    b.truncate(20)
    assert content(b) == b"se" + bytes(18)
    # cut, then write past the old content with a gap
    b.truncate(1)
    b.write(30, b"yz")
    assert content(b) == b"s" + bytes(29) + b"yz"
    assert OLD not in bytes(b.read(0, 100))
    b.close()


def test_truncate_to_zero_then_rewrite():
    b = SpillBuffer(b"x" * 1000)
    b.truncate(0)
    assert b.size == 0 and content(b) == b"" and b.read(0, 10) == b""
    b.write(3, b"abc")
    assert content(b) == bytes(3) + b"abc"
    b.close()


def test_growth_keeps_content():
    b = SpillBuffer()
    pieces = []
    for i in range(40):  # past several capacities
        piece = bytes([i]) * (GRAIN // 3 + i)
        b.write(b.size, piece)
        pieces.append(piece)
    assert content(b) == b"".join(pieces)
    assert capacity(b) >= b.size
    b.close()


# ---------------------------------------------------------------------- the pool
def test_closed_buffer_is_handed_to_the_next():
    a = SpillBuffer(b"x" * 100_000)
    mid, cap = mem_id(a), capacity(a)
    a.close()
    assert pool_ids() == [mid] and spill._pooled == cap
    b = SpillBuffer()
    assert mem_id(b) == mid and spill._pool == [] and spill._pooled == 0
    assert b.size == 0 and content(b) == b""
    b.write(0, b"y")
    assert content(b) == b"y"
    b.close()
    assert pool_ids() == [mid]


def test_take_picks_a_buffer_large_enough():
    small = SpillBuffer(b"s")
    small_id = mem_id(small)
    big = SpillBuffer(b"b" * (3 * GRAIN))
    big_id = mem_id(big)
    assert capacity(big) > capacity(small)
    big.close()
    small.close()
    assert pool_ids() == [big_id, small_id]
    # needs more than the small one holds: the big one, though the small one came back last
    c = SpillBuffer(b"c" * (2 * GRAIN))
    assert mem_id(c) == big_id and pool_ids() == [small_id]
    # more than any pooled one: a new buffer, the pool untouched
    d = SpillBuffer(b"d" * (5 * GRAIN))
    assert mem_id(d) != small_id and pool_ids() == [small_id]
    assert_pool_accounting()
    c.close()
    d.close()
    assert_pool_accounting()


def test_growth_gives_the_old_buffer_back():
    b = SpillBuffer(b"q" * 10)
    old, cap = mem_id(b), capacity(b)
    b.write(0, b"r" * (cap + 1))  # past the capacity: a new, larger buffer
    assert mem_id(b) != old
    assert pool_ids() == [old]
    assert content(b) == b"r" * (cap + 1)
    b.close()


def test_a_buffer_with_a_live_view_is_not_pooled():
    b = SpillBuffer(b"keep me")
    view = b.view()
    b.close()
    assert spill._pool == [] and spill._pooled == 0
    assert bytes(view) == b"keep me"  # still valid, and nobody else writes into it
    c = SpillBuffer()
    c.write(0, b"other file")
    assert bytes(view) == b"keep me"
    c.close()
    assert len(spill._pool) == 1  # c's buffer, with no view, was pooled
    # a view from read() holds it just as well
    d = SpillBuffer(b"read view")
    assert spill._pool == []  # d took c's buffer
    part = d.read(0, 4)
    d.close()
    assert spill._pool == []
    assert bytes(part) == b"read"
    e = SpillBuffer()
    e.write(0, b"XXXXXXXXX")
    assert bytes(part) == b"read"
    e.close()


def test_a_view_released_before_close_lets_the_buffer_be_pooled():
    b = SpillBuffer(b"short-lived")
    mid = mem_id(b)
    view = b.view()
    assert bytes(view) == b"short-lived"
    view.release()
    del view
    b.close()
    assert pool_ids() == [mid]


def test_a_view_taken_before_growth_stays_valid_and_unchanged():
    b = SpillBuffer(b"before")
    view = b.view()
    old, cap = mem_id(b), capacity(b)
    b.write(6, b"g" * (cap * 2))  # grows: a new buffer, no resize in place
    assert mem_id(b) != old
    assert bytes(view) == b"before"
    assert spill._pool == []  # the old buffer is still viewed: not pooled
    # writing to the grown buffer does not touch the old one
    b.write(0, b"AFTER!")
    assert bytes(view) == b"before"
    assert content(b)[:6] == b"AFTER!"
    view.release()
    b.close()


def test_pool_each_refuses_large_buffers(monkeypatch):
    monkeypatch.setattr(spill, "POOL_EACH", 2 * GRAIN)
    at_limit = SpillBuffer(b"a" * (2 * GRAIN))
    over = SpillBuffer(b"b" * (2 * GRAIN + 1))
    assert capacity(at_limit) == 2 * GRAIN and capacity(over) == 3 * GRAIN
    keep = mem_id(at_limit)
    over.close()
    assert spill._pool == []
    at_limit.close()
    assert pool_ids() == [keep]
    assert_pool_accounting()


def test_pool_bytes_caps_the_total(monkeypatch):
    monkeypatch.setattr(spill, "POOL_BYTES", 3 * GRAIN)
    bufs = [SpillBuffer(bytes([i]) * GRAIN) for i in range(5)]
    ids = [mem_id(b) for b in bufs]
    assert all(capacity(b) == GRAIN for b in bufs)
    for b in bufs:
        b.close()
    assert pool_ids() == ids[:3]
    assert spill._pooled == 3 * GRAIN
    # a larger one does not fit the rest
    monkeypatch.setattr(spill, "POOL_BYTES", 4 * GRAIN)
    two = SpillBuffer(b"z" * (2 * GRAIN))
    two.close()
    assert spill._pooled == 3 * GRAIN and len(spill._pool) == 3
    # taking one makes room again
    taken = SpillBuffer(b"t")
    assert spill._pooled == 2 * GRAIN
    taken.close()
    assert spill._pooled == 3 * GRAIN
    assert_pool_accounting()


def test_default_limits():
    assert spill.POOL_EACH <= spill.POOL_BYTES
    big = SpillBuffer(b"x" * (spill.POOL_EACH + 1))
    big.close()
    assert spill._pool == []


# ---------------------------------------------------------------------- compact
def test_compact_gives_back_room_far_beyond_the_content():
    b = SpillBuffer(b"y" * (4 * GRAIN))
    big = mem_id(b)
    b.truncate(10)
    b.compact()
    assert mem_id(b) != big and capacity(b) == 10
    assert pool_ids() == [big]
    assert content(b) == b"y" * 10
    # still writable afterwards, and growth works from the exact size
    b.write(20, b"z")
    assert content(b) == b"y" * 10 + bytes(10) + b"z"
    b.close()


def test_compact_keeps_a_buffer_that_is_not_too_large():
    b = SpillBuffer(b"x" * 40_000)  # one grain, less than twice the content
    mid = mem_id(b)
    b.compact()
    assert mem_id(b) == mid and spill._pool == []
    small = SpillBuffer(b"s")  # one grain for 1 byte: the grain is the floor
    small_id = mem_id(small)
    small.compact()
    assert mem_id(small) == small_id
    b.close()
    small.close()


def test_compact_of_a_viewed_buffer_does_not_pool_it():
    b = SpillBuffer(b"c" * (4 * GRAIN))
    view = b.view()
    b.truncate(3)
    b.compact()
    assert spill._pool == []
    assert bytes(view[:3]) == b"ccc"
    assert content(b) == b"ccc"
    del view
    b.close()


def test_compact_of_an_empty_and_a_spilled_buffer():
    b = SpillBuffer(b"e" * (4 * GRAIN))
    b.truncate(0)
    b.compact()
    assert content(b) == b"" and capacity(b) == 0
    b.write(0, b"again")
    assert content(b) == b"again"
    b.close()
    s = SpillBuffer(b"s" * 2000, threshold=1000)
    s.compact()  # nothing in memory: nothing to do
    assert bytes(s.view()) == b"s" * 2000
    s.close()


# ---------------------------------------------------------------------- spill
def test_spill_past_the_threshold():
    threshold = 3 * GRAIN + 7
    data = os.urandom(threshold + 1000)
    b = SpillBuffer(threshold=threshold)
    for i in range(0, threshold, 50_000):
        b.write(i, data[i : min(i + 50_000, threshold)])
    assert b.size == threshold and b._mem is not None  # up to the threshold: memory
    mid = mem_id(b)
    b.write(threshold, data[threshold:])
    assert b._mem is None and b._file is not None
    assert pool_ids()[-1] == mid  # the memory went back to the pool (after those outgrown)
    assert bytes(b.read(0, len(data))) == data
    assert bytes(b.view()) == data
    # writes, gaps and truncation work on the file too
    b.write(10, b"ten")
    b.write(len(data) + 5, b"end")
    expected = data[:10] + b"ten" + data[13:] + bytes(5) + b"end"
    assert bytes(b.view()) == expected and b.size == len(expected)
    b.truncate(100)
    b.truncate(200)
    assert bytes(b.view()) == expected[:100] + bytes(100)
    b.close()
    assert b._file is None


def test_spill_by_truncate_and_by_initial_content():
    b = SpillBuffer(b"abc", threshold=1000)
    b.truncate(1001)
    assert b._mem is None
    assert bytes(b.view()) == b"abc" + bytes(998)
    b.close()
    c = SpillBuffer(b"q" * 1001, threshold=1000)
    assert c._mem is None and bytes(c.view()) == b"q" * 1001
    c.close()


def test_view_of_a_spilled_buffer_held_across_a_write():
    b = SpillBuffer(b"m" * 2000, threshold=1000)
    view = b.view()
    assert view[:4] == b"mmmm"
    b.write(0, b"NEW")  # the map is dropped (or left to its holder); no error
    assert bytes(b.view()[:5]) == b"NEWmm"
    del view
    b.close()


def test_empty_buffer_view_and_close_twice():
    b = SpillBuffer()
    assert bytes(b.view()) == b""
    b.close()
    b.close()
    assert len(spill._pool) == 1
