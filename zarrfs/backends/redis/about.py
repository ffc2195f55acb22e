"""The Redis driver's declaration (``redis://``, ``rediss://``, ``unix://``, ``valkey://``,
``valkeys://``): :data:`ABOUT`. A password the URL lacks is read by the command line from
``?password_file=`` or the environment, as ``redis-cli`` reads ``REDISCLI_AUTH``."""

from __future__ import annotations

from ..about import About
from .url import OWN_OPTIONS, REDIS_PY_OPTIONS

#: Where a password may come from besides the URL and ``?password_file=``, in this order.
PASSWORD_ENV = ("ZARRFS_PASSWORD", "REDISCLI_AUTH")
#: The query options that carry a secret: the password, its file's path, TLS's key password.
SECRETS = ("password", "password_file", "ssl_password")

ABOUT = About(
    driver="zarrfs.backends.redis.driver:RedisDriver",
    schemes=("redis", "rediss", "unix", "valkey", "valkeys"),
    kind="a Redis database",
    options=OWN_OPTIONS + tuple(sorted(REDIS_PY_OPTIONS)),
    secrets=SECRETS,
    password_env=PASSWORD_ENV,
)
