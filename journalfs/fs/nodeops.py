"""The handlers of inodes themselves: lookup, forget, getattr, setattr, readlink, access,
statfs. lookup and getattr have a fast path for a known inode on local SOURCE that never
yields to trio's scheduler (tests/test_fs_hotpath.py)."""
from __future__ import annotations

import errno
import os
import stat
import time
from typing import Callable

import pyfuse3
import trio

from .caches import Listing
from .guards import fuse_error, guarded, guards_itself
from .inodes import Inode, join
from .linuxcalls import chown_fd, proc_path, utime_fd
from .mountcore import Handle, MountCore, same_attributes
from .views import VIEWS_NAME

#: Inodes one FORGET batch drops before letting other requests run (the kernel forgets
#: thousands at once after a huge listing).
FORGET_STEP = 256


class NodeOps(MountCore):
    """lookup, forget, getattr, setattr, readlink, access, statfs."""

    @guards_itself
    async def lookup(self, parent_inode, name, ctx=None):
        # A name in a directory with a fresh listing (timeout > 0: stat of many names, ls
        # -l) is answered from it. In a directory on local SOURCE with no listing cache in
        # use (timeout 0): a name not seen yet is opened O_PATH and remembered; a name known
        # to mean an object whose O_PATH fd is kept costs one fstatat to see it still means
        # that object. No call that could yield (tests/test_fs_hotpath.py). Everything else
        # (views, dots, scans, hard links, a name that now means another object) takes
        # _lookup.
        try:
            parent = self.table.by_ino.get(parent_inode)
            if parent is None or not parent.paths or name in (b".", b"..") or \
                    len(name) > self.name_max or \
                    (parent is self.table.root and name == VIEWS_NAME):
                return await self._lookup(parent_inode, name, ctx)
            directory = parent.paths[-1]
            if self.snapshots.enabled:
                listing = self.snapshots.listing(directory)
                if listing is not None:
                    attrs = self._lookup_listed(listing, parent, name)
                    if attrs is not None:
                        return attrs
            elif parent.fd is not None and not parent.transient and self.local:
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
                                same_attributes(built[0], st) and \
                                (node.file_type != stat.S_IFDIR or
                                 self.watch.watching(node.ino)):
                            return built[2]
                        return self.attrs(node, st)
            return await self._lookup(parent_inode, name, ctx)
        except Exception as exc:
            raise fuse_error(exc, "lookup") from None

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
            return await self._lookup_held(parent)
        if name == b"..":  # asked by NFS exports; the directory it was found in
            up = parent if parent is self.table.root else self.table.by_ino.get(parent.parent)
            if up is None and parent.path:  # e.g. a directory found again by its handle
                return await self._found_at(os.path.dirname(parent.path))
            if up is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return await self._lookup_held(up)
        # a fresh listing is a dict lookup: no coroutine for it (stat of many names, cold)
        dir_rel = parent.path
        listing = self.snapshots.listing(dir_rel) if dir_rel is not None else None
        if listing is None and dir_rel is not None:
            listing = await self._listing(parent, dir_rel, ctx.uid if ctx is not None else 0)
        if listing is not None:  # answered from memory: `ls -l`, find, stat of many files
            attrs = self._lookup_listed(listing, parent, name)
            if attrs is not None:
                return attrs
        rel = None if dir_rel is None else join(dir_rel, name)
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

    async def _listing(self, parent: Inode, dir_rel: bytes, uid: int = 0) -> Listing | None:
        """A new listing of ``parent`` (at ``dir_rel``, which has no fresh one) to answer
        lookups from, when it is busy enough."""
        listing = None
        if self.snapshots.worth_scanning(dir_rel):
            generation = self.snapshots.generation
            skip = VIEWS_NAME if parent is self.table.root else None
            scanned = await self._scan(parent, uid, skip, self.snapshots.max_entries)
            self.snapshots.store(dir_rel, generation, scanned)
            listing = self.snapshots.listing(dir_rel)
        return listing

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

    async def _lookup_held(self, node):
        """A lookup's answer for ``node`` after a stat that may wait: the reference is
        counted before the wait, so a FORGET arriving meanwhile cannot drop the node the
        reply names."""
        node.lookups += 1
        try:
            return self.attrs(node, await self._stat(node))
        except BaseException:
            self.table.forget(node.ino, 1)
            raise

    @guarded
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

    @guards_itself
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
                    same_attributes(built[0], st) and \
                    (node.file_type != stat.S_IFDIR or self.watch.watching(node.ino)):
                return built[2]
            return self.attrs(node, st)
        except Exception as exc:
            raise fuse_error(exc, "getattr") from None

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

    @guarded
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
            chown_fd(fd, uid, gid)
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
            utime_fd(fd, attr.st_atime_ns if fields.update_atime else now.st_atime_ns,
                      attr.st_mtime_ns if fields.update_mtime else now.st_mtime_ns)
        return os.fstat(fd)

    @guarded
    async def readlink(self, inode, ctx=None):
        if self.views.owns(inode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return await self._on(self.table.get(inode), self._readlink)

    @staticmethod
    def _readlink(fd: int) -> bytes:
        return os.readlink(b"", dir_fd=fd)  # readlinkat(fd, ""): the O_PATH symlink itself

    @guarded
    async def access(self, inode, mode, ctx):
        # Permission checks are the kernel's (we always mount with default_permissions).
        if self.views.owns(inode) and mode & os.W_OK:
            return False
        return True

    @guarded
    async def statfs(self, ctx):
        sv = await self._on(self.table.root, os.fstatvfs)
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(out, name, getattr(sv, name))
        return out
