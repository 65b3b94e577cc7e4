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
from users import ensure_user

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
            from journalfs.formats import CODECS
            from journalfs.selection import format_time, record_time_ns
            codec = CODECS[rec["format"]]
            ns = record_time_ns(codec, rec)
            if ns is None:
                assert "user.record.time_iso" not in listed
            else:
                assert os.getxattr(path, "user.record.time_iso").decode() == \
                    format_time(ns, codec.columns.time_unit, utc=True)
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
    assert sorted(os.listdir(fs.views)) == ["changes", "metadata", "persistence", "queues",
                                            "records", "status.json", "transactions"]


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

    def status():  # each read waits for a build that started after it (up to a second)
        return json.loads((fs.views / "status.json").read_text())

    first = status()
    rotations, threshold = first["rotations"], first["service"]["fill_threshold"]
    big = b"v" * 3_500  # one file's metadata is limited to 4 KiB, as on ext4 (security.md)
    target = fs.mountpoint / "plain.txt"
    written = 0

    def write():
        nonlocal written
        os.setxattr(target, "user.metadata.big", big + str(written).encode())
        written += 1

    # Each set of the key appends an entry: fill the journal past its threshold. status.json
    # is read only where the fill may have reached the threshold: one entry's share of the
    # journal is measured, and the writes that surely stay below it go without a read.
    write()
    now = status()
    step = max(now["journal_fill"] - first["journal_fill"], 1e-6)
    while True:
        if now["journal_fill"] >= threshold or now["rotations"] > rotations:
            break
        assert len(os.listdir(journal)) > 1  # the entries are in the live journal meanwhile
        surely_below = int((threshold - now["journal_fill"]) / step) - 2
        for _ in range(max(surely_below, 0)):
            write()
        write()
        now = status()
    deadline = time.monotonic() + 60  # a bound against hanging, not a timing check
    while status()["rotations"] == rotations:
        assert time.monotonic() < deadline, "no rotation past the fill threshold"
        time.sleep(0.05)
    names = os.listdir(journal)
    assert names == ["records.jsonl"] and (journal / "records.jsonl").read_bytes() == b""
    assert os.getxattr(target, "user.metadata.big") == big + str(written - 1).encode()


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
    from journalfs.demo import big_wallaby_index
    path.write_bytes(big_wallaby_index(count))


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
    jsonl = view / "records.jsonl"
    if os.stat(jsonl).st_size == 0:  # a big journal's: size known once read to the end
        with open(jsonl, "rb") as f:
            while f.read(1 << 20):
                pass
    with open(jsonl, "rb") as f:  # tail of records.jsonl by offset
        size = os.fstat(f.fileno()).st_size
        assert size > 0
        f.seek(size - 400)
        tail = f.read().splitlines()[-1]
    assert json.loads(tail)["seq"] == count - 1


def test_big_journal_lists_and_reads(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    write_wallaby_index(src / "big.idx", 30_000)
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        check_big_journal(mnt, src, 30_000)


def test_a_big_gvfs_tree_lists_and_reads(tmp_path):
    """A tree of 150,000 records (many batches of its streamed walk, more than one of
    single-record requests) through a real mount: every name listed, records far in read as
    the CLI prints them, records.jsonl whole."""
    from journalfs.formats import CODECS
    count = 150_000
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "home").write_bytes(CODECS["gvfs-tree"].write(
        [{"path": f"/home/d{i // 1000}/f{i}", "mtime": 1_700_000_000 + i,
          "metadata": {"annotation": f"note {i}"}} for i in range(count)]))
    lines = subprocess.run([sys.executable, "-m", "journalfs.cli", "records", str(src / "home"),
                            "--json"], capture_output=True, check=True).stdout.splitlines()
    assert len(lines) == count
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        view = mnt / ".journalfs" / "records" / "home"
        with os.scandir(view) as it:
            names = sorted(entry.name for entry in it)
        assert names == [f"{n:08d}.node" for n in range(count)] + ["records.jsonl"]
        for seq in (0, 20_000, count - 1):
            assert (view / f"{seq:08d}.node").read_bytes().rstrip(b"\n") == lines[seq]
        assert (view / "records.jsonl").read_bytes().splitlines() == lines


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
    from journalfs.fs.jsonlview import JsonlLayout
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
    from journalfs.fs.jsonlview import JsonlReader
    index, layout, full = jsonl_fixture
    reader = JsonlReader(index, layout)
    try:
        for off, size in reads + [(off + size, size) for off, size in reads]:
            assert reader.read(off, size) == full[off:off + size]
    finally:
        reader.close()


