"""`tail -f` on MNT/.journalfs/records/<journal>/records.jsonl while a writer appends to the
SOURCE journal: real mount, real GNU tail (inotify and ---disable-inotify polling), growth
seen by an open handle and by stat, truncation and rotation ending the stream cleanly."""
from __future__ import annotations

import json
import os
import queue
import random
import select
import subprocess
import threading
import time
from pathlib import Path

import pytest

from journalfs import demo
from journalfs.formats import CODECS
from journalfs.jsonlines import json_line
from mountutil import mounted

pytestmark = pytest.mark.fuse

KESTREL = CODECS["kestrel-writer"]


class Writer:
    """A Kestrel writer appending PUT frames to SOURCE/jobs.<n>."""

    def __init__(self, path: Path, count: int = 300, first_id: int = 1):
        self.path = path
        self.records = demo.kestrel_put_records(random.Random(first_id), count, first_id=first_id)
        frames = [KESTREL.write([rec])[4:] for rec in self.records]  # after the magic
        self.data = KESTREL.write([]) + b"".join(frames)
        self.ends = [4]
        for frame in frames:
            self.ends.append(self.ends[-1] + len(frame))
        self.written = 0

    def start(self, n: int) -> None:
        self.path.write_bytes(self.data[:self.ends[n]])
        self.written = n

    def put(self, n: int = 1) -> list[dict]:
        with open(self.path, "ab") as f:
            f.write(self.data[self.ends[self.written]:self.ends[self.written + n]])
        self.written += n
        return self.records[self.written - n:self.written]

    def lines(self, lo: int, hi: int) -> list[dict]:
        """The records.jsonl lines of records lo..hi-1 (as the CLI prints them)."""
        out = []
        for rec in KESTREL.read(self.data[:self.ends[hi]], "x"):
            if lo <= rec["seq"] < hi:
                out.append(json.loads(json_line(rec)))
        return out


