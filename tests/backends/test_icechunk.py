"""Icechunk repositories as folders: a branch written through a mount and committed with
``zarrfs commit``, a tag read through a new mount by zarr-python 3, tensorstore, ``ls`` and
``cp -a``; a commit made elsewhere meanwhile is a conflict that says what to do."""

from __future__ import annotations

import errno
import os
import subprocess

import numpy as np
import pytest
from mounting import zarrfs
from zarr.core.sync import sync

from zarrfs.backends import open_driver
from zarrfs.backends.base import InvalidKeyError
from zarrfs.testing import DriverConformance
from zarrfs.testing.filesystem import FilesystemConformance

icechunk = pytest.importorskip("icechunk")


def _repo(path):
    return icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)))


def _write_array(folder, data, name="x"):
    import zarr

    root = zarr.open_group(str(folder), mode="a")
    arr = root.create_array(name, shape=data.shape, chunks=(4, 4), dtype=data.dtype)
    arr[:] = data
    return arr


def _commit(mount, *args: str):
    return zarrfs("commit", str(mount.path), *args, check=False)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_write_commit_tag_and_read_the_tag_through_a_new_mount(tmp_path, mount_factory):
    import tensorstore as ts
    import zarr

    repo_path = tmp_path / "repo"
    branch = mount_factory(f"icechunk://{repo_path}?branch=main", ["create"])
    data = np.arange(64, dtype="i4").reshape(8, 8)
    _write_array(branch.path, data)
    # Visible through the mount at once, before any commit.
    np.testing.assert_array_equal(zarr.open_array(str(branch.path / "x"), mode="r")[:], data)
    status = zarrfs("status", str(branch.path)).stdout
    assert "Icechunk branch main" in status and "uncommitted writes" in status

    done = _commit(branch, "-m", "first version")
    assert done.returncode == 0, done.stderr
    snapshot = done.stdout.strip()
    repo = _repo(repo_path)
    assert [c.message for c in repo.ancestry(branch="main")][0] == "first version"
    repo.create_tag("v1", snapshot)

    # The branch goes on: a second version, committed, does not change the tag.
    zarr.open_array(str(branch.path / "x"), mode="r+")[0, :] = -1
    assert _commit(branch, "-m", "second").returncode == 0

    tag = mount_factory(f"icechunk://{repo_path}?tag=v1")
    np.testing.assert_array_equal(zarr.open_array(str(tag.path / "x"), mode="r")[:], data)
    got = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tag.path / "x")}}).result()
    np.testing.assert_array_equal(got.read().result(), data)
    # The same as Icechunk reads the tag itself.
    direct = zarr.open_array(repo.readonly_session(tag="v1").store, path="x", mode="r")
    np.testing.assert_array_equal(direct[:], data)
    # ls and cp -a read it as a folder; it is read-only.
    assert sorted(os.listdir(tag.path)) == ["x", "zarr.json"]
    copied = tmp_path / "copied"
    subprocess.run(["cp", "-a", str(tag.path), str(copied)], check=True)
    np.testing.assert_array_equal(zarr.open_array(str(copied / "x"), mode="r")[:], data)
    with pytest.raises(OSError) as err:
        (tag.path / "x" / "zarr.json").write_bytes(b"{}")
    assert err.value.errno == errno.EROFS
    refused = _commit(tag, "-m", "nothing")
    assert refused.returncode == 1 and "read-only" in refused.stderr

    latest = mount_factory(f"icechunk://{repo_path}?snapshot={snapshot}")
    np.testing.assert_array_equal(zarr.open_array(str(latest.path / "x"), mode="r")[:], data)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_a_commit_made_elsewhere_is_a_conflict_that_says_what_to_do(tmp_path, mount_factory):
    import zarr

    repo_path = tmp_path / "repo"
    first = mount_factory(f"icechunk://{repo_path}?branch=main", ["create"])
    _write_array(first.path, np.zeros((8, 8), "i4"))
    assert _commit(first, "-m", "base").returncode == 0
    a = mount_factory(f"icechunk://{repo_path}?branch=main")
    b = mount_factory(f"icechunk://{repo_path}?branch=main")
    zarr.open_array(str(a.path / "x"), mode="r+")[0, 0] = 1
    zarr.open_array(str(b.path / "x"), mode="r+")[0, 1] = 2  # the same chunk
    assert _commit(a, "-m", "from a").returncode == 0

    refused = _commit(b, "-m", "from b")
    assert refused.returncode == 1
    assert "moved" in refused.stderr and "--rebase" in refused.stderr and "Traceback" not in refused.stderr
    # The writes stay in the mount.
    assert zarr.open_array(str(b.path / "x"), mode="r")[0, 1] == 2
    rebased = _commit(b, "-m", "from b", "--rebase")
    assert rebased.returncode == 1 and "--branch" in rebased.stderr
    moved = _commit(b, "-m", "from b", "--branch", "b-work")
    assert moved.returncode == 0, moved.stderr
    repo = _repo(repo_path)
    on_b = zarr.open_array(repo.readonly_session(branch="b-work").store, path="x", mode="r")[0, :2]
    on_main = zarr.open_array(repo.readonly_session(branch="main").store, path="x", mode="r")[0, :2]
    assert on_b.tolist() == [0, 2] and on_main.tolist() == [1, 0]


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_writes_to_other_chunks_are_rebased_on_a_moved_branch(tmp_path, mount_factory):
    import zarr

    repo_path = tmp_path / "repo"
    first = mount_factory(f"icechunk://{repo_path}?branch=main", ["create"])
    _write_array(first.path, np.zeros((8, 8), "i4"))
    assert _commit(first, "-m", "base").returncode == 0
    b = mount_factory(f"icechunk://{repo_path}?branch=main")
    zarr.open_array(str(first.path / "x"), mode="r+")[0, 0] = 1
    assert _commit(first, "-m", "elsewhere").returncode == 0
    zarr.open_array(str(b.path / "x"), mode="r+")[7, 7] = 9  # another chunk
    assert _commit(b, "-m", "b").returncode == 1
    assert _commit(b, "-m", "b", "--rebase").returncode == 0
    arr = zarr.open_array(_repo(repo_path).readonly_session(branch="main").store, path="x", mode="r")
    assert (arr[0, 0], arr[7, 7]) == (1, 9)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_unmount_commits_what_was_not_committed_and_says_so(tmp_path, mount_factory):
    import zarr

    repo_path = tmp_path / "repo"
    m = mount_factory(f"icechunk://{repo_path}?branch=main", ["create"])
    data = np.arange(16, dtype="i4").reshape(4, 4)
    _write_array(m.path, data)
    with pytest.raises(OSError) as err:  # Icechunk holds Zarr v3 only
        (m.path / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    assert err.value.errno == errno.EINVAL
    (m.path / "y").mkdir()
    with pytest.raises(OSError) as err:  # the format layer validates what a branch mount writes
        (m.path / "y" / "zarr.json").write_bytes(b'{"zarr_format": 3, "node_type": "array"}')
    assert err.value.errno == errno.EINVAL
    m.stop()
    assert "uncommitted writes committed to 'main'" in m.log_text()
    session = _repo(repo_path).readonly_session(branch="main")
    np.testing.assert_array_equal(zarr.open_array(session.store, path="x", mode="r")[:], data)
    assert not sync(session.store.exists("y/zarr.json"))


class TestIcechunkConformance(DriverConformance):
    """The driver kit on a branch of a new repository. Its keys are not Zarr v3 keys, so
    Icechunk keeps them aside in memory (see the driver): what that cannot give is declared."""

    memory = "names that are not Zarr v3 keys are kept in memory, for the life of the driver"
    cannot = {
        "test_reopen_keeps_data": memory,
        "test_read_only": memory + " (another driver does not see them)",
        "test_processes_increment_exactly": memory,
        "test_killed_writer_leaves_a_consistent_database": memory,
    }

    @pytest.fixture
    def url(self, tmp_path):
        return f"icechunk://{tmp_path}/repo?branch=main"

    @pytest.fixture
    def driver(self, url):
        d = open_driver(url)
        yield d
        d.close()


def test_the_driver_stores_zarr_v3_keys_in_the_session_and_commits_them(tmp_path):
    url = f"icechunk://{tmp_path}/repo?branch=main"
    group = b'{"zarr_format": 3, "node_type": "group", "attributes": {}}'
    with open_driver(url) as d:
        d.transact(lambda t: (t.put("zarr.json", group), t.put("scratch.tmp", b"x")))
        assert d.get("zarr.json") == group and d.get("scratch.tmp") == b"x"
        assert d.commit("group")["kept_aside"] == ["scratch.tmp"]
        with pytest.raises(InvalidKeyError):
            d.put(".zgroup", b"{}")
    with open_driver(f"icechunk://{tmp_path}/repo?branch=main", readonly=True) as again:
        assert again.scan() == [("zarr.json", None)] and again.get("zarr.json") == group


def test_copy_a_folder_into_a_new_repository_and_back(tmp_path):
    import zarr

    folder = tmp_path / "src"
    data = np.arange(30, dtype="f4").reshape(5, 6)
    _write_array(folder, data)
    zarrfs("copy", str(folder), f"icechunk://{tmp_path}/repo?branch=main")
    repo = _repo(tmp_path / "repo")
    assert [c.message for c in repo.ancestry(branch="main")][0].startswith("written through zarrfs")
    arr = zarr.open_array(repo.readonly_session(branch="main").store, path="x", mode="r")
    np.testing.assert_array_equal(arr[:], data)
    zarrfs("copy", f"icechunk://{tmp_path}/repo?branch=main", str(tmp_path / "back"))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "back" / "x"), mode="r")[:], data)


