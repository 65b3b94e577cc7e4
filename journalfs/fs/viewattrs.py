"""Attributes and lookups of the views: modes and owners from the SOURCE objects, sizes of
record files and records.jsonl, names resolved to view inodes."""
from __future__ import annotations

import errno
import os
import stat
import time

import pyfuse3

from .dirlist import DIR_BLKSIZE
from .viewbase import TRUST_SECONDS
from .jsonlview import JsonlLayout
from .viewindex import SMALL_JOURNAL_BYTES, SMALL_JOURNAL_RECORDS, ViewIndexes
from .viewnodes import (JOURNAL, JSONL, JSONL_NAME, LIVE, METADATA, RECORD, RECORDS_DIR, ROOT,
    ROOT_MODE, STATE, STATUS, JournalInfo, VNode, record_content, record_file_name, seq_of)


class ViewAttrs(ViewIndexes):
    """Attributes of view inodes and lookups of names in view directories."""

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
        name is never cached by the kernel: whether it is there depends on who asks; but
        ``records`` itself is always there (``ls -l`` of a view walks it once per entry)."""
        a = self._attrs(node, stat.S_IFDIR | (st.st_mode & 0o555), 0, st.st_mtime_ns,
                        owner=(st.st_uid, st.st_gid))
        if node.rel:
            a.entry_timeout = 0
        return a

    # Answers about SOURCE paths kept for TRUST_SECONDS and only while nothing changed
    # (the views' change generation, bumped by every change seen through the mount or by
    # the watcher): the records/ directories and journal directories have entry timeout 0,
    # so `ls -l` of a view re-looks them up once per entry, and each answer was a worker-
    # thread hop (~185 µs) before.
    def _recent(self, key: tuple):
        """The value remembered under ``key`` by :meth:`_remember`, if still trusted, as a
        1-tuple (the value may be None); else None."""
        cached = self.catalog.get(key)
        if cached is None or cached[1] != self._scan_generation \
                or time.monotonic() - cached[0] >= TRUST_SECONDS:
            return None
        return (cached[2],)

    def _remember(self, key: tuple, generation: int, value, cost: int = 200) -> None:
        self.catalog.put(key, (time.monotonic(), generation, value), cost + len(key[1]))

    def _journal_attrs(self, node: VNode, info: JournalInfo) -> pyfuse3.EntryAttributes:
        owner, dir_mode, _ = self._journal_perms(node.rel, info)
        timeout = 0 if node.rel == LIVE else None
        a = self._attrs(node, dir_mode, 0, info.ident[3], timeout, owner)
        if not self._shown_to_all(node.rel, info):
            a.entry_timeout = 0  # shown only to those who may read it (ACLs too): never shared
        return a

    def _shown_to_all(self, rel: bytes, info: JournalInfo) -> bool:
        """Whether every caller who can reach ``rel``'s view sees it, as found by the lookup
        that is answering now (:meth:`_child_key`): r for owner, group and others and no
        ACL, so that reading it needs nothing but the search permission on its directories
        a caller showed by getting here (each records/ directory is looked up per caller).
        Then the kernel may keep its name: `ls -l` of the view walks it once per entry, and
        each walk was a LOOKUP. A change seen by the mount drops the name (source_changed)."""
        if rel == LIVE or info.mode & 0o444 != 0o444:
            return False
        recent = self._recent(("to-all", rel))
        return recent is not None and recent[0]

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
            key = ("dir-lstat", node.rel)
            recent = self._recent(key)
            if recent is None:
                generation = self._scan_generation
                st = await self._on_file(node.rel, self._records_dir_stat, node.rel)
                self._remember(key, generation, st)
            else:
                st = recent[0]
            return self._dir_attrs(node, st)
        if node.kind == JOURNAL:  # no decoding: the file's lstat, still a journal
            info = self._trusted_info(node.rel) or \
                await self._on_file(node.rel, self._info_or_enoent, node.rel)
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

    async def getattr(self, ino: int) -> pyfuse3.EntryAttributes:
        node = self._get(ino)
        if node.kind == STATUS:  # size 0, as /proc files (fs/status.py)
            return self._attrs(node, stat.S_IFREG | 0o600, 0, self.status_file.mtime_ns, 0)
        if node.kind == RECORD:
            cached = self._cached_record(node)
            if cached is not None:  # answered from memory, inline
                return self._record_attrs(node, *cached)
        return await self._compute_attrs(node)

    def lookup_root(self) -> pyfuse3.EntryAttributes:
        self.root.lookups += 1
        return self._attrs(self.root, ROOT_MODE)

    async def lookup(self, parent_ino: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_ino)
        node = dict(self._fixed_entries(parent)).get(name)
        if node is None and parent.kind == JOURNAL:
            node = self._cached_record_lookup(parent, name)
        if node is None:
            key = await self._child_key(parent, name, ctx)
            if key is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            node = self._node(*key)
        # counted before the wait: a FORGET of the kernel's earlier references to this node
        # arriving meanwhile must not drop it from the table (the reply names it)
        node.lookups += 1
        try:
            return await self.getattr(node.ino)
        except BaseException:
            self.forget(node.ino, 1)
            raise

    def _cached_record_lookup(self, parent: VNode, name: bytes) -> VNode | None:
        """The record named ``name`` when memory alone can tell (no syscall, no decoding)."""
        seq = seq_of(name)
        if seq is None:
            return None
        node = self._node(RECORD, parent.rel, seq)
        cached = self._cached_record(node)
        return node if cached is not None and record_file_name(cached[0]) == name else None

    def _fixed_entries(self, node: VNode) -> list[tuple[bytes, VNode]]:
        if node.kind == ROOT:
            return [(b"metadata", self.metadata), (b"records", self.records),
                    (b"status.json", self.status), *self.state_tops]
        if node.kind == METADATA:
            return [(b"journal", self.live)]
        return []

    def _shown_entry(self, rel: bytes, caller=None) -> tuple[str | None, bool]:
        """(RECORDS_DIR, JOURNAL or None: what the caller sees at records/``rel``, whether
        a journal there is readable by all: see :meth:`_shown_to_all`). Thread only."""
        entry = self._records_entry(rel, caller)
        if entry is None:
            return None, False
        try:
            to_all = entry[0] == JOURNAL and entry[1].mode & 0o444 == 0o444 \
                and self.source.access_acl(rel) is None
        except OSError:  # gone meanwhile, or no ACLs to be read: not known to be for all
            to_all = False
        return entry[0], to_all

    async def _child_key(self, parent: VNode, name: bytes, ctx=None) -> tuple | None:
        """(kind, rel, seq) of ``name`` in a records dir or journal dir."""
        if parent.kind == RECORDS_DIR and name not in (b".", b".."):
            rel = parent.rel + b"/" + name if parent.rel else name
            # whether this caller sees it (its credentials are part of the key)
            key = ("shown", rel, self._caller(ctx))
            recent = self._recent(key)
            # "not there" is never taken from memory: a journal just written in SOURCE may
            # not have reached the watcher yet, and a missing name is looked up rarely
            if recent is None or recent[0] is None:
                generation = self._scan_generation
                kind, to_all = await self._on_file_as(ctx, rel, self._shown_entry, rel)
                self._remember(key, generation, kind)
                self._remember(("to-all", rel), generation, to_all)
            else:
                kind = recent[0]
            return None if kind is None else (kind, rel)
        if parent.kind == STATE and name not in (b".", b".."):
            rel = parent.rel + b"/" + name
            entry = await self._on_file(rel, self.state_tree.resolve, rel)
            return None if entry is None else (STATE, rel)
        if parent.kind == JOURNAL:
            if name == JSONL_NAME:
                return (JSONL, parent.rel)
            seq = seq_of(name)
            if seq is None:
                return None
            try:
                idx = await self._index(parent.rel, seq)
                rec = await self._on_file(parent.rel, self._record, parent.rel, seq, idx)
            except FileNotFoundError:
                return None
            return (RECORD, parent.rel, seq) if record_file_name(rec) == name else None
        return None
