"""`journalfs pipeline`: Parquet tables from journals, checked against ground truth."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from journalfs.formats import CODECS, FormatError, kestrel
from journalfs.formats.akka import AkkaData
from journalfs.journals import read_file
from journalfs.spark.pipeline import run
from codec_helpers import file_records
from journalfs.spark.testing import spark  # noqa: F401  (the session-wide fixture)

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[1]


def table(out: Path, name: str) -> list[dict]:
    return pq.read_table(out / name).to_pylist()



@pytest.fixture(scope="module")
def conformance_run(spark, tmp_path_factory, conformance_dir):
    """One pipeline run over a copy of every conformance journal (records + gvfs stores)."""
    base = tmp_path_factory.mktemp("pipe")
    src = base / "in"
    shutil.copytree(conformance_dir / "records", src / "records")
    shutil.copytree(conformance_dir / "gvfs", src / "gvfs")
    for d, _dirs, files in os.walk(src):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    summary = run(spark, str(src), str(base / "out"))
    return src, base / "out", summary


def test_metadata_equals_gvfs_ground_truth(conformance_run, gvfs_snapshots):
    src, out, _ = conformance_run
    stores: dict[str, dict] = {}
    for row in table(out, "metadata"):
        value = row["values"] if row["values"] is not None else row["value"]
        assert (row["value"] is None) != (row["values"] is None)
        stores.setdefault(row["store"], {}).setdefault(row["path"], {})[row["key"]] = value
    for snap in gvfs_snapshots:
        rel = snap.relative_to(snap.parents[2])
        store = str(src / "gvfs" / rel / "gvfs-metadata" / "home")
        expected = json.loads((snap / "expected.json").read_text())
        assert stores.pop(store, {}) == expected, store
    assert not stores


def test_metadata_replayed_by_the_driver_equals_the_dataframe_function(spark, conformance_run):
    """A few small stores are replayed by the driver from the records' Parquet (no Spark
    job); bigger ones by derived.metadata on the executors: the same rows."""
    from journalfs.spark import derived
    from journalfs.spark.pipeline import replayed_here
    from journalfs.spark.plan import list_journals
    src, out, _ = conformance_run
    assert replayed_here(list_journals(str(src)))
    expected = derived.metadata(spark.read.parquet(str(out / "records"))).collect()
    got = sorted(tuple(r.values()) for r in table(out, "metadata"))
    assert got == sorted(tuple(r) for r in expected) and len(got) > 100


def test_records_table_partitioned_by_format(conformance_run, records_expected):
    src, out, summary = conformance_run
    parts = sorted(p.name for p in (out / "records").iterdir() if p.is_dir())
    assert parts == sorted(f"format={f}" for f in CODECS)
    rows = table(out, "records")
    jobs = [r for r in rows if r["source"] == str(src / "records" / "jobs.1700000000001")]
    assert sorted(r["seq"] for r in jobs) == [r["seq"] for r in records_expected["jobs.1700000000001"]["records"]]
    assert summary.rows["records"] == len(rows)
    assert not any(r["kind"] == "_damage" for r in rows)


def test_damage_table_counts_damaged_files(conformance_run, records_expected):
    src, out, summary = conformance_run
    damage = table(out, "_damage")
    damaged = {k for k, v in records_expected.items() if v["exit"] == 3}
    assert {Path(d["path"]).relative_to(src / "records").as_posix() for d in damage} == damaged
    assert summary.damaged_files == len(damaged) == len(damage)
    for only in damage:
        with pytest.raises(FormatError) as exc:
            list(read_file(only["path"]))
        assert (only["offset"], only["reason"]) == (exc.value.offset, exc.value.reason)


def test_queues_match_queue_state_on_conformance(conformance_run):
    src, out, _ = conformance_run
    d = src / "records"
    got = {(r["queue"], r["reader"]): (r["head"], r["tail"], r["pending"]) for r in table(out, "queues")}
    writers = [(p.name, file_records(p)) for p in sorted(d.glob("jobs.1*"))]
    for reader in ("", "indexer"):
        state = kestrel.queue_state(writers, file_records(d / f"jobs.read.{reader}"))
        assert got.pop(("jobs", reader)) == (state["head"], state["tail"], state["pending"])
    torn = kestrel.queue_state([("torn.1800000000000", file_records(d / "torn.1800000000000"))], [])
    assert got.pop(("torn", "")) == (torn["head"], torn["tail"], torn["pending"])
    assert got.pop(("mail", "x")) == (0, 0, 0)
    assert not got


def test_persistence_matches_chains_on_conformance(conformance_run):
    from journalfs.formats.akka import chains
    src, out, _ = conformance_run
    got = {r["persistence_id"]: r for r in table(out, "persistence")}
    expected = {}
    for d in ("akka0", "akka1", "akka2"):
        base = src / "records" / d
        expected.update(chains(file_records(base / "meta"), file_records(base / "data")))
    assert {pid: (r["messages"], r["highest_seq"], r["consistent"]) for pid, r in got.items()} == \
        {pid: (c["messages"], c["highest_seq"], c["consistent"]) for pid, c in expected.items()}


def test_transactions_match_jrnl_records(conformance_run, records_expected):
    src, out, _ = conformance_run
    got = sorted((Path(r["source"]).name, r["offset"], int(r["time"].timestamp()), r["status"], r["ops"])
                 for r in table(out, "transactions"))
    expected = sorted((name, rec["offset"], rec["time"], rec["status"],
                       [op["op"] if isinstance(op, dict) else op for op in rec["ops"]])
                      for name, v in records_expected.items() if v["format"] == "jrnl"
                      for rec in v["records"])
    assert got == expected


def test_tables_written_empty_have_the_columns_of_computed_ones(spark, conformance_run):
    """A table none of whose formats is found is written from derived.DDLS, not computed."""
    from journalfs.spark import derived
    _src, out, _ = conformance_run
    for name in derived.TABLES:
        assert spark.read.parquet(str(out / name)).schema.simpleString() == \
            spark.createDataFrame([], derived.DDLS[name]).schema.simpleString(), name


# -- small crafted inputs with hand-computed answers ----------------------------------------

def test_crafted_queues_and_persistence(spark, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "Q.1").write_bytes(kestrel.build_writer_file([b"a"] * 5, first_id=3))   # ids 3..7
    (src / "Q.2").write_bytes(kestrel.build_writer_file([b"b"] * 3, first_id=8))   # ids 8..10
    (src / "Q.read.a").write_bytes(kestrel.build_checkpoint(4, [6, 9, 99]))
    (src / "Q.read.b").write_bytes(kestrel.build_checkpoint(100))
    (src / "Q.read.c").write_bytes(kestrel.build_checkpoint(0))
    (src / "Q.read.a~~123").write_bytes(kestrel.build_checkpoint(0))  # leftover temp file
    (src / "lone.5").write_bytes(kestrel.build_writer_file([b"c"] * 3))            # no readers
    data, meta = AkkaData.build([("a", 1, b"x"), ("b", 1, b"y"), ("a", 2, b"zz"), ("c", 1, b"")])
    metas = [dict(m) for m in records_of_bytes("akka-meta", meta)]
    for m in metas:
        if m["persistence_id"] == "b":
            m["highest_seq"] = 5  # the meta block disagrees with its chain
    metas.append({"persistence_id": "empty", "first": 0, "last": 0, "highest_seq": 0})
    (src / "akka").mkdir()
    (src / "akka" / "data").write_bytes(data)
    (src / "akka" / "meta").write_bytes(CODECS["akka-meta"].write(metas))
    out = tmp_path / "out"
    summary = run(spark, str(src), str(out))
    queues = {(r["queue"], r["reader"]): (r["head"], r["tail"], r["pending"]) for r in table(out, "queues")}
    assert queues == {
        ("Q", "a"): (4, 10, 4),   # pending 5, 7, 8, 10 (6 and 9 done, 99 outside (head, tail])
        ("Q", "b"): (10, 10, 0),  # head clamped down to the tail
        ("Q", "c"): (2, 10, 8),   # head clamped up to first id - 1
        ("lone", ""): (0, 3, 3),  # default reader of a queue without reader files
    }
    persistence = {r["persistence_id"]: (r["messages"], r["highest_seq"], r["consistent"])
                   for r in table(out, "persistence")}
    assert persistence == {"a": (2, 2, True), "b": (1, 5, False), "c": (1, 1, True), "empty": (0, 0, True)}
    assert summary.damaged_files == 0 and summary.rows["transactions"] == 0


def akka_chains_with_bad_links(directory: Path, count: int = 40_000) -> None:
    """An akka journal of interleaved chains (big enough for several tasks and batches) in
    which some links are wrong: a chain forked into another, a ``prev`` that does not link
    back, a sequence number that does not increase, a link to the last block of the file,
    and a persistence id with a meta block but no messages."""
    pids = [f"p{i}" for i in range(13)]
    data, metas = AkkaData.layout([(pids[i % 13], i // 13 + 1, b"m" * (i % 50))
                                   for i in range(count)])
    data[100]["next"] = data[20_007]["self"]             # p9 -> a block of p0 far away
    data[15_000]["prev"] = data[14_000]["self"]          # p11 -> p12: does not link back
    data[30_001]["seq_nr"] = 0                           # p10: seq goes down
    data[39_000]["next"] = data[-1]["self"]              # p0 forked into the last block (p11)
    data[1_991]["next"] = data[1_992]["self"]            # p2 forked into a neighbour (p3)
    metas.append({"persistence_id": "nothing", "first": 0, "last": 0, "highest_seq": 0})
    metas.append({"persistence_id": "nothing-here", "first": 0, "last": 0, "highest_seq": 1})
    directory.mkdir()
    (directory / "data").write_bytes(AkkaData().write(data))
    (directory / "meta").write_bytes(CODECS["akka-meta"].write(metas))


def test_tables_of_the_records_pass_equal_the_dataframe_functions(spark, tmp_path, records_corpus):
    """``queues``, ``transactions`` and ``persistence`` are computed as the records are
    written (partials per batch, merged on the driver): the same answers as derived's
    DataFrame functions on the records table, also for a Kestrel file split across tasks
    whose ids have gaps, repeat and go backwards, and akka chains split across tasks with
    bad links inside a batch and across tasks."""
    from journalfs.spark import derived
    src = tmp_path / "in"
    src.mkdir()
    akka_chains_with_bad_links(src / "akka")
    (src / "akka-small").mkdir()
    data, meta = AkkaData.build([("a", 1, b"x"), ("b", 1, b"y"), ("a", 2, b"zz")])
    (src / "akka-small" / "data").write_bytes(data)
    (src / "akka-small" / "meta").write_bytes(meta)
    ids = list(range(1, 20_000)) + [30_000, 30_001, 5, 5, 40_000] + list(range(50_000, 70_000))
    with open(src / "Big.1", "wb") as f:  # ~3 MB: split into several tasks' slices
        f.write(kestrel.WRITER_MAGIC)
        f.write(b"".join(kestrel.encode_put(i, b"p" * 60) for i in ids))
    (src / "Big.2").write_bytes(kestrel.build_writer_file([b"q"] * 10, first_id=70_000))
    (src / "Big.read.r").write_bytes(kestrel.build_checkpoint(15_000, [15_002, 30_001, 5, 69_999]))
    (src / "Big.read.s").write_bytes(kestrel.build_checkpoint(10**9))
    for n in range(4):
        shutil.copy(records_corpus / f"db{n}.jrnl", src)
    out = tmp_path / "out"
    run(spark, str(src), str(out))
    from journalfs.spark.plan import list_journals, plan
    slices = [s for g in plan(list_journals(str(src)), 2).groups for s in g]
    for name in ("Big.1", "akka/data"):
        assert len([s for s in slices if s.path.endswith(name)]) >= 2, name
    records = spark.read.parquet(str(out / "records"))
    for name in derived.IN_PASS:
        expected = [tuple(r) for r in getattr(derived, name)(records).collect()]
        got = [tuple(r.values()) for r in table(out, name)]
        if name == "transactions":  # Spark's naive local time, pyarrow's aware UTC
            expected = [(s, o, t.timestamp(), st, ops) for s, o, t, st, ops in expected]
            got = [(s, o, t.timestamp(), st, ops) for s, o, t, st, ops in got]
        assert got and sorted(got) == sorted(expected), name
    persistence = {r["persistence_id"]: r["consistent"] for r in table(out, "persistence")}
    assert persistence["nothing"] and persistence["a"]
    assert all(persistence[f"p{i}"] for i in (1, 3, 4, 5, 6, 7, 8))
    assert not any(persistence[pid] for pid in ("nothing-here", "p0", "p2", "p9", "p10", "p11",
                                                "p12"))
    state = kestrel.queue_state([(p.name, file_records(p)) for p in sorted(src.glob("Big.[0-9]"))],
                                file_records(src / "Big.read.r"))
    (row,) = [r for r in table(out, "queues") if r["reader"] == "r"]
    assert (row["head"], row["tail"], row["pending"]) == (state["head"], state["tail"],
                                                          state["pending"])


def test_persistence_of_a_directory_with_two_akka_data_files(spark, tmp_path):
    """Two data files in one directory repeat ``self`` offsets, which the DataFrame's join
    pairs across the files: the pass's partials cannot say that, so the table comes from
    the DataFrame function there (and equals it)."""
    from journalfs.spark import derived
    from journalfs.spark.read import read_slice
    from journalfs.spark.plan import list_journals, plan
    src = tmp_path / "in"
    (src / "twin").mkdir(parents=True)
    data, meta = AkkaData.build([("a", 1, b"x"), ("b", 1, b"y"), ("a", 2, b"zz")])
    (src / "twin" / "data").write_bytes(data)
    (src / "twin" / "data2").write_bytes(AkkaData.build([("a", 1, b"yy"), ("a", 2, b"x")])[0])
    (src / "twin" / "meta").write_bytes(meta)
    parts = [p for g in plan(list_journals(str(src)), 1).groups for sl in g
             for batch in read_slice(sl, False, 1000)
             for p in [derived.partials(batch).get("persistence")] if p is not None]
    assert derived.finish("persistence", parts) is None
    out = tmp_path / "out"
    run(spark, str(src), str(out))
    expected = derived.persistence(spark.read.parquet(str(out / "records"))).collect()
    assert sorted(tuple(r.values()) for r in table(out, "persistence")) == \
        sorted(tuple(r) for r in expected) != []


def test_persistence_of_very_many_ids_is_left_to_the_dataframe_function(spark, tmp_path):
    """Many persistence ids with few messages each make the pass's partials as big as the
    records: the tasks give them up, and the table comes from the DataFrame function."""
    import io
    from rich.console import Console
    from journalfs.spark import derived
    src = tmp_path / "in"
    (src / "many").mkdir(parents=True)
    ids = derived.PARTIAL_ROWS_FLOOR + 10_000
    data, meta = AkkaData.build([(f"id{i}", 1, b"") for i in range(ids)])
    (src / "many" / "data").write_bytes(data)
    (src / "many" / "meta").write_bytes(meta)
    out = tmp_path / "out"
    console = io.StringIO()
    run(spark, str(src), str(out), console=Console(file=console, width=200))
    assert "writing persistence" in console.getvalue()  # a Spark job, not the pass
    got = table(out, "persistence")
    assert len(got) == ids and all(r["consistent"] and r["messages"] == 1 for r in got)
    assert not derived.partials_too_big(derived.PARTIAL_ROWS_FLOOR, 0)
    assert derived.partials_too_big(derived.PARTIAL_ROWS_FLOOR + 1, 2 * ids)


def test_records_keep_only_the_files_the_successful_attempts_wrote(spark, tmp_path,
                                                                   records_corpus):
    """Tasks write their own Parquet files; what a failed or repeated attempt left in the
    table's directory (here: planted before the run) is removed, so no row is there twice."""
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(records_corpus / "db0.jrnl", src)
    out = tmp_path / "out"
    stray = out / "records" / "format=jrnl" / "part-00000-7.snappy.parquet"
    stray.parent.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "conformance" / "records" / "db0.jrnl", stray)
    stray_row = out / "transactions" / "part-00000-7.snappy.parquet"  # the tasks write it too
    stray_row.parent.mkdir(parents=True)
    shutil.copy(stray, stray_row)
    (out / "records" / "format=akka-data").mkdir()  # a format only a failed attempt met
    (out / "records" / "format=akka-data" / "part-00001-0.snappy.parquet").write_bytes(b"x")
    summary = run(spark, str(src), str(out))
    assert not stray.exists() and not stray_row.exists()
    assert sorted(p.name for p in (out / "records").iterdir()) == ["_SUCCESS", "format=jrnl"]
    assert summary.rows["transactions"] == len(table(out, "transactions")) > 0
    assert summary.rows["records"] == len(table(out, "records")) == \
        len(file_records(src / "db0.jrnl"))


