"""JRNL page-transaction journal codec: conformance files, chain following, round trips,
hostile links (cycles, out-of-range offsets), and the spec's rollback/redo recovery."""
from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec_helpers import (FAST, assert_expected_records, flip_bits, read_all, read_corpus_file,
                           reads_back, truncations)
from journalfs.formats import FormatError, record_to_json
from journalfs.formats.jrnl import HEADER, Jrnl

JRNL = Jrnl()
JRNL_FILES = ["db0.jrnl", "db1.jrnl", "db2.jrnl", "db3.jrnl"]


def decode(buf, source="j"):
    return read_all(JRNL, buf, source)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tx(time, complete, *ops):
    return {"time": time, "complete": complete, "ops": list(ops)}


ALLOC = {"op": "alloc", "page": 65536, "free_before": 131072, "free_after": 0}
REMOVE = {"op": "remove", "page": 196608, "free_before": 65536}
MODIFY = {"op": "modify", "page": 65536, "data_offset": 12, "size": 3,
          "before_b64": b64(b"abc"), "after_b64": b64(b"xyz")}
DONE = {"op": "complete", "data_b64": b64(b"transaction completed\n\0")}
ROLLBACK = {"op": "rollback", "data_b64": ""}


def sample(last_complete=True, last_done_op=True):
    txs = [tx(1_600_000_000, True, ALLOC, MODIFY, DONE), tx(1_600_000_010, True, REMOVE, DONE),
           tx(1_600_000_020, last_complete, MODIFY, *([DONE] if last_done_op else []))]
    return txs, JRNL.write(txs)


def semantic(recs):
    return [(r["time"], r["complete"], r["ops"]) for r in recs]


# -- conformance ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", JRNL_FILES)
def test_conformance_records(name, records_corpus, records_expected):
    expected = records_expected[name]
    assert expected["format"] == "jrnl"
    _codec, buf, recs, error = read_corpus_file(records_corpus, name, expected)
    assert_expected_records(recs, error, expected, name, to_json=with_op_names_only)
    # the writer rebuilds the same chain byte for byte
    assert JRNL.write(recs) == buf


def with_op_names_only(rec):
    """The record's JSON with each op reduced to its name: only the names are fixed by the
    contract (each op must still carry its own fields)."""
    out = record_to_json(rec)
    assert all(set(op) - {"op"} for op in out["ops"])
    return {**out, "ops": [op["op"] for op in out["ops"]]}


@pytest.mark.parametrize("name", JRNL_FILES)
def test_conformance_resume_at_every_transaction(name, records_corpus):
    buf = (records_corpus / name).read_bytes()
    full = list(JRNL.read(buf, name))
    for rec in full:
        assert list(JRNL.read(buf, name, rec["offset"], rec["seq"])) == full[rec["seq"]:]
        assert list(JRNL.read(buf, name, stop=rec["offset"])) == full[:rec["seq"]]


def test_sniff():
    _, buf = sample()
    assert JRNL.sniff(buf[:64]) and JRNL.sniff(b"JRNL" + bytes(16)) and JRNL.sniff(b"JRNL")
    assert not JRNL.sniff(b"JRNL entries for today: nothing to report\n")
    assert not JRNL.sniff(b"jrnl" + bytes(16))


# -- statuses and round trips --------------------------------------------------------------------

def test_status_follows_the_flag_and_the_completion_op():
    txs = [tx(1, True, ALLOC, DONE), tx(2, False, ALLOC, DONE), tx(3, False, ALLOC),
           tx(4, False, ALLOC, ROLLBACK), tx(5, True, DONE)]
    recs, error = decode(JRNL.write(txs))
    assert error is None
    assert [(r["complete"], r["status"]) for r in recs] == [
        (True, "complete"), (False, "redo"), (False, "rollback"), (False, "rollback"),
        (True, "complete")]
    # a last transaction marked complete must end with its completion op: else it is torn
    recs, error = decode(JRNL.write(txs[:-1] + [tx(5, True, ALLOC)]))
    assert len(recs) == 4 and error is not None


