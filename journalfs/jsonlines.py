"""JSON lines of records: the one renderer behind `journalfs records --json` and the views'
``records.jsonl``.

Every line is exactly :func:`journalfs.formats.record_json_line` of one record plus ``\\n``
(:func:`json_line`, the reference). Batches of records a codec decodes as columns are
rendered from the columns by vectorised kernels (:func:`render_columns`); a batch they
cannot write exactly (a field some records lack, text that varies per record or is not
UTF-8, floats, lists, null payloads) is written record by record.
"""
from __future__ import annotations

import binascii
import contextlib
import json
from typing import Iterator

import numpy as np

from .formats import Codec, FormatError
from .formats.base import Columns, Record, record_json_line

def json_line(rec: Record) -> bytes:
    """One line of `journalfs records --json` (with its newline) as UTF-8 bytes; the reference
    every other way of rendering is held to. (``record_json_line`` already writes text that
    is not UTF-8 as ``<field>_b64``, so the encoding cannot fail.)"""
    return (record_json_line(rec) + "\n").encode("utf-8")


class JsonChunk:
    """JSON lines of consecutive records, with what a directory listing needs of each (worked
    out only when asked: streaming readers never need it)."""

    def __init__(self, data: bytes, rows: int, kinds: list[str] | None = None,
                 payload_sizes: list[int | None] | None = None,
                 lengths: np.ndarray | None = None, columns: Columns | None = None):
        self.data, self.rows = data, rows
        self._kinds, self._payload_sizes = kinds, payload_sizes
        #: each line's length, when the renderer knew them already
        self.lengths = lengths
        self._columns = columns
        #: the damage that ended a chunk rendered record by record (see records_chunk)
        self.error: FormatError | None = None

    @property
    def kinds(self) -> list[str]:
        if self._kinds is None:
            kinds = self._columns.data["kind"] if self._columns is not None else []
            self._kinds = ([kinds] * self.rows if isinstance(kinds, str)
                           else list(kinds[:self.rows]))
        return self._kinds

    @property
    def payload_sizes(self) -> list[int | None] | None:
        """Per record: its payload's length (its record file holds the payload), or None when
        it has no payload field (its record file holds its JSON line); None: no payloads."""
        if self._payload_sizes is None and self._columns is not None:
            payloads = self._columns.data.get("payload")
            if payloads is not None:
                self._payload_sizes = [0 if p is None else len(p) for p in payloads[:self.rows]]
        return self._payload_sizes

    def line_lengths(self) -> np.ndarray:
        if self.lengths is None:
            ends = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == 10) + 1
            self.lengths = np.diff(ends, prepend=0)
        return self.lengths

    def content_sizes(self) -> list[int]:
        """The size of every record's file: payload length, else JSON line length."""
        lines = self.line_lengths().tolist()
        sizes = self.payload_sizes
        if sizes is None:
            return lines
        return [line if p is None else p for line, p in zip(lines, sizes)]


EMPTY = JsonChunk(b"", 0, [], None)


def has_columns(codec: Codec) -> bool:
    """True when ``codec`` decodes columns its own (vectorised) way; the generic
    ``read_columns`` is :meth:`Codec.read` plus a dict per record, and those records are
    rendered straight from :meth:`Codec.read`."""
    return type(codec).read_columns is not Codec.read_columns


def json_chunk(codec: Codec, buf, path: str, start: int | None, seq: int, count: int,
               stop: int | None = None) -> JsonChunk:
    """The JSON lines of up to ``count`` records of ``buf`` from record ``seq`` at ``start``
    (decoding stops before ``stop``); stops silently at damage (callers learn of it from
    their index, or from :func:`columns_chunk`'s caller)."""
    if has_columns(codec):
        cols = codec.read_columns(buf, path, start, seq, stop, count)
        if not cols.rows:
            return EMPTY
        end = cols.next_offset if cols.error is None else cols.error.offset
        return columns_chunk(codec, buf, path, cols, start, seq, end)
    with contextlib.closing(codec.read(buf, path, start, seq, stop)) as records:
        return records_chunk(records, count)


def columns_chunk(codec: Codec, buf, path: str, cols: Columns, start: int | None, seq: int,
                  stop: int | None) -> JsonChunk:
    """The JSON lines of the records ``cols`` holds (decoded from record ``seq`` at ``start``;
    the next record, if any, starts at ``stop``): rendered from the columns, or, when they
    cannot be written exactly that way, decoded again one by one over the same bytes."""
    it = codec.read(buf, path, start, seq, stop)
    try:
        first = next(it, None)
    except FormatError:
        first = None
    finally:
        it.close()
    if first is not None:
        rendered = render_columns(cols, list(first))
        if rendered is not None:
            return JsonChunk(rendered[0], cols.rows, lengths=rendered[1], columns=cols)
    with contextlib.closing(codec.read(buf, path, start, seq, stop)) as records:
        return records_chunk(records, cols.rows)


