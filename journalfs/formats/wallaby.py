"""Wallaby write-ahead log (``LOG``) and its fixed-width index (``IDX``), specs/wallaby-log.md.

Log: a header (``LOG``, u8 version, u32 flags, and in the seed's layout an i64 TTL in ns: 16
bytes; the original Go writer wrote only the first 8), then records of u32 payload size, u32
flags, i64 time in ns and the payload. A zero size with a zero time is the end of data (the
original pre-extends logs with zero blocks). Index: a 16-byte header (``IDX``) and 24-byte
records of i64 time, u64 record number and i64 absolute offset of the log record.
All integers are little-endian.
"""
from __future__ import annotations

import mmap
import random
import struct
import time as _time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .base import Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record, Repair, slice_payloads
from . import samples
from .starts import RecordStarts

LOG_MAGIC = b"LOG"
IDX_MAGIC = b"IDX"
INDEX_SUFFIX = ".idx"  # a log's index is named after it: ``<log>.idx``
VERSION = 1
#: Version bytes we accept when sniffing: low control bytes, so no text file matches.
PLAUSIBLE_VERSIONS = range(1, 9)
_FILE_HEADER = struct.Struct("<3sBIq")  # magic, version, flags, TTL: the seed's layout (we write it)
_SHORT_FILE_HEADER = struct.Struct("<3sBI")  # without the TTL: the original writer's layout
_RECORD_HEADER = struct.Struct("<IIq")
_SIZE = struct.Struct("<I")
_TIME = struct.Struct("<q")
_INDEX_RECORD = struct.Struct("<qQq")
SHORT_HEADER, FULL_HEADER = _SHORT_FILE_HEADER.size, _FILE_HEADER.size  # 8, 16
RECORD_HEADER, INDEX_RECORD = _RECORD_HEADER.size, _INDEX_RECORD.size  # 16, 24
INDEX_DTYPE = np.dtype([("time", "<i8"), ("index", "<u8"), ("log_offset", "<i8")])
#: How many records each candidate header layout must survive when telling 8 from 16 bytes.
LAYOUT_PROBE_RECORDS = 4
#: The original writer's payload cap: a longer payload cut by the end of file is not a torn write.
MAX_PLAUSIBLE_PAYLOAD = 65536
#: Records per batch when validating: bounds validation's memory whatever the file size.
VALIDATE_BATCH = 1 << 14
#: Index entries compared with the log at once (bounds the temporary arrays of a check).
INDEX_CHUNK = 1 << 16


def _sniff(head: bytes, magic: bytes) -> bool:
    return len(head) >= 4 and head[:3] == magic and head[3] in PLAUSIBLE_VERSIONS


def _bytes_view(buf: Buffer):
    """The buffer itself when its slices are ``bytes`` (bytes, mmap), else a flat memoryview
    (whose slices need ``bytes()``); never a copy of the whole buffer."""
    return buf if isinstance(buf, (bytes, mmap.mmap)) else memoryview(buf).cast("B")


def _u8(buf: Buffer) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, np.uint8)


def _all_zero_from(buf: Buffer, pos: int) -> bool:
    return not _u8(buf)[pos:].any()


@dataclass
class WallabyLogHeader:
    """The decoded log file header; ``size`` (8 or 16) is where the first record starts."""

    version: int
    flags: int
    ttl_ns: int
    size: int


# -- the log ------------------------------------------------------------------------------------

