"""`journalfs records` selections (-n, --count, --from/--to, --since/--until, --kind, --key,
--grep, --payload) on every format, several files and queues, the on-disk index, and
-f/--follow with real writers appending, new segments, truncation and rotation."""
from __future__ import annotations

import datetime as dt
import json
import os
import queue
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from journalfs import demo
from journalfs.formats import CODECS
from journalfs.jsonlines import record_line
from journalfs.journals import sniff_file
from journalfs.selection import format_time, parse_time, record_time_ns
from codec_helpers import file_records
from test_records_cli import run_cli

KESTREL = CODECS["kestrel-writer"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test's on-disk indexes in its own cache directory (never the user's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    demo.write_demo(root)
    return root


def _journals(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and sniff_file(str(p)))


def _json(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _want(records) -> list[dict]:
    return [json.loads(record_line(r)) for r in records]


# -- selections on every format ------------------------------------------------------------

def test_each_selection_on_each_format(demo_tree):
    formats = set()
    for path in _journals(demo_tree):
        codec = sniff_file(str(path))
        formats.add(codec.name)
        records = file_records(path)
        assert len(records) >= 2, path
        p = str(path)
        assert _json(run_cli("records", p, "--json", "-n", "3")) == _want(records[-3:]), p
        assert _json(run_cli("records", p, "--json", "-n", "0")) == []
        assert _json(run_cli("records", p, "--json", "--count", "2")) == _want(records[:2]), p
        assert _json(run_cli("records", p, "--json", "--from", "1", "--to", "2")) == \
            _want(records[1:3]), p
        assert _json(run_cli("records", p, "--json", "--from", str(len(records)))) == []
        kind = records[-1]["kind"]
        assert _json(run_cli("records", p, "--json", "--kind", f"{kind},nosuchkind")) == \
            _want([r for r in records if r["kind"] == kind]), p
        # a grep for a piece of the middle record's line: every line that has it
        line = record_line(records[len(records) // 2], "auto")
        needle = re.escape(line[-12:-2])
        assert _json(run_cli("records", p, "--json", "--grep", needle)) == \
            _want([r for r in records if re.search(needle, record_line(r, "auto"))]), p
        # times: the records from the middle one's time on, and up to it
        mid = records[len(records) // 2]
        ns = record_time_ns(codec, mid)
        if codec.columns.time is None:
            assert ns is None
            assert _json(run_cli("records", p, "--json", "--since", "@0")) == []
            continue
        at = f"@{ns // 10**9}.{ns % 10**9:09d}"
        assert _json(run_cli("records", p, "--json", "--since", at)) == \
            _want([r for r in records if record_time_ns(codec, r) >= ns]), p
        assert _json(run_cli("records", p, "--json", "--until", at)) == \
            _want([r for r in records if record_time_ns(codec, r) <= ns]), p
    assert formats == set(CODECS)


def test_key_selects_queue_persistence_id_and_path(demo_tree):
    data = demo_tree / "akka" / "orders" / "data"
    got = _json(run_cli("records", str(data), "--json", "--key", "order-17"))
    from journalfs.formats.akka import follow_chain
    metas = file_records(demo_tree / "akka" / "orders" / "meta")
    meta = next(m for m in metas if m["persistence_id"] == "order-17")
    chain, problems = follow_chain(meta, {m["self"]: m for m in file_records(data)})
    assert not problems and len(chain) >= 2
    assert [g["self"] for g in got] == sorted(m["self"] for m in chain)  # file order
    log = demo_tree / "gvfs-metadata" / "home-5eedface.log"
    got = _json(run_cli("records", str(log), "--json", "--key", "/docs/notes.md"))
    assert got and all(g["path"] == "/docs/notes.md" for g in got)
    queue_dir = demo_tree / "queues"
    got = _json(run_cli("records", str(queue_dir / "jobs"), "--json", "--key", "jobs"))
    assert len(got) == sum(len(file_records(p)) for p in queue_dir.iterdir())
    assert _json(run_cli("records", str(queue_dir / "jobs"), "--json", "--key", "other")) == []


def test_a_queue_is_its_segments_in_order_then_its_readers(demo_tree, tmp_path):
    q = tmp_path / "q"
    q.mkdir()
    for p in (demo_tree / "queues").iterdir():
        (q / p.name).write_bytes(p.read_bytes())
    # a segment numbered 9 sorts before 1700000000000 by number (not by text)
    (q / "jobs.9").write_bytes(KESTREL.write(demo.kestrel_put_records(random.Random(2), 2)))
    (q / "other.5").write_bytes((q / "jobs.9").read_bytes())
    got = _json(run_cli("records", str(q / "jobs"), "--json"))
    sources = []
    for g in got:
        if not sources or sources[-1] != g["source"]:
            sources.append(g["source"])
    names = [os.path.basename(s) for s in sources]
    assert names == ["jobs.9", "jobs.1700000000000", "jobs.1700000060000", "jobs.read.",
                     "jobs.read.mailer"]
    # -n counts over the whole queue: the last records are the readers'
    last = _json(run_cli("records", str(q / "jobs"), "--json", "-n", "3"))
    readers = [(p.name, r) for p in sorted(q.glob("jobs.read.*")) for r in file_records(p)]
    assert [(os.path.basename(g["source"]), g["seq"]) for g in last] == \
        [(name, r["seq"]) for name, r in readers[-3:]]
    # a directory: every journal under it, with its source
    everything = _json(run_cli("records", str(q), "--json"))
    assert {os.path.basename(g["source"]) for g in everything} == {p.name for p in q.iterdir()}


def test_payload_modes_keep_the_contract_names(demo_tree):
    p = str(demo_tree / "wallaby" / "events.log")
    raw = file_records(demo_tree / "wallaby" / "events.log")[0]["payload"]
    (b64,) = _json(run_cli("records", p, "--json", "-c", "1"))
    assert "payload" not in b64 and b64["payload_b64"]
    (auto,) = _json(run_cli("records", p, "--json", "-c", "1", "--payload", "auto"))
    assert auto["payload"] == raw.decode() and "payload_b64" not in auto
    (hexed,) = _json(run_cli("records", p, "--json", "-c", "1", "--payload", "hex"))
    assert bytes.fromhex(hexed["payload_hex"]) == raw


def test_binary_payloads_stay_base64_in_auto_and_text(tmp_path):
    path = tmp_path / "jobs.1700000000000"
    recs = demo.kestrel_put_records(random.Random(4), 2)
    recs[0]["payload"] = b"\xff\xfe\x00binary"
    path.write_bytes(KESTREL.write(recs))
    for mode in ("auto", "text"):
        first, second = _json(run_cli("records", str(path), "--json", "--payload", mode))
        assert "payload" not in first and first["payload_b64"] == "//4AYmluYXJ5"
        assert second["payload"] == recs[1]["payload"].decode()
    table = run_cli("records", str(path), "--payload", "text").stdout
    assert "\\xff\\xfe" in table


def test_table_shows_iso_times_and_keeps_raw_numbers_in_json(demo_tree):
    p = demo_tree / "queues" / "jobs.1700000000000"
    rec = file_records(p)[0]
    row = run_cli("records", str(p), "--utc", "-c", "1").stdout.splitlines()[2]
    iso = dt.datetime.fromtimestamp(rec["add_time"] / 1000, dt.timezone.utc)
    assert iso.strftime("%Y-%m-%dT%H:%M:%S.") + f"{rec['add_time'] % 1000:03d}Z" in row.split()
    (line,) = _json(run_cli("records", str(p), "--json", "-c", "1", "--utc"))
    assert line["add_time"] == rec["add_time"]


def test_usage_errors_are_one_line(demo_tree):
    p = str(demo_tree / "jrnl" / "db.jrnl")
    for argv in (("--since", "not a time"), ("-n", "1", "--count", "2"), ("--grep", "("),
                 ("--from", "5", "--to", "2"), ("-n", "-3")):
        proc = run_cli("records", p, *argv)
        assert proc.returncode == 2, argv
        assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1]


def test_relative_times_as_journalctl_takes_them(demo_tree):
    p = str(demo_tree / "jrnl" / "db.jrnl")
    assert _json(run_cli("records", p, "--json", "--since", "-10min")) == []  # 2023's records
    assert len(_json(run_cli("records", p, "--json", "--until", "-10min"))) == \
        len(file_records(p))
    assert _json(run_cli("records", p, "--json", "--since", "today")) == []
    proc = run_cli("records", p, "--since", "-1h", real=True)
    assert proc.returncode == 0, proc.stderr


def test_parse_time_forms():
    now = 1_700_000_000 * 10**9  # 2023-11-14T22:13:20Z
    assert parse_time("now", now_ns=now) == now
    assert parse_time("-10min", now_ns=now) == now - 600 * 10**9
    assert parse_time("-1h30min", now_ns=now) == now - 5400 * 10**9
    assert parse_time("+2d", now_ns=now) == now + 2 * 86400 * 10**9
    assert parse_time("5 min ago", now_ns=now) == now - 300 * 10**9
    assert parse_time("@1700000000.5") == now + 5 * 10**8
    assert parse_time("2023-11-14T22:13:20Z") == now
    assert parse_time("2023-11-14 22:13:20", utc=True) == now
    assert parse_time("2023-11-14", utc=True) == now - (22 * 3600 + 13 * 60 + 20) * 10**9
    assert parse_time("today", utc=True, now_ns=now) == parse_time("2023-11-14", utc=True)
    assert parse_time("yesterday", utc=True, now_ns=now) == \
        parse_time("2023-11-13", utc=True)
    for bad in ("", "soon", "-10 parsecs", "2023-13-45"):
        with pytest.raises(ValueError):
            parse_time(bad)


def test_format_time_of_hostile_values_is_the_number():
    assert format_time(10**30, "ms", utc=True) == str(10**30 // 10**6)
    assert format_time(0, "s", utc=True) == "1970-01-01T00:00:00Z"
    assert format_time(1_700_000_000_123_456_789, "ns", utc=True) == \
        "2023-11-14T22:13:20.123456789Z"


# -- big files: the index ------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_queue(tmp_path_factory) -> tuple[Path, list[dict]]:
    """~6 MB: 40,000 PUTs whose times grow (many checkpoints for the bisection)."""
    path = tmp_path_factory.mktemp("bigq") / "big.1700000000000"
    records = demo.kestrel_put_records(random.Random(9), 40_000, payload=(100, 180))
    path.write_bytes(KESTREL.write(records))
    return path, file_records(path)


def test_selections_on_a_big_file_use_and_keep_the_index(big_queue, tmp_path):
    path, records = big_queue
    p = str(path)
    assert _json(run_cli("records", p, "--json", "-n", "10")) == _want(records[-10:])
    saved = list((tmp_path / "cache" / "journalfs" / "indexes").iterdir())
    assert len(saved) == 1 and saved[0].name.endswith(".jfsidx")
    assert os.stat(saved[0]).st_mode & 0o777 == 0o600
    # the saved index answers the next selections
    assert _json(run_cli("records", p, "--json", "--from", "31000", "--count", "5")) == \
        _want(records[31000:31005])
    t = record_time_ns(KESTREL, records[20_000])
    since = f"@{t // 10**9}.{t % 10**9:09d}"
    t2 = record_time_ns(KESTREL, records[20_100])
    until = f"@{t2 // 10**9}.{t2 % 10**9:09d}"
    assert _json(run_cli("records", p, "--json", "--since", since, "--until", until)) == \
        _want([r for r in records if t <= record_time_ns(KESTREL, r) <= t2])
    assert _json(run_cli("records", p, "--json", "--since", since, "-n", "3")) == \
        _want(records[-3:])
    # filters on -n walk back a checkpoint at a time
    odd = [r for r in records if r["id"] % 1000 == 7]
    assert _json(run_cli("records", p, "--json", "--grep", r'"id": \d*007,', "-n", "4")) == \
        _want(odd[-4:])


def test_index_of_a_grown_file_is_extended(big_queue, tmp_path):
    path, records = big_queue
    grown = tmp_path / path.name
    grown.write_bytes(path.read_bytes())
    assert len(_json(run_cli("records", str(grown), "--json", "-n", "1"))) == 1
    more = demo.kestrel_put_records(random.Random(5), 3, first_id=40_001,
                                    start_ms=records[-1]["add_time"])
    with open(grown, "ab") as f:
        f.write(KESTREL.write(more)[4:])  # the frames after the magic
    got = _json(run_cli("records", str(grown), "--json", "-n", "4"))
    assert [g["id"] for g in got] == [40_000, 40_001, 40_002, 40_003]


def test_damaged_file_selection_prints_the_valid_records_then_exits_3(tmp_path):
    path = tmp_path / "torn.1800000000000"
    recs = demo.kestrel_put_records(random.Random(7), 21)
    whole = len(KESTREL.write(recs[:20]))
    path.write_bytes(KESTREL.write(recs)[:whole + 9])
    proc = run_cli("records", str(path), "--json", "-n", "2", real=True)
    assert proc.returncode == 3
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [19, 20]
    assert len(proc.stderr.splitlines()) == 1 and f"byte {whole}" in proc.stderr


# -- following ---------------------------------------------------------------------------------

class Follow:
    """``journalfs records -f ...`` as a real process; its lines read with timeouts."""

    def __init__(self, *argv: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "records", "-f",
                                      *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.out: queue.Queue = queue.Queue()
        self.err: queue.Queue = queue.Queue()
        for stream, q in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, q), daemon=True).start()

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line.rstrip("\n"))

    def lines(self, n: int, timeout: float = 20) -> list[str]:
        got, deadline = [], time.monotonic() + timeout
        while len(got) < n:
            got.append(self.out.get(timeout=max(0.01, deadline - time.monotonic())))
        return got

    def records(self, n: int, timeout: float = 20) -> list[dict]:
        return [json.loads(line) for line in self.lines(n, timeout)]

    def notice(self, timeout: float = 20) -> str:
        return self.err.get(timeout=timeout)

    def quiet(self, seconds: float = 0.5) -> bool:
        time.sleep(seconds)
        return self.out.empty()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def follow():
    started = []

    def start(*argv):
        f = Follow(*argv)
        started.append(f)
        return f
    yield start
    for f in started:
        f.stop()


class Writer:
    """A Kestrel writer appending PUTs frame by frame, as a real writer does."""

    def __init__(self, path: Path, count: int = 200, first_id: int = 1):
        self.path = path
        self.records = demo.kestrel_put_records(random.Random(first_id), count, first_id=first_id)
        self.data = KESTREL.write(self.records)
        self.ends = [len(KESTREL.write(self.records[:i])) for i in range(count + 1)]
        self.written = 0

    def put(self, n: int = 1, torn_pause: float = 0.0) -> list[dict]:
        with open(self.path, "ab") as f:
            for _ in range(n):
                lo, hi = self.ends[self.written], self.ends[self.written + 1]
                if torn_pause:  # half a frame first, the rest later
                    f.write(self.data[lo:lo + 5])
                    f.flush()
                    time.sleep(torn_pause)
                    lo += 5
                f.write(self.data[lo:hi])
                f.flush()
                self.written += 1
        return self.records[self.written - n:self.written]

    def start(self, n: int) -> None:
        self.path.write_bytes(self.data[:self.ends[n]])
        self.written = n


def test_follow_prints_appended_records_as_a_writer_adds_them(tmp_path, follow):
    w = Writer(tmp_path / "jobs.1700000000000")
    w.start(15)
    f = follow(str(w.path), "--json")
    assert [r["id"] for r in f.records(10)] == list(range(6, 16))  # the last 10 first
    assert f.quiet(0.3)
    for _ in range(5):
        (rec,) = w.put()
        (got,) = f.records(1)
        assert got["id"] == rec["id"] and got["seq"] == rec["id"] - 1
    # a burst, and a PUT written in two pieces (the follower waits for the rest)
    burst = w.put(20)
    assert [r["id"] for r in f.records(20)] == [r["id"] for r in burst]
    (torn,) = w.put(torn_pause=0.4)
    assert [r["id"] for r in f.records(1)] == [torn["id"]]
    assert f.err.empty(), f.err.get()


def test_follow_table_and_filters_apply_to_new_records(tmp_path, follow):
    w = Writer(tmp_path / "jobs.1700000000000")
    w.start(3)
    f = follow(str(w.path), "--kind", "put", "--grep", '"id": 1[0-9],', "--json")
    assert f.quiet(0.3)
    w.put(20)
    assert [r["id"] for r in f.records(10)] == list(range(10, 20))
    assert f.quiet(0.3)


def test_follow_a_queue_picks_up_new_segments_and_readers(tmp_path, follow):
    q = tmp_path / "q"
    q.mkdir()
    w = Writer(q / "jobs.1700000000000")
    w.start(2)
    f = follow(str(q / "jobs"), "--json")
    assert [r["id"] for r in f.records(2)] == [1, 2]
    w2 = Writer(q / "jobs.1700000000001", first_id=3)
    w2.start(0)
    (w2.path).write_bytes(w2.data[:w2.ends[1]])
    notice = f.notice()
    assert "new file" in notice and "jobs.1700000000001" in notice
    (rec,) = f.records(1)
    assert rec["id"] == 3 and rec["source"] == str(w2.path)
    w2.written = 1
    w2.put(2)
    assert [r["id"] for r in f.records(2)] == [4, 5]
    reader = q / "jobs.read.mailer"
    reader.write_bytes(CODECS["kestrel-reader"].write([{"kind": "read_head", "id": 3}]))
    (rec,) = f.records(1)
    assert rec["kind"] == "read_head" and rec["source"] == str(reader)
    # something else in the directory is not part of the queue
    Writer(q / "other.1700000000000").start(2)
    assert f.quiet(0.5)


def test_follow_says_rewritten_when_a_file_is_rewritten_in_place(tmp_path, follow):
    w = Writer(tmp_path / "jobs.1700000000000")
    w.start(3)
    f = follow(str(w.path), "--json")
    assert len(f.records(3)) == 3
    # other records written over it from byte 0, as long as before or longer (a WAL reset):
    # not a truncation, but read again from its start all the same
    again = Writer(w.path, first_id=40)
    new_bytes = again.data[:again.ends[6]]
    assert len(new_bytes) >= w.path.stat().st_size
    fd = os.open(w.path, os.O_WRONLY)  # no O_TRUNC: the size never goes down
    try:
        os.pwrite(fd, new_bytes, 0)
    finally:
        os.close(fd)
    notice = f.notice()
    assert "rewritten in place" in notice and "truncated" not in notice
    assert str(w.path) in notice
    assert [r["id"] for r in f.records(6)] == [40, 41, 42, 43, 44, 45]


def test_follow_survives_truncation_and_rotation(tmp_path, follow):
    w = Writer(tmp_path / "jobs.1700000000000")
    w.start(5)
    f = follow(str(w.path), "--json")
    assert len(f.records(5)) == 5
    # truncated and written again: reported, then read from its start
    w.start(2)
    notice = f.notice()
    assert "truncated" in notice and str(w.path) in notice
    assert [r["id"] for r in f.records(2)] == [1, 2]
    w.put(1)
    assert [r["id"] for r in f.records(1)] == [3]
    # rotated: a new file renamed over the path
    new = Writer(tmp_path / "next", first_id=100)
    new.start(3)
    os.rename(new.path, w.path)
    assert "replaced" in f.notice()
    assert [r["id"] for r in f.records(3)] == [100, 101, 102]
    new.path = w.path
    new.put(1)
    assert [r["id"] for r in f.records(1)] == [103]
    # removed: reported; it comes back as a new file
    os.unlink(w.path)
    assert "removed" in f.notice()
    Writer(w.path, first_id=500).start(1)
    assert "replaced" in f.notice()
    assert [r["id"] for r in f.records(1)] == [500]
    assert f.proc.poll() is None


def test_follow_reports_damage_that_stays_and_goes_on(tmp_path, follow):
    w = Writer(tmp_path / "jobs.1700000000000")
    w.start(2)
    f = follow(str(w.path), "--json")
    assert len(f.records(2)) == 2
    with open(w.path, "ab") as out:
        out.write(b"\x99garbage")
    notice = f.notice(timeout=10)
    assert "damaged at byte" in notice and str(w.path) in notice
    assert f.proc.poll() is None and f.quiet(0.2)


def test_follower_reads_a_big_burst_a_window_at_a_time(tmp_path, monkeypatch):
    """Much appended at once is read in windows (memory stays a window), records that cross
    a window's end included, each record once and in order."""
    from journalfs import selection
    monkeypatch.setattr(selection, "FOLLOW_WINDOW", 200)  # smaller than some records
    w = Writer(tmp_path / "jobs.1700000000000", count=300)
    w.start(1)
    groups, sources = selection.expand_sources([str(w.path)])
    follower = selection.Follower(groups)
    first = file_records(w.path)[0]
    follower.start(sources[0], (first["offset"], first["seq"]), None)
    try:
        w.put(250)
        got = [item[1]["id"] for item in follower.poll()
               if not isinstance(item, selection.Notice)]
        assert got == list(range(2, 252))
        assert not any(isinstance(i, selection.Notice) for i in follower.poll())
    finally:
        follower.close()
