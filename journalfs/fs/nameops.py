"""The handlers that change names in SOURCE: mkdir, rmdir, unlink, rename, symlink, link,
mknod. Each acts relative to its directory's O_PATH fd, then forgets exactly what it made
stale (listings, stats) and moves the names' metadata along in the store."""
from __future__ import annotations

import errno
import functools
import os
import stat
from typing import Callable

import pyfuse3

from .guards import guarded
from .inodes import Inode
from .linuxcalls import link_fd, renameat2
from .storecalls import StoreCalls


class NamespaceOps(StoreCalls):
    """mkdir, rmdir, unlink, rename, symlink, link, mknod."""

    @guarded
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

    @guarded
    async def rmdir(self, parent_inode, name, ctx):
        await self._remove(parent_inode, name, is_dir=True)

    @guarded
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

    @guarded
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: pyfuse3.RequestContext) -> None:
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
        if new_parent is not old_parent:  # the old one's stat is _change_names' fresh fstat
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
            await self._meta_restructure_after(old, self.meta.move, self.store_path(old), tmp)
            await self._meta_restructure_after(old, self.meta.move, self.store_path(new),
                                               self.store_path(old))
            await self._meta_restructure_after(old, self.meta.move, tmp, self.store_path(new))
            return
        if replaced:
            self.table.unlinked(new)
            await self._meta_restructure_after(new, self.meta.remove, self.store_path(new))
        self.table.renamed([(old, new)], dirs)
        await self._meta_restructure_after(old, self.meta.move, self.store_path(old),
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
            renameat2(old_fd, old, new_fd, new, flags)
        else:
            os.rename(old, new, src_dir_fd=old_fd, dst_dir_fd=new_fd)
        src_key = (src.st_dev, src.st_ino)
        dst_key = None if dst is None else (dst.st_dev, dst.st_ino)
        replaced = dst_key is not None and dst_key != src_key
        exchanged = dst_key if flags & pyfuse3.RENAME_EXCHANGE else None
        dirs = stat.S_ISDIR(src.st_mode) or \
            (exchanged is not None and dst is not None and stat.S_ISDIR(dst.st_mode))
        return replaced, src_key, exchanged, dirs, dst_key

    @guarded
    async def symlink(self, parent_inode, name, target, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, st = await self._change_names(parent, (rel,), self._make, parent, ctx,
                                          self._symlink, name, bytes(target))
        return (await self._created(parent, rel, name, fd, st))[1]

    @staticmethod
    def _symlink(dir_fd: int, name: bytes, target: bytes) -> None:
        os.symlink(target, name, dir_fd=dir_fd)

    @guarded
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
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
            await self._meta_restructure(self.meta.copy, self.store_path(sources[-1]),
                                         self.store_path(rel))
        return attrs

    def _link(self, fd: int, parent: Inode, name: bytes) -> tuple[int, os.stat_result]:
        dir_fd = self.table.fd(parent)
        link_fd(fd, dir_fd, name)
        return self._open_path(dir_fd, name)

    @guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        parent, rel = self._dir(parent_inode, name)
        fd, st = await self._change_names(parent, (rel,), self._make, parent, ctx,
                                          self._mknod, name, mode, rdev)
        return (await self._created(parent, rel, name, fd, st))[1]

    @staticmethod
    def _mknod(dir_fd: int, name: bytes, mode: int, rdev: int) -> None:
        os.mknod(name, mode, rdev, dir_fd=dir_fd)
