"""The handlers of mirrored directories: opendir, readdir, releasedir, fsyncdir. A listing
is taken at the first readdir and answered from the kept listings of dirlist.py when the
watcher covers the directory; a reply goes in steps of bounded work (READDIR_STEP,
READDIR_NEW_MAX) and lets waiting requests through between them."""
from __future__ import annotations

import os
import stat
import time

import pyfuse3

from .caches import Listing
from .dirlist import NameOnlyEntry, listing_rows, patched
from .guards import guarded, in_thread
from .inodes import Inode
from .mountcore import DirHandle
from .storecalls import StoreCalls
from .views import VIEWS_NAME
from .workers import KERNEL_QUEUE

#: Entries one step of a readdir reply handles at most, and of them entries whose inode and
#: attributes it builds at most (~50 µs each on a busy heap; a name the kernel holds costs
#: ~1 µs). Between steps the reply looks at the kernel's queue (workers.KernelQueue): while
#: nobody else uses the mount it goes on until the kernel's buffer is full (~5,000 entries
#: with the 1 MiB st_blksize: a user listing alone sends few requests); once a request waits
#: it is let through first and replies stay one step long for a while (workers.
#: CONTENDED_SECONDS), so another user's request waits for one step at most and the
#: lister's pace is the kernel's round trip (bob lists 100k entries in a loop,
#: bench/attacks.py). Trio's other tasks (a request whose worker thread is done) run at
#: least every workers.CHECKPOINT_SECONDS of a long reply.
READDIR_STEP = 64
READDIR_NEW_MAX = 8
_S_IFMT = 0o170000  # stat.S_IFMT as a mask (an operator, not a call per entry)


