"""Database drivers for zarrfs, installed as ``zarrfs.backends``.

``open_driver(url)`` picks a driver by the URL's scheme; see ``registry`` (which reads each
driver package's declaration, ``about``) and ``base`` (the contract).
"""

from .base import DATA, KEYS, SIDE, SIZES, VALUES, Driver, Fetch, Get, HasPrefix, Size, Space, Txn
from .registry import open_driver, register

__all__ = [
    "DATA",
    "SIDE",
    "KEYS",
    "SIZES",
    "VALUES",
    "Driver",
    "Fetch",
    "Get",
    "HasPrefix",
    "Size",
    "Space",
    "Txn",
    "open_driver",
    "register",
]
