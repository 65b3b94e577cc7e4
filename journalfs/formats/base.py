"""The one interface every format codec implements.

A codec turns bytes into records and records into bytes. It never opens files: callers hand
it a buffer (bytes, memoryview or mmap) plus the file's name, which only appears in errors.

Records are plain dicts holding exactly the contract's JSON fields (``format``, ``seq``,
``offset``, ``kind`` and the per-format fields), except that a binary payload is kept as
``bytes`` under ``"payload"``; :func:`record_to_json` turns that into ``payload_b64``.
"""
from __future__ import annotations

import base64
import gc
import json
import mmap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

Buffer = Any  # bytes | bytearray | memoryview | mmap.mmap
Record = dict


class FormatError(Exception):
    """Damage in a journal file: which file, at which byte, and why."""

    def __init__(self, source: str, offset: int, reason: str):
        super().__init__(source, offset, reason)
        self.source = source
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.source}: damaged at byte {self.offset}: {self.reason}"

    def detached(self) -> "FormatError":
        """This report without the traceback of where it was raised, for keeping beside the
        records before the damage: a traceback keeps every frame of the decoding alive, and
        with them the file's buffers, and its frames hold it back (a reference cycle that
        only the cyclic collector frees, rarely in a long-running daemon)."""
        self.__traceback__ = self.__context__ = None
        return self


@dataclass
class Columns:
    """Columnar output of :meth:`Codec.read_columns`.

    ``data`` maps each contract field name (``seq``, ``offset``, ``kind``, the format's fields,
    and ``payload`` as a list/array of bytes) to a numpy array or a Python list, all of length
    ``rows``. ``next_offset``/``next_seq`` say where a following call resumes; ``error`` is the
    damage that ended decoding early (the rows before it are valid).
    """

    data: dict[str, Any]
    rows: int
    next_offset: int | None
    next_seq: int
    error: FormatError | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            self.error.detached()

    def records(self) -> Iterator[Record]:
        """The rows as the records :meth:`Codec.read` yields (fields in the columns' order)."""
        names = list(self.data)
        values = [c.tolist() if hasattr(c, "tolist") else list(c) for c in self.data.values()]
        for row in zip(*values):
            yield dict(zip(names, row))


def rows_of_batches(batches: Iterator[Columns], first: int, last: int
                    ) -> Iterator[tuple[Columns, int, int]]:
    """(batch, lo, hi) for rows ``first .. last-1`` counted across consecutive batches of
    columns (a codec's ``column_batches``): the batches before them are passed over; stops
    after the one holding the last row or the damage."""
    seen = 0
    for cols in batches:
        lo, hi = max(first - seen, 0), min(last - seen, cols.rows)
        if lo < hi:
            yield cols, lo, hi
        seen += cols.rows
        if seen >= last or cols.error is not None:
            return


class BuiltOnAccess(Sequence):
    """A column whose values are built only when read: ``build(i)`` makes row ``i``'s value
    (a fresh object each time). For nested values whose Python objects cost far more than
    finding and checking them (a jrnl transaction's list of operation dicts): a batch that is
    counted, indexed or listed never builds them. ``tolist()`` builds every row, as numpy's
    does; a slice is a list."""

    def __init__(self, rows: int, build: Callable[[int], Any]):
        self._rows, self._build = rows, build

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._build(i) for i in range(*index.indices(self._rows))]
        if index < 0:
            index += self._rows
        if not 0 <= index < self._rows:
            raise IndexError("column index out of range")
        return self._build(index)

    def tolist(self) -> list:
        return [self._build(i) for i in range(self._rows)]


