"""The Redis Cluster driver's declaration (``redis+cluster://``, ``rediss+cluster://``,
``valkey+cluster://``, ``valkeys+cluster://``): :data:`ABOUT`; its password comes as Redis's."""

from __future__ import annotations

from ..about import About
from ..redis.about import PASSWORD_ENV, SECRETS
from ..redis.url import OWN_OPTIONS, TLS_OPTIONS

ABOUT = About(
    driver="zarrfs.backends.redis_cluster.driver:RedisClusterDriver",
    schemes=tuple(f"{s}+cluster" for s in ("redis", "rediss", "valkey", "valkeys")),
    kind="a Redis Cluster database",
    options=(*OWN_OPTIONS, "spread", "spread_above", *sorted(TLS_OPTIONS)),
    secrets=SECRETS,
    password_env=PASSWORD_ENV,
)
