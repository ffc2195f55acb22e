"""What a PostgreSQL write transaction may take without reading (``postgres.guesses``): the
table alone, without a server. Against a server (the check, a wrong guess, the feed):
``test_backends.py::TestPostgres``."""

from __future__ import annotations

from zarrfs.backends.base import DATA, SIDE, Get, GuessedWrongError, HasPrefix, Size
from zarrfs.backends.guesses import NAMES
from zarrfs.backends.postgres.guesses import MISS, PostgresGuesses, Taken


def test_a_name_never_seen_is_absent_and_a_folder_never_read_empty():
    g, t = PostgresGuesses(), Taken()
    plan = [(Get, b"a/0", DATA), (Size, b"a/1", SIDE), (HasPrefix, b"a/", DATA)]
    assert t.answer(g, plan) == [None, None, False]
    assert t.names == {(DATA, b"a/0"): None, (SIDE, b"a/1"): None} and t.prefixes == {(DATA, b"a/"): False}
    assert t.unchecked


def test_a_batch_with_one_answer_not_known_takes_none():
    g, t = PostgresGuesses(), Taken()
    g.keep((DATA, b"m"), MISS)
    g.keep((DATA, b"big"), 9999)  # a length alone answers a size, not a value
    assert t.answer(g, [(Get, b"a", DATA), (Get, b"m", DATA)]) is None
    assert t.answer(g, [(Get, b"a", DATA), (Get, b"big", DATA)]) is None
    assert t.answer(g, [(Get, b"a", DATA), (HasPrefix, b"a", DATA)]) is None  # not a folder's prefix
    assert not t and not t.unchecked
    assert t.answer(g, [(Size, b"big", DATA)]) == [9999]


def test_a_folder_the_transaction_wrote_below_is_read():
    g, t = PostgresGuesses(), Taken()
    assert t.answer(g, [(HasPrefix, b"d/", DATA)], {(DATA, b"d/")}) is None
    assert t.answer(g, [(HasPrefix, b"d/", SIDE)], {(DATA, b"d/")}) == [False]


def test_a_name_answered_twice_in_a_run_is_answered_as_first():
    g, t = PostgresGuesses(), Taken()
    g.keep((DATA, b"k"), b"one")
    assert t.answer(g, [(Get, b"k", DATA)]) == [b"one"]
    g.forget([(DATA, "k")])
    assert t.answer(g, [(Get, b"k", DATA), (Size, b"k", DATA)]) == [b"one", 3]


def test_learnt_answers_and_a_size_of_a_known_value():
    g = PostgresGuesses()
    plan = [(Get, b"a/v", DATA), (Size, b"a/s", DATA), (Size, b"a/none", DATA), (HasPrefix, b"a/", DATA),
            (HasPrefix, b"b/", DATA)]
    found = {("get", DATA, b"a/v"): b"value", ("size", DATA, b"a/s"): 7, ("prefix", DATA, b"a/"): None}
    g.learn(plan, found)
    assert g.names == {(DATA, b"a/v"): b"value", (DATA, b"a/s"): 7, (DATA, b"a/none"): None}
    assert g.prefixes == {(DATA, b"a/"): True, (DATA, b"b/"): False}
    g.prefixes[DATA, b"a/"] = b"a/w"  # a witness this mount wrote
    g.learn([(HasPrefix, b"a/", DATA)], {("prefix", DATA, b"a/"): None})
    assert g.prefixes[DATA, b"a/"] == b"a/w"  # kept: a read holding keys confirms it
    g.learn([(Size, b"a/v", DATA)], {("size", DATA, b"a/v"): 5})
    assert g.names[DATA, b"a/v"] == b"value"  # the same length: the value stays known
    g.learn([(Size, b"a/v", DATA)], {("size", DATA, b"a/v"): 6})
    assert g.names[DATA, b"a/v"] == 6


