"""`journalfs records`: JSON lines, the table, damage, streaming with bounded memory, and the
demo tree it is shown on."""
from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tracemalloc
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from journalfs import cli, demo
from journalfs.formats import CODECS, FormatError, record_json_line
from journalfs.journals import sniff_file

JOURNALFS = Path(sys.executable).with_name("journalfs")
REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(JOURNALFS), *argv], capture_output=True, text=True, timeout=timeout)


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
    assert lines[1].split() == ["SEQ", "OFFSET", "KIND", "FIELDS"]
    records = list(CODECS["kestrel-writer"].read(path.read_bytes(), "x"))
    rows = lines[2:]
    assert len(rows) == len(records) == 40
    for row, rec in zip(rows, records):
        seq, offset, kind, fields = row.split(None, 3)
        assert (int(seq), int(offset), kind) == (rec["seq"], rec["offset"], "put")
        assert f"id={rec['id']} " in fields and f"payload=<{len(rec['payload'])} B>" in fields


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
    proc = run_cli("records", str(path), "--json")
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
    proc = run_cli("records", str(tmp_path))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    proc = run_cli("records")
    assert proc.returncode == 2


@pytest.fixture(scope="module")
def big_kestrel(tmp_path_factory) -> Path:
    """40 MB: 20,000 PUTs of 2,000 bytes."""
    path = tmp_path_factory.mktemp("big") / f"big.{demo.BASE_MS}"
    records = demo.kestrel_put_records(random.Random(3), 20_000, payload=(2000, 2000))
    path.write_bytes(CODECS["kestrel-writer"].write(records))
    return path


def test_huge_file_streams_with_bounded_memory(big_kestrel):
    """Printing 40 MB of records (54 MB of JSON) must not hold them: peak well under either."""
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
    assert written > 50_000_000
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
