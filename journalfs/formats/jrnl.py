"""YeltsinDB page-transaction journal (``JRNL``), specs/jrnl.md.

A 20-byte header (``JRNL``, u64 first and u64 last transaction offset), then transactions
linked both ways: u64 prev, u64 next, i64 time (Unix s), u8 flags (bit 0 = complete), then
operations (u8 type, u32 size, data) ending with op 0xFF. Records follow the chain from the
header's first offset; links must move forward through the file, so a cycle cannot loop.
All integers are little-endian.
"""
from __future__ import annotations

import base64
import random
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from .base import (Base64Bytes, Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record,
                   RecordGroup, RecordLists, Repair, field_at, payload_b64, slice_payloads)
from . import samples
from .spans import paused_gc

MAGIC = b"JRNL"
COMPLETE_FLAG = 0x01

_HEADER = struct.Struct("<4sQQ")
_LINKS = struct.Struct("<QQ")
_TX_HEADER = struct.Struct("<QQqB")
_OP_HEADER = struct.Struct("<BI")
HEADER, TX_HEADER, OP_HEADER = _HEADER.size, _TX_HEADER.size, _OP_HEADER.size  # 20, 25, 5
_ALLOC = struct.Struct("<QQQ")
_MODIFY = struct.Struct("<QHH")
_REMOVE = struct.Struct("<QQ")

OP_ALLOC, OP_MODIFY, OP_REMOVE, OP_ROLLBACK, OP_COMPLETE = 0x01, 0x02, 0x03, 0xFE, 0xFF
OP_NAMES = {OP_ALLOC: "alloc", OP_MODIFY: "modify", OP_REMOVE: "remove",
            OP_ROLLBACK: "rollback", OP_COMPLETE: "complete"}
OP_CODES = {v: k for k, v in OP_NAMES.items()}


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


# -- operations -----------------------------------------------------------------------------

def decode_op(code: int, data: bytes, source: str, offset: int) -> dict:
    """One operation as a JSON-safe dict; ``offset`` (of the op header) only names errors."""
    name = OP_NAMES.get(code)
    if name is None:
        raise FormatError(source, offset, f"unknown operation type 0x{code:02x}")
    if code == OP_ALLOC:
        _need(len(data) == _ALLOC.size, source, offset, f"page allocation of {len(data)} bytes "
                                                        "(must be 24)")
        page, before, after = _ALLOC.unpack(data)
        return {"op": name, "page": page, "free_before": before, "free_after": after}
    if code == OP_REMOVE:
        _need(len(data) == _REMOVE.size, source, offset, f"page removal of {len(data)} bytes "
                                                         "(must be 16)")
        page, before = _REMOVE.unpack(data)
        return {"op": name, "page": page, "free_before": before}
    if code == OP_MODIFY:
        _need(len(data) >= _MODIFY.size, source, offset, "page modification shorter than 12 bytes")
        page, data_offset, size = _MODIFY.unpack_from(data)
        _need(len(data) == _MODIFY.size + 2 * size, source, offset,
              f"page modification of {len(data)} bytes does not hold two {size}-byte images")
        images = data[_MODIFY.size:]
        return {"op": name, "page": page, "data_offset": data_offset, "size": size,
                "before_b64": payload_b64(images[:size]), "after_b64": payload_b64(images[size:])}
    return {"op": name, "data_b64": payload_b64(data)}


def encode_op(op: dict) -> bytes:
    """The bytes of one operation dict (as :func:`decode_op` makes; missing fields are 0)."""
    name = op["op"]
    if name == "alloc":
        data = _ALLOC.pack(op.get("page", 0), op.get("free_before", 0), op.get("free_after", 0))
    elif name == "remove":
        data = _REMOVE.pack(op.get("page", 0), op.get("free_before", 0))
    elif name == "modify":
        before, after = _unb64(op.get("before_b64")), _unb64(op.get("after_b64"))
        if len(before) != len(after):
            raise ValueError("modify before/after images differ in size")
        data = _MODIFY.pack(op.get("page", 0), op.get("data_offset", 0), len(before)) \
            + before + after
    elif name in OP_CODES:
        data = _unb64(op.get("data_b64"))
    else:
        raise ValueError(f"unknown jrnl operation {name!r}")
    return _OP_HEADER.pack(OP_CODES[name], len(data)) + data


def _need(ok: bool, source: str, offset: int, reason: str) -> None:
    if not ok:
        raise FormatError(source, offset, reason)


def status_of(complete: bool, ops: list[dict]) -> str:
    if complete:
        return "complete"
    return "redo" if any(op["op"] == "complete" for op in ops) else "rollback"


