"""The journal views (MNT/.journalfs) in-process, with no kernel mount (the fast tier).

Each test serves the demo tree (journalfs/demo.py) with a JournalFS and its own embedded store
(tests/fastops.py), calls the FUSE handlers directly, and compares what the views show with
what `journalfs records --json` prints for the same files. The store is checked by its fsck
after each test (tests/conftest.py). tests/test_fs_views.py checks the same through a mount.
"""
from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import random
import stat
import tempfile
from pathlib import Path

import pyfuse3
import pytest

import fastops
from fastops import ROOT, Ctx, error_of, listdir, lookup_path, read_all
from journalfs import demo, state
from journalfs.formats import CODECS
from journalfs.journals import sniff_file
from test_fs_views import cli_records_json, record_names

pytestmark = pytest.mark.fast

NOBODY = Ctx(uid=65534, gid=65534)
FILE_MODE = stat.S_IFREG | 0o644
def _demo_journals() -> set[str]:
    """The journals of the demo tree (journalfs/demo.py), by SOURCE-relative path: its files
    a codec recognises (so a new format's demo files are expected with no edit here)."""
    with tempfile.TemporaryDirectory() as tmp:
        demo.write_demo(Path(tmp))
        return {os.path.relpath(p, tmp) for p in Path(tmp).rglob("*")
                if p.is_file() and sniff_file(str(p)) is not None}


DEMO_JOURNALS = _demo_journals()


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    demo.write_demo(src)
    return src


#: `records --json` output by (path's name, content): the demo is the same in every test
_CLI_SEEN: dict[tuple[str, bytes], bytes] = {}


@pytest.fixture
def cli(tmp_path):
    """`journalfs records FILE --json` of SOURCE files (bytes of stdout), by relative path;
    all not seen before asked for at once (one interpreter)."""
    def run(source: Path, rels) -> dict[str, bytes]:
        def key(rel):
            path = source / rel
            content = path.read_bytes() if path.is_file() else repr(sorted(
                (str(p), p.read_bytes()) for p in path.rglob("*") if p.is_file())).encode()
            return rel, hashlib.sha256(content).digest()
        keys = {rel: key(rel) for rel in rels}
        new = sorted(rel for rel in rels if keys[rel] not in _CLI_SEEN)
        if new:
            out = Path(tempfile.mkdtemp(dir=tmp_path))
            for rel, output in zip(new, cli_records_json(*(source / r for r in new), tmp_dir=out)):
                _CLI_SEEN[keys[rel]] = output
        return {rel: _CLI_SEEN[keys[rel]] for rel in rels}
    return run


def run(source: Path, scenario, **kwargs):
    return fastops.run(source, scenario, **kwargs)


async def journal_dirs(ops, rel: str = "") -> set[str]:
    """Every journal directory below .journalfs/records/REL (a directory with records.jsonl),
    walked with lookup and readdir."""
    top = await lookup_path(ops, f".journalfs/records/{rel}".rstrip("/"))
    names = await listdir(ops, top.st_ino)
    if "records.jsonl" in names:
        return {rel}
    found = set()
    for name in names:
        found |= await journal_dirs(ops, f"{rel}/{name}".lstrip("/"))
    return found


def payload_of(rec: dict, line: bytes) -> bytes:
    """What a record's file holds: its payload, or its JSON line when it has none."""
    return base64.b64decode(rec["payload_b64"]) if "payload_b64" in rec else line


async def check_journal_view(ops, rel: str, output: bytes) -> list[dict]:
    """The view of journal ``rel`` shows exactly ``output`` (what `records --json` printed):
    records.jsonl byte for byte, one file per record named SEQ.KIND with its payload, each with
    the size getattr gives; returns the records."""
    view = f".journalfs/records/{rel}"
    jsonl = await lookup_path(ops, f"{view}/records.jsonl")
    assert await read_all(ops, jsonl.st_ino) == output, rel
    assert (await ops.getattr(jsonl.st_ino, ROOT)).st_size == len(output), rel
    lines = output.splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    names = record_names(records)
    journal = await lookup_path(ops, view)
    assert stat.S_ISDIR(journal.st_mode)
    assert sorted(await listdir(ops, journal.st_ino)) == sorted(names + ["records.jsonl"]), rel
    for rec, name, line in zip(records, names, lines):
        attrs = await lookup_path(ops, f"{view}/{name}")
        content = await read_all(ops, attrs.st_ino)
        assert content == payload_of(rec, line), (rel, name)
        assert attrs.st_size == len(content) and stat.S_ISREG(attrs.st_mode), (rel, name)
    return records


