"""FormatHooks through the real tree over the in-memory driver (no FUSE), and check_database."""

from __future__ import annotations

import json
import uuid
import zlib

import numpy as np
import pytest
import zarr
from format_cases import V2_ARRAY, V3_ARRAY, with_

from zarrfs.backends import open_driver
from zarrfs.format import FormatError
from zarrfs.format.check import check_database
from zarrfs.format.hooks import FormatHooks
from zarrfs.fs.commitoptions import CREATE
from zarrfs.fs.tree import Tree

pytestmark = pytest.mark.filterwarnings("ignore")


def j(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@pytest.fixture
def make_tree():
    drivers = []

    def make(**options) -> Tree:
        driver = open_driver(f"memory://{uuid.uuid4().hex}")
        drivers.append(driver)
        return Tree(driver, hooks=FormatHooks(**options))

    yield make
    for d in drivers:
        d.close()


def put(tree: Tree, key: str, value: bytes) -> None:
    parts = key.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        folder = "/".join(parts[:i])
        try:
            tree.mkdir(folder, 0o755)
        except OSError:
            pass  # already there
    tree.store([(key, value, None, CREATE)])


def test_strict_refuses_and_stores_nothing(make_tree):
    tree = make_tree()
    put(tree, ".zgroup", j({"zarr_format": 2}))
    put(tree, "a/.zarray", j(V2_ARRAY))
    put(tree, "a/2.2", b"chunk")
    for key, value, rule in [
        ("a/3.0", b"chunk", "chunk-key.out-of-grid"),
        ("b/.zarray", j(with_(V2_ARRAY, order="X")), "zarray.order"),
        ("a/.zattrs", j({"_ARRAY_DIMENSIONS": ["x"]}), "zattrs.array-dimensions-length"),
    ]:
        with pytest.raises(FormatError) as exc:
            put(tree, key, value)
        assert exc.value.problem.rule == rule
        assert tree.driver.get(key) is None
    with pytest.raises(FormatError):
        tree.mkdir("bad\\name", 0o755)
    # a temporary name is fine, and renaming it onto a bad key is refused
    put(tree, "a/3.0.0123456789abcdef0123456789abcdef.partial", b"chunk")
    with pytest.raises(FormatError):
        tree.rename("a/3.0.0123456789abcdef0123456789abcdef.partial", "a/3.0")
    tree.rename("a/3.0.0123456789abcdef0123456789abcdef.partial", "a/1.1")
    assert tree.driver.get("a/1.1") == b"chunk"


def test_warn_and_off_store_everything(make_tree):
    for mode in ("warn", "off"):
        tree = make_tree(validate=mode)
        put(tree, "a/.zarray", j(V2_ARRAY))
        put(tree, "a/9.9", b"x")
        put(tree, "b/.zarray", b"not json")
        assert tree.driver.get("a/9.9") == b"x" and tree.driver.get("b/.zarray") == b"not json"


def test_decoded_view(make_tree):
    tree = make_tree(view="decoded")
    meta = with_(V2_ARRAY, dtype="<i4", fill_value=-1, compressor={"id": "zlib", "level": 1})
    put(tree, "a/.zarray", j(meta))
    raw = np.arange(32, dtype="<i4").tobytes()
    put(tree, "a/0.1", raw)
    stored = tree.driver.get("a/0.1")
    assert zlib.decompress(stored) == raw  # stored encoded...
    assert tree.read_value("a/0.1") == raw  # ...shown decoded
    assert tree.lookup("a/0.1").size == 32 * 4
    with pytest.raises(FormatError) as exc:
        put(tree, "a/0.0", raw[:-4])
    assert exc.value.problem.rule == "chunk.raw-size"
    # metadata shows as stored
    assert json.loads(tree.read_value("a/.zarray")) == meta


def test_live_consolidation_v2(make_tree):
    tree = make_tree(consolidate="auto")
    put(tree, ".zgroup", j({"zarr_format": 2}))
    put(tree, ".zmetadata", j({"metadata": {".zgroup": {"zarr_format": 2}}, "zarr_consolidated_format": 1}))
    put(tree, "g/.zgroup", j({"zarr_format": 2}))
    put(tree, "g/a/.zarray", j(V2_ARRAY))
    put(tree, "g/a/.zattrs", j({"units": "K"}))
    put(tree, "g/a/0.0", b"chunk")  # chunks do not touch it
    doc = json.loads(tree.driver.get(".zmetadata"))
    assert set(doc["metadata"]) == {".zgroup", "g/.zgroup", "g/a/.zarray", "g/a/.zattrs"}
    tree.unlink("g/a/.zattrs")
    tree.rename("g", "h")
    doc = json.loads(tree.driver.get(".zmetadata"))
    assert set(doc["metadata"]) == {".zgroup", "h/.zgroup", "h/a/.zarray"}


def test_no_consolidation_unless_asked(make_tree):
    tree = make_tree(consolidate="auto")
    put(tree, ".zgroup", j({"zarr_format": 2}))
    put(tree, "a/.zarray", j(V2_ARRAY))
    assert tree.driver.get(".zmetadata") is None
    off = make_tree(consolidate="off")
    put(off, ".zmetadata", j({"metadata": {}, "zarr_consolidated_format": 1}))
    put(off, "a/.zarray", j(V2_ARRAY))
    assert json.loads(off.driver.get(".zmetadata"))["metadata"] == {}


def test_live_creates_root_documents(make_tree):
    tree = make_tree(consolidate="live")
    put(tree, ".zgroup", j({"zarr_format": 2}))
    put(tree, "a/.zarray", j(V2_ARRAY))
    assert set(json.loads(tree.driver.get(".zmetadata"))["metadata"]) == {".zgroup", "a/.zarray"}
    v3 = make_tree(consolidate="live")
    put(v3, "zarr.json", j({"zarr_format": 3, "node_type": "group"}))
    put(v3, "g/a/zarr.json", j(V3_ARRAY))
    meta = json.loads(v3.driver.get("zarr.json"))["consolidated_metadata"]["metadata"]
    assert list(meta) == ["g", "g/a"]


def test_consolidation_v3_readable_by_zarr(make_tree, tmp_path):
    tree = make_tree()
    root = zarr.open_group(str(tmp_path / "src"), mode="w")
    root.create_group("g").create_array("a", shape=(4,), chunks=(2,), dtype="i4")[...] = 5
    zarr.consolidate_metadata(str(tmp_path / "src"))
    for path in sorted((tmp_path / "src").rglob("*")):
        if path.is_file():
            put(tree, str(path.relative_to(tmp_path / "src")), path.read_bytes())
    new = zarr.create_array(str(tmp_path / "b"), shape=(6, 6), chunks=(3, 3), dtype="f8")
    put(tree, "g/b/zarr.json", (tmp_path / "b" / "zarr.json").read_bytes())
    # copy the whole database out and let zarr read it through its consolidated metadata
    out = tmp_path / "out"
    for key, value in tree.driver.scan(fetch="values"):
        (out / key).parent.mkdir(parents=True, exist_ok=True)
        (out / key).write_bytes(value)
    g = zarr.open_consolidated(str(out))
    assert g["g/b"].shape == new.shape and (g["g/a"][...] == 5).all()


def test_check_database(make_tree):
    tree = make_tree(validate="off")
    put(tree, ".zgroup", j({"zarr_format": 2}))
    put(tree, "a/.zarray", j(V2_ARRAY))
    for i in range(3):
        put(tree, f"a/{i}.0", b"x")
    put(tree, "a/7.7", b"x")
    put(tree, "b/.zgroup", j({"zarr_format": 2, "x": 1}))
    found = list(check_database(tree.driver, batch=2))
    assert {(p.key, p.rule) for p in found if p.is_error} == {
        ("a/7.7", "chunk-key.out-of-grid"),
        ("b/.zgroup", "zgroup.keys"),
    }


def test_bad_options():
    with pytest.raises(ValueError):
        FormatHooks(validate="maybe")


class _Reads:
    """A transaction's reads over ``data``, counted (what the hooks ask a commit for)."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self.reads = 0

    def get(self, key: str) -> bytes | None:
        self.reads += 1
        return self.data.get(key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        self.reads += len(keys)
        return [self.data.get(k) for k in keys]

    def after_commit(self, fn) -> None:
        fn()  # each store here is a transaction that committed

    @property
    def notes(self) -> dict:
        return {}


class _Failing(_Reads):
    """A run whose commit fails (it is run again): what it learnt is not kept."""

    def after_commit(self, fn) -> None:
        pass


def test_a_folder_found_outside_by_a_run_that_did_not_commit_is_read_again():
    hooks = FormatHooks()
    failing = _Failing({})
    hooks.store(failing, "plain/a", b"x")
    assert failing.reads == 7
    txn = _Reads({})
    hooks.store(txn, "plain/a", b"x")  # the run again reads them
    assert txn.reads == 7


def test_a_folder_outside_every_node_is_read_once_a_while():
    """A file committed in a folder with no metadata document in it or above reads the
    candidate documents once; the next files there read none, until the folder's time is up
    or a metadata document changes (this mount's, or another writer's as the feed tells)."""
    now = [100.0]
    hooks = FormatHooks(clock=lambda: now[0])
    txn = _Reads({})
    hooks.store(txn, "plain/a", b"x")
    assert txn.reads == 7  # plain/ and the root: zarr.json, .zarray, .zgroup; the root's v1 meta
    assert hooks.reads("plain/b") == []  # nothing to fetch with a remote commit's first reads
    hooks.store(txn, "plain/b", b"x")
    hooks.store(txn, "plain/c.partial", b"x")  # a temporary name: never judged
    assert txn.reads == 7
    now[0] += 1.01
    hooks.store(txn, "plain/c", b"x")
    assert txn.reads == 14
    # Another writer's change that is no metadata keeps it; a metadata document drops it.
    hooks.elsewhere(["plain/d", "other/x"])
    hooks.store(txn, "plain/e", b"x")
    assert txn.reads == 14
    txn.data["plain/.zarray"] = j(V2_ARRAY)
    hooks.elsewhere(["plain/.zarray"])
    with pytest.raises(FormatError):
        hooks.store(txn, "plain/3.0", b"x")
    hooks.store(txn, "plain/2.2", b"x")  # inside the array now: read each time
    assert hooks.reads("plain/2.1") != []
    hooks.store(txn, "other/a", b"x")
    assert hooks.reads("other/b") == []
    hooks.elsewhere(None)  # not known what changed: nothing taken as outside
    assert hooks.reads("other/b") != []


def test_own_metadata_makes_a_folder_taken_as_outside_an_array(make_tree):
    """The mount's own metadata write puts a folder it took as outside every node inside an
    array at once: a chunk key out of the grid is refused right after."""
    tree = make_tree()
    put(tree, "a/x", b"not a chunk yet")
    put(tree, "a/.zarray", j(V2_ARRAY))
    with pytest.raises(FormatError) as exc:
        put(tree, "a/3.0", b"chunk")
    assert exc.value.problem.rule == "chunk-key.out-of-grid"
    # and by a rename of a folder holding an array onto a name taken as outside
    put(tree, "b/c/y", b"plain")
    tree.unlink("b/c/y")
    tree.rmdir("b/c")
    put(tree, "tmp/c/.zarray", j(V2_ARRAY))
    tree.rename("tmp/c", "b/c")
    put(tree, "b/c/2.2", b"chunk")
    with pytest.raises(FormatError):
        put(tree, "b/c/3.0", b"chunk")


def test_another_writers_metadata_reaches_a_folder_taken_as_outside(tmp_path):
    """Two trees on one SQLite database: an array another writer made in a folder this one
    took as outside every node is judged as soon as the change feed tells of it."""
    from zarrfs.fs.changes import ChangeWatcher

    url = f"sqlite://{tmp_path}/shared.sqlite"
    drivers = [open_driver(url), open_driver(url)]
    here, there = (Tree(d, hooks=FormatHooks()) for d in drivers)
    try:
        watcher = ChangeWatcher(here)
        put(here, "a/x", b"plain")
        put(there, "a/.zarray", j(V2_ARRAY))
        watcher.poll()
        with pytest.raises(FormatError):
            put(here, "a/3.0", b"chunk")
        put(here, "a/2.2", b"chunk")
    finally:
        for d in drivers:
            d.close()
