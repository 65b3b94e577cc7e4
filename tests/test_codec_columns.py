"""The vectorised column decoders of the small-record formats (jrnl, gvfs-journal,
kestrel-reader, akka-meta) against the codecs' own ``read``: the same rows (every field, value
and order), the same damage at the same byte, the same place to resume, on random valid files
and on truncated, bit-flipped and lying ones; and the text-span helper."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from codec_helpers import FAST, columns_as_records, columns_traced, flip_bits, read_all, same_error
from journalfs.formats import CODECS, Codec
from journalfs.formats.base import BuiltOnAccess
from journalfs.formats.gvfs_journal import MAGIC as GVFS_MAGIC
from journalfs.formats.spans import utf8_strings

FORMATS = ("jrnl", "gvfs-journal", "kestrel-reader", "akka-meta")

# -- random valid files ------------------------------------------------------------------------

i64 = st.integers(-2**63, 2**63 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=10)
#: names that are not UTF-8 (raw bytes kept as surrogateescape), as gvfs stores file names
odd = st.binary(max_size=8).filter(lambda b: b"\0" not in b).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
gvfs_text = st.one_of(text, odd)


def _jrnl_op():
    images = st.binary(max_size=20)
    return st.one_of(
        st.builds(lambda p, b, a: {"op": "alloc", "page": p, "free_before": b, "free_after": a},
                  u64, u64, u64),
        st.builds(lambda p, b: {"op": "remove", "page": p, "free_before": b}, u64, u64),
        st.builds(lambda p, o, pair: {"op": "modify", "page": p, "data_offset": o,
                                      "size": len(pair[0]),
                                      "before_b64": _b64(pair[0]), "after_b64": _b64(pair[1])},
                  u64, st.integers(0, 65535),
                  images.flatmap(lambda b: st.tuples(st.just(b), st.binary(min_size=len(b),
                                                                           max_size=len(b))))),
        st.builds(lambda d: {"op": "rollback", "data_b64": _b64(d)}, st.binary(max_size=12)),
    )


def _b64(data: bytes) -> str:
    import base64
    return base64.b64encode(data).decode("ascii")


jrnl_files = st.lists(st.builds(
    lambda t, flag, ops, done: {"time": t, "complete": flag,
                                "ops": ops + ([{"op": "complete", "data_b64": ""}]
                                              if done or flag else [])},
    i64, st.booleans(), st.lists(_jrnl_op(), max_size=4), st.booleans()),
    max_size=12).map(lambda txs: CODECS["jrnl"].write(txs))

gvfs_files = st.lists(st.one_of(
    st.builds(lambda p, k, v, t: {"kind": "setv" if isinstance(v, list) else "set", "mtime": t,
                                  "path": p, "key": k, "value": v},
              gvfs_text, gvfs_text, st.one_of(gvfs_text, st.lists(gvfs_text, max_size=4)),
              st.integers(0, 2**64 - 1)),
    st.builds(lambda p, k, t: {"kind": "unset", "mtime": t, "path": p, "key": k},
              gvfs_text, gvfs_text, st.integers(0, 2**40)),
    st.builds(lambda p, s, t: {"kind": "copy", "mtime": t, "path": p, "source": s},
              gvfs_text, gvfs_text, st.integers(0, 2**40)),
    st.builds(lambda p, t: {"kind": "remove", "mtime": t, "path": p}, gvfs_text,
              st.integers(0, 2**40)),
), max_size=25).flatmap(lambda recs: st.sampled_from([None, 2048]).map(
    lambda size: CODECS["gvfs-journal"].write(
        recs, tag=7, file_size=None if size is None or _gvfs_used(recs) > size else size)))


def _gvfs_used(recs) -> int:
    return len(CODECS["gvfs-journal"].write(recs, tag=7, file_size=None).rstrip(b"\0")) + 64


def _kestrel_reader_file(items) -> bytes:
    """Reader records with unknown commands (skipped by the frame rule) between some."""
    out = bytearray(CODECS["kestrel-reader"].write([]))
    for item in items:
        if isinstance(item, bytes):
            out += item
        else:
            out += CODECS["kestrel-reader"].write([item])[4:]
    return bytes(out)


kestrel_reader_files = st.lists(st.one_of(
    st.builds(lambda i: {"kind": "read_head", "id": i}, i64),
    st.builds(lambda ids: {"kind": "read_done", "ids": ids}, st.lists(i64, max_size=9)),
    st.builds(lambda i: {"kind": "read_done", "ids": list(range(i, i + 8))}, st.integers(0, 99)),
    st.just(bytes.fromhex("f3 04000000 01010101 02020202 ffffffff")),  # command 15: skipped
), max_size=20).flatmap(lambda items: st.sampled_from([b"", b"\0" * 7]).map(
    lambda tail: _kestrel_reader_file(items) + tail))

akka_meta_files = st.lists(st.builds(
    lambda pid, a, b, c: {"persistence_id": pid, "first": a, "last": b, "highest_seq": c},
    st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
              st.just("użytkownik")),
    i64, i64, i64), max_size=20).map(CODECS["akka-meta"].write)


FILES = {"jrnl": jrnl_files, "gvfs-journal": gvfs_files, "kestrel-reader": kestrel_reader_files,
         "akka-meta": akka_meta_files}


# -- what must hold ----------------------------------------------------------------------------

def assert_same_as_read(codec: Codec, buf, start=None, seq=0, stop=None, limit=None):
    """``read_columns`` gives what the generic default (``read`` plus a column per field, in
    order of first use) gives: rows, values, column order, resume point and damage."""
    fast = codec.read_columns(buf, "f", start, seq, stop, limit)
    slow = Codec.read_columns(codec, buf, "f", start, seq, stop, limit)
    assert fast.rows == slow.rows
    for name, column in fast.data.items():
        assert len(column) == fast.rows, name
    assert columns_as_records(fast) == columns_as_records(slow)
    if slow.rows:
        assert list(fast.data) == list(slow.data)
    assert (fast.next_offset, fast.next_seq) == (slow.next_offset, slow.next_seq)
    assert same_error(fast.error, slow.error), (fast.error, slow.error)
    if slow.error is not None:
        assert fast.error.reason == slow.error.reason
    return fast


def rows_are_records(rows: list[dict], records: list[dict]) -> bool:
    """Each row holds its record's fields (and None for fields only other kinds have)."""
    return len(rows) == len(records) and all(
        {k: v for k, v in row.items() if k in rec} == rec
        and all(v is None for k, v in row.items() if k not in rec)
        for row, rec in zip(rows, records))


