"""records.jsonl: where its lines start (:class:`JsonlLayout`) and one open handle's stream of
them (:class:`JsonlReader`), rendered a chunk of records at a time from the codec's columns."""
from __future__ import annotations

import bisect
import threading
from typing import Callable

import numpy as np

from ..journals import CHECKPOINT_EVERY, RecordIndex
from ..jsonlines import keep_freed_memory
from .jsonlfollow import JsonlGrowth

#: Records rendered together when records.jsonl is read (a multiple of CHECKPOINT_EVERY):
#: big enough for the vectorised renderer's fixed cost per batch to vanish, small enough that
#: a chunk stays a few MB.
READ_CHUNK_RECORDS = 16 * CHECKPOINT_EVERY


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
        self.count: int | None = None  # lines in all (None: not known yet)
        self.identity: tuple | None = None  # (st_dev, identity) of the index measured
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
        #: follows the journal once the handle read to its end (tail -f: views' _jsonl_growth)
        self.growth: JsonlGrowth | None = None
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
