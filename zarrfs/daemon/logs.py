"""Where the daemon logs, and rate-limited lines.

A background daemon logs to ``--log-file``, else syslog, else a file named after its
mountpoint (:func:`default_log_file`); SIGHUP reopens the file (:func:`reopen_logs`).

Rate-limited lines: a burst of the same failure (every request of a mount while its
database is down) becomes a few lines and a count, not hundreds of lines.

A line's kind is its logger, level and format string (``record.msg`` before the arguments are
put in), so "lookup /a: EIO (...)" and "lookup /b: EIO (...)" are one kind. Within each
``window`` seconds the first ``burst`` lines of a kind pass; the rest are counted, and the next
line of that kind after the window (or :meth:`RepeatFilter.flush`, at unmount) is preceded by
one line saying how many were left out, quoting the last of them.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import threading
import time

from zarrfs.lines import one_line

log = logging.getLogger("zarrfs")


class OneLineFormatter(logging.Formatter):
    """A line's message with its control characters escaped (:func:`one_line`): names from
    the database or the kernel may hold newlines. A traceback (debugging) keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


#: The filter of the handler set up by :func:`setup_logging` (flushed at unmount).
repeats: RepeatFilter | None = None


class _Kind:
    __slots__ = ("start", "passed", "dropped", "last", "level", "name")

    def __init__(self, start: float, level: int, name: str) -> None:
        self.start = start
        self.passed = 0
        self.dropped = 0
        self.last = ""
        self.level = level
        self.name = name


class RepeatFilter(logging.Filter):
    """Let ``burst`` lines of a kind through per ``window`` seconds and count the others; see
    the module docstring. Attach it to a handler (``handler.addFilter``)."""

    def __init__(self, burst: int = 5, window: float = 10.0, clock=time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.clock = clock
        self._kinds: dict[tuple, _Kind] = {}
        self._lock = threading.Lock()
        self._handler: logging.Handler | None = None

    def attach(self, handler: logging.Handler) -> None:
        """Filter ``handler``'s lines, and write the "left out" lines through it."""
        self._handler = handler
        handler.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is written now (the first of its kind in a window, or within the
        burst); a dropped record only counts."""
        if record.levelno < logging.WARNING or isinstance(record, _Summary):
            return True  # debugging output is asked for: keep all of it
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        summaries = []
        with self._lock:
            kind = self._kinds.get(key)
            if kind is not None and now - kind.start >= self.window:
                summaries.append(self._summary(kind, now))
                kind = None
            if kind is None:
                if len(self._kinds) >= 1024:  # many distinct kinds: forget the idle ones
                    summaries += self._expire(now)
                kind = self._kinds[key] = _Kind(now, record.levelno, record.name)
            if kind.passed < self.burst:
                kind.passed += 1
                passed = True
            else:
                kind.dropped += 1
                kind.last = record.getMessage()
                passed = False
        self._emit(summaries)
        return passed

    def flush(self) -> None:
        """Write the "left out" line of every kind that has dropped lines (at unmount)."""
        now = self.clock()
        with self._lock:
            summaries = [self._summary(kind, now) for kind in self._kinds.values()]
            self._kinds.clear()
        self._emit(summaries)

    def _expire(self, now: float) -> list:
        out = []
        for key, kind in list(self._kinds.items()):
            if now - kind.start >= self.window:
                out.append(self._summary(kind, now))
                del self._kinds[key]
        return out

    @staticmethod
    def _summary(kind: _Kind, now: float) -> _Summary | None:
        if not kind.dropped:
            return None
        seconds = max(1, round(now - kind.start))
        text = f"... {kind.dropped} more like this in the last {seconds} s, the last: {kind.last}"
        return _Summary(kind.name, kind.level, __file__, 0, text, None, None)

    def _emit(self, summaries: list) -> None:
        if self._handler is None:
            return
        for record in summaries:
            if record is not None:
                self._handler.handle(record)


class _Summary(logging.LogRecord):
    """The "left out" line of a kind, which :class:`RepeatFilter` always lets through."""



def escape_path(path: str) -> str:
    """A file name for ``path``, as ``systemd-escape --path`` makes it (``/mnt/a-b`` ->
    ``mnt-a\\x2db``; ``/`` -> ``-``)."""
    trimmed = os.path.normpath(path).strip("/")
    if not trimmed:
        return "-"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isalnum() and ch.isascii() or ch in "_:" or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def state_folder() -> str:
    """Where a background daemon keeps its log when there is no syslog: ``/var/log/zarrfs``
    for root, ``$XDG_STATE_HOME/zarrfs`` (``~/.local/state/zarrfs``) for a user."""
    if os.geteuid() == 0:
        return "/var/log/zarrfs"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "zarrfs")


def default_log_file(mountpoint: str) -> str:
    """The log file of a background mount without syslog."""
    return os.path.join(state_folder(), escape_path(mountpoint) + ".log")


class ReopenableFileHandler(logging.FileHandler):
    """A log file that is opened again, by name, before the first line after SIGHUP (so
    logrotate can move it away)."""

    reopen = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.reopen:
            self.reopen = False
            if self.stream is not None:
                stream, self.stream = self.stream, None
                stream.close()
        super().emit(record)


def reopen_logs() -> None:
    """SIGHUP: reopen the log file before the next line; say so in the new file."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ReopenableFileHandler):
            handler.reopen = True
            log.info("log file reopened (SIGHUP)")


def _syslog() -> logging.Handler | None:
    if not os.path.exists("/dev/log"):
        return None
    try:
        return logging.handlers.SysLogHandler(address="/dev/log")
    except OSError:  # a socket nobody listens on
        return None


def setup_logging(level: str, log_file: str | None, foreground: bool, mountpoint: str | None = None) -> str:
    """Log to ``log_file``, else stderr in the foreground, else syslog, else the default log
    file of ``mountpoint`` (:func:`default_log_file`). Returns where the log goes."""
    handler: logging.Handler | None = None
    where = ""
    if not log_file and not foreground:
        handler = _syslog()
        where = "syslog"
        if handler is None and mountpoint is not None:
            log_file = default_log_file(mountpoint)
            try:
                os.makedirs(os.path.dirname(log_file), mode=0o700, exist_ok=True)
            except OSError:
                log_file = None
    if handler is None and log_file:
        try:
            handler, where = ReopenableFileHandler(log_file), log_file
        except OSError:
            handler = None
    if handler is None:
        handler = logging.StreamHandler(sys.stderr) if foreground else logging.NullHandler()
        where = "stderr" if foreground else ""
    handler.setFormatter(OneLineFormatter("%(asctime)s zarrfs[%(process)d] %(levelname)s %(message)s"))
    global repeats
    repeats = None
    if getattr(logging, level.upper(), logging.INFO) > logging.DEBUG:
        # At debug level every line is asked for; otherwise a burst becomes a count.
        repeats = RepeatFilter()
        repeats.attach(handler)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return where