def assert_batches_equal_read(codec: Codec, buf, batch: int):
    """Batches of ``batch`` rows, each resuming where the previous said, give every record
    ``read`` gives and then its damage; each batch equals the generic one."""
    records, error = read_all(codec, buf)
    got: list[dict] = []
    start, seq = None, 0
    for _ in range(len(buf) + 2):
        cols = assert_same_as_read(codec, buf, start, seq, limit=batch)
        got += columns_as_records(cols)
        if cols.error is not None or cols.next_offset is None:
            break
        start, seq = cols.next_offset, cols.next_seq
    assert rows_are_records(got, records)
    assert same_error(cols.error, error)


def mutate(data, buf: bytes) -> bytes:
    """A truncated, bit-flipped or lying (a random 1-8 byte field overwritten with an
    extreme value) copy of ``buf``."""
    how = data.draw(st.sampled_from(["cut", "flip", "lie"]))
    if how == "cut":
        return buf[:data.draw(st.integers(0, len(buf)))]
    if how == "flip":
        return flip_bits(data, buf, 4)
    out = bytearray(buf)
    width = data.draw(st.sampled_from([1, 2, 4, 8]))
    if len(out) < width:
        return bytes(out)
    at = data.draw(st.integers(0, len(out) - width))
    value = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, 2**(8 * width - 1), 2**(8 * width) - 1,
                                       2**(8 * width - 1) - 1]))
    order = data.draw(st.sampled_from(["little", "big"]))
    out[at:at + width] = value.to_bytes(width, order)
    return bytes(out)


