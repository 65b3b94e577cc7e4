"""JSON lines of records: the one renderer behind `journalfs records --json` and the views'
``records.jsonl``.

Every line is exactly :func:`journalfs.formats.record_json_line` of one record plus ``\\n``
(:func:`json_line`, the reference). Batches of records a codec decodes as columns are
rendered from the columns by vectorised kernels (:func:`render_columns`): integers, booleans
and payloads with no Python object per row, texts that vary per row with one encoding each
(escapes checked for the whole batch at once), other values (lists, objects, floats) with one
``json.dumps`` each, the rest of the row staying vectorised. A batch they cannot write exactly (a field some records lack, text that is not
UTF-8, null payloads) is written record by record.
"""
from __future__ import annotations

import binascii
import contextlib
import ctypes
import json
import threading
from typing import Callable, Iterator

import numpy as np

from .formats import Codec, FormatError
from .formats.base import (Base64Bytes, Columns, IntLists, Record, RecordLists, json_safe,
                          record_json_line, rows_of_batches)
from .options import PAYLOAD_MODES  # defined with the other command-line choices


def json_line(rec: Record) -> bytes:
    """One line of `journalfs records --json` (with its newline) as UTF-8 bytes; the reference
    every other way of rendering is held to. (``record_json_line`` already writes text that
    is not UTF-8 as ``<field>_b64``, so the encoding cannot fail.)"""
    return (record_json_line(rec) + "\n").encode("utf-8")




def payload_fields(payload, mode: str) -> dict:
    """The JSON field (name and value) that shows ``payload`` in ``mode``."""
    if payload is None:
        return {"payload_b64": None}
    data = bytes(payload)
    if mode == "hex":
        return {"payload_hex": data.hex()}
    if mode in ("auto", "text"):
        try:
            return {"payload": data.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"payload_b64": binascii.b2a_base64(data, newline=False).decode("ascii")}


def record_line(rec: Record, payload: str = "base64", source: str | None = None) -> str:
    """One JSON line (no newline) of ``rec`` with its payload shown as ``payload`` says
    (:data:`PAYLOAD_MODES`) and, when given, the file it comes from first as ``source``
    (a record field of that name then as ``<kind>_source``);
    with the defaults exactly :func:`journalfs.formats.record_json_line`."""
    if payload == "base64" and source is None:
        return record_json_line(rec)
    out: dict = {} if source is None else {"source": source}
    for name, value in rec.items():
        if name == "payload":
            out.update(payload_fields(value, payload))
        elif name == "source" and source is not None:
            # a record's own ``source`` field (gvfs-journal ``copy``) beside the file's: both
            # kept, the record's under its kind's name (docs/contract.md)
            out[f"{rec.get('kind', 'record')}_source"] = value
        else:
            out[name] = value
    safe = json_safe(out)
    return json.dumps(safe, ensure_ascii=False, separators=(", ", ": "))


class JsonChunk:
    """JSON lines of consecutive records, with what a directory listing needs of each (worked
    out only when asked: streaming readers never need it)."""

    def __init__(self, data: bytes, rows: int, kinds: list[str] | None = None,
                 payload_sizes: list[int | None] | None = None,
                 lengths: np.ndarray | None = None, columns: Columns | None = None,
                 measure: Callable[[], np.ndarray] | None = None):
        self.data, self.rows = data, rows
        self._kinds, self._payload_sizes = kinds, payload_sizes
        #: each line's length, when the renderer knew them already
        self.lengths = lengths
        self._columns = columns
        self._measure = measure  # the renderer's way to each line's length (no scan)
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
        if self.lengths is None and self._measure is not None:
            self.lengths = self._measure()
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


def json_chunk(codec: Codec, buf, path: str, start: int | None, seq: int, count: int,
               stop: int | None = None) -> JsonChunk:
    """The JSON lines of up to ``count`` records of ``buf`` from record ``seq`` at ``start``
    (decoding stops before ``stop``); stops silently at damage (callers learn of it from
    their index, or from :func:`columns_chunk`'s caller)."""
    if not codec.resumable:  # from its start: the batches before record ``seq`` walked
        return _batches_chunk(codec, buf, path, seq, count)
    if codec.columnar:
        cols = codec.read_columns(buf, path, start, seq, stop, count)
        if not cols.rows:
            return EMPTY
        end = cols.next_offset if cols.error is None else cols.error.offset
        return columns_chunk(codec, buf, path, cols, start, seq, end)
    with contextlib.closing(codec.read(buf, path, start, seq, stop)) as records:
        return records_chunk(records, count)


