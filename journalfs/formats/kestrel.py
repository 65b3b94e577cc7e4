"""Kestrel 3 (libkestrel) queue journals: writer files ``Q.<ms>`` and reader files ``Q.read.<name>``.

Byte facts are in ``specs/kestrel.md``. Both file types share one low-level framing: a 4-byte
magic, then records of ``command byte = (command << 4) | W``, ``4 * W`` little-endian header
bytes and, for commands >= 8, as many data bytes as the first header word says. A 0x00 byte
where a command is expected is the clean end of data (writers pre-allocate zero-filled space).
"""
from __future__ import annotations

import mmap
import struct
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .base import Buffer, Codec, Columns, Finding, FormatError, Record, Repair

WRITER_MAGIC = bytes.fromhex("27642603")
READER_MAGIC = bytes.fromhex("263c2603")
MAGIC_SIZE = 4
#: Payloads (and any data block) above this are damage, as in the original reader and writer.
MAX_DATA = 16 * 1024 * 1024

CMD_READ_HEAD = 0
CMD_PUT = 8
CMD_READ_DONE = 9
#: Command bytes of the two PUT shapes: without (W=6) and with (W=8) an expiry time.
PUT_BYTE = (CMD_PUT << 4) | 6
PUT_EXPIRY_BYTE = (CMD_PUT << 4) | 8

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
#: Per command byte: the fixed size of a well-formed PUT record of that byte, 0 for other bytes.
_PUT_HEADER_BYTES = tuple(25 if b == PUT_BYTE else 33 if b == PUT_EXPIRY_BYTE else 0 for b in range(256))
_I64 = struct.Struct("<q")
_PUT_HEADER = struct.Struct("<iiqq")  # data length, error_count, id, add_time
_PUT_EXPIRY = struct.Struct("<iiqqq")
_READ_HEAD = struct.Struct("<Bq")
_READ_DONE = struct.Struct("<Bi")


class Frame(NamedTuple):
    """One low-level record: where it starts, its command, header words, and data span."""

    offset: int
    command: int
    words: int
    data_start: int
    end: int


def check_magic(buf: Buffer, source: str, magic: bytes, what: str) -> None:
    if len(buf) < MAGIC_SIZE or bytes(buf[:MAGIC_SIZE]) != magic:
        raise FormatError(source, 0, f"not a Kestrel {what} file (magic {magic.hex()} missing)")


def frames(buf: Buffer, source: str, start: int | None, stop: int | None) -> Iterator[Frame]:
    """Every record frame from ``start`` until end of file, a 0x00 end marker or ``stop``.

    Raises :class:`FormatError` at a frame whose header or data runs past the end of the buffer
    (a torn write) or whose data length is negative or over 16 MiB.
    """
    size = len(buf)
    pos = MAGIC_SIZE if start is None else start
    if pos < MAGIC_SIZE or pos > size:
        raise FormatError(source, pos, "start offset is outside the file's records")
    limit = size if stop is None else min(stop, size)
    while pos < limit:
        byte = buf[pos]
        if byte == 0:
            return  # zero-filled preallocation: clean end of data
        command, words = byte >> 4, byte & 0xF
        data_start = pos + 1 + 4 * words
        if data_start > size:
            raise FormatError(source, pos, f"torn record: {4 * words} header bytes run past the end of file")
        length = 0
        if command >= 8:
            if words == 0:
                raise FormatError(source, pos, f"command {command} carries data but has no length word")
            length = _I32.unpack_from(buf, pos + 1)[0]
            if length < 0 or length > MAX_DATA:
                raise FormatError(source, pos, f"data length {length} is outside 0..16 MiB")
        end = data_start + length
        if end > size:
            raise FormatError(source, pos, f"torn record: {length} data bytes run past the end of file")
        yield Frame(pos, command, words, data_start, end)
        pos = end