def test_a_task_goes_on_in_a_new_file_every_so_many_row_groups(tmp_path, monkeypatch):
    """A Parquet writer holds every row group's metadata until it closes (the worker of a
    2 GB JRNL journal grew by ~70 MB): a task's records and transactions files end every
    ROW_GROUPS_PER_FILE row groups, and together hold every row, once."""
    from journalfs.spark import read, source, writer
    from journalfs.spark.plan import list_journals, plan
    monkeypatch.setattr(writer, "ROW_GROUPS_PER_FILE", 3)
    for module in (read, source):  # many small batches (not merged again), a row group each
        monkeypatch.setattr(module, "BATCH_BYTES", 4096)
    src = tmp_path / "in"
    src.mkdir()
    (src / "q.1700000000000").write_bytes(kestrel.build_writer_file([b"x" * 50] * 2000))
    txs = [{"time": 1_700_000_000 + i, "complete": True,
            "ops": [{"op": "alloc", "page": i}, {"op": "complete"}]} for i in range(600)]
    (src / "pages.jrnl").write_bytes(CODECS["jrnl"].write(txs))
    groups = plan(list_journals(str(src)), 1, cache_dir=None).groups
    out = tmp_path / "out"
    reported = [dict(zip(writer.RESULT_NAMES, r)) for r in
                writer.write_groups(groups, str(out / "records"), iter(range(len(groups))))]
    files = {r["path"]: r["rows"] for r in reported if r["rows"] is not None}
    on_disk = sorted(str(p) for p in out.rglob("*.parquet"))
    assert sorted(files) == on_disk
    for name, expected in (("format=kestrel-writer", 2000), ("format=jrnl", 600),
                           ("transactions", 600)):
        mine = [p for p in on_disk if f"/{name}/" in p]
        assert len(mine) > 1, name
        assert all(pq.ParquetFile(p).metadata.num_row_groups <= 3 for p in mine), name
        assert sum(pq.ParquetFile(p).metadata.num_rows for p in mine) == \
            sum(files[p] for p in mine) == expected, name


