"""A journal written directly in SOURCE is in its view at once, and the mount's kept answers
never hide it (issue 24's probes: carol writes a small journal in SOURCE, then lists its
view; it sometimes gave ENOENT).

Two windows, each reproduced here by its mechanism:
- a lookup that waited (a worker-thread hop) while the kernel's FORGET of the same view inode
  arrived: the node left the table and the reply named an inode the daemon no longer knew, so
  the next request on it (the listing) gave ENOENT. The kernel forgets a records/ directory
  whenever the watcher drops its name, i.e. after every change in it.
- "not there" answers kept per caller (0.5 s) and "no journal below" answers (2 s): a journal
  written in SOURCE right after its name was looked up stayed hidden until they expired (for
  ever in a directory nobody watches, until the watcher's round in one it watches).

And a listing of a mirrored directory keeps using its kept copy while changes elsewhere in
SOURCE still wait in the watcher's queue: it waits for the watcher's round instead of
rescanning (a counter of scans), and still shows a change made in that directory just before.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyfuse3
import pytest
import trio

import fastops
import users
from conftest import CONFORMANCE
from fastops import ROOT, listdir, lookup_path
from journalfs import demo
from mountutil import mounted
from test_fs_permissions import SYSTEM_PYTHON
from test_store_ownership import clean_log, run_as

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")
#: a 4 kB Wallaby index of 7 records: carol's small journal in the hostile benchmark
TEMPLATE = CONFORMANCE / "records" / "wal0.log.idx"


@pytest.fixture
def carol():
    return users.ensure_user("jfs-race-carol")


def carols_tree(base: Path, carol) -> Path:
    """SOURCE with carol's 0755 home: one journal of hers (so records/ shows her home), an
    empty subdirectory and her template; SOURCE's own directories are 0755."""
    src = base / "src"
    home = src / "carol"
    (home / "empty").mkdir(parents=True)
    for d in (src, home, home / "empty"):
        os.chmod(d, 0o755)
    for d in (home, home / "empty"):
        os.chown(d, carol.pw_uid, carol.pw_gid)
    shutil.copyfile(TEMPLATE, home / "old.log.idx")
    shutil.copyfile(TEMPLATE, base / "template.idx")
    for f in (home / "old.log.idx", base / "template.idx"):
        os.chown(f, carol.pw_uid, carol.pw_gid)
        os.chmod(f, 0o644)
    return src


@pytest.mark.fuse
@AS_ROOT
def test_a_journal_written_in_source_after_a_miss_is_found_at_once(carol):
    """carol looks up names that are not journals yet (a missing file, a directory with no
    journal), then writes journals there directly in SOURCE and lists their views at once,
    in one process: each is found (on the code before, the kept "not there" answers said
    ENOENT for 0.5 s, and "no journal below" for 2 s: neither directory is watched, as
    nobody used it through the mirror)."""
    with users.reachable_dir("jfs-views-race-") as base:
        src, mnt = carols_tree(base, carol), base / "mnt"
        recs = mnt / ".journalfs" / "records" / "carol"
        template = str(base / "template.idx")
        new_file, new_in_dir = src / "carol" / "new.log.idx", src / "carol" / "empty" / "j.log.idx"
        with mounted(src, mnt, "-o", "allow_other") as m:
            seen = run_as(carol, [
                ("home", f"sorted(os.listdir({str(recs)!r}))"),
                ("missing_file", f"os.stat({str(recs / 'new.log.idx')!r})"),
                ("missing_dir", f"os.stat({str(recs / 'empty')!r})"),
                ("write_file", f"__import__('shutil').copyfile({template!r}, {str(new_file)!r})"),
                ("write_dir", f"__import__('shutil').copyfile({template!r}, {str(new_in_dir)!r})"),
                ("file_view", f"sorted(os.listdir({str(recs / 'new.log.idx')!r}))[:2]"),
                ("dir_view", f"sorted(os.listdir({str(recs / 'empty')!r}))"),
                ("record", f"len(open({str(recs / 'new.log.idx' / '00000000.index')!r}, 'rb')"
                           ".read()) > 0"),
            ])
            assert seen["home"] == ["old.log.idx"], seen
            assert seen["missing_file"] == "ENOENT" and seen["missing_dir"] == "ENOENT", seen
            assert seen["file_view"] == ["00000000.index", "00000001.index"], seen
            assert seen["dir_view"] == ["j.log.idx"], seen
            assert seen["record"] is True, seen
            clean_log(m)


