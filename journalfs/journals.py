"""Journal files on disk: detection, mapping and sparse record indexes over the pure codecs.

This is the file-level layer the CLI, the FUSE views and the Spark source share. Codecs see
only buffers; this module opens and maps files, and remembers where records start so that a
journal of millions of records can be listed and read piecewise with bounded memory.
"""
from __future__ import annotations

import bisect
import contextlib
import datetime
import errno
import itertools
import mmap
import os
import stat
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from .formats import CODECS, SCAN_ROWS, SNIFF_BYTES, Codec, FormatError, detect
from .formats.base import Batches, Finding, Record, Records, Rows, rows_of_batches
from .jsonlines import EMPTY, JsonChunk, json_chunk
from .pagecache import DroppingPages, FileMapping, PagePacer, Releaser

#: A checkpoint is kept every this many records (bounded memory for huge journals).
CHECKPOINT_EVERY = 1024
#: Bytes at the start of a file and before its last checkpoint that must be unchanged for an
#: index to be extended rather than rebuilt when the file grows.
FINGERPRINT_BYTES = 4096
#: A hole (never-written zeros of a sparse file, found with SEEK_HOLE) at least this long
#: ends what is decoded: ``truncate -s 1G`` on a small journal is one damage entry, not
#: millions of all-zero records decoded by a root daemon.
HOLE_MIN = 1 << 20


#: Opens a journal for reading and returns a fd the caller closes (the views pass one that
#: stays inside SOURCE; the default opens the path, not following a final symlink).
Opener = Callable[[], int]


