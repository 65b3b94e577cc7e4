"""gvfs metadata journal (``\\xda\\x1ajour``): header, CRC'd entries, encoder and validator.

Byte layout: specs/gvfs-metadata.md. Readers stop at the first invalid entry (gvfs does the
same); entries past the header's ``num_entries`` are not part of the journal at all.
"""
from __future__ import annotations

import bisect
import mmap
import random
import re
import struct
import zlib
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Iterator

import numpy as np

from .base import Codec, ColumnMap, Columns, Finding, FormatError, Record, field_at

try:  # the same CRC-32 as zlib's, 2.7x faster on entries of ~80 bytes (SIMD folding)
    from zlib_ng.zlib_ng import crc32 as _entry_crc32
except ImportError:  # pragma: no cover - zlib-ng is pinned in pyproject.toml
    _entry_crc32 = zlib.crc32
from . import samples
from .spans import paused_gc

MAGIC = b"\xda\x1ajour"
HEADER_SIZE = 20
FIRST_ENTRY = HEADER_SIZE
#: The size gvfs gives every new journal; ours may be larger (gvfs honours file_size).
GVFS_JOURNAL_SIZE = 32 * 1024
MIN_ENTRY = 24
#: A journal's name: its tree's name and the tree's random tag as 8 hex digits (gvfs's rule).
JOURNAL_SUFFIX = r"-([0-9a-f]{8})\.log$"
_JOURNAL_NAME = re.compile(r"(?s)(.+)" + JOURNAL_SUFFIX)


def journal_name(tree_name: str, tag: int) -> str:
    """The journal file name of the tree ``tree_name`` whose header carries ``tag``."""
    return f"{tree_name}-{tag:08x}.log"


def tree_and_tag(journal: str) -> tuple[str, str] | None:
    """``(tree name, tag as 8 hex digits)`` a journal's name carries; None for other names."""
    m = _JOURNAL_NAME.search(journal)
    return (m.group(1), m.group(2)) if m else None

OP_SET, OP_SETV, OP_UNSET, OP_COPY, OP_REMOVE = range(5)
_SET_OP = bytes((OP_SET,))
KIND_OF_OP = ("set", "setv", "unset", "copy", "remove")
OP_OF_KIND = {k: i for i, k in enumerate(KIND_OF_OP)}

_HEADER = struct.Struct(">6sBBIII")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">II")
_ENTRY_HEAD = struct.Struct(">IIQB")  # size, crc, mtime, op


def encode_str(s: str) -> bytes:
    """Keys, values and paths as stored: UTF-8 (raw bytes of odd file names survive) + NUL."""
    data = s.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise ValueError(f"NUL byte in {s!r}")
    return data + b"\0"