PROBE = r"""
import json, os, sys
home, views, template, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = open(template, "rb").read()
errors = []
for n in range(rounds):
    name = "v%d.log.idx" % n
    with open(os.path.join(home, name), "wb") as f:
        f.write(data)
    if n >= 2:
        os.unlink(os.path.join(home, "v%d.log.idx" % (n - 2)))
    try:
        view = os.path.join(views, name)
        first = sorted(os.listdir(view))[0]
        with open(os.path.join(view, first), "rb") as f:
            f.read()
    except OSError as exc:
        errors.append("%s: %s" % (name, exc.strerror))
print(json.dumps(errors))
"""


@pytest.mark.fuse
@AS_ROOT
def test_new_small_views_in_a_loop_never_give_enoent(carol):
    """The hostile benchmark's probe, on its own: carol writes a new small journal in SOURCE
    (and removes the one before last), lists its view and reads its first record, 300 times.
    Every change in her home makes the watcher drop records/carol's name from the kernel,
    which forgets its inode while her next lookup of it may be waiting: every listing and
    read succeeds. (The race needs unlucky timing: on the code before, a few errors per run
    of the benchmark; the deterministic check is the in-process test below.)"""
    with users.reachable_dir("jfs-views-race-") as base:
        src, mnt = carols_tree(base, carol), base / "mnt"
        with mounted(src, mnt, "-o", "allow_other") as m:
            os.stat(mnt / "carol" / "old.log.idx")  # her home is watched, as in the benchmark
            proc = subprocess.run(
                ["setpriv", f"--reuid={carol.pw_uid}", f"--regid={carol.pw_gid}",
                 "--init-groups", "--reset-env", SYSTEM_PYTHON, "-c", PROBE, str(src / "carol"),
                 str(mnt / ".journalfs" / "records" / "carol"), str(base / "template.idx"),
                 "300"], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout) == []
            clean_log(m)


@pytest.mark.fast
def test_a_forget_arriving_while_a_lookup_waits_keeps_the_node(tmp_path):
    """The kernel's FORGET of a records/ directory's earlier references, handled while a new
    lookup of it waits for its worker thread: the lookup's reply names the same inode, and
    that inode is still known (the code before dropped it: the next request, the listing,
    got ENOENT)."""
    src = tmp_path / "src"
    demo.write_demo(src)

    async def scenario(ops):
        views = ops.views
        records = await lookup_path(ops, ".journalfs/records")
        first = await ops.lookup(records.st_ino, b"wallaby", ROOT)
        held = views.by_ino[first.st_ino].lookups  # the kernel's references so far
        parked, release = trio.Event(), trio.Event()
        real = views._on_file

        async def on_file(rel, fn, *args):
            if getattr(fn, "__name__", "") == "_records_dir_stat":  # the getattr's hop
                parked.set()
                await release.wait()
            return await real(rel, fn, *args)

        views._on_file = on_file
        views.catalog.discard_where(lambda key: key[0] in ("shown", "dir-lstat"))
        found = {}
        async with trio.open_nursery() as nursery:
            async def look():
                found["attrs"] = await ops.lookup(records.st_ino, b"wallaby", ROOT)
            nursery.start_soon(look)
            await parked.wait()
            await ops.forget([(first.st_ino, held)])  # the kernel evicted its inode
            release.set()
        ino = found["attrs"].st_ino
        assert ino == first.st_ino  # the same node, still there while the lookup waited
        assert views.by_ino[ino].lookups == 1  # the kernel's one new reference
        assert (await ops.getattr(ino, ROOT)).st_ino == ino
        assert "events.log" in await listdir(ops, ino)

    fastops.run(src, scenario)


