"""Keeping the kernel's caches right when other writers change the database: for each key the
change feed names, exactly what changed is dropped from the kernel (attributes, pages, entries,
negative entries, link groups) before the next request (docs/architecture.md, "Design notes by
module")."""

from __future__ import annotations

import logging
import select
import stat
import threading
from typing import Any, Protocol

from zarrfs.fs.api import ChangeWatcher, Operations, folders_of, version_mark
from zarrfs.fuse import abi as k
from zarrfs.fuse.handshake import Agreed
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.notify import Invalidator, entry_folder, inval_attrs, inval_entry, inval_inode

log = logging.getLogger("zarrfs.fuse.coherence")

NEGATIVES = 1 << 16
EVICTED = NEGATIVES // 8  # forgotten (and dropped from the kernel) at once when full


class Mount(Protocol):
    """What coherence uses of the session (``fuse.session.Session``): the filesystem, the node
    table (what the kernel holds), the invalidator that writes the notifications, what INIT
    agreed with the kernel (None before INIT: no notification goes out then), and with several
    request threads who runs with whom (``fuse.admission``, else None); ``fd``, its
    ``/dev/fuse`` descriptor."""

    fd: int
    ops: Operations
    inodes: InodeTable
    invalidator: Invalidator
    agreed: Agreed | None
    admission: Any