def _bytes(buf: Buffer, start: int, end: int) -> bytes:
    chunk = buf[start:end]
    return chunk if type(chunk) is bytes else bytes(chunk)


def _wrong_file(source: str, frame: Frame, what: str) -> FormatError:
    return FormatError(source, frame.offset, f"command {frame.command} does not belong in a {what} file")


def decode_put(buf: Buffer, source: str, frame: Frame, seq: int) -> Record:
    if frame.words not in (6, 8):
        raise FormatError(source, frame.offset, f"PUT with {frame.words} header words (must be 6 or 8)")
    if frame.words == 8:
        _, error_count, item_id, add_time, expire_time = _PUT_EXPIRY.unpack_from(buf, frame.offset + 1)
    else:
        _, error_count, item_id, add_time = _PUT_HEADER.unpack_from(buf, frame.offset + 1)
        expire_time = None
    return {"format": "kestrel-writer", "seq": seq, "offset": frame.offset, "kind": "put",
            "id": item_id, "add_time": add_time, "expire_time": expire_time,
            "error_count": error_count, "payload": _bytes(buf, frame.data_start, frame.end)}


def decode_reader_record(buf: Buffer, source: str, frame: Frame, seq: int) -> Record:
    base = {"format": "kestrel-reader", "seq": seq, "offset": frame.offset}
    if frame.command == CMD_READ_HEAD:
        if frame.words != 2:
            raise FormatError(source, frame.offset, f"READ_HEAD with {frame.words} header words (must be 2)")
        return {**base, "kind": "read_head", "id": _I64.unpack_from(buf, frame.offset + 1)[0]}
    if frame.words != 1:
        raise FormatError(source, frame.offset, f"READ_DONE with {frame.words} header words (must be 1)")
    length = frame.end - frame.data_start
    if length % 8:
        raise FormatError(source, frame.offset, f"READ_DONE data of {length} bytes is not a whole number of ids")
    ids = np.frombuffer(buf, dtype="<i8", count=length // 8, offset=frame.data_start).tolist() if length else []
    return {**base, "kind": "read_done", "ids": ids}


class KestrelWriter(Codec):
    name = "kestrel-writer"
    kinds = ("put",)
    resumable = True
    header_size = MAGIC_SIZE

    def sniff(self, head: bytes) -> bool:
        return bytes(head[:MAGIC_SIZE]) == WRITER_MAGIC

    def read(self, buf, source, start=None, seq=0, stop=None):
        check_magic(buf, source, WRITER_MAGIC, "writer")
        for frame in frames(buf, source, start, stop):
            if frame.command == CMD_PUT:
                yield decode_put(buf, source, frame, seq)
                seq += 1
            elif frame.command in (CMD_READ_HEAD, CMD_READ_DONE):
                raise _wrong_file(source, frame, "writer")
            # any other command: unknown, skipped by the frame rule

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: one tight loop finds record starts, numpy gathers the fields.

        Anything off the fast path (unknown commands, damage) is handed to :meth:`read`, so the
        result is always exactly what :meth:`read` yields.
        """
        size = len(buf)
        pos = MAGIC_SIZE if start is None else start
        try:
            check_magic(buf, source, WRITER_MAGIC, "writer")
            if pos < MAGIC_SIZE or pos > size:
                raise FormatError(source, pos, "start offset is outside the file's records")
        except FormatError as exc:
            return Columns(_put_columns(buf, [], seq), 0, None, seq, exc)
        end = size if stop is None else min(stop, size)
        wanted = -1 if limit is None else limit
        starts: list[int] = []
        append = starts.append
        unpack_length = _U32.unpack_from
        skip_of = _PUT_HEADER_BYTES
        walk_end = min(end, size - 32)  # the longest PUT header fits before it: no bounds check
        while True:
            # at most this many records fit before ``end``; a for-range is the cheapest loop
            budget = (end - pos) // 25 + 1 if limit is None else limit - len(starts)
            for _ in range(budget):
                if pos >= walk_end:
                    break
                skip = skip_of[buf[pos]]
                if not skip:
                    break
                length = unpack_length(buf, pos + 1)[0]  # unsigned: a negative i32 is huge
                if length > MAX_DATA:
                    break
                after = pos + skip + length
                if after > size:
                    break
                append(pos)
                pos = after
            # off the fast path: read() skips unknown frames, finds the end or names the damage
            try:
                rec = next(self.read(buf, source, pos, seq + len(starts), stop), None)
            except FormatError as exc:
                next_offset, error = None, exc
                break
            if rec is None or len(starts) == wanted:
                next_offset, error = (None if rec is None else rec["offset"]), None
                break
            append(rec["offset"])
            pos = rec["offset"] + 1 + 4 * (buf[rec["offset"]] & 0xF) + len(rec["payload"])
        return Columns(_put_columns(buf, starts, seq), len(starts), next_offset, seq + len(starts), error)

    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        out = bytearray(WRITER_MAGIC)
        for rec in records:
            out += encode_put(rec["id"], rec["payload"], add_time=rec.get("add_time", 0),
                              expire_time=rec.get("expire_time"), error_count=rec.get("error_count", 0))
        return bytes(out)

    def validate(self, buf, source, **context) -> list[Finding]:
        findings: list[Finding] = []
        previous = None
        try:
            for rec in self.read(buf, source):
                if rec["id"] == 0:
                    findings.append(Finding(rec["offset"], "item id is 0 (ids are non-zero)"))
                elif previous is not None and rec["id"] != previous + 1:
                    findings.append(Finding(rec["offset"], f"item id {rec['id']} does not follow {previous}"))
                previous = rec["id"]
        except FormatError:
            return findings  # the damage itself is what read() reports
        findings += _check_zero_tail(buf, source)
        return findings

    def repair(self, buf, source, **context) -> Repair | None:
        return truncate_torn(self, buf, source)


class KestrelReader(Codec):
    name = "kestrel-reader"
    kinds = ("read_head", "read_done")
    resumable = True
    header_size = MAGIC_SIZE

    def sniff(self, head: bytes) -> bool:
        return bytes(head[:MAGIC_SIZE]) == READER_MAGIC

    def read(self, buf, source, start=None, seq=0, stop=None):
        check_magic(buf, source, READER_MAGIC, "reader")
        for frame in frames(buf, source, start, stop):
            if frame.command in (CMD_READ_HEAD, CMD_READ_DONE):
                yield decode_reader_record(buf, source, frame, seq)
                seq += 1
            elif frame.command == CMD_PUT:
                raise _wrong_file(source, frame, "reader")

    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        out = bytearray(READER_MAGIC)
        for rec in records:
            if rec["kind"] == "read_head":
                out += encode_read_head(rec["id"])
            elif rec["kind"] == "read_done":
                out += encode_read_done(rec["ids"])
            else:
                raise ValueError(f"kestrel-reader cannot hold a {rec['kind']!r} record")
        return bytes(out)

    def validate(self, buf, source, **context) -> list[Finding]:
        findings: list[Finding] = []
        head = None
        try:
            records = list(self.read(buf, source))
        except FormatError:
            return findings
        for rec in records:
            if rec["kind"] == "read_head":
                head = rec["id"]
                if head < 0:
                    findings.append(Finding(rec["offset"], f"negative head id {head}"))
                continue
            ids = rec["ids"]
            if len(set(ids)) != len(ids):
                findings.append(Finding(rec["offset"], "READ_DONE lists an id twice", "warning"))
            if any(i <= 0 for i in ids):
                findings.append(Finding(rec["offset"], "READ_DONE lists an id that is not positive"))
            if head is not None and any(i <= head for i in ids):
                findings.append(Finding(rec["offset"], f"READ_DONE id at or below the head {head}"))
        findings += _check_zero_tail(buf, source)
        return findings

    def repair(self, buf, source, **context) -> Repair | None:
        return truncate_torn(self, buf, source)


# -- columns ---------------------------------------------------------------------------------

def field_at(buf: Buffer, offsets: np.ndarray, delta: int, dtype: str) -> np.ndarray:
    """The integers of ``dtype`` at byte ``offsets + delta`` (unaligned), gathered in one step
    through a byte-strided view of the buffer. Callers have checked every position."""
    width = np.dtype(dtype).itemsize
    if not len(offsets):
        return np.zeros(0, dtype=np.dtype(dtype).newbyteorder("="))
    view = np.ndarray(shape=(len(buf) - width + 1,), dtype=dtype, buffer=buf, strides=(1,))
    return view[offsets + delta].astype(np.dtype(dtype).newbyteorder("="))


def slice_payloads(buf: Buffer, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    if isinstance(buf, (bytes, mmap.mmap)):
        return [buf[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    view = memoryview(buf)
    return [view[a:b].tobytes() for a, b in zip(starts.tolist(), ends.tolist())]


def _put_columns(buf: Buffer, starts: list[int], seq: int) -> dict[str, Any]:
    rows = len(starts)
    offsets = np.array(starts, dtype=np.int64)
    has_expiry = field_at(buf, offsets, 0, "u1") == PUT_EXPIRY_BYTE
    lengths = field_at(buf, offsets, 1, "<i4").astype(np.int64)
    expire = np.zeros(rows, dtype=np.int64)
    if has_expiry.any():
        expire[has_expiry] = field_at(buf, offsets[has_expiry], 25, "<i8")
    data_starts = offsets + np.where(has_expiry, 33, 25)
    return {
        "format": ["kestrel-writer"] * rows,
        "seq": np.arange(seq, seq + rows, dtype=np.int64),
        "offset": offsets,
        "kind": ["put"] * rows,
        "id": field_at(buf, offsets, 9, "<i8"),
        "add_time": field_at(buf, offsets, 17, "<i8"),
        # null where the PUT has no expiry; .tolist() gives None there
        "expire_time": np.ma.masked_array(expire, mask=~has_expiry),
        "error_count": field_at(buf, offsets, 5, "<i4"),
        "payload": slice_payloads(buf, data_starts, data_starts + lengths),
    }


# -- writing ---------------------------------------------------------------------------------

def encode_put(item_id: int, payload: bytes, add_time: int = 0, expire_time: int | None = None,
               error_count: int = 0) -> bytes:
    if len(payload) > MAX_DATA:
        raise ValueError(f"payload of {len(payload)} bytes is over Kestrel's 16 MiB limit")
    if expire_time is None:
        head = bytes([PUT_BYTE]) + _PUT_HEADER.pack(len(payload), error_count, item_id, add_time)
    else:
        head = bytes([PUT_EXPIRY_BYTE]) + _PUT_EXPIRY.pack(len(payload), error_count, item_id,
                                                            add_time, expire_time)
    return head + bytes(payload)


def encode_read_head(item_id: int) -> bytes:
    return _READ_HEAD.pack((CMD_READ_HEAD << 4) | 2, item_id)


def encode_read_done(ids: Iterable[int]) -> bytes:
    ids = list(ids)
    data = np.array(ids, dtype="<i8").tobytes()
    if len(data) > MAX_DATA:
        raise ValueError("READ_DONE data over Kestrel's 16 MiB limit")
    return _READ_DONE.pack((CMD_READ_DONE << 4) | 1, len(data)) + data


def build_writer_file(items: Iterable[bytes], first_id: int = 1, add_time: int = 0,
                      expire_time: int | None = None) -> bytes:
    """A writer file holding ``items`` as PUTs with contiguous ids from ``first_id``."""
    out = bytearray(WRITER_MAGIC)
    for n, payload in enumerate(items):
        out += encode_put(first_id + n, payload, add_time, expire_time)
    return bytes(out)


def build_checkpoint(head: int, done_ids: Iterable[int] = ()) -> bytes:
    """A reader file as the original writes a checkpoint: magic + READ_HEAD + READ_DONE."""
    return READER_MAGIC + encode_read_head(head) + encode_read_done(sorted(done_ids))


# -- recovery --------------------------------------------------------------------------------

def truncate_torn(codec: Codec, buf: Buffer, source: str) -> Repair | None:
    """The original writer's rule: cut the file back to the last good record boundary.

    Nothing after the cut is a record :meth:`read` returns; a file without a magic is left alone.
    """
    try:
        for _ in codec.read(buf, source):
            pass
    except FormatError as damage:
        if damage.offset < MAGIC_SIZE:
            return None
        return Repair(_bytes(buf, 0, damage.offset),
                      [f"truncated at byte {damage.offset} (was {len(buf)} bytes): {damage.reason}"])
    return None


def _check_zero_tail(buf: Buffer, source: str) -> list[Finding]:
    """After a 0x00 end marker a pre-allocated file holds only zeros; anything else is odd."""
    last = None
    for frame in frames(buf, source, None, None):
        last = frame
    end = MAGIC_SIZE if last is None else last.end
    if end >= len(buf):
        return []
    tail = np.frombuffer(buf, dtype=np.uint8, offset=end)
    stray = np.flatnonzero(tail)
    if stray.size:
        return [Finding(end + int(stray[0]), "non-zero bytes after the end-of-data marker", "warning")]
    return []


# -- queue state -----------------------------------------------------------------------------

def _writer_order(name: str) -> tuple[int, int | str]:
    suffix = str(name).rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    return (0, int(suffix)) if suffix.isdigit() else (1, str(name))


def queue_state(writer_files: list[tuple[str, list[Record]]], reader_records: list[Record],
                now_ms: int | None = None) -> dict[str, Any]:
    """What one reader sees of a queue (spec "Queue state").

    ``writer_files`` are (file name, PUT records) pairs in any order; ``reader_records`` are the
    reader file's records in file order. ``now_ms`` None means nothing expires. Returns head,
    tail, pending (count of live items), pending_ids, expired (count) and done_ids.
    """
    ordered = sorted(writer_files, key=lambda pair: _writer_order(pair[0]))
    puts = [rec for _, records in ordered for rec in records if rec.get("kind", "put") == "put"]
    newest = next((records for _, records in reversed(ordered) if records), [])
    tail = newest[-1]["id"] if newest else 0
    oldest = next((records for _, records in ordered if records), [])
    floor = oldest[0]["id"] - 1 if oldest else 0
    head = 0
    done: set[int] = set()
    for rec in reader_records:
        if rec["kind"] == "read_head":
            head = rec["id"]
        elif rec["kind"] == "read_done":
            done.update(rec["ids"])
    head = max(min(head, tail), min(floor, tail))
    done = {i for i in done if head < i <= tail}
    live = sorted((rec for rec in puts if rec["id"] > head and rec["id"] not in done),
                  key=lambda rec: rec["id"])
    expired = [rec for rec in live if now_ms is not None and rec.get("expire_time") is not None
               and rec["expire_time"] <= now_ms]
    expired_ids = {rec["id"] for rec in expired}
    pending_ids = [rec["id"] for rec in live if rec["id"] not in expired_ids]
    return {"head": head, "tail": tail, "pending": len(pending_ids), "pending_ids": pending_ids,
            "expired": len(expired), "done_ids": sorted(done)}


def garbage_files(writer_files: list[tuple[str, list[Record]]], heads: list[int]) -> list[str]:
    """Writer files every reader is past (all ids <= min head), except the newest such file."""
    if not heads:
        return []
    low = min(heads)
    ordered = sorted(writer_files, key=lambda pair: _writer_order(pair[0]))
    consumed = [name for name, records in ordered if all(rec["id"] <= low for rec in records)]
    return consumed[:-1]