def test_files_the_driver_cannot_see_fail_the_run(spark, tmp_path, records_corpus, monkeypatch):
    """On a cluster whose executors write to disks of their own, the driver does not see the
    records files they report: the run fails saying so, rather than writing empty tables."""
    from journalfs.spark import writer
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(records_corpus / "db0.jrnl", src)
    monkeypatch.setattr(writer, "_seen", lambda path: False)
    with pytest.raises(OSError, match="where the driver does not see them"):
        run(spark, str(src), str(tmp_path / "out"))


def records_of_bytes(fmt: str, data: bytes) -> list[dict]:
    return [{k: v for k, v in rec.items() if k not in ("format", "seq", "offset", "kind")}
            for rec in CODECS[fmt].read(data, fmt)]


# -- the command ----------------------------------------------------------------------------

#: A tiny input: the JVM's start-up dominates, so only its C1 compiler and serial GC.
FAST_JVM = ('--driver-java-options "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" '
            "--conf spark.ui.enabled=false pyspark-shell")


def cli_env() -> dict:
    # no class-archive builder left running after a test (test_class_archive_... has its own)
    return dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_SUBMIT_ARGS=FAST_JVM,
                JOURNALFS_SPARK_CDS="0")


def pipeline_cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "journalfs.cli", "pipeline", *argv],
                          capture_output=True, text=True, env=cli_env(), timeout=timeout)


