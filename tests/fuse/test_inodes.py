"""The inode table alone: node IDs and keys, lookups counted and forgotten, renames."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from zarrfs.fs.tree import DIR, FILE
from zarrfs.fuse import abi as k
from zarrfs.fuse.inodes import Checked, InodeTable


def test_inode_table_remember_and_forget():
    t = InodeTable(DIR)
    assert len(t) == 1 and t.key(k.ROOT_ID) == "" and t.get(k.ROOT_ID).kind == DIR
    a, node = t.remember("a", FILE)
    assert a == k.ROOT_ID + 1 and node.key == "a" and node.lookups == 1
    assert t.remember("a", FILE) == (a, node) and node.lookups == 2
    b, _ = t.remember("b", DIR)
    assert b == a + 1 and t.key(b) == "b"
    t.forget(a, 1)
    assert t.key(a) == "a" and t.held("a") == a
    t.forget(a, 1)  # forgotten by the kernel: kept idle, for its inode number
    assert t.held("a") is None and t.key(a) == "a" and node.lookups == 0
    t.forget(a, 1)  # nothing more to forget
    t.forget(k.ROOT_ID, 100)
    assert t.get(k.ROOT_ID).lookups == 1
    assert t.remember("a", FILE) == (a, node) and node.lookups == 1  # the same ID again
    t.detach("a")
    t.forget(a, 1)  # nameless: gone
    assert t.get(a) is None and "a" not in t.ids
    again = t.remember("a", FILE)[0]  # a new ID, never an old one: a's slot, next generation
    assert again not in (a, b) and again & 0xFFFFFFFF == a and again >> 32 == 1
    assert t.key(a) is None and t.get(a) is None and t.key(again) == "a"
    t.forget(a, 5)  # a stale ID names nothing, and changes nothing
    assert t.get(again).lookups == 1
    many = [t.remember(f"k{i}", FILE)[0] for i in range(20)]
    assert many == list(range(b + 1, b + 21))


def test_a_forgotten_node_keeps_its_id_across_renames_until_too_many_are_idle(monkeypatch):
    from zarrfs.fuse import inodes

    monkeypatch.setattr(inodes, "IDLE_NODES", 3)
    t = InodeTable(DIR)
    d, _ = t.remember("d", DIR)
    f, _ = t.remember("d/f", FILE)
    t.forget(f, 1)
    t.forget(d, 1)
    t.moved("d", "e")  # renamed while the kernel held neither
    assert t.remember("e/f", FILE)[0] == f and t.remember("e", DIR)[0] == d
    t.forget(f, 1)
    t.detach("e/f")  # removed while forgotten: the node goes
    assert t.get(f) is None and len(t.idle) == 0
    ids = [t.remember(f"x{i}", FILE)[0] for i in range(5)]
    for i in ids:
        t.forget(i, 1)
    assert list(t.idle) == ids[2:] and t.get(ids[0]) is None and "x0" not in t.ids
    assert t.remember("x4", FILE)[0] == ids[4] and t.remember("x0", FILE)[0] not in ids


def test_inode_table_detach():
    t = InodeTable(DIR)
    a, node = t.remember("a", FILE)
    t.detach("a")
    assert node.key is None and t.key(a) is None and t.get(a) == node and "a" not in t.ids
    again, _ = t.remember("a", FILE)
    assert again != a
    t.forget(a, 1)  # the detached node goes; the new one at the same key stays
    assert t.get(a) is None and t.ids["a"] == again
    t.detach("never-seen")


def test_inode_table_kind_change_gives_a_new_id():
    """A file replaced by a folder of the same name behind the mount: the kernel's inode of the
    old type is detached and the name gets a new node."""
    t = InodeTable(DIR)
    old, old_node = t.remember("x", FILE)
    new, new_node = t.remember("x", DIR)
    assert new != old and old_node.key is None and new_node.key == "x" and new_node.lookups == 1
    assert t.ids["x"] == new
    t.forget(old, 1)
    assert t.ids["x"] == new and t.get(new) == new_node


def test_inode_table_moved_with_nested_keys_and_a_replaced_target():
    t = InodeTable(DIR)
    src = t.remember("a", DIR)[0]
    child = t.remember("a/b", DIR)[0]
    leaf = t.remember("a/b/c", FILE)[0]
    sibling = t.remember("ab", FILE)[0]  # shares the prefix "a" but is not below "a/"
    target = t.remember("z", DIR)[0]
    stale = t.remember("z/b", DIR)[0]  # a node the kernel still holds under the target
    t.moved("a", "z")
    assert (t.key(src), t.key(child), t.key(leaf)) == ("z", "z/b", "z/b/c")
    assert t.key(sibling) == "ab" and t.key(target) is None and t.key(stale) is None
    assert t.ids == {"": k.ROOT_ID, "z": src, "z/b": child, "z/b/c": leaf, "ab": sibling}
    t.moved("ab", "z/b/d")  # a file into a moved folder
    assert t.key(sibling) == "z/b/d" and "ab" not in t.ids


def test_inode_table_exchanged():
    t = InodeTable(DIR)
    a = t.remember("a", DIR)[0]
    a1 = t.remember("a/1", FILE)[0]
    b = t.remember("b", DIR)[0]
    b2 = t.remember("b/2", FILE)[0]
    t.exchanged("a", "b")
    assert (t.key(a), t.key(a1), t.key(b), t.key(b2)) == ("b", "b/1", "a", "a/2")
    assert t.ids == {"": k.ROOT_ID, "a": b, "a/2": b2, "b": a, "b/1": a1}
    only = t.remember("only", FILE)[0]
    t.exchanged("only", "unknown")  # the kernel never looked the other name up
    assert t.key(only) == "unknown" and "only" not in t.ids


def test_the_names_of_a_linked_file_share_one_node():
    t = InodeTable(DIR)
    a, node = t.remember("a", FILE)
    t.linked(a, "g1")  # the reply to LINK: the new name is the source's node
    assert t.remember("b", FILE, "g1") == (a, node) and t.remember("d/c", FILE, "g1")[0] == a
    assert (node.key, node.aliases, node.lookups) == ("a", {"b", "d/c"}, 3)
    t.detach("a")  # unlink of the node's own name: it keeps the others
    assert node.key in ("b", "d/c") and t.key(a) is not None and "a" not in t.ids
    t.moved("d", "e")
    assert t.ids["e/c"] == a and "d/c" not in t.ids and "e/c" in {node.key, *node.aliases}
    t.detach("b")
    t.detach("e/c")
    assert t.key(a) is None  # every name gone: the node names nothing
    t.forget(a, 3)
    assert t.get(a) is None and t.groups == {} and not {"a", "b", "e/c"} & set(t.ids)
    fresh, _ = t.remember("x", FILE, "g2")  # after a remount: the first name met gives the ID
    assert t.remember("y", FILE, "g2")[0] == fresh and t.groups == {"g2": fresh}
    t.forget(fresh, 2)  # forgotten, kept idle with both names and its group
    assert t.held("x") is None and t.remember("y", FILE, "g2")[0] == fresh
    t.forget(fresh, 1)
    t.detach("x")
    t.detach("y")
    assert t.ids == {"": k.ROOT_ID} and t.groups == {} and t.get(fresh) is None


def _numbered_memory(keys: list[str], number) -> int:
    """Bytes the Python heap grew by while a new table numbered ``keys``, 4,096 at a time, by
    ``number(table, part)``; each key is checked numbered and read with no xattrs when given so."""
    import tracemalloc

    tracemalloc.start()
    try:
        table = InodeTable(DIR)
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, len(keys), 4096):
            number(table, keys[start : start + 4096])
        used = tracemalloc.get_traced_memory()[0] - before
        assert len(table) == len(keys) + 1 and all(table.ids[key] for key in keys)
        return used
    finally:
        tracemalloc.stop()


def _at_once(bare: bool):
    def number(table: InodeTable, part: list[str]) -> None:
        table.remember_plains(part, [FILE] * len(part), [7] * len(part), [bare] * len(part))
        assert all(table.bare_of_xattrs(table.ids[key]) == bare for key in part)

    return number


def _one_by_one(table: InodeTable, part: list[str]) -> None:
    for key in part:
        table.remember_plain(key, FILE, 7, True)
    assert all(table.bare_of_xattrs(table.ids[key]) for key in part)


def test_names_numbered_at_once_take_no_more_memory_a_node_than_one_by_one():
    """A node is a row of the table's columns and one int, shared by the key's dict entry and
    the node's row: names numbered at once (``remember_plains``, a first listing's reply)
    take no more memory than the same names numbered one by one (a range of node IDs iterated
    twice made a second int a node, for the no-xattrs set of the time: 31 bytes a node more)."""
    keys = [f"arr/c/{i}.0" for i in range(40000)]
    at_once, one_by_one = _numbered_memory(keys, _at_once(True)), _numbered_memory(keys, _one_by_one)
    assert at_once <= one_by_one * 1.05, (at_once, one_by_one)


def test_a_node_read_with_no_xattrs_costs_the_table_no_more_than_a_byte():
    """Whether a node's extended attributes were read as none is a byte of its row: as a set of
    node IDs it took 32 bytes a name more at a folder of 10^6 names listed (RssAnon of the
    daemon 238 bytes a name)."""
    keys = [f"arr/c/{i}.0" for i in range(40000)]
    bare, plain = _numbered_memory(keys, _at_once(True)), _numbered_memory(keys, _at_once(False))
    assert bare - plain <= 2 * len(keys), (bare, plain)


def test_no_xattrs_is_said_of_a_node_only_while_it_is_the_one_read():
    """The byte that says a node's extended attributes were read as none belongs to the node,
    not to its slot: a node forgotten, dropped, or made again in the slot is not bare, nor is a
    stale node ID; a change to every node's extended attributes clears them all."""
    t = InodeTable(DIR)
    a = t.remember_plain("a", FILE, 0, True)
    b = t.remember_plain("b", FILE, 0, True)
    assert t.bare_of_xattrs(a) and t.bare_of_xattrs(b)
    t.xattrs_read(a, False)
    assert not t.bare_of_xattrs(a) and t.bare_of_xattrs(b)
    t.xattrs_read(a, True)
    assert t.bare_of_xattrs(a)
    t.xattrs_changed()
    assert not t.bare_of_xattrs(a) and not t.bare_of_xattrs(b)
    t.xattrs_read(b, True)
    t.detach("b")
    t.forget(b, 1)  # nameless and forgotten: the slot is free
    c = t.remember_plain("c", FILE, 0, False)  # the freed slot, a new generation
    assert c & 0xFFFFFFFF == b & 0xFFFFFFFF and c != b
    assert not t.bare_of_xattrs(c) and not t.bare_of_xattrs(b)
    t.xattrs_read(c, True)
    assert t.bare_of_xattrs(c) and not t.bare_of_xattrs(b)  # b's ID is stale
    t.xattrs_read(b, False)  # a stale ID changes nothing of the slot's node
    assert t.bare_of_xattrs(c)
    t.forget(c, 1)  # forgotten, kept idle: its extended attributes are read again when asked
    assert not t.bare_of_xattrs(c)
    d = t.remember_plain("c", FILE, 0, False)
    assert d == c and not t.bare_of_xattrs(c)


