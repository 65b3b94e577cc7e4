"""Files of the views: record files, records.jsonl (streamed, following its growing journal),
status.json and the state files."""
from __future__ import annotations

import errno

import pyfuse3

from ..journals import CHECKPOINT_EVERY, RecordIndex
from .jsonlfollow import JsonlGrowth
from .jsonlview import JsonlLayout, JsonlReader
from .viewattrs import ViewAttrs
from .viewnodes import JSONL, LIVE, RECORD, STATE, STATUS, record_content


class ViewFiles(ViewAttrs):
    """open, read and release of view files."""

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
            growth = content.growth
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
        if reader.growth is None:
            reader.growth = JsonlGrowth(reader.index, end)
        if not await self._follow_journal(reader):
            return b""
        return await self._on_file(reader.rel, reader.growth.read, off, size)

    async def _follow_journal(self, reader: JsonlReader) -> bool:
        """Look at the journal of a records.jsonl handle that reached its end again: True
        while it only grew (the handle's growth follows its newest index), False once it was
        truncated, rewritten or replaced (the handle's stream has ended)."""
        growth = reader.growth
        if growth is None or growth.ended:
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
