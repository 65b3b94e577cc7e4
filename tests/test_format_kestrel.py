"""Kestrel writer/reader codecs against the original project's vectors, the conformance corpus,
round trips, the vectorised column decoder and hostile input."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from codec_helpers import (FAST, assert_columns_equal_read, check_vectors, columns_as_records,
                           columns_in_batches, corpus_files, flip_bits, read_all,
                           read_expected_corpus, read_traced, reads_back, truncations)
from journalfs.formats import FormatError, detect
from journalfs.formats.base import Codec
from journalfs.formats.kestrel import (
    MAX_DATA, READER_MAGIC, WRITER_MAGIC, KestrelReader, KestrelWriter, build_checkpoint,
    build_writer_file, check_magic, decode_put, encode_put, encode_read_done, encode_read_head,
    frames, garbage_files, queue_state,
)

WRITER = KestrelWriter()
READER = KestrelReader()
KESTREL = ("kestrel-writer", "kestrel-reader")

i64 = st.integers(-2**63, 2**63 - 1)
i32 = st.integers(-2**31, 2**31 - 1)
put_records = st.lists(st.fixed_dictionaries({
    "kind": st.just("put"), "id": i64, "add_time": i64, "expire_time": st.none() | i64,
    "error_count": i32, "payload": st.binary(max_size=40)}), max_size=12)
reader_records = st.lists(st.one_of(
    st.fixed_dictionaries({"kind": st.just("read_head"), "id": i64}),
    st.fixed_dictionaries({"kind": st.just("read_done"), "ids": st.lists(i64, max_size=5)})), max_size=8)


def strip(rec):
    return {k: v for k, v in rec.items() if k not in ("format", "seq", "offset", "kind")}


def sample_writer(n=6):
    return build_writer_file([bytes([i]) * i for i in range(n)], first_id=7, add_time=1000)


# -- known answers -------------------------------------------------------------------------

def test_vectors_decode_exactly(vectors):
    assert check_vectors(vectors, KESTREL) == 4


def test_vectors_encode_back(vectors):
    one_put = bytes.fromhex(vectors["kestrel-writer/one-put"]["hex"])
    assert WRITER_MAGIC + encode_put(100, b"hello", add_time=255, error_count=1) == one_put
    assert READER_MAGIC + encode_read_head(511) == bytes.fromhex(vectors["kestrel-reader/read-head"]["hex"])
    assert READER_MAGIC + encode_read_done([10, 20, 30]) == bytes.fromhex(vectors["kestrel-reader/read-done"]["hex"])


def test_conformance_files_decode_exactly(records_corpus, records_expected):
    assert len(read_expected_corpus(records_corpus, records_expected, KESTREL)) == 8


def test_torn_file_names_file_and_offset(records_corpus):
    buf = (records_corpus / "torn.1800000000000").read_bytes()
    records, error = read_all(WRITER, buf, "torn.1800000000000")
    assert len(records) == 16
    assert error.source == "torn.1800000000000"
    assert error.offset == records[-1]["offset"] + 25 + len(records[-1]["payload"])  # last good boundary
    assert "torn" in str(error)


def test_columns_equal_records_on_corpus(records_corpus, records_expected):
    for name in corpus_files(records_expected, ("kestrel-writer",)):
        buf = (records_corpus / name).read_bytes()
        records, error = read_all(WRITER, buf, name)
        cols = WRITER.read_columns(buf, name)
        assert columns_as_records(cols) == records, name
        assert (cols.error is None) == (error is None)
        if error:
            assert (cols.error.offset, cols.error.reason) == (error.offset, error.reason)


def test_sniff_by_magic_only():
    assert WRITER.sniff(WRITER_MAGIC + b"\0" * 10) and not WRITER.sniff(READER_MAGIC)
    assert READER.sniff(READER_MAGIC) and not READER.sniff(WRITER_MAGIC)
    assert not WRITER.sniff(b"") and not READER.sniff(b"\x26\x3c")


# -- framing rules --------------------------------------------------------------------------

def test_zero_filled_preallocation_is_a_clean_end():
    buf = sample_writer() + bytes(4096)
    records, error = read_all(WRITER, buf)
    assert error is None and len(records) == 6
    assert WRITER.validate(buf, "f") == []
    assert WRITER.repair(buf, "f") is None


def test_garbage_after_end_marker_is_a_warning_not_damage():
    buf = sample_writer() + bytes(10) + b"\x01"
    assert len(read_all(WRITER, buf)[0]) == 6
    findings = WRITER.validate(buf, "f")
    assert [f.severity for f in findings] == ["warning"]


def test_unknown_commands_are_skipped_in_both_files():
    unknown = bytes([0x73]) + bytes(12) + bytes([0xA1]) + struct.pack("<i", 3) + b"xyz"
    writer = WRITER_MAGIC + unknown + encode_put(1, b"a") + unknown + encode_put(2, b"b")
    records, error = read_all(WRITER, writer)
    assert error is None and [r["id"] for r in records] == [1, 2] and [r["seq"] for r in records] == [0, 1]
    assert records[0]["offset"] == 4 + len(unknown)
    assert columns_as_records(WRITER.read_columns(writer, "f")) == records
    reader = READER_MAGIC + unknown + encode_read_head(5)
    assert [r["id"] for r in read_all(READER, reader)[0]] == [5]


@pytest.mark.parametrize("frame, why", [
    (bytes([0x87]) + struct.pack("<iiqq", 0, 0, 1, 0) + bytes(4), "PUT"),  # W=7
    (bytes([0x81]) + struct.pack("<i", 0), "PUT"),  # W=1
    (bytes([0x80]), "no length word"),  # data command without a length
    (bytes([0x86]) + struct.pack("<iiqq", -1, 0, 1, 0), "data length"),
])
def test_bad_put_headers_are_damage(frame, why):
    buf = WRITER_MAGIC + encode_put(1, b"ok") + frame + bytes(40)
    records, error = read_all(WRITER, buf, "w")
    assert [r["id"] for r in records] == [1]
    assert error.offset == 4 + 25 + 2 and why in error.reason
    cols = WRITER.read_columns(buf, "w")
    assert cols.rows == 1 and cols.error.offset == error.offset


@pytest.mark.parametrize("frame", [
    bytes([0x03]) + bytes(12),  # READ_HEAD with 3 words
    bytes([0x92]) + struct.pack("<iI", 8, 0) + bytes(8),  # READ_DONE with 2 words
    bytes([0x91]) + struct.pack("<i", 12) + bytes(12),  # not whole ids
    encode_put(1, b"x"),  # a PUT in a reader file
])
def test_bad_reader_records_are_damage(frame):
    buf = READER_MAGIC + encode_read_head(3) + frame
    records, error = read_all(READER, buf, "r")
    assert len(records) == 1 and error.offset == 13


def test_reader_record_in_writer_file_is_damage():
    buf = WRITER_MAGIC + encode_put(1, b"a") + encode_read_head(1)
    records, error = read_all(WRITER, buf)
    assert len(records) == 1 and error is not None


def test_payload_over_16_mib_is_damage_even_when_present():
    big = MAX_DATA + 1
    buf = WRITER_MAGIC + bytes([0x86]) + struct.pack("<iiqq", big, 0, 1, 0) + bytes(big)
    records, error = read_all(WRITER, buf)
    assert records == [] and error.offset == 4 and "16 MiB" in error.reason
    cols = WRITER.read_columns(buf, "f")
    assert cols.rows == 0 and cols.error.offset == 4
    with pytest.raises(ValueError):
        encode_put(1, bytes(big))


@pytest.mark.parametrize("codec, buf", [
    (WRITER, WRITER_MAGIC + bytes([0x86]) + struct.pack("<iiqq", 2**31 - 1, 0, 1, 0) + b"abc"),
    (WRITER, WRITER_MAGIC + bytes([0xF1]) + struct.pack("<i", 2**31 - 1)),
    (READER, READER_MAGIC + bytes([0x91]) + struct.pack("<i", 2**31 - 1) + bytes(16)),
    (READER, READER_MAGIC + bytes([0x91]) + struct.pack("<i", 2**24) + bytes(16)),
])
def test_lying_sizes_fail_fast_without_big_allocations(codec, buf):
    records, error, cols, peak = read_traced(codec, buf)
    assert records == [] and error.offset == 4 and cols.error.offset == 4
    assert peak < 1 << 20


def test_not_a_kestrel_file():
    for codec, buf in ((WRITER, READER_MAGIC + encode_read_head(1)), (READER, b"\x26\x3c"), (WRITER, b"")):
        records, error = read_all(codec, buf)
        assert records == [] and error.offset == 0


# -- round trips ----------------------------------------------------------------------------

@FAST
@given(put_records)
def test_writer_round_trip(records):
    buf = WRITER.write(records)
    decoded = reads_back(WRITER, buf)
    assert [strip(r) for r in decoded] == [strip(r) for r in records]
    assert [r["seq"] for r in decoded] == list(range(len(records)))
    assert columns_as_records(WRITER.read_columns(buf, "f")) == decoded


@FAST
@given(reader_records)
def test_reader_round_trip(records):
    decoded = reads_back(READER, READER.write(records))
    assert [{**strip(r), "kind": r["kind"]} for r in decoded] == [{**strip(r), "kind": r["kind"]} for r in records]


def test_checkpoint_is_18_bytes_when_empty():
    buf = build_checkpoint(0)
    assert len(buf) == 18 and buf.endswith(bytes.fromhex("9100000000"))
    assert [(r["kind"], r.get("id"), r.get("ids")) for r in read_all(READER, buf)[0]] == [
        ("read_head", 0, None), ("read_done", None, [])]


# -- columns and resumption -------------------------------------------------------------------

@FAST
@given(put_records, st.integers(1, 5))
def test_columns_in_batches_equal_read(records, batch):
    buf = WRITER.write(records) + bytes(3)
    assert columns_in_batches(WRITER, buf, batch) == read_all(WRITER, buf)


def frame_by_frame(buf, source="f"):
    """The spec's frame rules, one frame at a time (no fast path): (records, damage offset)."""
    out = []
    try:
        check_magic(buf, source, WRITER_MAGIC, "writer")
        for frame in frames(buf, source, None, None):
            if frame.command == 8:
                out.append(decode_put(buf, source, frame, len(out)))
            elif frame.command in (0, 9):
                return out, frame.offset
    except FormatError as exc:
        return out, exc.offset
    return out, None


