"""Where a URL of the fsspec filesystems points: the database and the key inside it.

A URL is the mount's URL with a path inside the database after the database's own part and
before the options, so that fsspec can join paths onto it: ``lmdb:///data/x.lmdb/run1/t/zarr.json``,
``redis://host:6379/0/run1?prefix=zarr``, ``postgresql://me@host/db/run1?table=zarr``,
``redis+cluster://h1:7000,h2:7001/run1?prefix=zarr``, ``icechunk:///repo@tag.v1/t``.

The path fsspec hands around (:func:`strip`) is the URL without its scheme, credentials and
options: a file database's absolute path, then the key; a server's ``host:port`` and database
part, then the key. Where a file database's path ends is found on disk (:func:`split_files`):
at the first name that is not a folder (a database file, or nothing yet: a database is made
there) or is a database folder (an LMDB environment, an Icechunk repository); a path of folders
only is the database itself (an empty folder a new LMDB database is made in).
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from zarrfs.backends.registry import files_of, what_is_there
from zarrfs.backends.versionpath import split_version

#: Schemes whose database is a path on this machine (a Redis ``unix://`` socket too).
PATH_SCHEMES = ("lmdb", "sqlite", "dbm", "zip", "icechunk", "unix")
POSTGRES_SCHEMES = ("postgresql", "postgres")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster")
REDIS_SCHEMES = ("redis", "rediss", "valkey", "valkeys")


def credentials(url: str) -> tuple[str, str | None]:
    """``(user, password)`` written in ``url``'s netloc (unquoted; "" and None when absent)."""
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return "", None
    userinfo = netloc.rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    return unquote(user), unquote(password) if colon else None


def url_options(url: str) -> dict[str, str]:
    """The query options of ``url`` (the last of a repeated one)."""
    if "://" not in url:
        return {}
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def strip(scheme: str, url: str) -> str:
    """The path of ``url`` as the filesystem passes it around (see the module docstring); a
    path without the scheme comes back as it is, but for a trailing slash."""
    prefix = scheme + "://"
    if not url.startswith(prefix):
        return url.rstrip("/")
    parts = urlsplit(url)
    if scheme in PATH_SCHEMES:
        path = unquote(parts.netloc + parts.path)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        if scheme == "zip":  # fsspec's own zip://inner::... (see schemes): made absolute later
            return path.rstrip("/")
        return os.path.abspath(os.path.expanduser(path)) if path else ""
    hosts = parts.netloc.rpartition("@")[2]
    user = credentials(url)[0]
    if user and scheme in POSTGRES_SCHEMES:  # a user name is no secret, and names the database
        hosts = f"{quote(user, safe='')}@{hosts}"
    return (hosts + unquote(parts.path)).rstrip("/")


def split_servers(scheme: str, path: str) -> tuple[str, str]:
    """``(root, key)`` of a server database's path: the hosts and, for Redis, a database number
    (``host:6379/0``), for PostgreSQL the database name (``me@host/db``)."""
    hosts, _, rest = path.partition("/")
    if scheme in CLUSTER_SCHEMES or not rest:
        return hosts, rest
    first, _, after = rest.partition("/")
    if scheme in POSTGRES_SCHEMES or (first.isascii() and first.isdigit()):
        return f"{hosts}/{first}", after
    return hosts, rest


def _ends_database(scheme: str, path: str) -> bool:
    if scheme == "icechunk":
        path = split_version(path)[0]
    if scheme == "dbm":
        return what_is_there("dbm", path) != "other" or not os.path.isdir(path)
    if not os.path.isdir(path):
        return True  # a file, a socket, or nothing: the database is here
    files = files_of(scheme)  # None for a unix socket's path: a folder is never that
    return files is not None and files.what_is_there(path) == "database"  # an LMDB or Icechunk folder


def split_files(scheme: str, path: str, known: frozenset[str]) -> tuple[str, str]:
    """``(root, key)`` of a path database's path, ``known`` the roots found before (looked up
    first, without touching the disk)."""
    for root in known:
        if path == root or path.startswith(root + "/"):
            return root, path[len(root) + 1 :]
    names = path.strip("/").split("/")
    for i in range(1, len(names) + 1):
        root = "/" + "/".join(names[:i])
        if _ends_database(scheme, root):
            return root, "/".join(names[i:])
    return path, ""


def driver_url(scheme: str, root: str, options: dict[str, str], password: str | None) -> str:
    """The driver's URL (the mount's) of the database at ``root`` with its query ``options``
    and ``password``."""
    query = f"?{urlencode(options)}" if options else ""
    if scheme in PATH_SCHEMES:
        return f"{scheme}://{quote(root)}{query}"
    hosts, _, tail = root.partition("/")
    user, at, hosts = hosts.rpartition("@")
    if password is not None:
        user = f"{user}:{quote(password, safe='')}"
        at = "@"
    return f"{scheme}://{user}{at}{hosts}/{tail}{query}"
