"""The views' state and inode table, what a SOURCE file is (a journal?), who sees what under
``records/``, and the worker threads requests about SOURCE files run in."""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
import zlib
from collections import OrderedDict
from typing import Any, Callable

import pyfuse3
import trio

from ..journals import FINGERPRINT_BYTES, is_backup_name, sniff_fd
from .catalog import Catalog
from .control import Control
from .indexfiles import IndexDir
from .jsonlview import JsonlReader
from .sourcefiles import open_regular_path
from .stateviews import TOPS as STATE_TOPS, StateTree
from .status import StatusFile
from .watch import NOTIFIER
from .workers import CpuBudget, index_cpu_setting
from .viewnodes import (JOURNAL, JOURNAL_ID_MAX, JOURNAL_IDS_KEPT, JSONL, LIVE, METADATA,
    RECORD, RECORD_INO_BASE, RECORDS_DIR, ROOT, SEQ_BITS, SEQ_MASK, STATE, STATUS, VIEWS_NAME,
    IndexJob, JournalInfo, ViewContext, ViewDirHandle, VNode)

log = logging.getLogger("journalfs.fs.views")

#: How long a checked journal is trusted without a stat (writes through the mount reset it).
TRUST_SECONDS = 0.5
#: How long "does this SOURCE dir hold any journal" answers are reused.
SCAN_TTL = 2.0
#: A "no journal below" answer is checked again against the directories it listed (an
#: lstat each) when it listed at most this many; else the TTL and the watcher alone.
SCAN_DIRS_CHECKED = 32
#: Worker threads the views use at most, and at most on one SOURCE path (see _on_file).
VIEW_THREADS = 16
FILE_THREADS = 2
#: Journals indexed at once (each in its own worker thread, outside trio's default pool so
#: that other requests never queue behind them). One per owner at a time, each within its
#: owner's CPU budget (a paused one uses no CPU): enough that a few users paused over their
#: budget never keep another user's small journal waiting for a thread.
INDEX_THREADS = 8


def _dir_state(st: os.stat_result) -> tuple:
    """What changes when a directory's names, mode, owner or ACL change."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class ViewsBase:
    """The state of ``MNT/.journalfs``: its inode table, what each SOURCE file is, who may see
    it, and the threads requests about SOURCE files run in."""

    status_file: StatusFile  # made by Views (views.py), which renders status.json

    def __init__(self, ctx, options: dict):
        """``ctx``: a :class:`ViewContext`; a JournalFS is accepted too (its collaborators are
        taken from it once, :meth:`ViewContext.of_mount`)."""
        self.ctx = ctx if isinstance(ctx, ViewContext) else ViewContext.of_mount(ctx)
        self.source = self.ctx.source
        self.options = options
        self.control: Control | None = None  # settings as xattrs of the root (fs/main.py sets it)
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
        self.dirs: dict[int, ViewDirHandle] = {}     # handle -> open directory
        self.files: dict[int, bytes | JsonlReader] = {}  # handle -> open file
        self.catalog = Catalog()
        self.index_dir = IndexDir(self.ctx.store_dir)
        if self.index_dir.usable:  # what is there, and files of journals gone meanwhile
            threading.Thread(target=self._sweep_indexes, name="journalfs-index-sweep",
                             daemon=True).start()
        self._jobs: dict[bytes, IndexJob] = {}  # trio thread only (viewindex.py)
        self._measuring: set[bytes] = set()  # records.jsonl being measured; trio thread only
        self._index_limiter = trio.CapacityLimiter(INDEX_THREADS)
        # one indexing thread per journal owner: one user's huge journals take at most one
        # core, never every slot another user's small view waits for (issue 24 item 4)
        self._owner_limiters: dict[int, trio.CapacityLimiter] = {}
        # ... and within a CPU budget per owner (viewindex.py charges it between batches)
        self.index_cpu = CpuBudget(*index_cpu_setting(os.environ.get("JOURNALFS_INDEX_CPU")))
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
            # only a name the kernel holds (a node it looked up and has not forgotten; a
            # missing name is never cached): the notification is a hop to the notifier's
            # thread, on every create and every close after a write
            if parent is not None and (self.by_key.get((RECORDS_DIR, path, -1)) is not None or
                                       self.by_key.get((JOURNAL, path, -1)) is not None):
                NOTIFIER.invalidate_entry(parent.ino, name)  # async: the kernel may hold
                # that directory's lock now
            path = parent_rel
        # records/ dir of rel itself too: its mode or ACL (kernel-cached per inode) changed
        stale = [(node.ino, False) for kind in (RECORDS_DIR, JOURNAL, JSONL)
                 if (node := self.by_key.get((kind, rel, -1))) is not None]
        if stale:  # may block on page-cache writeback: never on the trio thread, one hop
            await trio.to_thread.run_sync(NOTIFIER.invalidate_inodes, stale)

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
        path = self.ctx.meta.journal_path()  # may read the store's files: threads only
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
        self.catalog.put(key, info, info.cost(), info.uid)
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
        # "none" is believed only while no directory it listed changed: a journal written in
        # SOURCE just now may not have reached the watcher (the generation) yet
        if cached is not None and now - cached[0] < SCAN_TTL and cached[2] == generation \
                and (cached[1] or self._dirs_unchanged(cached[3])):
            return cached[1]
        found = False
        pending: list[tuple[bytes, os.stat_result | None]] = [(rel, None)]
        listed: list[tuple[bytes, tuple]] | None = []  # each directory as before its listing
        while pending and not found:
            top, top_st = pending.pop()
            try:
                top_st = top_st or self.source.lstat(top)
            except OSError:
                continue
            if listed is not None:
                listed.append((top, _dir_state(top_st)))
                if len(listed) > SCAN_DIRS_CHECKED:
                    listed = None  # too many to check again: the TTL and generation only
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
                        pending.append((sub, st))
                elif stat.S_ISREG(st.st_mode) and not is_backup_name(name) and \
                        self._journal_info(sub, st) is not None and \
                        (caller is None or self.source.access(sub, os.R_OK)):
                    found = True
                    break
        cost = 100 + len(rel) + sum(80 + len(d) for d, _ in listed or ())
        self.catalog.put(key, (now, found, generation, listed), cost)
        return found

    def _dirs_unchanged(self, listed: list[tuple[bytes, tuple]] | None) -> bool:
        """Whether each directory (rel, state before it was listed) is as it was: a name
        made, removed or renamed in it, or its mode or ACL changed, changes its ctime."""
        if listed is None:
            return True
        for rel, state in listed:
            try:
                if _dir_state(self.source.lstat(rel)) != state:
                    return False
            except OSError:
                return False
        return True

    def _caller(self, ctx):
        """The credentials key of a request's caller; None for root (sees everything) or
        when the mount cannot act as its callers."""
        if ctx is None or self.ctx.as_caller is None or ctx.uid == 0:
            return None
        return self.ctx.caller_key(ctx)

    async def _on_file_as(self, ctx, rel: bytes, fn: Callable, *args):
        """:meth:`_on_file` with the caller's credentials (``fn(*args, caller)``)."""
        caller, as_caller = self._caller(ctx), self.ctx.as_caller
        if caller is None or as_caller is None:
            return await self._on_file(rel, fn, *args, None)
        return await self._on_file(rel, as_caller, ctx, fn, *args, caller)

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
