"""Watching SOURCE for changes made behind the mount's back, so the kernel's caches can stay
long and still be right.

The kernel caches names and attributes for the mount's timeout (120 s by default) and file
data until told otherwise. Everything changed *through* the mount is invalidated by the
passthrough itself; this module covers the rest: a process writing SOURCE directly. It
watches exactly the directories the kernel knows and, for each change, makes the kernel
forget the entry (name), the attributes and the cached data of what changed.

Mechanisms, best first:
- ``fanotify`` (root): one inode mark per known directory, with FAN_EVENT_ON_CHILD and
  FAN_REPORT_DFID_NAME (each event names the directory by file handle plus the child's name).
  Events caused by this daemon itself (its pid) are dropped, so changes made through the
  mount cost no second invalidation.
- ``inotify`` (not root): one watch per known directory. inotify does not say who made a
  change, so the daemon's own changes come back as events and are invalidated once more
  (correct, just a little extra work).
- ``timeout``: no watch could be set (limit reached, or the kernel refused): changes behind
  the mount show after the cache timeout. status.json's ``watch.mechanism`` says which one is in force.

Interface used by the passthrough (journalfs/fs/passthrough.py):

    watcher = SourceWatcher(changed)            # changed: see below
    watcher.directory_known(ino, fd=..., path=...)   # the kernel got a directory inode
                                                # (lookup, readdirplus, the root): watch it
    watcher.directory_forgotten(ino)            # the kernel forgot it: stop watching
    watcher.unsettled(ino)                      # a change in that directory not yet applied?
    await nursery.start(watcher.run)            # serve events until cancelled

``directory_known`` is cheap and idempotent; pass an fd (O_PATH is fine) or a path of the
directory (one of the two). The environment variable JOURNALFS_WATCH=fanotify|inotify|off
forces a mechanism (benches and tests compare them). ``changed(dir_ino, name)`` is an async callback into the
passthrough: SOURCE changed at ``name`` (bytes) in directory ``dir_ino`` (``name`` is None
when the directory itself changed). It must drop the passthrough's own caches of that
name (listings, remembered stats, views) and return the inode number the kernel knows for
that child, or None. The watcher then, outside any request handler, invalidates the kernel's
entry and inode through :data:`NOTIFIER`.

Every cache invalidation of the process goes through :data:`NOTIFIER` (a
:class:`KernelNotifier`), not pyfuse3's ``invalidate_entry_async``: that one's thread outlives
the FUSE session. When the session ended while SOURCE was changing (an unmount while another
process, e.g. the next mount of the same SOURCE, wrote there), the entries it still held were
sent after ``pyfuse3.close()`` had set the session to NULL; libfuse answered EINVAL and pyfuse3
logged each with a traceback (issue #27, seen in xfstests). Before closing the session the
daemon calls :meth:`SourceWatcher.stop`: no event is read and no call reaches the session
after it.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import threading
from collections import OrderedDict
from typing import Awaitable, Callable

import pyfuse3
import trio

log = logging.getLogger("journalfs.fs.watch")

_libc = ctypes.CDLL(None, use_errno=True)

# fanotify(7)
FAN_CLOEXEC, FAN_NONBLOCK, FAN_UNLIMITED_QUEUE = 0x1, 0x2, 0x10
FAN_REPORT_DFID_NAME = 0x400 | 0x800
FAN_MARK_ADD, FAN_MARK_REMOVE, FAN_MARK_DONT_FOLLOW, FAN_MARK_ONLYDIR = 0x1, 0x2, 0x4, 0x8
FAN_MODIFY, FAN_ATTRIB, FAN_MOVED_FROM, FAN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
FAN_CREATE, FAN_DELETE, FAN_Q_OVERFLOW = 0x100, 0x200, 0x4000
FAN_RENAME, FAN_EVENT_ON_CHILD, FAN_ONDIR = 0x10000000, 0x08000000, 0x40000000
FAN_EVENT_INFO_TYPE_DFID_NAME = 2
FAN_EVENT_INFO_TYPE_OLD_DFID_NAME, FAN_EVENT_INFO_TYPE_NEW_DFID_NAME = 10, 12
# FAN_RENAME (kernel >= 5.17): one event naming both the old and the new place of a rename
FANOTIFY_MASK = (FAN_MODIFY | FAN_ATTRIB | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_CREATE
                 | FAN_DELETE | FAN_RENAME | FAN_EVENT_ON_CHILD | FAN_ONDIR)
FANOTIFY_MASK_OLD = FANOTIFY_MASK & ~FAN_RENAME
_FAN_META = struct.Struct("=IBBHQii")           # fanotify_event_metadata
_FAN_INFO = struct.Struct("=BBH")               # fanotify_event_info_header
_FID_HEAD = struct.Struct("=8sIi")              # fsid, handle_bytes, handle_type

# inotify(7)
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_Q_OVERFLOW, IN_IGNORED = 0x100, 0x200, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_ISDIR = 0x1000000, 0x2000000, 0x40000000
INOTIFY_MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
                | IN_ONLYDIR | IN_DONT_FOLLOW)
_IN_EVENT = struct.Struct("=iIII")

#: What one event asks the kernel to drop: NAMES = the directory's entry for the name (and
#: the directory's attributes); DATA = the child's page cache (and attributes); ATTRS = the
#: child's attributes only.
NAMES, DATA, ATTRS = 4, 2, 1
_FAN_KIND = {FAN_CREATE: NAMES, FAN_DELETE: NAMES, FAN_MOVED_FROM: NAMES, FAN_MOVED_TO: NAMES,
             FAN_MODIFY: DATA, FAN_ATTRIB: ATTRS}
_IN_KIND = {IN_CREATE: NAMES, IN_DELETE: NAMES, IN_MOVED_FROM: NAMES, IN_MOVED_TO: NAMES,
            IN_MODIFY: DATA, IN_ATTRIB: ATTRS}
_AT_EMPTY_PATH = 0x1000
_MAX_HANDLE = 128
_READ_SIZE = 1 << 16

#: Entry invalidations waiting for the notifier's thread, at most (distinct (directory, name)
#: pairs; a repeat of a waiting one is free). Beyond it the oldest are dropped: the kernel
#: then keeps those names until the entry timeout, and status.json counts them.
MAX_PENDING_ENTRIES = 65_536
#: How long closing waits for a call into the kernel in progress (one blocked on a request
#: that will never be answered, after a signal): then the session is closed anyway.
CLOSE_TIMEOUT = 2.0
#: How long the watcher leaves the queue alone after a round of only the daemon's own
#: events (fanotify names their pid): a stream of writes, creates or renames through the
#: mount then wakes it once per pause, not once per request (each wake is a trio task step
#: and 4 syscalls on the request thread, #28). A change behind the mount made during the
#: pause shows at most this much later.
OWN_EVENTS_PAUSE = 0.001
#: Changes unsettled() reads ahead of the watcher's round at most (distinct (directory, name)
#: pairs, while run() still applies the last round): past it the rest stays in the kernel's
#: queue and every directory counts as unsettled, so a flood of changes cannot grow memory.
MAX_TAKEN = 65_536


class KernelNotifier:
    """Sends the kernel's cache invalidations of this process's FUSE session (pyfuse3 has one
    session per process) and guarantees none reaches the session after :meth:`close`.

    Entry invalidations are queued by any thread without blocking, deduplicated and
    bounded (MAX_PENDING_ENTRIES), and sent by one thread of ours (an invalidation can block
    until a request on that directory is answered: never on the trio thread). Inode
    invalidations are sent by the caller's worker thread (they can block on writeback).
    Every call into the session is counted while it runs (:meth:`_enter`); :meth:`close`
    sets ``closed`` and then waits for the count to reach 0, so once it returns no call is
    in progress and none will start. Calls do not wait for each other: an entry
    invalidation waits for its directory's lock while a READDIR of it is in progress (bob's
    listing of 100k entries), and an inode invalidation queued behind it held up the
    watcher's round and every request that invalidates views (a create through the mount)
    for as long."""

    def __init__(self, max_pending: int = MAX_PENDING_ENTRIES):
        self.max_pending = max_pending
        self._ready = threading.Condition()    # guards _pending, closed, _thread, _calls
        self._calls = 0                        # calls into the session in progress
        self._pending: OrderedDict[tuple[int, bytes], None] = OrderedDict()
        self._thread: threading.Thread | None = None
        self.closed = False
        self.sent = self.dropped = self.failed = 0

    def status(self) -> dict:
        return {"pending": len(self._pending), "sent": self.sent, "dropped": self.dropped,
                "failed": self.failed}

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel forget ``name`` in directory ``parent`` (soon, from our thread)."""
        with self._ready:
            if self.closed or (parent, name) in self._pending:
                return
            self._pending[(parent, name)] = None
            if len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
                self.dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="journalfs-notify",
                                                daemon=True)
                self._thread.start()
            self._ready.notify()

    def invalidate_inodes(self, items: list[tuple[int, bool]]) -> None:
        """From a worker thread: drop the kernel's cached attributes (and data, unless the
        flag says attributes only) of each inode; inodes the kernel forgot are skipped."""
        for ino, attr_only in items:
            if not self._enter():
                return
            try:
                pyfuse3.invalidate_inode(ino, attr_only)
            except OSError:  # the kernel has forgotten it: nothing cached to drop
                pass
            finally:
                self._leave()

    def _enter(self) -> bool:
        """Count a call into the session about to start; False once closed (no call)."""
        with self._ready:
            if self.closed:
                return False
            self._calls += 1
            return True

    def _leave(self) -> None:
        with self._ready:
            self._calls -= 1
            if not self._calls:
                self._ready.notify_all()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self.closed:
                    self._ready.wait()
                if self.closed:
                    return
                (parent, name), _ = self._pending.popitem(last=False)
            if not self._enter():
                return
            try:
                pyfuse3.invalidate_entry(parent, name)
                self.sent += 1
            except FileNotFoundError:  # the kernel holds no such entry: nothing to drop
                pass
            except OSError as exc:
                self.failed += 1
                log.debug("invalidating %r in directory %d: %s", name, parent, exc)
            finally:
                self._leave()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """No call into the session from here on (call it before ``pyfuse3.close()``);
        False when a call in progress did not end within ``timeout`` seconds."""
        with self._ready:
            self.closed = True
            self._pending.clear()
            self._ready.notify_all()
            if not self._ready.wait_for(lambda: not self._calls, timeout):
                log.warning("a kernel cache invalidation was still in progress when the "
                            "FUSE session closed")
                return False
        return True