def test_empty_journal_is_exactly_the_header():
    buf = JRNL.write([])
    assert buf == b"JRNL" + bytes(16) and decode(buf) == ([], None)
    assert JRNL.validate(buf, "j") == [] and JRNL.repair(buf, "j") is None


u64 = st.integers(0, 2**64 - 1)
ops = st.one_of(
    st.builds(lambda p, b, a: {"op": "alloc", "page": p, "free_before": b, "free_after": a},
              u64, u64, u64),
    st.builds(lambda p, b: {"op": "remove", "page": p, "free_before": b}, u64, u64),
    st.builds(lambda p, o, img: {"op": "modify", "page": p, "data_offset": o, "size": len(img[0]),
                                 "before_b64": b64(img[0]), "after_b64": b64(img[1])},
              u64, st.integers(0, 65535),
              st.integers(0, 40).flatmap(lambda n: st.tuples(st.binary(min_size=n, max_size=n),
                                                             st.binary(min_size=n, max_size=n)))),
    st.builds(lambda d: {"op": "rollback", "data_b64": b64(d)}, st.binary(max_size=30)),
)
# a transaction marked complete always ends with its completion op
transactions = st.lists(st.builds(
    lambda t, c, body, done: tx(t, c, *body, *([{"op": "complete", "data_b64": b64(done or b"")}]
                                               if c or done is not None else [])),
    st.integers(-2**63, 2**63 - 1), st.booleans(), st.lists(ops, max_size=5),
    st.none() | st.binary(max_size=23)), max_size=8)


@FAST
@given(txs=transactions)
def test_round_trip(txs):
    buf = JRNL.write(txs)
    recs = reads_back(JRNL, buf)
    assert semantic(recs) == [(t["time"], t["complete"], t["ops"]) for t in txs]
    offsets = [r["offset"] for r in recs]
    assert [r["prev"] for r in recs] == ([0] + offsets[:-1] if recs else [])
    assert [r["next"] for r in recs] == (offsets[1:] + [0] if recs else [])
    assert all(f.severity == "warning" for f in JRNL.validate(buf, "j"))


# -- hostile input -------------------------------------------------------------------------------

def test_truncation_at_every_byte_yields_a_prefix_then_an_error():
    txs, buf = sample()
    for cut, full, recs, error in truncations(JRNL, buf, "cut.jrnl"):
        assert error is not None, cut
        # exactly the transactions whose bytes all survived are returned
        ends = [f["offset"] for f in full[1:]] + [len(buf)]
        assert len(recs) == sum(1 for end in ends if end <= cut), cut


def _with_link(buf: bytes, tx_offset: int, field: str, value: int) -> bytes:
    out = bytearray(buf)
    struct.pack_into("<Q", out, tx_offset + {"prev": 0, "next": 8}[field], value)
    return bytes(out)


@pytest.mark.timeout(10)
def test_link_cycles_end_in_a_format_error_not_a_hang():
    _, buf = sample()
    full = list(JRNL.read(buf, "j"))
    last = full[-1]["offset"]
    for target in (full[0]["offset"], full[1]["offset"], last):  # back-links and a self-loop
        recs, error = decode(_with_link(buf, last, "next", target))
        assert recs == full[:2] and error.offset == last + 8 and "next link" in error.reason


@pytest.mark.parametrize("value", [2**31, 2**63, 2**64 - 1])
def test_out_of_range_links_and_header_offsets(value):
    _, buf = sample()
    full = list(JRNL.read(buf, "j"))
    recs, error = decode(_with_link(buf, full[1]["offset"], "next", value))
    assert recs[:1] == full[:1] and recs[1]["next"] == value and len(recs) == 2
    assert isinstance(error, FormatError) and error.offset == len(buf)
    recs, error = decode(_with_link(buf, full[1]["offset"], "prev", value))
    assert recs == full[:1] and error.offset == full[1]["offset"]
    head = bytearray(buf)
    struct.pack_into("<Q", head, 4, value)
    assert decode(bytes(head))[0] == [] and decode(bytes(head))[1] is not None
    assert JRNL.repair(bytes(head), "j") is None  # nothing there can be recovered safely


