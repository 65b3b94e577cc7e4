"""The views' inodes: kinds, numbering, names, and what the views get from the mount."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import trio

from ..formats.base import Codec
from ..journals import RecordIndex
from ..metastore.backend import MetadataBackend

from ..jsonlines import json_line
from .dirlist import NameOnlyEntry
from .jsonlview import JsonlLayout
from .settings import RuntimeSettings
from .sourcefiles import SourceTree

#: The views' directory in the mount's root (it shadows a SOURCE name of the same name).
VIEWS_NAME = b".journalfs"
JSONL_NAME = b"records.jsonl"
RECORD_XATTR_PREFIX = b"user.record."
DAMAGE_XATTR = b"user.journal.damage"

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

#: .journalfs itself: writable by the mount's owner only for its runtime settings, which are
#: user.* xattrs and so need write permission (fs/control.py); every other change is EROFS.
ROOT_MODE = stat.S_IFDIR | 0o755


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
    meta: MetadataBackend                 # the store: status(), journal_path()
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
    settings: RuntimeSettings | None = None  # the mount's runtime settings (status.json)

    @classmethod
    def of_mount(cls, fs) -> "ViewContext":
        """The collaborators of a :class:`~journalfs.fs.passthrough.JournalFS`."""
        loc = fs.location
        tree = os.fspath(loc.tree_path or "")
        return cls(source=SourceTree(fs.src), meta=fs.meta, next_inode=fs.next_inode,
                   next_handle=fs.next_handle, timeout=lambda: fs.timeout,
                   store_dir=os.path.dirname(tree) or None, tree_path=tree,
                   prefix=loc.prefix, source_name=os.fsdecode(fs.src), watch=fs.watch,
                   # looked up per call: the mount makes its Caller after its views
                   as_caller=lambda ctx, fn, *args: fs.caller.run(ctx, fn, *args),
                   caller_key=lambda ctx: (ctx.uid, ctx.gid, tuple(fs.caller.groups(ctx.pid))),
                   settings=fs.settings)


def record_content(rec: dict) -> bytes:
    """What a record file holds: its payload bytes, else its JSON line."""
    if "payload" in rec:
        return bytes(rec["payload"] or b"")
    return json_line(rec)


def record_file_name(rec: dict) -> bytes:
    return f"{rec['seq']:08d}.{rec['kind']}".encode("utf-8", "surrogateescape")


def seq_of(name: bytes) -> int | None:
    """The record number a record file name claims (``00000042.kind`` -> 42), else None."""
    digits, dot, _kind = name.partition(b".")
    if not dot or len(digits) < 8 or not digits.isdigit():
        return None
    seq = int(digits)
    return seq if b"%08d" % seq == digits and seq <= SEQ_MASK else None


@dataclass(eq=False)


class JournalInfo:
    """One SOURCE file as last seen (lstat) and, when it is a journal, its index and layout."""

    ident: tuple                       # (st_dev, st_ino, st_size, st_mtime_ns)
    uid: int
    gid: int
    mode: int
    codec: Codec | None = None         # None: not a journal
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


@dataclass(eq=False)


class EntryBlock:
    """Directory entries of consecutive records as one block (direntries.entries)."""
    block: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.ends)

#: How a journal's records are listed (see viewlisting.py): with attributes (sizes: the
#: kernel makes an inode of each), by name only (no inode, no FORGET later), or by name only
#: a block of entries at a time (direntries.py).
FULL, NAMES, BLOCKS = "full", "names", "blocks"


@dataclass(eq=False, slots=True)


class JournalListing:
    """Where the listing of a journal's records stands, for one open directory."""
    info: JournalInfo | None           # None: not a journal (any more): an empty directory
    index: RecordIndex | None = None   # the index listed from (growing while it is built)
    way: str | None = None             # FULL, NAMES or BLOCKS: how ``batch`` was made
    first: int = 0                     # record number of batch[0]
    #: names and sizes (FULL), names (NAMES) or an EntryBlock (BLOCKS) from record ``first``
    batch: list | EntryBlock = field(default_factory=list)
    plain: NameOnlyEntry | None = None  # the entry NAMES and BLOCKS show each record with
    head: np.ndarray | None = None     # BLOCKS: the template entry (direntries.template)
    head_made: bool = False            # whether ``head`` was tried (None: not available)


@dataclass(eq=False, slots=True)


class ViewDirHandle:
    """One open view directory: what its listing needs, as of opendir (or rewinddir)."""
    node: VNode
    ctx: Any                           # the opener's request context: whose view it is
    read: bool = False                 # read from since listed (a readdir at 0 rewinds)
    #: records/ directories: (name, RECORDS_DIR or JOURNAL, lstat or JournalInfo); state
    #: directories: names
    entries: list = field(default_factory=list)
    journal: JournalListing | None = None  # journal directories
