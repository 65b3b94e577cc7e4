"""The gvfs-format metadata store: one tree file + its journal, read and written like gvfs.

:class:`MetaStore` is the only code that writes a store. Reads never load the tree: a lookup
walks an in-memory index of the live journal newest -> oldest (spec "Lookup semantics") and then
binary-searches the mapped tree. Writes append one CRC'd entry per operation; rotation
(compaction) streams the old tree + journal into a new tree file with gvfs's exact steps.
"""
from __future__ import annotations

import bisect
import mmap
import errno
import fcntl
import os
import secrets
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field

from ..formats.base import FormatError
from ..formats.gvfs_journal import (HEADER_SIZE, encode_entry, decode_entry, new_journal,
                                    parse_header)
from ..formats.gvfs_tree import MergedTree, TreeView, open_tree_file, write_tree

DEFAULT_JOURNAL_SIZE = 1 << 20  # gvfs uses 32 KiB; it honours the header's file_size
SYNC_MODES = ("always", "batch", "none")
TREE_LOOKUP_CACHE = 200_000  # memoised path -> dirent entries (cleared when full)
_U32 = struct.Struct(">I")
Value = str | list[str]


class StoreLocked(Exception):
    """Another writer holds the store's lock."""


class EntryTooLarge(Exception):
    """An entry larger than an empty journal can hold (FUSE maps it to E2BIG)."""


def journal_path_for(tree_path: str, tag: int) -> str:
    return f"{tree_path}-{tag:08x}.log"


def lock_path_for(tree_path: str) -> str:
    return tree_path + ".journalfs-lock"


