"""Command-line pieces that need no mount: reindex, copy."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from zarrfs.backends import open_driver


def zarrfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120
    )


def test_reindex_lists_keys_another_client_added(redis_server):
    prefix = f"r{uuid.uuid4().hex[:8]}"
    url = redis_server.url(0, prefix=prefix)
    with open_driver(url) as driver:
        driver.put("g/a", b"1")  # the index exists from now on
    redis_server.client().set(f"{prefix}:g/b", b"2")  # as zarr-python 2's RedisStore writes
    with open_driver(url) as driver:
        assert [k for k, _ in driver.scan("g/", "g0")] == ["g/a"]
    result = zarrfs("reindex", url)
    assert result.returncode == 0, result.stderr
    assert "indexed 2 keys" in result.stderr
    with open_driver(url) as driver:
        assert [k for k, _ in driver.scan("g/", "g0")] == ["g/a", "g/b"]


def test_reindex_refuses_a_database_without_an_index(tmp_path):
    open_driver(f"sqlite://{tmp_path}/x.sqlite").close()
    result = zarrfs("reindex", f"sqlite://{tmp_path}/x.sqlite")
    assert result.returncode == 2
    assert "keeps no index" in result.stderr


def test_copy_folder_to_database_and_back(tmp_path):
    src = tmp_path / "src"
    (src / "arr/0").mkdir(parents=True)
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    (src / "arr/0/0").write_bytes(b"\x00\x01")
    url = f"lmdb://{tmp_path}/db.lmdb"
    assert zarrfs("copy", str(src), url).returncode == 0
    with open_driver(url) as driver:
        assert driver.scan(fetch="values") == [(".zgroup", b'{"zarr_format": 2}'), ("arr/0/0", b"\x00\x01")]
    out = tmp_path / "out"
    assert zarrfs("copy", url, str(out)).returncode == 0
    assert (out / "arr/0/0").read_bytes() == b"\x00\x01"


# --- messages and exit statuses (no mount needed) --------------------------------------------


def one_line(result: subprocess.CompletedProcess, status: int, *words: str) -> str:
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_help_is_plain_text_and_lists_schemes_options_and_exit_statuses():
    for args in (["--help"], ["mount", "--help"]):
        result = zarrfs(*args)
        assert result.returncode == 0
        text = result.stdout
        assert "``" not in text and ":func:" not in text
        for scheme in ("lmdb://", "sqlite://", "redis://", "rediss://", "unix://", "memory://"):
            assert scheme in text, scheme
        for option in ("create", "validate=", "allow_root", "no_default_permissions", "uid=N", "umask="):
            assert option in text, option
        assert "exit status" in text and "2  usage" in text
        assert "ZARRFS_PASSWORD" in text and "password_file" in text


def test_bad_option_value_and_unknown_option_exit_2(tmp_path):
    (tmp_path / "m").mkdir()
    db = str(tmp_path / "db.lmdb")
    one_line(zarrfs("mount", db, str(tmp_path / "m"), "-o", "create,validate=sometimes"), 2, "validate=")
    one_line(zarrfs("mount", db, str(tmp_path / "m"), "-o", "create,nosuchopt"), 2, "nosuchopt")
    one_line(zarrfs("mount", db, str(tmp_path / "m"), "-o", "umask=999"), 2, "umask")
    one_line(zarrfs("mount", db), 2, "MOUNTPOINT")  # argparse: a missing argument
    one_line(zarrfs("frobnicate"), 2)
    assert not (tmp_path / "db.lmdb").exists()


def test_missing_mountpoint_and_missing_parent_folder_are_one_line(tmp_path):
    (tmp_path / "m").mkdir()
    one_line(zarrfs("mount", str(tmp_path / "db.lmdb"), str(tmp_path / "absent"), "-o", "create"), 1,
             "does not exist", "absent")
    line = one_line(zarrfs("mount", str(tmp_path / "no/such/db.lmdb"), str(tmp_path / "m"), "-o", "create"),
                    1, "does not exist")
    assert str(tmp_path / "no/such") in line
    assert not (tmp_path / "no").exists()


def test_check_of_a_missing_database_does_not_suggest_create(tmp_path):
    line = one_line(zarrfs("check", f"sqlite://{tmp_path}/absent.sqlite"), 1, "does not exist")
    assert "create" not in line
    assert not (tmp_path / "absent.sqlite").exists()


def test_umount_of_what_is_not_mounted(tmp_path):
    one_line(zarrfs("umount", str(tmp_path)), 1, "is not mounted")
    one_line(zarrfs("umount", str(tmp_path / "absent")), 1, "does not exist")


# --- copy -------------------------------------------------------------------------------------


def test_copy_of_a_missing_source_creates_nothing(tmp_path):
    for source in (str(tmp_path / "absent"), f"lmdb://{tmp_path}/absent.lmdb", f"sqlite://{tmp_path}/a.sqlite"):
        for dest in (f"lmdb://{tmp_path}/out.lmdb", str(tmp_path / "out")):
            one_line(zarrfs("copy", source, dest), 1, "does not exist")
            assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_copy_validate_refuses_a_bad_hierarchy_and_copies_a_good_one(tmp_path):
    src = tmp_path / "src"
    (src / "arr").mkdir(parents=True)
    (src / ".zgroup").write_text('{"zarr_format": 2}')
    (src / "arr/.zarray").write_text(
        '{"zarr_format": 2, "shape": [4], "chunks": [0], "dtype": "<i4", "compressor": null,'
        ' "fill_value": 0, "order": "C", "filters": null}'
    )
    url = f"lmdb://{tmp_path}/db.lmdb"
    line = one_line(zarrfs("copy", "--validate", str(src), url), 1, "arr/.zarray", "nothing was copied")
    assert "chunks" in line
    assert not (tmp_path / "db.lmdb").exists()
    assert zarrfs("copy", str(src), url).returncode == 0  # without --validate it is copied as it is
    fixed = (src / "arr/.zarray").read_text().replace('"chunks": [0]', '"chunks": [2]')
    (src / "arr/.zarray").write_text(fixed)
    (src / "arr/0").write_bytes(b"\0" * 8)
    out = tmp_path / "out"
    assert zarrfs("copy", "--validate", str(src), f"sqlite://{tmp_path}/db.sqlite").returncode == 0
    assert zarrfs("copy", "--validate", f"sqlite://{tmp_path}/db.sqlite", str(out)).returncode == 0
    assert (out / "arr/0").read_bytes() == b"\0" * 8


def test_copy_progress_only_on_request_when_not_a_terminal(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"k{i:03d}").write_bytes(b"x" * 1000)
    quiet = zarrfs("copy", str(src), f"lmdb://{tmp_path}/a.lmdb")
    assert quiet.returncode == 0 and quiet.stderr.splitlines() == ["copied 300 keys (293.0 KiB)"]
    shown = zarrfs("copy", "--progress", f"lmdb://{tmp_path}/a.lmdb", f"sqlite://{tmp_path}/b.sqlite")
    assert shown.returncode == 0, shown.stderr
    assert "300/300 keys" in shown.stderr and "100%" in shown.stderr, shown.stderr
    assert shown.stderr.splitlines()[-1] == "copied 300 keys (293.0 KiB)"


def test_copy_progress_bar_on_a_terminal(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"y" * 5000)
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        os.execv(sys.executable, [sys.executable, "-m", "zarrfs", "copy", str(src), f"lmdb://{tmp_path}/t.lmdb"])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"1/1 keys" in out and b"100%" in out, out