def test_records_tree_lists_every_journal_and_nothing_else(source, cli):
    shown = run(source, journal_dirs)
    assert shown == DEMO_JOURNALS
    # the same files `journalfs records SOURCE --json` finds in the directory
    every = [json.loads(line) for line in cli(source.parent, [source.name])[source.name].splitlines()]
    # (a gvfs copy entry's own "source", the path it copies from, takes the place of the
    # file's "source" in these lines: left out here, a known defect of the CLI's output)
    assert {os.path.relpath(rec["source"], source) for rec in every
            if (rec["format"], rec["kind"]) != ("gvfs-journal", "copy")} == DEMO_JOURNALS

    async def hidden(ops):
        records = await lookup_path(ops, ".journalfs/records")
        top = set(await listdir(ops, records.st_ino))
        # the directories holding journals, no docs, photos
        assert top == {rel.split("/")[0] for rel in DEMO_JOURNALS}
        assert not top & {"docs", "photos", "README.txt"}
        for missing in ("docs", "photos", "README.txt", "docs/notes.md", "wallaby/nothing"):
            assert await error_of(lookup_path(ops, f".journalfs/records/{missing}")) == \
                errno.ENOENT, missing
        # the views never show up in SOURCE's own listing, and never in their own records
        assert ".journalfs" not in await listdir(ops, pyfuse3.ROOT_INODE)
        assert not (source / ".journalfs").exists()
    run(source, hidden)


def test_every_journal_view_matches_records_json(source, cli):
    outputs = cli(source, DEMO_JOURNALS)

    async def scenario(ops):
        for rel in sorted(DEMO_JOURNALS):
            records = await check_journal_view(ops, rel, outputs[rel])
            assert records, rel  # every demo journal has records
    run(source, scenario)


def test_record_xattrs_are_the_json_fields(source, cli):
    outputs = cli(source, DEMO_JOURNALS)

    async def scenario(ops):
        for rel in sorted(DEMO_JOURNALS):
            lines = outputs[rel].splitlines()
            records = [json.loads(line) for line in lines]
            for rec, name in list(zip(records, record_names(records)))[:3]:
                ino = (await lookup_path(ops, f".journalfs/records/{rel}/{name}")).st_ino
                listed = set(await ops.listxattr(ino, ROOT))
                for field, value in rec.items():
                    attr = f"user.record.{field}".encode()
                    if isinstance(value, (list, dict)) or field == "payload_b64":
                        assert attr not in listed, (rel, name, field)
                        continue
                    text = value if isinstance(value, str) else json.dumps(value)
                    assert await ops.getxattr(ino, attr, ROOT) == text.encode(), (rel, field)
                    assert attr in listed, (rel, name, field)
                assert await error_of(ops.getxattr(ino, b"user.record.no_such_field", ROOT)) \
                    == errno.ENODATA
                assert await error_of(ops.getxattr(ino, b"user.metadata.k", ROOT)) == \
                    errno.ENODATA
    run(source, scenario)


