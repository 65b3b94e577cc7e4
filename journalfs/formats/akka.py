"""akka-persistence-file-journal: a meta file (one block per persistence id) and a data file
(messages as doubly linked lists per persistence id). All integers are big-endian.

Byte facts are in ``specs/akka-file-journal.md``. Both files start with a 4-byte magic and an
i32 total size of the blocks after the 8-byte header; the header total must match the file.
"""
from __future__ import annotations

import heapq
import itertools
import mmap
import random
import struct
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .starts import RecordStarts
from .base import (Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record, Repair, field_at,
                   slice_payloads, start_offset)
from . import samples
from .spans import paused_gc, utf8_strings

META_MAGICS = (b"APFM", b"AKFM")  # the seed's magic, the original code's magic
META_WRITE_MAGIC = b"APFM"
DATA_MAGIC = b"AKFD"
HEADER_SIZE = 8
META_BLOCK_FIXED = 26   # i16 size, i64 first, i64 last, i64 highest
DATA_BLOCK_FIXED = 24   # i32 size, i32 self, i32 prev, i32 next, i64 seq_nr
MAX_I32 = 2**31 - 1

_HEADER = struct.Struct(">4si")
_META_BLOCK = struct.Struct(">hqqq")
_DATA_BLOCK = struct.Struct(">iiiiq")
_SIZE_SELF = struct.Struct(">ii")


def _blocks_area(buf: Buffer, source: str, magics: tuple[bytes, ...], what: str) -> int:
    """Check the header; return where the blocks the header counts end (clipped to the file)."""
    if len(buf) < HEADER_SIZE:
        raise FormatError(source, 0, f"akka {what} file shorter than its 8-byte header")
    magic, total = _HEADER.unpack_from(buf, 0)
    if magic not in magics:
        raise FormatError(source, 0, f"not an akka {what} file (magic {magic!r})")
    if total < 0:
        raise FormatError(source, 4, f"negative blocks total {total}")
    return min(HEADER_SIZE + total, len(buf))


def _blocks(buf: Buffer, source: str, start: int | None, stop: int | None,
            magics: tuple[bytes, ...], what: str, block: struct.Struct) -> Iterator[tuple[int, tuple]]:
    """(offset, fixed fields) of each block from ``start`` (None = the first) until ``stop``.

    Every block's leading i32 size is checked (the fixed part fits, the block ends within the
    blocks' area) before it is yielded; after the last block the header's total is checked.
    """
    area_end = _blocks_area(buf, source, magics, what)
    pos = start_offset(source, start, HEADER_SIZE, area_end)
    fixed = block.size
    while pos < area_end:
        if stop is not None and pos >= stop:
            return
        if pos + fixed > area_end:
            raise FormatError(source, pos, f"torn {what} block: fewer than {fixed} bytes left")
        fields = block.unpack_from(buf, pos)
        size = fields[0]
        if size < fixed:
            raise FormatError(source, pos, f"{what} block size {size} is below {fixed}")
        if pos + size > area_end:
            raise FormatError(source, pos, f"torn {what} block: {size} bytes run past the blocks' end")
        yield pos, fields
        pos += size
    _check_total(buf, source, area_end)


def _check_total(buf: Buffer, source: str, area_end: int) -> None:
    """After the last block: the header's total must describe exactly the file's length."""
    declared = HEADER_SIZE + _HEADER.unpack_from(buf, 0)[1]
    if declared > len(buf):
        raise FormatError(source, area_end, f"file ends at byte {len(buf)} but its header counts "
                                            f"blocks up to byte {declared}")
    if declared < len(buf):
        raise FormatError(source, area_end, f"{len(buf) - declared} bytes after the blocks the header counts")


class _PairedFile:
    """A meta file and a data file live in one directory; each names the other by its role
    (``data`` / ``meta``): the file of that name if it has the other's format, else the first
    such file by name."""

    partner_formats: tuple[str, ...]
    partner_role: str

    def partners(self, name, siblings):
        names = sorted(n for n, f in siblings if f in self.partner_formats)
        other = self.partner_role if self.partner_role in names else (names[0] if names else None)
        return {self.partner_role: other} if other else {}


