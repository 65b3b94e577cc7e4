"""The pyfuse3 Operations: SOURCE mirrored through, metadata as xattrs, views under /.journalfs.

Every request acts on the SOURCE object the kernel's inode stands for, never on a path
string: each inode holds an ``O_PATH|O_NOFOLLOW`` fd of its object (see inodes.py), names
are resolved one component at a time relative to the parent's fd with the ``*at()`` calls
and no symlink following, and calls that need a real fd on the object itself go through
``/proc/self/fd/N`` (the kernel's link to that exact object, no path walk). So a directory
swapped for a symlink in SOURCE, a long path or a reused fd number can never make the daemon
act on anything but what the caller reached.

Objects are created with the caller's fsuid/fsgid/groups (per thread, restored at once), so
ownership, setgid inheritance and the permission checks of SOURCE itself are native.

On a local SOURCE filesystem (by statfs f_type) syscalls run inline on the trio thread: a
thread hop costs more than the syscall. fsync, anything on a network/FUSE SOURCE and opens
of anything but regular files and directories run in worker threads.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import itertools
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable

import pyfuse3
import trio

from . import xattrs
from .caches import UNKNOWN, Listing, MetaCache, Scan
from .dirlist import DIR_BLKSIZE, ListingCache, NameOnlyEntry, listing_rows, patched
from .inodes import VIEW_INO_BASE, Inode, InodeTable, O_PATH_FLAGS, join, same_object, stale
from .ownership import Ownership
from .views import VIEWS_NAME, Views

from .watch import SourceWatcher
from .workers import FairWorkers

log = logging.getLogger("journalfs.fs")

#: File handles at or above this are the views' (listings, virtual files); below are ours.
HANDLE_BASE = 1 << 32
_libc = ctypes.CDLL(None, use_errno=True)
_AT_EMPTY_PATH = 0x1000
_AT_SYMLINK_NOFOLLOW = 0x100
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(os.uname().machine)
_IS_ROOT = os.geteuid() == 0
_ABSENT = object()
_CAP_SYS_ADMIN = 21
_CAP_SYS_RESOURCE = 24
_CAPABILITY_VERSION_3 = 0x20080522
#: Longest a directory listing or a remembered stat answers lookups/getattr from memory
#: (never longer than the kernel's own timeout; anything changed through the mount is
#: forgotten at once).
SNAPSHOT_TTL = 2.0
#: statfs f_type of local filesystems: syscalls there are cheaper inline than a thread hop,
#: and close(2) flushes nothing (no deferred write errors): ext2/3/4, xfs, btrfs, tmpfs, f2fs.
LOCAL_FS_TYPES = {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010}
#: Directory entries a scan lists on the trio thread before it hands the rest to a worker
#: thread: a small directory costs no thread hop, a big one holds up no other request.
SCAN_INLINE = 1024
#: Entries whose inode and attributes a readdir reply builds at most (~50 µs each on a busy
#: heap); the reply then ends early and the kernel asks for the rest in another request, so
#: the first listing of a huge directory holds up nobody's requests for long.
READDIR_NEW_MAX = 8
#: Entries a readdir reply carries at most (a 1 MiB buffer takes ~5,000): bounds the work of
#: one request whatever the kernel asks for (~0.3 ms on a busy machine). Measured with bob
#: listing 100k entries in a loop (bench/attacks.py): carol's p99 ~1-2 ms at 64, ~6 ms at
#: 256; bob's repeated listing of 100k takes 0.27 s instead of 0.19 s.
READDIR_MAX = 64
#: Inodes one FORGET batch drops before letting other requests run (the kernel forgets
#: thousands at once after a huge listing).
FORGET_STEP = 256


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def _fs_type(fd: int) -> int | None:
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


def _check(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int) -> None:
    _check(_libc.renameat2(old_dir, old, new_dir, new, ctypes.c_uint(flags)))


def _chown_fd(fd: int, uid: int, gid: int) -> None:
    """chown of the object an O_PATH fd stands for (a symlink itself, too)."""
    _check(_libc.fchownat(fd, b"", uid, gid, _AT_EMPTY_PATH | _AT_SYMLINK_NOFOLLOW))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _utime_fd(fd: int, atime_ns: int, mtime_ns: int) -> None:
    times = (_Timespec * 2)(_Timespec(*divmod(atime_ns, 10**9)),
                            _Timespec(*divmod(mtime_ns, 10**9)))
    _check(_libc.utimensat(fd, b"", times, _AT_EMPTY_PATH | _AT_SYMLINK_NOFOLLOW))


def _same_attributes(old: os.stat_result, new: os.stat_result) -> bool:
    """Whether a reply built from ``old`` is exact for ``new`` (the tuple part compares
    whole seconds only: the ns times and the block fields are checked on their own)."""
    return old is new or (old == new and old.st_mtime_ns == new.st_mtime_ns
                          and old.st_ctime_ns == new.st_ctime_ns
                          and old.st_atime_ns == new.st_atime_ns
                          and old.st_blocks == new.st_blocks and old.st_rdev == new.st_rdev
                          and old.st_blksize == new.st_blksize)


#: statx's STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND (chattr +i, +a), at byte 8 of struct statx
_STATX_FROZEN = 0x10 | 0x20


def _frozen(fd: int) -> bool:
    """Whether the object of O_PATH ``fd`` is immutable or append-only (chattr +i/+a):
    statx reports the inode flags without opening the file (no lease break, no FIFO wait)."""
    buf = ctypes.create_string_buffer(256)
    _check(_libc.statx(fd, b"", _AT_EMPTY_PATH | _AT_SYMLINK_NOFOLLOW, 0, buf))
    return bool(int.from_bytes(buf.raw[8:16], "little") & _STATX_FROZEN)


def proc_path(fd: int) -> bytes:
    """The kernel's link to exactly the object ``fd`` stands for (no path walk)."""
    return b"/proc/self/fd/%d" % fd


def _fuse_error(exc: Exception, what: str) -> pyfuse3.FUSEError:
    """What a handler raises for ``exc``: FUSEError as is, OSError with its errno, anything
    else logged and EIO."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, OSError):
        return pyfuse3.FUSEError(exc.errno or errno.EIO)
    log.error("%s failed", what, exc_info=exc)
    return pyfuse3.FUSEError(errno.EIO)


def _guarded(fn: Callable) -> Callable:
    """Only FUSEError may leave a handler: OSError keeps its errno, anything else is EIO.
    (The hottest handlers, getattr, lookup and getxattr, do the same in their own body: one
    coroutine less per request.)"""
    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            raise _fuse_error(exc, fn.__name__) from None
    return handler


async def _in_thread(fn: Callable, *args: Any, limiter=None) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)


@dataclass(eq=False)
class Handle:
    """One open file: its own fd, the inode, and whether it was written since opened.
    ``busy`` counts worker threads using ``fd``: release closes it only when none is."""
    fd: int
    node: Inode
    written: bool = False
    busy: int = 0
    released: bool = False
    # (size, mtime_ns) at open and node.changes then: a handle released with no change
    # through the mount since needs no fstat for the keep_cache test of the next open
    opened: tuple | None = None
    changes: int = -1
    # (fsuid, fsgid) of the opener: writes run as them (pyfuse3's write has no ctx)
    writer: tuple[int, int] = (0, 0)
    # writes through this very handle (buffered ones went through the kernel's page cache,
    # so they leave it current); ``direct``: opened O_DIRECT, whose writes bypass it
    own_writes: int = 0
    direct: bool = False


_setfsuid, _setfsgid, _capset = _libc.setfsuid, _libc.setfsgid, _libc.capset


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _capabilities() -> tuple[_CapHeader, ctypes.Array] | None:
    """This thread's capability sets (capget), or None where that fails."""
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        return None
    return header, data


