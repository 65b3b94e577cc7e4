"""MNT/.journalfs/{queues,persistence,transactions}/: each system's state as paths, through a
real mount: the same answers as journalfs.state (the pipeline's derived tables' semantics),
live as the journals grow, read-only, with SOURCE's permissions for other users."""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from journalfs import demo, state
from journalfs.formats import CODECS
from mountutil import mounted
from test_fs_views import as_view_user, shared_base, view_user  # noqa: F401  (fixture)

KESTREL = CODECS["kestrel-writer"]


@pytest.fixture
def demo_mount(tmp_path):
    src = tmp_path / "src"
    demo.write_demo(src)
    with mounted(src, tmp_path / "mnt", "--store", str(tmp_path / "store")) as m:
        m.views = m.mountpoint / ".journalfs"
        yield m
        log = m.stderr()
        assert "Traceback" not in log and "ERROR" not in log, log


def _summary_without_age(rows):
    return [{k: v for k, v in r.items() if k != "oldest_pending_age_ms"} for r in rows]


def test_queue_paths_are_the_queue_state(demo_mount):
    q = demo_mount.views / "queues" / "queues" / "jobs"
    assert sorted(os.listdir(demo_mount.views)) == [
        "changes", "metadata", "persistence", "queues", "records", "status.json", "transactions"]
    assert os.listdir(demo_mount.views / "queues") == ["queues"]
    assert sorted(os.listdir(q)) == ["(default)", "mailer", "state.json"]
    want = state.queue(str(demo_mount.source / "queues"), "jobs")
    got = json.loads((q / "state.json").read_text())
    assert _summary_without_age(got) == _summary_without_age([r.summary() for r in want.readers])
    assert all(r["oldest_pending_age_ms"] > 0 for r in got)
    for reader in want.readers:
        d = q / (reader.reader or "(default)")
        items = sorted(os.listdir(d))
        assert items == sorted(["state.json"] + [f"{i['id']:08d}.item" for i in reader.items])
        first = reader.items[0]
        assert (d / f"{first['id']:08d}.item").read_bytes() == first["payload"]
        assert os.stat(d / f"{first['id']:08d}.item").st_size == len(first["payload"])
        assert json.loads((d / "state.json").read_text())["pending"] == reader.pending
    assert not (q / "mailer" / "00000001.item").exists()  # read by mailer: not pending


def test_persistence_and_transaction_paths(demo_mount):
    orders = demo_mount.views / "persistence" / "akka" / "orders"
    want = state.persistence(str(demo_mount.source / "akka" / "orders"))
    assert sorted(os.listdir(orders)) == sorted(["state.json"] +
                                                [p.persistence_id for p in want.ids])
    assert json.loads((orders / "state.json").read_text()) == [p.summary() for p in want.ids]
    pid = want.ids[0]
    events = sorted(os.listdir(orders / pid.persistence_id))
    assert events == sorted(["state.json"] + [f"{e['seq_nr']:08d}.event" for e in pid.events])
    for e in pid.events:
        assert (orders / pid.persistence_id / f"{e['seq_nr']:08d}.event").read_bytes() == \
            e["payload"]
    db = demo_mount.views / "transactions" / "jrnl" / "db.jrnl"
    rows, _ = state.transactions(str(demo_mount.source / "jrnl" / "db.jrnl"))
    assert sorted(os.listdir(db)) == sorted(["state.json"] +
                                            [f"{r['seq']:08d}.{r['status']}" for r in rows])
    rb = next(r for r in rows if r["status"] == "rollback")
    got = json.loads((db / f"{rb['seq']:08d}.rollback").read_text())
    assert got == {**rb, "source": "jrnl/db.jrnl"}
    summary = json.loads((db / "state.json").read_text())
    assert summary["by_status"] == {s: sum(r["status"] == s for r in rows)
                                    for s in {r["status"] for r in rows}}
    assert [r["seq"] for r in summary["incomplete"]] == \
        [r["seq"] for r in rows if r["status"] != "complete"]


def test_state_paths_are_read_only_and_missing_names_are_enoent(demo_mount):
    q = demo_mount.views / "queues" / "queues" / "jobs"
    for action in (lambda: open(q / "state.json", "w"), lambda: os.mkdir(q / "new"),
                   lambda: os.unlink(q / "state.json"),
                   lambda: open(q / "mailer" / "new.item", "w")):
        with pytest.raises(OSError) as exc:
            action()
        assert exc.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    for missing in (q / "nobody", q / "mailer" / "99999999.item",
                    demo_mount.views / "queues" / "nothing",
                    demo_mount.views / "persistence" / "akka" / "orders" / "nobody"):
        assert not missing.exists()
    with pytest.raises(NotADirectoryError):
        os.listdir(q / "state.json")


