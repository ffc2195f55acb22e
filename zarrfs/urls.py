"""Database URLs as the command line takes them: paths made absolute against the caller's
folder and a password gathered from where its driver says it may be given (see each driver's
``about``); what a URL names and how it is shown are the drivers' (``zarrfs.backends.urls``)."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit

from zarrfs.backends.registry import declared, files_of
from zarrfs.backends.urls import file_path, quoted, url_scheme, whole_database
from zarrfs.usage import UsageError


class MountFailure(Exception):
    """A mount that cannot be made as asked (missing database or mountpoint, busy mountpoint):
    reported as one line, exit status 1."""


def _file_scheme(scheme: str) -> bool:
    """Whether ``scheme``'s URLs name a local file or folder (its driver declares ``files``)."""
    return files_of(scheme) is not None


def _one_slash(url: str) -> str:
    """``lmdb:/abs/path`` (one slash, as RFC 8089 spells a local file) as ``lmdb:///abs/path``;
    other URLs as they are."""
    head, sep, rest = url.partition(":")
    if sep and _file_scheme(head) and not rest.startswith("//"):
        return f"{head}://{rest}"
    return url


def resolve_url(url: str, cwd: str | None = None) -> str:
    """``url`` with the database path (a file database's, a bare path) and the query options
    its driver declares paths (``password_file``) made absolute against ``cwd`` (default: the
    working folder), so that a daemon running in ``/`` opens what the caller named.
    ``lmdb:/abs/path`` (one slash) is ``lmdb:///abs/path``; ``lmdb://rel/path`` and
    ``lmdb:rel/path`` are relative to ``cwd``."""
    cwd = cwd or os.getcwd()
    url = _one_slash(url)
    scheme = url_scheme(url)
    if not scheme:
        _not_a_server(url, cwd)
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(url)))
    parts = urlsplit(url)
    if _file_scheme(scheme):
        path = file_path(url)
        if not path:
            raise UsageError(f"{url} names no database path")
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
        return f"{parts.scheme}://{quoted(path)}" + (f"?{parts.query}" if parts.query else "")
    about = declared(scheme)
    paths = ("password_file",) if about is None else about.path_options
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k in paths for k, _ in query):
        query = [(k, os.path.join(cwd, os.path.expanduser(v)) if k in paths else v) for k, v in query]
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}"
    return url


def _not_a_server(path: str, cwd: str) -> None:
    """Refuse ``redis:/host:6379`` or ``postgresql:host/db`` (a server's scheme without its
    two slashes), which would be taken as a path, unless that path exists."""
    head, sep, rest = path.partition(":")
    server = sep and (about := declared(head)) is not None and about.files is None
    if server and not os.path.lexists(os.path.join(cwd, path)):
        fixed = f"{head}://{rest.lstrip('/')}"
        raise UsageError(f"{path} is not a URL: write {fixed} (two slashes after {head}:)")


def with_password(url: str, environ: dict[str, str] | None = None) -> str:
    """The URL for the driver: for a driver that declares ``password_env`` (Redis), a password
    from ``?password_file=`` or the first of those environment variables set is added to it
    when the URL has none of its own. Other URLs come back as they are."""
    about = declared(url_scheme(url))
    if about is None or not about.password_env:
        return url
    parts = urlsplit(url)
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
            password = next((environ[n] for n in about.password_env if environ.get(n)), None)
    if password is not None:
        query.append(("password", password))
    return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


def location(text: str) -> str:
    """A database URL or a folder as a command takes it: its paths made absolute (see
    :func:`resolve_url`), a password added from where it may be given (see
    :func:`with_password`)."""
    return with_password(whole_database(resolve_url(text)))


def reason(exc: BaseException) -> str:
    """The words of an error for a one-line message (an OSError's strerror, without its errno)."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
