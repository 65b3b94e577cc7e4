"""Pure codecs, one module per format, behind the :class:`~journalfs.formats.base.Codec` interface."""
from __future__ import annotations

from .base import (SCAN_FORMS, SCAN_ROWS, ColumnMap, Codec, Columns, Finding, FormatError,
                   Repair, json_safe, record_json_line, record_to_json)
from .akka import AkkaData, AkkaMeta
from .gvfs_journal import GvfsJournal
from .gvfs_tree import GvfsTree
from .jrnl import Jrnl
from .kestrel import KestrelReader, KestrelWriter
from .wallaby import WallabyIndex, WallabyLog

#: Every codec by its contract name, in the contract's order.
CODECS: dict[str, Codec] = {c.name: c for c in (
    GvfsTree(), GvfsJournal(), KestrelWriter(), KestrelReader(), AkkaMeta(), AkkaData(),
    WallabyLog(), WallabyIndex(), Jrnl(),
)}

#: How many leading bytes :func:`detect` needs.
SNIFF_BYTES = 64


def detect(head: bytes) -> Codec | None:
    """The codec whose magic starts ``head``, or None: detection is by content only."""
    for codec in CODECS.values():
        if codec.sniff(head):
            return codec
    return None


def splittable(codec: Codec) -> bool:
    """True when a big file of this format can be read as independent byte ranges."""
    return codec.resumable and (codec.in_file_order or codec.record_size is not None)


__all__ = ["CODECS", "SCAN_FORMS", "SCAN_ROWS", "SNIFF_BYTES", "ColumnMap", "Codec", "Columns",
           "Finding", "FormatError", "Repair", "detect", "json_safe", "record_json_line",
           "record_to_json", "splittable"]
