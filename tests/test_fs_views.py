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
import time

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


# Runs `journalfs records FILE --json` for many files in ONE interpreter (startup is slow),
# capturing each run's fd 1 byte for byte in OUT_DIR/<n>.
_CLI_LOOP = """
import os, sys
from journalfs.cli import main
out_dir, files = sys.argv[1], sys.argv[2:]
for n, path in enumerate(files):
    sys.stdout.flush()
    fd = os.open(os.path.join(out_dir, str(n)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(1)
    os.dup2(fd, 1)
    try:
        code = main(["records", path, "--json"])
        sys.stdout.flush()
    finally:
        os.dup2(saved, 1)
        os.close(fd)
        os.close(saved)
    assert code in (0, 3), (path, code)
"""


def cli_records_json(*paths, tmp_dir) -> list[bytes]:
    """What `journalfs records FILE --json` prints on stdout for each of ``paths``."""
    subprocess.run([sys.executable, "-c", _CLI_LOOP, str(tmp_dir), *map(str, paths)],
                   check=True, stderr=subprocess.DEVNULL)
    return [(tmp_dir / str(n)).read_bytes() for n in range(len(paths))]


@pytest.fixture(scope="module")
def cli_output(fs, records_expected, tmp_path_factory) -> dict[str, bytes]:
    """`journalfs records --json` of every conformance file: what the views must show."""
    names = sorted(records_expected)
    outputs = cli_records_json(*(fs.source / "corpus" / n for n in names),
                               tmp_dir=tmp_path_factory.mktemp("cli"))
    return dict(zip(names, outputs))


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


def test_records_jsonl_is_byte_identical_to_cli(fs, cli_output):
    for name, output in cli_output.items():
        view = (fs.views / "records" / "corpus" / name / "records.jsonl").read_bytes()
        assert view == output, name
        assert os.stat(fs.views / "records" / "corpus" / name / "records.jsonl").st_size == len(output)


def test_record_files_and_names(fs, cli_output):
    for name, output in cli_output.items():
        view = fs.views / "records" / "corpus" / name
        lines = output.splitlines(keepends=True)
        records = [json.loads(line) for line in lines]
        names = record_names(records)
        assert sorted(os.listdir(view)) == sorted(names + ["records.jsonl"]), name
        for rec, fname, line in zip(records, names, lines):
            content = (view / fname).read_bytes()
            if "payload_b64" in rec:
                assert content == base64.b64decode(rec["payload_b64"]), (name, fname)
            else:
                assert content == line, (name, fname)
            assert os.stat(view / fname).st_size == len(content)


def test_record_xattrs(fs, cli_output):
    for name, output in cli_output.items():
        view = fs.views / "records" / "corpus" / name
        records = [json.loads(line) for line in output.splitlines()]
        for rec, fname in list(zip(records, record_names(records)))[:5]:
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


def test_damaged_journal_shows_valid_prefix(fs, records_expected, cli_output):
    assert records_expected["torn.1800000000000"]["exit"] == 3
    valid = len(cli_output["torn.1800000000000"].splitlines())
    assert valid > 0
    view = fs.views / "records" / "corpus" / "torn.1800000000000"
    assert len(os.listdir(view)) == valid + 1


def test_cat_and_cp_records_jsonl(fs, cli_output, tmp_path):
    view = fs.views / "records" / "corpus" / "wal1.log" / "records.jsonl"
    cat = subprocess.run(["cat", str(view)], capture_output=True, check=True).stdout
    subprocess.run(["cp", str(view), str(tmp_path / "copy.jsonl")], check=True)
    assert (tmp_path / "copy.jsonl").read_bytes() == cat == cli_output["wal1.log"]
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
        lambda: os.rename(fs.mountpoint / "plain.txt", fs.views / "plain.txt"),
        lambda: os.rename(rec, fs.mountpoint / "stolen"),
        lambda: os.link(rec, fs.mountpoint / "linked"),
        lambda: os.removexattr(rec, "user.record.kind"),
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
        assert info.value.errno == errno.EROFS, (attempt, info.value)
    assert not (fs.source / "stolen").exists() and not (fs.source / "linked").exists()


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


