"""Codec output (:class:`~journalfs.formats.base.Columns`) -> Arrow record batches of the
data source schema, without going through Python rows for the hot columns."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..formats import CODECS, ColumnMap
from .schema import COLUMNS, DAMAGE_KIND, arrow_schema


#: Fields that are columns of their own and therefore never repeated in ``attrs``.
_BASE_FIELDS = {"format", "seq", "offset", "kind", "payload", "payload_b64"}

_US_PER = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}
#: Spark timestamps cover years 1..9999; anything outside (hostile input) becomes null.
_MIN_US, _MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999

def _column_map(fmt: str | None) -> ColumnMap:
    codec = CODECS.get(fmt) if fmt else None
    return codec.columns if codec is not None else ColumnMap()


def _int64(values: Any) -> pa.Array:
    if isinstance(values, np.ndarray) and values.dtype.kind in "iub":
        return pa.array(values.astype(np.int64, copy=False))
    arr = pa.array(values)
    if arr.type != pa.int64():
        arr = arr.cast(pa.int64(), safe=False)
    return arr


def _timestamps(values: Any, unit: str) -> pa.Array:
    raw = _int64(values)
    scale = _US_PER[unit]
    if scale is None:
        us = pc.divide(raw, 1000)  # ns -> us; every int64 ns value is in range
    else:
        us = pc.multiply(raw, scale)  # may wrap for hostile values: masked below
        limit = _MAX_US // scale
        ok = pc.and_(pc.greater_equal(raw, -limit), pc.less_equal(raw, limit))
        us = pc.if_else(ok, us, pa.scalar(None, pa.int64()))
    return us.cast(pa.timestamp("us", tz="UTC"))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value, ensure_ascii=False)


_CASTABLE = (pa.types.is_integer, pa.types.is_boolean, pa.types.is_null)


def _text_column(values: Any) -> pa.Array:
    """Field values as text: numbers and booleans cast by Arrow, strings as they are, lists and
    objects as JSON (only those go through Python one by one)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iub":
        return pc.cast(pa.array(values), pa.string())
    try:
        arr = pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        arr = None
    if arr is not None:
        if pa.types.is_string(arr.type):
            return arr
        if any(test(arr.type) for test in _CASTABLE):
            return pc.cast(arr, pa.string())
        if pa.types.is_list(arr.type) and pa.types.is_integer(arr.type.value_type):
            return _int_lists_as_json(arr)
    return pa.array([_text(v) for v in values], type=pa.string())


def _int_lists_as_json(arr: pa.ListArray) -> pa.Array:
    """Lists of integers as json.dumps writes them (``[1, 2, 3]``), in Arrow: a Kestrel
    READ_DONE's id list per row went through Python one row at a time (5x slower)."""
    joined = pc.binary_join(arr.cast(pa.list_(pa.string())), ", ")
    return pc.binary_join_element_wise("[", joined, "]", "")


def _attrs(fields: dict[str, Any], rows: int) -> pa.Array:
    """map<string,string> per row holding every non-null field, built column-wise."""
    names = list(fields)
    m = len(names)
    map_type = arrow_schema().field("attrs").type
    if m == 0 or rows == 0:
        offsets = pa.array(np.zeros(rows + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()),
                                       type=map_type)
    texts = pa.concat_arrays([_text_column(fields[k]) for k in names])  # field-major
    valid = np.asarray(texts.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    row_major = (np.arange(rows)[:, None] + np.arange(m)[None, :] * rows).ravel()
    keep = row_major[valid[row_major]]
    per_row = valid.reshape(m, rows).sum(axis=0)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(per_row, out=offsets[1:])
    keys = pa.array(names, pa.string()).take(pa.array(keep // rows))
    items = texts.take(pa.array(keep))
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, type=map_type)


def _binary(values: Any, rows: int) -> pa.Array:
    if values is None:
        return pa.nulls(rows, pa.binary())
    if isinstance(values, pa.Array):
        return values.cast(pa.binary())
    try:  # bytes objects (what most codecs give): one C++ pass, about 2x the join below
        arr = pa.array(values, pa.binary())
        if isinstance(arr, pa.Array):  # not chunked (over 2 GiB)
            return arr
    except (pa.ArrowException, TypeError, ValueError):
        pass  # memoryviews of the mapped file
    try:  # one join + one offsets array: no per-item Python objects on the Arrow side
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=rows)
        blob = b"".join(values)
    except TypeError:  # None among the payloads
        return pa.array([None if v is None else bytes(v) for v in values], type=pa.binary())
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                         pa.py_buffer(blob)])
    return pa.array([bytes(v) for v in values], type=pa.binary())


def to_batch(data: dict[str, Any], rows: int, source: str, fmt: str, *,
             first_seq: int = 0, key: Any = None) -> pa.RecordBatch:
    """One batch of the data source schema from a codec's columns.

    ``key`` overrides the key column: a string for every row (Kestrel queue name) or a
    sequence of per-row strings (Akka persistence ids resolved from the meta file)."""
    spec = _column_map(fmt)
    seq = _int64(data["seq"]) if "seq" in data else pa.array(
        np.arange(first_seq, first_seq + rows, dtype=np.int64))
    cols: dict[str, pa.Array] = {
        "source": pa.repeat(pa.scalar(source, pa.string()), rows),
        "format": pa.repeat(pa.scalar(fmt, pa.string()), rows),
        "seq": seq,
        "offset": _int64(data["offset"]),
        "kind": pa.array(data["kind"], pa.string()) if not isinstance(data["kind"], str)
        else pa.repeat(pa.scalar(data["kind"], pa.string()), rows),
    }
    cols["time"] = (_timestamps(data[spec.time], spec.time_unit) if spec.time in data
                    else pa.nulls(rows, pa.timestamp("us", tz="UTC")))
    if key is None and spec.key in data:
        cols["key"] = pa.array(data[spec.key], pa.string()) if not isinstance(data[spec.key], pa.Array) \
            else data[spec.key].cast(pa.string())
    elif isinstance(key, str):
        cols["key"] = pa.repeat(pa.scalar(key, pa.string()), rows)
    elif key is not None:
        cols["key"] = pa.array(key, pa.string())
    else:
        cols["key"] = pa.nulls(rows, pa.string())
    if spec.id == "seq":
        cols["id"] = seq
    elif spec.id in data:
        cols["id"] = _int64(data[spec.id])
    else:
        cols["id"] = pa.nulls(rows, pa.int64())
    cols["payload"] = _binary(data.get("payload"), rows)
    skip = _BASE_FIELDS | {spec.key, spec.id}
    cols["attrs"] = _attrs({k: v for k, v in data.items() if k not in skip}, rows)
    return pa.RecordBatch.from_arrays([cols[c] for c in COLUMNS], schema=arrow_schema())


def damage_batch(source: str, fmt: str, seq: int, offset: int, reason: str) -> pa.RecordBatch:
    """One ``_damage`` row: where decoding of ``source`` stopped, and why."""
    data = {"seq": [seq], "offset": [offset], "kind": [DAMAGE_KIND], "reason": [reason]}
    return to_batch(data, 1, source, fmt)


def attrs_of(record: dict) -> dict[str, str]:
    """The ``attrs`` a record gets (used by tests and row-wise fallbacks)."""
    spec = _column_map(record.get("format"))
    skip = _BASE_FIELDS | {spec.key, spec.id}
    return {k: _text(v) for k, v in record.items() if k not in skip and v is not None}
