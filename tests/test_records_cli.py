"""`journalfs records`: JSON lines, the table, damage, streaming with bounded memory, and the
demo tree it is shown on."""
from __future__ import annotations

import base64
import io
import os
import json
import random
import subprocess
import sys
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from journalfs import cli, demo
from journalfs.formats import CODECS, FormatError, record_json_line
from journalfs.formats.akka import AkkaData
from journalfs.formats.base import json_safe
from journalfs.journals import CHECKPOINT_EVERY, RecordIndex, sniff_file

JOURNALFS = Path(sys.executable).with_name("journalfs")
REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv: str, real: bool = False) -> subprocess.CompletedProcess:
    """The CLI in-process (fast), or with ``real=True`` the installed console script."""
    argv = list(argv)
    if real:
        return subprocess.run([str(JOURNALFS), *argv], capture_output=True, text=True,
                              timeout=120)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    demo.write_demo(root)
    return root


def _journals(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and sniff_file(str(p)))


def test_demo_has_every_format(demo_tree):
    formats = {sniff_file(str(p)).name for p in _journals(demo_tree)}
    assert formats == set(CODECS)


def test_committed_demo_is_the_generators_output(demo_tree):
    committed = {p.relative_to(REPO / "demo"): p.read_bytes()
                 for p in (REPO / "demo").rglob("*") if p.is_file()}
    fresh = {p.relative_to(demo_tree): p.read_bytes() for p in demo_tree.rglob("*") if p.is_file()}
    assert committed == fresh, "demo/ is stale: run `python -m journalfs.demo demo`"
    assert sum(map(len, committed.values())) < 200_000