class DirectoryOps(StoreCalls):
    """opendir, readdir, releasedir, fsyncdir."""

    kernel_queue = KERNEL_QUEUE  # whether a request waits (tests set their own)

    @guarded
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
        self.dirs[handle] = DirHandle(node, ctx.uid if ctx is not None else 0)
        return handle

    async def _list(self, handle: DirHandle) -> None:
        """List ``handle``'s directory as it is now (first readdir, rewinddir)."""
        node = handle.node
        listing, current = await self._dir_listing(node, handle.uid)
        dots = await self._on(node, self._dots, node is self.table.root)
        frozen = listing.frozen()
        handle.listing, handle.dots, handle.read = frozen, dots, False
        handle.plain = NameOnlyEntry(stat.S_IFREG) if current and NameOnlyEntry.available \
            else None
        handle.rows = (self.snapshots.rows(node.path, listing)
                       if current and node.path is not None else None) or listing_rows(frozen)

    async def _dir_listing(self, node: Inode, uid: int = 0) -> tuple[Listing, bool]:
        """The current listing of directory ``node``: the one kept since the last scan when
        the watcher covers the directory (only names changed since are stat'ed again), else
        a fresh snapshot or a new scan; and whether every change in SOURCE has reached the
        kernel's caches (the directory is watched and no change in it is waiting)."""
        rel = node.path
        # a change behind the mount in this directory not yet applied to our caches: none
        # of them is current (changes elsewhere in SOURCE leave its kept listing usable)
        pending = self.watch.unsettled(node.ino)
        watched = rel is not None and not pending and self.watch.watching(node.ino)
        listing: Listing | None = None
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
            scanned = await self._scan(node, uid, skip, None)
            assert scanned is not None  # None only past a max_entries
            listing = scanned
            fresh = True
            if rel is not None and len(listing.stats) <= self.snapshots.max_entries:
                self.snapshots.store(rel, generation, listing)
        if watched and fresh and rel is not None:
            self.snapshots.keep(rel, node, generation, listing)
        return listing, watched

    def _dots(self, fd: int, is_root: bool) -> list[tuple[bytes, pyfuse3.EntryAttributes]]:
        """``.`` and ``..`` as readdir reports them (``..`` of the root is the root)."""
        here = os.fstat(fd)
        up = here if is_root else os.stat(b"..", dir_fd=fd, follow_symlinks=False)
        number = pyfuse3.ROOT_INODE if is_root else self.table.number((here.st_dev, here.st_ino))
        up_number = pyfuse3.ROOT_INODE if is_root or (up.st_dev, up.st_ino) == self.table.root.key \
            else self.table.number((up.st_dev, up.st_ino))
        return [(b".", self._dot_attrs(number, here)), (b"..", self._dot_attrs(up_number, up))]

    def _dot_attrs(self, number: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        return self.attrs(Inode(number, None), st)

    @guarded
    async def readdir(self, fh, start_id, token):
        handle = self.dirs.get(fh)
        if handle is None:
            return await self.views.readdir(fh, start_id, token)
        if handle.listing is None or (start_id == 0 and handle.read):
            # the first read, or rewinddir: the directory as it is now (POSIX)
            await self._list(handle)
        handle.read = True
        dots = handle.dots
        for i in range(start_id, len(dots)):  # no lookup reference for these two
            if not pyfuse3.readdir_reply(token, dots[i][0], dots[i][1], i + 1):
                return
        index = max(0, start_id - len(dots))
        since = time.perf_counter()
        while True:
            index = self._reply_step(handle, token, index)
            if index is None:
                return
            # room left and more to list: another step, unless others use the mount
            since = await self.kernel_queue.between_steps(since)
            if since is None:
                return  # (the kernel asks for the rest)

    def _reply_step(self, handle, token, start):
        """Entries of ``handle``'s listing from row ``start`` on into the reply: READDIR_STEP
        at most, READDIR_NEW_MAX of them built at most. The row to go on from, or None when
        the reply is full or the listing done."""
        node = handle.node
        listing = handle.listing
        plain = handle.plain
        entries = handle.rows
        # Per entry: the attributes built once per stat (shared with lookups and with later
        # listings of a kept listing), found through the listing's rows, so a repeated
        # listing costs a few identity checks and the reply.
        # A name whose inode the kernel holds already, with attributes that are current or
        # invalidated (``plain``: every change has reached it), goes by name only (the
        # kernel then updates nothing and keeps the inode's cached ACL, which `ls -l` would
        # ask for again: a request) unless its metadata was written through the mount since
        # and the kernel holds no ACL of it: a setxattr invalidated its attributes, which the
        # entry then carries (else `getfattr -R` after setting metadata sends a GETATTR per
        # file). Every other entry carries its attributes.
        by_ino, reply = self.table.by_ino, pyfuse3.readdir_reply
        # names whose metadata was written through the mount since their last entry (mostly
        # none: then every name the kernel holds goes by name only)
        written = self.meta_cache.written_paths if self.meta_cache is not None else None
        plain_attrs, plain_ino = (plain.attrs, plain.ino) if plain is not None else (None, None)
        plain_type = plain_attrs.st_mode if plain is not None else 0  # as the last call left it
        stale = False
        built = 0
        first = len(handle.dots) + 1
        # only this step's rows (LazyRows makes them now), never a copy of a big listing
        for i, (name, st, entry) in enumerate(entries[start:start + READDIR_STEP], start + first):
            if entry is not None and entry[0] is st and \
                    by_ino.get((child := entry[1]).ino) is child:
                if plain_attrs is not None and child.lookups and (
                        not written or child.acl_cached or child.meta_path is None or
                        child.meta_path[1] not in written):
                    if st.st_mode & _S_IFMT != plain_type:  # the entry's type
                        plain_type = plain_attrs.st_mode = st.st_mode & _S_IFMT
                    plain_ino.value = child.ino
                    if not reply(token, name, plain_attrs, i):
                        return None
                    continue
                attrs = entry[2]
            elif built >= READDIR_NEW_MAX:
                return i - first  # enough building for one step: the next one goes on here
            else:
                built += 1
                child, attrs = self._listed(listing, node, name, st)
                if not stale and node.path is not None:
                    stale = True
                    self.snapshots.rows_stale(node.path)
            if not reply(token, name, attrs, i):
                self.table.drop_if_unused(child)
                return None
            child.lookups += 1
            child.acl_cached = False  # the kernel dropped its cached ACL with these attributes
            if written and child.meta_path is not None:
                written.discard(child.meta_path[1])
        start += READDIR_STEP
        return start if start < len(entries) else None

    @guarded
    async def releasedir(self, fh):
        if self.dirs.pop(fh, None) is None:
            self.views.releasedir(fh)

    @guarded
    async def fsyncdir(self, fh, datasync):
        handle = self.dirs.get(fh)
        if handle is not None:
            node = handle.node
            fd = self.table.hold(node)
            try:
                await in_thread(self._fsync_dir, fd)
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
