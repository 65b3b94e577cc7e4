"""The one interface every format codec implements.

A codec turns bytes into records and records into bytes. It never opens files: callers hand
it a buffer (bytes, memoryview or mmap) plus the file's name, which only appears in errors.

Records are plain dicts holding exactly the contract's JSON fields (``format``, ``seq``,
``offset``, ``kind`` and the per-format fields), except that a binary payload is kept as
``bytes`` under ``"payload"``; :func:`record_to_json` turns that into ``payload_b64``.
"""
from __future__ import annotations

import abc
import base64
import gc
import json
import mmap
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Sequence, Union

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
    columns (a codec's :meth:`Codec.scan`): the batches before them are passed over; stops
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
        self._groups, self._asked = groups, False
        self._made: list[RecordGroup] | None = None

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


#: Rows per batch of :meth:`Codec.scan` unless the caller asks otherwise.
SCAN_ROWS = 16384
#: The first batch of a scan that sizes its batches by bytes (``span``): rows before the
#: file's bytes per record are known.
FIRST_SCAN_ROWS = 16
#: What a scan's batches hold (:meth:`Codec.scan`'s ``form``): every column; only the
#: ``offset`` column (record starts, found without decoding where the codec can); every
#: column with nested values as their JSON text (:meth:`Codec.read_text_columns`).
SCAN_FORMS = ("columns", "offsets", "text")
#: A stream of records or batches that its reader may close early (``contextlib.closing``).
Records = Generator[Record, None, None]
Batches = Generator["Columns", None, None]
#: A scan's most rows per batch: a number, or a function asked before each batch (a consumer
#: that sizes its batches by what it makes of them: JSON text, Arrow bytes).
Rows = Union[int, Callable[[], int]]


class Codec(abc.ABC):
    """Base class; one subclass per format, registered in :mod:`journalfs.formats`.

    This is the whole interface the rest of journalfs uses: nothing outside ``formats/``
    asks a codec what it has (no ``hasattr``, no type checks). A format must provide
    :meth:`read` and :meth:`write` (abstract) and its facts (the class attributes below);
    every other method has a default built from those, which a format overrides where it
    has a faster or bounded way (a vectorised column decoder, a header walk that finds
    record starts without decoding payloads, a streaming walk of a file that cannot resume
    mid-file). Callers stream a file through :meth:`scan` alone (``journals.scan`` adds
    the page release); :meth:`read` is the row decoder every other path is held to.
    """

    name: str = ""  # contract format name, e.g. "kestrel-writer"
    kinds: tuple[str, ...] = ()
    #: File magics the default :meth:`sniff` accepts (formats that need more override it).
    magics: tuple[bytes, ...] = ()
    #: True when :meth:`read` can resume at any record's ``offset`` (with its ``seq``).
    #: A codec that cannot is streamed from its start only (:meth:`scan` with no ``start``).
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
    #: True when :meth:`validate` takes a ``pace`` keyword and calls it after each step of
    #: reading (the caller drops the pages read so far there); False: the caller drops them
    #: on a timer while it runs.
    paces_validation: bool = False
    #: True when :meth:`read_columns` is the codec's own (vectorised) decoder; False: it is
    #: the default, :meth:`read` plus a dict per record, and callers that want records or
    #: their JSON lines take them from :meth:`read` directly. Set for each subclass from
    #: whether it overrides :meth:`read_columns` (a fact no format has to repeat).
    columnar: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "columnar" not in cls.__dict__:
            cls.columnar = cls.read_columns is not Codec.read_columns

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

    def key_resolver(self, buf: Buffer, partners: dict[str, Buffer],
                     pace: Callable[[], None] | None = None
                     ) -> Callable[[dict], Sequence[str | None]] | None:
        """For a format whose records' keys only a partner file names (an akka data file's
        chains start in its meta file): given this file's bytes and its partners' bytes by
        role, a function from a batch's columns to their keys. None: no such keys.
        ``pace``: called now and then while it reads far from a batch (as for validate)."""
        return None

    # -- detection -------------------------------------------------------------------------
    def sniff(self, head: bytes) -> bool:
        """True when ``head`` (the file's first up-to-64 bytes) carries this format's magic.
        A format without ``magics`` must override it (the registry's test checks)."""
        return any(bytes(head[:len(magic)]) == magic for magic in self.magics)

    # -- reading ---------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Records:
        """Yield records in file order from byte ``start`` (a record boundary; None = first).

        ``seq`` is the ordinal of the record at ``start``. Decoding stops before any record that
        begins at or after ``stop``. At the first damage, raise :class:`FormatError` after
        yielding every valid record before it. Every size or offset read from the buffer is
        checked against ``len(buf)`` before use. The row decoder: every other way of
        reading (columns, offsets, scans) gives exactly its records, offsets and damage.
        """

    def records(self, buf: Buffer, source: str, pace: Callable[[], None] | None = None
                ) -> Records:
        """Every record of the file, as :meth:`read` yields them (and its damage), in bounded
        memory whatever the file's size; ``pace`` as for :meth:`scan`. This default is
        :meth:`read` itself; a codec whose :meth:`read` holds the whole file's structure
        (a tree) overrides it with its :meth:`scan`."""
        return self.read(buf, source)

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

    def record_offsets(self, buf: Buffer, source: str, start: int | None = None,
                       seq: int = 0, stop: int | None = None, limit: int | None = None
                       ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """Where the records :meth:`read` yields start (up to ``limit``): (offsets, where a
        next call resumes or None, the damage that ended them). This default takes them
        from :meth:`read_columns` (or, without a column decoder of the codec's own, from
        :meth:`read`); a format that can find record starts without decoding payloads
        (a header walk) overrides it."""
        if self.columnar:
            cols = self.read_columns(buf, source, start, seq, stop, limit)
            offsets = cols.data.get("offset", ())
            return (np.asarray(offsets[:cols.rows], dtype=np.int64), cols.next_offset,
                    cols.error)
        found: list[int] = []
        it = self.read(buf, source, start, seq, stop)
        try:
            for rec in it:
                if len(found) == limit:
                    return np.asarray(found, dtype=np.int64), rec["offset"], None
                found.append(rec["offset"])
        except FormatError as exc:
            return np.asarray(found, dtype=np.int64), None, exc.detached()
        finally:
            it.close()
        return np.asarray(found, dtype=np.int64), None, None

    def scan(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None, *, rows: Rows = SCAN_ROWS, span: int | None = None,
             form: str = "columns", pace: Callable[[], None] | None = None
             ) -> Batches:
        """The one way to stream a file: its records from ``start`` (record ``seq``; None =
        the first) up to ``stop``, as consecutive batches of columns of at most ``rows``
        rows (:data:`Rows`) -- with ``span``, of about ``span`` bytes of the file each (a
        first small batch measures the records' size). ``form`` (:data:`SCAN_FORMS`) says what the
        batches must hold; they may hold more. The damage that ends the records is the
        ``error`` of the last batch (which may have no rows); nothing is raised.

        ``pace`` is called whenever the pages read so far are not needed again, by a codec
        whose walk does not go forward through the file (a tree read level by level); a
        forward reader leaves that to its caller, which drops the pages behind each batch's
        last offset. This default drives :meth:`read_columns` (or :meth:`record_offsets`,
        :meth:`read_text_columns`) from record to record; a codec that cannot resume
        mid-file is decoded whole and given in slices -- it overrides this to stream in
        bounded memory."""
        if form not in SCAN_FORMS:
            raise ValueError(f"unknown scan form {form!r}")
        if not self.resumable:
            if start is not None:
                raise ValueError(f"{self.name} cannot resume mid-file")
            yield from _sliced(self.read_columns(buf, source, None, seq, stop), most_rows(rows))
            return
        end = len(buf) if stop is None else min(stop, len(buf))
        want = most_rows(rows)
        if span is not None and end - (start or 0) > span:  # not surely one batch: measure
            want = min(want, FIRST_SCAN_ROWS)
        while True:
            cols = self._batch(buf, source, start, seq, stop, want, form)
            yield cols
            if cols.error is not None or cols.next_offset is None \
                    or (not cols.rows and cols.next_offset == start):
                return
            want = most_rows(rows)
            if span is not None and cols.rows:
                first = int(cols.data["offset"][0])
                per_row = max(1, (cols.next_offset - first) // cols.rows)
                want = max(1, min(want, span // per_row))
            start, seq = cols.next_offset, cols.next_seq

    def _batch(self, buf: Buffer, source: str, start: int | None, seq: int,
               stop: int | None, limit: int, form: str) -> Columns:
        """One batch of :meth:`scan` in ``form``."""
        if form == "offsets":
            offsets, next_offset, error = self.record_offsets(buf, source, start, seq, stop,
                                                              limit)
            return Columns({"offset": offsets}, len(offsets), next_offset,
                           seq + len(offsets), error)
        if form == "text":
            cols = self.read_text_columns(buf, source, start, seq, stop, limit)
            if cols is not None:
                return cols
        return self.read_columns(buf, source, start, seq, stop, limit)

    # -- writing ---------------------------------------------------------------------------
    @abc.abstractmethod
    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        """Encode ``records`` (dicts as :meth:`read` yields; ``seq``/``offset`` ignored) into a
        complete file. ``header`` carries format-level settings (e.g. TTL, flags, tag)."""

    # -- validation and recovery -----------------------------------------------------------
    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        """Format-specific consistency checks beyond decoding (links, indexes, status).
        ``context`` may carry related files' bytes (e.g. ``log=`` for a Wallaby index) and,
        for a codec that :attr:`paces_validation`, ``pace``."""
        return []

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """Apply the format's own recovery rule; None when nothing needs repair. Never drops a
        record that :meth:`read` returns as valid."""
        return None

    # -- the demo tree ---------------------------------------------------------------------
    def demo_files(self, rng: random.Random, described: Sequence[str]) -> dict[str, bytes]:
        """Files of a small, realistic sample of this format for ``journalfs.demo``'s tree,
        by path relative to it, made with :meth:`write` from ``rng`` alone. A family of
        formats whose files only make sense together (a queue's writer and reader files)
        gives them from one of its codecs; the others give none. ``described``: the demo
        tree's ordinary files (``/docs/report.txt``), for a format that keeps metadata
        about files. The registry's test checks that every format shows up in the demo."""
        return {}

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """A valid file of this format holding about ``count`` records (payloads of
        :data:`samples.SAMPLE_PAYLOAD` bytes where the format has payloads), made with
        :meth:`write` from ``rng`` alone: the parse benchmark's input (``bench/parse.py``
        scales ``count`` to the file size it wants), so a new format needs no edit there.
        There is no default a format could do without (the records are the format's own);
        the registry's test checks that every registered format gives one."""
        raise NotImplementedError(f"{self.name} gives no sample file")


def most_rows(rows: Rows) -> int:
    """The most rows the next batch of a scan may have (see :data:`Rows`)."""
    return max(1, rows() if callable(rows) else rows)


def _sliced(cols: Columns, rows: int) -> Iterator[Columns]:
    """``cols`` (a whole file's columns) as batches of at most ``rows`` rows; the damage
    with the last."""
    if cols.rows <= rows:
        yield cols
        return
    seq0 = cols.next_seq - cols.rows
    offsets = cols.data["offset"]
    for lo in range(0, cols.rows, rows):
        hi = min(cols.rows, lo + rows)
        data = {k: v if isinstance(v, str) else v[lo:hi] for k, v in cols.data.items()}
        last = hi == cols.rows
        yield Columns(data, hi - lo, cols.next_offset if last else int(offsets[hi]),
                      seq0 + hi, cols.error if last else None)


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