def test_class_archive_is_made_in_the_background_and_then_used(tmp_path, records_corpus):
    """A short run that finds no class-data archive for its driver JVM starts one detached
    low-priority builder (the pipeline over the demo's journals) and finishes without
    waiting for it; the builder removes what a killed one left of its archive; the next run
    maps the archive."""
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(records_corpus / "db0.jrnl", src)
    env = dict(cli_env(), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("JOURNALFS_SPARK_CDS")
    from journalfs.commands.pipeline import QUICK_JVM
    from journalfs.spark.classarchive import ClassArchive
    cds = tmp_path / "cache" / "journalfs" / "spark-cds"
    cds.mkdir(parents=True)
    killed = Path(ClassArchive(QUICK_JVM, str(cds)).path + ".4242.tmp")  # a killed builder's
    killed.write_bytes(b"half")
    others = cds / "driver-0123456789abcdef.jsa.4243.tmp"  # another key's builder: running
    others.write_bytes(b"half")
    argv = [sys.executable, "-m", "journalfs.cli", "pipeline", str(src)]
    first = subprocess.run([*argv, str(tmp_path / "out1")], capture_output=True, text=True,
                           env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    (lock,) = cds.glob("*.lock")  # the builder runs on after the command
    deadline = time.monotonic() + 600
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert not lock.exists(), "the builder did not finish"
    (archive,) = cds.glob("*.jsa")
    assert archive.stat().st_size > 10 << 20 and list(cds.glob("*.tmp")) == [others]
    options = ClassArchive(QUICK_JVM, str(cds)).java_options()  # what a short run adds
    assert f"-XX:SharedArchiveFile={archive} " in options
    # -Xshare:on: a JVM that cannot map the archive does not start (auto would ignore it)
    second = subprocess.run([*argv, str(tmp_path / "out2"), "--conf",
                             f"spark.driver.extraJavaOptions={QUICK_JVM} {options} -Xshare:on"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert pq.read_table(tmp_path / "out2" / "records").num_rows == \
        pq.read_table(tmp_path / "out1" / "records").num_rows > 0


def test_cli_names_damage_skips_fsck_backups_and_refuses_to_overwrite(tmp_path, records_corpus):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(records_corpus / "torn.1800000000000", src)
    shutil.copy(records_corpus / "db0.jrnl", src)
    shutil.copy(records_corpus / "db1.jrnl", src)
    (src / "not-a-journal.txt").write_text("hello")
    with pytest.raises(FormatError) as damaged:
        list(read_file(str(src / "torn.1800000000000")))
    out = tmp_path / "out"
    proc = pipeline_cli(str(src), str(out))
    assert proc.returncode == 3, proc.stderr[-2000:]  # damage found; the tables are written
    assert "damaged files" in proc.stderr and "Traceback" not in proc.stderr
    assert "journalfs pipeline: reading journals (3 files, " in proc.stderr  # a line per stage
    # the derived tables of the formats found, side by side
    assert " MB) -> records, queues, transactions\n" in proc.stderr  # computed in one pass
    assert f"damaged: {src / 'torn.1800000000000'}: at byte {damaged.value.offset}: " \
           f"{damaged.value.reason}" in proc.stderr.replace("\n", "")
    assert len(table(out, "_damage")) == 1
    transactions = len(table(out, "transactions"))
    assert transactions == len(file_records(src / "db0.jrnl")) + len(file_records(src / "db1.jrnl"))

    again = pipeline_cli(str(src), str(out), timeout=60)  # refused before Spark starts
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    # fsck --repair rewrites db0.jrnl and the torn queue file, keeping backups beside them
    fsck = subprocess.run([sys.executable, "-m", "journalfs.cli", "fsck", "--repair", str(src)],
                          capture_output=True, text=True, env=cli_env(), timeout=120)
    backups = sorted(p.name for p in src.iterdir() if ".journalfs-backup-" in p.name)
    assert len(backups) == 2, fsck.stdout
    proc = pipeline_cli(str(src), str(out), "--overwrite")
    assert proc.returncode == 0, proc.stderr[-2000:]  # no damage left
    assert len(table(out, "transactions")) == transactions  # not doubled by the backup
    sources = {Path(r["source"]).name for r in table(out, "records")}
    assert not any(".journalfs-backup-" in name for name in sources)
    assert len(table(out, "_damage")) == 0  # the repaired copy is clean
    assert not list(tmp_path.glob(".out.journalfs-partial-*"))


def test_cli_checks_paths_before_spark(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for argv, code, words in (
            ((str(tmp_path / "nope"), str(tmp_path / "o")), 1, "no such file"),
            ((str(src), str(a_file)), 2, "not a directory"),
            ((str(src), str(tmp_path / "no" / "such" / "o")), 1, "no such directory"),
            ((str(src), str(tmp_path / "o"), "--driver-memory", "lots"), 2, "invalid"),
            ((str(src), str(tmp_path / "o"), "--conf", "novalue"), 2, "invalid"),
            ((str(src / "x"), str(tmp_path)), 1, "no such file")):
        proc = pipeline_cli(*argv, timeout=60)
        assert proc.returncode == code, (argv, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        if code != 2 or "directory" in words:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    (src / "j").write_bytes(kestrel.build_writer_file([b"a"]))
    proc = pipeline_cli(str(src), str(tmp_path), "--overwrite", timeout=60)  # OUTPUT holds INPUT
    assert proc.returncode == 2 and "holds the input" in proc.stderr
    assert (src / "j").exists()


def test_cli_unreachable_master_is_one_line_after_the_timeout(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "q.1").write_bytes(kestrel.build_writer_file([b"a"]))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = pipeline_cli(str(src), str(tmp_path / "out"), "--master", f"spark://127.0.0.1:{port}",
                        "--master-timeout", "3", timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert f"spark://127.0.0.1:{port}" in line and "cannot reach" in line, line
    assert took < 60
    assert not (tmp_path / "out").exists()


def test_cli_ctrl_c_stops_spark_and_exits_130(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) while Spark runs."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):  # enough to keep a job busy for a while
        (src / f"q{i}.{1700000000000 + i}").write_bytes(
            kestrel.build_writer_file([bytes(200)] * 100_000))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "pipeline", str(src), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), start_new_session=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".out.journalfs-partial-*")):  # Spark is writing
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Exception" not in err, err
    assert "interrupted" in err.strip().splitlines()[-1]
    assert not out.exists() and not list(tmp_path.glob(".out.journalfs-partial-*"))
    deadline = time.monotonic() + 30  # the JVM exits once its parent has gone
    while subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "processes of the run are still alive"
        time.sleep(0.5)


def test_input_without_journals_is_refused(spark, tmp_path):
    from journalfs.spark.plan import NoJournalError
    src = tmp_path / "in"
    src.mkdir()
    (src / "readme.txt").write_text("not a journal")
    with pytest.raises(NoJournalError, match="no journal found"):
        run(spark, str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_cli_refuses_inputs_that_hold_no_journal_before_spark(tmp_path):
    """`journalfs pipeline /etc/passwd OUT` and friends: one line, exit 1, before Spark
    starts, OUTPUT untouched."""
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "readme.txt").write_text("not a journal")
    (src / "sub" / "data.bin").write_bytes(bytes(100))
    (src / "q.1700000000000.journalfs-backup-20260101T000000Z").write_bytes(
        kestrel.build_writer_file([b"a"]))  # fsck's backups are not journals either
    for argv, words in (
            (("/etc/passwd",), "/etc/passwd: not a journal (supported formats: akka-data, "),
            ((str(src),), f"{src}: no journal found (3 files looked at; supported formats: "),
            ((f"file://{src}",), f"{src}: no journal found (3 files looked at"),
            ((str(src / "nope"),), f"{src / 'nope'}: no such file or directory"),
            ((f"file://{src}/nope",), f"file://{src}/nope: no such file or directory"),
            (("hdfs://127.0.0.1:9/x",), "hdfs://127.0.0.1:9/x: unsupported URI scheme 'hdfs'"),
            (("fiel:///tmp",), "fiel:///tmp: unsupported URI scheme 'fiel'"),
            (("file://otherhost/tmp",), "a file:// URI names a host (otherhost)")):
        proc = pipeline_cli(*argv, str(tmp_path / "out"), timeout=60)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("journalfs: pipeline: "), proc.stderr
        assert words in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists()


def test_cli_reads_a_file_uri(tmp_path, records_corpus):
    out = tmp_path / "out[2]{a,b}*"  # Hadoop glob characters: read back literally
    proc = pipeline_cli(f"file://{records_corpus}/db0.jrnl", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["source"] for r in table(out, "records")] == \
        [str(records_corpus / "db0.jrnl")] * len(file_records(records_corpus / "db0.jrnl"))


def _store_table(store: str, records: list[dict], journal: list[tuple] = ()):
    """A store's group as the metadata table's replay gets it: its tree's records (and
    journal rows: (source, seq, kind, path, attrs))."""
    import pyarrow as pa
    rows = [{"store": store, "source": store, "format": "gvfs-tree", "seq": r["seq"],
             "kind": "node", "key": r["path"],
             "attrs": [("mtime", str(r["mtime"])), ("metadata", json.dumps(r["metadata"]))]}
            for r in records]
    rows += [{"store": store, "source": source, "format": "gvfs-journal", "seq": seq,
              "kind": kind, "key": path, "attrs": list(attrs.items())}
             for source, seq, kind, path, attrs in journal]
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("store", pa.string()), ("source", pa.string()), ("format", pa.string()),
        ("seq", pa.int64()), ("kind", pa.string()), ("key", pa.string()),
        ("attrs", pa.map_(pa.string(), pa.string()))]))


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.tuples(
    st.lists(st.sampled_from(["a", "b", "é", "z z", "0"]), max_size=3),
    st.dictionaries(st.sampled_from(["k", "emblems", "ä"]),
                    st.one_of(st.text(max_size=4), st.lists(st.text(max_size=3), max_size=2)),
                    max_size=2)), max_size=12))
