"""``MNT/.journalfs``: record views of every conformance journal, the live metadata journal,
status.json, and read-only-ness, on a real mount."""
from __future__ import annotations

import base64
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse


@pytest.fixture(scope="module")
def fs(tmp_path_factory, records_corpus):
    base = tmp_path_factory.mktemp("views")
    src = base / "src"
    shutil.copytree(records_corpus, src / "corpus")
    (src / "plain.txt").write_text("not a journal")
    (src / "empty-dir").mkdir()
    (src / "only-text").mkdir()
    (src / "only-text" / "notes.md").write_text("# nothing to see")
    with mounted(src, base / "mnt", "--store", str(base / "store"), "--sync", "always") as m:
        m.views = m.mountpoint / ".journalfs"
        yield m


def cli_records_json(path) -> bytes:
    """What `journalfs records FILE --json` prints (stdout only; damaged files exit 3)."""
    out = subprocess.run([sys.executable, "-m", "journalfs.cli", "records", str(path), "--json"],
                         capture_output=True)
    assert out.returncode in (0, 3), out.stderr
    return out.stdout


def record_names(records: list[dict]) -> list[str]:
    return [f"{r['seq']:08d}.{r['kind']}" for r in records]


def test_records_tree_shows_journals_only(fs, records_expected):
    records = fs.views / "records"
    assert os.listdir(records) == ["corpus"]  # plain.txt, empty-dir, only-text hold no journal
    shown = set()
    for top, dirs, files in os.walk(records / "corpus"):
        if "records.jsonl" in files:
            shown.add(os.path.relpath(top, records / "corpus"))
            dirs.clear()
    assert shown == set(records_expected)
    assert not (records / "plain.txt").exists()
    assert not (records / "corpus" / "expected.json").exists()


def test_every_format_is_covered(records_expected):
    formats = {v["format"] for v in records_expected.values()}
    assert formats >= {"kestrel-writer", "kestrel-reader", "akka-meta", "akka-data",
                       "wallaby-log", "wallaby-index", "jrnl"}


def test_records_jsonl_is_byte_identical_to_cli(fs, records_expected):
    for name, expected in records_expected.items():
        view = (fs.views / "records" / "corpus" / name / "records.jsonl").read_bytes()
        assert view == cli_records_json(fs.source / "corpus" / name), name
        assert [json.loads(line) for line in view.splitlines()] == expected["records"], name


def test_record_files_and_names(fs, records_expected):
    for name, expected in records_expected.items():
        view = fs.views / "records" / "corpus" / name
        lines = (view / "records.jsonl").read_bytes().splitlines(keepends=True)
        names = record_names(expected["records"])
        assert sorted(os.listdir(view)) == sorted(names + ["records.jsonl"]), name
        for rec, fname, line in zip(expected["records"], names, lines):
            content = (view / fname).read_bytes()
            if "payload_b64" in rec:
                assert content == base64.b64decode(rec["payload_b64"]), (name, fname)
            else:
                assert content == line, (name, fname)
            assert os.stat(view / fname).st_size == len(content)


def test_record_xattrs(fs, records_expected):
    for name, expected in records_expected.items():
        view = fs.views / "records" / "corpus" / name
        for rec, fname in list(zip(expected["records"], record_names(expected["records"])))[:5]:
            path = view / fname
            listed = set(os.listxattr(path))
            for field, value in rec.items():
                attr = f"user.record.{field}"
                if isinstance(value, (list, dict)) or field == "payload_b64":
                    assert attr not in listed
                    continue
                text = value if isinstance(value, str) else json.dumps(value)
                assert os.getxattr(path, attr) == text.encode(), (name, fname, field)
                assert attr in listed
    out = subprocess.run(["getfattr", "--only-values", "-n", "user.record.kind",
                          str(fs.views / "records" / "corpus" / "db0.jrnl" / "00000000.transaction")],
                         capture_output=True, check=True)
    assert out.stdout == b"transaction"


def test_damaged_journal_shows_valid_prefix(fs, records_expected):
    torn = records_expected["torn.1800000000000"]
    assert torn["exit"] == 3
    view = fs.views / "records" / "corpus" / "torn.1800000000000"
    assert len(os.listdir(view)) == len(torn["records"]) + 1


