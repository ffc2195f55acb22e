"""The Redis Cluster driver (``redis+cluster://``): :class:`~.driver.RedisClusterDriver` in
``driver``, declared in ``about``: the Redis driver with one hash tag per hierarchy; ``feed``
follows the slot's master.
"""
