"""Large files stored in parts: bounded memory whatever a file's size, and no value limit. Parts
are written before the commit that names them, shared between versions, and freed after the
commit that lets go of them (docs/architecture.md, "Design notes by module")."""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from zarrfs.backends.base import KEYS, PARTS, SIDE, Get, Size, Txn
from zarrfs.fs import hardlinks
from zarrfs.fs.commitoptions import CommitOptions
from zarrfs.fs.errors import FsError
from zarrfs.fs.manifest import MAGIC, MANIFEST_SIZE, MAP_MAGIC, Parted, new_id, part_key
from zarrfs.fs.sidedata import Attrs, attr_key, pointer_key
from zarrfs.fs.spill import PartTrack

log = logging.getLogger("zarrfs.fs.parts")

DEFAULT_ABOVE = 64 << 20
PART_SIZE = 16 << 20
MIN_PART = 4096


def part_size(above: int, max_value: int | None) -> int:
    """The size of the parts of a mount that parts files above ``above`` bytes: 16 MiB, less
    for a low threshold (the model tests part files of a few KiB), never above the driver's
    largest value."""
    size = min(PART_SIZE, max(above, MIN_PART))
    return min(size, max_value) if max_value else size


def parted_of(raw_attrs: bytes | None) -> Parted | None:
    """The manifest an attribute record ends with, if any."""
    attrs = Attrs.unpack(raw_attrs) if raw_attrs is not None else None
    return attrs.parted if attrs is not None else None


# ---------------------------------------------------------------------- reading (in a transaction)
def current(t: Txn, key: str, value: Any = None, parted: Parted | None | bool = False) -> Parted | None:
    """The parts of the value at ``key`` when it is stored in parts: its data key holds the
    manifest its attribute record ends with. ``value``: the data key's value, when read;
    ``parted``: the record's manifest, when read (a probe reads the record)."""
    if value is None:
        if parted is False and t.size(key) != MANIFEST_SIZE:
            return None
        value = t.get(key)
    if value is None or len(value) != MANIFEST_SIZE:
        return None
    if not isinstance(parted, Parted):
        parted = parted_of(t.get(attr_key(key), SIDE))
    return parted if parted is not None and parted.manifest() == bytes(value) else None


def let_go(t: Txn, key: str, raw_attrs: bytes | None, *, every_name: bool = False) -> Parted | None:
    """The parts that the value at ``key`` lets go of when a writer that is not a mount (the
    zarr-python 3 store) overwrites or deletes it; ``raw_attrs``: its attribute record, both
    read before the change, in its transaction. Its version when the data key holds the
    manifest the record names and no other name of a hard link group holds it (the parts go
    with the last name, as through a mount) or ``every_name`` of the group is being rewritten;
    :func:`free` them after the commit."""
    parted = parted_of(raw_attrs)
    if parted is None or current(t, key, parted=parted) is None:
        return None
    if every_name:
        return parted
    group = hardlinks.load(t, key, t.get(pointer_key(key), SIDE))
    return parted if group is None or len(group.names) <= 1 else None


_MAPS: OrderedDict[str, tuple[str | None, ...]] = OrderedDict()  # id -> entries (immutable)
_MAPS_KEPT = 256


class Rebase(FsError):
    """The version a commit shares parts with is no longer the stored one (another mount
    replaced it): the commit stores every part instead."""

    def __init__(self, key: str) -> None:
        super().__init__(errno.ESTALE, f"{key}: replaced since it was read", quiet=True)