class TestIcechunkFilesystem(FilesystemConformance):
    """The filesystem kit over a branch of a new repository (its names are kept aside in
    memory until they are Zarr v3 keys; the tree means the same over them)."""

    v2 = "Icechunk holds Zarr v3 only: the test writes Zarr v2 metadata"
    cannot = {
        "test_folders_derive_from_keys": v2,
        "test_rename_folder_moves_everything_atomically": v2,
        "test_decoded_view_encodes_a_temporary_file_renamed_onto_a_chunk": v2,
        "test_link_stores_the_new_name_or_fails_with_eexist": "Icechunk refuses the test's zarr.json "
        "(not a complete Zarr v3 document)",
        "test_a_folder_named_as_a_prefix_of_its_siblings_is_listed_once": "Icechunk refuses the test's "
        "zarr.json (not a complete Zarr v3 document)",
    }

    @pytest.fixture
    def driver_url(self, tmp_path):
        return f"icechunk://{tmp_path}/repo?branch=main"


def test_version_names_as_zep8_spells_them():
    from zarrfs.backends.versionpath import split_version

    assert split_version("/r/repo@tag.v1") == ("/r/repo", "tag", "v1")
    assert split_version("/r/repo@branch.dev.2") == ("/r/repo", "branch", "dev.2")
    assert split_version("/r/repo@1CECHNKREP0F1RSTCMT0") == ("/r/repo", "snapshot", "1CECHNKREP0F1RSTCMT0")
    for plain in ("/r/repo", "/r/me@host/repo", "/r/repo@notaversion", "/r/repo@tag.", "/r/@tag.v1"):
        assert split_version(plain) == (plain, None, None)


