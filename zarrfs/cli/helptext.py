"""The text of ``zarrfs --help``: synopsis, URL schemes, mount options, exit statuses."""

DRIVERS = "LMDB, SQLite, Redis, Redis Cluster, PostgreSQL, DBM"
DESCRIPTION = (
    f"Mount a key/value database ({DRIVERS}) as a folder that behaves like a Zarr DirectoryStore."
)
SYNOPSIS = """\
zarrfs mount URL MOUNTPOINT [-o OPT[,OPT...]] [-f] [--log-file FILE] [--log-level LEVEL]
       zarrfs URL MOUNTPOINT [-o OPT[,OPT...]]      (the same: the form /etc/fstab uses)
       zarrfs umount [-z] MOUNTPOINT | -a
       zarrfs status [--json] [MOUNTPOINT]
       zarrfs stats [-i SECONDS] [-n N] MOUNTPOINT | --prometheus [MOUNTPOINT]
       zarrfs commit MOUNTPOINT -m MESSAGE [--rebase | --branch NAME]
       zarrfs check [--warnings] [--repair] URL
       zarrfs copy [--if-exists replace|skip|raise] [--resume] [--dry-run] [--validate]
                   [--progress | --no-progress] SOURCE DEST
       zarrfs consolidate URL|FOLDER
       zarrfs reindex URL
       zarrfs -V | --version"""

URLS_HELP = """\
database URLs:
  lmdb:///abs/path/db.lmdb    LMDB (the default: a bare path is an LMDB path too)
  sqlite:///abs/path/db.sqlite
                              SQLite
  redis://[user[:password]@]host:port/db?prefix=zarr
                              Redis over TCP (rediss://... over TLS)
  unix:///path/redis.sock?db=0&prefix=zarr
                              Redis over a unix socket
  redis+cluster://host:port,host:port/?prefix=zarr
                              Redis Cluster: one hierarchy per hash tag {prefix}
  valkey://, valkeys://, valkey+cluster://   Valkey, the same as the redis schemes
  zip:///abs/path/data.zip    a zarr-python 2 or 3 ZipStore archive, read-only
  icechunk:///abs/path/repo?branch=main   (or ?tag=NAME, ?snapshot=ID)
                              an Icechunk repository; a branch commits with zarrfs commit
  postgresql://user@host:port/dbname?table=zarr
                              PostgreSQL (postgres:// too; needs pip install zarrfs[postgres])
  dbm:///abs/path/db          DBM (zarr-python 2's DBMStore)
  memory://name               in-process, for tests
  Relative paths are resolved against the current folder (lmdb://rel/db.lmdb, or a bare
  path); lmdb:/abs/db.lmdb (one slash) is absolute. A path that is not a database of that
  kind (a Zarr folder, another file) is never written into; -o create makes a new database
  only at a new path, in an empty folder or an empty file. A Redis password may also come
  from ?password_file=PATH or the environment variable ZARRFS_PASSWORD (else REDISCLI_AUTH,
  as redis-cli reads it); it never shows in ps, the mount table, the logs or zarrfs status.
"""

