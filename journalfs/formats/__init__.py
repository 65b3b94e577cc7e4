"""Pure codecs, one module per format, behind the :class:`~journalfs.formats.base.Codec` interface."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import (ColumnMap, Codec, Columns, Finding, FormatError, Repair, json_safe,
                   record_json_line, record_to_json)
from .akka import AkkaData, AkkaMeta
from .gvfs_journal import GvfsJournal
from .gvfs_tree import GvfsTree
from .jrnl import Jrnl
from .kestrel import KestrelReader, KestrelWriter
from .sqlite_wal import SqliteWal
from .wallaby import WallabyIndex, WallabyLog

#: Every codec by its contract name, in the contract's order.
CODECS: dict[str, Codec] = {c.name: c for c in (
    GvfsTree(), GvfsJournal(), KestrelWriter(), KestrelReader(), AkkaMeta(), AkkaData(),
    WallabyLog(), WallabyIndex(), Jrnl(), SqliteWal(),
)}

#: How many leading bytes :func:`detect` needs.
SNIFF_BYTES = 64


def detect(head: bytes) -> Codec | None:
    """The codec whose magic starts ``head``, or None: detection is by content only."""
    for codec in CODECS.values():
        if codec.sniff(head):
            return codec
    return None


def record_offsets(codec: Codec, buf, source: str, start: int | None = None, seq: int = 0,
                   stop: int | None = None, limit: int | None = None
                   ) -> tuple[Sequence[int], int | None, FormatError | None]:
    """Where the records :meth:`Codec.read` yields start (up to ``limit``): (offsets, where a
    next call resumes or None, the damage that ended them). Through the codec's own
    ``record_offsets`` when it finds starts without decoding, else its ``read_columns``."""
    own = getattr(codec, "record_offsets", None)
    if own is not None:
        return own(buf, source, start, seq, stop, limit)
    cols = codec.read_columns(buf, source, start, seq, stop, limit)
    offsets = cols.data.get("offset", ())
    return (np.asarray(offsets[:cols.rows], dtype=np.int64), cols.next_offset, cols.error)


def splittable(codec: Codec) -> bool:
    """True when a big file of this format can be read as independent byte ranges."""
    return codec.resumable and (codec.in_file_order or codec.record_size is not None)


__all__ = ["CODECS", "SNIFF_BYTES", "ColumnMap", "Codec", "Columns", "Finding", "FormatError",
           "Repair", "detect", "json_safe", "record_json_line", "record_offsets",
           "record_to_json", "splittable"]
