"""Validators stream: memory stays flat in the file's size, and the findings on damaged
journals are exactly the ones the whole-file validators gave (the expected lists below were
taken from them)."""
from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journalfs.formats import CODECS
from journalfs.formats import akka as akka_mod
from journalfs.formats import wallaby as wallaby_mod
from journalfs.formats.akka import AkkaData, AkkaMeta
from journalfs.formats.jrnl import Jrnl
from journalfs.formats.kestrel import READER_MAGIC, KestrelReader

MB = 1 << 20
#: Traced Python allocations allowed while validating a ~12 MB journal. The whole-file
#: validators held every record and needed from 40 MB (wallaby-log) to 200 MB (akka-meta).
PEAK_BOUND = 8 * MB


# -- big valid journals, generated without a dict per record ------------------------------------

def big_wallaby_log(size: int) -> bytes:
    dtype = np.dtype([("size", "<u4"), ("flags", "<u4"), ("time", "<i8"), ("payload", "u1", 48)])
    rec = np.zeros((size - 16) // dtype.itemsize, dtype)
    rec["size"] = 48
    rec["time"] = 1_700_000_000_000_000_000 + np.arange(len(rec)) * 1000
    rec["payload"] = ord("x")
    return b"LOG\x01" + bytes(12) + rec.tobytes()


def big_kestrel_reader(size: int) -> bytes:
    per_done = 8
    dtype = np.dtype([("head_cmd", "u1"), ("head", "<i8"), ("done_cmd", "u1"),
                      ("done_length", "<i4"), ("done", "<i8", per_done)])
    rec = np.zeros((size - len(READER_MAGIC)) // dtype.itemsize, dtype)
    rec["head_cmd"], rec["done_cmd"] = 0x02, 0x91  # READ_HEAD, READ_DONE (command, size words)
    rec["head"] = np.arange(len(rec)) * per_done
    rec["done_length"] = per_done * 8
    rec["done"] = rec["head"][:, None] + np.arange(1, per_done + 1)
    data = READER_MAGIC + rec.tobytes()
    # the same bytes as the codec writes
    assert KestrelReader().write([{"kind": "read_head", "id": 0},
                                  {"kind": "read_done", "ids": list(range(1, 9))}]) \
        == data[:len(READER_MAGIC) + dtype.itemsize]
    return data


def big_jrnl(size: int) -> bytes:
    count = size // 70
    return Jrnl().write([{"time": i, "complete": True,
                          "ops": [{"op": "alloc", "page": i, "free_before": 9, "free_after": 8},
                                  {"op": "complete"}]} for i in range(count)])


def big_akka(size: int) -> tuple[bytes, bytes]:
    count = size // (akka_mod.DATA_BLOCK_FIXED + 100)
    return AkkaData.build([(f"pid-{i % 64}", i // 64 + 1, b"p" * 100) for i in range(count)])


def big_akka_meta(size: int) -> bytes:
    count = size // 46
    return AkkaMeta().write([{"persistence_id": f"pid-{i:012d}", "first": 8, "last": 8,
                              "highest_seq": i} for i in range(count)])


def _peak(codec: str, buf: bytes, **context) -> tuple[int, list]:
    tracemalloc.start()
    try:
        findings = CODECS[codec].validate(buf, codec, **context)
        return tracemalloc.get_traced_memory()[1], findings
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("codec, make", [
    ("wallaby-log", lambda: (big_wallaby_log(12 * MB), {})),
    ("kestrel-reader", lambda: (big_kestrel_reader(12 * MB), {})),
    ("jrnl", lambda: (big_jrnl(6 * MB), {})),
    ("akka-data", lambda: (big_akka(12 * MB)[0], {})),
    ("akka-meta", lambda: (big_akka(12 * MB)[1], {"data": big_akka(12 * MB)[0]})),
    ("akka-meta", lambda: (big_akka_meta(12 * MB), {})),
])
def test_validation_memory_does_not_grow_with_the_file(codec, make):
    buf, context = make()
    peak, findings = _peak(codec, buf, **context)
    assert findings == []
    assert peak < PEAK_BOUND, f"{codec}: {peak / MB:.1f} MB traced while validating"


# -- findings on damaged journals: the same as the whole-file validators ------------------------

def _akka_damaged() -> tuple[bytes, bytes]:
    data, meta = AkkaData.build([(pid, n, b"x" * 8) for n in range(1, 5) for pid in "abc"])
    data = bytearray(data)
    blocks = [8 + 32 * i for i in range(12)]  # every block is 24 + 8 bytes
    struct.pack_into(">i", data, blocks[0] + 12, blocks[0] + 5)   # a's first next: not a block
    struct.pack_into(">i", data, blocks[4] + 8, blocks[2])       # b's second prev: not mutual
    struct.pack_into(">q", data, blocks[8] + 16, 1)              # c's third seq_nr falls
    struct.pack_into(">i", data, blocks[11] + 12, blocks[2])     # c's last next: back to its head
    return bytes(data), meta


def test_akka_data_link_findings_are_unchanged():
    data, _meta = _akka_damaged()
    got = [(f.offset, f.reason) for f in AkkaData().validate(data, "data")]
    assert got == [
        (8, "next link 13 is not a block start"),
        (40, "next link to 136 is not mutual (its prev is 72)"),
        (104, "prev link to 8 is not mutual (its next is 13)"),
        (136, "prev link to 72 is not mutual (its next is 168)"),
        (264, "sequence number 1 does not increase after 2"),
        (360, "next link to 72 is not mutual (its prev is 0)")]


def test_akka_meta_chain_findings_are_unchanged():
    data, meta = _akka_damaged()
    got = [(f.offset, f.reason) for f in AkkaMeta().validate(meta, "meta", data=data)]
    assert got == [
        (8, "'a': link 13 does not point at a data block"),
        (35, "'b': block 136 has prev 72, expected 40"),
        (62, "'c': block 264 has sequence number 1 after 2"),
        (62, "'c': chain loops back to block 72")]


def test_akka_meta_backward_link_that_is_no_loop():
    data, meta = AkkaData.build([(pid, n, b"x" * 8) for n in range(1, 3) for pid in "ab"])
    data = bytearray(data)
    struct.pack_into(">i", data, 8 + 32 * 2 + 12, 8 + 32 * 1)  # a's last block -> b's first
    got = [(f.offset, f.reason) for f in AkkaMeta().validate(meta, "meta", data=bytes(data))]
    assert got == [(8, "'a': block 40 has prev 0, expected 72"),
                   (8, "'a': block 40 has sequence number 1 after 2")]


def test_akka_meta_duplicate_ids_and_damaged_data():
    data, _meta = AkkaData.build([("a", 1, b"x")])
    meta = AkkaMeta().write([{"persistence_id": pid, "first": 0, "last": 0, "highest_seq": 0}
                             for pid in ("a", "b", "a", "c", "a")])
    got = [(f.offset, f.reason) for f in AkkaMeta().validate(meta, "meta", data=data[:-3])]
    assert got == [(62, "persistence id 'a' appears twice"),
                   (116, "persistence id 'a' appears twice"),
                   (0, "data file is damaged, links checked up to byte 8")]


def test_duplicate_ids_found_across_hash_passes(monkeypatch):
    monkeypatch.setattr(akka_mod, "IDS_PER_PASS", 3)  # several passes over a small file
    monkeypatch.setattr(akka_mod, "VALIDATE_BATCH", 4)
    ids = [f"id{i % 7}" for i in range(20)] + ["", ""]
    meta = AkkaMeta().write([{"persistence_id": pid, "first": 0, "last": 0, "highest_seq": 0}
                             for pid in ids])
    findings = AkkaMeta().validate(meta, "meta")
    offsets, pos = [], 8
    seen: set[str] = set()
    for pid in ids:
        if pid in seen:
            offsets.append(pos)
        seen.add(pid)
        pos += akka_mod.META_BLOCK_FIXED + len(pid)
    assert [f.offset for f in findings] == offsets
    assert findings[-1].reason == "persistence id '' appears twice"


def test_kestrel_reader_findings_and_damage_after_them():
    buf = KestrelReader().write([{"kind": "read_head", "id": 5},
                                 {"kind": "read_done", "ids": [3, 6, 6, -1]},
                                 {"kind": "read_head", "id": -2}])
    got = [(f.offset, f.reason, f.severity) for f in KestrelReader().validate(buf, "r")]
    assert got == [(13, "READ_DONE lists an id twice", "warning"),
                   (13, "READ_DONE lists an id that is not positive", "error"),
                   (13, "READ_DONE id at or below the head 5", "error"),
                   (50, "negative head id -2", "error")]
    assert KestrelReader().validate(buf + b"\x02\x01", "r") == []  # read() names the damage


@pytest.mark.parametrize("batch", [1, 3, 1 << 16])
def test_wallaby_log_counts_span_batches(monkeypatch, batch):
    monkeypatch.setattr(wallaby_mod, "VALIDATE_BATCH", batch)
    recs = [{"time": t, "payload": b"ab", "flags": f}
            for t, f in [(10, 0), (20, 1), (30, 0), (40, 2), (50, 0), (95, 3), (99, 0)]]
    log = wallaby_mod.WallabyLog().write(recs, ttl_ns=20)
    torn = log + struct.pack("<IIq", 100, 0, 120) + b"x"
    got = [(f.offset, f.reason, f.severity)
           for f in wallaby_mod.WallabyLog().validate(torn, "LOG", now_ns=100)]
    assert got == [(142, "record payload of 100 bytes runs past the end of the file (1 left)",
                    "error"),
                   (34, "3 record(s) carry flags other than the log's (0)", "warning"),
                   (16, "5 record(s) expired (TTL 20 ns)", "warning")]


def test_jrnl_header_last_mid_chain_keeps_its_finding():
    buf = bytearray(Jrnl().write([{"time": i, "complete": True, "ops": [{"op": "complete"}]}
                                  for i in range(4)]))
    struct.pack_into("<Q", buf, 12, 20 + 30)  # the header's last names the second transaction
    got = [(f.offset, f.reason) for f in Jrnl().validate(bytes(buf), "j")]
    assert got == [(12, "header's last offset 50 is not the chain's end 110; last transaction "
                        "at 50 has a non-zero next link (80)")]


# -- the batched Kestrel validators find what the record-by-record rules find ------------------

def _reader_rules(records: list[dict]) -> list[tuple]:
    """The reader's rules applied one record at a time (the reference)."""
    found, head = [], None
    for rec in records:
        if rec["kind"] == "read_head":
            head = rec["id"]
            if head < 0:
                found.append((rec["offset"], f"negative head id {head}", "error"))
            continue
        ids = rec["ids"]
        if len(set(ids)) != len(ids):
            found.append((rec["offset"], "READ_DONE lists an id twice", "warning"))
        if any(i <= 0 for i in ids):
            found.append((rec["offset"], "READ_DONE lists an id that is not positive", "error"))
        if head is not None and any(i <= head for i in ids):
            found.append((rec["offset"], f"READ_DONE id at or below the head {head}", "error"))
    return found


def _writer_rules(records: list[dict]) -> list[tuple]:
    found, previous = [], None
    for rec in records:
        if rec["id"] == 0:
            found.append((rec["offset"], "item id is 0 (ids are non-zero)", "error"))
        elif previous is not None and rec["id"] != previous + 1:
            found.append((rec["offset"], f"item id {rec['id']} does not follow {previous}", "error"))
        previous = rec["id"]
    return found


_I64 = st.one_of(st.integers(-3, 12), st.sampled_from([-(1 << 63), (1 << 63) - 1]))


@settings(max_examples=150, deadline=None)
@given(items=st.lists(st.one_of(
           st.builds(lambda i: {"kind": "read_head", "id": i}, _I64),
           st.builds(lambda ids: {"kind": "read_done", "ids": ids}, st.lists(_I64, max_size=5))),
           max_size=30),
       batch=st.integers(1, 8))
def test_kestrel_reader_batches_find_what_the_rules_find(items, batch):
    from journalfs.formats import kestrel as kestrel_mod
    buf = KestrelReader().write(items)
    records = list(KestrelReader().read(buf, "r"))
    old = kestrel_mod.VALIDATE_BATCH
    kestrel_mod.VALIDATE_BATCH = batch
    try:
        got = [(f.offset, f.reason, f.severity) for f in KestrelReader().validate(buf, "r")]
    finally:
        kestrel_mod.VALIDATE_BATCH = old
    assert got == _reader_rules(records)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(-2, 6), st.sampled_from([(1 << 63) - 1, -(1 << 63)])),
                    max_size=30),
       batch=st.integers(1, 8), cut=st.integers(0, 40))
def test_kestrel_writer_batches_find_what_the_rules_find(ids, batch, cut):
    from journalfs.formats import kestrel as kestrel_mod
    writer = CODECS["kestrel-writer"]
    buf = writer.write([{"id": i, "payload": b"p" * (i % 3)} for i in ids])
    if cut:  # torn: the findings before the damage stay
        buf = buf[:max(4, len(buf) - cut)]
    records = []
    try:
        records.extend(writer.read(buf, "w"))
    except Exception:  # the damage itself: read() names it
        pass
    old = kestrel_mod.VALIDATE_BATCH
    kestrel_mod.VALIDATE_BATCH = batch
    try:
        got = [(f.offset, f.reason, f.severity) for f in writer.validate(buf, "w")
               if "end-of-data" not in f.reason]
    finally:
        kestrel_mod.VALIDATE_BATCH = old
    assert got == _writer_rules(records)
