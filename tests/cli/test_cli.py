"""Command-line pieces that need no mount: reindex, copy, and every way a command is refused
(one line, exit status 1 or 2, never a traceback, nothing written where it should not be)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from mounting import unavailable

from zarrfs.backends import open_driver

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def zarrfs(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": CHECKOUT}  # this checkout's zarrfs from any folder
    return subprocess.run(
        [sys.executable, "-m", "zarrfs", *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
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


def test_reindex_builds_a_missing_index_once_showing_its_progress_on_a_terminal(tmp_path):
    """A ``RedisStore`` database of 10^7 keys has no index: ``zarrfs reindex`` builds it in one
    scan of the keyspace (the open does not build it first, unseen, to scan again after) and
    on a terminal shows each pass's progress. Its own redis-server: SCANs are counted there."""
    import fcntl
    import pty
    import struct
    import termios

    from conftest import start_redis, stop_redis

    from zarrfs.backends.redis.index import scan_keyspace
    from zarrfs.backends.redis.url import KeyNames

    server = start_redis(str(tmp_path))
    try:
        client = server.client()
        pipe = client.pipeline(transaction=False)
        for i in range(30_000):
            pipe.set(f"zarr:arr/{i}", b"v")  # as zarr-python 2's RedisStore writes
        pipe.execute()

        def scans() -> int:
            return client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)

        before = scans()
        assert sum(1 for _ in scan_keyspace(client, KeyNames("zarr"), "test")) == 30_000
        one_pass = scans() - before
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        before = scans()
        proc = subprocess.Popen(
            [sys.executable, "-m", "zarrfs", "reindex", server.url(0)],
            stderr=slave, env={**os.environ, "PYTHONPATH": CHECKOUT},
        )
        os.close(slave)
        said = b""
        while True:
            try:
                got = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not got:
                break
            said += got
        os.close(master)
        assert proc.wait() == 0, said[-500:]
        # One pass, and the look for a key under the prefix before anything is made there
        # (nothing is made without -o create): a SCAN or two that stop at the first key.
        assert scans() - before <= one_pass + 2, (scans() - before, one_pass)
        assert b"indexing" in said and b"pruning" in said and b"indexed 30000 keys" in said, said[-500:]
        with open_driver(server.url(0)) as driver:
            assert len(driver.scan("arr/", "arr0")) == 30_000
    finally:
        stop_redis(server)


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


def test_mount_help_gives_the_request_threads_the_daemon_uses_by_default():
    from zarrfs.fuse.workers import DEFAULT_WORKERS

    line = next(line for line in zarrfs("mount", "--help").stdout.splitlines() if "workers=N" in line)
    assert f"({DEFAULT_WORKERS} on a database server" in line, line


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


def test_a_daemon_that_ends_without_a_word_is_reported_with_its_status_and_its_log(tmp_path):
    """A daemon that exits before it is ready and says nothing on stderr (killed, or its
    Python ended by something of its own) is reported with its status and where its log is,
    not as "the daemon did not start"."""
    site = tmp_path / "site"
    site.mkdir()
    # Only the daemon (started with --ready-fd) ends at once; the mount command runs on.
    (site / "sitecustomize.py").write_text('import os, sys\nif "--ready-fd" in sys.argv:\n    os._exit(3)\n')
    (tmp_path / "m").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([CHECKOUT, str(site)])}
    db, where = f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m")
    args = [sys.executable, "-m", "zarrfs", "mount", db, where, "-o", "create"]
    logged = subprocess.run([*args, "--log-file", f"{tmp_path}/log"], capture_output=True, text=True, env=env)
    line = one_line(logged, 1, "the daemon exited (status 3) before it was ready")
    assert line.endswith(f"see {tmp_path / 'log'}"), line
    plain = subprocess.run(args, capture_output=True, text=True, env=env)
    assert one_line(plain, 1).endswith("run it with -f to see why")
    assert not os.path.ismount(tmp_path / "m")


def test_a_line_for_a_person_escapes_control_characters_and_keeps_the_rest():
    from zarrfs.lines import one_line

    assert one_line("a\nb\tc\rd\x1b[31m\x00\x7f\x85") == "a\\nb\\tc\\rd\\x1b[31m\\x00\\x7f\\x85"
    assert one_line("plain é 中 \\ \u00a0") == "plain é 中 \\ \u00a0"


