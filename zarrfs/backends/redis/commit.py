"""The Redis driver's commit: a transaction's buffered writes as one ``MULTI``/``EXEC`` (one
round trip), and, over ``maxmemory``, its removals as a script, so that cleanup stays possible
on a full server."""

from __future__ import annotations

from typing import Any

from ..base import RetryableError, Space, StorageFullError
from ..buffered import DELETED
from .link import BIG_ARG, Link, translate
from .url import KeyNames


def commit(link: Link, pending: dict[tuple[Space, bytes], Any], keys: KeyNames, where: str) -> None:
    """Send ``pending`` (values, or ``DELETED``) and the index changes they make in one
    ``MULTI``/``EXEC`` on ``link``; a watched key changed meanwhile is a :class:`RetryableError`.
    ``keys`` names the keys, ``where`` the database in messages."""
    commands: list[tuple[Any, ...]] = [("MULTI",)]
    added: dict[bytes, list[Any]] = {}
    removed: dict[bytes, list[bytes]] = {}
    deleted: list[bytes] = []
    big = False  # only then is the encoding worth splitting around values
    for (space, raw), value in pending.items():
        name, index = keys.name(space, raw), keys.index[space]
        if value is DELETED:
            deleted.append(name)
            removed.setdefault(index, []).append(raw)
        else:
            commands.append(("SET", name, value))
            added.setdefault(index, []).extend((0, raw))
            big = big or len(value) > BIG_ARG
    if deleted:
        commands.append(("DEL", *deleted))
    for index, members in removed.items():
        commands.append(("ZREM", index, *members))
    for index, scored in added.items():
        commands.append(("ZADD", index, *scored))
    commands.append(("EXEC",))
    replies = link.call(commands, big=big)
    for reply in replies[:-1]:
        if isinstance(reply, Exception):  # refused while queueing, e.g. OOM
            error = translate(reply, where)
            if isinstance(error, StorageFullError) and not added:
                # Over maxmemory, Redis refuses every command queued in a MULTI, even a
                # DEL; a script may still delete. Removals then win over a concurrent
                # change of the same keys (no WATCH): cleanup stays possible.
                link.checked([removal(deleted, removed)])
                return
            raise error
    result = replies[-1]
    if result is None:
        raise RetryableError(f"{where}: write conflict (a watched key changed)")
    if isinstance(result, Exception):
        raise translate(result, where)
    for reply in result:
        if isinstance(reply, Exception):
            raise translate(reply, where)


# Deletes KEYS[1..ARGV[1]], then, for each further key (a sorted set), removes the number of
# members ARGV gives next, listed after it.
REMOVE = """
local n = tonumber(ARGV[1])
for i = 1, n do redis.call('DEL', KEYS[i]) end
local j = 2
for i = n + 1, #KEYS do
  local count = tonumber(ARGV[j])
  for m = 1, count do redis.call('ZREM', KEYS[i], ARGV[j + m]) end
  j = j + count + 1
end
return 0
"""


def removal(deleted: list[bytes], removed: dict[bytes, list[bytes]]) -> tuple[Any, ...]:
    """The EVAL of :data:`REMOVE` for these deletes and index removals."""
    keys = [*deleted, *removed]
    argv: list[Any] = [len(deleted)]
    for members in removed.values():
        argv += [len(members), *members]
    return ("EVAL", REMOVE, len(keys), *keys, *argv)
