"""Fast columnar reader for JRNL journals (the data source's hot path for ``jrnl``).

The codec (:mod:`journalfs.formats.jrnl`) builds one dict per operation, which the Arrow
conversion then turns back into JSON text row by row. Here each transaction's ``ops`` is
rendered straight to the JSON text ``json.dumps(ops, ensure_ascii=False)`` would give, and
the scalar fields go out as plain lists.

Only clean chains are decoded here: at anything the codec would stop at or report (torn
transaction, bad link, unknown op, wrong op size, bad header) :func:`read_columns` returns
None and the caller decodes the same batch with the codec, so damage is reported exactly as
the codec reports it.
"""
from __future__ import annotations

import struct
from base64 import b64encode

from ..formats.base import Columns
from ..formats.jrnl import (COMPLETE_FLAG, HEADER, MAGIC, OP_ALLOC, OP_COMPLETE, OP_HEADER,
                            OP_MODIFY, OP_NAMES, OP_REMOVE, TX_HEADER)

_HEADER = struct.Struct("<4sQQ")
_TX_HEADER = struct.Struct("<QQqB")
_OP_HEADER = struct.Struct("<BI")
_ALLOC = struct.Struct("<QQQ")
_REMOVE = struct.Struct("<QQ")
_MODIFY = struct.Struct("<QHH")


class _Unclean(Exception):
    """Something the codec must handle (and word); internal to this module."""


def _b64(data) -> str:
    return b64encode(data).decode("ascii")


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


def read_columns(buf, source: str, start: int | None = None, seq: int = 0,
                 stop: int | None = None, limit: int | None = None) -> Columns | None:
    """Like ``Jrnl.read_columns``; None when the codec must decode this batch instead."""
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
