"""One fsspec filesystem class per URL scheme (fsspec makes an instance from the scheme's class
with no other word of which scheme it was), each registered by entry point in ``fsspec.specs``."""

from __future__ import annotations

from typing import Any

from .filesystem import DatabaseFileSystem


class LMDBFileSystem(DatabaseFileSystem):
    protocol = "lmdb"


class SQLiteFileSystem(DatabaseFileSystem):
    protocol = "sqlite"


class DBMFileSystem(DatabaseFileSystem):
    protocol = "dbm"


class ZipFileSystem(DatabaseFileSystem):
    """``zip:///abs/path/data.zip/key`` (the archive's absolute path: a relative one is
    relative to the working folder). fsspec's own chained form, ``zip://inner::file:///x.zip``
    (an ``fo`` argument), stays fsspec's ``ZipFileSystem``: this class replaces it in fsspec's
    registry and hands such calls to it."""

    protocol = "zip"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or "fo" in kwargs:
            from fsspec.implementations.zip import ZipFileSystem as Archive

            return Archive(*args, **kwargs)
        return super().__new__(cls)


class IcechunkFileSystem(DatabaseFileSystem):
    protocol = "icechunk"


class RedisFileSystem(DatabaseFileSystem):
    protocol = "redis"


class RedissFileSystem(DatabaseFileSystem):
    protocol = "rediss"


class UnixRedisFileSystem(DatabaseFileSystem):
    protocol = "unix"


class ValkeyFileSystem(DatabaseFileSystem):
    protocol = "valkey"


class ValkeysFileSystem(DatabaseFileSystem):
    protocol = "valkeys"


class RedisClusterFileSystem(DatabaseFileSystem):
    protocol = "redis+cluster"


class RedissClusterFileSystem(DatabaseFileSystem):
    protocol = "rediss+cluster"


class ValkeyClusterFileSystem(DatabaseFileSystem):
    protocol = "valkey+cluster"


class ValkeysClusterFileSystem(DatabaseFileSystem):
    protocol = "valkeys+cluster"


class PostgresqlFileSystem(DatabaseFileSystem):
    protocol = "postgresql"


class PostgresFileSystem(DatabaseFileSystem):
    protocol = "postgres"


#: scheme -> class, as the entry points name them.
BY_SCHEME = {cls.protocol: cls for cls in DatabaseFileSystem.__subclasses__()}
