"""The queue rules of ``fuse.admission`` with several request threads, request by request: a
reader waits for a release read before it (which a program's next open must not overtake), not
for a request that was read before it and is still on its way to asking for its turn."""

from __future__ import annotations

import threading
import time

import pytest

from zarrfs.fuse import admission as admission_module
from zarrfs.fuse.admission import Admission

WAIT = 30  # seconds: a condition waited for, not a bound on speed


@pytest.fixture
def long_gap(monkeypatch):
    """A request missing from the queue is waited for far longer than any test runs."""
    monkeypatch.setattr(admission_module, "GAP_WAIT", 600)


def _reader(adm: Admission, key, node: int, order: int, events: list) -> threading.Thread:
    def run() -> None:
        adm.enter_reader(key, node, order)
        events.append(("reader", order))
        adm.leave_reader(key)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.usefixtures("long_gap")
def test_a_reader_does_not_wait_for_a_request_read_before_it_that_has_not_asked():
    adm = Admission()
    for unique in (10, 12, 14):
        adm.arrived(unique, unanswered=False)
    events: list = []
    _reader(adm, "b", 2, 14, events).join(WAIT)
    assert events == [("reader", 14)]


@pytest.mark.usefixtures("long_gap")
def test_a_reader_waits_for_a_release_read_before_it_to_ask_and_run():
    adm = Admission()
    adm.arrived(10, unanswered=False)
    adm.arrived(12, unanswered=True)  # a close's release: its program does not wait for it
    adm.arrived(14, unanswered=False)  # that program's next open
    events: list = []
    t = _reader(adm, "f", 5, 14, events)
    t.join(0.3)
    assert events == [], "the open ran before the release that came before it"
    adm.enter_writer(12)  # the release asks for its turn (a writer): it runs first
    events.append(("release", 12))
    adm.leave_writer()
    t.join(WAIT)
    assert events == [("release", 12), ("reader", 14)]


@pytest.mark.usefixtures("long_gap")
def test_a_reader_waits_for_a_request_not_read_yet():
    adm = Admission()
    adm.arrived(10, unanswered=False)
    adm.arrived(14, unanswered=False)  # 12 is still in the kernel's queue, or being read
    events: list = []
    t = _reader(adm, "b", 2, 14, events)
    t.join(0.3)
    assert events == []
    adm.arrived(12, unanswered=False)
    adm.enter_reader("a", 1, 12)
    events.append(("reader", 12))
    adm.leave_reader("a")
    t.join(WAIT)
    assert events == [("reader", 12), ("reader", 14)]


@pytest.mark.usefixtures("long_gap")
def test_a_release_that_ends_without_asking_lets_the_readers_after_it_go():
    adm = Admission()
    adm.arrived(10, unanswered=False)
    adm.arrived(12, unanswered=True)
    adm.arrived(14, unanswered=False)
    events: list = []
    t = _reader(adm, "f", 5, 14, events)
    t.join(0.3)
    assert events == []
    adm.settled(12)  # its thread ended it (say, the mount is going) before it asked
    t.join(WAIT)
    assert events == [("reader", 14)]


@pytest.mark.usefixtures("long_gap")
def test_readers_of_one_node_start_in_the_kernels_order():
    """A reader's release read before the next open, both waiting while another reader of
    that node runs: the release starts first, or the open finds the closed descriptor's
    version still read and shows the file as that one (seen through two mounts on Redis)."""
    adm = Admission()
    for unique in (10, 12, 14):
        adm.arrived(unique, unanswered=unique == 12)
    adm.enter_reader(5, 5, 10)  # a read of the node runs: it waits on its server, below
    events: list = []
    with adm.released():
        release = _reader(adm, 5, 5, 12, events)
        opening = _reader(adm, 5, 5, 14, events)
        for _ in range(500):  # both asked for their turn and wait
            with adm.turn:
                if len(adm._readers_waiting) == 2:
                    break
            release.join(0.01)
    assert sorted(adm._readers_waiting) == [12, 14]
    adm.leave_reader(5)
    release.join(WAIT)
    opening.join(WAIT)
    assert events == [("reader", 12), ("reader", 14)]


def test_a_writer_leaving_wakes_only_the_writer_whose_turn_came():
    """Eight writers queued behind a running one, each taken in turn: each thread waits once.
    A change woke every waiting thread, which found its turn not come and waited again (36
    waits here; with 16 writers on a server, 20 wake-ups a file of five requests)."""
    adm = Admission()
    main = threading.get_ident()
    waits: list[int] = []
    adm.before_wait = lambda: waits.append(threading.get_ident())
    ran: list[int] = []
    threads: list[threading.Thread] = []

    def queued() -> int:
        return sum(1 for w in waits if w != main)

    adm.enter_writer(10)
    with adm.released():  # the writer waits on its server: the others queue meanwhile
        for unique in range(12, 28, 2):

            def run(u: int = unique) -> None:
                adm.enter_writer(u)
                ran.append(u)
                adm.leave_writer()

            threads.append(threading.Thread(target=run, daemon=True))
            threads[-1].start()
            deadline = time.monotonic() + WAIT
            while queued() < len(threads) and time.monotonic() < deadline:  # it waits for its turn
                time.sleep(0.001)
    assert queued() == 8 and not ran
    adm.leave_writer()
    for t in threads:
        t.join(WAIT)
    assert ran == list(range(12, 28, 2))
    assert queued() == 8, f"{queued()} waits for 8 writers"