def test_a_store_with_nothing_to_replay_is_its_trees_rows(tmp_path_factory, nodes):
    """The fast path of the metadata table (no MergedTree, no dict per record) gives the
    rows the replay gives, in the same order."""
    from journalfs.spark import derived
    tree = CODECS["gvfs-tree"]
    buf = tree.write([{"path": "/" + "/".join(parts), "metadata": meta, "mtime": 1}
                      for parts, meta in nodes])
    store = str(tmp_path_factory.mktemp("store") / "home")
    Path(store).write_bytes(buf)
    table = _store_table(store, list(tree.read(buf, store)))
    fast = derived._tree_state(store, table)
    assert fast is not None
    assert fast.to_pylist() == derived._replay_group(table).to_pylist()
    state = derived.replay_store(store, table.to_pylist())
    assert [(r["path"], r["key"], r["value"] if r["values"] is None else r["values"])
            for r in fast.to_pylist()] == \
        [(p, k, state[p][k]) for p in sorted(state) for k in sorted(state[p])]


def test_paths_the_replay_would_merge_take_the_replay(tmp_path):
    """Two nodes of one path, or a path with an empty component: MergedTree merges them,
    so the fast path declines."""
    from journalfs.spark import derived
    store = str(tmp_path / "home")
    Path(store).write_bytes(CODECS["gvfs-tree"].write([]))
    for paths in (["/a", "/a"], ["/a//b"], ["/a/"], ["a"]):
        records = [{"seq": i, "path": p, "mtime": 0, "metadata": {"k": str(i)}}
                   for i, p in enumerate(paths)]
        table = _store_table(store, records)
        assert derived._tree_state(store, table) is None
        state = derived.replay_store(store, table.to_pylist())
        assert derived._replay_group(table).to_pylist() == [
            {"store": store, "path": p, "key": k, "value": v, "values": None}
            for p in sorted(state) for k, v in sorted(state[p].items())]


