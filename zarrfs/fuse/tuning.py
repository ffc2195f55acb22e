"""Settings of the process and of the kernel that the daemon makes for speed.

Both are best effort: where a setting cannot be made (no glibc, no permission to write the
mount's ``read_ahead_kb``), the mount works as before and a debug line says why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os

log = logging.getLogger("zarrfs.fuse.tuning")

# mallopt(3) parameters of glibc.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
KEEP_FREED = 128 << 20
DEFAULT_READAHEAD_KIB = 1024
#: Objects the collector's youngest generation gathers before it runs (Python's default: 700).
YOUNG_GENERATION = 50_000


def keep_freed_memory() -> bool:
    """Make glibc reuse freed memory for the next value instead of returning it to the kernel.

    Every chunk passes through a few buffers of its size (the file's buffer, the database's
    copy). By default glibc maps each large buffer afresh and unmaps it when it is freed, so
    every copy page-faults on new memory (docs/performance.md has what that cost). Values up
    to 32 MiB now come from the heap, which keeps up to :data:`KEEP_FREED` bytes of freed
    memory; one arena, since the operations run on one thread. Returns False where there is no
    glibc.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt: freed memory goes back to the kernel at once")
        return False
    settings = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, KEEP_FREED), (M_ARENA_MAX, 1))
    return all(mallopt(param, value) == 1 for param, value in settings)


#: Thread pools of the numerical libraries numpy may load, each held to one thread.
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def no_blas_threads() -> None:
    """Have numpy's BLAS start no worker threads in this process (unless the environment says
    otherwise). The daemon imports numpy for some arrays' checks (a v2 structured type, a codec
    numcodecs builds) and for decoded views, and does no linear algebra, but OpenBLAS starts a
    thread per CPU at its load, which spin waiting for work: 15% of a fresh mount's CPU samples
    during its first Zarr write, on the client's cores
    (docs/performance.md, "A fresh mount's first Zarr metadata: numpy's import"). Only before
    numpy is imported does this count."""
    for name in ONE_THREAD:
        os.environ.setdefault(name, "1")


def collect_less_often() -> None:
    """Run the cyclic garbage collector's youngest generation after :data:`YOUNG_GENERATION`
    new objects rather than 700. A listing's window holds thousands of nodes, attribute records
    and rows across several requests, so at 700 the collector ran many times a window and
    traversed each of them: about 5,300 instructions of the 65,000 a READDIRPLUS name cost
    (callgrind; docs/performance.md, "The garbage collector"). The count is of objects made
    and not yet freed: those freed by reference counting, nearly all of a request's, never add
    up to a collection; only garbage in reference cycles waits longer for one, and no request
    leaves any (``tests/fuse/test_cycles.py``)."""
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


_libc = None


def give_back_memory() -> bool:
    """Return the heap's free memory to the kernel (glibc's ``malloc_trim``): what
    :func:`keep_freed_memory` keeps for the next values is let go once the kernel forgot many
    names at once (a large folder's nodes after memory pressure or ``drop_caches``), so the
    daemon's resident memory falls back with its node table. False where there is no glibc."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(_libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_device(mountpoint: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """``major:minor`` of the filesystem mounted at ``mountpoint`` (the topmost one), read from
    ``mountinfo``. ``mountpoint`` must be resolved already (``os.path.realpath`` before
    mounting): from inside the daemon, a ``stat`` of its own mountpoint would wait for the
    daemon's own answer."""
    target = mountpoint
    device = None
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) > 4 and _unescape(fields[4]) == target:
                    device = fields[2]
    except OSError:
        return None
    return device


def set_readahead(mountpoint: str, kib: int) -> bool:
    """Set the kernel's read-ahead for the mount at ``mountpoint`` (resolved, as for
    :func:`mount_device`) to ``kib`` KiB.

    The kernel reads a FUSE file in requests no larger than its read-ahead window, 128 KiB by
    default: a 4 MiB chunk is then 32 round trips to the daemon. With 1 MiB (the largest
    request the session takes) it is 4. Writing ``/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`` needs
    root; elsewhere this returns False and the kernel's default stays.
    """
    device = mount_device(mountpoint)
    if device is None:
        log.debug("read-ahead left as it is: %s not found in the mount table", mountpoint)
        return False
    path = f"/sys/class/bdi/{device}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kib))
    except OSError as exc:
        log.debug("read-ahead left as it is: cannot write %s (%s)", path, exc.strerror)
        return False
    log.debug("read-ahead of %s set to %d KiB", mountpoint, kib)
    return True
