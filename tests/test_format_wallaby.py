"""Wallaby log (LOG) and index (IDX) codecs: conformance files, round trips, the vectorised
column decoders, hostile input, and index/log validation and repair."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec_helpers import (FAST, assert_columns_equal_read, assert_expected_records,
                           columns_as_records, columns_in_batches, flip_bits, read_all,
                           read_corpus_file, reads_back, truncations)
from journalfs.formats import detect
from journalfs.formats.wallaby import WallabyIndex, WallabyLog, build_index, write_log_and_index

LOG, IDX = WallabyLog(), WallabyIndex()
WAL_FILES = ["wal0.log", "wal0.log.idx", "wal1.log", "wal1.log.idx", "wal2.log", "wal2.log.idx"]
T0 = 1_700_000_000_000_000_000  # a realistic time in ns


def sample_log(n=6, flags=0, ttl_ns=0, sizes=(3, 0, 40, 1, 100, 7)):
    items = [(T0 + i * 1000, bytes([i % 251]) * sizes[i % len(sizes)]) for i in range(n)]
    return write_log_and_index(items, flags=flags, ttl_ns=ttl_ns)


def short_header(log: bytes) -> bytes:
    """The original Go writer's layout: the same records after an 8-byte header."""
    return log[:8] + log[16:]


# -- conformance ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", WAL_FILES)
def test_conformance_records(name, records_corpus, records_expected):
    expected = records_expected[name]
    codec, buf, recs, error = read_corpus_file(records_corpus, name, expected)
    assert_expected_records(recs, error, expected, name)
    assert_columns_equal_read(codec, buf, recs, error, name)


@pytest.mark.parametrize("log_name", ["wal0.log", "wal1.log", "wal2.log"])
def test_conformance_pairs_are_consistent(log_name, records_corpus):
    log = (records_corpus / log_name).read_bytes()
    index = (records_corpus / (log_name + ".idx")).read_bytes()
    now_before_all = 0
    assert IDX.validate(index, "i", log=log) == []
    assert LOG.validate(log, "l", index=index, now_ns=now_before_all) == []
    assert IDX.repair(index, "i", log=log) is None
    assert LOG.repair(log, "l", index=index) is None
    # the rebuilt index is byte-identical to the real one
    assert build_index(LOG.read_columns(log, "l"), *IDX.header(index, "i")[1:]) == index


def test_wal2_uses_the_short_header(records_corpus):
    log = (records_corpus / "wal2.log").read_bytes()
    assert LOG.header(log, "wal2.log").size == 8
    assert LOG.header((records_corpus / "wal1.log").read_bytes(), "wal1.log").ttl_ns == 3600 * 10**9


# -- sniffing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("head", [b"LOG file for today\n", b"IDX: the index\n", b"LOG\x00\0\0\0\0",
                                  b"LOG\x09tab", b"LO", b"", b"IDX\xff" + bytes(12)])
def test_sniff_rejects_text_and_implausible_versions(head):
    assert not LOG.sniff(head) and not IDX.sniff(head)
    assert detect(head) is None or detect(head).name not in ("wallaby-log", "wallaby-index")


def test_sniff_accepts_written_files():
    log, index = sample_log()
    assert detect(log[:64]).name == "wallaby-log"
    assert detect(short_header(log)[:64]).name == "wallaby-log"
    assert detect(index[:64]).name == "wallaby-index"


# -- round trips ---------------------------------------------------------------------------------

times = st.integers(-2**63, 2**63 - 1)
payloads = st.binary(max_size=120)
log_items = st.lists(st.tuples(times, payloads), max_size=25).map(
    # a zero size with a zero time is the end-of-data marker, never a record
    lambda items: [(t or 1, p) if not p else (t, p) for t, p in items])