# -- the properties --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_codec_has_its_own_column_decoder(fmt):
    assert type(CODECS[fmt]).read_columns is not Codec.read_columns


@pytest.mark.parametrize("fmt", FORMATS)
@FAST
@given(data=st.data())
def test_valid_files_decode_as_read_does(fmt, data):
    codec = CODECS[fmt]
    buf = data.draw(FILES[fmt])
    records, error = read_all(codec, buf)
    assert error is None
    cols = assert_same_as_read(codec, buf)
    assert rows_are_records(columns_as_records(cols), records)
    assert_batches_equal_read(codec, buf, data.draw(st.integers(1, 7)))


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_files_decode_as_read_does(fmt, data):
    codec = CODECS[fmt]
    buf = mutate(data, data.draw(FILES[fmt]))
    assert_same_as_read(codec, buf)
    assert_batches_equal_read(codec, buf, data.draw(st.integers(1, 5)))


@pytest.mark.parametrize("fmt", FORMATS)
@FAST
@given(data=st.data())
def test_resume_at_any_record_and_stop_before_any(fmt, data):
    codec = CODECS[fmt]
    buf = data.draw(FILES[fmt])
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    records, _ = read_all(codec, buf)
    if not records:
        return
    first = data.draw(st.integers(0, len(records) - 1))
    rec = records[first]
    stop = data.draw(st.one_of(st.none(), st.sampled_from([r["offset"] for r in records])))
    limit = data.draw(st.one_of(st.none(), st.integers(0, 6)))
    assert_same_as_read(codec, buf, rec["offset"], rec["seq"], stop, limit)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_headerless_buffers(fmt):
    codec = CODECS[fmt]
    for buf in (b"", codec.write([])[:3], codec.write([]), bytes(64)):
        assert_same_as_read(codec, buf)
        assert_same_as_read(codec, memoryview(buf))


@pytest.mark.parametrize("fmt", FORMATS)
def test_memoryview_and_bytearray_buffers(fmt):
    codec = CODECS[fmt]
    buf = _sample(fmt)
    for view in (memoryview(buf), bytearray(buf)):
        cols = assert_same_as_read(codec, view)
        assert columns_as_records(cols) == columns_as_records(codec.read_columns(buf, "f"))


def _sample(fmt: str) -> bytes:
    import random

    from journalfs import demo
    rng = random.Random(5)
    if fmt == "jrnl":
        return CODECS[fmt].write(demo.jrnl_records(rng, 40, last="redo"))
    if fmt == "gvfs-journal":
        return CODECS[fmt].write([{"kind": "set", "mtime": i, "path": f"/p/é{i}", "key": "k",
                                   "value": "v" * i} if i % 3 else
                                  {"kind": "setv", "mtime": i, "path": "/q", "key": "e",
                                   "value": ["a", "", "ü"]} for i in range(40)], tag=3)
    if fmt == "kestrel-reader":
        return CODECS[fmt].write([{"kind": "read_head", "id": i} if i % 2 else
                                  {"kind": "read_done", "ids": list(range(i % 5))}
                                  for i in range(40)])
    return CODECS[fmt].write([{"persistence_id": f"id-ü-{i}", "first": i, "last": -i,
                               "highest_seq": 2**40 + i} for i in range(40)])


# -- hostile sizes: no giant allocation, no hang ------------------------------------------------------

def _huge_setv() -> bytes:
    good = CODECS["gvfs-journal"].write([{"kind": "setv", "mtime": 1, "path": "/a", "key": "k",
                                          "value": ["x"]}], tag=1)
    entry = bytearray(good[20:20 + struct.unpack(">I", good[20:24])[0]])
    count_at = 17 + 3 + 2  # "/a\0" "k\0", aligned to 4 from the entry's start
    count_at += -count_at % 4
    entry[count_at:count_at + 4] = struct.pack(">I", 0xFFFFFFF0)
    import zlib
    entry[4:8] = struct.pack(">I", zlib.crc32(bytes(entry[8:])))
    out = bytearray(good)
    out[20:20 + len(entry)] = entry
    return bytes(out)


