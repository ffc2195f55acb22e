"""The fsspec filesystem over every zarrfs driver: zarr, xarray, dask and ``fsspec.open`` reach a
database by its URL, without a mount.

Each database a path leads to is served by a :class:`zarrfs.store.DatabaseStore` (the same
records as a mount writes, the same format layer: ``validate`` and ``consolidate`` as the
mount's options, ``strict`` and ``auto`` by default), opened at its first use (under a lock:
see :meth:`DatabaseFileSystem._first_use`) and kept until :meth:`~DatabaseFileSystem.close` or
the process's exit. Connections are held per process: an instance pickles as its scheme and
options (fsspec's ``storage_options``), so a dask worker or a forked child opens its own, and
the databases opened by another process are never used after a fork. Within a process every
instance (fsspec makes one per thread) shares each database's driver, each call serialised by
the store's lock (a call is one short transaction). A read-only database (``read_only=True``,
an existing zip archive, an Icechunk tag) refuses writes with ``PermissionError`` (``EROFS``).
"""

from __future__ import annotations

import atexit
import errno
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, ClassVar

from fsspec.spec import AbstractFileSystem

from zarrfs.backends.base import SIZES
from zarrfs.backends.registry import what_is_there
from zarrfs.backends.versionpath import split_version
from zarrfs.dbfiles import check_database_path
from zarrfs.fs import parts
from zarrfs.urls import MountFailure, with_password

if TYPE_CHECKING:  # zarr is imported at the first database opened: fsspec imports this module
    from zarrfs.store import DatabaseStore  # for every zip:// of its own too (see schemes)

from . import location
from .errors import read_only, translated
from .files import KeyFile

#: The databases this process opened, by what opened them; fsspec makes an instance per thread,
#: and they share these. Closed at the process's exit: an Icechunk branch commits its writes then.
_STORES: OrderedDict[tuple[Any, ...], DatabaseStore] = OrderedDict()  # least recently used first
#: The most databases a process keeps open: an LMDB environment maps its whole map size (1 TiB
#: by default) into the address space, and a process that opened a few hundred ran out of it.
#: The least recently used one is closed past this (it opens again when used); an Icechunk
#: branch, whose writes its close would commit, is never closed so.
MAX_OPEN = 16
#: scheme -> the databases open in this process (where a path's database ends, known without
#: looking at the disk again); a database is first opened under ``_OPENING``.
_ROOTS: dict[str, frozenset[str]] = {}  # replaced, never changed: read without the lock
_OPENING = threading.Lock()
_STORES_LOCK = threading.Lock()
_STORES_PID = [os.getpid()]


@atexit.register
def _close_all() -> None:
    with _STORES_LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
    for store in stores:
        store.close()


#: Keyword arguments fsspec itself gives a filesystem: never database options.
FSSPEC_OWN = {
    "asynchronous", "loop", "skip_instance_cache", "use_listings_cache", "listings_expiry_time",
    "max_paths", "batch_size",
}  # fmt: skip