@FAST
@given(items=log_items, flags=st.integers(0, 2**32 - 1), ttl=st.integers(-2**63, 2**63 - 1))
def test_log_and_index_round_trip(items, flags, ttl):
    log, index = write_log_and_index(items, flags=flags, ttl_ns=ttl)
    recs = reads_back(LOG, log, flags=flags, ttl_ns=ttl)
    want = [(t, p, flags) for t, p in items]
    assert [(r["time"], r["payload"], r["flags"]) for r in recs] == want
    entries = reads_back(IDX, index, flags=flags, ttl_ns=ttl)
    assert [(e["time"], e["index"], e["log_offset"]) for e in entries] == \
        [(r["time"], r["seq"], r["offset"]) for r in recs]
    assert columns_as_records(LOG.read_columns(log, "f")) == recs
    assert columns_as_records(IDX.read_columns(index, "f")) == entries
    assert IDX.validate(index, "i", log=log) == []


@FAST
@given(items=st.lists(st.tuples(st.integers(2**50, 2**62), payloads), min_size=1, max_size=12))
def test_short_header_logs_read_the_same_records(items):
    log, _ = write_log_and_index(items)
    old = short_header(log)
    assert LOG.header(old, "old").size == 8
    recs, error = read_all(LOG, old)
    assert error is None
    assert [(r["time"], r["payload"], r["offset"] + 8) for r in recs] == \
        [(t, p, o) for (t, p), o in zip(items, [r["offset"] for r in read_all(LOG, log)[0]])]


