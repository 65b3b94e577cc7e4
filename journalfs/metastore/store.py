"""The gvfs-format metadata store: one tree file + its journal, read and written like gvfs.

:class:`MetaStore` is the only code that writes a store. Reads never load the tree: a lookup
consults an in-memory index of the live journal (only when the journal holds something for the
path or any REMOVE/COPY; spec "Lookup semantics") and then the mapped tree, whose directories'
child names are decoded once into dicts (TreeView) and whose decoded node metadata is cached
per path by get_all (bounded; valid until the tree file is replaced). Writes append one CRC'd entry per
operation, entry bytes then the count that covers them, as memory copies into the journal
mapped shared (``_map_journal``; ``write_many``: many operations, one copy); rotation (compaction) streams the old
tree + journal into a new tree file with gvfs's exact steps.
"""
from __future__ import annotations

import bisect
import errno
import itertools
import logging
import mmap
import os
import platform
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..formats.base import FormatError
from ..formats.gvfs_journal import (HEADER_SIZE, encode_entry, decode_entry, journal_image,
                                    parse_header)
from ..formats.gvfs_tree import ROTATED_OFFSET, MergedTree, TreeView, write_tree
from .backend import (CopyOp, InvalidMetadata, MoveOp, RemoveOp, SetOp, UnsetOp, Value,
                      WriteOp)
from ..options import SYNC_MODES
from .files import (StoreDir, journal_path_for, lock_holder, lock_path_for,
                    write_all)
from .ledger import Ledger

log = logging.getLogger(__name__)

DEFAULT_JOURNAL_SIZE = 1 << 20  # gvfs uses 32 KiB; it honours the header's file_size
TREE_META_CACHE = 100_000  # decoded tree metadata per path (the tree is immutable per mapping)
#: After a rotation failed for want of space, the next attempt waits this long (doubling up
#: to ROTATION_BACKOFF_MAX) unless the filesystem has the room a rotation needs by then.
ROTATION_BACKOFF = 1.0
ROTATION_BACKOFF_MAX = 60.0
#: Appends are memory copies into the mapped journal only where CPUs show other CPUs one
#: CPU's stores in program order (x86's TSO), so a gvfs reader mapping the journal never
#: sees the entry count before the entry it covers; elsewhere appends are two pwrites.
MAPPED_APPENDS = platform.machine() in ("x86_64", "AMD64", "i386", "i686")
#: _check_space asks the filesystem for its free space at least this often, and on every
#: write once the room left above a rotation's needs is below the margin.
SPACE_RECHECK_SECONDS = 0.5
SPACE_RECHECK_MARGIN = 64 << 20
_NOT_CACHED: Any = object()
_U32 = struct.Struct(">I")
_u32_from = _U32.unpack_from  # bound once: every read-only lookup checks two header fields

__all__ = ["MetaStore", "StoreLocked", "EntryTooLarge", "InvalidMetadata", "SYNC_MODES",
           "journal_path_for", "lock_path_for", "lock_holder", "canonical"]


class StoreLocked(OSError):
    """Another writer holds the store's lock (EBUSY)."""

    def __init__(self, message: str):
        super().__init__(errno.EBUSY, message)


class RotationPostponed(OSError):
    """A rotation not attempted: the last one failed for want of space moments ago and the
    filesystem still lacks the room one needs (ENOSPC, nothing written)."""


class EntryTooLarge(OSError):
    """An entry larger than an empty journal can hold (E2BIG, as a native xattr too big)."""

    def __init__(self, message: str):
        super().__init__(errno.E2BIG, message)


def _ancestors_and_self(path: str) -> list[str]:
    """"/a/b" -> ["/", "/a", "/a/b"] (an ancestor is a prefix ending at "/" or at the end)."""
    out = ["/"]
    if path != "/":
        pos = 0
        while True:
            pos = path.find("/", pos + 1)
            if pos < 0:
                out.append(path)
                break
            out.append(path[:pos])
    return out


def _redirect(cur: str, dest: str, source: str) -> str:
    """cur lies at or under dest; the same place under source."""
    rest = cur if dest == "/" else cur[len(dest):]
    if rest == "/":
        rest = ""
    base = "" if source == "/" else source
    return (base + rest) or "/"


def canonical(path: str) -> str:
    # fast path: already canonical ("/" itself takes the slow path, which returns it as is)
    if path[:1] == "/" and path[-1:] != "/" and "//" not in path and "\0" not in path:
        return path
    if "\0" in path:
        raise InvalidMetadata(f"NUL byte in metadata path {path!r}")
    parts = [p for p in path.split("/") if p]
    return "/" + "/".join(parts)