class WallabyLog(Codec):
    name = "wallaby-log"
    in_file_order = True
    paces_validation = True  # validate() calls its ``pace`` keyword after each step
    columns = ColumnMap(time="time", time_unit="ns", id="seq")

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        return self.write([{"time": t, "payload": p}
                           for t, p in sample_items(rng, count, payload=samples.SAMPLE_PAYLOAD)])

    def demo_files(self, rng, described):
        """A log of 48 records and its index."""
        log, index = write_log_and_index(sample_items(rng, 48), flags=0, ttl_ns=0)
        return {"wallaby/events.log": log, "wallaby/events.log" + INDEX_SUFFIX: index}

    def partners(self, name, siblings):
        index = name + INDEX_SUFFIX
        return {"index": index} if (index, "wallaby-index") in siblings else {}
    partner_formats = ("wallaby-index",)
    kinds = ("record",)
    header_size = FULL_HEADER

    def sniff(self, head: bytes) -> bool:
        return _sniff(head, LOG_MAGIC)

    # -- header ------------------------------------------------------------------------------
    def header(self, buf: Buffer, source: str) -> WallabyLogHeader:
        """The header, deciding between the 8- and 16-byte layouts by which one is followed
        by plausible records: the 16-byte seed layout stands unless it reads as garbage
        where the 8-byte layout does not."""
        if len(buf) < SHORT_HEADER:
            raise FormatError(source, 0, f"log header truncated ({len(buf)} of 8 bytes)")
        magic, version, flags = _SHORT_FILE_HEADER.unpack_from(buf, 0)
        if magic != LOG_MAGIC:
            raise FormatError(source, 0, "not a Wallaby log (magic is not 'LOG')")
        if len(buf) < FULL_HEADER:
            return WallabyLogHeader(version, flags, 0, SHORT_HEADER)
        full = self._probe(buf, FULL_HEADER, flags)
        if full != "ok":
            short = self._probe(buf, SHORT_HEADER, flags, plausible_times=True)
            if short == "ok" or (full == "garbage" and short == "torn"):
                return WallabyLogHeader(version, flags, 0, SHORT_HEADER)
        ttl = _TIME.unpack_from(buf, 8)[0]
        return WallabyLogHeader(version, flags, ttl, FULL_HEADER)

    def _probe(self, buf: Buffer, start: int, flags: int, plausible_times: bool = False) -> str:
        """How the first few records from ``start`` look: "ok", "torn" (cut short by the end
        of the file, as a crash leaves it) or "garbage" (another layout's bytes). Records must
        carry the file's flags; with ``plausible_times`` also a time beyond the epoch's first
        seconds (the short layout misreads a 16-byte header's TTL as a record of time < 2**32)."""
        n = 0
        try:
            for _pos, _size, rec_flags, t in self._walk(buf, "", start, None):
                if rec_flags != flags or (plausible_times and -2**32 < t < 2**32):
                    return "garbage"
                n += 1
                if n >= LAYOUT_PROBE_RECORDS:
                    break
        except FormatError as exc:
            if exc.offset + RECORD_HEADER > len(buf) and "truncated" in exc.reason:
                return "torn"
            size = _SIZE.unpack_from(buf, exc.offset)[0] if exc.offset + 4 <= len(buf) else 0
            torn = "runs past the end" in exc.reason and size <= MAX_PLAUSIBLE_PAYLOAD
            return "torn" if torn else "garbage"
        return "ok"

    # -- reading -----------------------------------------------------------------------------
    def _walk(self, buf: Buffer, source: str, pos: int, stop: int | None
              ) -> Iterator[tuple[int, int, int, int]]:
        """(offset, payload size, flags, time) of each record from ``pos``; ends quietly at
        the end of the buffer or at a zero-filled tail, raises at damage."""
        end = len(buf)
        limit = end if stop is None else min(stop, end)
        unpack = _RECORD_HEADER.unpack_from
        while pos < limit:
            if pos + RECORD_HEADER > end:
                self._check_tail(buf, source, pos)
                return
            size, flags, t = unpack(buf, pos)
            if size == 0 and t == 0:
                self._check_tail(buf, source, pos)
                return
            nxt = pos + RECORD_HEADER + size
            if nxt > end:
                left = end - pos - RECORD_HEADER
                raise FormatError(source, pos, f"record payload of {size} bytes runs past the "
                                               f"end of the file ({left} left)")
            yield pos, size, flags, t
            pos = nxt

    @staticmethod
    def _check_tail(buf: Buffer, source: str, pos: int) -> None:
        """A tail of zeros is the pre-extended end of data; anything else there is damage."""
        if _all_zero_from(buf, pos):
            return
        left = len(buf) - pos
        if left < RECORD_HEADER:
            raise FormatError(source, pos, f"record header truncated ({left} of 16 bytes)")
        raise FormatError(source, pos, "non-zero data after the end-of-data marker "
                                       "(zero size and time): a gap in the log")

    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Iterator[Record]:
        if start is None:
            start = self.header(buf, source).size
        data = _bytes_view(buf)
        for pos, size, flags, t in self._walk(buf, source, start, stop):
            body = pos + RECORD_HEADER
            yield {"format": self.name, "seq": seq, "offset": pos, "kind": "record",
                   "time": t, "flags": flags, "payload": bytes(data[body:body + size])}
            seq += 1

    def read_columns(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
                     stop: int | None = None, limit: int | None = None) -> Columns:
        """Vectorised: a tight walk over the size fields finds the record boundaries, then
        numpy gathers every header at once and checks them all (end marker, torn tail)."""
        error = None
        next_offset = None
        # bytes/mmap slices are bytes: the walk itself cuts the payloads (no second pass)
        sliced: list[bytes] | None = [] if isinstance(buf, (bytes, mmap.mmap)) else None
        try:
            if start is None:
                start = self.header(buf, source).size
            offs, heads, times, next_offset = self._boundaries(buf, source, start, stop, limit, sliced)
        except FormatError as exc:
            error = exc
            empty = np.zeros(0, np.int64)
            offs, heads, times = getattr(exc, "columns", (empty, empty.view(np.uint64), empty))
        rows = len(offs)
        done = 0 if sliced is None else min(len(sliced), rows)  # rows the walk cut already
        if sliced is not None and done == rows:
            payload = sliced if len(sliced) == rows else sliced[:rows]
        else:
            sizes = (heads[done:] & 0xFFFFFFFF).astype(np.int64)
            bodies = offs[done:] + RECORD_HEADER
            payload = slice_payloads(buf, bodies, bodies + sizes)
            if done:
                payload = sliced[:done] + payload
        columns = {"format": _constant(self.name, rows),
                   "seq": np.arange(seq, seq + rows, dtype=np.int64), "offset": offs,
                   "kind": _constant("record", rows), "time": times,
                   "flags": (heads >> np.uint64(32)).astype(np.uint32), "payload": payload}
        return Columns(columns, rows, next_offset, seq + rows, error)

    def _boundaries(self, buf: Buffer, source: str, pos: int, stop: int | None,
                    limit: int | None, payloads: list[bytes] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
        """(offsets, size|flags<<32 words, times) of the records from ``pos``, and where a next
        call resumes (None = done). On damage the FormatError carries the valid prefix's
        arrays as ``.columns``. With a ``payloads`` list (``buf`` bytes or mmap) the walk
        appends the payloads of the walked records to it, from the first, until a record runs
        past the end or has size 0 (maybe the end-of-data marker, after which sizes are not to
        be trusted): so it never copies bytes ``read`` would not; the caller cuts the rest."""
        end = len(buf)
        bound = end if stop is None else min(stop, end)
        max_rows = end if limit is None else limit
        last_header = end - RECORD_HEADER
        unpack = _SIZE.unpack_from
        walked: list[int] = []
        append = walked.append
        # the hot loop: follow the size fields only; every other check is vectorised below
        walk_until = min(bound, last_header + 1)  # one comparison per record
        if payloads is None:
            for _ in range(max_rows):
                if pos >= walk_until:
                    break
                append(pos)
                pos += RECORD_HEADER + unpack(buf, pos)[0]
        else:
            keep, header = payloads.append, RECORD_HEADER  # locals: cheaper than globals
            for _ in range(max_rows):
                if pos >= walk_until:
                    break
                append(pos)
                body = pos + header
                pos = body + unpack(buf, pos)[0]
                # past the end (damage) or size 0 (maybe the end-of-data marker, after which
                # lengths are not to be trusted): slice no further, just walk
                if pos > end or pos == body:
                    break
                keep(buf[body:pos])
            for _ in range(max_rows - len(walked)):
                if pos >= walk_until:
                    break
                append(pos)
                pos += RECORD_HEADER + unpack(buf, pos)[0]
        offs = np.array(walked, dtype=np.int64)
        heads = _gather_u64(buf, offs)
        times = _gather_u64(buf, offs + 8).view(np.int64)
        # the end-of-data marker: zero size and zero time
        marker = np.flatnonzero(((heads & 0xFFFFFFFF) == 0) & (times == 0))
        if len(marker):
            cut = int(marker[0])
            offs, heads, times = offs[:cut], heads[:cut], times[:cut]
            self._check_damage(buf, source, int(walked[cut]), None, (offs, heads, times))
            return offs, heads, times, None
        if len(offs) and pos > end:  # the last record walked runs past the end
            self._check_damage(buf, source, int(offs[-1]), pos,
                               (offs[:-1], heads[:-1], times[:-1]))
        if pos < bound and len(walked) < max_rows:  # stopped short of a whole header
            self._check_damage(buf, source, pos, None, (offs, heads, times))
        done = pos >= bound or (pos > last_header and len(walked) < max_rows)
        return offs, heads, times, None if done else pos

    def _header_batches(self, buf: Buffer, source: str, pos: int
                        ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, FormatError | None]]:
        """(offsets, size|flags<<32 words, times, damage) of the records from ``pos`` in
        batches of :data:`VALIDATE_BATCH`, without payloads; the damage (or None) that ends
        the walk comes with the last batch. The same records as one :meth:`_boundaries`."""
        while True:
            try:
                offs, heads, times, nxt = self._boundaries(buf, source, pos, None, VALIDATE_BATCH)
            except FormatError as exc:
                yield (*exc.columns, exc)
                return
            yield offs, heads, times, None
            if nxt is None or (not len(offs) and nxt == pos):
                return
            pos = nxt

    def _check_damage(self, buf: Buffer, source: str, pos: int, runs_to: int | None,
                      prefix: tuple) -> None:
        try:
            if runs_to is not None:
                size = runs_to - pos - RECORD_HEADER
                raise FormatError(source, pos, f"record payload of {size} bytes runs past the "
                                               f"end of the file ({len(buf) - pos - 16} left)")
            self._check_tail(buf, source, pos)
        except FormatError as exc:
            exc.columns = prefix
            raise

    # -- writing -----------------------------------------------------------------------------
    def write(self, records: Sequence[Record], flags: int = 0, ttl_ns: int = 0,
              version: int = VERSION, **_: Any) -> bytes:
        """The seed's 16-byte header, then each record (its own ``flags`` if it has them)."""
        parts = [_FILE_HEADER.pack(LOG_MAGIC, version, flags, ttl_ns)]
        for rec in records:
            payload = bytes(rec.get("payload") or b"")
            parts.append(_RECORD_HEADER.pack(len(payload), rec.get("flags", flags), rec["time"]))
            parts.append(payload)
        return b"".join(parts)

    # -- validation and recovery -------------------------------------------------------------
    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        findings: list[Finding] = []
        try:
            head = self.header(buf, source)
        except FormatError as exc:
            return [Finding(exc.offset, exc.reason)]
        if head.version != VERSION:
            findings.append(Finding(3, f"unknown log version {head.version}", "warning"))
        # batch by batch, keeping counts and first offsets only: memory stays flat in file size
        error = None
        odd_count, odd_first = 0, None
        expired_count, expired_first = 0, None
        expiry_clock = context.get("now_ns")
        if expiry_clock is None:
            expiry_clock = _time.time_ns()  # one "now" for every batch
        pace = context.get("pace")  # called after each batch: the caller may drop pages then
        index = context.get("index")
        starts = RecordStarts(buf, "<u4", RECORD_HEADER) if index is not None else None
        for offs, heads, times, error in self._header_batches(buf, source, head.size):
            if starts is not None:
                starts.extend(offs)
            if pace is not None:
                pace()
            odd = np.flatnonzero((heads >> np.uint64(32)) != head.flags)
            if len(odd) and odd_first is None:
                odd_first = int(offs[odd[0]])
            odd_count += len(odd)
            expired = np.flatnonzero(_expired_mask(times, head.ttl_ns, expiry_clock))
            if len(expired) and expired_first is None:
                expired_first = int(offs[expired[0]])
            expired_count += len(expired)
        if error is not None:
            findings.append(Finding(error.offset, error.reason))
        if odd_count:
            findings.append(Finding(odd_first, f"{odd_count} record(s) carry flags other than "
                                               f"the log's ({head.flags})", "warning"))
        if expired_count:
            findings.append(Finding(expired_first, f"{expired_count} record(s) expired "
                                                   f"(TTL {head.ttl_ns} ns)", "warning"))
        if index is not None:
            findings.extend(_index_vs_log(index, buf, source, from_log=True,
                                          log_starts=(starts, error), pace=pace).findings)
        return findings

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """Truncate a torn final record or a zero-filled tail; with ``compact_expired=True``
        also drop records past their TTL. Any other damage is left alone (the records after
        it cannot be told from garbage, and dropping them could lose valid data)."""
        try:
            head = self.header(buf, source)
        except FormatError:
            return None  # no header to keep: nothing safe to do
        cols = self.read_columns(buf, source)
        actions: list[str] = []
        cut = len(buf)
        if cols.error is not None:
            if not _is_torn_tail(buf, cols.error, head.flags, context.get("index")):
                return None
            cut = cols.error.offset
            actions.append(f"truncated the torn final record at byte {cut} "
                           f"({len(buf) - cut} bytes)")
        else:
            end = _record_end(cols)
            if end is None:
                end = head.size
            if end < len(buf):
                cut = end
                actions.append(f"trimmed {len(buf) - end} bytes of zero-filled tail at byte {end}")
        data = bytes(_bytes_view(buf)[:cut])
        if context.get("compact_expired"):
            data, dropped = self._compact(data, source, head, cols, context.get("now_ns"))
            if dropped:
                actions.append(f"dropped {dropped} expired record(s) (TTL {head.ttl_ns} ns); "
                               "the log's index must be rebuilt")
        return Repair(data, actions) if actions else None

    def _compact(self, data: bytes, source: str, head: WallabyLogHeader, cols: Columns,
                 now_ns: int | None) -> tuple[bytes, int]:
        expired = _expired_mask(cols.data["time"], head.ttl_ns, now_ns)
        if not expired.any():
            return data, 0
        keep = np.flatnonzero(~expired)
        parts = [data[:head.size]]
        offs, sizes = cols.data["offset"], [len(p) for p in cols.data["payload"]]
        for i in keep.tolist():
            a = int(offs[i])
            parts.append(data[a:a + RECORD_HEADER + sizes[i]])
        return b"".join(parts), int(expired.sum())


