"""The handlers of extended attributes: ``user.metadata.*`` from the store (every name of a
file shows its metadata: it belongs to the file), everything else the SOURCE object's own
(ACLs set with the caller's credentials). getxattr of a cached value never yields."""
from __future__ import annotations

import errno
import os
import stat

import pyfuse3

from . import xattrs
from .caller import CAP_SYS_ADMIN
from .guards import fuse_error, guarded, guards_itself
from .inodes import Inode, same_object, stale
from .linuxcalls import frozen, proc_path, stat_beneath, statx_beneath
from .storecalls import StoreCalls

#: The POSIX ACLs' attribute names: the kernel caches what getxattr answers for them.
ACL_PREFIX = b"system.posix_acl_"


class XattrOps(StoreCalls):
    """getxattr, setxattr, removexattr, listxattr."""

    def _names_if_writable(self, fd: int, node: Inode) -> list[bytes]:
        """:meth:`_names_now` of a file whose attributes may change: EPERM for an immutable
        or append-only one, as the kernel answers for its native xattrs."""
        if frozen(fd):
            raise pyfuse3.FUSEError(errno.EPERM)
        return self._names_now(fd, node)

    def _names_now(self, fd: int, node: Inode) -> list[bytes]:
        """The names of ``node`` (O_PATH ``fd``) that still mean its object in SOURCE
        (ENOENT if none: a file deleted behind the mount's back gets no metadata). Each name
        is checked from SOURCE's fd as the mirror itself would reach it, never through a
        symlink (stat_beneath): a directory swapped for a symlink behind the mount's back
        does not make a name count, and nothing outside SOURCE is looked at. (The names are
        paths, not (directory inode, name) pairs: hard links seen once are kept by path in
        the inode table after the kernel forgot their directories.)"""
        if node is self.table.root:
            return [b""]
        names = []
        root_fd = self.table.root.fd
        assert root_fd is not None  # the root's fd is held for the mount's life
        for rel in self.table.names_of(node):  # a name that still means it: it is linked
            try:
                st = stat_beneath(root_fd, rel)
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

    @guards_itself
    async def getxattr(self, inode, name, ctx=None):
        # A cached user.metadata.* value of a known inode is a few dict lookups, and any
        # other attribute of a known inode on local SOURCE one syscall (ls -l asks
        # security.selinux and the ACL of every entry; the first also opens the inode's fd
        # if a listing made it), with no call that could yield (tests/test_fs_hotpath.py);
        # anything else takes _getxattr.
        try:
            node = self.table.by_ino.get(inode)
            if node is not None:
                key = xattrs.known_metadata_key(name)
                if key is not None:
                    cache = self.meta_cache
                    made, paths = node.meta_path, node.paths
                    if cache is not None and made is not None and paths and \
                            made[0] is paths[-1]:
                        values = cache.get_all(made[1])
                        if values is not None:
                            value = values.get(key)
                            if value is None:
                                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
                            return xattrs.encode_value(value)
                elif self.local and not node.transient and \
                        not name.startswith(xattrs.METADATA_PREFIX):
                    if name.startswith(ACL_PREFIX):
                        node.acl_cached = True  # answer or ENODATA: the kernel keeps either
                    fd = node.fd
                    if fd is not None:
                        return self._native_getxattr(fd, name)
                    # the first for an inode known from a listing (`ls -l`): its fd is
                    # opened, checked and kept here, with no coroutine layers
                    return self._inline(node, self._native_getxattr, name)
            return await self._getxattr(inode, name)
        except Exception as exc:
            raise fuse_error(exc, "getxattr") from None

    async def _getxattr(self, inode: int, name: bytes) -> bytes:
        if self.views.owns(inode):
            return await self.views.getxattr(inode, name)
        node = self.table.get(inode)
        key = xattrs.metadata_key(name)
        if key is None:
            if bytes(name).startswith(ACL_PREFIX):
                node.acl_cached = True
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

    @guards_itself
    async def setxattr(self, inode, name, value, ctx):
        # A user.metadata.* value of a file known under one name on local SOURCE, its
        # entries bound and values cached: one statx beneath SOURCE and the store's inline
        # append, with no coroutine below this one (tests/test_fs_hotpath.py).
        try:
            if self.views.owns(inode):  # read-only, but for the settings on .journalfs itself
                return await self.views.setxattr(inode, name, value, ctx)
            if self.readonly:
                raise pyfuse3.FUSEError(errno.EROFS)
            node = self.table.get(inode)
            key = xattrs.metadata_key(name)
            if key is None:
                if bytes(name).startswith(ACL_PREFIX):
                    await self._set_acl(node, name, value, ctx)
                    return None
                await self._change_native_xattr(node, os.setxattr, name, value)
                return None
            self._check_user_xattr_allowed(node)
            decoded = xattrs.decode_value(value)
            checked = self._one_name_now(node) if self.local else None
            if checked is None:
                names, identity = await self._on(node, self._names_if_writable, node), None
            else:
                names, identity = checked
                if self.ownership.set_now(node, names, key, decoded, identity):
                    return None
            # metadata belongs to the file: every name of it, within the owner's quota
            await self.ownership.set(node, names, key, decoded, identity)
            return None
        except Exception as exc:
            raise fuse_error(exc, "setxattr") from None

    def _one_name_now(self, node: Inode) -> tuple[list[bytes], tuple[tuple, int]] | None:
        """:meth:`_names_if_writable` of a file known under one name (no hard link of it
        seen), on this thread (local SOURCE), with the ledger's identity of it
        (``Ownership.identity``) from the same statx: three syscalls where the general way
        takes six. None: that way must decide (the name now means something else or
        nothing, is too long for one call, or the kernel lacks openat2)."""
        paths = node.paths  # (table.names_of's answer when no hard link was seen)
        if len(paths) != 1 or node is self.table.root or node.key in self.table.links:
            return None
        names = [paths[0]]
        root_fd = self.table.root.fd
        assert root_fd is not None  # the root's fd is held for the mount's life
        try:
            st = statx_beneath(root_fd, names[0])
        except OSError:
            return None
        if (st.dev, st.ino) != node.key or stat.S_IFMT(st.mode) != node.file_type:
            return None
        if st.frozen:
            raise pyfuse3.FUSEError(errno.EPERM)
        return names, ((st.ino, st.btime_ns), st.uid)

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
            await self.views.source_changed(node.path)  # the views mirror ACLs (viewxattrs.py)

    async def _change_native_xattr(self, node: Inode, change, *args) -> None:
        """``os.setxattr``/``os.removexattr`` on the SOURCE object itself."""
        try:
            await self._on(node, lambda fd: change(proc_path(fd), *args))
        finally:
            self._attrs_changed(node)  # ctime
        if bytes(args[0]).startswith(ACL_PREFIX) and node.path is not None:
            await self.views.source_changed(node.path)  # the views mirror ACLs (viewxattrs.py)

    @staticmethod
    def _check_user_xattr_allowed(node: Inode) -> None:
        # Natively only regular files and directories carry user.* attributes.
        if node.file_type not in (stat.S_IFREG, stat.S_IFDIR):
            raise pyfuse3.FUSEError(errno.EPERM)

    @guarded
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

    @guards_itself
    async def listxattr(self, inode, ctx):
        # getfattr asks it of every file: a known inode with its fd kept on local SOURCE and
        # its metadata cached costs one syscall, with no call that could yield
        # (tests/test_fs_hotpath.py); anything else takes _listxattr.
        try:
            node = self.table.by_ino.get(inode)
            if node is None or node.fd is None or node.transient or not self.local:
                return await self._listxattr(inode, ctx)
            native = os.listxattr(proc_path(node.fd))
            names = self._native_names(native, ctx) if native else []  # mostly none
            if node.file_type not in (stat.S_IFREG, stat.S_IFDIR):
                return names
            made, paths, cache = node.meta_path, node.paths, self.meta_cache
            values = cache.get_all(made[1]) if cache is not None and made is not None and \
                paths and made[0] is paths[-1] else None
            if values is None:
                store_path = await self.ownership.store_path(node)
                if store_path is None:
                    return names
                values = await self._meta_values(store_path)
            return names + xattrs.metadata_names(values)
        except Exception as exc:
            raise fuse_error(exc, "listxattr") from None

    async def _listxattr(self, inode, ctx) -> list[bytes]:
        if self.views.owns(inode):
            return await self.views.listxattr(inode)
        node = self.table.get(inode)
        native = await self._on(node, lambda fd: os.listxattr(proc_path(fd)))
        names = self._native_names(native, ctx)
        store_path = await self.ownership.store_path(node) \
            if node.file_type in (stat.S_IFREG, stat.S_IFDIR) else None
        if store_path is not None:
            stored = await self._meta_values(store_path)
            names += xattrs.metadata_names(stored)
        return names

    def _native_names(self, native: list[str], ctx) -> list[bytes]:
        """SOURCE's own attribute names as listed to the caller: not ``user.metadata.*``
        (the store's keys shadow them), nor ``trusted.*`` unless it holds CAP_SYS_ADMIN."""
        hide_trusted = any(n.startswith("trusted.") for n in native) \
            and not self.caller.capable(ctx, CAP_SYS_ADMIN)
        names = []
        for n in native:
            raw = os.fsencode(n)
            if raw.startswith(xattrs.METADATA_PREFIX):
                continue  # shadowed by the store's keys
            if hide_trusted and raw.startswith(b"trusted."):
                continue  # Linux lists these to CAP_SYS_ADMIN only
            names.append(raw)
        return names