def test_a_store_with_journal_entries_is_replayed(tmp_path, monkeypatch):
    """Entries of the tree's own journal: the replay (they may copy or remove subtrees)."""
    from journalfs.spark import derived
    tree = CODECS["gvfs-tree"]
    store = str(tmp_path / "home")
    buf = tree.write([{"path": "/a/b", "metadata": {"k": "1"}, "mtime": 1}], tag=0x1234abcd)
    Path(store).write_bytes(buf)
    journal = [(store + "-1234abcd.log", 0, "remove", "/a", {})]
    table = _store_table(store, list(tree.read(buf, store)), journal)
    monkeypatch.setattr(derived, "_tree_state", None)  # calling it would fail
    assert derived._replay_group(table).to_pylist() == []


def _streamed_stores(tmp_path):
    """Three stores as metadata()'s replay meets them: one with its own journal and a journal
    of another tag, one whose only journal has another tag, one with a journal and no tree;
    plus each store's rows as _replay_group gets them."""
    import pyarrow as pa
    tree = CODECS["gvfs-tree"]
    groups = []
    for name, tag in (("a", 0x1234abcd), ("b", 0x0badcafe)):
        store = str(tmp_path / name)
        buf = tree.write([{"path": f"/d{i}/f{j}", "metadata": {"k": f"{i}.{j}", "e": ["x", str(j)]},
                           "mtime": 1} for i in range(4) for j in range(5)], tag=tag)
        Path(store).write_bytes(buf)
        groups.append((store, list(tree.read(buf, store))))
    a, b = groups[0][0], groups[1][0]
    own = [(a + "-1234abcd.log", i, kind, path, attrs) for i, (kind, path, attrs) in enumerate([
        ("set", "/d0/f1", {"key": "k", "value": "new"}),
        ("setv", "/d5/f0", {"key": "e", "value": json.dumps(["p", "q"])}),
        ("copy", "/d9", {"source": "/d1"}),
        ("unset", "/d9/f2", {"key": "k"}),
        ("remove", "/d2", {}),
        ("set", "/d2/g", {"key": "k", "value": "after"}),
    ] * 3)]
    other = [(a + "-00000000.log", i, "remove", "/", {}) for i in range(3)]  # not the tree's
    c = str(tmp_path / "c")  # no tree: every journal of the store is replayed
    tables = [_store_table(a, groups[0][1], other + own),
              _store_table(b, groups[1][1], [(b + "-00000001.log", 0, "remove", "/", {})]),
              _store_table(c, [], [(c + "-00000002.log", i, "set", f"/x{i % 3}",
                                    {"key": "k", "value": str(i)}) for i in range(7)])]
    rows = pa.concat_tables(tables)
    order = pa.compute.sort_indices(rows.append_column(
        "journal", pa.compute.not_equal(rows.column("format"), "gvfs-tree")),
        [("store", "ascending"), ("journal", "ascending"), ("source", "ascending"),
         ("seq", "ascending")])
    return rows.take(order), tables