def test_views_refuse_every_change_with_erofs(source):
    async def scenario(ops):
        view = ".journalfs/records/jrnl/db.jrnl"
        journal = await lookup_path(ops, view)
        names = sorted(await listdir(ops, journal.st_ino))
        rec = await lookup_path(ops, f"{view}/{names[0]}")
        first = names[0].encode()
        jsonl = await lookup_path(ops, f"{view}/records.jsonl")
        status = await lookup_path(ops, ".journalfs/status.json")
        records = await lookup_path(ops, ".journalfs/records")
        attempts = {
            "open a record for writing": ops.open(rec.st_ino, os.O_RDWR, ROOT),
            "open records.jsonl for writing": ops.open(jsonl.st_ino, os.O_WRONLY, ROOT),
            "open status.json for writing": ops.open(status.st_ino, os.O_WRONLY, ROOT),
            "create a file": ops.create(journal.st_ino, b"new", FILE_MODE, os.O_WRONLY, ROOT),
            "mkdir": ops.mkdir(journal.st_ino, b"d", stat.S_IFDIR | 0o755, ROOT),
            "unlink a record": ops.unlink(journal.st_ino, first, ROOT),
            "rmdir records": ops.rmdir((await lookup_path(ops, ".journalfs")).st_ino,
                                       b"records", ROOT),
            "rename a record": ops.rename(journal.st_ino, first, journal.st_ino,
                                          b"x", 0, ROOT),
            "rename out of the views": ops.rename(journal.st_ino, first,
                                                  pyfuse3.ROOT_INODE, b"stolen", 0, ROOT),
            "rename into the views": ops.rename(pyfuse3.ROOT_INODE, b"README.txt",
                                                records.st_ino, b"README.txt", 0, ROOT),
            "link out of the views": ops.link(rec.st_ino, pyfuse3.ROOT_INODE, b"linked", ROOT),
            "symlink": ops.symlink(journal.st_ino, b"l", b"x", ROOT),
            "setxattr metadata": ops.setxattr(rec.st_ino, b"user.metadata.k", b"v", ROOT),
            "removexattr": ops.removexattr(rec.st_ino, b"user.record.kind", ROOT),
        }
        for what, call in attempts.items():
            assert await error_of(call) == errno.EROFS, what
        assert not (source / "stolen").exists() and not (source / "linked").exists()
        assert (source / "README.txt").exists()
    run(source, scenario)


