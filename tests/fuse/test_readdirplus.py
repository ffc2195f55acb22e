"""READDIRPLUS through the session without a mount: each name with its node ID and the
attributes a LOOKUP would give, a lookup counted per entry sent (and only those that fit),
exact across replies that resume (see ``session_wire``)."""

from __future__ import annotations

from session_wire import ATTR_FIELDS, entry_of, z

from zarrfs.fuse import abi as k

ENTRY_OUT = 6  # nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec


def plus_of(body: bytes) -> list[tuple[str, int, int, dict]]:
    """(name, node ID, next offset, attributes) of each fuse_direntplus record of a reply;
    checks each record's padding and that its dirent's ino is the entry's node ID."""
    out, at = [], 0
    while at < len(body):
        values = k.DIRENTPLUS.unpack_from(body, at)
        nodeid = values[0]
        attr = dict(zip(ATTR_FIELDS, values[ENTRY_OUT : ENTRY_OUT + 16], strict=True))
        ino, off, namelen, _ = values[ENTRY_OUT + 16 :]
        name = body[at + k.DIRENTPLUS.size : at + k.DIRENTPLUS.size + namelen].decode()
        assert ino == nodeid or nodeid == 0  # without a node: the number the listing gives
        out.append((name, nodeid, off, attr))
        at += (k.DIRENTPLUS.size + namelen + 7) // 8 * 8
    assert at == len(body), "the last record is padded to 8 bytes"
    return out


def opendir(wire, nodeid: int) -> int:
    return k.OPEN_REPLY.unpack(wire.ok(k.OPENDIR, nodeid, k.OPEN_IN.pack(0, 0)).raw)[3]


def readdirplus(wire, nodeid: int, fh: int, offset: int, size: int = 4096) -> bytes:
    return wire.ok(k.READDIRPLUS, nodeid, k.READ_IN.pack(fh, offset, size, 0, 0, 0, 0)).body


def test_readdirplus_gives_what_a_lookup_gives_and_counts_one_lookup_per_entry(wire):
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.mkdir(d.nodeid, "sub")
    wire.put_file(d.nodeid, "file", b"12345", mode=0o640)
    wire.ops.tree.driver.transact(lambda t: t.put("d/behind", b"x" * 70))  # not through the mount
    for key in ("d/sub", "d/file"):  # the kernel holds what it made: forgotten, as after a while
        nodeid = wire.inodes.ids[key]
        wire.send(k.FORGET, nodeid, k.FORGET_IN.pack(wire.inodes.get(nodeid).lookups))
        assert wire.inodes.held(key) is None
    got = plus_of(readdirplus(wire, d.nodeid, opendir(wire, d.nodeid), 0))
    assert [(n, o) for n, _, o, _ in got] == [(".", 1), ("..", 2), ("behind", 3), ("file", 4), ("sub", 5)]
    assert got[0][1] == got[1][1] == 0  # "." and "..": no node ID, no lookup counted
    by_name = {n: (nodeid, attr) for n, nodeid, _, attr in got}
    for name in ("behind", "file", "sub"):
        nodeid, attr = by_name[name]
        looked = entry_of(wire.call(k.LOOKUP, d.nodeid, z(name)))
        assert nodeid == looked.nodeid and attr == vars(looked.attr), name
    assert by_name["behind"][1]["size"] == 70 and by_name["file"][1]["mode"] == 0o100640
    # One count for the entry, one for the LOOKUP just made.
    for key in ("d/behind", "d/file", "d/sub"):
        assert wire.inodes.get(wire.inodes.ids[key]).lookups == 2, key
    wire.send(k.FORGET, by_name["behind"][0], k.FORGET_IN.pack(2))
    assert wire.inodes.held("d/behind") is None


def test_a_name_whose_node_the_kernel_holds_is_listed_alone(wire):
    """Listed again, a name the kernel holds goes with node ID 0 and its node's number: the
    kernel keeps its entry, attributes and cached ACLs (READDIRPLUS with a node makes it
    forget those), nothing is read for it, and no lookup is counted."""
    d = wire.mkdir(k.ROOT_ID, "d")
    held = wire.put_file(d.nodeid, "held", b"12345")
    wire.ops.tree.driver.transact(lambda t: t.put("d/other", b"x" * 70))  # not through the mount
    before = wire.inodes.get(held.nodeid).lookups
    listed = plus_of(readdirplus(wire, d.nodeid, opendir(wire, d.nodeid), 0))
    got = {n: (nodeid, attr) for n, nodeid, _, attr in listed}
    assert got["held"][0] == 0 and set(got["held"][1].values()) == {0}
    assert got["other"][0] == wire.inodes.ids["d/other"] and got["other"][1]["size"] == 70
    assert wire.inodes.get(held.nodeid).lookups == before
    body = readdirplus(wire, d.nodeid, opendir(wire, d.nodeid), 0)
    at = body.index(b"held\0") - k.DIRENTPLUS.size
    assert k.DIRENTPLUS.unpack_from(body, at)[ENTRY_OUT + 16] == held.nodeid  # the number stat gives


def test_readdirplus_in_small_replies_is_exact_and_counts_only_what_fits(wire):
    names = [f"n{i:04d}" for i in range(600)]  # several listing windows (128, 512, ...)
    wire.ops.tree.driver.transact(lambda t: [t.put(f"big/{n}", n.encode()) for n in names])
    d = wire.lookup(k.ROOT_ID, "big")
    fh = opendir(wire, d.nodeid)
    seen, offset = [], 0
    while body := readdirplus(wire, d.nodeid, fh, offset, size=500):  # 3 records of 160 bytes
        records = plus_of(body)
        assert len(records) == min(3, 602 - len(seen))
        assert [o for _, _, o, _ in records] == list(range(offset + 1, offset + 1 + len(records)))
        seen += [n for n, *_ in records]
        offset = records[-1][2]
    assert seen == [".", ".."] + names
    # Every name sent once, counted once: nothing counted for records that did not fit.
    assert [wire.inodes.get(wire.inodes.ids[f"big/{n}"]).lookups for n in names] == [1] * len(names)
    # Listed again while the kernel holds them: names alone, nothing counted again.
    again = plus_of(readdirplus(wire, d.nodeid, fh, 2, 4096))
    assert [n for n, *_ in again] == names[: len(again)] and len(again) == 4096 // 160
    assert {nodeid for _, nodeid, _, _ in again} == {0}
    assert [wire.inodes.get(wire.inodes.ids[f"big/{n}"]).lookups for n in names] == [1] * len(names)