class IntLists(BuiltOnAccess):
    """A column of integer lists held flat: row ``i`` is ``values[starts[i]:starts[i] +
    counts[i]]``, or None where ``missing[i]`` (a field that kind of record lacks). Read
    like :class:`BuiltOnAccess` (a list per row, built when read); the renderer and Arrow
    take the arrays as they are, with no Python object per number (a Kestrel READ_DONE's
    ids: one ``json.dumps`` per row cost half of ``records --json``)."""

    def __init__(self, values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                 missing: np.ndarray | None = None):
        self.values, self.starts, self.counts = values, starts, counts
        self.missing = missing if missing is not None and missing.any() else None
        # no super().__init__(rows, self._build): a bound method kept on the instance is a
        # reference cycle, and the batch's arrays would wait for the cyclic collector
        self._rows = len(starts)

    def _build(self, i: int) -> list[int] | None:
        if self.missing is not None and self.missing[i]:
            return None
        start = int(self.starts[i])
        return self.values[start:start + int(self.counts[i])].tolist()

    def take(self, rows: np.ndarray) -> "IntLists":
        """The rows ``rows`` (an index array), sharing ``values``."""
        return IntLists(self.values, self.starts[rows], self.counts[rows],
                        None if self.missing is None else self.missing[rows])

    def contiguous(self) -> tuple[np.ndarray, np.ndarray]:
        """(values in row order, ``rows + 1`` bounds): row ``i``'s numbers are
        ``values[bounds[i]:bounds[i + 1]]`` (none where missing)."""
        counts = self.counts if self.missing is None else np.where(self.missing, 0, self.counts)
        bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        within = np.arange(int(bounds[-1]), dtype=np.int64)
        if len(counts) and not np.array_equal(self.starts, bounds[:-1]):
            within += np.repeat(self.starts - bounds[:-1], counts)
            return self.values[within], bounds
        return self.values[:int(bounds[-1])], bounds

    def __arrow_array__(self, type=None):
        import pyarrow as pa  # only Spark's side needs it
        values, bounds = self.contiguous()
        mask = None if self.missing is None else pa.array(self.missing)
        return pa.ListArray.from_arrays(pa.array(bounds.astype(np.int32)), pa.array(values),
                                        mask=mask)


class Base64Bytes(list):
    """A column of ``bytes`` whose JSON is their base64 text under the field's own name
    (a nested record's ``data_b64``), as the top-level ``payload`` is ``payload_b64``'s."""


@dataclass
class RecordGroup:
    """Nested records of one shape: their fields in JSON order, as columns (numpy arrays,
    lists, :class:`Base64Bytes`, per-group constants as ``str``), and each one's place in
    the flat order of every nested record of a batch."""

    order: list[str]
    data: dict[str, Any]
    places: np.ndarray


class RecordLists(BuiltOnAccess):
    """A column of lists of nested records (a jrnl transaction's operations): read like
    :class:`BuiltOnAccess` (each row's list of dicts built when read), and, for the
    renderer, the nested records held flat as :class:`RecordGroup` columns, row ``i``'s
    being flat places ``bounds[i] .. bounds[i + 1] - 1``. ``groups()`` makes them when first
    asked (a batch that is only counted or listed never does)."""

    def __init__(self, rows: int, build: Callable[[int], Any], bounds: np.ndarray,
                 groups: Callable[[], list[RecordGroup] | None]):
        super().__init__(rows, build)
        self.bounds = bounds
        self._groups, self._made, self._asked = groups, None, False

    def groups(self) -> list[RecordGroup] | None:
        """The nested records' columns; None when they cannot all be made exactly that way."""
        if not self._asked:
            self._made, self._asked = self._groups(), True
        return self._made


@dataclass(frozen=True)
class ColumnMap:
    """Which record field feeds each of the Spark rows' ``time``/``key``/``id`` columns."""

    time: str | None = None
    time_unit: str = "s"  # unit of the raw time field: s, ms, us or ns
    key: str | None = None  # a record field, or None (the key may come from the file's name)
    id: str | None = None  # a record field, "seq" (the record number itself) or None


@dataclass
class Finding:
    """One problem found by :meth:`Codec.validate` (beyond what reading already rejects)."""

    offset: int
    reason: str
    severity: str = "error"  # "error" (damage) or "warning" (odd but readable)


@dataclass
class Repair:
    """What :meth:`Codec.repair` decided: the new file bytes and a sentence per change."""

    data: bytes
    actions: list[str] = field(default_factory=list)


