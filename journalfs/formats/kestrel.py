"""Kestrel 3 (libkestrel) queue journals: writer files ``Q.<ms>`` and reader files ``Q.read.<name>``.

Byte facts are in ``specs/kestrel.md``. Both file types share one low-level framing: a 4-byte
magic, then records of ``command byte = (command << 4) | W``, ``4 * W`` little-endian header
bytes and, for commands >= 8, as many data bytes as the first header word says. A 0x00 byte
where a command is expected is the clean end of data (writers pre-allocate zero-filled space).
"""
from __future__ import annotations

import mmap
import random
import re
import struct
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from .base import (Buffer, Codec, ColumnMap, Columns, Finding, FormatError, IntLists, Record, Repair,
                   field_at, slice_payloads, start_offset)
from . import samples
from .spans import paused_gc

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
_I64 = struct.Struct("<q")
_PUT_HEADER = struct.Struct("<iiqq")  # data length, error_count, id, add_time
_PUT_EXPIRY = struct.Struct("<iiqqq")
#: Whole PUT headers including the command byte, for the per-record fast path of read().
_PUT_RECORD = struct.Struct("<Biiqq")
_PUT_EXPIRY_RECORD = struct.Struct("<Biiqqq")
PUT_HEADER_SIZE = _PUT_RECORD.size  # 25
PUT_EXPIRY_HEADER_SIZE = _PUT_EXPIRY_RECORD.size  # 33
#: Command byte and data length: all the boundary walk reads per record.
_COMMAND_LENGTH = struct.Struct("<BI")
#: Added to the position after any byte that does not start a PUT: far past every buffer, so
#: the speculative walk stops right after recording that position (which is then rejected).
_NOT_A_PUT = 1 << 62
#: Per command byte: the header size of a PUT of that byte, _NOT_A_PUT for other bytes.
_PUT_HEADER_OF = tuple(PUT_HEADER_SIZE if b == PUT_BYTE else PUT_EXPIRY_HEADER_SIZE
                       if b == PUT_EXPIRY_BYTE else _NOT_A_PUT for b in range(256))
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
    pos = start_offset(source, start, MAGIC_SIZE, size)
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


def reader_frames(buf: Buffer, source: str, start: int | None, stop: int | None) -> Iterator[Frame]:
    """The frames of a reader file's records, each checked (damage raises); unknown commands
    are skipped by the frame rule."""
    check_magic(buf, source, READER_MAGIC, "reader")
    for frame in frames(buf, source, start, stop):
        if frame.command == CMD_READ_HEAD:
            if frame.words != 2:
                raise FormatError(source, frame.offset, f"READ_HEAD with {frame.words} header words (must be 2)")
        elif frame.command == CMD_READ_DONE:
            if frame.words != 1:
                raise FormatError(source, frame.offset, f"READ_DONE with {frame.words} header words (must be 1)")
            length = frame.end - frame.data_start
            if length % 8:
                raise FormatError(source, frame.offset, f"READ_DONE data of {length} bytes is not a whole number of ids")
        elif frame.command == CMD_PUT:
            raise _wrong_file(source, frame, "reader")
        else:
            continue
        yield frame


def decode_reader_record(buf: Buffer, frame: Frame, seq: int) -> Record:
    """The record of a frame :func:`reader_frames` yielded."""
    base = {"format": "kestrel-reader", "seq": seq, "offset": frame.offset}
    if frame.command == CMD_READ_HEAD:
        return {**base, "kind": "read_head", "id": _I64.unpack_from(buf, frame.offset + 1)[0]}
    return {**base, "kind": "read_done", "ids": done_ids(buf, frame)}


def done_ids(buf: Buffer, frame: Frame) -> list[int]:
    """The ids of a checked READ_DONE frame."""
    count = (frame.end - frame.data_start) // 8
    return np.frombuffer(buf, dtype="<i8", count=count, offset=frame.data_start).tolist() if count else []


#: The file name rule (one definition; Spark's queue table matches the same suffixes):
#: writer files ``Q.<digits>``, reader files ``Q.read.<reader>``; ``~~`` marks temp files.
WRITER_SUFFIX = r"\.(\d+)$"
READER_SUFFIX = r"\.read\.([^/~]*)$"
_WRITER_NAME = re.compile(r"^(?P<queue>[^.~]+)" + WRITER_SUFFIX)
_READER_NAME = re.compile(r"^(?P<queue>[^~]+?)" + READER_SUFFIX)