# -- transactions -----------------------------------------------------------------------------

@dataclass
class Transaction:
    offset: int
    prev: int
    next: int
    time: int
    flags: int
    ops: list[dict]
    end: int  # byte after its last operation

    @property
    def complete(self) -> bool:
        return bool(self.flags & COMPLETE_FLAG)

    @property
    def status(self) -> str:
        return status_of(self.complete, self.ops)


class TornTransaction(FormatError):
    """The chain's last transaction is cut short by the end of the file (a crash mid-write)."""

    def __init__(self, source: str, offset: int, reason: str, tx_offset: int, flags: int | None):
        super().__init__(source, offset, reason)
        self.tx_offset = tx_offset
        self.flags = flags


def parse_transaction(buf: Buffer, source: str, pos: int, prev: int | None) -> Transaction:
    """The transaction at ``pos``; ``prev`` is the offset its prev link must hold (None:
    unknown, when resuming). Operations run to op 0xFF, else to the next link / end of file."""
    end = len(buf)
    if pos < HEADER:
        raise FormatError(source, pos, f"transaction offset {pos} points into the header")
    if pos + TX_HEADER > end:
        raise TornTransaction(source, min(pos, end), f"transaction at {pos} cut off by the end "
                              f"of the file ({max(0, end - pos)} of 25 header bytes)", pos, None)
    back, nxt, t, flags = _TX_HEADER.unpack_from(buf, pos)
    if prev is not None and back != prev:
        raise FormatError(source, pos, f"prev link is {back}, expected {prev}")
    if nxt and nxt < pos + TX_HEADER:
        raise FormatError(source, pos + 8, f"next link {nxt} does not point past this "
                                           f"transaction's header ({pos + TX_HEADER})")
    # a next link at or past the end: this transaction may be whole, the next one is torn off
    bound = min(nxt, end) if nxt else end
    ops: list[dict] = []
    at = pos + TX_HEADER
    while at < bound:
        if at + OP_HEADER > bound:
            _torn_or_bad(source, at, pos, flags, bound == end, "operation header truncated")
        code, size = _OP_HEADER.unpack_from(buf, at)
        if code not in OP_NAMES:
            raise FormatError(source, at, f"unknown operation type 0x{code:02x}")
        if at + OP_HEADER + size > bound:
            _torn_or_bad(source, at, pos, flags, bound == end,
                         f"operation of {size} bytes runs past the transaction's end ({bound})")
        data = bytes(buf[at + OP_HEADER:at + OP_HEADER + size])
        ops.append(decode_op(code, data, source, at))
        at += OP_HEADER + size
        if code == OP_COMPLETE:
            break
    else:
        # no completion op before the end of the file: a torn write, unless this is the last
        # transaction and not marked complete (the spec's rollback case)
        if nxt > end or (bound == end and flags & COMPLETE_FLAG):
            raise TornTransaction(source, at, "transaction cut off by the end of the file "
                                              "before its completion op", pos, flags)
    return Transaction(pos, back, nxt, t, flags, ops, at)


def _torn_or_bad(source: str, at: int, tx: int, flags: int, at_eof: bool, reason: str) -> None:
    if at_eof:  # the last transaction, cut by the end of the file
        raise TornTransaction(source, at, reason, tx, flags)
    raise FormatError(source, at, reason)


def read_header(buf: Buffer, source: str) -> tuple[int, int]:
    """(first, last) transaction offsets."""
    if len(buf) < HEADER:
        raise FormatError(source, 0, f"journal header truncated ({len(buf)} of 20 bytes)")
    magic, first, last = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError(source, 0, "not a JRNL journal (magic is not 'JRNL')")
    if (first == 0) != (last == 0):
        raise FormatError(source, 4, f"header offsets disagree: first {first}, last {last}")
    return first, last


def walk(buf: Buffer, source: str, start: int | None = None,
         stop: int | None = None) -> Iterator[Transaction]:
    """Transactions in chain order from ``start`` (None = the header's first)."""
    prev: int | None = None
    if start is None:
        start, _last = read_header(buf, source)
        prev = 0
    pos = start
    while pos and (stop is None or pos < stop):
        tx = parse_transaction(buf, source, pos, prev)
        yield tx
        prev, pos = tx.offset, tx.next


def tx_record(tx: Transaction, seq: int) -> Record:
    return {"format": "jrnl", "seq": seq, "offset": tx.offset, "kind": "transaction",
            "prev": tx.prev, "next": tx.next, "time": tx.time, "complete": tx.complete,
            "status": tx.status, "ops": tx.ops}