def test_a_damaged_journal_shows_its_valid_prefix_and_where_it_breaks(source, cli):
    whole = (source / "jrnl" / "db.jrnl").read_bytes()
    (source / "jrnl" / "torn.jrnl").write_bytes(whole[:len(whole) * 2 // 3])
    outputs = cli(source, ["jrnl/torn.jrnl", "jrnl/db.jrnl"])
    valid = outputs["jrnl/torn.jrnl"]
    assert valid and len(valid.splitlines()) < len(outputs["jrnl/db.jrnl"].splitlines())

    async def scenario(ops):
        await check_journal_view(ops, "jrnl/torn.jrnl", valid)
        torn = await lookup_path(ops, ".journalfs/records/jrnl/torn.jrnl")
        damage = (await ops.getxattr(torn.st_ino, b"user.journal.damage", ROOT)).decode()
        offset, _, reason = damage.partition(": ")
        assert 0 < int(offset) <= len(whole) * 2 // 3 and reason
        assert b"user.journal.damage" in await ops.listxattr(torn.st_ino, ROOT)
        healthy = await lookup_path(ops, ".journalfs/records/jrnl/db.jrnl")
        assert b"user.journal.damage" not in await ops.listxattr(healthy.st_ino, ROOT)
        assert await error_of(ops.getxattr(healthy.st_ino, b"user.journal.damage", ROOT)) == \
            errno.ENODATA
        status = json.loads(await read_all(ops, (await lookup_path(
            ops, ".journalfs/status.json")).st_ino))
        listed = {d["path"]: d for d in status["damaged_journals"]}
        assert listed["jrnl/torn.jrnl"]["offset"] == int(offset)
        assert "jrnl/db.jrnl" not in listed
    run(source, scenario)


def test_journals_made_renamed_grown_and_removed_through_the_handlers(source, cli):
    """Changes made through the mount show in the views at once (no cache to wait out)."""
    segment = (source / "queues" / "jobs.1700000060000").read_bytes()
    first_rec = list(CODECS["kestrel-writer"].read(segment, "x"))
    grown = CODECS["kestrel-writer"].write(
        demo.kestrel_put_records(random.Random(7), 3, first_id=first_rec[-1]["id"] + 1))[4:]

    async def scenario(ops):
        wallaby = await lookup_path(ops, "wallaby")
        before = await journal_dirs(ops, "wallaby")
        info, _ = await ops.create(wallaby.st_ino, b"copy.jobs", FILE_MODE, os.O_WRONLY, ROOT)
        await ops.write(info.fh, 0, segment)
        await ops.release(info.fh)
        assert await journal_dirs(ops, "wallaby") == before | {"wallaby/copy.jobs"}
        view_before = await read_all(ops, (await lookup_path(
            ops, ".journalfs/records/wallaby/copy.jobs/records.jsonl")).st_ino)

        await ops.rename(wallaby.st_ino, b"copy.jobs", wallaby.st_ino, b"moved.jobs", 0, ROOT)
        assert await journal_dirs(ops, "wallaby") == before | {"wallaby/moved.jobs"}
        assert await error_of(lookup_path(ops, ".journalfs/records/wallaby/copy.jobs")) == \
            errno.ENOENT

        moved = await lookup_path(ops, "wallaby/moved.jobs")
        info = await ops.open(moved.st_ino, os.O_WRONLY | os.O_APPEND, ROOT)
        await ops.write(info.fh, len(segment), grown)
        await ops.release(info.fh)
        return view_before

    view_before = run(source, scenario)
    outputs = cli(source, ["wallaby/moved.jobs"])
    grown_output = outputs["wallaby/moved.jobs"]
    assert len(grown_output.splitlines()) == len(view_before.splitlines()) + 3

    async def after(ops):
        await check_journal_view(ops, "wallaby/moved.jobs", grown_output)
        wallaby = await lookup_path(ops, "wallaby")
        await ops.unlink(wallaby.st_ino, b"moved.jobs", ROOT)
        assert "moved.jobs" not in await listdir(
            ops, (await lookup_path(ops, ".journalfs/records/wallaby")).st_ino)
    run(source, after)


def test_views_follow_source_permissions(source):
    """A journal in a directory the caller cannot enter is not there for them."""
    os.chmod(source / "jrnl", 0o700)

    async def scenario(ops):
        records = await lookup_path(ops, ".journalfs/records")
        for_root = set(await listdir(ops, records.st_ino, ROOT))
        for_nobody = set(await listdir(ops, records.st_ino, NOBODY))
        assert "jrnl" in for_root and "jrnl" not in for_nobody
        assert for_nobody == for_root - {"jrnl"}
        assert await error_of(lookup_path(ops, ".journalfs/records/jrnl/db.jrnl", NOBODY)) in \
            (errno.ENOENT, errno.EACCES)
    if os.geteuid() != 0:
        pytest.skip("a caller other than the daemon's user needs root")
    run(source, scenario)


def test_state_views_are_journalfs_state(source):
    want_queue = state.queue(str(source / "queues"), "jobs")
    want_ids = state.persistence(str(source / "akka" / "orders"))
    rows, _ = state.transactions(str(source / "jrnl" / "db.jrnl"))

    async def scenario(ops):
        top = await lookup_path(ops, ".journalfs")
        assert sorted(await listdir(ops, top.st_ino)) == [
            "changes", "metadata", "persistence", "queues", "records", "status.json",
            "transactions"]
        q = ".journalfs/queues/queues/jobs"
        assert sorted(await listdir(ops, (await lookup_path(ops, q)).st_ino)) == \
            sorted(["state.json"] + [r.reader or "(default)" for r in want_queue.readers])
        for reader in want_queue.readers:
            d = f"{q}/{reader.reader or '(default)'}"
            assert sorted(await listdir(ops, (await lookup_path(ops, d)).st_ino)) == \
                sorted(["state.json"] + [f"{i['id']:08d}.item" for i in reader.items])
            first = reader.items[0]
            item = await lookup_path(ops, f"{d}/{first['id']:08d}.item")
            assert await read_all(ops, item.st_ino) == first["payload"]
        orders = ".journalfs/persistence/akka/orders"
        got = json.loads(await read_all(ops, (await lookup_path(
            ops, f"{orders}/state.json")).st_ino))
        assert got == [p.summary() for p in want_ids.ids]
        db = ".journalfs/transactions/jrnl/db.jrnl"
        assert sorted(await listdir(ops, (await lookup_path(ops, db)).st_ino)) == \
            sorted(["state.json"] + [f"{r['seq']:08d}.{r['status']}" for r in rows])
        assert await error_of(lookup_path(ops, f"{q}/nobody")) == errno.ENOENT
        state_json = await lookup_path(ops, f"{q}/state.json")
        assert await error_of(ops.open(state_json.st_ino, os.O_WRONLY, ROOT)) == errno.EROFS
    run(source, scenario)


def test_live_metadata_journal_shows_each_set_as_records_json_does(source, cli):
    async def scenario(ops):
        journal = await lookup_path(ops, ".journalfs/metadata/journal")
        before = set(await listdir(ops, journal.st_ino))
        readme = await lookup_path(ops, "README.txt")
        await ops.setxattr(readme.st_ino, b"user.metadata.watched", b"yes", ROOT)
        await ops.setxattr(readme.st_ino, b"user.metadata.tags", b"a\0b\0", ROOT)
        added = set(await listdir(ops, journal.st_ino)) - before
        assert sorted(n.partition(".")[2] for n in added) == ["set", "setv"]  # a list: setv
        jsonl = await read_all(ops, (await lookup_path(
            ops, ".journalfs/metadata/journal/records.jsonl")).st_ino)
        entries = [json.loads(line) for line in jsonl.splitlines()]
        assert [(e["format"], e["kind"], e["key"], e["value"]) for e in entries[-2:]] == \
            [("gvfs-journal", "set", "watched", "yes"),
             ("gvfs-journal", "setv", "tags", ["a", "b"])]
        assert all(e["path"].endswith("/README.txt") for e in entries[-2:])
        newest = sorted(added)[-1]
        rec = await lookup_path(ops, f".journalfs/metadata/journal/{newest}")
        assert json.loads(await read_all(ops, rec.st_ino)) == entries[-1]
        status = json.loads(await read_all(ops, (await lookup_path(
            ops, ".journalfs/status.json")).st_ino))
        # the live view is `journalfs records` of the store's journal file (read while the
        # store is open: closing it rotates the journal away)
        journal_file = status["store"]["journal"].lstrip("/")
        shown = cli(Path("/"), [journal_file])[journal_file]
        assert [json.loads(line)["key"] for line in shown.splitlines()][-2:] == \
            ["watched", "tags"]
        assert shown == jsonl

    run(source, scenario)


def test_status_json_describes_the_mount(source):
    async def scenario(ops):
        attrs = await lookup_path(ops, ".journalfs/status.json")
        data = await read_all(ops, attrs.st_ino)
        status = json.loads(data)
        assert status["options"]["sync"] == "always" and status["options"]["source"] == \
            str(source)
        assert status["store"]["tree"].startswith(str(source.parent / "data"))
        assert status["store"]["journal"] == status["service"]["journal_path"]
        assert status["entries"] == status["service"]["entries"] and status["rotations"] >= 0
        assert 0 <= status["journal_fill"] <= 1
        assert status["damaged_journals"] == []
    run(source, scenario)


@pytest.mark.parametrize("room", [1, 7, 64])
def test_listings_resume_where_a_full_reply_buffer_stopped_them(source, room):
    """The kernel's reply buffer fills up after a few entries; the next readdir resumes at the
    offset of the last one taken: each listing still gives every name once."""
    with open(source / "wallaby" / "events.log.idx", "rb") as f:
        index = f.read()
    for i in range(150):  # a big SOURCE directory, and a big records/ directory
        (source / "docs" / f"note{i:03d}.txt").write_text(str(i))
    (source / "many").mkdir()
    for i in range(40):
        (source / "many" / f"events{i:02d}.log.idx").write_bytes(index)

    async def scenario(ops):
        for path in ("docs", ".journalfs/records/many", ".journalfs/records/jrnl/db.jrnl",
                     ".journalfs/records/wallaby/events.log", ".journalfs"):
            ino = (await lookup_path(ops, path)).st_ino
            whole = await listdir(ops, ino)
            paged = await listdir(ops, ino, room=room)
            assert paged == whole and len(set(paged)) == len(paged), path
        assert len(await listdir(ops, (await lookup_path(ops, "docs")).st_ino, room=room)) == 152
        assert len(await listdir(ops, (await lookup_path(
            ops, ".journalfs/records/many")).st_ino, room=room)) == 40
    run(source, scenario)