def records_chunk(records: Iterator[Record], count: int) -> JsonChunk:
    """The next ``count`` of ``records`` (or fewer: their end), one by one -- the reference
    rendering. A :class:`FormatError` ends the chunk after the records before it and is kept
    in its ``error``. ``records`` stays open: a following call goes on with it."""
    lines, kinds, sizes = [], [], []
    error = None
    if count > 0:
        try:
            for rec in records:
                lines.append(json_line(rec))
                kinds.append(rec["kind"])
                sizes.append(len(rec["payload"] or b"") if "payload" in rec else None)
                if len(lines) == count:
                    break
        except FormatError as exc:
            error = exc
    chunk = JsonChunk(b"".join(lines), len(lines), kinds,
                      sizes if any(v is not None for v in sizes) else None)
    chunk.error = error
    return chunk


# -- the columnar renderer -----------------------------------------------------------------------

#: Batches smaller than this are written record by record: Arrow's fixed cost per call
#: (a dozen kernels per batch) only pays off on more rows.
COLUMNS_MIN_ROWS = 64


def render_columns(cols: Columns, order: list[str]) -> tuple[bytes, np.ndarray] | None:
    """(every row of ``cols`` as :func:`json_line` writes it, each line's length), the fields
    in ``order`` (the first record's); None when some column has no exact vectorised
    spelling (or the batch is too small to be worth it).

    Numbers become text through Arrow's casts, payloads through one base64 pass over all of
    them (:func:`_base64_texts`), and each row's line is joined by one Arrow kernel; no
    Python object is made per record but for a payload's padding."""
    data, rows = cols.data, cols.rows
    if set(data) != set(order) or rows < COLUMNS_MIN_ROWS:
        return None
    import pyarrow as pa  # only here: small outputs never pay for loading Arrow
    import pyarrow.compute as pc

    args: list = []
    literal: list[str] = []
    try:
        for i, name in enumerate(order):
            key = "payload_b64" if name == "payload" else name
            literal.append(("{" if i == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
            value = _spelling(pa, pc, data[name], rows, name == "payload")
            if value is None:
                return None
            if isinstance(value, str):
                literal.append(value)
                continue
            if name == "payload":
                literal.append('"')
            args.append("".join(literal))
            literal = ['"'] if name == "payload" else []
            args.append(value)
        literal.append("}\n")
        args.append("".join(literal))
        if not any(isinstance(a, pa.Array) for a in args):
            return None
        for a in args:
            if isinstance(a, str):
                a.encode("utf-8")  # a shared text that is not UTF-8 is only json_line's
        joined = pc.binary_join_element_wise(*args, "")
    except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeEncodeError):
        return None
    if joined.null_count:
        return None
    offsets, values = joined.buffers()[1:3]
    ends = np.frombuffer(offsets, dtype=np.int32, count=rows + 1, offset=joined.offset * 4)
    return memoryview(values)[int(ends[0]):int(ends[-1])].tobytes(), np.diff(ends)


def _spelling(pa, pc, column, rows: int, payload: bool):
    """One column as an Arrow string array of JSON texts (payloads: the base64 text, without
    its quotes), or the one JSON text every row shares (a ``str``); None when some value
    needs general JSON encoding."""
    if payload:
        return _base64_texts(pa, column, rows)
    if isinstance(column, str):
        return json.dumps(column, ensure_ascii=False)
    if isinstance(column, np.ndarray) and column.dtype.kind in "iub":
        if isinstance(column, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(column)[:rows]
            arr = pa.array(column.data[:rows], mask=mask if mask.any() else None)
            return pc.fill_null(arr.cast(pa.string()), "null")
        return pa.array(column[:rows]).cast(pa.string())
    if isinstance(column, (list, np.ndarray)) and isinstance(column[0], str):
        head, part = column[0], column[:rows]
        shared = bool((part == head).all()) if isinstance(part, np.ndarray) \
            else part.count(head) == rows
        return json.dumps(head, ensure_ascii=False) if shared else None
    return None


#: What makes a payload of ``len % 3`` bytes a whole number of 3-byte groups.
_PADDING = np.array([b"", b"\0\0", b"\0"], dtype=object)


def _base64_texts(pa, column, rows: int):
    """The base64 text of every payload as one Arrow string array: the payloads, each
    NUL-padded to whole 3-byte groups, go through one base64 pass (each payload then turns
    into its own 4-character groups), and each one's last group gets its ``=`` padding."""
    items = column[:rows]
    if not isinstance(items, list):
        items = list(items)
    try:
        sizes = np.fromiter(map(len, items), dtype=np.int64, count=rows)
        padded = b"".join(map(bytes.__add__, items, _PADDING[sizes % 3].tolist()))
    except TypeError:  # a null payload (or not bytes): only json_line writes it
        return None
    text = np.frombuffer(binascii.b2a_base64(padded, newline=False), dtype=np.uint8).copy()
    ends = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(-(-sizes // 3) * 4, out=ends[1:])
    short = sizes % 3
    one, two = ends[1:][short == 1], ends[1:][short == 2]
    text[one - 1] = text[one - 2] = text[two - 1] = ord("=")
    if ends[-1] >= 1 << 31:
        return None
    return pa.StringArray.from_buffers(rows, pa.py_buffer(ends.astype(np.int32)),
                                       pa.py_buffer(text))


__all__ = ["EMPTY", "JsonChunk", "columns_chunk", "has_columns", "json_chunk", "json_line",
           "records_chunk", "render_columns"]
