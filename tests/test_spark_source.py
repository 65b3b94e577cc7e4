"""The `journal` Spark data source against the codecs, on a real local Spark."""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from journalfs.formats import CODECS, FormatError
from journalfs.formats import kestrel
from journalfs.formats.akka import AkkaData
from journalfs.journals import read_file
from journalfs.formats.kestrel import queue_name as kestrel_queue
from journalfs.spark.convert import attrs_of, to_batch
from journalfs.spark.plan import list_journals, plan
from codec_helpers import file_records
from journalfs.spark.testing import spark  # noqa: F401  (the session-wide fixture)

pytestmark = pytest.mark.spark


def load(spark, path, **options):
    reader = spark.read.format("journal").option("checkpointCache", "")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(str(path))


def rows_by_source(df) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in df.orderBy("source", "seq").collect():
        out.setdefault(r["source"], []).append(r)
    return out



def assert_same_records(rows, records):
    """Rows equal the codec's records: seq/offset/kind/payload/attrs (+ the mapped columns)."""
    assert [r["seq"] for r in rows] == [rec["seq"] for rec in records]
    for row, rec in zip(rows, records):
        assert (row["format"], row["offset"], row["kind"]) == (rec["format"], rec["offset"], rec["kind"])
        payload = rec.get("payload")
        if "payload_b64" in rec:
            payload = base64.b64decode(rec["payload_b64"]) if rec["payload_b64"] is not None else None
        assert row["payload"] == payload
        assert _op_names(dict(row["attrs"])) == _op_names(attrs_of(rec))


def _op_names(attrs: dict) -> dict:
    """expected.json lists JRNL ops by name only; the codecs give the full op objects."""
    if "ops" in attrs:
        ops = json.loads(attrs["ops"])
        attrs = dict(attrs, ops=[op["op"] if isinstance(op, dict) else op for op in ops])
    return attrs


# -- the conformance corpus ---------------------------------------------------------------

def test_every_conformance_file_has_the_cli_records(spark, records_corpus, records_expected):
    df = load(spark, records_corpus)
    assert df.schema.simpleString() == (
        "struct<source:string,format:string,seq:bigint,offset:bigint,kind:string,time:timestamp,"
        "key:string,id:bigint,payload:binary,attrs:map<string,string>>")
    got = rows_by_source(df)
    for name, expected in records_expected.items():
        rows = got.pop(str(records_corpus / name), [])
        assert len(rows) == len(expected["records"]), f"{name}: {len(rows)} rows in the DataFrame"
        if not rows:  # no valid record (a bare header, damage at once): no rows, as in the CLI
            continue
        assert {r["format"] for r in rows} == {expected["format"]}
        assert_same_records(rows, expected["records"])
    assert not got, f"rows for files not in expected.json: {sorted(got)}"