class Jrnl(Codec):
    name = "jrnl"
    columns = ColumnMap(time="time")

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        return self.write(sample_transactions(rng, count, last="complete"))

    def demo_files(self, rng, described):
        """Seven transactions: complete ones, redos, and a rollback last."""
        return {"jrnl/db.jrnl": self.write(sample_transactions(rng, 7))}

    def read_text_columns(self, buf, source, start=None, seq=0, stop=None, limit=None):
        return _text_columns(buf, source, start, seq, stop, limit)
    kinds = ("transaction",)
    header_size = HEADER

    def sniff(self, head: bytes) -> bool:
        """The magic, and header offsets that are not plain text (which they never are in
        a real journal: offsets are small numbers with zero high bytes)."""
        if head[:4] != MAGIC:
            return False
        offsets = head[4:HEADER]
        return len(offsets) < 16 or not all(0x20 <= b < 0x7F or b in b"\t\r\n" for b in offsets)

    def read(self, buf: Buffer, source: str, start: int | None = None, seq: int = 0,
             stop: int | None = None) -> Iterator[Record]:
        for tx in walk(buf, source, start, stop):
            yield tx_record(tx, seq)
            seq += 1

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None) -> Columns:
        """Vectorised decoding: a tight loop follows the chain (one unpack per transaction
        and per operation), numpy gathers the fields and checks the operations' sizes; each
        row's ``ops`` are built as dicts only when read (:class:`BuiltOnAccess`). Wherever
        the loop stops, :func:`parse_transaction` takes one exact step, so the rows, the
        damage and where the next batch resumes are exactly what :meth:`read` gives."""
        prev: int | None = None
        if start is None:
            try:
                pos, _last = read_header(buf, source)
            except FormatError as exc:
                return _chain_columns(_Chain.empty(), buf, source, seq, None, exc)
            prev = 0
        else:
            pos = start
        with paused_gc():
            offsets, after = _walk_links(buf, pos, stop, limit)
            chain = _Chain.of(buf, offsets, prev)
        if chain.rows < len(offsets):  # a transaction read() refuses: the exact step names it
            after = int(offsets[chain.rows])
        prev = int(chain.offsets[-1]) if chain.rows else prev
        pos = after
        # one exact step: the chain's end, the damage, or the next batch's first transaction
        if not pos or (stop is not None and pos >= stop):
            return _chain_columns(chain, buf, source, seq, None, None)
        try:
            parse_transaction(buf, source, pos, prev)
        except FormatError as exc:
            return _chain_columns(chain, buf, source, seq, None, exc)
        if chain.rows == limit:
            return _chain_columns(chain, buf, source, seq, pos, None)
        # the walk refused a transaction read() accepts: decode this batch the plain way
        return Codec.read_columns(self, buf, source, start, seq, stop, limit)

    def write(self, records: Sequence[Record], **_: Any) -> bytes:
        """A consistent chain: offsets and links computed, flags from ``complete``, ops kept."""
        bodies = []
        for rec in records:
            ops = b"".join(encode_op(op) for op in rec.get("ops", ()))
            bodies.append((rec.get("time", 0), COMPLETE_FLAG if rec.get("complete") else 0, ops))
        offsets, pos = [], HEADER
        for _t, _f, ops in bodies:
            offsets.append(pos)
            pos += TX_HEADER + len(ops)
        first = offsets[0] if offsets else 0
        last = offsets[-1] if offsets else 0
        parts = [_HEADER.pack(MAGIC, first, last)]
        for i, (t, flags, ops) in enumerate(bodies):
            prev = offsets[i - 1] if i else 0
            nxt = offsets[i + 1] if i + 1 < len(offsets) else 0
            parts.append(_TX_HEADER.pack(prev, nxt, t, flags) + ops)
        return b"".join(parts)

    # -- validation and recovery ---------------------------------------------------------
    def validate(self, buf: Buffer, source: str, **context: Any) -> list[Finding]:
        state = _scan(buf, source)
        findings = [Finding(f.offset, f.reason, f.severity) for f in state.findings]
        if state.needed:
            findings.append(Finding(state.needed[1], state.needed[2], "warning"))
        return findings

    def repair(self, buf: Buffer, source: str, **context: Any) -> Repair | None:
        """The spec's recovery: drop a torn or incomplete (no 0xFF) last transaction
        (rollback), or set the COMPLETE flag of a last transaction that has its 0xFF op
        (redo: there is no table file here to re-apply after-images to; with ``table=`` the
        redo is left to the table's owner). Damage elsewhere is not repaired."""
        state = _scan(buf, source)
        if state.fatal:
            return None
        data = bytearray(buf)
        tail = state.tail
        if state.torn is not None or (tail is not None and tail.status == "rollback"):
            cut = min(state.torn.tx_offset, len(buf)) if state.torn is not None else tail.offset
            kept = tail if state.torn is not None else state.before_tail
            _rollback(data, kept.offset if kept is not None else None, cut)
            return Repair(bytes(data), [
                f"rolled back the incomplete transaction at byte {cut}: "
                + (f"journal now ends at transaction {kept.offset}" if kept is not None
                   else "journal now empty")])
        actions: list[str] = []
        if tail is not None and _last_offset(data) != tail.offset:
            _set_last(data, tail.offset)
            actions.append(f"header's last offset set to the chain's end ({tail.offset})")
        if tail is not None and tail.status == "redo":
            tail = tail.offset
            if context.get("table"):
                actions.append(f"redo of transaction {tail} left to the table file "
                               f"{context['table']} (not applied here)")
            else:
                data[tail + 24] |= COMPLETE_FLAG
                actions.append(f"redo: transaction at byte {tail} marked complete "
                               "(no table file to re-apply its after-images to)")
        return Repair(bytes(data), actions) if actions else None