HOSTILE = [
    ("gvfs-journal", _huge_setv()),
    ("gvfs-journal", GVFS_MAGIC + bytes([1, 0]) + struct.pack(">III", 0, 64, 0xFFFFFFFF)
     + struct.pack(">I", 0x7FFFFFFC) + bytes(40)),
    ("kestrel-reader", bytes.fromhex("263c2603") + b"\x91" + struct.pack("<i", 2**31 - 8) + bytes(16)),
    ("kestrel-reader", bytes.fromhex("263c2603") + b"\x91" + struct.pack("<i", 16 << 20) + bytes(16)),
    ("jrnl", b"JRNL" + struct.pack("<QQ", 20, 20) + struct.pack("<QQqB", 0, 0, 0, 1)
     + b"\x01" + struct.pack("<I", 0xFFFFFFFF) + bytes(8)),
    ("jrnl", b"JRNL" + struct.pack("<QQ", 20, 20) + struct.pack("<QQqB", 0, 20, 0, 1) + bytes(8)),
    ("akka-meta", b"APFM" + struct.pack(">i", 2**31 - 1) + struct.pack(">h", 0x7FFF) + bytes(40)),
]


@pytest.mark.parametrize("fmt, buf", HOSTILE)
def test_lying_sizes_fail_fast_without_big_allocations(fmt, buf):
    codec = CODECS[fmt]
    cols, peak = columns_traced(codec, buf)
    records, error = read_all(codec, buf)
    assert error is not None and same_error(cols.error, error)
    assert rows_are_records(columns_as_records(cols), records)
    assert peak < 1 << 20


def test_jrnl_ops_are_built_on_access_and_outlive_the_buffer():
    codec = CODECS["jrnl"]
    buf = bytearray(_sample("jrnl"))
    records, _ = read_all(codec, bytes(buf))
    cols = codec.read_columns(buf, "f")
    ops = cols.data["ops"]
    assert isinstance(ops, BuiltOnAccess) and len(ops) == cols.rows == len(records)
    buf[:] = bytes(len(buf))  # the caller reuses its buffer: the column kept its own bytes
    assert ops[0] == records[0]["ops"] and ops[-1] == records[-1]["ops"]
    assert ops[1:3] == [r["ops"] for r in records[1:3]] and list(ops) == [r["ops"] for r in records]
    with pytest.raises(IndexError):
        ops[len(records)]


# -- text spans ----------------------------------------------------------------------------------

@st.composite
def span_sets(draw):
    """(buffer, starts, ends) of sorted, non-overlapping spans over random bytes (mostly
    UTF-8 text, sometimes not)."""
    body = st.one_of(st.binary(max_size=9), st.text(max_size=5).map(
        lambda t: t.encode("utf-8", "surrogatepass")))
    pieces = draw(st.lists(st.tuples(st.binary(max_size=6), body), max_size=12))
    buf, starts, ends = bytearray(), [], []
    for gap, data in pieces:
        buf += gap
        starts.append(len(buf))
        buf += data
        ends.append(len(buf))
    return bytes(buf), np.array(starts, np.int64), np.array(ends, np.int64)


@FAST
@given(span_sets())
def test_utf8_strings_decode_each_span_as_alone_or_refuse(spans):
    buf, starts, ends = spans
    try:
        want = [buf[a:b].decode("utf-8") for a, b in zip(starts, ends)]
    except UnicodeDecodeError:
        want = None
    assert utf8_strings(buf, starts, ends) == want


def test_utf8_strings_refuse_a_character_split_across_spans():
    buf = "é".encode()  # c3 a9: valid joined, not as two spans
    assert utf8_strings(buf, np.array([0, 1]), np.array([1, 2])) is None
    assert utf8_strings(buf, np.array([0]), np.array([2])) == ["é"]


