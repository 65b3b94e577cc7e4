"""YeltsinDB page-transaction journal (``JRNL``), specs/jrnl.md.

A 20-byte header (``JRNL``, u64 first and u64 last transaction offset), then transactions
linked both ways: u64 prev, u64 next, i64 time (Unix s), u8 flags (bit 0 = complete), then
operations (u8 type, u32 size, data) ending with op 0xFF. Records follow the chain from the
header's first offset; links must move forward through the file, so a cycle cannot loop.
All integers are little-endian.
"""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from .base import (BuiltOnAccess, Buffer, Codec, ColumnMap, Columns, Finding, FormatError, Record,
                   Repair, field_at, payload_b64)
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
                return _chain_columns(_Chain(), buf, source, seq, None, exc)
            prev = 0
        else:
            pos = start
        chain = _Chain()
        with paused_gc():
            pos, prev = _walk_chain(buf, pos, prev, stop, limit, chain)
            refused = chain.check_ops(buf)
            if refused is not None:  # an operation read() refuses: step to its transaction
                pos, prev = chain.cut(refused)
        # one exact step: the chain's end, the damage, or the next batch's first transaction
        if not pos or (stop is not None and pos >= stop):
            return _chain_columns(chain, buf, source, seq, None, None)
        try:
            parse_transaction(buf, source, pos, prev)
        except FormatError as exc:
            return _chain_columns(chain, buf, source, seq, None, exc)
        if chain.rows == limit:
            return _chain_columns(chain, buf, source, seq, pos, None)
        # the loop refused a transaction read() accepts: decode this batch the plain way
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


def _scan(buf: Buffer, source: str) -> _Scan:
    """The chain's end, the damage in the chain and what recovery it needs."""
    scan = _Scan([])
    try:
        first, last = read_header(buf, source)
        for tx in walk(buf, source):
            scan.before_tail, scan.tail = scan.tail, tx
            if scan.at_last is None and tx.offset == last:
                scan.at_last = tx
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

_TX_UNPACK = _TX_HEADER.unpack_from
_OP_UNPACK = _OP_HEADER.unpack_from


class _Chain:
    """The transactions a batch walked: their fixed fields, and every operation's code and
    data span in one flat table (``op_first[i]`` is transaction i's first operation)."""

    def __init__(self):
        self.offsets: list[int] = []
        self.prevs: list[int] = []
        self.nexts: list[int] = []
        self.times: list[int] = []
        self.flags: list[int] = []
        self.op_first: list[int] = [0]
        self.codes: list[int] = []
        self.starts: list[int] = []  # where each operation's data starts
        self.sizes: list[int] = []
        self.ended: list[bool] = []  # has its completion op (0xFF)

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def check_ops(self, buf) -> int | None:
        """The first transaction holding an operation :func:`decode_op` refuses (a page
        allocation not of 24 bytes, a removal not of 16, a modification whose two images do
        not fill it); None when there is none."""
        if not self.codes:
            return None
        codes = np.array(self.codes, np.uint8)
        sizes = np.array(self.sizes, np.int64)
        bad = ((codes == OP_ALLOC) & (sizes != _ALLOC.size)) \
            | ((codes == OP_REMOVE) & (sizes != _REMOVE.size))
        modify = np.flatnonzero(codes == OP_MODIFY)
        if len(modify):
            short = sizes[modify] < _MODIFY.size
            bad[modify[short]] = True
            whole = modify[~short]
            images = field_at(buf, np.array(self.starts, np.int64)[whole], 10, "<u2")
            bad[whole[sizes[whole] != _MODIFY.size + 2 * images.astype(np.int64)]] = True
        first = np.flatnonzero(bad)
        if not len(first):
            return None
        return int(np.searchsorted(np.array(self.op_first, np.int64), first[0], "right")) - 1

    def cut(self, row: int) -> tuple[int, int | None]:
        """Keep the transactions before ``row``; (its offset, the offset its prev link must
        hold) for the exact step."""
        pos, prev = self.offsets[row], self.prevs[row]
        ops = self.op_first[row]
        for column in (self.offsets, self.prevs, self.nexts, self.times, self.flags, self.ended):
            del column[row:]
        del self.op_first[row + 1:]
        for column in (self.codes, self.starts, self.sizes):
            del column[ops:]
        return pos, prev if row else self._first_prev

    _first_prev: int | None = None


