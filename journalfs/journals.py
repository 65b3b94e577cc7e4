"""Journal files on disk: detection, mapping and sparse record indexes over the pure codecs.

This is the file-level layer the CLI, the FUSE views and the Spark source share. Codecs see
only buffers; this module opens and maps files, and remembers where records start so that a
journal of millions of records can be listed and read piecewise with bounded memory.
"""
from __future__ import annotations

import bisect
import contextlib
import datetime
import mmap
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from .formats import CODECS, SNIFF_BYTES, Codec, FormatError, detect
from .formats.base import Record

#: A checkpoint is kept every this many records (bounded memory for huge journals).
CHECKPOINT_EVERY = 1024
#: Bytes at the start of a file and before its last checkpoint that must be unchanged for an
#: index to be extended rather than rebuilt when the file grows.
FINGERPRINT_BYTES = 4096


def sniff_file(path: str) -> Codec | None:
    """The codec for ``path`` by its magic bytes; None for anything that is not a journal."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return None
    return detect(head)


@contextlib.contextmanager
def mapped(path: str):
    """A read-only mmap of ``path`` (``b""`` for an empty file); never a copy of the file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield b""
            return
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield m
        finally:
            with contextlib.suppress(BufferError):
                m.close()


def _codec_of(path: str, codec: Codec | None) -> Codec:
    """``codec``, or the one ``path``'s magic names; a file without one is damaged input."""
    codec = codec or sniff_file(path)
    if codec is None:
        raise FormatError(path, 0, "not a supported journal file (unknown magic bytes)")
    return codec


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

    @classmethod
    def build(cls, path: str, codec: Codec | None = None,
              previous: "RecordIndex | None" = None) -> "RecordIndex":
        """Index ``path``. With ``previous`` (an index of the same file, taken earlier) and a
        file that only grew -- same inode, not smaller, the same bytes at its start and just
        before its last checkpoint -- indexing resumes at that checkpoint: a journal being
        appended to costs the new records, not the whole file again."""
        codec = _codec_of(path, codec)
        st = os.stat(path)
        idx = cls(path, codec, identity=(st.st_ino, st.st_size, st.st_mtime_ns))
        try:
            if codec.resumable:
                with mapped(path) as buf:
                    start, seq = idx._resume(previous, buf)
                    try:
                        for offsets in _offset_batches(codec, buf, path, start, seq):
                            idx._add(offsets)
                    finally:  # a torn tail too: it is often completed by the next append
                        if idx.offsets:
                            idx.fingerprint = _prefix_fingerprint(buf, idx.offsets[-1])
            else:  # no resuming mid-file: only the count is worth keeping
                with mapped(path) as buf:
                    for _ in codec.read(buf, path):
                        idx.count += 1
        except FormatError as exc:
            idx.error = exc
        return idx

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
        self.seqs.extend(range(self.count + first, self.count + len(offsets), CHECKPOINT_EVERY))
        self.offsets.extend(int(o) for o in offsets[first::CHECKPOINT_EVERY])
        self.count += len(offsets)

    def records(self, first: int = 0, count: int | None = None) -> Iterator[Record]:
        """Records ``first .. first+count-1`` (clipped to the valid prefix)."""
        last = self.count if count is None else min(self.count, first + count)
        if first >= last:
            return
        with mapped(self.path) as buf:
            if self.codec.resumable and self.seqs:
                i = bisect.bisect_right(self.seqs, first) - 1
                seq, start = self.seqs[i], self.offsets[i]
            else:
                seq, start = 0, None
            it = self.codec.read(buf, self.path, start, seq)
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

    def record(self, seq: int) -> Record:
        for rec in self.records(seq, 1):
            return rec
        raise IndexError(seq)


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
                    seq: int = 0) -> Iterator[Sequence[int]]:
    """The start offsets of every record :meth:`Codec.read` yields for ``path`` (mapped as
    ``buf``) from record ``seq`` at ``start`` on, in batches of bounded size; raises the same
    :class:`FormatError` after the valid prefix.

    Uses the codec's cheapest exact path: a ``record_offsets`` method (starts without
    decoding), else its own vectorised ``read_columns``, else ``read``."""
    if hasattr(codec, "record_offsets"):
        yield from _batched(codec.record_offsets, buf, path, start, seq)
    elif type(codec).read_columns is not Codec.read_columns:
        def column_offsets(buf, path, start, seq, stop, limit):
            cols = codec.read_columns(buf, path, start, seq, stop, limit)
            return cols.data.get("offset", ())[:cols.rows], cols.next_offset, cols.error
        yield from _batched(column_offsets, buf, path, start, seq)
    else:  # the generic default read_columns is only read() plus columns: use read()
        batch: list[int] = []
        try:
            for rec in codec.read(buf, path, start, seq):
                batch.append(rec["offset"])
                if len(batch) == INDEX_BATCH_ROWS:
                    yield batch
                    batch = []
        except FormatError:
            if batch:
                yield batch
            raise
        if batch:
            yield batch