def mapped(t: Txn, parted: Parted) -> Parted:
    """``parted`` with its map (``entries``) known: read from ``p:<id>/map`` for a mapped
    version (cached: a version's map never changes), every part its own otherwise."""
    if parted.entries is not None:
        return parted
    if not parted.mapped:
        return replace(parted, entries=(parted.id,) * parted.count)
    entries = _MAPS.get(parted.id)
    if entries is None:
        raw = t.get(parted.map_key, PARTS)
        if raw is None or len(raw) != 16 * parted.count:
            raise FsError(errno.EIO, f"the part map of a value stored in parts ({parted.id}) is missing")
        entries = parted.with_map(raw).entries
        assert entries is not None
        _remember(parted.id, entries)
    else:
        _MAPS.move_to_end(parted.id)
    return replace(parted, entries=entries)


def _remember(ident: str, entries: tuple[str | None, ...]) -> None:
    _MAPS[ident] = entries
    while len(_MAPS) > _MAPS_KEPT:
        _MAPS.popitem(last=False)


def data_parts(t: Txn, parted: Parted) -> list[bool]:
    """Per part of ``parted``, whether it is stored (False: a hole, zeros)."""
    entries = mapped(t, parted).entries
    assert entries is not None
    return [e is not None for e in entries]


def data_ranges(driver: Any, key: str) -> list[tuple[int, int]] | None:
    """The ranges of the stored value at ``key`` that are stored (its parts that are not
    holes, adjacent ones merged); None when it is not stored in parts (all data)."""

    def run(t: Txn) -> list[tuple[int, int]] | None:
        found = current(t, key)
        if found is None:
            return None
        out: list[tuple[int, int]] = []
        for n, stored in enumerate(data_parts(t, found)):
            if not stored:
                continue
            start, end = n * found.part, min(found.size, (n + 1) * found.part)
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], end)
            else:
                out.append((start, end))
        return out

    return driver.transact(run, write=False)


def read_parts(t: Txn, parted: Parted, offset: int, size: int) -> bytes:
    """``size`` bytes (fewer at the end) from ``offset`` of a parted value (zeros in holes)."""
    end = min(parted.size, offset + size) if size >= 0 else parted.size
    entries = mapped(t, parted).entries if offset < end else ()
    assert entries is not None
    pieces: list[bytes] = []
    while offset < end:
        n, within = divmod(offset, parted.part)
        count = min(end - offset, parted.part - within)
        owner = entries[n]
        if owner is None:
            piece = bytes(count)
        else:
            piece = t.read(part_key(owner, n), within, count, PARTS)
        if not piece:
            raise FsError(errno.EIO, f"part {n} of a value stored in parts ({parted.id}) is missing")
        pieces.append(piece)
        offset += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def read(t: Txn, key: str, offset: int, size: int, parted: Parted | None | bool = False) -> bytes | None:
    """Stored bytes of ``key`` from ``offset`` (a parted value's as well); None when absent.
    ``parted``: what the file's attribute record says (None: not parted), when a probe read it.

    Without it, the range is read first and the manifest looked for only when what came back
    may be a manifest's: an ordinary value costs one read (one round trip on a server)."""
    if parted is False and size >= 0:
        got = t.read(key, offset, size)
        if got is None or size == 0 or not may_be_manifest(got, offset, size):
            return got
        # A short read of the whole value: the value itself, no second read for it.
        whole_value = got if offset == 0 and len(got) == MANIFEST_SIZE < size else None
        found = current(t, key, whole_value)
        return got if found is None else read_parts(t, found, offset, size)
    found = current(t, key, parted=parted) if parted is not None else None
    if found is not None:
        return read_parts(t, found, offset, size)
    return t.read(key, offset, size)


def may_be_manifest(got: bytes, offset: int, size: int) -> bool:
    """Whether ``got``, what a read of ``size`` bytes from ``offset`` returned, may be from a
    value of exactly :data:`MANIFEST_SIZE` bytes that starts with the manifest's magic."""
    n = len(got)
    if n == size:  # the value goes on at least to the range's end
        fits = offset + size <= MANIFEST_SIZE
    elif n:  # a short read ends where the value ends
        fits = offset + n == MANIFEST_SIZE
    else:  # nothing from ``offset``: the value ends at or before it
        fits = offset >= MANIFEST_SIZE
    if not fits:
        return False
    for magic in (MAGIC, MAP_MAGIC):
        head = magic[offset:]
        k = min(len(head), n)
        if bytes(got[:k]) == head[:k]:
            return True
    return False


