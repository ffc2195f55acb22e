"""What a database URL names, read from its driver's declaration (``About``): the file or
folder of a file database, the whole database a part of one names, and the URL as it may be
shown (logs, the mount table, ``zarrfs status``) without its secrets."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from .about import DEFAULT_SECRETS
from .errors import BackendError
from .registry import declared


def url_scheme(url: str) -> str:
    """The scheme of ``url`` in lower case; "" for a bare path."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and head and head[0].isalpha() and "/" not in head else ""


def file_path(url: str) -> str:
    """The path of a file database's URL as its driver reads it (relative to the working
    folder unless absolute; ``scheme:////abs`` is ``/abs`` too)."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def quoted(path: str) -> str:
    """``path`` for a URL, quoted only where a URL must be (``%``, ``?``, ``#``, and the tab
    and line breaks ``urlsplit`` drops): ``zarrfs status`` and the mount table show it as it
    is (a comma or a space, not ``%2C``)."""
    for char in "%?#\t\n\r":
        path = path.replace(char, f"%{ord(char):02X}")
    return path


def database_path(url: str) -> str | None:
    """The file or folder a file database's URL (or a bare path) names, else None."""
    scheme = url_scheme(url)
    if not scheme:
        return url
    about = declared(scheme)
    if about is None or about.files is None:
        return None
    return about.files.where(file_path(url))


def whole_database(url: str) -> str:
    """``url`` naming the whole database when it names a part of one (a file inside an LMDB
    folder names the folder: see ``DatabaseFiles.database_at``); other URLs, and bare paths (a
    folder to ``copy``; LMDB's driver finds its folder itself), as they are. A path the driver
    refuses is left for the driver to refuse when it opens it."""
    scheme = url_scheme(url)
    about = declared(scheme)
    if about is None or about.files is None:
        return url
    path = about.files.where(file_path(url))
    try:
        whole = about.files.database_at(path)
    except BackendError:
        return url
    if whole == path:
        return url
    query = urlsplit(url).query
    return f"{scheme}://{quoted(whole)}" + (f"?{query}" if query else "")


def _shown_as_is(url: str) -> bool:
    """Whether ``url`` carries no secret: a bare path, a file database's URL (its user part is
    a path's), a driver's that declares none."""
    scheme = url_scheme(url)
    if not scheme:
        return True
    about = declared(scheme)
    if about is None:  # an unknown scheme: the secrets of the defaults are hidden all the same
        return False
    return about.files is not None or not about.secrets


def shown_url(url: str) -> str:
    """``url`` without credentials (a password in it, the query options its driver declares
    secret, such as a password file's path): what logs, the mount table and ``zarrfs
    status`` show."""
    if _shown_as_is(url):
        return url
    about = declared(url_scheme(url))
    secrets = DEFAULT_SECRETS if about is None else about.secrets
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name = user.partition(":")[0]
        netloc = f"{name}@{host}" if name else host
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in secrets]
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def url_password(url: str) -> str | None:
    """The password as written in ``url`` itself (to hide it from the process's argv)."""
    if _shown_as_is(url):
        return None
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return None
    user = netloc.rpartition("@")[0]
    return user.partition(":")[2] or None


__all__ = [
    "database_path", "file_path", "quoted", "shown_url", "url_password", "url_scheme", "whole_database",
]
