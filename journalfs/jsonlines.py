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
            return JsonChunk(rendered, cols.rows, columns=cols)
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
#
# A batch is laid out as one byte matrix: a row per record, a block of columns per field, each
# block as wide as the field's longest text in the batch. Keys and values every row shares are
# one template row copied into every row; numbers are written four digits at a time as whole
# columns of 4-byte groups; payloads are base64 of a NUL-padded payload matrix, each row
# turning into its own 4-character groups. What a shorter value leaves of its block is NUL,
# and the NULs are deleted in one pass at the end: no JSON text holds a raw NUL (JSON escapes
# it, base64 and digits have none). Number and payload blocks start at multiples of 4 so
# that they are written as 32-bit words.

#: Batches smaller than this are written record by record (a dozen numpy calls per batch).
COLUMNS_MIN_ROWS = 16
#: A batch whose matrix would exceed both this many bytes and four times its payloads' text
#: is cut in halves (one huge payload among small ones must not make every row as wide).
MATRIX_SLACK_BYTES = 8 << 20


def _groups(lead_zero: bytes) -> np.ndarray:
    """4-character groups as 32-bit words: ``[0, 10000)`` every number zero-padded ("0042"),
    ``[10000, 20000)`` the leading group of a number, padded with NULs instead of zeros,
    whose value 0 reads ``lead_zero``."""
    full = b"".join(b"%04d" % i for i in range(10000))
    lead = b"".join((b"%4d" % i).replace(b" ", b"\0") for i in range(1, 10000))
    return np.frombuffer(full + lead_zero + lead, dtype=np.uint32)


#: The last group of a number (0 is "0"); every other group (0 is nothing).
_LOW_GROUPS = _groups(b"\0\0\0" + b"0")
_HIGH_GROUPS = _groups(b"\0\0\0\0")
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_BOOLS = np.frombuffer(b"\0\0\0false\0\0\0\0true", dtype=np.uint8).reshape(2, 8)


def render_columns(cols: Columns, order: list[str]) -> bytes | None:
    """Every row of ``cols`` as :func:`json_line` writes it, the fields in ``order`` (the
    first record's); None when some column has no exact vectorised spelling (or the batch is
    too small for it to pay)."""
    data, rows = cols.data, cols.rows
    if set(data) != set(order) or rows < COLUMNS_MIN_ROWS:
        return None
    return _render(data, order, 0, rows)


def _render(data: dict, order: list[str], lo: int, hi: int) -> bytes | None:
    """Rows ``lo .. hi-1`` (see :func:`render_columns`)."""
    blocks: list = []  # bytes (a literal) or a field writer, left to right
    text: list[str] = []
    for i, name in enumerate(order):
        payload = name == "payload"
        text.append(("{" if i == 0 else ", ")
                    + json.dumps("payload_b64" if payload else name, ensure_ascii=False) + ": ")
        field = _Base64.of(data[name], lo, hi) if payload else _field(data[name], lo, hi)
        if field is None:
            return None
        if isinstance(field, str):  # every row has this value: part of the template
            text.append(field)
            continue
        blocks.append("".join(text) + ('"' if payload else ""))
        blocks.append(field)
        text = ['"'] if payload else []
    blocks.append("".join(text) + "}\n")
    rows = hi - lo
    payloads = [b for b in blocks if isinstance(b, _Base64)]
    if rows > 1 and payloads:
        wide = rows * payloads[0].width
        if wide > max(MATRIX_SLACK_BYTES, 4 * int(payloads[0].groups.sum()) * 4):
            mid = (lo + hi) // 2
            head, tail = _render(data, order, lo, mid), _render(data, order, mid, hi)
            return None if head is None or tail is None else head + tail
    template = bytearray()
    places = []
    for block in blocks:
        if isinstance(block, str):
            try:
                template += block.encode("utf-8")
            except UnicodeEncodeError:
                return None  # text that is not UTF-8: only json_line writes it (as _b64)
            template += b"\0" * (-len(template) % 4)  # the next block starts at a word
        else:
            places.append((block, len(template)))
            template += bytes(block.width)
    matrix = np.empty((rows, len(template)), dtype=np.uint8)
    matrix[...] = np.frombuffer(template, dtype=np.uint8)
    words = matrix.view(np.uint32)
    try:
        for block, at in places:
            block.write(matrix, words, at)
    except (TypeError, ValueError):  # payloads that are not bytes: only json_line writes them
        return None
    return matrix.tobytes().translate(None, b"\0")


def _field(column, lo: int, hi: int):
    """The writer of one (non-payload) column's JSON texts for rows ``lo .. hi-1``, the one
    JSON text every row shares (a ``str``), or None when some value needs general JSON."""
    if isinstance(column, str):
        return json.dumps(column, ensure_ascii=False)
    if isinstance(column, np.ndarray):
        if column.dtype.kind in "iu":
            return _Integers.of(column, lo, hi)
        if column.dtype.kind == "b" and not isinstance(column, np.ma.MaskedArray):
            return _Bools(column[lo:hi])
    if isinstance(column, (list, np.ndarray)) and isinstance(column[lo], str):
        head, part = column[lo], column[lo:hi]
        shared = bool((part == head).all()) if isinstance(part, np.ndarray) \
            else part.count(head) == hi - lo
        return json.dumps(head, ensure_ascii=False) if shared else None
    return None