class Codec:
    """Base class; one subclass per format, registered in :mod:`journalfs.formats`."""

    name: str = ""  # contract format name, e.g. "kestrel-writer"
    kinds: tuple[str, ...] = ()
    #: File magics the default :meth:`sniff` accepts (formats that need more override it).
    magics: tuple[bytes, ...] = ()
    #: True when :meth:`read` can resume at any record's ``offset`` (with its ``seq``).
    resumable: bool = True
    #: Fixed record width in bytes for fixed-width formats (random access without an index).
    record_size: int | None = None
    header_size: int = 0
    #: True when records lie in increasing offset order, so the records that start in a byte
    #: range are a contiguous run and a big file can be read as independent ranges.
    in_file_order: bool = False
    #: The record fields behind the Spark columns time/key/id.
    columns: ColumnMap = ColumnMap()
    #: True for a file that only indexes a partner file: its repair rebuilds it from that
    #: file, so its own entries are not records a repair must preserve.
    derived: bool = False
    #: The formats of the files :meth:`partners` may name (empty: it never names one), so a
    #: caller lists a file's directory only when the file can have partners.
    partner_formats: tuple[str, ...] = ()
    #: For the tree file of a metadata store: what fsck reports the store as. fsck checks such
    #: a file as a store, with the journals that name it as a partner (never them alone).
    store_label: str | None = None
    #: The partner roles :meth:`key_resolver` reads (empty: the keys need no partner file).
    key_partners: tuple[str, ...] = ()

    # -- facts about files -----------------------------------------------------------------
    def file_key(self, name: str) -> str | None:
        """The ``key`` every record of a file named ``name`` shares, when the format keeps it
        in the file name (a Kestrel queue); None otherwise."""
        return None

    def partners(self, name: str, siblings: Sequence[tuple[str, str]]) -> dict[str, str]:
        """The related files of a file named ``name`` among ``siblings`` (``(name, format)``
        of the other journals in its directory), by role: what :meth:`validate`/:meth:`repair`
        take as keyword context and the Spark reader uses (an akka data file's ``meta``)."""
        return {}

    def key_resolver(self, buf: Buffer, partners: dict[str, Buffer]
                     ) -> Callable[[dict], Sequence[str | None]] | None:
        """For a format whose records' keys only a partner file names (an akka data file's
        chains start in its meta file): given this file's bytes and its partners' bytes by
        role, a function from a batch's columns to their keys. None: no such keys."""
        return None

    # -- detection -------------------------------------------------------------------------
    def sniff(self, head: bytes) -> bool:
        """True when ``head`` (the file's first up-to-64 bytes) carries this format's magic."""
        if not self.magics:
            raise NotImplementedError
        return any(bytes(head[:len(magic)]) == magic for magic in self.magics)

    # -- reading ---------------------------------------------------------------------------
    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Iterator[Record]:
        """Yield records in file order from byte ``start`` (a record boundary; None = first).

        ``seq`` is the ordinal of the record at ``start``. Decoding stops before any record that
        begins at or after ``stop``. At the first damage, raise :class:`FormatError` after
        yielding every valid record before it. Every size or offset read from the buffer is
        checked against ``len(buf)`` before use.
        """
        raise NotImplementedError

    def read_columns(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
                     stop: int | None = None, limit: int | None = None) -> Columns:
        """Up to ``limit`` records as columns. Formats on the hot path override this with a
        vectorised decoder; this default goes through :meth:`read`, filling every column in
        the same pass (a field a record lacks is None in that row)."""
        columns: dict[str, list] = {}
        rows = 0
        error = None
        next_offset = None
        it = self.read(buf, source, start, seq, stop)
        # records are acyclic: cyclic GC passes over thousands of live rows are pure overhead
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for rec in it:
                if rows == limit:
                    next_offset = rec["offset"]
                    break
                for key, value in rec.items():
                    column = columns.get(key)
                    if column is None:  # first record with this field: earlier rows lack it
                        column = columns[key] = [None] * rows
                    column.append(value)
                rows += 1
                if len(rec) != len(columns):  # this record lacks some fields: pad them
                    for column in columns.values():
                        if len(column) < rows:
                            column.append(None)
        except FormatError as exc:
            error = exc
        finally:
            it.close()
            if gc_was_enabled:
                gc.enable()
        return Columns(columns, rows, next_offset, seq + rows, error)

    def read_text_columns(self, buf: Buffer, source: str, start: int | None = None,
                          seq: int = 0, stop: int | None = None,
                          limit: int | None = None) -> Columns | None:
        """Like :meth:`read_columns`, with every nested value (lists, objects) already as
        its JSON text; None when the codec has no such path or leaves this batch to
        :meth:`read_columns` (damage is always reported by that one)."""
        return None

    # -- writing ---------------------------------------------------------------------------
    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        """Encode ``records`` (dicts as :meth:`read` yields; ``seq``/``offset`` ignored) into a
        complete file. ``header`` carries format-level settings (e.g. TTL, flags, tag)."""
        raise NotImplementedError

    # -- validation and recovery -----------------------------------------------------------
    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        """Format-specific consistency checks beyond decoding (links, indexes, status).
        ``context`` may carry related files' bytes (e.g. ``log=`` for a Wallaby index)."""
        return []

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """Apply the format's own recovery rule; None when nothing needs repair. Never drops a
        record that :meth:`read` returns as valid."""
        return None


