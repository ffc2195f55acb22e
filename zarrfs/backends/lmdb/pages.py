"""Releasing the pages of LMDB's memory maps that reads touched.

py-lmdb returns values as slices of the environment's memory map; every page a copy out of
the map touches stays in the process's resident set (file-backed, but VmRSS counts it) until
the kernel needs the memory. Reading a 4 GiB file would so show 4 GiB resident. The driver
copies values out of the maps through :func:`copied`, which counts large copies
(:func:`touched`); past :data:`BUDGET` bytes the
maps of the driver's environments get ``madvise(MADV_DONTNEED)``: the mapping is read-only
and shared (``writemap`` is off), so the next access maps the page again from the page cache,
with the same bytes. Nothing is lost but the mapping itself. The maps are found in
``/proc/self/maps`` by their data file (``env.info()``'s ``map_addr`` is 0 unless LMDB was
asked for a fixed address), once: their places are kept and each is checked with a
``readlink`` of ``/proc/self/map_files`` before it is released (:func:`_mapped`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Any

log = logging.getLogger("zarrfs.backends.lmdb")

BUDGET = 32 << 20
# The largest value a commit can write. A node records a value's size in 32 bits, but a commit
# writes a value's pages (a 16-byte header, then the value) in one write(2), which Linux ends
# at 0x7FFFF000 bytes, and LMDB takes the short write for EIO (LMDB's pages are the system's).
_PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_VALUE = 0x7FFFF000 // _PAGE * _PAGE - 16
MADV_DONTNEED = 4

_pending: dict[int, int] = {}
_madvise: Any = None


def _libc_madvise() -> Any:
    global _madvise
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _madvise = libc.madvise
            _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def _environments(driver: Any) -> list[Any]:
    """The LMDB driver's environments: its data's, and its side's once there is one."""
    side = driver.side.env(False)
    return [driver.env] if side is None else [driver.env, side]


#: Copies smaller than this are not counted (a lookup's small values: a dict update each).
COUNTED = 64 << 10


def copied(driver: Any, view: Any) -> bytes:
    """``bytes(view)`` of a slice of ``driver``'s maps; a large copy is counted for
    :func:`touched`."""
    data = bytes(view)
    if len(data) >= COUNTED:
        touched(driver, len(data))
    return data


def touched(driver: Any, nbytes: int) -> None:
    """``nbytes`` were copied out of the LMDB ``driver``'s maps:
    release the maps' pages once :data:`BUDGET` bytes were."""
    key = id(driver)
    pending = _pending.get(key, 0) + nbytes
    if pending < BUDGET:
        _pending[key] = pending
        return
    _pending[key] = 0
    release(driver)


_baseline: dict[int, int] = {}


def _resident_file() -> int | None:
    """The process's resident pages of mapped files, in bytes (``/proc/self/statm``'s shared
    field: files and shared memory), or None where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[2]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


#: Rows scanned between two looks at the process's resident file pages (a look reads /proc).
LOOK_EVERY = 1024
_rows: dict[int, int] = {}


def scanned(driver: Any, rows: int) -> None:
    """A scan of ``driver``'s maps passed ``rows`` rows. Every :data:`LOOK_EVERY` rows, the
    maps' pages are released once the process's resident file pages grew :data:`BUDGET` bytes
    past what they were at the first look, or just after a release that left more (a scan's
    rows give no sizes to count: reading a value to learn its size could read it from disk)."""
    key = id(driver)
    passed = _rows.get(key, 0) + rows
    if passed < LOOK_EVERY:
        _rows[key] = passed
        return
    _rows[key] = 0
    resident = _resident_file()
    if resident is None:
        return
    base = _baseline.setdefault(key, resident)
    if resident - base > BUDGET:
        release(driver)


def forget(driver: Any) -> None:
    """Forget the counts of a closed ``driver`` (a later driver may be given its ``id``)."""
    key = id(driver)
    for counts in (_pending, _rows, _baseline, _places):
        counts.pop(key, None)


def data_file(env: Any) -> str | None:
    try:
        path = env.path()
        subdir = env.flags()["subdir"]
    except Exception:  # a closed environment
        return None
    return os.path.realpath(os.path.join(path, "data.mdb") if subdir else path)


def mappings(files: set[str]) -> list[tuple[int, int]]:
    """``(start, end)`` of this process's mappings of ``files``."""
    return [(start, end) for start, end, _ in mappings_of(files)]


def mappings_of(files: set[str]) -> list[tuple[int, int, str]]:
    """``(start, end, file)`` of this process's mappings of ``files``."""
    found = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and (file := fields[5].rstrip("\n")) in files:
                    start, end = fields[0].split("-")
                    found.append((int(start, 16), int(end, 16), file))
    except OSError:
        pass
    return found


#: Per driver: its maps' files and where ``/proc/self/maps`` last showed them mapped.
_places: dict[int, tuple[set[str], list[tuple[int, int, str]]]] = {}


def _still_mapped(start: int, end: int, file: str) -> bool:
    """Whether ``start``-``end`` is still one mapping of ``file`` (``/proc/self/map_files``:
    one ``readlink``, 5 us, where reading ``/proc/self/maps`` took 0.4-1.2 ms)."""
    try:
        return os.readlink(f"/proc/self/map_files/{start:x}-{end:x}") == file
    except OSError:  # gone, split, or a kernel that does not show it: look again
        return False


def _mapped(driver: Any, files: set[str]) -> list[tuple[int, int]]:
    """Where ``files`` (``driver``'s maps) are mapped: as last found while each place is still
    a mapping of its file, else found again. A map moves only when resized or reopened, and
    a place given back to ``madvise(MADV_DONTNEED)`` must be the map's: the memory mapped
    there next (the interpreter's, say) would be zeroed."""
    key = id(driver)
    known = _places.get(key)
    if known is not None and known[0] == files and known[1]:
        if all(_still_mapped(*place) for place in known[1]):
            return [(start, end) for start, end, _ in known[1]]
    places = mappings_of(files)
    _places[key] = (files, places)
    return [(start, end) for start, end, _ in places]


def release(driver: Any) -> None:
    """Drop every page of ``driver``'s maps from the process's resident set."""
    madvise = _libc_madvise()
    if not madvise:
        return
    files = {f for env in _environments(driver) if (f := data_file(env)) is not None}
    for start, end in _mapped(driver, files):
        if madvise(start, end - start, MADV_DONTNEED) != 0:
            log.debug("madvise of the LMDB map failed: errno %d", ctypes.get_errno())
    # What is resident now is other files' (libraries mapped since the first look, say): the
    # next release is due when the maps have grown a budget past the higher of this and the
    # first look, not at every look.
    resident = _resident_file()
    if resident is not None:
        key = id(driver)
        _baseline[key] = max(resident, _baseline.get(key, resident))