@dataclass
class JournalIndex:
    """The live journal's valid entries, indexed for lookups by path.

    ``keyed[path][key]`` and ``structural[path]`` hold entry numbers in increasing order, so the
    newest entry before a bound is one bisect away; structural entries (REMOVE, COPY) are
    found by probing the path and each of its ancestors.
    """

    records: list[dict] = field(default_factory=list)
    keyed: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    structural: dict[str, list[int]] = field(default_factory=dict)
    next_offset: int = HEADER_SIZE
    error: FormatError | None = None

    @property
    def count(self) -> int:
        return len(self.records)

    def add(self, rec: dict, size: int) -> None:
        idx = len(self.records)
        self.records.append(rec)
        self.next_offset += size
        kind = rec["kind"]
        if kind in ("copy", "remove"):
            self.structural.setdefault(rec["path"], []).append(idx)
        else:
            if kind == "unset":
                self.unsets += 1
            path = rec["path"]
            keys = self.keyed.get(path)
            if keys is None:
                keys = self.keyed[path] = {}
                if self._sorted_paths is not None:
                    bisect.insort(self._sorted_paths, path)
            entries = keys.get(rec["key"])
            if entries is None:  # (no empty list made per write of a key seen before)
                keys[rec["key"]] = [idx]
            else:
                entries.append(idx)

    _sorted_paths: list[str] | None = None  # keyed paths in order, built on first need
    unsets: int = 0  # UNSET entries among the records

    def deciding_sets(self, count: int) -> list[dict] | None:
        """When the first ``count`` records (all of them) are SET/SETV entries only: the
        newest of each (path, key), in journal order -- what decides a merge of them. None
        when there are others (an UNSET or a REMOVE/COPY makes order across keys matter)."""
        if self.structural or self.unsets or count != len(self.records):
            return None
        records = self.records
        return [records[i] for i in sorted(idxs[-1] for keys in self.keyed.values()
                                           for idxs in keys.values())]

    def touches(self, path: str) -> bool:
        """Whether any entry is about ``path``, a path below it, or (structurally: a REMOVE
        or COPY) one of its ancestors -- i.e. whether the journal may decide anything at or
        below ``path``."""
        if path in self.keyed:
            return True
        below = path + "/"
        for spath, idxs in self.structural.items():
            if spath.startswith(below) or spath == path or path.startswith(spath + "/") \
                    or spath == "/":
                return True
        if self._sorted_paths is None:
            self._sorted_paths = sorted(self.keyed)
        i = bisect.bisect_left(self._sorted_paths, below)
        return i < len(self._sorted_paths) and self._sorted_paths[i].startswith(below)

    def _newest_structural(self, cur: str, before: int) -> int:
        best = -1
        if not self.structural:
            return best
        for anc in _ancestors_and_self(cur):
            idxs = self.structural.get(anc)
            if idxs:
                i = bisect.bisect_left(idxs, before) - 1
                if i >= 0 and idxs[i] > best:
                    best = idxs[i]
        return best

    def resolve_key(self, cur: str, key: str):
        """("value", v) / ("absent", None) decided by the journal, or ("tree", path)."""
        before = len(self.records)
        if not before:
            return "tree", cur
        while True:
            s = self._newest_structural(cur, before)
            idxs = self.keyed.get(cur, {}).get(key)
            if idxs:
                i = bisect.bisect_left(idxs, before) - 1
                if i >= 0 and idxs[i] > s:
                    rec = self.records[idxs[i]]
                    return ("absent", None) if rec["kind"] == "unset" else ("value", rec["value"])
            if s < 0:
                return "tree", cur
            rec = self.records[s]
            if rec["kind"] == "remove":
                return "absent", None
            cur, before = _redirect(cur, rec["path"], rec["source"]), s

    def resolve_all(self, cur: str, out: dict, decided: set):
        """Fill ``out`` with journal-decided keys; returns the tree path still to consult
        (or None when a REMOVE ends the walk)."""
        before = len(self.records)
        while True:
            s = self._newest_structural(cur, before)
            for key, idxs in self.keyed.get(cur, {}).items():
                if key in decided:
                    continue
                i = bisect.bisect_left(idxs, before) - 1
                if i >= 0 and idxs[i] > s:
                    decided.add(key)
                    rec = self.records[idxs[i]]
                    if rec["kind"] != "unset":
                        out[key] = rec["value"]
            if s < 0:
                return cur
            rec = self.records[s]
            if rec["kind"] == "remove":
                return None
            cur, before = _redirect(cur, rec["path"], rec["source"]), s