#: Rows rendered at a time from a codec's column batches.
RENDER_ROWS = 16384


def _batches_chunk(codec: Codec, buf, path: str, first: int, count: int) -> JsonChunk:
    """The JSON lines of records ``first .. first+count-1`` of a codec that cannot resume
    mid-file, from its :meth:`~Codec.scan`: the batches before them walked, not rendered;
    no columns of the whole file held."""
    parts: list[bytes] = []
    kinds: list[str] = []
    with contextlib.closing(codec.scan(buf, path, rows=RENDER_ROWS)) as batches:
        for cols, lo, hi in rows_of_batches(batches, first, first + count):
            parts.append(bytes(render_rows(cols, list(cols.data), lo, hi)))
            column = cols.data["kind"]
            kinds += [column] * (hi - lo) if isinstance(column, str) else list(column[lo:hi])
    return JsonChunk(b"".join(parts), len(kinds), kinds) if kinds else EMPTY


def columns_chunk(codec: Codec, buf, path: str, cols: Columns, start: int | None, seq: int,
                  stop: int | None) -> JsonChunk:
    """The JSON lines of the records ``cols`` holds (decoded from record ``seq`` at ``start``;
    the next record, if any, starts at ``stop``): rendered from the columns, or, when they
    cannot be written exactly that way, decoded again one by one over the same bytes. A
    codec that cannot resume mid-file has its columns in its records' field order, and they
    are rendered as they are."""
    if not codec.resumable:
        return JsonChunk(bytes(render_rows(cols, list(cols.data), 0, cols.rows)), cols.rows,
                         columns=cols)
    first = _first_record(codec, buf, path, start, seq, stop)
    if first is not None:
        rendered = render_columns_measured(cols, list(first))
        if rendered is None:
            rendered = _render_by_kind(codec, buf, path, cols, seq, stop)
        if rendered is not None:
            return JsonChunk(rendered[0], cols.rows, columns=cols, measure=rendered[1])
    with contextlib.closing(codec.read(buf, path, start, seq, stop)) as records:
        return records_chunk(records, cols.rows)


def _first_record(codec: Codec, buf, path: str, start: int | None, seq: int,
                  stop: int | None) -> Record | None:
    """The record at ``start`` as :meth:`Codec.read` gives it (its fields, in their order);
    None at the end or at damage."""
    it = codec.read(buf, path, start, seq, stop)
    try:
        return next(it, None)
    except FormatError:
        return None
    finally:
        it.close()


def _render_by_kind(codec: Codec, buf, path: str, cols: Columns, seq: int, stop: int | None
                    ) -> tuple[bytes, Callable[[], np.ndarray]] | None:
    """A batch whose kinds of record carry different fields (kestrel-reader's ``read_head``
    and ``read_done``): each kind's rows rendered with that kind's fields (taken from its first
    record, decoded again), the lines then put back in file order. None when that does not
    work either (a field some records of one kind lack, text that is not UTF-8 ...)."""
    kinds = cols.data.get("kind")
    if kinds is None or isinstance(kinds, str) or cols.rows < 2 * COLUMNS_MIN_ROWS:
        return None
    labels = np.asarray(kinds, dtype=object)
    names = list(dict.fromkeys(kinds))
    if len(names) < 2 or len(names) > 8:
        return None
    offsets = cols.data["offset"]
    parts, lengths, group_of = [], [], np.empty(cols.rows, dtype=np.intp)
    for g, name in enumerate(names):
        rows = np.flatnonzero(labels == name)
        group_of[rows] = g
        first = _first_record(codec, buf, path, int(offsets[rows[0]]), seq + int(rows[0]), stop)
        if first is None or first.get("kind") != name:
            return None
        order = list(first)
        data = {field: _take(cols.data[field], rows) for field in order
                if field in cols.data}
        rendered = render_columns_measured(Columns(data, len(rows), None, 0), order) \
            if len(data) == len(order) else None
        if rendered is None:
            return None
        parts.append(rendered[0])
        lengths.append(rendered[1]())
    # where each group's lines start in the joined groups, then every line in file order
    starts = []
    base = 0
    for part, lens in zip(parts, lengths):
        starts.append(base + np.concatenate(([0], np.cumsum(lens)[:-1])))
        base += len(part)
    line_start = np.empty(cols.rows, dtype=np.int64)
    line_len = np.empty(cols.rows, dtype=np.int64)
    for g in range(len(names)):
        rows = group_of == g
        line_start[rows], line_len[rows] = starts[g], lengths[g]
    joined = b"".join(parts)
    # one slice per line: an index per byte (numpy's gather) would take 8 bytes per byte
    ends = (line_start + line_len).tolist()
    return b"".join([joined[a:b] for a, b in zip(line_start.tolist(), ends)]), \
        lambda: line_len