@pytest.mark.parametrize("where", [0, 3])
def test_jrnl_transactions_with_more_operations_than_walked_in_parallel(where):
    from journalfs.formats.jrnl import PARALLEL_OPS
    codec = CODECS["jrnl"]
    many = [{"op": "rollback", "data_b64": ""}] * (PARALLEL_OPS + 5) + [{"op": "complete",
                                                                          "data_b64": ""}]
    txs = [{"time": i, "complete": True,
            "ops": many if i == where else [{"op": "complete", "data_b64": ""}]} for i in range(6)]
    buf = codec.write(txs)
    assert_same_as_read(codec, buf)
    for batch in (1, 2, 4):
        assert_batches_equal_read(codec, buf, batch)
    assert_batches_equal_read(codec, buf[:-3], 2)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_columns_render_the_lines_read_gives(fmt, data):
    """The renderer's columnar way (integer lists, nested operation lists, kinds with their
    own fields) writes byte for byte the JSON lines of the records ``read`` gives, up to the
    damage, on valid and damaged files; every batch size takes the columnar way."""
    from journalfs import jsonlines
    codec = CODECS[fmt]
    buf = data.draw(FILES[fmt])
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    records, error = read_all(codec, buf)
    old = jsonlines.COLUMNS_MIN_ROWS, jsonlines.records_chunk
    one_by_one = []
    jsonlines.COLUMNS_MIN_ROWS = 1
    jsonlines.records_chunk = lambda *a: one_by_one.append(1) or old[1](*a)
    try:
        chunk = jsonlines.json_chunk(codec, buf, "f", None, 0, len(records) + 1)
    finally:
        jsonlines.COLUMNS_MIN_ROWS, jsonlines.records_chunk = old
    if fmt in ("jrnl", "kestrel-reader") and len(records) >= 2:
        assert not one_by_one  # rendered from the columns, not record by record
    assert chunk.rows == len(records)
    assert bytes(chunk.data) == b"".join(jsonlines.json_line(r) for r in records)


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_gvfs_journal_validation_names_what_read_names(data):
    """The batched validator reports exactly the damage the entry-by-entry reader raises
    (offset and wording), whatever the batch size."""
    from journalfs.formats import gvfs_journal
    from journalfs.formats.gvfs_journal import iter_entries
    codec = CODECS["gvfs-journal"]
    buf = data.draw(FILES["gvfs-journal"])
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    want = []
    try:
        gvfs_journal.parse_header(buf, "j", exact_size=False)
        try:
            for _ in iter_entries(buf, "j", exact_size=False):
                pass
        except gvfs_journal.FormatError as exc:
            want.append((exc.offset, exc.reason))
    except gvfs_journal.FormatError as exc:
        want.append((exc.offset, exc.reason))
    old = gvfs_journal.VALIDATE_BATCH
    gvfs_journal.VALIDATE_BATCH = data.draw(st.integers(1, 6))
    try:
        got = [(f.offset, f.reason) for f in codec.validate(buf, "j")]
    finally:
        gvfs_journal.VALIDATE_BATCH = old
    assert got == want


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_jrnl_chain_ends_found_in_batches_are_the_walks(data):
    """fsck's batched look at a jrnl chain finds the last two transactions, the one at the
    header's last offset and the damage that the transaction-by-transaction walk finds."""
    from journalfs.formats import jrnl
    buf = data.draw(FILES["jrnl"])
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    try:
        _first, last = jrnl.read_header(buf, "j")
    except jrnl.FormatError:
        return
    seen, damage = [], None
    try:
        for tx in jrnl.walk(buf, "j"):
            seen.append(tx.offset)
    except jrnl.FormatError as exc:
        damage = exc
    want = (seen[-2] if len(seen) > 1 else None, seen[-1] if seen else None,
            last if last in seen else None)
    old = jrnl.VALIDATE_BATCH
    jrnl.VALIDATE_BATCH = data.draw(st.integers(1, 5))
    try:
        *got, got_damage = jrnl._chain_ends(buf, "j", last)
    finally:
        jrnl.VALIDATE_BATCH = old
    assert tuple(got) == want
    assert same_error(got_damage, damage)
    assert type(got_damage) is type(damage)