def test_a_newline_or_an_escape_sequence_in_a_path_stays_on_the_error_line(tmp_path):
    # A URL's %0A made the one line of an error two; %1B wrote an escape sequence to the terminal.
    (tmp_path / "m").mkdir()
    result = zarrfs("mount", f"lmdb://{tmp_path}/a%0Ab%1B[31m", str(tmp_path / "m"))
    line = one_line(result, 1, "does not exist")
    assert f"{tmp_path}/a\\nb\\x1b[31m" in line and "\x1b" not in line, line


def test_check_writes_each_problem_on_one_line_whatever_its_key_holds(tmp_path):
    driver = open_driver(f"lmdb://{tmp_path}/db.lmdb")
    driver.transact(lambda t: [t.put(k, b"{bad") for k in ("x\ny/.zarray", "e\x1b[31m/.zarray")])
    driver.close()
    result = zarrfs("check", f"lmdb://{tmp_path}/db.lmdb")
    assert result.returncode == 1 and "\x1b" not in result.stdout, result.stdout
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("error: ") for ln in lines), lines
    assert "error: x\\ny/.zarray: zarray.invalid" in lines[1], lines


def test_check_of_a_missing_database_does_not_suggest_create(tmp_path):
    line = one_line(zarrfs("check", f"sqlite://{tmp_path}/absent.sqlite"), 1, "does not exist")
    assert "create" not in line
    assert not (tmp_path / "absent.sqlite").exists()


def test_umount_of_what_is_not_mounted(tmp_path):
    one_line(zarrfs("umount", str(tmp_path)), 1, "is not mounted")
    one_line(zarrfs("umount", str(tmp_path / "absent")), 1, "does not exist")


# --- copy -------------------------------------------------------------------------------------