def _take(column, rows: np.ndarray):
    """``column`` (a numpy array, a list, a per-batch constant, a built-on-access column)
    for the rows ``rows`` only."""
    if isinstance(column, str):
        return column
    if isinstance(column, (np.ndarray, IntLists)):
        return column[rows] if isinstance(column, np.ndarray) else column.take(rows)
    taken = [column[i] for i in rows.tolist()]
    return Base64Bytes(taken) if isinstance(column, Base64Bytes) else taken


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
            error = exc.detached()
    chunk = JsonChunk(b"".join(lines), len(lines), kinds,
                      sizes if any(v is not None for v in sizes) else None)
    chunk.error = error
    return chunk


#: glibc's mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: What glibc may keep of freed memory (per arena) while batches stream: about two batches'
#: buffers (a 16,384-record batch peaks at ~20 MB); what is kept stays resident.
KEPT_FREE_BYTES = 32 << 20
_heap_kept = threading.Lock()


def keep_freed_memory() -> None:
    """Let glibc keep the big buffers each rendered batch frees, for the next batch. By
    default it hands them back to the kernel after every batch (they are larger than its trim
    threshold) and the next batch faults every page in again: a quarter to a third of the
    rendering time. What is kept is bounded by KEPT_FREE_BYTES per arena. Process-wide, so
    called by what streams many batches (``records --json``, ``records.jsonl``), once; a
    no-op without glibc."""
    if not _heap_kept.acquire(blocking=False):
        return  # done already
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, KEPT_FREE_BYTES)
    mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES)


# -- the columnar renderer -----------------------------------------------------------------------
#
# A batch is laid out as one byte matrix: a row per record, a block of columns per field, each
# block as wide as the field's longest text in the batch. Keys and values every row shares are
# one template row copied into every row; numbers are written four digits at a time as 4-byte
# groups (right-aligned); payloads are base64 of a NUL-padded payload matrix, each row turning
# into its own 4-character groups; texts that vary per row are packed NUL-padded. What a
# shorter value leaves of its block is NUL, and the NULs are deleted in one pass at the end:
# no JSON text holds a raw NUL (JSON escapes it, base64 and digits have none). A batch whose
# every block is full in every row (same digit counts, equal payload sizes: common in big
# journals) has no NUL at all and skips that pass.

#: Batches smaller than this are written record by record (a dozen numpy calls per batch).
COLUMNS_MIN_ROWS = 16
#: A batch whose matrix would exceed both this many bytes and four times its variable texts
#: is cut in halves (one huge payload among small ones must not make every row as wide).
MATRIX_SLACK_BYTES = 8 << 20