def whole(t: Txn, key: str, value: Any, parted: Parted | None | bool = False) -> Any:
    """The value of ``key`` whose data key holds ``value``: assembled from its parts when it
    is parted. ``parted``: what its attribute record says (None: not parted), when a probe
    read it (the record is not read again)."""
    if value is None or len(value) != MANIFEST_SIZE:
        return value
    if parted is None:
        return value
    found = current(t, key, value, parted)
    return value if found is None else read_parts(t, found, 0, found.size)


def wholes(t: Txn, versions: list[Parted]) -> list[bytes]:
    """The whole values of several parted ``versions``, every part read in one batch (on a
    spread hierarchy one round trip to all the masters holding them, not one per part)."""
    plans: list[tuple[Parted, list[int | None]]] = []
    reads: list[Get] = []
    for parted in versions:
        parted = mapped(t, parted)
        assert parted.entries is not None
        slots: list[int | None] = []
        for n, owner in enumerate(parted.entries):
            slots.append(None if owner is None else len(reads))
            if owner is not None:
                reads.append(Get(part_key(owner, n), PARTS))
        plans.append((parted, slots))
    got = t.read_many(reads) if reads else []
    out: list[bytes] = []
    for parted, slots in plans:
        pieces: list[bytes] = []
        for n, i in enumerate(slots):
            piece = bytes(parted.length(n)) if i is None else got[i]
            if piece is None or len(piece) != parted.length(n):
                raise FsError(errno.EIO, f"part {n} of a value stored in parts ({parted.id}) is missing")
            pieces.append(piece)
        out.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
    return out


def size_of(t: Txn, key: str) -> int | None:
    """The size of the value of ``key`` (a parted value's total), None when absent."""
    size = t.size(key)
    if size == MANIFEST_SIZE and (found := current(t, key)) is not None:
        return found.size
    return size


def reader(t: Txn, key: str) -> Callable[[int, int], bytes | None]:
    """``read(offset, size)`` of the value of ``key`` in transaction ``t``, the manifest
    looked up once."""
    found = current(t, key)
    if found is None:
        return lambda offset, size: read(t, key, offset, size)
    return lambda offset, size: read_parts(t, found, offset, size)


def check_present(t: Txn, key: str, parted: Parted) -> None:
    """In the commit of ``parted`` at ``key``: the version it shares parts with is the one
    stored (:class:`Rebase` otherwise), and every part it names, and its map, are there (EIO
    otherwise: a ``zarrfs check --repair`` running beside the mount took them for orphans),
    so a file is never stored with parts missing. A scan of their keys: asking the sizes of
    large values in a write transaction makes LMDB page them in."""
    if parted.base is not None and current(t, key) != parted.base:
        raise Rebase(key)
    want = mapped(t, parted).keys() if parted.entries is not None or not parted.mapped else []
    if parted.mapped:
        want.append(parted.map_key)
    if t.spaces[PARTS] is PARTS:  # parts kept apart (on other servers): asked, in one batch
        sizes = t.read_many([Size(k, PARTS) for k in want])
        missing = sum(1 for size in sizes if size is None)
    else:
        present: set[str] = set()
        for prefix in sorted({k.rpartition("/")[0] + "/" for k in want}):
            present.update(k for k, _ in t.scan_prefix(prefix, space=PARTS, fetch=KEYS))
        missing = sum(1 for k in want if k not in present)
    if missing:
        raise FsError(errno.EIO, f"{key}: {missing} of its {len(want)} parts vanished before the commit")


