"""The DBM driver (``dbm://``, the files of zarr-python 2's ``DBMStore``):
:class:`~.driver.DBMDriver` in ``driver``, declared in ``about``."""