def _batched(starts_of, buf, path: str, start: int | None, seq: int) -> Iterator[Sequence[int]]:
    """Drive ``starts_of(buf, path, start, seq, stop, limit) -> (offsets, next, error)`` from
    ``start`` to the end, sizing each batch so it spans about ``INDEX_BATCH_BYTES``."""
    limit = FIRST_BATCH_ROWS
    while True:
        offsets, next_offset, error = starts_of(buf, path, start, seq, None, limit)
        rows = len(offsets)
        if rows:
            yield offsets
        if error is not None:
            raise error
        if next_offset is None or not rows:
            return
        per_row = max(1, (next_offset - int(offsets[0])) // rows)
        limit = max(1, min(INDEX_BATCH_ROWS, INDEX_BATCH_BYTES // per_row))
        start, seq = next_offset, seq + rows


# -- related files ---------------------------------------------------------------------------

def _sibling_of_format(directory: str, fmt: str, preferred: str) -> str | None:
    """``directory/preferred`` when it is a ``fmt`` file, else the first such file by name."""
    first = os.path.join(directory, preferred)
    if _is_format(first, fmt):
        return first
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        candidate = os.path.join(directory, name)
        if not is_backup(name) and _is_format(candidate, fmt):
            return candidate
    return None


def _is_format(path: str, fmt: str) -> bool:
    """True when ``path`` is a regular file whose magic names format ``fmt``."""
    if not os.path.isfile(path):
        return False
    codec = sniff_file(path)
    return codec is not None and codec.name == fmt


def related_files(path: str, codec: Codec) -> dict[str, str]:
    """The files :meth:`Codec.validate` / :meth:`Codec.repair` of ``path`` want as context,
    by context keyword: a Wallaby index's ``log`` (its name without ``.idx``), a Wallaby log's
    ``index`` (``<name>.idx``), an akka meta file's ``data`` and an akka data file's ``meta``
    (same directory, preferably named ``data`` / ``meta``). Only files whose magic matches."""
    directory = os.path.dirname(path) or "."
    related: dict[str, str] = {}
    if codec.name == "wallaby-index" and path.endswith(".idx"):
        log = path[: -len(".idx")]
        if _is_format(log, "wallaby-log"):
            related["log"] = log
    elif codec.name == "wallaby-log":
        index = path + ".idx"
        if _is_format(index, "wallaby-index"):
            related["index"] = index
    elif codec.name == "akka-meta":
        data = _sibling_of_format(directory, "akka-data", "data")
        if data:
            related["data"] = data
    elif codec.name == "akka-data":
        meta = _sibling_of_format(directory, "akka-meta", "meta")
        if meta:
            related["meta"] = meta
    return related


# -- safe rewriting ----------------------------------------------------------------------------

BACKUP_MARK = ".journalfs-backup-"


def is_backup(name: str) -> bool:
    return BACKUP_MARK in os.path.basename(name)


def is_backup_name(name: bytes | str) -> bool:
    """True for a backup ``fsck --repair`` wrote: never a journal, wherever it is listed."""
    if isinstance(name, bytes):
        return BACKUP_MARK.encode() in name
    return BACKUP_MARK in name


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


__all__ = ["BACKUP_MARK", "CHECKPOINT_EVERY", "CODECS", "RecordIndex", "fsync_dir", "is_backup",
           "mapped", "read_file", "related_files", "replace_atomically", "sniff_file",
           "write_backup"]
