"""SQLite write-ahead log (the ``-wal`` file beside a database in WAL mode), as SQLite's file
format document (fileformat2.html, "The WAL File Format") and its ``wal.c`` define it.

A 32-byte header of eight big-endian u32: magic (0x377f0682, or 0x377f0683 when the checksums
read the data as big-endian words), format version 3007000, page size, checkpoint sequence,
salt-1, salt-2, and the header's checksum over its first 24 bytes. Then frames: a 24-byte frame
header (page number; the database size in pages after a commit, nonzero only on a transaction's
last frame; salt-1 and salt-2 copied from the header; a checksum) and one page.

The checksum is cumulative: each frame's runs on from the previous frame's (the first from the
header's) over the frame header's first 8 bytes and the page, as u32 words in the magic's byte
order, two at a time: ``s0 += w0 + s1; s1 += w1 + s0`` (mod 2**32).

A record is one frame SQLite accepts: its salts are the header's, its checksum continues the
chain and its page number is not 0. Kind ``commit`` is a transaction's last frame (its
``db_size`` nonzero), ``page`` any other. Frames after the last commit are not committed:
SQLite ignores them (validation warns). The log ends quietly at the end of the file or at a
frame left over from an earlier generation of the file (after a checkpoint SQLite writes from
the start again under new salts; the old frames beyond stay until overwritten): its salts
differ and its checksum does not continue the chain. A frame of this generation that does not
fit (a bad checksum under the header's salts, salts that differ under a checksum that
continues the chain, page 0, a frame cut by the end of the file) is damage.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .base import (Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record, Records,
                   Repair, slice_payloads)

MAGIC_LE, MAGIC_BE = 0x377F0682, 0x377F0683  # low bit: checksum words are big-endian
VERSION = 3007000
HEADER = 32
FRAME_HEADER = 24
MIN_PAGE, MAX_PAGE = 512, 65536
WAL_SUFFIX = "-wal"  # SQLite names the log after its database: ``<db>-wal``
_HEADER = struct.Struct(">8I")
_MAGICS = (struct.pack(">II", MAGIC_LE, VERSION), struct.pack(">II", MAGIC_BE, VERSION))
#: The frame header's fields, in the order of the file and of a record's JSON.
FIELDS = ("page", "db_size", "salt1", "salt2", "checksum1", "checksum2")
#: Frame bytes checked at once, and about the bytes of each batch :meth:`SqliteWal.read` and
#: :meth:`SqliteWal.validate` scan (bounds the temporary arrays whatever the file size).
CHECK_BYTES = 1 << 23
#: The most frames in one such batch.
READ_BATCH = 1024
_MASK = np.uint64(0xFFFFFFFF)


@dataclass(frozen=True)
class WalHeader:
    big_endian: bool  # checksum words are big-endian (magic 0x377f0683)
    page_size: int
    checkpoint: int
    salt1: int
    salt2: int
    checksum1: int
    checksum2: int

    @property
    def frame_size(self) -> int:
        return FRAME_HEADER + self.page_size


def checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes) running on from (s0, s1):
    the plain loop (the header's 24 bytes; the tests' reference for :class:`_Weights`)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def read_header(buf: Buffer, source: str) -> WalHeader:
    """The checked header: magic, version, page size and its own checksum."""
    if len(buf) < HEADER:
        raise FormatError(source, 0, f"WAL header truncated ({len(buf)} of {HEADER} bytes)")
    magic, version, page_size, checkpoint, salt1, salt2, ck1, ck2 = _HEADER.unpack_from(buf, 0)
    if magic not in (MAGIC_LE, MAGIC_BE):
        raise FormatError(source, 0, f"not a SQLite WAL (magic 0x{magic:08x})")
    if version != VERSION:
        raise FormatError(source, 4, f"WAL format version {version} (only {VERSION} exists)")
    if not MIN_PAGE <= page_size <= MAX_PAGE or page_size & (page_size - 1):
        raise FormatError(source, 8, f"page size {page_size} is not a power of two from "
                                     f"{MIN_PAGE} to {MAX_PAGE}")
    big_endian = bool(magic & 1)
    if checksum(bytes(buf[:24]), big_endian) != (ck1, ck2):
        raise FormatError(source, 24, "WAL header checksum mismatch (SQLite ignores the "
                                      "whole log)")
    return WalHeader(big_endian, page_size, checkpoint, salt1, salt2, ck1, ck2)


class _Weights:
    """The checksum as linear algebra, so numpy checks many frames at once. One step over
    words (a, b) maps the state v = (s0, s1) to A v + (a, a + b) with A = [[1, 1], [1, 2]];
    over n steps the words add up as sum A^(n-1-k) (a_k, a_k + b_k): fixed weights per word
    position, all mod 2**32 (uint64 products of two u32 cannot overflow; sums wrap mod 2**64,
    a multiple of 2**32)."""

    def __init__(self, page_size: int):
        pairs = page_size // 8
        powers = np.empty((pairs + 2, 2, 2), np.uint64)  # A^0 .. A^(pairs + 1)
        m = np.eye(2, dtype=np.uint64)
        a = np.array([[1, 1], [1, 2]], np.uint64)
        for j in range(pairs + 2):
            powers[j] = m
            m = (a @ m) & _MASK
        back = powers[pairs - 1::-1]  # A^(pairs-1-k) for word pair k of the page
        self.s0_a = (back[:, 0, 0] + back[:, 0, 1]) & _MASK
        self.s0_b = back[:, 0, 1].copy()
        self.s1_a = (back[:, 1, 0] + back[:, 1, 1]) & _MASK
        self.s1_b = back[:, 1, 1].copy()
        self.page_power = powers[pairs]  # carries the frame header's pair over the page
        self.frame_power = powers[pairs + 1]  # carries the previous checksum over the frame

    def frames(self, seeds: np.ndarray, head: np.ndarray, page: np.ndarray) -> np.ndarray:
        """(n, 2) checksums of n frames: ``seeds`` (n, 2) the checksums they run on from,
        ``head`` (n, 2) the frame headers' first two words and ``page`` (n, words) the pages'
        words, all in the checksum's byte order."""
        a, b = page[:, 0::2].astype(np.uint64), page[:, 1::2].astype(np.uint64)
        d0 = (a @ self.s0_a + b @ self.s0_b) & _MASK
        d1 = (a @ self.s1_a + b @ self.s1_b) & _MASK
        h = head.astype(np.uint64)
        c = np.stack([h[:, 0], h[:, 0] + h[:, 1]], axis=1) & _MASK
        s = seeds.astype(np.uint64)
        out = (s @ self.frame_power.T + c @ self.page_power.T) & _MASK
        out[:, 0] = (out[:, 0] + d0) & _MASK
        out[:, 1] = (out[:, 1] + d1) & _MASK
        return out