class AkkaMeta(_PairedFile, Codec):
    name = "akka-meta"
    columns = ColumnMap(key="persistence_id")
    partner_formats, partner_role = ("akka-data",), "data"
    kinds = ("meta",)
    magics = META_MAGICS
    header_size = HEADER_SIZE
    paces_validation = True  # validate() calls its ``pace`` keyword after each step

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """One entry per persistence id, pointing into a (not written) data file."""
        records = []
        for i in range(count):
            first = 8 + 100 * rng.randrange(10**6)
            records.append({"persistence_id": f"user-{i:08d}", "first": first,
                            "last": first + 100 * rng.randrange(1000),
                            "highest_seq": rng.randint(1, 10**6)})
        return self.write(records)

    def read(self, buf, source, start=None, seq=0, stop=None):
        blocks = _blocks(buf, source, start, stop, self.magics, "meta", _META_BLOCK)
        for pos, (size, first, last, highest) in blocks:
            try:
                pid = bytes(buf[pos + META_BLOCK_FIXED:pos + size]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FormatError(source, pos + META_BLOCK_FIXED + exc.start,
                                  "persistence id is not valid UTF-8") from None
            yield {"format": self.name, "seq": seq, "offset": pos, "kind": "meta",
                   "persistence_id": pid, "first": first, "last": last, "highest_seq": highest}
            seq += 1

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: a tight loop walks the blocks' sizes, numpy gathers the fixed
        fields and the persistence ids are decoded in one step per batch. Wherever the walk
        stops, :meth:`read` takes one step to name the damage or the next record, so the
        result is always exactly what :meth:`read` yields."""
        try:
            area_end = _blocks_area(buf, source, self.magics, "meta")
            pos = start_offset(source, start, HEADER_SIZE, area_end)
        except FormatError as exc:
            return Columns(_meta_columns(buf, np.zeros(0, np.int64), [], seq), 0, None, seq, exc)
        end = area_end if stop is None else min(stop, area_end)
        walk_end = min(end, area_end - META_BLOCK_FIXED + 1)  # a whole fixed part fits before it
        budget = max(0, (walk_end - pos) // META_BLOCK_FIXED + 1) if limit is None else limit
        starts: list[int] = []
        append = starts.append
        unpack_size = _META_SIZE.unpack_from
        for _ in range(budget):  # a for-range is the cheapest loop
            if pos >= walk_end:
                break
            size = unpack_size(buf, pos)[0]
            if size < META_BLOCK_FIXED or pos + size > area_end:
                break
            append(pos)
            pos += size
        offsets = np.array(starts, dtype=np.int64)
        sizes = field_at(buf, offsets, 0, ">i2").astype(np.int64)
        with paused_gc():
            pids = utf8_strings(buf, offsets + META_BLOCK_FIXED, offsets + sizes)
        if pids is None:  # some id is not UTF-8: keep the blocks before the first such one
            pids = []
            for a, b in zip((offsets + META_BLOCK_FIXED).tolist(), (offsets + sizes).tolist()):
                try:
                    pids.append(bytes(buf[a:b]).decode("utf-8"))
                except UnicodeDecodeError:
                    break
            offsets = offsets[:len(pids)]
            pos = starts[len(pids)]  # read() names the damage in this block
            full = False
        else:
            full = len(starts) == limit
        rows = len(offsets)
        next_offset, error = _probe(self, buf, source, pos, seq + rows, stop, full, strict=False)
        if next_offset is _DISAGREE:  # the walk refused a block read() accepts: decode exactly
            return Codec.read_columns(self, buf, source, start, seq, stop, limit)
        return Columns(_meta_columns(buf, offsets, pids, seq), rows, next_offset, seq + rows, error)

    def write(self, records: Sequence[Record], magic: bytes = META_WRITE_MAGIC, **header: Any) -> bytes:
        if magic not in META_MAGICS:
            raise ValueError(f"akka meta magic must be one of {META_MAGICS}")
        blocks = bytearray()
        for rec in records:
            pid = rec["persistence_id"].encode("utf-8")
            size = META_BLOCK_FIXED + len(pid)
            if size > 0x7FFF:
                raise ValueError(f"persistence id of {len(pid)} bytes does not fit an i16 block size")
            blocks += _META_BLOCK.pack(size, rec["first"], rec["last"], rec["highest_seq"]) + pid
        return _HEADER.pack(magic, len(blocks)) + bytes(blocks)

    def validate(self, buf, source, **context) -> list[Finding]:
        """Duplicate persistence ids, and with ``data=`` each id's chain against its block.
        Streams: memory stays flat in both files' sizes (no list of records is kept).
        ``pace`` (optional): called every batch of blocks, to drop the pages read so far."""
        pace = context.get("pace")
        # every block read() accepts, a batch of columns at a time
        for cols in self.scan(buf, source, rows=VALIDATE_BATCH):
            if cols.error is not None:
                return []  # the damage itself is what read() reports
            if pace is not None:
                pace()
        findings = _duplicate_ids(buf, source, pace)
        data = context.get("data")
        if data is not None:
            findings.extend(_chain_findings(buf, source, data, pace))
        return findings


class AkkaData(_PairedFile, Codec):
    name = "akka-data"
    in_file_order = True
    columns = ColumnMap(id="seq_nr")
    partner_formats, partner_role = ("akka-meta",), "meta"
    key_partners = ("meta",)
    kinds = ("message",)
    magics = (DATA_MAGIC,)
    header_size = HEADER_SIZE
    paces_validation = True  # validate() calls its ``pace`` keyword after each step

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        pids = tuple(f"order-{i}" for i in range(1000))
        data, _meta = AkkaData.build(sample_messages(rng, count, pids,
                                                     payload=samples.SAMPLE_PAYLOAD))
        return data

    def demo_files(self, rng, described):
        """A journal of three persistence ids: its data and meta files."""
        data, meta = self.build(sample_messages(rng, 36, ("order-17", "order-18", "użytkownik-3")))
        return {"akka/orders/data": data, "akka/orders/meta": meta}

    def read(self, buf, source, start=None, seq=0, stop=None):
        blocks = _blocks(buf, source, start, stop, self.magics, "data", _DATA_BLOCK)
        for pos, (size, self_offset, prev, nxt, seq_nr) in blocks:
            if self_offset != pos:
                raise FormatError(source, pos, f"data block says it is at byte {self_offset}")
            yield {"format": self.name, "seq": seq, "offset": pos, "kind": "message",
                   "self": self_offset, "prev": prev, "next": nxt, "seq_nr": seq_nr,
                   "payload": bytes(buf[pos + DATA_BLOCK_FIXED:pos + size])}
            seq += 1

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: a tight loop walks the blocks, numpy gathers the fields.

        The loop accepts exactly the blocks :meth:`read` accepts; wherever it stops,
        :meth:`read` takes one step to name the damage or the next record, so the result is
        always exactly what :meth:`read` yields."""
        # bytes/mmap slices are bytes: the walk itself cuts the payloads (no second pass)
        sliced: list[bytes] | None = [] if isinstance(buf, (bytes, mmap.mmap)) else None
        starts, next_offset, error = self._walk(buf, source, start, seq, stop, limit, sliced)
        rows = len(starts)
        return Columns(self._columns(buf, starts, seq, sliced), rows, next_offset, seq + rows, error)

    def record_offsets(self, buf, source, start=None, seq=0, stop=None, limit=None
                       ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """Where the blocks :meth:`read` yields start (up to ``limit``), without decoding
        them: (int64 offsets, where a next call resumes or None, the damage they end at)."""
        return self._walk(buf, source, start, seq, stop, limit, None)

    def _walk(self, buf, source, start, seq, stop, limit, payloads: list[bytes] | None
              ) -> tuple[np.ndarray, int | None, FormatError | None]:
        """:meth:`record_offsets`; with a ``payloads`` list (``buf`` bytes or mmap) also each
        accepted block's payload, appended to it."""
        try:
            area_end = _blocks_area(buf, source, self.magics, "data")
            pos = start_offset(source, start, HEADER_SIZE, area_end)
        except FormatError as exc:
            return np.zeros(0, np.int64), None, exc
        end = area_end if stop is None else min(stop, area_end)
        wanted = -1 if limit is None else limit
        starts: list[int] = []
        append = starts.append
        unpack_block = _SIZE_SELF.unpack_from
        walk_end = min(end, area_end - DATA_BLOCK_FIXED + 1)  # a whole block header fits before it
        budget = (walk_end - pos) // DATA_BLOCK_FIXED + 1 if limit is None else limit
        if payloads is None:
            for _ in range(budget):  # a for-range is the cheapest loop
                if pos >= walk_end:
                    break
                size, self_offset = unpack_block(buf, pos)
                if size < DATA_BLOCK_FIXED or pos + size > area_end or self_offset != pos:
                    break
                append(pos)
                pos += size
        else:
            keep, fixed = payloads.append, DATA_BLOCK_FIXED  # locals: cheaper than globals
            for _ in range(budget):
                if pos >= walk_end:
                    break
                size, self_offset = unpack_block(buf, pos)
                if size < fixed or pos + size > area_end or self_offset != pos:
                    break
                append(pos)
                keep(buf[pos + fixed:pos + size])
                pos += size
        next_offset, error = _probe(self, buf, source, pos, seq + len(starts), stop, len(starts) == wanted)
        return np.array(starts, dtype=np.int64), next_offset, error

    def _columns(self, buf: Buffer, offsets: np.ndarray, seq: int,
                 payloads: list[bytes] | None = None) -> dict[str, Any]:
        rows = len(offsets)
        if payloads is None:
            sizes = field_at(buf, offsets, 0, ">i4").astype(np.int64)
            payloads = slice_payloads(buf, offsets + DATA_BLOCK_FIXED, offsets + sizes)
        return {
            "format": [self.name] * rows,
            "seq": np.arange(seq, seq + rows, dtype=np.int64),
            "offset": offsets,
            "kind": ["message"] * rows,
            "self": offsets.copy(),
            "prev": field_at(buf, offsets, 8, ">i4").astype(np.int64),
            "next": field_at(buf, offsets, 12, ">i4").astype(np.int64),
            "seq_nr": field_at(buf, offsets, 16, ">i8"),
            "payload": payloads,
        }

    def write(self, records: Sequence[Record], **header: Any) -> bytes:
        """Blocks in the given order; each record's ``self`` (if given) must be where its block
        lands, and ``prev``/``next`` (default 0) must be 0 or another block's start."""
        positions = []
        pos = HEADER_SIZE
        for rec in records:
            if rec.get("self") not in (None, pos):
                raise ValueError(f"record says self={rec['self']} but its block lands at byte {pos}")
            positions.append(pos)
            pos += DATA_BLOCK_FIXED + len(rec["payload"])
        if pos > MAX_I32:
            raise ValueError("akka data file would exceed the i32 offset range")
        starts = set(positions)
        blocks = bytearray()
        for rec, here in zip(records, positions):
            prev, nxt = rec.get("prev", 0), rec.get("next", 0)
            for link in (prev, nxt):
                if link and link not in starts:
                    raise ValueError(f"block at {here} links to {link}, which is not a block start")
            payload = bytes(rec["payload"])
            blocks += _DATA_BLOCK.pack(DATA_BLOCK_FIXED + len(payload), here, prev, nxt, rec["seq_nr"])
            blocks += payload
        return _HEADER.pack(DATA_MAGIC, len(blocks)) + bytes(blocks)

    @staticmethod
    def layout(messages: Sequence[tuple[str, int, bytes]]) -> tuple[list[Record], list[Record]]:
        """Data records (with links) and meta records for ``messages`` = [(pid, seq_nr, payload)]
        appended in order, as the original journal lays them out."""
        data: list[Record] = []
        metas: dict[str, Record] = {}
        pos = HEADER_SIZE
        for pid, seq_nr, payload in messages:
            meta = metas.get(pid)
            prev = meta["last"] if meta else 0
            if meta:
                data[meta["_index"]]["next"] = pos
            else:
                meta = metas[pid] = {"persistence_id": pid, "first": pos, "highest_seq": seq_nr}
            meta.update(last=pos, _index=len(data), highest_seq=max(meta["highest_seq"], seq_nr))
            data.append({"self": pos, "prev": prev, "next": 0, "seq_nr": seq_nr, "payload": bytes(payload)})
            pos += DATA_BLOCK_FIXED + len(payload)
        meta_records = [{"persistence_id": m["persistence_id"], "first": m["first"], "last": m["last"],
                         "highest_seq": m["highest_seq"]} for m in metas.values()]
        return data, meta_records

    @classmethod
    def build(cls, messages: Sequence[tuple[str, int, bytes]]) -> tuple[bytes, bytes]:
        """The (data file, meta file) bytes holding ``messages`` = [(pid, seq_nr, payload)]."""
        data, metas = cls.layout(messages)
        return cls().write(data), AkkaMeta().write(metas)

    def validate(self, buf, source, **context) -> list[Finding]:
        """Every ``next``/``prev`` link of the valid blocks names a block start whose link
        back is mutual, and sequence numbers increase along ``next``. Two streamed passes: the
        first finds the block starts (:class:`RecordStarts`), the second checks each batch's
        links by reading the linked blocks' headers in place.

        ``pace`` (optional): called after each batch; the caller may drop the pages read so
        far from memory then (fsck does)."""
        pace = context.get("pace")
        starts = _block_starts(buf, source, pace)[0]
        findings: list[Finding] = []
        for fields, _error in _data_batches(buf, source):
            if len(fields["offset"]):
                findings.extend(_link_findings(buf, starts, fields))
            if pace is not None:
                pace()
        return findings

    def key_resolver(self, buf, partners, pace=None):
        """Persistence ids for batches of this file's messages, from its ``meta`` partner."""
        if "meta" not in partners:
            return None
        resolver = ChainResolver(chain_heads(partners["meta"], "meta"), buf, pace)
        return lambda data: resolver.resolve(data["self"], data["prev"])

    def repair(self, buf, source, **context) -> Repair | None:
        """Only the safe cases: a torn final block is cut off and/or the header's total is set
        to the blocks actually present. Any other damage is left for a human."""
        size = len(buf)
        try:
            for _ in self.read(buf, source):
                pass
            return None
        except FormatError as exc:
            if exc.offset < HEADER_SIZE:
                return None
            damage = exc
        pos = HEADER_SIZE
        for m in _valid_prefix(buf, whole_file=True):
            pos = m["offset"] + DATA_BLOCK_FIXED + len(m["payload"])
        declared = HEADER_SIZE + _HEADER.unpack_from(buf, 0)[1]
        if pos < declared and pos < size and not _is_torn_tail(buf, pos):
            return None  # damage before the end: truncating would lose valid blocks
        actions = []
        if pos < size:
            what = "the torn final block" if _is_torn_tail(buf, pos) else "bytes after the last block"
            actions.append(f"cut {what} at byte {pos} (was {size} bytes)")
        if declared != pos:
            actions.append(f"set the header's blocks total to {pos - HEADER_SIZE} (was {declared - HEADER_SIZE})")
        fixed = bytearray(buf[:pos])
        _HEADER.pack_into(fixed, 0, DATA_MAGIC, pos - HEADER_SIZE)
        return Repair(bytes(fixed), actions or [damage.reason])


# -- persistence ids of data blocks ---------------------------------------------------------
# Data blocks carry no persistence id: a chain starts at a meta block's ``first`` offset (a
# block with ``prev == 0``) and every later block names its predecessor, so in file order
# ``pid[self] = pid[prev]``. Only the newest block of each chain is remembered (memory grows
# with the number of ids, not with the file); a batch that starts mid-file walks unknown
# predecessors back through block headers only.

_PREV = struct.Struct(">i")
_PREV_AT = 8  # i32 size, i32 self, then i32 prev


def chain_heads(meta: Buffer, source: str) -> dict[int, str]:
    """``{first offset: persistence id}`` from a meta file's bytes (its valid prefix)."""
    heads: dict[int, str] = {}
    try:
        for rec in _META.read(meta, source):
            heads[int(rec["first"])] = rec["persistence_id"]
    except FormatError:
        pass
    return heads


#: Blocks a walk back passes between two calls of the resolver's ``pace``.
PACE_STEPS = 2048


class ChainResolver:
    """The persistence id of each data block, given the chains' heads. ``pace`` (the
    caller's, as for validate) is called every :data:`PACE_STEPS` blocks a walk back
    passes: the caller drops the file's pages there, as a walk from the end of a big file
    touches most of its pages."""

    def __init__(self, heads: dict[int, str], buf: Buffer, pace: Callable[[], None] | None = None):
        self.heads = heads
        self.buf = buf
        self.pace = pace
        self.tips: dict[int, str | None] = {}  # newest known block of each chain -> pid

    def _walk_back(self, offset: int) -> str | None:
        """pid of the block at ``offset`` by following ``prev`` links through headers."""
        seen = 0
        limit = len(self.buf) // DATA_BLOCK_FIXED + 1  # a longer walk means a cycle
        while seen <= limit:
            if self.pace is not None and seen % PACE_STEPS == PACE_STEPS - 1:
                self.pace()
            if offset in self.tips:
                return self.tips[offset]
            if offset < HEADER_SIZE or offset + _PREV_AT + _PREV.size > len(self.buf):
                return None
            prev = _PREV.unpack_from(self.buf, offset + _PREV_AT)[0]
            if prev == 0:
                return self.heads.get(offset)
            if prev >= offset:  # links point backwards in an append-only file
                return None
            offset, seen = prev, seen + 1
        return None

    def resolve(self, selfs, prevs) -> list[str | None]:
        """The ids of the blocks at ``selfs`` (in file order) whose ``prev`` links are ``prevs``."""
        out = []
        tips = self.tips
        for s, p in zip(selfs.tolist() if hasattr(selfs, "tolist") else selfs,
                        prevs.tolist() if hasattr(prevs, "tolist") else prevs):
            if p == 0:
                pid = self.heads.get(s)
            elif p in tips:
                pid = tips.pop(p)
            else:
                pid = self._walk_back(p)
            tips[s] = pid
            out.append(pid)
        return out


#: What :func:`_probe` answers (with strict=False) when read() accepts a record the walk
#: refused: the caller then decodes the batch the generic way.
_DISAGREE = -1


def _probe(codec: Codec, buf: Buffer, source: str, pos: int, seq: int, stop: int | None,
           full: bool, strict: bool = True) -> tuple[int | None, FormatError | None]:
    """Where a vectorised walk ended: one :meth:`Codec.read` step from ``pos`` gives the
    ``next_offset`` (a following record when the batch is ``full``) and any damage there."""
    try:
        rec = next(codec.read(buf, source, pos, seq, stop), None)
    except FormatError as exc:
        return None, exc
    if rec is None:
        return None, None
    if not full and not strict:
        return _DISAGREE, None
    # the walk accepts exactly what read() accepts, so a record here means the batch is full
    assert full, "vectorised walk stopped before a record read() accepts"
    return rec["offset"], None


def _meta_columns(buf: Buffer, offsets: np.ndarray, pids: list[str], seq: int) -> dict[str, Any]:
    """The columns of the meta blocks at ``offsets`` (checked) with their decoded ids."""
    rows = len(offsets)
    return {
        "format": ["akka-meta"] * rows,
        "seq": np.arange(seq, seq + rows, dtype=np.int64),
        "offset": offsets,
        "kind": ["meta"] * rows,
        "persistence_id": pids,
        "first": field_at(buf, offsets, 2, ">i8"),
        "last": field_at(buf, offsets, 10, ">i8"),
        "highest_seq": field_at(buf, offsets, 18, ">i8"),
    }


def _valid_prefix(buf: Buffer, whole_file: bool = False) -> Iterator[Record]:
    """The data blocks :meth:`AkkaData.read` accepts before damage; with ``whole_file`` the walk
    ignores the header's total and goes on to the end of the file."""
    if whole_file and len(buf) >= HEADER_SIZE:
        patched = bytearray(buf)
        _HEADER.pack_into(patched, 0, DATA_MAGIC, min(len(buf) - HEADER_SIZE, MAX_I32))
        buf = patched
    try:
        yield from AkkaData().read(buf, "data")
    except FormatError:
        return


def _is_torn_tail(buf: Buffer, pos: int) -> bool:
    """True when the bytes from ``pos`` are the start of one block cut short by the file's end."""
    remaining = len(buf) - pos
    if remaining < DATA_BLOCK_FIXED:
        return True
    size, self_offset = _SIZE_SELF.unpack_from(buf, pos)
    return self_offset == pos and size > remaining


# -- chains ----------------------------------------------------------------------------------

def follow_chain(meta: Record, by_offset: dict[int, Record]) -> tuple[list[Record], list[str]]:
    """The messages of one persistence id, following ``next`` from the meta's ``first``, and
    every inconsistency met on the way (empty when the chain agrees with the meta block)."""
    chain: list[Record] = []
    problems: list[str] = []
    link, prev = meta["first"], 0
    seen: set[int] = set()
    while link:
        block = by_offset.get(link)
        if block is None:
            problems.append(f"link {link} does not point at a data block")
            break
        if link in seen:
            problems.append(f"chain loops back to block {link}")
            break
        seen.add(link)
        if block["prev"] != prev:
            problems.append(f"block {link} has prev {block['prev']}, expected {prev}")
        if chain and block["seq_nr"] <= chain[-1]["seq_nr"]:
            problems.append(f"block {link} has sequence number {block['seq_nr']} after {chain[-1]['seq_nr']}")
        chain.append(block)
        prev, link = link, block["next"]
    last = chain[-1]["self"] if chain else 0
    if not problems and last != meta["last"]:
        problems.append(f"chain ends at {last}, meta says last is {meta['last']}")
    top = chain[-1]["seq_nr"] if chain else 0
    if not problems and top != meta["highest_seq"]:
        problems.append(f"last sequence number is {top}, meta says highest is {meta['highest_seq']}")
    return chain, problems


def chains(meta_records: Sequence[Record], data_records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per persistence id: ``messages`` (count along its chain), ``highest_seq`` (from the meta
    block) and ``consistent`` (links, sequence numbers and meta agree)."""
    by_offset = {m["self"]: m for m in data_records}
    out = {}
    for meta in meta_records:
        chain, problems = follow_chain(meta, by_offset)
        out[meta["persistence_id"]] = {"messages": len(chain), "highest_seq": meta["highest_seq"],
                                       "consistent": not problems}
    return out


_META = AkkaMeta()


# -- streamed validation ---------------------------------------------------------------------
# The checks read linked blocks' headers straight from the buffer instead of keeping records:
# memory is one batch at a time and the block starts as a RecordStarts (8 bytes per
# STARTS_PER_MARK blocks, whatever the file holds).

#: Blocks per batch when validating.
VALIDATE_BATCH = 1 << 14
#: Persistence-id hashes held at once when looking for duplicate ids (8 bytes each).
IDS_PER_PASS = 4_000_000
#: Bytes of persistence ids hashed in one vectorised step (bounds its temporary arrays).
HASH_RUN_BYTES = 1 << 16
#: Chains followed together in one file-order pass over the data file.
CHAINS_PER_PASS = 1 << 14


def _data_batches(data: Buffer, source: str) -> Iterator[tuple[dict[str, np.ndarray], FormatError | None]]:
    """The link fields (offset = self, prev, next, seq_nr) of the data blocks
    :meth:`AkkaData.read` yields, in batches without payloads; the damage that ends them (if
    any) comes with the last batch."""
    for cols in AkkaData().scan(data, source, rows=VALIDATE_BATCH, form="offsets"):
        offsets = cols.data["offset"]
        yield {"offset": offsets, "self": offsets,
               "prev": field_at(data, offsets, 8, ">i4").astype(np.int64),
               "next": field_at(data, offsets, 12, ">i4").astype(np.int64),
               "seq_nr": field_at(data, offsets, 16, ">i8")}, cols.error


def _block_starts(data: Buffer, source: str, pace=None) -> tuple[RecordStarts, FormatError | None]:
    """The starts of ``data``'s valid blocks (a :class:`RecordStarts`: memory does not grow
    with the file) and the damage that ends them (or None)."""
    starts, error = RecordStarts(data, ">i4"), None
    for cols in AkkaData().scan(data, source, rows=VALIDATE_BATCH, form="offsets"):
        starts.extend(cols.data["offset"])
        if pace is not None:
            pace()
        error = cols.error
    return starts, error


def _link_findings(buf: Buffer, starts: RecordStarts, data: dict[str, Any]) -> list[Finding]:
    """The findings of one batch of data blocks' links, in block order (next, then prev)."""
    selfs, seq_nrs = data["self"], data["seq_nr"]
    rows = len(selfs)
    checks = {}
    for field_name, back_at in (("next", 8), ("prev", 12)):  # the other block's prev / next
        link = data[field_name]
        known = starts.contains(link, near=selfs) & (link != 0)
        back = np.zeros(rows, np.int64)
        back[known] = field_at(buf, link[known], back_at, ">i4")
        other_seq = np.zeros(rows, np.int64)
        if field_name == "next":
            other_seq[known] = field_at(buf, link[known], 16, ">i8")
        missing = (link != 0) & ~known
        unmutual = known & (back != selfs)
        falling = known & ~unmutual & (other_seq <= seq_nrs) if field_name == "next" \
            else np.zeros(rows, bool)
        checks[field_name] = (link, back, other_seq, missing, unmutual, falling)
    flagged = np.zeros(rows, bool)
    for _link, _back, _seq, missing, unmutual, falling in checks.values():
        flagged |= missing | unmutual | falling
    findings = []
    for i in np.flatnonzero(flagged).tolist():
        offset = int(data["offset"][i])
        for field_name, back_name in (("next", "prev"), ("prev", "next")):
            link, back, other_seq, missing, unmutual, falling = checks[field_name]
            target = int(link[i])
            if missing[i]:
                findings.append(Finding(offset, f"{field_name} link {target} is not a block start"))
            elif unmutual[i]:
                findings.append(Finding(offset, f"{field_name} link to {target} is not mutual "
                                                f"(its {back_name} is {int(back[i])})"))
            elif falling[i]:
                findings.append(Finding(target, f"sequence number {int(other_seq[i])} does not "
                                                f"increase after {int(seq_nrs[i])}"))
    return findings


def _meta_offsets(meta: Buffer, pace=None) -> Iterator[np.ndarray]:
    """Batches of block offsets of a meta file :meth:`AkkaMeta.read` accepts whole."""
    area_end = HEADER_SIZE + _HEADER.unpack_from(meta, 0)[1]
    unpack = _META_SIZE.unpack_from
    pos = HEADER_SIZE
    while pos < area_end:
        starts = []
        append = starts.append
        for _ in range(VALIDATE_BATCH):
            if pos >= area_end:
                break
            append(pos)
            pos += unpack(meta, pos)[0]
        yield np.array(starts, dtype=np.int64)
        if pace is not None:
            pace()


_META_SIZE = struct.Struct(">h")
_HASH_MULTIPLIER = np.uint64(0x100000001B3)  # FNV's 64-bit prime: an odd multiplier
_HASH_POWERS = np.cumprod(np.full(0x8000, _HASH_MULTIPLIER, np.uint64), dtype=np.uint64)


def _id_hashes(meta: Buffer, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each block's persistence id bytes, vectorised over runs of ids of at
    most :data:`HASH_RUN_BYTES` bytes together (duplicates are confirmed on the bytes
    themselves, so a collision costs only time)."""
    lengths = field_at(meta, offsets, 0, ">i2").astype(np.int64) - META_BLOCK_FIXED
    ends = np.cumsum(lengths)
    out = np.empty(len(offsets), np.uint64)
    i = 0
    while i < len(offsets):
        j = max(i + 1, int(np.searchsorted(ends, ends[i] - lengths[i] + HASH_RUN_BYTES, "right")))
        out[i:j] = _hash_run(meta, offsets[i:j], lengths[i:j])
        i = j
    return out


def _hash_run(meta: Buffer, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    ends = np.cumsum(lengths)
    begins = ends - lengths
    within = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(begins, lengths)
    raw = np.frombuffer(meta, np.uint8)[np.repeat(offsets + META_BLOCK_FIXED, lengths) + within]
    terms = (raw.astype(np.uint64) + np.uint64(1)) * _HASH_POWERS[within]
    hashes = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    filled = lengths > 0
    if filled.any():
        hashes[filled] += np.add.reduceat(terms, begins[filled])
    hashes ^= hashes >> np.uint64(31)  # spread the high bits into the low ones used to partition
    hashes *= np.uint64(0xBF58476D1CE4E5B9)
    hashes ^= hashes >> np.uint64(29)
    return hashes


def _duplicate_ids(meta: Buffer, source: str, pace=None) -> list[Finding]:
    """A finding at every block whose persistence id an earlier block already has.

    Memory is bounded whatever the number of ids: the ids' hashes are sorted in passes of at
    most :data:`IDS_PER_PASS` (one hash range each) to find hashes seen twice, then one last
    pass compares the bytes of only the ids with such a hash."""
    count = sum(len(offs) for offs in _meta_offsets(meta, pace))
    passes = max(1, -(-count // IDS_PER_PASS))
    twice: list[np.ndarray] = []
    for part in range(passes):
        # one array filled in place (grown should a hash range hold more than its share)
        hashes = np.empty(count // passes + count // (8 * passes) + 1024, np.uint64)
        filled = 0
        for offs in _meta_offsets(meta, pace):
            batch = _id_hashes(meta, offs)
            if passes > 1:
                batch = batch[batch % np.uint64(passes) == part]
            if filled + len(batch) > len(hashes):
                hashes = np.resize(hashes, 2 * (filled + len(batch)))
            hashes[filled:filled + len(batch)] = batch
            filled += len(batch)
        hashes = hashes[:filled]
        hashes.sort()
        twice.append(np.unique(hashes[1:][hashes[1:] == hashes[:-1]]))
        del hashes
    suspects = np.concatenate(twice)
    if not len(suspects):
        return []
    findings = []
    first_seen: set[bytes] = set()
    for offs in _meta_offsets(meta, pace):
        for pos in offs[np.isin(_id_hashes(meta, offs), suspects)].tolist():
            size = _META_SIZE.unpack_from(meta, pos)[0]
            pid = bytes(meta[pos + META_BLOCK_FIXED:pos + size])
            if pid in first_seen:
                findings.append(Finding(pos, f"persistence id {pid.decode('utf-8')!r} appears twice"))
            first_seen.add(pid)
    return findings


def _chain_findings(meta: Buffer, source: str, data: Buffer, pace=None) -> list[Finding]:
    """Each meta block's chain in the data file (see :func:`follow_chain` for the rules; the
    same problems in the same words, in meta order). Chains are followed in groups of
    :data:`CHAINS_PER_PASS`, each group's blocks visited in file order."""
    starts, error = _block_starts(data, "data", pace)
    findings = []
    if error is not None:
        findings.append(Finding(0, f"data file is damaged, links checked up to byte {error.offset}"))
    records = _META.read(meta, source)
    try:
        while True:
            group = [(rec["offset"], rec["persistence_id"], rec["first"], rec["last"], rec["highest_seq"])
                     for rec in itertools.islice(records, CHAINS_PER_PASS)]
            if not group:
                break
            for (offset, pid, *_chain), reasons in zip(group, _group_problems(group, data, starts, pace)):
                findings.extend(Finding(offset, f"{pid!r}: {reason}") for reason in reasons)
    finally:
        records.close()
    return findings


class _Walk:
    """Where one chain's walk stands: the previous block, how many blocks, the last one's
    offset and sequence number, and the problems met."""

    __slots__ = ("first", "prev", "count", "last_self", "last_seq", "problems")

    def __init__(self, first: int):
        self.first, self.prev, self.count, self.last_self, self.last_seq = first, 0, 0, 0, 0
        self.problems: list[str] = []

    def step(self, link: int, data: Buffer) -> int:
        """Check the block at ``link`` (a block start) and move past it; its next link."""
        _size, _self, block_prev, block_next, seq_nr = _DATA_BLOCK.unpack_from(data, link)
        if block_prev != self.prev:
            self.problems.append(f"block {link} has prev {block_prev}, expected {self.prev}")
        if self.count and seq_nr <= self.last_seq:
            self.problems.append(f"block {link} has sequence number {seq_nr} after {self.last_seq}")
        self.count, self.last_self, self.last_seq, self.prev = self.count + 1, link, seq_nr, link
        return block_next


def _group_problems(group: list[tuple], data: Buffer, starts: RecordStarts,
                    pace=None) -> list[list[str]]:
    """The problems of each chain of ``group`` ((offset, pid, first, last, highest) each).
    Forward links are followed through a heap, so the data file is read in file order once
    per group; a chain whose link turns back is finished in place (only a damaged or hostile
    file has one, and it needs the set of its visited blocks to tell a loop)."""
    walks = [_Walk(first) for _offset, _pid, first, _last, _highest in group]
    heap: list[tuple[int, int]] = []

    def enter(i: int, link: int) -> None:
        if not link:
            return
        if link not in starts:
            walks[i].problems.append(f"link {link} does not point at a data block")
            return
        heapq.heappush(heap, (link, i))

    for i, walk in enumerate(walks):
        enter(i, walk.first)
    steps = 0
    while heap:
        link, i = heapq.heappop(heap)
        walk = walks[i]
        steps += 1
        if pace is not None and not steps % VALIDATE_BATCH:
            pace()
        following = walk.step(link, data)
        if following and following <= link:
            _finish_in_place(walk, following, link, data, starts)
        else:
            enter(i, following)
    out = []
    for (_offset, _pid, _first, last, highest), walk in zip(group, walks):
        problems = walk.problems
        if not problems and walk.last_self != last:
            problems.append(f"chain ends at {walk.last_self}, meta says last is {last}")
        if not problems and walk.last_seq != highest:
            problems.append(f"last sequence number is {walk.last_seq}, meta says highest is {highest}")
        out.append(problems)
    return out


def _finish_in_place(walk: _Walk, link: int, furthest: int, data: Buffer,
                     starts: RecordStarts) -> None:
    """Follow the rest of a chain from ``link`` block by block, as :func:`follow_chain` does."""
    seen: set[int] | None = None
    while link:
        if link not in starts:
            walk.problems.append(f"link {link} does not point at a data block")
            return
        if seen is None and link <= furthest:
            seen = set(_chain_blocks(walk.first, data, walk.count))
        if seen is not None:
            if link in seen:
                walk.problems.append(f"chain loops back to block {link}")
                return
            seen.add(link)
        furthest = max(furthest, link)
        link = walk.step(link, data)


def _chain_blocks(first: int, data: Buffer, count: int) -> Iterator[int]:
    """The first ``count`` blocks of a chain (already walked, so each is a block start)."""
    link = first
    for _ in range(count):
        yield link
        link = _DATA_BLOCK.unpack_from(data, link)[3]


# -- samples (the demo tree, tests and benches) ----------------------------------------------------

def sample_messages(rng: random.Random, count: int, pids: tuple[str, ...],
             payload: tuple[int, int] = (16, 100)) -> list[tuple[str, int, bytes]]:
    """``count`` messages interleaved over ``pids``, sequence numbers from 1 per id."""
    seq = dict.fromkeys(pids, 0)
    out = []
    for _ in range(count):
        pid = rng.choice(pids)
        seq[pid] += 1
        out.append((pid, seq[pid], samples.text(rng, *payload)))
    return out
