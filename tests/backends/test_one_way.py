"""One database is never opened two ways at once: a file inside an LMDB folder is that folder,
zarrfs's own bookkeeping files are refused, and a database whose format cannot be shared (DBM,
a zip archive being written) refuses a second driver rather than letting it lose writes."""

from __future__ import annotations

import os
import threading

import pytest
from mounting import eventually, zarrfs

from zarrfs.backends import open_driver
from zarrfs.backends.base import SIDE
from zarrfs.backends.errors import BackendError


def _one_line(result, *words: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _lmdb_keys(folder) -> list[str]:
    with open_driver(f"lmdb://{folder}", readonly=True) as driver:
        return [key for key, _ in driver.scan("")]


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_an_lmdb_folders_data_file_mounts_the_folder(tmp_path, mount_factory):
    db = tmp_path / "db.lmdb"
    a = mount_factory(f"lmdb://{db}", ["create"], name="a")
    (a.path / "made").mkdir()  # an empty folder: a record of the side environment only
    b = mount_factory(f"lmdb://{db}/data.mdb", name="b")
    # The same side environment: the folder made through A, and A's mode, are B's.
    os.chmod(a.path / "made", 0o701)
    eventually(lambda: (b.path / "made").is_dir(), "a folder made through the other mount")
    eventually(lambda: (b.path / "made").stat().st_mode & 0o777 == 0o701, "its mode")
    status = zarrfs("status").stdout
    assert f"{b.path}\tlmdb://{db}\t" in status, status
    errors: list[BaseException] = []

    def writes(mount, tag: str) -> None:
        try:
            for i in range(150):
                with open(mount.path / f"{tag}{i}", "wb") as fh:
                    fh.write(tag.encode() * 100)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=writes, args=(m, t)) for m, t in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    a.stop()
    b.stop()
    keys = _lmdb_keys(db)
    assert len([k for k in keys if k[0] in "ab"]) == 300, len(keys)
    assert [n for n in os.listdir(db) if n.startswith("data.mdb")] == ["data.mdb"]  # no lock of its own


def test_check_and_copy_of_an_lmdb_data_file_read_the_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    db = tmp_path / "db.lmdb"
    assert zarrfs("copy", str(src), f"lmdb://{db}").returncode == 0
    result = zarrfs("check", f"{db}/data.mdb", check=False)
    assert result.returncode == 0, result.stderr
    assert zarrfs("copy", f"lmdb://{db}/data.mdb", str(tmp_path / "out")).returncode == 0
    assert (tmp_path / "out" / ".zgroup").read_bytes() == b'{"zarr_format": 2}'
    assert [n for n in os.listdir(db) if n.startswith("data.mdb")] == ["data.mdb"]  # no lock of its own


def test_zarrfs_bookkeeping_is_never_a_database(tmp_path):
    db = tmp_path / "db.lmdb"
    with open_driver(f"lmdb://{db}") as driver:
        driver.put(".zgroup", b"{}")
        driver.put("k", b"v", SIDE)
    assert (db / "zarrfs-side.mdb").is_file()
    (tmp_path / "m").mkdir()
    try:
        for path in (db / "zarrfs-side.mdb", db / "zarrfs-side.mdb-lock"):
            result = zarrfs("mount", f"lmdb://{path}", str(tmp_path / "m"), check=False)
            _one_line(result, "bookkeeping", str(db))
            _one_line(zarrfs("check", f"lmdb://{path}", check=False), "bookkeeping")
    finally:
        if os.path.ismount(tmp_path / "m"):  # mounted after all: not left behind
            zarrfs("umount", "-z", str(tmp_path / "m"), check=False)
    with pytest.raises(BackendError, match="bookkeeping"):
        open_driver(f"lmdb://{db}/zarrfs-side.mdb")
    assert not os.path.ismount(tmp_path / "m")


def _dbm(tmp_path) -> str:
    url = f"dbm://{tmp_path}/d.dbm"
    with open_driver(url) as driver:
        driver.put(".zgroup", b'{"zarr_format": 2}')
    return url


def test_a_dbm_database_takes_one_writer_and_no_reader_beside_it(tmp_path):
    url = _dbm(tmp_path)
    first = open_driver(url)
    try:
        for readonly in (False, True):
            with pytest.raises(BackendError, match="already open|open for writing") as caught:
                open_driver(url, readonly=readonly)
            assert "\n" not in str(caught.value)
        first.put("a", b"1")
    finally:
        first.close()
    readers = [open_driver(url, readonly=True) for _ in range(2)]  # readers share
    try:
        with pytest.raises(BackendError, match="already open"):
            open_driver(url)
    finally:
        for r in readers:
            r.close()
    with open_driver(url) as again:
        assert again.get("a") == b"1"


@pytest.mark.mount
@pytest.mark.usefixtures("fuse_required")
def test_a_second_mount_of_a_dbm_database_is_refused_and_nothing_is_lost(tmp_path, mount_factory):
    url = _dbm(tmp_path)
    a = mount_factory(url, name="a")
    (tmp_path / "b").mkdir()
    try:
        _one_line(zarrfs("mount", url, str(tmp_path / "b"), check=False), "already open")
        _one_line(zarrfs("mount", url, str(tmp_path / "b"), "-o", "ro", check=False), "open for writing")
    finally:
        if os.path.ismount(tmp_path / "b"):  # mounted after all: not left behind
            zarrfs("umount", "-z", str(tmp_path / "b"), check=False)
    assert not os.path.ismount(tmp_path / "b")
    (a.path / "g").mkdir()
    for i in range(20):
        (a.path / "g" / str(i)).write_bytes(b"%d" % i)
    a.stop()
    with open_driver(url, readonly=True) as driver:
        assert [driver.get(f"g/{i}") for i in range(20)] == [b"%d" % i for i in range(20)]


def test_a_zip_archive_being_written_has_one_writer_and_no_reader(tmp_path):
    url = f"zip://{tmp_path}/a.zip"
    writer = open_driver(url)
    try:
        writer.put(".zgroup", b"{}")
        with pytest.raises(BackendError, match="open for writing|just made"):
            open_driver(url, readonly=True)
        with pytest.raises(BackendError):
            open_driver(url)
    finally:
        writer.close()
    with open_driver(url, readonly=True) as a, open_driver(url, readonly=True) as b:
        assert a.get(".zgroup") == b.get(".zgroup") == b"{}"