def _gather_u64(buf: Buffer, offsets: np.ndarray) -> np.ndarray:
    """The little-endian u64 at every (unaligned) byte offset, each ``offset + 8 <= len``:
    the two aligned words around it, shifted together."""
    count = len(buf) // 8
    if not len(offsets):
        return np.zeros(0, np.uint64)
    words = np.frombuffer(buf, dtype="<u8", count=count)
    index = offsets >> 3
    shift = (offsets & 7).astype(np.uint64) << np.uint64(3)
    out = words[index] >> shift
    # the high word's bytes; two shifts so a zero ``shift`` moves them out entirely
    high = words[np.minimum(index + 1, count - 1)]
    out |= (high << (np.uint64(63) - shift)) << np.uint64(1)
    for i in np.flatnonzero((index + 1 >= count) & (shift != 0)).tolist():
        out[i] = struct.unpack_from("<Q", buf, int(offsets[i]))[0]  # ends in the last bytes
    return out


def _constant(value: str, rows: int) -> np.ndarray:
    """A column holding one string on every row, without materialising the rows."""
    return np.broadcast_to(np.array(value, dtype=object), (rows,))


def _record_end(cols: Columns) -> int | None:
    if cols.rows == 0:
        return None
    return int(cols.data["offset"][-1]) + RECORD_HEADER + len(cols.data["payload"][-1])


