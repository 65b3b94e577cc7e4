"""The mount's state and the helpers every group of FUSE handlers shares (``JournalFS`` is
made of this core and one class per group of operations: see fs/passthrough.py)."""
from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable

import pyfuse3
from pyfuse3 import EntryAttributes

from ..metastore.backend import MetadataBackend
from ..metastore.location import StoreLocation
from . import direntries
from .caches import UNKNOWN, Listing, MetaCache, Scan
from .caller import Caller
from .dirlist import DIR_BLKSIZE, STRUCT_WRITES, LazyRows, ListingCache, NameOnlyEntry
from .guards import in_thread
from .inodes import VIEW_INO_BASE, Inode, InodeTable, O_PATH_FLAGS, join
from .linuxcalls import LOCAL_FS_TYPES, fs_type, raise_fd_limit
from .ownership import Ownership
from .settings import RuntimeSettings
from .views import VIEWS_NAME, Views
from .watch import SourceWatcher
from .workers import FairWorkers

_S_IFMT, _S_IFDIR = 0o170000, stat.S_IFDIR  # (stat.S_IFMT is a function)

_ABSENT = object()  # a name a listing lacks (its stats may hold UNKNOWN)

log = logging.getLogger("journalfs.fs")

#: File handles at or above this are the views' (listings, virtual files); below are ours.
HANDLE_BASE = 1 << 32
#: Longest a directory listing or a remembered stat answers lookups/getattr from memory
#: (never longer than the kernel's own timeout; anything changed through the mount is
#: forgotten at once).
SNAPSHOT_TTL = 2.0
#: Directory entries a scan lists on the trio thread before it hands the rest to a worker
#: thread: a small directory costs no thread hop, a big one holds up no other request.
SCAN_INLINE = 1024


def same_attributes(old: os.stat_result, new: os.stat_result) -> bool:
    """Whether a reply built from ``old`` is exact for ``new`` (the tuple part compares
    whole seconds only: the ns times and the block fields are checked on their own)."""
    return old is new or (old == new and old.st_mtime_ns == new.st_mtime_ns
                          and old.st_ctime_ns == new.st_ctime_ns
                          and old.st_atime_ns == new.st_atime_ns
                          and old.st_blocks == new.st_blocks and old.st_rdev == new.st_rdev
                          and old.st_blksize == new.st_blksize)


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


@dataclass(eq=False, slots=True)
class DirHandle:
    """One open mirrored directory. Listed at the first readdir, not at opendir (names made
    in between must show: POSIX; xfstests generic/471), and again at a rewinddir."""
    node: Inode
    uid: int                       # the opener's: whose worker-thread share a big scan takes
    read: bool = False             # read from since listed (a readdir at 0 then rewinds)
    listing: Listing | None = None  # as of the first readdir (frozen: later changes unseen)
    #: ``.`` and ``..`` with their attributes
    dots: list[tuple[bytes, pyfuse3.EntryAttributes]] | None = None
    #: for names the kernel holds current attributes of (every change reached it), or None
    plain: NameOnlyEntry | None = None
    rows: list[tuple] | LazyRows | None = None  # the listing's rows (dirlist.rows)