# one frame each: PUTs without/with expiry, unknown commands with and without data, a PUT
# whose length lies (negative, over 16 MiB, past the end), a READ_HEAD, the 0x00 end marker
writer_frames = st.lists(st.one_of(
    st.builds(lambda i, p: encode_put(i, p), i64, st.binary(max_size=30)),
    st.builds(lambda i, p, e: encode_put(i, p, expire_time=e), i64, st.binary(max_size=30), i64),
    st.builds(lambda n, d: bytes([0xA0 | 1 + n]) + struct.pack("<i", len(d)) + bytes(4 * n) + d,
              st.integers(0, 3), st.binary(max_size=9)),
    st.builds(lambda c, w: bytes([c << 4 | w]) + bytes(4 * w), st.integers(1, 7), st.integers(0, 3)),
    st.sampled_from([bytes([0x86]) + struct.pack("<i", -5) + bytes(20),
                     bytes([0x86]) + struct.pack("<i", MAX_DATA + 1) + bytes(20),
                     bytes([0x88]) + struct.pack("<i", 10**6) + bytes(28),
                     encode_read_head(3), bytes(40)]),
), max_size=14)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer_frames, st.integers(1, 4), st.binary(max_size=3))
def test_fast_paths_equal_the_frame_rules(parts, batch, tail):
    buf = WRITER_MAGIC + b"".join(parts) + tail
    expected, damage = frame_by_frame(buf)
    records, error = read_all(WRITER, buf)
    assert records == expected and (error and error.offset) == damage
    offsets, next_offset, error = WRITER.record_offsets(buf, "f")
    assert offsets.tolist() == [r["offset"] for r in expected] and next_offset is None
    assert (error and error.offset) == damage
    got, error = columns_in_batches(WRITER, buf, batch)
    assert got == expected and (error and error.offset) == damage


