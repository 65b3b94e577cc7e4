"""`journalfs queue`, `events`, `transactions`: each system's state without Spark, agreeing
with the pipeline's derived tables, on hand-counted demo data, the conformance corpus and
live files."""
from __future__ import annotations

import json
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from journalfs import demo, state
from journalfs.formats import CODECS
from codec_helpers import file_records
from test_records_cli import run_cli
from journalfs.spark.testing import spark  # noqa: F401  (the session-wide fixture)

KESTREL, READER = CODECS["kestrel-writer"], CODECS["kestrel-reader"]


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    demo.write_demo(root)
    return root


def _lines(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_queue_readers_of_the_demo(demo_tree):
    """The demo's queue: ids 1..64; the default reader consumed up to 45 plus 47 and 50;
    mailer read up to 12."""
    rows = _lines(run_cli("queue", str(demo_tree / "queues" / "jobs"), "--json"))
    got = {r["reader"]: (r["head"], r["tail"], r["pending"]) for r in rows}
    assert got == {"": (45, 64, 64 - 45 - 2), "mailer": (12, 64, 64 - 12)}
    puts = {r["id"]: r for p in sorted((demo_tree / "queues").glob("jobs.1*"))
            for r in file_records(p)}
    default = next(r for r in rows if r["reader"] == "")
    assert default["oldest_pending_add_time"] == puts[46]["add_time"]
    assert default["oldest_pending_age_ms"] > 0
    items = _lines(run_cli("queue", str(demo_tree / "queues" / "jobs"), "--reader", "",
                           "--pending", "--json"))
    assert [i["id"] for i in items] == [i for i in range(46, 65) if i not in (47, 50)]
    assert all(i["payload"] == puts[i["id"]]["payload"].decode() for i in items)
    # the table: one row per reader, a directory names every queue in it
    table = run_cli("queue", str(demo_tree / "queues")).stdout.splitlines()
    assert table[0].split()[:5] == ["QUEUE", "READER", "HEAD", "TAIL", "PENDING"]
    assert [line.split()[:5] for line in table[1:]] == [
        ["jobs", "(default)", "45", "64", "17"], ["jobs", "mailer", "12", "64", "52"]]
    pending = run_cli("queue", str(demo_tree / "queues" / "jobs.read.mailer"), "--pending",
                      "--reader", "mailer").stdout.splitlines()
    assert pending[0].startswith("# jobs reader mailer: 52 pending after head 12")
    assert len(pending) == 2 + 52


def test_events_of_one_persistence_id_in_order(demo_tree):
    orders = demo_tree / "akka" / "orders"
    ids = _lines(run_cli("events", str(orders), "--json"))
    assert [(i["persistence_id"], i["messages"], i["highest_seq"], i["consistent"])
            for i in ids] == [("order-17", 12, 12, True), ("użytkownik-3", 15, 15, True),
                              ("order-18", 9, 9, True)]  # the demo's, in its meta file's order
    events = _lines(run_cli("events", str(orders / "data"), "--id", "order-17", "--json"))
    assert [e["seq_nr"] for e in events] == list(range(1, 13))
    blocks = {b["self"]: b for b in file_records(orders / "data")}
    assert all(e["payload"] == blocks[e["offset"]]["payload"].decode() for e in events)
    # the chain walked by hand: first from meta, then next links
    meta = next(m for m in file_records(orders / "meta") if m["persistence_id"] == "order-17")
    link, walked = meta["first"], []
    while link:
        walked.append(link)
        link = blocks[link]["next"]
    assert [e["offset"] for e in events] == walked
    some = _lines(run_cli("events", str(orders), "--id", "order-17", "--from-seq", "3",
                          "--to-seq", "5", "--json", "--payload", "hex"))
    assert [e["seq_nr"] for e in some] == [3, 4, 5] and "payload_hex" in some[0]
    proc = run_cli("events", str(orders), "--id", "nobody")
    assert proc.returncode == 1 and "nobody" in proc.stderr


def test_transactions_and_the_incomplete_ones(demo_tree):
    db = demo_tree / "jrnl" / "db.jrnl"
    rows = _lines(run_cli("transactions", str(db), "--json"))
    records = file_records(db)
    assert [(r["offset"], r["status"], r["time"]) for r in rows] == \
        [(r["offset"], r["status"], r["time"]) for r in records]
    incomplete = _lines(run_cli("transactions", str(db), "--incomplete", "--json"))
    assert [r["status"] for r in incomplete] == ["redo", "rollback"]
    assert [r["offset"] for r in incomplete] == \
        [r["offset"] for r in records if r["status"] != "complete"]


def test_state_of_damaged_files_is_their_valid_prefix_and_exit_3(tmp_path, records_corpus):
    q = tmp_path / "q"
    shutil.copytree(records_corpus, q)
    proc = run_cli("queue", str(q / "torn"), "--json", real=True)
    assert proc.returncode == 3 and "torn.1800000000000: damaged at byte" in proc.stderr
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    prefix = file_records(q / "torn.1800000000000")
    assert row["tail"] == prefix[-1]["id"] and row["pending"] == len(prefix)
    garbage = tmp_path / "junk.jrnl"
    garbage.write_bytes(b"JRNL" + os.urandom(300))
    proc = run_cli("transactions", str(garbage), real=True)
    assert proc.returncode in (0, 3) and "Traceback" not in proc.stderr


def _reference_tables(corpus: Path) -> dict:
    """The derived tables' answers by their definitions in the codec modules (what
    tests/test_pipeline.py holds the Spark tables to)."""
    from journalfs.formats import kestrel
    from journalfs.formats.akka import chains
    writers = [(p.name, file_records(p)) for p in sorted(corpus.glob("jobs.1*"))]
    queues = {}
    for reader in ("", "indexer"):
        st = kestrel.queue_state(writers, file_records(corpus / f"jobs.read.{reader}"))
        queues[("jobs", reader)] = (st["head"], st["tail"], st["pending"])
    torn = kestrel.queue_state([("torn.1800000000000", file_records(corpus / "torn.1800000000000"))], [])
    queues[("torn", "")] = (torn["head"], torn["tail"], torn["pending"])
    queues[("mail", "x")] = (0, 0, 0)
    persistence = {}
    for d in ("akka0", "akka1", "akka2"):
        for pid, c in chains(file_records(corpus / d / "meta"),
                             file_records(corpus / d / "data")).items():
            persistence[pid] = (c["messages"], c["highest_seq"], c["consistent"])
    return {"queues": queues, "persistence": persistence}


def _state_tables(corpus: Path) -> dict:
    queues = {}
    for directory, name in state.queues_of(str(corpus)):
        for r in state.queue(directory, name).readers:
            queues[(r.queue, r.reader)] = (r.head, r.tail, r.pending)
    persistence = {}
    for d in ("akka0", "akka1", "akka2"):
        for pid in state.persistence(str(corpus / d)).ids:
            persistence[pid.persistence_id] = (pid.messages, pid.highest_seq, pid.consistent)
    return {"queues": queues, "persistence": persistence}


def test_state_agrees_with_the_derived_tables_definitions(records_corpus):
    assert _state_tables(records_corpus) == _reference_tables(records_corpus)


def test_transactions_agree_with_the_conformance_records(records_corpus, records_expected):
    got = sorted((Path(r["source"]).name, r["offset"], r["time"], r["status"], r["ops"])
                 for p in sorted(records_corpus.glob("*.jrnl"))
                 for r in state.transactions(str(p))[0])
    expected = sorted((name, rec["offset"], rec["time"], rec["status"],
                       [op["op"] if isinstance(op, dict) else op for op in rec["ops"]])
                      for name, v in records_expected.items() if v["format"] == "jrnl"
                      for rec in v["records"])
    assert got == expected


@pytest.mark.spark
def test_state_agrees_with_spark_derived_tables(spark, records_corpus, tmp_path):
    """Both sides on the conformance corpus: the pipeline's derived tables (Spark) and
    journalfs.state."""
    import pyarrow.parquet as pq
    from journalfs.spark.pipeline import run
    src = tmp_path / "in" / "records"
    shutil.copytree(records_corpus, src)
    run(spark, str(tmp_path / "in"), str(tmp_path / "out"))

    def table(name):
        return pq.read_table(tmp_path / "out" / name).to_pylist()
    queues = {(r["queue"], r["reader"]): (r["head"], r["tail"], r["pending"])
              for r in table("queues")}
    persistence = {r["persistence_id"]: (r["messages"], r["highest_seq"], r["consistent"])
                   for r in table("persistence")}
    txs = sorted((Path(r["source"]).name, r["offset"], r["status"], list(r["ops"]))
                 for r in table("transactions"))
    assert _state_tables(src) == {"queues": queues, "persistence": persistence}
    assert sorted((Path(r["source"]).name, r["offset"], r["status"], r["ops"])
                  for p in sorted(src.glob("*.jrnl")) for r in state.transactions(str(p))[0]) \
        == txs


def test_queue_state_is_live(tmp_path):
    """A writer appends and a reader moves its head while `queue --watch` runs."""
    q = tmp_path / "q"
    q.mkdir()
    records = demo.kestrel_put_records(random.Random(3), 10)
    data = KESTREL.write(records)
    ends = [len(KESTREL.write(records[:i])) for i in range(11)]
    (q / "jobs.1700000000000").write_bytes(data[:ends[4]])
    (q / "jobs.read.mailer").write_bytes(READER.write([{"kind": "read_head", "id": 1}]))
    proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "queue", str(q / "jobs"),
                             "--json", "--watch"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        def next_row():
            try:
                return json.loads(lines.get(timeout=60))
            except queue.Empty:
                proc.terminate()
                raise AssertionError(f"no answer from queue --watch: {proc.stderr.read()}")
        assert (next_row()["pending"]) == 3
        with open(q / "jobs.1700000000000", "ab") as f:
            f.write(data[ends[4]:ends[6]])
        row = next_row()
        assert (row["tail"], row["pending"]) == (6, 5)
        tmp = q / "jobs.read.mailer~~"
        tmp.write_bytes(READER.write([{"kind": "read_head", "id": 5},
                                      {"kind": "read_done", "ids": [6]}]))
        os.rename(tmp, q / "jobs.read.mailer")
        deadline = time.monotonic() + 10
        while (row["head"], row["pending"]) != (5, 0) and time.monotonic() < deadline:
            row = next_row()
        assert (row["head"], row["tail"], row["pending"]) == (5, 6, 0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_changes_of_the_demo_gvfs_journal(demo_tree):
    log = demo_tree / "gvfs-metadata" / "home-5eedface.log"
    rows = _lines(run_cli("changes", str(log), "--json"))
    got = [(r["change"], r["path"], r["key"], r.get("before"), r.get("after"), r["source"])
           for r in rows]
    assert got == [
        ("set", "/docs/report.txt", "rating", None, "5", None),
        ("set-list", "/docs/notes.md", "tags", None, ["draft", "q3"], None),
        # the tree had this value: the journal's own tree is the base of the replay
        ("unset", "/docs/report.txt", "annotation", "sync #0", None, None),
        ("copy", "/docs/archive/old-notes.md", None, None, None, "/docs/old-notes.md"),
        ("remove", "/docs/old-notes.md", None, None, None, None),
    ]
    tree = json.loads(run_cli("meta", "dump", str(demo_tree / "gvfs-metadata" / "home"),
                              "--json").stdout)
    assert "annotation" not in tree.get("/docs/report.txt", {})
    assert tree["/docs/report.txt"]["rating"] == "5"
    only = _lines(run_cli("changes", str(log), "--json", "--path", "/docs/old-notes.md"))
    assert [r["change"] for r in only] == ["copy", "remove"]
    table = run_cli("changes", str(log)).stdout
    assert 'annotation: "sync #0" -> (unset)' in table