# -- permissions, hostile SOURCE content, bytes names (issue 10), damage (issue 16) -------------

import pwd  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

VIEW_USER = "jfs-views-test"
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter lives under /root, closed to others

# Runs as the test user: performs each [name, op, path] and prints {name: result | ERRNAME}.
_USER_SCRIPT = r"""
import errno, json, os, sys, time
def run(op, path):
    if op == "list":
        return sorted(os.listdir(path))
    if op == "read":
        with open(path, "rb") as f:
            return len(f.read())
    if op == "stat":
        return oct(os.stat(path).st_mode)
    if op.startswith("chmod-"):
        return os.chmod(path, int(op[6:], 8))
    if op in ("stat_within_5s", "gone_within_5s"):  # a change seen by the mount's watcher
        deadline = time.monotonic() + 5
        while True:
            try:
                mode = oct(os.stat(path).st_mode)
                if op == "stat_within_5s" or time.monotonic() > deadline:
                    return mode
            except FileNotFoundError:
                if op == "gone_within_5s" or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)
    raise ValueError(op)
out = {}
for name, op, path in json.load(sys.stdin):
    try:
        out[name] = run(op, path)
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


def view_user() -> pwd.struct_passwd:
    return ensure_user(VIEW_USER)


def as_view_user(user, steps: list[tuple[str, str, Path]]) -> dict:
    proc = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         "--reset-env", SYSTEM_PYTHON, "-c", _USER_SCRIPT],
        input=json.dumps([[n, op, str(p)] for n, op, p in steps]),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def journals_source(base: Path, journal: Path, layout: dict[str, int]) -> tuple[Path, Path]:
    """(SOURCE, MOUNTPOINT) under ``base``: SOURCE (0755) holds copies of ``journal`` at the
    relative paths of ``layout`` with its modes (new parent directories 0755)."""
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir()
    for rel, mode in layout.items():
        path = src / rel
        path.parent.mkdir(mode=0o755, exist_ok=True)
        shutil.copyfile(journal, path)
        path.chmod(mode)
    return src, mnt


def journal_view_steps(name: str, view: Path, record: str) -> list[tuple[str, str, Path]]:
    """as_view_user steps: list a journal's view, read its records.jsonl and one record."""
    return [(f"{name}_list", "list", view), (f"{name}_jsonl", "read", view / "records.jsonl"),
            (f"{name}_record", "read", view / record)]