@FAST
@given(reader_records, st.binary(max_size=12), st.integers(1, 3))
def test_reader_offsets_equal_read(records, tail, batch):
    buf = READER.write(records) + tail
    expected, damage = read_all(READER, buf)
    offsets, next_offset, error = READER.record_offsets(buf, "f")
    assert offsets.tolist() == [r["offset"] for r in expected] and next_offset is None
    assert (error and (error.offset, error.reason)) == (damage and (damage.offset, damage.reason))
    got, start, seq = [], None, 0
    while True:
        offsets, start, error = READER.record_offsets(buf, "f", start, seq, limit=batch)
        assert len(offsets) <= batch
        got += offsets.tolist()
        seq += len(offsets)
        if start is None:
            break
    assert got == [r["offset"] for r in expected]


@FAST
@given(reader_records, st.binary(max_size=12), st.sampled_from([None, 1, 2, 5]))
def test_reader_columns_equal_the_generic_default(records, tail, limit):
    buf = READER.write(records) + tail
    fast = READER.read_columns(buf, "f", limit=limit)
    generic = Codec.read_columns(READER, buf, "f", limit=limit)
    # with no rows the default has no columns at all; the reader keeps the base ones
    assert list(fast.data) == (list(generic.data) or ["format", "seq", "offset", "kind"])
    assert columns_as_records(fast) == columns_as_records(generic)
    assert (fast.rows, fast.next_offset, fast.next_seq) == (generic.rows, generic.next_offset, generic.next_seq)
    assert (fast.error and fast.error.args) == (generic.error and generic.error.args)