#: The notifier of this process's FUSE session.
NOTIFIER = KernelNotifier()

Changed = Callable[[int, "bytes | None"], Awaitable["int | None"]]
Renamed = Callable[[int, bytes, int, bytes], Awaitable[None]]
Deleted = Callable[[int, bytes], Awaitable[None]]


def _kinds(mask: int, table: dict[int, int]) -> int:
    kinds = 0
    for bit, kind in table.items():
        if mask & bit:
            kinds |= kind
    return kinds


def file_handle(fd: int | None = None, path: bytes | None = None) -> tuple[bytes, int] | None:
    """(the kernel's file handle of a directory as fanotify reports it: type + bytes, the
    id of its mount)."""
    buf = ctypes.create_string_buffer(8 + _MAX_HANDLE)
    struct.pack_into("=Ii", buf, 0, _MAX_HANDLE, 0)
    mount_id = ctypes.c_int()
    if fd is not None:
        rc = _libc.name_to_handle_at(fd, b"", buf, ctypes.byref(mount_id), _AT_EMPTY_PATH)
    else:
        rc = _libc.name_to_handle_at(-100, path, buf, ctypes.byref(mount_id), 0)
    if rc != 0:
        return None
    size, kind = struct.unpack_from("=Ii", buf, 0)
    return struct.pack("=i", kind) + buf.raw[8:8 + size], mount_id.value


