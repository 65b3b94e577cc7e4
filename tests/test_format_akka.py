"""akka-persistence-file-journal meta/data codecs against the original project's vectors, the
conformance corpus, round trips, the vectorised column decoder, hostile input and link checks."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from codec_helpers import (FAST, assert_columns_equal_read, check_vectors, columns_as_records,
                           columns_in_batches, flip_bits, read_all, read_expected_corpus,
                           read_traced, reads_back, truncations)
from journalfs.formats.akka import AkkaData, AkkaMeta, chains

DATA = AkkaData()
META = AkkaMeta()
AKKA = ("akka-meta", "akka-data")

pids = st.sampled_from(["P1", "order-7", "użytkownik-3", "", "x" * 40])
payloads = st.binary(max_size=30)


@st.composite
def journals(draw):
    """Messages of several persistence ids, sequence numbers increasing per id (maybe gaps)."""
    messages, last = [], {}
    for pid, payload, gap in draw(st.lists(st.tuples(pids, payloads, st.integers(1, 3)), max_size=12)):
        last[pid] = last.get(pid, 0) + gap
        messages.append((pid, last[pid], payload))
    return messages


def data_block(at, seq_nr, payload=b"", prev=0, nxt=0, size=None):
    return struct.pack(">iiiiq", 24 + len(payload) if size is None else size, at, prev, nxt, seq_nr) + payload


def data_file(*blocks, total=None):
    body = b"".join(blocks)
    return b"AKFD" + struct.pack(">i", len(body) if total is None else total) + body


# -- known answers -------------------------------------------------------------------------

def test_vectors_decode_exactly(vectors):
    assert check_vectors(vectors, AKKA) == 2


def test_vectors_encode_back(vectors):
    data_hex = bytes.fromhex(vectors["akka-data/two-messages"]["hex"])
    assert DATA.write(read_all(DATA, data_hex)[0]) == data_hex
    meta_hex = bytes.fromhex(vectors["akka-meta/two-ids-original-magic"]["hex"])
    metas = read_all(META, meta_hex)[0]
    assert META.write(metas, magic=b"AKFM") == meta_hex
    assert META.write(metas) == b"APFM" + meta_hex[4:]  # journalfs writes the seed's magic


def test_conformance_files_decode_exactly(records_corpus, records_expected):
    files = read_expected_corpus(records_corpus, records_expected, AKKA)
    assert len(files) == 6
    for name, codec, buf, records in files:
        if codec is DATA:
            assert columns_as_records(DATA.read_columns(buf, name)) == records
            assert DATA.write(records) == buf


def test_conformance_journals_are_consistent(records_corpus):
    for folder in ("akka0", "akka1", "akka2"):
        meta = (records_corpus / folder / "meta").read_bytes()
        data = (records_corpus / folder / "data").read_bytes()
        metas, messages = read_all(META, meta)[0], read_all(DATA, data)[0]
        assert META.validate(meta, "meta", data=data) == []
        assert DATA.validate(data, "data") == []
        summary = chains(metas, messages)
        assert set(summary) == {m["persistence_id"] for m in metas}
        assert all(s["consistent"] for s in summary.values())
        assert sum(s["messages"] for s in summary.values()) == len(messages)  # every block is on a chain


def test_sniff_by_magic_only():
    assert META.sniff(b"APFM\0\0\0\0") and META.sniff(b"AKFM") and not META.sniff(b"AKFD")
    assert DATA.sniff(b"AKFD") and not DATA.sniff(b"APFM") and not DATA.sniff(b"")


# -- round trips ----------------------------------------------------------------------------

@FAST
@given(journals())
def test_build_round_trip(messages):
    data, meta = AkkaData.build(messages)
    records = reads_back(DATA, data)
    assert [(r["seq_nr"], r["payload"]) for r in records] == [(s, p) for _, s, p in messages]
    metas = reads_back(META, meta)
    assert meta[:4] == b"APFM"
    summary = chains(metas, records)
    for pid in {m[0] for m in messages}:
        mine = [s for p, s, _ in messages if p == pid]
        assert summary[pid] == {"messages": len(mine), "highest_seq": mine[-1], "consistent": True}
    assert META.validate(meta, "m", data=data) == [] and DATA.validate(data, "d") == []
    assert columns_as_records(DATA.read_columns(data, "d")) == records


def test_write_refuses_inconsistent_links():
    with pytest.raises(ValueError):
        DATA.write([{"self": 9, "prev": 0, "next": 0, "seq_nr": 1, "payload": b""}])
    with pytest.raises(ValueError):
        DATA.write([{"prev": 0, "next": 20, "seq_nr": 1, "payload": b""}])
    with pytest.raises(ValueError):
        META.write([{"persistence_id": "x" * 40000, "first": 0, "last": 0, "highest_seq": 0}])


# -- columns and resumption -------------------------------------------------------------------

@FAST
@given(journals(), st.integers(1, 4))
def test_columns_in_batches_equal_read(messages, batch):
    data, _ = AkkaData.build(messages)
    assert columns_in_batches(DATA, data, batch) == read_all(DATA, data)


def test_resume_and_stop_at_every_record(records_corpus):
    for name, codec in (("akka0/data", DATA), ("akka0/meta", META)):
        buf = (records_corpus / name).read_bytes()
        records = read_all(codec, buf)[0]
        for rec in records[::5]:
            assert read_all(codec, buf, start=rec["offset"], seq=rec["seq"]) == (records[rec["seq"]:], None)
            assert read_all(codec, buf, stop=rec["offset"]) == (records[:rec["seq"]], None)
            if codec is DATA:
                cols = DATA.read_columns(buf, "d", rec["offset"], rec["seq"], stop=records[-1]["offset"])
                assert cols.error is None and columns_as_records(cols) == records[rec["seq"]:-1]
                assert isinstance(cols.data["seq_nr"], np.ndarray)


# -- hostile input ----------------------------------------------------------------------------

def small_journal():
    return AkkaData.build([("a", 1, b"xy"), ("b", 1, b""), ("a", 2, b"z" * 5), ("b", 2, b"q")])


def test_truncation_at_every_byte_gives_a_prefix():
    data, meta = small_journal()
    for codec, buf in ((DATA, data), (META, meta)):
        for cut, _full, records, error in truncations(codec, buf):
            assert error is not None  # the header total no longer fits
            if codec is DATA:
                assert_columns_equal_read(DATA, buf[:cut], records, error, "cut")


def test_repair_cuts_only_a_torn_final_block():
    data, _ = small_journal()
    full = read_all(DATA, data)[0]
    boundaries = [r["offset"] for r in full] + [len(data)]
    for cut in range(9, len(data)):
        part = data[:cut]
        fixed = DATA.repair(part, "cut")
        kept = [b for b in boundaries if b <= cut][-1]
        assert fixed.data[8:] == data[8:kept]  # every whole block kept, the torn one dropped
        assert read_all(DATA, fixed.data) == (full[:boundaries.index(kept)], None)
    assert DATA.repair(data, "d") is None


def test_repair_fixes_a_stale_header_total_without_losing_blocks():
    data, _ = small_journal()
    stale = data[:4] + struct.pack(">i", 30) + data[8:]  # blocks appended, header not updated
    records, error = read_all(DATA, stale)
    assert error is not None
    fixed = DATA.repair(stale, "d")
    assert fixed.data == data and any("header" in a for a in fixed.actions)


def test_repair_cuts_stray_bytes_after_the_counted_blocks():
    data, _ = small_journal()
    fixed = DATA.repair(data + b"junk" * 10, "d")
    assert fixed.data == data and "after the last block" in fixed.actions[0]


def test_repair_refuses_mid_file_damage():
    data, _ = small_journal()
    second = read_all(DATA, data)[0][1]["offset"]
    broken = bytearray(data)
    broken[second + 4:second + 8] = struct.pack(">i", 999)  # self-offset lies
    records, error = read_all(DATA, bytes(broken))
    assert len(records) == 1 and error.offset == second and "999" in error.reason
    assert DATA.repair(bytes(broken), "d") is None


@pytest.mark.parametrize("codec, buf, offset", [
    (DATA, data_file(data_block(8, 1, b"a"), total=2**31 - 1), 9 + 24),
    (DATA, data_file(data_block(8, 1, size=2**31 - 1)), 8),
    (DATA, data_file(data_block(8, 1, size=-5)), 8),
    (DATA, data_file(data_block(8, 1, size=3)), 8),
    (DATA, b"AKFD" + struct.pack(">i", -1), 4),
    (META, b"APFM" + struct.pack(">ih", 2**31 - 1, 0x7FFF) + bytes(30), 8),
    (META, b"APFM" + struct.pack(">ih", 30, -1) + bytes(30), 8),
    (META, b"APFM" + struct.pack(">ih", 30, 20) + bytes(30), 8),
])
def test_lying_sizes_fail_fast_without_big_allocations(codec, buf, offset):
    records, error, cols, peak = read_traced(codec, buf)
    assert error is not None and error.offset == offset and cols.error.offset == offset
    assert peak < 1 << 20


def test_header_total_must_match_file_length():
    block = data_block(8, 1, b"a")
    for total, offset in ((len(block) - 5, 8), (len(block) + 5, 33)):
        records, error = read_all(DATA, data_file(block, total=total))
        assert error.offset == offset
    records, error = read_all(DATA, data_file(block) + b"junk")
    assert len(records) == 1 and error.offset == 33 and "4 bytes" in error.reason


def test_bad_utf8_persistence_id_is_damage():
    good = META.write([{"persistence_id": "ok", "first": 8, "last": 8, "highest_seq": 1}])
    bad = good + struct.pack(">hqqq", 28, 0, 0, 0) + b"\xff\xfe"
    bad = bad[:4] + struct.pack(">i", len(bad) - 8) + bad[8:]
    records, error = read_all(META, bad)
    assert [r["persistence_id"] for r in records] == ["ok"] and error.offset == len(good) + 26


def test_not_an_akka_file():
    for codec, buf in ((DATA, b"APFM\0\0\0\0"), (META, b"AKFD\0\0\0\0"), (DATA, b"AKF"), (META, b"")):
        records, error = read_all(codec, buf)
        assert records == [] and error.offset == 0


@FAST
@given(st.data())
def test_bit_flips_never_raise_anything_else(data):
    files = small_journal()
    which = data.draw(st.integers(0, 1))
    codec = (DATA, META)[which]
    buf = flip_bits(data, files[which], 3)
    records, error = read_all(codec, buf)
    codec.validate(buf, "f", data=files[0])
    META.validate(files[1], "m", data=buf)
    fixed = codec.repair(buf, "f")
    if fixed is not None:  # every valid block kept; a too-small header total may free more after them
        repaired, damage = read_all(codec, fixed.data)
        assert damage is None and repaired[:len(records)] == records
    if codec is DATA:
        assert_columns_equal_read(DATA, buf, records, error)


# -- validate and chains ----------------------------------------------------------------------

def test_validate_data_links():
    ok = data_file(data_block(8, 1, prev=0, nxt=32), data_block(32, 2, prev=8, nxt=0))
    assert DATA.validate(ok, "d") == []
    not_mutual = data_file(data_block(8, 1, nxt=32), data_block(32, 2, prev=0))
    assert [f.offset for f in DATA.validate(not_mutual, "d")] == [8]
    dangling = data_file(data_block(8, 1, nxt=20))
    assert "not a block start" in DATA.validate(dangling, "d")[0].reason
    backwards = data_file(data_block(8, 5, nxt=32), data_block(32, 2, prev=8))
    assert [f.offset for f in DATA.validate(backwards, "d")] == [32]


def test_validate_meta_against_data():
    data, meta = small_journal()
    metas = read_all(META, meta)[0]
    assert META.validate(meta, "m", data=data) == []
    assert META.validate(meta, "m") == []
    wrong_last = META.write([{**metas[0], "last": metas[0]["first"]}, metas[1]])
    wrong_high = META.write([metas[0], {**metas[1], "highest_seq": 9}])
    dup = META.write([metas[0], metas[0]])
    for buf, words in ((wrong_last, "ends at"), (wrong_high, "highest"), (dup, "twice")):
        findings = META.validate(buf, "m", data=data)
        assert len(findings) == 1 and words in findings[0].reason, words


def test_chains_flag_broken_journals():
    data, meta = small_journal()
    metas, messages = read_all(META, meta)[0], read_all(DATA, data)[0]
    broken = [{**m, "next": 0} if m["offset"] == metas[0]["first"] else m for m in messages]
    summary = chains(metas, broken)
    assert summary["a"] == {"messages": 1, "highest_seq": 2, "consistent": False}
    assert summary["b"]["consistent"] and summary["b"]["messages"] == 2
    loop = [{**m, "next": m["self"], "prev": m["self"]} for m in messages]
    assert not chains(metas, loop)["a"]["consistent"]
    empty = {"persistence_id": "e", "first": 0, "last": 0, "highest_seq": 0}
    assert chains([empty], [])["e"] == {"messages": 0, "highest_seq": 0, "consistent": True}