def test_umount_leaves_a_mount_that_is_not_zarrfs_alone(tmp_path):
    """A bind mount (ext4, tmpfs...) is refused by ``zarrfs umount``, and stays mounted."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    (tmp_path / "b").mkdir()
    script = 'mount --bind "$0" "$0" || exit 99; "$@"; s=$?; mountpoint -q "$0" && echo still; exit $s'
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(tmp_path / "b"),
         sys.executable, "-m", "zarrfs", "umount", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    if result.returncode == 99:
        pytest.skip(f"no private bind mount here: {result.stderr.strip()}")
    one_line(result, 1, "is not a zarrfs mount", "umount(8)")
    assert result.stdout.strip() == "still"


def test_copy_of_a_missing_source_creates_nothing(tmp_path):
    for source in (str(tmp_path / "absent"), f"lmdb://{tmp_path}/absent.lmdb", f"sqlite://{tmp_path}/a.sqlite"):
        for dest in (f"lmdb://{tmp_path}/out.lmdb", str(tmp_path / "out")):
            one_line(zarrfs("copy", source, dest), 1, "does not exist")
            assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_copy_onto_itself_or_onto_a_file_is_one_line_and_a_bare_lmdb_path_is_the_database(tmp_path):
    """``copy X X`` said "already open read-only in this process"; a file as the destination
    gave a raw "[Errno 20] Not a directory"; a bare path to an LMDB database (the database, to
    every other command) was copied as a folder: data.mdb and lock.mdb as keys."""
    src = tmp_path / "src"
    src.mkdir()
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    for url in (f"lmdb://{tmp_path}/db.lmdb", f"sqlite://{tmp_path}/db.sqlite"):
        assert zarrfs("copy", str(src), url).returncode == 0
    (tmp_path / "notes.txt").write_text("text")
    before = snapshot(tmp_path)
    for source, dest in (("lmdb://db.lmdb", "lmdb://db.lmdb"), ("lmdb://db.lmdb", "db.lmdb"),
                         ("sqlite://db.sqlite", f"sqlite://{tmp_path}/db.sqlite"), ("src", "./src/"),
                         ("db.lmdb/data.mdb", "lmdb://db.lmdb")):
        one_line(zarrfs("copy", source, dest, cwd=tmp_path), 1, "are the same", "nothing to copy")
    one_line(zarrfs("copy", "src", "src/inner", cwd=tmp_path), 1, "inside the source folder")
    for dest in ("notes.txt", "notes.txt/x"):
        line = one_line(zarrfs("copy", "lmdb://db.lmdb", dest, cwd=tmp_path), 1, "is a file, not a folder")
        assert "Errno" not in line
    one_line(zarrfs("copy", "src", "db.sqlite", cwd=tmp_path), 1, "is a SQLite database",
             f"sqlite://{tmp_path}/db.sqlite")
    assert snapshot(tmp_path) == before
    assert zarrfs("copy", "db.lmdb", "out", cwd=tmp_path).returncode == 0
    assert snapshot(tmp_path / "out") == {".zgroup": b'{"zarr_format": 2}'}


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


# --- the first hour: commands that must not surprise ------------------------------------------

COMMAND_NAMES = ("mount", "umount", "status", "check", "copy", "consolidate", "reindex")


def test_a_mistyped_command_is_never_a_database(tmp_path):
    (tmp_path / "mnt/x").mkdir(parents=True)
    for args, guess in ((["unmount", "mnt/x"], "umount"), (["statuss"], "status"), (["list"], None)):
        line = one_line(zarrfs(*args, cwd=tmp_path), 2, f"unknown command '{args[0]}'", *COMMAND_NAMES)
        assert guess is None or f"did you mean '{guess}'" in line
        assert "does not exist" not in line and "MOUNTPOINT" in line
    # the hint the old message gave, followed: still nothing is created
    one_line(zarrfs("unmount", "mnt/x", "-o", "create", cwd=tmp_path), 2, "unknown command")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]


def test_every_usage_error_names_the_commands(tmp_path):
    for args in (["mount"], ["mount", "db.lmdb"], ["copy", "a"], ["status", "--bogus"], ["check"], []):
        one_line(zarrfs(*args, cwd=tmp_path), 2, *COMMAND_NAMES)


def test_version_help_and_synopsis():
    for flag in ("-V", "-v", "--version"):
        result = zarrfs(flag)
        assert result.returncode == 0 and result.stdout.startswith("zarrfs "), result
    text = zarrfs("--help").stdout
    usage = text.split("\n\n")[0]
    for command in COMMAND_NAMES:
        assert f"zarrfs {command}" in usage, command
    for scheme in ("postgresql://", "dbm://", "redis+cluster://"):
        assert scheme in text
    assert "LMDB, SQLite, Redis, Redis Cluster, PostgreSQL, DBM" in text
    assert "nonempty" in text


ZARR_FOLDER = {".zgroup": b'{"zarr_format": 2}', "a/.zarray": b"{}", "a/0": b"\0" * 8}


def zarr_folder(where) -> dict:
    for key, value in ZARR_FOLDER.items():
        (where / key).parent.mkdir(parents=True, exist_ok=True)
        (where / key).write_bytes(value)
    return snapshot(where)


def snapshot(where) -> dict:
    return {str(p.relative_to(where)): p.read_bytes() for p in sorted(where.rglob("*")) if p.is_file()}


def test_a_folder_that_is_not_a_database_is_never_written_into(tmp_path):
    (tmp_path / "m").mkdir()
    data = tmp_path / "climate.zarr"
    before = zarr_folder(data)
    mnt = str(tmp_path / "m")
    for opts in ([], ["-o", "ro"]):
        line = one_line(zarrfs("mount", str(data), mnt, *opts), 1, str(data), "not an LMDB database")
        assert "zarrfs copy" in line  # what to do with a Zarr folder
    one_line(zarrfs("mount", str(data), mnt, "-o", "create"), 1, "-o create makes a new database only")
    one_line(zarrfs("check", str(data)), 1, "not an LMDB database")
    one_line(zarrfs("copy", str(tmp_path / "m"), f"lmdb://{data}"), 1, "not an LMDB database")
    assert snapshot(data) == before
    # a file of another kind, for each file driver
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    for url, kind in ((f"sqlite://{text}", "SQLite"), (f"lmdb://{text}", "LMDB"), (f"dbm://{text}", "DBM")):
        one_line(zarrfs("mount", url, mnt, "-o", "create"), 1, str(text))
        one_line(zarrfs("check", url), 1, f"not a {kind}" if kind != "LMDB" else "not an LMDB")
    assert text.read_text() == "not a database"
    one_line(zarrfs("mount", f"sqlite://{tmp_path}", mnt), 1, "a folder", "not a SQLite database")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["climate.zarr", "m", "notes.txt"]


def test_a_database_of_another_kind_is_named_with_its_url(tmp_path):
    """A bare s.sqlite (a bare path is LMDB) said only "not an LMDB database"."""
    src = tmp_path / "src"
    src.mkdir()
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    (tmp_path / "m").mkdir()
    for url in (f"sqlite://{tmp_path}/s.sqlite", f"lmdb://{tmp_path}/l.lmdb"):
        assert zarrfs("copy", str(src), url).returncode == 0
    for args, words in (
        (["check", "s.sqlite"], ["not an LMDB database", f"a SQLite database, whose URL is sqlite://{tmp_path}/"]),
        (["mount", "s.sqlite", "m", "-o", "create"], [f"sqlite://{tmp_path}/s.sqlite"]),
        (["copy", "src", "lmdb://s.sqlite"], [f"sqlite://{tmp_path}/s.sqlite"]),
        (["check", "sqlite://l.lmdb"], [f"an LMDB database, whose URL is lmdb://{tmp_path}/l.lmdb"]),
    ):
        one_line(zarrfs(*args, cwd=tmp_path), 1, *words)


def test_an_empty_folder_needs_create_and_is_named_once(tmp_path):
    (tmp_path / "m").mkdir()
    empty = tmp_path / "emptydir"
    empty.mkdir()
    line = one_line(zarrfs("mount", str(empty), str(tmp_path / "m"), "-o", "ro"), 1, "is an empty folder")
    assert line.count(str(empty)) == 1 and "No such file" not in line
    line = one_line(zarrfs("mount", str(empty), str(tmp_path / "m")), 1, "is an empty folder", "-o create")
    one_line(zarrfs("check", str(empty)), 1, "is an empty folder")
    assert list(empty.iterdir()) == []


def test_one_slash_urls_and_relative_dbm_resolve_before_anything_opens(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    # lmdb:/abs (one slash) is the absolute path, not a folder named "lmdb:" here
    assert zarrfs("copy", str(src), f"lmdb:{tmp_path}/one.lmdb", cwd=tmp_path).returncode == 0
    assert (tmp_path / "one.lmdb" / "data.mdb").exists() and not (tmp_path / "lmdb:").exists()
    assert zarrfs("check", f"lmdb:{tmp_path}/one.lmdb").returncode == 0
    # dbm://rel is relative to the caller's folder, for every command
    (tmp_path / "db").mkdir()
    assert zarrfs("copy", str(src), "dbm://db/d.dbm", cwd=tmp_path).returncode == 0
    result = zarrfs("check", "dbm://db/d.dbm", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert zarrfs("copy", "dbm://db/d.dbm", "out", cwd=tmp_path).returncode == 0
    assert (out / ".zgroup").read_bytes() == b'{"zarr_format": 2}'


def read_only(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``zarrfs ARGS`` with ``tmp_path`` bound read-only over itself (a private mount namespace)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    result = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", script, str(tmp_path), sys.executable, "-m",
         "zarrfs", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    if "unshare failed" in result.stderr or "mount:" in result.stderr:
        pytest.skip(f"no private read-only bind mount here: {result.stderr.strip()}")
    return result


def test_databases_on_read_only_media(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    for url in (f"lmdb://{tmp_path}/db.lmdb", f"sqlite://{tmp_path}/db.sqlite"):
        assert zarrfs("copy", str(src), url).returncode == 0
    (tmp_path / "m").mkdir()
    # writable mount of read-only media: one line saying -o ro
    one_line(read_only(tmp_path, "mount", f"lmdb://{tmp_path}/db.lmdb", str(tmp_path / "m")), 1,
             "read-only file system", "-o ro")
    # SQLite (WAL) on read-only media is read: checked and copied from
    result = read_only(tmp_path, "check", f"sqlite://{tmp_path}/db.sqlite")
    assert result.returncode == 0, result.stderr
    result = read_only(tmp_path, "copy", f"sqlite://{tmp_path}/db.sqlite", "/dev/shm/zarrfs-ro-copy-test")
    try:
        assert result.returncode == 0, result.stderr
    finally:
        import shutil

        shutil.rmtree("/dev/shm/zarrfs-ro-copy-test", ignore_errors=True)


def as_nobody(*args: str) -> subprocess.CompletedProcess:
    """``zarrfs ARGS`` as the unprivileged user nobody (uid 65534), from ``/``."""
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        unavailable("acting as another user needs root and setpriv (util-linux)")
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "zarrfs",
         *args],
        capture_output=True, text=True, timeout=120, cwd="/", env={**os.environ, "PYTHONPATH": CHECKOUT},
    )


def test_a_database_this_user_may_read_but_not_write():
    """A user who may read an LMDB folder or a SQLite file but not write it (nor its lock file,
    nor the folder) checks it and copies from it (both said "/x/ro.lmdb: /x/ro.lmdb: Permission
    denied"), and a writable mount is refused at once saying -o ro; a 0444 SQLite file of one's
    own mounted read-write, and every close then failed with EROFS."""
    import shutil
    import tempfile
    from pathlib import Path

    shared = Path(tempfile.mkdtemp(prefix="zarrfs-shared-", dir="/tmp"))  # pytest's is root's alone
    try:
        shared.chmod(0o755)
        (shared / "src").mkdir()
        (shared / "src/.zgroup").write_bytes(b'{"zarr_format": 2}')
        mine = shared / "mine"
        (mine / "m").mkdir(parents=True)
        for path in (mine, mine / "m"):
            os.chown(path, 65534, 65534)
        for kind in ("lmdb", "sqlite"):
            url = f"{kind}://{shared}/db.{kind}"
            assert zarrfs("copy", str(shared / "src"), url).returncode == 0
            result = as_nobody("check", url)
            assert result.returncode == 0 and "no problems found" in result.stderr, result.stderr
            assert "Permission denied" not in result.stderr, result.stderr
            result = as_nobody("copy", url, str(mine / f"out-{kind}"))
            assert result.returncode == 0, result.stderr
            assert (mine / f"out-{kind}/.zgroup").read_bytes() == b'{"zarr_format": 2}'
            line = one_line(as_nobody("mount", url, str(mine / "m")), 1, "may read it but not write it",
                            "-o ro")
            assert line.count(str(shared)) == 1, line  # the path once
        own = mine / "own.sqlite"
        assert zarrfs("copy", str(shared / "src"), f"sqlite://{own}").returncode == 0
        os.chown(own, 65534, 65534)
        own.chmod(0o444)
        one_line(as_nobody("mount", f"sqlite://{own}", str(mine / "m")), 1, "own.sqlite: owner", "mode 0444",
                 "-o ro")
        assert not os.path.ismount(mine / "m")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_log_file_in_a_missing_folder_is_refused_before_mounting(tmp_path):
    (tmp_path / "m").mkdir()
    line = one_line(
        zarrfs("mount", str(tmp_path / "db.lmdb"), str(tmp_path / "m"), "-o", "create",
               "--log-file", str(tmp_path / "no/such/zarrfs.log")), 1, "--log-file", "does not exist")
    assert str(tmp_path / "no/such") in line
    assert not os.path.ismount(tmp_path / "m") and not (tmp_path / "db.lmdb").exists()


def test_sizes_take_suffixes_and_a_non_empty_mountpoint_needs_nonempty(tmp_path):
    (tmp_path / "e").mkdir()
    db = str(tmp_path / "absent.lmdb")
    # spill=64M passes the option parser (exit 1: the database is missing, not 2: usage)
    one_line(zarrfs("mount", db, str(tmp_path / "e"), "-o", "spill=64M,parts_above=64M"), 1, "does not exist")
    one_line(zarrfs("mount", db, str(tmp_path / "e"), "-o", "spill=lots"), 2, "spill=")
    (tmp_path / "m").mkdir()
    (tmp_path / "m/file").write_text("x")
    one_line(zarrfs("mount", db, str(tmp_path / "m"), "-o", "create"), 1, "is not empty", "-o nonempty")
    assert not os.path.exists(db)


def test_unknown_url_options_of_redis_and_redis_cluster(redis_server, redis_cluster):
    """The options a Redis URL takes are named, not redis-py's internals (about 60 were)."""
    for url in (redis_server.url(0, bogus="1"), redis_cluster.url(bogus="1")):
        line = one_line(zarrfs("check", url), 1, "unknown option(s) bogus", "known:", "prefix",
                        "password_file")
        known = line.partition("known: ")[2].split(", ")
        assert len(known) <= 15 and not {"command_packer", "event_dispatcher", "retry"} & set(known), line
    one_line(zarrfs("check", redis_server.url(0, prefx="a")), 1, "unknown option(s) prefx",
             "did you mean prefix?")


def test_a_typo_in_a_server_url_makes_nothing_without_create(tmp_path, redis_server, redis_cluster,
                                                             postgres_server):
    """?table=typo on PostgreSQL made two tables and mounted an empty folder; ?prefix=typo on
    Redis wrote zarrfs.index.* keys; redis://host/abc was database 0. Without -o create each is
    one line, and nothing is written."""
    (tmp_path / "m").mkdir()
    typo = f"typo{uuid.uuid4().hex[:8]}"
    urls = {
        postgres_server.url(table=typo): "no table",
        redis_server.url(0, prefix=typo): "no hierarchy with this prefix",
        redis_cluster.url(prefix=typo): "no hierarchy with this prefix",
    }
    try:
        for url, words in urls.items():
            one_line(zarrfs("mount", url, str(tmp_path / "m")), 1, words, "-o create")
            one_line(zarrfs("check", url), 1, words)
            if url.startswith("redis"):
                one_line(zarrfs("reindex", url), 1, words)
    finally:
        if os.path.ismount(tmp_path / "m"):  # the typo was mounted
            zarrfs("umount", str(tmp_path / "m"))
    with postgres_server.connect() as conn:
        made = conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (f"{typo}%",))
    assert made.fetchall() == []
    assert redis_server.client().keys(f"*{typo}*") == []
    assert redis_cluster.client().keys(f"*{typo}*") == []
    where = f"{redis_server.host}:{redis_server.port}"
    one_line(zarrfs("check", f"redis://{where}/abc"), 1, "/abc is not a database number")
    one_line(zarrfs("check", redis_cluster.url().rstrip("/") + "/3"), 1, "database 0 only")
    assert not os.path.ismount(tmp_path / "m")
    # a cluster's hierarchy that exists is reindexed (reindex failed on every cluster)
    with open_driver(redis_cluster.url(prefix=typo)) as driver:
        driver.put("g/a", b"1")
    result = zarrfs("reindex", redis_cluster.url(prefix=typo))
    assert result.returncode == 0 and "indexed 1 keys" in result.stderr, result.stderr


