"""SQLite WAL codec: the conformance logs the real SQLite wrote, its checksum, where a log ends
(an earlier generation's frames) and where it is damaged, hostile headers, the writer and the
demo database checked by the real SQLite, fsck's report and repair through the CLI."""
from __future__ import annotations

import os
import random
import shutil
import sqlite3
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codec_helpers import (FAST, assert_columns_equal_read, assert_expected_records,
                           columns_in_batches, corpus_files, flip_bits, read_all,
                           read_corpus_file, reads_back, same_error, truncations)
from journalfs.formats import CODECS, FormatError, detect, record_to_json
from journalfs.formats.sqlite_wal import FRAME_HEADER, HEADER, _weights, checksum, read_header
from journalfs.spark.testing import spark  # noqa: F401  (the session-wide fixture)
from test_codec_columns import assert_batches_equal_read, assert_same_as_read, mutate
from test_records_cli import run_cli

WAL = CODECS["sqlite-wal"]
#: The damaged conformance logs: where reading stops, and why.
DAMAGE = {"torn.db-wal": (3248, "truncated"), "flip.db-wal": (4320, "checksum mismatch"),
          "salt.db-wal": (2720, "salts"), "header.db-wal": (24, "header checksum")}


def header_of(buf: bytes) -> dict:
    hdr = read_header(buf, "x")
    return {"page_size": hdr.page_size, "salt1": hdr.salt1, "salt2": hdr.salt2,
            "checkpoint": hdr.checkpoint, "big_endian": hdr.big_endian}


def live_log(tmp_path, transactions: int = 3, rows: int = 5, page_size: int = 1024):
    """A database the real SQLite writes now (WAL mode, no automatic checkpoint): (database
    bytes, log bytes) copied while it is open, and its rows."""
    db = tmp_path / "live.db"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute(f"pragma page_size={page_size}")
    con.execute("pragma journal_mode=wal")
    con.execute("pragma wal_autocheckpoint=0")
    con.execute("create table t(id integer primary key, v text)")
    for n in range(transactions):
        con.execute("begin")
        con.executemany("insert into t(v) values (?)", [(f"{n}-{i} " * 20,) for i in range(rows)])
        con.execute("commit")
    out = db.read_bytes(), (tmp_path / "live.db-wal").read_bytes(), con.execute(
        "select * from t").fetchall()
    con.close()
    return out


def sqlite_reads(tmp_path, database: bytes, log: bytes, query: str) -> tuple[int, list]:
    """(frames SQLite takes from ``log``, the query's rows) with the real SQLite."""
    where = tmp_path / "check"
    where.mkdir(exist_ok=True)
    (where / "c.db").write_bytes(database)
    (where / "c.db-wal").write_bytes(log)
    con = sqlite3.connect(where / "c.db")
    try:
        rows = con.execute(query).fetchall()
        frames = con.execute("pragma wal_checkpoint(PASSIVE)").fetchone()[1]
    finally:
        con.close()
    return frames, rows


# -- conformance -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wal_files(records_expected) -> dict[str, dict]:
    files = corpus_files(records_expected, ("sqlite-wal",))
    assert len(files) == 9
    return files


def test_conformance_logs(wal_files, records_corpus):
    for name, expected in wal_files.items():
        codec, buf, recs, error = read_corpus_file(records_corpus, name, expected)
        assert_expected_records(recs, error, expected, name)
        assert_columns_equal_read(codec, buf, recs, error, name)
        for batch in (1, 2, 3, 7):
            got, got_error = columns_in_batches(codec, buf, batch, name)
            assert got == recs and (got_error is None) == (error is None), (name, batch)
        if name in DAMAGE:
            offset, words = DAMAGE[name]
            assert error.offset == offset and words in error.reason, error
            assert name in str(error) and f"byte {offset}" in str(error)
        else:
            assert error is None, error


def test_resume_at_every_frame(wal_files, records_corpus):
    for name in wal_files:
        buf = (records_corpus / name).read_bytes()
        recs, _error = read_all(WAL, buf, name)
        for i, rec in enumerate(recs):
            assert read_all(WAL, buf, name, start=rec["offset"], seq=i)[0] == recs[i:]
            assert [r["offset"] for r in WAL.read(buf, name, stop=rec["offset"])] == \
                [r["offset"] for r in recs[:i]]


