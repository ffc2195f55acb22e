"""The Redis driver's commit: a transaction's buffered writes as one ``MULTI``/``EXEC`` (one
round trip), after the checks of the answers it guessed (``guesses``) when it took any
(:data:`CHECK`, in the same round trip); over ``maxmemory``, its removals as a script, so that cleanup stays
possible on a full server."""

from __future__ import annotations

import logging
from typing import Any

from ..base import RetryableError, Space, StorageFullError
from ..buffered import DELETED
from .guesses import Guesses, Taken
from .link import BIG_ARG, Link, translate
from .url import KeyNames

log = logging.getLogger("zarrfs.backends.redis")


def commit(
    link: Link,
    pending: dict[tuple[Space, bytes], Any],
    keys: KeyNames,
    where: str,
    guesses: Guesses | None = None,
) -> None:
    """Send ``pending`` (values, or ``DELETED``) and the index changes they make in one
    ``MULTI``/``EXEC`` on ``link``; a watched key changed meanwhile is a :class:`RetryableError`.
    ``keys`` names the keys, ``where`` the database in messages; ``guesses`` is told what was
    written."""
    writes, big, added, (deleted, removed) = _writes(pending, keys)
    commands = [("MULTI",), *writes, ("EXEC",)]
    replies = link.call(commands, big=big)
    for reply in replies[:-1]:
        if isinstance(reply, Exception):  # refused while queueing, e.g. OOM
            error = translate(reply, where)
            if isinstance(error, StorageFullError) and not added:
                # Over maxmemory, Redis refuses every command queued in a MULTI, even a
                # DEL; a script may still delete. Removals then win over a concurrent
                # change of the same keys (no WATCH): cleanup stays possible.
                link.checked([removal(deleted, removed)])
                if guesses is not None:
                    guesses.wrote(pending, keys.name, keys.index)
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
    if guesses is not None:
        guesses.wrote(pending, keys.name, keys.index)


def _writes(
    pending: dict[tuple[Space, bytes], Any], keys: KeyNames
) -> tuple[list[tuple[Any, ...]], bool, bool, tuple[list[bytes], dict[bytes, list[bytes]]]]:
    """The commands that store ``pending`` and the index changes it makes; whether a value is
    long (the encoding then sends it apart: ``link``); whether any value is added; the names
    deleted and the index members removed."""
    commands: list[tuple[Any, ...]] = []
    added: dict[bytes, list[Any]] = {}
    removed: dict[bytes, list[bytes]] = {}
    deleted: list[bytes] = []
    big = False
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
    return commands, big, bool(added), (deleted, removed)


# The checks of a commit of guessed reads (``guesses``), sent between the WATCH of the keys
# it reads and the MULTI/EXEC of the writes: 1 when every answer holds; else 0, and a write of
# KEYS[1] (the guard, watched too) makes the EXEC write nothing. ARGV[1] and ARGV[2] count the
# names and ranges checked, KEYS[2..] name them in that order: a name's check is its value's
# SHA-1, ``#n`` (its length) or ``-`` (absent); a range's, its query's bounds and limit, then
# the count and members it answered. The writes stay plain commands of the MULTI: the server
# reports a script's writes to the writer's own change feed (NOLOOP holds only for a client's
# own commands), which would take them for another client's.
CHECK = """
local function holds()
  local k, a = 2, 3
  for i = 1, tonumber(ARGV[1]) do
    local key, want = KEYS[k], ARGV[a]
    k, a = k + 1, a + 1
    if want == '-' then
      if redis.call('EXISTS', key) == 1 then return false end
    elseif string.sub(want, 1, 1) == '#' then
      if redis.call('EXISTS', key) == 0 or redis.call('STRLEN', key) ~= tonumber(string.sub(want, 2)) then
        return false
      end
    else
      local v = redis.call('GET', key)
      if not v or redis.sha1hex(v) ~= want then return false end
    end
  end
  for i = 1, tonumber(ARGV[2]) do
    local got = redis.call('ZRANGEBYLEX', KEYS[k], ARGV[a], ARGV[a + 1], 'LIMIT', 0, ARGV[a + 2])
    local n = tonumber(ARGV[a + 3])
    if #got ~= n then return false end
    for j = 1, n do
      if got[j] ~= ARGV[a + 3 + j] then return false end
    end
    k, a = k + 1, a + 4 + n
  end
  return true
end
local ok, good = pcall(holds)
if ok and good then return 1 end
redis.call('SET', KEYS[1], '1', 'PX', 10000)
return 0
"""


def guesses_for(client: Any, where: str) -> Guesses | None:
    """A writable driver's :class:`Guesses`, when the server runs scripts: the writes of a
    commit go through even if its checks are refused (an ACL without EVAL), so it is seen
    once, at the open, that they would run."""
    try:
        if client.eval("return 1", 0) == 1:
            return Guesses()
    except Exception as exc:
        log.warning("%s: commits read before they write (the server runs no script: %s)", where, exc)
    return None


def guessed(
    link: Link,
    pending: dict[tuple[Space, bytes], Any],
    keys: KeyNames,
    where: str,
    guesses: Guesses,
    taken: Taken,
) -> bool:
    """Commit ``pending`` after the checks of the answers ``taken`` (see :data:`CHECK`), all in
    one round trip. False when a guess was wrong, or the server refused the writes (over
    maxmemory): nothing was written, and the transaction runs again reading for real. Another
    client's change of a key between the checks and the EXEC is a :class:`RetryableError`, as
    a watched key's is for :func:`commit`."""
    check_keys, check_args, names, ranges = taken.checks()
    writes, big, _, _ = _writes(pending, keys)
    guard = keys.guard
    sent = [
        ("WATCH", guard, *check_keys),
        ("EVAL", CHECK, 1 + len(check_keys), guard, *check_keys, names, ranges, *check_args),
        ("MULTI",),
        *writes,
        ("EXEC",),
    ]
    replies = link.call(sent, big=big)
    held, result = replies[1], replies[-1]
    if isinstance(result, list):
        if held != 1:  # the checks did not run (refused), and could not stop the writes
            guesses.usable = False
            log.error("%s: a commit's checks were refused (%s); its writes went through", where, held)
        for reply in result:
            if isinstance(reply, Exception):
                raise translate(reply, where)
        guesses.wrote(pending, keys.name, keys.index, taken)
        return True
    if held == 0:
        return False
    if result is None:
        raise RetryableError(f"{where}: write conflict (a watched key changed)")
    # Refused while queueing: a full server (the run again meets it as it always did), or
    # what any commit hears (a moved slot), raised as such.
    refused = [r for r in replies[:-1] if isinstance(r, Exception)]
    if any(str(r).startswith("OOM") for r in refused):
        return False
    raise translate(refused[0] if refused else result, where)


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
