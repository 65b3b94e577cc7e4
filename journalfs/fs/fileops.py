"""The handlers of open files: open, create, read, write, flush, fsync, release. Reads and
writes of a local SOURCE run inline; an open that could wait (a lease break, a FIFO, a
device) runs in a worker thread of the opener's share."""
from __future__ import annotations

import errno
import fcntl
import functools
import os
import stat
from typing import Any, Callable

import pyfuse3

from .guards import guarded
from .inodes import Inode, same_object, stale
from .linuxcalls import proc_path
from .mountcore import HANDLE_BASE, Handle
from .storecalls import StoreCalls


def writeback_flags(flags: int) -> int:
    """The flags the daemon opens a file with under the kernel's writeback cache: the kernel
    reads pages of files opened write-only (to fill a partly written page), so O_WRONLY is
    opened O_RDWR (the kernel has already checked the caller's permission for what the
    caller asked; the caller's fd stays write-only), and the kernel itself places O_APPEND
    writes at its own idea of the end (an O_APPEND fd would move them)."""
    if flags & os.O_ACCMODE == os.O_WRONLY:
        flags = flags & ~os.O_ACCMODE | os.O_RDWR
    return flags & ~os.O_APPEND


def _reopened(fd: int, flags: int) -> int:
    """``fd``'s inode opened again by the daemon with ``flags`` (closing ``fd``)."""
    flags &= ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        return os.open(proc_path(fd), flags)
    finally:
        os.close(fd)


class FileOps(StoreCalls):
    """open, create, read, write, flush, fsync, release."""

    @guarded
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
        writeback = self.enable_writeback_cache and node.file_type == stat.S_IFREG
        path_fd = self.table.hold(node)
        try:
            fd = st = None
            if self.local and node.file_type in (stat.S_IFREG, stat.S_IFDIR):
                # Linux answers EWOULDBLOCK instead of waiting for a lease break (started
                # now): only then does this open need a thread, of its user's share
                try:
                    fd, st = self._reopen(path_fd, node, flags, writeback, nonblocking=True)
                except BlockingIOError:
                    pass
            if fd is None:  # FIFOs/devices may block: only this user's requests wait
                fd, st = await self.workers.run(uid, self._reopen, path_fd, node, flags,
                                                writeback)
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
    def _reopen(path_fd: int, node: Inode, flags: int, writeback: bool = False,
                nonblocking: bool = False) -> tuple[int, os.stat_result]:
        """A real fd of ``node``'s object, opened with ``flags`` (``writeback``: as the
        kernel's writeback cache needs, see writeback_flags); ``nonblocking``: with
        O_NONBLOCK added (BlockingIOError where the open would wait for a lease break),
        then cleared again unless the caller asked for it."""
        # O_DIRECT is the kernel's business: its requests reach us in unaligned buffers
        flags = (flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_DIRECT)) | os.O_CLOEXEC
        if nonblocking and flags & os.O_NONBLOCK:
            nonblocking = False  # the caller's own flag: kept
        extra = os.O_NONBLOCK if nonblocking else 0
        wanted = writeback_flags(flags) if writeback else flags
        try:
            fd = os.open(proc_path(path_fd), wanted | extra)
        except PermissionError:
            if wanted == flags:
                raise
            # an append-only file (chattr +a) opens for writing with O_APPEND only
            fd = os.open(proc_path(path_fd), flags | extra)
            wanted = flags
        flags = wanted
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

    @guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, path_fd, st = await self._change_names(parent, (rel,), self._create, parent,
                                                   name, stat.S_IMODE(mode), flags, ctx)
        node, attrs = await self._created(parent, rel, name, path_fd, st)
        return pyfuse3.FileInfo(fh=self._new_handle(node, fd, ctx)), attrs

    def _create(self, parent: Inode, name: bytes, mode: int, flags: int, ctx):
        dir_fd = self.table.fd(parent)
        flags = (flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC) & ~(os.O_NOCTTY | os.O_DIRECT)
        asked = flags
        if self.enable_writeback_cache:
            flags = writeback_flags(flags)
        try:
            fd = self.caller.run(ctx, functools.partial(os.open, name, flags, mode, dir_fd=dir_fd))
        except PermissionError:
            if flags == asked:
                raise
            # the name existed already (made in SOURCE meanwhile) and the caller may only
            # write it: the caller's own open, then the daemon's readable one of that inode
            fd = self.caller.run(ctx, functools.partial(os.open, name, asked, mode, dir_fd=dir_fd))
            fd = _reopened(fd, flags)
        try:
            path_fd = os.open(proc_path(fd), os.O_PATH | os.O_CLOEXEC)
            return fd, path_fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    @guarded
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

    @guarded
    async def write(self, fh, off, buf):
        if fh >= HANDLE_BASE or self.readonly:
            raise pyfuse3.FUSEError(errno.EROFS)
        handle = self._handle(fh)
        handle.written = True
        node = handle.node
        uid, gid = handle.writer
        try:
            handle.own_writes += 1
            # as the writer: root's reserved blocks and quotas apply to them as on SOURCE
            if self.local:
                return self.caller.as_user(uid, gid, os.pwrite, handle.fd, buf, off)
            return await self._handle_call(
                handle, lambda fd: self.caller.as_user(uid, gid, os.pwrite, fd, buf, off))
        finally:
            # the kernel drops its attributes of the file; they are fstat-ed when it asks
            # (a stream of writes asks for none in between)
            self._attrs_changed(node)

    @guarded
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

    @guarded
    async def fsync(self, fh, datasync):
        handle = self.files.get(fh) if fh < HANDLE_BASE else None
        if handle is not None:
            await self._handle_call(handle, os.fdatasync if datasync else os.fsync)
        await self._meta_sync()

    @guarded
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