@pytest.mark.usefixtures("fuse_required")
@pytest.mark.mount
def test_zep8_versions_in_urls_and_in_a_mount(tmp_path, mount_factory):
    import fsspec
    import zarr

    path = tmp_path / "repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    session = repo.writable_session("main")
    zarr.open_group(session.store, mode="w").create_array("x", data=np.arange(4, dtype="i4"))
    first = session.commit("first")
    repo.create_tag("v1", first)
    session = repo.writable_session("main")
    zarr.open_array(session.store, path="x", mode="r+")[:] = 7
    session.commit("second")

    at = f"icechunk://{path}"
    np.testing.assert_array_equal(zarr.open_array(f"{at}@tag.v1/x", mode="r")[:], np.arange(4))
    np.testing.assert_array_equal(zarr.open_array(f"{at}@{first}/x", mode="r")[:], np.arange(4))
    np.testing.assert_array_equal(zarr.open_array(f"{at}@branch.main/x", mode="r")[:], [7] * 4)
    fs, tag = fsspec.core.url_to_fs(f"{at}@tag.v1")
    with pytest.raises(PermissionError) as err:
        fs.pipe_file(f"{tag}/x/zarr.json", b"{}")
    assert err.value.errno == errno.EROFS
    with pytest.raises(Exception, match=r"the tag is named twice \(@tag... and \?tag=\)$") as err:
        fsspec.core.url_to_fs(f"{at}@tag.v1/x?tag=v2")[0].cat_file(f"{tag}/x/zarr.json")
    assert err.value.__cause__ is None
    # a write by URL to a branch is committed when the filesystem closes
    fs, main = fsspec.core.url_to_fs(f"{at}@branch.main")
    zarr.open_group(f"{at}@branch.main", mode="a").create_array("y", data=np.ones(3, dtype="u1"))
    fs.close()
    assert "y" in zarr.open_group(_repo(path).readonly_session(branch="main").store, mode="r")

    m = mount_factory(f"{at}@tag.v1")
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "x"), mode="r")[:], np.arange(4))
    assert "Icechunk tag v1" in zarrfs("status", str(m.path)).stdout
