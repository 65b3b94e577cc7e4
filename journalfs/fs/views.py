"""``MNT/.journalfs/``: the read-only virtual tree (CONTRACT "The mount").

::

    .journalfs/records/<p>/            for every journal file SOURCE/<p> (found by content)
        records.jsonl                  exactly `journalfs records SOURCE/<p> --json`
        <seq:08d>.<kind>               payload bytes, else the record's JSON line
    .journalfs/metadata/journal/       the live metadata journal, the same way
    .journalfs/status.json             store paths, journal fill, counters, mount options

Everything is generated lazily from a :class:`~journalfs.journals.RecordIndex` (sparse
checkpoints), cached by the journal's (ino, size, mtime), so a journal of millions of records
lists and reads with bounded memory. Inodes exist only while the kernel references them.
"""
from __future__ import annotations

import bisect
import errno
import inspect
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import pyfuse3
import trio

from ..formats.base import record_json_line
from ..journals import CHECKPOINT_EVERY, RecordIndex, sniff_file

log = logging.getLogger("journalfs.fs.views")

VIEWS_NAME = b".journalfs"
JSONL_NAME = b"records.jsonl"
RECORD_XATTR_PREFIX = b"user.record."
#: Records decoded per directory-listing batch (kept per open directory handle).
LIST_BATCH = 2048
#: Records decoded together for single-record requests, how many such batches stay cached,
#: and the payload bytes above which a batch is not kept.
RECORD_BATCH = 256
BATCH_CACHE = 32
BATCH_PAYLOAD_LIMIT = 1 << 20
#: How long a checked index is trusted without a stat (writes through the mount reset it).
TRUST_SECONDS = 0.5
#: Journals whose indexes stay cached.
INDEX_CACHE = 64
#: How long "does this SOURCE dir hold any journal" answers are reused.
SCAN_TTL = 2.0

ROOT, RECORDS_DIR, JOURNAL, RECORD, JSONL, METADATA, STATUS = (
    "root", "records_dir", "journal", "record", "jsonl", "metadata", "status")
#: Record inode numbers: RECORD_INO_BASE | journal id << SEQ_BITS | seq.
RECORD_INO_BASE = 1 << 62
SEQ_BITS = 36
SEQ_MASK = (1 << SEQ_BITS) - 1
JOURNAL_ID_MAX = (1 << (62 - SEQ_BITS)) - 1
LIVE = b"\0live"  # the `rel` of the live metadata journal (no SOURCE path can contain NUL)


@dataclass(eq=False, slots=True)
class VNode:
    ino: int
    kind: str
    rel: bytes = b""   # SOURCE-relative path (records dirs, journals) or LIVE
    seq: int = -1      # record number (RECORD)
    lookups: int = 0
    permanent: bool = False

    @property
    def key(self) -> tuple:
        return (self.kind, self.rel, self.seq)


def record_content(rec: dict) -> bytes:
    """What a record file holds: its payload bytes, else its JSON line."""
    if "payload" in rec:
        return bytes(rec["payload"] or b"")
    return (record_json_line(rec) + "\n").encode("utf-8")


def record_file_name(rec: dict) -> bytes:
    return f"{rec['seq']:08d}.{rec['kind']}".encode("utf-8")


