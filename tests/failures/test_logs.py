"""Rate-limited log lines (zarrfs.daemon.logs.RepeatFilter) on a real logging handler."""

from __future__ import annotations

import io
import logging

from zarrfs.daemon.logs import RepeatFilter


def _logger(burst=3, window=10.0):
    now = [0.0]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    filt = RepeatFilter(burst=burst, window=window, clock=lambda: now[0])
    filt.attach(handler)
    log = logging.getLogger(f"test.logs.{id(filt)}")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    return log, filt, stream, now


def test_a_burst_becomes_a_few_lines_and_a_count():
    log, filt, stream, now = _logger()
    for i in range(288):
        now[0] = i * 0.01
        log.error("lookup %s: EIO (%s)", f"/a/{i}", "connection refused")
    log.warning("something else")
    now[0] = 11.0
    log.error("lookup %s: EIO (%s)", "/back", "connection refused")
    lines = stream.getvalue().splitlines()
    assert lines[:3] == [f"ERROR lookup /a/{i}: EIO (connection refused)" for i in range(3)]
    assert lines[3] == "WARNING something else"
    assert lines[4].startswith("ERROR ... 285 more like this in the last 11 s, the last: lookup /a/287")
    assert lines[5] == "ERROR lookup /back: EIO (connection refused)"
    assert len(lines) == 6


def test_flush_reports_what_was_left_out_and_debug_is_never_limited():
    log, filt, stream, now = _logger(burst=1)
    for _ in range(5):
        log.debug("detail")
        log.error("same %d", 1)
    filt.flush()
    lines = stream.getvalue().splitlines()
    assert lines.count("DEBUG detail") == 5
    assert lines.count("ERROR same 1") == 1
    assert lines[-1].startswith("ERROR ... 4 more like this")
