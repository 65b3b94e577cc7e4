"""Directory listings of the views: records/ directories as the opener may see them, the state
paths, and a journal's records, listed three ways (see :class:`JournalListing`)."""
from __future__ import annotations

import bisect
import contextlib
import errno
import os
import stat
from typing import Any, Iterable

import numpy as np
import pyfuse3

from ..journals import CHECKPOINT_EVERY, RecordIndex, is_backup_name
from . import direntries
from .dirlist import NameOnlyEntry
from .jsonlview import READ_CHUNK_RECORDS
from .viewattrs import ViewAttrs
from .viewnodes import (JOURNAL, JOURNAL_ID_MAX, JSONL, JSONL_NAME, LIVE, RECORD,
    RECORD_INO_BASE, RECORDS_DIR, SEQ_BITS, SEQ_MASK, STATE, STATUS, VIEWS_NAME, BLOCKS, FULL,
    NAMES, EntryBlock, JournalListing, ViewDirHandle, VNode)


#: Journals with at least this many records are listed by name only (see _readdir_journal).
NAMES_ONLY_RECORDS = 100_000
#: Records decoded per directory-listing batch (kept per open directory handle).
LIST_BATCH = 16 * 1024


class ViewListing(ViewAttrs):
    """opendir, readdir and releasedir of view directories."""

    async def opendir(self, ino: int, ctx=None) -> int:
        node = self._get(ino)
        if node.kind in (RECORD, JSONL, STATUS):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        handle = self.ctx.next_handle()
        self.dirs[handle] = await self._list(ViewDirHandle(node, ctx))
        return handle

    async def _list(self, handle: ViewDirHandle) -> ViewDirHandle:
        """What ``handle``'s listing needs, as of now (records/ directories: as the opener
        may see them)."""
        node, ctx = handle.node, handle.ctx
        if node.kind == RECORDS_DIR:
            handle.entries = await self._on_file_as(ctx, node.rel, self._list_records_dir,
                                                    node.rel)
        elif node.kind == JOURNAL:  # listing waits for indexing as far as it goes, not here
            handle.journal = JournalListing(
                await self._on_file(node.rel, self._journal_info, node.rel))
        elif node.kind == STATE:
            entry = await self._state_entry(node)
            if not entry.is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            handle.entries = entry.children
        return handle

    def _list_records_dir(self, rel: bytes, caller=None) -> list[tuple[bytes, str, Any]]:
        out: list[tuple[bytes, str, Any]] = []
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

    async def readdir(self, fh: int, start_id: int, token) -> None:
        handle = self.dirs.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node = handle.node
        if start_id == 0 and handle.read:  # rewinddir: the directory as it is now
            fresh = await self._list(ViewDirHandle(node, handle.ctx))
            handle.entries, handle.journal = fresh.entries, fresh.journal
        handle.read = True
        if node.kind == JOURNAL:
            return await self._readdir_journal(node, handle.journal, start_id, token)
        if node.kind == STATE:
            for i, name in enumerate(handle.entries[start_id:], start_id + 1):
                child = self._node(STATE, node.rel + b"/" + name)
                child.lookups += 1  # held across the wait (a FORGET meanwhile keeps it)
                try:
                    attrs = await self.getattr(child.ino)
                except (pyfuse3.FUSEError, OSError):  # gone meanwhile
                    self.forget(child.ino, 1)
                    continue
                if not pyfuse3.readdir_reply(token, name, attrs, i):
                    self.forget(child.ino, 1)
                    return
            return
        if node.kind == RECORDS_DIR:
            for i, (name, kind, what) in enumerate(handle.entries[start_id:], start_id + 1):
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

    # -- a journal's records ---------------------------------------------------------------
    # Entry 0 is records.jsonl; entry ``seq + 1`` is record ``seq`` (stable cursors). Record
    # inodes are computed, not stored (no VNode per entry). Three ways of listing them:
    # FULL, with attributes (exact sizes), a reply per entry with one reused attribute object;
    # NAMES, for a big journal: by name only, no kernel inode per record (and no FORGET for it
    # later; `ls -l` looks each record up, as on bindfs); BLOCKS, NAMES written a block of
    # entries at a time (direntries.py), while the names have 8 digits. Each helper below
    # replies from the batch in hand and returns the next record number, or None once the
    # reply is full.
    async def _readdir_journal(self, node: VNode, state: JournalListing | None,
                               start_id: int, token) -> None:
        if state is None or state.info is None:  # not a journal (any more): an empty directory
            return
        info = state.info
        if start_id == 0:
            jsonl = self._node(JSONL, node.rel)
            if not pyfuse3.readdir_reply(token, JSONL_NAME,
                                         self._jsonl_attrs(jsonl, info, self._known_layout(info)), 1):
                self.forget(jsonl.ino, 0)
                return
            jsonl.lookups += 1
            start_id = 1
        seq = start_id - 1
        owner, _, file_mode = self._journal_perms(node.rel, info)
        if seq > SEQ_MASK or self._next_journal_id > JOURNAL_ID_MAX:
            raise pyfuse3.FUSEError(errno.EOVERFLOW)
        ino_base = RECORD_INO_BASE | (self._journal_id(node.rel) << SEQ_BITS)
        attrs: pyfuse3.EntryAttributes | None = None
        idx = state.index
        while True:
            # An index still being built is listed as far as it has settled (up to its last
            # checkpoint); past that the listing waits for the indexer, and only this
            # directory's request waits.
            while idx is None or (seq >= idx.settled() and not idx.complete):
                want = seq if idx is None else seq - seq % CHECKPOINT_EVERY + CHECKPOINT_EVERY
                try:
                    idx = state.index = await self._index(node.rel, want)
                except OSError:
                    return
            if seq >= idx.count:
                return
            way = self._listing_way(state, idx, file_mode)
            if not state.first <= seq < state.first + len(state.batch) or state.way != way:
                if way == BLOCKS:
                    state.batch = await self._on_file(node.rel, self._list_entries, idx, seq,
                                                      state.head, ino_base)
                else:
                    state.batch = await self._on_file(node.rel, self._list_names if way == NAMES
                                                      else self._list_batch, idx, seq)
                state.first, state.way = seq, way
                if not len(state.batch):
                    return
            if way == BLOCKS:
                following = self._reply_block(state, seq, token)
            elif way == NAMES:
                following = self._reply_names(state, seq, ino_base, token)
            else:
                if attrs is None:  # one object for every entry: readdir_reply copies it
                    attrs = self._attrs(node, file_mode, 0, info.ident[3],
                                        0 if node.rel == LIVE else None, owner)
                following = self._reply_full(state, seq, ino_base, attrs, token)
            if following is None:  # the reply is full
                return
            seq = following

    @staticmethod
    def _listing_way(state: JournalListing, idx: RecordIndex, file_mode: int) -> str:
        """How the records of ``idx`` are listed now (the index may still grow past
        NAMES_ONLY_RECORDS while listed)."""
        if not NameOnlyEntry.available or idx.count < NAMES_ONLY_RECORDS:
            return FULL
        if state.plain is None:
            state.plain = NameOnlyEntry(file_mode)
        if not direntries.available or idx.count > direntries.EIGHT_DIGITS:
            return NAMES
        if not state.head_made:
            state.head, state.head_made = direntries.template(state.plain.attrs), True
        return BLOCKS if state.head is not None else NAMES

    @staticmethod
    def _reply_block(state: JournalListing, seq: int, token) -> int | None:
        batch, first = state.batch, state.first
        assert isinstance(batch, EntryBlock)
        entries, ends = batch.block, batch.ends
        done = seq - first
        offset = int(ends[done - 1]) if done else 0
        fit = int(np.searchsorted(ends, offset + direntries.room(token), "right"))
        if fit > done:
            direntries.append(token, entries[offset:int(ends[fit - 1])])
            seq = first + fit
        return seq if fit == len(ends) else None  # else the reply is full

    @staticmethod
    def _reply_names(state: JournalListing, seq: int, ino_base: int, token) -> int | None:
        reply, plain, batch = pyfuse3.readdir_reply, state.plain, state.batch
        assert plain is not None and isinstance(batch, list)
        ino, plain_attrs = plain.ino, plain.attrs
        for name in batch[seq - state.first:]:
            ino.value = ino_base | seq
            if not reply(token, name, plain_attrs, seq + 2):
                return None
            seq += 1
        return seq

    @staticmethod
    def _reply_full(state: JournalListing, seq: int, ino_base: int,
                    attrs: pyfuse3.EntryAttributes, token) -> int | None:
        reply, batch = pyfuse3.readdir_reply, state.batch
        assert isinstance(batch, list)
        for name, size in batch[seq - state.first:]:
            attrs.st_ino = ino_base | seq
            attrs.st_size = size
            attrs.st_blocks = (size + 511) // 512
            if not reply(token, name, attrs, seq + 2):
                return None
            seq += 1
        return seq

    @staticmethod
    def _list_names(idx: RecordIndex, first: int) -> list[bytes]:
        """The names of records ``first`` on, about LIST_BATCH of them (see _list_kinds)."""
        names: list[bytes] = []
        seq = first
        for count, kind in ViewListing._list_kinds(idx, first):
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
        if not codec.columnar or not codec.resumable:
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
                names = ViewListing._list_batch(idx, max(first, seq), sizes=False)
                if names:
                    out.append((len(names), [name.partition(b".")[2] for name in names]))
                return out
            read = 0  # records of seq .. last-1 read so far
            # the index's own reader of a record range (bounded pread, never a mapping)
            with contextlib.closing(idx.column_batches(seq, last)) as batches:
                for cols in batches:
                    at, take = seq + read, min(cols.rows, last - seq - read)
                    skip = min(take, max(0, first - at))
                    if take > skip:
                        listed += ViewListing._kind_run(out, cols.data["kind"], skip, take)
                    read += take
                    if cols.error is not None or read >= last - seq:
                        break
            if read < last - seq:  # the records end here (damage)
                break
            seq += read
        return out

    @staticmethod
    def _kind_run(out: list[tuple[int, bytes | list[bytes]]], kinds, skip: int,
                  take: int) -> int:
        """Add the kinds of rows ``skip .. take-1`` of a batch (its "kind" column: one str
        for all, or one per row) to ``out`` as a run; how many rows that is."""
        rows = take - skip
        if isinstance(kinds, str):
            out.append((rows, kinds.encode("utf-8", "surrogateescape")))
            return rows
        run = list(kinds[skip:take])
        if run.count(run[0]) == len(run):  # one kind
            out.append((rows, run[0].encode("utf-8", "surrogateescape")))
        else:
            out.append((rows, [k.encode("utf-8", "surrogateescape") for k in run]))
        return rows

    @staticmethod
    def _list_entries(idx: RecordIndex, first: int, head, ino_base: int) -> EntryBlock:
        """READDIRPLUS entries (by name only) of records ``first`` on, about LIST_BATCH of
        them, as one block and the end of each entry in it (direntries.entries)."""
        return EntryBlock(*direntries.entries(head, first, ViewListing._list_kinds(idx, first),
                                              ino_base, 2))

    @staticmethod
    def _list_batch(idx: RecordIndex, first: int, sizes: bool = True) -> list:
        """(name, exact size) of records ``first`` on, about LIST_BATCH of them. Exact sizes,
        though JSON-line records need their line rendered: a listing's attributes update
        cached inodes, and a wrong size would cut short a concurrent read. Lines are
        rendered a checkpoint's worth at a time from the columns (see json_chunk).
        ``sizes=False``: the names alone, for entries listed by name only."""
        count = idx.settled()  # a partial index grows meanwhile: list what has settled
        step = READ_CHUNK_RECORDS if idx.codec.resumable else max(1, count)
        seq = first - first % CHECKPOINT_EVERY if idx.codec.resumable else 0
        out: list = []  # (name, size) pairs, or names (sizes=False)
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
                names: Iterable[bytes] = map(template.__mod__, seqs)
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