class MetaStore:
    """One gvfs-format store (tree + journal). Thread-safe; synchronous; one writer per store.

    Every file is reached through the store directory's fd (:class:`~.files.StoreDir`), never
    by path: no symlink planted in the directory is followed, and the only files written are
    ones this process opened itself."""

    def __init__(self, tree_path: str, sync: str, journal_size: int, readonly: bool):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
        self.tree_path = os.path.abspath(tree_path)
        self.sync = sync
        self.journal_size = journal_size
        self.readonly = readonly
        self._lock = threading.RLock()
        self._rotate_mutex = threading.Lock()
        self._dir: StoreDir | None = None
        self._lock_fd: int | None = None
        self._tree_buf: Any = None  # mmap (bytes when empty)
        self._tree_fd: int | None = None  # the writer's read-write fd of the mapped tree
        self._tree: TreeView | None = None
        self._tree_ino = 0
        # tree path -> its decoded metadata in the mapped tree (None: not in the tree); valid
        # until the tree is replaced, which clears it (the journal is consulted first anyway)
        self._tree_meta: dict[str, dict | None] = {}
        self._journal_fd: int | None = None
        self._journal_buf: Any = None  # mmap
        self._journal_mapped_rw = False  # the writer appends through the mapping
        self._journal_name = ""
        self._journal_file_size = 0
        self._journal_ok = False  # header valid and tied to this tree
        self._index = JournalIndex()
        self._ticket = 0
        self.durable_ticket = 0
        self.rotations = 0
        self.failed_rotations = 0
        self.last_fsync: float | None = None
        self.last_rotation_seconds: float | None = None
        self._dirty = False
        self._closed = False
        self.ledger: Ledger | None = None  # the writer's ownership/quota ledger (ledger.py)
        self.refused_for_space = 0
        self._rotation_failed_at: float | None = None
        self._rotation_backoff = ROTATION_BACKOFF
        # _check_space's last answer: free bytes above a rotation's room, less what was
        # granted since; valid until the monotonic time _space_fresh_until
        self._space_surplus = 0
        self._space_fresh_until = 0.0

    # ----------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, tree_path, *, sync="batch", journal_size=DEFAULT_JOURNAL_SIZE, readonly=False,
             create=True) -> "MetaStore":
        store = cls(tree_path, sync, journal_size, readonly)
        try:
            store._dir = StoreDir.open(store.tree_path, writer=not readonly, create=create)
        except FileNotFoundError:
            if readonly and create:
                return store  # a reader of a store not made yet: empty (e.g. a -o ro mount)
            raise FileNotFoundError(errno.ENOENT, f"no metadata store at {store.tree_path}") from None
        try:
            if not store._dir.exists(store._dir.tree_name) and not create:
                raise FileNotFoundError(errno.ENOENT, f"no metadata store at {store.tree_path}")
            if not readonly:
                store._take_lock()
                store._dir.remove_stale_temp_trees()
                store.ledger = Ledger(store._dir, store._dir.tree_name)
            store._load()
            if not readonly and store._tree is None:
                store.rotate()  # writes an empty tree and a fresh journal
                store.rotations = 0  # creating is not compacting
        except BaseException:
            store._release()
            raise
        return store

    @property
    def _store_dir(self) -> StoreDir:
        """The open store directory (None only once the store is closed)."""
        opened = self._dir
        if opened is None:
            raise ValueError(f"metadata store {self.tree_path} is closed")
        return opened

    def _take_lock(self) -> None:
        try:
            self._lock_fd = self._store_dir.take_lock()
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLocked(f"metadata store {self.tree_path} is in use by "
                                  f"{getattr(exc, 'holder', 'another process')}") from None
            raise

    def _load(self) -> None:
        """Map the tree and its journal; re-check ``rotated`` after opening the journal (the
        race where a writer replaces both between our two opens)."""
        self._space_fresh_until = 0.0  # a rotation's room depends on the files mapped
        for _ in range(20):
            self._unmap()
            if not self._store_dir.exists(self._store_dir.tree_name):
                return
            self._tree_buf, self._tree_ino, self._tree_fd = self._store_dir.map_tree()
            self._tree = TreeView(self._tree_buf, self.tree_path)
            self._open_journal()
            if self._tree.rotated == 0 or self._current_ino() == self._tree_ino:
                return
        raise OSError(errno.EIO, f"{self.tree_path}: store keeps rotating under us")

    def _current_ino(self) -> int:
        st = self._store_dir.lstat(self._store_dir.tree_name)
        return 0 if st is None else st.st_ino

    def _open_journal(self) -> None:
        self._index = JournalIndex()
        self._journal_ok = False
        tree = self._tree
        assert tree is not None  # _load maps the tree first
        self._journal_name = self._store_dir.journal_name(tree.tag)
        try:
            fd, st = self._store_dir.open_file(self._journal_name, os.O_RDONLY if self.readonly else os.O_RDWR)
        except FileNotFoundError:
            return
        self._journal_fd = fd
        size = st.st_size
        if size < HEADER_SIZE:
            return
        self._journal_buf = self._map_journal(fd, size)
        try:
            header = parse_header(self._journal_buf, self.journal_path)
        except FormatError as exc:
            self._index.error = exc.detached()
            return
        if header.tag != tree.tag:
            return
        self._journal_ok = True
        self._journal_file_size = min(header.file_size, size)
        self._index_new_entries()
        if self._journal_mapped_rw:
            self._journal_mapped_rw = self._fill_holes(fd, self._index.next_offset,
                                                       self._journal_file_size)

    def _map_journal(self, fd: int, size: int) -> mmap.mmap:
        """The journal mapped for reading, and for a writer also for writing: an append is
        then two memory copies (entry, then count) into the page cache, where gvfs's own
        writer puts them too -- no syscall. The page cache is the kernel's: kill -9 of the
        daemon loses nothing copied there, and fdatasync writes mapped pages as any others.
        A writable shared mapping dies with SIGBUS if the file shrinks under it; only the
        store's own user can do that (files.py: the directory and its files are ours
        alone). Where no writable mapping can be made, appends take pwrite, as on CPUs
        that may show other CPUs the count before the entry (see MAPPED_APPENDS), and
        under ``--sync always``: a page dirtied through a mapping makes ext4 commit its
        journal at the next fdatasync (page_mkwrite joins the running transaction), one
        written with pwrite does not -- an fdatasync per write took 4x longer mapped."""
        self._journal_mapped_rw = False
        if not self.readonly and MAPPED_APPENDS:
            try:
                buf = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
                self._journal_mapped_rw = True
                return buf
            except OSError as exc:
                log.info("metadata store %s: journal not mappable for writing (%s): "
                         "appends use pwrite", self.tree_path, exc)
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)

    def _fill_holes(self, fd: int, start: int, end: int) -> bool:
        """Make the journal's free part [start, end) allocated data (zeros) where it is a
        hole: a store on a full disk must make a mapped write fail as ENOSPC of this call,
        never SIGBUS at the first store into a page without a block. Our own journals are
        written whole (_swap_in); another writer's may be sparse. False: keep to pwrite."""
        pos = start
        try:
            while pos < end:
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
                if hole >= end:
                    break
                try:
                    data = min(os.lseek(fd, hole, os.SEEK_DATA), end)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:  # ENXIO: no data after the hole
                        raise
                    data = end
                write_all(fd, bytes(data - hole), hole)
                pos = data
        except OSError as exc:
            log.warning("metadata store %s: journal has holes that cannot be filled (%s): "
                        "appends use pwrite", self.tree_path, exc)
            return False
        return True

    def _index_new_entries(self) -> None:
        """Validate entries the header counts beyond those already indexed."""
        buf, index = self._journal_buf, self._index
        if index.error is not None:
            return
        num = _U32.unpack_from(buf, 16)[0]
        while index.count < num:
            try:
                rec, size = decode_entry(buf, index.next_offset, self.journal_path,
                                         self._journal_file_size)
            except FormatError as exc:
                index.error = exc.detached()
                return
            index.add(rec, size)

    def _tree_metadata(self, path: str) -> dict | None:
        """Decoded metadata of ``path`` in the mapped tree (None: no such node), cached."""
        meta = self._tree_meta.get(path, _NOT_CACHED)
        return self._tree_metadata_uncached(path) if meta is _NOT_CACHED else meta

    def _tree_metadata_uncached(self, path: str) -> dict | None:
        tree = self._tree
        if tree is None:
            return None
        off = tree.lookup(path)
        meta = None if off is None else tree.metadata(off)
        cache = self._tree_meta
        if len(cache) >= TREE_META_CACHE:
            for stale in list(itertools.islice(cache, TREE_META_CACHE // 2)):
                del cache[stale]  # the oldest half (insertion order)
        cache[path] = meta
        return meta

    def _unmap(self) -> None:
        self._tree_meta = {}
        for attr in ("_journal_buf", "_tree_buf"):
            buf = getattr(self, attr)
            if buf is not None and hasattr(buf, "close"):
                try:
                    buf.close()
                except BufferError:
                    pass
            setattr(self, attr, None)
        for attr in ("_journal_fd", "_tree_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)
        self._tree = None

    def _release(self) -> None:
        self._closed = True
        self._unmap()
        if self.ledger is not None:
            self.ledger.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._dir is not None:
            self._dir.close()
            self._dir = None

    # ----------------------------------------------------------------------------- reading
    @property
    def journal_path(self) -> str:
        return self._dir.where(self._journal_name) if self._journal_name and self._dir else ""

    def refresh(self) -> None:
        """Pick up another writer's rotation (rotated flag + new inode) or new entries."""
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        tree = self._tree
        if tree is None:
            if self._dir is not None and self._dir.exists(self._dir.tree_name):
                self._load()
        elif _u32_from(tree.buf, ROTATED_OFFSET)[0] != 0:
            if self._current_ino() != self._tree_ino:
                self._load()
            elif self._journal_ok:
                self._index_new_entries()
        elif self._journal_ok and _u32_from(self._journal_buf, 16)[0] != len(self._index.records):
            self._index_new_entries()

    def get(self, path: str, key: str) -> Value | None:
        path = canonical(path)
        with self._lock:
            if self.readonly:
                tree = self._tree  # _refresh_locked's common case inline: nothing changed
                if tree is None or _u32_from(tree.buf, ROTATED_OFFSET)[0] or (self._journal_ok and
                        _u32_from(self._journal_buf, 16)[0] != len(self._index.records)):
                    self._refresh_locked()
            index = self._index
            if index.records and (index.structural or path in index.keyed):
                verdict, what = index.resolve_key(path, key)
                if verdict != "tree":
                    return what
                path = what
            # one key: a binary search in the mapped node, nothing decoded or cached beyond it
            tree = self._tree
            return None if tree is None else tree.value(path, key)

    def get_all(self, path: str) -> dict[str, Value]:
        path = canonical(path)
        with self._lock:
            if self.readonly:
                self._refresh_locked()
            return self._get_all_locked(path)

    def _get_all_locked(self, path: str) -> dict[str, Value]:
        index = self._index
        out: dict[str, Value] = {}
        decided: set[str] = set()
        if index.records and (index.structural or path in index.keyed):
            path = index.resolve_all(path, out, decided)
        if path is not None:
            for k, v in (self._tree_metadata(path) or {}).items():
                if k not in decided:
                    out[k] = v
        return {k: out[k] for k in sorted(out)}

    def peek(self, path: str, key: str | None = None):
        """``(True, answer)`` when the answer is already in memory -- decided by the journal
        index or by the tree-metadata cache -- else ``(False, None)``. Never blocks on the
        store lock, never touches the mapped files and never does I/O, so an event loop may
        call it inline. ``key=None`` asks for all keys (as :meth:`get_all`). Read-only
        stores always say ``(False, None)``: they must re-check the files first."""
        try:
            path = canonical(path)
        except ValueError:
            return False, None
        if self.readonly or not self._lock.acquire(blocking=False):
            return False, None
        try:
            index = self._index
            tree_path = path
            if index.records and (index.structural or path in index.keyed):
                if key is not None:
                    verdict, what = index.resolve_key(path, key)
                    if verdict != "tree":
                        return True, what
                    tree_path = what
                else:
                    out: dict = {}
                    decided: set = set()
                    tree_path = index.resolve_all(path, out, decided)
            if tree_path is not None and self._tree is not None \
                    and tree_path not in self._tree_meta:
                return False, None
            if key is not None:
                meta = self._tree_meta.get(tree_path)
                return True, None if meta is None else meta.get(key)
            return True, self._get_all_locked(path)
        finally:
            self._lock.release()

    def try_get_all(self, path: str) -> dict[str, Value] | None:
        """:meth:`get_all` if the store lock is free right now, else None (a rotation is
        swapping files in, or a worker thread is appending). Lookups only read memory: the
        journal index and the mapped tree of this writer's local store, so an event loop may
        call it inline. Read-only stores say None: they must re-check the files first."""
        if self.readonly:
            return None
        path = canonical(path)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._get_all_locked(path)
        finally:
            self._lock.release()

    def holds_nothing_at(self, *paths: str) -> bool:
        """True when no metadata lies at or below any of ``paths`` (so moving or removing
        them changes nothing), decided from memory without waiting for the store lock;
        False when unsure (lock busy, read-only store, the root)."""
        if self.readonly:
            return False
        paths = tuple(canonical(p) for p in paths)
        if "/" in paths or not self._lock.acquire(blocking=False):
            return False
        try:
            index, tree = self._index, self._tree
            if index.error is not None:
                return False
            for path in paths:
                if index.records and index.touches(path):
                    return False
                if tree is not None and tree.lookup(path) is not None:
                    return False
            return True
        except FormatError:  # a damaged tree: let the real write report it
            return False
        finally:
            self._lock.release()

    def _merged(self, count: int | None = None) -> MergedTree:
        merged = MergedTree(self._tree)
        records = self._index.records[:count]
        deciding = self._index.deciding_sets(len(records))
        if deciding is None:
            for rec in records:
                merged.apply(rec)
            return merged
        # the same tree as every entry applied (set after set of one key: the last wins, as
        # does the last one's mtime for its node), and the same time range (every SET
        # counts in it): a rotation after a burst of sets folds in a fraction of them
        for rec in deciding:
            merged.apply(rec)
        times = [t for rec in records if (t := rec["mtime"])]
        if times:
            merged._note_time(min(times))
            merged._note_time(max(times))
        return merged

    def dump(self) -> dict[str, dict]:
        with self._lock:
            if self.readonly:
                self._refresh_locked()
            return {path: meta for path, meta, _ in self._merged().items()}

    # ----------------------------------------------------------------------------- writing
    def _check_writable(self) -> None:
        if self.readonly:
            raise OSError(errno.EROFS, f"metadata store {self.tree_path} is open read-only")
        if self._closed:
            raise ValueError("metadata store is closed")

    def _encode(self, ops: tuple, mtime: int) -> list[tuple[bytes, dict, int]]:
        """(entry bytes, its record as the journal index holds it, size) per op; the record is
        built here rather than decoded back from the bytes we just made."""
        entries = []
        for kind, path, key, value, source in ops:
            try:
                entry = encode_entry(kind, mtime, path, key, value, source)
            except (ValueError, UnicodeError) as exc:  # a NUL byte, or a str no bytes make
                raise InvalidMetadata(f"metadata entry for {path!r} cannot be stored: {exc}") from None
            rec = {"kind": kind, "mtime": mtime, "path": path}
            if key is not None:
                rec["key"] = key
            if value is not None:
                rec["value"] = value
            if source is not None:
                rec["source"] = source
            entries.append((entry, rec, len(entry)))
        total = entries[0][2] if len(entries) == 1 else sum(size for _, _, size in entries)
        self._check_fits(total)
        return entries

    def _check_fits(self, total: int) -> None:
        if total > self.journal_size - HEADER_SIZE:
            raise EntryTooLarge(f"metadata entry of {total} bytes can never fit a journal of "
                                f"{self.journal_size} bytes")

    # -- space: the store never eats into root's reserve nor the room of one rotation -------
    def rotation_room(self) -> int:
        """Bytes one rotation may need: a new tree (at most the old one plus what the journal
        holds) and a new preallocated journal."""
        tree = len(self._tree_buf) if self._tree_buf is not None else 0
        return tree + self._index.next_offset + max(self.journal_size, self._journal_file_size)

    def _space_left(self) -> int:
        """What an unprivileged user could still write on the store's filesystem (root's
        reserved blocks excluded, though the daemon is root)."""
        st = os.fstatvfs(self._store_dir.fd)
        return st.f_bavail * st.f_frsize

    def _check_space(self, grow: int) -> None:
        """ENOSPC unless ``grow`` more bytes of metadata still leave room for a rotation
        above root's reserve. The filesystem is asked (fstatvfs) when the last answer is
        older than SPACE_RECHECK_SECONDS or what this store granted since brings the room
        left within SPACE_RECHECK_MARGIN of the line: an append into the preallocated
        journal takes no space itself, so a figure that old misjudges only what someone
        else wrote meanwhile, and a rotation that then lacks the room fails as it would
        have anyway, leaving the old tree and journal in use."""
        now = time.monotonic()
        surplus = self._space_surplus - grow
        if now >= self._space_fresh_until or surplus < SPACE_RECHECK_MARGIN:
            surplus = self._space_left() - self.rotation_room() - grow
            self._space_fresh_until = now + SPACE_RECHECK_SECONDS
        if surplus < 0:
            self._space_fresh_until = 0.0  # ask again next time: space may come back
            self.refused_for_space += 1
            raise OSError(errno.ENOSPC, f"metadata store {self.tree_path}: its filesystem "
                          "lacks the room a rotation needs above root's reserve")
        self._space_surplus = surplus

    @staticmethod
    def _grows(entries) -> int:
        if len(entries) == 1:  # (no generator for the common write)
            _, rec, size = entries[0]
            return size if rec["kind"] in ("set", "setv") else 0
        return sum(size for _, rec, size in entries if rec["kind"] in ("set", "setv"))

    def _room(self, total: int) -> bool:
        return self._journal_ok and self._index.error is None and \
            self._index.next_offset + total <= self._journal_file_size

    def _append(self, *ops: tuple) -> int:
        """Append one entry per op ((kind, path, key, value, source)) as one unit: all of them
        go into the same journal, adjacent (a move's COPY + REMOVE). Returns the last ticket.
        A full journal is rotated first; when that fails (a full disk) its OSError is raised
        and nothing was written."""
        self._check_writable()
        entries = self._encode(ops, int(time.time()))
        total = sum(size for _, _, size in entries)
        grow = self._grows(entries)
        for _attempt in range(2):
            with self._lock:
                if grow:
                    self._check_space(grow)
                if self._room(total):
                    return self._write_entries(entries)
            self.rotate()  # never called with the store lock held: rotate takes it itself
        raise EntryTooLarge(f"metadata entry of {total} bytes does not fit after rotation")

    def try_append(self, op: WriteOp) -> tuple[int, float] | None:
        """Append one write only if that costs no wait for the store lock (a rotation may
        hold it), no rotation and no fsync: returns (ticket, journal fill) -- or None, and the
        caller queues the write instead. A bad write raises. This lets an event loop apply
        ``batch`` and ``none`` writes inline: memory copies into the mapped, preallocated
        journal (see _map_journal)."""
        if self.sync == "always":
            return None
        return self._try_append_ops(self._ops(op))

    def try_set(self, path: str, key: str, value: Value) -> tuple[int, float] | None:
        """``try_append(SetOp(path, key, value))`` (the mount's setxattr), minus the op. A
        string value (every setxattr) takes the same steps as :meth:`_try_append_ops` and
        :meth:`_encode` written out for one SET entry, without the tuples of ops and the
        generic record building (the setxattr row's CPU per request)."""
        if self.sync == "always":
            return None
        if type(value) is not str:
            return self._try_append_ops(self._set_ops(path, key, value))
        if type(key) is not str or not key or "\0" in key:
            self._check_key(key)
        if self.readonly or self._closed:
            self._check_writable()
        path = canonical(path)
        mtime = int(time.time())
        try:
            entry = encode_entry("set", mtime, path, key, value)
        except (ValueError, UnicodeError) as exc:  # a NUL byte, or a str no bytes make
            raise InvalidMetadata(f"metadata entry for {path!r} cannot be stored: {exc}") from None
        size = len(entry)
        self._check_fits(size)
        lock = self._lock
        if not lock.acquire(False):
            return None
        try:
            self._check_space(size)
            if not self._room(size):
                return None
            rec = {"kind": "set", "mtime": mtime, "path": path, "key": key, "value": value}
            ticket = self._write_entries([(entry, rec, size)], fsync=False)
            return ticket, self._fill_locked()
        finally:
            lock.release()

    def _try_append_ops(self, ops: tuple) -> tuple[int, float] | None:
        self._check_writable()
        entries = self._encode(ops, int(time.time()))
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if len(entries) == 1:
                total = entries[0][2]
            else:
                total = sum(size for _, _, size in entries)
            grow = self._grows(entries)
            if grow:
                self._check_space(grow)
            if not self._room(total):
                return None
            ticket = self._write_entries(entries, fsync=False)
            return ticket, self._fill_locked()
        finally:
            self._lock.release()

    def write_many(self, ops: list[WriteOp], *, durable: bool = False) -> list:
        """Many writes as few journal appends; returns per write its ticket or the exception
        it raised (a bad write fails alone; when the journal is full and cannot be rotated --
        a full disk -- that OSError is the answer of every write not yet appended, and those
        appended keep their tickets). Writes are appended in order, as many per append as fit;
        ``durable`` fdatasyncs once at the end."""
        self._check_writable()
        mtime = int(time.time())
        results: list = [None] * len(ops)
        units: list[tuple[int, list]] = []
        with self._lock:
            spare = self._space_left() - self.rotation_room()
        for i, op in enumerate(ops):
            try:
                entries = self._encode(self._ops(op), mtime)
                grow = self._grows(entries)
                if grow:
                    if grow > spare:
                        self.refused_for_space += 1
                        raise OSError(errno.ENOSPC, f"metadata store {self.tree_path}: its "
                                      "filesystem lacks the room a rotation needs above "
                                      "root's reserve")
                    spare -= grow
                units.append((i, entries))
            except OSError as exc:
                results[i] = exc
        pos, fruitless = 0, 0
        while pos < len(units):
            with self._lock:
                room = self._journal_file_size - self._index.next_offset
                batch, used = [], 0
                if self._room(0):
                    for _, entries in units[pos:]:
                        size = sum(e[2] for e in entries)
                        if used + size > room:
                            break
                        batch.append(entries)
                        used += size
                if batch:
                    try:
                        ticket = self._ticket
                        self._write_entries([e for entries in batch for e in entries], fsync=False)
                    except OSError as exc:
                        for i, _ in units[pos:]:
                            results[i] = exc
                        break
                    for k, entries in enumerate(batch):  # a unit's ticket: its last entry's
                        ticket += len(entries)
                        results[units[pos + k][0]] = ticket
                    pos += len(batch)
                    fruitless = 0
                    continue
            if fruitless == 2:  # rotated twice and it still does not fit
                for i, _ in units[pos:]:
                    results[i] = EntryTooLarge("metadata entry does not fit after rotation")
                break
            fruitless += 1
            try:
                self.rotate()  # the next unit does not fit: compact, then go on
            except OSError as exc:
                for i, _ in units[pos:]:
                    results[i] = exc
                break
        if durable or self.sync == "always":
            self.flush()
        return results

    def _ops(self, op: WriteOp) -> tuple[tuple, ...]:
        """The journal ops (kind, path, key, value, source) of one write, validated, paths
        canonical."""
        if type(op) is SetOp:
            return self._set_ops(op.path, op.key, op.value)
        if type(op) is UnsetOp:
            self._check_key(op.key)
            return (("unset", canonical(op.path), op.key, None, None),)
        if type(op) is RemoveOp:
            return (("remove", canonical(op.path), None, None, None),)
        if type(op) is CopyOp:
            return (("copy", canonical(op.dst), None, None, canonical(op.src)),)
        if type(op) is MoveOp:
            src, dst = canonical(op.src), canonical(op.dst)
            return ("copy", dst, None, None, src), ("remove", src, None, None, None)
        raise TypeError(f"not a metadata write: {op!r}")

    def _set_ops(self, path: str, key: str, value: Value) -> tuple[tuple, ...]:
        """:meth:`_ops` of ``SetOp(path, key, value)``."""
        self._check_key(key)
        if isinstance(value, (list, tuple)):
            return (("setv", canonical(path), key, [str(v) for v in value], None),)
        return (("set", canonical(path), key, str(value), None),)

    def _write_entries(self, entries: list, fsync: bool = True) -> int:
        """Entry bytes first, then the count that covers them (gvfs readers stop at the
        count); the index learns of them only once both writes went through, so a failed
        write leaves nothing counted."""
        fd = self._journal_fd
        assert fd is not None  # only a writer writes, and a writer's journal is open
        index = self._index
        data = entries[0][0] if len(entries) == 1 else b"".join(e for e, _, _ in entries)
        if self._journal_mapped_rw and self.sync != "always":  # (see _map_journal)
            start = index.next_offset
            self._journal_buf[start:start + len(data)] = data
            _U32.pack_into(self._journal_buf, 16, index.count + len(entries))
        else:
            write_all(fd, data, index.next_offset)
            write_all(fd, _U32.pack(index.count + len(entries)), 16)
        for _, rec, size in entries:
            self._index.add(rec, size)
        self._ticket += len(entries)
        self._dirty = True
        if fsync and self.sync == "always":
            os.fdatasync(fd)  # the journal is preallocated: its size never changes
            self.durable_ticket = self._ticket
            self.last_fsync = time.time()
        return self._ticket

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key or "\0" in key:
            raise InvalidMetadata(f"bad metadata key {key!r}")

    def set(self, path: str, key: str, value: Value) -> int:
        return self._append(*self._ops(SetOp(path, key, value)))

    def unset(self, path: str, key: str) -> int:
        return self._append(*self._ops(UnsetOp(path, key)))

    def remove(self, path: str) -> int:
        return self._append(*self._ops(RemoveOp(path)))

    def copy(self, src: str, dst: str) -> int:
        return self._append(*self._ops(CopyOp(src, dst)))

    def move(self, src: str, dst: str) -> int:
        """COPY(dst <- src) then REMOVE(src), as gvfs writes a move."""
        return self._append(*self._ops(MoveOp(src, dst)))

    def flush(self) -> int:
        """fdatasync the journal (preallocated, so its size and blocks never change and the
        inode's times are all fdatasync would skip); returns the highest durable ticket. It
        runs without the store lock (on a dup of the fd) so writers keep appending: group
        commit."""
        if self.ledger is not None:
            self.ledger.flush()
        with self._lock:
            target = self._ticket
            if target <= self.durable_ticket or self._journal_fd is None:
                return self.durable_ticket
            fd = os.dup(self._journal_fd)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.durable_ticket = max(self.durable_ticket, target)
            self.last_fsync = time.time()
            return self.durable_ticket

    # ----------------------------------------------------------------------------- rotation
    def fill(self) -> float:
        with self._lock:
            return self._fill_locked()

    def _fill_locked(self) -> float:
        if not self._journal_ok or not self._journal_file_size:
            return 1.0 if not self.readonly else 0.0
        return (self._index.next_offset - HEADER_SIZE) / (self._journal_file_size - HEADER_SIZE)

    def needs_rotation(self, threshold: float = 0.75) -> bool:
        with self._lock:
            return self._index.error is not None or self.fill() >= threshold

    @property
    def ticket(self) -> int:
        """The newest write's ticket."""
        return self._ticket

    @property
    def dirty(self) -> bool:
        return self._dirty

    def rotate(self) -> None:
        """Compaction with gvfs's steps. The merged tree is built and written outside the
        store lock from a snapshot of the journal; entries appended meanwhile are carried into
        the new journal under the lock, so no write is lost. Until the new tree is renamed
        into place nothing of the old tree and journal is touched: a rotation that fails (a
        full disk) leaves them in use as they were, and removes what it wrote."""
        self._check_writable()
        with self._rotate_mutex:
            self._check_rotation_backoff()
            started = time.monotonic()
            with self._lock:
                if self._tree is None and self._store_dir.exists(self._store_dir.tree_name):
                    self._load()  # an earlier load failed: never merge without the tree
                snapshot = self._index.count
                merged = self._merged(snapshot)
                old_tag = self._tree.tag if self._tree is not None else None
            tag = secrets.randbits(32)
            while tag == old_tag:
                tag = secrets.randbits(32)
            try:
                tmp = self._write_temp_tree(merged, tag)
                try:
                    with self._lock:
                        self._swap_in(tmp, tag, snapshot)
                        self.rotations += 1  # under the lock: status() never shows a half swap
                        self.last_rotation_seconds = time.monotonic() - started
                finally:
                    self._store_dir.unlink(tmp)  # gone already once renamed into place
            except FormatError as exc:  # the tree in place is damaged: EIO to the caller
                self.failed_rotations += 1
                raise OSError(errno.EIO, f"metadata store {self.tree_path}: cannot rotate: {exc}") from None
            except BaseException as exc:
                self.failed_rotations += 1
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    if self._rotation_failed_at is not None:
                        self._rotation_backoff = min(self._rotation_backoff * 2,
                                                     ROTATION_BACKOFF_MAX)
                    self._rotation_failed_at = time.monotonic()
                raise
            self._rotation_failed_at = None
            self._rotation_backoff = ROTATION_BACKOFF

    def _check_rotation_backoff(self) -> None:
        """No tight retry loop on a full disk: after a rotation failed for want of space,
        the next one waits out the backoff -- unless the room it needs is there again."""
        failed = self._rotation_failed_at
        if failed is None or time.monotonic() - failed >= self._rotation_backoff:
            return
        with self._lock:
            room = self.rotation_room()
        if self._space_left() >= room:
            return
        raise RotationPostponed(errno.ENOSPC, f"metadata store {self.tree_path}: rotation "
                                f"postponed: the last one failed for want of space "
                                f"{time.monotonic() - failed:.1f} s ago and the room it "
                                f"needs ({room} bytes) is still missing")

    def _write_temp_tree(self, merged: MergedTree, tag: int) -> str:
        fd, tmp = self._store_dir.create_temp_tree()
        try:
            with os.fdopen(fd, "w+b", closefd=False) as f:  # buffered: short writes continued
                write_tree(merged, f, tag)
            os.fsync(fd)
        except BaseException:
            self._store_dir.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return tmp

    def _swap_in(self, tmp: str, tag: int, snapshot: int) -> None:
        carried = self._index.records[snapshot:]
        entries = [encode_entry(r["kind"], r["mtime"], r["path"], r.get("key"), r.get("value"),
                                r.get("source")) for r in carried]
        image = journal_image(entries, tag, min_size=self.journal_size)
        new_journal = self._store_dir.journal_name(tag)
        self._store_dir.unlink(new_journal)  # a leftover of a killed rotation with this tag
        fd = self._store_dir.create_new(new_journal)
        try:
            try:
                write_all(fd, image, 0)  # every block allocated now: appends never need space
                os.fsync(fd)
            finally:
                os.close(fd)
            self._store_dir.rename(tmp, self._store_dir.tree_name)
        except BaseException:
            self._store_dir.unlink(new_journal)
            raise
        # committed: the new tree is in place; what follows must not undo that
        old_journal = self._journal_name
        try:
            self._store_dir.fsync()
            renamed_durably = True
        except OSError as exc:
            log.warning("metadata store %s: fsync of its directory failed: %s", self.tree_path, exc)
            renamed_durably = False
        if self._tree_fd is not None:
            try:  # mark the old tree rotated, through the fd we mapped it from
                write_all(self._tree_fd, b"\xff\xff\xff\xff", ROTATED_OFFSET)
                os.fsync(self._tree_fd)  # gvfs skips this; the seed's "sync old fd" step
            except OSError as exc:
                log.warning("metadata store %s: marking the old tree rotated failed: %s",
                            self.tree_path, exc)
        if old_journal and old_journal != new_journal and renamed_durably:
            self._store_dir.unlink(old_journal)
        self._load()
        self.durable_ticket = self._ticket
        self.last_fsync = time.time()
        self._dirty = bool(carried)

    # ----------------------------------------------------------------------------- the rest
    def status(self) -> dict:
        with self._lock:
            return {
                "tree_path": self.tree_path,
                "journal_path": self.journal_path,
                "journal_size": self._journal_file_size,
                "journal_used": self._index.next_offset,
                "fill": round(self.fill(), 6),
                "entries": self._index.count,
                "journal_error": str(self._index.error) if self._index.error else None,
                "rotations": self.rotations,
                "failed_rotations": self.failed_rotations,
                "refused_for_space": self.refused_for_space,
                "rotation_room": self.rotation_room(),
                "ledger": self.ledger.status() if self.ledger is not None else None,
                "last_rotation_seconds": self.last_rotation_seconds,
                "last_fsync": self.last_fsync,
                "ticket": self._ticket,
                "durable_ticket": self.durable_ticket,
                "sync": self.sync,
                "readonly": self.readonly,
            }

    def close(self, *, compact: bool = True) -> None:
        """Flush, rotate if anything was written since the last rotation (with
        ``compact=False`` only if the journal is past the fill threshold: short-lived writers
        such as the CLI leave their entries in the journal, where gvfs readers see them too),
        release the lock."""
        if self._closed:
            return
        try:
            if not self.readonly:
                self.flush()
                if self._dirty and (compact or self.needs_rotation()):
                    try:
                        self.rotate()
                    except OSError as exc:  # the journal holds every entry, durably
                        log.warning("metadata store %s: rotation at close failed, entries stay "
                                    "in the journal: %s", self.tree_path, exc)
        finally:
            with self._lock:
                self._closed = True
                self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