def scalar_text(value) -> str | None:
    """A record field as xattr text; None for non-scalars (lists, dicts, payload bytes)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return None


def _seq_of(name: bytes) -> int | None:
    """The record number a record file name claims (``00000042.kind`` -> 42), else None."""
    digits, dot, _kind = name.partition(b".")
    if not dot or len(digits) < 8 or not digits.isdigit():
        return None
    seq = int(digits)
    return seq if b"%08d" % seq == digits and seq <= SEQ_MASK else None


class JsonlLayout:
    """Byte size of records.jsonl and the byte offset of every CHECKPOINT_EVERY-th line."""

    def __init__(self, index: RecordIndex, previous: "JsonlLayout | None" = None):
        """``previous``: the layout of the index ``index`` was extended from (the same file
        before it grew); its lines before the re-read point are kept, not rendered again."""
        self.seqs: list[int] = []
        self.offsets: list[int] = []
        size = first = 0
        if previous is not None and index.grown_from is not None:
            resume = index.grown_from[1]
            keep = bisect.bisect_left(previous.seqs, resume)
            if keep < len(previous.seqs) and previous.seqs[keep] == resume:
                self.seqs, self.offsets = previous.seqs[:keep], previous.offsets[:keep]
                size, first = previous.offsets[keep], resume
        for rec in index.records(first):
            if rec["seq"] % CHECKPOINT_EVERY == 0:
                self.seqs.append(rec["seq"])
                self.offsets.append(size)
            size += len(record_json_line(rec).encode("utf-8")) + 1
        self.size = size


class JsonlReader:
    """Streams records.jsonl for one open handle: sequential reads continue one decoder."""

    def __init__(self, index: RecordIndex, layout: JsonlLayout):
        self.index, self.layout = index, layout
        self._lines: Iterator[bytes] | None = None
        self._next = 0            # byte offset of the next line the decoder yields
        self._window = b""        # decoded bytes starting at _window_start
        self._window_start = 0
        self.lock = threading.Lock()

    def _seek(self, off: int) -> None:
        i = max(0, bisect.bisect_right(self.layout.offsets, off) - 1)
        seq, start = (self.layout.seqs[i], self.layout.offsets[i]) if self.layout.seqs else (0, 0)
        self.close()
        self._lines = ((record_json_line(r) + "\n").encode("utf-8")
                       for r in self.index.records(seq))
        self._next = self._window_start = start
        self._window = b""

    def read(self, off: int, size: int) -> bytes:
        end = min(off + size, self.layout.size)
        if off >= end:
            return b""
        with self.lock:
            if self._lines is None or not self._window_start <= off <= self._next:
                self._seek(off)
            # The window holds [_window_start, _next); keep what lies at or after `off`.
            parts = [self._window[off - self._window_start:] if off < self._next else b""]
            line_end = self._next
            while line_end < end:
                line = next(self._lines, None)
                if line is None:
                    break
                line_start, line_end = line_end, line_end + len(line)
                if line_end > off:
                    parts.append(line[max(0, off - line_start):])
            self._next = line_end
            self._window, self._window_start = b"".join(parts), off
            return self._window[:end - off]

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None


class Views:
    """Inodes, attributes, listings and reads of ``MNT/.journalfs``."""

    def __init__(self, fs, options: dict):
        self.fs = fs                      # the JournalFS: source paths, allocators, metadata
        self.options = options
        self.started_ns = time.time_ns()
        self.by_ino: dict[int, VNode] = {}
        self.by_key: dict[tuple, VNode] = {}
        self._journal_ids: dict[bytes, int] = {}  # journal rel -> id inside record inode numbers
        self._journal_rels: list[bytes] = []
        self.dirs: dict[int, dict] = {}   # handle -> listing state
        self.files: dict[int, object] = {}  # handle -> bytes or JsonlReader
        self._indexes: OrderedDict[str, RecordIndex] = OrderedDict()
        self._layouts: dict[tuple, JsonlLayout] = {}
        self._sniffed: dict[bytes, tuple[tuple, bool]] = {}
        self._scans: dict[bytes, tuple[float, bool]] = {}
        self._batches: OrderedDict[tuple, list[dict]] = OrderedDict()
        self._checked: dict[str, float] = {}  # journal path -> when its identity was checked
        self._cache_lock = threading.Lock()  # the caches above are filled from worker threads
        self.root = self._node(ROOT, permanent=True)
        self.records = self._node(RECORDS_DIR, permanent=True)
        self.metadata = self._node(METADATA, permanent=True)
        self.status = self._node(STATUS, permanent=True)
        self.live = self._node(JOURNAL, LIVE, permanent=True)

    # -- inode table -----------------------------------------------------------------------
    # Record files are never stored: their inode number encodes (journal id, seq), so listing
    # a journal of millions of records costs no memory per record on our side.
    def owns(self, ino: int) -> bool:
        return ino in self.by_ino or ino >= RECORD_INO_BASE

    def _journal_id(self, rel: bytes) -> int:
        with self._cache_lock:  # also called from worker threads
            jid = self._journal_ids.get(rel)
            if jid is None:
                jid = self._journal_ids[rel] = len(self._journal_rels)
                self._journal_rels.append(rel)
            return jid

    def _node(self, kind: str, rel: bytes = b"", seq: int = -1, permanent: bool = False) -> VNode:
        if kind == RECORD:
            if seq > SEQ_MASK or len(self._journal_rels) > JOURNAL_ID_MAX:
                raise pyfuse3.FUSEError(errno.EOVERFLOW)
            ino = RECORD_INO_BASE | (self._journal_id(rel) << SEQ_BITS) | seq
            return VNode(ino, RECORD, rel, seq)
        node = self.by_key.get((kind, rel, seq))
        if node is None:
            node = VNode(self.fs.next_inode(), kind, rel, seq, permanent=permanent)
            self.by_ino[node.ino] = node
            self.by_key[node.key] = node
        return node

    def _get(self, ino: int) -> VNode:
        if ino >= RECORD_INO_BASE:
            jid, seq = (ino - RECORD_INO_BASE) >> SEQ_BITS, ino & SEQ_MASK
            if jid < len(self._journal_rels):
                return VNode(ino, RECORD, self._journal_rels[jid], seq)
        try:
            return self.by_ino[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def forget(self, ino: int, count: int) -> None:
        node = self.by_ino.get(ino)
        if node is None:
            return
        node.lookups = max(0, node.lookups - count)
        if node.lookups == 0 and not node.permanent:
            del self.by_ino[ino]
            self.by_key.pop(node.key, None)

    # -- cache invalidation ----------------------------------------------------------------
    async def source_changed(self, rel: bytes) -> None:
        """SOURCE/``rel`` was changed through the mount: make the kernel forget what it
        cached about the views of it (records/ entries up the tree, the journal's attrs)."""
        self._scans.clear()
        with self._cache_lock:
            self._checked.pop(os.fsdecode(self.fs.abs(rel)), None)
        path = rel
        while path:
            parent_rel, _, name = path.rpartition(b"/")
            parent = self.by_key.get((RECORDS_DIR, parent_rel, -1))
            if parent is not None:  # async: the kernel may hold that directory's lock now
                pyfuse3.invalidate_entry_async(parent.ino, name, ignore_enoent=True)
            path = parent_rel
        for kind in (JOURNAL, JSONL):
            node = self.by_key.get((kind, rel, -1))
            if node is None:
                continue
            try:  # may block on page-cache writeback: never on the trio thread
                await trio.to_thread.run_sync(pyfuse3.invalidate_inode, node.ino)
            except OSError:  # the kernel has forgotten it already: nothing to drop
                pass

    # -- journals --------------------------------------------------------------------------
    def _journal_path(self, rel: bytes) -> str:
        if rel == LIVE:
            store = getattr(self.fs.meta, "store", None)
            path = getattr(store, "journal_path", None) or getattr(self.fs.meta, "journal_path", None)
            if not path:  # the gvfsd backend names its journal in its status
                path = self._service_status().get("journal_path")
            if not path:
                raise FileNotFoundError(errno.ENOENT, "no live metadata journal")
            return os.fspath(path)
        return os.fsdecode(self.fs.abs(rel))

    def _index(self, rel: bytes) -> RecordIndex:
        """The (cached) index of a journal; rebuilt whenever the file changed. Thread only."""
        path = self._journal_path(rel)
        st = os.stat(path, follow_symlinks=False)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._cache_lock:
            idx = self._indexes.get(path)
        # The live journal is written in place through mmap (mtime is not reliable): always fresh.
        if idx is None or idx.identity != ident or rel == LIVE:
            codec = sniff_file(path)
            if codec is None:
                raise FileNotFoundError(errno.ENOENT, "not a journal")
            idx = RecordIndex.build(path, codec, previous=idx)  # a grown file: only the growth
        with self._cache_lock:
            self._indexes[path] = idx
            self._checked[path] = time.monotonic()
            self._indexes.move_to_end(path)
            while len(self._indexes) > INDEX_CACHE:
                self._indexes.popitem(last=False)
        return idx

    def _trusted_index(self, rel: bytes) -> RecordIndex | None:
        """The cached index when it was checked against the file moments ago (no syscall):
        lets the trio thread answer stat/lookup of records without a worker-thread hop."""
        if rel == LIVE:
            return None
        path = os.fsdecode(self.fs.abs(rel))
        with self._cache_lock:
            idx = self._indexes.get(path)
            checked = self._checked.get(path, -TRUST_SECONDS)
        return idx if idx is not None and time.monotonic() - checked < TRUST_SECONDS else None

    def _cached_record(self, node: VNode) -> dict | None:
        idx = self._trusted_index(node.rel)
        if idx is None:
            return None
        first = node.seq - node.seq % RECORD_BATCH
        with self._cache_lock:
            batch = self._batches.get((idx.path, idx.identity, idx.count, first))
        if batch is None or not 0 <= node.seq - first < len(batch):
            return None
        return batch[node.seq - first]

    def _record_attrs(self, node: VNode, rec: dict, mtime_ns: int) -> pyfuse3.EntryAttributes:
        timeout = 0 if node.rel == LIVE else None
        return self._attrs(node, stat.S_IFREG | 0o444, len(record_content(rec)), mtime_ns, timeout)

    def _cached_index(self, rel: bytes) -> RecordIndex:
        """Like :meth:`_index`, but the live journal is not rebuilt for every record."""
        if rel == LIVE:
            with self._cache_lock:
                idx = self._indexes.get(self._journal_path(rel))
            if idx is not None:
                return idx
        return self._index(rel)

    def _record(self, rel: bytes, seq: int, idx: RecordIndex | None = None) -> dict:
        """Record ``seq`` of a journal, decoded with its neighbours: ``ls -l`` or ``cat *``
        over a journal directory then decodes each record about once, not once per call."""
        idx = idx or self._cached_index(rel)
        first = seq - seq % RECORD_BATCH
        key = (idx.path, idx.identity, idx.count, first)
        with self._cache_lock:
            batch = self._batches.get(key)
            if batch is not None:
                self._batches.move_to_end(key)
        if batch is None:
            batch = list(idx.records(first, RECORD_BATCH))
            if sum(len(r.get("payload") or b"") for r in batch) <= BATCH_PAYLOAD_LIMIT:
                with self._cache_lock:
                    self._batches[key] = batch
                    while len(self._batches) > BATCH_CACHE:
                        self._batches.popitem(last=False)
        if not 0 <= seq - first < len(batch):
            raise FileNotFoundError(errno.ENOENT, "no such record")
        return batch[seq - first]

    def _layout(self, idx: RecordIndex) -> JsonlLayout:
        key = (idx.path, idx.identity, idx.count)
        with self._cache_lock:
            layout = self._layouts.get(key)
        if layout is None:
            with self._cache_lock:
                grown = idx.grown_from and next((v for k, v in self._layouts.items()
                                                 if k[:2] == (idx.path, idx.grown_from[0])), None)
            layout = JsonlLayout(idx, grown or None)
            with self._cache_lock:
                for stale in [k for k in self._layouts if k[0] == idx.path]:
                    del self._layouts[stale]
                while len(self._layouts) >= INDEX_CACHE:
                    del self._layouts[next(iter(self._layouts))]
                self._layouts[key] = layout
        return layout

    def _is_journal(self, rel: bytes, st: os.stat_result) -> bool:
        if not stat.S_ISREG(st.st_mode):
            return False
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._sniffed.get(rel)
        if cached is None or cached[0] != ident:
            if len(self._sniffed) > 100_000:
                self._sniffed.clear()
            cached = (ident, sniff_file(os.fsdecode(self.fs.abs(rel))) is not None)
            self._sniffed[rel] = cached
        return cached[1]

    def _holds_journals(self, rel: bytes) -> bool:
        """True when the SOURCE directory ``rel`` has a journal anywhere below it."""
        now = time.monotonic()
        cached = self._scans.get(rel)
        if cached is not None and now - cached[0] < SCAN_TTL:
            return cached[1]
        found = False
        for top, dirs, files in os.walk(self.fs.abs(rel)):
            base = os.path.relpath(top, self.fs.src)
            base = b"" if base == b"." else base
            for name in files:
                sub = base + b"/" + name if base else name
                try:
                    if self._is_journal(sub, os.lstat(top + b"/" + name)):
                        found = True
                        break
                except OSError:
                    continue
            if found:
                break
        self._scans[rel] = (now, found)
        return found

    def _records_entry(self, rel: bytes) -> str | None:
        """What SOURCE/``rel`` is under records/: JOURNAL, RECORDS_DIR or None (not shown)."""
        if rel.split(b"/")[0] == VIEWS_NAME:
            return None
        try:
            st = os.lstat(self.fs.abs(rel))
        except OSError:
            return None
        if stat.S_ISDIR(st.st_mode):
            return RECORDS_DIR if self._holds_journals(rel) else None
        return JOURNAL if self._is_journal(rel, st) else None

    # -- attributes ------------------------------------------------------------------------
    def _attrs(self, node: VNode, mode: int, size: int = 0, mtime_ns: int | None = None,
               timeout: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.entry_timeout = a.attr_timeout = self.fs.timeout if timeout is None else timeout
        a.st_mode = mode
        a.st_nlink = 2 if stat.S_ISDIR(mode) else 1
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_size = size
        a.st_blksize = 4096
        a.st_blocks = (size + 511) // 512
        t = self.started_ns if mtime_ns is None else mtime_ns
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = t
        return a

    def _compute_attrs(self, node: VNode) -> pyfuse3.EntryAttributes:
        """Attributes of any view node (thread: may decode or stat)."""
        live_timeout = 0 if node.rel == LIVE else None
        dir_mode, file_mode = stat.S_IFDIR | 0o555, stat.S_IFREG | 0o444
        if node.kind in (ROOT, METADATA):
            return self._attrs(node, dir_mode)
        if node.kind == RECORDS_DIR:
            if node.rel and self._records_entry(node.rel) != RECORDS_DIR:
                raise FileNotFoundError(errno.ENOENT, "gone")
            return self._attrs(node, dir_mode)
        if node.kind == STATUS:
            raise AssertionError("status.json attributes are built on the trio thread")
        if node.kind == JOURNAL:  # no decoding needed: just the file, still a journal
            path = self._journal_path(node.rel)
            st = os.stat(path, follow_symlinks=False)
            if node.rel != LIVE and not self._is_journal(node.rel, st):
                raise FileNotFoundError(errno.ENOENT, "no longer a journal")
            return self._attrs(node, dir_mode, mtime_ns=st.st_mtime_ns, timeout=live_timeout)
        idx = self._cached_index(node.rel) if node.kind == RECORD else self._index(node.rel)
        mtime = idx.identity[2]
        if node.kind == JSONL:
            return self._attrs(node, file_mode, self._layout(idx).size, mtime, live_timeout)
        return self._record_attrs(node, self._record(node.rel, node.seq, idx), mtime)

    def _service_status(self) -> dict:
        status = self.fs.meta.status()  # synchronous in both backends; may take a store lock
        return status if isinstance(status, dict) else {}

    async def _status_bytes(self) -> bytes:
        status = self.fs.meta.status
        if inspect.iscoroutinefunction(status):
            status = await status()
        else:  # synchronous in both backends, but it may wait for the store's lock
            status = await trio.to_thread.run_sync(status)
        status = status if isinstance(status, dict) else {}
        loc = self.fs.location
        journal = getattr(getattr(self.fs.meta, "store", None), "journal_path", None)
        doc = {
            "source": self.options.get("source") or os.fsdecode(self.fs.src),
            "mountpoint": self.options.get("mountpoint"),
            "store": {"tree": os.fspath(getattr(loc, "tree_path", "") or ""),
                      "prefix": getattr(loc, "prefix", None),
                      "journal": journal or status.get("journal_path")},
            # the figures people look for first, then everything the service reports
            "journal_fill": status.get("fill"),
            "entries": status.get("entries"),
            "rotations": status.get("rotations"),
            "last_fsync": status.get("last_fsync"),
            "service": status,
            "watch": self.fs.watch.status() if hasattr(self.fs, "watch") else None,
            "options": self.options,
        }
        return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()

    async def getattr(self, ino: int) -> pyfuse3.EntryAttributes:
        node = self._get(ino)
        if node.kind == STATUS:
            size = len(await self._status_bytes())
            return self._attrs(node, stat.S_IFREG | 0o444, size, time.time_ns(), 0)
        if node.kind == RECORD:
            rec = self._cached_record(node)
            if rec is not None:  # answered from memory, inline
                return self._record_attrs(node, rec, self._trusted_index(node.rel).identity[2])
        return await trio.to_thread.run_sync(self._compute_attrs, node)

    # -- lookup ----------------------------------------------------------------------------
    def lookup_root(self) -> pyfuse3.EntryAttributes:
        self.root.lookups += 1
        return self._attrs(self.root, stat.S_IFDIR | 0o555)

    async def lookup(self, parent_ino: int, name: bytes) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_ino)
        fixed = dict(self._fixed_entries(parent))
        if name in fixed:
            node = fixed[name]
        elif parent.kind == JOURNAL and (node := self._cached_record_lookup(parent, name)):
            pass
        else:
            key = await trio.to_thread.run_sync(self._child_key, parent, name)
            if key is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            node = self._node(*key)
        try:
            attrs = await self.getattr(node.ino)
        except BaseException:
            self.forget(node.ino, 0)
            raise
        node.lookups += 1
        return attrs

    def _cached_record_lookup(self, parent: VNode, name: bytes) -> VNode | None:
        """The record named ``name`` when memory alone can tell (no syscall, no decoding)."""
        seq = _seq_of(name)
        if seq is None:
            return None
        node = self._node(RECORD, parent.rel, seq)
        rec = self._cached_record(node)
        return node if rec is not None and record_file_name(rec) == name else None

    def _child_key(self, parent: VNode, name: bytes) -> tuple | None:
        """(kind, rel, seq) of ``name`` in a records dir or journal dir (thread: stats/decodes)."""
        if parent.kind == RECORDS_DIR and name not in (b".", b".."):
            rel = parent.rel + b"/" + name if parent.rel else name
            kind = self._records_entry(rel)
            return None if kind is None else (kind, rel)
        if parent.kind == JOURNAL:
            if name == JSONL_NAME:
                return (JSONL, parent.rel)
            seq = self._record_seq(parent.rel, name)
            return None if seq is None else (RECORD, parent.rel, seq)
        return None

    def _record_seq(self, rel: bytes, name: bytes) -> int | None:
        seq = _seq_of(name)
        if seq is None:
            return None
        try:
            rec = self._record(rel, seq, self._index(rel))
        except FileNotFoundError:
            return None
        return seq if record_file_name(rec) == name else None

    # -- directories -----------------------------------------------------------------------
    async def opendir(self, ino: int) -> int:
        node = self._get(ino)
        if node.kind in (RECORD, JSONL, STATUS):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        handle = self.fs.next_handle()
        state = {"node": node, "batch_first": 0, "batch": []}
        if node.kind == RECORDS_DIR:
            state["entries"] = await trio.to_thread.run_sync(self._list_records_dir, node.rel)
        elif node.kind == JOURNAL:  # an unreadable journal shows as an empty directory
            state["index"] = await trio.to_thread.run_sync(self._index, node.rel)
        self.dirs[handle] = state
        return handle

    def _list_records_dir(self, rel: bytes) -> list[tuple[bytes, str]]:
        out = []
        try:
            names = sorted(os.listdir(self.fs.abs(rel)))
        except OSError:
            return out
        for name in names:
            sub = rel + b"/" + name if rel else name
            kind = self._records_entry(sub)
            if kind is not None:
                out.append((name, kind))
        return out

    def _fixed_entries(self, node: VNode) -> list[tuple[bytes, VNode]]:
        if node.kind == ROOT:
            return [(b"metadata", self.metadata), (b"records", self.records),
                    (b"status.json", self.status)]
        if node.kind == METADATA:
            return [(b"journal", self.live)]
        return []

    async def readdir(self, fh: int, start_id: int, token) -> None:
        state = self.dirs.get(fh)
        if state is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node: VNode = state["node"]
        if node.kind == JOURNAL:
            return await self._readdir_journal(state, start_id, token)
        if node.kind == RECORDS_DIR:
            entries = [(name, self._node(kind, node.rel + b"/" + name if node.rel else name))
                       for name, kind in state["entries"][start_id:]]
        else:
            entries = self._fixed_entries(node)[start_id:]
        for i, (name, child) in enumerate(entries, start_id + 1):
            try:
                attrs = await self.getattr(child.ino)
            except pyfuse3.FUSEError:
                continue
            except OSError:
                continue
            if not pyfuse3.readdir_reply(token, name, attrs, i):
                self.forget(child.ino, 0)
                return
            child.lookups += 1

    async def _readdir_journal(self, state: dict, start_id: int, token) -> None:
        """Entry 0 is records.jsonl; entry ``seq + 1`` is record ``seq`` (stable cursors)."""
        node: VNode = state["node"]
        idx: RecordIndex = state["index"]
        if start_id == 0:
            jsonl = self._node(JSONL, node.rel)
            attrs = self._listed_jsonl_attrs(jsonl, idx)
            if not pyfuse3.readdir_reply(token, JSONL_NAME, attrs, 1):
                self.forget(jsonl.ino, 0)
                return
            jsonl.lookups += 1
            start_id = 1
        seq = start_id - 1
        mtime = idx.identity[2]
        timeout = 0 if node.rel == LIVE else None
        while seq < idx.count:
            first, batch = state["batch_first"], state["batch"]
            if not first <= seq < first + len(batch):
                batch = await trio.to_thread.run_sync(self._list_batch, idx, seq)
                state["batch_first"], state["batch"] = seq, batch
                first = seq
                if not batch:
                    return
            name, size = batch[seq - first]
            child = self._node(RECORD, node.rel, seq)
            attrs = self._attrs(child, stat.S_IFREG | 0o444, size, mtime, timeout)
            if not pyfuse3.readdir_reply(token, name, attrs, seq + 2):
                self.forget(child.ino, 0)
                return
            child.lookups += 1
            seq += 1

    def _listed_jsonl_attrs(self, jsonl: VNode, idx: RecordIndex) -> pyfuse3.EntryAttributes:
        """records.jsonl as a listing shows it. Its size costs a JSON pass over every record,
        so a listing only reports it when known; otherwise size 0 with no caching, and the
        next stat/open asks again and gets the exact size. (It is read with direct_io, so a
        momentarily wrong size never cuts a read short.)"""
        with self._cache_lock:
            layout = self._layouts.get((idx.path, idx.identity, idx.count))
        if layout is None:
            return self._attrs(jsonl, stat.S_IFREG | 0o444, 0, idx.identity[2], 0)
        timeout = 0 if jsonl.rel == LIVE else None
        return self._attrs(jsonl, stat.S_IFREG | 0o444, layout.size, idx.identity[2], timeout)

    @staticmethod
    def _list_batch(idx: RecordIndex, first: int) -> list[tuple[bytes, int]]:
        # Exact sizes even though JSON-line records cost an encoding each: a listing's
        # attributes update cached inodes, and a wrong size would cut short a concurrent read.
        return [(record_file_name(r), len(record_content(r)))
                for r in idx.records(first, LIST_BATCH)]

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------------
    async def open(self, ino: int) -> pyfuse3.FileInfo:
        node = self._get(ino)
        if node.kind not in (RECORD, JSONL, STATUS):
            raise pyfuse3.FUSEError(errno.EISDIR)
        handle = self.fs.next_handle()
        if node.kind == STATUS:
            self.files[handle] = await self._status_bytes()
            return pyfuse3.FileInfo(fh=handle, direct_io=True)
        rec = self._cached_record(node) if node.kind == RECORD else None
        if rec is not None:  # decoded moments ago: answered inline
            self.files[handle] = record_content(rec)
        else:
            self.files[handle] = await trio.to_thread.run_sync(self._open_content, node)
        # The live journal changes in place: never trust the page cache for it. records.jsonl
        # is streamed by its reader and may be listed with a provisional size (see above).
        # A record file's content is fixed by its inode (journal, seq) and the journal's
        # identity: a changed journal gets its view dentries invalidated, and a new size or
        # mtime in its attributes drops the kernel's pages, so they can be kept across opens.
        uncached = node.rel == LIVE or node.kind == JSONL
        return pyfuse3.FileInfo(fh=handle, direct_io=uncached, keep_cache=not uncached)

    def _open_content(self, node: VNode):
        if node.kind == JSONL:
            idx = self._index(node.rel)
            return JsonlReader(idx, self._layout(idx))
        return record_content(self._record(node.rel, node.seq))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        content = self.files.get(fh)
        if content is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if isinstance(content, JsonlReader):
            return await trio.to_thread.run_sync(content.read, off, size)
        return content[off:off + size]

    def release(self, fh: int) -> None:
        content = self.files.pop(fh, None)
        if isinstance(content, JsonlReader):
            with content.lock:
                content.close()

    # -- xattrs ----------------------------------------------------------------------------
    def _record_fields(self, node: VNode) -> dict[bytes, bytes]:
        if node.kind != RECORD:
            return {}
        rec = self._record(node.rel, node.seq)
        out = {}
        for key, value in rec.items():
            text = scalar_text(value)
            if text is not None:
                out[RECORD_XATTR_PREFIX + key.encode()] = text.encode("utf-8")
        return out

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        node = self._get(ino)
        if node.kind != RECORD or not name.startswith(RECORD_XATTR_PREFIX):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        fields = await trio.to_thread.run_sync(self._record_fields, node)
        try:
            return fields[name]
        except KeyError:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    async def listxattr(self, ino: int) -> list[bytes]:
        node = self._get(ino)
        return list(await trio.to_thread.run_sync(self._record_fields, node))