def _is_torn_tail(buf: Buffer, error: FormatError, flags: int, index: Buffer | None) -> bool:
    """Damage that can only be a final record cut short by a crash: a header cut by the end
    of the file, or a whole header with the log's flags whose payload (within the original
    writer's 64 KiB cap, so not a flipped size) runs past the end; and no index entry points
    beyond it (which would prove records follow)."""
    if error.reason.startswith("record header truncated"):
        torn = True
    elif "runs past the end" in error.reason:
        size, rec_flags = struct.unpack_from("<II", buf, error.offset)
        torn = rec_flags == flags and size <= MAX_PLAUSIBLE_PAYLOAD
    else:
        return False
    if not torn or index is None:
        return torn
    entries = WallabyIndex().read_columns(index, "index")
    return not (entries.data["log_offset"] > error.offset).any()


def _expired_mask(times: np.ndarray, ttl_ns: int, now_ns: int | None) -> np.ndarray:
    if ttl_ns <= 0:
        return np.zeros(len(times), bool)
    now = _time.time_ns() if now_ns is None else now_ns
    # now > time + ttl  <=>  time < now - ttl; clip so the threshold fits in int64
    threshold = max(min(now - ttl_ns, 2**63 - 1), -2**63)
    return times < np.int64(threshold)


# -- the index ----------------------------------------------------------------------------------

