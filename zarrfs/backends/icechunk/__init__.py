"""Icechunk repositories as folders: ``icechunk:///path/repo?branch=main``
(:class:`~.driver.IcechunkDriver` in ``driver``, declared in ``about``)."""
