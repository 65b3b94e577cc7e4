"""Executor side of the data source: one file slice -> Arrow record batches."""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from typing import Iterator

import pyarrow as pa

from ..formats import CODECS, FormatError
from ..journals import HEAD_BYTES, mapped, scan
from ..pagecache import PagePacer
from .convert import damage_batch, to_batch
from .plan import FileSlice
from .storage import is_remote, object_mapped


#: Batches a task handles between two calls of glibc's ``malloc_trim``: the workers' Arrow
#: buffers come from malloc (the system pool), whose freed pages a long task kept as it
#: went (a 2 GB Kestrel reader file's worker: 340 MB; over 300 MB of it, in one process,
#: anonymous memory 143 MB at the end without, 109 MB with, peak RSS 227 against 197 MB).
TRIM_EVERY = 16


def malloc_trim():
    """glibc's ``malloc_trim(0)`` (gives free heap pages back), or a no-op without glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


def _keys_for(sl: FileSlice, buf):
    """A per-file key (the codec reads it from the file name) or a per-batch key function
    (records whose key a partner file names: an akka data file's chains, by its meta file)."""
    codec = CODECS[sl.format]
    key = codec.file_key(os.path.basename(sl.path))
    if key is not None or not sl.partners:
        return key, None
    with contextlib.ExitStack() as stack:
        partners = {}
        for role, path in sl.partners:
            try:
                partners[role] = stack.enter_context(
                    object_mapped(path, [(0, 1 << 62)], sl.storage) if is_remote(path)
                    else mapped(path))
            except OSError:  # vanished or unreadable since planning: no keys from it
                pass
        # a late slice's first keys walk back through most of the file: its pages dropped
        # as the walk goes (a worker peaked at 330 MB on a 150 MB akka journal, 205 MB after)
        return None, codec.key_resolver(buf, partners, pace=PagePacer(buf))


class UnreadableSlice(OSError):
    """An executor cannot open a file the driver planned (not visible there, or gone):
    the task fails, so Spark retries it and then fails the job, never a silent 0 rows."""


def read_slice(sl: FileSlice, include_damage: bool, batch_rows: int
               ) -> Iterator[pa.RecordBatch]:
    """Batches of the records of ``sl`` (its file mapped for the duration)."""
    try:
        if is_remote(sl.path):  # an object: ranged reads of what the slice needs into a buffer
            cm = object_mapped(sl.path, slice_ranges(sl), sl.storage)
        else:
            cm = mapped(sl.path)
        buf = cm.__enter__()
    except OSError as exc:
        raise UnreadableSlice(exc.errno, f"journalfs: cannot read {sl.path} on "
                              f"{socket.gethostname()} (pid {os.getpid()}): "
                              f"{exc.strerror or exc}; every executor must see the input at "
                              "the path the driver listed") from None
    with contextlib.ExitStack() as stack:
        stack.push(cm)
        yield from read_buffer(buf, sl, include_damage, batch_rows)


def slice_ranges(sl: FileSlice) -> list[tuple[int, int]]:
    """Byte ranges of an object a slice needs: all of it, or for a slice of a fixed-width
    format (the only remote ones split) its header and its records."""
    if sl.start is None:
        return [(0, 1 << 62)]
    return [(0, HEAD_BYTES), (sl.start, 1 << 62 if sl.stop is None else sl.stop)]


#: Arrow bytes a batch aims at: rows per batch adapt to the records' size (payloads of up
#: to megabytes each must not make 64k-row batches), starting small.
#: 4 MiB: a worker's anonymous memory on the 1 GB bench corpus peaked at 221 MB against 319
#: with 32 MiB batches (the batch, its merged copy and its Parquet row group in flight), for
#: the same CPU; on the 0.25 GB corpus 128 MB against 159 with 8 MiB (row groups of 2-3 MB).
BATCH_BYTES = 4 << 20
FIRST_BATCH_ROWS = 16
#: Arrow rows can be several times their bytes on disk (attrs text, offsets).
ARROW_EXPANSION = 8


def read_buffer(buf, sl: FileSlice, include_damage: bool, batch_rows: int
                ) -> Iterator[pa.RecordBatch]:
    """Batches of the records of ``sl`` whose bytes are ``buf`` (the whole file), each of
    at most ``batch_rows`` rows and about :data:`BATCH_BYTES` bytes."""
    max_rows = batch_rows
    span = (len(buf) if sl.stop is None else min(sl.stop, len(buf))) - (sl.start or 0)
    if span * ARROW_EXPANSION > BATCH_BYTES:  # not surely small: measure a few rows first
        batch_rows = min(batch_rows, FIRST_BATCH_ROWS)
    codec = CODECS[sl.format]
    file_key, batch_key = _keys_for(sl, buf)
    seq = sl.seq
    # the one reader (a worker's RSS flat however big the slice), its batches sized by the
    # Arrow bytes of the ones before
    batches = scan(codec, buf, sl.path, sl.start, sl.seq, sl.stop, rows=lambda: batch_rows,
                   form="text")
    with contextlib.closing(batches):
        while True:
            try:
                cols = next(batches, None)
                error = cols.error if cols is not None else None
            except FormatError as exc:  # a codec may raise instead of reporting
                cols, error = None, exc.detached()
            except Exception as exc:  # a decoder bug on hostile bytes must not kill the job
                cols, error = None, FormatError(sl.path, sl.start or 0,
                                                f"decoder failed: {exc!r}")
            if cols is not None and cols.rows:
                if batch_key:
                    key = batch_key(cols.data)
                else:
                    key = file_key
                batch = to_batch(cols.data, cols.rows, sl.path, sl.format, first_seq=seq,
                                 key=key)
                row_bytes = max(1, batch.nbytes // batch.num_rows)
                batch_rows = max(1, min(max_rows, BATCH_BYTES // row_bytes))
                if batch.num_rows:
                    yield batch
                seq = cols.next_seq
            if error is not None:
                if include_damage:
                    yield damage_batch(sl.path, sl.format, seq, error.offset, error.reason)
                return
            if cols is None:
                return