class DatabaseFileSystem(AbstractFileSystem):
    """A zarrfs database (or several of one scheme) as an fsspec filesystem; a subclass per
    scheme (:mod:`zarrfs.urlfs.schemes`) sets :attr:`protocol`.

    ``read_only``: open every database read-only. ``validate``, ``consolidate``: the mount's
    options of those names. ``password``: a server's password, kept out of every path (also
    taken from the URL, ``?password_file=`` and, for Redis, ``$ZARRFS_PASSWORD`` and
    ``$REDISCLI_AUTH``). Any other keyword is the database's own query option
    (``prefix=``, ``table=``, ``map_size=``...), refused with the known ones if the driver has
    none of that name."""

    protocol: ClassVar[str] = "zarrfs"
    root_marker = ""

    def __init__(
        self,
        *,
        read_only: bool = False,
        validate: str = "strict",
        consolidate: str = "auto",
        password: str | None = None,
        **options: Any,
    ) -> None:
        own = {k: options.pop(k) for k in list(options) if k in FSSPEC_OWN}
        super().__init__(**own)
        for name, value, allowed in (
            ("validate", validate, ("strict", "warn", "off")),
            ("consolidate", consolidate, ("auto", "live", "off")),
        ):
            if value not in allowed:
                raise ValueError(f"{self.protocol}:// option {name}={value!r}: one of {', '.join(allowed)}")
        self.read_only = bool(read_only)
        self.validate = validate
        self.consolidate = consolidate
        self.password = password
        self.options = {k: str(v) for k, v in options.items()}
        self._idents: dict[str, tuple[Any, ...]] = {}  # root -> its key in _STORES

    # ------------------------------------------------------------------ URLs and paths
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return location.strip(cls.protocol, str(path))

    @classmethod
    def _get_kwargs_from_urls(cls, path: str) -> dict[str, Any]:
        options: dict[str, Any] = location.url_options(path)
        password = location.credentials(path)[1]
        if password is not None:
            options["password"] = password
        return options

    def unstrip_protocol(self, name: str) -> str:
        """The URL of a path, without the options or the password."""
        prefix = f"{self.protocol}://"
        return name if name.startswith(prefix) else prefix + name

    def _split(self, path: str) -> tuple[str, str]:
        path = self._strip_protocol(path)
        if self.protocol == "zip":
            path = os.path.abspath(os.path.expanduser(path))
        if self.protocol in location.PATH_SCHEMES:
            return location.split_files(self.protocol, path, _ROOTS.get(self.protocol, frozenset()))
        return location.split_servers(self.protocol, path)

    def _store(self, root: str) -> DatabaseStore:
        ident = self._idents.get(root)
        if ident is None:
            url = location.driver_url(self.protocol, root, self.options, self.password)
            with translated(self.unstrip_protocol(root), self.password):
                url = with_password(url)
            ident = self._idents[root] = (url, *self._config())
        evicted = []
        with _STORES_LOCK:
            if _STORES_PID[0] != os.getpid():  # forked: the parent's connections are not ours
                _STORES.clear()
                _ROOTS.clear()
                _STORES_PID[0] = os.getpid()
            store = _STORES.get(ident)
            if store is not None:
                _STORES.move_to_end(ident)
                return store
            try:
                from zarrfs.store import DatabaseStore
            except ImportError as exc:
                raise ImportError(
                    f"{self.protocol}:// URLs need {exc.name or 'zarr'}: pip install 'zarrfs[fsspec]'"
                ) from None

            store = _STORES[ident] = DatabaseStore(
                ident[0], read_only=self.read_only, validate=self.validate, consolidate=self.consolidate
            )
            for old in list(_STORES):
                if len(_STORES) <= MAX_OPEN:
                    break
                if old != ident and old[1] != "icechunk":
                    evicted.append(_STORES.pop(old))
        for old_store in evicted:
            old_store.close()
        return store

    def _check(self, root: str, write: bool) -> None:
        """What the mount checks before it opens a file database: a path that holds something
        else is never written into; a missing database is made by a write, never by a read."""
        if self.protocol not in location.PATH_SCHEMES or self.protocol == "unix":
            return
        path = split_version(root)[0] if self.protocol == "icechunk" else root
        create = write and not self.read_only
        try:
            check_database_path(self.protocol, path, create=create, readonly=self.read_only, hint=False)
        except MountFailure as exc:
            if not create and what_is_there(self.protocol, path) in ("missing", "empty"):
                raise FileNotFoundError(errno.ENOENT, str(exc)) from None
            raise ValueError(str(exc)) from None

    def _first_use(self, path: str, write: bool) -> tuple[str, str]:
        """The database and key of ``path`` when its database is not open in this process yet:
        found, checked and opened (created, for a write) under one lock, so that no other
        thread's walk sees a database half made (an LMDB folder without its data file yet) and
        takes a path inside it for another database."""
        with _OPENING:
            root, key = self._split(path)
            if root in _ROOTS.get(self.protocol, ()):
                return root, key
            self._check(root, write)
            store = self._store(root)
            with translated(self.unstrip_protocol(root), self.password):
                store._open_sync()
            _ROOTS[self.protocol] = _ROOTS.get(self.protocol, frozenset()) | {root}
            return root, key

    def _call(self, path: str, fn, write: bool = False) -> Any:
        """``fn(store, key)`` for the database and key of ``path``, errors translated."""
        root, key = self._split(path)
        if write and self.read_only:
            raise read_only(self.unstrip_protocol(root))
        if root not in _ROOTS.get(self.protocol, ()):
            root, key = self._first_use(path, write)
        where = self.unstrip_protocol(root)
        store = self._store(root)

        with translated(where, self.password):
            return fn(store, key)

    def close(self) -> None:
        """Close the databases of this scheme and these options open in the process, whichever
        instance opened them (fsspec makes one per thread, zarr one more): they open again when
        used. An Icechunk branch commits its writes."""
        with _STORES_LOCK:
            mine = [store for ident, store in _STORES.items() if ident[1:] == self._config()]
        for store in mine:
            store.close()

    def _config(self) -> tuple[Any, ...]:
        options = tuple(sorted(self.options.items()))
        return (self.protocol, self.read_only, self.validate, self.consolidate, self.password, options)

    # ------------------------------------------------------------------ reads
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The value at ``path`` (bytes ``start:end`` of it, negative from its end)."""

        def read(store: DatabaseStore, key: str) -> bytes:
            got = store.get_sync(key, byte_range=_byte_range(start, end, store, key))
            if got is None:
                raise FileNotFoundError(self.unstrip_protocol(path))
            return got.to_bytes()

        return self._call(path, read)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """A key (``file``, with its size) or a folder (``directory``): a database's root or a
        prefix of keys."""

        def look(store: DatabaseStore, key: str) -> dict[str, Any]:
            name = self._strip_protocol(path)
            if key:
                size = store._read(lambda t: parts.size_of(t, key))
                if size is not None:
                    return {"name": name, "size": size, "type": "file"}
                if next(iter(store.keys_sync(key + "/")), None) is None:
                    raise FileNotFoundError(self.unstrip_protocol(name))
            return {"name": name, "size": 0, "type": "directory"}

        return self._call(path, look)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """What is directly under ``path``; a key lists as itself."""

        def listing(store: DatabaseStore, key: str) -> list[dict[str, Any]]:
            base = self._strip_protocol(path)
            out = [
                {"name": f"{base}/{name}", "size": size or 0, "type": "directory" if size is None else "file"}
                for name, size in store.entries_sync(key, SIZES)
            ]
            if not out and key:
                size = store._read(lambda t: parts.size_of(t, key))
                if size is None:
                    raise FileNotFoundError(self.unstrip_protocol(base))
                out = [{"name": base, "size": size, "type": "file"}]
            return out

        entries = self._call(path, listing)
        return entries if detail else [e["name"] for e in entries]

    def find(
        self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kw: Any
    ) -> Any:
        """Every key under ``path`` (and with ``withdirs`` the folders between), streamed from
        the database's ordered scan, not walked folder by folder."""
        base = self._strip_protocol(path)

        def scan(store: DatabaseStore, key: str) -> dict[str, dict[str, Any]]:
            below = key + "/" if key else ""
            out: dict[str, dict[str, Any]] = {}
            if key:
                size = store._read(lambda t: parts.size_of(t, key))
                if size is not None:
                    out[base] = {"name": base, "size": size, "type": "file"}
            for k, size in store.keys_sync(below, SIZES):
                rel = k[len(below) :].split("/")
                if maxdepth is not None and len(rel) > maxdepth:
                    if withdirs:
                        rel = rel[:maxdepth]
                        name = f"{base}/{'/'.join(rel)}"
                        out.setdefault(name, {"name": name, "size": 0, "type": "directory"})
                    continue
                if withdirs:
                    for i in range(1, len(rel)):
                        name = f"{base}/{'/'.join(rel[:i])}"
                        out.setdefault(name, {"name": name, "size": 0, "type": "directory"})
                name = f"{base}/{'/'.join(rel)}"
                out[name] = {"name": name, "size": size, "type": "file"}
            if withdirs and not key:
                out.setdefault(base, {"name": base, "size": 0, "type": "directory"})
            return dict(sorted(out.items()))

        try:
            found = self._call(path, scan)
        except FileNotFoundError:  # no database there (yet): nothing under it
            found = {}
        return found if detail else sorted(found)

    # ------------------------------------------------------------------ writes
    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Store ``value`` at ``path`` (one transaction, with the file's records, as a mount
        writes it); ``mode="create"`` stores only if nothing is there."""
        from zarr.core.buffer import cpu

        buf = cpu.Buffer.from_bytes(bytes(value))

        def put(store: DatabaseStore, key: str) -> None:
            if not key:
                raise IsADirectoryError(self.unstrip_protocol(path))
            if mode == "create":
                from zarr.core.sync import sync

                sync(store.set_if_not_exists(key, buf))
            else:
                store.set_sync(key, buf)

        self._call(path, put, write=True)

    def rm_file(self, path: str) -> None:
        """Remove the key at ``path``."""
        self._call(path, lambda store, key: store.delete_sync(key), write=True)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Remove keys; ``recursive``: and everything under them (one transaction each)."""
        for p in [path] if isinstance(path, str) else path:

            def remove(store: DatabaseStore, key: str) -> None:
                if recursive:
                    store.delete_dir_sync(key)
                if key:
                    store.delete_sync(key)

            self._call(p, remove, write=True)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing: a folder is a prefix of keys, there once a key is under it."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing, as :meth:`mkdir`."""

    def rmdir(self, path: str) -> None:
        """Nothing: a folder without keys is not there."""

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True, **kw):
        if "r" not in mode and self.read_only:
            raise read_only(self.unstrip_protocol(self._split(path)[0]))
        return KeyFile(self, path, mode, block_size or "default", autocommit, **kw)


def _byte_range(start: int | None, end: int | None, store: DatabaseStore, key: str) -> Any:
    """zarr's byte request for Python's slice ``start:end`` of a value."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if start is None and end is None:
        return None
    if (start or 0) < 0 and end is None:
        return SuffixByteRequest(-start)
    if end is None:
        return OffsetByteRequest(start)
    if (start or 0) < 0 or end < 0:
        size = store._read(lambda t: parts.size_of(t, key)) or 0
        start = max(0, size + start) if start is not None and start < 0 else start or 0
        end = max(0, size + end) if end < 0 else end
    return RangeByteRequest(start or 0, max(start or 0, end))
