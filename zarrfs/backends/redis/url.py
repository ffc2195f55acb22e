"""What a Redis URL names, for both Redis drivers (``redis`` and ``redis_cluster``): the
server or the cluster's starting nodes, the credentials, the ``prefix`` option and the other
query options; and the names of the keys a prefix gives (:class:`KeyNames`)."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..base import DATA, SIDE, BackendError, Space

#: The prefix of the keys when the URL gives none (zarr-python 2's ``RedisStore`` default).
DEFAULT_PREFIX = "zarr"


class RedisURL(NamedTuple):
    """A Redis URL taken apart (see :func:`parse_url`)."""

    scheme: str
    userinfo: str  # "user:password", or "" (still quoted as in the URL)
    hosts: str  # the netloc without the credentials: "host:port", "h1:p1,h2:p2", or ""
    netloc: str  # as in the URL, credentials included
    path: str
    query: list[tuple[str, str]]  # the query options but ``prefix``, in their order
    prefix: str  # the last ``prefix`` option, else :data:`DEFAULT_PREFIX`

    def client_url(self) -> str:
        """The URL for redis-py: ``valkey``/``valkeys`` spelled ``redis``/``rediss``, without
        the ``prefix`` option. Not ``urlunsplit``: it drops the ``//`` of ``unix:///path``
        (empty netloc), which redis-py needs."""
        scheme = {"valkey": "redis", "valkeys": "rediss"}.get(self.scheme.lower(), self.scheme)
        rest = urlencode(self.query)
        return f"{scheme}://{self.netloc}{self.path}" + (f"?{rest}" if rest else "")

    def where(self, prefix: str) -> str:
        """How errors and logs name the database: the URL without credentials, and the prefix."""
        return f"{self.scheme}://{self.hosts}{self.path} prefix={prefix}"


def parse_url(url: str) -> RedisURL:
    """Take a ``redis://``, ``unix://``, ``valkey://`` or ``…+cluster://`` URL apart."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [v for k, v in query if k == "prefix"]
    userinfo, _, hosts = parts.netloc.rpartition("@")
    return RedisURL(
        scheme=parts.scheme,
        userinfo=userinfo,
        hosts=hosts,
        netloc=parts.netloc,
        path=parts.path,
        query=[(k, v) for k, v in query if k != "prefix"],
        prefix=prefixes[-1] if prefixes else DEFAULT_PREFIX,
    )


#: What every Redis URL takes: its key prefix and credentials.
OWN_OPTIONS = ("prefix", "username", "password", "password_file")
#: The redis-py options a ``redis://`` URL hands on: the database number (of a ``unix://``
#: URL), the connection's name, and TLS's settings. The rest of redis-py's keyword
#: arguments are its internals, or set by zarrfs (``-o timeout=`` bounds every wait).
#: TLS's settings (``rediss://``): the authority's certificates, the client's own, checks.
TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_cert_reqs",
     "ssl_check_hostname", "ssl_min_version"}
)
REDIS_PY_OPTIONS = frozenset({"db", "client_name"}) | TLS_OPTIONS


def check_db(url: RedisURL, cluster: bool = False) -> None:
    """Refuse a database number that is not one (``redis://host/abc``: redis-py takes it for
    database 0), and any on a cluster, which has database 0 only."""
    if url.scheme.lower() == "unix":
        return
    number = url.path.strip("/")
    if cluster and number not in ("", "0"):
        raise BackendError(f"{url.where(url.prefix)}: a Redis Cluster has database 0 only: drop /{number}")
    if number and not (number.isascii() and number.isdigit()):
        raise BackendError(
            f"{url.where(url.prefix)}: /{number} is not a database number (redis://host:port/N, N from 0)"
        )


def check_query(url: RedisURL, known: set[str] | frozenset[str]) -> None:
    """Refuse the query options of ``url`` that are not in ``known`` nor :data:`OWN_OPTIONS`,
    as the file drivers do: a typo must not be ignored, nor reach redis-py as a keyword argument."""
    import difflib

    names = set(known) | set(OWN_OPTIONS)
    unknown = sorted({k for k, _ in url.query} - names)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(names), n=1, cutoff=0.6)
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise BackendError(
            f"{url.where(url.prefix)}: unknown option(s) {', '.join(unknown)}{guess}; known: "
            f"{', '.join(sorted(names))}"
        )
    tls = [k for k, _ in url.query if k in TLS_OPTIONS]
    if tls and not is_tls(url.scheme):
        plain, _, rest = url.scheme.partition("+")
        secure = ("valkeys" if plain.lower() == "valkey" else "rediss") + (f"+{rest}" if rest else "")
        raise BackendError(f"{url.where(url.prefix)}: {tls[0]} is a TLS setting: use {secure}://")


def is_tls(scheme: str) -> bool:
    """Whether a Redis URL's scheme connects over TLS (``rediss``, ``valkeys``, their ``+cluster``)."""
    return scheme.lower().partition("+")[0] in ("rediss", "valkeys")


class KeyNames:
    """The names of a hierarchy's keys, given its prefix: data keys ``{prefix}:{key}``, side keys
    ``zarrfs.side.{prefix}:{key}``, the indexes ``zarrfs.index.{prefix}`` and
    ``zarrfs.sideindex.{prefix}``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        p = prefix.encode("utf-8")
        #: What every data key starts with (zarr-python 2's ``RedisStore`` layout).
        self.data_prefix = p + b":"
        #: What every side key starts with.
        self.side_prefix = b"zarrfs.side." + p + b":"
        #: The listing index (a sorted set) of each space.
        self.index = {DATA: b"zarrfs.index." + p, SIDE: b"zarrfs.sideindex." + p}
        #: The indexes, as a set (what a read transaction never watches).
        self.indexes = frozenset(self.index.values())
        #: The channel ``zarrfs reindex`` tells the mounts' change feeds on that it changed the
        #: index (an index write is no data key's: no invalidation says so).
        self.reindexed = b"zarrfs.reindexed." + p
        #: Written by a commit's checks that failed, to stop its EXEC (``commit.CHECK``).
        self.guard = b"zarrfs.guard." + p
        self._prefixes = {DATA: self.data_prefix, SIDE: self.side_prefix}

    def name(self, space: Space, raw: bytes) -> bytes:
        """The Redis key that holds ``raw`` in ``space``."""
        return self._prefixes[space] + raw