@FAST
@given(items=log_items, chunk=st.integers(1, 7), stop_at=st.integers(0, 30))
def test_columns_resume_in_chunks_and_equal_read(items, chunk, stop_at):
    log, index = write_log_and_index(items)
    for codec, buf in ((LOG, log), (IDX, index)):
        full = list(codec.read(buf, "f"))
        assert columns_in_batches(codec, buf, chunk) == (full, None)
        if len(full) > stop_at:  # stop: nothing that begins at or after it
            stop = full[stop_at]["offset"]
            assert list(codec.read(buf, "f", stop=stop)) == full[:stop_at]
            assert columns_as_records(codec.read_columns(buf, "f", stop=stop)) == full[:stop_at]
        if full:  # resuming at any record gives the rest
            mid = full[len(full) // 2]
            assert list(codec.read(buf, "f", mid["offset"], mid["seq"])) == full[mid["seq"]:]


# -- zero tails and hostile input ---------------------------------------------------------------

def test_zero_filled_tail_is_a_clean_end():
    log, _ = sample_log()
    want = list(LOG.read(log, "f"))
    for zeros in (1, 15, 16, 512 * 1024):
        padded = log + bytes(zeros)
        assert read_all(LOG, padded) == (want, None)
        assert columns_as_records(LOG.read_columns(padded, "f")) == want


def test_data_after_the_zero_marker_is_damage():
    log, _ = sample_log()
    recs, error = read_all(LOG, log + bytes(64) + b"\x05")
    assert recs == list(LOG.read(log, "f"))
    assert error.offset == len(log) and "gap" in error.reason


def test_truncation_at_every_byte_yields_a_prefix_then_an_error():
    log, index = sample_log(n=5)
    for codec, buf in ((LOG, log), (IDX, index)):
        full = list(codec.read(buf, "f"))
        ends = {r["offset"] + (16 + len(r["payload"]) if codec is LOG else 24) for r in full}
        for cut, _full, recs, error in truncations(codec, buf, "cut.bin"):
            whole = [r for r in full if r["offset"] + (16 + len(r["payload"]) if codec is LOG
                                                       else 24) <= cut]
            assert recs == whole
            if codec is LOG:  # zeros after the last whole record read as pre-extension
                last_end = max([r["offset"] + 16 + len(r["payload"]) for r in whole], default=8)
                clean = cut >= 8 and not any(buf[last_end:cut])
            else:
                clean = cut in ends or cut == 16
            assert (error is None) == clean, cut
            assert_columns_equal_read(codec, buf[:cut], recs, error, "cut.bin")


@pytest.mark.parametrize("size", [2**31, 2**32 - 1, 2**31 + 5])
def test_lying_sizes_stop_at_that_record(size):
    log, _ = sample_log()
    full = list(LOG.read(log, "f"))
    victim = full[3]["offset"]
    bad = bytearray(log)
    struct.pack_into("<I", bad, victim, size)
    recs, error = read_all(LOG, bytes(bad))
    assert recs == full[:3] and error.offset == victim
    cols = LOG.read_columns(bytes(bad), "f")
    assert columns_as_records(cols) == full[:3] and cols.error.offset == victim


@FAST
@given(data=st.data())
def test_bit_flips_never_raise_anything_but_format_error(data):
    log, index = sample_log(n=8)
    for codec, buf in ((LOG, log), (IDX, index)):
        bad = flip_bits(data, buf, 4)
        recs, error = read_all(codec, bad)
        assert_columns_equal_read(codec, bad, recs, error)
        codec.validate(bad, "f", **({"log": log} if codec is IDX else {"index": index}))


def test_huge_index_offsets_are_reported_not_followed():
    log, index = sample_log()
    bad = bytearray(index)
    struct.pack_into("<qQq", bad, 16 + 24 * 2, T0, 2**63, 2**63 - 1)
    recs, error = read_all(IDX, bytes(bad))
    assert error is None and recs[2]["index"] == 2**63 and recs[2]["log_offset"] == 2**63 - 1
    findings = IDX.validate(bytes(bad), "i", log=log)
    assert any(f.severity == "error" and f.offset == 16 + 48 for f in findings)


# -- validation and repair -----------------------------------------------------------------------

def test_lagging_index_is_a_warning_and_is_rebuilt():
    log, index = sample_log(n=6)
    lagging = index[:16 + 24 * 4]
    findings = IDX.validate(lagging, "i", log=log)
    assert [f.severity for f in findings] == ["warning"]
    assert "2 log record(s) not indexed" in findings[0].reason
    assert any("not indexed" in f.reason for f in LOG.validate(log, "l", index=lagging))
    fix = IDX.repair(lagging, "i", log=log)
    assert fix.data == index and "rebuilt" in fix.actions[0]


def test_torn_index_record_is_dropped_or_rebuilt():
    log, index = sample_log(n=6)
    torn = index[:-5]
    assert read_all(IDX, torn)[1].offset == len(index) - 24
    assert IDX.repair(torn, "i").data == index[:-24]
    assert IDX.repair(torn, "i", log=log).data == index


def test_mismatching_index_is_an_error_and_is_rebuilt():
    log, index = sample_log(n=6)
    shifted = bytearray(index)
    struct.pack_into("<q", shifted, 16 + 24 * 3 + 16, 4242)  # points into the middle of a record
    findings = IDX.validate(bytes(shifted), "i", log=log)
    assert [(f.severity, f.offset) for f in findings] == [("error", 16 + 24 * 3)]
    other_time = bytearray(index)
    struct.pack_into("<q", other_time, 16 + 24 * 5, T0 - 1)
    assert [f.severity for f in IDX.validate(bytes(other_time), "i", log=log)] == ["error"]
    assert any(f.severity == "error" for f in LOG.validate(log, "l", index=bytes(other_time)))
    assert IDX.repair(bytes(shifted), "i", log=log).data == index
    assert IDX.repair(bytes(other_time), "i", log=log).data == index


def test_non_contiguous_index_numbers_are_an_error():
    log, index = sample_log(n=6)
    bad = bytearray(index)
    struct.pack_into("<Q", bad, 16 + 24 * 2 + 8, 7)
    findings = IDX.validate(bytes(bad), "i", log=log)
    assert any(f.severity == "error" and "contiguous" in f.reason for f in findings)


def test_index_of_a_gap_log_is_detected():
    """The original appender's gap: the log has zeros where the index expects records."""
    log, index = sample_log(n=6)
    offsets = [r["offset"] for r in LOG.read(log, "f")]
    gap = log[:offsets[3]] + bytes(32) + log[offsets[3]:]
    assert read_all(LOG, gap)[1] is not None  # records after zeros: damage, not a clean end
    assert any(f.severity == "error" for f in IDX.validate(index, "i", log=gap))


def test_ttl_expiry_is_reported_and_compacted_only_on_request():
    items = [(T0 + i * 10, bytes([i]) * 5) for i in range(10)]
    log, _ = write_log_and_index(items, ttl_ns=100)
    now = T0 + 145  # records 0..4 have time + ttl < now
    findings = LOG.validate(log, "l", now_ns=now)
    assert [(f.severity, f.reason) for f in findings] == [
        ("warning", "5 record(s) expired (TTL 100 ns)")]
    assert LOG.repair(log, "l", now_ns=now) is None
    fix = LOG.repair(log, "l", now_ns=now, compact_expired=True)
    assert [(r["time"], r["payload"]) for r in LOG.read(fix.data, "l")] == items[5:]
    assert LOG.validate(log, "l", now_ns=T0) == []  # nothing expired yet
    no_ttl, _ = write_log_and_index(items)
    assert LOG.validate(no_ttl, "l", now_ns=2**63 - 1) == []


def test_log_repair_truncates_only_a_torn_tail():
    log, index = sample_log(n=6)
    full = list(LOG.read(log, "f"))
    fix = LOG.repair(log[:-3], "l")
    assert fix.data == log[:full[-1]["offset"]] and "torn" in fix.actions[0]
    assert list(LOG.read(fix.data, "l")) == full[:-1]
    assert LOG.repair(log + bytes(100), "l").data == log  # zero pre-extension trimmed
    assert LOG.repair(log, "l") is None
    # a lying size in the middle: the index proves records follow, so nothing is dropped
    bad = bytearray(log)
    struct.pack_into("<I", bad, full[2]["offset"], 2**31)
    assert LOG.repair(bytes(bad), "l", index=index) is None


def test_unaligned_u64_gather_matches_struct():
    from journalfs.formats.wallaby import _gather_u64
    buf = bytes(range(7, 7 + 61))
    offsets = np.arange(0, len(buf) - 7, dtype=np.int64)
    want = [struct.unpack_from("<Q", buf, o)[0] for o in offsets.tolist()]
    assert _gather_u64(buf, offsets).tolist() == want
    assert _gather_u64(memoryview(buf), offsets[::-3]).tolist() == want[::-3]


def test_log_repair_refuses_a_flipped_size_in_the_middle():
    log, _ = sample_log(n=6)
    full = list(LOG.read(log, "f"))
    bad = bytearray(log)
    struct.pack_into("<I", bad, full[2]["offset"], 2**31)  # beyond the original's 64 KiB cap
    assert LOG.repair(bytes(bad), "l") is None
    assert any(f.severity == "error" for f in LOG.validate(bytes(bad), "l"))


def test_columns_over_mmap_and_memoryview_equal_read(tmp_path):
    from journalfs.journals import mapped
    log, index = sample_log(n=40)
    for codec, data in ((LOG, log), (IDX, index)):
        path = tmp_path / "f.bin"
        path.write_bytes(data)
        want = list(codec.read(data, "f"))
        with mapped(str(path)) as buf:
            assert list(codec.read(buf, "f")) == want
            cols = codec.read_columns(buf, "f")
            assert columns_as_records(cols) == want
            del cols
        assert columns_as_records(codec.read_columns(memoryview(bytearray(data)), "f")) == want


def test_index_restarted_after_a_reopen_is_flagged_and_rebuilt():
    """The original truncated the index on reopen and numbered from 0 again."""
    log, index = sample_log(n=6)
    entries = list(IDX.read(index, "i"))[2:]
    for number, entry in enumerate(entries):
        entry["index"] = number
    restarted = IDX.write(entries)
    findings = IDX.validate(restarted, "i", log=log)
    assert any("restarted" in f.reason for f in findings)
    assert IDX.repair(restarted, "i", log=log).data == index