def decode_str(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class JournalHeader:
    tag: int
    file_size: int
    num_entries: int


def parse_header(buf, source: str, *, exact_size: bool = True) -> JournalHeader:
    """The journal's header. gvfs ignores a journal whose file_size is not the real size
    (``exact_size``, what a store does); a reader of a damaged file passes False and reads
    the entries that are there (see :func:`size_damage`)."""
    if len(buf) < HEADER_SIZE:
        raise FormatError(source, 0, f"journal header needs {HEADER_SIZE} bytes, file has {len(buf)}")
    magic, major, _minor, tag, file_size, num = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError(source, 0, "not a gvfs metadata journal (bad magic)")
    if major != 1:
        raise FormatError(source, 6, f"unsupported journal major version {major}")
    if exact_size and file_size != len(buf):
        raise FormatError(source, 12, f"header file_size {file_size} != real size {len(buf)}")
    if file_size < HEADER_SIZE:
        raise FormatError(source, 12, f"header file_size {file_size} is smaller than the header")
    return JournalHeader(tag, file_size, num)


def size_damage(header: JournalHeader, real_size: int, source: str) -> FormatError | None:
    """The damage a file of ``real_size`` bytes has when its header says otherwise: where it
    was cut (a truncated journal), or where its extra bytes start."""
    if real_size < header.file_size:
        return FormatError(source, real_size, f"journal truncated: the file ends at byte {real_size}, "
                                              f"its header says {header.file_size}")
    if real_size > header.file_size:
        return FormatError(source, header.file_size, f"{real_size - header.file_size} bytes past "
                                                     f"the header's file_size {header.file_size}")
    return None


def new_journal(tag: int, file_size: int = GVFS_JOURNAL_SIZE) -> bytearray:
    """A fresh, empty journal file image (zero-filled after the header, as gvfs makes them)."""
    if file_size < HEADER_SIZE + MIN_ENTRY or file_size % 4 or file_size > 0xFFFFFFFF:
        raise ValueError(f"bad journal size {file_size}")
    out = bytearray(file_size)
    _HEADER.pack_into(out, 0, MAGIC, 1, 0, tag, file_size, 0)
    return out


def journal_image(entries: Sequence[bytes], tag: int, size: int | None = None,
                  min_size: int = GVFS_JOURNAL_SIZE) -> bytearray:
    """A journal file holding the encoded ``entries`` in order: ``size`` bytes, or else the
    smallest multiple of 4 that holds them and is at least ``min_size``."""
    used = HEADER_SIZE + sum(map(len, entries))
    if size is None:
        size = max(min_size, used + (-used % 4))
    if used > size:
        raise ValueError(f"{len(entries)} entries need {used} bytes, journal holds {size}")
    out = new_journal(tag, size)
    pos = HEADER_SIZE
    for e in entries:
        out[pos:pos + len(e)] = e
        pos += len(e)
    _U32.pack_into(out, 16, len(entries))
    return out


_PADDING = (b"", b"\0\0\0", b"\0\0", b"\0")  # by length % 4: up to the next multiple of 4


def encode_entry(kind: str, mtime: int, path: str, key: str | None = None,
                 value: str | Sequence[str] | None = None, source: str | None = None) -> bytes:
    """One complete journal entry (both size fields and the CRC filled in)."""
    op = OP_OF_KIND[kind]
    if op == OP_SET and type(value) is str:  # the common write, in one concatenation
        body = b"".join((_SET_OP, encode_str(path), encode_str(key), encode_str(value)))
        body += _PADDING[(16 + len(body)) % 4]
        size = 16 + len(body) + 4
        time_and_body = b"".join((_U64.pack(mtime & 0xFFFFFFFFFFFFFFFF), body, _U32.pack(size)))
        return _PAIR.pack(size, zlib.crc32(time_and_body)) + time_and_body
    parts = [bytes((op,)), encode_str(path)]
    if op in (OP_SET, OP_SETV, OP_UNSET):
        parts.append(encode_str(key))
    if op == OP_SET:
        parts.append(encode_str(value))
    elif op == OP_SETV:
        used = 16 + sum(map(len, parts))
        values = list(value)
        parts.append(bytes(-used % 4))
        parts.append(_U32.pack(len(values)))
        parts.extend(encode_str(v) for v in values)
    elif op == OP_COPY:
        parts.append(encode_str(source))
    body = b"".join(parts)
    body += bytes(-(16 + len(body)) % 4)
    size = 16 + len(body) + 4
    tail = _U32.pack(size)
    time_and_body = _U64.pack(mtime & 0xFFFFFFFFFFFFFFFF) + body + tail
    return _PAIR.pack(size, zlib.crc32(time_and_body)) + time_and_body


def _cstr(buf, pos: int, end: int, source: str, what: str) -> tuple[str, int]:
    """The NUL-terminated string at ``pos`` that must end before ``end``; and the next pos."""
    if hasattr(buf, "find"):
        nul = buf.find(b"\0", pos, end)
    else:  # memoryview
        nul = bytes(buf[pos:end]).find(b"\0")
        nul = nul + pos if nul >= 0 else -1
    if nul < 0:
        raise FormatError(source, pos, f"unterminated {what}")
    return decode_str(bytes(buf[pos:nul])), nul + 1


def decode_entry(buf, offset: int, source: str, limit: int | None = None) -> tuple[dict, int]:
    """Validate and decode the entry at ``offset``; returns (fields, entry_size).

    ``limit`` is the end of the journal area (the file size). Raises FormatError naming the
    first rule the entry breaks.
    """
    limit = len(buf) if limit is None else limit
    if offset % 4:
        raise FormatError(source, offset, "entry not 4-byte aligned")
    if offset + MIN_ENTRY > limit:
        raise FormatError(source, offset, "entry header runs past the end of the journal")
    size, crc, mtime, op = _ENTRY_HEAD.unpack_from(buf, offset)
    if size < MIN_ENTRY or size % 4 or offset + size > limit:
        raise FormatError(source, offset, f"bad entry size {size}")
    end = offset + size
    if _U32.unpack_from(buf, end - 4)[0] != size:
        raise FormatError(source, end - 4, "trailing entry size differs from leading size")
    if zlib.crc32(memoryview(buf)[offset + 8:end]) != crc:
        raise FormatError(source, offset + 4, "entry CRC mismatch")
    if op > OP_REMOVE:
        raise FormatError(source, offset + 16, f"unknown entry op {op}")
    body_end = end - 4
    path, pos = _cstr(buf, offset + 17, body_end, source, "path")
    rec: dict = {"kind": KIND_OF_OP[op], "mtime": mtime, "path": path}
    if op in (OP_SET, OP_SETV, OP_UNSET):
        rec["key"], pos = _cstr(buf, pos, body_end, source, "key")
    if op == OP_SET:
        rec["value"], pos = _cstr(buf, pos, body_end, source, "value")
    elif op == OP_SETV:
        pos += -(pos - offset) % 4
        if pos + 4 > body_end:
            raise FormatError(source, pos, "list count runs past the entry")
        count = _U32.unpack_from(buf, pos)[0]
        pos += 4
        if count > body_end - pos:  # every value takes at least its NUL byte
            raise FormatError(source, pos - 4, f"list count {count} larger than the entry")
        values = []
        for _ in range(count):
            v, pos = _cstr(buf, pos, body_end, source, "list value")
            values.append(v)
        rec["value"] = values
    elif op == OP_COPY:
        rec["source"], pos = _cstr(buf, pos, body_end, source, "copy source")
    return rec, size


def iter_entries(buf, source: str, start: int = FIRST_ENTRY, first_index: int = 0,
                 count: int | None = None, *, exact_size: bool = True) -> Iterator[tuple[int, dict, int]]:
    """(offset, fields, size) of valid entries from ``start`` (entry number ``first_index``) up
    to the header's num_entries (or ``count`` more); FormatError at the first invalid one.
    With ``exact_size=False`` a truncated (or overlong) file yields the entries it holds, then
    a FormatError at the damage: where the file was cut, or the entry the cut runs through."""
    header = parse_header(buf, source, exact_size=exact_size)
    end = min(header.file_size, len(buf))
    cut = size_damage(header, len(buf), source)
    remaining = header.num_entries - first_index if count is None else count
    offset = start
    while remaining > 0:
        try:
            rec, size = decode_entry(buf, offset, source, end)
        except FormatError as exc:
            if cut is not None and len(buf) < header.file_size and _runs_past(buf, offset, end):
                raise FormatError(source, offset, f"entry cut off: {cut.reason}") from None
            raise exc from None
        yield offset, rec, size
        offset += size
        remaining -= 1
    if cut is not None:
        raise cut


def _runs_past(buf, offset: int, end: int) -> bool:
    """The entry at ``offset`` would end beyond ``end`` (or its sizes cannot be read there)."""
    if offset + 4 > end:
        return True
    return offset + _U32.unpack_from(buf, offset)[0] > end


class GvfsJournal(Codec):
    name = "gvfs-journal"
    paces_validation = True  # validate() calls its ``pace`` keyword after each batch
    columns = ColumnMap(time="mtime", key="path")
    kinds = KIND_OF_OP
    magics = (MAGIC,)
    header_size = HEADER_SIZE

    partner_formats = ("gvfs-tree",)  # a journal belongs to the tree its name carries

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """Sets of an annotation, every fourth one a list of emblems."""
        entries: list[Record] = []
        for i in range(count):
            path = f"/home/user/docs/d{i % 997}/file-{i}.txt"
            if i % 4 == 3:
                entries.append({"kind": "setv", "mtime": samples.BASE_S + i, "path": path,
                                "key": "emblems", "value": ["urgent", "shared"]})
            else:
                entries.append({"kind": "set", "mtime": samples.BASE_S + i, "path": path,
                                "key": "annotation", "value": f"note {rng.randrange(10**6)}"})
        return self.write(entries, tag=0x12345678)

    def partners(self, name, siblings):
        named = tree_and_tag(name)
        return {"tree": named[0]} if named and (named[0], "gvfs-tree") in siblings else {}

    def read(self, buf, source, start=None, seq=0, stop=None) -> Iterator[Record]:
        start = FIRST_ENTRY if start is None else start
        for offset, fields, _size in iter_entries(buf, source, start, seq, exact_size=False):
            if stop is not None and offset >= stop:
                return
            yield {"format": self.name, "seq": seq, "offset": offset, **fields}
            seq += 1

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding (see the notes above :class:`_Run`); exactly what :meth:`read`
        yields, with the generic default's columns (a field a kind lacks is None)."""
        try:
            header = parse_header(buf, source, exact_size=False)
        except FormatError as exc:
            return Columns({}, 0, None, seq, exc)
        end = min(header.file_size, len(buf))
        pos = FIRST_ENTRY if start is None else start
        remaining = header.num_entries - seq
        walk_end = end - MIN_ENTRY + 1 if stop is None else min(stop, end - MIN_ENTRY + 1)
        run = _Run()
        with paused_gc():
            while True:
                wanted = remaining - run.rows if limit is None \
                    else min(limit, remaining) - run.rows
                if wanted > 0 and pos % 4 == 0:
                    walked = _walk(buf, pos, walk_end, end, wanted)
                    taken = 0
                    while taken < len(walked):  # runs of about RUN_BYTES
                        cut = bisect.bisect_left(walked, walked[taken] + RUN_BYTES, taken + 1)
                        taken += _decode_run(buf, np.array(walked[taken:cut], np.int64), run)
                        if taken < cut:  # an entry the run refused: the exact step names it
                            break
                    if taken:
                        pos = walked[taken - 1] + _U32.unpack_from(buf, walked[taken - 1])[0]
                # one exact step: the next entry the runs could not take, the end, or damage
                records = self.read(buf, source, pos, seq + run.rows, stop)
                try:
                    rec = next(records, None)
                except FormatError as exc:
                    return Columns(run.columns(seq), run.rows, None, seq + run.rows, exc)
                finally:
                    records.close()
                if rec is None:
                    return Columns(run.columns(seq), run.rows, None, seq + run.rows, None)
                if run.rows == limit:
                    return Columns(run.columns(seq), run.rows, rec["offset"], seq + run.rows, None)
                run.add_record(rec)
                pos = rec["offset"] + _U32.unpack_from(buf, rec["offset"])[0]

    def write(self, records: Sequence[Record], *, tag: int = 0, file_size: int | None = None,
              **header) -> bytes:
        entries = [encode_entry(r["kind"], int(r.get("mtime", 0)), r["path"], r.get("key"),
                                r.get("value"), r.get("source")) for r in records]
        return bytes(journal_image(entries, tag, file_size))

    def validate(self, buf, source, **context):
        findings = []
        try:
            header = parse_header(buf, source, exact_size=False)
        except FormatError as exc:
            return [Finding(exc.offset, exc.reason)]
        tree_tag = context.get("tree_tag")
        if tree_tag is not None and tree_tag != header.tag:
            findings.append(Finding(8, f"journal tag {header.tag:08x} != tree tag {tree_tag:08x}"))
        pace = context.get("pace")
        # every entry read() accepts, a batch of columns at a time
        for cols in self.scan(buf, source, rows=VALIDATE_BATCH):
            if pace is not None:
                pace()
            if cols.error is not None:
                findings.append(Finding(cols.error.offset, cols.error.reason))
        return findings


# -- columns ---------------------------------------------------------------------------------
#
# read_columns walks the entries' leading sizes (a region of words guessed at once, see
# _guess), then checks a run of entries at once: trailing sizes, ops, CRCs (one crc32 call
# per entry) and every string found through the NUL bytes of the run's bytes (numpy). The
# run's texts are kept as bytes and decoded (or spelt as JSON) only when asked. Wherever the
# run stops (damage, the end, an entry too big for the
# vectorised path), read() takes one exact step, so the result is always what read() yields.

#: Entries per batch when validating.
VALIDATE_BATCH = 1 << 14
#: Entries above this size are decoded one by one (their NUL search would scan them whole).
LARGE_ENTRY = 1 << 16
#: The bytes of entries checked and decoded together (bounds the NUL positions' array).
RUN_BYTES = 1 << 20
_FIELDS_OF_OP = (("key", "value"), ("key", "value"), ("key",), ("source",), ())


class _Run:
    """The columns of consecutive entries, filled run by run. Their texts stay bytes until a
    text column is first read (:class:`_Texts`): counting, indexing and listing never decode
    them."""

    def __init__(self):
        self.offsets: list[np.ndarray] = []
        self.mtimes: list[np.ndarray] = []
        self.ops: list[np.ndarray] = []
        self.pieces: list = []  # per run a _Piece, per record of an exact step its dict
        self.rows = 0

    def add_record(self, rec: Record) -> None:
        self.offsets.append(np.array([rec["offset"]], np.int64))
        self.mtimes.append(np.array([rec["mtime"]], np.uint64))
        self.ops.append(np.array([OP_OF_KIND[rec["kind"]]], np.uint8))
        self.pieces.append(rec)
        self.rows += 1

    def columns(self, seq: int) -> dict:
        rows = self.rows
        offsets = np.concatenate(self.offsets) if self.offsets else np.zeros(0, np.int64)
        ops = np.concatenate(self.ops) if self.ops else np.zeros(0, np.uint8)
        mtimes = np.concatenate(self.mtimes) if self.mtimes else np.zeros(0, np.uint64)
        texts = _Texts(self.pieces, rows)
        data = {"format": ["gvfs-journal"] * rows,
                "seq": np.arange(seq, seq + rows, dtype=np.int64),
                "offset": offsets,
                "kind": _Kinds(np.array(KIND_OF_OP)[ops].tolist(), ops),
                "mtime": mtimes,
                "path": _TextColumn(texts, "path")}
        # the generic default's columns: a field first used by a later row comes later
        for name in dict.fromkeys(f for op in dict.fromkeys(ops.tolist()) for f in _FIELDS_OF_OP[op]):
            data[name] = _TextColumn(texts, name)
        return data


class _Kinds(list):
    """The kind column (a list), which spells its rows' JSON from the entries' ops."""

    _SPELT = np.array([k.encode() for k in KIND_OF_OP], dtype=object)
    _SPELT_SIZES = np.array([len(k.encode()) for k in KIND_OF_OP], dtype=np.int64)

    def __init__(self, kinds: list, ops: np.ndarray):
        super().__init__(kinds)
        self.ops = ops

    def json_spelling(self, lo: int, hi: int) -> tuple[list[bytes], bool, np.ndarray] | str:
        ops = self.ops[lo:hi]
        if (ops == ops[0]).all():  # one kind in every row: the template's
            return f'"{KIND_OF_OP[ops[0]]}"'
        return self._SPELT[ops].tolist(), True, self._SPELT_SIZES[ops]


class _Piece:
    """The texts of one run of entries, as a copy of the run's bytes and where each string
    lies in it; :meth:`decode` gives them as read() does (see the end of _decode_run)."""

    __slots__ = ("data", "starts", "stops", "ops", "head", "counts")

    def __init__(self, data: bytes, starts, stops, ops, head, counts):
        self.data, self.starts, self.stops = data, starts, stops
        self.ops, self.head, self.counts = ops, head, counts

    def decode(self) -> dict[str, list]:
        ops, head, counts = self.ops, self.head, self.counts
        take = len(ops)
        text = b"\0".join(_spans(self.data, self.starts, self.stops))
        strings = text.decode("utf-8", "surrogateescape").split("\0")
        pick = strings.__getitem__
        sets = np.flatnonzero(ops == OP_SET)
        keyed = np.flatnonzero(ops <= OP_UNSET)
        copies = np.flatnonzero(ops == OP_COPY)
        values = _placed(take, sets, map(pick, (head[sets] + 2).tolist()))
        setvs = np.flatnonzero(ops == OP_SETV)
        if len(setvs):
            for row, i, n in zip(setvs.tolist(), (head[setvs] + 2).tolist(), counts[setvs].tolist()):
                values[row] = strings[i:i + n]
        return {"path": list(map(pick, head.tolist())),
                "key": _placed(take, keyed, map(pick, (head[keyed] + 1).tolist())),
                "source": _placed(take, copies, map(pick, (head[copies] + 1).tolist())),
                "value": values}

    def has_lists(self) -> bool:
        return bool((self.ops == OP_SETV).any())

    def spelling(self, lists: bool) -> dict[str, tuple[list, np.ndarray]] | None:
        """Each row's JSON text of each field as ``json.dumps(v, ensure_ascii=False)`` spells
        it, UTF-8 (path, key, source without their quotes; value whole when the batch has
        ``lists``, else without its quotes too), None where a row lacks the field, with the
        texts' sizes (-1: none). None when some string needs escaping or is not UTF-8
        (json_line's own)."""
        # spans joined by \x01 (NULs inside a span end its strings): a text with a control
        # character of its own makes more than the joins' count, and is json.dumps's
        spans = b"\x01".join(_spans(self.data, self.starts, self.stops))
        if not spans.isascii():
            try:
                spans.decode("utf-8")
            except UnicodeDecodeError:
                return None  # written as <field>_b64
        codes = np.frombuffer(spans, np.uint8)
        if (np.count_nonzero(codes - np.uint8(1) < 0x1F) != len(self.starts) - 1  # NUL wraps
                or b'"' in spans or b"\\" in spans):
            return None
        ops, head, counts = self.ops, self.head, self.counts
        take = len(ops)
        joined = spans.replace(b"\x01", b"\0")
        raws = joined.split(b"\0")
        # every string's size, from where the separators are (the renderer needs them all)
        ends = np.flatnonzero(codes < 2)
        sizes = np.diff(ends, prepend=-1, append=len(codes)) - 1
        pick = raws.__getitem__
        sets = np.flatnonzero(ops == OP_SET)
        keyed = np.flatnonzero(ops <= OP_UNSET)
        copies = np.flatnonzero(ops == OP_COPY)
        value_at = head[sets] + 2
        if lists:  # values are whole JSON texts: a set's string with its quotes
            quoted = (b'"' + joined.replace(b"\0", b'"\0"') + b'"').split(b"\0")
            values = _placed(take, sets, map(quoted.__getitem__, value_at.tolist()))
            value_sizes = _placed_sizes(take, sets, sizes[value_at] + 2)
        else:
            values = _placed(take, sets, map(pick, value_at.tolist()))
            value_sizes = _placed_sizes(take, sets, sizes[value_at])
        setvs = np.flatnonzero(ops == OP_SETV)
        if len(setvs):
            # each span as a JSON list of its strings; a list's values are one span, after
            # its entry's head span
            list_texts = (b'["' + spans.replace(b"\0", b'", "').replace(b"\x01", b'"]\x01["')
                          + b'"]').split(b"\x01")
            listed = (ops == OP_SETV) & (counts > 0)
            slot = np.arange(take) + np.cumsum(listed) - listed
            for row in setvs[counts[setvs] == 0].tolist():
                values[row] = b"[]"
            full = np.flatnonzero(listed)
            texts_at = (slot[full] + 1).tolist()
            for row, value in zip(full.tolist(), map(list_texts.__getitem__, texts_at)):
                values[row] = value
            value_sizes[setvs] = [len(values[row]) for row in setvs.tolist()]
        key_at, source_at = head[keyed] + 1, head[copies] + 1
        return {"path": (list(map(pick, head.tolist())), sizes[head]),
                "key": (_placed(take, keyed, map(pick, key_at.tolist())),
                        _placed_sizes(take, keyed, sizes[key_at])),
                "source": (_placed(take, copies, map(pick, source_at.tolist())),
                           _placed_sizes(take, copies, sizes[source_at])),
                "value": (values, value_sizes)}


class _Texts:
    """The text columns of a batch, decoded all at once when one is first read."""

    def __init__(self, pieces: list, rows: int):
        self.pieces, self.rows = pieces, rows
        self.decoded: dict[str, list] | None = None
        self.spelt: dict[str, list] | bool | None = None  # False: cannot be spelt so
        self.lists = False  # some value is a list (setv): values are spelt whole

    def column(self, name: str) -> list:
        if self.decoded is None:
            decoded: dict[str, list] = {"path": [], "key": [], "value": [], "source": []}
            with paused_gc():
                for piece in self.pieces:
                    if isinstance(piece, _Piece):
                        for field, values in piece.decode().items():
                            decoded[field] += values
                    else:  # a record of an exact step
                        for field, values in decoded.items():
                            values.append(piece.get(field))
            self.decoded, self.pieces = decoded, []
        return self.decoded[name]

    def spelling(self, name: str, lo: int, hi: int
                 ) -> tuple[list[bytes], bool, np.ndarray] | str | None:
        """Rows ``lo .. hi-1`` of column ``name`` spelt as JSON (see _Piece.spelling), whether
        their quotes are the renderer's and their sizes, or the one JSON text all of them
        have; None when the batch's texts are decoded already, or some row lacks the field,
        or some text needs json.dumps."""
        if self.spelt is None:
            if self.decoded is not None or not all(isinstance(p, _Piece) for p in self.pieces):
                return None
            texts: dict[str, list] = {"path": [], "key": [], "value": [], "source": []}
            sizes: dict[str, list] = {"path": [], "key": [], "value": [], "source": []}
            # values are strings but for setv's lists: without lists the renderer quotes them
            self.lists = any(piece.has_lists() for piece in self.pieces)
            with paused_gc():
                for piece in self.pieces:
                    items = piece.spelling(self.lists)
                    if items is None:
                        self.spelt = False
                        return None
                    for field, (values, lengths) in items.items():
                        texts[field] += values
                        sizes[field].append(lengths)
            self.spelt = {field: (texts[field], np.concatenate(sizes[field]))
                          for field in texts}
        if self.spelt is False:
            return None
        column, lengths = self.spelt[name]
        lengths = lengths[lo:hi]
        if not len(lengths) or lengths.min() < 0:
            return None
        items = column[lo:hi]
        quoted = name != "value" or not self.lists
        if (lengths == lengths[0]).all() and items.count(items[0]) == len(items):
            text = items[0].decode("utf-8")  # one text in every row: the template's
            return f'"{text}"' if quoted else text
        return items, quoted, lengths


class _TextColumn(Sequence):
    """One text column of a batch (a list once read; see :class:`_Texts`)."""

    def __init__(self, texts: _Texts, name: str):
        self._texts, self._name = texts, name

    def __len__(self) -> int:
        return self._texts.rows

    def __getitem__(self, index):
        return self._texts.column(self._name)[index]

    def __iter__(self):
        return iter(self._texts.column(self._name))

    def __eq__(self, other):
        return list(self) == (list(other) if isinstance(other, (list, _TextColumn)) else other)

    def tolist(self) -> list:
        return list(self._texts.column(self._name))

    def json_spelling(self, lo: int, hi: int
                      ) -> tuple[list[bytes], bool, np.ndarray] | str | None:
        """For the JSON renderer: rows ``lo .. hi-1`` as JSON text without decoding them, with
        their sizes (a ``str``: the one text every row has)."""
        return self._texts.spelling(self._name, lo, hi)


def _spans(buf, starts: np.ndarray, ends: np.ndarray):
    """The bytes of each ``buf[start:end]`` (bytes-like: a memoryview where slicing ``buf``
    would not give bytes), made without a Python call per span."""
    whole = buf if isinstance(buf, (bytes, mmap.mmap)) else memoryview(buf).cast("B")
    return map(whole.__getitem__, map(slice, starts.tolist(), ends.tolist()))


def _placed(rows: int, which: np.ndarray, values) -> list:
    """A column of ``rows`` holding ``values`` at rows ``which`` and None elsewhere."""
    if len(which) == rows:
        return list(values)
    column: list = [None] * rows
    for i, value in zip(which.tolist(), values):
        column[i] = value
    return column


def _placed_sizes(rows: int, which: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`_placed`'s sizes: ``sizes`` at rows ``which``, -1 (no text) elsewhere."""
    if len(which) == rows:
        return sizes.astype(np.int64, copy=False)
    column = np.full(rows, -1, dtype=np.int64)
    column[which] = sizes
    return column


def _walk(buf, pos: int, walk_end: int, end: int, budget: int) -> list[int]:
    """Up to ``budget`` entry starts from ``pos`` whose leading size is plausible (>= 24, a
    multiple of 4, inside ``end``, at most LARGE_ENTRY); the checks that need more than the
    size are :func:`_decode_run`'s. A region at a time is guessed whole (:func:`_guess`),
    one Python step per entry only where the guess does not hold."""
    walked: list[int] = []
    region = GUESS_MIN
    while len(walked) < budget and pos < walk_end:
        guessed = _guess(buf, pos, min(end, pos + region), end)
        room = budget - len(walked)
        if len(guessed) > room:
            guessed = guessed[:room]
        if len(guessed) and guessed[-1] >= walk_end:
            guessed = guessed[:int(np.searchsorted(guessed, walk_end))]
        if len(guessed):
            walked += guessed.tolist()
            last = walked[-1]
            pos = last + _U32.unpack_from(buf, last)[0]
            region = min(2 * region, GUESS_MAX) if len(guessed) > 1 else GUESS_MIN
            continue
        # no guess at ``pos``: exact steps, then guessing again
        stepped = _step(buf, pos, walk_end, end, min(room, GUESS_STEPS))
        if not stepped:
            break
        walked += stepped
        last = stepped[-1]
        pos = last + _U32.unpack_from(buf, last)[0]
        region = GUESS_MIN
    return walked


#: Bytes of the file guessed per step of :func:`_walk` (doubling from MIN while guesses
#: hold, back to MIN where one fails: a hostile file costs little more than exact steps).
GUESS_MIN, GUESS_MAX = 1 << 14, 1 << 20
#: Exact steps taken where a guess failed, before guessing again.
GUESS_STEPS = 64


def _guess(buf, pos: int, region_end: int, end: int) -> np.ndarray:
    """Entry starts from ``pos`` (a multiple of 4) that :func:`_step` would walk, found for
    the 4-byte words of ``[pos, region_end)`` at once, as far as they are certain: a word is
    a candidate when it reads as a plausible size whose entry ends inside the region with the
    same trailing size; the chain of candidates, each one ending where the next starts, from
    ``pos`` on, is the walk (each link is checked exactly as :func:`_step` checks it).
    Stops at the first link not in that chain (damage, a big entry, the region's end)."""
    words = (region_end - pos) // 4
    if words < MIN_ENTRY // 4:
        return np.zeros(0, np.int64)
    raw = np.frombuffer(buf, np.uint32, words, pos)  # big-endian words read as native (LE)
    # sizes 24 .. 65535, multiples of 4: the big-endian top two bytes zero, low two bits zero
    cand = np.flatnonzero((raw & _SIZE_MASK) == 0)
    if not len(cand) or cand[0] != 0:
        return np.zeros(0, np.int64)
    sizes = raw[cand].view(">u4").astype(np.int64)
    ends = cand + (sizes >> 2)  # in words, from pos
    inside = (sizes >= MIN_ENTRY) & (ends <= words)
    cand, sizes, ends = cand[inside], sizes[inside], ends[inside]
    if not len(cand) or cand[0] != 0:
        return np.zeros(0, np.int64)
    cand = cand[raw[ends - 1] == raw[cand]]  # the trailing size (raw words compare alike)
    if not len(cand) or cand[0] != 0:
        return np.zeros(0, np.int64)
    nexts = cand + (raw[cand].view(">u4").astype(np.int64) >> 2)
    breaks = np.flatnonzero(cand[1:] != nexts[:-1])
    chain = cand[:int(breaks[0]) + 1] if len(breaks) else cand
    return pos + 4 * chain


_SIZE_MASK = np.frombuffer(bytes((0xFF, 0xFF, 0, 3)), np.uint32)[0]


def _step(buf, pos: int, walk_end: int, end: int, budget: int) -> list[int]:
    """Up to ``budget`` plausible entry starts from ``pos``, one by one."""
    walked: list[int] = []
    append = walked.append
    unpack = _U32.unpack_from
    for _ in range(budget):
        if pos >= walk_end:
            break
        size = unpack(buf, pos)[0]
        if size < MIN_ENTRY or size & 3 or pos + size > end or size > LARGE_ENTRY:
            break
        append(pos)
        pos += size
    return walked


def _decode_run(buf, offsets: np.ndarray, run: _Run) -> int:
    """Check and decode the entries at ``offsets`` (sizes already plausible) into ``run``, up
    to the first one :func:`decode_entry` would refuse; return how many were taken."""
    sizes = field_at(buf, offsets, 0, ">u4").astype(np.int64)
    ends = offsets + sizes
    body_ends = ends - 4
    ok = (field_at(buf, body_ends, 0, ">u4") == sizes)
    ops = field_at(buf, offsets, 16, "u1")
    ok &= ops <= OP_REMOVE
    crcs = np.fromiter(map(_entry_crc32, _spans(buf, offsets + 8, ends)),
                       dtype=np.uint32, count=len(offsets))
    ok &= crcs == field_at(buf, offsets, 4, ">u4")
    # strings: every NUL of the run, then each string's end is the first NUL after its start
    lo, hi = int(offsets[0]), int(ends[-1])
    nuls = np.flatnonzero(np.frombuffer(buf, np.uint8, hi - lo, lo) == 0) + lo
    last = len(nuls) - 1
    path_at = np.searchsorted(nuls, offsets + 17)
    path_ends = nuls[np.minimum(path_at, last)]
    ok &= (path_at <= last) & (path_ends < body_ends)
    second = nuls[np.minimum(path_at + 1, last)]  # key's end (set, setv, unset), source's (copy)
    has_second = ops <= OP_COPY
    ok &= ~has_second | ((path_at + 1 <= last) & (second < body_ends))
    is_set = ops == OP_SET
    third = nuls[np.minimum(path_at + 2, last)]
    ok &= ~is_set | ((path_at + 2 <= last) & (third < body_ends))
    is_setv = ops == OP_SETV
    counts = np.zeros(len(offsets), np.int64)
    list_at = np.zeros(len(offsets), np.int64)
    if is_setv.any():
        # after the key: padding to 4 (from the entry's start), u32 count, count strings
        pos = second + 1
        pos += -(pos - offsets) % 4
        fits = is_setv & (pos + 4 <= body_ends)
        counts[fits] = field_at(buf, pos[fits], 0, ">u4")
        first_value = pos + 4
        ok &= ~is_setv | (fits & (counts <= body_ends - first_value))
        counts[~ok] = 0
        list_at = np.searchsorted(nuls, first_value)
        last_value = list_at + counts - 1
        listed = is_setv & (counts > 0)
        ok &= ~listed | ((last_value <= last) & (nuls[np.clip(last_value, 0, last)] < body_ends))
    bad = np.flatnonzero(~ok)
    take = int(bad[0]) if len(bad) else len(offsets)
    if not take:
        return 0
    offsets, ops, sizes = offsets[:take], ops[:take], sizes[:take]
    path_ends, second, third = path_ends[:take], second[:take], third[:take]
    counts, list_at, is_setv = counts[:take], list_at[:take], is_setv[:take]
    # every string of the run in file order: path, then key/source, then value(s). The
    # strings before a list (or all of an entry's, without one) lie back to back, NUL
    # between them, and so do a list's values: one span each, joined by NULs, decoded once
    # (no UTF-8 sequence crosses a NUL, so each string decodes as it would alone)
    per_entry = np.where(ops == OP_REMOVE, 1, np.where(ops == OP_SET, 3, 2)) + counts
    firsts = np.zeros(take + 1, np.int64)
    np.cumsum(per_entry, out=firsts[1:])
    head = firsts[:-1]
    head_ends = np.where(ops == OP_REMOVE, path_ends, np.where(ops == OP_SET, third, second))
    lists = np.flatnonzero(is_setv & (counts > 0))
    if len(lists):
        has_list = np.zeros(take, np.int64)
        has_list[lists] = 1
        slot = np.arange(take, dtype=np.int64) + np.cumsum(has_list) - has_list
        starts = np.empty(take + len(lists), np.int64)
        stops = np.empty(take + len(lists), np.int64)
        starts[slot], stops[slot] = offsets + 17, head_ends
        list_pos = second[lists] + 1
        list_pos += -(list_pos - offsets[lists]) % 4
        starts[slot[lists] + 1] = list_pos + 4
        stops[slot[lists] + 1] = nuls[list_at[lists] + counts[lists] - 1]
    else:
        starts, stops = offsets + 17, head_ends
    lo, hi = int(starts[0]), int(stops.max())
    whole = buf if isinstance(buf, (bytes, mmap.mmap)) else memoryview(buf).cast("B")
    run.pieces.append(_Piece(bytes(whole[lo:hi]), starts - lo, stops - lo, ops, head, counts))
    run.offsets.append(offsets)
    run.mtimes.append(field_at(buf, offsets, 8, ">u8"))
    run.ops.append(ops)
    run.rows += take
    return take