def queue_name(name: str) -> str | None:
    """The queue a Kestrel file belongs to, from its name: ``Q.<digits>`` (a writer file) or
    ``Q.read.<reader>`` (a reader checkpoint); None for anything else (``~~`` temp files)."""
    name = name.rsplit("/", 1)[-1]
    if "~~" in name:  # a checkpoint's leftover temp file
        return None
    m = _READER_NAME.match(name) or _WRITER_NAME.match(name)
    return m.group("queue") if m else None


class _QueueFile:
    def file_key(self, name: str) -> str | None:
        return queue_name(name)


class KestrelWriter(_QueueFile, Codec):
    name = "kestrel-writer"
    paces_validation = True  # validate() calls its ``pace`` keyword after each batch
    in_file_order = True
    columns = ColumnMap(time="add_time", time_unit="ms", id="id")
    kinds = ("put",)
    magics = (WRITER_MAGIC,)
    header_size = MAGIC_SIZE

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        return self.write(sample_puts(rng, count, payload=samples.SAMPLE_PAYLOAD))

    def demo_files(self, rng, described):
        """A queue ``jobs`` (see :func:`queue_demo_files`), writer and reader files both."""
        return {f"queues/{n}": d for n, d in queue_demo_files(rng).items()}

    def read(self, buf, source, start=None, seq=0, stop=None):
        check_magic(buf, source, WRITER_MAGIC, "writer")
        size = len(buf)
        pos = start_offset(source, start, MAGIC_SIZE, size)
        end = size if stop is None else min(stop, size)
        copy = type(buf[0:0]) is not bytes  # memoryview/bytearray slices must become bytes
        unpack_put, unpack_expiry = _PUT_RECORD.unpack_from, _PUT_EXPIRY_RECORD.unpack_from
        while pos < end:
            # fast path: a well-formed PUT decoded in one unpack; anything else goes through
            # the exact frame rules below, which also name any damage
            command = buf[pos]
            length = -1
            if command == PUT_BYTE and pos + PUT_HEADER_SIZE <= size:
                _, length, error_count, item_id, add_time = unpack_put(buf, pos)
                expire_time, data = None, pos + PUT_HEADER_SIZE
            elif command == PUT_EXPIRY_BYTE and pos + PUT_EXPIRY_HEADER_SIZE <= size:
                _, length, error_count, item_id, add_time, expire_time = unpack_expiry(buf, pos)
                data = pos + PUT_EXPIRY_HEADER_SIZE
            if 0 <= length <= MAX_DATA and data + length <= size:
                payload = buf[data:data + length]
                yield {"format": "kestrel-writer", "seq": seq, "offset": pos, "kind": "put",
                       "id": item_id, "add_time": add_time, "expire_time": expire_time,
                       "error_count": error_count, "payload": bytes(payload) if copy else payload}
                seq += 1
                pos = data + length
                continue
            frame = next(frames(buf, source, pos, stop), None)
            if frame is None:
                return  # the 0x00 end marker
            if frame.command == CMD_PUT:
                yield decode_put(buf, source, frame, seq)
                seq += 1
            elif frame.command in (CMD_READ_HEAD, CMD_READ_DONE):
                raise _wrong_file(source, frame, "writer")
            # any other command: unknown, skipped by the frame rule
            pos = frame.end

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: :meth:`record_offsets` finds the record starts, numpy gathers
        the fields. The result is always exactly what :meth:`read` yields."""
        # bytes/mmap slices are bytes: the walk itself cuts the payloads (no second pass)
        sliced: list[bytes] | None = [] if isinstance(buf, (bytes, mmap.mmap)) else None
        offsets, next_offset, error = self._offsets(buf, source, start, seq, stop, limit, sliced)
        rows = len(offsets)
        return Columns(_put_columns(buf, offsets, seq, sliced), rows, next_offset, seq + rows, error)

    def record_offsets(self, buf, source, start=None, seq=0, stop=None, limit=None
                       ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """Where each record :meth:`read` would yield (up to ``limit``) starts, without decoding
        them: (int64 offsets, where a next call resumes or None, the damage that ended them).

        A speculative walk assumes every record is a PUT (one unpack per record), numpy then
        checks all the walked headers at once and keeps the well-formed prefix; wherever that
        stops, :meth:`read` takes one exact step (unknown command, end marker or damage).
        """
        return self._offsets(buf, source, start, seq, stop, limit, None)

    def _offsets(self, buf, source, start, seq, stop, limit, payloads: list[bytes] | None
                 ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """:meth:`record_offsets`; with a ``payloads`` list (``buf`` bytes or mmap) also
        each record's payload, appended to it."""
        size = len(buf)
        try:
            check_magic(buf, source, WRITER_MAGIC, "writer")
            pos = start_offset(source, start, MAGIC_SIZE, size)
        except FormatError as exc:
            return np.zeros(0, np.int64), None, exc
        end = size if stop is None else min(stop, size)
        walk_end = min(end, size - PUT_EXPIRY_HEADER_SIZE + 1)  # whole headers fit before it

        def walk(pos: int, budget: int) -> tuple[list[int], int]:
            if payloads is None:
                return _walk_puts(buf, pos, walk_end, budget)
            return _walk_and_slice_puts(buf, pos, walk_end, budget, payloads)

        def taken(rec: Record) -> int:
            if payloads is not None:
                payloads.append(rec["payload"])
            return rec["offset"] + 1 + 4 * (buf[rec["offset"]] & 0xF) + len(rec["payload"])

        return _walked_offsets(pos, end, PUT_HEADER_SIZE, limit, walk,
                               lambda offsets: _well_formed_puts(buf, offsets),
                               lambda at, rows: next(self.read(buf, source, at, seq + rows,
                                                               stop), None), taken)

    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        out = bytearray(WRITER_MAGIC)
        for rec in records:
            out += encode_put(rec["id"], rec["payload"], add_time=rec.get("add_time", 0),
                              expire_time=rec.get("expire_time"), error_count=rec.get("error_count", 0))
        return bytes(out)

    def validate(self, buf, source, **context) -> list[Finding]:
        # ids checked a batch of record starts at a time (no payloads, no record dicts)
        findings: list[Finding] = []
        previous, last = None, None
        pace = context.get("pace")
        for offsets, error in _offset_batches(self, buf, source):
            if pace is not None:
                pace()
            ids = field_at(buf, offsets, 9, "<i8")
            if len(ids):
                before = np.empty(len(ids), dtype=np.int64)
                before[1:] = ids[:-1]
                before[0] = 0 if previous is None else previous
                # Python's previous + 1 never wraps: after the largest id nothing follows
                skipped = (ids != before + 1) | (before == np.iinfo(np.int64).max)
                if previous is None:
                    skipped[0] = False
                for i in np.flatnonzero((ids == 0) | skipped).tolist():
                    if ids[i] == 0:
                        findings.append(Finding(int(offsets[i]), "item id is 0 (ids are non-zero)"))
                    else:
                        findings.append(Finding(int(offsets[i]), f"item id {int(ids[i])} does not "
                                                                 f"follow {int(before[i])}"))
                previous, last = int(ids[-1]), int(offsets[-1])
            if error is not None:
                return findings  # the damage itself is what read() reports
        findings += _check_zero_tail(buf, source, last)
        return findings

    def repair(self, buf, source, **context) -> Repair | None:
        return truncate_torn(self, buf, source)


