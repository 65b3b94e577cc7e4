"""Only FUSEError leaves a handler of JournalFS (pyfuse3 ends the whole mount on any other
exception): every handler is guarded, the hottest ones in their own body
(fs/guards.py). Checked on the class, and by making each kind fail from the inside."""
from __future__ import annotations

import errno
import inspect
import logging
import os

import pyfuse3
import pytest
import trio

from fastops import ROOT, lookup_path, serving
from journalfs.fs.guards import GUARD
from journalfs.fs.passthrough import JournalFS

pytestmark = pytest.mark.fast

HOT = {"lookup", "getattr", "getxattr", "listxattr", "setxattr"}


def handlers() -> list[str]:
    """The operations pyfuse3 calls that JournalFS implements itself."""
    return [name for name, fn in inspect.getmembers(pyfuse3.Operations, inspect.iscoroutinefunction)
            if not name.startswith("_") and getattr(JournalFS, name) is not fn]


def test_every_handler_is_guarded_and_only_the_hot_ones_in_their_body():
    names = handlers()
    assert {"lookup", "getattr", "readdir", "write", "setxattr", "rename"} <= set(names)
    kinds = {name: getattr(getattr(JournalFS, name), GUARD, None) for name in names}
    assert [n for n, kind in kinds.items() if kind is None] == []
    assert {n for n, kind in kinds.items() if kind == "inline"} == HOT


class Broken(dict):
    """An inode table's map that fails as a bug would."""

    def get(self, *args):
        raise RuntimeError("a bug")

    def __getitem__(self, key):
        raise RuntimeError("a bug")


@pytest.mark.parametrize("handler", sorted(HOT) + ["setattr", "opendir"])
@pytest.mark.daemon_log_errors(r"ERROR .* failed\nTraceback.*RuntimeError: a bug",
                               reason="the test plants a bug inside each handler: the guard "
                                      "logs it and answers EIO")
def test_an_unexpected_error_inside_a_handler_is_eio_and_logged(tmp_path, caplog, handler):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x")

    async def main():
        async with serving(tmp_path / "src", tmp_path / "store") as ops:
            f = await lookup_path(ops, "f")
            ops.table.by_ino = Broken(ops.table.by_ino)
            args = {"lookup": (pyfuse3.ROOT_INODE, b"f", ROOT), "getattr": (f.st_ino, ROOT),
                    "getxattr": (f.st_ino, b"user.metadata.k", ROOT),
                    "setxattr": (f.st_ino, b"user.metadata.k", b"v", ROOT),
                    "setattr": (f.st_ino, pyfuse3.EntryAttributes(), pyfuse3.SetattrFields(),
                                None, ROOT),
                    "opendir": (pyfuse3.ROOT_INODE, ROOT), "listxattr": (f.st_ino, ROOT)}
            with pytest.raises(pyfuse3.FUSEError) as raised:
                await getattr(ops, handler)(*args[handler])
            return raised.value.errno

    with caplog.at_level(logging.ERROR, logger="journalfs.fs"):
        assert trio.run(main) == errno.EIO
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)


def names_now(ops, ino: int) -> list[bytes]:
    """The names setxattr would write metadata under (XattrOps._names_now)."""
    node = ops.table.get(ino)
    return sorted(ops._inline(node, ops._names_now, node))


def one_file_source(tmp_path):
    """SOURCE with one file, d/f."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"x")
    return src


def test_a_file_of_one_name_is_checked_in_one_statx_beneath(tmp_path):
    """setxattr of a file known under one name (the common case) checks that name, the
    file's inode flags and its ledger identity with one openat2+statx (_one_name_now):
    the same identity Ownership.identity gives, and a directory of the path swapped for a
    symlink behind the mount's back still does not make the name count (ENOENT)."""
    src = one_file_source(tmp_path)
    key = b"user.metadata.colour"

    async def main():
        async with serving(src, tmp_path / "store") as ops:
            f = await lookup_path(ops, "d/f")
            node = ops.table.get(f.st_ino)
            assert ops._one_name_now(node) == ([b"d/f"], ops.ownership.identity(node))
            await ops.setxattr(f.st_ino, key, b"blue", ROOT)
            assert await ops.getxattr(f.st_ino, key, ROOT) == b"blue"
            (src / "d").rename(src / "e")
            (src / "d").symlink_to("e")
            assert ops._one_name_now(node) is None
            with pytest.raises(pyfuse3.FUSEError) as gone:
                await ops.setxattr(f.st_ino, key, b"red", ROOT)
            assert gone.value.errno == errno.ENOENT

    trio.run(main)


def test_metadata_goes_only_to_names_that_still_lead_to_the_file(tmp_path):
    """setxattr of user.metadata.* writes under every name of the file that still means it
    in SOURCE, each checked from SOURCE's fd without following a symlink: a directory of
    the path swapped for a symlink behind the mount's back (to where the file now is) does
    not make the old name count, so nothing is written under a path that no longer names
    the file; a hard link made through the mount does count."""
    src = one_file_source(tmp_path)
    key = b"user.metadata.colour"

    async def main():
        async with serving(src, tmp_path / "store") as ops:
            f = await lookup_path(ops, "d/f")
            await ops.link(f.st_ino, pyfuse3.ROOT_INODE, b"g", ROOT)
            await ops.setxattr(f.st_ino, key, b"blue", ROOT)
            assert await ops.getxattr((await lookup_path(ops, "g")).st_ino, key, ROOT) == b"blue"
            assert names_now(ops, f.st_ino) == [b"d/f", b"g"]
            # behind the mount's back (no watcher runs here): d moves, a symlink takes its name
            (src / "d").rename(src / "e")
            (src / "d").symlink_to("e")
            assert names_now(ops, f.st_ino) == [b"g"]
            os.unlink(src / "g")
            with pytest.raises(pyfuse3.FUSEError) as gone:
                await ops.setxattr(f.st_ino, key, b"red", ROOT)
            assert gone.value.errno == errno.ENOENT

    trio.run(main)