class MountCore(pyfuse3.Operations):
    """The mount's state and what every group of handlers shares: the inode table, the
    remembered stats and replies, the open handles, how a SOURCE call runs."""

    def __init__(self, source: str, meta: MetadataBackend, location: StoreLocation, *,
                 timeout: float = 1.0, options: dict | None = None,
                 settings: RuntimeSettings | None = None):
        """``settings``: the mount's runtime settings (fs/settings.py), their one owner; made
        here from ``timeout`` and ``options["ro"]`` when not given (in-process tests)."""
        super().__init__()
        self.src = os.fsencode(os.path.abspath(source))
        self.meta = meta            # the store, only through the MetadataBackend protocol
        self.location = location    # StoreLocation: store paths for mount-relative paths
        if settings is None:
            settings = RuntimeSettings(meta, timeout=timeout, readonly=bool((options or {}).get("ro")),
                                       cache_cap=SNAPSHOT_TTL)
        self.settings = settings
        # Copies of the settings the request path reads, kept current by _settings_changed:
        # the entry/attribute timeout of every reply; read-only (-o ro, or remount,ro through
        # MNT/.journalfs's user.journalfs.ro): every change, metadata included, is EROFS,
        # also where the kernel's flag is not set (a remount by a user who may not remount
        # the kernel's superblock); how long remembered stats and listings answer.
        self.timeout = settings.timeout
        self.readonly = settings.readonly
        self.stat_ttl = settings.cache_ttl
        self._view_numbers = itertools.count(VIEW_INO_BASE)
        self._view_handles = itertools.count(HANDLE_BASE)
        self._file_handles = itertools.count(1)
        raise_fd_limit()
        root_fd = os.open(self.src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.table = InodeTable(root_fd)
        self.files: dict[int, Handle] = {}                     # file handle -> open file
        self.dirs: dict[int, DirHandle] = {}                 # handle -> open directory
        # changes made behind the mount: the watcher asks source_changed what to invalidate
        self.watch = SourceWatcher(self.source_changed, renamed=self.source_renamed,
                                   deleted=self.source_deleted)
        self.views = Views(self, options or {})
        if not (NameOnlyEntry.available and direntries.available):
            log.warning("pyfuse3 %s: writes into its objects are off (%s): big listings take "
                        "the slow path (fs/direntries.py)", pyfuse3.__version__,
                        "probe failed" if STRUCT_WRITES == "all" else
                        f"JOURNALFS_STRUCT_WRITES={STRUCT_WRITES}")
        self._exchange_tmp = itertools.count()
        self.snapshots = ListingCache(settings.cache_ttl)  # + listings kept for readdir
        settings.subscribe(self._settings_changed)
        root = os.fstat(root_fd)
        self.local = fs_type(root_fd) in LOCAL_FS_TYPES
        self.local_dev = root.st_dev if self.local else None
        self.name_max = os.fstatvfs(root_fd).f_namemax or 255
        self.caller = Caller()
        # Calls that may wait on another process (an open that would break a lease, FIFOs,
        # devices, truncate by path, big directory scans): threads of their own, a fair
        # share per user, so they never take the threads fsync and the others need and one
        # user's slow files never delay another user's requests.
        self.workers = FairWorkers()
        # Metadata values are cached only for a store this mount alone writes.
        self.meta_cache = MetaCache() if meta.sole_writer else None
        # metadata belongs to the file: the store's ledger of owners and quota (ownership.py)
        self.ownership = Ownership(self, meta.ledger)

    def _settings_changed(self, settings: RuntimeSettings) -> None:
        self.timeout = settings.timeout
        self.readonly = settings.readonly
        self.stat_ttl = self.snapshots.ttl = settings.cache_ttl

    # -- helpers ---------------------------------------------------------------------------
    def next_inode(self) -> int:
        """A number for a view inode (a range SOURCE's numbers never reach)."""
        return next(self._view_numbers)

    def next_handle(self) -> int:
        return next(self._view_handles)

    def store_path(self, rel: bytes) -> str:
        return self.location.store_path("/" + os.fsdecode(rel))

    async def _io(self, fn: Callable, *args: Any) -> Any:
        """Run a SOURCE syscall: inline on a local filesystem, else in a worker thread."""
        if self.local:
            return fn(*args)
        return await in_thread(fn, *args)

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
        if built is not None and built[1] == timeout and same_attributes(built[0], st):
            a = built[2]
        else:
            # one statement per field: no tuple built and unpacked (stat cold, ls -l cold:
            # one reply per name); generation stays the 0 pyfuse3 starts it at
            a = EntryAttributes()
            a.st_ino = node.ino
            a.entry_timeout = timeout
            a.attr_timeout = timeout
            mode = a.st_mode = st.st_mode
            a.st_nlink = st.st_nlink
            a.st_uid = st.st_uid
            a.st_gid = st.st_gid
            a.st_rdev = st.st_rdev
            a.st_size = st.st_size
            a.st_blocks = st.st_blocks
            a.st_atime_ns = st.st_atime_ns
            a.st_mtime_ns = st.st_mtime_ns
            a.st_ctime_ns = st.st_ctime_ns
            # big READDIRPLUS replies for directories (see DIR_BLKSIZE)
            a.st_blksize = DIR_BLKSIZE if mode & _S_IFMT == _S_IFDIR else st.st_blksize
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
            others = parent.changes - changes  # made by other calls while this one ran
            self._namespace_changed(*(r for r in rels if r is not None))  # bumps it too
            parent.changes += 1
            parent.stat = None
            if dir_st is not None and not others:
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

    def _lookup_listed(self, listing: Listing, parent: Inode, name: bytes):
        """A LOOKUP answered from a fresh listing: the reply (one kernel reference counted),
        ENOENT for a name it lacks, None for a name listed without its stat."""
        st: Any = listing.stats.get(name, _ABSENT)
        if st is _ABSENT:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if st is UNKNOWN:
            return None
        child, attrs = self._listed(listing, parent, name, st)
        child.lookups += 1
        return attrs

    def _listed(self, listing: Listing, parent: Inode, name: bytes, st: os.stat_result):
        """(inode, attributes) of ``name``, listed with ``st``: built once per stat and shared
        by lookups and readdir. Adds no kernel reference: the caller counts one once the
        kernel has the answer."""
        built = listing.attrs.get(name)
        if built is None or built[0] is not st or self.table.by_ino.get(built[1].ino) is not built[1]:
            paths = parent.paths
            rel = join(paths[-1], name) if paths else None  # (parent.path, read once)
            # the kernel forgot the inode since it was built: the same object stands again
            # when nothing else took its place (remember checks), with its reply if current
            reuse = built[1] if built is not None else None
            child = self.table.remember(rel, st, parent.ino, name, lookups=0, reuse=reuse)
            attrs = self.attrs(child, st)
            if built is None or child is not reuse or attrs is not built[2]:
                listing.attrs[name] = (st, child, attrs)
            return child, attrs
        return built[1], built[2]

    @staticmethod
    def _open_path(dir_fd: int, name: bytes) -> tuple[int, os.stat_result]:
        fd = os.open(name, O_PATH_FLAGS, dir_fd=dir_fd)
        try:
            return fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

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

    def _handle_done(self, handle: Handle) -> None:
        handle.busy -= 1
        if handle.released and handle.busy == 0:
            os.close(handle.fd)
