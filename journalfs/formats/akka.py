"""akka-persistence-file-journal: a meta file (one block per persistence id) and a data file
(messages as doubly linked lists per persistence id). All integers are big-endian.

Byte facts are in ``specs/akka-file-journal.md``. Both files start with a 4-byte magic and an
i32 total size of the blocks after the 8-byte header; the header total must match the file.
"""
from __future__ import annotations

import struct
from typing import Any, Iterator, Sequence

import numpy as np

from .base import (Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record, Repair, field_at,
                   slice_payloads, start_offset)

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
        try:
            metas = list(self.read(buf, source))
        except FormatError:
            return []
        findings = []
        seen: set[str] = set()
        for meta in metas:
            if meta["persistence_id"] in seen:
                findings.append(Finding(meta["offset"], f"persistence id {meta['persistence_id']!r} appears twice"))
            seen.add(meta["persistence_id"])
        data = context.get("data")
        if data is None:
            return findings
        try:
            messages = list(AkkaData().read(data, "data"))
        except FormatError as exc:
            findings.append(Finding(0, f"data file is damaged, links checked up to byte {exc.offset}"))
            messages = list(_valid_prefix(data))
        by_offset = {m["self"]: m for m in messages}
        for meta in metas:
            for reason in follow_chain(meta, by_offset)[1]:
                findings.append(Finding(meta["offset"], f"{meta['persistence_id']!r}: {reason}"))
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
        try:
            area_end = _blocks_area(buf, source, self.magics, "data")
            pos = start_offset(source, start, HEADER_SIZE, area_end)
        except FormatError as exc:
            return Columns(self._columns(buf, [], seq), 0, None, seq, exc)
        end = area_end if stop is None else min(stop, area_end)
        wanted = -1 if limit is None else limit
        starts: list[int] = []
        append = starts.append
        unpack_block = _SIZE_SELF.unpack_from
        walk_end = min(end, area_end - DATA_BLOCK_FIXED + 1)  # a whole block header fits before it
        budget = (walk_end - pos) // DATA_BLOCK_FIXED + 1 if limit is None else limit
        for _ in range(budget):  # a for-range is the cheapest loop
            if pos >= walk_end:
                break
            size, self_offset = unpack_block(buf, pos)
            if size < DATA_BLOCK_FIXED or pos + size > area_end or self_offset != pos:
                break
            append(pos)
            pos += size
        next_offset, error = _probe(self, buf, source, pos, seq + len(starts), stop, len(starts) == wanted)
        rows = len(starts)
        return Columns(self._columns(buf, starts, seq), rows, next_offset, seq + rows, error)

    def _columns(self, buf: Buffer, starts: list[int], seq: int) -> dict[str, Any]:
        rows = len(starts)
        offsets = np.array(starts, dtype=np.int64)
        sizes = field_at(buf, offsets, 0, ">i4").astype(np.int64)
        return {
            "format": [self.name] * rows,
            "seq": np.arange(seq, seq + rows, dtype=np.int64),
            "offset": offsets,
            "kind": ["message"] * rows,
            "self": offsets.copy(),
            "prev": field_at(buf, offsets, 8, ">i4").astype(np.int64),
            "next": field_at(buf, offsets, 12, ">i4").astype(np.int64),
            "seq_nr": field_at(buf, offsets, 16, ">i8"),
            "payload": slice_payloads(buf, offsets + DATA_BLOCK_FIXED, offsets + sizes),
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
        try:
            messages = list(self.read(buf, source))
        except FormatError:
            messages = list(_valid_prefix(buf))
        by_offset = {m["self"]: m for m in messages}
        findings = []
        for m in messages:
            for field_name, back in (("next", "prev"), ("prev", "next")):
                link = m[field_name]
                if not link:
                    continue
                other = by_offset.get(link)
                if other is None:
                    findings.append(Finding(m["offset"], f"{field_name} link {link} is not a block start"))
                elif other[back] != m["self"]:
                    findings.append(Finding(m["offset"], f"{field_name} link to {link} is not mutual "
                                                         f"(its {back} is {other[back]})"))
                elif field_name == "next" and other["seq_nr"] <= m["seq_nr"]:
                    findings.append(Finding(link, f"sequence number {other['seq_nr']} does not increase "
                                                  f"after {m['seq_nr']}"))
        return findings

    def key_resolver(self, buf, partners):
        """Persistence ids for batches of this file's messages, from its ``meta`` partner."""
        if "meta" not in partners:
            return None
        resolver = ChainResolver(chain_heads(partners["meta"], "meta"), buf)
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


class ChainResolver:
    """The persistence id of each data block, given the chains' heads."""

    def __init__(self, heads: dict[int, str], buf: Buffer):
        self.heads = heads
        self.buf = buf
        self.tips: dict[int, str | None] = {}  # newest known block of each chain -> pid

    def _walk_back(self, offset: int) -> str | None:
        """pid of the block at ``offset`` by following ``prev`` links through headers."""
        seen = 0
        limit = len(self.buf) // DATA_BLOCK_FIXED + 1  # a longer walk means a cycle
        while seen <= limit:
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


def _probe(codec: Codec, buf: Buffer, source: str, pos: int, seq: int, stop: int | None,
           full: bool) -> tuple[int | None, FormatError | None]:
    """Where a vectorised walk ended: one :meth:`Codec.read` step from ``pos`` gives the
    ``next_offset`` (a following record when the batch is ``full``) and any damage there."""
    try:
        rec = next(codec.read(buf, source, pos, seq, stop), None)
    except FormatError as exc:
        return None, exc
    if rec is None:
        return None, None
    # the walk accepts exactly what read() accepts, so a record here means the batch is full
    assert full, "vectorised walk stopped before a record read() accepts"
    return rec["offset"], None


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
