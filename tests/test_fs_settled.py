"""setxattr's path walk left out while the SOURCE watcher proves nothing changed (#28,
journalfs/fs/watch.py ``SourceWatcher.settled``, journalfs/fs/xattrops.py ``_one_name_now``).

A metadata write must reach the file its name still means (#24 item 2): the mount checks that
with a statx beneath SOURCE (openat2, a path walk). With fanotify (root), every change to a
name or an attribute below watched directories is queued before the changing syscall
returns, so while the watcher's generation has not moved the name still means the file, and
the set reads only the file's own owner and flags (one statx on its held fd). These tests
run the real handlers on a real SOURCE with a real store and the real fanotify watcher (no
kernel mount is needed for the mechanism), and one real mount with real users: the cached
way is taken in the common case (``walks_skipped``), and every change made directly in
SOURCE -- a rename or replacement of the file or of a directory above it, chattr +i, chown
-- is seen by the very next set. Under inotify or after lost events the walk is taken."""
from __future__ import annotations

import errno
import json
import os
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path

import pyfuse3
import pytest
import trio

from journalfs.fs.main import MountConfig, _open_metadata, assemble
from journalfs.fs.watch import KernelNotifier

import users
from mountutil import mounted
from test_store_ownership import NOTE, clean_log, note_of, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root")

KEY = b"user.metadata.note"


class Ctx:
    uid = gid = pid = 0
    umask = 0o022


@asynccontextmanager
async def handlers(base: Path, watch: str = "fanotify"):
    """The mount's handlers on ``base/src`` with a store in ``base/store``, no kernel."""
    os.environ["JOURNALFS_WATCH"] = watch
    try:
        config = MountConfig(source=str(base / "src"), mountpoint=str(base / "mnt"),
                             store=str(base / "store"))
        meta, location = _open_metadata(config)
        ops = assemble(config, meta, location, str(base / "src"))
    finally:
        del os.environ["JOURNALFS_WATCH"]
    # no FUSE session here: the kernel's caches the watcher would drop are not there
    notifier = KernelNotifier()
    notifier.invalidate_entry = lambda parent, name: None  # type: ignore[method-assign]
    notifier.invalidate_inodes = lambda items: None  # type: ignore[method-assign]
    ops.watch.notifier = notifier
    async with trio.open_nursery() as nursery:
        await nursery.start(meta.run)
        nursery.start_soon(ops.watch.run)
        try:
            yield ops
        finally:
            ops.watch.stop()
            nursery.cancel_scope.cancel()


@pytest.fixture
def base(tmp_path):
    (tmp_path / "src" / "d" / "e").mkdir(parents=True)
    (tmp_path / "store").mkdir()
    for name in ("f", "g"):
        (tmp_path / "src" / "d" / "e" / name).write_text(name)
    return tmp_path


def sh(command: str) -> None:
    """A change made directly in SOURCE by another process."""
    subprocess.run(["sh", "-c", command], check=True)


async def lookup(ops, rel: str) -> int:
    ino = pyfuse3.ROOT_INODE
    for part in rel.split("/"):
        ino = (await ops.lookup(ino, part.encode(), Ctx())).st_ino
    return ino


async def set_note(ops, ino: int, value: bytes):
    try:
        await ops.setxattr(ino, KEY, value, Ctx())
        return "ok"
    except pyfuse3.FUSEError as exc:
        return errno.errorcode[exc.errno]


def charged(ops, rel: str):
    """The ledger's (identity, uid, bytes) of the store path of SOURCE's ``rel``."""
    entries = ops.ownership.ledger.entries
    found = [v for p, v in entries.items() if p.endswith("/" + rel)]
    return found[0] if found else None