class Caller:
    """Acts with a request's credentials: fsuid/fsgid and supplementary groups are
    per thread on Linux (raw syscalls; glibc's setgroups would change every thread).

    As the caller, the thread also drops CAP_SYS_RESOURCE from its effective set (capset is
    per thread too): ext4 lets root's reserved blocks and disk quotas be overrun by an fsuid
    0 *or* a CAP_SYS_RESOURCE writer, so only both make a user's writes and creations stop
    at the reserve and their quota as on SOURCE (setfsuid itself drops only the fs caps)."""

    def __init__(self):
        self._groups: dict[int, tuple[float, list[int]]] = {}
        self._own_groups = os.getgroups()
        caps = _capabilities() if _IS_ROOT else None
        self._caps = self._caps_as_user = None  # (header, data) for capset, as pointers
        if caps is not None and caps[1][0].effective >> _CAP_SYS_RESOURCE & 1:
            self._kept = (caps, _capabilities())
            self._kept[1][1][0].effective &= ~(1 << _CAP_SYS_RESOURCE)
            self._caps, self._caps_as_user = (
                (ctypes.byref(header), data) for header, data in self._kept)

    def groups(self, pid: int) -> list[int]:
        now = time.monotonic()
        cached = self._groups.get(pid)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        groups: list[int] = []
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Groups:"):
                        groups = [int(g) for g in line.split()[1:]]
                        break
        except (OSError, ValueError):
            pass
        if len(self._groups) > 1024:
            self._groups.clear()
        self._groups[pid] = (now, groups)
        return groups

    def run(self, ctx, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` as the caller (as ourselves when we are not root or it is root)."""
        if not _IS_ROOT or ctx is None or (ctx.uid == 0 and ctx.gid == 0) or _SYS_SETGROUPS is None:
            return fn(*args)
        groups = self.groups(ctx.pid) if ctx.pid else []
        self._setgroups(groups)
        try:
            return self.as_user(ctx.uid, ctx.gid, fn, *args)
        finally:
            self._setgroups(self._own_groups)

    def as_user(self, uid: int, gid: int, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` with fsuid ``uid``, fsgid ``gid`` and no CAP_SYS_RESOURCE (for
        writes of file data: no permission check needs the groups then)."""
        if not _IS_ROOT or (uid == 0 and gid == 0):
            return fn(*args)
        drop = uid != 0 and self._caps_as_user is not None  # root keeps root's reserve
        if drop and _capset(*self._caps_as_user) != 0:
            _check(-1)
        _setfsgid(gid)
        _setfsuid(uid)  # drops the fs capabilities from the effective set
        try:
            return fn(*args)
        finally:
            _setfsuid(0)
            _setfsgid(0)
            if drop and _capset(*self._caps) != 0:
                _check(-1)

    @staticmethod
    def _setgroups(groups: list[int]) -> None:
        arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
        _check(_libc.syscall(_SYS_SETGROUPS, len(groups), arr))

    def capable(self, ctx, cap: int) -> bool:
        """Whether the calling process holds capability ``cap`` (effective set)."""
        if ctx is None or not ctx.pid:
            return ctx is not None and ctx.uid == 0
        try:
            with open(f"/proc/{ctx.pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"CapEff:"):
                        return bool(int(line.split()[1], 16) >> cap & 1)
        except (OSError, ValueError):
            pass
        return ctx.uid == 0


class JournalFS(pyfuse3.Operations):
    """SOURCE passthrough + ``user.metadata.*`` xattrs backed by a metadata service."""

    enable_writeback_cache = False
    # The kernel reads system.posix_acl_* through getxattr and enforces them itself, as on
    # SOURCE (with default_permissions, which the POSIX_ACL flag implies anyway).
    enable_acl = True

    def __init__(self, source: str, meta, location, *, timeout: float = 1.0,
                 options: dict | None = None):
        super().__init__()
        self.src = os.fsencode(os.path.abspath(source))
        self.meta = meta            # MetaService or GvfsdBackend (same async API)
        self.location = location    # StoreLocation: store paths for mount-relative paths
        self.timeout = timeout
        # Read-only mount (-o ro, or remount,ro through MNT/.journalfs's user.journalfs.ro):
        # every change, metadata included, is EROFS, also where the kernel's flag is not set
        # (a remount by a user who may not remount the kernel's superblock).
        self.readonly = bool((options or {}).get("ro"))
        self._view_numbers = itertools.count(VIEW_INO_BASE)
        self._view_handles = itertools.count(HANDLE_BASE)
        self._file_handles = itertools.count(1)
        _raise_fd_limit()
        root_fd = os.open(self.src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.table = InodeTable(root_fd)
        self.files: dict[int, Handle] = {}                     # file handle -> open file
        self.dirs: dict[int, list] = {}  # handle -> _dir_state
        # changes made behind the mount: the watcher asks source_changed what to invalidate
        self.watch = SourceWatcher(self.source_changed, renamed=self.source_renamed,
                                   deleted=self.source_deleted)
        self.views = Views(self, options or {})
        self._exchange_tmp = itertools.count()
        self.snapshots = ListingCache(min(timeout, SNAPSHOT_TTL))  # + listings kept for readdir
        self.stat_ttl = min(timeout, SNAPSHOT_TTL)
        root = os.fstat(root_fd)
        self.local = _fs_type(root_fd) in LOCAL_FS_TYPES
        self.local_dev = root.st_dev if self.local else None
        self.name_max = os.fstatvfs(root_fd).f_namemax or 255
        self.caller = Caller()
        # Calls that may wait on another process (an open that would break a lease, FIFOs,
        # devices, truncate by path, big directory scans): threads of their own, a fair
        # share per user, so they never take the threads fsync and the others need and one
        # user's slow files never delay another user's requests.
        self.workers = FairWorkers()
        # Metadata values are cached only for a store this mount alone writes.
        store = getattr(meta, "store", None)
        exclusive = store is not None and getattr(store, "readonly", True) is False
        self.meta_cache = MetaCache() if exclusive else None
        # metadata belongs to the file: the store's ledger of owners and quota (ownership.py)
        self.ownership = Ownership(self, getattr(store, "ledger", None) if exclusive else None)

    # -- helpers ---------------------------------------------------------------------------
    def next_inode(self) -> int:
        """A number for a view inode (a range SOURCE's numbers never reach)."""
        return next(self._view_numbers)

    def next_handle(self) -> int:
        return next(self._view_handles)

    def abs(self, rel: bytes) -> bytes:
        """A path string into SOURCE, for the views only (they open journals safely
        themselves); the passthrough never acts on one."""
        return self.src + b"/" + rel

    def store_path(self, rel: bytes) -> str:
        return self.location.store_path("/" + os.fsdecode(rel))

    async def _io(self, fn: Callable, *args: Any) -> Any:
        """Run a SOURCE syscall: inline on a local filesystem, else in a worker thread."""
        if self.local:
            return fn(*args)
        return await _in_thread(fn, *args)

    def _inline(self, node: Inode, fn: Callable, *args: Any) -> Any:
        """``fn(fd, *args)`` with ``node``'s O_PATH fd, on this thread (local SOURCE only):
        the hot handlers' way to :meth:`_on` without its coroutines."""
        fd = self.table.fd(node)
        try:
            return fn(fd, *args)
        finally:
            self.table.let_go(node)

    async def _on(self, node: Inode, fn: Callable, *args: Any) -> Any:
        """``fn(fd, *args)`` with ``node``'s O_PATH fd, kept open for the whole call."""
        fd = self.table.hold(node)
        try:
            return await self._io(fn, fd, *args)
        finally:
            self.table.unhold(node)

    def attrs(self, node: Inode, st: os.stat_result) -> pyfuse3.EntryAttributes:
        """The reply for ``node`` with attributes ``st``: the one built last time when
        nothing in it changed (a getattr at timeout 0 then costs an fstat and a compare)."""
        timeout = self.timeout
        built = node.reply
        if built is not None and built[1] == timeout and _same_attributes(built[0], st):
            a = built[2]
        else:
            a = pyfuse3.EntryAttributes()
            a.st_ino, a.generation = node.ino, 0
            a.entry_timeout = a.attr_timeout = timeout
            a.st_mode, a.st_nlink, a.st_uid, a.st_gid = st.st_mode, st.st_nlink, st.st_uid, st.st_gid
            a.st_rdev, a.st_size, a.st_blksize, a.st_blocks = (st.st_rdev, st.st_size,
                                                              st.st_blksize, st.st_blocks)
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = (st.st_atime_ns, st.st_mtime_ns,
                                                           st.st_ctime_ns)
            if stat.S_ISDIR(st.st_mode):
                a.st_blksize = DIR_BLKSIZE  # big READDIRPLUS replies (see DIR_BLKSIZE)
            node.reply = (st, timeout, a)
        if node.file_type == stat.S_IFDIR and node.key is not None and \
                not self.watch.watching(node.ino):
            self._watch_directory(node)  # the kernel will know it
        return a

    def _watch_directory(self, node: Inode) -> None:
        try:
            self.watch.directory_known(node.ino, fd=self.table.fd(node))
        except (OSError, pyfuse3.FUSEError):
            pass  # gone meanwhile: nothing to watch
        finally:
            self.table.let_go(node)

    async def source_changed(self, dir_ino: int, name: bytes | None) -> int | None:
        """SOURCE changed behind the mount at ``name`` in directory ``dir_ino`` (None: the
        directory itself): drop our caches of it; the kernel's number for it, or None."""
        directory = self.table.by_ino.get(dir_ino)
        if directory is None or directory.path is None:
            return None
        rel = directory.path if name is None else join(directory.path, name)
        self._namespace_changed(rel)
        if name is not None:
            await self.ownership.changed(rel)
        await self.views.source_changed(rel)
        child = self.table.root if rel == b"" else self.table.by_path.get(rel)
        return None if child is None else child.ino

    def _rel_in(self, dir_ino: int, name: bytes) -> bytes | None:
        directory = self.table.by_ino.get(dir_ino)
        if directory is None or directory.path is None:
            return None
        return join(directory.path, name)

    async def source_renamed(self, old_dir: int, old_name: bytes, new_dir: int,
                             new_name: bytes) -> None:
        """SOURCE renamed a name behind the mount: its metadata moves along (ownership.py)."""
        old, new = self._rel_in(old_dir, old_name), self._rel_in(new_dir, new_name)
        if old is not None and new is not None:
            await self.ownership.renamed(old, new)

    async def source_deleted(self, dir_ino: int, name: bytes) -> None:
        rel = self._rel_in(dir_ino, name)
        if rel is not None:
            await self.ownership.deleted(rel)

    def _dot_attrs(self, number: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        a = self.attrs(Inode(number, None), st)
        return a

    def _path(self, node: Inode) -> bytes:
        if node.path is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node.path

    def _dir(self, parent_inode: int, name: bytes) -> tuple[Inode, bytes | None]:
        """The passthrough directory ``parent_inode`` a change of ``name`` happens in, and
        the SOURCE-relative path of ``name`` (None when the directory has none left)."""
        if self.readonly or self.views.owns(parent_inode) or \
                (parent_inode == pyfuse3.ROOT_INODE and name == VIEWS_NAME):
            raise pyfuse3.FUSEError(errno.EROFS)
        if len(name) > self.name_max:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        parent = self.table.get(parent_inode)
        return parent, (None if parent.path is None else join(parent.path, name))

    def _stat_of(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    async def _stat(self, node: Inode) -> os.stat_result:
        return await self._on(node, self._stat_of)

    async def _created(self, parent: Inode, rel: bytes | None, name: bytes, fd: int,
                       st: os.stat_result) -> tuple[Inode, pyfuse3.EntryAttributes]:
        node = self.table.remember(rel, st, parent.ino, name, fd=fd)
        node.changes += 1
        self._remember_stat(node, st)
        if rel is not None:
            await self.views.source_changed(rel)
        return node, self.attrs(node, st)

    async def _change_names(self, parent: Inode, rels: tuple, fn: Callable, *args: Any) -> Any:
        """Run the namespace change ``fn(*args)``, then forget what it made stale. The same
        call fstats ``parent`` (the directory of ``rels[0]``): the kernel asks for its new
        mtime right away, and that answer then costs nothing more."""
        changes = parent.changes
        dir_st = None
        fd = self.table.hold(parent)
        try:
            result, dir_st = await self._io(self._then_fstat, fn, args, fd)
            return result
        finally:
            self.table.unhold(parent)
            self._namespace_changed(*(r for r in rels if r is not None))
            parent.changes += 1
            parent.stat = None
            if dir_st is not None and changes + 1 == parent.changes:
                self._remember_stat(parent, dir_st)

    @staticmethod
    def _then_fstat(fn: Callable, args: tuple, fd: int) -> tuple[Any, os.stat_result | None]:
        result = fn(*args)
        try:
            return result, os.fstat(fd)
        except OSError:
            return result, None

    def _namespace_changed(self, *rels: bytes) -> None:
        """Names were added/removed/moved at ``rels``: listings and the remembered stats of
        those objects (nlink, ctime) and of their directories (mtime, nlink) are stale."""
        self.snapshots.names_changed(*rels)
        for rel in rels:
            self._forget_stat(rel, os.path.dirname(rel))

    def _attrs_changed(self, node: Inode, st: os.stat_result | None = None,
                       changes_before: int | None = None) -> None:
        """``node``'s attributes changed through us: listings holding its stat are stale.
        ``st``, taken by the change itself, is remembered unless another change finished
        meanwhile (``changes_before`` is ``node.changes`` from when this one started)."""
        self.snapshots.attrs_changed(*node.paths)
        keep = st is not None and changes_before == node.changes
        node.changes += 1
        self._remember_stat(node, st if keep else None)

    def _remember_stat(self, node: Inode, st: os.stat_result | None) -> None:
        node.stat, node.stat_time = st, time.monotonic()

    def _forget_stat(self, *rels: bytes) -> None:
        for rel in rels:
            node = self.table.root if rel == b"" else self.table.by_path.get(rel)
            if node is not None:
                node.changes += 1
                node.stat = None
                self.snapshots.attrs_changed(*node.paths)  # e.g. nlink of other hard links

    def _fresh_stat(self, node: Inode) -> os.stat_result | None:
        if node.stat is not None and time.monotonic() - node.stat_time <= self.stat_ttl:
            return node.stat
        return None

    def _listed(self, listing: Listing, parent: Inode, name: bytes, st: os.stat_result):
        """(inode, attributes) of ``name``, listed with ``st``: built once per stat and shared
        by lookups and readdir. Adds no kernel reference: the caller counts one once the
        kernel has the answer."""
        built = listing.attrs.get(name)
        if built is None or built[0] is not st or self.table.by_ino.get(built[1].ino) is not built[1]:
            rel = None if parent.path is None else join(parent.path, name)
            # the kernel forgot the inode since it was built: the same object stands again
            # when nothing else took its place (remember checks), with its reply if current
            reuse = built[1] if built is not None else None
            child = self.table.remember(rel, st, parent.ino, name, lookups=0, reuse=reuse)
            attrs = self.attrs(child, st)
            if child is not reuse or attrs is not built[2]:
                listing.attrs[name] = (st, child, attrs)
            return child, attrs
        return built[1], built[2]

    async def _listing(self, parent: Inode, uid: int = 0) -> Listing | None:
        """A fresh listing of ``parent`` to answer lookups from, when it is busy enough."""
        dir_rel = parent.path
        if dir_rel is None:
            return None
        listing = self.snapshots.listing(dir_rel)
        if listing is None and self.snapshots.worth_scanning(dir_rel):
            generation = self.snapshots.generation
            skip = VIEWS_NAME if parent is self.table.root else None
            scanned = await self._scan(parent, uid, skip, self.snapshots.max_entries)
            self.snapshots.store(dir_rel, generation, scanned)
            listing = self.snapshots.listing(dir_rel)
        return listing

    @staticmethod
    def _open_path(dir_fd: int, name: bytes) -> tuple[int, os.stat_result]:
        fd = os.open(name, O_PATH_FLAGS, dir_fd=dir_fd)
        try:
            return fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    # -- lookup / attributes ---------------------------------------------------------------
    async def lookup(self, parent_inode, name, ctx=None):
        # In a directory on local SOURCE with no listing cache in use (timeout 0): a name
        # not seen yet is opened O_PATH and remembered; a name known to mean an object whose
        # O_PATH fd is kept costs one fstatat to see it still means that object. No call
        # that could yield (tests/test_fs_hotpath.py). Everything else (views, dots,
        # listings, hard links, a name that now means another object) takes _lookup.
        try:
            parent = self.table.by_ino.get(parent_inode)
            if parent is not None and parent.fd is not None and not parent.transient and \
                    self.local and not self.snapshots.enabled and parent.paths and \
                    name not in (b".", b"..") and len(name) <= self.name_max and \
                    not (parent is self.table.root and name == VIEWS_NAME):
                directory = parent.paths[-1]
                rel = name if directory == b"" else directory + b"/" + name
                node = self.table.by_path.get(rel)
                if node is None:  # a name not seen yet: pin its object with an O_PATH fd
                    fd, st = self._open_path(parent.fd, name)
                    node = self.table.remember(rel, st, parent.ino, name, fd=fd)
                    return self.attrs(node, st)
                if node.fd is not None and not node.transient and node is not self.table.root:
                    st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
                    key = (st.st_dev, st.st_ino)
                    if key == node.key and self.table.by_key.get(key) is node and \
                            stat.S_IFMT(st.st_mode) == node.file_type and \
                            (st.st_nlink == 1 or node.file_type == stat.S_IFDIR):
                        node.parent, node.name = parent.ino, name
                        node.lookups += 1
                        built = node.reply
                        if built is not None and built[1] == self.timeout and \
                                _same_attributes(built[0], st) and \
                                (node.file_type != stat.S_IFDIR or
                                 self.watch.watching(node.ino)):
                            return built[2]
                        return self.attrs(node, st)
            return await self._lookup(parent_inode, name, ctx)
        except Exception as exc:
            raise _fuse_error(exc, "lookup") from None

    async def _lookup(self, parent_inode, name, ctx=None):
        if parent_inode == pyfuse3.ROOT_INODE and name == VIEWS_NAME:
            return self.views.lookup_root()
        if self.views.owns(parent_inode):
            return await self.views.lookup(parent_inode, name, ctx)
        if len(name) > self.name_max:  # before any cached answer
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        if name == b"." and parent_inode not in self.table:
            # open_by_handle_at / NFS: a handle of an inode the kernel has forgotten
            return await self._found_again(parent_inode)
        parent = self.table.get(parent_inode)
        if name == b".":
            st = await self._stat(parent)
            parent.lookups += 1
            return self.attrs(parent, st)
        if name == b"..":  # asked by NFS exports; the directory it was found in
            up = parent if parent is self.table.root else self.table.by_ino.get(parent.parent)
            if up is None and parent.path:  # e.g. a directory found again by its handle
                return await self._found_at(os.path.dirname(parent.path))
            if up is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            st = await self._stat(up)
            up.lookups += 1
            return self.attrs(up, st)
        listing = await self._listing(parent, ctx.uid if ctx is not None else 0)
        if listing is not None:  # answered from memory: `ls -l`, find, stat of many files
            st = listing.stats.get(name, _ABSENT)
            if st is _ABSENT:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if st is not UNKNOWN:
                child, attrs = self._listed(listing, parent, name, st)
                child.lookups += 1
                return attrs
        rel = None if parent.path is None else join(parent.path, name)
        seen = self.table.by_path.get(rel) if rel is not None else None
        if seen is not None and seen.fd is not None:
            # a name we know: an fstatat tells whether it still means an object that has
            # its O_PATH fd already (no open + close of a second one)
            st = self._inline(parent, self._lstat_at, name) if self.local else \
                await self._on(parent, self._lstat_at, name)
            node = self.table.by_key.get((st.st_dev, st.st_ino))
            if node is not None and node.fd is not None and \
                    node.file_type == stat.S_IFMT(st.st_mode):
                node = self.table.remember(rel, st, parent.ino, name)
                return self.attrs(node, st)
        fd, st = self._inline(parent, self._open_path, name) if self.local else \
            await self._on(parent, self._open_path, name)
        node = self.table.remember(rel, st, parent.ino, name, fd=fd)
        return self.attrs(node, st)

    async def _found_again(self, ino: int) -> pyfuse3.EntryAttributes:
        """LOOKUP(ino, "."): the forgotten inode ``ino``, found again inside SOURCE
        (inodes.InodeTable.find_forgotten), or ESTALE."""
        rel, st, fd, parent = await self._io(self.table.find_forgotten, ino)
        node = self.table.remember(rel, st, parent, os.path.basename(rel), fd=fd)
        return self.attrs(node, st)

    async def _found_at(self, rel: bytes) -> pyfuse3.EntryAttributes:
        """The directory at ``rel`` (a parent asked for by ".."), walked to from SOURCE."""
        if rel == b"":
            st = await self._stat(self.table.root)
            self.table.root.lookups += 1
            return self.attrs(self.table.root, st)
        found = await self._io(self.table.walk, rel)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        fd, st, parent_key = found
        parent = pyfuse3.ROOT_INODE if parent_key == self.table.root.key \
            else self.table.number(parent_key)
        node = self.table.remember(rel, st, parent, os.path.basename(rel), fd=fd)
        return self.attrs(node, st)

    @staticmethod
    def _lstat_at(dir_fd: int, name: bytes) -> os.stat_result:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)

    @_guarded
    async def forget(self, inode_list):
        for n, (ino, count) in enumerate(inode_list, 1):
            if n % FORGET_STEP == 0:
                await trio.lowlevel.checkpoint()
            if self.views.owns(ino):
                self.views.forget(ino, count)
            else:
                self.table.forget(ino, count)
                if ino not in self.table.by_ino:
                    self.watch.directory_forgotten(ino)

    async def getattr(self, inode, ctx=None):
        # The most frequent request (every stat at timeout 0, and before each xattr call
        # the kernel checks permissions with): a known inode with a kept fd on local SOURCE
        # costs one fstat and a compare with the last reply, with no call that could yield
        # to trio's scheduler and as few Python calls as possible (tests/test_fs_hotpath.py).
        try:
            node = self.table.by_ino.get(inode)
            if node is None or node.fd is None or node.transient or not self.local:
                return await self._getattr(inode)
            ttl = self.stat_ttl
            st = node.stat if ttl > 0 else None
            if st is None or time.monotonic() - node.stat_time > ttl:
                # e.g. right after a write, the write's own fstat usually answers
                st = os.fstat(node.fd)
                if ttl > 0:
                    node.stat, node.stat_time = st, time.monotonic()
            built = node.reply
            if built is not None and built[1] == self.timeout and \
                    _same_attributes(built[0], st) and \
                    (node.file_type != stat.S_IFDIR or self.watch.watching(node.ino)):
                return built[2]
            return self.attrs(node, st)
        except Exception as exc:
            raise _fuse_error(exc, "getattr") from None

    async def _getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        if self.views.owns(inode):
            return await self.views.getattr(inode)
        node = self.table.get(inode)
        st = self._fresh_stat(node)
        if st is None:
            changes = node.changes
            st = self._inline(node, os.fstat) if self.local else await self._stat(node)
            if changes == node.changes:
                self._remember_stat(node, st)
        return self.attrs(node, st)

    @_guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        if self.readonly or self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        handle = self.files.get(fh) if fh is not None else None
        changes, st = node.changes, None
        try:
            if fields.update_size and (handle is None or handle.node is not node):
                # truncate by path waits for a lease break like an open for writing:
                # never on this thread
                st = await self._with_handle(handle, node, self._apply_setattr, attr, fields,
                                             uid=ctx.uid if ctx is not None else 0)
            else:
                st = await self._with_handle(handle, node, self._apply_setattr, attr, fields)
        finally:
            self._attrs_changed(node, st, changes)
        if fields.update_size and node.path is not None:
            await self.views.source_changed(node.path)
        return self.attrs(node, st)

    async def _with_handle(self, handle: Handle | None, node: Inode, fn: Callable, *args,
                           uid: int | None = None):
        """``fn(path_fd, open_fd or None, *args)``, both fds kept open for the call; with
        ``uid``, in a worker thread of that user's share (a call that may wait)."""
        if handle is not None and handle.node is not node:
            handle = None
        if handle is not None:
            handle.busy += 1
        try:
            if uid is not None:
                fd = self.table.hold(node)
                try:
                    return await self.workers.run(uid, fn, fd, handle.fd if handle else None,
                                                  *args)
                finally:
                    self.table.unhold(node)
            return await self._on(node, fn, handle.fd if handle else None, *args)
        finally:
            if handle is not None:
                self._handle_done(handle)

    @staticmethod
    def _apply_setattr(fd: int, open_fd: int | None, attr, fields) -> os.stat_result:
        current = os.fstat(fd)
        if fields.update_uid or fields.update_gid:  # before chmod: chown clears set-id bits
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            _chown_fd(fd, uid, gid)
        if fields.update_mode and not stat.S_ISLNK(current.st_mode):  # symlinks have no mode
            mode = stat.S_IMODE(attr.st_mode)
            if open_fd is not None:
                os.fchmod(open_fd, mode)
            else:
                os.chmod(proc_path(fd), mode)
        if fields.update_size:
            if open_fd is not None:
                os.ftruncate(open_fd, attr.st_size)
            elif stat.S_ISDIR(current.st_mode):
                raise IsADirectoryError(errno.EISDIR, "directory")
            elif not stat.S_ISREG(current.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            else:
                os.truncate(proc_path(fd), attr.st_size)
        if fields.update_atime or fields.update_mtime:
            now = os.fstat(fd)
            _utime_fd(fd, attr.st_atime_ns if fields.update_atime else now.st_atime_ns,
                      attr.st_mtime_ns if fields.update_mtime else now.st_mtime_ns)
        return os.fstat(fd)

    @_guarded
    async def readlink(self, inode, ctx=None):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return await self._on(self.table.get(inode), self._readlink)

    @staticmethod
    def _readlink(fd: int) -> bytes:
        return os.readlink(b"", dir_fd=fd)  # readlinkat(fd, ""): the O_PATH symlink itself

    @_guarded
    async def access(self, inode, mode, ctx):
        # Permission checks are the kernel's (we always mount with default_permissions).
        if self.views.owns(inode) and mode & os.W_OK:
            return False
        return True

    @_guarded
    async def statfs(self, ctx):
        sv = await self._on(self.table.root, os.fstatvfs)
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(out, name, getattr(sv, name))
        return out

    # -- directories -----------------------------------------------------------------------
    @_guarded
    async def opendir(self, inode, ctx):
        if self.views.owns(inode):
            return await self.views.opendir(inode, ctx)
        node = self.table.get(inode)
        handle = self.next_handle()
        # listed at the first readdir, not now: names made between opendir and the first
        # readdir (or a rewinddir before any) must show (POSIX; xfstests generic/471). The
        # object is checked now: ESTALE from open(2) makes the kernel look the name up again.
        self.table.fd(node)
        self.table.let_go(node)
        self.dirs[handle] = [node, None, None, False, None, None, ctx.uid if ctx is not None else 0]
        return handle

    async def _dir_state(self, node: Inode, uid: int = 0) -> list:
        """An open directory: [inode, its listing as of now, . and .., read from yet,
        NameOnlyEntry for names the kernel holds current attributes of, or None, the
        listing's rows (dirlist.rows)]."""
        listing, current = await self._dir_listing(node, uid)
        dots = await self._on(node, self._dots, node is self.table.root)
        plain = NameOnlyEntry(stat.S_IFREG) if current and NameOnlyEntry.available else None
        frozen = listing.frozen()
        entries = (self.snapshots.rows(node.path, listing) if current else None) \
            or listing_rows(frozen)
        return [node, frozen, dots, False, plain, entries, uid]

    async def _dir_listing(self, node: Inode, uid: int = 0) -> tuple[Listing, bool]:
        """The current listing of directory ``node``: the one kept since the last scan when
        the watcher covers the directory (only names changed since are stat'ed again), else
        a fresh snapshot or a new scan; and whether every change in SOURCE has reached the
        kernel's caches (the directory is watched and no change is waiting)."""
        rel = node.path
        # a change behind the mount not yet applied to our caches: none of them is current
        pending = self.watch.pending()
        watched = rel is not None and not pending and self.watch.watching(node.ino)
        listing = None
        if rel is not None and not pending:
            listing = (self.snapshots.kept(rel, node) if watched else None) \
                or self.snapshots.listing(rel)
        generation = self.snapshots.generation
        fresh = False
        skip = VIEWS_NAME if node is self.table.root else None  # shadowed by the views
        if listing is not None and listing.unknown:
            listing = await self._on(node, patched, listing.frozen(), skip)
            fresh = True
        if listing is None:
            listing = await self._scan(node, uid, skip, None)
            fresh = True
            if rel is not None and len(listing.stats) <= self.snapshots.max_entries:
                self.snapshots.store(rel, generation, listing)
        if watched and fresh:
            self.snapshots.keep(rel, node, generation, listing)
        return listing, watched

    async def _scan(self, node: Inode, uid: int, skip: bytes | None,
                    max_entries: int | None) -> Listing | None:
        """A listing of directory ``node`` (None: more than ``max_entries``): on local
        SOURCE its first ``SCAN_INLINE`` entries on this thread (most directories are done
        then), the rest of a big one in a worker thread of ``uid``'s share, so a listing
        of 100k names never holds up anyone else's requests."""
        fd = self.table.hold(node)
        try:
            if not self.local:
                return await self.workers.run(uid, self._scan_whole, fd, skip, max_entries)
            scan = Scan(fd, skip, max_entries)
            try:
                if not scan.step(SCAN_INLINE):
                    await self.workers.run(uid, self._scan_rest, scan)
                return scan.result()
            finally:
                scan.close()
        finally:
            self.table.unhold(node)

    @classmethod
    def _scan_whole(cls, fd: int, skip: bytes | None, max_entries: int | None) -> Listing | None:
        scan = Scan(fd, skip, max_entries)
        try:
            cls._scan_rest(scan)
            return scan.result()
        finally:
            scan.close()

    @staticmethod
    def _scan_rest(scan: Scan) -> None:
        scan.step(None)
        if not scan.too_big:
            scan.names = sorted(scan.stats)  # sort in the thread too

    def _dots(self, fd: int, is_root: bool) -> list:
        """``.`` and ``..`` as readdir reports them (``..`` of the root is the root)."""
        here = os.fstat(fd)
        up = here if is_root else os.stat(b"..", dir_fd=fd, follow_symlinks=False)
        number = pyfuse3.ROOT_INODE if is_root else self.table.number((here.st_dev, here.st_ino))
        up_number = pyfuse3.ROOT_INODE if is_root or (up.st_dev, up.st_ino) == self.table.root.key \
            else self.table.number((up.st_dev, up.st_ino))
        return [(b".", self._dot_attrs(number, here)), (b"..", self._dot_attrs(up_number, up))]

    @_guarded
    async def readdir(self, fh, start_id, token):
        if fh not in self.dirs:
            return await self.views.readdir(fh, start_id, token)
        state = self.dirs[fh]
        if state[1] is None or (start_id == 0 and state[3]):
            # the first read, or rewinddir: the directory as it is now (POSIX)
            state[:] = await self._dir_state(state[0], state[6])
        state[3] = True
        node, listing, dots, _, plain, entries, _ = state
        for i in range(start_id, len(dots)):  # no lookup reference for these two
            if not pyfuse3.readdir_reply(token, dots[i][0], dots[i][1], i + 1):
                return
        # Per entry: the attributes built once per stat (shared with lookups and with later
        # listings of a kept listing), found through the listing's rows, so a repeated
        # listing costs a few identity checks and the reply.
        # A name whose inode the kernel holds already, with attributes that are current or
        # invalidated (``plain``: every change has reached it), goes by name only: the kernel
        # then neither updates that inode nor drops its cached ACLs (which `ls -l` would ask
        # for again), and counts no lookup.
        by_ino, reply, file_type = self.table.by_ino, pyfuse3.readdir_reply, stat.S_IFMT
        plain_attrs, plain_ino = (plain.attrs, plain.ino) if plain is not None else (None, None)
        plain_type = plain_attrs.st_mode if plain is not None else 0  # as the last call left it
        start = max(0, start_id - len(dots))
        stale = False
        built = 0
        first = len(dots) + 1
        # only this reply's rows (LazyRows makes them now), never a copy of a big listing
        for i, (name, st, entry) in enumerate(entries[start:start + READDIR_MAX], start + first):
            if entry is not None and entry[0] is st and by_ino.get(entry[1].ino) is entry[1]:
                child, attrs = entry[1], entry[2]
                if plain_attrs is not None and child.lookups:
                    if file_type(st.st_mode) != plain_type:  # the entry's type
                        plain_type = plain_attrs.st_mode = file_type(st.st_mode)
                    plain_ino.value = child.ino
                    if not reply(token, name, plain_attrs, i):
                        return
                    continue
            elif built >= READDIR_NEW_MAX:
                return  # enough work for one request: the kernel asks for the rest
            else:
                built += 1
                child, attrs = self._listed(listing, node, name, st)
                if not stale and node.path is not None:
                    stale = True
                    self.snapshots.rows_stale(node.path)
            if not reply(token, name, attrs, i):
                self.table.drop_if_unused(child)
                return
            child.lookups += 1

    @_guarded
    async def releasedir(self, fh):
        if self.dirs.pop(fh, None) is None:
            self.views.releasedir(fh)

    @_guarded
    async def fsyncdir(self, fh, datasync):
        if fh in self.dirs:
            node = self.dirs[fh][0]
            fd = self.table.hold(node)
            try:
                await _in_thread(self._fsync_dir, fd)
            finally:
                self.table.unhold(node)
        await self._meta_sync()

    @staticmethod
    def _fsync_dir(fd: int) -> None:
        dir_fd = os.open(b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def _meta_sync(self) -> None:
        """Make every acknowledged metadata write durable (CONTRACT: fsync of any file)."""
        await self._meta_call_fn(self.meta.sync)

    @_guarded
    async def mkdir(self, parent_inode, name, mode, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, st = await self._change_names(parent, (rel,), self._make, parent, ctx,
                                          self._mkdir, name, stat.S_IMODE(mode))
        return (await self._created(parent, rel, name, fd, st))[1]

    @staticmethod
    def _mkdir(dir_fd: int, name: bytes, mode: int) -> None:
        os.mkdir(name, mode, dir_fd=dir_fd)

    def _make(self, parent: Inode, ctx, make: Callable, name: bytes, *args) -> tuple:
        """Create ``name`` in ``parent`` with ``make(dir_fd, name, *args)`` as the caller,
        then an O_PATH fd of what was created and its stat."""
        dir_fd = self.table.fd(parent)
        self.caller.run(ctx, make, dir_fd, name, *args)
        return self._open_path(dir_fd, name)

    @_guarded
    async def rmdir(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, is_dir=True)

    # -- names -----------------------------------------------------------------------------
    @_guarded
    async def unlink(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, is_dir=False)

    async def _remove(self, parent_inode, name, is_dir: bool) -> None:
        """rmdir/unlink in SOURCE, then drop the name, its views and its metadata (subtree)."""
        parent, rel = self._dir(parent_inode, name)
        self._pin(parent, rel, name)
        victim = self.table.by_path.get(rel) if rel is not None else None
        remove = functools.partial(os.rmdir if is_dir else os.unlink, name)
        key = await self._change_names(parent, (rel,), self._remove_at, remove, parent, name)
        self._links_changed(key)
        if rel is None:
            return
        self.table.unlinked(rel, is_dir=is_dir)
        await self.views.source_changed(rel)
        # the name is gone: that is the answer, whatever becomes of its metadata
        await self.ownership.unlinked(rel, victim)

    def _pin(self, parent: Inode, rel: bytes | None, name: bytes) -> None:
        """Open the fd of the object about to lose the name ``rel``, so that it stays
        reachable by inode (open-but-unlinked files, other hard links)."""
        victim = self.table.by_path.get(rel) if rel is not None else None
        if victim is not None and victim.fd is None and victim.parent == parent.ino \
                and victim.name == name:
            try:
                self.table.fd(victim)
            except (OSError, pyfuse3.FUSEError):
                pass

    def _remove_at(self, remove: Callable, parent: Inode, name: bytes) -> tuple | None:
        """Remove ``name``; the key of the object that lost it (None if unknown)."""
        dir_fd = self.table.fd(parent)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        remove(dir_fd=dir_fd)
        return None if st is None else (st.st_dev, st.st_ino)

    def _links_changed(self, key: tuple | None) -> None:
        """The object ``key`` lost a name: its remembered stat (nlink, ctime) is stale, also
        when the name was one of those no longer kept per inode (MAX_PATHS)."""
        node = self.table.by_key.get(key) if key is not None else None
        if node is not None:
            self._forget_stat_node(node)
            # listings hold its stat under every name (hard links: not only node.paths)
            self.snapshots.attrs_changed(*self.table.names_of(node))

    @_guarded
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old_parent, old = self._dir(parent_inode_old, name_old)
        new_parent, new = self._dir(parent_inode_new, name_new)
        self._pin(new_parent, new, name_new)  # a replaced file may still be open
        self.table.hold(new_parent)
        try:
            replaced, moved, other, dirs, dst_key = await self._change_names(
                old_parent, (old, new), self._rename, old_parent, name_old, new_parent,
                name_new, flags)
        finally:
            self.table.unhold(new_parent)
        self._forget_stat_node(new_parent)
        if replaced:
            self._links_changed(dst_key)
        # The objects now live under their new names: their fds are opened from there.
        for key, parent, name in ((moved, new_parent, name_new), (other, old_parent, name_old)):
            node = self.table.by_key.get(key) if key is not None else None
            if node is not None:
                node.parent, node.name = parent.ino, name
        if old is None or new is None:
            return
        await self.views.source_changed(old)
        await self.views.source_changed(new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            self.table.renamed([(old, new), (new, old)], dirs)
            tmp = self.store_path(b".journalfs-exchange-%d" % next(self._exchange_tmp))
            await self._meta_restructure_after(old, "move", self.store_path(old), tmp)
            await self._meta_restructure_after(old, "move", self.store_path(new),
                                               self.store_path(old))
            await self._meta_restructure_after(old, "move", tmp, self.store_path(new))
            return
        if replaced:
            self.table.unlinked(new)
            await self._meta_restructure_after(new, "remove", self.store_path(new))
        self.table.renamed([(old, new)], dirs)
        await self._meta_restructure_after(old, "move", self.store_path(old),
                                           self.store_path(new))

    def _forget_stat_node(self, node: Inode) -> None:
        node.changes += 1
        node.stat = None

    def _rename(self, old_parent: Inode, old: bytes, new_parent: Inode, new: bytes,
                flags: int) -> tuple[bool, tuple | None, tuple | None, bool, tuple | None]:
        """Rename in SOURCE: (whether an existing, different object at ``new`` was
        replaced, key of the moved object, key of the object exchanged with it, whether
        a directory moved: then paths below the names change too, key of what was at
        ``new``)."""
        old_fd, new_fd = self.table.fd(old_parent), self.table.fd(new_parent)
        src = os.stat(old, dir_fd=old_fd, follow_symlinks=False)
        dst = None
        try:
            dst = os.stat(new, dir_fd=new_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        if flags:
            _renameat2(old_fd, old, new_fd, new, flags)
        else:
            os.rename(old, new, src_dir_fd=old_fd, dst_dir_fd=new_fd)
        src_key = (src.st_dev, src.st_ino)
        dst_key = None if dst is None else (dst.st_dev, dst.st_ino)
        replaced = dst_key is not None and dst_key != src_key
        exchanged = dst_key if flags & pyfuse3.RENAME_EXCHANGE else None
        dirs = stat.S_ISDIR(src.st_mode) or (exchanged is not None and stat.S_ISDIR(dst.st_mode))
        return replaced, src_key, exchanged, dirs, dst_key

    @_guarded
    async def symlink(self, parent_inode, name, target, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, st = await self._change_names(parent, (rel,), self._make, parent, ctx,
                                          self._symlink, name, bytes(target))
        return (await self._created(parent, rel, name, fd, st))[1]

    @staticmethod
    def _symlink(dir_fd: int, name: bytes, target: bytes) -> None:
        os.symlink(target, name, dir_fd=dir_fd)

    @_guarded
    async def link(self, inode, new_parent_inode, new_name, ctx):
        if self.readonly or self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        parent, rel = self._dir(new_parent_inode, new_name)
        fd = self.table.hold(node)
        try:
            new_fd, st = await self._change_names(parent, (rel,), self._link, fd, parent,
                                                  new_name)
        finally:
            self.table.unhold(node)
            self._attrs_changed(node)  # nlink
        sources = [p for p in self.table.names_of(node) if p != rel]
        linked, attrs = await self._created(parent, rel, new_name, new_fd, st)
        self.snapshots.attrs_changed(*self.table.names_of(linked))
        if rel is not None and sources:
            # metadata belongs to the file: the new name shows what the others show
            await self._meta_restructure("copy", self.store_path(sources[-1]),
                                         self.store_path(rel))
        return attrs

    def _link(self, fd: int, parent: Inode, name: bytes) -> tuple[int, os.stat_result]:
        dir_fd = self.table.fd(parent)
        if _IS_ROOT:  # linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH
            _check(_libc.linkat(fd, b"", dir_fd, name, _AT_EMPTY_PATH))
        else:  # the proc link leads to the same object
            _check(_libc.linkat(-100, proc_path(fd), dir_fd, name, 0x400))  # AT_SYMLINK_FOLLOW
        return self._open_path(dir_fd, name)

    @_guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, st = await self._change_names(parent, (rel,), self._make, parent, ctx,
                                          self._mknod, name, mode, rdev)
        return (await self._created(parent, rel, name, fd, st))[1]

    @staticmethod
    def _mknod(dir_fd: int, name: bytes, mode: int, rdev: int) -> None:
        os.mknod(name, mode, rdev, dir_fd=dir_fd)

    # -- files -----------------------------------------------------------------------------
    @_guarded
    async def open(self, inode, flags, ctx):
        if self.views.owns(inode):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                raise pyfuse3.FUSEError(errno.EROFS)
            return await self.views.open(inode)
        if self.readonly and flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        changes = node.changes
        uid = ctx.uid if ctx is not None else 0
        path_fd = self.table.hold(node)
        try:
            fd = st = None
            if self.local and node.file_type in (stat.S_IFREG, stat.S_IFDIR):
                # Linux answers EWOULDBLOCK instead of waiting for a lease break (started
                # now): only then does this open need a thread, of its user's share
                try:
                    fd, st = self._reopen(path_fd, node, flags, nonblocking=True)
                except BlockingIOError:
                    pass
            if fd is None:  # FIFOs/devices may block: only this user's requests wait
                fd, st = await self.workers.run(uid, self._reopen, path_fd, node, flags)
        finally:
            self.table.unhold(node)
        if flags & os.O_TRUNC:
            self._attrs_changed(node)
        elif changes == node.changes:
            self._remember_stat(node, st)
        ident = (st.st_size, st.st_mtime_ns)
        keep = node.cache_ident == ident  # unchanged since last close
        fh = self._new_handle(node, fd, ctx)
        handle = self.files[fh]
        handle.direct = bool(flags & os.O_DIRECT)
        if not flags & os.O_TRUNC:
            handle.opened, handle.changes = ident, node.changes
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    def _new_handle(self, node: Inode, fd: int, ctx=None) -> int:
        fh = next(self._file_handles)
        node.open_handle(fh)
        self.files[fh] = Handle(fd, node, writer=(ctx.uid, ctx.gid) if ctx is not None else (0, 0))
        return fh

    @staticmethod
    def _reopen(path_fd: int, node: Inode, flags: int,
                nonblocking: bool = False) -> tuple[int, os.stat_result]:
        """A real fd of ``node``'s object, opened with ``flags``; ``nonblocking``: with
        O_NONBLOCK added (BlockingIOError where the open would wait for a lease break),
        then cleared again unless the caller asked for it."""
        # O_DIRECT is the kernel's business: its requests reach us in unaligned buffers
        flags = (flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_DIRECT)) | os.O_CLOEXEC
        if nonblocking and flags & os.O_NONBLOCK:
            nonblocking = False  # the caller's own flag: kept
        fd = os.open(proc_path(path_fd), flags | os.O_NONBLOCK if nonblocking else flags)
        try:
            if nonblocking:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            st = os.fstat(fd)
            if not same_object(st, node):
                raise stale()
            return fd, st
        except BaseException:
            os.close(fd)
            raise

    @_guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, path_fd, st = await self._change_names(parent, (rel,), self._create, parent,
                                                   name, stat.S_IMODE(mode), flags, ctx)
        node, attrs = await self._created(parent, rel, name, path_fd, st)
        return pyfuse3.FileInfo(fh=self._new_handle(node, fd, ctx)), attrs

    def _create(self, parent: Inode, name: bytes, mode: int, flags: int, ctx):
        dir_fd = self.table.fd(parent)
        flags = (flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC) & ~(os.O_NOCTTY | os.O_DIRECT)
        fd = self.caller.run(ctx, functools.partial(os.open, name, flags, mode, dir_fd=dir_fd))
        try:
            path_fd = os.open(proc_path(fd), os.O_PATH | os.O_CLOEXEC)
            return fd, path_fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    @_guarded
    async def read(self, fh, off, size):
        if fh >= HANDLE_BASE:
            return await self.views.read(fh, off, size)
        handle = self._handle(fh)
        if self.local:
            return os.pread(handle.fd, size, off)
        return await self._handle_call(handle, os.pread, size, off)

    def _handle(self, fh: int) -> Handle:
        handle = self.files.get(fh)
        if handle is None or handle.released:
            raise pyfuse3.FUSEError(errno.EBADF)
        return handle

    async def _handle_call(self, handle: Handle, fn: Callable, *args) -> Any:
        """``fn(handle.fd, *args)`` in a worker thread of the opener's share (fsync and I/O
        on a network SOURCE may wait long); the fd stays open until it returns."""
        handle.busy += 1
        try:
            return await self.workers.run(handle.writer[0], fn, handle.fd, *args)
        finally:
            self._handle_done(handle)

    def _handle_done(self, handle: Handle) -> None:
        handle.busy -= 1
        if handle.released and handle.busy == 0:
            os.close(handle.fd)

    @_guarded
    async def write(self, fh, off, buf):
        if fh >= HANDLE_BASE or self.readonly:
            raise pyfuse3.FUSEError(errno.EROFS)
        handle = self._handle(fh)
        handle.written = True
        node = handle.node
        changes, st = node.changes, None
        uid, gid = handle.writer
        try:
            handle.own_writes += 1
            # as the writer: root's reserved blocks and quotas apply to them as on SOURCE
            if self.local:
                written, st = self.caller.as_user(uid, gid, self._write, handle.fd, buf, off)
            else:
                written, st = await self._handle_call(
                    handle, lambda fd: self.caller.as_user(uid, gid, self._write, fd, buf, off))
            return written
        finally:
            self._attrs_changed(node, st, changes)

    @staticmethod
    def _write(fd: int, buf: bytes, off: int) -> tuple[int, os.stat_result]:
        """pwrite, and the attributes the kernel will ask for next (it drops its own)."""
        return os.pwrite(fd, buf, off), os.fstat(fd)

    @_guarded
    async def flush(self, fh):
        # close(2) semantics of the underlying filesystem (e.g. NFS flushes on close): only
        # a written file has anything to flush, so a read-only close costs nothing.
        handle = self.files.get(fh) if fh < HANDLE_BASE else None
        if handle is not None and handle.written:
            if not self.local:
                await self._handle_call(handle, lambda fd: os.close(os.dup(fd)))
            await self._written_out(handle)

    async def _written_out(self, handle: Handle) -> None:
        """A written file is being closed (flush is synchronous with close(2), release is
        not): refresh the views of it before close returns."""
        if handle.written:
            handle.written = False
            if handle.node.path is not None:
                await self.views.source_changed(handle.node.path)

    @_guarded
    async def fsync(self, fh, datasync):
        handle = self.files.get(fh) if fh < HANDLE_BASE else None
        if handle is not None:
            await self._handle_call(handle, os.fdatasync if datasync else os.fsync)
        await self._meta_sync()

    @_guarded
    async def release(self, fh):
        if fh >= HANDLE_BASE:
            self.views.release(fh)
            return
        handle = self.files.pop(fh, None)
        if handle is None:
            return
        await self._written_out(handle)
        node = handle.node
        handle.released = True
        try:
            if handle.opened is not None and handle.changes == node.changes:
                # nothing changed through the mount since the open: what it saw stands (a
                # change behind the mount makes the next open's fstat differ: no keep_cache)
                node.cache_ident = handle.opened
            else:
                changes = node.changes
                st = await self._io(os.fstat, handle.fd)
                # the kernel's cache is current only if every change since the open came
                # through this handle's own buffered writes: a write through another handle
                # (O_DIRECT above all) can race this handle's reads into stale pages, and
                # mtime is too coarse to tell (xfstests generic/451)
                only_own = not handle.direct and handle.changes >= 0 and \
                    changes - handle.changes == handle.own_writes
                node.cache_ident = (st.st_size, st.st_mtime_ns) if only_own else None
                if changes == node.changes:
                    self._remember_stat(node, st)
        finally:
            if handle.busy == 0:
                os.close(handle.fd)
            self.table.release_handle(node, fh)

    # -- extended attributes ---------------------------------------------------------------
    async def _meta_call(self, method: str, *args):
        return await self._meta_call_fn(getattr(self.meta, method), *args)

    async def _meta_call_fn(self, fn: Callable, *args):
        """Call the metadata service, turning its errors into errnos."""
        try:
            return await fn(*args)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            if exc.errno:
                raise pyfuse3.FUSEError(exc.errno) from None
            log.exception("metadata %s%r failed", getattr(fn, "__name__", fn), args)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("metadata %s%r failed", getattr(fn, "__name__", fn), args)
            raise pyfuse3.FUSEError(errno.EIO) from None

    async def _meta_values(self, store_path: str) -> dict:
        """Every metadata key of ``store_path``: from memory when cached (no thread hop)."""
        cache = self.meta_cache
        values = cache.get_all(store_path) if cache is not None else None
        if values is None:
            generation = cache.generation if cache is not None else 0
            values = await self._meta_call("get_all", store_path) or {}
            if cache is not None:
                cache.store(store_path, generation, values)
        return values

    async def _meta_get(self, store_path: str, key: str):
        if self.meta_cache is None:
            return await self._meta_call("get", store_path, key)
        return (await self._meta_values(store_path)).get(key)

    async def _meta_write(self, method: str, store_path: str, key: str, value=None) -> None:
        """set/unset one key, keeping the cache exact (dropped when the outcome is unknown)."""
        try:
            await self._meta_call(method, store_path, key, *(() if value is None else (value,)))
        except BaseException:
            if self.meta_cache is not None:
                self.meta_cache.forget(store_path)
            raise
        if self.meta_cache is not None:
            self.meta_cache.written(store_path, key, value)

    async def _meta_restructure_after(self, rel: bytes, method: str, *paths: str) -> None:
        """A store change following a namespace change that already happened in SOURCE:
        its failure (a full store) is logged, never the caller's answer (the ledger keeps
        the entries tied to their file, so they are never shown on another one)."""
        try:
            await self._meta_restructure(method, *paths)
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata %s for %r failed after the change in SOURCE: %s", method,
                        rel, exc)

    async def _meta_restructure(self, method: str, *paths: str) -> None:
        """remove/move/copy whole subtrees in the store; cached values are dropped after."""
        try:
            await self._meta_call(method, *paths)
        finally:
            if self.meta_cache is not None:
                self.meta_cache.moved_or_removed()

    def _names_if_writable(self, fd: int, node: Inode) -> list[bytes]:
        """:meth:`_names_now` of a file whose attributes may change: EPERM for an immutable
        or append-only one, as the kernel answers for its native xattrs."""
        if _frozen(fd):
            raise pyfuse3.FUSEError(errno.EPERM)
        return self._names_now(fd, node)

    def _names_now(self, fd: int, node: Inode) -> list[bytes]:
        """The names of ``node`` (O_PATH ``fd``) that still mean its object in SOURCE
        (ENOENT if none: a file deleted behind the mount's back gets no metadata)."""
        if node is self.table.root:
            return [b""]
        names = []
        for rel in self.table.names_of(node):  # a name that still means it: it is linked
            try:
                st = os.stat(rel, dir_fd=self.table.root.fd, follow_symlinks=False)
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    continue
                if os.fstat(fd).st_nlink == 0:
                    continue  # no name left at all
                st = None  # too long to check in one call: trust what we saw
            if st is None or same_object(st, node):
                names.append(rel)
        if not names:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return names

    async def getxattr(self, inode, name, ctx=None):
        # A cached user.metadata.* value of a known inode is a few dict lookups, with no
        # call that could yield (tests/test_fs_hotpath.py); anything else takes _getxattr.
        try:
            node = self.table.by_ino.get(inode)
            cache = self.meta_cache
            key = xattrs.known_metadata_key(name)
            if node is not None and cache is not None and key is not None:
                made, paths = node.meta_path, node.paths
                if made is not None and paths and made[0] is paths[-1]:
                    values = cache.get_all(made[1])
                    if values is not None:
                        value = values.get(key)
                        if value is None:
                            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
                        return xattrs.encode_value(value)
            return await self._getxattr(inode, name)
        except Exception as exc:
            raise _fuse_error(exc, "getxattr") from None

    async def _getxattr(self, inode: int, name: bytes) -> bytes:
        if self.views.owns(inode):
            return await self.views.getxattr(inode, name)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            return await self._on(node, self._native_getxattr, name)
        store_path = await self.ownership.store_path(node)
        if store_path is None:  # unlinked: its metadata went with its last name
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = await self._meta_get(store_path, key)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return xattrs.encode_value(value)

    @staticmethod
    def _native_getxattr(fd: int, name: bytes) -> bytes:
        return os.getxattr(proc_path(fd), name)

    @_guarded
    async def setxattr(self, inode, name, value, ctx):
        if self.views.owns(inode):  # read-only, but for the settings on .journalfs itself
            return await self.views.setxattr(inode, name, value, ctx)
        if self.readonly:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            if bytes(name).startswith(b"system.posix_acl_"):
                await self._set_acl(node, name, value, ctx)
                return
            await self._change_native_xattr(node, os.setxattr, name, value)
            return
        self._check_user_xattr_allowed(node)
        decoded = xattrs.decode_value(value)
        names = await self._on(node, self._names_if_writable, node)
        # metadata belongs to the file: every name of it, within the owner's quota
        await self.ownership.set(node, names, key, decoded)

    async def _set_acl(self, node: Inode, name: bytes, value: bytes, ctx) -> None:
        """An ACL set with the caller's credentials, so that SOURCE itself decides whether
        the set-group-ID bit goes (an owner outside the file's group loses it, as natively:
        xfstests generic/375); the kernel checked the permission already."""
        def set_as_caller(fd: int) -> None:
            if node.file_type not in (stat.S_IFREG, stat.S_IFDIR):  # never open devices
                os.setxattr(proc_path(fd), name, value)
                return
            # opened as ourselves (the /proc link is ours alone), set as the caller
            real = os.open(proc_path(fd), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY |
                           os.O_CLOEXEC)
            try:
                if not same_object(os.fstat(real), node):
                    raise stale()
                self.caller.run(ctx, os.setxattr, real, name, value)
            finally:
                os.close(real)
        try:
            await self._on(node, set_as_caller)
        finally:
            self._attrs_changed(node)  # ctime, and the mode the ACL may have changed
        if node.path is not None:
            await self.views.source_changed(node.path)  # the views mirror ACLs (views.py)

    async def _change_native_xattr(self, node: Inode, change, *args) -> None:
        """``os.setxattr``/``os.removexattr`` on the SOURCE object itself."""
        try:
            await self._on(node, lambda fd: change(proc_path(fd), *args))
        finally:
            self._attrs_changed(node)  # ctime
        if bytes(args[0]).startswith(b"system.posix_acl_") and node.path is not None:
            await self.views.source_changed(node.path)  # the views mirror ACLs (views.py)

    @staticmethod
    def _check_user_xattr_allowed(node: Inode) -> None:
        # Natively only regular files and directories carry user.* attributes.
        if node.file_type not in (stat.S_IFREG, stat.S_IFDIR):
            raise pyfuse3.FUSEError(errno.EPERM)

    @_guarded
    async def removexattr(self, inode, name, ctx):
        if self.readonly or self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            await self._change_native_xattr(node, os.removexattr, name)
            return
        self._check_user_xattr_allowed(node)
        names = await self._on(node, self._names_if_writable, node)
        store_path = await self.ownership.store_path(node)
        if store_path is None or await self._meta_get(store_path, key) is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        await self.ownership.unset(node, names, key)

    @_guarded
    async def listxattr(self, inode, ctx):
        if self.views.owns(inode):
            return await self.views.listxattr(inode)
        node = self.table.get(inode)
        native = await self._on(node, lambda fd: os.listxattr(proc_path(fd)))
        hide_trusted = any(n.startswith("trusted.") for n in native) \
            and not self.caller.capable(ctx, _CAP_SYS_ADMIN)
        names = []
        for n in native:
            raw = os.fsencode(n)
            if raw.startswith(xattrs.METADATA_PREFIX):
                continue  # shadowed by the store's keys
            if hide_trusted and raw.startswith(b"trusted."):
                continue  # Linux lists these to CAP_SYS_ADMIN only
            names.append(raw)
        store_path = await self.ownership.store_path(node) \
            if node.file_type in (stat.S_IFREG, stat.S_IFDIR) else None
        if store_path is not None:
            stored = await self._meta_values(store_path)
            names += xattrs.metadata_names(stored)
        return names


def _raise_fd_limit() -> None:
    """One O_PATH fd per inode the kernel holds: allow as many as the system does."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if _IS_ROOT:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                want = max(hard, int(f.read()))
        except (OSError, ValueError):
            pass
    for limit in ((want, want), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return
        except (ValueError, OSError):
            continue