def test_state_paths_follow_the_journals(demo_mount):
    """A PUT appended in SOURCE is a pending item at once; a reader's new head drops them."""
    seg = demo_mount.source / "queues" / "jobs.1700000060000"
    last = list(KESTREL.read(seg.read_bytes(), "x"))[-1]["id"]
    new = demo.kestrel_put_records(random.Random(1), 2, first_id=last + 1)
    with open(seg, "ab") as f:
        f.write(KESTREL.write(new)[4:])
    mailer = demo_mount.views / "queues" / "queues" / "jobs" / "mailer"
    assert f"{last + 2:08d}.item" in os.listdir(mailer)
    assert (mailer / f"{last + 2:08d}.item").read_bytes() == new[1]["payload"]
    assert json.loads((mailer / "state.json").read_text())["tail"] == last + 2
    reader = demo_mount.source / "queues" / "jobs.read.mailer"
    tmp = reader.with_name("jobs.read.mailer~~")
    tmp.write_bytes(CODECS["kestrel-reader"].write([{"kind": "read_head", "id": last + 1}]))
    os.rename(tmp, reader)
    deadline = time.monotonic() + 2  # a SOURCE directory's scan is reused for 0.2 s
    while sorted(os.listdir(mailer)) != sorted(["state.json", f"{last + 2:08d}.item"]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(os.listdir(mailer)) == sorted(["state.json", f"{last + 2:08d}.item"])


def test_state_paths_carry_source_permissions(shared_base, records_corpus):  # noqa: F811
    """A user sees through a state path only what they can read in SOURCE: every file of a
    queue or journal must be readable for its state to be."""
    user = view_user()
    src, mnt = shared_base / "src", shared_base / "mnt"
    for d in ("open", "closed", "mixed", "akka"):
        (src / d).mkdir(parents=True, mode=0o755)
    for d in ("open", "closed", "mixed"):
        for p in (records_corpus).glob("jobs.*"):
            shutil.copyfile(p, src / d / p.name)
            (src / d / p.name).chmod(0o644 if d != "closed" else 0o600)
    (src / "mixed" / "jobs.read.indexer").chmod(0o600)
    for p in (records_corpus / "akka0").iterdir():
        shutil.copyfile(p, src / "akka" / p.name)
        (src / "akka" / p.name).chmod(0o600)
    shutil.copyfile(records_corpus / "db0.jrnl", src / "db0.jrnl")
    (src / "db0.jrnl").chmod(0o644)
    mnt.mkdir()
    with mounted(src, mnt, "--store", str(shared_base / "store"), "-o", "allow_other"):
        v = mnt / ".journalfs"
        got = as_view_user(user, [
            ("open", "list", v / "queues" / "open" / "jobs"),
            ("open_state", "read", v / "queues" / "open" / "jobs" / "state.json"),
            ("closed", "list", v / "queues" / "closed" / "jobs"),
            ("closed_state", "read", v / "queues" / "closed" / "jobs" / "state.json"),
            ("mixed", "list", v / "queues" / "mixed" / "jobs"),
            ("akka", "list", v / "persistence" / "akka"),
            ("jrnl", "read", v / "transactions" / "db0.jrnl" / "state.json"),
        ])
    assert isinstance(got["open"], list) and "state.json" in got["open"]
    assert isinstance(got["open_state"], int) and got["open_state"] > 0
    assert got["closed"] == got["closed_state"] == got["mixed"] == got["akka"] == "EACCES"
    assert isinstance(got["jrnl"], int)


def test_changes_paths(demo_mount):
    d = demo_mount.views / "changes" / "gvfs-metadata" / "home-5eedface.log"
    rows, _ = state.metadata_changes(str(demo_mount.source / "gvfs-metadata" /
                                         "home-5eedface.log"))
    names = [f"{r['seq']:08d}.{r['change']}" for r in rows]
    assert sorted(os.listdir(d)) == sorted(["state.json"] + names)
    unset = json.loads((d / "00000002.unset").read_text())
    home = demo_mount.source / "gvfs-metadata" / "home"
    node = next(r for r in CODECS["gvfs-tree"].read(home.read_bytes(), str(home))
                if r["path"] == unset["path"])
    assert unset["before"].endswith(" #0")  # the demo's first file: annotated "<word> #0"
    assert (unset["before"], unset["after"]) == (node["metadata"]["annotation"], None)
    assert json.loads((d / "state.json").read_text())["entries"] == len(rows)


def test_hostile_queue_files_give_their_valid_prefix(demo_mount):
    """A segment damaged after some PUTs, a reader file of garbage after its magic, a
    symlink named like a segment: the state is computed from what is valid, the daemon
    logs no error (the fixture checks), nothing outside SOURCE is read."""
    qdir = demo_mount.source / "queues"
    good = demo.kestrel_put_records(random.Random(5), 3, first_id=1000)
    (qdir / "jobs.1800000000000").write_bytes(KESTREL.write(good) + b"\x99" + os.urandom(64))
    (qdir / "jobs.read.evil").write_bytes(bytes.fromhex("263c2603") + os.urandom(50))
    os.symlink("/etc/passwd", qdir / "jobs.1900000000000")
    q = demo_mount.views / "queues" / "queues" / "jobs"
    rows = {r["reader"]: r for r in json.loads((q / "state.json").read_text())}
    assert rows["mailer"]["tail"] == 1002
    assert f"{1002:08d}.item" in os.listdir(q / "mailer")
    assert (q / "mailer" / f"{1002:08d}.item").read_bytes() == good[2]["payload"]
    assert "evil" in rows and rows["evil"]["head"] >= 0