def test_the_walk_is_left_out_while_nothing_changed(base):
    async def main():
        async with handlers(base) as ops:
            ino = await lookup(ops, "d/e/f")
            assert await set_note(ops, ino, b"1") == "ok"  # bound, its facts found
            before = ops.watch.walks_skipped
            for i in range(5):
                assert await set_note(ops, ino, b"v%d" % i) == "ok"
            assert ops.watch.walks_skipped == before + 5
            assert ops.watch.status()["walks_skipped"] == before + 5
            # a change anywhere watched (here: a new name beside it) takes the walk once
            sh(f"echo n > {base}/src/d/e/new")
            assert await set_note(ops, ino, b"w") == "ok"
            assert ops.watch.walks_skipped == before + 5
            await trio.sleep(0.1)  # the watcher applies it
            assert await set_note(ops, ino, b"x") == "ok"  # the walk, then cached again
            assert ops.watch.walks_skipped == before + 5
            assert await set_note(ops, ino, b"y") == "ok"
            assert ops.watch.walks_skipped == before + 6
            assert await ops.getxattr(ino, KEY, Ctx()) == b"y"
    trio.run(main)


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_rename_and_a_new_file_in_source_never_take_the_metadata(base, what):
    """The name is renamed (or a directory above it moved) and a new file made at the old
    path directly in SOURCE, and the old file is set at once, before the watcher's round:
    nothing reaches the new file, and the old file keeps what it gets."""
    src = base / "src"

    async def main():
        async with handlers(base) as ops:
            ino = await lookup(ops, "d/e/f")
            for value in (b"a1", b"a2"):
                assert await set_note(ops, ino, value) == "ok"
            assert ops.watch.walks_skipped >= 1  # the cached way was in use
            # another process (the handlers' own changes are the mount's: not heard)
            if what == "file":
                sh(f"mv {src}/d/e/f {src}/d/e/f.old && echo new > {src}/d/e/f")
                moved = src / "d/e/f.old"
            else:
                sh(f"mv {src}/d/e {src}/d/e.old && mkdir {src}/d/e && echo new > {src}/d/e/f")
                moved = src / "d/e.old/f"
            skipped = ops.watch.walks_skipped
            got = await set_note(ops, ino, b"a3")  # right away: nothing applied yet
            assert ops.watch.walks_skipped == skipped  # the walk decided
            assert got in ("ok", "ENOENT"), got
            await trio.sleep(0.1)  # the watcher applies the rename
            new = await lookup(ops, "d/e/f")
            assert new != ino
            rel = os.path.relpath(moved, src)
            assert await lookup(ops, rel) == ino  # as the kernel finds it again
            with pytest.raises(pyfuse3.FUSEError) as exc:
                await ops.getxattr(new, KEY, Ctx())
            assert exc.value.errno == pyfuse3.ENOATTR
            assert await set_note(ops, ino, b"a4") == "ok"
            assert await ops.getxattr(ino, KEY, Ctx()) == b"a4"
            entry = charged(ops, rel)
            assert entry is not None and entry[0][0] == os.stat(moved).st_ino
            assert charged(ops, "d/e/f") is None
    trio.run(main)


def test_chattr_i_in_source_is_eperm_at_once(base):
    path = base / "src" / "d" / "e" / "f"

    async def main():
        async with handlers(base) as ops:
            ino = await lookup(ops, "d/e/f")
            for value in (b"1", b"2"):
                assert await set_note(ops, ino, value) == "ok"
            skipped = ops.watch.walks_skipped
            subprocess.run(["chattr", "+i", str(path)], check=True)
            try:
                # chattr raises no fanotify event: the flags come from the file itself
                assert await set_note(ops, ino, b"3") == "EPERM"
                assert ops.watch.walks_skipped == skipped + 1
            finally:
                subprocess.run(["chattr", "-i", str(path)], check=True)
            assert await set_note(ops, ino, b"4") == "ok"
    trio.run(main)


def test_chown_in_source_moves_the_charge_at_once(base):
    path = base / "src" / "d" / "e" / "f"

    async def main():
        async with handlers(base) as ops:
            ino = await lookup(ops, "d/e/f")
            for value in (b"1", b"2"):
                assert await set_note(ops, ino, value) == "ok"
            assert charged(ops, "d/e/f")[1] == 0
            sh(f"chown 4321:4321 {path}")
            assert await set_note(ops, ino, b"3") == "ok"
            assert charged(ops, "d/e/f")[1] == 4321
            await trio.sleep(0.1)
            assert await set_note(ops, ino, b"4") == "ok"  # cached again: still the file's
            assert charged(ops, "d/e/f")[1] == 4321
            sh(f"chown 0:0 {path}")
            assert await set_note(ops, ino, b"5") == "ok"
            assert charged(ops, "d/e/f")[1] == 0
    trio.run(main)


