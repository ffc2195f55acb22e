"""Database URLs as the command line takes them: paths made absolute against the caller's
folder, a Redis password gathered from where it may be given, and the URL as it may be shown
(logs, the mount table, ``zarrfs status``) without credentials."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from zarrfs.usage import UsageError


class MountFailure(Exception):
    """A mount that cannot be made as asked (missing database or mountpoint, busy mountpoint):
    reported as one line, exit status 1."""

# Where a Redis password may come from besides the URL, in this order after the URL's own.
PASSWORD_ENV = ("ZARRFS_PASSWORD", "REDISCLI_AUTH")
SECRET_QUERY = ("password", "password_file")
FILE_SCHEMES = ("lmdb", "sqlite", "dbm", "zip", "icechunk")
# The Redis-protocol schemes, whose password may come from a file or the environment.
REDIS_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys") + tuple(
    f"{s}+cluster" for s in ("redis", "rediss", "valkey", "valkeys")
)
_NO_SECRETS = ("", "lmdb", "sqlite", "dbm", "memory", "zip", "icechunk")
# The schemes of servers (and memory://): never a path, whatever the slashes.
SERVER_SCHEMES = REDIS_SCHEMES + ("postgresql", "postgres", "memory")



def url_scheme(url: str) -> str:
    """The scheme of ``url`` in lower case; "" for a bare path."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and head and head[0].isalpha() and "/" not in head else ""


_scheme = url_scheme


def _one_slash(url: str) -> str:
    """``lmdb:/abs/path`` (one slash, as RFC 8089 spells a local file) as ``lmdb:///abs/path``;
    other URLs as they are."""
    head, sep, rest = url.partition(":")
    if sep and head.lower() in FILE_SCHEMES and not rest.startswith("//"):
        return f"{head}://{rest}"
    return url


def _file_path(url: str) -> str:
    """The path of a ``lmdb://`` or ``sqlite://`` URL as the drivers read it (relative to the
    working folder unless absolute)."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def _quoted(path: str) -> str:
    """``path`` for a URL, quoted only where a URL must be (``%``, ``?``, ``#``, and the tab
    and line breaks ``urlsplit`` drops): ``zarrfs status`` and the mount table show it as it
    is (a comma or a space, not ``%2C``)."""
    for char in "%?#\t\n\r":
        path = path.replace(char, f"%{ord(char):02X}")
    return path


def resolve_url(url: str, cwd: str | None = None) -> str:
    """``url`` with the database path (LMDB, SQLite, DBM, a bare path) and a ``password_file``
    made absolute against ``cwd`` (default: the working folder), so that a daemon running in
    ``/`` opens what the caller named. ``lmdb:/abs/path`` (one slash) is ``lmdb:///abs/path``;
    ``lmdb://rel/path`` and ``lmdb:rel/path`` are relative to ``cwd``."""
    cwd = cwd or os.getcwd()
    url = _one_slash(url)
    scheme = _scheme(url)
    if not scheme:
        _not_a_server(url, cwd)
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(url)))
    parts = urlsplit(url)
    if scheme in FILE_SCHEMES:
        path = _file_path(url)
        if not path:
            raise UsageError(f"{url} names no database path")
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
        return f"{parts.scheme}://{_quoted(path)}" + (f"?{parts.query}" if parts.query else "")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "password_file" for k, _ in query):
        query = [
            (k, os.path.join(cwd, os.path.expanduser(v)) if k == "password_file" else v) for k, v in query
        ]
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}"
    return url


def whole_database(url: str) -> str:
    """``url`` naming the whole database when it names a part of one (a file inside an LMDB
    folder names the folder: see ``Driver.database_at``); other URLs, and bare paths (a folder
    to ``copy``; LMDB's driver finds its folder itself), as they are. A path the driver refuses
    is left for the driver to refuse when it opens it."""
    from zarrfs.backends.errors import BackendError
    from zarrfs.backends.registry import driver_class, normalize_url

    scheme = _scheme(url)
    path = database_path(url) if scheme else None  # a bare path may be a folder (copy)
    if path is None:
        return url
    try:
        whole = driver_class(normalize_url(url)[0]).database_at(path)
    except BackendError:
        return url
    if whole == path:
        return url
    query = urlsplit(url).query
    return f"{scheme}://{_quoted(whole)}" + (f"?{query}" if query else "")


def _not_a_server(path: str, cwd: str) -> None:
    """Refuse ``redis:/host:6379`` or ``postgresql:host/db`` (a server's scheme without its
    two slashes), which would be taken as a path, unless that path exists."""
    head, sep, rest = path.partition(":")
    if sep and head.lower() in SERVER_SCHEMES and not os.path.lexists(os.path.join(cwd, path)):
        fixed = f"{head}://{rest.lstrip('/')}"
        raise UsageError(f"{path} is not a URL: write {fixed} (two slashes after {head}:)")


def redis_secret(url: str, environ: dict[str, str] | None = None) -> str:
    """The URL for the driver: a password from ``?password_file=`` or the environment
    (``$ZARRFS_PASSWORD``, then ``$REDISCLI_AUTH``) is added to it when the URL has none of
    its own. Other URLs come back as they are."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in REDIS_SCHEMES:
        return url
    environ = os.environ if environ is None else environ
    query = parse_qsl(parts.query, keep_blank_values=True)
    files = [v for k, v in query if k == "password_file"]
    query = [(k, v) for k, v in query if k != "password_file"]
    password = None
    if parts.password is None and not any(k == "password" for k, _ in query):
        if files:
            try:
                with open(files[-1], encoding="utf-8") as fh:
                    password = fh.read().rstrip("\r\n")
            except (OSError, UnicodeError) as exc:
                raise MountFailure(f"cannot read the password file {files[-1]}: {reason(exc)}") from None
        else:
            password = next((environ[n] for n in PASSWORD_ENV if environ.get(n)), None)
    if password is not None:
        query.append(("password", password))
    return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def location(text: str) -> str:
    """A database URL or a folder as a command takes it: its paths made absolute (see
    :func:`resolve_url`), a Redis password added from where it may be given (see
    :func:`redis_secret`)."""
    return redis_secret(whole_database(resolve_url(text)))


def shown_url(url: str) -> str:
    """``url`` without credentials (a password in it or in its query, a password file's
    path): what logs, the mount table and ``zarrfs status`` show."""
    if _scheme(url) in _NO_SECRETS:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}@{host}" if name else host
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in SECRET_QUERY]
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def url_password(url: str) -> str | None:
    """The password as written in ``url`` itself (to hide it from the process's argv)."""
    if _scheme(url) in _NO_SECRETS:
        return None
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return None
    user = netloc.rpartition("@")[0]
    return user.partition(":")[2] or None


def reason(exc: BaseException) -> str:
    """The words of an error for a one-line message (an OSError's strerror, without its errno)."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def database_path(url: str) -> str | None:
    """The file or folder a file-based URL names (LMDB, SQLite, a bare path), else None."""
    scheme = _scheme(url)
    if scheme == "icechunk":  # repo@tag.v1 (ZEP 8's version names) is the repository repo
        from zarrfs.backends.versionpath import split_version

        return split_version(_file_path(url))[0]
    if scheme in FILE_SCHEMES:
        return _file_path(url)
    return None if scheme else url
