"""The in-process driver for tests (``memory://``): :class:`~.driver.MemoryDriver` in
``driver``, declared in ``about``."""