def test_inotify_and_lost_events_take_the_walk(base):
    async def main():
        async with handlers(base, watch="inotify") as ops:
            assert ops.watch.mechanism == "inotify"
            ino = await lookup(ops, "d/e/f")
            for i in range(3):
                assert await set_note(ops, ino, b"%d" % i) == "ok"
            assert ops.watch.walks_skipped == 0
        async with handlers(base) as ops:
            ino = await lookup(ops, "d/e/f")
            for i in range(3):
                assert await set_note(ops, ino, b"%d" % i) == "ok"
            skipped = ops.watch.walks_skipped
            assert skipped >= 1
            ops.watch._overflow(ops.watch._waiting)  # as a FAN_Q_OVERFLOW read does
            assert await set_note(ops, ino, b"x") == "ok"
            assert ops.watch.walks_skipped == skipped  # unapplied, and a new generation
            await trio.sleep(0.1)
            assert await set_note(ops, ino, b"y") == "ok"  # the walk, found again
            assert await set_note(ops, ino, b"z") == "ok"
            assert ops.watch.walks_skipped == skipped + 1
            ops.watch.limit_reached = True  # some directory went unwatched
            assert await set_note(ops, ino, b"w") == "ok"
            assert ops.watch.walks_skipped == skipped + 1
    trio.run(main)


@pytest.mark.fuse
def test_real_mount_alice_open_file_renamed_and_replaced_in_source(tmp_path):
    """Alice sets her note through a file she holds open (after the first, on the cached
    way), renames it and puts a new file at its name directly in SOURCE, and her next set
    through her open file comes at once: the new file shows nothing (to bob either), the
    renamed one has her note."""
    alice, bob = users.ensure_user("jfs-alice"), users.ensure_user("jfs-bob")
    with users.reachable_dir("jfs-settled-") as top:
        src, mnt = top / "src", top / "mnt"
        (src / "shared").mkdir(parents=True)
        os.chmod(src, 0o755)
        os.chmod(src / "shared", 0o777)
        with mounted(src, mnt, "-o", "allow_other", "--store", str(top / "store")) as m:
            sh, msh = src / "shared", mnt / "shared"
            report = str(msh / "report")
            got = run_as(alice, [
                ("mk", f"open({report!r}, 'w').write('r')"),
                ("fd", f"globals().__setitem__('fd', os.open({report!r}, os.O_RDONLY))"),
                ("s1", f"os.setxattr(fd, {NOTE!r}, b'one')"),
                ("s2", f"os.setxattr(fd, {NOTE!r}, b'two')"),
                ("s3", f"os.setxattr(fd, {NOTE!r}, b'three')"),
                # directly in SOURCE (alice has a shell too; the shared directory is 0777)
                ("mv", f"os.rename({str(sh / 'report')!r}, {str(sh / 'report.old')!r})"),
                ("new", f"open({str(sh / 'report')!r}, 'w').write('new')"),
                ("s4", f"os.setxattr(fd, {NOTE!r}, b'four')"),
                ("g4", f"os.getxattr(fd, {NOTE!r})"),
            ])
            assert got["s1"] == got["s2"] == got["s3"] == "ok", got
            assert got["mv"] == "ok" and got["new"] == 3, got
            assert got["s4"] in ("ok", "ENOENT"), got
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            assert status["watch"]["mechanism"] == "fanotify"
            assert status["watch"]["walks_skipped"] >= 1, status["watch"]
            assert note_of(bob, msh / "report") == "ENODATA"
            listed = run_as(bob, [("l", f"os.listxattr({str(msh / 'report')!r})")])["l"]
            assert NOTE not in listed, listed
            assert note_of(alice, msh / "report.old") in ("four", "three")
            clean_log(m)