def _last_offset(data: bytearray) -> int:
    return _HEADER.unpack_from(data, 0)[2]


def _set_last(data: bytearray, last: int) -> None:
    struct.pack_into("<Q", data, 12, last)


def _rollback(data: bytearray, last: int | None, cut: int) -> None:
    """Unlink everything from ``cut`` on and truncate there, ``last`` (the offset of the
    transaction that stays the chain's end) keeping a zero next link (20 bytes when nothing
    is left)."""
    if last is None:
        struct.pack_into("<QQ", data, 4, 0, 0)
        del data[HEADER:]
        return
    struct.pack_into("<Q", data, last + 8, 0)
    _set_last(data, last)
    del data[cut:]


@dataclass
class _Scan:
    """What validation and recovery need of the chain, kept in constant memory: its last two
    transactions and the one the header names as last, never the whole chain."""

    findings: list[Finding]
    tail: Transaction | None = None  # the chain's last transaction
    before_tail: Transaction | None = None  # the one before it
    at_last: Transaction | None = None  # the first transaction at the header's last offset
    torn: TornTransaction | None = None
    fatal: bool = False  # damage a recovery rule cannot fix
    needed: tuple[str, int, str] | None = None  # (status, offset, sentence)


#: Transactions per batch when validating.
VALIDATE_BATCH = 1 << 13


def _chain_ends(buf: Buffer, source: str, last: int
                ) -> tuple[int | None, int | None, int | None, FormatError | None]:
    """Offsets of the chain's last transaction but one, its last, and the first at the
    header's ``last`` offset (None where there is none), walked a batch of columns at a time,
    and the damage :func:`walk` would raise after them (or None)."""
    before_tail = tail = at_last = error = None
    for cols in Jrnl().scan(buf, source, rows=VALIDATE_BATCH, form="offsets"):
        offsets = cols.data["offset"][:cols.rows].tolist() if cols.rows else []
        if offsets:
            before_tail, tail = (offsets[-2] if len(offsets) > 1 else tail), offsets[-1]
            if at_last is None and last in offsets:
                at_last = last
        error = cols.error
    return before_tail, tail, at_last, error


def _scan(buf: Buffer, source: str) -> _Scan:
    """The chain's end, the damage in the chain and what recovery it needs."""
    scan = _Scan([])
    try:
        first, last = read_header(buf, source)
        *ends, damage = _chain_ends(buf, source, last)
        scan.before_tail, scan.tail, scan.at_last = (
            None if at is None else parse_transaction(buf, source, at, None) for at in ends)
        if damage is not None:
            raise damage
    except TornTransaction as exc:
        scan.findings.append(Finding(exc.offset, exc.reason))
        if exc.tx_offset > len(buf):  # a link past the end is corruption, not a torn write
            scan.fatal = True
            return scan
        scan.torn = exc
    except FormatError as exc:
        scan.fatal = True
        scan.findings.append(Finding(exc.offset, exc.reason))
        return scan
    if scan.torn is not None:
        scan.needed = ("rollback", scan.torn.tx_offset,
                       f"needs rollback: transaction at byte {scan.torn.tx_offset} is torn")
        return scan
    tail = scan.tail
    if tail is None:
        return scan
    if last != tail.offset:
        at_last = scan.at_last
        reason = (f"header's last offset {last} is not the chain's end {tail.offset}")
        if at_last is not None and at_last.next:
            reason += f"; last transaction at {last} has a non-zero next link ({at_last.next})"
        scan.findings.append(Finding(12, reason))
    if tail.status != "complete":
        scan.needed = (tail.status, tail.offset,
                       f"needs {tail.status}: last transaction at byte {tail.offset} is "
                       + ("not marked complete but has its completion op" if tail.status == "redo"
                          else "incomplete (no completion op)"))
    return scan


