"""Releasing the pages of LMDB's memory maps that reads touched.

py-lmdb returns values as slices of the environment's memory map; every page a copy out of
the map touches stays in the process's resident set (file-backed, but VmRSS counts it) until
the kernel needs the memory. Reading a 4 GiB file would so show 4 GiB resident. The callers
that read large values count what they copy (:func:`touched`); past :data:`BUDGET` bytes the
maps of the driver's environments get ``madvise(MADV_DONTNEED)``: the mapping is read-only
and shared (``writemap`` is off), so the next access maps the page again from the page cache,
with the same bytes. Nothing is lost but the mapping itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Any

log = logging.getLogger("zarrfs.backends.lmdb")

BUDGET = 32 << 20
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
    lmdb = sys.modules.get("lmdb")
    if lmdb is None:
        return []
    envs = []
    env = getattr(driver, "env", None)
    if isinstance(env, lmdb.Environment):
        envs.append(env)
    side = getattr(driver, "side", None)
    side_env = getattr(side, "env", None)
    if callable(side_env):
        env = side_env(False)
        if isinstance(env, lmdb.Environment):
            envs.append(env)
    return envs


def touched(driver: Any, nbytes: int) -> None:
    """``nbytes`` were copied out of ``driver``'s maps (nothing happens for other drivers):
    release the maps' pages once :data:`BUDGET` bytes were."""
    key = id(driver)
    pending = _pending.get(key, 0) + nbytes
    if pending < BUDGET:
        _pending[key] = pending
        return
    _pending[key] = 0
    release(driver)


def release(driver: Any) -> None:
    """Drop every page of ``driver``'s maps from the process's resident set."""
    madvise = _libc_madvise()
    if not madvise:
        return
    for env in _environments(driver):
        try:
            info = env.info()
        except Exception:  # a closed environment
            continue
        if madvise(info["map_addr"], info["map_size"], MADV_DONTNEED) != 0:
            log.debug("madvise of the LMDB map failed: errno %d", ctypes.get_errno())
