"""Where the format layer plugs into the tree: :class:`Hooks`, called inside the tree's
transactions to refuse names and values, transform what is stored and shown, and keep other
keys (consolidated metadata) in step. The base class accepts everything as is."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from zarrfs.backends.base import Txn


class Hooks:
    """Where the format layer plugs into the tree. This base class accepts everything as is."""

    #: Whether files show other bytes than the stored ones (a decoded view): then no file is
    #: stored in parts, and sizes and reads go through :meth:`shown_size`, :meth:`shown_value`.
    transforms = False

    def whole(self, key: str) -> bool:
        """Whether the value at ``key`` must be stored whole, never in parts (a document the
        hooks read back, such as Zarr metadata), however large."""
        return False

    def check_name(self, txn: Txn, key: str, kind: int) -> None:
        """Refuse (raise) a new file or folder name; called by create, mkdir, rename, link."""

    def store(self, txn: Txn, key: str, value: Any) -> Any:
        """Validate (and possibly transform) bytes written through a file before they are stored;
        return what to store. Raise to refuse: nothing is stored."""
        return value

    def arrive(self, txn: Txn, key: str, value: bytes, source: str) -> bytes:
        """Validate a stored value arriving at ``key`` from ``source`` by rename or link, and
        return what to store there (``source`` is empty when the file moves with its folder).
        Raise to refuse."""
        return value

    def reads(self, key: str) -> list[str]:
        """Data keys :meth:`check_name` and :meth:`store` will read for a new file at ``key``.
        On a remote database the tree fetches them together with its own first reads, so the
        commit of a new file costs one round trip of reads."""
        return []

    def changed(self, txn: Txn, key: str, value: Any) -> None:
        """Called, in the same transaction, after data key ``key`` was set to ``value`` (bytes
        or a buffer) or deleted (``None``)."""

    def elsewhere(self, keys: Collection[str] | None) -> None:
        """Another writer changed data keys ``keys`` (None: not known which), as the change
        feed tells, outside any transaction of this mount's."""

    def shown_size(self, txn: Txn, key: str, size: int) -> int:
        """The size a file shows (a decoded view shows the decoded size)."""
        return size

    def shown_value(self, txn: Txn, key: str, value: bytes) -> bytes:
        """The bytes a file shows when read."""
        return value