# -- columns with the ops as JSON text (the Spark reader's hot path) ------------------------------
# Each transaction's ``ops`` is rendered straight to the text ``json.dumps(ops,
# ensure_ascii=False)`` would give, without a dict per operation. Only clean chains are decoded
# here: at anything :meth:`Jrnl.read` would stop at or report (torn transaction, bad link,
# unknown op, wrong op size, bad header) the batch is left to the ordinary decoder, so damage is
# reported exactly as the codec reports it.

class _Unclean(Exception):
    """Something the codec must handle (and word); internal to this module."""


def _b64(data) -> str:
    return base64.b64encode(data).decode("ascii")


def _op_json(code: int, buf, at: int, size: int) -> str:
    data = buf[at:at + size]
    if code == OP_ALLOC:
        if size != _ALLOC.size:
            raise _Unclean
        page, before, after = _ALLOC.unpack(data)
        return f'{{"op": "alloc", "page": {page}, "free_before": {before}, "free_after": {after}}}'
    if code == OP_REMOVE:
        if size != _REMOVE.size:
            raise _Unclean
        page, before = _REMOVE.unpack(data)
        return f'{{"op": "remove", "page": {page}, "free_before": {before}}}'
    if code == OP_MODIFY:
        if size < _MODIFY.size:
            raise _Unclean
        page, data_offset, image = _MODIFY.unpack_from(data)
        if size != _MODIFY.size + 2 * image:
            raise _Unclean
        body = _MODIFY.size
        return (f'{{"op": "modify", "page": {page}, "data_offset": {data_offset}, "size": {image}, '
                f'"before_b64": "{_b64(data[body:body + image])}", '
                f'"after_b64": "{_b64(data[body + image:])}"}}')
    return f'{{"op": "{OP_NAMES[code]}", "data_b64": "{_b64(data)}"}}'


def _transaction(buf, pos: int, prev: int | None, end: int):
    """(prev, next, time, complete, status, ops JSON) of a clean transaction at ``pos``."""
    if pos < HEADER or pos + TX_HEADER > end:
        raise _Unclean
    back, nxt, t, flags = _TX_HEADER.unpack_from(buf, pos)
    if (prev is not None and back != prev) or (nxt and nxt < pos + TX_HEADER):
        raise _Unclean
    bound = min(nxt, end) if nxt else end
    ops = []
    has_complete_op = False
    at = pos + TX_HEADER
    while at < bound:
        if at + OP_HEADER > bound:
            raise _Unclean
        code, size = _OP_HEADER.unpack_from(buf, at)
        at += OP_HEADER
        if code not in OP_NAMES or at + size > bound:
            raise _Unclean
        ops.append(_op_json(code, buf, at, size))
        at += size
        if code == OP_COMPLETE:
            has_complete_op = True
            break
    else:  # no completion op: the codec decides between torn and rollback
        if nxt > end or (bound == end and flags & COMPLETE_FLAG):
            raise _Unclean
    complete = bool(flags & COMPLETE_FLAG)
    status = "complete" if complete else ("redo" if has_complete_op else "rollback")
    return back, nxt, t, complete, status, "[" + ", ".join(ops) + "]"


def _text_columns(buf, source: str, start: int | None = None, seq: int = 0,
                  stop: int | None = None, limit: int | None = None) -> Columns | None:
    """See :meth:`Jrnl.read_text_columns`."""
    end = len(buf)
    try:
        if start is None:
            if end < HEADER:
                raise _Unclean
            magic, first, last = _HEADER.unpack_from(buf, 0)
            if magic != MAGIC or (first == 0) != (last == 0):
                raise _Unclean
            pos, prev = first, 0
        else:
            pos, prev = start, None
        offsets, prevs, nexts, times, completes, statuses, ops = [], [], [], [], [], [], []
        next_offset = None
        while pos and (stop is None or pos < stop):
            back, nxt, t, complete, status, op_text = _transaction(buf, pos, prev, end)
            if len(offsets) == limit:  # checked (its prev link too) but left to the next batch
                next_offset = pos
                break
            offsets.append(pos)
            prevs.append(back)
            nexts.append(nxt)
            times.append(t)
            completes.append(complete)
            statuses.append(status)
            ops.append(op_text)
            prev, pos = pos, nxt
    except (_Unclean, struct.error):
        return None
    rows = len(offsets)
    data = {"format": "jrnl", "seq": list(range(seq, seq + rows)), "offset": offsets,
            "kind": "transaction", "prev": prevs, "next": nexts, "time": times,
            "complete": completes, "status": statuses, "ops": ops}
    return Columns(data, rows, next_offset, seq + rows, None)