def test_redis_credentials_refused_say_which_were_wrong(redis_server, tmp_path):
    """A password given and refused is not told to give one (it was), nor is one given to a
    server that has none."""
    client = redis_server.client()
    user = f"u{uuid.uuid4().hex[:8]}"
    client.acl_setuser(user, enabled=True, passwords=["+right"], keys=["*"], commands=["+@all"])
    try:
        (tmp_path / "pw").write_text("wrong\n")
        where = f"{redis_server.host}:{redis_server.port}"
        line = one_line(zarrfs("check", f"redis://{user}@{where}/0?password_file={tmp_path}/pw"), 1,
                        "refused the user name and password given")
        assert "wants a password" not in line and "wrong" not in line
        line = one_line(zarrfs("check", f"redis://:given@{where}/0"), 1, "the server has no password")
        assert "given" not in line.replace("password given", "")
    finally:
        client.acl_deluser(user)


def test_a_server_url_with_one_slash_is_not_a_path(tmp_path):
    for url, fixed in (("redis:/localhost:6379", "redis://localhost:6379"),
                       ("postgresql:/db.example/zarr", "postgresql://db.example/zarr"),
                       ("rediss:host:6380/0", "rediss://host:6380/0")):
        for args in (["check", url], ["mount", url, "m"], ["copy", url, "out"]):
            one_line(zarrfs(*args, cwd=tmp_path), 2, f"{url} is not a URL", fixed)
    assert list(tmp_path.iterdir()) == []


