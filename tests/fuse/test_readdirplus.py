"""READDIRPLUS through the session without a mount: each name with its node ID and the
attributes a LOOKUP would give, a lookup counted per entry sent (and only those that fit),
exact across replies that resume (see ``session_wire``)."""

from __future__ import annotations

import os

from session_wire import ATTR_FIELDS, dirents_of, entry_of, z

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


def _forget_all(wire, keys) -> None:
    """FORGET every lookup of ``keys``' nodes, as the kernel does after a while."""
    for key in keys:
        nodeid = wire.inodes.ids.get(key)
        if nodeid is not None and wire.inodes.get(nodeid) and wire.inodes.get(nodeid).lookups:
            wire.send(k.FORGET, nodeid, k.FORGET_IN.pack(wire.inodes.get(nodeid).lookups))


def test_a_window_of_every_kind_of_name_lists_what_a_lookup_gives(make_ops, make_wire):
    """A folder large enough that its nodes are read from whole ranges of side records and
    numbered a reply at a time (plain files and folders in one loop), mixed with every name
    that takes the per-name road: a file stored in parts, two names of one linked file, a
    symlink, a device, a key written behind the mount and a folder of such keys (no attribute
    record: the mount's defaults, each its own copy), a folder whose
    attribute record says it is a file, a file open with pending writes, a file whose pages
    the kernel was given, and a file looked up again meanwhile. Each entry's node ID and
    attributes are what a LOOKUP then gives, in replies of every size."""
    from zarrfs.backends.base import SIDE
    from zarrfs.fs.sidedata import ATTR, Attrs

    ops = make_ops()
    ops.handles.parting.above = 4096  # files above 4 KiB stored in parts
    wire = make_wire(ops)
    d = wire.mkdir(k.ROOT_ID, "d")
    for i in range(90):
        wire.put_file(d.nodeid, f"f{i:03d}", b"x" * i, mode=0o600 + i % 8)
    wire.mkdir(d.nodeid, "sub")
    wire.put_file(d.nodeid, "parted", b"p" * 20000)
    one = wire.put_file(d.nodeid, "linked1", b"L" * 9)
    wire.ok(k.LINK, d.nodeid, k.LINK_IN.pack(one.nodeid) + z("linked2"))
    wire.ok(k.SYMLINK, d.nodeid, z("sym") + z("f001"))
    wire.ok(k.MKNOD, d.nodeid, k.MKNOD_IN.pack(0o020644, os.makedev(1, 3), 0o022, 0) + z("dev"))
    SOME = Attrs(0o100644, 1, 2, 3, 4, 5).pack()
    wire.ops.tree.driver.transact(
        lambda t: [
            t.put("d/behind", b"b" * 33), t.put("d/zbare/k", b"2"), t.put("d/odd/k", b"1"),
            t.put(ATTR + "d/odd", SOME, SIDE),
        ]
    )
    opened, fh_open = wire.create(d.nodeid, "open")  # pending writes, not stored yet
    wire.write(opened.nodeid, fh_open, b"o" * 77)
    paged = wire.lookup(d.nodeid, "f010")  # its pages given to the kernel, then forgotten
    fh_paged, _ = wire.open(paged.nodeid)
    assert wire.read(paged.nodeid, fh_paged) == b"x" * 10
    wire.release(paged.nodeid, fh_paged)
    listed = ["open", "linked1", "linked2", "sub", "sym", "dev", "parted", "f010"]
    listed += [f"f{i:03d}" for i in range(90)]
    assert wire.inodes.paged(paged.nodeid)
    everything = [f"d/{n}" for n in listed + ["behind", "zbare", "odd"]]
    _forget_all(wire, everything)  # "open" too: its pending node is what a listing then shows
    for size in (4096, 1000, 160 * 130):
        fh = opendir(wire, d.nodeid)
        wire.lookup(d.nodeid, "f080")  # held by the kernel: listed alone
        got, offset = [], 0
        while body := readdirplus(wire, d.nodeid, fh, offset, size):
            records = plus_of(body)
            got += records
            offset = records[-1][2]
        names = [n for n, *_ in got][2:]
        stored = sorted(set(listed) - {"open"} | {"behind", "zbare", "odd"})
        assert names == stored + ["open"], size  # unstored last
        for name, nodeid, _, attr in got[2:]:
            looked = entry_of(wire.call(k.LOOKUP, d.nodeid, z(name)))
            if name == "f080":
                assert nodeid == 0 and set(attr.values()) == {0}
            else:
                assert (nodeid, attr) == (looked.nodeid, vars(looked.attr)), (name, size)
        sizes = {n: a["size"] for n, _, _, a in got if n in ("parted", "open", "behind", "sym", "f089")}
        assert sizes == {"parted": 20000, "open": 77, "behind": 33, "sym": 4, "f089": 89}
        assert next(a for n, _, _, a in got if n == "odd")["mode"] & 0o170000 == 0o040000
        assert next(a for n, _, _, a in got if n == "zbare")["mode"] & 0o170000 == 0o040000
        assert next(a for n, _, _, a in got if n == "linked1")["nlink"] == 2
        assert next(a for n, _, _, a in got if n == "f007")["mode"] == 0o100607
        _forget_all(wire, everything)
    wire.release(opened.nodeid, fh_open)