def test_the_streamed_replay_equals_the_grouped_one(tmp_path):
    """metadata()'s replay gets each store's rows over many batches (Spark's Arrow batches)
    and keeps only the store's state: the rows of replaying each store's rows at once."""
    from journalfs.spark import derived
    rows, tables = _streamed_stores(tmp_path)
    expected = [r for t in tables for r in derived._replay_group(t).to_pylist()]
    assert len(expected) > 50 and {r["store"] for r in expected} == {t["store"][0].as_py() for t in tables}
    for size in (1, 4, 7, 1000):
        batches = rows.to_batches(max_chunksize=size)
        got = [r for b in derived.replay_batches(iter(batches)) for r in b.to_pylist()]
        assert got == expected, size


def test_the_streamed_replay_yields_a_store_before_reading_the_next(tmp_path):
    """A store's rows are never all in the worker at once: the replay pulls batches one by
    one and yields a store's rows as soon as the next store's first batch comes."""
    from journalfs.spark import derived
    rows, tables = _streamed_stores(tmp_path)
    pulled = []

    def batches():
        for batch in rows.to_batches(max_chunksize=5):
            pulled.append(batch.column("store").to_pylist())
            yield batch
    first = tables[0]["store"][0].as_py()
    replay = derived.replay_batches(batches())
    out = next(replay)
    assert set(out.column("store").to_pylist()) == {first}
    assert sum(first in stores for stores in pulled) > 5  # the store came in many batches
    assert pulled[-1][-1] != first and first not in pulled[-1][1:]  # ... and is done with
    assert len(pulled) < len(rows.to_batches(max_chunksize=5))