def test_json_lines_are_the_records_in_file_order(demo_tree, capsys):
    for path in _journals(demo_tree):
        codec = sniff_file(str(path))
        want = [record_json_line(r) for r in codec.read(path.read_bytes(), str(path))]
        assert cli.main(["records", str(path), "--json"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out == want, path
        parsed = [json.loads(line) for line in out]
        assert [r["seq"] for r in parsed] == list(range(len(parsed)))
        assert all(r["format"] == codec.name for r in parsed)
        assert all("payload" not in r for r in parsed)  # binary payloads only as payload_b64


def test_table_has_a_row_per_record_with_fixed_columns(demo_tree):
    path = demo_tree / "queues" / f"jobs.{demo.BASE_MS}"
    proc = run_cli("records", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# kestrel-writer"
    assert lines[1].split() == ["SEQ", "OFFSET", "TIME", "KIND", "FIELDS"]
    records = list(CODECS["kestrel-writer"].read(path.read_bytes(), "x"))
    rows = lines[2:]
    assert len(rows) == len(records) == 40
    for row, rec in zip(rows, records):
        seq, offset, when, kind, fields = row.split(None, 4)
        assert (int(seq), int(offset), kind) == (rec["seq"], rec["offset"], "put")
        assert when.startswith("2023-11-1") and "add_time=" not in fields
        assert f"id={rec['id']} " in fields and f"payload=<{len(rec['payload'])} B>" in fields


def test_table_and_notices_carry_no_control_bytes_of_a_hostile_journal(tmp_path):
    """A payload, a string field or a file name with ESC/NUL/BEL bytes reaches the terminal
    escaped (\\x1b ...), never raw: a journal cannot send escape sequences to the reader."""
    codec = CODECS["kestrel-writer"]
    records = demo.kestrel_put_records(random.Random(3), 2)
    records[0]["payload"] = b"\x1b[31mred\x07\x00"
    path = tmp_path / "jobs\x1b[2J.1"
    path.write_bytes(codec.write(records) + b"\x03\xff")  # damage after the records
    proc = run_cli("records", str(path))
    assert proc.returncode == 3
    for text in (proc.stdout, proc.stderr):
        assert not any(c in text for c in "\x1b\x07\x00"), text
    assert "payload=<10 B>\\x1b[31mred\\a\\x00" in proc.stdout
    assert "jobs\\x1b[2J.1" in proc.stderr


def _torn_kestrel(tmp_path: Path) -> tuple[Path, list[dict], FormatError]:
    """A writer file whose 21st PUT is torn after 9 bytes; its prefix and the codec's error."""
    codec = CODECS["kestrel-writer"]
    records = demo.kestrel_put_records(random.Random(7), 21)
    whole = len(codec.write(records[:20]))
    path = tmp_path / "jobs.1800000000000"
    path.write_bytes(codec.write(records)[:whole + 9])
    with pytest.raises(FormatError) as caught:
        list(codec.read(path.read_bytes(), str(path)))
    assert caught.value.offset >= whole
    return path, records[:20], caught.value


def test_damage_prints_prefix_then_one_line_and_exits_3(tmp_path):
    path, prefix, error = _torn_kestrel(tmp_path)
    proc = run_cli("records", str(path), "--json", real=True)
    assert proc.returncode == 3
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in prefix]
    assert proc.stderr.splitlines() == [f"journalfs: {error}"]
    assert str(path) in proc.stderr and f"byte {error.offset}" in proc.stderr


def test_damage_in_table_mode_too(tmp_path):
    path, prefix, _ = _torn_kestrel(tmp_path)
    proc = run_cli("records", str(path))
    assert proc.returncode == 3
    assert len(proc.stdout.splitlines()) == 2 + len(prefix)
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_directory_and_usage_errors(tmp_path):
    proc = run_cli("records", str(tmp_path), real=True)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    proc = run_cli("records")
    assert proc.returncode == 2


@pytest.fixture(scope="module")
def big_kestrel(tmp_path_factory) -> Path:
    """24 MB: 12,000 PUTs of 2,000 bytes."""
    path = tmp_path_factory.mktemp("big") / f"big.{demo.BASE_MS}"
    records = demo.kestrel_put_records(random.Random(3), 12_000, payload=(2000, 2000))
    path.write_bytes(CODECS["kestrel-writer"].write(records))
    return path


def test_huge_file_streams_with_bounded_memory(big_kestrel):
    """Printing 24 MB of records (32 MB of JSON) must not hold them: peak well under either."""
    written = 0

    class CountingSink(io.TextIOBase):
        def write(self, s):
            nonlocal written
            written += len(s)
            return len(s)

    tracemalloc.start()
    try:
        with redirect_stdout(CountingSink()):
            assert cli.main(["records", str(big_kestrel), "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert written > 30_000_000
    assert peak < 16 << 20, f"peak {peak} bytes"


def test_closed_pipe_stops_quietly(big_kestrel):
    proc = subprocess.Popen([str(JOURNALFS), "records", str(big_kestrel), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert first["seq"] == 0 and err == ""


def test_format_error_names_file_and_offset():
    exc = FormatError("/x/jobs.1", 123, "torn record")
    assert str(exc) == "/x/jobs.1: damaged at byte 123: torn record"


def test_undecodable_file_names_stay_valid_json(tmp_path):
    """gvfs stores file names as raw bytes; one that is not UTF-8 must not break the output."""
    path = tmp_path / "home"
    path.write_bytes(CODECS["gvfs-tree"].write(
        [{"path": "/docs/caf\udce9.txt", "mtime": demo.BASE_S, "metadata": {"k": "v"}}]))
    proc = run_cli("records", str(path), "--json", real=True)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    record = json.loads(line)
    assert "path" not in record  # INTERFACES.md point 1: <field>_b64 INSTEAD of <field>
    assert base64.b64decode(record["path_b64"]) == b"/docs/caf\xe9.txt"
    assert record["metadata"] == {"k": "v"}


def test_json_safe_rules():
    raw = "caf\udce9"
    assert json_safe({"path": "/ok", "n": 1}) == {"path": "/ok", "n": 1}
    assert json_safe({"key": raw}) == {"key_b64": base64.b64encode(b"caf\xe9").decode()}
    assert json_safe({"value": ["a", raw]}) == {
        "value_b64": [base64.b64encode(b"a").decode(), base64.b64encode(b"caf\xe9").decode()]}
    assert json_safe({"metadata": {raw: "v", "k": raw}}) == {
        "metadata": {"b64:" + base64.b64encode(b"caf\xe9").decode(): "v",
                     "k_b64": base64.b64encode(b"caf\xe9").decode()}}


def _many_records(fmt: str, rng: random.Random) -> bytes:
    """A file of a few thousand records (several RecordIndex checkpoints) for ``fmt``."""
    n = 3 * CHECKPOINT_EVERY + 17
    if fmt == "kestrel-writer":
        return CODECS[fmt].write(demo.kestrel_put_records(rng, n))
    if fmt == "akka-data":
        return AkkaData.build(demo.akka_messages(rng, n, ("a", "b", "c")))[0]
    if fmt == "wallaby-log":
        return CODECS[fmt].write([{"time": t, "payload": p} for t, p in demo.wallaby_items(rng, n)])
    if fmt == "jrnl":
        return CODECS[fmt].write(demo.jrnl_records(rng, n, last="complete"))
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["kestrel-writer", "akka-data", "wallaby-log", "jrnl"])
def test_record_index_reaches_any_record(fmt, tmp_path):
    path = tmp_path / f"many.{fmt}"
    data = _many_records(fmt, random.Random(fmt))
    path.write_bytes(data)
    everything = list(CODECS[fmt].read(data, str(path)))
    index = RecordIndex.build(str(path))
    assert index.count == len(everything) and index.error is None
    assert len(index.seqs) == -(-len(everything) // CHECKPOINT_EVERY)
    for seq in (0, 1, CHECKPOINT_EVERY - 1, CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY + 5,
                len(everything) - 1):
        assert index.record(seq) == everything[seq]
    window = list(index.records(CHECKPOINT_EVERY - 2, 5))
    assert window == everything[CHECKPOINT_EVERY - 2:CHECKPOINT_EVERY + 3]
    with pytest.raises(IndexError):
        index.record(len(everything))

    path.write_bytes(data[:everything[-1]["offset"] + 3])  # the last record torn
    damaged = RecordIndex.build(str(path))
    assert damaged.count == len(everything) - 1 and damaged.error is not None
    assert list(damaged.records(len(everything) - 3)) == everything[-3:-1]


# -- big files: constant memory, progress -------------------------------------------------------

BIG_BYTES = 300_000_000
RSS_LIMIT = 100 << 20


@pytest.fixture(scope="module")
def huge_kestrel(tmp_path_factory) -> tuple[Path, int]:
    """A 300 MB writer journal of 64-byte PUTs (generated with numpy in a few seconds)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from bigjournal import write_kestrel_writer
    finally:
        sys.path.pop(0)
    path = tmp_path_factory.mktemp("huge") / f"jobs.{demo.BASE_MS}"
    return path, write_kestrel_writer(path, BIG_BYTES)


#: Runs argv in a fresh child and reports that child's peak RSS. Linux carries a process's peak
#: across fork+exec, so measuring the CLI as our own child would count this (big) test process;
#: a grandchild of this small interpreter starts from its size instead.
PEAK_RSS_WRAPPER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "journalfs.cli", *sys.argv[1:]])
_pid, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\npeak-rss-kib={usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_measured(argv: list[str]) -> tuple[int, int, int, bytes]:
    """(exit code, peak RSS in bytes, the number of stdout lines, stderr + stdout's tail) of
    the real CLI."""
    proc = subprocess.Popen([sys.executable, "-c", PEAK_RSS_WRAPPER, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines, tail = 0, b""
    while chunk := proc.stdout.read1(1 << 20):
        lines += chunk.count(b"\n")
        tail = (tail + chunk)[-4096:]
    err = proc.stderr.read()
    code = proc.wait()
    err, _, peak = err.rpartition(b"\npeak-rss-kib=")
    return code, int(peak) * 1024, lines, err + b"\n" + tail


def test_records_and_fsck_of_a_huge_file_stay_under_100_mb(huge_kestrel):
    path, count = huge_kestrel
    code, peak, lines, rest = _run_measured(["records", str(path), "--json"])
    assert code == 0 and lines == count, rest[-300:]
    last = json.loads(rest.rsplit(b"\n", 2)[-2])
    assert (last["seq"], last["id"]) == (count - 1, count)
    assert rest.startswith(b"\n"), "nothing on stderr when it is not a terminal"
    assert peak < RSS_LIMIT, f"records --json peaked at {peak >> 20} MiB"
    code, peak, _lines, rest = _run_measured(["fsck", str(path)])
    assert code == 0 and f"ok ({count} records)".encode() in rest, rest
    assert peak < RSS_LIMIT, f"fsck peaked at {peak >> 20} MiB"


def _stderr_on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit code, what the terminal got)."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=slave,
                            env=dict(os.environ, TERM="xterm-256color", COLUMNS="100"))
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return proc.wait(timeout=120), seen.decode("utf-8", "replace")


def test_progress_bar_on_a_terminal_only(huge_kestrel, tmp_path, monkeypatch):
    path, count = huge_kestrel
    # a quiet machine checks 300 MB in under the default second: the bar from the start
    monkeypatch.setenv("JOURNALFS_PROGRESS_AFTER", "0")
    code, screen = _stderr_on_a_terminal(["fsck", str(path)])
    monkeypatch.delenv("JOURNALFS_PROGRESS_AFTER")
    assert code == 0
    assert "━" in screen and "records" in screen and "jobs." in screen, screen[-500:]
    # quick work shows nothing, even on a terminal
    small = tmp_path / f"jobs.{demo.BASE_MS}"
    small.write_bytes(CODECS["kestrel-writer"].write(demo.kestrel_put_records(random.Random(1), 50)))
    code, screen = _stderr_on_a_terminal(["records", str(small), "--json"])
    assert code == 0 and screen == ""


def test_columnar_lines_equal_the_dict_path_over_many_batches(tmp_path):
    """Every format of _many_records, over several batches, byte for byte; torn too."""
    from journalfs.commands.records import json_chunks

    def chunks_text(data: bytes, path: Path) -> tuple[str, FormatError | None]:
        out, error = [], None
        try:
            for chunk in json_chunks(CODECS[fmt], data, str(path)):
                out.append(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
        except FormatError as exc:
            error = exc
        return b"".join(out).decode(), error

    for fmt in ("kestrel-writer", "akka-data", "wallaby-log", "jrnl"):
        whole = _many_records(fmt, random.Random(fmt))
        for data in (whole, whole[:len(whole) * 2 // 3]):
            path = tmp_path / fmt
            lines, error = [], None
            try:
                for rec in CODECS[fmt].read(data, str(path)):
                    lines.append(record_json_line(rec) + "\n")
            except FormatError as exc:
                error = exc
            got, got_error = chunks_text(data, path)
            assert got == "".join(lines), fmt
            assert str(got_error) == str(error), fmt


def test_several_files_keep_both_the_file_and_a_copy_records_own_source(tmp_path):
    # a gvfs-journal `copy` record has a field named `source`; with several files every line
    # starts with the file's `source`: the record's own is then `copy_source` (contract)
    entries = [{"kind": "set", "mtime": 1, "path": "/a", "key": "k", "value": "v"},
               {"kind": "copy", "mtime": 2, "path": "/b", "source": "/a"}]
    journal = tmp_path / "home-1234abcd.log"
    journal.write_bytes(CODECS["gvfs-journal"].write(entries, tag=0x1234abcd))
    out = run_cli("records", str(journal), "--json")
    single = [json.loads(line) for line in out.stdout.splitlines()]
    assert single[1]["source"] == "/a" and "copy_source" not in single[1]
    out = run_cli("records", str(tmp_path), "--json")  # a directory: lines name their file
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    copy = next(rec for rec in lines if rec["kind"] == "copy")
    assert copy["source"] == str(journal) and copy["copy_source"] == "/a"
    assert all(rec["source"] == str(journal) for rec in lines)