def test_a_listed_name_is_no_longer_a_remembered_missing_one(make_wire):
    """Under a change feed the session remembers the names it answered "no such file" for (to
    drop them from the kernel later); a name a listing then gives with its node exists, and is
    remembered missing no more, in a window large enough to be read and numbered in one loop."""
    from zarrfs.fs.api import ChangeWatcher
    from zarrfs.fuse import coherence

    wire = make_wire(negative_timeout=3600)
    wire.session.coherence = coherence.Coherence(wire.session, ChangeWatcher(wire.ops.tree))
    d = wire.mkdir(k.ROOT_ID, "d")
    assert wire.lookup(d.nodeid, "late").nodeid == 0
    assert "d/late" in wire.session.coherence.negatives
    names = [f"n{i:03d}" for i in range(100)] + ["late"]
    wire.ops.tree.driver.transact(lambda t: [t.put(f"d/{n}", n.encode()) for n in names])  # another client
    fh = opendir(wire, d.nodeid)
    got, offset = [], 0
    while body := readdirplus(wire, d.nodeid, fh, offset, 1 << 16):
        records = plus_of(body)
        got += records
        offset = records[-1][2]
    late = next(nodeid for n, nodeid, _, _ in got if n == "late")
    assert late == wire.inodes.ids["d/late"] != 0
    assert "d/late" not in wire.session.coherence.negatives


_EVERY_KIND = ["small", "empty", "sub", "parted", "linked1", "linked2", "sym", "behind"]


def _every_kind(make_ops, make_wire):
    """A mount following a change feed with a folder ``d`` of names of every kind (plain file,
    empty file, folder, file in parts, two names of a linked file, symlink, a key written
    behind the mount), forgotten by the kernel; and their nodes as a listing reads them."""
    from zarrfs.fs.api import ChangeWatcher
    from zarrfs.fuse import coherence

    ops = make_ops()
    ops.handles.parting.above = 4096
    wire = make_wire(ops)
    session = wire.session
    session.coherence = coherence.Coherence(session, ChangeWatcher(ops.tree))
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.put_file(d.nodeid, "small", b"s" * 700, mode=0o640)
    wire.put_file(d.nodeid, "empty", b"")
    wire.mkdir(d.nodeid, "sub")
    wire.put_file(d.nodeid, "parted", b"p" * 9000)
    one = wire.put_file(d.nodeid, "linked1", b"L" * 9)
    wire.ok(k.LINK, d.nodeid, k.LINK_IN.pack(one.nodeid) + z("linked2"))
    wire.ok(k.SYMLINK, d.nodeid, z("sym") + z("small"))
    ops.tree.driver.transact(lambda t: t.put("d/behind", b"b" * 33))
    _forget_all(wire, [f"d/{n}" for n in _EVERY_KIND])
    fh = ops.opendir("d")
    listed = {key: node for _, _, _, key, node in ops.readdirplus(fh, 2, 100) if node is not None}
    assert sorted(listed) == sorted(f"d/{n}" for n in _EVERY_KIND)
    assert listed["d/small"].no_xattrs and listed["d/sub"].no_xattrs  # read with their xattr records
    return ops, wire, listed