def test_copy_resumes_only_what_is_not_whole_and_the_bar_ends_at_100(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(50):
        (src / f"k{i:02d}").write_bytes(bytes([i]) * 1000)
    out = tmp_path / "out"
    out.mkdir()
    for i in range(20):  # an interrupted copy: twenty files whole, one cut short
        (out / f"k{i:02d}").write_bytes(bytes([i]) * 1000)
    (out / "k20").write_bytes(b"\x14" * 10)
    result = zarrfs("copy", "--resume", "--progress", str(src), str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "copied 30 keys (29.3 KiB), skipped 20 that were there already"
    assert "100%" in result.stderr and "50/50 keys" in result.stderr, result.stderr
    assert snapshot(out) == snapshot(src)
    # the same into a database: what is whole there is kept
    url = f"sqlite://{tmp_path}/db.sqlite"
    with _created(url) as driver:
        driver.put("k00", b"\0" * 1000)
        driver.put("k01", b"short")
    result = zarrfs("copy", "--if-exists", "skip", str(src), url)
    assert result.stderr.splitlines()[-1].endswith("skipped 1 that were there already"), result.stderr
    with open_driver(url) as driver:
        assert driver.get("k01") == b"\x01" * 1000


def _created(url: str):
    from zarrfs.dbfiles import open_database
    from zarrfs.options import parse_options

    return open_database(url, parse_options(["create"]))


def test_ctrl_c_in_copy_is_one_line_and_the_copy_resumes(tmp_path):
    import signal

    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"k{i:03d}").write_bytes(os.urandom(64 << 10))
    url = f"lmdb://{tmp_path}/db.lmdb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zarrfs", "copy", "--progress", str(src), url],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    import time

    deadline = time.monotonic() + 60
    while not (tmp_path / "db.lmdb").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    if proc.returncode == 0:
        pytest.skip("the copy ended before the signal came")
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("zarrfs:")]
    assert lines == [lines[0]] and "--resume" in lines[0], err
    result = zarrfs("copy", "--resume", "--progress", str(src), url)
    assert result.returncode == 0, result.stderr
    assert "400/400 keys" in result.stderr and "100%" in result.stderr
    with open_driver(url) as driver:
        assert len(driver.scan()) == 400


