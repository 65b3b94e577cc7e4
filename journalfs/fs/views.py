"""``MNT/.journalfs/``: the read-only virtual tree (CONTRACT "The mount").

::

    .journalfs/records/<p>/            for every journal file SOURCE/<p> (found by content)
        records.jsonl                  exactly `journalfs records SOURCE/<p> --json`
        <seq:08d>.<kind>               payload bytes, else the record's JSON line
    .journalfs/metadata/journal/       the live metadata journal, the same way
    .journalfs/status.json             store paths, journal fill, counters, mount options
    .journalfs/queues/, persistence/, transactions/   each system's state (fs/stateviews.py)

Permissions follow SOURCE: a directory under ``records/`` carries its SOURCE directory's owner,
group and mode (without write bits); a journal's view directory and its files carry the
journal's owner, group and read bits (x added on the directory where r is set). The mount uses
default_permissions, so the kernel refuses to others what SOURCE refuses them. The store's own
journal view and status.json belong to the mount's owner, 0700/0600.

Journals are opened only through :class:`~journalfs.fs.sourcefiles.SourceTree` (component by
component from a SOURCE directory fd, never following a symlink, never opening anything but a
regular file for reading). Indexing a journal runs in a worker thread of its own; requests for
records it has already passed are answered from the partial index, and no other request waits
for it. Indexes are kept on disk in the store directory (:mod:`journalfs.fs.indexfiles`), so a
remount finds any record of a big journal at once. Everything remembered between requests lives
in one :class:`~journalfs.fs.catalog.Catalog`.
"""
from __future__ import annotations

import base64
import bisect
import contextlib
import errno
import inspect
import json
import logging
import os
import stat
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyfuse3
import trio

from ..formats.base import Codec
from ..journals import CHECKPOINT_EVERY, FINGERPRINT_BYTES, RecordIndex, is_backup_name, sniff_fd
from ..jsonlines import json_line, keep_freed_memory
from . import direntries
from .catalog import Catalog
from .dirlist import DIR_BLKSIZE, NameOnlyEntry
from .indexfiles import IndexDir, matches, may_extend
from .jsonlfollow import JsonlGrowth
from .stateviews import TOPS as STATE_TOPS, StateTree
from ..selection import format_time, record_time_ns
from .sourcefiles import SourceTree, open_regular_path
from .status import StatusFile
from .watch import NOTIFIER

log = logging.getLogger("journalfs.fs.views")

VIEWS_NAME = b".journalfs"
JSONL_NAME = b"records.jsonl"
RECORD_XATTR_PREFIX = b"user.record."
DAMAGE_XATTR = b"user.journal.damage"
#: Journals with at least this many records are listed by name only (see _readdir_journal).
NAMES_ONLY_RECORDS = 100_000
#: Records decoded per directory-listing batch (kept per open directory handle).
LIST_BATCH = 16 * 1024
#: Records decoded together for single-record requests; batches with more payload bytes
#: than this are not remembered.
RECORD_BATCH = 256
#: ... for a format that cannot resume mid-file (a gvfs tree, walked from its top for every
#: batch): more records a walk, so that `ls -l` of a big one walks it tens of times, not
#: thousands (its records have no payload: a batch costs ~400 bytes a record).
UNRESUMABLE_RECORD_BATCH = 1 << 14
BATCH_PAYLOAD_LIMIT = 1 << 20
#: How long a checked journal is trusted without a stat (writes through the mount reset it).
TRUST_SECONDS = 0.5
#: How long "does this SOURCE dir hold any journal" answers are reused.
SCAN_TTL = 2.0
#: Journals up to this size are indexed and measured (records.jsonl's size) when first stat'ed;
#: bigger ones show records.jsonl with size 0 until it was read once (direct I/O, as /proc).
SMALL_JOURNAL_BYTES = 4 << 20
SMALL_JOURNAL_RECORDS = 50_000
#: Journals from this size on get their index saved in the store directory.
DISK_INDEX_MIN_BYTES = 1 << 20
#: Journals indexed at once (each in its own worker thread, outside trio's default pool so
#: that other requests never queue behind them).
INDEX_THREADS = 2
#: Records rendered together when records.jsonl is read (a multiple of CHECKPOINT_EVERY):
#: big enough for the vectorised renderer's fixed cost per batch to vanish, small enough that
#: a chunk stays a few MB.
READ_CHUNK_RECORDS = 16 * CHECKPOINT_EVERY
#: Worker threads the views use at most, and at most on one SOURCE path (see _on_file).
VIEW_THREADS = 16
FILE_THREADS = 2
#: Damaged journals listed in status.json at most.
DAMAGE_LIST_MAX = 1000

ROOT, RECORDS_DIR, JOURNAL, RECORD, JSONL, METADATA, STATUS = (
    "root", "records_dir", "journal", "record", "jsonl", "metadata", "status")
#: A path of the state views (queues/, persistence/, transactions/: fs/stateviews.py); its
#: rel is the path below .journalfs.
STATE = "state"
#: Record inode numbers: RECORD_INO_BASE | journal id << SEQ_BITS | seq.
RECORD_INO_BASE = 1 << 62
SEQ_BITS = 36
SEQ_MASK = (1 << SEQ_BITS) - 1
JOURNAL_ID_MAX = (1 << (62 - SEQ_BITS)) - 1
#: Journal names remembered for record inode numbers (least recently used forgotten; an id
#: is never handed out again, so a forgotten one can only go stale: ENOENT, never alias).
JOURNAL_IDS_KEPT = 32_768
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


@dataclass
class ViewContext:
    """What the views need from the mount, passed explicitly (no reference back to it)."""

    source: SourceTree                    # SOURCE, reached through its directory fd
    meta: Any                             # metadata service: status(), its store's journal
    next_inode: Callable[[], int]
    next_handle: Callable[[], int]
    timeout: Callable[[], float]          # the mount's current attribute/entry timeout
    store_dir: str | None = None          # where on-disk indexes go (<store dir>/indexes)
    tree_path: str = ""
    prefix: str | None = None
    source_name: str = ""
    watch: Any = None                     # fs.watch.SourceWatcher: status() for status.json
    # ``as_caller(ctx, fn, *args)`` runs fn with the request's fsuid/fsgid/groups (thread
    # only); ``caller_key(ctx)`` says whose they are. None: every caller sees everything.
    as_caller: Callable | None = None
    caller_key: Callable | None = None

    @classmethod
    def of_mount(cls, fs) -> "ViewContext":
        """The collaborators of a :class:`~journalfs.fs.passthrough.JournalFS`."""
        loc = fs.location
        tree = os.fspath(getattr(loc, "tree_path", "") or "")
        return cls(source=SourceTree(fs.src), meta=fs.meta, next_inode=fs.next_inode,
                   next_handle=fs.next_handle, timeout=lambda: fs.timeout,
                   store_dir=os.path.dirname(tree) or None, tree_path=tree,
                   prefix=getattr(loc, "prefix", None), source_name=os.fsdecode(fs.src),
                   watch=getattr(fs, "watch", None),
                   # looked up per call: the mount makes its Caller after its views
                   as_caller=lambda ctx, fn, *args: fs.caller.run(ctx, fn, *args),
                   caller_key=lambda ctx: (ctx.uid, ctx.gid, tuple(fs.caller.groups(ctx.pid))))


#: The access ACL the kernel asks for (POSIX ACL mode) before deciding on a view inode.
ACL_XATTR = b"system.posix_acl_access"
_ACL_VERSION = 2
_ACL_ENTRY = 8  # u16 tag, u16 perm, u32 id (little endian)
_R, _W, _X = 4, 2, 1


def view_acl(raw: bytes, kind: str) -> bytes | None:
    """The ACL of a view inode made from its SOURCE object's ``raw`` access ACL: every
    entry's w bit cleared (views are read-only), as the view's mode is made from the mode.
    ``kind``: RECORDS_DIR keeps r and x (a SOURCE directory); JOURNAL (a journal's view
    directory) gets x wherever r is set; a record file or records.jsonl keeps r only.
    None for anything that is not a well-formed version-2 ACL (the mode alone then rules)."""
    if len(raw) < 4 or (len(raw) - 4) % _ACL_ENTRY or \
            int.from_bytes(raw[:4], "little") != _ACL_VERSION:
        return None
    out = bytearray(raw)
    for pos in range(4 + 2, len(out), _ACL_ENTRY):
        perm = int.from_bytes(out[pos:pos + 2], "little")
        if kind == RECORDS_DIR:
            perm &= _R | _X
        elif kind == JOURNAL:
            perm = _R | _X if perm & _R else 0
        else:
            perm &= _R
        out[pos:pos + 2] = perm.to_bytes(2, "little")
    return bytes(out)


def record_content(rec: dict) -> bytes:
    """What a record file holds: its payload bytes, else its JSON line."""
    if "payload" in rec:
        return bytes(rec["payload"] or b"")
    return json_line(rec)


def _record_batch(idx: RecordIndex) -> int:
    """Records decoded together with one a request asks for."""
    return RECORD_BATCH if idx.codec.resumable else UNRESUMABLE_RECORD_BATCH


def record_file_name(rec: dict) -> bytes:
    return f"{rec['seq']:08d}.{rec['kind']}".encode("utf-8", "surrogateescape")


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


