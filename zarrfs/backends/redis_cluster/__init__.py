"""The Redis Cluster driver (``redis+cluster://``): :class:`RedisClusterDriver` in ``driver``, the
Redis driver with one hash tag per hierarchy; ``feed`` follows the slot's master.
"""

from .driver import RedisClusterDriver, RedisClusterTxn

__all__ = ["RedisClusterDriver", "RedisClusterTxn"]