def _parent(path: str) -> str:
    cut = path.rfind("/")
    return "/" if cut <= 0 else path[:cut]


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
    if path.startswith("/") and "//" not in path and (path == "/" or not path.endswith("/")) \
            and "\0" not in path:
        return path
    if "\0" in path:
        raise ValueError("NUL in path")
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
        if rec["kind"] in ("copy", "remove"):
            self.structural.setdefault(rec["path"], []).append(idx)
        else:
            self.keyed.setdefault(rec["path"], {}).setdefault(rec["key"], []).append(idx)

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
    """One gvfs-format store (tree + journal). Thread-safe; synchronous; one writer per store."""

    def __init__(self, tree_path: str, sync: str, journal_size: int, readonly: bool):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
        self.tree_path = os.path.abspath(tree_path)
        self.sync = sync
        self.journal_size = journal_size
        self.readonly = readonly
        self._lock = threading.RLock()
        self._rotate_mutex = threading.Lock()
        self._lock_fd: int | None = None
        self._tree_buf = None
        self._tree: TreeView | None = None
        self._tree_ino = 0
        self._tree_offsets: dict[str, int | None] = {}  # path -> dirent in the mapped tree
        self._journal_fd: int | None = None
        self._journal_buf = None
        self._journal_path = ""
        self._journal_file_size = 0
        self._journal_ok = False  # header valid and tied to this tree
        self._index = JournalIndex()
        self._ticket = 0
        self.durable_ticket = 0
        self.rotations = 0
        self.last_fsync: float | None = None
        self.last_rotation_seconds: float | None = None
        self._dirty = False
        self._closed = False

    # ----------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, tree_path, *, sync="batch", journal_size=DEFAULT_JOURNAL_SIZE, readonly=False,
             create=True) -> "MetaStore":
        store = cls(tree_path, sync, journal_size, readonly)
        exists = os.path.exists(store.tree_path)
        if not exists and not create:
            raise FileNotFoundError(f"no metadata store at {store.tree_path}")
        if not readonly:
            os.makedirs(os.path.dirname(store.tree_path), exist_ok=True)
            store._take_lock()
        try:
            store._load()
            if not readonly and store._tree is None:
                store.rotate()  # writes an empty tree and a fresh journal
                store.rotations = 0  # creating is not compacting
        except BaseException:
            store._release()
            raise
        return store

    def _take_lock(self) -> None:
        path = lock_path_for(self.tree_path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLocked(f"metadata store {self.tree_path} is in use by {holder}") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _load(self) -> None:
        """Map the tree and its journal; re-check ``rotated`` after opening the journal (the
        race where a writer replaces both between our two opens)."""
        for _ in range(20):
            self._unmap()
            if not os.path.exists(self.tree_path):
                return
            buf, ino = open_tree_file(self.tree_path)
            self._tree_buf, self._tree_ino = buf, ino
            self._tree = TreeView(buf, self.tree_path)
            self._open_journal()
            if self._tree.rotated == 0 or self._current_ino() == ino:
                return
        raise OSError(f"{self.tree_path}: store keeps rotating under us")

    def _current_ino(self) -> int:
        try:
            return os.lstat(self.tree_path).st_ino
        except FileNotFoundError:
            return 0

    def _open_journal(self) -> None:
        self._index = JournalIndex()
        self._journal_ok = False
        self._journal_path = journal_path_for(self.tree_path, self._tree.tag)
        try:
            fd = os.open(self._journal_path, os.O_RDONLY if self.readonly else os.O_RDWR)
        except FileNotFoundError:
            return
        self._journal_fd = fd
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            return
        self._journal_buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        try:
            header = parse_header(self._journal_buf, self._journal_path)
        except FormatError as exc:
            self._index.error = exc
            return
        if header.tag != self._tree.tag:
            return
        self._journal_ok = True
        self._journal_file_size = header.file_size
        self._index_new_entries()

    def _index_new_entries(self) -> None:
        """Validate entries the header counts beyond those already indexed."""
        buf, index = self._journal_buf, self._index
        if index.error is not None:
            return
        num = _U32.unpack_from(buf, 16)[0]
        while index.count < num:
            try:
                rec, size = decode_entry(buf, index.next_offset, self._journal_path,
                                         self._journal_file_size)
            except FormatError as exc:
                index.error = exc
                return
            index.add(rec, size)

    def _tree_lookup(self, path: str) -> int | None:
        """Dirent of ``path`` in the mapped tree, memoised until the tree is replaced."""
        try:
            return self._tree_offsets[path]
        except KeyError:
            pass
        if len(self._tree_offsets) >= TREE_LOOKUP_CACHE:
            self._tree_offsets.clear()
        off = self._tree_offsets[path] = self._tree.lookup(path)
        return off

    def _unmap(self) -> None:
        self._tree_offsets = {}
        for attr in ("_journal_buf", "_tree_buf"):
            buf = getattr(self, attr)
            if buf is not None and hasattr(buf, "close"):
                try:
                    buf.close()
                except BufferError:
                    pass
            setattr(self, attr, None)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        self._tree = None

    def _release(self) -> None:
        self._unmap()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----------------------------------------------------------------------------- reading
    @property
    def journal_path(self) -> str:
        return self._journal_path

    def refresh(self) -> None:
        """Pick up another writer's rotation (rotated flag + new inode) or new entries."""
        with self._lock:
            if self._tree is None:
                if os.path.exists(self.tree_path):
                    self._load()
                return
            if self._tree.rotated != 0 and self._current_ino() != self._tree_ino:
                self._load()
            elif self._journal_ok:
                self._index_new_entries()

    def _reader_refresh(self) -> None:
        if self.readonly:
            self.refresh()

    def get(self, path: str, key: str) -> Value | None:
        path = canonical(path)
        with self._lock:
            self._reader_refresh()
            verdict, what = self._index.resolve_key(path, key)
            if verdict != "tree":
                return what
            if self._tree is None:
                return None
            off = self._tree_lookup(what)
            return None if off is None else self._tree.get(off, key)

    def get_all(self, path: str) -> dict[str, Value]:
        path = canonical(path)
        with self._lock:
            self._reader_refresh()
            out: dict[str, Value] = {}
            decided: set[str] = set()
            tree_path = self._index.resolve_all(path, out, decided)
            if tree_path is not None and self._tree is not None:
                off = self._tree_lookup(tree_path)
                if off is not None:
                    for k, v in self._tree.metadata(off).items():
                        if k not in decided:
                            out[k] = v
            return {k: out[k] for k in sorted(out)}

    def _merged(self, count: int | None = None) -> MergedTree:
        merged = MergedTree(self._tree)
        for rec in self._index.records[:count]:
            merged.apply(rec)
        return merged

    def dump(self) -> dict[str, dict]:
        with self._lock:
            self._reader_refresh()
            return {path: meta for path, meta, _ in self._merged().items()}

    # ----------------------------------------------------------------------------- writing
    def _check_writable(self) -> None:
        if self.readonly:
            raise PermissionError(f"metadata store {self.tree_path} is open read-only")
        if self._closed:
            raise ValueError("metadata store is closed")

    def _append(self, *ops: tuple) -> int:
        """Append one entry per op ((kind, path, key, value, source)) as one unit: all of them
        go into the same journal, adjacent (a move's COPY + REMOVE). Returns the last ticket."""
        self._check_writable()
        mtime = int(time.time())
        entries = []
        for kind, path, key, value, source in ops:
            entry = encode_entry(kind, mtime, path, key, value, source)
            rec, size = decode_entry(entry, 0, "<new entry>")
            entries.append((entry, rec, size))
        total = sum(size for _, _, size in entries)
        if total > self.journal_size - HEADER_SIZE:
            raise EntryTooLarge(f"metadata entry of {total} bytes can never fit a journal of "
                                f"{self.journal_size} bytes")
        for _attempt in range(2):
            with self._lock:
                if self._journal_ok and self._index.error is None and \
                        self._index.next_offset + total <= self._journal_file_size:
                    return self._write_entries(entries)
            self.rotate()  # never called with the store lock held: rotate takes it itself
        raise EntryTooLarge(f"metadata entry of {total} bytes does not fit after rotation")

    def _write_entries(self, entries: list) -> int:
        fd = self._journal_fd
        start = self._index.next_offset
        os.pwrite(fd, b"".join(e for e, _, _ in entries), start)  # entry bytes first ...
        for _, rec, size in entries:
            self._index.add(rec, size)
        os.pwrite(fd, _U32.pack(self._index.count), 16)  # ... then the count that covers them
        self._ticket += len(entries)
        self._dirty = True
        if self.sync == "always":
            os.fsync(fd)
            self.durable_ticket = self._ticket
            self.last_fsync = time.time()
        return self._ticket

    @staticmethod
    def _check_key(key: str) -> None:
        if not key or "\0" in key:
            raise ValueError(f"bad metadata key {key!r}")

    def set(self, path: str, key: str, value: Value) -> int:
        self._check_key(key)
        if isinstance(value, (list, tuple)):
            return self._append(("setv", canonical(path), key, [str(v) for v in value], None))
        return self._append(("set", canonical(path), key, str(value), None))

    def unset(self, path: str, key: str) -> int:
        self._check_key(key)
        return self._append(("unset", canonical(path), key, None, None))

    def remove(self, path: str) -> int:
        return self._append(("remove", canonical(path), None, None, None))

    def copy(self, src: str, dst: str) -> int:
        return self._append(("copy", canonical(dst), None, None, canonical(src)))

    def move(self, src: str, dst: str) -> int:
        """COPY(dst <- src) then REMOVE(src), as gvfs writes a move."""
        src, dst = canonical(src), canonical(dst)
        return self._append(("copy", dst, None, None, src), ("remove", src, None, None, None))

    def flush(self) -> int:
        """fsync the journal; returns the highest durable ticket. The fsync runs without the
        store lock (on a dup of the fd) so writers keep appending: group commit."""
        with self._lock:
            target = self._ticket
            if target <= self.durable_ticket or self._journal_fd is None:
                return self.durable_ticket
            fd = os.dup(self._journal_fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.durable_ticket = max(self.durable_ticket, target)
            self.last_fsync = time.time()
            return self.durable_ticket

    # ----------------------------------------------------------------------------- rotation
    def fill(self) -> float:
        with self._lock:
            if not self._journal_ok or not self._journal_file_size:
                return 1.0 if not self.readonly else 0.0
            return (self._index.next_offset - HEADER_SIZE) / (self._journal_file_size - HEADER_SIZE)

    def needs_rotation(self, threshold: float = 0.75) -> bool:
        with self._lock:
            return self._index.error is not None or self.fill() >= threshold

    @property
    def dirty(self) -> bool:
        return self._dirty

    def rotate(self) -> None:
        """Compaction with gvfs's steps. The merged tree is built and written outside the
        store lock from a snapshot of the journal; entries appended meanwhile are carried into
        the new journal under the lock, so no write is lost."""
        self._check_writable()
        with self._rotate_mutex:
            started = time.monotonic()
            with self._lock:
                snapshot = self._index.count
                merged = self._merged(snapshot)
            tag = secrets.randbits(32)
            tmp = self._write_temp_tree(merged, tag)
            try:
                with self._lock:
                    self._swap_in(tmp, tag, snapshot)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            self.rotations += 1
            self.last_rotation_seconds = time.monotonic() - started

    def _write_temp_tree(self, merged: MergedTree, tag: int) -> str:
        directory, base = os.path.split(self.tree_path)
        fd, tmp = tempfile.mkstemp(prefix=base + ".", dir=directory)
        try:
            with os.fdopen(fd, "w+b") as f:
                write_tree(merged, f, tag)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def _swap_in(self, tmp: str, tag: int, snapshot: int) -> None:
        carried = self._index.records[snapshot:]
        entries = [encode_entry(r["kind"], r["mtime"], r["path"], r.get("key"), r.get("value"),
                                r.get("source")) for r in carried]
        used = HEADER_SIZE + sum(map(len, entries))
        size = max(self.journal_size, used + (-used % 4))
        image = new_journal(tag, size)
        pos = HEADER_SIZE
        for e in entries:
            image[pos:pos + len(e)] = e
            pos += len(e)
        _U32.pack_into(image, 16, len(entries))
        new_journal_path = journal_path_for(self.tree_path, tag)
        fd = os.open(new_journal_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, image)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            old_fd = os.open(self.tree_path, os.O_RDWR)
        except FileNotFoundError:
            old_fd = None
        old_journal = self._journal_path
        try:
            os.rename(tmp, self.tree_path)
            dir_fd = os.open(os.path.dirname(self.tree_path), os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            if old_fd is not None:
                os.pwrite(old_fd, b"\xff\xff\xff\xff", 8)
                os.fsync(old_fd)  # gvfs skips this; the seed's "sync old fd" step
        finally:
            if old_fd is not None:
                os.close(old_fd)
        if old_journal and old_journal != new_journal_path:
            try:
                os.unlink(old_journal)
            except FileNotFoundError:
                pass
        self._load()
        self.durable_ticket = self._ticket
        self.last_fsync = time.time()
        self._dirty = bool(carried)

    # ----------------------------------------------------------------------------- the rest
    def status(self) -> dict:
        with self._lock:
            return {
                "tree_path": self.tree_path,
                "journal_path": self._journal_path,
                "journal_size": self._journal_file_size,
                "journal_used": self._index.next_offset,
                "fill": round(self.fill(), 6),
                "entries": self._index.count,
                "journal_error": str(self._index.error) if self._index.error else None,
                "rotations": self.rotations,
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
                    self.rotate()
        finally:
            with self._lock:
                self._closed = True
                self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
