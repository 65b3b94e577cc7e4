"""records.jsonl of a journal that grows while it is open: what ``tail -f`` reads past the
end it saw.

An open records.jsonl handle serves the lines of the journal as it was indexed when opened.
Once a read reaches that end, the journal is looked at again: when it only grew (same file,
not shorter, the same bytes before the old index's last checkpoint -- the rule
:meth:`RecordIndex.build` extends an index by), the lines of the new records follow, rendered
record by record from the new index (whole lines, in order, never a piece of a line that an
in-place change made shorter or longer). When it was truncated, rewritten or replaced, the
handle's stream ends: every read past what it served returns end-of-file, never a piece of
a line of another file. A reader that starts over at offset 0 (``tail -f`` after "file
truncated", as with a regular file truncated in place) then gets the lines of the journal as
it is now.
"""
from __future__ import annotations

import os
import threading
import zlib

from ..journals import FINGERPRINT_BYTES, RecordIndex
from ..jsonlines import json_line

#: Records rendered at once past the handle's first end (tail -f reads a few at a time).
GROWTH_CHUNK_RECORDS = 1024


def extends(old: RecordIndex, new: RecordIndex) -> bool:
    """True when ``new`` indexes the file ``old`` was taken of, only grown since."""
    if new is old:
        return True
    if not old.identity or not new.identity or old.dev != new.dev \
            or old.identity[0] != new.identity[0] or new.identity[1] < old.identity[1] \
            or new.count < old.count or not old.codec.resumable or new.codec is not old.codec:
        return False
    if not old.fingerprint:
        return old.count == 0
    upto, crc = old.fingerprint
    opener = new.opener or old.opener
    if opener is None:
        return False
    try:
        fd = opener()
    except OSError:
        return False
    try:
        head = os.pread(fd, min(upto, FINGERPRINT_BYTES), 0)
        lo = max(0, upto - FINGERPRINT_BYTES)
        before = os.pread(fd, upto - lo, lo)
    except OSError:
        return False
    finally:
        os.close(fd)
    return zlib.crc32(before, zlib.crc32(head)) == crc


class JsonlGrowth:
    """The lines after a records.jsonl handle's first end: records ``base_count`` on of the
    newest index that :func:`extends` the handle's, starting at byte ``base_end``. Reads are
    served from one rendered chunk in hand, continued forward (tail reads sequentially)."""

    def __init__(self, index: RecordIndex, base_end: int):
        self.index = index
        self.base_count, self.base_end = index.count, base_end
        self.ended = False
        self._seq, self._start, self._chunk, self._rows = -1, base_end, b"", 0
        self.lock = threading.Lock()

    def adopt(self, index: RecordIndex) -> bool:
        """Follow ``index`` from now on when it extends the one in hand; else the stream
        ends. Returns whether the stream goes on."""
        with self.lock:
            if self.ended:
                return False
            if index is self.index:
                return True
            if not extends(self.index, index):
                self.ended = True
                self._chunk = b""
                return False
            self.index = index
            return True

    def adopt_end(self) -> None:
        """The journal is gone: the stream ends."""
        with self.lock:
            self.ended, self._chunk = True, b""

    def _render(self, seq: int) -> tuple[bytes, int]:
        want = min(GROWTH_CHUNK_RECORDS, self.index.count - seq)
        if want <= 0:
            return b"", 0
        lines = [json_line(rec) for rec in self.index.records(seq, want)]
        return b"".join(lines), len(lines)

    def read(self, off: int, size: int) -> bytes:
        """Bytes ``[off, off+size)`` of records.jsonl past the handle's first end (b"" at the
        current end, or once the stream ended)."""
        with self.lock:
            if self.ended or off < self.base_end:
                return b""
            try:
                if self._seq < 0 or off < self._start:
                    self._seq, self._start = self.base_count, self.base_end
                    self._chunk, self._rows = self._render(self._seq)
                while off >= self._start + len(self._chunk):
                    if not self._rows:
                        # nothing in hand: render what the newer index has here now
                        self._chunk, self._rows = self._render(self._seq)
                        if not self._rows:
                            return b""
                        continue
                    nxt = self._seq + self._rows
                    chunk, rows = self._render(nxt)
                    if not rows:
                        return b""
                    self._seq, self._start = nxt, self._start + len(self._chunk)
                    self._chunk, self._rows = chunk, rows
            except OSError:  # replaced under us (the index's opener refuses another file)
                self.ended, self._chunk = True, b""
                return b""
            inside = off - self._start
            return bytes(self._chunk[inside:inside + size])