def test_live_metadata_journal_empties_after_a_rotation(fs):
    """Past the fill threshold the mount rotates in the background: the entries move into the
    tree (still readable as xattrs) and metadata/journal/ shows the new, empty journal."""
    journal = fs.views / "metadata" / "journal"
    status = json.loads((fs.views / "status.json").read_text())
    rotations, threshold = status["rotations"], status["service"]["fill_threshold"]
    big = b"v" * 60_000
    target = fs.mountpoint / "plain.txt"
    written = 0
    while True:  # ~60 kB entries: a handful fill the journal past its threshold; then stop
        os.setxattr(target, f"user.metadata.big{written}", big)
        written += 1
        status = json.loads((fs.views / "status.json").read_text())
        if status["journal_fill"] >= threshold or status["rotations"] > rotations:
            break
        assert len(os.listdir(journal)) > 1  # the entries are in the live journal meanwhile
    deadline = time.monotonic() + 60  # a bound against hanging, not a timing check
    while json.loads((fs.views / "status.json").read_text())["rotations"] == rotations:
        assert time.monotonic() < deadline, "no rotation past the fill threshold"
        time.sleep(0.05)
    names = os.listdir(journal)
    assert names == ["records.jsonl"] and (journal / "records.jsonl").read_bytes() == b""
    assert all(os.getxattr(target, f"user.metadata.big{i}") == big for i in range(written))