def _open_by_handle(mount_fd: int, handle: bytes) -> int:
    kind, body = struct.unpack_from("=i", handle)[0], handle[4:]
    buf = ctypes.create_string_buffer(struct.pack("=Ii", len(body), kind) + body)
    return _libc.open_by_handle_at(mount_fd, buf, os.O_PATH | os.O_CLOEXEC)


class SourceWatcher:
    """Turns changes in SOURCE into kernel cache invalidations (see the module doc)."""

    def __init__(self, changed: Changed, *, renamed: Renamed | None = None,
                 deleted: Deleted | None = None, use_fanotify: bool | None = None,
                 notifier: KernelNotifier | None = None):
        self._changed = changed
        self.notifier = NOTIFIER if notifier is None else notifier
        self.stopped = False
        #: the kernel's writeback cache is on: it keeps its own size and mtime of a regular
        #: file it caches, whatever the daemon answers, so a change drops the entry too (the
        #: inode goes once unused and the next lookup brings SOURCE's attributes)
        self.kernel_owns_sizes = False
        # renames (old dir ino, old name, new dir ino, new name) and deletes seen, in order,
        # for the metadata that follows files (fs/ownership.py); applied before ``changed``
        self._renamed, self._deleted = renamed, deleted
        self._name_events: list[tuple] = []
        self._mask = FANOTIFY_MASK
        self.renames = 0
        self.fd = -1
        self.mechanism = "timeout"
        self.reason = "not started"
        self._by_key: dict[object, int] = {}    # fanotify: handle -> ino; inotify: wd -> ino
        self._key_of: dict[int, object] = {}    # ino -> handle / wd
        self._marked: dict[object, int] = {}    # fanotify: handle -> marks held (by inos)
        self._mount_of: dict[bytes, int] = {}   # fanotify: handle -> mount id
        self._mount_fds: dict[int, int] = {}    # mount id -> an O_PATH fd on it
        self.limit_reached = False
        self.applying = False  # events read from the queue, their caches not yet dropped
        # changes read from the queue and not yet applied, {(dir ino, name): kinds}: read by
        # run() or by unsettled() (which must know the directories they are in)
        self._waiting: dict[tuple[int, bytes | None], int] = {}
        self._waiting_dirs: set[int] = set()  # the directories of _waiting
        self._applying_dirs: set[int] = set()  # directories of the round being applied
        self._wake: trio.CancelScope | None = None  # run() waiting for the queue
        self._pid = os.getpid()  # whose events are the daemon's own (fanotify)
        self.events = 0
        self.invalidations = 0
        self.overflows = 0
        forced = os.environ.get("JOURNALFS_WATCH", "")  # for benches and tests only
        if forced == "off":
            self.reason = "JOURNALFS_WATCH=off"
            return
        if use_fanotify is None:
            use_fanotify = forced == "fanotify" or (forced != "inotify" and os.geteuid() == 0)
        self._open(use_fanotify)

    # -- setup -----------------------------------------------------------------------------
    def _open(self, want_fanotify: bool) -> None:
        if want_fanotify:
            fd = _libc.fanotify_init(FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE
                                     | FAN_REPORT_DFID_NAME, os.O_RDONLY | os.O_CLOEXEC)
            if fd >= 0:
                self.fd, self.mechanism, self.reason = fd, "fanotify", ""
                return
            log.info("fanotify unavailable (%s); using inotify",
                     os.strerror(ctypes.get_errno()))
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd >= 0:
            self.fd, self.mechanism, self.reason = fd, "inotify", ""
            return
        self.reason = f"inotify unavailable: {os.strerror(ctypes.get_errno())}"
        log.warning("SOURCE changes behind the mount show after the cache timeout: %s",
                    self.reason)

    def stop(self) -> None:
        """The FUSE session is about to close (its main loop has returned): read no more
        events (the marks go with the fd, so no other process's change reaches us), and
        close the notifier, waiting for a call into the session in progress. Call it on
        the trio thread, before ``pyfuse3.close()``."""
        self.stopped = True
        if self.fd >= 0:
            try:
                trio.lowlevel.notify_closing(self.fd)  # wakes run() if it waits on the fd
            except RuntimeError:  # not inside trio (tests)
                pass
        self.close()
        self.notifier.close()

    def close(self) -> None:
        for fd in self._mount_fds.values():
            os.close(fd)
        self._mount_fds.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def status(self) -> dict:
        """status.json's ``watch``: the mechanism in force ("fanotify", "inotify", or
        "timeout" when changes behind the mount wait for the cache timeout; "+timeout" once
        the watch limit left some directories unwatched) and what it has done
        (``notifications``: the kernel notifier's queue, entries sent, dropped past its bound
        and refused by the kernel)."""
        state = self.mechanism if not self.limit_reached else f"{self.mechanism}+timeout"
        return {"mechanism": state, "reason": self.reason,
                "directories": len(self._key_of), "events": self.events,
                "renames": self.renames,
                "invalidations": self.invalidations, "overflows": self.overflows,
                "notifications": self.notifier.status()}

    # -- the passthrough's hooks ----------------------------------------------------------
    def directory_known(self, ino: int, fd: int | None = None,
                        path: bytes | str | None = None) -> None:
        if self.fd < 0 or ino in self._key_of:
            return
        target = os.fsencode(path) if path is not None else None
        if self.mechanism == "fanotify":
            self._fan_watch(ino, fd, target)
        else:
            self._in_watch(ino, fd, target)

    def watching(self, ino: int) -> bool:
        """Whether every change in directory ``ino`` reaches the passthrough's hooks."""
        return self.fd >= 0 and ino in self._key_of

    def pending(self) -> bool:
        """Whether changes have happened that the hooks have not been told about yet (the
        queue is not empty, or events read from it are still being applied). A change made
        in SOURCE is queued before the syscall making it returns."""
        if self.applying or self._waiting:
            return True
        if self.fd < 0:
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(0))

    def unsettled(self, ino: int) -> bool:
        """Whether a change in directory ``ino`` (a name in it made, removed, renamed or
        changed; every directory after a queue overflow) has happened that the hooks have
        not been told about yet. Reads what is queued (never waits), so that a change
        anywhere else in SOURCE leaves a listing of ``ino`` what it kept (one user's flood
        of changes costs nobody else's listings a rescan). Not counted: a change inside a
        subdirectory, which only changes that subdirectory's times in this listing until
        the watcher's round (the kernel drops them then)."""
        if len(self._waiting) >= MAX_TAKEN:
            return True
        if self.fd >= 0 and not self.stopped:
            try:
                if self._take() and self._wake is not None:
                    self._wake.cancel()  # run() applies them now
            except OSError:  # the queue cannot be read here: assume the worst
                return True
        return ino in self._applying_dirs or ino in self._waiting_dirs

    def _take(self) -> bool:
        """Read the queue into ``_waiting`` (never blocks); whether anything was read."""
        names = len(self._name_events)
        new = self._read_all({})
        for key, kinds in new.items():
            self._waiting[key] = self._waiting.get(key, 0) | kinds
            self._waiting_dirs.add(key[0])
        return bool(new) or len(self._name_events) != names

    def directory_forgotten(self, ino: int) -> None:
        key = self._key_of.pop(ino, None)
        if key is None:
            return
        if self._by_key.get(key) == ino:
            del self._by_key[key]
        if self.mechanism == "inotify":
            _libc.inotify_rm_watch(self.fd, key)
            return
        left = self._marked.pop(key, 1) - 1
        if left > 0:  # another inode number still stands for this directory
            self._marked[key] = left
            return
        # A mark pins the directory's inode in memory: remove it. The directory may have
        # moved or gone since, so reach it by handle (root: CAP_DAC_READ_SEARCH).
        mount_fd = self._mount_fds.get(self._mount_of.pop(key, -1))
        if mount_fd is None:
            return
        fd = _open_by_handle(mount_fd, key)
        if fd < 0:  # gone: its marks went with it
            return
        try:
            _libc.fanotify_mark(self.fd, FAN_MARK_REMOVE, ctypes.c_uint64(self._mask), -100,
                                f"/proc/self/fd/{fd}".encode())
        finally:
            os.close(fd)

    def _fan_watch(self, ino: int, fd: int | None, path: bytes | None) -> None:
        found = file_handle(fd, path)
        if found is None:  # e.g. a filesystem without file handles mounted below SOURCE
            self._partial(f"a directory cannot be watched: {os.strerror(ctypes.get_errno())}")
            return
        handle, mount_id = found
        if handle in self._marked:  # same directory under another inode number
            self._marked[handle] += 1
        else:
            # through /proc/self/fd/N so that an O_PATH fd works too; a given path is
            # never followed through a final symlink
            target = f"/proc/self/fd/{fd}".encode() if fd is not None else path
            flags = FAN_MARK_ADD | FAN_MARK_ONLYDIR | (FAN_MARK_DONT_FOLLOW if fd is None else 0)
            rc = _libc.fanotify_mark(self.fd, flags, ctypes.c_uint64(self._mask), -100, target)
            if rc != 0 and ctypes.get_errno() == errno.EINVAL and self._mask & FAN_RENAME:
                self._mask = FANOTIFY_MASK_OLD  # a kernel before 5.17: paired moves unknown
                rc = _libc.fanotify_mark(self.fd, flags, ctypes.c_uint64(self._mask), -100,
                                         target)
            if rc != 0:
                self._refused(ctypes.get_errno(), path)
                return
            self._marked[handle] = 1
            self._mount_of[handle] = mount_id
            # One fd on SOURCE's own filesystem (its root is the first directory known) to
            # remove marks by handle later. None on filesystems mounted below SOURCE: an fd
            # would keep them from being unmounted, and their marks go with their unmount.
            if not self._mount_fds:
                self._mount_fds[mount_id] = os.open(
                    target, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY
                    | (os.O_NOFOLLOW if fd is None else 0))
        self._by_key[handle] = ino
        self._key_of[ino] = handle

    def _in_watch(self, ino: int, fd: int | None, path: bytes | None) -> None:
        target = f"/proc/self/fd/{fd}".encode() if fd is not None else path
        mask = INOTIFY_MASK & ~IN_DONT_FOLLOW if fd is not None else INOTIFY_MASK
        wd = _libc.inotify_add_watch(self.fd, target, ctypes.c_uint32(mask))
        if wd < 0:
            self._refused(ctypes.get_errno(), path)
            return
        self._by_key[wd] = ino
        self._key_of[ino] = wd

    def _refused(self, err: int, path: bytes | None) -> None:
        if err in (errno.ENOSPC, errno.ENOMEM, errno.EMFILE):
            self._partial(f"{self.mechanism} watch limit reached ({os.strerror(err)})")
        elif err not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            # e.g. EXDEV/EOPNOTSUPP: a filesystem below SOURCE that cannot be watched
            self._partial(f"a directory cannot be watched: {os.strerror(err)}")

    def _partial(self, why: str) -> None:
        """Some directory goes unwatched: its changes wait for the cache timeout."""
        if not self.limit_reached:
            self.limit_reached = True
            self.reason = (f"{why}: changes behind the mount in unwatched directories show "
                           "after the cache timeout")
            log.warning("%s", self.reason)

    # -- events ----------------------------------------------------------------------------
    async def run(self, task_status=None) -> None:
        """Serve events until cancelled (start it in the mount's nursery)."""
        if task_status is not None:
            task_status.started()
        if self.fd < 0:
            return
        self._pid = os.getpid()  # the daemon's, after any fork
        try:
            while not self.stopped:
                try:
                    await self._wait()
                except trio.ClosedResourceError:  # stop(): the session is closing
                    return
                if self.stopped:
                    return
                self.applying = True
                try:
                    self._take()
                    changes, self._waiting = self._waiting, {}
                    self._applying_dirs, self._waiting_dirs = self._waiting_dirs, set()
                    if changes or self._name_events:
                        await self._apply(changes)
                        changes = None
                finally:
                    self.applying = False
                    self._applying_dirs = set()
                if changes is not None:  # nothing from anyone else: let ours gather
                    await trio.sleep(OWN_EVENTS_PAUSE)
        finally:
            self.close()

    async def _wait(self) -> None:
        """Until the queue has events, or unsettled() has read some for us to apply."""
        if self._waiting or self._name_events:
            return
        with trio.CancelScope() as scope:
            self._wake = scope
            try:
                await trio.lowlevel.wait_readable(self.fd)
            finally:
                self._wake = None

    def _read_all(self, changes: dict[tuple[int, bytes | None], int]
                  ) -> dict[tuple[int, bytes | None], int]:
        """Drain the queue into ``changes``: {(dir ino, name or None): kinds} merged over
        all events."""
        parse = self._parse_fanotify if self.mechanism == "fanotify" else self._parse_inotify
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            parse(data, changes)
            if len(data) < _READ_SIZE // 2:
                break
        return changes

    def _note(self, changes: dict, ino: int | None, name: bytes | None, kinds: int) -> None:
        if ino is None or not kinds:
            return
        self.events += 1
        key = (ino, name)
        changes[key] = changes.get(key, 0) | kinds

    def _parse_fanotify(self, data: bytes, changes: dict) -> None:
        me = self._pid
        pos = 0
        while pos + _FAN_META.size <= len(data):
            length, _vers, _res, meta_len, mask, fd, pid = _FAN_META.unpack_from(data, pos)
            if length < _FAN_META.size:
                break
            if fd >= 0:  # not sent in FID mode; never leak one
                os.close(fd)
            if mask & FAN_Q_OVERFLOW:
                self._overflow(changes)
            elif pid != me:
                info = pos + meta_len
                end = pos + length
                places = {}
                while info + _FAN_INFO.size <= end:
                    kind, _pad, info_len = _FAN_INFO.unpack_from(data, info)
                    if info_len == 0:
                        break
                    if kind == FAN_EVENT_INFO_TYPE_DFID_NAME:
                        place = self._fan_record(data, info + _FAN_INFO.size, info + info_len,
                                                 mask & ~FAN_RENAME, changes)
                        if mask & FAN_DELETE and place is not None and place[1]:
                            self._name_events.append(("deleted", place))
                    elif kind in (FAN_EVENT_INFO_TYPE_OLD_DFID_NAME,
                                  FAN_EVENT_INFO_TYPE_NEW_DFID_NAME):
                        places[kind] = self._fan_record(data, info + _FAN_INFO.size,
                                                        info + info_len, 0, changes)
                    info += info_len
                if mask & FAN_RENAME:
                    old = places.get(FAN_EVENT_INFO_TYPE_OLD_DFID_NAME)
                    new = places.get(FAN_EVENT_INFO_TYPE_NEW_DFID_NAME)
                    if old is not None and new is not None and old[1] and new[1]:
                        self._name_events.append(("renamed", old, new))
            pos += length

    def _fan_record(self, data: bytes, at: int, end: int, mask: int,
                    changes: dict) -> tuple[int, bytes | None] | None:
        """Note the change one (directory handle, name) record names; returns (directory
        ino, name) when the directory is one we watch."""
        _fsid, size, handle_type = _FID_HEAD.unpack_from(data, at)
        start = at + _FID_HEAD.size
        handle = struct.pack("=i", handle_type) + data[start:start + size]
        ino = self._by_key.get(handle)
        if ino is None:
            return None
        raw = data[start + size:end]
        name = raw[:raw.find(b"\0")] if b"\0" in raw else raw
        name = None if name in (b"", b".") else name
        self._note(changes, ino, name, _kinds(mask, _FAN_KIND))
        return ino, name

    def _parse_inotify(self, data: bytes, changes: dict) -> None:
        pos = 0
        moved_from: dict[int, tuple[int, bytes]] = {}  # cookie -> old place (this batch)
        while pos + _IN_EVENT.size <= len(data):
            wd, mask, cookie, length = _IN_EVENT.unpack_from(data, pos)
            raw = data[pos + _IN_EVENT.size:pos + _IN_EVENT.size + length]
            pos += _IN_EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self._overflow(changes)
                continue
            if mask & IN_IGNORED:  # the directory is gone: its watch went with it
                ino = self._by_key.pop(wd, None)
                if ino is not None:
                    self._key_of.pop(ino, None)
                continue
            name = raw.split(b"\0", 1)[0] or None
            ino = self._by_key.get(wd)
            self._note(changes, ino, name, _kinds(mask, _IN_KIND))
            if ino is None or name is None:
                continue
            if mask & IN_MOVED_FROM:  # its IN_MOVED_TO follows at once if the target is watched
                moved_from[cookie] = (ino, name)
            elif mask & IN_MOVED_TO and cookie in moved_from:
                self._name_events.append(("renamed", moved_from.pop(cookie), (ino, name)))
            elif mask & IN_DELETE:
                self._name_events.append(("deleted", (ino, name)))

    def _overflow(self, changes: dict) -> None:
        """Events were lost: every watched directory may have changed in any way."""
        # The kernel's cached *names* in those directories cannot be listed from here: they
        # stay until the cache timeout (attributes and data are dropped below).
        self.overflows += 1
        self.reason = ("the change queue overflowed: names changed behind the mount may show "
                       "only after the cache timeout")
        log.warning("SOURCE change queue overflowed: dropping every cached directory")
        for ino in list(self._key_of):
            changes[(ino, None)] = NAMES | DATA | ATTRS

    async def _apply_names(self) -> None:
        """Renames and deletes, in the order they happened."""
        events, self._name_events = self._name_events, []
        for event in events:
            try:
                if event[0] == "renamed" and self._renamed is not None:
                    self.renames += 1
                    (old_dir, old_name), (new_dir, new_name) = event[1], event[2]
                    await self._renamed(old_dir, old_name, new_dir, new_name)
                elif event[0] == "deleted" and self._deleted is not None:
                    await self._deleted(*event[1])
            except Exception:
                log.exception("following a rename or delete in SOURCE failed")

    async def _apply(self, changes: dict[tuple[int, bytes | None], int]) -> None:
        await self._apply_names()
        inodes: dict[int, bool] = {}    # ino -> attributes only?
        for (dir_ino, name), kinds in changes.items():
            try:
                child = await self._changed(dir_ino, name)
            except Exception:
                log.exception("dropping caches of a SOURCE change failed")
                child = None
            if name is None:
                inodes[dir_ino] = inodes.get(dir_ino, True) and not kinds & DATA
                if kinds & NAMES:  # overflow: names unknown, drop what the kernel holds
                    inodes[dir_ino] = False
                continue
            if kinds & NAMES or (self.kernel_owns_sizes and child is not None):
                self.notifier.invalidate_entry(dir_ino, name)
                inodes.setdefault(dir_ino, True)
                self.invalidations += 1
            if child is not None:
                inodes[child] = inodes.get(child, True) and not kinds & DATA
        self._applying_dirs = set()  # our caches are current; the kernel's inodes follow
        if inodes and not self.stopped:
            self.invalidations += len(inodes)
            await trio.to_thread.run_sync(self.notifier.invalidate_inodes, list(inodes.items()))