class WallabyIndex(Codec):
    name = "wallaby-index"
    in_file_order = True
    paces_validation = True  # validate() calls its ``pace`` keyword after each step
    derived = True
    columns = ColumnMap(time="time", time_unit="ns", id="index")

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """The index of a log of 58-byte items, seconds apart."""
        times = samples.BASE_NS + np.cumsum(np.random.default_rng(rng.randrange(2**32)).integers(
            1, 5_000_000_000, count, dtype=np.int64))
        offsets = 16 + np.arange(count, dtype=np.int64) * (16 + 58)
        return build_index(Columns({"time": times, "offset": offsets}, count, None, count))

    def partners(self, name, siblings):
        log = name[:-len(INDEX_SUFFIX)] if name.endswith(INDEX_SUFFIX) else None
        return {"log": log} if log and (log, "wallaby-log") in siblings else {}
    partner_formats = ("wallaby-log",)
    kinds = ("index",)
    record_size = INDEX_RECORD
    header_size = FULL_HEADER

    def sniff(self, head: bytes) -> bool:
        return _sniff(head, IDX_MAGIC)

    def header(self, buf: Buffer, source: str) -> tuple[int, int, int]:
        """(version, flags, ttl_ns)."""
        if len(buf) < FULL_HEADER:
            raise FormatError(source, 0, f"index header truncated ({len(buf)} of 16 bytes)")
        magic, version, flags, ttl = _FILE_HEADER.unpack_from(buf, 0)
        if magic != IDX_MAGIC:
            raise FormatError(source, 0, "not a Wallaby index (magic is not 'IDX')")
        return version, flags, ttl

    def _span(self, buf: Buffer, source: str, start: int | None, stop: int | None
              ) -> tuple[int, int, FormatError | None]:
        """(first record offset, whole records before ``stop``, damage after them)."""
        if start is None:
            self.header(buf, source)
            start = FULL_HEADER
        if start < FULL_HEADER or (start - FULL_HEADER) % INDEX_RECORD:
            raise FormatError(source, start, "not an index record boundary")
        end = len(buf)
        whole = max(0, end - start) // INDEX_RECORD
        error = None
        if start + whole * INDEX_RECORD < end:
            torn = start + whole * INDEX_RECORD
            error = FormatError(source, torn, f"index record truncated ({end - torn} of 24 bytes)")
        if stop is not None:
            wanted = max(0, -(-(stop - start) // INDEX_RECORD))
            if wanted < whole:
                whole, error = wanted, None
        return start, whole, error

    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Iterator[Record]:
        start, count, error = self._span(buf, source, start, stop)
        unpack = _INDEX_RECORD.unpack_from
        for i in range(count):
            pos = start + i * INDEX_RECORD
            t, number, log_offset = unpack(buf, pos)
            yield {"format": self.name, "seq": seq + i, "offset": pos, "kind": "index",
                   "time": t, "index": number, "log_offset": log_offset}
        if error is not None:
            raise error

    def read_columns(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
                     stop: int | None = None, limit: int | None = None) -> Columns:
        """One ``np.frombuffer`` with a structured dtype over every whole record."""
        try:
            start, count, error = self._span(buf, source, start, stop)
        except FormatError as exc:
            return _index_columns(np.zeros(0, INDEX_DTYPE), self.name, 0, seq, None, exc)
        next_offset = None
        if limit is not None and limit < count:
            count, error, next_offset = limit, None, start + limit * INDEX_RECORD
        table = np.frombuffer(buf, dtype=INDEX_DTYPE, count=count, offset=start) if count \
            else np.zeros(0, INDEX_DTYPE)
        return _index_columns(table, self.name, start, seq, next_offset, error)

    def write(self, records: Sequence[Record], flags: int = 0, ttl_ns: int = 0,
              version: int = VERSION, **_: Any) -> bytes:
        table = np.zeros(len(records), INDEX_DTYPE)
        for name in INDEX_DTYPE.names:
            table[name] = [r[name] for r in records]
        return index_file(table, flags, ttl_ns, version)

    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        findings: list[Finding] = []
        try:
            version, _flags, _ttl = self.header(buf, source)
        except FormatError as exc:
            return [Finding(exc.offset, exc.reason)]
        if version != VERSION:
            findings.append(Finding(3, f"unknown index version {version}", "warning"))
        error = self._span(buf, source, None, None)[2]  # fixed-width: no walk needed
        if error is not None:
            findings.append(Finding(error.offset, error.reason))
        log = context.get("log")
        if log is not None:
            findings.extend(_index_vs_log(buf, log, source, from_log=False,
                                          pace=context.get("pace")).findings)
        return findings

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """With ``log=``: rebuild the index from the log when it lags, mismatches or is torn.
        Without it: only drop a torn final index record."""
        log = context.get("log")
        if log is None:
            cols = self.read_columns(buf, source)
            if cols.error is None or not cols.error.reason.startswith("index record truncated"):
                return None
            cut = cols.error.offset
            return Repair(bytes(_bytes_view(buf)[:cut]),
                          [f"dropped the torn final index record at byte {cut}"])
        check = _index_vs_log(buf, log, source, from_log=False)
        if not check.needs_rebuild:
            return None
        try:
            _version, flags, ttl = self.header(buf, source)
        except FormatError:
            head = WallabyLog().header(log, "log")
            flags, ttl = head.flags, head.ttl_ns
        log_cols = WallabyLog().read_columns(log, "log")
        new = build_index(log_cols, flags=flags, ttl_ns=ttl)
        return Repair(new, [f"rebuilt the index from the log ({log_cols.rows} records): "
                            + "; ".join(check.reasons)])


def _index_columns(table: np.ndarray, name: str, start: int, seq: int,
                   next_offset: int | None, error: FormatError | None) -> Columns:
    rows = len(table)
    # the field columns are zero-copy strided views of the buffer (read-only for an mmap)
    data = {"format": _constant(name, rows), "seq": np.arange(seq, seq + rows, dtype=np.int64),
            "offset": np.arange(start, start + INDEX_RECORD * rows, INDEX_RECORD, dtype=np.int64),
            "kind": _constant("index", rows),
            "time": table["time"], "index": table["index"], "log_offset": table["log_offset"]}
    return Columns(data, rows, next_offset, seq + rows, error)


# -- index <-> log consistency -------------------------------------------------------------------

class IndexCheck:
    """Findings of comparing an index with its log, and whether a rebuild would fix them."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.reasons: list[str] = []
        self.needs_rebuild = False

    def problem(self, offset: int, reason: str, severity: str = "error") -> None:
        self.findings.append(Finding(offset, reason, severity))
        self.reasons.append(reason)
        self.needs_rebuild = True


def _index_vs_log(index: Buffer, log: Buffer, source: str, from_log: bool,
                  log_starts: "tuple[RecordStarts, FormatError | None] | None" = None,
                  pace: Callable[[], None] | None = None) -> IndexCheck:
    """Every index entry must name a log record header with the same time, numbers must run
    0..n-1, and the index must cover every log record. Finding offsets are in ``source``
    (the index unless ``from_log``).

    Streams both files: the log's record starts are a :class:`RecordStarts` (``log_starts``
    when the caller already walked the log), the index is read :data:`INDEX_CHUNK` entries at
    a time, and only counts and first offenders are kept, so memory does not grow with
    either file. ``pace`` is called after each chunk (the caller may drop pages then)."""
    check = IndexCheck()
    starts, log_error = log_starts if log_starts is not None else _log_starts(log, pace)
    codec = WallabyIndex()
    rows, last_at = 0, -1
    idx_error = None
    bad_count, bad_first = 0, None       # (entry, its offset, its log offset)
    gap_first = None                     # (entry, its offset, its number)
    renumbered_first = None              # (entry, its offset, its log offset)
    for cols in codec.scan(index, "index", rows=INDEX_CHUNK):
        idx_error = cols.error
        if cols.rows:
            entry_offs, numbers = cols.data["offset"], cols.data["index"]
            targets, times = cols.data["log_offset"], cols.data["time"]
            at, found = starts.rank(targets)
            bad = ~found
            # a found target is a record start: its time is the i64 8 bytes in
            bad[found] = _gather_u64(log, targets[found] + 8).view(np.int64) != times[found]
            if bad.any():
                if bad_first is None:
                    i = int(np.flatnonzero(bad)[0])
                    bad_first = (rows + i, int(entry_offs[i]), int(targets[i]))
                bad_count += int(bad.sum())
            if gap_first is None:
                gaps = numbers != np.arange(rows, rows + cols.rows, dtype=np.uint64)
                if gaps.any():
                    i = int(np.flatnonzero(gaps)[0])
                    gap_first = (rows + i, int(entry_offs[i]), int(numbers[i]))
            if renumbered_first is None:
                renumbered = at != numbers.astype(np.int64)
                if renumbered.any():
                    i = int(np.flatnonzero(renumbered)[0])
                    renumbered_first = (rows + i, int(entry_offs[i]), int(targets[i]))
            last_at = int(at[-1])
            rows += cols.rows
        if pace is not None:
            pace()
    if idx_error is not None:
        check.problem(idx_error.offset if not from_log else 0,
                      f"index damaged: {idx_error.reason}")
    if bad_first is not None:
        first, entry_off, target = bad_first
        where = entry_off if not from_log else _within(target, log)
        check.problem(where, f"{bad_count} index entr(y/ies) do not match a log record "
                             f"(first: entry {first} -> log byte {target})")
    if gap_first is not None:
        first, entry_off, number = gap_first
        check.problem(entry_off if not from_log else 0,
                      f"index numbers are not contiguous 0..{rows - 1} "
                      f"(entry {first} says {number})")
    elif bad_first is None and renumbered_first is not None:
        first, entry_off, target = renumbered_first
        where = entry_off if not from_log else _within(target, log)
        check.problem(where,
                      f"index numbers do not match log record numbers from entry {first} "
                      "(numbering restarted after a reopen?)", "warning")
    covered = last_at + 1 if rows and bad_first is None else rows
    lag = starts.count - covered
    if lag > 0:
        first_missing = starts.at_rank(covered) if covered < starts.count else 0
        check.problem(first_missing if from_log else len(index),
                      f"index lags the log: {lag} log record(s) not indexed", "warning")
    if log_error is not None and not from_log:
        check.findings.append(Finding(0, f"log damaged: {log_error.reason}", "warning"))
    return check


def _log_starts(log: Buffer, pace: Callable[[], None] | None = None
                ) -> tuple[RecordStarts, FormatError | None]:
    """Where a log's records start (its valid prefix, as a :class:`RecordStarts`) and the
    damage that ends it."""
    codec = WallabyLog()
    starts = RecordStarts(log, "<u4", RECORD_HEADER)
    try:
        start = codec.header(log, "log").size
    except FormatError as exc:
        return starts, exc
    error = None
    for offs, _heads, _times, error in codec._header_batches(log, "log", start):
        starts.extend(offs)
        if pace is not None:
            pace()
    return starts, error


def _within(offset: int, buf: Buffer) -> int:
    """``offset`` when it lies in ``buf``, else the end of ``buf`` (findings name real bytes)."""
    return offset if 0 <= offset <= len(buf) else len(buf)


def build_index(log_cols: Columns, flags: int = 0, ttl_ns: int = 0) -> bytes:
    """An index file covering every record of a log given as :meth:`WallabyLog.read_columns`."""
    table = np.zeros(log_cols.rows, INDEX_DTYPE)
    table["time"] = log_cols.data["time"]
    table["index"] = np.arange(log_cols.rows, dtype=np.uint64)
    table["log_offset"] = log_cols.data["offset"]
    return index_file(table, flags, ttl_ns)


def index_file(table: np.ndarray, flags: int = 0, ttl_ns: int = 0, version: int = VERSION) -> bytes:
    """A whole index file of ``table`` (rows of :data:`INDEX_DTYPE`), in one pass."""
    return _FILE_HEADER.pack(IDX_MAGIC, version, flags, ttl_ns) + table.tobytes()


def write_log_and_index(items: Iterable[tuple[int, bytes]], flags: int = 0,
                        ttl_ns: int = 0) -> tuple[bytes, bytes]:
    """A log (16-byte header) of ``(time_ns, payload)`` items and its matching index."""
    records = [{"time": t, "payload": p} for t, p in items]
    log = WallabyLog().write(records, flags=flags, ttl_ns=ttl_ns)
    return log, build_index(WallabyLog().read_columns(log, "log"), flags=flags, ttl_ns=ttl_ns)


# -- samples (the demo tree, tests and benches) ----------------------------------------------------

def sample_items(rng: random.Random, count: int, payload: tuple[int, int] = (16, 100)
          ) -> Iterator[tuple[int, bytes]]:
    """``count`` (time in ns, payload) items, seconds apart, realistic JSON payloads."""
    now = samples.BASE_NS
    for _ in range(count):
        now += rng.randint(1, 5_000_000_000)
        yield now, samples.text(rng, *payload)


def big_index(count: int) -> bytes:
    """A valid Wallaby index of ``count`` records (for a log of 40-byte records), built in one
    numpy pass: the big views of the tests and benches."""
    table = np.zeros(count, INDEX_DTYPE)
    table["time"] = 1_700_000_000_000_000_000 + np.arange(count, dtype=np.int64) * 1000
    table["index"] = np.arange(count, dtype=np.uint64)
    table["log_offset"] = 16 + np.arange(count, dtype=np.int64) * 40
    return index_file(table)