def test_resume_at_every_record_and_stop():
    buf = sample_writer(8)
    records = read_all(WRITER, buf)[0]
    for rec in records:
        assert read_all(WRITER, buf, start=rec["offset"], seq=rec["seq"])[0] == records[rec["seq"]:]
        assert read_all(WRITER, buf, stop=rec["offset"])[0] == records[:rec["seq"]]
        cols = WRITER.read_columns(buf, "f", stop=rec["offset"])
        assert columns_as_records(cols) == records[:rec["seq"]] and cols.error is None
    with pytest.raises(FormatError):
        list(WRITER.read(buf, "f", start=len(buf) + 1))


def test_column_types_feed_pyarrow():
    pa = pytest.importorskip("pyarrow")
    buf = WRITER.write([{"id": 1, "payload": b"a", "expire_time": 5}, {"id": 2, "payload": b""}])
    cols = WRITER.read_columns(buf, "f")
    assert pa.array(cols.data["expire_time"]).to_pylist() == [5, None]
    assert pa.array(cols.data["payload"], pa.binary()).to_pylist() == [b"a", b""]
    assert isinstance(cols.data["id"], np.ndarray) and cols.data["id"].dtype == np.int64


# -- hostile input ----------------------------------------------------------------------------

def test_truncation_at_every_byte_gives_a_prefix():
    buf = sample_writer(6) + bytes([0x88]) + struct.pack("<iiqqq", 3, 1, 13, 2, 9) + b"end"
    boundaries = {r["offset"] for r in read_all(WRITER, buf)[0]} | {len(buf), 4}
    for cut, _full, records, error in truncations(WRITER, buf):
        part = buf[:cut]
        assert (error is None) == (cut in boundaries), cut
        assert_columns_equal_read(WRITER, part, records, error, "cut")
        fixed = WRITER.repair(part, "cut")
        if error is not None and cut >= 4:
            assert read_all(WRITER, fixed.data) == (records, None)