def test_lying_op_sizes():
    _, buf = sample()
    full_first = list(JRNL.read(buf, "j"))[0]["offset"]
    first_op = full_first + 25
    for size in (2**31, 2**32 - 1, 7):
        bad = bytearray(buf)
        struct.pack_into("<I", bad, first_op + 1, size)
        recs, error = decode(bytes(bad))
        assert recs == [] and error.offset == first_op
    bad = bytearray(buf)
    bad[first_op] = 0x42
    assert "unknown operation" in decode(bytes(bad))[1].reason


@FAST
@given(data=st.data())
def test_bit_flips_never_raise_anything_but_format_error(data):
    _, buf = sample()
    bad = flip_bits(data, buf, 4)
    decode(bad)
    JRNL.validate(bad, "j")
    fix = JRNL.repair(bad, "j")
    if fix is not None:
        assert decode(fix.data)[1] is None


# -- validation and recovery (specs/jrnl.md "Recovery") -----------------------------------------

def test_rollback_drops_the_incomplete_last_transaction():
    txs, buf = sample(last_complete=False, last_done_op=False)
    findings = JRNL.validate(buf, "j")
    assert [(f.severity, f.offset) for f in findings] == [("warning", decode(buf)[0][-1]["offset"])]
    assert "rollback" in findings[0].reason
    fix = JRNL.repair(buf, "j")
    assert fix.data == JRNL.write(txs[:-1])  # unlinked, header's last moved, truncated
    assert "rolled back" in fix.actions[0]


def test_rollback_of_the_only_transaction_leaves_20_bytes():
    buf = JRNL.write([tx(7, False, ALLOC, MODIFY)])
    fix = JRNL.repair(buf, "j")
    assert fix.data == b"JRNL" + bytes(16) and len(fix.data) == HEADER


def test_redo_marks_the_last_transaction_complete():
    txs, buf = sample(last_complete=False, last_done_op=True)
    assert "redo" in JRNL.validate(buf, "j")[0].reason
    fix = JRNL.repair(buf, "j")
    txs[-1]["complete"] = True
    assert fix.data == JRNL.write(txs) and "redo" in fix.actions[0]
    assert JRNL.validate(fix.data, "j") == []
    assert JRNL.repair(buf, "j", table="/some/table.tbl").data == buf  # left to the table's owner


def test_torn_last_transaction_header_makes_the_previous_one_last():
    txs, buf = sample()
    last = decode(buf)[0][-1]["offset"]
    torn = buf[:last + 10]
    recs, error = decode(torn)
    assert len(recs) == 2 and error.offset == last
    assert any(f.severity == "error" for f in JRNL.validate(torn, "j"))
    assert JRNL.repair(torn, "j").data == JRNL.write(txs[:2])
    torn_ops = buf[:-3]  # cut inside the last transaction's completion op
    assert decode(torn_ops)[0] == recs
    assert JRNL.repair(torn_ops, "j").data == JRNL.write(txs[:2])


def test_header_last_that_is_not_the_chain_end_is_corrupt():
    txs, buf = sample()
    middle = decode(buf)[0][1]["offset"]
    bad = bytearray(buf)
    struct.pack_into("<Q", bad, 12, middle)
    findings = JRNL.validate(bytes(bad), "j")
    assert [f.severity for f in findings] == ["error"]
    assert "non-zero next link" in findings[0].reason
    assert JRNL.repair(bytes(bad), "j").data == buf
    one_sided = bytearray(buf)
    struct.pack_into("<Q", one_sided, 12, 0)
    assert decode(bytes(one_sided))[1].offset == 4