class Coherence:
    """One mount's link between the change feed and the kernel's caches."""

    def __init__(self, session: Mount, watcher: ChangeWatcher) -> None:
        self.session = session
        self.watcher = watcher
        # Whether lookups answer missing names from what the mount knows (the watcher made the
        # tree follow the feed, which decides it): then a lookup asks the feed first.
        self.names_known = session.ops.knows_names()
        self.negatives: dict[str, None] = {}  # oldest first
        self.polls = 0
        self.dropped = 0  # notifications sent
        self._poller: tuple[int, select.poll] | None = None  # the feed's descriptor, polled
        #: Drops an earlier poll queued and did not see written (its wait cut short by a
        #: request, or a locked poll's entries): a request's poll waits for them too.
        self._unfinished: list[threading.Event] = []

    def negative_time(self, key: str, long: tuple[int, int]) -> tuple[int, int]:
        """How long the kernel may cache "no such file" for ``key``: ``long``, the name
        remembered so that it can be dropped (past :data:`NEGATIVES`, the oldest
        :data:`EVICTED` are dropped from the kernel and forgotten)."""
        negatives = self.negatives
        if len(negatives) >= NEGATIVES and key not in negatives:
            held = self.session.inodes.held
            notes = []
            for old in list(negatives)[:EVICTED]:
                del negatives[old]
                parent, _, name = old.rpartition("/")
                parent_id = held(parent)
                if parent_id is not None:  # else the kernel holds no entry under it
                    notes.append(inval_entry(parent_id, name))
            if notes and self._may_drop():
                self.session.invalidator.post(notes)
        negatives[key] = None
        return long

    def _may_drop(self) -> bool:
        """Whether the kernel takes the notifications (INIT answered, a version that has them)."""
        agreed = self.session.agreed
        return agreed is not None and agreed.inval

    def created(self, key: str) -> None:
        """``key`` was made through this mount: the kernel's entry for it is the file's."""
        self.negatives.pop(key, None)

    def news(self) -> bool:
        """Whether the feed has news waiting (its descriptor is readable; a feed without one
        always may)."""
        fd = self.watcher.fileno()
        if fd is None:
            return True
        if self._poller is None or self._poller[0] != fd:  # made once a descriptor (a reconnect)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self._poller = (fd, poller)
        return bool(self._poller[1].poll(0))

    def poll(self, locked: bool = False, until_request: int | None = None) -> None:
        """Ask the feed; drop what changed from the kernel's caches before the next request
        is served (bounded, see :mod:`zarrfs.fuse.notify`): a client that saw one change (a
        file's new content) must not meet an older state of another name afterwards.
        ``locked``: the request being served holds folders locked in the kernel (a lookup
        its folder, a rename two), or one that does may be waiting for this poll to end:
        a drop of an entry in such a folder cannot be written before that request is
        answered, nor those queued behind it, so no drop of an entry is waited for (they
        are written by a thread of their own, at once, or once that request is answered).
        ``until_request``:
        a poll between requests stops waiting when one comes (``Invalidator.wait``). Either
        way the wait no longer runs out its bound, 100 ms a rename or a lookup after another
        mount's change in its folder."""
        self.polls += 1
        request = not locked and until_request is None  # waits for every drop queued
        keys = self.watcher.poll()
        if keys is not None and not keys:
            if request:
                self.finish()
            return
        admission = self.session.admission
        if admission is not None:  # readers that read before the change run again after it
            admission.restart_readers()
        invalidator = self.session.invalidator
        # Decided and queued in one step: a lock granted meanwhile on the waiters' thread
        # either comes first (its file is then skipped, being bare) or queues its reply after
        # these drops (see zarrfs.fuse.notify); files' attributes are dropped at once.
        with invalidator.order:
            notes = self.everything() if keys is None else self.notes(keys)
            if not notes or not self._may_drop():
                notes = []
            else:
                self.dropped += len(notes)
                if locked:  # its entry drops are not waited for (see above)
                    entries = [n for n in notes if entry_folder(n) is not None]
                    if entries:
                        notes = [n for n in notes if entry_folder(n) is None]
                        self._track(invalidator.enqueue(entries))
            done = invalidator.enqueue(notes) if notes else None
        if request:  # these drops and those not seen written before, under one bound
            if done is not None:
                self._unfinished.append(done)
            self.finish()
        elif done is not None:
            invalidator.wait(done, until_request)
            if not done.is_set():
                self._track(done)

    def _track(self, done: threading.Event) -> None:
        self._unfinished = [e for e in self._unfinished if not e.is_set()] + [done]

    def unfinished(self) -> bool:
        """Whether drops an earlier poll queued are still being written."""
        pending = self._unfinished  # empty but after another mount's change: no generator
        return bool(pending) and any(not e.is_set() for e in pending)

    def finish(self) -> None:
        """Wait for the drops earlier polls queued and did not see written (bounded, as
        :meth:`Invalidator.wait`): a request's poll (an open's, close-to-open) that found
        nothing new must not answer with another mount's change while a drop the same
        change caused (a cached "no such file" of a name it made) is still to be written,
        or a client that saw that change would meet the older state of the other name."""
        pending = self._unfinished
        if pending:
            self._unfinished = []
            self.session.invalidator.wait_all(pending)

    def poll_between(self) -> None:
        """:meth:`poll` between two requests (the loop's idle work): its wait for the drops
        ends when a request comes (with request threads, which read them at once: no drop
        of an entry is waited for)."""
        if self.session.admission is None:
            self.poll(until_request=self.session.fd)
        else:  # a request thread's rename or lookup may wait for this poll's turn to end
            self.poll(locked=True)

    def notes(self, keys: list[str]) -> list[bytes]:
        """The notifications for ``keys`` changed (docs/architecture.md, "Design notes by module")."""
        inodes = self.session.inodes
        held, nodes, find = inodes.held, inodes.nodes, self.session.ops.find
        negatives = self.negatives
        notes: list[bytes] = []
        changed = set(keys)
        targets = changed | folders_of(changed)
        agreed = self.session.agreed
        expire = agreed is not None and agreed.expire
        rewritten = self.watcher.rewritten
        regrouped: set[int] = set()
        for key in sorted(targets):
            nodeid = held(key)
            entry = renew = False
            if nodeid is not None:
                inode = nodes[nodeid]
                if inode.kind == stat.S_IFREG:
                    # Its attributes, at once (the next open decides on its pages: it keeps
                    # none now). None when the kernel holds none since the last drop (a lock
                    # granted, a drop of this feed's): a second drop could make it ignore what
                    # a getattr sent meanwhile answers. Nor when a lock granted since brought
                    # the file up to date and the kernel was shown its stored version: the
                    # change is one made before the grant (the holder's lock keeps others'
                    # writes out), and a drop reaching the kernel while it takes in a
                    # getattr's answer makes it keep the old size, which the lock holder's
                    # next lseek(SEEK_END) then writes at, over another mount's data.
                    # (The grant's mark is taken only when there is something to decide: a
                    # change heard in two looks, the getattr between them, is one change.)
                    if inode.given and not (
                        inodes.granted_since(nodeid) and key and self._shown(key, inode.given)
                    ):
                        notes.append(inval_attrs(nodeid))
                        inode.given = 0
                    inode.heard = True
                elif not inode.bare:  # else dropped, and nothing shown since
                    notes.append(inval_inode(nodeid))  # a folder's kept listing too
                # The stamp stays: what the kernel was last shown, compared with what the next
                # open reads (a reply may have shown it again before this drop was decided).
                inode.stamp_time, inode.cache_ok = 0.0, False
                inodes.xattrs_changed(nodeid)
                if key:
                    node = find(key)
                    entry = node is None or node.kind != inode.kind
                    if inode.group and (entry or node.group != inode.group):
                        # A name of a linked file gone, or no longer one of its names.
                        if nodeid not in regrouped:
                            regrouped.add(nodeid)
                            for name in self.regroup(nodeid, rewritten):
                                if name == key:
                                    entry = True
                                else:
                                    notes += self._entry_of(name)
                    elif node is None and inode.aliases:  # a hard link gone: the file lives on
                        inodes.detach(key)  # under its other names, which the node keeps
                    elif not entry and node.group and not inode.group:  # linked elsewhere:
                        inodes.linked(nodeid, node.group)  # its new names are this node
                    # Its owner or mode may have changed: the kernel checks a chmod or chown
                    # (default_permissions) against the owner it holds, which only a lookup
                    # (the next path walk through the name) or a getattr renews.
                    renew = expire and key in changed
            elif key in negatives:
                del negatives[key]
                entry = True
            elif key in changed and key in inodes.ids:  # a node the kernel forgot, kept for its
                nodeid = inodes.ids[key]  # number: its names must be right when it is
                known = nodes[nodeid]  # looked up again
                if known.group and nodeid not in regrouped:
                    node = find(key)
                    if node is None or node.kind != known.kind or node.group != known.group:
                        regrouped.add(nodeid)
                        self.regroup(nodeid, rewritten)
                elif known.aliases and find(key) is None:
                    inodes.detach(key)
            if entry or renew:
                notes += self._entry_of(key, 0 if entry else k.EXPIRE_ONLY)
        return notes

    def _shown(self, key: str, given: int) -> bool:
        """Whether ``given`` (the version mark of what the kernel was last shown of the file
        at ``key``) is the file's version now."""
        node = self.session.ops.find(key)
        if node is None or node.kind != stat.S_IFREG:
            return False
        return version_mark(node.size, node.attrs.mtime) == given

    def _entry_of(self, key: str, flags: int = 0) -> list[bytes]:
        """The notification dropping the kernel's entry of ``key`` (none when the kernel holds
        no node of its folder)."""
        parent, _, name = key.rpartition("/")
        parent_id = self.session.inodes.held(parent)
        return [] if parent_id is None else [inval_entry(parent_id, name, flags)]

    def regroup(self, nodeid: int, rewritten: set[str] | None) -> list[str]:
        """Which names of the linked file of node ``nodeid`` are still its, after changes made
        elsewhere (``Operations.names_left``; ``rewritten``: the names whose value or entry
        record changed, None: not known); the names it lost (gone, or now another file's) are
        taken from it and returned, for the kernel to look them up again. When no name is
        known to be the file any more, none keeps the node (each gets one of its own at its
        next lookup): a name never shows another file's content. A name left in another link
        group is that group's file when the table has a node for it."""
        inodes = self.session.inodes
        inode = inodes.nodes[nodeid]
        names = inodes.names(nodeid)
        keep, group = self.session.ops.names_left(names, inode.group, inode.kind, rewritten)
        if group != inode.group:
            if group and inodes.groups.get(group, nodeid) != nodeid:
                keep, group = [], ""
            inodes.regrouped(nodeid, group)
        lost = [n for n in names if n not in keep]
        for name in lost:
            inodes.detach(name)
        return lost

    def everything(self) -> list[bytes]:
        """The notifications dropping every node's attributes and pages and every entry."""
        inodes = self.session.inodes
        ids, nodes, held = inodes.ids, inodes.nodes, inodes.held
        notes: list[bytes] = []
        for nodeid in {i for i in inodes.groups.values() if i in nodes}:  # linked files' names
            for name in self.regroup(nodeid, None):
                notes += self._entry_of(name)
        for nodeid in ids.values():
            inode = nodes[nodeid]
            if inode.lookups:  # the kernel holds nothing of a node it forgot
                if not inode.bare:  # else dropped (a lock granted), and nothing shown since
                    notes.append(inval_inode(nodeid))
                inode.stamp_time, inode.cache_ok = 0.0, False
                if inode.kind == stat.S_IFREG:
                    inode.heard = True  # as in notes()
        inodes.xattrs_changed()
        # Marked for a new lookup rather than dropped: a folder a process is in stays on its
        # path unless the lookup finds it gone (docs/architecture.md, fuse/coherence.py).
        agreed = self.session.agreed
        flags = k.EXPIRE_ONLY if agreed is not None and agreed.expire else 0
        for key in list(ids) + list(self.negatives):
            if key:
                parent, _, name = key.rpartition("/")
                parent_id = held(parent)
                if parent_id is not None:
                    notes.append(inval_entry(parent_id, name, flags))
        self.negatives.clear()
        return notes