def _groups(lead_zero: bytes) -> np.ndarray:
    """4-character groups as 32-bit words: ``[0, 10000)`` every number zero-padded ("0042"),
    ``[10000, 20000)`` the leading group of a number, padded with NULs instead of zeros,
    whose value 0 reads ``lead_zero``. (Built with numpy: a CLI run pays for it at start.)"""
    values = np.arange(10000)
    chars = (values[:, None] // np.array([1000, 100, 10, 1]) % 10 + ord("0")).astype(np.uint8)
    lead = chars.copy()
    digits = 1 + (values >= 10) + (values >= 100) + (values >= 1000)
    lead[np.arange(4) < 4 - digits[:, None]] = 0
    lead[0] = np.frombuffer(lead_zero, dtype=np.uint8)
    return np.concatenate([chars, lead]).view(np.uint32).ravel()


#: The last group of a number (0 is "0"); every other group (0 is nothing).
_LOW_GROUPS = _groups(b"\0\0\0" + b"0")
_HIGH_GROUPS = _groups(b"\0\0\0\0")
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_BOOLS = np.frombuffer(b"false\0true", dtype=np.uint8).reshape(2, 5)
_POWERS = np.array([10 ** k for k in range(1, 20)], dtype=np.uint64)


def render_rows(cols: Columns, order: list[str], lo: int, hi: int) -> bytes | bytearray:
    """The JSON lines of rows ``lo .. hi-1`` of ``cols``, whose fields are in ``order`` (the
    records' own): from the columns where they can be written exactly that way, else record
    by record from the columns' values. For columns of a whole file rendered a window at a
    time (a gvfs tree cannot resume mid-file)."""
    data = cols.data
    if hi - lo >= COLUMNS_MIN_ROWS and set(data) == set(order):
        rendered = _render(data, order, lo, hi)
        if rendered is not None:
            return rendered[0]
    values = [_row_values(data[name], lo, hi) for name in order]
    return b"".join(json_line(dict(zip(order, row))) for row in zip(*values))


def _row_values(column, lo: int, hi: int) -> list:
    """Rows ``lo .. hi-1`` of ``column`` as Python values."""
    if isinstance(column, str):
        return [column] * (hi - lo)
    part = column[lo:hi]
    return part.tolist() if hasattr(part, "tolist") else list(part)


def render_columns(cols: Columns, order: list[str]) -> bytes | bytearray | None:
    """Every row of ``cols`` as :func:`json_line` writes it, the fields in ``order`` (the
    first record's); None when some column has no exact vectorised spelling (or the batch is
    too small for it to pay)."""
    rendered = render_columns_measured(cols, order)
    return None if rendered is None else rendered[0]


def render_columns_measured(cols: Columns, order: list[str]
                            ) -> tuple[bytes | bytearray, Callable[[], np.ndarray]] | None:
    """:func:`render_columns`, and a function giving each line's length (from the columns:
    cheaper than looking for the newlines)."""
    data, rows = cols.data, cols.rows
    if set(data) != set(order) or rows < COLUMNS_MIN_ROWS:
        return None
    return _render(data, order, 0, rows)


def _render(data: dict, order: list[str], lo: int, hi: int
            ) -> tuple[bytes | bytearray, Callable[[], np.ndarray]] | None:
    """Rows ``lo .. hi-1`` and their lengths (see :func:`render_columns_measured`)."""
    fields: list = []  # (text before the field, its writer), left to right
    text: list[str] = []
    for i, name in enumerate(order):
        payload = name == "payload"
        text.append(("{" if i == 0 else ", ")
                    + json.dumps("payload_b64" if payload else name, ensure_ascii=False) + ": ")
        field = (_Base64.of(data[name], lo, hi)
                 if payload or isinstance(data[name], Base64Bytes) else _field(data[name], lo, hi))
        if field is None:
            return None
        if isinstance(field, str):  # every row has this value: part of the template
            text.append(field)
            continue
        fields.append(("".join(text) + ('"' if field.quoted else ""), field))
        text = ['"'] if field.quoted else []
    tail = "".join(text) + "}\n"
    rows = hi - lo
    packed = [f for _, f in fields if isinstance(f, _Packed)]
    if rows > 1 and packed:
        wide = rows * sum(f.width for f in packed)
        if wide > max(MATRIX_SLACK_BYTES, 4 * sum(f.content for f in packed)):
            mid = (lo + hi) // 2
            head, rest = _render(data, order, lo, mid), _render(data, order, mid, hi)
            if head is None or rest is None:
                return None
            return head[0] + rest[0], lambda: np.concatenate([head[1](), rest[1]()])
    # Every block full in every row: the rows need no NUL, hence no deleting pass. Otherwise
    # blocks written as 32-bit words start at multiples of 4 (the NULs before them go too).
    full = all(f.full for _, f in fields)
    template = bytearray()
    places = []
    try:
        for before, field in fields:
            template += before.encode("utf-8")
            prefix = field.prefix(not full)
            if prefix:
                template += prefix.encode("utf-8")
            if not full and field.words:
                template += b"\0" * (-len(template) % 4)
            places.append((field, len(template)))
            template += bytes(field.size(not full))
        template += tail.encode("utf-8")
        if not full:  # every row starts at a multiple of 4 too
            template += b"\0" * (-len(template) % 4)
    except UnicodeEncodeError:
        return None  # text that is not UTF-8: only json_line writes it (as _b64)
    width = len(template)
    out = bytearray(rows * width)
    matrix = np.frombuffer(out, dtype=np.uint8).reshape(rows, width)
    matrix[...] = np.frombuffer(template, dtype=np.uint8)
    try:
        for field, at in places:
            field.write(matrix, at, not full)
    except (TypeError, ValueError):  # payloads that are not bytes: only json_line writes them
        return None
    del matrix  # releases ``out``'s buffer

    def measure() -> np.ndarray:
        text = np.count_nonzero(np.frombuffer(template, dtype=np.uint8))
        lengths = np.full(rows, text, dtype=np.int64)
        for field, _at in places:
            lengths += field.lengths(not full)
        return lengths
    return (out if full else out.translate(None, b"\0")), measure


def _field(column, lo: int, hi: int):
    """The writer of one (non-payload) column's JSON texts for rows ``lo .. hi-1``, the one
    JSON text every row shares (a ``str``), or None when some value needs general JSON."""
    if isinstance(column, str):
        return json.dumps(column, ensure_ascii=False)
    spelt = getattr(column, "json_spelling", None)  # a codec's column that spells its rows
    if spelt is not None and (spelling := spelt(lo, hi)) is not None:
        return spelling if isinstance(spelling, str) else _Packed(*spelling)
    if isinstance(column, np.ndarray) and column.dtype.kind not in "OU":
        if column.dtype.kind in "iu":
            return _Integers.of(column, lo, hi)
        if column.dtype.kind == "b" and not isinstance(column, np.ma.MaskedArray):
            values = column[lo:hi]
            if values.all() or not values.any():  # one value in every row
                return "true" if values[0] else "false"
            return _Bools(values)
        return None  # floats, masked bools...: json_line's spelling
    if isinstance(column, IntLists):
        return _int_lists(column, lo, hi)
    if isinstance(column, RecordLists):
        return _record_lists(column, lo, hi)
    part = column[lo:hi]
    if not isinstance(part, list):
        part = list(part)
    head = part[0]
    if type(head) is str and part.count(head) == len(part):  # one text in every row
        return json.dumps(head, ensure_ascii=False)
    types = set(map(type, part))
    if types == {str}:
        return _Packed.texts(part)
    if types == {int}:
        try:
            return _Integers.of(np.array(part, dtype=np.int64 if min(part) < 0 else np.uint64),
                                0, len(part))
        except OverflowError:
            return None
    if type(None) in types:  # a field some records lack (generic read_columns): not exact
        return None
    return _Packed.values(part)


def _int_lists(column: IntLists, lo: int, hi: int) -> "_Packed | None":
    """Rows ``lo .. hi-1`` of a column of integer lists as json.dumps spells them
    (``[1, 2, 3]``): every number of the rows written at once by :class:`_Integers` into a
    matrix with a row per number, each row framed by the ``, `` or ``[`` before it and the
    ``]`` after the last of its list, then the NULs deleted and the text cut per list. None
    when some row has no list (a field some records lack)."""
    part = column.take(np.arange(lo, hi))
    if part.missing is not None:
        return None
    values, bounds = part.contiguous()
    counts = np.diff(bounds)
    if not len(values):
        return _Packed([b"[]"] * (hi - lo), False)
    numbers = _Integers.of(values, 0, len(values))
    if isinstance(numbers, str):  # one number in every list
        body, width = numbers.encode(), len(numbers)
    else:
        body = numbers.prefix(False).encode()
        width = len(body) + numbers.size(False)
    framed = np.zeros((len(values), 2 + width + 1), dtype=np.uint8)
    framed[:, :2] = np.frombuffer(b", ", dtype=np.uint8)
    if body:
        framed[:, 2:2 + len(body)] = np.frombuffer(body, dtype=np.uint8)
    if not isinstance(numbers, str):
        numbers.write(framed, 2 + len(body), False)
    listed = counts > 0
    framed[bounds[:-1][listed], 0] = 0
    framed[bounds[:-1][listed], 1] = ord("[")
    framed[bounds[1:][listed] - 1, -1] = ord("]")
    text = framed.tobytes().translate(None, b"\0")
    digits = (np.full(len(values), width, dtype=np.int64) if isinstance(numbers, str)
              else len(body) + np.asarray(numbers.lengths(False), dtype=np.int64)
              * np.ones(len(values), dtype=np.int64))
    summed = np.concatenate(([0], np.cumsum(digits)))
    sizes = summed[bounds[1:]] - summed[bounds[:-1]] + 2 * counts  # 0 for an empty list
    ends = np.cumsum(sizes).tolist()
    starts = [0] + ends[:-1]
    items = [text[a:b] or b"[]" for a, b in zip(starts, ends)]
    return _Packed(items, False)


def _record_lists(column: RecordLists, lo: int, hi: int) -> "_Packed | None":
    """Rows ``lo .. hi-1`` of a column of nested record lists as json.dumps spells them
    (``[{"op": ...}, {...}]``): each group of nested records of one shape rendered at once by
    :func:`_render` (as lines, whose newlines are dropped), put back in their flat order and
    joined per list. None when the groups cannot be made or rendered exactly."""
    groups = column.groups()
    if groups is None:
        return None
    bounds = column.bounds
    first, end = int(bounds[lo]), int(bounds[hi])
    within = np.diff(bounds[lo:hi + 1]).tolist()
    if first == end:
        return _Packed([b"[]"] * (hi - lo), False)
    starts = np.zeros(end - first, dtype=np.int64)
    lengths = np.zeros(end - first, dtype=np.int64)
    parts, base, seen = [], 0, 0
    for group in groups:
        rows = np.flatnonzero((group.places >= first) & (group.places < end))
        if not len(rows):
            continue
        data = {name: _take(group.data[name], rows) for name in group.order}
        rendered = _render(data, group.order, 0, len(rows))
        if rendered is None:
            return None
        text, measure = rendered
        sizes = np.asarray(measure(), dtype=np.int64)
        where = group.places[rows] - first
        starts[where] = base + np.cumsum(sizes) - sizes
        lengths[where] = sizes - 1  # without the newline
        parts.append(bytes(text))
        base += len(text)
        seen += len(rows)
    if seen != end - first:
        return None  # a nested record in no group: not exact
    joined = b"".join(parts)
    texts = [joined[a:b] for a, b in zip(starts.tolist(), (starts + lengths).tolist())]
    items, at = [], 0
    for count in within:
        items.append(b"[" + b", ".join(texts[at:at + count]) + b"]")
        at += count
    return _Packed(items, False)


class _Integers:
    """Decimal integers (null where masked), right-aligned in their block, four digits per
    step: the division is the costly part, and a 4-character group is one word.

    When every number of the batch has the same digits above the last ``k`` (timestamps,
    offsets), those digits are the template's and only the last ``k`` are written, zero-padded:
    fewer divisions, and every row as wide."""

    quoted = False

    def __init__(self, magnitude: np.ndarray, negative: np.ndarray | None,
                 null: np.ndarray | None):
        self.magnitude, self.negative, self.null = magnitude, negative, null
        top = int(magnitude.max(initial=0))
        bottom = int(magnitude.min()) if len(magnitude) else 0
        self.digits = len(str(top))
        self.short = len(str(bottom))  # digits of the shortest number
        self.shared = 0  # trailing digits written when the leading ones are shared (0: none)
        if negative is None and null is None and self.short == self.digits:
            k = 1
            while top // 10 ** k != bottom // 10 ** k:
                k += 1
            self.shared = k if k < self.digits else 0
        self.full = negative is None and null is None and self.short == self.digits
        self.words = 1

    @classmethod
    def of(cls, column: np.ndarray, lo: int, hi: int) -> "_Integers | str":
        null = None
        if isinstance(column, np.ma.MaskedArray):
            null = np.ma.getmaskarray(column)[lo:hi]
            values = column.data[lo:hi]
            if null.all():
                return "null"
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
        top = int(magnitude.max(initial=0))
        if null is None and negative is None and len(magnitude) and top == int(magnitude.min()):
            return str(top)  # one value in every row: the template's
        if top < 1 << 32:  # narrower integers divide faster
            magnitude = magnitude.astype(np.uint32)
        elif top < 1 << 63:
            magnitude = magnitude.view(np.int64)
        return cls(magnitude, negative, null)

    def _trailing(self, aligned: bool) -> int:
        """How many trailing digits are written (the rest are the template's), 0: all."""
        k = self.shared
        if k and aligned:
            k = -(-k // 4) * 4  # whole words
            if k >= self.digits:
                return 0
        return k

    def prefix(self, aligned: bool) -> str:
        k = self._trailing(aligned)
        return str(int(self.magnitude[0]) // 10 ** k) if k else ""

    def size(self, aligned: bool) -> int:
        k = self._trailing(aligned)
        width = k or max(self.digits + (self.negative is not None),
                         4 if self.null is not None else 1)
        return -(-width // 4) * 4 if aligned else width

    def lengths(self, aligned: bool) -> np.ndarray | int:
        k = self._trailing(aligned)
        if k or self.full:
            return k or self.digits
        digits = np.searchsorted(_POWERS, self.magnitude.astype(np.uint64), side="right") + 1
        if self.negative is not None:
            digits += self.negative
        if self.null is not None:
            digits[self.null] = 4
        return digits

    def write(self, matrix: np.ndarray, at: int, aligned: bool) -> None:
        k = self._trailing(aligned)
        width = self.size(aligned)
        n = -(-width // 4)
        rest = self.magnitude
        step = rest.dtype.type(10000)
        if k:  # only the trailing k digits, every group zero-padded
            rest = rest % rest.dtype.type(10 ** k)
            sure = n
        else:
            sure = (self.short - 1) // 4  # groups every row has in full: no leading-group test
        if aligned:
            words = matrix[:, at:at + 4 * n].view(np.uint32)
        else:
            words = np.empty((len(rest), n), dtype=np.uint32)
        for j in range(n):
            table = _LOW_GROUPS if j == 0 else _HIGH_GROUPS
            if j == n - 1 and not k:  # the top group: the rest is below 10000
                group = rest + step
            else:
                high = rest // step
                group = rest - high * step
                if j >= sure:
                    group += (high == 0) * step  # the leading group: no zeros before it
                rest = high
            words[:, n - 1 - j] = table[group]
        end = at + width
        if not aligned:
            matrix[:, at:end] = words.view(np.uint8)[:, 4 * n - width:]
        if self.negative is not None:
            rows_hit = np.flatnonzero(self.negative)
            digits = np.array([len(str(int(v))) for v in self.magnitude[rows_hit]],
                              dtype=np.int64)
            matrix[rows_hit, end - 1 - digits] = ord("-")
        if self.null is not None:
            rows_hit = np.flatnonzero(self.null)
            matrix[rows_hit, at:end] = 0
            matrix[rows_hit, end - 4:end] = _NULL


class _Bools:
    """``true``/``false`` (a batch whose rows all agree is the template's)."""

    quoted, full, words = False, False, 0

    def __init__(self, values: np.ndarray):
        self.values = values

    @staticmethod
    def prefix(aligned: bool) -> str:
        return ""

    @staticmethod
    def size(aligned: bool) -> int:
        return 5

    def lengths(self, aligned: bool) -> np.ndarray:
        return 5 - self.values.astype(np.int64)

    def write(self, matrix: np.ndarray, at: int, aligned: bool) -> None:
        matrix[:, at:at + 5] = _BOOLS[self.values.astype(np.intp)]


class _Packed:
    """Texts that vary per row (already their JSON spelling, as UTF-8), packed NUL-padded
    into the block; ``quoted``: the quotes around them are the template's."""

    words = 0  # written as bytes: the block needs no alignment

    def __init__(self, items: list[bytes], quoted: bool, sizes: np.ndarray | None = None):
        """``sizes``: each item's length when the caller knows them (a codec's spelling)."""
        self.items, self.quoted = items, quoted
        if sizes is None:
            sizes = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        self.sizes = sizes
        self.width = int(sizes.max(initial=0))
        self.content = int(sizes.sum())
        self.full = not len(items) or int(sizes.min()) == self.width

    @classmethod
    def texts(cls, part: list[str]) -> "_Packed | None":
        """JSON strings (escaped as json.dumps(ensure_ascii=False) does); None when one is
        not valid UTF-8 (json_line writes it as ``<field>_b64``)."""
        joined = "".join(part)
        try:
            raw = joined.encode("utf-8")
        except UnicodeEncodeError:
            return None
        codes = np.frombuffer(raw, dtype=np.uint8)
        if (codes < 0x20).any() or (codes == 0x22).any() or (codes == 0x5C).any():
            items = [json.dumps(s, ensure_ascii=False)[1:-1].encode("utf-8") for s in part]
        elif len(raw) == len(joined):  # ASCII: one encoding per row is all
            items = [s.encode("ascii") for s in part]
        else:
            items = [s.encode("utf-8") for s in part]
        return cls(items, True)

    @classmethod
    def values(cls, part: list) -> "_Packed | None":
        """Any JSON values (lists, objects, floats...) spelt by json.dumps one by one; None
        when one holds text that is not UTF-8 or is not JSON at all."""
        try:
            return cls([json.dumps(v, ensure_ascii=False).encode("utf-8") for v in part], False)
        except (TypeError, ValueError, UnicodeEncodeError):
            return None

    @staticmethod
    def prefix(aligned: bool) -> str:
        return ""

    def size(self, aligned: bool) -> int:
        return self.width

    def lengths(self, aligned: bool) -> np.ndarray:
        return self.sizes

    def write(self, matrix: np.ndarray, at: int, aligned: bool) -> None:
        if not self.width:
            return
        packed = np.array(self.items, dtype=f"S{self.width}")
        matrix[:, at:at + self.width] = packed.view(np.uint8).reshape(len(self.items), -1)


class _Base64(_Packed):
    """Payloads' base64 (the quotes are the template's): the batch's payloads NUL-padded into
    one matrix whose rows are whole 3-byte groups, base64 of all of it at once, the groups
    past each payload's end blanked, each one's last group given its ``=`` padding."""

    quoted = True
    words = 1

    def __init__(self, items: list, sizes: np.ndarray):
        self.items, self.sizes = items, sizes
        self.groups = -(-sizes // 3)
        self.count = int(self.groups.max(initial=0))  # groups of the longest payload
        self.width = 4 * self.count
        self.content = 4 * int(self.groups.sum())
        self.full = not len(items) or int(self.groups.min()) == self.count

    def lengths(self, aligned: bool) -> np.ndarray:
        return 4 * self.groups

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

    def write(self, matrix: np.ndarray, at: int, aligned: bool) -> None:
        rows, count = len(self.items), self.count
        if not count:
            return
        # packed only now: the caller first checked the matrix's size (see _render)
        packed = np.array(self.items, dtype=f"S{3 * count}")
        if packed.dtype.kind != "S" or packed.shape != (rows,):
            raise TypeError("payloads must be bytes")
        text = np.frombuffer(binascii.b2a_base64(packed, newline=False), dtype=np.uint8)
        block = matrix[:, at:at + 4 * count]
        if self.full:
            block[...] = text.reshape(rows, 4 * count)
        else:  # aligned: whole words, the groups past each payload's end zeroed
            np.multiply(text.view(np.uint32).reshape(rows, count),
                        np.arange(count) < self.groups[:, None], out=block.view(np.uint32))
        short = self.sizes % 3  # 1 byte past a whole group: "==", 2 bytes: "="
        if self.full and (short == short[0]).all():
            for k in range((3 - int(short[0])) % 3):
                matrix[:, at + 4 * count - 1 - k] = ord("=")
            return
        last = at + 4 * self.groups - 1
        for rows_hit, pads in ((np.flatnonzero(short == 1), 2), (np.flatnonzero(short == 2), 1)):
            for k in range(pads):
                matrix[rows_hit, last[rows_hit] - k] = ord("=")


__all__ = ["EMPTY", "PAYLOAD_MODES", "JsonChunk", "payload_fields", "record_line", "columns_chunk", "json_chunk", "json_line",
           "keep_freed_memory", "records_chunk", "render_columns", "render_columns_measured",
           "render_rows"]
