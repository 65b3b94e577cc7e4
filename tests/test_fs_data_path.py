"""The data rows' request path in-process (#28): what a namespace change through the mount
leaves for the kernel's next request about the directory."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import fastops
from fastops import ROOT, lookup_path

pytestmark = pytest.mark.fast


def test_a_changed_directory_is_answered_from_the_changes_own_fstat(tmp_path, monkeypatch):
    """After a create, rename, mkdir or unlink in a directory the kernel asks the directory's
    attributes (its mtime changed; the next change's permission check needs them): the
    change fstat-ed the directory right after it, so that answer costs no syscall, and it is
    SOURCE's current stat."""
    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "a").write_text("a")
    (source / "other").mkdir()

    async def scenario(ops):
        d = await lookup_path(ops, "d")
        other = await lookup_path(ops, "other")
        await ops.lookup(d.st_ino, b"a", ROOT)
        fstats = []
        real_fstat = os.fstat

        def counted(fd):
            fstats.append(fd)
            return real_fstat(fd)

        async def getattr_now(ino):
            fstats.clear()
            monkeypatch.setattr(os, "fstat", counted)
            try:
                return await ops.getattr(ino, ROOT), len(fstats)
            finally:
                monkeypatch.setattr(os, "fstat", real_fstat)

        def source_stat(rel):
            return os.stat(source / rel)

        async def check(what, ino, rel):
            attrs, calls = await getattr_now(ino)
            st = source_stat(rel)
            assert calls == 0, what
            assert (attrs.st_mtime_ns, attrs.st_ctime_ns, attrs.st_nlink) == \
                (st.st_mtime_ns, st.st_ctime_ns, st.st_nlink), what

        await ops.rename(d.st_ino, b"a", d.st_ino, b"b", 0, ROOT)
        await check("rename", d.st_ino, "d")
        fi, _ = await ops.create(d.st_ino, b"c", stat.S_IFREG | 0o644,
                                 os.O_WRONLY | os.O_CREAT, ROOT)
        await ops.release(fi.fh)
        await check("create", d.st_ino, "d")
        await ops.mkdir(d.st_ino, b"sub", 0o755, ROOT)
        await check("mkdir", d.st_ino, "d")  # nlink too
        await ops.unlink(d.st_ino, b"c", ROOT)
        await check("unlink", d.st_ino, "d")
        # across directories: the source's from its fstat, the target's asked of SOURCE
        await ops.rename(d.st_ino, b"b", other.st_ino, b"b", 0, ROOT)
        await check("rename out of d", d.st_ino, "d")
        attrs, calls = await getattr_now(other.st_ino)
        assert calls == 1
        assert attrs.st_mtime_ns == source_stat("other").st_mtime_ns

    fastops.run(source, scenario, data_home="store", timeout=60)
