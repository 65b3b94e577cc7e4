"""`journalfs fsck` end to end through the real CLI: reports, the recovery rule of each format,
backups, atomic replacement, untouched clean files and the no-lost-record guarantee."""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from codec_helpers import read_all
from journalfs import cli, demo
from journalfs.formats import CODECS, Repair
from journalfs.formats.wallaby import build_index
from journalfs.journals import BACKUP_MARK, sniff_file
from test_records_cli import run_cli


def fsck(*argv: str, real: bool = False) -> subprocess.CompletedProcess:
    return run_cli("fsck", *argv, real=real)


def backups_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + BACKUP_MARK + "*"))


def valid_records(path: Path) -> list[dict]:
    return read_all(sniff_file(str(path)), path.read_bytes(), str(path))[0]


def snapshot(root: Path) -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def tree(tmp_path) -> Path:
    demo.write_demo(tmp_path)
    return tmp_path


def test_clean_tree_is_ok_and_untouched_even_with_repair(tree):
    (tree / "jrnl" / "db.jrnl").write_bytes(
        CODECS["jrnl"].write(demo.jrnl_records(random.Random(1), 5, last="complete")))
    before = snapshot(tree)
    proc = fsck(str(tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for fmt in CODECS:
        if not fmt.startswith("gvfs-"):  # tree and journal are checked as one store
            assert any(f": {fmt}: ok" in line for line in lines), fmt
    assert any(": gvfs-store: ok" in line for line in lines)
    assert fsck(str(tree), "--repair").returncode == 0
    assert snapshot(tree) == before


def test_kestrel_torn_tail_is_reported_then_truncated(tree):
    path = tree / "queues" / f"jobs.{demo.BASE_MS + 60_000}"
    whole = path.read_bytes()
    records = valid_records(path)
    torn = whole[:-7]  # the last PUT loses its last 7 payload bytes
    path.write_bytes(torn)

    proc = fsck(str(path))
    assert proc.returncode == 3
    assert "DAMAGED" in proc.stdout and "byte " in proc.stdout
    assert path.read_bytes() == torn and not backups_of(path)

    proc = fsck(str(path), "--repair", real=True)
    assert proc.returncode == 0, proc.stdout
    assert path.read_bytes() == whole[:records[-1]["offset"]]  # cut where the torn PUT began
    assert valid_records(path) == records[:-1]
    (backup,) = backups_of(path)
    assert backup.read_bytes() == torn
    assert fsck(str(path)).returncode == 0


def test_lagging_wallaby_index_is_rebuilt_from_the_log(tree):
    log, index = tree / "wallaby" / "events.log", tree / "wallaby" / "events.log.idx"
    full_index = index.read_bytes()
    lagging = full_index[:16 + 24 * 30]  # the index lost its last 18 entries
    index.write_bytes(lagging)

    proc = fsck(str(index))  # a lagging index is readable: the codec rates it a warning
    assert "byte 736: warning: index lags the log" in proc.stdout
    assert index.read_bytes() == lagging and not backups_of(index)

    proc = fsck(str(tree / "wallaby"), "--repair")
    assert proc.returncode == 0, proc.stdout
    rebuilt = build_index(CODECS["wallaby-log"].read_columns(log.read_bytes(), "log"))
    assert index.read_bytes() == rebuilt == full_index
    assert backups_of(index)[0].read_bytes() == lagging
    assert not backups_of(log)


def test_jrnl_incomplete_last_transaction_is_rolled_back(tree):
    path = tree / "jrnl" / "db.jrnl"
    before = valid_records(path)
    assert before[-1]["status"] == "rollback"

    proc = fsck(str(path), "--repair")
    assert proc.returncode == 0, proc.stdout
    after = valid_records(path)
    assert [(r["offset"], r["time"], r["ops"]) for r in after] == \
        [(r["offset"], r["time"], r["ops"]) for r in before[:-1]]
    assert path.stat().st_size == before[-1]["offset"]  # truncated where it began
    assert after[-1]["next"] == 0
    assert backups_of(path)[0].read_bytes() != path.read_bytes()


def test_jrnl_redo_transaction_is_marked_complete(tmp_path):
    path = tmp_path / "redo.jrnl"
    path.write_bytes(CODECS["jrnl"].write(demo.jrnl_records(random.Random(2), 4, last="redo")))
    before = valid_records(path)
    assert before[-1]["status"] == "redo"
    assert fsck(str(path), "--repair").returncode == 0
    after = valid_records(path)
    assert after[-1]["status"] == "complete" and after[-1]["complete"] is True
    assert [r["ops"] for r in after] == [r["ops"] for r in before]
    assert len(backups_of(path)) == 1


def test_damaged_gvfs_store_is_found_through_the_directory(tree):
    journal = next((tree / "gvfs-metadata").glob("home-*.log"))
    data = bytearray(journal.read_bytes())
    data[40] ^= 0x10  # inside the first entry: its CRC no longer matches
    journal.write_bytes(bytes(data))
    proc = fsck(str(tree))
    assert proc.returncode == 3
    assert "gvfs-store: DAMAGED" in proc.stdout
    assert journal.read_bytes() == bytes(data)


def test_repair_that_would_lose_a_record_is_refused(tree, monkeypatch, capsys):
    """A (deliberately wrong) recovery rule that drops a valid record is refused: the file,
    and everything else, stays as it was."""
    path = tree / "queues" / f"jobs.{demo.BASE_MS}"
    codec = CODECS["kestrel-writer"]
    original = path.read_bytes()
    records = valid_records(path)
    damaged = original + b"\x86\x05\x00"  # a torn PUT after the last one
    path.write_bytes(damaged)

    def greedy_repair(buf, source, **context):
        return Repair(codec.write(records[:-1]), ["dropped the last two records"])

    monkeypatch.setattr(codec, "repair", greedy_repair)
    assert cli.main(["fsck", str(path), "--repair"]) == 3
    out = capsys.readouterr().out
    assert "repair refused" in out and f"record {len(records) - 1}" in out
    assert path.read_bytes() == damaged and not backups_of(path)


def test_akka_and_reader_files_are_validated(tree):
    data = tree / "akka" / "orders" / "data"
    blob = data.read_bytes()
    data.write_bytes(blob[:-5])  # torn final block
    proc = fsck(str(tree / "akka"))
    assert proc.returncode == 3
    assert "akka-data: DAMAGED" in proc.stdout


def test_not_a_journal_and_missing_path(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("hello\n")
    proc = fsck(str(plain))
    assert proc.returncode == 3 and "not a supported journal" in proc.stderr
    proc = fsck(str(tmp_path / "absent"), real=True)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fsck(str(empty)).returncode == 0