@functools.lru_cache(maxsize=None)
def _weights(page_size: int) -> _Weights:
    return _Weights(page_size)


@dataclass
class Frames:
    """The valid frames of one walk: offsets and (rows, 6) header fields (:data:`FIELDS`);
    where a next walk resumes (None: done) and the damage that ended it."""

    offsets: np.ndarray
    heads: np.ndarray
    next_offset: int | None
    error: FormatError | None

    @property
    def rows(self) -> int:
        return len(self.offsets)


def _frame_bytes(buf: Buffer, first: int, count: int, size: int) -> np.ndarray:
    """(count, size) bytes of the consecutive frames from byte ``first`` (a view, no copy;
    the caller has checked they lie inside the buffer)."""
    flat = np.frombuffer(buf, np.uint8)[first:first + count * size]
    return np.lib.stride_tricks.as_strided(flat, shape=(count, size), strides=(size, 1),
                                           writeable=False)


def walk(buf: Buffer, source: str, hdr: WalHeader, pos: int, stop: int | None = None,
         limit: int | None = None) -> Frames:
    """The valid frames from byte ``pos`` (a frame boundary), up to ``limit`` of them and none
    that starts at or after ``stop``. The frame after the last one taken is looked at too, so
    ``next_offset`` and ``error`` are exactly what :meth:`SqliteWal.read` meets next.

    Resumed mid-log, the frame at ``pos`` is taken as read before: its checksum ran on from
    the frame before it, whose bytes a caller may have let go (a sliding window reads them
    as zeros), so the chain is checked from its stored checksum on."""
    end, size = len(buf), hdr.frame_size
    if pos < HEADER or pos > end or (pos - HEADER) % size:
        raise FormatError(source, pos, f"start offset {pos} is not a frame boundary "
                                       f"(frames of {size} bytes from byte {HEADER})")
    whole = (end - pos) // size
    span = whole if stop is None else min(whole, max(0, -(-(stop - pos) // size)))
    look = span if limit is None else min(span, limit + 1)  # one past the limit: next_offset
    seed: tuple[int, int] | None = (hdr.checksum1, hdr.checksum2) if pos == HEADER else None
    order = ">u4" if hdr.big_endian else "<u4"
    weights = _weights(hdr.page_size)
    chunk = max(1, CHECK_BYTES // size)
    taken: list[np.ndarray] = []
    error: FormatError | None = None
    for lo in range(0, look, chunk):
        offsets = pos + np.arange(lo, min(look, lo + chunk), dtype=np.int64) * size
        frames = _frame_bytes(buf, int(offsets[0]), len(offsets), size)
        heads = frames[:, :FRAME_HEADER].view(">u4").astype(np.uint32)
        words = frames[:, :8].view(order)
        pages = frames[:, FRAME_HEADER:].view(order)
        seeds = np.empty((len(offsets), 2), np.uint64)
        seeds[0] = heads[0, 4:6] if seed is None else seed
        seeds[1:] = heads[:-1, 4:6]
        sums = weights.frames(seeds, words, pages)
        sums_ok = (sums == heads[:, 4:6]).all(axis=1)
        if seed is None:  # resumed: the first frame was checked by the walk that found it
            sums_ok[0] = True
        salts_ok = (heads[:, 2] == hdr.salt1) & (heads[:, 3] == hdr.salt2)
        good = sums_ok & salts_ok & (heads[:, 0] != 0)
        bad = np.flatnonzero(~good)
        cut = int(bad[0]) if len(bad) else len(offsets)
        taken.append(np.column_stack([offsets[:cut], heads[:cut].astype(np.int64)]))
        if len(bad):  # the end of the log, or damage
            error = _refused(source, hdr, int(offsets[cut]), heads[cut], bool(salts_ok[cut]),
                             bool(sums_ok[cut]))
            break
        seed = (int(heads[-1, 4]), int(heads[-1, 5]))
    else:  # every frame looked at is valid: what follows the last whole one
        if look == whole and (stop is None or pos + whole * size < stop):
            error = _tail(buf, source, hdr, pos + whole * size)
    table = np.concatenate(taken) if taken else np.zeros((0, 7), np.int64)
    rows = len(table) if limit is None else min(len(table), limit)
    next_offset = None
    if rows < len(table):  # the limit, and the one more frame looked at is valid: resume there
        next_offset, error = pos + rows * size, None
    return Frames(table[:rows, 0], table[:rows, 1:].astype(np.uint32), next_offset, error)


def _refused(source: str, hdr: WalHeader, at: int, head: np.ndarray, salts_ok: bool,
             sums_ok: bool) -> FormatError | None:
    """Why SQLite stops at the frame at ``at``: None for a frame of an earlier generation
    (its salts differ and its checksum does not continue the log: the log's quiet end), else
    the damage. A checksum that continues the log proves the frame is this log's."""
    n = _nth(at, hdr)
    if not salts_ok and not sums_ok:
        return None
    if not salts_ok:
        return FormatError(source, at + 8, f"frame {n}: salts 0x{int(head[2]):08x} "
                           f"0x{int(head[3]):08x} are not the header's 0x{hdr.salt1:08x} "
                           f"0x{hdr.salt2:08x} but its checksum continues the log "
                           "(damaged salts)")
    if not sums_ok:
        return FormatError(source, at, f"frame {n}: checksum mismatch (a torn write or a "
                                       "damaged frame)")
    return FormatError(source, at, f"frame {n}: page number 0")


def _tail(buf: Buffer, source: str, hdr: WalHeader, at: int) -> FormatError | None:
    """What the bytes after the last whole frame are: nothing, the cut-off head of a frame of
    an earlier generation (its salts differ: not damage), or a torn frame (damage)."""
    left = len(buf) - at
    if not left:
        return None
    if left >= 16 and struct.unpack_from(">II", buf, at + 8) != (hdr.salt1, hdr.salt2):
        return None
    return FormatError(source, at, f"frame {_nth(at, hdr)} truncated ({left} of "
                                   f"{hdr.frame_size} bytes: a torn write)")


def _nth(at: int, hdr: WalHeader) -> int:
    return (at - HEADER) // hdr.frame_size


def frame_columns(name: str, buf: Buffer, page_size: int, frames: Frames, seq: int
                  ) -> dict[str, Any]:
    """The contract's columns of ``frames``: format, seq, offset, kind, :data:`FIELDS`, payload."""
    rows, heads = frames.rows, frames.heads
    commit = heads[:, 1] != 0 if rows else np.zeros(0, bool)
    data: dict[str, Any] = {
        "format": [name] * rows,
        "seq": np.arange(seq, seq + rows, dtype=np.int64),
        "offset": frames.offsets,
        "kind": np.where(commit, "commit", "page").tolist(),
    }
    for i, field in enumerate(FIELDS):
        data[field] = heads[:, i].astype(np.int64)
    starts = frames.offsets + FRAME_HEADER
    data["payload"] = slice_payloads(buf, starts, starts + page_size)
    return data


class SqliteWal(Codec):
    name = "sqlite-wal"
    kinds = ("page", "commit")
    in_file_order = True
    header_size = HEADER
    #: A WAL has no clock; Spark's key is the database the log belongs to (from the file name),
    #: its id the page each frame writes.
    columns = ColumnMap(id="page")

    def sniff(self, head: bytes) -> bool:
        """The magic and the only format version: 8 fixed bytes."""
        return bytes(head[:8]) in _MAGICS

    def file_key(self, name: str) -> str | None:
        """The database's file name: SQLite names its log ``<database>-wal``."""
        return name[:-len(WAL_SUFFIX)] if name.endswith(WAL_SUFFIX) and len(name) > 4 else None

    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Records:
        for cols in self.scan(buf, source, start, seq, stop, rows=READ_BATCH, span=CHECK_BYTES):
            yield from cols.records()
            if cols.error is not None:
                raise cols.error

    def read_columns(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
                     stop: int | None = None, limit: int | None = None) -> Columns:
        try:
            hdr = read_header(buf, source)
            frames = walk(buf, source, hdr, HEADER if start is None else start, stop, limit)
        except FormatError as exc:
            empty = np.zeros(0, np.int64)
            hdr, frames = None, Frames(empty, np.zeros((0, 6), np.uint32), None, exc)
        cols = frame_columns(self.name, buf, hdr.page_size if hdr else 0, frames, seq)
        return Columns(cols, frames.rows, frames.next_offset, seq + frames.rows, frames.error)

    def record_offsets(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
                       stop: int | None = None, limit: int | None = None
                       ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """The frames' offsets as :meth:`read_columns` finds them (every checksum checked),
        without copying their pages."""
        try:
            frames = walk(buf, source, read_header(buf, source),
                          HEADER if start is None else start, stop, limit)
        except FormatError as exc:
            return np.zeros(0, np.int64), None, exc.detached()
        return frames.offsets, frames.next_offset, frames.error

    # -- writing ---------------------------------------------------------------------------
    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        """A log SQLite would accept: ``records`` give each frame's ``page``, ``db_size`` and
        ``payload`` (one page; shorter is padded with zeros); salts and checksums are computed.
        ``header``: ``page_size`` (default: the smallest that holds every payload, at least
        4096), ``salt1``, ``salt2``, ``checkpoint``, ``big_endian``."""
        longest = max((len(r.get("payload") or b"") for r in records), default=0)
        page_size = header.get("page_size") or max(4096, 1 << max(0, longest - 1).bit_length())
        if not MIN_PAGE <= page_size <= MAX_PAGE or page_size & (page_size - 1):
            raise ValueError(f"page size {page_size} is not a power of two from {MIN_PAGE} "
                             f"to {MAX_PAGE}")
        big_endian = bool(header.get("big_endian", False))
        salt1, salt2 = header.get("salt1", 0x5EED0001), header.get("salt2", 0x5EED0002)
        head = struct.pack(">6I", MAGIC_BE if big_endian else MAGIC_LE, VERSION, page_size,
                           header.get("checkpoint", 0), salt1, salt2)
        s = checksum(head, big_endian)
        parts = [head, struct.pack(">II", *s)]
        weights, order = _weights(page_size), ">u4" if big_endian else "<u4"
        for rec in records:
            page = bytes(rec.get("payload") or b"")
            if len(page) > page_size:
                raise ValueError(f"a page of {len(page)} bytes in a log of {page_size}-byte pages")
            page = page.ljust(page_size, b"\0")
            first = struct.pack(">II", rec["page"], rec.get("db_size", 0))
            s0, s1 = weights.frames(np.array([s], np.uint64), np.frombuffer(first, order)[None],
                                    np.frombuffer(page, order)[None])[0]
            s = (int(s0), int(s1))
            parts.append(first + struct.pack(">4I", salt1, salt2, *s) + page)
        return b"".join(parts)

    # -- the demo tree -----------------------------------------------------------------------
    def sample_file(self, rng, count: int) -> bytes:
        return self.write(sample_frames(rng, count), page_size=1024)

    def demo_files(self, rng, described: Sequence[str] = ()) -> dict[str, bytes]:
        """A shop's database (``sqlite/shop.db``, as WAL mode leaves a new one) and its log of
        nine transactions, which the real SQLite reads (the tests open it)."""
        database, txs = demo_database(rng)
        return {DEMO_DB: database, DEMO_DB + WAL_SUFFIX: demo_log(rng, txs)}

    # -- validation and recovery -----------------------------------------------------------
    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        """Frames after the last commit (SQLite ignores them: a transaction still being written,
        or lost at a crash), with reading's damage left to reading."""
        first_after, frames_after = None, 0  # the frames since the last commit
        for cols in self.scan(buf, source, rows=READ_BATCH, span=CHECK_BYTES):
            if not cols.rows:
                continue
            commits = np.flatnonzero(cols.data["db_size"])
            if len(commits):
                first_after, frames_after = None, cols.rows - 1 - int(commits[-1])
                if frames_after:
                    first_after = int(cols.data["offset"][commits[-1] + 1])
            else:
                frames_after += cols.rows
            if first_after is None and frames_after:
                first_after = int(cols.data["offset"][cols.rows - frames_after])
        if first_after is None:
            return []
        return [Finding(first_after, f"{frames_after} frame(s) from byte {first_after} follow "
                                     "the last commit: not committed, SQLite ignores them",
                        "warning")]

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """SQLite's own reading, made durable: a frame whose salts alone are damaged (its
        checksum continues the log) gets the header's salts back; a torn or damaged frame is
        cut off with everything after it (SQLite never reads past it). Every valid frame,
        committed or not, is kept. A damaged header is not repaired (which frames belong to
        the log is then unknown)."""
        try:
            hdr = read_header(buf, source)
        except FormatError:
            return None
        data = bytearray(buf)
        actions: list[str] = []
        pos = HEADER
        while True:
            frames = walk(data, source, hdr, pos, None, None)
            error = frames.error
            if error is None:
                break
            at = error.offset - (error.offset - HEADER) % hdr.frame_size
            if error.offset == at + 8:  # the salts: this log's frame otherwise
                struct.pack_into(">II", data, at + 8, hdr.salt1, hdr.salt2)
                actions.append(f"frame {_nth(at, hdr)} (byte {at}): salts set back to the "
                               "header's")
                pos = at
                continue
            data = data[:at]
            actions.append(f"cut the log at byte {at}: {error.reason}")
            break
        return Repair(bytes(data), actions) if actions else None


# -- a sample database for the demo tree ---------------------------------------------------------
# A small shop's database as SQLite lays it out (file format 4, 1024-byte pages, one table
# leaf page per table) and the log of its transactions, built here byte by byte so that the
# demo is the same on every machine; the tests open it with the real SQLite.

DEMO_PAGE = 1024
DEMO_DB = "sqlite/shop.db"
#: The SQLite version the database header claims (the one the conformance files came from).
DEMO_SQLITE_VERSION = 3040001
_CUSTOMERS = ("ada", "grace", "linus", "margaret", "ken", "barbara")
_CITIES = ("Lisbon", "Oslo", "Kraków", "Austin", "Nairobi")
_ITEMS = ("invoice paper", "thumb drive", "backup tape", "label printer", "ledger", "router")


def _varint(v: int) -> bytes:
    """SQLite's big-endian base-128 varint (values below 2**56 here)."""
    out = [v & 0x7F]
    v >>= 7
    while v:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    return bytes(reversed(out))


def _record(values: Sequence[Any]) -> bytes:
    """A row in SQLite's record format: a header of serial types, then the values."""
    types, body = [], []
    for v in values:
        if v is None:
            types.append(0)
        elif isinstance(v, int):
            width, code = next((w, c) for w, c in ((1, 1), (2, 2), (4, 4), (8, 6))
                               if -(1 << (8 * w - 1)) <= v < 1 << (8 * w - 1))
            types.append(code)
            body.append(v.to_bytes(width, "big", signed=True))
        else:
            text = v.encode("utf-8")
            types.append(13 + 2 * len(text))
            body.append(text)
    head = b"".join(map(_varint, types))
    return _varint(len(head) + 1) + head + b"".join(body)


def _leaf(rows: Sequence[tuple[int, Sequence[Any]]], at: int = 0) -> bytes:
    """A table b-tree leaf page of ``rows`` (rowid, values) whose b-tree header starts at
    byte ``at`` (100 on page 1, after the database header, which the caller puts there)."""
    page = bytearray(DEMO_PAGE)
    cells = [_varint(len(rec)) + _varint(rowid) + rec
             for rowid, rec in ((rowid, _record(values)) for rowid, values in rows)]
    top, pointers = DEMO_PAGE, []
    for cell in cells:
        top -= len(cell)
        page[top:top + len(cell)] = cell
        pointers.append(top)
    if at + 8 + 2 * len(cells) > top:
        raise ValueError("demo rows do not fit one page")
    struct.pack_into(">BHHHB", page, at, 0x0D, 0, len(cells), top if cells else DEMO_PAGE, 0)
    struct.pack_into(f">{len(pointers)}H", page, at + 8, *pointers)
    return bytes(page)


def _page1(schema: Sequence[tuple[str, int, str]], pages: int, change: int) -> bytes:
    """Page 1: the database header and the schema table (name, root page, SQL per table)."""
    header = struct.pack(">16sHBBBBBBIIIIIIIIIIII20xII", b"SQLite format 3\0", DEMO_PAGE,
                         2, 2, 0, 64, 32, 32,  # WAL mode, no reserved bytes, payload fractions
                         change, pages, 0, 0, len(schema), 4, 0, 0, 1, 0, 0, 0,
                         change, DEMO_SQLITE_VERSION)
    rows = [(n + 1, ("table", name, name, root, sql)) for n, (name, root, sql) in
            enumerate(schema)]
    return header + _leaf(rows, 100)[100:]


def demo_database(rng) -> tuple[bytes, list[list[tuple[int, bytes]]]]:
    """(the database file as ``PRAGMA journal_mode=wal`` leaves a new one, the transactions
    after it: each a list of (page number, page bytes) in page order)."""
    schema: list[tuple[str, int, str]] = []
    tables: dict[int, list[tuple[int, Sequence[Any]]]] = {}
    change = 1
    txs: list[list[tuple[int, bytes]]] = []

    def commit(*roots: int, grew: bool = False) -> None:
        nonlocal change
        pages = []
        if grew:  # the schema or the database's size changed: page 1 too
            change += 1
            pages.append((1, _page1(schema, 1 + len(tables), change)))
        pages += [(root, _leaf(tables[root])) for root in sorted(roots)]
        txs.append(pages)

    def create(name: str, sql: str) -> int:
        root = 2 + len(tables)
        schema.append((name, root, sql))
        tables[root] = []
        commit(root, grew=True)
        return root

    database = _page1([], 1, change)
    customers = create("customers", "CREATE TABLE customers(id INTEGER PRIMARY KEY, "
                                    "name TEXT, city TEXT)")
    tables[customers] += [(n, (None, name, rng.choice(_CITIES)))
                          for n, name in enumerate(_CUSTOMERS[:4], 1)]
    commit(customers)
    orders = create("orders", "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER, "
                              "item TEXT, qty INTEGER)")
    for _ in range(4):
        first = len(tables[orders]) + 1
        tables[orders] += [(n, (None, rng.randint(1, 4), rng.choice(_ITEMS), rng.randint(1, 20)))
                           for n in range(first, first + rng.randint(2, 4))]
        commit(orders)
    # a new customer and her first order in one transaction: two pages
    tables[customers].append((5, (None, _CUSTOMERS[4], rng.choice(_CITIES))))
    tables[orders].append((len(tables[orders]) + 1, (None, 5, rng.choice(_ITEMS), 1)))
    commit(customers, orders)
    rowid, (_, who, item, qty) = tables[orders][1]  # a corrected quantity
    tables[orders][1] = (rowid, (None, who, item, qty + 10))
    commit(orders)
    return database, txs


def demo_log(rng, txs: list[list[tuple[int, bytes]]]) -> bytes:
    """The ``-wal`` file of ``txs``, under salts drawn from ``rng``: each transaction's last
    frame is its commit, carrying the database's size in pages after it."""
    records, size = [], 1
    for pages in txs:
        size = max(size, max(page for page, _ in pages))
        records += [{"page": page, "db_size": 0, "payload": data} for page, data in pages]
        records[-1]["db_size"] = size
    return SqliteWal().write(records, page_size=DEMO_PAGE, salt1=rng.getrandbits(32),
                             salt2=rng.getrandbits(32))


def sample_frames(rng, count: int) -> list[dict]:
    """``count`` frames of a busy log of 1024-byte pages (the benchmarks' input): transactions
    of one to four table leaf pages of order rows, each ending in its commit frame."""
    pool = [_leaf([(n, (None, rng.randint(1, 500), rng.choice(_ITEMS), rng.randint(1, 20)))
                   for n in range(first, first + rng.randint(8, 16))])
            for first in range(1, 64 * 16, 16)]  # distinct pages, drawn again and again
    frames: list[dict] = []
    pages = 2
    while len(frames) < count:
        pages += rng.random() < 0.1  # the database grows now and then
        touched = sorted(rng.sample(range(2, pages + 1), min(pages - 1, rng.randint(1, 4))))
        frames += [{"page": page, "db_size": 0, "payload": rng.choice(pool)} for page in touched]
        frames[-1]["db_size"] = pages
    return frames[:count] if frames[count - 1]["db_size"] else frames[:count - 1] + [
        {**frames[count - 1], "db_size": pages}]