def released(garbage: Iterable[Parted | None], new: Parted | None) -> list[Parted]:
    """The versions a commit of ``new`` lets go of, among ``garbage``: the one it shares
    parts with keeps them (its ``keep``)."""
    out = []
    for old in garbage:
        if old is None or old == new:
            continue
        if new is not None and new.base is not None and old.id == new.base.id and new.entries is not None:
            old = replace(old, keep=frozenset(new.keys()))
        out.append(old)
    return out


# ---------------------------------------------------------------------- writing (own transactions)
def _zeros(view: memoryview, buffer: bytearray, zeros: bytes) -> bool:
    n = len(view)
    return buffer == zeros if n == len(buffer) == len(zeros) else buffer.count(0, 0, n) == n


def store(
    driver: Any,
    size: int,
    readinto: Callable[[int, memoryview], int],
    part: int,
    base: Parted | None = None,
    changed: Callable[[int], bool] | None = None,
    has_data: Callable[[int, int], bool] | None = None,
) -> Parted:
    """Write the parts of a new version of ``size`` bytes, each in its own transaction;
    ``readinto(offset, view)`` fills a view with the bytes from ``offset``. A part of zeros
    is a hole, not stored (``has_data(start, end)``: False when the range is known to be
    zeros without reading it). With ``base`` (the stored version the content was read from)
    and ``changed(n)`` (whether part ``n`` changed since), an unchanged part of the same
    size is shared with ``base``, not written again. A version with holes or shared parts
    gets its map written (its own transaction, before the commit). On failure what was
    written is deleted again (best effort) and the error raised."""
    ident = new_id()
    count = -(-size // part)
    if base is not None:
        base = driver.transact(lambda t: mapped(t, base), write=False)
        if base.part != part:
            base = None
    entries: list[str | None] = []
    written: list[str] = []
    buffer = bytearray(min(part, size))
    zeros = bytes(len(buffer))
    try:
        for n in range(count):
            start = n * part
            length = min(part, size - start)
            if (
                base is not None
                and changed is not None
                and n < base.count
                and base.length(n) == length
                and not changed(n)
            ):
                assert base.entries is not None
                entries.append(base.entries[n])
                continue
            if has_data is not None and not has_data(start, start + length):
                entries.append(None)
                continue
            view = memoryview(buffer)[:length]
            got = 0
            while got < length:
                step = readinto(start + got, view[got:])
                if step <= 0:
                    raise FsError(errno.EIO, "the file's buffer ended before its size")
                got += step
            if _zeros(view, buffer, zeros):
                entries.append(None)
                continue
            key = part_key(ident, n)
            driver.transact(lambda t, key=key, view=view: t.put(key, view, PARTS))
            written.append(key)
            entries.append(ident)
            driver.serve_meanwhile()  # a large file's commit does not hold up other files
        parted = Parted.of(ident, size, part, entries, base)
        if parted.mapped:
            raw = parted.pack_map()
            written.append(parted.map_key)
            driver.transact(lambda t: t.put(parted.map_key, raw, PARTS))
            assert parted.entries is not None
            _remember(ident, parted.entries)
    except BaseException:
        _delete(driver, written, ident)
        raise
    finally:
        del buffer
    return parted


def store_one_part_each(driver: Any, values: list[memoryview], part: int) -> list[Parted]:
    """Versions of several small files stored in parts (a chunk of a hierarchy spread over a
    Redis Cluster's masters: every chunk is one part), all their parts in one transaction: on
    a spread hierarchy one pipeline to every master holding one, so closes served together
    send their chunks to the masters in parallel. Each value is at most ``part`` bytes; one of
    zeros is stored as its part all the same (no map, no hole)."""
    versions = []
    for value in values:
        assert len(value) <= part
        ident = new_id()
        versions.append(Parted.of(ident, len(value), part, [ident] if len(value) else [], None))

    def run(t: Txn) -> None:
        for parted, value in zip(versions, values, strict=True):
            if parted.size:
                t.put(part_key(parted.id, 0), value, PARTS)

    driver.transact(run)
    return versions


def check_present_many(t: Txn, versions: list[tuple[str, Parted]]) -> None:
    """:func:`check_present` of several new versions, their parts asked in one batch."""
    if len(versions) == 1:
        check_present(t, *versions[0])
        return
    want: list[tuple[str, str]] = []
    for key, parted in versions:
        if parted.base is not None or parted.mapped or parted.entries is None:
            check_present(t, key, parted)
            continue
        want += [(key, part_key(parted.id, n)) for n in range(parted.count)]
    sizes = t.read_many([Size(k, PARTS) for _, k in want]) if want else []
    for (key, _), size in zip(want, sizes, strict=True):
        if size is None:
            raise FsError(errno.EIO, f"{key}: its parts vanished before the commit")


def _delete(driver: Any, keys: Iterable[str], ident: str) -> None:
    try:
        for key in keys:
            driver.transact(lambda t, key=key: t.delete(key, PARTS))
    except Exception as exc:
        log.error("parts of %s not deleted (zarrfs check --repair deletes them): %s", ident, exc)


def free(driver: Any, versions: Iterable[Parted]) -> None:
    """Delete the parts of ``versions``, each part in its own transaction, but those their
    successor took over (``keep``); then the map. Best effort: a failure is logged, and the
    parts left are orphans for ``zarrfs check --repair``."""
    for parted in versions:
        try:
            parted = driver.transact(lambda t, p=parted: mapped(t, p), write=False)
        except Exception as exc:
            log.error("parts of %s not deleted (zarrfs check --repair deletes them): %s", parted.id, exc)
            continue
        keep = parted.keep or frozenset()
        gone = [k for k in parted.keys() if k not in keep]
        if parted.mapped:
            gone.append(parted.map_key)
        _delete(driver, gone, parted.id)
        _MAPS.pop(parted.id, None)


def new_keys(parted: Parted) -> list[str]:
    """The keys :func:`store` wrote for ``parted`` (its own parts and its map): what to delete
    when its commit did not happen."""
    assert parted.entries is not None
    keys = [part_key(parted.id, n) for n, e in enumerate(parted.entries) if e == parted.id]
    return keys + [parted.map_key] if parted.mapped else keys


def discard(driver: Any, parted: Parted) -> None:
    """Delete what :func:`store` wrote for ``parted``, whose commit did not happen."""
    _delete(driver, new_keys(parted), parted.id)


class Parting:
    """Storing the files of a mount: whole, or in parts (docs/architecture.md, "Design notes by module")."""

    def __init__(self, tree: Any, above: int = DEFAULT_ABOVE) -> None:
        self.tree = tree
        self.above = above
        self._max_value: int | None | bool = False

    @property
    def max_value(self) -> int | None:
        """The driver's largest value (None: no limit)."""
        if self._max_value is False:
            self._max_value = self.tree.driver.transact(lambda t: t.max_value, write=False)
        return self._max_value  # type: ignore[return-value]

    def wanted(self, key: str, size: int) -> bool:
        """Whether a file of ``size`` bytes at ``key`` is stored in parts."""
        limit = self.max_value
        if limit is not None and size > limit:
            whole_only = self.tree.hooks_transform or self.tree.hooks.whole(key)
            return not whole_only  # too large either way: EFBIG, as before
        above = self.above
        if self.tree.driver.parts_above is not None:
            above = min(above, self.tree.driver.parts_above)
        if size <= above or self.tree.hooks_transform:
            return False
        return not self.tree.hooks.whole(key)

    def store(self, key: str, buffer: Any, attrs: Attrs | None, how: CommitOptions) -> None:
        """Store the content of ``buffer`` (a :class:`zarrfs.fs.spill.SpillBuffer`) at ``key``
        (:meth:`zarrfs.fs.tree.Tree.store`): whole, or its parts first when it is large, then
        their manifest as :meth:`CommitOptions.in_parts` says."""
        if not self.wanted(key, buffer.size):
            self.tree.store([(key, buffer.view(), attrs, how)])
            return
        if attrs is None:
            attrs = self.tree.lookup_attrs(key)
        part = part_size(self.above, self.max_value)
        driver = self.tree.driver
        track = buffer.parts
        parted = store(
            driver,
            buffer.size,
            buffer.readinto,
            part,
            base=track.base if track is not None else None,
            changed=track.changed if track is not None else None,
            has_data=buffer.has_data,
        )
        try:
            self.tree.store([(key, parted.manifest(), attrs, how.in_parts(parted))])
        except Rebase:
            # Another mount stored a new version: this one's parts no longer share anything.
            discard(driver, parted)
            buffer.settle()
            self.store(key, buffer, attrs, how)
            return
        except BaseException:
            discard(driver, parted)
            raise
        # The next commit of this buffer shares what it does not change with this version.
        if track is not None:
            track.committed(parted)
        else:
            buffer.parts = PartTrack(parted, fill=self.fill)

    def groupable(self, key: str, buffer: Any) -> bool:
        """Whether the content of ``buffer`` may be committed with other files'
        (:meth:`store_many`): stored whole, or in one part of its own (not sharing parts with
        a version stored before)."""
        if not self.wanted(key, buffer.size):
            return True
        return buffer.parts is None and buffer.size <= part_size(self.above, self.max_value)

    def store_many(self, items: list[tuple[str, Any, Attrs | None, CommitOptions]]) -> None:
        """:meth:`store` of several files (``(key, buffer, attrs, how)``, each
        :meth:`groupable`) in one transaction (``Tree.store``); the parts of those
        stored in parts are written first, together (:func:`store_one_part_each`)."""
        parted_at = [i for i, (key, buffer, _, _) in enumerate(items) if self.wanted(key, buffer.size)]
        versions = store_one_part_each(
            self.tree.driver, [items[i][1].view() for i in parted_at], part_size(self.above, self.max_value)
        )
        chosen = dict(zip(parted_at, versions, strict=True))
        steps: list[tuple[str, Any, Attrs | None, CommitOptions]] = []
        for i, (key, buffer, attrs, how) in enumerate(items):
            parted = chosen.get(i)
            if parted is None:
                steps.append((key, buffer.view(), attrs, how))
                continue
            if attrs is None:
                attrs = self.tree.lookup_attrs(key)
            steps.append((key, parted.manifest(), attrs, how.in_parts(parted)))
        try:
            self.tree.store(steps)
        except BaseException:
            for parted in versions:
                discard(self.tree.driver, parted)
            raise
        for i, parted in chosen.items():
            items[i][1].parts = PartTrack(parted, fill=self.fill)

    def fill(self, parted: Parted, n: int) -> bytes:
        """Part ``n`` of ``parted`` (a buffer reads it in when first needed): ESTALE when it
        is gone (another mount replaced the file and freed the version)."""
        try:
            return self.tree.driver.transact(
                lambda t: read_parts(t, parted, n * parted.part, parted.length(n)), write=False
            )
        except FsError as exc:
            if exc.errno == errno.EIO:
                raise FsError(errno.ESTALE, f"{parted.id}: replaced since it was read") from exc
            raise

    def lazy(self, t: Txn, key: str, buffer: Any) -> bool:
        """Make ``buffer`` (empty, on disk) the content of the parted value at ``key`` without
        reading its parts: they come in when first needed (see :mod:`zarrfs.fs.spill`).
        False when the value is not parted."""
        found = current(t, key)
        if found is None:
            return False
        found = mapped(t, found)
        assert found.entries is not None
        buffer.truncate(found.size)
        pending = {n for n, e in enumerate(found.entries) if e is not None}
        buffer.parts = PartTrack(found, pending, self.fill)
        return True