# --- "no name given a node since": what lets a listing's reply number its names unlooked -----

_KEYS = ["a", "b", "a/x", "a/y", "b/x", "b/y", "c"]


class NamesComeOnlyWhenCounted(RuleBasedStateMachine):
    """Every way a name comes into the table counts (``InodeTable.added``): while the count
    stays, the table's names are a subset of those it had (``fuse.inodes.Checked`` rests on
    it: a reply's names found new stay new)."""

    def __init__(self) -> None:
        super().__init__()
        self.t = InodeTable(DIR)
        self.seen = (self.t.added, set(self.t.ids))

    @rule(
        key=st.sampled_from(_KEYS), kind=st.sampled_from([FILE, DIR]), group=st.sampled_from(["", "g1", "g2"])
    )
    def remember(self, key, kind, group):
        self.t.remember(key, kind, group if kind == FILE else "", [k for k in _KEYS if k != key][:2])

    @rule(keys=st.lists(st.sampled_from(_KEYS), min_size=1, max_size=4, unique=True))
    def remember_plains(self, keys):
        self.t.remember_plains(keys, [FILE] * len(keys), [0] * len(keys), None)

    @rule(key=st.sampled_from(_KEYS), kind=st.sampled_from([FILE, DIR]))
    def number(self, key, kind):
        self.t.number(key, kind)

    @rule(key=st.sampled_from(_KEYS))
    def link(self, key):
        nodeid = self.t.ids.get(key)
        if nodeid is not None:
            self.t.linked(nodeid, "g1")

    @rule(key=st.sampled_from(_KEYS), count=st.integers(1, 3))
    def forget(self, key, count):
        nodeid = self.t.ids.get(key)
        if nodeid is not None:
            self.t.forget(nodeid, count)

    @rule(key=st.sampled_from(_KEYS))
    def detach(self, key):
        self.t.detach(key)

    @rule(src=st.sampled_from(_KEYS), dst=st.sampled_from(_KEYS))
    def move(self, src, dst):
        if src != dst and not dst.startswith(src + "/") and not src.startswith(dst + "/"):
            self.t.moved(src, dst)

    @rule(a=st.sampled_from(["a", "b", "c"]), b=st.sampled_from(["a", "b", "c"]))
    def exchange(self, a, b):
        if a != b:
            self.t.exchanged(a, b)

    @invariant()
    def no_name_came_uncounted(self):
        added, names = self.seen
        now = set(self.t.ids)
        if self.t.added == added:
            assert now <= names, (now - names, added)
        else:
            assert self.t.added > added
        self.seen = (self.t.added, now)


TestNamesComeOnlyWhenCounted = NamesComeOnlyWhenCounted.TestCase
TestNamesComeOnlyWhenCounted.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)


def test_a_reply_numbers_its_names_unlooked_only_while_none_came():
    t = InodeTable(DIR)
    t.remember("d", DIR)
    asked = Checked(t)
    assert asked.holds_none(["d/0", "d/1"]) and asked.still_none()
    t.remember("d/1", FILE)  # another request's lookup, while this one waited on a server
    assert asked.holds_none(["d/0"]) and not asked.still_none()
    fresh = Checked(t)
    assert not fresh.holds_none(["d/0", "d/1"]) and not fresh.still_none()  # one is held
    again = Checked(t)
    assert again.holds_none(["d/2"]) and again.still_none()
    t.moved("d/1", "d/2")  # a rename brings a name in too
    assert not again.still_none()
    ids = t.remember_plains(["d/3", "d/4"], [FILE, FILE], [0, 0], None, new=True)
    assert [t.key(i) for i in ids] == ["d/3", "d/4"] and len(t) == 5
