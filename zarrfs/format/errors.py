"""Problems found in Zarr keys and documents, and the exceptions that carry them.

A :class:`Problem` is one finding (a rule broken by one key). Validators return lists of them
so that a checker can report everything at once; the filesystem refuses a commit when any of
them has severity ``"error"`` by raising :class:`FormatError`, which it maps to ``EINVAL``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

ERROR = "error"
WARNING = "warning"


class Problem(NamedTuple):
    """One rule broken by one key.

    ``rule`` is a short stable identifier (``"zarray.shape-chunks-length"``) meant for log lines
    and tests; ``value`` says what was wrong in words a user can act on; ``severity`` is
    ``"error"`` (the write must be refused) or ``"warning"`` (worth logging, still accepted).
    """

    key: str
    rule: str
    value: str
    severity: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.key}: {self.rule}: {self.value}"

    @property
    def is_error(self) -> bool:
        """True when this problem must make the write fail."""
        return self.severity == ERROR


def error(key: str, rule: str, value: str) -> Problem:
    """Build a :class:`Problem` of severity ``"error"``."""
    return Problem(key, rule, value, ERROR)


def warning(key: str, rule: str, value: str) -> Problem:
    """Build a :class:`Problem` of severity ``"warning"``."""
    return Problem(key, rule, value, WARNING)


def errors_only(problems: Iterable[Problem]) -> list[Problem]:
    """Return the problems of severity ``"error"``, in order."""
    return [p for p in problems if p.severity == ERROR]


class FormatError(Exception):
    """A key or value breaks a Zarr rule; the filesystem answers ``EINVAL``.

    The first offending :class:`Problem` is kept in :attr:`problem`; all of them (errors and
    warnings, as the validator returned them) in :attr:`problems`.
    """

    def __init__(self, problem: Problem, problems: Iterable[Problem] | None = None):
        super().__init__(f"{problem.key}: {problem.rule}: {problem.value}")
        self.problem = problem
        self.problems = list(problems) if problems is not None else [problem]


class ChunkSizeError(FormatError):
    """Raw chunk bytes of the wrong length were handed to an encoder."""


class UnsupportedArray(FormatError):
    """An array whose chunks this layer cannot decode or encode (object dtype, sharding...).

    The metadata may be perfectly valid; only the decoded view is unavailable.
    """


class Report:
    """Collects the problems of one key; validators call :meth:`error` and :meth:`warn`.

    ``prefix`` starts every rule id (``"zarray"`` turns ``"shape"`` into ``"zarray.shape"``), so
    the same checking code can serve a document on its own and an entry of ``.zmetadata``.
    """

    def __init__(self, key: str, prefix: str, problems: list[Problem] | None = None):
        self.key = key
        self.prefix = prefix
        self.problems: list[Problem] = problems if problems is not None else []

    def error(self, rule: str, value: str) -> None:
        """Record an error under ``<prefix>.<rule>``."""
        self.problems.append(Problem(self.key, f"{self.prefix}.{rule}", value, ERROR))

    def warn(self, rule: str, value: str) -> None:
        """Record a warning under ``<prefix>.<rule>``."""
        self.problems.append(Problem(self.key, f"{self.prefix}.{rule}", value, WARNING))

    def add(self, severity: str, rule: str, value: str) -> None:
        """Record a problem of the given severity under ``<prefix>.<rule>``."""
        self.problems.append(Problem(self.key, f"{self.prefix}.{rule}", value, severity))

    def child(self, prefix: str) -> Report:
        """A report for a nested document that appends to the same list of problems."""
        return Report(self.key, prefix, self.problems)

    @property
    def has_errors(self) -> bool:
        """True once any error was recorded."""
        return any(p.severity == ERROR for p in self.problems)


def raise_on_error(problems: Iterable[Problem]) -> None:
    """Raise :class:`FormatError` for the first error among ``problems``; warnings pass."""
    problems = list(problems)
    for p in problems:
        if p.severity == ERROR:
            raise FormatError(p, problems)