def open_path(path: str, follow: bool = True) -> int:
    """A read-only fd of the regular file ``path`` (``follow=False``: a final symlink is not
    followed). FIFOs, devices and the like are refused before they are opened for reading,
    so nothing here ever blocks on them."""
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    path_fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(path_fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(path_fd)


def sniff_fd(fd: int) -> Codec | None:
    """The codec of the open file ``fd`` by its magic bytes; None when it is not a journal."""
    try:
        return detect(os.pread(fd, SNIFF_BYTES, 0))
    except OSError:
        return None


def sniff_file(path: str) -> Codec | None:
    """The codec for ``path`` by its magic bytes; None for anything that is not a journal."""
    try:
        fd = open_path(path)
    except OSError:
        return None
    try:
        return sniff_fd(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def mapped_fd(fd: int):
    """A read-only mmap of the open file ``fd`` (``b""`` when empty); never a copy."""
    size = os.fstat(fd).st_size
    if size == 0:
        yield b""
        return
    m = FileMapping(fd, 0, access=mmap.ACCESS_READ)
    try:
        yield m
    finally:
        with contextlib.suppress(BufferError):
            m.close()


@contextlib.contextmanager
def mapped(path: str):
    """A read-only mmap of ``path`` (``b""`` for an empty file); never a copy of the file.
    For the caller's own files (CLI, Spark): the views read with :func:`pread_buffer`."""
    fd = open_path(path)
    try:
        with mapped_fd(fd) as buf:
            yield buf
    finally:
        os.close(fd)


#: Bytes at a file's start every codec may need (headers), read along with any range.
HEAD_BYTES = 64 << 10
#: Bytes read past the last known checkpoint of an index still being built.
PARTIAL_WINDOW = 64 << 20


def data_end(fd: int, size: int) -> int:
    """Where the file's data ends for decoding: the start of its first hole of at least
    HOLE_MIN bytes (SEEK_HOLE/SEEK_DATA), else ``size``."""
    pos = 0
    while pos < size:
        try:
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
        except OSError:  # no SEEK_HOLE here: the file is all data
            return size
        if hole >= size:
            return size
        try:
            data = os.lseek(fd, hole, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                return size
            data = size  # a hole up to the end
        if data - hole >= HOLE_MIN:
            return hole
        pos = data
    return size


@contextlib.contextmanager
def pread_buffer(fd: int, start: int, end: int, size: int | None = None):
    """A buffer as long as the file (``size``, default ``end``) holding its bytes
    ``[0, HEAD_BYTES)`` and ``[start, end)``, zeros elsewhere, read with pread into anonymous
    memory (pages never written cost nothing). Codecs see the file's true length; callers
    decode only records inside the range (``stop``).

    For files other users can change (the views, as root): a mapping of the file itself
    kills the process with SIGBUS when the file is truncated meanwhile; here a truncated
    file only reads short, and the codec then reports damage."""
    size = end if size is None else size
    end = min(end, size)
    if size <= 0:
        yield b""
        return
    m = mmap.mmap(-1, size)
    try:
        view = memoryview(m)
        try:
            for lo, hi in ((0, min(HEAD_BYTES, end)), (max(0, start), end)):
                pos = lo
                while pos < hi:
                    got = os.preadv(fd, [view[pos:hi]], pos)
                    if got <= 0:  # shorter than it was: the rest stays zeros
                        break
                    pos += got
        finally:
            view.release()
        yield m
    finally:
        with contextlib.suppress(BufferError):
            m.close()


#: While indexing a file others may change (the views), the bytes held in memory from the
#: record being indexed on: a window that slides along the file. It doubles only for a batch
#: whose records or damage reach past it (a single record bigger than it), and shrinks back.
LOAD_AHEAD = 64 << 20
_PAGE = mmap.PAGESIZE


class WindowedBuffer:
    """A buffer as long as the file (codecs see its true length) that holds, read with pread
    into anonymous memory, only the file's first ``HEAD_BYTES`` and one window ``[lo, hi)``;
    everything else reads as zeros. Moving the window forward gives the pages behind it back
    to the kernel (``MADV_DONTNEED``), so the process's memory stays about one window, not
    the file: a 1 GB journal is indexed in ~64 MiB. Never a mapping of the file itself: a
    file truncated meanwhile only reads short (zeros), and the codec reports damage."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, max(0, size)
        self.buf = mmap.mmap(-1, self.size) if self.size else b""
        self._view = memoryview(self.buf) if self.size else None
        self._head = min(HEAD_BYTES, self.size)
        self.lo = self.hi = self._head  # the window; [0, _head) is always held
        self.short = False  # the file came out shorter than ``size``: nothing more comes
        self._read(0, self._head)

    def _read(self, lo: int, hi: int) -> None:
        pos = lo
        while pos < hi:
            got = os.preadv(self.fd, [self._view[pos:hi]], pos)
            if got <= 0:  # shorter than it was: the rest stays zeros
                self.short = True
                return
            pos += got

    def _drop(self, lo: int, hi: int) -> None:
        """Give the whole pages inside ``[lo, hi)`` (outside the head) back: they read as zeros."""
        lo = max(-(-max(lo, self._head) // _PAGE) * _PAGE, 0)
        hi = min(hi // _PAGE * _PAGE, self.size // _PAGE * _PAGE)
        if hi > lo:
            self.buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def window(self, lo: int, hi: int) -> int:
        """Hold the file's bytes ``[lo, hi)`` (clipped to the file), dropping what lies
        before ``lo``; returns how far the buffer now holds the file without a gap from
        ``lo`` (``size`` once the file's end is held, or it came out short)."""
        if not self.size:
            return 0
        lo, hi = max(0, min(lo, self.size)), max(0, min(hi, self.size))
        if lo < self.lo or lo > self.hi:  # a jump: start a new window
            self._drop(self.lo, self.hi + _PAGE)
            self.lo = self.hi = lo
        else:
            self._drop(self.lo, lo)
            self.lo = max(self.lo, lo // _PAGE * _PAGE)
        if hi > self.hi and not self.short:
            self._read(self.hi, hi)
            self.hi = hi
        if self.short:
            return self.size
        return max(self.hi, self._head) if self.lo <= self._head else self.hi

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            with contextlib.suppress(BufferError):
                self.buf.close()


@contextlib.contextmanager
def windowed_buffer(fd: int, size: int):
    win = WindowedBuffer(fd, size)
    try:
        yield win
    finally:
        win.close()


def _codec_of(path: str, codec: Codec | None) -> Codec:
    """``codec``, or the one ``path``'s magic names; a file without one is damaged input."""
    codec = codec or sniff_file(path)
    if codec is None:
        raise FormatError(path, 0, "not a supported journal file (unknown magic bytes)")
    return codec


# -- the one reader ----------------------------------------------------------------------------
#: Called after each batch of a scan with (the offset of its last record, records so far).
Progress = Callable[[int, int], None]


def scan(codec: Codec, buf, path: str, start: int | None = None, seq: int = 0,
         stop: int | None = None, *, rows: Rows = SCAN_ROWS, span: int | None = None,
         form: str = "columns", progress: Progress | None = None) -> Batches:
    """The one streaming reader of a file's records: :meth:`Codec.scan`'s batches (see
    there for ``rows``, ``span``, ``form``; the damage is the last batch's ``error``), with
    the pages of a mapping ``buf`` dropped from this process as the reading passes them --
    behind each batch once the caller has it, and whenever a codec that walks the file
    back and forth says so -- so a file of any size streams in a bounded resident set (the
    pages stay in the page cache). Every consumer that streams a file (``records``,
    ``fsck``, the record indexes, the Spark reader and its checkpoints) reads through it."""
    releaser, pacer = Releaser(buf), PagePacer(buf)
    count = 0
    with contextlib.closing(codec.scan(buf, path, start, seq, stop, rows=rows, span=span,
                                       form=form, pace=pacer)) as batches:
        for cols in batches:
            yield cols
            if cols.rows:
                last = int(cols.data["offset"][cols.rows - 1])
                count += cols.rows
                releaser.passed(last)
                if progress is not None:
                    progress(last, count)


def read_records(codec: Codec, buf, path: str, progress: Progress | None = None
                 ) -> Records:
    """Every record of ``path`` (mapped as ``buf``) as :meth:`Codec.read` yields them, through
    :meth:`Codec.records` (bounded memory), the pages behind them dropped as in :func:`scan`;
    raises the damage after the valid records."""
    releaser = Releaser(buf)
    records = codec.records(buf, path, pace=PagePacer(buf))
    try:
        for n, rec in enumerate(records):
            if not n & 1023:
                releaser.passed(rec["offset"])
                if progress is not None:
                    progress(rec["offset"], n)
            yield rec
    finally:
        records.close()


def validate(codec: Codec, buf, path: str, context: dict) -> list[Finding]:
    """:meth:`Codec.validate` of ``buf`` with the keyword ``context`` (partner files' buffers,
    settings), holding only a bounded part of the mapped files in this process: for a codec
    that :attr:`~Codec.paces_validation` the pages are dropped in step with its reading,
    for the others by a timer while it runs."""
    if codec.paces_validation:
        return codec.validate(buf, path, pace=PagePacer(buf, *context.values()), **context)
    with DroppingPages(buf, *context.values()):
        return codec.validate(buf, path, **context)


def read_file(path: str, codec: Codec | None = None) -> Iterator[Record]:
    """Every record of ``path`` in file order; raises :class:`FormatError` at damage."""
    codec = _codec_of(path, codec)
    with mapped(path) as buf:
        yield from codec.read(buf, path)


@dataclass
class RecordIndex:
    """Where every ``CHECKPOINT_EVERY``-th record of one file starts, plus the record count.

    Built by one streaming pass in batches of bounded size, through the codec's cheapest exact
    way to find record starts (see :func:`_offset_batches`); afterwards any record is reached
    by resuming the codec at the nearest checkpoint.
    """

    path: str
    codec: Codec
    count: int = 0
    error: FormatError | None = None
    seqs: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    identity: tuple = ()
    #: (offset of the last checkpoint, crc32 of the bytes that vouch for the prefix before it)
    fingerprint: tuple = ()
    #: when extended from an index of the same file before it grew: that index's identity and
    #: the record number re-reading started at (records before it are exactly as there)
    grown_from: tuple | None = None

    #: opens the file (a fd the caller closes); None: the path itself
    opener: Opener | None = field(default=None, repr=False, compare=False)
    #: the file's st_dev (with identity's inode: which file this is)
    dev: int = 0
    #: False while :meth:`build` is still adding records (a partial index serves those it has)
    complete: bool = True
    #: (views) records.jsonl's line layout, when a reader finished it before the index was
    #: adopted by the views
    finished_layout: object = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, path: str, codec: Codec | None = None,
              previous: "RecordIndex | None" = None, opener: Opener | None = None,
              progress: Callable[["RecordIndex"], None] | None = None) -> "RecordIndex":
        """Index ``path``. With ``previous`` (an index of the same file, taken earlier) and a
        file that only grew -- same inode, not smaller, the same bytes at its start and just
        before its last checkpoint -- indexing resumes at that checkpoint: a journal being
        appended to costs the new records, not the whole file again.

        ``opener`` opens the file instead of its path (see :data:`Opener`). ``progress`` is
        called with the index after every batch: records below ``count`` are served already."""
        fd = opener() if opener is not None else open_path(path)
        try:
            codec = codec or sniff_fd(fd)
            if codec is None:
                raise FormatError(path, 0, "not a supported journal file (unknown magic bytes)")
            st = os.fstat(fd)
            idx = cls(path, codec, identity=(st.st_ino, st.st_size, st.st_mtime_ns),
                      opener=opener, dev=st.st_dev, complete=False)
            if opener is None:  # the caller's own file (CLI): mapped, no copy
                with mapped_fd(fd) as buf:
                    idx._index_buffer(buf, previous, progress)
            else:  # a file others may truncate under us (views): read, never mapped
                end = data_end(fd, st.st_size)
                with windowed_buffer(fd, end) as win:
                    idx._index_buffer(win.buf, previous, progress, win)
                if end < st.st_size and idx.error is None:
                    idx.error = FormatError(path, end, f"a hole of {st.st_size - end} bytes "
                                            "(a sparse file's never-written zeros): not "
                                            "decoded").detached()
            idx.complete = True
        finally:
            os.close(fd)
        return idx

    def _index_buffer(self, buf, previous: "RecordIndex | None", progress,
                      win: WindowedBuffer | None = None) -> None:
        """Index ``buf``: the file mapped, or (``win``) a :class:`WindowedBuffer` of it that
        holds one window at a time."""
        path, codec = self.path, self.codec
        try:
            if codec.resumable:
                if win is not None and previous is not None and previous.fingerprint:
                    last = previous.fingerprint[0]  # the bytes _resume compares
                    win.window(max(0, last - FINGERPRINT_BYTES), last)
                start, seq = self._resume(previous, buf)
                try:
                    for offsets in _offset_batches(codec, buf, path, start, seq, win):
                        self._add(offsets)
                        if progress is not None:
                            progress(self)
                finally:  # a torn tail too: it is often completed by the next append
                    if self.offsets:
                        last = self.offsets[-1]
                        if win is not None:
                            win.window(max(0, last - FINGERPRINT_BYTES), last)
                        self.fingerprint = _prefix_fingerprint(buf, last)
            else:  # no resuming mid-file: the whole file, counted a batch at a time
                if win is not None:
                    win.window(0, len(buf))
                for cols in scan(codec, buf, path, form="offsets"):
                    self.count += cols.rows
                    if cols.error is not None:
                        raise cols.error
        except FormatError as exc:
            self.error = exc.detached()

    def _resume(self, previous: "RecordIndex | None", buf) -> tuple[int | None, int]:
        """(offset, record number) to index from: ``previous``'s last checkpoint when it
        still holds for this file (its checkpoints before that one are adopted), else the
        start."""
        if previous is None or not previous.fingerprint or previous.codec.name != self.codec.name:
            return None, 0
        ino, size = self.identity[:2]
        last = previous.fingerprint[0]
        if previous.identity[0] != ino or previous.identity[1] > size or last > len(buf) \
                or _prefix_fingerprint(buf, last) != previous.fingerprint:
            return None, 0
        keep = len(previous.seqs) - 1  # the last checkpoint is re-read, with what follows it
        self.seqs, self.offsets = previous.seqs[:keep], previous.offsets[:keep]
        self.count = previous.seqs[keep]
        self.grown_from = (previous.identity, self.count)
        return previous.offsets[keep], self.count

    def _add(self, offsets: Sequence[int]) -> None:
        """Count the records starting at ``offsets`` (the next ones in file order), keeping
        the start of every ``CHECKPOINT_EVERY``-th record."""
        first = -self.count % CHECKPOINT_EVERY  # the batch's first checkpointed row
        # offsets before seqs, count last: a reader of a partial index (another thread)
        # never sees a checkpoint without its offset, nor a count past the checkpoints
        self.offsets.extend(int(o) for o in offsets[first::CHECKPOINT_EVERY])
        self.seqs.extend(range(self.count + first, self.count + len(offsets), CHECKPOINT_EVERY))
        self.count += len(offsets)

    def records(self, first: int = 0, count: int | None = None) -> Iterator[Record]:
        """Records ``first .. first+count-1`` (clipped to the valid prefix)."""
        last = self.count if count is None else min(self.count, first + count)
        if first >= last:
            return
        if not self.codec.resumable:
            yield from self._batch_records(first, last)
            return
        seq, start = 0, None
        if self.seqs:
            i = bisect.bisect_right(self.seqs, first) - 1
            seq, start = self.seqs[i], self.offsets[i]
        with self._range(start, last) as (buf, stop):
            it = self.codec.read(buf, self.path, start, seq, stop)
            try:
                for rec in it:
                    s = rec["seq"]
                    if s >= last:
                        break
                    if s >= first:
                        yield rec
            except FormatError:
                pass  # the damage is already recorded in self.error; the prefix was served
            finally:
                it.close()

    def _batch_records(self, first: int, last: int) -> Iterator[Record]:
        """Records ``first .. last-1`` of a codec that cannot resume mid-file, from its
        start: the batches before them counted, not made into records."""
        with self._range(None, last) as (buf, _), \
                contextlib.closing(scan(self.codec, buf, self.path)) as batches:
            # clipped at the damage, which is already recorded in self.error
            for cols, lo, hi in rows_of_batches(batches, first, last):
                yield from itertools.islice(cols.records(), lo, hi)

    @contextlib.contextmanager
    def _range(self, start: int | None, last: int):
        """(buffer, stop) to decode records from ``start`` up to record ``last``: the file
        mapped (no opener), or (views) only the bytes up to the checkpoint at or after
        ``last`` read with pread -- ``stop`` is that checkpoint's offset, or None."""
        if self.opener is None:
            with mapped(self.path) as buf:
                yield buf, None
            return
        j = bisect.bisect_left(self.seqs, last) if self.codec.resumable else len(self.seqs)
        stop = self.offsets[j] if j < len(self.offsets) and self.seqs[j] >= last else None
        fd = self.opener()
        try:
            size = os.fstat(fd).st_size
            if stop is not None:
                end = min(stop, size)
            elif self.complete:  # indexed up to a hole (data_end): rendered up to it too,
                end = data_end(fd, size)  # never a sparse file's gigabytes of zeros per read
            else:  # past the checkpoints of an index still being built: never the whole file
                end = min(size, (start or 0) + PARTIAL_WINDOW)
            with pread_buffer(fd, start or 0, end, size) as buf:
                yield buf, stop
        finally:
            os.close(fd)

    def settled(self) -> int:
        """How many records can be rendered in checkpoint-aligned pieces now: all of them
        once the index is complete; while it is still being built, those before its last
        checkpoint (their bytes end where that checkpoint starts, so no read is open-ended,
        and the next piece starts at a checkpoint again)."""
        complete = self.complete  # read first: a count read after it is at least as far
        if complete or not self.codec.resumable:
            return self.count
        seqs = self.seqs
        return seqs[-1] if seqs else 0

    def record(self, seq: int) -> Record:
        for rec in self.records(seq, 1):
            return rec
        raise IndexError(seq)

    def json_chunk(self, first: int, count: int) -> JsonChunk:
        """The JSON lines -- exactly ``journalfs records --json``'s -- of records ``first ..
        first+count-1``, clipped to the valid prefix, with each record's kind and payload
        size (listings). ``first`` must be a checkpointed record (or 0): decoding starts
        right there."""
        last = min(self.count, first + count)
        if first >= last:
            return EMPTY
        start = self._checkpoint_offset(first)
        with self._range(start, last) as (buf, stop):
            return json_chunk(self.codec, buf, self.path, start, first, last - first, stop)

    def column_batches(self, first: int, last: int) -> Batches:
        """Records ``first .. last-1`` as :func:`scan`'s column batches (the last batch may
        run past ``last``; a damaged file's last one carries the error), read by the index's
        own reader of a record range (views: a bounded pread, never a mapping). ``first``
        must be a checkpointed record (or 0): decoding starts right there. Close the
        iterator (or run it out) before the file may go: it holds the range open."""
        start = self._checkpoint_offset(first)
        with self._range(start, last) as (buf, stop), \
                contextlib.closing(scan(self.codec, buf, self.path, start, first, stop,
                                        rows=last - first)) as batches:
            yield from batches

    def _checkpoint_offset(self, first: int) -> int | None:
        """Where checkpointed record ``first`` starts (None: record 0, the file's start)."""
        if self.codec.resumable and self.seqs and first:
            i = bisect.bisect_right(self.seqs, first) - 1
            if self.seqs[i] != first:
                raise ValueError(f"record {first} is not at a checkpoint")
            return self.offsets[i]
        if first:
            raise ValueError(f"record {first} is not at a checkpoint (none recorded)")
        return None


#: Records per batch while indexing, and the bytes a batch aims to span: together they bound
#: what one batch holds in memory (its offsets, and any payloads a codec decodes with them).
INDEX_BATCH_ROWS = 1 << 16
INDEX_BATCH_BYTES = 1 << 20
#: Rows of the first batch, before the file's bytes per record are known.
FIRST_BATCH_ROWS = 16


def _prefix_fingerprint(buf, upto: int) -> tuple[int, int]:
    """(``upto``, crc32 of the file's first bytes and of the bytes just before ``upto``): an
    appended-to file keeps both; a rewritten one almost surely changes one of them."""
    head = zlib.crc32(buf[:min(upto, FINGERPRINT_BYTES)])
    return upto, zlib.crc32(buf[max(0, upto - FINGERPRINT_BYTES):upto], head)


def _offset_batches(codec: Codec, buf, path: str, start: int | None = None,
                    seq: int = 0, win: WindowedBuffer | None = None
                    ) -> Iterator[Sequence[int]]:
    """The start offsets of every record :meth:`Codec.read` yields for ``path`` (mapped as
    ``buf``) from record ``seq`` at ``start`` on, in batches of bounded size; raises the same
    :class:`FormatError` after the valid prefix.

    Through the codec's cheapest exact way to find record starts
    (:meth:`Codec.record_offsets`): the mapped file by :func:`scan`; a file others may
    change, held a window at a time (``win``), by :func:`_batched`."""
    if win is None:
        for cols in scan(codec, buf, path, start, seq, rows=INDEX_BATCH_ROWS,
                         span=INDEX_BATCH_BYTES, form="offsets"):
            if cols.rows:
                yield cols.data["offset"]
            if cols.error is not None:
                raise cols.error
        return
    yield from _batched(codec.record_offsets, buf, path, start, seq, win)


def _batched(starts_of, buf, path: str, start: int | None, seq: int,
             win: WindowedBuffer | None = None) -> Iterator[Sequence[int]]:
    """Drive ``starts_of(buf, path, start, seq, stop, limit) -> (offsets, next, error)`` from
    ``start`` to the end, sizing each batch so it spans about ``INDEX_BATCH_BYTES``.

    With ``win``, the buffer holds the file only from ``start`` to the window's end. A batch
    that reached past it -- its resume point beyond it, or its end or damage found before the
    file's end -- may have read zeros instead of the file: it is done again. When it found
    records, from its last one on (the window slides there); when the window's first record
    is itself the trouble, with a window twice as big. Damage is taken as it is once two
    windows, the second twice the first, both starting at the same record, report the same
    one: only a record bigger than that could still be read short, so memory stays a window
    even for a file damaged in its middle. The end of the records is believed only once the
    window reaches the file's end."""
    limit, per_row = FIRST_BATCH_ROWS, None
    width, tried = LOAD_AHEAD, None
    while True:
        at = start or 0
        held = len(buf) if win is None else win.window(at, at + width)
        rows_wanted = limit
        if held < len(buf) and per_row is not None:
            # records past the window are decoded again after it slides: a batch asks only
            # for what the window can hold (a small window made this quadratic)
            rows_wanted = max(2, min(limit, (held - at) // per_row + 2))
        offsets, next_offset, error = starts_of(buf, path, start, seq, None, rows_wanted)
        rows = len(offsets)
        if held < len(buf) and (error is not None or next_offset is None
                                or next_offset > held):
            if rows >= 2 and int(offsets[-1]) < held and \
                    all(int(offsets[i]) < int(offsets[i + 1]) for i in range(rows - 1)):
                # the records before the last lie wholly in the window: keep them and
                # resume at the last one, which may reach past it
                yield offsets[:-1]
                start, seq = int(offsets[-1]), seq + rows - 1
                width, tried = LOAD_AHEAD, None
                continue
            verdict = (rows, next_offset, None if error is None else
                       (error.offset, error.reason))
            # "no more records" is believed only at the file's end: zeros past the window
            # look like the end (padding) to several formats
            if verdict != tried or error is None:
                tried, width = verdict, width * 2
                continue
        if rows:
            yield offsets
        if error is not None:
            raise error
        if next_offset is None or not rows:
            return
        per_row = max(1, (next_offset - int(offsets[0])) // rows)
        limit = max(1, min(INDEX_BATCH_ROWS, INDEX_BATCH_BYTES // per_row))
        start, seq = next_offset, seq + rows
        width, tried = LOAD_AHEAD, None


# -- related files ---------------------------------------------------------------------------

def directory_journals(directory: str) -> list[tuple[str, str]]:
    """``(name, format)`` of every journal file in ``directory`` (by magic; never a backup)."""
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return []
    found = []
    for name in names:
        full = os.path.join(directory, name)
        if is_backup_name(name) or not os.path.isfile(full):
            continue
        codec = sniff_file(full)
        if codec is not None:
            found.append((name, codec.name))
    return found


def related_files(path: str, codec: Codec,
                  siblings: Sequence[tuple[str, str]] | None = None) -> dict[str, str]:
    """The files :meth:`Codec.validate` / :meth:`Codec.repair` of ``path`` want as context,
    by context keyword, as the codec's :meth:`~Codec.partners` names them among the journals
    of its directory (``siblings``: their ``(name, format)``, listed here when not given)."""
    if not codec.partner_formats:
        return {}
    directory, name = os.path.split(path)
    if siblings is None:
        siblings = directory_journals(directory)
    partners = codec.partners(name, [s for s in siblings if s[0] != name])
    return {role: os.path.join(directory, other) for role, other in partners.items()}


# -- safe rewriting ----------------------------------------------------------------------------

BACKUP_MARK = ".journalfs-backup-"


def is_backup_name(name: bytes | str) -> bool:
    """True for a backup ``fsck --repair`` wrote (``X.journalfs-backup-<time>``): never a
    journal, whatever its content (views, the CLI's directory walk and Spark skip it)."""
    if isinstance(name, bytes):
        return BACKUP_MARK.encode() in name.rpartition(b"/")[2]
    return BACKUP_MARK in name.rpartition("/")[2]


def fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_backup(path: str, data: bytes) -> str:
    """Write ``data`` to a new ``<path>.journalfs-backup-<UTC timestamp>`` (never overwriting an
    existing file), fsync it and its directory; return its name."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    base = f"{path}{BACKUP_MARK}{stamp}"
    for attempt in range(1000):
        name = base if attempt == 0 else f"{base}-{attempt}"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        try:
            _write_durably(fd, data)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path))
        return name
    raise FileExistsError(f"{base}: too many backups with this timestamp")


def replace_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data``: temp file in the same directory, fsync, rename, fsync dir.
    The file keeps its permission bits; a crash leaves either the old or the new content."""
    directory = os.path.dirname(path) or "."
    mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".journalfs-tmp",
                               dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            _write_durably(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


__all__ = ["BACKUP_MARK", "CHECKPOINT_EVERY", "CODECS", "Opener", "RecordIndex", "fsync_dir",
           "is_backup_name", "mapped", "mapped_fd", "open_path", "read_file", "read_records",
           "scan", "validate",
           "directory_journals", "related_files", "replace_atomically", "sniff_file",
           "sniff_fd", "write_backup"]