class KestrelReader(_QueueFile, Codec):
    name = "kestrel-reader"
    paces_validation = True  # validate() calls its ``pace`` keyword after each batch
    in_file_order = True
    columns = ColumnMap(id="id")
    kinds = ("read_head", "read_done")
    magics = (READER_MAGIC,)
    header_size = MAGIC_SIZE

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """A reader's checkpoints: the head moving on, a few ids read ahead of it."""
        records: list[dict] = []
        head = 0
        for _ in range(count // 2):
            head += rng.randint(1, 50)
            records.append({"kind": "read_head", "id": head})
            records.append({"kind": "read_done",
                            "ids": sorted(rng.sample(range(head + 1, head + 200), 8))})
        return self.write(records)

    def read(self, buf, source, start=None, seq=0, stop=None):
        for frame in reader_frames(buf, source, start, stop):
            yield decode_reader_record(buf, frame, seq)
            seq += 1

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: :meth:`record_offsets` finds the record starts, numpy gathers
        the ids. The same columns the generic default makes (``id``/``ids`` in order of
        first use, None in the rows of the other kind), always exactly what :meth:`read`
        yields."""
        offsets, next_offset, error = self.record_offsets(buf, source, start, seq, stop, limit)
        with paused_gc():
            data = _reader_columns(buf, offsets, seq)
        return Columns(data, len(offsets), next_offset, seq + len(offsets), error)

    def record_offsets(self, buf, source, start=None, seq=0, stop=None, limit=None
                       ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """Where each record :meth:`read` would yield (up to ``limit``) starts, checked but
        not decoded: (int64 offsets, where a next call resumes or None, the damage).

        A speculative walk steps over READ_HEAD and READ_DONE frames (one unpack each),
        numpy checks the walked frames at once and keeps the well-formed prefix; wherever
        that stops, :meth:`read` takes one exact step (unknown command, end marker, damage).
        """
        size = len(buf)
        try:
            check_magic(buf, source, READER_MAGIC, "reader")
            pos = start_offset(source, start, MAGIC_SIZE, size)
        except FormatError as exc:
            return np.zeros(0, np.int64), None, exc
        end = size if stop is None else min(stop, size)
        walk_end = min(end, size - READ_HEAD_SIZE + 1)  # a READ_HEAD fits whole before it

        def taken(rec: Record) -> int:
            at = rec["offset"]
            return at + READ_HEAD_SIZE if rec["kind"] == "read_head" \
                else at + READ_DONE_HEADER_SIZE + 8 * len(rec["ids"])

        return _walked_offsets(pos, end, READ_DONE_HEADER_SIZE, limit,
                               lambda at, budget: _walk_reader(buf, at, walk_end, budget),
                               lambda offsets: _well_formed_reader_frames(buf, offsets),
                               lambda at, rows: next(self.read(buf, source, at, seq + rows,
                                                               stop), None), taken)

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
        # a batch of columns at a time (no list of the whole file, no record dicts); damaged
        # input reports only the damage itself, which read() names, so findings before it
        # are dropped then
        findings: list[Finding] = []
        head, last = None, None
        pace = context.get("pace")
        for cols in self.scan(buf, source, rows=VALIDATE_BATCH):
            if pace is not None:
                pace()
            if cols.error is not None:
                return []
            head = _reader_findings(cols, head, findings)
            if cols.rows:
                last = int(cols.data["offset"][-1])
        findings += _check_zero_tail(buf, source, last)
        return findings

    def repair(self, buf, source, **context) -> Repair | None:
        return truncate_torn(self, buf, source)


# -- columns ---------------------------------------------------------------------------------

def _walk_puts(buf: Buffer, pos: int, walk_end: int, budget: int) -> tuple[list[int], int]:
    """Up to ``budget`` record starts from ``pos``, assuming every record is a PUT, and the
    position after the last; :func:`_well_formed_puts` says how many of them really are."""
    walked: list[int] = []
    append = walked.append
    unpack = _COMMAND_LENGTH.unpack_from
    header_of = _PUT_HEADER_OF
    for _ in range(budget):  # the hot loop: a for-range with one unpack is the cheapest walk
        if pos >= walk_end:
            break
        append(pos)
        command, length = unpack(buf, pos)  # unsigned: a negative i32 length is huge
        pos += header_of[command] + length
    return walked, pos


def _walk_and_slice_puts(buf: Buffer, pos: int, walk_end: int, budget: int,
                         payloads: list[bytes]) -> tuple[list[int], int]:
    """:func:`_walk_puts` over bytes or mmap ``buf`` that also appends the payload of each
    record :func:`_well_formed_puts` will accept to ``payloads``: it stops right after the
    first record that is not one (not a PUT, data over 16 MiB or past the end), so exactly
    the accepted records are sliced, and no slice is over 16 MiB."""
    walked: list[int] = []
    append, keep = walked.append, payloads.append
    unpack = _COMMAND_LENGTH.unpack_from
    header_of = _PUT_HEADER_OF
    size, most = len(buf), MAX_DATA  # locals: cheaper than globals in the loop
    for _ in range(budget):
        if pos >= walk_end:
            break
        append(pos)
        command, length = unpack(buf, pos)
        data = pos + header_of[command]
        pos = data + length
        if pos > size or length > most:
            break
        keep(buf[data:pos])
    return walked, pos


def _well_formed_puts(buf: Buffer, offsets: np.ndarray) -> int:
    """How many leading ``offsets`` start a PUT :meth:`KestrelWriter.read` accepts as is:
    command byte 0x86/0x88, data length <= 16 MiB, data inside the buffer. Every offset
    leaves room for a whole header (the walk stops before the buffer's last 32 bytes)."""
    commands = field_at(buf, offsets, 0, "u1")
    lengths = field_at(buf, offsets, 1, "<u4").astype(np.int64)
    is_put = (commands == PUT_BYTE) | (commands == PUT_EXPIRY_BYTE)
    headers = np.where(commands == PUT_EXPIRY_BYTE, PUT_EXPIRY_HEADER_SIZE, PUT_HEADER_SIZE)
    good = is_put & (lengths <= MAX_DATA) & (offsets + headers + lengths <= len(buf))
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else len(offsets)


#: Per command byte: how far a READ_HEAD (9 bytes) or a READ_DONE header (5 bytes, plus its
#: data) steps; _NOT_A_PUT for any other byte, so the walk stops right after it.
READ_HEAD_SIZE = _READ_HEAD.size
READ_DONE_HEADER_SIZE = _READ_DONE.size
_READ_HEAD_BYTE = (CMD_READ_HEAD << 4) | 2
_READ_DONE_BYTE = (CMD_READ_DONE << 4) | 1
_READER_STEP = tuple(READ_HEAD_SIZE if b == _READ_HEAD_BYTE else READ_DONE_HEADER_SIZE
                     if b == _READ_DONE_BYTE else _NOT_A_PUT for b in range(256))
#: Per command byte: the mask of the walked length word that counts (a READ_DONE's only).
_READER_LENGTH_MASK = tuple(0xFFFFFFFF if b == _READ_DONE_BYTE else 0 for b in range(256))


def _walk_reader(buf: Buffer, pos: int, walk_end: int, budget: int) -> tuple[list[int], int]:
    """Up to ``budget`` record starts from ``pos``, assuming every record is a READ_HEAD or a
    READ_DONE, and the position after the last; :func:`_well_formed_reader_frames` says how
    many of them really are."""
    walked: list[int] = []
    append = walked.append
    unpack = _COMMAND_LENGTH.unpack_from
    step, mask = _READER_STEP, _READER_LENGTH_MASK
    for _ in range(budget):
        if pos >= walk_end:
            break
        append(pos)
        command, length = unpack(buf, pos)
        pos += step[command] + (length & mask[command])
    return walked, pos


def _well_formed_reader_frames(buf: Buffer, offsets: np.ndarray) -> int:
    """How many leading ``offsets`` start a READ_HEAD or READ_DONE frame :meth:`KestrelReader.read`
    accepts as is (a READ_DONE's data: whole ids, <= 16 MiB, inside the buffer). Every offset
    leaves room for 9 bytes."""
    commands = field_at(buf, offsets, 0, "u1")
    lengths = field_at(buf, offsets, 1, "<u4").astype(np.int64)
    done = commands == _READ_DONE_BYTE
    good = (commands == _READ_HEAD_BYTE) | (done & (lengths <= MAX_DATA) & (lengths % 8 == 0)
                                           & (offsets + READ_DONE_HEADER_SIZE + lengths <= len(buf)))
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else len(offsets)


def _reader_columns(buf: Buffer, offsets: np.ndarray, seq: int) -> dict[str, Any]:
    """The columns of the checked reader records at ``offsets``."""
    rows = len(offsets)
    is_head = field_at(buf, offsets, 0, "u1") == _READ_HEAD_BYTE
    heads = np.flatnonzero(is_head)
    dones = np.flatnonzero(~is_head)
    kinds = np.array(["read_done", "read_head"])[is_head.astype(np.intp)].tolist()
    data: dict[str, Any] = {"format": ["kestrel-reader"] * rows,
                            "seq": np.arange(seq, seq + rows, dtype=np.int64),
                            "offset": offsets, "kind": kinds}
    order = ("id", "ids") if rows and is_head[0] else ("ids", "id")
    for name in order:
        if name == "id" and len(heads):
            ids = np.zeros(rows, dtype=np.int64)
            ids[heads] = field_at(buf, offsets[heads], 1, "<i8")
            data["id"] = ids if len(heads) == rows else np.ma.masked_array(ids, mask=~is_head)
        elif name == "ids" and len(dones):
            data["ids"] = _done_id_lists(buf, offsets, dones, rows)
    return data


#: Records per batch when validating.
VALIDATE_BATCH = 1 << 14


def _offset_batches(codec: Codec, buf: Buffer, source: str
                    ) -> Iterator[tuple[np.ndarray, FormatError | None]]:
    """The record starts :meth:`Codec.read` would yield, a batch at a time; the damage that
    ends them (if any) comes with the last batch."""
    for cols in codec.scan(buf, source, rows=VALIDATE_BATCH, form="offsets"):
        yield cols.data["offset"], cols.error


def _reader_findings(cols: Columns, head: int | None, findings: list[Finding]) -> int | None:
    """Append the findings of one batch of reader records (in record order: a READ_HEAD's
    negative id; a READ_DONE's repeated id, id <= 0, id at or below the head before it) and
    return the head in effect after it."""
    rows = cols.rows
    if not rows:
        return head
    offsets = cols.data["offset"]
    heads_col = cols.data.get("id")
    if heads_col is None:
        is_head = np.zeros(rows, dtype=bool)
        head_ids = np.zeros(rows, dtype=np.int64)
    else:
        is_head = ~np.ma.getmaskarray(heads_col)
        head_ids = np.ma.getdata(heads_col).astype(np.int64)
    # the head in effect at each row: the last READ_HEAD at or before it, else ``head``
    last = np.maximum.accumulate(np.where(is_head, np.arange(rows), -1))
    known = (last >= 0) | (head is not None)
    current = np.where(last >= 0, head_ids[np.maximum(last, 0)], 0 if head is None else head)
    flagged: dict[int, list[Finding]] = {}
    for i in np.flatnonzero(is_head & (head_ids < 0)).tolist():
        flagged[i] = [Finding(int(offsets[i]), f"negative head id {int(head_ids[i])}")]
    dones = np.flatnonzero(~is_head)
    if len(dones):
        values, bounds = cols.data["ids"].take(dones).contiguous()
        counts = np.diff(bounds)
        row = np.repeat(np.arange(len(dones)), counts)
        order = np.lexsort((values, row))
        repeated = np.zeros(len(dones), dtype=bool)
        same = (values[order][1:] == values[order][:-1]) & (row[order][1:] == row[order][:-1])
        repeated[row[order][1:][same]] = True
        not_positive = np.bincount(row, weights=values <= 0, minlength=len(dones)) > 0
        below = np.bincount(row, weights=values <= np.repeat(current[dones], counts),
                            minlength=len(dones)) > 0
        below &= known[dones]
        for j in np.flatnonzero(repeated | not_positive | below).tolist():
            i, at = int(dones[j]), int(offsets[dones[j]])
            found = flagged.setdefault(i, [])
            if repeated[j]:
                found.append(Finding(at, "READ_DONE lists an id twice", "warning"))
            if not_positive[j]:
                found.append(Finding(at, "READ_DONE lists an id that is not positive"))
            if below[j]:
                found.append(Finding(at, f"READ_DONE id at or below the head {int(current[i])}"))
    for i in sorted(flagged):
        findings.extend(flagged[i])
    return int(current[-1]) if known[-1] else head


def _done_id_lists(buf: Buffer, offsets: np.ndarray, dones: np.ndarray, rows: int) -> IntLists:
    """The ids of the READ_DONE rows ``dones``, gathered flat in file order (None in the
    other rows)."""
    starts = offsets[dones] + READ_DONE_HEADER_SIZE
    counts = field_at(buf, offsets[dones], 1, "<i4").astype(np.int64) // 8
    bounds = np.zeros(len(dones) + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    within = np.arange(int(bounds[-1]), dtype=np.int64) - np.repeat(bounds[:-1], counts)
    ids = field_at(buf, np.repeat(starts, counts) + 8 * within, 0, "<i8")
    if len(dones) == rows:
        return IntLists(ids, bounds[:-1], counts)
    row_starts = np.zeros(rows, dtype=np.int64)
    row_counts = np.zeros(rows, dtype=np.int64)
    row_starts[dones], row_counts[dones] = bounds[:-1], counts
    missing = np.ones(rows, dtype=bool)
    missing[dones] = False
    return IntLists(ids, row_starts, row_counts, missing)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _walked_offsets(pos: int, end: int, smallest: int, limit: int | None,
                    walk: Callable[[int, int], tuple[list[int], int]],
                    well_formed: Callable[[np.ndarray], int],
                    exact: Callable[[int, int], Record | None],
                    taken: Callable[[Record], int]
                    ) -> tuple[np.ndarray, int | None, FormatError | None]:
    """Record starts from ``pos``: a speculative ``walk(pos, budget) -> (starts, after)`` of
    which numpy's ``well_formed`` keeps a prefix; where that stops, ``exact(pos, rows)`` (the
    codec's own read: a record, None at the end, FormatError at damage) takes one step and
    ``taken(record)`` says where the record ends. (offsets, resume offset or None, damage)."""
    parts: list[np.ndarray] = []
    rows = 0
    while True:
        budget = max(0, (end - pos) // smallest + 1) if limit is None else limit - rows
        walked, after = walk(pos, budget)
        offsets = np.array(walked, dtype=np.int64)
        good = well_formed(offsets)
        if good < len(offsets):
            offsets, after = offsets[:good], walked[good]
        parts.append(offsets)
        rows += good
        pos = after
        try:
            rec = exact(pos, rows)
        except FormatError as exc:
            return _joined(parts), None, exc
        if rec is None or rows == limit:
            return _joined(parts), None if rec is None else rec["offset"], None
        parts.append(np.array([rec["offset"]], dtype=np.int64))
        rows += 1
        pos = taken(rec)


def _put_columns(buf: Buffer, offsets: np.ndarray, seq: int,
                 payloads: list[bytes] | None = None) -> dict[str, Any]:
    """The columns of the well-formed PUTs starting at ``offsets`` (``payloads``: theirs,
    when the walk already cut them)."""
    rows = len(offsets)
    has_expiry = field_at(buf, offsets, 0, "u1") == PUT_EXPIRY_BYTE
    expire = np.zeros(rows, dtype=np.int64)
    if has_expiry.any():
        expire[has_expiry] = field_at(buf, offsets[has_expiry], 25, "<i8")
    if payloads is None:
        lengths = field_at(buf, offsets, 1, "<i4").astype(np.int64)
        data_starts = offsets + np.where(has_expiry, PUT_EXPIRY_HEADER_SIZE, PUT_HEADER_SIZE)
        payloads = slice_payloads(buf, data_starts, data_starts + lengths)
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
        "payload": payloads,
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


def _check_zero_tail(buf: Buffer, source: str, start: int | None = None) -> list[Finding]:
    """After a 0x00 end marker a pre-allocated file holds only zeros; anything else is odd.
    ``start``: a frame start (the last record's) from which to walk to the last frame."""
    last = None
    for frame in frames(buf, source, start, None):
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
    number = re.search(WRITER_SUFFIX, str(name))
    return (0, int(number.group(1))) if number else (1, str(name))


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


# -- samples (the demo tree, tests and benches) ----------------------------------------------------

def sample_puts(rng: random.Random, count: int, first_id: int = 1,
                start_ms: int = samples.BASE_MS, payload: tuple[int, int] = (20, 120)
                ) -> list[dict]:
    """``count`` put records (ids from ``first_id``, times from ``start_ms``), a third of
    them expiring, with realistic JSON payloads of ``payload`` bytes."""
    records, now = [], start_ms
    for n in range(count):
        now += rng.randint(1, 900)
        expiry = now + rng.choice((60_000, 3_600_000)) if rng.random() < 0.3 else None
        records.append({"kind": "put", "id": first_id + n, "add_time": now, "expire_time": expiry,
                        "error_count": rng.choice((0, 0, 0, 1, 2)),
                        "payload": samples.text(rng, *payload)})
    return records


def queue_demo_files(rng: random.Random, name: str = "jobs") -> dict[str, bytes]:
    """Two writer segments (ids 1..40, 41..64) and two readers: the default reader consumed up
    to 45 plus two items out of order; ``mailer`` has read everything up to 12."""
    writer, reader = KestrelWriter(), KestrelReader()
    base = samples.BASE_MS
    old = sample_puts(rng, 40, 1, base)
    new = sample_puts(rng, 24, 41, base + 60_000)
    return {
        f"{name}.{base}": writer.write(old),
        f"{name}.{base + 60_000}": writer.write(new),
        f"{name}.read.": reader.write([{"kind": "read_head", "id": 45},
                                       {"kind": "read_done", "ids": [47, 50]}]),
        f"{name}.read.mailer": reader.write([{"kind": "read_head", "id": 12},
                                             {"kind": "read_done", "ids": []}]),
    }