def test_writer_gives_sqlites_own_bytes(wal_files, records_corpus):
    """Re-encoding a log SQLite wrote (its records, its header's salts) gives its bytes: the
    checksums are SQLite's, in both byte orders."""
    for name in ("sqlite0.db-wal", "sqlite3.db-wal", "bigend.db-wal", "sqlite1.db-wal"):
        buf = (records_corpus / name).read_bytes()
        reads_back(WAL, buf, **header_of(buf))


def test_earlier_generation_ends_the_log_quietly(records_corpus):
    """After a checkpoint SQLite starts the log over under new salts: the old frames after
    the new ones are not records and not damage (SQLite took 1 frame, as the generator saw)."""
    buf = (records_corpus / "sqlite2.db-wal").read_bytes()
    recs, error = read_all(WAL, buf)
    assert error is None and len(recs) == 1 and recs[0]["kind"] == "commit"
    stale = struct.unpack_from(">II", buf, HEADER + len(recs) * (FRAME_HEADER + 512) + 8)
    assert stale != (recs[0]["salt1"], recs[0]["salt2"])
    assert WAL.validate(buf, "x") == [] and WAL.repair(buf, "x") is None


def test_uncommitted_frames_are_records_and_a_warning(records_corpus):
    buf = (records_corpus / "sqlite1.db-wal").read_bytes()
    recs, error = read_all(WAL, buf)
    last_commit = max(i for i, r in enumerate(recs) if r["kind"] == "commit")
    assert error is None and len(recs) - last_commit - 1 == 10
    (finding,) = WAL.validate(buf, "x")
    assert finding.severity == "warning" and finding.offset == recs[last_commit + 1]["offset"]
    assert "10 frame(s)" in finding.reason and WAL.repair(buf, "x") is None


# -- the checksum ---------------------------------------------------------------------------------

@FAST
@given(st.sampled_from([512, 1024, 4096]), st.booleans(), st.integers(1, 5), st.data())
def test_vectorised_checksum_is_sqlites_loop(page_size, big, frames, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    raw = rng.integers(0, 256, (frames, 8 + page_size), dtype=np.uint8)
    seeds = rng.integers(0, 2**32, (frames, 2), dtype=np.uint64)
    order = ">u4" if big else "<u4"
    got = _weights(page_size).frames(seeds, raw[:, :8].copy().view(order),
                                     raw[:, 8:].copy().view(order))
    for i in range(frames):
        assert tuple(got[i]) == checksum(raw[i].tobytes(), big, *map(int, seeds[i]))


# -- columns, batches, resumption: exactly what read gives -----------------------------------------

wal_logs = st.builds(
    lambda frames, page_size, big, salts: WAL.write(
        [{"page": p, "db_size": d, "payload": body} for p, d, body in frames],
        page_size=page_size, big_endian=big, salt1=salts[0], salt2=salts[1]),
    st.lists(st.tuples(st.integers(1, 2**32 - 1), st.sampled_from([0, 0, 1, 7, 2**32 - 1]),
                       st.binary(max_size=64)), max_size=12),
    st.sampled_from([512, 1024]), st.booleans(),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))


@FAST
@given(data=st.data())
def test_columns_and_batches_are_exactly_read(data):
    buf = data.draw(wal_logs)
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    assert_same_as_read(WAL, buf)
    assert_same_as_read(WAL, memoryview(buf))
    assert_batches_equal_read(WAL, buf, data.draw(st.integers(1, 5)))
    records, _error = read_all(WAL, buf)
    if records:
        rec = data.draw(st.sampled_from(records))
        stop = data.draw(st.one_of(st.none(), st.sampled_from([r["offset"] for r in records])))
        limit = data.draw(st.one_of(st.none(), st.integers(0, 6)))
        assert_same_as_read(WAL, buf, rec["offset"], rec["seq"], stop, limit)
        cols = WAL.read_columns(buf, "f", rec["offset"], rec["seq"], stop, limit)
        offsets, next_offset, error = WAL.record_offsets(buf, "f", rec["offset"], rec["seq"],
                                                         stop, limit)
        assert list(offsets) == list(cols.data["offset"]) and next_offset == cols.next_offset
        assert same_error(error, cols.error)