# -- columns (Codec.read_columns) ------------------------------------------------------------------

_NEXT = struct.Struct("<Q").unpack_from
#: Operations walked in parallel per batch (every transaction's k-th operation at step k);
#: the rest of a transaction with more is walked one operation at a time (a step costs the
#: same however few transactions are still in it).
PARALLEL_OPS = 64
_KNOWN_OP = np.zeros(256, bool)
_KNOWN_OP[list(OP_NAMES)] = True


def _walk_links(buf, pos: int, stop: int | None, limit: int | None) -> tuple[np.ndarray, int]:
    """Up to ``limit`` transaction starts along the next links from ``pos`` (each link
    moving past its transaction's header, every header inside the buffer), and the position
    after the last; the rest of each transaction is checked by :meth:`_Chain.of`."""
    end = len(buf)
    stop = end + 1 if stop is None else stop  # no transaction starts past the end
    budget = end // TX_HEADER + 1 if limit is None else limit
    walked: list[int] = []
    append = walked.append
    for _ in range(budget):
        if not pos or pos >= stop or pos < HEADER or pos + TX_HEADER > end:
            break
        nxt = _NEXT(buf, pos + 8)[0]
        if nxt and nxt < pos + TX_HEADER:
            break
        append(pos)
        pos = nxt
    return np.array(walked, np.int64), pos


class _Chain:
    """The transactions of a batch :func:`parse_transaction` accepts: their fixed fields, and
    every operation's code and data span in one flat table (``op_first[i]`` is transaction
    i's first operation)."""

    def __init__(self, offsets, prevs, nexts, times, flags, ended, op_first, codes, starts, sizes):
        self.offsets, self.prevs, self.nexts, self.times = offsets, prevs, nexts, times
        self.flags, self.ended, self.op_first = flags, ended, op_first
        self.codes, self.starts, self.sizes = codes, starts, sizes

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @classmethod
    def empty(cls) -> "_Chain":
        z = np.zeros(0, np.int64)
        return cls(z, z.astype(np.uint64), z.astype(np.uint64), z, z.astype(np.uint8),
                   z.astype(bool), np.zeros(1, np.int64), z.astype(np.uint8), z, z)

    @classmethod
    def of(cls, buf, offsets: np.ndarray, prev: int | None) -> "_Chain":
        """The leading transactions at ``offsets`` (whose headers fit and whose next links
        move forward) that read() accepts whole: prev links, operation headers, operation
        sizes, the completion op or an honest end."""
        n = len(offsets)
        if not n:
            return cls.empty()
        end = len(buf)
        prevs = field_at(buf, offsets, 0, "<u8")
        nexts = field_at(buf, offsets, 8, "<u8")
        bad = np.zeros(n, bool)
        expected = np.empty(n, np.uint64)
        expected[1:] = offsets[:-1]
        expected[0] = prevs[0] if prev is None else prev
        bad |= prevs != expected
        big_next = nexts >= np.uint64(end)
        bounds = np.where((nexts == 0) | big_next, end, nexts.astype(np.int64))
        # the operations, every transaction's k-th one at step k
        cursor = offsets + TX_HEADER
        active = np.flatnonzero(cursor < bounds)
        ended = np.zeros(n, bool)
        found: list[tuple[np.ndarray, ...]] = []
        byte = np.frombuffer(buf, np.uint8)
        for _ in range(PARALLEL_OPS):
            if not len(active):
                break
            at, bound = cursor[active], bounds[active]
            whole = at + OP_HEADER <= bound
            safe = np.where(whole, at, 0)  # a header that does not fit is not read
            codes = byte[safe]
            sizes = field_at(buf, safe, 1, "<u4").astype(np.int64)
            good = whole & _KNOWN_OP[codes] & (at + OP_HEADER + sizes <= bound)
            bad[active[~good]] = True
            rows, at, codes, sizes = active[good], at[good], codes[good], sizes[good]
            found.append((rows, codes, at + OP_HEADER, sizes))
            cursor[rows] = at + OP_HEADER + sizes
            done = codes == OP_COMPLETE
            ended[rows[done]] = True
            active = rows[~done & (cursor[rows] < bounds[rows])]
        # the few transactions with more operations go on one operation at a time
        rest = [_walk_ops(buf, row, int(cursor[row]), int(bounds[row]), bad, ended)
                for row in active.tolist()]
        # no completion op: torn if the next link runs past the end, or the last transaction
        # says it is complete
        flags = field_at(buf, offsets, 24, "u1")
        torn = ~ended & (big_next & (nexts > np.uint64(end)) | ((bounds == end) & (flags & COMPLETE_FLAG > 0)))
        bad |= torn
        # a transaction's k-th operation was found at step k (it was active at every step
        # before): its place in the flat table is its transaction's first place plus k
        counts = np.zeros(n, np.int64)
        for step_rows, *_ in found:
            counts[step_rows] += 1
        for row, more_codes, *_ in rest:
            counts[row] += len(more_codes)
        op_first = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=op_first[1:])
        total = int(op_first[-1])
        rows, codes = np.empty(total, np.int64), np.empty(total, np.uint8)
        starts, sizes = np.empty(total, np.int64), np.empty(total, np.int64)
        for k, (step_rows, step_codes, step_starts, step_sizes) in enumerate(found):
            places = op_first[step_rows] + k
            rows[places], codes[places] = step_rows, step_codes
            starts[places], sizes[places] = step_starts, step_sizes
        for row, more_codes, more_starts, more_sizes in rest:
            places = slice(op_first[row] + PARALLEL_OPS, op_first[row + 1])
            rows[places], codes[places] = row, more_codes
            starts[places], sizes[places] = more_starts, more_sizes
        bad |= _refused_ops(buf, n, rows, codes, starts, sizes)
        first_bad = np.flatnonzero(bad)
        take = int(first_bad[0]) if len(first_bad) else n
        ops = int(op_first[take])
        return cls(offsets[:take], prevs[:take], nexts[:take],
                   field_at(buf, offsets[:take], 16, "<i8"), flags[:take], ended[:take],
                   op_first[:take + 1], codes[:ops], starts[:ops], sizes[:ops])