def _walk_chain(buf, pos: int, prev: int | None, stop: int | None, limit: int | None,
                chain: _Chain) -> tuple[int, int | None]:
    """Follow the chain from ``pos`` for up to ``limit`` transactions that
    :func:`parse_transaction` accepts whole (the operations' own sizes are
    :meth:`_Chain.check_ops`'s); return where it stopped and the prev link expected there."""
    end = len(buf)
    chain._first_prev = prev
    offsets, prevs, nexts, times, flag_list = (chain.offsets, chain.prevs, chain.nexts,
                                               chain.times, chain.flags)
    codes, starts, sizes, op_first, ended = (chain.codes, chain.starts, chain.sizes,
                                             chain.op_first, chain.ended)
    stop = end + 1 if stop is None else stop  # no transaction starts past the end
    budget = end // TX_HEADER + 1 if limit is None else limit
    for _ in range(budget):
        if not pos or pos >= stop or pos < HEADER or pos + TX_HEADER > end:
            break
        back, nxt, t, flags = _TX_UNPACK(buf, pos)
        if (prev is not None and back != prev) or (nxt and nxt < pos + TX_HEADER):
            break
        bound = nxt if nxt and nxt < end else end
        at = pos + TX_HEADER
        mark = len(codes)
        complete_op = bad = False
        while at < bound:
            if at + OP_HEADER > bound:
                bad = True
                break
            code, size = _OP_UNPACK(buf, at)
            at += OP_HEADER
            if code not in OP_NAMES or at + size > bound:
                bad = True
                break
            codes.append(code)
            starts.append(at)
            sizes.append(size)
            at += size
            if code == OP_COMPLETE:
                complete_op = True
                break
        # a bad operation header, or torn: the exact step names it
        if bad or (not complete_op and (nxt > end or (bound == end and flags & COMPLETE_FLAG))):
            del codes[mark:], starts[mark:], sizes[mark:]
            break
        offsets.append(pos)
        prevs.append(back)
        nexts.append(nxt)
        times.append(t)
        flag_list.append(flags)
        ended.append(complete_op)
        op_first.append(len(codes))
        prev, pos = pos, nxt
    return pos, prev


def _chain_columns(chain: _Chain, buf, source: str, seq: int, next_offset: int | None,
                   error: FormatError | None) -> Columns:
    rows = chain.rows
    complete = (np.array(chain.flags, np.uint8) & COMPLETE_FLAG).astype(bool)
    ended = np.array(chain.ended, bool)
    status = np.array(["rollback", "redo", "complete"])[
        np.where(complete, 2, ended.astype(np.intp))].tolist() if rows else []
    data = {"format": ["jrnl"] * rows,
            "seq": np.arange(seq, seq + rows, dtype=np.int64),
            "offset": np.array(chain.offsets, np.int64),
            "kind": ["transaction"] * rows,
            "prev": np.array(chain.prevs, np.uint64),
            "next": np.array(chain.nexts, np.uint64),
            "time": np.array(chain.times, np.int64),
            "complete": complete,
            "status": status,
            "ops": _ops_column(chain, buf, source)}
    return Columns(data, rows, next_offset, seq + rows, error)


def _ops_column(chain: _Chain, buf, source: str) -> BuiltOnAccess:
    """Each row's operations as :func:`decode_op` makes them, built when read, from a copy
    of the batch's operation bytes (the column outlives the caller's mapping)."""
    rows = chain.rows
    if not chain.codes:
        return BuiltOnAccess(rows, lambda i: [])
    lo = chain.starts[0]
    hi = chain.starts[-1] + chain.sizes[-1]
    blob = bytes(memoryview(buf)[lo:hi])
    codes, starts, sizes, first = chain.codes, chain.starts, chain.sizes, chain.op_first

    def build(i: int) -> list[dict]:
        return [decode_op(codes[j], blob[starts[j] - lo:starts[j] - lo + sizes[j]], source,
                          starts[j] - OP_HEADER)
                for j in range(first[i], first[i + 1])]
    return BuiltOnAccess(rows, build)