def test_bench_workdir_that_does_not_exist_is_one_line(tmp_path):
    bench = os.path.join(CHECKOUT, "scripts", "bench.py")
    result = subprocess.run(
        [sys.executable, bench, "--workdir", str(tmp_path / "absent")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    assert result.returncode in (1, 2), result
    assert "Traceback" not in result.stderr and str(tmp_path / "absent") in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


ERROR_PATHS = [
    [], ["-x"], ["frobnicate"], ["help"],
    ["mount"], ["mount", "db.lmdb"], ["mount", "absent.lmdb", "nodir"], ["mount", "absent.lmdb", "m"],
    ["mount", "lmdb://", "m"], ["mount", "bogus://x", "m"], ["mount", "redis://127.0.0.1:1/0", "m"],
    ["mount", "db.lmdb", "m", "-o", "timeout=0"], ["mount", "db.lmdb", "m", "-o", "uid=x"],
    ["mount", "notes.txt", "m"], ["mount", "db.lmdb", "notes.txt"],
    ["mount", "absent.lmdb", "m", "-o", "ro,create"],
    ["mount", "sqlite://notes.txt", "m"], ["mount", "lmdb://db.lmdb?bogus=1", "m"],
    ["umount"], ["umount", "nodir"], ["umount", "m"], ["umount", "notes.txt"],
    ["status", "nodir"], ["status", "m"], ["status", "a", "b"],
    ["check"], ["check", "absent.lmdb"], ["check", "sqlite://"], ["check", "redis://127.0.0.1:1/0"],
    ["check", "m"], ["check", "notes.txt"], ["check", "bogus://x"],
    ["copy", "absent", "out"], ["copy", "m", "bogus://x"], ["copy", "notes.txt", "out"],
    ["copy", "m", "lmdb://notes.txt"], ["copy", "m", "out", "--if-exists", "maybe"],
    ["consolidate", "absent"], ["consolidate", "redis://127.0.0.1:1/0"], ["consolidate", "notes.txt"],
    ["reindex", "absent.lmdb"], ["reindex", "m"], ["reindex", "redis://127.0.0.1:1/0"],
    ["reindex", "db.lmdb"],
]


def test_every_error_path_of_every_command_is_one_line(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "notes.txt").write_text("text")
    src = tmp_path / "src"
    src.mkdir()
    (src / "k").write_bytes(b"v")
    assert zarrfs("copy", str(src), "lmdb://db.lmdb", cwd=tmp_path).returncode == 0
    for args in ERROR_PATHS:
        result = zarrfs(*args, cwd=tmp_path)
        assert result.returncode in (1, 2), (args, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr and "Error:" not in result.stderr.split(": ", 1)[0], args
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("zarrfs"), (args, result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.lmdb", "m", "notes.txt", "src"]


def test_man_page_and_completion_are_generated_from_the_parser(tmp_path):
    import shutil

    from zarrfs.cli.main import build_parser
    from zarrfs.cli.manpage import subcommands

    page = subprocess.run([sys.executable, "-m", "zarrfs.cli.manpage"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": CHECKOUT}, check=True).stdout
    for name, sub in subcommands(build_parser()).items():
        assert f".SS zarrfs {name}" in page, name
        for action in sub._actions:
            for flag in action.option_strings:
                if action.help != "==SUPPRESS==" and flag not in ("-h", "--help"):
                    assert flag.replace("-", "\\-") in page, (name, flag)
    assert "postgresql://" in page and "NOTIFY_SOCKET" in page
    if shutil.which("man") and shutil.which("groff"):
        (tmp_path / "zarrfs.1").write_text(page)
        shown = subprocess.run(["man", "--warnings", "-l", str(tmp_path / "zarrfs.1")], capture_output=True,
                               text=True, env={**os.environ, "MANWIDTH": "100"})
        assert shown.returncode == 0 and "zarrfs umount" in shown.stdout and shown.stderr == "", shown.stderr
    script = subprocess.run([sys.executable, "-m", "zarrfs.cli.completion", "bash"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": CHECKOUT}, check=True).stdout
    (tmp_path / "zarrfs.bash").write_text(script)
    probe = (
        f'source {tmp_path}/zarrfs.bash; t() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1));'
        ' COMPREPLY=(); _zarrfs; echo "${COMPREPLY[*]}"; }; t zarrfs co; t zarrfs mount db m -o create,val;'
        " t zarrfs copy --if-exists s; t zarrfs mount --log-l"
    )
    said = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout
    said = said.splitlines()
    assert said == ["commit copy consolidate", "create,validate=", "skip", "--log-level"], said
    zsh = subprocess.run([sys.executable, "-m", "zarrfs.cli.completion", "zsh"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": CHECKOUT}, check=True).stdout
    assert zsh.startswith("#compdef zarrfs") and "bashcompinit" in zsh
    # A new shell: bash-completion loads the script by the command's name from where setup.sh
    # puts it (XDG_DATA_DIRS/bash-completion/completions); setup.sh installs bash-completion.
    loader = "/usr/share/bash-completion/bash_completion"
    if not os.path.exists(loader):
        unavailable("bash-completion is not installed (scripts/setup.sh installs it)")
    (tmp_path / "bash-completion/completions").mkdir(parents=True)
    (tmp_path / "zarrfs.bash").rename(tmp_path / "bash-completion/completions/zarrfs")
    probe = f'source {loader}; _completion_loader zarrfs; complete -p zarrfs'
    said = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "XDG_DATA_DIRS": f"{tmp_path}:/usr/share"})
    assert said.returncode == 0 and "_zarrfs" in said.stdout, (said.stdout, said.stderr)


def test_the_store_extra_brings_zarr_3_and_setup_installs_man_completion_and_offers_the_path():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11

    with open(os.path.join(CHECKOUT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert any(dep.startswith("zarr>=3") for dep in project["optional-dependencies"]["store"])
    assert "PostgreSQL" in project["description"] and "DBM" in project["description"]
    with open(os.path.join(CHECKOUT, "scripts", "setup.sh")) as fh:
        setup = fh.read()
    for word in ("zarrfs.cli.manpage", "zarrfs.cli.completion bash", "zarrfs.cli.completion zsh", "--on-path",
                 "/usr/local/bin/zarrfs", "scripts/install_unit.sh", "need+=(bash-completion)"):
        assert word in setup, word
    check = subprocess.run(["bash", "-n", os.path.join(CHECKOUT, "scripts", "setup.sh")], capture_output=True)
    assert check.returncode == 0, check.stderr