def test_an_entry_by_the_one_call_road_is_the_per_name_roads(make_ops, make_wire):
    """Every LOOKUP, CREATE, MKDIR... and each READDIRPLUS name gets its ``fuse_entry_out``
    from ``Session._entry``: a plain file or folder numbered and packed in one call, the rest
    by ``_entry_values``. For names of every kind, fresh to the node table and already in it,
    with a mount that follows a change feed (extended attributes read as none are marked),
    both give the same node ID, the same bytes, the same version given to the kernel, the
    same lookup count and the same no-xattrs mark; also while the mount remembers missing
    names (the name itself among them: a CREATE after its LOOKUP), which both forget."""
    ops, wire, listed = _every_kind(make_ops, make_wire)
    session, inodes, names = wire.session, wire.inodes, _EVERY_KIND
    negatives = session.coherence.negatives
    for first_plain, remembered in ((True, False), (False, False), (True, True), (False, True)):
        for name in names:
            key = f"d/{name}"
            node = (listed if first_plain else {}).get(key) or ops.find(key)
            got = []
            for plain in (first_plain, not first_plain):
                if remembered:
                    negatives.update({key: None, "d/missing": None})
                before = inodes.get(inodes.ids[key]).lookups if key in inodes.ids else 0
                if plain:
                    nodeid, packed = session._entry(key, node)
                else:
                    values = session._entry_values(key, node)
                    nodeid, packed = values[0], k.ENTRY_OUT.pack(*values)
                inode = inodes.get(nodeid)
                assert inode.lookups == before + 1, (name, plain)
                assert key not in negatives and ("d/missing" in negatives) == remembered
                got.append((nodeid, packed, inode.given, inodes.bare_of_xattrs(nodeid)))
            assert got[0] == got[1], (name, first_plain)
            assert got[0][3] == node.no_xattrs, name
        _forget_all(wire, [f"d/{n}" for n in names])


def test_a_reply_of_names_numbered_at_once_gives_each_what_the_one_call_road_gives(make_ops, make_wire):
    """A READDIRPLUS reply's names are numbered and packed at once (``Session._entries``; names
    all new to a table without free slots appended to its columns in one call, the others
    name by name, those not plain by ``_entry_values`` in their places). For names of every
    kind, new to a fresh node table, then forgotten, then half and all of them known, each
    gets the node ID its key has in the table, one more lookup, its no-xattrs mark, and the
    entry and version mark ``_entry`` gives the same name right after."""
    ops, first, listed = _every_kind(make_ops, make_wire)
    keys = [f"d/{n}" for n in _EVERY_KIND]
    nodes = [listed[key] for key in keys]
    fresh = make_wire(ops)  # a table that has no node of them yet, and no free slot
    from zarrfs.fuse.coherence import Coherence

    fresh.session.coherence = Coherence(fresh.session, first.session.coherence.watcher)
    for wire in (fresh, first):
        session, inodes = wire.session, wire.inodes
        for known in ([], keys[::2], keys):
            _forget_all(wire, keys)
            before = {key: session._entry(key, listed[key])[0] for key in known}
            counts = {}  # lookups of each node before, by node ID
            for key in keys:
                if key in inodes.ids and inodes.get(inodes.ids[key]):
                    counts[inodes.ids[key]] = inodes.get(inodes.ids[key]).lookups
            ids, packed = session._entries(keys, nodes)
            assert len(ids) == len(packed) == len(keys)
            assert len(set(ids)) == len(keys) - 1  # the two names of the linked file: one node
            for key, node, nodeid in zip(keys, nodes, ids, strict=True):
                assert inodes.ids[key] == nodeid, key
                assert nodeid == before.get(key, nodeid), key
                assert inodes.get(nodeid).lookups == counts.get(nodeid, 0) + list(ids).count(nodeid), key
                assert inodes.bare_of_xattrs(nodeid) == node.no_xattrs, key
            for key, node, nodeid, raw in zip(keys, nodes, ids, packed, strict=True):
                inode = inodes.get(nodeid)
                given = inode.given
                assert session._entry(key, node) == (nodeid, raw), key
                assert inode.given == given, key
        _forget_all(wire, keys)