def test_metadata_dataframe_streams_each_store(spark, tmp_path):
    """derived.metadata on Spark, with Arrow batches of 3 rows: the same rows as the grouped
    replay, through mapInArrow (no grouped applyInArrow of a whole store)."""
    from journalfs.spark import derived
    rows, tables = _streamed_stores(tmp_path)
    path = str(tmp_path / "records.parquet")
    pq.write_table(rows.drop_columns(["store"]), path)
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        df = derived.metadata(spark.read.parquet(path))
        plan = df._jdf.queryExecution().executedPlan().toString()
        got = sorted(tuple(r) for r in df.collect())
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert "MapInArrow" in plan and "FlatMapGroupsInArrow" not in plan
    expected = sorted((r["store"], r["path"], r["key"], r["value"], r["values"])
                      for t in tables for r in derived._replay_group(t).to_pylist())
    assert got == expected and len(got) > 50


def test_summary_names_damage_and_what_was_not_read():
    import io
    from rich.console import Console
    from journalfs.spark.pipeline import UNREADABLE_SHOWN, Summary, print_summary
    out = io.StringIO()
    summary = Summary(rows={"records": 1}, damaged_files=1, output="/o",
                      damage=[("/in/a", 7, "torn record")],
                      unreadable=[(f"/in/s{i}", "Permission denied") for i in range(UNREADABLE_SHOWN + 3)])
    print_summary(summary, Console(file=out, width=200))
    text = out.getvalue()
    assert "damaged: /in/a: at byte 7: torn record" in text
    assert "not read: /in/s0: Permission denied" in text
    assert f"not read: /in/s{UNREADABLE_SHOWN}:" not in text and "not read: 3 more files or directories" in text