@FAST
@given(st.data())
def test_bit_flips_never_raise_anything_else(data):
    source = data.draw(st.sampled_from([sample_writer(5), build_checkpoint(9, [11, 12]) + encode_read_head(10)]))
    codec = detect(source)
    buf = flip_bits(data, source, 3)
    records, error = read_all(codec, buf)
    codec.validate(buf, "f")
    fixed = codec.repair(buf, "f")
    if fixed is not None:
        assert read_all(codec, fixed.data) == (records, None)
    if codec is WRITER:
        assert_columns_equal_read(WRITER, buf, records, error)


# -- validate and repair ----------------------------------------------------------------------

def test_validate_writer_ids():
    assert WRITER.validate(sample_writer(), "f") == []
    gap = WRITER_MAGIC + encode_put(1, b"") + encode_put(3, b"") + encode_put(0, b"")
    reasons = [(f.offset, f.reason) for f in WRITER.validate(gap, "f")]
    assert len(reasons) == 2
    assert reasons[0][0] == 4 + 25 and "does not follow 1" in reasons[0][1]
    assert reasons[1][0] == 4 + 50 and "0" in reasons[1][1]


def test_validate_reader_done_ids_above_head():
    good = build_checkpoint(10, [12, 15])
    assert READER.validate(good, "r") == []
    bad = READER_MAGIC + encode_read_head(10) + encode_read_done([9, 12, 12])
    findings = READER.validate(bad, "r")
    assert {f.severity for f in findings} == {"error", "warning"}
    assert all(f.offset == 13 for f in findings)


def test_repair_truncates_torn_tail_to_last_boundary(records_corpus):
    buf = (records_corpus / "torn.1800000000000").read_bytes()
    records, error = read_all(WRITER, buf)
    fixed = WRITER.repair(buf, "torn")
    assert fixed.data == buf[:error.offset] and len(fixed.actions) == 1
    assert read_all(WRITER, fixed.data) == (records, None)
    assert WRITER.repair(fixed.data, "torn") is None
    assert WRITER.repair(READER_MAGIC, "not-a-writer") is None


# -- queue state ------------------------------------------------------------------------------

def test_queue_state_of_the_conformance_queue(records_corpus):
    writers = [(p.name, read_all(WRITER, p.read_bytes())[0]) for p in records_corpus.glob("jobs.1*")]
    assert len(writers) == 4
    newest = max(writers, key=lambda w: int(w[0].split(".")[1]))[1]
    indexer = read_all(READER, (records_corpus / "jobs.read.indexer").read_bytes())[0]
    state = queue_state(writers, indexer)
    # the reader's head (1036850598261) is past everything written: clamped to the tail
    assert state["tail"] == newest[-1]["id"] == state["head"]
    assert state["pending"] == 0 and state["pending_ids"] == [] and state["done_ids"] == []


def test_queue_state_rules():
    def puts(ids, expire=None):
        return [{"kind": "put", "id": i, "expire_time": expire} for i in ids]
    writers = [("q.20", puts(range(6, 9), expire=100)), ("q.3", puts(range(3, 6))), ("q.100", [])]
    reader = read_all(READER, build_checkpoint(4, [6, 2]) + encode_read_done([7]))[0]
    state = queue_state(writers, reader)
    assert state == {"head": 4, "tail": 8, "pending": 2, "pending_ids": [5, 8], "expired": 0,
                     "done_ids": [6, 7]}
    assert queue_state(writers, reader, now_ms=100)["pending_ids"] == [5]
    assert queue_state(writers, [])["head"] == 2  # clamped up to first id - 1
    assert queue_state([], reader)["head"] == 0
    assert garbage_files(writers, [6, 9]) == ["q.3"]  # the empty newest file is "all consumed"
    assert garbage_files([("q.1", puts([1])), ("q.2", puts([2])), ("q.3", puts([3]))], [2]) == ["q.1"]
