"""What a driver is, declared in its package without importing it: :class:`About`.

The command line needs to know a URL's driver before it opens anything, and without importing
the driver's client library (``redis``, ``psycopg``, ``icechunk``): which schemes it serves,
whether the URL names a local file or folder (made absolute against the caller's folder, its
kind told by its first bytes: :class:`~zarrfs.backends.dbfiles.DatabaseFiles`), which query
options the URL takes and which of them carry a secret (left out wherever the URL is shown).
Each driver package declares this in its ``about`` module (``ABOUT = About(...)``); the
registry reads it, and imports the driver's class only when a database is opened.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import DriverNotFoundError

if TYPE_CHECKING:
    from .base import Driver
    from .dbfiles import DatabaseFiles


#: The query options a URL's secret is given by when its driver declares nothing else.
DEFAULT_SECRETS = ("password", "password_file")


@dataclass(frozen=True, eq=False)
class About:
    """One driver's declaration; see the module docstring."""

    #: The driver's class as ``"package.module:Class"``, imported when a URL needs it.
    driver: str
    #: The URL schemes it serves, lower case, e.g. ``("postgresql", "postgres")``.
    schemes: tuple[str, ...]
    #: How messages name one of its databases: ``"an LMDB database"``.
    kind: str = "a database"
    #: A database that is a local file or folder: how its path is told apart before it is
    #: opened. None: a server (or memory), whose URL is never a path.
    files: DatabaseFiles | None = None
    #: A bare path (no ``scheme://``) ending so is this driver's database (``".zarrdb"``);
    #: ``""``: every bare path no other driver claims; None: a bare path is never this driver's.
    bare: str | None = None
    #: The query options its URL takes; any other is refused when it opens.
    options: tuple[str, ...] = ()
    #: Query options whose value is a secret: left out, with a password in the URL's user
    #: part, wherever the URL is shown (logs, the mount table, ``zarrfs status``). A file
    #: database's URL is shown as it is.
    secrets: tuple[str, ...] = DEFAULT_SECRETS
    #: Query options naming a local file (``password_file``), made absolute against the
    #: caller's folder before the daemon, which runs in ``/``, reads them.
    path_options: tuple[str, ...] = ("password_file",)
    #: Environment variables the command line reads a password from, in order, when the URL
    #: has none and no ``?password_file=``; the password (from either) reaches the driver as
    #: ``?password=``, and the daemon gets neither the variables nor the file's path.
    password_env: tuple[str, ...] = ()
    #: What to ``pip install`` when the driver's import fails for a missing module, by the
    #: module's top-level name (``"*"``: any module; a name not given: the name itself).
    pip: Mapping[str, str] = field(default_factory=dict)

    def driver_class(self, scheme: str) -> type[Driver]:
        """Import and return the driver's class (``scheme``: the URL's, for messages)."""
        from .base import Driver

        module_name, _, class_name = self.driver.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = exc.name or ""
            if missing and module_name != missing and not module_name.startswith(missing + "."):
                top = missing.split(".")[0]
                pip = self.pip.get(top) or self.pip.get("*") or top
                raise DriverNotFoundError(
                    f"the {scheme!r} driver needs the Python package {pip!r}: pip install {pip}"
                ) from exc
            raise DriverNotFoundError(
                f"cannot import the {scheme!r} driver module {module_name!r}: {exc}"
            ) from exc
        cls = getattr(module, class_name, None)
        if cls is None:
            raise DriverNotFoundError(f"module {module_name!r} has no driver class {class_name!r}")
        if not (isinstance(cls, type) and issubclass(cls, Driver)):
            raise DriverNotFoundError(f"{self.driver!r} is not a zarrfs Driver subclass")
        return cls


__all__ = ["DEFAULT_SECRETS", "About"]