def test_columns_time_key_id_follow_each_format(spark, records_corpus, records_expected):
    rows = rows_by_source(load(spark, records_corpus))
    writer = rows[str(records_corpus / "jobs.1700000000000")]
    first = records_expected["jobs.1700000000000"]["records"][0]
    assert writer[0]["key"] == "jobs" and writer[0]["id"] == first["id"]
    assert writer[0]["time"].timestamp() * 1000 == pytest.approx(first["add_time"])
    reader = rows[str(records_corpus / "jobs.read.indexer")]
    assert reader[0]["key"] == "jobs" and reader[0]["id"] == 1036850598261 and reader[0]["time"] is None
    meta = rows[str(records_corpus / "akka0/meta")]
    assert meta[0]["key"] == "użytkownik-0"
    # every akka message is keyed by the persistence id whose chain reaches it
    for d in ("akka0", "akka1", "akka2"):
        metas = file_records(records_corpus / d / "meta")
        heads = {m["first"]: m["persistence_id"] for m in metas}
        msgs = rows[str(records_corpus / d / "data")]
        seq_nrs = {rec["self"]: rec["seq_nr"] for rec in file_records(records_corpus / d / "data")}
        by_self = {int(r["attrs"]["self"]): r for r in msgs}
        reached = 0
        for first, pid in heads.items():
            link = first
            while link:
                assert by_self[link]["key"] == pid and by_self[link]["id"] == seq_nrs[link]
                link, reached = int(by_self[link]["attrs"]["next"]), reached + 1
        assert reached == sum(1 for r in msgs if r["key"] is not None) > 0
    wal = rows[str(records_corpus / "wal0.log")]
    assert [r["id"] for r in wal] == [r["seq"] for r in wal]
    ns = records_expected["wal0.log"]["records"][0]["time"]
    assert wal[0]["attrs"]["time"] == str(ns)
    assert int(wal[0]["time"].timestamp() * 1_000_000) == pytest.approx(ns // 1000, abs=1)


def test_gvfs_tree_and_journal_rows(spark, gvfs_snapshots):
    store = gvfs_snapshots[-1] / "gvfs-metadata"
    got = rows_by_source(load(spark, store))
    assert len(got) == 2
    for source, rows in got.items():
        records = file_records(source)
        assert_same_records(rows, records)
        assert [r["key"] for r in rows] == [rec["path"] for rec in records]


# -- options and push-down ----------------------------------------------------------------

def test_formats_option_glob_and_pushdown(spark, records_corpus, records_expected):
    only = load(spark, records_corpus, formats="jrnl,wallaby-index")
    assert {r["format"] for r in only.select("format").distinct().collect()} == {"jrnl", "wallaby-index"}
    globbed = load(spark, records_corpus, pathGlobFilter="*.jrnl")
    assert globbed.count() == sum(len(v["records"]) for k, v in records_expected.items() if k.endswith(".jrnl"))
    flat = load(spark, records_corpus, recursive="false")
    assert not any("/akka" in r["source"] for r in flat.select("source").distinct().collect())
    df = load(spark, records_corpus)
    pushed = df.where("format = 'kestrel-reader' and kind in ('read_done')").collect()
    expected = [rec for k, v in records_expected.items() for rec in v["records"] if rec["kind"] == "read_done"]
    assert sorted((r["offset"], r["attrs"]["ids"]) for r in pushed) == sorted(
        (rec["offset"], json.dumps(rec["ids"])) for rec in expected)
    source = str(records_corpus / "db1.jrnl")
    assert df.where(df.source == source).count() == len(records_expected["db1.jrnl"]["records"])


def test_a_frame_scanned_twice_in_one_plan_reads_each_scan_whole(spark, records_corpus):
    """Two filtered scans of one DataFrame in one plan (a union; the persistence table's
    self-join and join with the meta rows) each see their own rows. Spark plans a Python
    data source's reader once per relation, so filters pushed by one scan used to prune the
    others: ``derived.persistence`` of a loaded frame gave null highest_seq and repeated ids
    where the pipeline (reading Parquet) was right. Held to the same tables computed from
    the same rows in memory (no data source)."""
    from journalfs.spark import derived
    df = load(spark, records_corpus)
    rows = df.collect()
    union = df.where("format = 'akka-meta'").unionByName(df.where("format = 'jrnl'"))
    counts = {r["format"]: r["count"] for r in union.groupBy("format").count().collect()}
    assert counts == {f: sum(1 for r in rows if r["format"] == f) for f in ("akka-meta", "jrnl")}
    in_memory = spark.createDataFrame(rows, df.schema)
    for table in (derived.persistence, derived.queues, derived.transactions):
        got = sorted(map(tuple, table(df).collect()))
        assert got == sorted(map(tuple, table(in_memory).collect())), table.__name__
    persistence = derived.persistence(df).collect()
    assert persistence and all(r["highest_seq"] is not None for r in persistence)
    assert len({r["persistence_id"] for r in persistence}) == len(persistence)


# -- big files are split across tasks -------------------------------------------------------

@pytest.fixture(scope="module")
def big_journals(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    payloads = [bytes([n % 251]) * (n % 700) for n in range(9000)]
    (d / "big.1").write_bytes(kestrel.build_writer_file(payloads, first_id=1, add_time=1_700_000_000_000))
    messages = [(f"pid-{n % 7}", n // 7 + 1, bytes(n % 300)) for n in range(12000)]
    data, meta = AkkaData.build(messages)
    (d / "akka").mkdir()
    (d / "akka" / "data").write_bytes(data)
    (d / "akka" / "meta").write_bytes(meta)
    index = CODECS["wallaby-index"].write(
        [{"time": 10**18 + n, "index": n, "log_offset": 16 + n} for n in range(60000)])
    (d / "w.log.idx").write_bytes(index)
    return d


def test_big_files_split_into_exact_slices(spark, big_journals):
    files = list_journals(str(big_journals))
    groups = plan(files, parallelism=2, max_split=1 << 20).groups
    split = {}
    for g in groups:
        for s in g:
            split.setdefault(s.path, []).append(s)
    assert all(len(split[f.path]) >= 2 for f in files if f.size > (1 << 20) + 100_000), split.keys()
    df = load(spark, big_journals, maxSplitBytes=1 << 20)
    assert df.rdd.getNumPartitions() >= 4
    got = rows_by_source(df)
    for f in files:
        records = file_records(f.path)
        rows = got[f.path]
        assert [(r["seq"], r["offset"], r["kind"]) for r in rows] == \
            [(rec["seq"], rec["offset"], rec["kind"]) for rec in records]
        if f.format == "akka-data":
            assert {r["key"] for r in rows} == {f"pid-{n}" for n in range(7)}
            by_pid: dict[str, list[int]] = {}
            for r in rows:
                by_pid.setdefault(r["key"], []).append(r["id"])
            assert all(ids == list(range(1, len(ids) + 1)) for ids in by_pid.values())


def test_split_points_come_from_the_shared_record_index(tmp_path, monkeypatch):
    """The planner's split points come from the record index the CLI and the views use
    (one file per journal in ``CACHE/indexes``): reused as is, extended when the journal
    grew, and a hostile index file changes nothing but the time it takes."""
    from journalfs.fs.indexfiles import IndexCache, IndexDir
    from journalfs.spark import checkpoints
    path = tmp_path / "q.1"
    path.write_bytes(kestrel.build_writer_file([b"x" * 100] * 40_000))  # > SAVE_INDEX_BYTES
    cache = tmp_path / "cache"
    first = checkpoints.checkpoints(str(path), "kestrel-writer", 400_000, str(cache))
    assert len(first) > 5 and first[0] == (4, 0)
    records = file_records(path)
    by_offset = {rec["offset"]: rec["seq"] for rec in records}
    assert all(by_offset[off] == seq for off, seq in first)
    st = path.stat()
    saved = cache / "indexes" / IndexDir.name_of(st.st_dev, st.st_ino)
    assert saved.is_file()
    # the CLI's cache loads that very file: no re-indexing
    from journalfs.journals import RecordIndex
    with monkeypatch.context() as m:
        m.setattr(RecordIndex, "build", classmethod(lambda *a, **k: pytest.fail("re-indexed")))
        cli = IndexCache(str(cache))
        index = cli.index(str(path), CODECS["kestrel-writer"])
        cli.close()
        assert checkpoints.checkpoints(str(path), "kestrel-writer", 400_000, str(cache)) == first
    assert index.count == len(records)
    with open(path, "ab") as f:  # the journal grows: indexing resumes
        f.write(b"".join(kestrel.encode_put(40_001 + n, b"y" * 100) for n in range(20_000)))
    grown = checkpoints.checkpoints(str(path), "kestrel-writer", 400_000, str(cache))
    by_offset = {rec["offset"]: rec["seq"] for rec in file_records(path)}
    assert len(grown) > len(first) and all(by_offset[off] == seq for off, seq in grown)
    assert checkpoints.checkpoints(str(path), "kestrel-writer", 400_000, str(cache)) == grown
    good = saved.read_bytes()
    header_end = good.index(b"\n", 8)
    header = json.loads(good[8:header_end])
    lies = [b"garbage", good[:len(good) // 2],
            good[:8] + json.dumps(dict(header, count=10**12)).encode() + good[header_end:],
            good[:header_end + 1] + bytes(len(good) - header_end - 1)]  # offsets all zero
    for hostile in lies:
        saved.chmod(0o600)
        saved.write_bytes(hostile)
        assert checkpoints.checkpoints(str(path), "kestrel-writer", 400_000, str(cache)) == grown


# -- damage ---------------------------------------------------------------------------------

def test_damaged_files_keep_their_prefix_and_never_fail_the_job(spark, tmp_path, records_corpus):
    good = (records_corpus / "wal0.log").read_bytes()
    (tmp_path / "cut.log").write_bytes(good[:len(good) // 2])
    flipped = bytearray((records_corpus / "akka0" / "data").read_bytes())
    flipped[300] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    (tmp_path / "garbage.1").write_bytes(b"\x27\x64\x26\x03" + os.urandom(5000))
    (tmp_path / "liar.1").write_bytes(b"\x27\x64\x26\x03\x86\xff\xff\xff\x7f" + bytes(40))
    shutil.copy(records_corpus / "torn.1800000000000", tmp_path)
    df = load(spark, tmp_path, includeDamage="true")
    got = rows_by_source(df)
    damaged = {s for s, rows in got.items() if any(r["kind"] == "_damage" for r in rows)}
    for source, rows in got.items():
        records = file_records(source)
        assert_same_records([r for r in rows if r["kind"] != "_damage"], records)
        try:
            list(read_file(source))
        except FormatError as exc:
            assert source in damaged
            (dmg,) = [r for r in rows if r["kind"] == "_damage"]
            assert dmg["offset"] == exc.offset and dmg["attrs"]["reason"] == exc.reason
    assert str(tmp_path / "torn.1800000000000") in damaged
    assert str(tmp_path / "cut.log") in damaged
    assert load(spark, tmp_path).where("kind = '_damage'").count() == 0  # off by default


# -- never silently empty --------------------------------------------------------------------

def test_load_is_never_silently_empty(spark, tmp_path, records_corpus):
    """A wrong path, an unsupported or mistyped URI scheme and an input holding no journal
    raise (they used to give 0 rows); a filter that matches nothing is still just empty."""
    import re
    (tmp_path / "readme.txt").write_text("not a journal")
    for path, words in ((tmp_path / "nope", f"{tmp_path / 'nope'}: no such file or directory"),
                        (f"file://{tmp_path}/nope", f"file://{tmp_path}/nope: no such file"),
                        ("hdfs://127.0.0.1:9/x", "hdfs://127.0.0.1:9/x: unsupported URI scheme 'hdfs'"),
                        ("s3c://bucket/k", "unsupported URI scheme 's3c'"),
                        (tmp_path, f"{tmp_path}: no journal found (1 files looked at")):
        with pytest.raises(Exception, match=re.escape(words)):
            load(spark, path).count()
    assert load(spark, f"file://{records_corpus}").count() == load(spark, records_corpus).count()
    assert load(spark, records_corpus, formats="no-such-format").count() == 0


def test_listing_names_what_it_could_not_read(tmp_path, monkeypatch):
    """Files and directories that cannot be read are collected (the pipeline names them),
    not silently skipped; non-regular files are no journals and no error."""
    import errno
    from journalfs.spark import plan as plan_module
    (tmp_path / "q.1").write_bytes(kestrel.build_writer_file([b"a"]))
    (tmp_path / "secret.1").write_bytes(kestrel.build_writer_file([b"b"]))
    os.mkfifo(tmp_path / "fifo")
    real = plan_module.open_path

    def open_path(path, follow=True):
        if path.endswith("secret.1"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, follow)
    monkeypatch.setattr(plan_module, "open_path", open_path)
    unreadable: list = []
    files = list_journals(str(tmp_path), unreadable=unreadable)
    assert [f.path for f in files] == [str(tmp_path / "q.1")]
    assert unreadable == [(str(tmp_path / "secret.1"), "Permission denied")]


def test_a_slice_its_executor_cannot_open_fails_the_task(tmp_path, records_corpus):
    """Not a damage row per slice: the task fails (Spark retries it, then fails the job;
    tests/test_spark_cluster.py shows it on a cluster whose worker cannot see the files)."""
    from journalfs.spark.plan import FileSlice
    from journalfs.spark.read import UnreadableSlice
    from journalfs.spark.source import JournalPartition, JournalReader
    reader = JournalReader({"path": str(records_corpus), "includeDamage": "true"})
    good = FileSlice(str(records_corpus / "db0.jrnl"), "jrnl")
    gone = FileSlice(str(tmp_path / "gone.jrnl"), "jrnl")
    with pytest.raises(UnreadableSlice, match=f"cannot read {tmp_path / 'gone.jrnl'} on .*: "
                       "No such file or directory; every executor must see the input"):
        list(reader.read(JournalPartition([good, gone])))


# -- columnar conversion (no Spark needed) --------------------------------------------------

field_values = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.text(max_size=8), st.booleans(),
                         st.lists(st.text(max_size=4), max_size=3),
                         st.lists(st.integers(-2**63, 2**63 - 1), max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({"mtime": st.integers(0, 2**40), "path": st.text(min_size=1, max_size=6),
                                       "key": st.one_of(st.none(), st.text(max_size=5)),
                                       "value": field_values}), max_size=20))
def test_to_batch_attrs_equal_row_wise_conversion(records):
    # a column of integer lists alone (Kestrel's READ_DONE ids) takes the Arrow path
    ids = [r["value"] if isinstance(r["value"], list) and all(isinstance(i, int) for i in r["value"])
           else None for r in records]
    assert list(to_batch({"seq": list(range(len(ids))), "offset": [0] * len(ids), "kind": ["x"] * len(ids),
                          "ids": ids}, len(ids), "/s", "kestrel-reader").column("attrs").to_pylist()) \
        == [[("ids", json.dumps(v))] if v is not None else [] for v in ids]
    rows = [dict(r, format="gvfs-journal", seq=i, offset=20 + i, kind="set") for i, r in enumerate(records)]
    data = {k: [r[k] for r in rows] for k in ("seq", "offset", "kind", "mtime", "path", "key", "value")}
    batch = to_batch(data, len(rows), "/s", "gvfs-journal")
    out = batch.to_pylist()
    assert [dict(o["attrs"]) for o in out] == [attrs_of(r) for r in rows]
    assert [o["key"] for o in out] == [r["path"] for r in rows]


def test_kestrel_queue_names():
    assert kestrel_queue("/d/jobs.1700000000000") == "jobs"
    assert kestrel_queue("/d/jobs.read.") == "jobs"
    assert kestrel_queue("/d/jobs.read.indexer") == "jobs"
    assert kestrel_queue("/d/jobs.read.x~~123") is None
    assert kestrel_queue("/d/notaqueue") is None


def test_hostile_times_become_null_and_payload_views_are_copied():
    import numpy as np
    buf = b"hello world"
    data = {"seq": np.array([0, 1, 2]), "offset": np.array([4, 9, 14]), "kind": ["put"] * 3,
            "id": np.array([1, 2, 3]), "add_time": np.array([2**62, -2**62, 1_700_000_000_000]),
            "payload": [memoryview(buf)[0:5], memoryview(buf)[6:], memoryview(buf)[0:0]]}
    out = to_batch(data, 3, "/d/q.1", "kestrel-writer", key="q").to_pylist()
    assert [r["time"] is None for r in out] == [True, True, False]
    assert out[2]["time"].timestamp() == 1_700_000_000
    assert [r["payload"] for r in out] == [b"hello", b"world", b""]
    assert dict(out[0]["attrs"])["add_time"] == str(2**62)


# -- fast paths (no Spark needed) -----------------------------------------------------------

def _slice_rows(path: str, fmt: str, fast: bool, monkeypatch, batch_rows: int) -> list[dict]:
    """Rows read_slice gives for the whole file, with or without the codec's JSON-text fast
    path (``read_text_columns``)."""
    from journalfs.spark import read as spark_read
    from journalfs.spark.plan import FileSlice
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(type(CODECS[fmt]), "read_text_columns", lambda self, *a, **k: None)
        return [row for batch in spark_read.read_slice(FileSlice(path, fmt), True, batch_rows)
                for row in batch.to_pylist()]


@pytest.mark.parametrize("name", ["db0.jrnl", "db1.jrnl", "db2.jrnl", "db3.jrnl"])
def test_jrnl_fast_reader_equals_codec_on_conformance(records_corpus, name, monkeypatch):
    path = str(records_corpus / name)
    for batch_rows in (1, 3, 65536):
        fast = _slice_rows(path, "jrnl", True, monkeypatch, batch_rows)
        assert fast == _slice_rows(path, "jrnl", False, monkeypatch, batch_rows)
    ops = [json.loads(dict(r["attrs"])["ops"]) for r in fast if r["kind"] == "transaction"]
    assert ops and all(isinstance(op, dict) and "op" in op for tx in ops for op in tx)


@settings(max_examples=120, deadline=None)
@given(cut=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                  max_size=3), batch_rows=st.sampled_from([2, 65536]))
def test_jrnl_fast_reader_equals_codec_on_damage(tmp_path_factory, records_corpus, cut, flips, batch_rows):
    """Torn or bit-flipped journals: same valid prefix and the same damage row as the codec."""
    data = bytearray((records_corpus / "db1.jrnl").read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    del data[cut % (len(data) + 1):]
    path = tmp_path_factory.mktemp("jrnl") / "x.jrnl"
    path.write_bytes(bytes(data))
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _slice_rows(str(path), "jrnl", True, monkeypatch, batch_rows) == \
            _slice_rows(str(path), "jrnl", False, monkeypatch, batch_rows)


def test_small_batches_are_coalesced_up_to_the_batch_size():
    import pyarrow as pa
    from journalfs.spark.source import coalesce
    small = [pa.record_batch([pa.array(range(n))], names=["x"]) for n in (3, 4, 5, 20, 1)]
    out = list(coalesce(iter(small), 10))
    assert [b.num_rows for b in out] == [12, 20, 1]
    assert [v for b in out for v in b.column(0).to_pylist()] == \
        [v for b in small for v in b.column(0).to_pylist()]


def test_batches_adapt_to_record_size(tmp_path):
    """Big payloads give fewer rows per batch: a batch stays near BATCH_BYTES, whatever the rows."""
    from journalfs.spark import read as spark_read
    from journalfs.spark.plan import FileSlice
    payloads = [bytes([n % 251]) * 300_000 for n in range(400)]  # 120 MB of records
    path = tmp_path / "big.1"
    path.write_bytes(kestrel.build_writer_file(payloads, first_id=1))
    batches = list(spark_read.read_slice(FileSlice(str(path), "kestrel-writer"), False, 65536))
    assert sum(b.num_rows for b in batches) == 400
    assert len(batches) >= 3
    assert max(b.nbytes for b in batches) <= 2 * spark_read.BATCH_BYTES


@pytest.mark.timeout(120)  # the old code never finished its second batch
@pytest.mark.parametrize("damaged", [False, True])
def test_a_tree_bigger_than_a_batch_is_read_once_in_order(tmp_path, damaged):
    """A gvfs tree cannot resume mid-file: its rows come from its own stream of batches,
    each once and in order (read from a resume offset, a tree used to start again at its
    first row: the same rows over and over), then its damage."""
    from journalfs.spark import read as spark_read
    from journalfs.spark.plan import FileSlice
    from journalfs.spark.schema import DAMAGE_KIND
    tree = CODECS["gvfs-tree"]
    buf = bytearray(tree.write([{"path": f"/home/d{i // 1000}/f{i}", "mtime": 1_700_000_000 + i,
                                 "metadata": {"annotation": "x" * 40}} for i in range(60_000)]))
    if damaged:  # the last node's value points past the end
        last = max(r["offset"] for r in tree.read(bytes(buf), "t"))
        meta = int.from_bytes(buf[last + 8:last + 12], "big")
        buf[meta + 8:meta + 12] = (len(buf) + 9).to_bytes(4, "big")
    path = tmp_path / "home"
    path.write_bytes(bytes(buf))
    records = []
    try:
        records.extend(tree.read(bytes(buf), str(path)))
    except FormatError as exc:
        error = exc
    else:
        error = None
    batches = list(itertools.islice(  # bounded: a tree read again from its top never ends
        spark_read.read_slice(FileSlice(str(path), "gvfs-tree"), True, 4096), 1000))
    rows = [r for b in batches for r in b.to_pylist()]
    damage = [r for r in rows if r["kind"] == DAMAGE_KIND]
    rows = [r for r in rows if r["kind"] != DAMAGE_KIND]
    assert [(r["seq"], r["offset"], r["key"]) for r in rows] == \
        [(rec["seq"], rec["offset"], rec["path"]) for rec in records]
    assert len(batches) > 1
    assert [r["offset"] for r in damage] == ([] if error is None else [error.offset])


def test_a_late_slice_drops_the_pages_its_keys_walk_back_through(tmp_path, monkeypatch):
    """The first keys of a slice that starts far into an akka data file are found by walking
    ``prev`` links back through the file: the reader drops the file's pages as that walk
    goes (it touched most of a 150 MB journal's pages at once), with the same keys."""
    from journalfs.formats import akka
    from journalfs.spark import read as spark_read
    data, meta = AkkaData.build([("only", i + 1, b"p" * 40) for i in range(5000)])
    (tmp_path / "data").write_bytes(data)
    (tmp_path / "meta").write_bytes(meta)
    (sl,) = [s for g in plan(list_journals(str(tmp_path)), 1).groups for s in g
             if s.path.endswith("data")]
    offsets = akka.AkkaData().record_offsets(data, "data")[0]
    late = spark_read.FileSlice(sl.path, sl.format, start=int(offsets[4000]), seq=4000,
                                partners=sl.partners)
    paced = []
    monkeypatch.setattr(spark_read, "PagePacer", lambda buf: lambda: paced.append(len(buf)))
    keys = [k for b in spark_read.read_slice(late, False, 100_000)
            for k in b.column("key").to_pylist()]
    assert keys == ["only"] * 1000
    # the data file's pages (not the meta file's), once per PACE_STEPS blocks walked
    assert paced == [len(data)] * (4000 // akka.PACE_STEPS)