def test_cat_and_cp_records_jsonl(fs, tmp_path):
    view = fs.views / "records" / "corpus" / "wal1.log" / "records.jsonl"
    cat = subprocess.run(["cat", str(view)], capture_output=True, check=True).stdout
    subprocess.run(["cp", str(view), str(tmp_path / "copy.jsonl")], check=True)
    assert (tmp_path / "copy.jsonl").read_bytes() == cat == cli_records_json(
        fs.source / "corpus" / "wal1.log")
    with open(view, "rb") as f:  # random access by offset
        f.seek(1000)
        assert f.read(333) == cat[1000:1333]
        f.seek(17)
        assert f.read(5) == cat[17:22]


def test_views_are_read_only(fs):
    rec_dir = fs.views / "records" / "corpus" / "db0.jrnl"
    rec = rec_dir / "00000000.transaction"
    attempts = [
        lambda: open(rec, "r+b"),
        lambda: open(rec_dir / "records.jsonl", "wb"),
        lambda: open(rec_dir / "new", "w"),
        lambda: os.mkdir(rec_dir / "d"),
        lambda: os.unlink(rec),
        lambda: os.rename(rec, rec_dir / "x"),
        lambda: os.rename(fs.source / "plain.txt", fs.views / "plain.txt"),
        lambda: os.setxattr(rec, "user.metadata.k", b"v"),
        lambda: os.chmod(rec, 0o666),
        lambda: os.truncate(rec, 0),
        lambda: os.symlink("x", fs.views / "link"),
        lambda: open(fs.views / "status.json", "w"),
        lambda: os.rmdir(fs.views / "records"),
        lambda: os.rename(fs.views, fs.mountpoint / "elsewhere"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno in (errno.EROFS, errno.EACCES, errno.EXDEV), attempt
    with pytest.raises(OSError) as info:
        os.setxattr(rec, "user.metadata.k", b"v")
    assert info.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    with pytest.raises(OSError) as info:
        os.unlink(rec)
    assert info.value.errno == errno.EROFS


def test_views_hidden_from_root_listing(fs):
    assert ".journalfs" not in os.listdir(fs.mountpoint)
    assert sorted(os.listdir(fs.views)) == ["metadata", "records", "status.json"]


def test_live_metadata_journal_follows_setfattr(fs):
    journal = fs.views / "metadata" / "journal"
    before = set(os.listdir(journal))
    subprocess.run(["setfattr", "-n", "user.metadata.watched", "-v", "yes",
                    str(fs.mountpoint / "plain.txt")], check=True)
    after = set(os.listdir(journal))
    added = after - before
    assert added and all(name.endswith(".set") for name in added)
    entries = [json.loads(line) for line in (journal / "records.jsonl").read_text().splitlines()]
    last = entries[-1]
    assert (last["format"], last["kind"], last["key"], last["value"]) == \
           ("gvfs-journal", "set", "watched", "yes")
    assert last["path"].endswith("/plain.txt")
    newest = sorted(added)[-1]
    assert json.loads((journal / newest).read_text()) == last


def test_status_json(fs):
    status = json.loads((fs.views / "status.json").read_text())
    assert status["options"]["sync"] == "always"
    assert status["store"]["tree"].startswith(str(fs.mountpoint.parent / "store"))
    assert status["store"]["journal"] == status["service"]["journal_path"]
    for key in ("entries", "rotations", "fill", "last_fsync"):
        assert key in status["service"]


def test_growing_journal_is_seen_growing(fs, records_expected):
    name = "jobs.1700000000000"
    full = (fs.source / "corpus" / name).read_bytes()
    records = records_expected[name]["records"]
    cut = records[5]["offset"]
    target = fs.mountpoint / "growing.q"
    target.write_bytes(full[:cut])
    view = fs.views / "records" / "growing.q"
    assert len(os.listdir(view)) == 5 + 1
    with open(target, "ab") as f:
        f.write(full[cut:])
    assert sorted(os.listdir(view)) == sorted(record_names(records) + ["records.jsonl"])
    assert (view / "records.jsonl").read_bytes() == cli_records_json(target)