@pytest.mark.fast
def test_a_forget_arriving_while_a_dotdot_lookup_waits_keeps_the_node(tmp_path):
    """The same for a mirrored directory's ``..`` (NFS exports ask it): the FORGET of the
    kernel's references to the parent, handled while the lookup's stat waits, leaves the
    node the reply names in the table."""
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)

    async def scenario(ops):
        a = await lookup_path(ops, "a")
        b = await lookup_path(ops, "a/b")
        held = ops.table.by_ino[a.st_ino].lookups
        parked, release = trio.Event(), trio.Event()
        real = ops._stat

        async def stat_waiting(node):
            if node.ino == a.st_ino:
                parked.set()
                await release.wait()
            return await real(node)

        ops._stat = stat_waiting
        found = {}
        async with trio.open_nursery() as nursery:
            async def look():
                found["attrs"] = await ops.lookup(b.st_ino, b"..", ROOT)
            nursery.start_soon(look)
            await parked.wait()
            await ops.forget([(a.st_ino, held)])  # the kernel evicted its inode
            release.set()
        assert found["attrs"].st_ino == a.st_ino
        assert ops.table.by_ino[a.st_ino].lookups == 1  # the kernel's one new reference
        assert (await ops.getattr(a.st_ino, ROOT)).st_ino == a.st_ino

    fastops.run(src, scenario)


@pytest.mark.fast
@pytest.mark.skipif(os.environ.get("JOURNALFS_WATCH") == "off", reason="needs a SOURCE watcher")
def test_changes_elsewhere_in_source_leave_a_listing_its_kept_copy(tmp_path):
    """With the watcher running (as a mount runs it), a directory listed once is listed
    again from its kept copy although changes elsewhere in SOURCE still wait in the
    watcher's queue (the code before rescanned SOURCE whenever anything anywhere was
    pending: one user's flood of changes made every listing a rescan); a change in the
    directory itself, made just before the listing, shows."""
    src = tmp_path / "src"
    (src / "listed").mkdir(parents=True)
    (src / "elsewhere").mkdir()
    for i in range(20):
        (src / "listed" / f"f{i:02d}").write_bytes(b"x")

    def touch(path: Path) -> None:
        """Made by another process, as behind a mount's back (fanotify does not report the
        daemon's own changes; here the test is the daemon), without a trio checkpoint."""
        subprocess.run(["touch", str(path)], check=True)

    async def scenario(ops):
        scans = []
        real = ops._scan

        async def counted(node, *args):
            scans.append(node.path)
            return await real(node, *args)

        ops._scan = counted
        async with trio.open_nursery() as nursery:
            await nursery.start(ops.watch.run)
            listed = await lookup_path(ops, "listed")
            await lookup_path(ops, "elsewhere")  # known, so watched
            assert ops.watch.watching(listed.st_ino)
            names = await listdir(ops, listed.st_ino)
            assert len(names) == 20 and scans == [b"listed"]
            for i in range(5):  # queued, not yet read by the watcher: no checkpoint between
                touch(src / "elsewhere" / f"n{i}")
                assert ops.watch.pending()
                assert len(await listdir(ops, listed.st_ino)) == 20
            assert scans == [b"listed"], scans  # every listing from the kept copy
            touch(src / "listed" / "late")  # in the listed directory itself: still queued
            assert "late" in await listdir(ops, listed.st_ino)
            nursery.cancel_scope.cancel()

    fastops.run(src, scenario)


@pytest.mark.fast
def test_unsettled_reads_ahead_of_the_watcher_within_a_bound(monkeypatch, tmp_path):
    """unsettled() reads the kernel's queue ahead of the watcher's round only up to
    MAX_TAKEN changes; past it nothing more is read and every directory is unsettled."""
    from journalfs.fs import watch
    watcher = watch.SourceWatcher(lambda ino, name: None)
    try:
        monkeypatch.setattr(watch, "MAX_TAKEN", 2)
        read = []
        monkeypatch.setattr(watcher, "_read_all", lambda changes: read.append(1) or changes)
        watcher._waiting = {(7, b"a"): 1, (7, b"b"): 1}
        watcher._waiting_dirs = {7}
        assert watcher.unsettled(8) is True and read == []
        watcher._waiting = {(7, b"a"): 1}
        assert watcher.unsettled(8) is False
        assert watcher.unsettled(7) is True
    finally:
        watcher.stop()