def test_meta_compact_of_a_mounted_store_asks_the_mount(fs):
    """The mount holds the store's writer lock; `journalfs meta compact TREE` then asks it to
    rotate (SIGUSR1) and waits for the new tree."""
    journal = fs.views / "metadata" / "journal"
    status = json.loads((fs.views / "status.json").read_text())
    target = fs.mountpoint / "plain.txt"
    os.setxattr(target, "user.metadata.compact_me", b"yes")
    assert len(os.listdir(journal)) > 1
    done = subprocess.run([sys.executable, "-m", "journalfs.cli", "meta", "compact",
                           status["store"]["tree"]], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "through the mount" in done.stdout, done.stderr
    deadline = time.monotonic() + 60  # the tree is replaced a moment before the swap ends
    while (after := json.loads((fs.views / "status.json").read_text()))["rotations"] == status["rotations"]:
        assert time.monotonic() < deadline, "the rotation never finished"
        time.sleep(0.02)
    assert after["rotations"] == status["rotations"] + 1 and after["entries"] == 0
    assert os.listdir(journal) == ["records.jsonl"]
    assert os.getxattr(target, "user.metadata.compact_me") == b"yes"


def test_status_json(fs):
    status = json.loads((fs.views / "status.json").read_text())
    assert status["options"]["sync"] == "always"
    assert status["store"]["tree"].startswith(str(fs.mountpoint.parent / "store"))
    assert status["store"]["journal"] == status["service"]["journal_path"]
    for key in ("entries", "rotations", "fill", "last_fsync"):
        assert key in status["service"]
    assert status["entries"] == status["service"]["entries"] and status["rotations"] >= 0
    assert 0 <= status["journal_fill"] <= 1
    assert status["mountpoint"] == str(fs.mountpoint)


def test_growing_journal_is_seen_growing(fs, cli_output, tmp_path):
    name = "jobs.1700000000000"
    full = (fs.source / "corpus" / name).read_bytes()
    records = [json.loads(line) for line in cli_output[name].splitlines()]
    cut = records[5]["offset"]
    target = fs.mountpoint / "growing.q"
    target.write_bytes(full[:cut])
    view = fs.views / "records" / "growing.q"
    assert len(os.listdir(view)) == 5 + 1
    with open(target, "ab") as f:
        f.write(full[cut:])
    assert sorted(os.listdir(view)) == sorted(record_names(records) + ["records.jsonl"])
    assert (view / "records.jsonl").read_bytes() == cli_output[name]


def test_write_through_mount_invalidates_cached_view(fs, cli_output):
    """The kernel caches view attributes (1 s); a journal written through the mount must not
    be shown stale even within that second."""
    name = "jobs.1700000000001"
    full = (fs.source / "corpus" / name).read_bytes()
    records = [json.loads(line) for line in cli_output[name].splitlines()]
    target = fs.mountpoint / "cached.q"
    target.write_bytes(full[:records[3]["offset"]])
    jsonl = fs.views / "records" / "cached.q" / "records.jsonl"
    first = jsonl.read_bytes()
    assert len(first.splitlines()) == 3 and os.stat(jsonl).st_size == len(first)
    with open(target, "ab") as f:
        f.write(full[records[3]["offset"]:])
    assert os.stat(jsonl).st_size == len(cli_output[name])  # not the cached size
    assert jsonl.read_bytes() == cli_output[name]


def write_wallaby_index(path, count: int) -> None:
    """A valid wallaby-index file of ``count`` fixed-width records (numpy, no per-record loop)."""
    import struct

    import numpy as np
    rec = np.zeros(count, dtype=[("time", "<i8"), ("index", "<u8"), ("offset", "<i8")])
    rec["time"] = 1_700_000_000_000_000_000 + np.arange(count, dtype=np.int64) * 1000
    rec["index"] = np.arange(count, dtype=np.uint64)
    rec["offset"] = 16 + np.arange(count, dtype=np.int64) * 40
    with open(path, "wb") as f:
        f.write(b"IDX" + struct.pack("<BIq", 1, 0, 0))
        rec.tofile(f)


def check_big_journal(mnt, src, count: int) -> None:
    view = mnt / ".journalfs" / "records" / "big.idx"
    seen = 0
    with os.scandir(view) as it:  # streamed listing with stable cursors
        for entry in it:
            seen += 1
    assert seen == count + 1
    last = view / f"{count - 1:08d}.index"
    rec = json.loads(last.read_text())
    assert (rec["seq"], rec["index"], rec["offset"]) == (count - 1, count - 1, 16 + 24 * (count - 1))
    assert os.getxattr(last, "user.record.log_offset") == str(16 + 40 * (count - 1)).encode()
    middle = view / f"{count // 2:08d}.index"
    assert json.loads(middle.read_text())["seq"] == count // 2
    assert not (view / f"{count:08d}.index").exists()
    with open(view / "records.jsonl", "rb") as f:  # tail of records.jsonl by offset
        size = os.fstat(f.fileno()).st_size
        f.seek(size - 400)
        tail = f.read().splitlines()[-1]
    assert json.loads(tail)["seq"] == count - 1


def test_big_journal_lists_and_reads(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    write_wallaby_index(src / "big.idx", 30_000)
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        check_big_journal(mnt, src, 30_000)


@pytest.mark.soak
def test_ten_million_records_bounded_memory(tmp_path):
    import psutil
    count = 10_000_000
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    write_wallaby_index(src / "big.idx", count)
    with mounted(src, mnt, "--store", str(tmp_path / "store")) as m:
        check_big_journal(mnt, src, count)
        rss = psutil.Process(m.pid).memory_info().rss
        assert rss < 1 << 30, f"daemon RSS {rss >> 20} MiB after listing {count} records"


@pytest.fixture(scope="module")
def jsonl_fixture(tmp_path_factory):
    from journalfs.formats.base import record_json_line
    from journalfs.fs.views import JsonlLayout
    from journalfs.journals import RecordIndex
    path = tmp_path_factory.mktemp("jsonl") / "j.idx"
    write_wallaby_index(path, 3000)  # three checkpoints (every 1024 records)
    index = RecordIndex.build(str(path))
    full = "".join(record_json_line(r) + "\n" for r in index.records()).encode()
    return index, JsonlLayout(index), full


def test_jsonl_layout_size(jsonl_fixture):
    index, layout, full = jsonl_fixture
    assert layout.size == len(full)
    assert layout.seqs == [0, 1024, 2048]


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 460_000), st.integers(1, 70_000)), min_size=1, max_size=12))
def test_jsonl_reader_any_read_sequence(jsonl_fixture, reads):
    """Whatever offsets a reader asks for (sequential, backwards, past EOF), the bytes are
    exactly those of records.jsonl."""
    from journalfs.fs.views import JsonlReader
    index, layout, full = jsonl_fixture
    reader = JsonlReader(index, layout)
    try:
        for off, size in reads + [(off + size, size) for off, size in reads]:
            assert reader.read(off, size) == full[off:off + size]
    finally:
        reader.close()
