"""URL scheme -> driver class, imported only when a URL needs it.

The table maps a scheme to ``"module:Class"`` (as fsspec's registry does), so importing zarrfs
never imports ``lmdb`` or ``redis``. Third-party packages add drivers through the entry-point
group ``zarrfs.backends`` (name = scheme, value = ``"module:Class"``); they feed the same table
but never replace a built-in or an explicitly registered scheme. A bare filesystem path, with no
``scheme://``, means LMDB, or SQLite when it ends in ``.zarrdb``.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from typing import Any

from .base import Driver, DriverNotFoundError

ENTRY_POINT_GROUP = "zarrfs.backends"
ZARRDB_SUFFIX = ".zarrdb"  # zarr-sqlite's file extension: a bare path ending so is SQLite

_LMDB = "zarrfs.backends.lmdb:LMDBDriver"
_REDIS = "zarrfs.backends.redis:RedisDriver"
_CLUSTER = "zarrfs.backends.redis_cluster:RedisClusterDriver"
_POSTGRES = "zarrfs.backends.postgres:PostgresDriver"
_table: dict[str, str] = {
    "lmdb": _LMDB,
    "sqlite": "zarrfs.backends.sqlite:SQLiteDriver",
    "redis": _REDIS,
    "rediss": _REDIS,
    "unix": _REDIS,
    "valkey": _REDIS,
    "valkeys": _REDIS,
    "redis+cluster": _CLUSTER,
    "rediss+cluster": _CLUSTER,
    "valkey+cluster": _CLUSTER,
    "valkeys+cluster": _CLUSTER,
    "memory": "zarrfs.backends.memory:MemoryDriver",
    "postgresql": _POSTGRES,
    "postgres": _POSTGRES,
    "dbm": "zarrfs.backends.dbm:DBMDriver",
    "zip": "zarrfs.backends.zip:ZipDriver",
    "icechunk": "zarrfs.backends.icechunk:IcechunkDriver",
}
# Import name of a dependency -> the distribution to ``pip install`` when it is missing.
_pip_names: dict[str, str] = {
    "lmdb": "lmdb",
    "redis": "redis",
    "hiredis": "hiredis",
    "psycopg": "psycopg[binary]",
    "icechunk": "zarrfs[icechunk]",
}
# Scheme -> the distribution that provides a registered driver's dependencies, when given.
_scheme_pip: dict[str, str] = {}

_entry_points_loaded = False
_lock = threading.Lock()
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def register(scheme: str, target: str, *, clobber: bool = True, pip: str | None = None) -> None:
    """Map URL ``scheme`` to the driver class ``target`` (``"package.module:Class"``).

    ``clobber=False`` keeps an existing mapping. ``pip`` names the distribution to suggest when
    importing the driver's module fails for a missing dependency."""
    if ":" not in target:
        raise ValueError(f"driver target {target!r} is not of the form 'module:Class'")
    scheme = scheme.lower()
    with _lock:
        if clobber or scheme not in _table:
            _table[scheme] = target
        if pip:
            _scheme_pip[scheme] = pip


def load_entry_points(force: bool = False) -> None:
    """Add the drivers of the ``zarrfs.backends`` entry-point group to the table (once, or again
    with ``force`` after installing a package); they never replace an existing scheme."""
    from importlib.metadata import entry_points  # scanning every installed package: when needed

    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        register(ep.name, ep.value, clobber=False)


def known_schemes() -> list[str]:
    """Return every scheme a URL may use, built-in and from entry points, sorted."""
    load_entry_points()
    return sorted(_table)


def bare_path_scheme(path: str) -> str:
    """The scheme of a bare path: ``sqlite`` for a ``.zarrdb`` file (zarr-sqlite's extension),
    else ``lmdb``."""
    return "sqlite" if path.rstrip("/").lower().endswith(ZARRDB_SUFFIX) else "lmdb"


def normalize_url(url: str) -> tuple[str, str]:
    """Return ``(scheme, url)``; a bare path becomes ``lmdb:///absolute/path`` (``sqlite://`` for
    a ``.zarrdb`` file)."""
    m = _SCHEME.match(url)
    if m is None:
        scheme = bare_path_scheme(url)
        return scheme, f"{scheme}://" + os.path.abspath(os.path.expanduser(url))
    return m.group(1).lower(), url


def driver_class(scheme: str) -> type[Driver]:
    """Import and return the driver class registered for ``scheme`` (the entry points are
    looked at for a scheme not built in only: they never replace one)."""
    if scheme.lower() not in _table:
        load_entry_points()
    target = _table.get(scheme.lower())
    if target is None:
        raise DriverNotFoundError(
            f"no zarrfs driver for URL scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or ""
        if missing and module_name != missing and not module_name.startswith(missing + "."):
            top = missing.split(".")[0]
            pip = _scheme_pip.get(scheme.lower()) or _pip_names.get(top, top)
            raise DriverNotFoundError(
                f"the {scheme!r} driver needs the Python package {pip!r}: pip install {pip}"
            ) from exc
        raise DriverNotFoundError(
            f"cannot import the {scheme!r} driver module {module_name!r}: {exc}"
        ) from exc
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise DriverNotFoundError(f"module {module_name!r} has no driver class {class_name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise DriverNotFoundError(f"{target!r} is not a zarrfs Driver subclass")
    return cls


def open_driver(url: str, readonly: bool = False, timeout: float | None = None, **options: Any) -> Driver:
    """Open the database at ``url`` with the driver its scheme names (a bare path: LMDB);
    ``options`` go to that driver's class (its own keyword arguments). ``timeout``: the
    driver's :attr:`~Driver.timeout` from the start, so it bounds the connect and the first
    calls of the open too (a server that accepts and never answers)."""
    scheme, url = normalize_url(url)
    cls = driver_class(scheme)
    if timeout is None:
        return cls(url, readonly=readonly, **options)
    driver = cls.__new__(cls)
    driver.timeout = timeout  # read by __init__, which connects
    driver.__init__(url, readonly=readonly, **options)
    driver.set_timeout(timeout)
    return driver