def payload_b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(bytes(data)).decode("ascii")


def _utf8(text: str) -> bool:
    """True when ``text`` holds no lone surrogates (a name that was not valid UTF-8)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raw_b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


def _safe_value(value: Any) -> tuple[bool, Any]:
    """(True, value as JSON can carry it) or (False, its raw bytes in base64) for one field."""
    if isinstance(value, str):
        return (True, value) if _utf8(value) else (False, _raw_b64(value))
    if isinstance(value, list) and any(isinstance(v, str) and not _utf8(v) for v in value):
        return False, [_raw_b64(v) if isinstance(v, str) else v for v in value]
    if isinstance(value, dict):
        return True, _safe_mapping(value)
    return True, value


def _safe_mapping(fields: dict) -> dict:
    """A nested mapping (gvfs metadata ``{key: value}``): a key that is not UTF-8 becomes
    ``"b64:<base64>"``, its value follows the same rule as a top-level field."""
    out = {}
    for key, value in fields.items():
        if isinstance(key, str) and not _utf8(key):
            key = "b64:" + _raw_b64(key)
        ok, safe = _safe_value(value)
        out[key if ok else f"{key}_b64"] = safe
    return out


def json_safe(fields: dict) -> dict:
    """``fields`` as JSON can carry them: a text field that is not valid UTF-8 (a ``str``
    holding ``surrogateescape`` lone surrogates) is written as ``"<field>_b64"`` with the raw
    bytes in base64 INSTEAD of ``"<field>"``; a list with such an element becomes a
    ``<field>_b64`` list of base64 strings (every element); nested mappings follow the same
    rule, with a non-UTF-8 key written as ``"b64:<base64>"``. Everything else is unchanged."""
    out = {}
    for key, value in fields.items():
        ok, safe = _safe_value(value)
        out[key if ok else f"{key}_b64"] = safe
    return out


def record_to_json(rec: Record) -> dict:
    """The contract's JSON object for one record (payload bytes become ``payload_b64``, text
    that is not UTF-8 becomes ``<field>_b64``: see :func:`json_safe`)."""
    out = {}
    for k, v in rec.items():
        if k == "payload":
            out["payload_b64"] = payload_b64(v)
        else:
            out[k] = v
    return json_safe(out)


def record_json_line(rec: Record) -> str:
    return json.dumps(record_to_json(rec), ensure_ascii=False, separators=(", ", ": "))


# -- helpers shared by the codecs ----------------------------------------------------------------

def start_offset(source: str, start: int | None, first: int, end: int) -> int:
    """Where reading begins: ``first`` (the first record) when ``start`` is None, else ``start``,
    which must lie between ``first`` and ``end``."""
    pos = first if start is None else start
    if pos < first or pos > end:
        raise FormatError(source, pos, "start offset is outside the file's records")
    return pos


def field_at(buf: Buffer, offsets: np.ndarray, delta: int, dtype: str) -> np.ndarray:
    """The integers of ``dtype`` at byte ``offsets + delta`` (unaligned), gathered in one step
    through a byte-strided view of the buffer. Callers have checked every position."""
    native = np.dtype(dtype).newbyteorder("=")
    if not len(offsets):
        return np.zeros(0, dtype=native)
    width = np.dtype(dtype).itemsize
    view = np.ndarray(shape=(len(buf) - width + 1,), dtype=dtype, buffer=buf, strides=(1,))
    return view[offsets + delta].astype(native)


def slice_payloads(buf: Buffer, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """``bytes`` of each ``buf[start:end]`` span (a payload column)."""
    spans = zip(starts.tolist(), ends.tolist())
    if isinstance(buf, (bytes, mmap.mmap)):  # their slices already are bytes
        return [buf[a:b] for a, b in spans]
    view = memoryview(buf).cast("B")
    return [view[a:b].tobytes() for a, b in spans]