@pytest.fixture
def mount(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with mounted(src, tmp_path / "mnt", "--store", str(tmp_path / "store")) as m:
        m.views = m.mountpoint / ".journalfs"
        yield m
        log = m.stderr()
        assert "Traceback" not in log and "ERROR" not in log, log


class Tail:
    """A real `tail -f` (or -F) process; its output lines read with timeouts."""

    def __init__(self, path: Path, *options: str):
        if "-n" not in options:
            options = (*options, "-n", "+1")
        self.proc = subprocess.Popen(["tail", *options, "-s", "0.1", str(path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.out.put(line)

    def lines(self, n: int, timeout: float = 20) -> list[dict]:
        got, deadline = [], time.monotonic() + timeout
        while len(got) < n:
            line = self.out.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line.endswith("\n"), f"a piece of a line: {line!r}"
            got.append(json.loads(line))
        return got

    def quiet(self, seconds: float) -> bool:
        time.sleep(seconds)
        return self.out.empty()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def tails():
    started: list[Tail] = []

    def start(path, *options):
        t = Tail(path, *options)
        started.append(t)
        return t
    yield start
    for t in started:
        t.stop()


@pytest.mark.parametrize("options", [("-f",), ("-f", "---disable-inotify")],
                         ids=["inotify", "polling"])
def test_tail_f_streams_records_as_the_journal_grows(mount, tails, options):
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(5)
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    t = tails(jsonl, *options)
    assert t.lines(5) == w.lines(0, 5)
    for i in range(5, 12):
        w.put()
        assert t.lines(1) == w.lines(i, i + 1)
    w.put(40)  # a burst
    assert t.lines(40) == w.lines(12, 52)
    assert os.stat(jsonl).st_size == len(b"".join(json_line(r) for r in
                                                  KESTREL.read(w.path.read_bytes(), "x")))
    assert t.quiet(0.5)


def test_an_open_handle_sees_growth_and_stat_the_new_size(mount):
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(3)
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    with open(jsonl, "rb") as f:
        first = f.read()
        assert first.count(b"\n") == 3 and f.read() == b""
        w.put(2)
        want = b"".join(json_line(r) for r in KESTREL.read(w.path.read_bytes(), "x"))
        assert os.stat(jsonl).st_size == len(want)  # attributes are not cached
        assert os.fstat(f.fileno()).st_size == len(want)
        assert first + f.read() == want
        assert f.read() == b""
        # a fresh reader sees the same bytes
        assert jsonl.read_bytes() == want


def test_truncation_and_rotation_end_the_stream_cleanly(mount):
    """An open handle: past the end it served, a truncated or replaced journal gives
    end-of-file, never a piece of a line; starting over at 0 gives the journal as it is."""
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(6)
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    with open(jsonl, "rb") as f:
        assert f.read().count(b"\n") == 6
        w.start(2)  # truncated and written again in place
        assert f.read() == b"" and f.read() == b""
        w.put(10)  # it grows past its old length: still not this stream
        assert f.read() == b""
        f.seek(0)  # starting over: the journal as it is now
        assert [json.loads(x) for x in f.read().splitlines()] == w.lines(0, 12)
        new = Writer(mount.source / "next", first_id=1000)
        new.start(20)
        os.rename(new.path, w.path)  # rotated: a bigger file under the same name
        assert f.read() == b""
        f.seek(0)
        assert [x["id"] for x in map(json.loads, f.read().splitlines())] == \
            list(range(1000, 1020))


@pytest.mark.parametrize("options", [("-f",), ("-F",)], ids=["descriptor", "name"])
def test_tail_after_truncation_and_rotation(mount, tails, options):
    """tail says "file truncated" and goes on with the new lines, whole."""
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(12)
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    t = tails(jsonl, *options)
    assert t.lines(12) == w.lines(0, 12)
    w.start(3)
    assert t.lines(3) == w.lines(0, 3)
    w.put(2)
    assert t.lines(2) == w.lines(3, 5)
    new = Writer(mount.source / "next", first_id=1000)
    new.start(2)
    os.rename(new.path, w.path)
    new.path = w.path
    assert [x["id"] for x in t.lines(2)] == [1000, 1001]
    new.put(3)
    assert [x["id"] for x in t.lines(3)] == [1002, 1003, 1004]
    assert any("truncated" in line for line in t.err), t.err


def test_a_torn_append_shows_once_complete(mount, tails):
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(2)
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    t = tails(jsonl, "-f")
    assert len(t.lines(2)) == 2
    lo, hi = w.ends[2], w.ends[3]
    with open(w.path, "ab") as f:
        f.write(w.data[lo:lo + 7])
        f.flush()
        assert t.quiet(0.6)
        f.write(w.data[lo + 7:hi])
    w.written = 3
    assert t.lines(1) == w.lines(2, 3)


def test_tail_f_on_a_big_journal_once_its_size_is_known(mount, tails):
    """A journal over 4 MiB shows records.jsonl with size 0 until read once; after that
    `tail -f` starts at its last lines and follows, the size extended by the growth only."""
    count = 45_000
    w = Writer(mount.source / "jobs.1700000000000", count=count + 20)
    w.start(count)
    assert w.path.stat().st_size > 4 << 20
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    whole = jsonl.read_bytes()  # measures it
    assert whole.count(b"\n") == count
    assert os.stat(jsonl).st_size == len(whole)
    t = tails(jsonl, "-f", "-n", "3")
    assert t.lines(3) == w.lines(count - 3, count)
    w.put(5)
    assert t.lines(5) == w.lines(count, count + 5)
    assert os.stat(jsonl).st_size == len(whole) + sum(
        len(json_line(r)) for r in KESTREL.read(w.path.read_bytes(), "x") if r["seq"] >= count)


def test_a_record_file_appears_only_whole_and_never_changes(mount):
    """Kestrel writes a record whole (a torn frame at the end is not a record yet): a
    half-written PUT is neither listed nor found by name, and a record file, once there, holds
    its whole payload; `tail -f` on it prints that payload and nothing more as the journal
    grows (docs/views.md: which formats' record files can change)."""
    w = Writer(mount.source / "jobs.1700000000000")
    w.start(2)
    view = mount.views / "records" / w.path.name
    name = f"{2:08d}.put"
    assert sorted(os.listdir(view)) == [f"{0:08d}.put", f"{1:08d}.put", "records.jsonl"]
    lo, hi = w.ends[2], w.ends[3]
    with open(w.path, "ab") as f:
        f.write(w.data[lo:hi - 5])  # all but the last bytes of its payload
        f.flush()
        time.sleep(0.3)
        assert name not in os.listdir(view)
        assert not (view / name).exists()
        f.write(w.data[hi - 5:hi])
    w.written = 3
    payload = w.records[2]["payload"]
    deadline = time.monotonic() + 10
    while name not in os.listdir(view):
        assert time.monotonic() < deadline, os.listdir(view)
        time.sleep(0.05)
    assert (view / name).read_bytes() == payload
    assert (view / name).stat().st_size == len(payload)
    tail = subprocess.Popen(["tail", "-f", "-c", "+1", "-s", "0.1", str(view / name)],
                            stdout=subprocess.PIPE)
    try:
        def output(seconds: float) -> bytes:  # what tail printed within ``seconds``
            got, deadline = b"", time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                if select.select([tail.stdout], [], [], left)[0]:
                    got += os.read(tail.stdout.fileno(), 1 << 16)
            return got
        assert output(2) == payload
        w.put(5)  # the journal grows; this record does not
        assert output(0.8) == b""
    finally:
        tail.terminate()
        tail.wait(timeout=10)
    assert (view / name).read_bytes() == payload


def test_a_jrnl_transaction_being_written_shows_each_state_whole(mount):
    """JRNL's last transaction is a record while it is written (the spec's rollback state),
    and it changes in place: each whole operation appended, then the flag set. It shows once
    its header and first operation are whole; while an operation is half-written it does not
    show (the journal reads as damaged there, as fsck would roll it back); each open serves
    one whole JSON line of the state as of that open, and a new open the state as it is now."""
    jrnl = CODECS["jrnl"]
    recs = demo.jrnl_records(random.Random(5), 3, last="complete")
    final = jrnl.write(recs)
    tx = len(jrnl.write(recs[:2]))  # where the writer puts the third transaction
    op_ends, at = [], tx + 25
    for op in recs[2]["ops"]:
        at += len(jrnl.write([{"ops": [op]}])) - 20 - 25
        op_ends.append(at)
    assert op_ends[-1] == len(final)
    incomplete = bytearray(final)
    incomplete[tx + 24] = 0  # the flag is set last, in place
    path = mount.source / "pages.jrnl"
    path.write_bytes(incomplete[:tx + 20])  # linked, its header not yet whole
    view = mount.views / "records" / path.name
    name = f"{2:08d}.transaction"

    def grow_to(end: int) -> None:
        with open(path, "ab") as f:
            f.write(incomplete[path.stat().st_size:end])

    def shown(present: bool) -> bytes | None:
        deadline = time.monotonic() + 10
        while (name in os.listdir(view)) != present:
            assert time.monotonic() < deadline, (present, os.listdir(view))
            time.sleep(0.05)
        return (view / name).read_bytes() if present else None

    assert sorted(os.listdir(view))[:2] == [f"{0:08d}.transaction", f"{1:08d}.transaction"]
    assert shown(False) is None
    grow_to(op_ends[0] - 3)  # the first operation torn
    time.sleep(0.3)
    assert shown(False) is None
    for n, end in enumerate(op_ends[:-1]):
        grow_to(end)
        line = shown(True)
        rec = json.loads(line)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert (rec["status"], len(rec["ops"])) == ("rollback", n + 1)
        assert rec["ops"] == recs[2]["ops"][:n + 1]
        with open(view / name, "rb") as handle:
            grow_to(end + 3)  # the next operation torn: the transaction is not shown
            assert shown(False) is None
            assert handle.read() == line  # the handle keeps the state it opened, whole
    grow_to(op_ends[-1])  # the completion op is whole, the flag not set yet: redo
    rec = json.loads(shown(True))
    assert rec["status"] == "redo" and rec["ops"] == recs[2]["ops"]
    with open(path, "r+b") as f:
        f.seek(tx + 24)
        f.write(bytes([final[tx + 24]]))
    deadline = time.monotonic() + 10
    while (rec := json.loads((view / name).read_bytes()))["status"] != "complete":
        assert time.monotonic() < deadline, rec
        time.sleep(0.05)
    assert rec["ops"] == recs[2]["ops"] and rec["complete"] is True


def test_tail_f_on_a_big_journal_never_read_before(mount, tails):
    """A journal over 4 MiB: records.jsonl shows size 0 at first, and looking at it starts
    measuring it in the background; once its size shows (nobody has read it), `tail -f`
    prints its last lines and follows, and the measured layout is saved with the index."""
    count = 45_000
    w = Writer(mount.source / "jobs.1700000000000", count=count + 20)
    w.start(count)
    assert w.path.stat().st_size > 4 << 20
    jsonl = mount.views / "records" / w.path.name / "records.jsonl"
    want = sum(len(json_line(r)) for r in KESTREL.read(w.path.read_bytes(), "x"))
    assert os.stat(jsonl).st_size in (0, want)
    deadline = time.monotonic() + 60
    while (size := os.stat(jsonl).st_size) == 0:
        assert time.monotonic() < deadline, "records.jsonl's size never showed"
        time.sleep(0.1)
    assert size == want
    t = tails(jsonl, "-f", "-n", "3")
    assert t.lines(3) == w.lines(count - 3, count)
    w.put(5)
    assert t.lines(5) == w.lines(count, count + 5)
    assert t.quiet(0.3)
    status = json.loads((mount.views / "status.json").read_bytes())
    assert status["views"]["indexes_saved"] >= 2, status["views"]  # the index, then its layout
