"""Failed commits on a real database, for tests of "stores everything, or nothing".

:func:`failing_commits` makes the next write transactions of a driver fail at their commit:
the transaction's function runs on the real database as usual, every put and delete lands in
the database's own transaction, and then, instead of committing, the transaction is rolled
back by the database and :class:`CommitFailed` is raised, as a commit refused by the database
(a full disk, a server gone) would be. On LMDB the failure is the data environment's commit,
after the side environment (the bookkeeping) committed: the path that puts the side records
back (``zarrfs.backends.lmdb.driver.LMDBTxn.finish``). Nothing is mocked: reads in the transaction, the
retries of :meth:`Driver.transact` and what the database holds afterwards are the real ones.

    with failing_commits(driver) as faults:
        with pytest.raises(CommitFailed):
            tree.rename("a", "b")
    assert faults.failed == 1
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from zarrfs.backends.base import Driver
from zarrfs.backends.errors import BackendError


class CommitFailed(BackendError):
    """The commit that :func:`failing_commits` made fail (EIO, as any database error)."""


class _LMDBDataCommitFails:
    """An LMDB transaction whose commit aborts it and fails, as a full disk's would."""

    def __init__(self, txn: Any) -> None:
        self._txn = txn

    def commit(self) -> None:
        import lmdb

        self._txn.abort()
        raise lmdb.Error("commit failed (zarrfs.testing.faults)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class _Failing:
    """A write transaction of ``driver`` whose commit fails."""

    def __init__(self, begun: Any, faults: Faults) -> None:
        self.begun, self.faults = begun, faults

    def __enter__(self) -> Any:
        self.txn = self.begun.__enter__()
        return self.txn

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> Any:
        if kind is not None:
            return self.begun.__exit__(kind, exc, tb)
        self.faults.failed += 1
        if type(self.txn).__name__ == "LMDBTxn":
            self.txn._data = _LMDBDataCommitFails(self.txn._data)
            self.begun.__exit__(None, None, None)  # side commits, data fails, side put back
            raise AssertionError("the LMDB data commit did not fail")  # pragma: no cover
        failure = CommitFailed(f"{self.faults.driver.url}: commit failed (zarrfs.testing.faults)")
        try:
            self.begun.__exit__(CommitFailed, failure, None)  # the database rolls back
        except CommitFailed:
            pass
        raise failure


class Faults:
    """How many commits are still to fail, and how many did."""

    def __init__(self, driver: Driver, count: int) -> None:
        self.driver, self.left, self.failed = driver, count, 0


@contextmanager
def failing_commits(driver: Driver, count: int = 1) -> Iterator[Faults]:
    """Within the block, the next ``count`` write transactions of ``driver`` fail at their
    commit (each run of a transaction counts: ``transact`` does not retry this failure)."""
    faults = Faults(driver, count)
    begin = driver._begin

    def failing_begin(write: bool) -> Any:
        begun = begin(write)
        if not write or faults.left <= 0:
            return begun
        faults.left -= 1
        return _Failing(begun, faults)

    driver._begin = failing_begin  # type: ignore[method-assign]
    try:
        yield faults
    finally:
        del driver._begin