OPTIONS_HELP = """\
mount options (-o OPT[,OPT...]):
  ro, rw                      read-only (writes fail with EROFS) or read-write (default)
  create                      create the database if it does not exist
  nonempty                    mount over a folder that has files in it (they are hidden)
  validate=strict|warn|off    Zarr metadata and chunk-key checks on commit (strict)
  view=raw|decoded            decoded: chunks show as their decoded bytes (raw)
  consolidate=auto|live|off   keep consolidated metadata in step (auto)
  cache_timeout=SECONDS       kernel entry/attribute/negative cache lifetime (3600 when
                              the database has a change feed, else 1); or
  entry_timeout=, attr_timeout=, negative_timeout=   one of them alone
  dir_cache=SECONDS           lifetime of a busy folder's snapshot (cache_timeout, or 1; 0 = off)
  dir_cache_entries=N         entries the folder snapshots hold together (65536)
  feed=0                      do not follow other writers' changes (short cache times)
  spill=BYTES                 an open file's buffer size before it spills to disk (64M;
                              K/M/G suffixes; an unlinked file in $TMPDIR, else /tmp)
  parts_above=BYTES           files larger than this are stored in parts (64M; K/M/G suffixes)
  spin=MICROSECONDS           request loop polling before it sleeps (200; 0 = never)
  workers=N                   request threads (16 on a database server; 1 = one thread, as
                              a database file always has)
  timeout=SECONDS             longest wait on a database server, or on a database another
                              program holds locked; then ETIMEDOUT (10)
  readahead=KiB               kernel read-ahead of the mount (1024; 0 = leave it)
  chunks_ahead=N              chunks read ahead of a reader in grid order (8; 0 = off; on
                              PostgreSQL, set: their content too, not only their sizes)
  direct_above=BYTES          a file this large read for the first time skips the page cache
                              (64K; off = never)
  uid=N, gid=N                owner shown for files and folders with none recorded
                              (default: the user who mounts)
  umask=OCTAL                 permission bits removed from files and folders with no
                              recorded mode (022)
  snapshot, snapshot=NAME     one committed state of an LMDB, SQLite or PostgreSQL database,
                              read-only (NAME: a PostgreSQL exported snapshot)
  snapshot_hold=SECONDS       longest a snapshot is held, then unmounted (3600; 0 = no limit)
  allow_other                 let every user in; turns on default_permissions
  allow_root                  let root in besides the owner; turns on default_permissions
  no_default_permissions      with allow_other/allow_root: no permission checks by the kernel
  default_permissions, fsname=, subtype=, auto_unmount, noexec, exec, nosuid, nodev,
  noatime, nodiratime, sync, async, dirsync, max_read=, blksize=, context=, fscontext=,
  defcontext=, rootcontext=, debug
                              handed to libfuse
  defaults, _netdev, auto, noauto, user, users, nouser, owner, group, nofail, dev, suid,
  atime, relatime, strictatime, lazytime, loop, x-*, comment=, helper=
                              ignored (fstab and mount(8) options; the mount is always
                              nodev,nosuid)
"""

EXIT_HELP = """\
exit status:
  0  success
  1  failure: the database, the mountpoint or the mount (missing, busy, refused, not
     mounted, unreachable); check: problems found
  2  usage: unknown command or option, missing argument, bad option value

/etc/fstab:  URL  MOUNTPOINT  fuse.zarrfs  defaults,_netdev[,opts]  0  0
  (mount.fuse3 runs "zarrfs URL MOUNTPOINT -o OPTS", which is "zarrfs mount ...")
"""

# The README's command-line reference is these texts, between these two lines, written by
# ``python -m zarrfs.cli.helptext README.md``; tests/cli/test_readme.py fails when they differ.
README_BEGIN = "<!-- zarrfs --help, written by: python -m zarrfs.cli.helptext README.md -->"
README_END = "<!-- end of zarrfs --help -->"


def readme_block() -> str:
    """The README's command-line reference: the synopsis, mount options and exit statuses of
    ``zarrfs --help``, word for word, so that the two cannot disagree."""
    body = "\n".join(["usage: " + SYNOPSIS, "", OPTIONS_HELP.rstrip("\n"), "", EXIT_HELP.rstrip("\n")])
    return f"{README_BEGIN}\n```\n{body}\n```\n{README_END}"


def with_readme_block(readme: str) -> str:
    """``readme`` with its command-line reference replaced by :func:`readme_block`."""
    start, end = readme.index(README_BEGIN), readme.index(README_END) + len(README_END)
    return readme[:start] + readme_block() + readme[end:]


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if README_BEGIN not in text or README_END not in text:
            where = f"{README_BEGIN}\n{README_END}"
            sys.exit(f"{path}: no command-line block; put these two lines where it goes:\n{where}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(with_readme_block(text))
