"""URL scheme -> a driver's declaration (:class:`~zarrfs.backends.about.About`) -> its class,
imported only when a database is opened.

The built-in drivers are the packages under ``zarrfs.backends`` with an ``about`` module; their
declarations are read the first time a URL is looked at (they import no client library, so
importing zarrfs never imports ``lmdb`` or ``redis``). Third-party packages add drivers through
the entry-point group ``zarrfs.backends`` (name = scheme, value = ``"module:Class"``, or
``"module:ABOUT"`` naming an :class:`About`, to declare more than the scheme); they never replace
a built-in or an explicitly registered scheme. A bare filesystem path, with no ``scheme://``,
is the database of the driver whose ``About.bare`` claims it (LMDB; SQLite for ``.zarrdb``).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import threading
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .about import About
from .base import Driver, DriverNotFoundError

if TYPE_CHECKING:
    from .dbfiles import DatabaseFiles

ENTRY_POINT_GROUP = "zarrfs.backends"

# Scheme -> its driver's declaration; an entry point's target waits in _pending until its
# scheme is asked for (importing it may import the driver's client library).
_abouts: dict[str, About] = {}
_pending: dict[str, str] = {}
_found = False
_entry_points_loaded = False
_lock = threading.RLock()
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _builtins() -> None:
    """Read the declarations of the driver packages under ``zarrfs.backends`` (once)."""
    global _found
    if _found:
        return
    with _lock:
        if _found:
            return
        package = __name__.rpartition(".")[0]
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            name = f"{package}.{info.name}.about"
            if info.ispkg and find_spec(name) is not None:
                declare(importlib.import_module(name).ABOUT, clobber=False)
        _found = True


def declare(about: About, *, clobber: bool = True) -> None:
    """Map every scheme of ``about`` to it (``clobber=False`` keeps an existing mapping)."""
    if ":" not in about.driver:
        raise ValueError(f"driver target {about.driver!r} is not of the form 'module:Class'")
    with _lock:
        for scheme in about.schemes:
            scheme = scheme.lower()
            if clobber or (scheme not in _abouts and scheme not in _pending):
                _abouts[scheme] = about
                _pending.pop(scheme, None)


def register(scheme: str, target: str, *, clobber: bool = True, pip: str | None = None) -> None:
    """Map URL ``scheme`` to the driver class ``target`` (``"package.module:Class"``), declared
    with the defaults of :class:`About`. ``clobber=False`` keeps an existing mapping. ``pip``
    names the distribution to suggest when importing the driver's module fails for a missing
    dependency."""
    _builtins()
    declare(About(driver=target, schemes=(scheme.lower(),), pip={"*": pip} if pip else {}), clobber=clobber)


def load_entry_points(force: bool = False) -> None:
    """Add the drivers of the ``zarrfs.backends`` entry-point group (once, or again with
    ``force`` after installing a package); they never replace an existing scheme."""
    from importlib.metadata import entry_points  # scanning every installed package: when needed

    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return
    _builtins()
    _entry_points_loaded = True
    with _lock:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            scheme = ep.name.lower()
            if scheme not in _abouts and scheme not in _pending:
                _pending[scheme] = ep.value


def _resolve(scheme: str, target: str) -> About:
    """The declaration an entry point names: an :class:`About`, or a driver class (declared
    with the defaults)."""
    module_name, _, name = target.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        found = None  # About.driver_class says what is missing, when the driver is opened
    if isinstance(found, About):
        return found
    return About(driver=target, schemes=(scheme,))


def about(scheme: str) -> About:
    """The declaration of the driver of URL scheme ``scheme`` (the entry points are looked at
    for a scheme not built in only: they never replace one)."""
    _builtins()
    scheme = scheme.lower()
    if scheme not in _abouts and scheme not in _pending:
        load_entry_points()
    with _lock:
        if scheme in _pending:
            _abouts[scheme] = _resolve(scheme, _pending.pop(scheme))
        found = _abouts.get(scheme)
    if found is None:
        raise DriverNotFoundError(
            f"no zarrfs driver for URL scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    return found


def declared(scheme: str) -> About | None:
    """:func:`about`, or None for a scheme no driver serves (or "" for a bare path)."""
    if not scheme:
        return None
    try:
        return about(scheme)
    except DriverNotFoundError:
        return None


def known_schemes() -> list[str]:
    """Return every scheme a URL may use, built-in and from entry points, sorted."""
    load_entry_points()
    return sorted({*_abouts, *_pending})


def file_kinds() -> dict[str, DatabaseFiles]:
    """Scheme -> how its databases lie on disk, for every built-in file database's driver
    (one scheme each)."""
    _builtins()
    with _lock:
        return {a.schemes[0]: a.files for a in dict.fromkeys(_abouts.values()) if a.files is not None}


def files_of(scheme: str) -> DatabaseFiles | None:
    """How the databases of ``scheme`` lie on disk; None for a server's (or an unknown) scheme."""
    found = declared(scheme)
    return None if found is None else found.files


def what_is_there(scheme: str, path: str) -> str:
    """What ``path`` holds for the file database scheme ``scheme``: see
    :meth:`~zarrfs.backends.dbfiles.DatabaseFiles.what_is_there`."""
    files = files_of(scheme)
    if files is None:
        raise DriverNotFoundError(f"{scheme}:// names no file database")
    return files.what_is_there(path)


def kind_at(path: str, but: str = "") -> str | None:
    """The scheme of the file database at ``path`` (not ``but``'s), or None when it holds none."""
    return next(
        (s for s, files in file_kinds().items() if s != but and files.what_is_there(path) == "database"), None
    )


def bare_path_scheme(path: str) -> str:
    """The scheme of a bare path: that of the driver whose ``About.bare`` suffix it ends with
    (the longest), else that of the driver taking every other bare path."""
    _builtins()
    low = path.rstrip("/").lower()
    with _lock:
        claims = sorted(
            ((a.bare, s) for s, a in _abouts.items() if a.bare is not None and s == a.schemes[0]),
            key=lambda c: -len(c[0]),
        )
    for suffix, scheme in claims:
        if low.endswith(suffix):
            return scheme
    raise DriverNotFoundError(f"{path}: no driver takes a bare path")


def normalize_url(url: str) -> tuple[str, str]:
    """Return ``(scheme, url)``; a bare path becomes ``lmdb:///absolute/path`` (``sqlite://`` for
    a ``.zarrdb`` file: see :func:`bare_path_scheme`)."""
    m = _SCHEME.match(url)
    if m is None:
        scheme = bare_path_scheme(url)
        return scheme, f"{scheme}://" + os.path.abspath(os.path.expanduser(url))
    return m.group(1).lower(), url


def password_env() -> tuple[str, ...]:
    """Every environment variable a driver's password may be read from (``About.password_env``)."""
    _builtins()
    with _lock:
        return tuple(dict.fromkeys(n for a in _abouts.values() for n in a.password_env))


def driver_class(scheme: str) -> type[Driver]:
    """Import and return the driver class registered for ``scheme``."""
    return about(scheme).driver_class(scheme)


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