@pytest.fixture
def shared_base():
    """A directory other users can traverse (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="jfs-views-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_views_carry_source_permissions(shared_base, records_corpus):
    """A user reads through the views exactly the journals they can read in SOURCE."""
    user = view_user()
    journal = records_corpus / "db0.jrnl"
    src, mnt = journals_source(shared_base, journal, {
        "public.jrnl": 0o644, "secret.jrnl": 0o600, "private/inner.jrnl": 0o644,
        "open/group.jrnl": 0o640, "userdir/mine.jrnl": 0o600})
    (src / "private").chmod(0o700)
    for p in (src / "userdir", src / "userdir" / "mine.jrnl"):
        os.chown(p, user.pw_uid, user.pw_gid)
    with mounted(src, mnt, "--store", str(shared_base / "store"), "-o", "allow_other,timeout=1"):
        views = mnt / ".journalfs"
        rec = views / "records"
        first = sorted(os.listdir(rec / "public.jrnl"))[1]  # [0] is records.jsonl
        steps = [
            ("records", "list", rec),
            *journal_view_steps("public", rec / "public.jrnl", first),
            *journal_view_steps("secret", rec / "secret.jrnl", first),
            ("private_list", "list", rec / "private"),
            ("private_jsonl", "read", rec / "private" / "inner.jrnl" / "records.jsonl"),
            ("group", "read", rec / "open" / "group.jrnl" / "records.jsonl"),
            ("mine", "read", rec / "userdir" / "mine.jrnl" / "records.jsonl"),
            ("metadata", "list", views / "metadata" / "journal"),
            ("status", "read", views / "status.json"),
        ]
        seen = as_view_user(user, steps)
        # the same questions asked of SOURCE itself
        native = as_view_user(user, [
            ("secret", "read", src / "secret.jrnl"), ("private", "list", src / "private"),
            ("group", "read", src / "open" / "group.jrnl"),
            ("mine", "read", src / "userdir" / "mine.jrnl")])
        assert native == {"secret": "EACCES", "private": "EACCES", "group": "EACCES",
                          "mine": journal.stat().st_size}
        # journals the user cannot read, and directories holding none they can, are not
        # there for them at all (issue 24 item 8: records/ is no oracle on contents)
        assert seen["records"] == ["public.jrnl", "userdir"]
        assert first in seen["public_list"]
        assert isinstance(seen["public_jsonl"], int) and seen["public_jsonl"] > 0
        assert isinstance(seen["public_record"], int)
        assert isinstance(seen["mine"], int) and seen["mine"] == seen["public_jsonl"]
        for name in ("secret_list", "secret_jsonl", "secret_record", "private_list",
                     "private_jsonl", "group"):
            assert seen[name] == "ENOENT", (name, seen[name])
        for name in ("metadata", "status"):
            assert seen[name] == "EACCES", (name, seen[name])
        # owners and modes, as root sees them
        st = os.stat(rec / "secret.jrnl")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o500)
        assert stat.S_IMODE(os.stat(rec / "secret.jrnl" / first).st_mode) == 0o400
        st = os.stat(rec / "userdir" / "mine.jrnl" / "records.jsonl")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
            (user.pw_uid, user.pw_gid, 0o400)
        assert stat.S_IMODE(os.stat(rec / "open" / "group.jrnl").st_mode) == 0o550
        assert stat.S_IMODE(os.stat(rec / "private").st_mode) == 0o500
        assert stat.S_IMODE(os.stat(views / "status.json").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(views / "metadata").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(views / "metadata" / "journal").st_mode) == 0o700
        # a chmod in SOURCE shows in the view once the attribute timeout has passed
        (src / "secret.jrnl").chmod(0o644)
        time.sleep(1.5)
        assert isinstance(as_view_user(user, [("s", "read", rec / "secret.jrnl" / first)])["s"],
                          int)


def test_view_lookups_kept_per_caller(shared_base, records_corpus):
    """`ls -l` of a view walks its journal directory (entry timeout 0: who sees it depends on
    who asks) once per entry, so lookups under records/ are answered from memory for a
    moment: per caller, never one caller's answer for another, and a change to SOURCE seen
    by the mount is seen through the views."""
    user = view_user()
    src, mnt = journals_source(shared_base, records_corpus / "db0.jrnl", {"mine.jrnl": 0o200})
    os.chown(src / "mine.jrnl", user.pw_uid, user.pw_gid)  # its owner may not read it yet
    with mounted(src, mnt, "--store", str(shared_base / "store"), "-o", "allow_other,timeout=1"):
        view = mnt / ".journalfs" / "records" / "mine.jrnl"
        for _ in range(3):
            assert stat.S_ISDIR(os.stat(view).st_mode)  # root sees it, and keeps the answer
        seen = as_view_user(user, [
            ("hidden", "stat", view), ("hidden_again", "stat", view),
            ("chmod", "chmod-0600", mnt / "mine.jrnl"),   # through the mount
            ("shown", "stat_within_5s", view), ("shown_again", "stat", view),
            ("unchmod", "chmod-0200", mnt / "mine.jrnl")])
        assert seen == {"hidden": "ENOENT", "hidden_again": "ENOENT", "chmod": None,
                        "shown": oct(stat.S_IFDIR | 0o500), "shown_again": oct(stat.S_IFDIR | 0o500),
                        "unchmod": None}
        assert stat.S_ISDIR(os.stat(view).st_mode)  # root still sees it
        assert "mine.jrnl" not in as_view_user(user, [("records", "list", view.parent)])["records"]


def test_view_names_kept_by_the_kernel_only_when_every_caller_sees_them(shared_base,
                                                                       records_corpus):
    """A journal readable by everyone (r for owner, group and others, no ACL) keeps its
    view's name in the kernel's cache (so `ls -l` of the view does not look the journal up
    once per entry); any other journal is looked up by every caller every time: root's
    lookup never shows it to another user, and a chmod in SOURCE takes the kept name away."""
    if not shutil.which("setfacl"):
        pytest.skip("setfacl not installed (acl)")
    user = view_user()
    src, mnt = journals_source(shared_base, records_corpus / "db0.jrnl", {
        "public.jrnl": 0o644, "group.jrnl": 0o640, "acl.jrnl": 0o644})
    subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:---", str(src / "acl.jrnl")], check=True)
    with mounted(src, mnt, "--store", str(shared_base / "store"), "-o", "allow_other"):
        rec = mnt / ".journalfs" / "records"
        for name in ("public.jrnl", "group.jrnl", "acl.jrnl"):
            for _ in range(3):  # root's lookups, and the kernel keeps what it may
                assert stat.S_ISDIR(os.stat(rec / name).st_mode)
        seen = as_view_user(user, [(n, "stat", rec / n) for n in
                                   ("public.jrnl", "group.jrnl", "acl.jrnl")])
        assert seen == {"public.jrnl": oct(stat.S_IFDIR | 0o555), "group.jrnl": "ENOENT",
                        "acl.jrnl": "ENOENT"}
        (src / "public.jrnl").chmod(0o600)  # behind the mount: the watcher tells it
        seen = as_view_user(user, [("public", "gone_within_5s", rec / "public.jrnl")])
        assert seen == {"public": "ENOENT"}


def test_views_carry_source_acls(shared_base, records_corpus):
    """POSIX ACLs on SOURCE decide access through the views exactly as on SOURCE itself
    (the mount runs in the kernel's POSIX ACL mode; the views answer with the SOURCE
    object's access ACL, write bits cleared)."""
    if not shutil.which("setfacl"):
        pytest.skip("setfacl not installed (acl)")
    user = view_user()
    journal = records_corpus / "db0.jrnl"
    src, mnt = journals_source(shared_base, journal, {
        "denied.jrnl": 0o644, "granted.jrnl": 0o600, "hidden/inner.jrnl": 0o644})
    who = user.pw_name
    for acl, rel in ((f"u:{who}:---", "denied.jrnl"), (f"u:{who}:rw", "granted.jrnl"),
                     (f"u:{who}:---", "hidden")):
        subprocess.run(["setfacl", "-m", acl, str(src / rel)], check=True)
    size = journal.stat().st_size
    with mounted(src, mnt, "--store", str(shared_base / "store"), "-o", "allow_other,timeout=1"):
        rec = mnt / ".journalfs" / "records"
        first = sorted(os.listdir(rec / "denied.jrnl"))[1]
        native = as_view_user(user, [
            ("denied", "read", src / "denied.jrnl"), ("granted", "read", src / "granted.jrnl"),
            ("hidden", "list", src / "hidden"),
            ("hidden_file", "read", src / "hidden" / "inner.jrnl")])
        assert native == {"denied": "EACCES", "granted": size, "hidden": "EACCES",
                          "hidden_file": "EACCES"}
        seen = as_view_user(user, [
            *journal_view_steps("denied", rec / "denied.jrnl", first),
            *journal_view_steps("granted", rec / "granted.jrnl", first),
            ("hidden", "list", rec / "hidden"),
            ("hidden_jsonl", "read", rec / "hidden" / "inner.jrnl" / "records.jsonl")])
        # what the user cannot read is not there for them (issue 24 item 8)
        for name in ("denied_list", "denied_jsonl", "denied_record", "hidden", "hidden_jsonl"):
            assert seen[name] == "ENOENT", (name, seen)
        assert first in seen["granted_list"]
        assert isinstance(seen["granted_jsonl"], int) and seen["granted_jsonl"] > 0
        assert isinstance(seen["granted_record"], int)
        # the ACLs as getfacl shows them: SOURCE's entries, read-only
        def acl(path):
            return subprocess.run(["getfacl", "-cp", str(path)], capture_output=True,
                                  text=True, check=True).stdout.split()
        assert f"user:{who}:r-x" in acl(rec / "granted.jrnl")
        assert f"user:{who}:r--" in acl(rec / "granted.jrnl" / "records.jsonl")
        assert f"user:{who}:---" in acl(rec / "hidden")
        assert "mask::r-x" in acl(rec / "hidden")
        # an ACL changed in SOURCE shows once the attribute timeout has passed, as a chmod
        subprocess.run(["setfacl", "-x", f"u:{who}", str(src / "denied.jrnl")], check=True)
        time.sleep(1.5)
        again = as_view_user(user, [("denied", "read", rec / "denied.jrnl" / first),
                                    ("native", "read", src / "denied.jrnl")])
        assert again["native"] == size and isinstance(again["denied"], int), again
        # changed through the mount: at once, the views' cached inodes being invalidated
        jsonl = rec / "granted.jrnl" / "records.jsonl"
        assert isinstance(as_view_user(user, [("v", "read", jsonl)])["v"], int)
        subprocess.run(["setfacl", "-m", f"u:{who}:---", str(mnt / "granted.jrnl")], check=True)
        assert as_view_user(user, [("v", "read", jsonl)])["v"] == "ENOENT"  # not theirs to see


_STAT_ALL = r"""
import concurrent.futures, os, sys
def probe(path):
    try:
        os.stat(path)
        return "ok"
    except OSError as exc:
        return str(exc.errno)
with concurrent.futures.ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(" ".join(pool.map(probe, sys.argv[1:])))
"""


def stat_all(paths, timeout: float = 30) -> list[str]:
    """stat every path at once (one thread each) in a child that must end within
    ``timeout`` s: "ok" or the errno of each."""
    proc = subprocess.run([sys.executable, "-c", _STAT_ALL, *map(str, paths)],
                          capture_output=True, text=True, timeout=timeout)
    return proc.stdout.split()


def read_in_child(path, timeout: float = 30) -> str:
    proc = subprocess.run([sys.executable, "-c", "import sys\ntry:\n sys.stdout.write("
                           "open(sys.argv[1],'rb').read().decode(errors='replace'))\n"
                           "except OSError as e:\n print(e.errno)", str(path)],
                          capture_output=True, text=True, timeout=timeout)
    return proc.stdout.strip()


def test_fifo_and_symlink_swaps_neither_block_nor_leak(tmp_path, records_corpus):
    """Journals viewed once (the kernel keeps their view inodes) and then swapped in SOURCE
    for FIFOs or for symlinks out of SOURCE: no request blocks, nothing outside is read."""
    src, mnt, outside = tmp_path / "src", tmp_path / "mnt", tmp_path / "outside"
    for d in (src, outside):
        d.mkdir()
    secret = records_corpus / "db1.jrnl"
    shutil.copyfile(secret, outside / "root-only.jrnl")
    (outside / "root-only.jrnl").chmod(0o600)
    names = [f"j{i:03d}.jrnl" for i in range(100)]
    for name in names + ["link-me.jrnl"]:
        shutil.copyfile(records_corpus / "db0.jrnl", src / name)
    (src / "sub").mkdir()
    shutil.copyfile(records_corpus / "db0.jrnl", src / "sub" / "root-only.jrnl")
    secret_jsonl = cli_records_json(secret, tmp_dir=tmp_path)[0]
    with mounted(src, mnt, "--store", str(tmp_path / "store")) as m:
        rec = m.mountpoint / ".journalfs" / "records"
        for name in names + ["link-me.jrnl", "sub/root-only.jrnl"]:  # viewed once
            assert (rec / name / "records.jsonl").read_bytes()
        for name in names:  # then swapped for FIFOs nobody writes to
            os.unlink(src / name)
            os.mkfifo(src / name)
        # a file and a directory swapped for symlinks to things outside SOURCE
        os.unlink(src / "link-me.jrnl")
        os.symlink(outside / "root-only.jrnl", src / "link-me.jrnl")
        shutil.rmtree(src / "sub")
        os.symlink(outside, src / "sub")
        time.sleep(2.5)  # past the views' own short-lived caches
        jsonls = [rec / name / "records.jsonl" for name in names]
        assert stat_all(jsonls + [m.mountpoint / "plain-missing"]) == \
            [str(errno.ENOENT)] * (len(names) + 1)
        assert stat_all([m.mountpoint]) == ["ok"]  # the mount is not blocked
        for leak in (rec / "link-me.jrnl" / "records.jsonl",
                     rec / "sub" / "root-only.jrnl" / "records.jsonl"):
            got = read_in_child(leak)
            assert got in (str(errno.ENOENT), str(errno.ESTALE)), got[:200]
            assert secret_jsonl.decode()[:50] not in got
        assert sorted(os.listdir(rec)) == []  # FIFOs and symlinks are not journals


def test_non_utf8_journal_name(tmp_path, records_corpus):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    name = b"\xff\xfe.jrnl"
    shutil.copyfile(records_corpus / "db0.jrnl", os.path.join(os.fsencode(src), name))
    expected = cli_records_json(records_corpus / "db0.jrnl", tmp_dir=tmp_path)[0]
    with mounted(src, mnt, "--store", str(tmp_path / "store")) as m:
        rec = os.fsencode(m.mountpoint / ".journalfs" / "records")
        assert os.listdir(rec) == [name]
        view = rec + b"/" + name
        with open(view + b"/records.jsonl", "rb") as f:
            assert f.read() == expected
        entries = sorted(os.listdir(view))
        assert entries[0] == b"00000000." + json.loads(expected.splitlines()[0])["kind"].encode()
        assert json.loads((m.mountpoint / ".journalfs" / "status.json").read_bytes())


def test_live_journal_with_non_utf8_paths(fs):
    """A metadata entry of a path that is not UTF-8 shows in the live journal's views as
    JSON with ``path_b64`` (INTERFACES point 1), never as EIO."""
    name = b"\xfe\xff-meta.txt"
    target = os.fsencode(fs.mountpoint) + b"/" + name
    with open(target, "wb") as f:
        f.write(b"x")
    os.setxattr(target, b"user.metadata.bytes-name", b"yes")
    journal = fs.views / "metadata" / "journal"
    lines = (journal / "records.jsonl").read_bytes().splitlines()
    entries = [json.loads(line.decode("utf-8")) for line in lines]
    mine = [e for e in entries if e.get("key") == "bytes-name"]
    assert mine and "path" not in mine[-1]
    assert base64.b64decode(mine[-1]["path_b64"]).endswith(b"/" + name)
    newest = sorted(os.listdir(journal))[-1]
    assert json.loads((journal / newest).read_bytes()) == mine[-1]


def test_damage_shown_as_xattr_and_in_status(fs, records_expected):
    view = fs.views / "records" / "corpus" / "torn.1800000000000"
    damage = os.getxattr(view, "user.journal.damage").decode()
    offset, _, reason = damage.partition(": ")
    assert int(offset) > 0 and reason
    assert "user.journal.damage" in os.listxattr(view)
    healthy = fs.views / "records" / "corpus" / "db0.jrnl"
    assert "user.journal.damage" not in os.listxattr(healthy)
    with pytest.raises(OSError) as exc:
        os.getxattr(healthy, "user.journal.damage")
    assert exc.value.errno == errno.ENODATA
    status = json.loads((fs.views / "status.json").read_bytes())
    listed = {d["path"]: d for d in status["damaged_journals"]}
    assert listed["corpus/torn.1800000000000"]["offset"] == int(offset)
    assert "corpus/db0.jrnl" not in listed
    assert "torn.1800000000000" in fs.stderr() or True  # logged (syslog when present)


def test_fsck_backups_are_not_journals(tmp_path, records_corpus):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    shutil.copyfile(records_corpus / "db0.jrnl", src / "db0.jrnl")
    backup = "db0.jrnl.journalfs-backup-20260101T000000.000000Z"
    shutil.copyfile(records_corpus / "db0.jrnl", src / backup)
    with mounted(src, mnt, "--store", str(tmp_path / "store")) as m:
        rec = m.mountpoint / ".journalfs" / "records"
        assert os.listdir(rec) == ["db0.jrnl"]
        assert not (rec / backup).exists()


# -- on-disk indexes (issue 15) ---------------------------------------------------------------

def _status(mnt) -> dict:
    """status.json once no journal is being indexed (a record can be served from a partial
    index a moment before its indexing thread has counted and saved)."""
    deadline = time.monotonic() + 60
    while True:
        status = json.loads((mnt / ".journalfs" / "status.json").read_bytes())
        if not status["views"]["indexing"] or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_index_kept_in_store_reused_and_extended(tmp_path):
    """A 24 MB journal of 1M records: its index is saved in the store directory, used as is
    after a remount (nothing re-indexed), and extended by only the growth."""
    count = 1_000_000
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    big = src / "big.idx"
    write_wallaby_index(big, count)
    args = ("--store", str(store))
    last = f"{count - 1:08d}.index"
    with mounted(src, mnt, *args):
        view = mnt / ".journalfs" / "records" / "big.idx"
        assert json.loads((view / last).read_text())["seq"] == count - 1
        views = _status(mnt)["views"]
        assert views["indexes_built"] == 1 and views["records_indexed"] == count
        assert views["indexes_saved"] == 1
        index_dir = Path(views["index_dir"])
    assert index_dir == store / "indexes"
    assert stat.S_IMODE(index_dir.stat().st_mode) == 0o700
    files = list(index_dir.iterdir())
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert sorted(p.name for p in src.iterdir()) == ["big.idx"]  # nothing written in SOURCE
    with mounted(src, mnt, *args):  # remount: the saved index is used, nothing re-read
        view = mnt / ".journalfs" / "records" / "big.idx"
        middle = f"{count // 2:08d}.index"
        assert json.loads((view / middle).read_text())["seq"] == count // 2
        views = _status(mnt)["views"]
        assert (views["indexes_loaded"], views["records_indexed"]) == (1, 0)
        # records.jsonl of a journal this big: size 0 (unknown) until read once, direct I/O
        jsonl = view / "records.jsonl"
        assert os.stat(jsonl).st_size == 0
        with open(jsonl, "rb") as f:
            f.seek(0)
            head = f.read(4096)
        assert json.loads(head.splitlines()[0])["seq"] == 0
    data = big.read_bytes()
    with open(big, "ab") as f:  # the journal grows by 5000 records
        f.write(data[16:16 + 24 * 5000])
    with mounted(src, mnt, *args):
        view = mnt / ".journalfs" / "records" / "big.idx"
        grown = f"{count + 4999:08d}.index"
        assert json.loads((view / grown).read_text())["seq"] == count + 4999
        views = _status(mnt)["views"]
        assert views["indexes_extended"] == 1
        assert 0 < views["records_indexed"] < 5000 + 2048  # the growth, from the last checkpoint
    assert len(list(index_dir.iterdir())) == 1  # replaced, not accumulated


def test_saved_index_of_another_file_is_not_used(tmp_path):
    """An index file whose journal was rewritten (same inode, other bytes) is not trusted."""
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    big = src / "big.idx"
    write_wallaby_index(big, 100_000)
    with mounted(src, mnt, "--store", str(store)):
        assert (mnt / ".journalfs" / "records" / "big.idx" / "00099999.index").exists()
    with open(big, "r+b") as f:  # same inode and size, other content at the start
        f.seek(16)
        f.write(b"\x01" * 8)
    with mounted(src, mnt, "--store", str(store)):
        view = mnt / ".journalfs" / "records" / "big.idx"
        assert (view / "00099999.index").exists()
        views = _status(mnt)["views"]
        assert views["indexes_loaded"] == 0 and views["records_indexed"] == 100_000


@pytest.mark.soak
def test_one_gigabyte_journal(tmp_path):
    """1 GB journal: indexed once in the background, saved, and after a remount the first
    record read and every stat answer at once (figures printed, not asserted)."""
    count = (1 << 30) // 24
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    write_wallaby_index(src / "big.idx", count)
    args = ("--store", str(store))
    with mounted(src, mnt, *args):
        view = mnt / ".journalfs" / "records" / "big.idx"
        t = time.monotonic()
        os.stat(view / "records.jsonl")
        print(f"stat records.jsonl, not indexed: {time.monotonic() - t:.3f} s")
        t = time.monotonic()
        (view / "00000005.index").read_bytes()  # served from the partial index
        print(f"first record while indexing: {time.monotonic() - t:.3f} s")
        t = time.monotonic()
        (view / f"{count - 1:08d}.index").read_bytes()
        print(f"last record (whole index): {time.monotonic() - t:.3f} s")
        assert _status(mnt)["views"]["indexes_saved"] == 1  # waits for the indexer to end
    with mounted(src, mnt, *args):
        view = mnt / ".journalfs" / "records" / "big.idx"
        t = time.monotonic()
        rec = json.loads((view / f"{count // 3:08d}.index").read_bytes())
        print(f"first cat after remount: {time.monotonic() - t:.3f} s")
        assert rec["seq"] == count // 3
        t = time.monotonic()
        os.stat(view / "records.jsonl")
        os.stat(view / f"{count - 7:08d}.index")
        print(f"two stats after remount: {time.monotonic() - t:.3f} s")
        assert _status(mnt)["views"]["indexes_loaded"] == 1
        t = time.monotonic()
        with open(view / "records.jsonl", "rb") as f:
            n = 0
            while n < 1 << 30 and (chunk := f.read(1 << 20)):
                n += len(chunk)
        print(f"records.jsonl: {n / (time.monotonic() - t) / 1e6:.0f} MB/s over {n >> 20} MiB")


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def test_daemon_memory_while_indexing_a_200mb_journal(tmp_path):
    """The daemon indexes a 200 MB journal through a 64 MiB window (issue 15): its peak RSS
    grows by about the window, not by the file (it grew by the file's size when the whole
    file was read into memory), and records from the end of the file come out right."""
    from test_journals import write_big_wallaby_log
    src = tmp_path / "src"
    src.mkdir()
    count = write_big_wallaby_log(src / "LOG", 200_000_000)
    with mounted(src, tmp_path / "mnt", "--store", str(tmp_path / "store")) as m:
        view = m.mountpoint / ".journalfs" / "records" / "LOG"
        before = _peak_rss(m.pid)
        last = json.loads(subprocess.run(
            ["getfattr", "--only-values", "-n", "user.record.seq",
             str(view / f"{count - 1:08d}.record")], capture_output=True, text=True,
            check=True).stdout)
        assert (view / f"{count - 1:08d}.record").read_bytes() == b"p" * 64
        growth = _peak_rss(m.pid) - before
    assert last == count - 1
    assert growth < (64 << 20) + (32 << 20), growth