def _walk_ops(buf, row: int, at: int, bound: int, bad: np.ndarray, ended: np.ndarray
              ) -> tuple[int, list[int], list[int], list[int]]:
    """The operations of transaction ``row`` from ``at`` on, one by one (the rules of
    :meth:`_Chain.of`'s parallel steps): (row, codes, data starts, sizes)."""
    codes: list[int] = []
    starts: list[int] = []
    sizes: list[int] = []
    while at < bound:
        if at + OP_HEADER > bound:
            bad[row] = True
            break
        code, size = _OP_HEADER.unpack_from(buf, at)
        at += OP_HEADER
        if code not in OP_NAMES or at + size > bound:
            bad[row] = True
            break
        codes.append(code)
        starts.append(at)
        sizes.append(size)
        at += size
        if code == OP_COMPLETE:
            ended[row] = True
            break
    return row, codes, starts, sizes


def _refused_ops(buf, n: int, rows: np.ndarray, codes: np.ndarray, starts: np.ndarray,
                 sizes: np.ndarray) -> np.ndarray:
    """Per transaction: True when it holds an operation :func:`decode_op` refuses (a page
    allocation not of 24 bytes, a removal not of 16, a modification whose two images do not
    fill it)."""
    refused = np.zeros(n, bool)
    if not len(codes):
        return refused
    bad = ((codes == OP_ALLOC) & (sizes != _ALLOC.size)) | ((codes == OP_REMOVE) & (sizes != _REMOVE.size))
    modify = np.flatnonzero(codes == OP_MODIFY)
    if len(modify):
        short = sizes[modify] < _MODIFY.size
        bad[modify[short]] = True
        whole = modify[~short]
        images = field_at(buf, starts[whole], 10, "<u2").astype(np.int64)
        bad[whole[sizes[whole] != _MODIFY.size + 2 * images]] = True
    refused[rows[bad]] = True
    return refused


def _chain_columns(chain: _Chain, buf, source: str, seq: int, next_offset: int | None,
                   error: FormatError | None) -> Columns:
    rows = chain.rows
    complete = (chain.flags & COMPLETE_FLAG).astype(bool)
    status = np.array(["rollback", "redo", "complete"])[
        np.where(complete, 2, chain.ended.astype(np.intp))].tolist()
    data = {"format": ["jrnl"] * rows,
            "seq": np.arange(seq, seq + rows, dtype=np.int64),
            "offset": chain.offsets,
            "kind": ["transaction"] * rows,
            "prev": chain.prevs,
            "next": chain.nexts,
            "time": chain.times,
            "complete": complete,
            "status": status,
            "ops": _ops_column(chain, buf, source)}
    return Columns(data, rows, next_offset, seq + rows, error)


