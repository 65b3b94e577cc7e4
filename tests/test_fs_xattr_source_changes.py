"""A metadata write right after a change made directly in SOURCE (#24 items 2 and 9, and
#28: any cache of setxattr's identity check must keep this true).

setxattr checks that the file's name still means it (a statx beneath SOURCE), reads its
owner (the quota's uid) and its inode flags (chattr +i/+a: EPERM). These tests set metadata
on a file several times (anything a handler could cache is cached), change SOURCE from
another process -- rename or replace the file or a directory above it, chattr +i, chown --
and set again at once, before the watcher's round: the set never reaches the new file at the
old name, +i is refused at once and the charge follows the owner at once. The handlers run
in-process on a real SOURCE with a real store and the real watcher; the last test does the
same through a real mount, as a real user holding the file open."""
from __future__ import annotations

import errno
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
    before = os.environ.get("JOURNALFS_WATCH")
    os.environ["JOURNALFS_WATCH"] = watch
    try:
        config = MountConfig(source=str(base / "src"), mountpoint=str(base / "mnt"),
                             store=str(base / "store"))
        meta, location = _open_metadata(config)
        ops = assemble(config, meta, location, str(base / "src"))
    finally:
        if before is None:
            del os.environ["JOURNALFS_WATCH"]
        else:
            os.environ["JOURNALFS_WATCH"] = before
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


async def stored(ops, rel: str):
    """The store's values at the store path of SOURCE's ``rel`` (None: no entry)."""
    paths = [p for p in ops.ownership.ledger.entries if p.endswith("/" + rel)]
    return await ops._meta_values(paths[0]) if paths else None


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
            # another process (the handlers' own changes are the mount's: not heard)
            if what == "file":
                sh(f"mv {src}/d/e/f {src}/d/e/f.old && echo new > {src}/d/e/f")
                moved = src / "d/e/f.old"
            else:
                sh(f"mv {src}/d/e {src}/d/e.old && mkdir {src}/d/e && echo new > {src}/d/e/f")
                moved = src / "d/e.old/f"
            got = await set_note(ops, ino, b"a3")  # right away: nothing applied yet
            assert got in ("ok", "ENOENT"), got
            # a3 was not written at the old name (the ledger would tie it to the old file and
            # park it from the new one: this checks the set itself, not that safety net)
            assert await stored(ops, "d/e/f") in (None, {}, {"note": "a2"})
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


async def noted_twice(ops, rel: str) -> int:
    """``rel``'s inode after two sets of the note through the mount (the common write's
    state: the file's entries bound, its values cached)."""
    ino = await lookup(ops, rel)
    for value in (b"1", b"2"):
        assert await set_note(ops, ino, value) == "ok"
    return ino


def test_chattr_i_in_source_is_eperm_at_once(base):
    path = base / "src" / "d" / "e" / "f"

    async def main():
        async with handlers(base) as ops:
            ino = await noted_twice(ops, "d/e/f")
            if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
                pytest.skip("SOURCE's filesystem has no inode flags here")
            try:
                # (chattr raises no fanotify event: no watcher could report it)
                assert await set_note(ops, ino, b"3") == "EPERM"
            finally:
                subprocess.run(["chattr", "-i", str(path)], check=True)
            assert await set_note(ops, ino, b"4") == "ok"
    trio.run(main)


def test_chown_in_source_moves_the_charge_at_once(base):
    path = base / "src" / "d" / "e" / "f"

    async def main():
        async with handlers(base) as ops:
            ino = await noted_twice(ops, "d/e/f")
            assert charged(ops, "d/e/f")[1] == 0
            sh(f"chown 4321:4321 {path}")
            assert await set_note(ops, ino, b"3") == "ok"
            assert charged(ops, "d/e/f")[1] == 4321
            await trio.sleep(0.1)
            assert await set_note(ops, ino, b"4") == "ok"
            assert charged(ops, "d/e/f")[1] == 4321
            sh(f"chown 0:0 {path}")
            assert await set_note(ops, ino, b"5") == "ok"
            assert charged(ops, "d/e/f")[1] == 0
    trio.run(main)


@pytest.mark.fuse
def test_real_mount_alice_open_file_renamed_and_replaced_in_source(tmp_path):
    """Alice sets her note three times through a file she holds open, renames it and puts a new file at its name directly in SOURCE, and her next set
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
            assert note_of(bob, msh / "report") == "ENODATA"
            listed = run_as(bob, [("l", f"os.listxattr({str(msh / 'report')!r})")])["l"]
            assert NOTE not in listed, listed
            assert note_of(alice, msh / "report.old") in ("four", "three")
            clean_log(m)
