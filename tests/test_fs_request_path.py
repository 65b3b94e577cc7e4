"""The request path's shortcuts stay exact (fast tier, in-process): replies reused while a
stat is unchanged, lookups of known names by fstatat, cached store paths across renames,
renames of files that touch only their own inodes."""
from __future__ import annotations

import errno
import os
import stat

import pyfuse3
import pytest
import trio

from fastops import ROOT, error_of, lookup_path, serving

pytestmark = pytest.mark.fast

KEY = b"user.metadata.k"


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (src / "d" / name).write_bytes(b"x")
    return src


def run(source, scenario):
    async def main():
        async with serving(source, source.parent / "store", sync="none", timeout=0) as ops:
            return await scenario(ops)
    return trio.run(main)


def test_reused_replies_follow_every_change(source):
    async def scenario(ops):
        a = await lookup_path(ops, "d/a")
        first = await ops.getattr(a.st_ino, ROOT)
        assert await ops.getattr(a.st_ino, ROOT) is first  # nothing changed: the same reply
        st = os.stat(source / "d" / "a")
        # behind the mount, inside the same second: only the ns part of mtime differs
        os.utime(source / "d" / "a", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        changed = await ops.getattr(a.st_ino, ROOT)
        assert changed.st_mtime_ns == st.st_mtime_ns + 1
        os.chmod(source / "d" / "a", 0o600)
        assert stat.S_IMODE((await ops.getattr(a.st_ino, ROOT)).st_mode) == 0o600
        with open(source / "d" / "a", "ab") as f:
            f.write(b"more")
        assert (await ops.getattr(a.st_ino, ROOT)).st_size == 5
    run(source, scenario)


def test_lookup_of_a_known_name_sees_a_replacement_behind_the_mount(source):
    async def scenario(ops):
        d = await lookup_path(ops, "d")
        old = await ops.lookup(d.st_ino, b"a", ROOT)
        assert (await ops.lookup(d.st_ino, b"a", ROOT)).st_ino == old.st_ino  # by fstatat
        os.unlink(source / "d" / "a")
        (source / "d" / "a").mkdir()  # another object, of another type
        new = await ops.lookup(d.st_ino, b"a", ROOT)
        assert new.st_ino != old.st_ino and stat.S_ISDIR(new.st_mode)
        os.rmdir(source / "d" / "a")
        assert await error_of(ops.lookup(d.st_ino, b"a", ROOT)) == errno.ENOENT
        os.symlink("/etc", source / "d" / "a")  # never followed
        link = await ops.lookup(d.st_ino, b"a", ROOT)
        assert stat.S_ISLNK(link.st_mode)
    run(source, scenario)


def test_renamed_files_keep_their_metadata_and_other_names(source):
    async def scenario(ops):
        d = await lookup_path(ops, "d")
        a = await ops.lookup(d.st_ino, b"a", ROOT)
        b = await ops.lookup(d.st_ino, b"b", ROOT)
        c = await ops.lookup(d.st_ino, b"c", ROOT)
        await ops.setxattr(a.st_ino, KEY, b"of a", ROOT)
        await ops.setxattr(c.st_ino, KEY, b"of c", ROOT)
        assert await ops.getxattr(a.st_ino, KEY, ROOT) == b"of a"  # store path now cached
        await ops.rename(d.st_ino, b"a", d.st_ino, b"a2", 0, ROOT)
        assert await ops.getxattr(a.st_ino, KEY, ROOT) == b"of a"  # under its new name
        assert ops.table.by_ino[a.st_ino].path == b"d/a2"
        assert ops.table.by_ino[b.st_ino].path == b"d/b"
        assert b"d/a" not in ops.table.by_path
        await ops.rename(d.st_ino, b"a2", d.st_ino, b"c", 0, ROOT)  # replaces c
        assert await ops.getxattr(a.st_ino, KEY, ROOT) == b"of a"
        assert ops.table.by_path[b"d/c"] is ops.table.by_ino[a.st_ino]
        # a plain rename of a file with no metadata leaves the store alone
        entries = ops.meta.store.status()["entries"]
        await ops.rename(d.st_ino, b"b", d.st_ino, b"b2", 0, ROOT)
        assert ops.meta.store.status()["entries"] == entries
        assert await error_of(ops.getxattr(b.st_ino, KEY, ROOT)) == pyfuse3.ENOATTR
        assert sorted(os.listdir(source / "d")) == ["b2", "c"]
        await ops.setxattr(b.st_ino, KEY, b"of b", ROOT)
        assert (await ops.listxattr(b.st_ino, ROOT)) == [KEY]
        assert ops.meta.store.get(ops.store_path(b"d/b2"), "k") == "of b"
    run(source, scenario)


def test_renamed_directory_moves_the_names_below_it(source):
    async def scenario(ops):
        d = await lookup_path(ops, "d")
        a = await ops.lookup(d.st_ino, b"a", ROOT)
        await ops.setxattr(a.st_ino, KEY, b"of a", ROOT)
        await ops.rename(pyfuse3.ROOT_INODE, b"d", pyfuse3.ROOT_INODE, b"e", 0, ROOT)
        assert ops.table.by_ino[a.st_ino].path == b"e/a"
        assert await ops.getxattr(a.st_ino, KEY, ROOT) == b"of a"
    run(source, scenario)
