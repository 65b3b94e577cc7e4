"""The pyfuse3 Operations: SOURCE mirrored through, metadata as xattrs, views under /.journalfs.

One small async handler per request. Every syscall on SOURCE runs in a worker thread
(``trio.to_thread.run_sync``) so a slow disk never stalls the single trio thread; answers
that need no syscall are given inline: lookups from a listing of a busy directory, getattr
from the stat the last change through the mount took, metadata from a cache (see caches.py).
Related syscalls share one thread call (open+fstat, write+fstat, change+lstat of the
directory, fstat+close). The kernel caches names and attributes for the mount's timeout,
so everything journalfs changes is invalidated precisely, right after the change. SOURCE paths are never followed through a final
symlink (``lstat``, ``O_NOFOLLOW``, ``follow_symlinks=False``).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import os
import stat
import time
from typing import Any, Callable

import pyfuse3
import trio

from . import xattrs
from .caches import UNKNOWN, DirSnapshots, Listing, MetaCache
from .inodes import Inode, InodeTable, join
from .views import VIEWS_NAME, Views
from .watch import SourceWatcher

log = logging.getLogger("journalfs.fs")

#: File handles at or above this are ours (directory listings, virtual files); below are fds.
HANDLE_BASE = 1 << 32
_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_IS_ROOT = os.geteuid() == 0
_ABSENT = object()
#: Longest a directory listing or a remembered stat answers lookups/getattr from memory
#: (never longer than the kernel's own timeout; anything changed through the mount is
#: forgotten at once).
SNAPSHOT_TTL = 2.0
#: statfs f_type of filesystems whose close(2) flushes nothing (no deferred write errors):
#: ext2/3/4, xfs, btrfs, tmpfs, f2fs. Elsewhere (NFS, CIFS, FUSE...) flush re-closes a dup.
LOCAL_FS_TYPES = {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010}


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def _fs_type(path: bytes) -> int | None:
    buf = _Statfs()
    if _libc.statfs(path, ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


def _renameat2(old: bytes, new: bytes, flags: int) -> None:
    if _libc.renameat2(_AT_FDCWD, old, _AT_FDCWD, new, ctypes.c_uint(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _guarded(fn: Callable) -> Callable:
    """Only FUSEError may leave a handler: OSError keeps its errno, anything else is EIO."""
    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
    return handler


async def _in_thread(fn: Callable, *args: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


class JournalFS(pyfuse3.Operations):
    """SOURCE passthrough + ``user.metadata.*`` xattrs backed by a metadata service."""

    enable_writeback_cache = False

    def __init__(self, source: str, meta, location, *, timeout: float = 1.0,
                 options: dict | None = None):
        super().__init__()
        self.src = os.fsencode(os.path.abspath(source))
        self.meta = meta            # MetaService or GvfsdBackend (same async API)
        self.location = location    # StoreLocation: store paths for mount-relative paths
        self.timeout = timeout
        self._numbers = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._handles = itertools.count(HANDLE_BASE)
        self.table = InodeTable(lambda: next(self._numbers))
        self.files: dict[int, Inode] = {}                       # fd -> inode
        self.written: set[int] = set()                          # fds written since opened
        self.dirs: dict[int, tuple[Inode, Listing]] = {}       # handle -> (dir, its listing)
        self.views = Views(self, options or {})
        self._exchange_tmp = itertools.count()
        self.snapshots = DirSnapshots(min(timeout, SNAPSHOT_TTL))
        self.stat_ttl = min(timeout, SNAPSHOT_TTL)
        root = os.stat(self.src + b"/")
        self.local_dev = root.st_dev if _fs_type(self.src + b"/") in LOCAL_FS_TYPES else None
        # Metadata values are cached only for a store this mount alone writes.
        store = getattr(meta, "store", None)
        exclusive = store is not None and getattr(store, "readonly", True) is False
        self.meta_cache = MetaCache() if exclusive else None
        self.watch = SourceWatcher(self.source_changed)  # changes made behind the mount

    # -- helpers ---------------------------------------------------------------------------
    def next_inode(self) -> int:
        return next(self._numbers)

    def next_handle(self) -> int:
        return next(self._handles)

    def abs(self, rel: bytes) -> bytes:
        # The trailing "/" makes lstat follow SOURCE itself (it may be a /proc/self/fd link).
        return self.src + b"/" + rel

    def store_path(self, rel: bytes) -> str:
        return self.location.store_path("/" + os.fsdecode(rel))

    def attrs(self, node: Inode, st: os.stat_result) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.entry_timeout = self.timeout
        a.attr_timeout = self.timeout
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_rdev = st.st_rdev
        a.st_size = st.st_size
        a.st_blksize = st.st_blksize
        a.st_blocks = st.st_blocks
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        if stat.S_ISDIR(st.st_mode) and node.path is not None:  # the kernel will know it
            self.watch.directory_known(node.ino, path=self.abs(node.path))
        return a

    async def source_changed(self, dir_ino: int, name: bytes | None) -> int | None:
        """watch.py: SOURCE changed behind the mount at ``name`` in ``dir_ino`` (or the
        directory itself): drop what we remember of it; the kernel inode of it, if any."""
        directory = self.table.by_ino.get(dir_ino)
        if directory is None or directory.path is None:
            return None
        rel = directory.path if name is None else join(directory.path, name)
        self._namespace_changed(rel)
        await self.views.source_changed(rel)
        child = self.table.root if rel == b"" else self.table.by_path.get(rel)
        return None if child is None else child.ino

    def _path(self, node: Inode) -> bytes:
        if node.path is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node.path

    def _child(self, parent_ino: int, name: bytes) -> bytes:
        """SOURCE-relative path of ``name`` in a passthrough directory (EROFS in the views)."""
        if self.views.owns(parent_ino) or (parent_ino == pyfuse3.ROOT_INODE and name == VIEWS_NAME):
            raise pyfuse3.FUSEError(errno.EROFS)
        return join(self._path(self.table.get(parent_ino)), name)

    async def _stat(self, node: Inode) -> os.stat_result:
        return await _in_thread(self._stat_any, list(node.paths), list(node.handles))

    def _stat_any(self, paths: list[bytes], handles: list[int]) -> os.stat_result:
        """lstat of the newest path that exists; an unlinked but open file answers by fd."""
        for rel in reversed(paths):
            try:
                return os.lstat(self.abs(rel))
            except FileNotFoundError:
                continue
        for fd in handles:
            return os.fstat(fd)
        raise FileNotFoundError(errno.ENOENT, "gone")

    def _own(self, path: bytes, ctx, fd: int | None = None) -> None:
        """New objects belong to the caller, as on a native filesystem (we run as root)."""
        if not _IS_ROOT or (ctx.uid == 0 and ctx.gid == 0):
            return
        parent = os.lstat(os.path.dirname(path))
        gid = -1 if parent.st_mode & stat.S_ISGID else ctx.gid  # setgid dirs pass their group
        if fd is not None:
            os.fchown(fd, ctx.uid, gid)
        else:
            os.chown(path, ctx.uid, gid, follow_symlinks=False)

    async def _created(self, rel: bytes, st: os.stat_result) -> pyfuse3.EntryAttributes:
        node = self.table.remember(rel, st)
        await self.views.source_changed(rel)
        return self.attrs(node, st)

    async def _change_names(self, rels: tuple[bytes, ...], fn: Callable, *args: Any) -> Any:
        """Run the namespace change ``fn(*args)`` in a thread, then forget what it made stale.
        The same thread call lstats the directory of ``rels[0]``: the kernel asks for its
        new mtime right away, and that answer then costs no second hop."""
        dir_rel = os.path.dirname(rels[0])
        directory = self.table.root if dir_rel == b"" else self.table.by_path.get(dir_rel)
        changes = directory.changes if directory is not None else -1
        dir_st = None
        try:
            result, dir_st = await _in_thread(self._then_lstat, fn, args, self.abs(dir_rel))
            return result
        finally:
            self._namespace_changed(*rels)
            if directory is not None and dir_st is not None and changes + 1 == directory.changes:
                self._remember_stat(directory, dir_st)

    @staticmethod
    def _then_lstat(fn: Callable, args: tuple, path: bytes) -> tuple[Any, os.stat_result | None]:
        result = fn(*args)
        try:
            return result, os.lstat(path)
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

    def _listed(self, listing: Listing, dir_rel: bytes, name: bytes, st: os.stat_result):
        """(inode, attributes) of ``name``, listed with ``st``: built once per stat and shared
        by lookups and readdir. Adds no kernel reference: the caller counts one once the
        kernel has the answer."""
        built_from, child, attrs = listing.attrs.get(name, (None, None, None))
        if built_from is not st or self.table.by_ino.get(child.ino) is not child:
            child = self.table.remember(join(dir_rel, name), st, lookups=0)
            attrs = self.attrs(child, st)
            listing.attrs[name] = (st, child, attrs)
        return child, attrs

    async def _listing(self, dir_rel: bytes) -> Listing | None:
        """A fresh listing of ``dir_rel`` to answer lookups from, when it is busy enough."""
        listing = self.snapshots.listing(dir_rel)
        if listing is None and self.snapshots.worth_scanning(dir_rel):
            generation = self.snapshots.generation
            skip = VIEWS_NAME if dir_rel == b"" else None
            scanned = await _in_thread(self.snapshots.scan, self.abs(dir_rel), skip)
            self.snapshots.store(dir_rel, generation, scanned)
            listing = self.snapshots.listing(dir_rel)
        return listing

    # -- lookup / attributes ---------------------------------------------------------------
    @_guarded
    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == pyfuse3.ROOT_INODE and name == VIEWS_NAME:
            return self.views.lookup_root()
        if self.views.owns(parent_inode):
            return await self.views.lookup(parent_inode, name)
        parent = self.table.get(parent_inode)
        parent_rel = self._path(parent)
        if name == b".":
            rel = parent_rel
        elif name == b"..":
            rel = os.path.dirname(parent_rel)
        else:
            rel = join(parent_rel, name)
            listing = await self._listing(parent_rel)
            if listing is not None:  # answered from memory: `ls -l`, find, stat of many files
                st = listing.stats.get(name, _ABSENT)
                if st is _ABSENT:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                if st is not UNKNOWN:
                    child, attrs = self._listed(listing, parent_rel, name, st)
                    child.lookups += 1
                    return attrs
        st = await _in_thread(os.lstat, self.abs(rel))
        return self.attrs(self.table.remember(rel, st), st)

    @_guarded
    async def forget(self, inode_list):
        for ino, count in inode_list:
            if self.views.owns(ino):
                self.views.forget(ino, count)
            else:
                self.table.forget(ino, count)
                if ino not in self.table.by_ino:
                    self.watch.directory_forgotten(ino)

    @_guarded
    async def getattr(self, inode, ctx=None):
        if self.views.owns(inode):
            return await self.views.getattr(inode)
        node = self.table.get(inode)
        st = self._fresh_stat(node)
        if st is None:  # e.g. right after a write: the write's own fstat usually answers
            changes = node.changes
            st = await self._stat(node)
            if changes == node.changes:
                self._remember_stat(node, st)
        return self.attrs(node, st)

    @_guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        changes, st = node.changes, None
        try:
            st = await _in_thread(self._apply_setattr, node.path, list(node.handles), attr,
                                  fields, fh)
        finally:
            self._attrs_changed(node, st, changes)
        if fields.update_size and node.path is not None:
            await self.views.source_changed(node.path)
        return self.attrs(node, st)

    def _apply_setattr(self, rel: bytes | None, handles: list[int], attr, fields,
                       fh: int | None) -> os.stat_result:
        fd = fh if fh is not None and fh < HANDLE_BASE else None
        path = None
        if fd is None:
            if rel is not None and os.path.lexists(self.abs(rel)):
                path = self.abs(rel)
            elif handles:
                fd = handles[0]
            else:
                raise FileNotFoundError(errno.ENOENT, "gone")
        current = os.fstat(fd) if fd is not None else os.lstat(path)
        if fields.update_uid or fields.update_gid:  # before chmod: chown clears set-id bits
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            if fd is not None:
                os.fchown(fd, uid, gid)
            else:
                os.chown(path, uid, gid, follow_symlinks=False)
        if fields.update_mode:
            mode = stat.S_IMODE(attr.st_mode)
            if fd is not None:
                os.fchmod(fd, mode)
            elif not stat.S_ISLNK(current.st_mode):  # Linux symlinks have no mode of their own
                os.chmod(path, mode)
        if fields.update_size:
            if fd is not None:
                os.ftruncate(fd, attr.st_size)
            else:
                tfd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.ftruncate(tfd, attr.st_size)
                finally:
                    os.close(tfd)
        if fields.update_atime or fields.update_mtime:
            now = os.fstat(fd) if fd is not None else os.lstat(path)
            times = (attr.st_atime_ns if fields.update_atime else now.st_atime_ns,
                     attr.st_mtime_ns if fields.update_mtime else now.st_mtime_ns)
            if fd is not None:
                os.utime(fd, ns=times)
            else:
                os.utime(path, ns=times, follow_symlinks=False)
        return os.fstat(fd) if fd is not None else os.lstat(path)

    @_guarded
    async def readlink(self, inode, ctx=None):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return await _in_thread(os.readlink, self.abs(self._path(self.table.get(inode))))

    @_guarded
    async def access(self, inode, mode, ctx):
        # Permission checks are the kernel's (we always mount with default_permissions).
        if self.views.owns(inode) and mode & os.W_OK:
            return False
        return True

    @_guarded
    async def statfs(self, ctx):
        sv = await _in_thread(os.statvfs, self.src)
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(out, name, getattr(sv, name))
        return out

    # -- directories -----------------------------------------------------------------------
    @_guarded
    async def opendir(self, inode, ctx):
        if self.views.owns(inode):
            return await self.views.opendir(inode)
        node = self.table.get(inode)
        rel = self._path(node)
        listing = self.snapshots.listing(rel)  # listed moments ago and unchanged since
        if listing is None or listing.unknown:
            generation = self.snapshots.generation
            skip = VIEWS_NAME if rel == b"" else None  # shadowed by the virtual tree
            listing = await _in_thread(self._scan_sorted, self.abs(rel), skip)
            if len(listing.stats) <= self.snapshots.max_entries:
                self.snapshots.store(rel, generation, listing)
        handle = self.next_handle()
        self.dirs[handle] = (node, listing.frozen())
        return handle

    def _scan_sorted(self, path: bytes, skip: bytes | None) -> Listing:
        listing = self.snapshots.scan(path, skip, limit=False)
        listing.names  # sort in the thread
        return listing

    @_guarded
    async def readdir(self, fh, start_id, token):
        if fh not in self.dirs:
            return await self.views.readdir(fh, start_id, token)
        node, listing = self.dirs[fh]
        base = self._path(node)
        names = listing.names
        for i in range(start_id, len(names)):
            child, attrs = self._listed(listing, base, names[i], listing.stats[names[i]])
            if not pyfuse3.readdir_reply(token, names[i], attrs, i + 1):
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
            await _in_thread(self._fsync_path, self.abs(self._path(self.dirs[fh][0])))

    @staticmethod
    def _fsync_path(path: bytes) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @_guarded
    async def mkdir(self, parent_inode, name, mode, ctx):
        rel = self._child(parent_inode, name)
        path = self.abs(rel)
        make = functools.partial(os.mkdir, mode=stat.S_IMODE(mode))
        st = await self._change_names((rel,), self._make_owned, make, path, ctx)
        return await self._created(rel, st)

    def _make_owned(self, make, path: bytes, ctx) -> os.stat_result:
        """Create ``path`` with ``make(path)``, give it to the caller, return its stat."""
        make(path)
        self._own(path, ctx)
        return os.lstat(path)

    @_guarded
    async def rmdir(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, os.rmdir, is_dir=True)

    # -- names -----------------------------------------------------------------------------
    @_guarded
    async def unlink(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, os.unlink, is_dir=False)

    async def _remove(self, parent_inode, name, remove, is_dir: bool) -> None:
        """rmdir/unlink in SOURCE, then drop the name, its views and its metadata (subtree)."""
        rel = self._child(parent_inode, name)
        await self._change_names((rel,), remove, self.abs(rel))
        self.table.unlinked(rel, is_dir=is_dir)
        await self.views.source_changed(rel)
        await self._meta_restructure("remove", self.store_path(rel))

    @_guarded
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        replaced = await self._change_names((old, new), self._rename, old, new, flags)
        await self.views.source_changed(old)
        await self.views.source_changed(new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            self.table.renamed([(old, new), (new, old)])
            tmp = self.store_path(b".journalfs-exchange-%d" % next(self._exchange_tmp))
            await self._meta_restructure("move", self.store_path(old), tmp)
            await self._meta_restructure("move", self.store_path(new), self.store_path(old))
            await self._meta_restructure("move", tmp, self.store_path(new))
            return
        if replaced:
            self.table.unlinked(new)
            await self._meta_restructure("remove", self.store_path(new))
        self.table.renamed([(old, new)])
        await self._meta_restructure("move", self.store_path(old), self.store_path(new))

    def _rename(self, old: bytes, new: bytes, flags: int) -> bool:
        """Rename in SOURCE; True when an existing, different object at ``new`` was replaced."""
        src, dst = os.lstat(self.abs(old)), None
        try:
            dst = os.lstat(self.abs(new))
        except FileNotFoundError:
            pass
        if flags:
            _renameat2(self.abs(old), self.abs(new), flags)
        else:
            os.rename(self.abs(old), self.abs(new))
        return dst is not None and (dst.st_dev, dst.st_ino) != (src.st_dev, src.st_ino)

    @_guarded
    async def symlink(self, parent_inode, name, target, ctx):
        rel = self._child(parent_inode, name)
        make = functools.partial(os.symlink, bytes(target))
        st = await self._change_names((rel,), self._make_owned, make, self.abs(rel), ctx)
        return await self._created(rel, st)

    @_guarded
    async def link(self, inode, new_parent_inode, new_name, ctx):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        rel = self._child(new_parent_inode, new_name)
        src = self.abs(self._path(self.table.get(inode)))
        try:
            st = await self._change_names((rel,), self._link, src, self.abs(rel))
        finally:
            self._attrs_changed(self.table.get(inode))  # nlink
        return await self._created(rel, st)

    @staticmethod
    def _link(src: bytes, dst: bytes) -> os.stat_result:
        os.link(src, dst, follow_symlinks=False)
        return os.lstat(dst)

    @_guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        rel = self._child(parent_inode, name)
        st = await self._change_names((rel,), self._mknod, self.abs(rel), mode, rdev, ctx)
        return await self._created(rel, st)

    def _mknod(self, path: bytes, mode: int, rdev: int, ctx) -> os.stat_result:
        os.mknod(path, mode, rdev)
        self._own(path, ctx)
        return os.lstat(path)

    # -- files -----------------------------------------------------------------------------
    @_guarded
    async def open(self, inode, flags, ctx):
        if self.views.owns(inode):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
                raise pyfuse3.FUSEError(errno.EROFS)
            return await self.views.open(inode)
        node = self.table.get(inode)
        changes = node.changes
        fd, st = await _in_thread(self._open, node.path, list(node.handles), flags)
        if flags & os.O_TRUNC:
            self._attrs_changed(node)
        elif changes == node.changes:
            self._remember_stat(node, st)
        keep = node.cache_ident == (st.st_size, st.st_mtime_ns)  # unchanged since last close
        node.handles.add(fd)
        self.files[fd] = node
        return pyfuse3.FileInfo(fh=fd, keep_cache=keep)

    def _open(self, rel: bytes | None, handles: list[int], flags: int):
        flags = (flags & ~os.O_CREAT) | os.O_NOFOLLOW | os.O_CLOEXEC
        if rel is not None and os.path.lexists(self.abs(rel)):
            fd = os.open(self.abs(rel), flags)
        elif handles:  # open-but-unlinked, reached through /proc/PID/fd
            fd = os.open(f"/proc/self/fd/{handles[0]}", flags & ~os.O_NOFOLLOW)
        else:
            raise FileNotFoundError(errno.ENOENT, "gone")
        return fd, os.fstat(fd)

    @_guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        rel = self._child(parent_inode, name)
        fd, st = await self._change_names((rel,), self._create, self.abs(rel), mode, flags, ctx)
        node = self.table.remember(rel, st)
        node.changes += 1
        self._remember_stat(node, st)
        node.handles.add(fd)
        self.files[fd] = node
        await self.views.source_changed(rel)
        return pyfuse3.FileInfo(fh=fd), self.attrs(node, st)

    def _create(self, path: bytes, mode: int, flags: int, ctx) -> tuple[int, os.stat_result]:
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
        try:  # O_EXCL: only a file we really created is handed to the caller (chown)
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mode))
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return self._open_existing(path, flags & ~os.O_CREAT)  # lost a race: plain open
        try:
            self._own(path, ctx, fd)
            return fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _open_existing(path: bytes, flags: int) -> tuple[int, os.stat_result]:
        fd = os.open(path, flags)
        return fd, os.fstat(fd)

    @_guarded
    async def read(self, fh, off, size):
        if fh >= HANDLE_BASE:
            return await self.views.read(fh, off, size)
        return await _in_thread(os.pread, fh, size, off)

    @_guarded
    async def write(self, fh, off, buf):
        if fh >= HANDLE_BASE:
            raise pyfuse3.FUSEError(errno.EROFS)
        self.written.add(fh)
        node = self.files.get(fh)
        changes, st = (node.changes if node is not None else 0), None
        try:
            written, st = await _in_thread(self._write, fh, buf, off)
            return written
        finally:
            if node is not None:
                self._attrs_changed(node, st, changes)

    @staticmethod
    def _write(fd: int, buf: bytes, off: int) -> tuple[int, os.stat_result]:
        """pwrite, and the attributes the kernel will ask for next (it drops its own)."""
        return os.pwrite(fd, buf, off), os.fstat(fd)

    @_guarded
    async def flush(self, fh):
        # close(2) semantics of the underlying filesystem (e.g. NFS flushes on close): only
        # a written file has anything to flush, so a read-only close costs no thread hop.
        if fh < HANDLE_BASE and fh in self.written:
            node = self.files.get(fh)
            if node is None or node.key is None or node.key[0] != self.local_dev:
                await _in_thread(lambda: os.close(os.dup(fh)))
            await self._written_out(fh)

    async def _written_out(self, fh: int) -> None:
        """A written file is being closed (flush is synchronous with close(2), release is
        not): refresh the views of it before close returns."""
        if fh in self.written:
            self.written.discard(fh)
            node = self.files.get(fh)
            if node is not None and node.path is not None:
                await self.views.source_changed(node.path)

    @_guarded
    async def fsync(self, fh, datasync):
        if fh < HANDLE_BASE:
            await _in_thread(os.fdatasync if datasync else os.fsync, fh)

    @_guarded
    async def release(self, fh):
        if fh >= HANDLE_BASE:
            self.views.release(fh)
            return
        await self._written_out(fh)
        node = self.files.pop(fh, None)
        try:
            changes = node.changes if node is not None else 0
            st = await _in_thread(self._close, fh)  # one hop for both
            if node is not None:
                node.cache_ident = (st.st_size, st.st_mtime_ns)
                if changes == node.changes:
                    self._remember_stat(node, st)
        finally:
            if node is not None:
                self.table.release_handle(node, fh)

    @staticmethod
    def _close(fd: int) -> os.stat_result:
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    # -- extended attributes ---------------------------------------------------------------
    async def _meta_call(self, method: str, *args):
        """Call the metadata service, turning its errors into errnos."""
        try:
            return await getattr(self.meta, method)(*args)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            if type(exc).__name__ == "EntryTooLarge":
                raise pyfuse3.FUSEError(errno.E2BIG) from None
            if isinstance(exc, OSError) and exc.errno:
                raise pyfuse3.FUSEError(exc.errno) from None
            log.exception("metadata %s%r failed", method, args)
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

    async def _meta_restructure(self, method: str, *paths: str) -> None:
        """remove/move whole subtrees in the store; cached values are dropped afterwards."""
        try:
            await self._meta_call(method, *paths)
        finally:
            if self.meta_cache is not None:
                self.meta_cache.moved_or_removed()

    def _xattr_target(self, node: Inode):
        """Where SOURCE's own xattrs are read: the path, or an fd once unlinked."""
        if node.path is not None:
            return self.abs(node.path)
        if node.handles:
            return next(iter(node.handles))
        raise pyfuse3.FUSEError(errno.ENOENT)

    @_guarded
    async def getxattr(self, inode, name, ctx=None):
        if self.views.owns(inode):
            return await self.views.getxattr(inode, name)
        if name.startswith(xattrs.FAST_NODATA_PREFIXES):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            target = self._xattr_target(node)
            return await _in_thread(self._native_getxattr, target, name)
        value = await self._meta_get(self.store_path(self._path(node)), key)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return xattrs.encode_value(value)

    @staticmethod
    def _native_getxattr(target, name: bytes) -> bytes:
        if isinstance(target, int):
            return os.getxattr(target, name)
        return os.getxattr(target, name, follow_symlinks=False)

    @_guarded
    async def setxattr(self, inode, name, value, ctx):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            await self._change_native_xattr(node, os.setxattr, name, value)
            return
        self._check_user_xattr_allowed(node)
        await self._meta_write("set", self.store_path(self._path(node)), key,
                               xattrs.decode_value(value))

    async def _change_native_xattr(self, node: Inode, change, *args) -> None:
        """``os.setxattr``/``os.removexattr`` on the SOURCE object itself (through its open fd
        when there is one, never following a symlink)."""
        target = self._xattr_target(node)
        follow = {} if isinstance(target, int) else {"follow_symlinks": False}
        try:
            await _in_thread(functools.partial(change, target, *args, **follow))
        finally:
            self._attrs_changed(node)  # ctime

    @staticmethod
    def _check_user_xattr_allowed(node: Inode) -> None:
        # Natively only regular files and directories carry user.* attributes (the kernel
        # checks this too; the root inode has no recorded type and is a directory).
        if node.file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise pyfuse3.FUSEError(errno.EPERM)

    @_guarded
    async def removexattr(self, inode, name, ctx):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            await self._change_native_xattr(node, os.removexattr, name)
            return
        self._check_user_xattr_allowed(node)
        store_path = self.store_path(self._path(node))
        if await self._meta_get(store_path, key) is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        await self._meta_write("unset", store_path, key)

    @_guarded
    async def listxattr(self, inode, ctx):
        if self.views.owns(inode):
            return await self.views.listxattr(inode)
        node = self.table.get(inode)
        target = self._xattr_target(node)
        if isinstance(target, int):
            native = await _in_thread(os.listxattr, target)
        else:
            native = await _in_thread(functools.partial(os.listxattr, target,
                                                        follow_symlinks=False))
        names = [os.fsencode(n) for n in native if not os.fsencode(n).startswith(xattrs.METADATA_PREFIX)]
        if node.path is not None:
            stored = await self._meta_values(self.store_path(node.path))
            names += xattrs.metadata_names(stored)
        return names