# -- hostile input ----------------------------------------------------------------------------------

def test_every_truncation_reads_as_a_prefix(records_corpus):
    buf = (records_corpus / "sqlite0.db-wal").read_bytes()
    frame = FRAME_HEADER + 512
    for cut, full, recs, error in truncations(WAL, buf):
        whole = max(0, (cut - HEADER) // frame)
        if cut < HEADER:
            assert error is not None and error.offset == 0 and not recs
        else:
            assert len(recs) == whole and (error is None) == ((cut - HEADER) % frame == 0)


@FAST
@given(data=st.data())
def test_flipped_bits_never_add_or_change_a_record(records_corpus, data):
    name = data.draw(st.sampled_from(["sqlite0.db-wal", "sqlite2.db-wal", "bigend.db-wal"]))
    buf = (records_corpus / name).read_bytes()
    full = read_all(WAL, buf)[0]
    bad = flip_bits(data, buf, 3)
    recs, error = read_all(WAL, bad, "flipped")
    assert recs == full[:len(recs)]
    assert error is None or (error.source == "flipped" and 0 <= error.offset < len(bad))
    assert_columns_equal_read(WAL, bad, recs, error, "flipped")


@pytest.mark.parametrize("change, offset, words", [
    (lambda b: b[:20], 0, "header truncated"),
    (lambda b: b[:4] + struct.pack(">I", 3007001) + b[8:], 4, "version"),
    (lambda b: b[:8] + struct.pack(">I", 1 << 30) + b[12:], 8, "page size"),
    (lambda b: b[:8] + struct.pack(">I", 1000) + b[12:], 8, "page size"),
    (lambda b: b[:8] + struct.pack(">I", 256) + b[12:], 8, "page size"),
])
def test_hostile_header_is_one_clear_error(records_corpus, change, offset, words):
    buf = change((records_corpus / "sqlite0.db-wal").read_bytes())
    recs, error = read_all(WAL, buf, "h")
    assert not recs and error.offset == offset and words in error.reason
    assert WAL.read_columns(buf, "h").error.offset == offset


def test_huge_page_size_claim_allocates_nothing(records_corpus):
    """A header that claims 64 KiB pages over a small file: one torn frame (its salts are the
    header's), no big buffer; the same bytes under other salts are an earlier generation's."""
    import tracemalloc
    head = WAL.write([], page_size=65536, salt1=5, salt2=6)
    assert read_all(WAL, head + bytes(1000))[1] is None
    buf = head + struct.pack(">6I", 1, 1, 5, 6, 0, 0) + bytes(1000)
    tracemalloc.start()
    try:
        recs, error = read_all(WAL, buf, "big")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not recs and error.offset == HEADER and "truncated" in error.reason
    assert peak < 1 << 20


def test_start_must_be_a_frame_boundary(records_corpus):
    buf = (records_corpus / "sqlite0.db-wal").read_bytes()
    with pytest.raises(FormatError, match="not a frame boundary"):
        list(WAL.read(buf, "x", start=HEADER + 3))
    assert WAL.read_columns(buf, "x", start=HEADER + 3).error.offset == HEADER + 3


def test_sniffing_takes_logs_only():
    assert WAL.sniff(WAL.write([])[:64]) and WAL.sniff(WAL.write([], big_endian=True)[:64])
    assert detect(b"SQLite format 3\0" + bytes(48)) is None  # the database itself
    assert not WAL.sniff(b"\x37\x7f\x06\x82" + b"text")
    assert WAL.file_key("shop.db-wal") == "shop.db" and WAL.file_key("shop.db") is None


# -- the real SQLite reads what the codec writes, and the codec reads what SQLite writes now -----------

def test_live_sqlite_log_and_rewritten_log(tmp_path):
    database, log, rows = live_log(tmp_path)
    recs, error = read_all(WAL, log, "live")
    assert error is None and recs[-1]["kind"] == "commit"
    assert sqlite_reads(tmp_path, database, log, "select * from t") == (len(recs), rows)
    # the same frames under other salts and the other byte order: SQLite takes them all
    other = WAL.write(recs, page_size=1024, salt1=7, salt2=9, big_endian=True)
    assert sqlite_reads(tmp_path, database, other, "select * from t") == (len(recs), rows)
    # and a log cut after the first transaction's commit holds only that one
    first = next(i for i, r in enumerate(recs) if r["kind"] == "commit" and r["page"] == 2)
    short = log[:recs[first]["offset"] + FRAME_HEADER + 1024]
    frames, got = sqlite_reads(tmp_path, database, short, "select count(*) from t")
    assert frames == first + 1 and got == [(0,)]


def test_sample_frames_are_a_log_sqlite_takes_whole():
    from journalfs.formats.sqlite_wal import sample_frames
    for count in (1, 2, 7, 200):
        frames = sample_frames(random.Random(count), count)
        assert len(frames) == count and frames[-1]["db_size"] > 0
        recs, error = read_all(WAL, WAL.write(frames, page_size=1024))
        assert error is None and [(r["page"], r["db_size"]) for r in recs] == \
            [(f["page"], f["db_size"]) for f in frames]
        assert WAL.validate(WAL.write(frames, page_size=1024), "x") == []


def test_demo_database_is_one_sqlite_reads(tmp_path):
    files = WAL.demo_files(random.Random(1))
    assert WAL.demo_files(random.Random(1)) == files  # the same on every run
    (database, log), = [(files[n], files[n + "-wal"]) for n in files if not n.endswith("-wal")]
    recs, error = read_all(WAL, log, "demo")
    assert error is None and WAL.validate(log, "demo") == []
    assert {r["kind"] for r in recs} == {"page", "commit"}
    frames, check = sqlite_reads(tmp_path, database, log, "pragma integrity_check")
    assert frames == len(recs) and check == [("ok",)]
    _frames, orders = sqlite_reads(tmp_path, database, log,
                                   "select count(*), count(distinct customer) from orders")
    assert orders[0][0] >= 9


# -- fsck ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["torn.db-wal", "flip.db-wal", "salt.db-wal"])
def test_fsck_reports_then_repairs_keeping_every_valid_frame(name, tmp_path, records_corpus):
    path = tmp_path / name
    shutil.copy(records_corpus / name, path)
    damaged = path.read_bytes()
    before, _error = read_all(WAL, damaged)
    proc = run_cli("fsck", str(path))
    assert proc.returncode == 3 and "DAMAGED" in proc.stdout
    assert f"byte {DAMAGE[name][0]}" in proc.stdout, proc.stdout
    proc = run_cli("fsck", str(path), "--repair")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after, error = read_all(WAL, path.read_bytes())
    assert error is None and after[:len(before)] == before
    if name == "salt.db-wal":  # the salts set back: every frame of the log again
        assert [record_to_json(r) for r in after] == \
            [record_to_json(r) for r in read_all(WAL, (records_corpus / "sqlite0.db-wal").read_bytes())[0]]
    assert run_cli("fsck", str(path)).returncode == 0


def test_fsck_leaves_a_damaged_header_alone(tmp_path, records_corpus):
    path = tmp_path / "header.db-wal"
    shutil.copy(records_corpus / "header.db-wal", path)
    before = path.read_bytes()
    proc = run_cli("fsck", str(path), "--repair")
    assert proc.returncode == 3 and "byte 24" in proc.stdout
    assert path.read_bytes() == before


# -- the views, on a real mount ------------------------------------------------------------------

def _cli_json(path) -> bytes:
    proc = run_cli("records", str(path), "--json")
    assert proc.returncode in (0, 3), proc.stderr
    return proc.stdout.encode()


@pytest.mark.fuse
def test_views_show_every_frame_as_its_page(tmp_path, records_corpus):
    """``ls`` lists a log's frames by kind, ``cat`` gives each frame's page, records.jsonl is
    ``journalfs records --json``; a live SQLite writing beside the mount is seen growing; a
    damaged log shows its valid frames and its damage."""
    from journalfs import demo
    from mountutil import mounted
    src = tmp_path / "src"
    demo_files = WAL.demo_files(random.Random(demo.SEED))
    for rel, data in demo_files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    shutil.copy(records_corpus / "flip.db-wal", src / "flip.db-wal")
    db = src / "live.db"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("pragma journal_mode=wal")
    con.execute("pragma wal_autocheckpoint=0")
    con.execute("create table t(id integer primary key, v text)")
    try:
        with mounted(src, tmp_path / "mnt", "--store", str(tmp_path / "store")) as m:
            views = m.mountpoint / ".journalfs" / "records"
            log = src / "sqlite" / "shop.db-wal"
            recs = read_all(WAL, log.read_bytes())[0]
            view = views / "sqlite" / "shop.db-wal"
            names = [f"{r['seq']:08d}.{r['kind']}" for r in recs]
            ls = subprocess_out(["ls", str(view)]).split()
            assert ls == sorted(names + ["records.jsonl"])
            for rec, name in zip(recs, names):
                assert subprocess_out(["cat", str(view / name)], text=False) == rec["payload"]
                assert os.getxattr(view / name, "user.record.page") == str(rec["page"]).encode()
            assert (view / "records.jsonl").read_bytes() == _cli_json(log)
            assert "shop.db" not in os.listdir(views / "sqlite")  # the database is no journal
            # a damaged log: its valid frames, and the damage by byte
            flip = views / "flip.db-wal"
            assert len(os.listdir(flip)) == 8 + 1
            assert os.getxattr(flip, "user.journal.damage").decode().startswith("4320: ")
            # the real SQLite goes on writing: the view follows
            live = views / "live.db-wal"
            frames_before = len(os.listdir(live)) - 1
            con.execute("insert into t(v) values ('one more')")
            after = read_all(WAL, (src / "live.db-wal").read_bytes())[0]
            assert len(after) > frames_before and after[-1]["kind"] == "commit"
            assert sorted(os.listdir(live)) == sorted(
                [f"{r['seq']:08d}.{r['kind']}" for r in after] + ["records.jsonl"])
            assert (live / "records.jsonl").read_bytes() == _cli_json(src / "live.db-wal")
            assert "Traceback" not in m.stderr()
    finally:
        con.close()


def subprocess_out(argv: list[str], text: bool = True):
    import subprocess
    return subprocess.run(argv, capture_output=True, check=True, text=text).stdout


# -- the pipeline -----------------------------------------------------------------------------------

@pytest.mark.spark
def test_pipeline_rows_are_the_frames(spark, tmp_path, records_corpus):
    """One row per frame in the records table: key = the database, id = the page, payload = the
    page; a damaged log is one row of the damage table with its byte offset."""
    import pyarrow.parquet as pq
    from journalfs.spark.pipeline import run
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(records_corpus / "sqlite0.db-wal", src / "shop.db-wal")
    shutil.copy(records_corpus / "torn.db-wal", src / "torn.db-wal")
    summary = run(spark, str(src), str(tmp_path / "out"))
    rows = pq.read_table(tmp_path / "out" / "records").to_pylist()
    want = read_all(WAL, (src / "shop.db-wal").read_bytes())[0] + \
        read_all(WAL, (src / "torn.db-wal").read_bytes())[0]
    got = sorted(rows, key=lambda r: (r["source"], r["seq"]))
    assert [(r["key"], r["id"], r["kind"], r["offset"], bytes(r["payload"])) for r in got] == \
        [(k, w["page"], w["kind"], w["offset"], w["payload"]) for k, w in
         zip(["shop.db"] * 11 + ["torn.db"] * 6, want)]
    assert all(r["format"] == "sqlite-wal" and r["time"] is None for r in rows)
    assert dict(got[1]["attrs"])["db_size"] == "2"
    (damage,) = pq.read_table(tmp_path / "out" / "_damage").to_pylist()
    assert damage["offset"] == 3248 and summary.damaged_files == 1