def test_own_commits_keep_a_witness_of_each_folder():
    g = PostgresGuesses()
    g.prefixes[DATA, b"x/"] = False
    g.wrote([(DATA, b"x/y/1", b"v"), (SIDE, b"e:x/y", b"d")], None)
    assert g.prefixes[DATA, b"x/"] == b"x/y/1" and g.prefixes[DATA, b"x/y/"] == b"x/y/1"
    assert g.prefixes[SIDE, b"e:x/"] == b"e:x/y" and g.names[DATA, b"x/y/1"] == b"v"
    g.wrote([(DATA, b"x/y/2", b"w"), (DATA, b"x/y/2", None)], None)  # another key: the witness stays
    assert g.prefixes[DATA, b"x/y/"] == b"x/y/1" and g.names[DATA, b"x/y/2"] is None
    g.wrote([(DATA, b"x/y/1", None)], None)  # the witness removed: others may be left
    assert g.prefixes[DATA, b"x/y/"] is MISS and g.prefixes[DATA, b"x/"] is MISS
    g.prefixes[DATA, b"r/"] = True  # a read found keys, none known
    g.wrote([(DATA, b"r/1", None)], None)  # a removal below: it may have been the last
    assert g.prefixes[DATA, b"r/"] is MISS
    g.wrote([(DATA, b"r/2", b"v")], None)  # a key written below is its witness
    assert g.prefixes[DATA, b"r/"] == b"r/2"


def test_a_commit_that_held_confirms_what_it_took():
    g, t = PostgresGuesses(), Taken()
    t.answer(g, [(Get, b"f/a", DATA), (HasPrefix, b"f/", DATA)])
    g.wrote([(DATA, b"f/a", b"new")], t)  # the check found f/ empty and f/a absent; then wrote
    assert g.names[DATA, b"f/a"] == b"new" and g.prefixes[DATA, b"f/"] == b"f/a"


def test_a_wrong_guess_forgets_what_was_taken():
    g, t = PostgresGuesses(), Taken()
    t.answer(g, [(Get, b"f/a", DATA), (HasPrefix, b"f/", DATA)])
    g.missed(t)
    assert g.names[DATA, b"f/a"] is MISS and g.prefixes[DATA, b"f/"] is MISS
    assert g.misses == 1 and not g.wanted()  # the next ones read


def test_the_feed_forgets_names_and_the_folders_they_may_change():
    g = PostgresGuesses()
    g.wrote([(DATA, b"p/q/1", b"v"), (DATA, b"p/r", b"w")], None)
    g.prefixes[DATA, b"z/"] = False
    g.prefixes[DATA, b"f/"] = True
    g.forget([(DATA, "p/q/1"), (DATA, "z/new"), (DATA, "f/old")])
    assert g.names[DATA, b"p/q/1"] is MISS and g.prefixes[DATA, b"z/"] is MISS
    assert g.prefixes[DATA, b"f/"] is MISS  # full, no witness: the change may have emptied it
    assert g.prefixes[DATA, b"p/q/"] is MISS and g.prefixes[DATA, b"p/"] is MISS  # their witness changed
    g.wrote([(DATA, b"s/1", b"v"), (DATA, b"s/2", b"v")], None)
    g.forget([(DATA, "s/2")])
    assert g.prefixes[DATA, b"s/"] == b"s/1"  # another key changed: the witness still holds
    g.clear()
    assert not g.names and not g.prefixes


def test_the_table_is_bounded():
    g = PostgresGuesses()
    g.wrote([(DATA, b"k%d" % i, b"v") for i in range(NAMES + 10)], None)
    assert len(g.names) <= NAMES and (DATA, b"k0") not in g.names and (DATA, b"k%d" % (NAMES + 9)) in g.names


def test_a_run_on_guesses_that_failed_runs_again_reading_and_a_bug_is_logged_once(monkeypatch, caplog):
    """A run on guessed answers that raised (not a driver's error) is a wrong guess, run again
    reading; an error of the code itself (a TypeError, say), which the run again would hide,
    is logged, once a kind."""
    from zarrfs.backends import guesses

    monkeypatch.setattr(guesses, "_logged", set())
    reading = guesses.Reading()
    caplog.set_level("ERROR", logger="zarrfs.backends.guesses")
    err = guesses.run_again("db", FileExistsError("a"), reading)
    assert isinstance(err, GuessedWrongError) and reading.take() and not caplog.records
    for _ in range(2):
        guesses.run_again("db", TypeError("bad"), reading)
    assert reading.take() and len(caplog.records) == 1 and "TypeError" in caplog.records[0].getMessage()
