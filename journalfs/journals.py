"""Journal files on disk: detection, mapping and sparse record indexes over the pure codecs.

This is the file-level layer the CLI, the FUSE views and the Spark source share. Codecs see
only buffers; this module opens and maps files, and remembers where records start so that a
journal of millions of records can be listed and read piecewise with bounded memory.
"""
from __future__ import annotations

import bisect
import contextlib
import mmap
import os
from dataclasses import dataclass, field
from typing import Iterator

from .formats import CODECS, SNIFF_BYTES, Codec, FormatError, detect
from .formats.base import Record

#: A checkpoint is kept every this many records (bounded memory for huge journals).
CHECKPOINT_EVERY = 1024


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


def read_file(path: str, codec: Codec | None = None) -> Iterator[Record]:
    """Every record of ``path`` in file order; raises :class:`FormatError` at damage."""
    codec = codec or sniff_file(path)
    if codec is None:
        raise FormatError(path, 0, "not a supported journal file (unknown magic bytes)")
    with mapped(path) as buf:
        yield from codec.read(buf, path)


@dataclass
class RecordIndex:
    """Where every ``CHECKPOINT_EVERY``-th record of one file starts, plus the record count.

    Built by one streaming pass; afterwards any record is reached by resuming the codec at the
    nearest checkpoint. Fixed-width formats need no checkpoints at all.
    """

    path: str
    codec: Codec
    count: int = 0
    error: FormatError | None = None
    seqs: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    identity: tuple = ()

    @classmethod
    def build(cls, path: str, codec: Codec | None = None) -> "RecordIndex":
        codec = codec or sniff_file(path)
        if codec is None:
            raise FormatError(path, 0, "not a supported journal file (unknown magic bytes)")
        st = os.stat(path)
        idx = cls(path, codec, identity=(st.st_ino, st.st_size, st.st_mtime_ns))
        n = 0
        try:
            with mapped(path) as buf:
                for rec in codec.read(buf, path):
                    if n % CHECKPOINT_EVERY == 0 and codec.resumable:
                        idx.seqs.append(n)
                        idx.offsets.append(rec["offset"])
                    n += 1
        except FormatError as exc:
            idx.error = exc
        idx.count = n
        return idx

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


__all__ = ["CHECKPOINT_EVERY", "CODECS", "RecordIndex", "mapped", "read_file", "sniff_file"]