def test_names_that_share_attributes_but_one_field_each_get_their_own(make_ops, make_wire):
    """A reply's names packed at once share the packed attributes after their size when all
    of those are equal (``Session._entries``): names equal to a first one in everything but
    one field (each time, mode, owner, group, link count, device number, size) each get the
    entry ``_entry`` gives them alone, and so do names equal to the first again after them."""
    import dataclasses

    wire = make_wire(make_ops())
    session = wire.session
    d = wire.mkdir(k.ROOT_ID, "d")
    wire.put_file(d.nodeid, "f", b"x" * 10)
    node = wire.ops.find("d/f")
    a = node.attrs
    changed_attrs = [
        {"atime": a.atime + 1}, {"mtime": a.mtime + 10**9}, {"ctime": a.ctime + 7},
        {"mode": a.mode ^ 0o7}, {"uid": a.uid + 1}, {"gid": a.gid + 1},
    ]  # fmt: skip
    changed_nodes = [{"nlink": 2}, {"rdev": 5}, {"size": 11}]
    nodes = [node]
    for change in changed_attrs:
        nodes += [dataclasses.replace(node, attrs=dataclasses.replace(a, **change)), node]
    for change in changed_nodes:
        nodes += [dataclasses.replace(node, **change), node]
    keys = [f"d/n{i:02d}" for i in range(len(nodes))]
    ids, packed = session._entries(keys, nodes)
    assert len(set(packed)) > len(changed_attrs) + len(changed_nodes)  # (node IDs differ too)
    _forget_all(wire, keys)
    for key, node, nodeid, raw in zip(keys, nodes, ids, packed, strict=True):
        assert session._entry(key, node) == (nodeid, raw), key
        values = k.ENTRY_OUT.unpack(raw)
        assert values[ENTRY_OUT + 1] == node.size and values[ENTRY_OUT + 10] == node.nlink, key
    _forget_all(wire, keys)


def test_a_name_looked_up_after_its_window_was_read_ahead_is_listed_as_held(make_wire):
    """A window read ahead notes that the kernel held none of its names
    (``DirListing.none_held``), which spares its reply asking again; a name looked up between
    that read and the reply is held after all: the reply gives it without a node (the
    kernel keeps its own), counts no lookup of it, and the node table keeps one node for
    the key. The other names come with nodes, one lookup each."""
    from collections import deque

    wire = make_wire()
    d = wire.mkdir(k.ROOT_ID, "d")
    names = [f"{i:04d}" for i in range(700)]
    wire.ops.tree.driver.transact(lambda t: [t.put(f"d/{name}", b"x") for name in names])
    ahead = wire.session.dirs.ahead = deque()
    fh = opendir(wire, d.nodeid)
    first = plus_of(readdirplus(wire, d.nodeid, fh, 0, size=20000))  # most of the first window
    while ahead:  # what the loop does while no request waits: the next window read
        if not ahead[0]():
            ahead.popleft()
    listing = wire.ops.dirs[fh]
    assert listing._ahead and listing._ahead[0].none_held is not None, "a window was read ahead"
    late = wire.lookup(d.nodeid, "0300")  # a name of the window read ahead
    rest, offset = [], first[-1][2]
    while body := readdirplus(wire, d.nodeid, fh, offset, size=1 << 16):
        rest += plus_of(body)
        offset = rest[-1][2]
    listed = {name: nodeid for name, nodeid, _, _ in first + rest}
    assert sorted(n for n in listed if n not in (".", "..")) == names
    assert listed["0300"] == 0
    assert wire.inodes.ids["d/0300"] == late.nodeid and wire.inodes.get(late.nodeid).lookups == 1
    for name in names:
        if name != "0300":
            assert listed[name] and wire.inodes.get(listed[name]).lookups == 1, name


def test_names_of_every_length_are_listed_whole_and_padded(wire):
    """Each entry is one record of its name's length padded to 8 bytes, for names of 1 to 300
    bytes (past 255: keys written around the kernel, whose own names stop there), in READDIR
    and READDIRPLUS replies alike."""
    d = wire.mkdir(k.ROOT_ID, "d")
    names = sorted("n" * n for n in (*range(1, 20), 254, 255, 256, 257, 300))
    wire.ops.tree.driver.transact(lambda t: [t.put("d/" + name, name.encode()) for name in names])
    listed, offset, fh = [], 0, opendir(wire, d.nodeid)
    while got := plus_of(readdirplus(wire, d.nodeid, fh, offset)):
        listed += [(name, attr["size"]) for name, _, _, attr in got]
        offset = got[-1][2]
    assert listed[2:] == [(name, len(name)) for name in names]
    listed, offset, fh = [], 0, opendir(wire, d.nodeid)
    while got := dirents_of(wire.readdir(d.nodeid, fh, offset)):
        listed += [name.decode() for name, _, _, _ in got]
        offset = got[-1][2]
    assert listed[2:] == names