class _Integers:
    """Decimal integers (null where masked), right-aligned in their block, four digits per
    step: the division is the costly part, and a 4-character group is one word."""

    def __init__(self, magnitude: np.ndarray, negative: np.ndarray | None,
                 null: np.ndarray | None):
        self.magnitude, self.negative, self.null = magnitude, negative, null
        digits = len(str(int(magnitude.max()))) if len(magnitude) else 1
        self.words = -(-(digits + (negative is not None)) // 4)
        self.width = 4 * self.words

    @classmethod
    def of(cls, column: np.ndarray, lo: int, hi: int) -> "_Integers":
        null = None
        if isinstance(column, np.ma.MaskedArray):
            null = np.ma.getmaskarray(column)[lo:hi]
            values = column.data[lo:hi]
            null = null if null.any() else None
        else:
            values = column[lo:hi]
        negative = None
        if values.dtype.kind == "i":
            magnitude = values.astype(np.int64).view(np.uint64)  # a copy, changed below
            below = values < 0
            if below.any():
                negative = below
                magnitude[below] = np.negative(magnitude[below])  # two's complement: |v|
        else:
            magnitude = values.astype(np.uint64)
        if null is not None:
            magnitude[null] = 0
            negative = None if negative is None or not (negative & ~null).any() \
                else negative & ~null
        if int(magnitude.max(initial=0)) < 1 << 63:  # int64 divides faster than uint64
            magnitude = magnitude.view(np.int64)
        return cls(magnitude, negative, null)

    def write(self, matrix: np.ndarray, words: np.ndarray, at: int) -> None:
        col = at // 4 + self.words - 1
        rest = self.magnitude
        step = rest.dtype.type(10000)
        for k in range(self.words):
            high = rest // step
            group = rest - high * step
            group += (high == 0) * step  # the leading group: no zeros before it
            words[:, col - k] = (_LOW_GROUPS if k == 0 else _HIGH_GROUPS)[group]
            rest = high
        end = at + self.width
        if self.negative is not None:
            rows = np.flatnonzero(self.negative)
            digits = np.array([len(str(int(v))) for v in self.magnitude[rows]], dtype=np.int64)
            matrix[rows, end - 1 - digits] = ord("-")
        if self.null is not None:
            rows = np.flatnonzero(self.null)
            matrix[rows, at:end] = 0
            matrix[rows, end - 4:end] = _NULL


class _Bools:
    width = 8

    def __init__(self, values: np.ndarray):
        self.values = values

    def write(self, matrix: np.ndarray, words: np.ndarray, at: int) -> None:
        matrix[:, at:at + 8] = _BOOLS[self.values.astype(np.intp)]


class _Base64:
    """Payloads' base64 (the quotes are the template's): the batch's payloads NUL-padded into
    one matrix whose rows are whole 3-byte groups, base64 of all of it at once, the groups
    past each payload's end blanked, each one's last group given its ``=`` padding."""

    def __init__(self, items: list, sizes: np.ndarray):
        self.items, self.sizes = items, sizes
        self.groups = -(-sizes // 3)
        self.count = max(1, int(self.groups.max()))  # groups of the longest payload
        self.width = 4 * self.count

    @classmethod
    def of(cls, column, lo: int, hi: int) -> "_Base64 | None":
        items = column[lo:hi]
        if not isinstance(items, list):
            items = list(items)
        try:
            sizes = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        except TypeError:  # a null payload: only json_line writes it
            return None
        return cls(items, sizes)

    def write(self, matrix: np.ndarray, words: np.ndarray, at: int) -> None:
        rows, count = len(self.items), self.count
        # packed only now: the caller first checked the matrix's size (see _render)
        packed = np.array(self.items, dtype=f"S{3 * count}")
        if packed.dtype.kind != "S" or packed.shape != (rows,):
            raise TypeError("payloads must be bytes")
        text = np.frombuffer(binascii.b2a_base64(packed, newline=False), dtype=np.uint32)
        np.multiply(text.reshape(rows, count), np.arange(count) < self.groups[:, None],
                    out=words[:, at // 4:at // 4 + count])
        last = at + 4 * self.groups - 1
        short = self.sizes % 3  # 1 byte past a whole group: "==", 2 bytes: "="
        for rows_hit, pads in ((np.flatnonzero(short == 1), 2), (np.flatnonzero(short == 2), 1)):
            for k in range(pads):
                matrix[rows_hit, last[rows_hit] - k] = ord("=")


__all__ = ["EMPTY", "JsonChunk", "columns_chunk", "has_columns", "json_chunk", "json_line",
           "records_chunk", "render_columns"]
