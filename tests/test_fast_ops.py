"""The fast tier: the operations class and its views driven in-process, with no kernel mount.

Run with ``pytest -m fast``. Each test builds a JournalFS on a temporary SOURCE with its own
embedded store (see fastops.py); the real-mount tests check the same behaviour through FUSE.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat

import pyfuse3
import pytest

import fastops
from fastops import ROOT, Ctx, error_of, listdir, lookup_path, read_all

pytestmark = pytest.mark.fast

FILE_MODE = stat.S_IFREG | 0o644


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "hello.txt").write_bytes(b"hello\n")
    return src


def run(source, scenario, **kwargs):
    return fastops.run(source, scenario, data_home="store", **kwargs)


def test_lookup_getattr_read(source):
    async def scenario(ops):
        attrs = await lookup_path(ops, "hello.txt")
        assert attrs.st_size == 6 and stat.S_ISREG(attrs.st_mode)
        assert (await ops.getattr(attrs.st_ino, ROOT)).st_size == 6
        assert await read_all(ops, attrs.st_ino) == b"hello\n"
        assert await error_of(lookup_path(ops, "absent")) == errno.ENOENT
    run(source, scenario)


def test_create_write_rename_unlink_mirror_source(source):
    async def scenario(ops):
        info, attrs = await ops.create(pyfuse3.ROOT_INODE, b"new.bin", FILE_MODE,
                                       os.O_WRONLY, ROOT)
        assert await ops.write(info.fh, 0, b"abc") == 3
        assert await ops.write(info.fh, 3, b"def") == 3
        await ops.flush(info.fh)
        await ops.release(info.fh)
        assert (source / "new.bin").read_bytes() == b"abcdef"
        assert (await ops.getattr(attrs.st_ino, ROOT)).st_size == 6

        dir_attrs = await ops.mkdir(pyfuse3.ROOT_INODE, b"sub", stat.S_IFDIR | 0o755, ROOT)
        assert (source / "sub").is_dir()
        await ops.rename(pyfuse3.ROOT_INODE, b"new.bin", dir_attrs.st_ino, b"moved.bin", 0, ROOT)
        assert not (source / "new.bin").exists()
        assert (source / "sub" / "moved.bin").read_bytes() == b"abcdef"
        assert await listdir(ops, dir_attrs.st_ino) == ["moved.bin"]
        assert sorted(await listdir(ops, pyfuse3.ROOT_INODE)) == ["hello.txt", "sub"]

        await ops.unlink(dir_attrs.st_ino, b"moved.bin", ROOT)
        assert not (source / "sub" / "moved.bin").exists()
        assert await error_of(lookup_path(ops, "sub/moved.bin")) == errno.ENOENT
    run(source, scenario)


def test_metadata_xattrs_round_trip_and_follow_rename(source):
    async def scenario(ops):
        ino = (await lookup_path(ops, "hello.txt")).st_ino
        await ops.setxattr(ino, b"user.metadata.emblems", b"important", ROOT)
        await ops.setxattr(ino, b"user.metadata.note", b"n\xffraw", ROOT)
        assert await ops.getxattr(ino, b"user.metadata.emblems", ROOT) == b"important"
        assert await ops.getxattr(ino, b"user.metadata.note", ROOT) == b"n\xffraw"
        listed = set(await ops.listxattr(ino, ROOT))
        assert {b"user.metadata.emblems", b"user.metadata.note"} <= listed

        await ops.rename(pyfuse3.ROOT_INODE, b"hello.txt", pyfuse3.ROOT_INODE, b"renamed.txt",
                         0, ROOT)
        ino = (await lookup_path(ops, "renamed.txt")).st_ino
        assert await ops.getxattr(ino, b"user.metadata.emblems", ROOT) == b"important"

        await ops.removexattr(ino, b"user.metadata.note", ROOT)
        assert await error_of(ops.getxattr(ino, b"user.metadata.note", ROOT)) == errno.ENODATA
        # metadata lives in the store, never as an xattr on the SOURCE file
        native = os.listxattr(source / "renamed.txt")
        assert not [n for n in native if n.startswith("user.metadata")]
    run(source, scenario)


def test_metadata_persists_across_a_new_service(source):
    async def write(ops):
        ino = (await lookup_path(ops, "hello.txt")).st_ino
        await ops.setxattr(ino, b"user.metadata.kept", b"yes", ROOT)

    async def read(ops):
        ino = (await lookup_path(ops, "hello.txt")).st_ino
        return await ops.getxattr(ino, b"user.metadata.kept", ROOT)

    run(source, write, sync="none")  # durable at unmount: the service's own flush
    assert run(source, read) == b"yes"


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_caller_credentials_apply(source):
    (source / "private").mkdir(mode=0o700)
    (source / "shared").mkdir()
    os.chmod(source / "shared", 0o777)
    user = Ctx(uid=65534, gid=65534)

    async def scenario(ops):
        private = (await lookup_path(ops, "private")).st_ino
        denied = ops.create(private, b"x", FILE_MODE, os.O_WRONLY, user)
        assert await error_of(denied) == errno.EACCES
        shared = (await lookup_path(ops, "shared")).st_ino
        info, attrs = await ops.create(shared, b"theirs", FILE_MODE, os.O_WRONLY, user)
        await ops.release(info.fh)
        assert (attrs.st_uid, attrs.st_gid) == (65534, 65534)
    run(source, scenario)
    st = os.stat(source / "shared" / "theirs")
    assert (st.st_uid, st.st_gid) == (65534, 65534)


def test_views_show_records_and_status(source, records_corpus, records_expected):
    name = "db1.jrnl"
    shutil.copy(records_corpus / name, source / name)
    expected = records_expected[name]["records"]

    async def scenario(ops):
        views = await lookup_path(ops, ".journalfs")
        assert stat.S_ISDIR(views.st_mode)
        assert {"records", "status.json"} <= set(await listdir(ops, views.st_ino))
        records = await lookup_path(ops, ".journalfs/records")
        assert await listdir(ops, records.st_ino) == [name]

        journal = await lookup_path(ops, f".journalfs/records/{name}")
        names = await listdir(ops, journal.st_ino)
        assert sorted(names) == sorted([f"{r['seq']:08d}.{r['kind']}" for r in expected]
                                       + ["records.jsonl"])
        jsonl = await lookup_path(ops, f".journalfs/records/{name}/records.jsonl")
        content = await read_all(ops, jsonl.st_ino)
        assert jsonl.st_size == len(content)
        shown = [json.loads(line) for line in content.splitlines()]
        # expected.json abbreviates some fields (jrnl's ops); seq/offset/kind/time are exact
        fields = ("seq", "offset", "kind", "time")
        assert [[r.get(f) for f in fields] for r in shown] == \
            [[r.get(f) for f in fields] for r in expected]

        first = await lookup_path(ops, f".journalfs/records/{name}/00000000.{expected[0]['kind']}")
        seq = await ops.getxattr(first.st_ino, b"user.record.seq", ROOT)
        assert seq == b"0"
        assert await error_of(ops.open(first.st_ino, os.O_WRONLY, ROOT)) == errno.EROFS

        status_attrs = await lookup_path(ops, ".journalfs/status.json")
        status = json.loads(await read_all(ops, status_attrs.st_ino))
        assert isinstance(status, dict) and "rotations" in status
    run(source, scenario)


def test_views_hide_non_journals(source):
    (source / "notes").mkdir()
    (source / "notes" / "plain.md").write_text("# not a journal")

    async def scenario(ops):
        records = await lookup_path(ops, ".journalfs/records")
        assert await listdir(ops, records.st_ino) == []
        assert await error_of(lookup_path(ops, ".journalfs/records/notes")) == errno.ENOENT
        # the views' name never reaches SOURCE's listing
        assert ".journalfs" not in await listdir(ops, pyfuse3.ROOT_INODE)
    run(source, scenario)