def _status_json(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()


def _rel_text(rel: bytes) -> dict:
    """A SOURCE-relative path for JSON: ``path``, or ``path_b64`` when not UTF-8."""
    try:
        return {"path": rel.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path_b64": base64.b64encode(rel).decode("ascii")}


# -- records.jsonl ------------------------------------------------------------------------------

class JsonlLayout:
    """Where records.jsonl's lines start: the byte offset of every CHECKPOINT_EVERY-th line of
    the lines measured so far (a prefix of the file), and its total size once all are.

    ``JsonlLayout(index)`` measures every line at once; :meth:`empty` starts with nothing
    known, and readers fill it in as they stream (:meth:`note`)."""

    def __init__(self, index: RecordIndex | None, previous: "JsonlLayout | None" = None):
        """``previous``: the layout of the index ``index`` was extended from (the same file
        before it grew); its lines before the re-read point are kept, not rendered again."""
        self.seqs: list[int] = []
        self.offsets: list[int] = []
        self.size: int | None = None
        self.measured = 0          # lines measured (a prefix)
        self.measured_bytes = 0    # their bytes
        self.lock = threading.Lock()
        if index is None:
            return
        self.count, self.identity = index.count, (index.dev, index.identity)
        size = first = 0
        if previous is not None and previous.size is not None and index.grown_from is not None:
            resume = index.grown_from[1]
            keep = bisect.bisect_left(previous.seqs, resume)
            if keep < len(previous.seqs) and previous.seqs[keep] == resume:
                self.seqs, self.offsets = previous.seqs[:keep], previous.offsets[:keep]
                size, first = previous.offsets[keep], resume
        step = CHECKPOINT_EVERY if index.codec.resumable else max(1, index.count)
        while first < index.count:
            chunk = index.json_chunk(first, step)
            data, rows = chunk.data, chunk.rows
            if not rows:
                break
            if first % CHECKPOINT_EVERY == 0:
                self.seqs.append(first)
                self.offsets.append(size)
            size += len(data)
            first += rows
        self.size = self.measured_bytes = size
        self.measured = index.count

    @classmethod
    def empty(cls, index: RecordIndex) -> "JsonlLayout":
        layout = cls(None)
        layout.count, layout.identity = index.count, (index.dev, index.identity)
        if index.count == 0:
            layout.size = 0
        return layout

    @classmethod
    def saved(cls, index: RecordIndex, seqs: list[int], offsets: list[int],
              size: int) -> "JsonlLayout":
        layout = cls.empty(index)
        layout.seqs, layout.offsets, layout.size = seqs, offsets, size
        layout.measured, layout.measured_bytes = index.count, size
        return layout

    def fits(self, index: RecordIndex) -> bool:
        return self.identity == (index.dev, index.identity) and self.count == index.count

    def checkpoint_before(self, off: int) -> tuple[int, int]:
        """(seq, byte offset) of the last known line start at or before ``off``."""
        with self.lock:
            i = bisect.bisect_right(self.offsets, off) - 1
            return (self.seqs[i], self.offsets[i]) if i >= 0 else (0, 0)

    def note_chunk(self, seq: int, start: int, length: int, rows: int,
                   line_lengths=None) -> bool:
        """Lines ``seq .. seq+rows-1`` span [start, start+length) (``line_lengths``: each
        line's, or a function giving them, needed when the chunk holds more than one
        checkpoint). True when this completed the layout."""
        with self.lock:
            if seq != self.measured or self.size is not None or not rows:
                return False
            if callable(line_lengths):
                line_lengths = line_lengths()
            if line_lengths is None:
                if seq % CHECKPOINT_EVERY == 0:
                    self.seqs.append(seq)
                    self.offsets.append(start)
            else:
                starts = np.cumsum(line_lengths) - line_lengths + start
                first = -seq % CHECKPOINT_EVERY
                self.seqs.extend(range(seq + first, seq + rows, CHECKPOINT_EVERY))
                self.offsets.extend(starts[first::CHECKPOINT_EVERY].tolist())
            self.measured += rows
            self.measured_bytes = start + length
            if self.count is not None and self.measured >= self.count:
                self.size = self.measured_bytes
                return True
            return False

    def cost(self) -> int:
        return 200 + 16 * len(self.offsets)


class JsonlReader:
    """Streams records.jsonl for one open handle, a chunk of CHECKPOINT_EVERY lines at a time
    (rendered from the codec's columns, :meth:`RecordIndex.json_chunk`); sequential reads
    continue from the chunk in hand. While records.jsonl's size is unknown the stream ends
    where the records end, and every chunk rendered extends the layout (``on_complete`` is
    called once it is whole)."""

    def __init__(self, index: RecordIndex, layout: JsonlLayout,
                 on_complete: Callable[[JsonlLayout], None] | None = None, rel: bytes = b""):
        self.index, self.layout = index, layout
        self.on_complete = on_complete
        keep_freed_memory()  # streaming renders batch after batch (see there)
        self.rel = rel  # the journal's SOURCE path (which file's threads reads count against)
        # a codec that cannot resume mid-file is rendered in one piece (gvfs trees: small)
        self._step = READ_CHUNK_RECORDS if index.codec.resumable else max(1, index.count)
        self._seq = -1           # first record of the chunk in hand (-1: none)
        self._start = 0          # its byte offset in records.jsonl
        self._chunk = b""
        self._rows = 0
        self._ended = False      # no records follow the chunk in hand
        #: the record a read stopped at because the index had not settled it yet (None: the
        #: read was not cut short by indexing)
        self.waiting_for: int | None = None
        self._completed = False
        self.lock = threading.Lock()

    def _render(self, seq: int, start: int) -> tuple[bytes, int, bool]:
        """(lines, rows, whether the records end after them) from record ``seq`` on. While
        the index is still being built only records it has settled are rendered (pieces
        start and end at checkpoints); none yet: ``(b"", 0, False)``, and the caller waits."""
        idx = self.index
        complete = idx.complete
        count = idx.count if complete else idx.settled()
        want = min(self._step, count - seq)
        if want <= 0:
            if not complete:
                self.waiting_for = seq
            return b"", 0, complete
        chunk = idx.json_chunk(seq, want)
        if complete and self.layout.count is None:  # the index was partial when opened
            with self.layout.lock:
                self.layout.count = idx.count
        # each line's length, worked out only when the layout still needs it
        lengths = chunk.line_lengths if chunk.rows > CHECKPOINT_EVERY else None
        self._completed |= self.layout.note_chunk(seq, start, len(chunk.data), chunk.rows,
                                                  lengths)
        ended = chunk.rows < want or (complete and seq + chunk.rows >= count)
        return chunk.data, chunk.rows, ended

    def _chunk_at(self, pos: int) -> bool:
        """Make the chunk in hand the one holding byte ``pos``; False past the end."""
        if self._seq >= 0 and self._start <= pos < self._start + len(self._chunk):
            return True
        if self._seq >= 0 and pos >= self._start:  # onwards from the chunk in hand
            seq, start, data = self._seq, self._start, self._chunk
            rows, ended = self._rows, self._ended
        else:
            seq, start = self.layout.checkpoint_before(pos)
            data, rows, ended = self._render(seq, start)
            if not rows:
                return False
        while pos >= start + len(data):
            if ended:
                return False
            seq, start = seq + rows, start + len(data)
            data, rows, ended = self._render(seq, start)
            if not rows:
                return False
        self._seq, self._start, self._chunk = seq, start, data
        self._rows, self._ended = rows, ended
        return True

    def read(self, off: int, size: int) -> bytes:
        return self.read_settled(off, size)[0]

    def read_settled(self, off: int, size: int) -> tuple[bytes, int | None]:
        """(bytes, None) as :meth:`read`; while the index is still being built, a read that
        reaches past the records it has settled ends there: ``(b"", seq)`` when nothing
        could be served yet, ``seq`` being the record it waits for."""
        total = self.layout.size
        end = off + size if total is None else min(off + size, total)
        if off >= end:
            return b"", None
        parts = []
        with self.lock:
            self.waiting_for = None
            pos = off
            while pos < end and self._chunk_at(pos):
                inside = pos - self._start
                piece = self._chunk[inside:inside + end - pos]
                parts.append(piece)
                pos += len(piece)
            completed, self._completed = self._completed, False
            waiting = self.waiting_for if pos < end else None
        if completed and self.on_complete is not None:
            self.on_complete(self.layout)
        return b"".join(parts), waiting

    def read_in_hand(self, off: int, size: int) -> bytes | None:
        """``read(off, size)`` when the chunk in hand holds all of it (a copy, no rendering:
        cheaper on the request thread than a hop to a worker), else None."""
        if not self.lock.acquire(blocking=False):  # a worker is rendering for this handle
            return None
        try:
            total = self.layout.size
            end = off + size if total is None else min(off + size, total)
            inside = off - self._start
            if self._seq < 0 or inside < 0 or end > self._start + len(self._chunk) or off >= end:
                return None
            return bytes(self._chunk[inside:inside + end - off])
        finally:
            self.lock.release()

    def close(self) -> None:
        self._seq, self._chunk = -1, b""


# -- what is known of one journal ---------------------------------------------------------------

@dataclass(eq=False)
class EntryBlock:
    """Directory entries of consecutive records as one block (direntries.entries)."""
    block: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.ends)


@dataclass(eq=False)
class JournalInfo:
    """One SOURCE file as last seen (lstat) and, when it is a journal, its index and layout."""

    ident: tuple                       # (st_dev, st_ino, st_size, st_mtime_ns)
    uid: int
    gid: int
    mode: int
    codec: Any = None                  # None: not a journal
    checked: float = 0.0               # time.monotonic() of the last lstat
    index: RecordIndex | None = None   # complete, of exactly `ident` (LIVE: of the last build)
    previous: RecordIndex | None = None  # an older index of the same inode (growth)
    layout: JsonlLayout | None = None
    head: int = 0                      # crc32 of the first bytes (on-disk index key)

    def cost(self) -> int:
        n = 300
        for idx in (self.index, self.previous):
            if idx is not None:
                n += 16 * len(idx.offsets)
        return n + (self.layout.cost() if self.layout is not None else 0)


@dataclass(eq=False)
class IndexJob:
    """A journal being indexed in a worker thread; waiters poll ``partial``."""

    done: trio.Event = field(default_factory=trio.Event)
    partial: RecordIndex | None = None
    result: RecordIndex | None = None
    error: OSError | None = None


#: .journalfs itself: writable by the mount's owner only for its runtime settings, which are
#: user.* xattrs and so need write permission (fs/control.py); every other change is EROFS.
ROOT_MODE = stat.S_IFDIR | 0o755


class Views:
    """Inodes, attributes, listings and reads of ``MNT/.journalfs``."""

    def __init__(self, ctx, options: dict):
        """``ctx``: a :class:`ViewContext`; a JournalFS is accepted too (its collaborators are
        taken from it once, :meth:`ViewContext.of_mount`)."""
        self.ctx = ctx if isinstance(ctx, ViewContext) else ViewContext.of_mount(ctx)
        self.source = self.ctx.source
        self.options = options
        self.control = None               # fs.control.Control: settings as xattrs of the root
        self.started_ns = time.time_ns()
        self.owner = (os.geteuid(), os.getegid())
        self.by_ino: dict[int, VNode] = {}
        self.by_key: dict[tuple, VNode] = {}
        # journal rel <-> id inside record inode numbers: bounded, least recently used out
        self._journal_ids: OrderedDict[bytes, int] = OrderedDict()
        self._journal_rels: dict[int, bytes] = {}
        self._next_journal_id = 0
        self._ids_lock = threading.Lock()
        self._scan_generation = 0  # bumped by every change: older "scan" answers are stale
        self.dirs: dict[int, dict] = {}   # handle -> listing state
        self.files: dict[int, object] = {}  # handle -> bytes or JsonlReader
        self.catalog = Catalog()
        self.index_dir = IndexDir(self.ctx.store_dir)
        if self.index_dir.usable:  # what is there, and files of journals gone meanwhile
            threading.Thread(target=self._sweep_indexes, name="journalfs-index-sweep",
                             daemon=True).start()
        self._jobs: dict[bytes, IndexJob] = {}  # trio thread only
        self._measuring: set[bytes] = set()  # records.jsonl being measured; trio thread only
        self._index_limiter = trio.CapacityLimiter(INDEX_THREADS)
        # one indexing thread per journal owner: one user's huge journals take at most one
        # core, never every slot another user's small view waits for (issue 24 item 4)
        self._owner_limiters: dict[int, trio.CapacityLimiter] = {}
        self._view_limiter = trio.CapacityLimiter(VIEW_THREADS)
        self._file_limiters: dict[bytes, trio.CapacityLimiter] = {}
        self.damaged: dict[bytes, tuple[int, str]] = {}
        #: how indexes were obtained (status.json): loaded from the store directory as they
        #: were, extended from a saved or earlier one, built from nothing; records decoded
        self.counters = dict.fromkeys(("indexes_loaded", "indexes_extended", "indexes_built",
                                       "indexes_saved", "records_indexed"), 0)
        self.root = self._node(ROOT, permanent=True)
        self.records = self._node(RECORDS_DIR, permanent=True)
        self.metadata = self._node(METADATA, permanent=True)
        self.status = self._node(STATUS, permanent=True)
        self.status_file = StatusFile(self._status_bytes)
        self.live = self._node(JOURNAL, LIVE, permanent=True)
        self.state_tree = StateTree(self)
        self.state_tops = [(top, self._node(STATE, top, permanent=True)) for top in STATE_TOPS]

    # -- inode table -----------------------------------------------------------------------
    # Record files are never stored: their inode number encodes (journal id, seq), so listing
    # a journal of millions of records costs no memory per record on our side.
    def owns(self, ino: int) -> bool:
        return ino in self.by_ino or ino >= RECORD_INO_BASE

    def _journal_id(self, rel: bytes) -> int:
        with self._ids_lock:
            jid = self._journal_ids.get(rel)
            if jid is not None:
                self._journal_ids.move_to_end(rel)
                return jid
            if self._next_journal_id > JOURNAL_ID_MAX:
                raise pyfuse3.FUSEError(errno.EOVERFLOW)
            jid = self._next_journal_id
            self._next_journal_id += 1
            self._journal_ids[rel] = jid
            self._journal_rels[jid] = rel
            while len(self._journal_ids) > JOURNAL_IDS_KEPT:
                _, old = self._journal_ids.popitem(last=False)
                del self._journal_rels[old]
            return jid

    def _node(self, kind: str, rel: bytes = b"", seq: int = -1, permanent: bool = False) -> VNode:
        if kind == RECORD:
            if seq > SEQ_MASK:
                raise pyfuse3.FUSEError(errno.EOVERFLOW)
            ino = RECORD_INO_BASE | (self._journal_id(rel) << SEQ_BITS) | seq
            return VNode(ino, RECORD, rel, seq)
        node = self.by_key.get((kind, rel, seq))
        if node is None:
            node = VNode(self.ctx.next_inode(), kind, rel, seq, permanent=permanent)
            self.by_ino[node.ino] = node
            self.by_key[node.key] = node
        return node

    def _get(self, ino: int) -> VNode:
        if ino >= RECORD_INO_BASE:
            jid, seq = (ino - RECORD_INO_BASE) >> SEQ_BITS, ino & SEQ_MASK
            rel = self._journal_rels.get(jid)
            if rel is not None:
                return VNode(ino, RECORD, rel, seq)
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
        # every "holds journals" answer may be stale now: a new generation (one bump, not a
        # pass over the catalog per change: a rename loop must not cost a scan each)
        self._scan_generation += 1
        self.catalog.discard(("acl", rel))
        info = self.catalog.get(("journal", rel))
        if info is not None:
            info.checked = -TRUST_SECONDS  # stat again; the index may still be extended
            if rel != LIVE and self.index_dir.usable:
                await trio.to_thread.run_sync(self._drop_index_if_gone, rel, info.ident[:2],
                                              limiter=self._view_limiter)
        path = rel
        while path:
            parent_rel, _, name = path.rpartition(b"/")
            parent = self.by_key.get((RECORDS_DIR, parent_rel, -1))
            if parent is not None:  # async: the kernel may hold that directory's lock now
                NOTIFIER.invalidate_entry(parent.ino, name)
            path = parent_rel
        # records/ dir of rel itself too: its mode or ACL (kernel-cached per inode) changed
        for kind in (RECORDS_DIR, JOURNAL, JSONL):
            node = self.by_key.get((kind, rel, -1))
            if node is None:
                continue
            # may block on page-cache writeback: never on the trio thread
            await trio.to_thread.run_sync(NOTIFIER.invalidate_inodes, [(node.ino, False)])

    def _sweep_indexes(self) -> None:
        def still_there(rel: str, dev: int, ino: int) -> bool:
            try:
                st = self.source.lstat(os.fsencode(rel))
            except OSError:
                return False
            return (st.st_dev, st.st_ino) == (dev, ino)
        try:
            self.index_dir.scan(still_there)
        except OSError as exc:
            log.warning("sweeping the journal index directory failed: %s", exc)

    def _drop_index_if_gone(self, rel: bytes, dev_ino: tuple) -> None:
        """The journal once at ``rel`` is no longer there: its on-disk index goes too."""
        try:
            st = self.source.lstat(rel)
            if (st.st_dev, st.st_ino) == tuple(dev_ino):
                return
        except OSError:
            pass
        self.index_dir.remove(*dev_ino)

    # -- journals: what a SOURCE file is (threads) -----------------------------------------
    def _live_path(self) -> str:
        meta = self.ctx.meta
        store = getattr(meta, "store", None)
        path = getattr(store, "journal_path", None) or getattr(meta, "journal_path", None)
        if not path:  # the gvfsd backend names its journal in its status
            path = self._service_status().get("journal_path")
        if not path:
            raise FileNotFoundError(errno.ENOENT, "no live metadata journal")
        return os.fspath(path)

    def _display_path(self, rel: bytes) -> str:
        if rel == LIVE:
            return self._live_path()
        return os.path.join(self.ctx.source_name, os.fsdecode(rel))

    def _lstat(self, rel: bytes) -> os.stat_result:
        if rel == LIVE:
            return os.stat(self._live_path(), follow_symlinks=False)
        return self.source.lstat(rel)

    def _open(self, rel: bytes) -> int:
        if rel == LIVE:
            return open_regular_path(self._live_path())
        return self.source.open_regular(rel)

    def _opener(self, rel: bytes, dev: int, ino: int) -> Callable[[], int]:
        """Opens the journal an index was taken of, and nothing else: a file swapped in
        under the same name since gives ESTALE."""
        def open_journal() -> int:
            fd = self._open(rel)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                os.close(fd)
                raise OSError(errno.ESTALE, "the journal was replaced", self._display_path(rel))
            return fd
        return open_journal

    def _journal_info(self, rel: bytes, st: os.stat_result | None = None) -> JournalInfo | None:
        """What SOURCE/``rel`` is now (lstat, and a sniff when it changed); None when it is
        not a journal. Thread only."""
        if rel != LIVE and is_backup_name(rel):
            return None
        if st is None:
            try:
                st = self._lstat(rel)
            except OSError:  # gone, or a component is no longer a directory: not a journal
                return None
        if not stat.S_ISREG(st.st_mode):
            return None
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        key = ("journal", rel)
        info = self.catalog.get(key)
        if info is None or info.ident != ident:
            old = info
            info = JournalInfo(ident, st.st_uid, st.st_gid, st.st_mode)
            try:
                fd = self._open(rel)
            except OSError:
                return None
            try:
                info.codec = sniff_fd(fd)
                info.head = zlib.crc32(os.pread(fd, FINGERPRINT_BYTES, 0))
            finally:
                os.close(fd)
            if old is not None and old.ident[:2] == ident[:2]:  # same file, changed: may grow
                info.previous = old.index or old.previous
                info.layout = old.layout
            if rel == LIVE and old is not None:  # rebuilt on demand, never by identity
                info.index = old.index
        else:  # owner and mode change without touching mtime
            info.uid, info.gid, info.mode = st.st_uid, st.st_gid, st.st_mode
        info.checked = time.monotonic()
        self.catalog.put(key, info, info.cost())
        return info if info.codec is not None else None

    def _trusted_info(self, rel: bytes) -> JournalInfo | None:
        """The journal's info when it was checked moments ago (no syscall): lets the trio
        thread answer stat/lookup of records without a worker-thread hop."""
        if rel == LIVE:  # written in place and rotated: always looked at again
            return None
        info = self.catalog.get(("journal", rel))
        if info is None or info.codec is None or time.monotonic() - info.checked >= TRUST_SECONDS:
            return None
        return info

    def _records_entry(self, rel: bytes, caller=None) -> tuple[str, Any] | None:
        """What SOURCE/``rel`` is under records/: (RECORDS_DIR, its lstat), (JOURNAL, its
        info) or None (not shown). ``caller`` (credentials key; this thread runs with them):
        shown only as far as that caller could see it in SOURCE (see :meth:`_visible`)."""
        if rel.split(b"/")[0] == VIEWS_NAME or is_backup_name(rel):
            return None
        try:
            st = self.source.lstat(rel)
        except OSError:
            return None
        if stat.S_ISDIR(st.st_mode):
            return (RECORDS_DIR, st) if self._visible(rel, st, caller) else None
        info = self._journal_info(rel, st) if stat.S_ISREG(st.st_mode) else None
        if info is None or not self._visible(rel, st, caller):
            return None
        return (JOURNAL, info)

    # -- who sees what under records/ (issue 24 item 8) ---------------------------------------
    # A directory is listed for a caller only if the caller could list the SOURCE directory
    # (read + search) and could find a journal below it; a journal only if the caller could
    # read it. Checked with faccessat(AT_EACCESS) under the caller's fsuid/fsgid/groups (as
    # the kernel decides, ACLs included); answers are cached per credentials, never shared.
    def _visible(self, rel: bytes, st: os.stat_result, caller) -> bool:
        if stat.S_ISDIR(st.st_mode):
            return self._holds_journals(rel, caller)
        return caller is None or self.source.access(rel, os.R_OK)

    def _holds_journals(self, rel: bytes, caller=None) -> bool:
        """Whether SOURCE/``rel`` has a journal anywhere below it; for a ``caller`` (whose
        credentials this thread runs with): one it could find through directories it can
        list, and read."""
        now = time.monotonic()
        key = ("scan", rel) if caller is None else ("scan", rel, caller)
        generation = self._scan_generation
        cached = self.catalog.get(key)
        if cached is not None and now - cached[0] < SCAN_TTL and cached[2] == generation:
            return cached[1]
        found = False
        pending = [rel]
        while pending and not found:
            top = pending.pop()
            if caller is not None and not self.source.access(top, os.R_OK | os.X_OK):
                continue
            try:
                entries = list(self.source.scan(top))
            except OSError:
                continue
            for name, st in entries:
                sub = top + b"/" + name if top else name
                if stat.S_ISDIR(st.st_mode):
                    if sub != VIEWS_NAME:
                        pending.append(sub)
                elif stat.S_ISREG(st.st_mode) and not is_backup_name(name) and \
                        self._journal_info(sub, st) is not None and \
                        (caller is None or self.source.access(sub, os.R_OK)):
                    found = True
                    break
        self.catalog.put(key, (now, found, generation), 100 + len(rel))
        return found

    def _caller(self, ctx):
        """The credentials key of a request's caller; None for root (sees everything) or
        when the mount cannot act as its callers."""
        if ctx is None or self.ctx.as_caller is None or getattr(ctx, "uid", 0) == 0:
            return None
        return self.ctx.caller_key(ctx)

    async def _on_file_as(self, ctx, rel: bytes, fn: Callable, *args):
        """:meth:`_on_file` with the caller's credentials (``fn(*args, caller)``)."""
        caller = self._caller(ctx)
        if caller is None:
            return await self._on_file(rel, fn, *args, None)
        return await self._on_file(rel, self.ctx.as_caller, ctx, fn, *args, caller)

    # -- worker threads ----------------------------------------------------------------------
    async def _on_file(self, rel: bytes, fn: Callable, *args):
        """``fn(*args)`` in a worker thread for a request about SOURCE/``rel``. At most
        FILE_THREADS threads work on one path and VIEW_THREADS on the views in all: a file
        on a hung network filesystem ties up its own requests, never the threads the rest
        of the mount (or the other journals) need. Waiting for a turn costs no thread."""
        limiter = self._file_limiters.get(rel)
        if limiter is None:
            limiter = self._file_limiters[rel] = trio.CapacityLimiter(FILE_THREADS)
        try:
            async with limiter:
                return await trio.to_thread.run_sync(fn, *args, limiter=self._view_limiter)
        finally:
            stats = limiter.statistics()
            if not stats.borrowed_tokens and not stats.tasks_waiting:
                self._file_limiters.pop(rel, None)

    # -- journals: indexes -----------------------------------------------------------------
    async def _index(self, rel: bytes, seq: int | None = None) -> RecordIndex:
        """The journal's index: complete, or (``seq`` given) one that already covers record
        ``seq``, possibly still growing. Waits only for this journal's own indexing."""
        info = self._trusted_info(rel)
        if info is not None and info.index is not None:
            return info.index
        job = self._jobs.get(rel)
        if job is None:
            job = self._jobs[rel] = IndexJob()
            trio.lowlevel.spawn_system_task(self._run_job, rel, job)
        while not job.done.is_set():
            partial = job.partial
            if seq is not None and partial is not None and seq < partial.count:
                return partial
            if seq is None:
                await job.done.wait()
            else:
                with trio.move_on_after(0.02):
                    await job.done.wait()
        if job.error is not None:
            raise OSError(job.error.errno or errno.EIO, job.error.strerror or "not a journal")
        return job.result

    @contextlib.asynccontextmanager
    async def _indexing_turn(self, rel: bytes):
        """A turn for work that reads a whole journal (indexing, measuring records.jsonl):
        one at a time per journal owner, at most INDEX_THREADS at once; the thread it runs
        in takes :attr:`_index_limiter`."""
        info = self.catalog.get(("journal", rel))
        owner = info.uid if info is not None else -1
        limiter = self._owner_limiters.get(owner)
        if limiter is None:
            limiter = self._owner_limiters[owner] = trio.CapacityLimiter(1)
        try:
            async with limiter:
                yield
        finally:
            stats = limiter.statistics()
            if not stats.borrowed_tokens and not stats.tasks_waiting:
                self._owner_limiters.pop(owner, None)

    async def _run_job(self, rel: bytes, job: IndexJob) -> None:
        try:
            async with self._indexing_turn(rel):
                job.result = await trio.to_thread.run_sync(
                    self._build_index, rel, job, limiter=self._index_limiter,
                    abandon_on_cancel=True)
        except OSError as exc:
            job.error = exc
        except Exception:  # noqa: BLE001 -- a system task must never end the mount
            log.exception("indexing %r failed", rel)
            job.error = OSError(errno.EIO, "indexing failed")
        finally:
            if self._jobs.get(rel) is job:
                del self._jobs[rel]
            job.done.set()

    def _measure_soon(self, rel: bytes) -> None:
        """Measure a big journal's records.jsonl in the background (every line rendered once,
        never kept), so that its size shows without a reader reading it all first: `tail -f`
        then starts at its last lines. The layout is saved with the on-disk index, so this
        happens once per journal; growth later extends it by the new records only."""
        if rel in self._measuring or rel == LIVE:
            return
        self._measuring.add(rel)
        trio.lowlevel.spawn_system_task(self._measure, rel)

    async def _measure(self, rel: bytes) -> None:
        try:
            idx = await self._index(rel)
            async with self._indexing_turn(rel):
                await trio.to_thread.run_sync(self._measure_layout, rel, idx,
                                              limiter=self._index_limiter,
                                              abandon_on_cancel=True)
        except OSError:  # gone or no longer a journal: nothing to measure
            pass
        except Exception:  # noqa: BLE001 -- a system task must never end the mount
            log.exception("measuring records.jsonl of %r failed", rel)
        finally:
            self._measuring.discard(rel)

    def _measure_layout(self, rel: bytes, idx: RecordIndex) -> None:
        if not idx.codec.resumable:  # rendered only whole (a gvfs tree): left to a reader
            return
        info = self.catalog.get(("journal", rel))
        if info is None or info.index is not idx or self._known_layout(info) is not None:
            return  # changed meanwhile (its next getattr starts again), or already known
        self._layout_done(rel, idx)(JsonlLayout(idx))

    def _build_index(self, rel: bytes, job: IndexJob) -> RecordIndex:
        """Index a journal (worker thread): from memory, the store's index directory, or the
        file itself (only its growth when an earlier index still holds)."""
        info = self._journal_info(rel)
        if info is None:
            raise FileNotFoundError(errno.ENOENT, "not a journal")
        if info.index is not None and rel != LIVE and info.index.identity == info.ident[1:] \
                and info.index.dev == info.ident[0]:
            return info.index
        dev, ino, size, _ = info.ident
        path = self._display_path(rel)
        opener = self._opener(rel, dev, ino)
        previous = info.previous if rel != LIVE else None
        if rel != LIVE:
            loaded = self.index_dir.load(dev, ino, path)
            if loaded is not None:
                saved, header, saved_layout = loaded
                saved.opener = opener
                if matches(header, info.codec.name, size, info.ident[3], info.head):
                    if saved_layout is not None:
                        info.layout = JsonlLayout.saved(saved, *saved_layout)
                    self._adopt(rel, info, saved)
                    self._count(indexes_loaded=1)
                    return saved
                if may_extend(header, info.codec.name, size, info.head) \
                        and (previous is None or previous.count < saved.count):
                    previous = saved

        def progress(partial: RecordIndex) -> None:
            job.partial = partial

        index = RecordIndex.build(path, info.codec, previous=previous, opener=opener,
                                  progress=progress)
        if index.identity != info.ident[1:]:  # changed while indexed: describe what was read
            info = self._journal_info(rel) or info
        if info.layout is not None and not info.layout.fits(index):
            prior = info.layout
            info.layout = None
            if prior.size is not None and index.grown_from is not None \
                    and index.count - index.grown_from[1] <= SMALL_JOURNAL_RECORDS:
                info.layout = JsonlLayout(index, prior)
        self._adopt(rel, info, index)
        resumed = index.grown_from[1] if index.grown_from else 0
        self._count(records_indexed=index.count - resumed,
                    **{"indexes_extended" if index.grown_from else "indexes_built": 1})
        if rel != LIVE and index.identity[1] >= DISK_INDEX_MIN_BYTES:
            self._save(rel, info, index)
        return index

    def _count(self, **increments: int) -> None:
        with self._ids_lock:
            for name, n in increments.items():
                self.counters[name] += n

    def _adopt(self, rel: bytes, info: JournalInfo, index: RecordIndex) -> None:
        info.index, info.previous = index, None
        finished = index.finished_layout
        if finished is not None and finished.fits(index):
            info.layout = finished
        if info.layout is not None and not info.layout.fits(index):
            info.layout = None
        self.catalog.put(("journal", rel), info, info.cost())
        self._note_damage(rel, index)

    def _save(self, rel: bytes, info: JournalInfo, index: RecordIndex) -> None:
        layout = info.layout
        saved_layout = None
        if layout is not None and layout.size is not None and layout.fits(index):
            saved_layout = (list(layout.seqs), list(layout.offsets), layout.size)
        if self.index_dir.save(index, info.head, saved_layout, owner=info.uid,
                               rel=os.fsdecode(rel)):
            self._count(indexes_saved=1)

    def _note_damage(self, rel: bytes, index: RecordIndex) -> None:
        err = index.error
        if err is None:
            self.damaged.pop(rel, None)
            return
        entry = (int(err.offset), str(err.reason))
        if self.damaged.get(rel) != entry:
            log.warning("damaged journal %s at byte %d: %s (the records before are shown)",
                        self._display_path(rel), *entry)
            if len(self.damaged) >= DAMAGE_LIST_MAX:
                self.damaged.pop(next(iter(self.damaged)))
            self.damaged[rel] = entry

    def _record(self, rel: bytes, seq: int, idx: RecordIndex) -> dict:
        """Record ``seq`` of a journal, decoded with its neighbours: ``ls -l`` or ``cat *``
        over a journal directory then decodes each record about once, not once per call."""
        size = _record_batch(idx)
        first = seq - seq % size
        key = self._batch_key(rel, idx, first)
        batch = self.catalog.get(key)
        if batch is None:
            batch = list(idx.records(first, size))
            payload = sum(len(r.get("payload") or b"") for r in batch)
            whole = len(batch) == size or idx.complete
            if whole and payload <= BATCH_PAYLOAD_LIMIT:
                self.catalog.put(key, batch, payload + 400 * len(batch))
        if not 0 <= seq - first < len(batch):
            raise FileNotFoundError(errno.ENOENT, "no such record")
        return batch[seq - first]

    @staticmethod
    def _batch_key(rel: bytes, idx: RecordIndex, first: int) -> tuple:
        # The live journal is written in place: its identity alone does not tell versions.
        return ("batch", rel, idx.dev, idx.identity, first, idx.count if rel == LIVE else None)

    def _cached_record(self, node: VNode) -> tuple[dict, JournalInfo] | None:
        info = self._trusted_info(node.rel)
        if info is None or info.index is None:
            return None
        first = node.seq - node.seq % _record_batch(info.index)
        batch = self.catalog.get(self._batch_key(node.rel, info.index, first))
        if batch is None or not 0 <= node.seq - first < len(batch):
            return None
        return batch[node.seq - first], info

    def _full_layout(self, rel: bytes, idx: RecordIndex) -> JsonlLayout:
        """records.jsonl's layout, measured now when not known (thread; small journals)."""
        info = self.catalog.get(("journal", rel))
        if info is not None and info.layout is not None and info.layout.fits(idx) \
                and info.layout.size is not None:
            return info.layout
        layout = JsonlLayout(idx)
        if info is not None and info.index is idx:
            info.layout = layout
            self.catalog.put(("journal", rel), info, info.cost())
        return layout

    def _layout_done(self, rel: bytes, idx: RecordIndex) -> Callable[[JsonlLayout], None]:
        def done(layout: JsonlLayout) -> None:
            info = self.catalog.get(("journal", rel))
            if info is None or info.index is not idx:
                # read to the end the moment its indexing ended, before the index was
                # adopted: _adopt takes the layout along
                idx.finished_layout = layout
                return
            info.layout = layout
            self.catalog.put(("journal", rel), info, info.cost())
            if rel != LIVE and idx.identity[1] >= DISK_INDEX_MIN_BYTES:
                self._save(rel, info, idx)
        return done

    # -- attributes ------------------------------------------------------------------------
    def _attrs(self, node: VNode, mode: int, size: int = 0, mtime_ns: int | None = None,
               timeout: float | None = None, owner: tuple[int, int] | None = None,
               ) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.entry_timeout = a.attr_timeout = self.ctx.timeout() if timeout is None else timeout
        a.st_mode = mode
        a.st_nlink = 2 if stat.S_ISDIR(mode) else 1
        a.st_uid, a.st_gid = owner or self.owner
        a.st_size = size
        # directories: big READDIRPLUS replies, as for mirrored ones (dirlist.DIR_BLKSIZE)
        a.st_blksize = DIR_BLKSIZE if stat.S_ISDIR(mode) else 4096
        a.st_blocks = (size + 511) // 512
        t = self.started_ns if mtime_ns is None else mtime_ns
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = t
        return a

    def _journal_perms(self, rel: bytes, info: JournalInfo) -> tuple[tuple[int, int], int, int]:
        """(owner, dir mode, file mode) of a journal's view: the journal's read bits."""
        if rel == LIVE:
            return self.owner, stat.S_IFDIR | 0o700, stat.S_IFREG | 0o600
        readable = info.mode & 0o444
        return ((info.uid, info.gid), stat.S_IFDIR | readable | (readable >> 2),
                stat.S_IFREG | readable)

    def _dir_attrs(self, node: VNode, st: os.stat_result) -> pyfuse3.EntryAttributes:
        """A records/ directory: its SOURCE directory's owner and mode, never writable. Its
        name is never cached by the kernel: whether it is there depends on who asks."""
        a = self._attrs(node, stat.S_IFDIR | (st.st_mode & 0o555), 0, st.st_mtime_ns,
                        owner=(st.st_uid, st.st_gid))
        a.entry_timeout = 0
        return a

    def _journal_attrs(self, node: VNode, info: JournalInfo) -> pyfuse3.EntryAttributes:
        owner, dir_mode, _ = self._journal_perms(node.rel, info)
        timeout = 0 if node.rel == LIVE else None
        a = self._attrs(node, dir_mode, 0, info.ident[3], timeout, owner)
        a.entry_timeout = 0  # shown only to those who may read it (ACLs too): never shared
        return a

    def _record_attrs(self, node: VNode, rec: dict, info: JournalInfo) -> pyfuse3.EntryAttributes:
        owner, _, file_mode = self._journal_perms(node.rel, info)
        timeout = 0 if node.rel == LIVE else None
        return self._attrs(node, file_mode, len(record_content(rec)), info.ident[3], timeout,
                           owner)

    def _jsonl_attrs(self, node: VNode, info: JournalInfo,
                     layout: JsonlLayout | None) -> pyfuse3.EntryAttributes:
        """records.jsonl: its exact size once known; before that size 0, never cached (it is
        read with direct I/O, so the provisional size never cuts a read short, as in /proc)."""
        owner, _, file_mode = self._journal_perms(node.rel, info)
        if layout is None or layout.size is None:
            return self._attrs(node, file_mode, 0, info.ident[3], 0, owner)
        # never cached either: it grows with its journal, and pollers (tail -f) go by the
        # size they stat
        return self._attrs(node, file_mode, layout.size, info.ident[3], 0, owner)

    def _known_layout(self, info: JournalInfo) -> JsonlLayout | None:
        layout, idx = info.layout, info.index
        if layout is None or idx is None or layout.size is None or not layout.fits(idx):
            return None
        return layout

    def _info_or_enoent(self, rel: bytes) -> JournalInfo:
        info = self._journal_info(rel)
        if info is None:
            raise FileNotFoundError(errno.ENOENT, "no longer a journal")
        return info

    async def _compute_attrs(self, node: VNode) -> pyfuse3.EntryAttributes:
        """Attributes of any view node but status.json."""
        if node.kind == ROOT:
            return self._attrs(node, ROOT_MODE)
        if node.kind == METADATA:
            return self._attrs(node, stat.S_IFDIR | 0o700)
        if node.kind == RECORDS_DIR:
            st = await self._on_file(node.rel, self._records_dir_stat, node.rel)
            return self._dir_attrs(node, st)
        if node.kind == JOURNAL:  # no decoding: the file's lstat, still a journal
            info = await self._on_file(node.rel, self._info_or_enoent, node.rel)
            return self._journal_attrs(node, info)
        if node.kind == JSONL:
            return await self._jsonl_getattr(node)
        if node.kind == STATE:  # the tops need no walk of SOURCE for their attributes
            entry = await self._state_entry(node) if b"/" in node.rel else None
            return self._state_attrs(node, entry)
        idx = await self._index(node.rel, node.seq)
        rec = await self._on_file(node.rel, self._record, node.rel, node.seq, idx)
        info = self.catalog.get(("journal", node.rel)) or \
            await self._on_file(node.rel, self._info_or_enoent, node.rel)
        return self._record_attrs(node, rec, info)

    async def _state_entry(self, node: VNode):
        try:
            entry = await self._on_file(node.rel, self.state_tree.resolve, node.rel)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entry

    def _state_attrs(self, node: VNode, entry) -> pyfuse3.EntryAttributes:
        """A state path: never cached (the state follows its journals)."""
        if entry is None:  # queues/, persistence/, transactions/ themselves
            st = self.source.lstat(b"")
            return self._attrs(node, stat.S_IFDIR | (st.st_mode & 0o555), 0, st.st_mtime_ns,
                               0, (st.st_uid, st.st_gid))
        return self._attrs(node, entry.mode, len(entry.content), entry.mtime_ns, 0, entry.owner)

    def _records_dir_stat(self, rel: bytes) -> os.stat_result:
        if not rel:
            return self.source.lstat(b"")
        entry = self._records_entry(rel)
        if entry is None or entry[0] != RECORDS_DIR:
            raise FileNotFoundError(errno.ENOENT, "gone")
        return entry[1]

    async def _jsonl_getattr(self, node: VNode) -> pyfuse3.EntryAttributes:
        info = await self._on_file(node.rel, self._info_or_enoent, node.rel)
        layout = self._known_layout(info)
        # measured before it grew: the index and the layout are extended by the growth only
        grown = info.layout is not None and info.layout.size is not None
        if layout is None and (info.ident[2] <= SMALL_JOURNAL_BYTES or node.rel == LIVE
                               or grown):
            idx = await self._index(node.rel)
            if idx.count <= SMALL_JOURNAL_RECORDS:
                layout = await self._on_file(node.rel, self._full_layout, node.rel, idx)
            info = self.catalog.get(("journal", node.rel)) or info
            layout = layout or self._known_layout(info)
        if layout is None:  # a big journal: size 0 until measured, which starts now
            self._measure_soon(node.rel)
        return self._jsonl_attrs(node, info, layout)

    def _service_status(self) -> dict:
        status = self.ctx.meta.status()  # synchronous in both backends; may take a store lock
        return status if isinstance(status, dict) else {}

    def status_fields(self) -> dict:
        """What the views add to status.json (INTERFACES point 6)."""
        damaged = [{**_rel_text(rel), "offset": off, "reason": reason}
                   for rel, (off, reason) in sorted(self.damaged.items())]
        return {
            "damaged_journals": damaged,
            "views": {"indexing": [_rel_text(r) for r in sorted(self._jobs)],
                      "index_dir": (os.path.join(self.ctx.store_dir, "indexes")
                                    if self.index_dir.usable else None),
                      "catalog_bytes": self.catalog.used, "catalog_entries": len(self.catalog),
                      "journal_names": len(self._journal_ids),
                      "index_files": self.index_dir.status(),
                      "view_inodes": len(self.by_ino),
                      **self.counters},
        }

    async def _status_bytes(self) -> bytes:
        status = self.ctx.meta.status
        if inspect.iscoroutinefunction(status):
            status = await status()
        else:  # synchronous in both backends, but it may wait for the store's lock
            status = await trio.to_thread.run_sync(status)
        status = status if isinstance(status, dict) else {}
        journal = getattr(getattr(self.ctx.meta, "store", None), "journal_path", None)
        doc = {
            "source": self.options.get("source") or self.ctx.source_name,
            "mountpoint": self.options.get("mountpoint"),
            "store": {"tree": self.ctx.tree_path, "prefix": self.ctx.prefix,
                      "journal": journal or status.get("journal_path")},
            # the figures people look for first, then everything the service reports
            "journal_fill": status.get("fill"),
            "entries": status.get("entries"),
            "rotations": status.get("rotations"),
            "last_fsync": status.get("last_fsync"),
            "service": status,
            "watch": self.ctx.watch.status() if self.ctx.watch is not None else None,
            "options": self.options,
            # the last runtime setting refused, and why (fs/control.py)
            "last_error": self.control.last_error if self.control is not None else None,
            **self.status_fields(),
        }
        # rendered in a worker thread: up to DAMAGE_LIST_MAX long names
        return await trio.to_thread.run_sync(_status_json, doc)

    async def getattr(self, ino: int) -> pyfuse3.EntryAttributes:
        node = self._get(ino)
        if node.kind == STATUS:  # size 0, as /proc files (fs/status.py)
            return self._attrs(node, stat.S_IFREG | 0o600, 0, self.status_file.mtime_ns, 0)
        if node.kind == RECORD:
            cached = self._cached_record(node)
            if cached is not None:  # answered from memory, inline
                return self._record_attrs(node, *cached)
        return await self._compute_attrs(node)

    # -- lookup ----------------------------------------------------------------------------
    def lookup_root(self) -> pyfuse3.EntryAttributes:
        self.root.lookups += 1
        return self._attrs(self.root, ROOT_MODE)

    async def lookup(self, parent_ino: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_ino)
        fixed = dict(self._fixed_entries(parent))
        if name in fixed:
            node = fixed[name]
        elif parent.kind == JOURNAL and (node := self._cached_record_lookup(parent, name)):
            pass
        else:
            key = await self._child_key(parent, name, ctx)
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
        cached = self._cached_record(node)
        return node if cached is not None and record_file_name(cached[0]) == name else None

    async def _child_key(self, parent: VNode, name: bytes, ctx=None) -> tuple | None:
        """(kind, rel, seq) of ``name`` in a records dir or journal dir."""
        if parent.kind == RECORDS_DIR and name not in (b".", b".."):
            rel = parent.rel + b"/" + name if parent.rel else name
            entry = await self._on_file_as(ctx, rel, self._records_entry, rel)
            return None if entry is None else (entry[0], rel)
        if parent.kind == STATE and name not in (b".", b".."):
            rel = parent.rel + b"/" + name
            entry = await self._on_file(rel, self.state_tree.resolve, rel)
            return None if entry is None else (STATE, rel)
        if parent.kind == JOURNAL:
            if name == JSONL_NAME:
                return (JSONL, parent.rel)
            seq = _seq_of(name)
            if seq is None:
                return None
            try:
                idx = await self._index(parent.rel, seq)
                rec = await self._on_file(parent.rel, self._record, parent.rel, seq, idx)
            except FileNotFoundError:
                return None
            return (RECORD, parent.rel, seq) if record_file_name(rec) == name else None
        return None

    # -- directories -----------------------------------------------------------------------
    async def opendir(self, ino: int, ctx=None) -> int:
        node = self._get(ino)
        if node.kind in (RECORD, JSONL, STATUS):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        handle = self.ctx.next_handle()
        self.dirs[handle] = await self._dir_state(node, ctx)
        return handle

    async def _dir_state(self, node: VNode, ctx=None) -> dict:
        """An open view directory: what its listing needs, as of now (records/ directories:
        as the opener may see them)."""
        state = {"node": node, "batch_first": 0, "batch": [], "index": None,
                 "names_only": None, "ctx": ctx}
        if node.kind == RECORDS_DIR:
            state["entries"] = await self._on_file_as(ctx, node.rel, self._list_records_dir,
                                                      node.rel)
        elif node.kind == JOURNAL:  # listing waits for indexing as far as it goes, not here
            state["info"] = await self._on_file(node.rel, self._journal_info, node.rel)
        elif node.kind == STATE:
            entry = await self._state_entry(node)
            if not entry.is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            state["entries"] = entry.children
        return state

    def _list_records_dir(self, rel: bytes, caller=None) -> list[tuple[bytes, str, Any]]:
        out = []
        if caller is not None and not self.source.access(rel, os.R_OK | os.X_OK):
            return out  # the caller could not list SOURCE/rel: nothing to reveal
        try:
            entries = sorted(self.source.scan(rel))
        except OSError:
            return out
        for name, st in entries:
            sub = rel + b"/" + name if rel else name
            if sub == VIEWS_NAME or is_backup_name(name):
                continue
            if stat.S_ISDIR(st.st_mode):
                if self._visible(sub, st, caller):
                    out.append((name, RECORDS_DIR, st))
            elif stat.S_ISREG(st.st_mode):
                info = self._journal_info(sub, st)
                if info is not None and self._visible(sub, st, caller):
                    out.append((name, JOURNAL, info))
        return out

    def _fixed_entries(self, node: VNode) -> list[tuple[bytes, VNode]]:
        if node.kind == ROOT:
            return [(b"metadata", self.metadata), (b"records", self.records),
                    (b"status.json", self.status), *self.state_tops]
        if node.kind == METADATA:
            return [(b"journal", self.live)]
        return []

    async def readdir(self, fh: int, start_id: int, token) -> None:
        state = self.dirs.get(fh)
        if state is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node: VNode = state["node"]
        if start_id == 0 and state.get("read"):  # rewinddir: the directory as it is now
            fresh = await self._dir_state(node, state.get("ctx"))
            state.clear()
            state.update(fresh)
        state["read"] = True
        if node.kind == JOURNAL:
            return await self._readdir_journal(state, start_id, token)
        if node.kind == STATE:
            for i, name in enumerate(state["entries"][start_id:], start_id + 1):
                child = self._node(STATE, node.rel + b"/" + name)
                try:
                    attrs = await self.getattr(child.ino)
                except (pyfuse3.FUSEError, OSError):  # gone meanwhile
                    self.forget(child.ino, 0)
                    continue
                if not pyfuse3.readdir_reply(token, name, attrs, i):
                    self.forget(child.ino, 0)
                    return
                child.lookups += 1
            return
        if node.kind == RECORDS_DIR:
            for i, (name, kind, what) in enumerate(state["entries"][start_id:], start_id + 1):
                child = self._node(kind, node.rel + b"/" + name if node.rel else name)
                attrs = (self._dir_attrs(child, what) if kind == RECORDS_DIR
                         else self._journal_attrs(child, what))
                if not pyfuse3.readdir_reply(token, name, attrs, i):
                    self.forget(child.ino, 0)
                    return
                child.lookups += 1
            return
        for i, (name, child) in enumerate(self._fixed_entries(node)[start_id:], start_id + 1):
            try:
                attrs = await self.getattr(child.ino)
            except (pyfuse3.FUSEError, OSError):
                continue
            if not pyfuse3.readdir_reply(token, name, attrs, i):
                self.forget(child.ino, 0)
                return
            child.lookups += 1

    async def _readdir_journal(self, state: dict, start_id: int, token) -> None:
        """Entry 0 is records.jsonl; entry ``seq + 1`` is record ``seq`` (stable cursors)."""
        node: VNode = state["node"]
        info: JournalInfo | None = state["info"]
        if info is None:  # not a journal (any more): an empty directory
            return
        if start_id == 0:
            jsonl = self._node(JSONL, node.rel)
            attrs = self._jsonl_attrs(jsonl, info, self._known_layout(info))
            if not pyfuse3.readdir_reply(token, JSONL_NAME, attrs, 1):
                self.forget(jsonl.ino, 0)
                return
            jsonl.lookups += 1
            start_id = 1
        seq = start_id - 1
        owner, _, file_mode = self._journal_perms(node.rel, info)
        timeout = 0 if node.rel == LIVE else None
        # Record inodes are computed, not stored (no VNode per entry), and one attribute
        # object is reused: readdir_reply copies it into the reply.
        if seq > SEQ_MASK or self._next_journal_id > JOURNAL_ID_MAX:
            raise pyfuse3.FUSEError(errno.EOVERFLOW)
        ino_base = RECORD_INO_BASE | (self._journal_id(node.rel) << SEQ_BITS)
        attrs = self._attrs(node, file_mode, 0, info.ident[3], timeout, owner)
        reply = pyfuse3.readdir_reply
        idx: RecordIndex | None = state["index"]
        while True:
            # An index still being built is listed as far as it has settled (up to its last
            # checkpoint); past that the listing waits for the indexer, and only this
            # directory's request waits.
            while idx is None or (seq >= idx.settled() and not idx.complete):
                want = seq if idx is None else seq - seq % CHECKPOINT_EVERY + CHECKPOINT_EVERY
                try:
                    idx = state["index"] = await self._index(node.rel, want)
                except OSError:
                    return
            if seq >= idx.count:
                return
            # A big journal is listed by name only: no kernel inode per record (and no
            # FORGET for it later); `ls -l` looks each record up, as on bindfs.
            names_only = NameOnlyEntry.available and idx.count >= NAMES_ONLY_RECORDS
            # ... and its entries are written a block at a time (direntries), not one
            # readdir_reply each, while their names have 8 digits
            blocks = names_only and direntries.available and idx.count <= direntries.EIGHT_DIGITS
            if blocks and "head" not in state:
                plain = state.get("plain") or state.setdefault("plain", NameOnlyEntry(file_mode))
                state["head"] = direntries.template(plain.attrs)
            blocks = blocks and state["head"] is not None
            first, batch = state["batch_first"], state["batch"]
            listed_as = (names_only, blocks)
            if not first <= seq < first + len(batch) or state["names_only"] != listed_as:
                if blocks:
                    batch = await self._on_file(node.rel, self._list_entries, idx, seq,
                                                state["head"], ino_base)
                else:
                    batch = await self._on_file(node.rel, self._list_names if names_only
                                                else self._list_batch, idx, seq)
                state["batch_first"], state["batch"] = seq, batch
                state["names_only"] = listed_as
                first = seq
                if not len(batch):
                    return
            if blocks:
                entries, ends = batch.block, batch.ends
                done = seq - first
                offset = int(ends[done - 1]) if done else 0
                fit = int(np.searchsorted(ends, offset + direntries.room(token), "right"))
                if fit > done:
                    direntries.append(token, entries[offset:int(ends[fit - 1])])
                    seq = first + fit
                if fit < len(ends):  # the reply is full
                    return
                continue
            if names_only:
                plain = state.get("plain") or state.setdefault("plain", NameOnlyEntry(file_mode))
                ino, plain_attrs = plain.ino, plain.attrs
                for name in batch[seq - first:]:
                    ino.value = ino_base | seq
                    if not reply(token, name, plain_attrs, seq + 2):
                        return
                    seq += 1
                continue
            for name, size in batch[seq - first:]:
                attrs.st_ino = ino_base | seq
                attrs.st_size = size
                attrs.st_blocks = (size + 511) // 512
                if not reply(token, name, attrs, seq + 2):
                    return
                seq += 1

    @staticmethod
    def _list_names(idx: RecordIndex, first: int) -> list[bytes]:
        """The names of records ``first`` on, about LIST_BATCH of them (see _list_kinds)."""
        names: list[bytes] = []
        seq = first
        for count, kind in Views._list_kinds(idx, first):
            seqs = range(seq, seq + count)
            if isinstance(kind, bytes):
                names.extend(map((b"%08d." + kind).__mod__, seqs))
            else:
                names.extend(b"%08d.%s" % pair for pair in zip(seqs, kind))
            seq += count
        return names

    @staticmethod
    def _list_kinds(idx: RecordIndex, first: int) -> list[tuple[int, bytes | list[bytes]]]:
        """The kinds of records ``first`` on, about LIST_BATCH of them, as runs of (count,
        one kind for the run or a list of one kind per record), for entries listed by name
        only: the names need the records' kinds, not their lines, so a codec with a
        vectorised column decoder is asked for the columns alone (nothing rendered)."""
        codec = idx.codec
        if len(codec.kinds) == 1:
            # one kind of record (jrnl, akka, gvfs trees): the names follow from the count alone
            last = min(idx.settled(), first + LIST_BATCH)
            return [(last - first, codec.kinds[0].encode("utf-8", "surrogateescape"))] \
                if last > first else []
        if type(codec).read_columns is Codec.read_columns or not codec.resumable:
            # no column decoder: the records decoded, their lines never rendered
            last = min(idx.settled(), first + LIST_BATCH)
            kinds = [rec["kind"].encode("utf-8", "surrogateescape")
                     for rec in idx.records(first, last - first)]
            return [(len(kinds), kinds)] if kinds else []
        seq = first - first % CHECKPOINT_EVERY
        count = idx.settled()  # a partial index grows meanwhile: list what has settled
        out: list[tuple[int, bytes | list[bytes]]] = []
        listed = 0
        while seq < count and listed < LIST_BATCH:
            last = min(count, seq + READ_CHUNK_RECORDS)
            i = bisect.bisect_right(idx.seqs, seq) - 1
            if seq and (i < 0 or idx.seqs[i] != seq):  # no checkpoint here: the slow way
                names = Views._list_batch(idx, max(first, seq), sizes=False)
                if names:
                    out.append((len(names), [name.partition(b".")[2] for name in names]))
                return out
            start = idx.offsets[i] if seq else None
            # the index's own reader of a record range (bounded pread, never a mapping)
            with idx._range(start, last) as (buf, stop):
                cols = idx.codec.read_columns(buf, idx.path, start, seq, stop, last - seq)
            skip = max(0, first - seq)
            if cols.rows <= skip:  # the records end (damage) before ``first``
                break
            kinds = cols.data["kind"]
            kinds = [kinds] if isinstance(kinds, str) else list(kinds[skip:cols.rows])
            rows = cols.rows - skip
            if len(kinds) == 1 or kinds.count(kinds[0]) == len(kinds):  # one kind
                out.append((rows, kinds[0].encode("utf-8", "surrogateescape")))
            else:
                out.append((rows, [k.encode("utf-8", "surrogateescape") for k in kinds]))
            listed += rows
            if cols.rows < last - seq:  # the records end here (damage)
                break
            seq += cols.rows
        return out

    @staticmethod
    def _list_entries(idx: RecordIndex, first: int, head, ino_base: int) -> "EntryBlock":
        """READDIRPLUS entries (by name only) of records ``first`` on, about LIST_BATCH of
        them, as one block and the end of each entry in it (direntries.entries)."""
        return EntryBlock(*direntries.entries(head, first, Views._list_kinds(idx, first),
                                              ino_base, 2))

    @staticmethod
    def _list_batch(idx: RecordIndex, first: int, sizes: bool = True,
                    ) -> list[tuple[bytes, int]] | list[bytes]:
        """(name, exact size) of records ``first`` on, about LIST_BATCH of them. Exact sizes,
        though JSON-line records need their line rendered: a listing's attributes update
        cached inodes, and a wrong size would cut short a concurrent read. Lines are
        rendered a checkpoint's worth at a time from the columns (see json_chunk).
        ``sizes=False``: the names alone, for entries listed by name only."""
        count = idx.settled()  # a partial index grows meanwhile: list what has settled
        step = READ_CHUNK_RECORDS if idx.codec.resumable else max(1, count)
        seq = first - first % CHECKPOINT_EVERY if idx.codec.resumable else 0
        out: list[tuple[bytes, int]] = []
        while seq < count and len(out) < LIST_BATCH:
            want = min(step, count - seq)
            chunk = idx.json_chunk(seq, want)
            if not chunk.rows:
                break
            skip = max(0, first - seq)
            kinds = chunk.kinds[skip:]
            seqs = range(seq + skip, seq + chunk.rows)
            if kinds and kinds.count(kinds[0]) == len(kinds):  # one kind: one name template
                template = b"%08d." + kinds[0].encode("utf-8", "surrogateescape")
                names = map(template.__mod__, seqs)
            else:
                names = (b"%08d.%s" % (n, k.encode("utf-8", "surrogateescape"))
                         for n, k in zip(seqs, kinds))
            out.extend(zip(names, chunk.content_sizes()[skip:]) if sizes else names)
            seq += chunk.rows
            if chunk.rows < want:  # the records end here (damage)
                break
        return out

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------------
    async def open(self, ino: int) -> pyfuse3.FileInfo:
        node = self._get(ino)
        if node.kind not in (RECORD, JSONL, STATUS, STATE):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if node.kind == STATE:
            entry = await self._state_entry(node)
            if entry.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
        handle = self.ctx.next_handle()
        if node.kind == STATUS:
            self.files[handle] = await self.status_file.current()
            return pyfuse3.FileInfo(fh=handle, direct_io=True)
        if node.kind == STATE:  # as of this open; the size in its attributes may be older
            self.files[handle] = entry.content
            return pyfuse3.FileInfo(fh=handle, direct_io=True)
        cached = self._cached_record(node) if node.kind == RECORD else None
        if cached is not None:  # decoded moments ago: answered inline
            self.files[handle] = record_content(cached[0])
        elif node.kind == JSONL:
            # the start of records.jsonl is served as soon as the index has settled it
            idx = await self._index(node.rel, 0)
            self.files[handle] = await self._on_file(node.rel, self._jsonl_reader, node.rel, idx)
        else:
            idx = await self._index(node.rel, node.seq)
            rec = await self._on_file(node.rel, self._record, node.rel, node.seq, idx)
            self.files[handle] = record_content(rec)
        # The live journal changes in place: never trust the page cache for it. records.jsonl
        # is streamed by its reader and may be listed with a provisional size (see above).
        # A record file's content is fixed by its inode (journal, seq) and the journal's
        # identity: a changed journal gets its view dentries invalidated, and a new size or
        # mtime in its attributes drops the kernel's pages, so they can be kept across opens.
        uncached = node.rel == LIVE or node.kind == JSONL
        return pyfuse3.FileInfo(fh=handle, direct_io=uncached, keep_cache=not uncached)

    def _jsonl_reader(self, rel: bytes, idx: RecordIndex) -> JsonlReader:
        info = self.catalog.get(("journal", rel))
        layout = info.layout if info is not None and info.index is idx else None
        if not idx.complete:  # still being indexed: its line count is not known yet
            layout = JsonlLayout.empty(idx)
            layout.count = None
        elif layout is None or not layout.fits(idx):
            layout = JsonlLayout.empty(idx)
            if info is not None and info.index is idx:
                info.layout = layout
        return JsonlReader(idx, layout, self._layout_done(rel, idx), rel)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        content = self.files.get(fh)
        if content is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if isinstance(content, JsonlReader):
            growth = getattr(content, "growth", None)
            if off == 0 and growth is not None and (growth.ended
                                                    or not await self._follow_journal(content)):
                # its journal was truncated or replaced, and the reader starts over (tail -f
                # after "file truncated"): the lines of the journal as it is now
                idx = await self._index(content.rel, 0)
                content = await self._on_file(content.rel, self._jsonl_reader, content.rel, idx)
                self.files[fh] = content
            data = content.read_in_hand(off, size)
            if data is not None:
                return data
            while True:
                data, waiting = await self._on_file(content.rel, content.read_settled, off, size)
                if data or waiting is None:
                    return data or await self._jsonl_growth(content, off, size)
                # the index has not reached this far yet: wait for its next checkpoint
                # (this request only; everything else is served meanwhile)
                idx = await self._index(content.rel, waiting + CHECKPOINT_EVERY)
                if idx is not content.index and not content.index.complete:
                    raise pyfuse3.FUSEError(errno.ESTALE)  # that indexing was abandoned
        return content[off:off + size]

    async def _jsonl_growth(self, reader: JsonlReader, off: int, size: int) -> bytes:
        """A read at or past the end of what an open records.jsonl serves: the lines of the
        records appended to its journal since (tail -f), or end-of-file for good once the
        journal was truncated or replaced (:mod:`journalfs.fs.jsonlfollow`)."""
        end = reader.layout.size
        if end is None or off < end or not reader.index.complete:
            return b""
        if getattr(reader, "growth", None) is None:
            reader.growth = JsonlGrowth(reader.index, end)
        if not await self._follow_journal(reader):
            return b""
        return await self._on_file(reader.rel, reader.growth.read, off, size)

    async def _follow_journal(self, reader: JsonlReader) -> bool:
        """Look at the journal of a records.jsonl handle that reached its end again: True
        while it only grew (the handle's growth follows its newest index), False once it was
        truncated, rewritten or replaced (the handle's stream has ended)."""
        growth = reader.growth
        if growth.ended:
            return False
        info = await self._on_file(reader.rel, self._journal_info, reader.rel)
        if info is None:  # gone, or no longer a journal
            growth.adopt_end()
            return False
        idx = info.index if info.index is not None and info.index.complete else None
        if idx is None or idx.identity != info.ident[1:] or idx.dev != info.ident[0]:
            try:
                idx = await self._index(reader.rel)
            except OSError:
                return False
        return await self._on_file(reader.rel, growth.adopt, idx)

    def release(self, fh: int) -> None:
        content = self.files.pop(fh, None)
        if isinstance(content, JsonlReader):
            with content.lock:
                content.close()

    # -- xattrs ----------------------------------------------------------------------------
    @staticmethod
    def _record_fields(rec: dict) -> dict[bytes, bytes]:
        out = {}
        for key, value in rec.items():
            text = scalar_text(value)
            if text is not None:
                out[RECORD_XATTR_PREFIX + key.encode("utf-8", "surrogateescape")] = \
                    text.encode("utf-8", "surrogateescape")
        return out

    async def _xattrs(self, node: VNode) -> dict[bytes, bytes]:
        if node.kind == RECORD:
            idx = await self._index(node.rel, node.seq)
            rec = await self._on_file(node.rel, self._record, node.rel, node.seq, idx)
            fields = self._record_fields(rec)
            ns = record_time_ns(idx.codec, rec)
            if ns is not None:  # the record's own time, readable (UTC)
                fields[RECORD_XATTR_PREFIX + b"time_iso"] = \
                    format_time(ns, idx.codec.columns.time_unit, utc=True).encode()
            return fields
        if node.kind == JOURNAL:
            idx = await self._index(node.rel)
            if idx.error is None:
                return {}
            text = f"{idx.error.offset}: {idx.error.reason}"
            return {DAMAGE_XATTR: text.encode("utf-8", "surrogateescape")}
        return {}

    def _source_acl(self, node: VNode) -> bytes | None:
        """The raw access ACL of the SOURCE object ``node`` stands for (thread)."""
        if node.kind != RECORDS_DIR and self._journal_info(node.rel) is None:
            return None  # no longer a journal: the view is going away
        return self.source.access_acl(node.rel)

    async def _acl(self, node: VNode) -> bytes | None:
        """The view ACL of ``node``: its SOURCE object's, read-only (:func:`view_acl`).
        Remembered for TRUST_SECONDS per SOURCE object, so that ``ls -l`` of a journal's
        many record files (ls asks each for its ACL) reads SOURCE's ACL about once."""
        if node.kind not in (RECORDS_DIR, JOURNAL, RECORD, JSONL) or node.rel == LIVE:
            return None
        key = ("acl", node.rel)
        cached = self.catalog.get(key)
        if cached is None or time.monotonic() - cached[0] >= TRUST_SECONDS:
            cached = (time.monotonic(), await self._on_file(node.rel, self._source_acl, node))
            self.catalog.put(key, cached, 100 + len(node.rel) + len(cached[1] or b""))
        return None if cached[1] is None else view_acl(cached[1], node.kind)

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        node = self._get(ino)
        if node.kind == ROOT and self.control is not None:
            return await self.control.getxattr(name)
        if name == ACL_XATTR:
            acl = await self._acl(node)
            if acl is None:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            return acl
        wanted = (node.kind == RECORD and name.startswith(RECORD_XATTR_PREFIX)) or \
            (node.kind == JOURNAL and name == DAMAGE_XATTR)
        if not wanted:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        fields = await self._xattrs(node)
        try:
            return fields[name]
        except KeyError:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    async def listxattr(self, ino: int) -> list[bytes]:
        node = self._get(ino)
        if node.kind == ROOT and self.control is not None:
            return await self.control.listxattr()
        names = list(await self._xattrs(node))
        if await self._acl(node) is not None:
            names.append(ACL_XATTR)
        return names

    async def setxattr(self, ino: int, name: bytes, value: bytes, ctx) -> None:
        """Only the mount's settings on ``.journalfs`` itself change; the rest is read-only."""
        if self._get(ino).kind != ROOT or self.control is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        await self.control.setxattr(name, value, ctx)
