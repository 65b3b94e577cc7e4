"""Where the records of a file's valid prefix start, in memory that does not grow with their
number (for validators that must ask "is this offset a record start?" or "how many records
start before it?" about links pointing anywhere in a file of any size).

The validator walks the file once and hands each batch of record starts to
:meth:`RecordStarts.extend`; only every :data:`STARTS_PER_MARK`-th start (a *mark*) is kept.
A question about an offset walks again the stretch of at most :data:`STARTS_PER_MARK` records
that follows the mark before it, reading only their size fields. Recently walked stretches are
kept (:data:`STRETCHES_KEPT` of them), so links that point near each other cost one walk.
"""
from __future__ import annotations

import struct
from collections import OrderedDict

import numpy as np

from .base import Buffer, field_at

#: Record starts per kept mark: 8 bytes of memory per this many records, and the most
#: records walked again to answer one question.
STARTS_PER_MARK = 64
#: Walked stretches kept for reuse (each at most STARTS_PER_MARK offsets).
STRETCHES_KEPT = 1024
#: Stretches walked together when answering a batch of questions (bounds the temporary
#: array of their starts to STRETCHES_PER_GROUP * STARTS_PER_MARK offsets).
STRETCHES_PER_GROUP = 1024


class RecordStarts:
    """The starts of a file's records as one walk found them, answered exactly as a sorted
    array of every start would (``np.searchsorted``), without holding that array.

    ``size_field`` (numpy dtype: ``">i4"``, ``"<u4"``) is a record's size at its start; the
    next record starts that size + ``size_extra`` bytes further on (the walk's own rule,
    repeated here)."""

    def __init__(self, buf: Buffer, size_field: str, size_extra: int = 0) -> None:
        self.buf = buf
        self._dtype = size_field
        self._unpack = struct.Struct(size_field.replace("i4", "i").replace("u4", "I")).unpack_from
        self._extra = size_extra
        self._parts: list[np.ndarray] = []
        self._marks: np.ndarray | None = None
        self.count = 0
        self.first = -1
        self.last = -1
        self._stretches: OrderedDict[int, np.ndarray] = OrderedDict()
        self._sets: OrderedDict[int, frozenset[int]] = OrderedDict()
        self._current: tuple[int, int, frozenset[int]] = (0, 0, frozenset())

    # -- building, batch by batch in file order ----------------------------------------------
    def extend(self, offsets: np.ndarray) -> None:
        """The next starts of the walk (ascending, following the previous ones)."""
        if not len(offsets):
            return
        skip = (-self.count) % STARTS_PER_MARK
        # a copy: a slice would keep the whole batch array alive
        self._parts.append(np.array(offsets[skip::STARTS_PER_MARK], dtype=np.int64))
        if self.first < 0:
            self.first = int(offsets[0])
        self.count += len(offsets)
        self.last = int(offsets[-1])
        self._marks = None
        self._current = (0, 0, frozenset())

    @property
    def marks(self) -> np.ndarray:
        if self._marks is None:
            self._marks = np.concatenate(self._parts) if self._parts else np.zeros(0, np.int64)
            self._parts = [self._marks]
        return self._marks

    @property
    def nbytes(self) -> int:
        """Memory held for the marks and the kept stretches (what grows with the file)."""
        return (sum(p.nbytes for p in self._parts) + sum(s.nbytes for s in self._stretches.values())
                + 64 * sum(len(s) for s in self._sets.values()))

    # -- walking a stretch again -------------------------------------------------------------
    def stretch(self, k: int) -> np.ndarray:
        """The starts from mark ``k`` up to (not including) mark ``k + 1``."""
        kept = self._stretches.get(k)
        if kept is not None:
            self._stretches.move_to_end(k)
            return kept
        rows = min(STARTS_PER_MARK, self.count - k * STARTS_PER_MARK)
        pos = int(self.marks[k])
        unpack, extra, end = self._unpack, self._extra, len(self.buf)
        out = []
        append = out.append
        try:
            for _ in range(rows):
                append(pos)
                step = extra + unpack(self.buf, pos)[0]
                if step <= 0 or pos + step > end:  # the file changed under us: stop here
                    break
                pos += step
        except struct.error:
            pass
        found = np.array(out, dtype=np.int64)
        self._stretches[k] = found
        if len(self._stretches) > STRETCHES_KEPT:
            self._stretches.popitem(last=False)
        return found

    def _stretch_set(self, k: int) -> frozenset[int]:
        kept = self._sets.get(k)
        if kept is None:
            kept = self._sets[k] = frozenset(self.stretch(k).tolist())
            if len(self._sets) > STRETCHES_KEPT:
                self._sets.popitem(last=False)
        return kept

    # -- questions ---------------------------------------------------------------------------
    def __contains__(self, offset: int) -> bool:
        low, high, members = self._current
        if low <= offset < high:  # questions in file order mostly stay in one stretch
            return offset in members
        if self.count == 0 or not self.first <= offset <= self.last:
            return False
        marks = self.marks
        k = int(np.searchsorted(marks, offset, side="right")) - 1
        members = self._stretch_set(k)
        self._current = (int(marks[k]), int(marks[k + 1]) if k + 1 < len(marks) else self.last + 1,
                         members)
        return offset in members

    def contains(self, offsets, near: np.ndarray | None = None) -> np.ndarray:
        """Whether each of ``offsets`` is a record start. ``near``: consecutive starts the
        caller holds (a batch of the walk), which answer for offsets within their span."""
        offsets = np.asarray(offsets, dtype=np.int64)
        out = np.zeros(len(offsets), bool)
        ask = (offsets >= self.first) & (offsets <= self.last) if self.count else out.copy()
        if near is not None and len(near):
            within = ask & (offsets >= near[0]) & (offsets <= near[-1])
            if within.any():
                at = offsets[within]
                out[within] = near[np.searchsorted(near, at)] == at
                ask &= ~within
        if ask.any():
            out[ask] = self.rank(offsets[ask])[1]
        return out

    def rank(self, offsets) -> tuple[np.ndarray, np.ndarray]:
        """(how many starts lie below each offset, whether it is a start itself): what
        ``np.searchsorted(starts, offsets)`` and a comparison would give.

        Offsets that follow each other as the walk would (each one where the previous one's
        record ends) form a run: only a run's first offset is looked up, and when it is the
        start of rank r, the next ones are the starts r + 1, r + 2, ... (as long as the walk
        went on that far). Links and indexes into a file mostly come in such runs."""
        offsets = np.asarray(offsets, dtype=np.int64)
        rows = len(offsets)
        ranks = np.zeros(rows, np.int64)
        hits = np.zeros(rows, bool)
        if not rows or not self.count:
            return ranks, hits
        order = None
        if rows > 1 and bool((offsets[1:] < offsets[:-1]).any()):
            order = np.argsort(offsets, kind="stable")
            offsets = offsets[order]
        inside = (offsets >= self.first) & (offsets <= self.last)
        chained = np.zeros(rows, bool)
        if rows > 1:
            before = np.flatnonzero(inside[:-1])
            steps = self._extra + field_at(self.buf, offsets[before], 0, self._dtype).astype(np.int64)
            chained[before + 1] = (steps > 0) & (offsets[before + 1] == offsets[before] + steps)
        heads = np.flatnonzero(~chained)
        head_ranks, head_hits = self._lookup(offsets[heads])
        run = np.cumsum(~chained) - 1                 # the run each offset belongs to
        within = np.arange(rows, dtype=np.int64) - heads[run]
        got_ranks = head_ranks[run] + within
        got_hits = head_hits[run] & (got_ranks < self.count)
        np.minimum(got_ranks, self.count, out=got_ranks)  # past the last start: all below
        doubtful = np.flatnonzero(~head_hits[run] & (within > 0))  # a run after a non-start
        if len(doubtful):
            got_ranks[doubtful], got_hits[doubtful] = self._lookup(offsets[doubtful])
        if order is None:
            return got_ranks, got_hits
        ranks[order], hits[order] = got_ranks, got_hits
        return ranks, hits

    def _lookup(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`rank` of ascending ``offsets``, each by walking its stretch again."""
        rows = len(offsets)
        ranks = np.zeros(rows, np.int64)
        hits = np.zeros(rows, bool)
        which = np.searchsorted(self.marks, offsets, side="right") - 1
        begin = int(np.searchsorted(which, 0))  # offsets below the first start: rank 0
        while begin < rows:
            low = int(which[begin])
            end = int(np.searchsorted(which, low + STRETCHES_PER_GROUP))
            needed = np.unique(which[begin:end]).tolist()
            pieces = [self.stretch(k) for k in needed]
            known = np.concatenate(pieces)
            known_rank = np.concatenate([np.arange(len(p), dtype=np.int64) + k * STARTS_PER_MARK
                                         for k, p in zip(needed, pieces)])
            asked = offsets[begin:end]
            at = np.searchsorted(known, asked)
            clipped = np.minimum(at, len(known) - 1)
            hit = known[clipped] == asked
            # not a start: the starts below it are its stretch's ones up to the one before it
            ranks[begin:end] = np.where(hit, known_rank[clipped], known_rank[np.maximum(at - 1, 0)] + 1)
            hits[begin:end] = hit
            begin = end
        return ranks, hits

    def at_rank(self, rank: int) -> int:
        """The offset of the start with ``rank`` starts before it (0 <= rank < count)."""
        return int(self.stretch(rank // STARTS_PER_MARK)[rank % STARTS_PER_MARK])