def _ops_column(chain: _Chain, buf, source: str) -> RecordLists:
    """Each row's operations as :func:`decode_op` makes them, built when read, from a copy
    of the batch's operation bytes (the column outlives the caller's buffer); for the
    renderer, the operations of each type as columns (:func:`_op_groups`)."""
    rows = chain.rows
    if not len(chain.codes):
        return RecordLists(rows, lambda i: [], np.zeros(rows + 1, dtype=np.int64), lambda: [])
    lo = int(chain.starts[0])
    blob = bytes(memoryview(buf).cast("B")[lo:int(chain.starts[-1] + chain.sizes[-1])])
    table: list = []  # (first, codes, starts, ends) as lists, made at the first build

    def build(i: int) -> list[dict]:
        if not table:
            starts = chain.starts - lo
            table.extend((chain.op_first.tolist(), chain.codes.tolist(), starts.tolist(),
                          (starts + chain.sizes).tolist()))
        first, codes, starts, ends = table
        return [decode_op(codes[j], blob[starts[j]:ends[j]], source, starts[j] + lo - OP_HEADER)
                for j in range(first[i], first[i + 1])]
    return RecordLists(rows, build, chain.op_first,
                       lambda: _op_groups(chain.codes, chain.starts - lo, chain.sizes, blob))


def _op_groups(codes: np.ndarray, starts: np.ndarray, sizes: np.ndarray, blob: bytes
               ) -> list[RecordGroup] | None:
    """The operations (already checked: sizes match their type) grouped by type, each group's
    fields as :func:`decode_op` names and orders them; None for a type it does not know."""
    if not np.isin(codes, list(OP_NAMES)).all():
        return None
    groups = []
    for code, name in OP_NAMES.items():
        places = np.flatnonzero(codes == code)
        if not len(places):
            continue
        at = starts[places]
        if code == OP_ALLOC:
            data = {"op": name, "page": field_at(blob, at, 0, "<u8"),
                    "free_before": field_at(blob, at, 8, "<u8"),
                    "free_after": field_at(blob, at, 16, "<u8")}
        elif code == OP_REMOVE:
            data = {"op": name, "page": field_at(blob, at, 0, "<u8"),
                    "free_before": field_at(blob, at, 8, "<u8")}
        elif code == OP_MODIFY:
            size = field_at(blob, at, 10, "<u2").astype(np.int64)
            images = at + _MODIFY.size
            data = {"op": name, "page": field_at(blob, at, 0, "<u8"),
                    "data_offset": field_at(blob, at, 8, "<u2"), "size": size,
                    "before_b64": Base64Bytes(slice_payloads(blob, images, images + size)),
                    "after_b64": Base64Bytes(slice_payloads(blob, images + size,
                                                            images + 2 * size))}
        else:
            data = {"op": name,
                    "data_b64": Base64Bytes(slice_payloads(blob, at, at + sizes[places]))}
        groups.append(RecordGroup(list(data), data, places))
    return groups


# -- samples (the demo tree, tests and benches) ----------------------------------------------------

def _sample_ops(rng: random.Random, ending: str | None) -> list[dict]:
    ops = []
    for _ in range(rng.randint(1, 4)):
        page = 65536 * rng.randint(1, 64)
        kind = rng.choice(("alloc", "modify", "modify", "remove"))
        if kind == "alloc":
            ops.append({"op": "alloc", "page": page, "free_before": page + 65536, "free_after": 0})
        elif kind == "remove":
            ops.append({"op": "remove", "page": page, "free_before": 0})
        else:
            size = rng.randint(4, 48)
            before, after = rng.randbytes(size), rng.randbytes(size)
            ops.append({"op": "modify", "page": page, "data_offset": rng.randrange(65536 - size),
                        "size": size, "before_b64": payload_b64(before),
                        "after_b64": payload_b64(after)})
    if ending:
        ops.append({"op": ending, "data_b64": ""})
    return ops


def sample_transactions(rng: random.Random, count: int, last: str = "rollback") -> list[dict]:
    """``count`` transactions: complete ones with every fifth from the third on a redo (0xFF
    op, flag clear); the last one is ``last`` ("complete", "redo" or "rollback" = no 0xFF op)."""
    records, now = [], samples.BASE_S
    for n in range(count):
        now += rng.randint(1, 600)
        status = last if n == count - 1 else ("redo" if n % 5 == 2 else "complete")
        records.append({"kind": "transaction", "time": now, "complete": status == "complete",
                        "ops": _sample_ops(rng, None if status == "rollback" else "complete")})
    return records
