"""The metadata store behind ``user.metadata.*`` in-process, with no kernel mount (fast tier).

Each test serves a temporary SOURCE with a JournalFS and its own embedded store
(tests/fastops.py) and drives the xattr and namespace handlers directly; what the store holds
afterwards is read back with `journalfs meta dump --json`, and tests/conftest.py runs the
store's fsck after each test (a finding fails it). tests/test_fs_xattr.py checks the same
through a mount, including ERANGE, which pyfuse3 answers itself: a handler returns the whole
value and pyfuse3 compares it with the caller's buffer (pyfuse3/handlers.pxi).
"""
from __future__ import annotations

import errno
import json
import os
import stat

import pyfuse3
import pytest

import fastops
from fastops import ROOT, Ctx, error_of, listdir, lookup_path
from journalfs.cli import main as cli_main

pytestmark = pytest.mark.fast

NOBODY = Ctx(uid=65534, gid=65534)
FILE_MODE = stat.S_IFREG | 0o644
DIR_MODE = stat.S_IFDIR | 0o755


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    for rel in ("a.txt", "b.txt", "dir/c.txt", "dir/sub/d.txt"):
        (src / rel).write_text(rel)
    os.symlink("a.txt", src / "link")
    os.mkfifo(src / "fifo")
    return src


def run(source, scenario, **kwargs):
    return fastops.run(source, scenario, **kwargs)


def served_tree() -> str:
    """The tree file of the store the last served JournalFS used."""
    return fastops.SERVED_STORES[-1]


def dump(capfdbinary, tree: str) -> dict:
    """What `journalfs meta dump TREE --json` shows (every path's metadata; run in-process,
    its stdout taken at fd 1 as a terminal or pipe would get it)."""
    capfdbinary.readouterr()
    code = cli_main(["meta", "dump", tree, "--json"])
    out, err = capfdbinary.readouterr()
    assert code == 0, err
    return json.loads(out.decode("utf-8", "surrogateescape"))


async def ino(ops, path: str) -> int:
    return (await lookup_path(ops, path)).st_ino


async def metadata(ops, path: str) -> dict[bytes, bytes]:
    """Every user.metadata.* attribute of ``path`` as listxattr and getxattr give them."""
    node = await ino(ops, path)
    names = [n for n in await ops.listxattr(node, ROOT) if n.startswith(b"user.metadata.")]
    return {n: await ops.getxattr(node, n, ROOT) for n in names}


async def set_meta(ops, path: str, key: str, value: bytes, ctx=ROOT) -> None:
    await ops.setxattr(await ino(ops, path), f"user.metadata.{key}".encode(), value, ctx)


def test_values_round_trip_and_land_in_the_store(source, capfdbinary):
    values = {b"user.metadata.text": b"hello world",
              b"user.metadata.utf8": "gr\u00fc\u00df \u2713".encode(),
              b"user.metadata.raw": b"\xff\xfe not utf-8",
              b"user.metadata.list": b"one\0two\0",
              b"user.metadata.big": b"x" * 3000,
              "user.metadata.k\u00e9y".encode(): b"v"}

    async def scenario(ops):
        node = await ino(ops, "a.txt")
        for name, value in values.items():
            await ops.setxattr(node, name, value, ROOT)
        assert await metadata(ops, "a.txt") == values
        await ops.setxattr(node, b"user.metadata.text", b"replaced", ROOT)
        assert await ops.getxattr(node, b"user.metadata.text", ROOT) == b"replaced"
        # a list without its last NUL is still a list, and reads back with it
        await ops.setxattr(node, b"user.metadata.list", b"x\0y", ROOT)
        assert await ops.getxattr(node, b"user.metadata.list", ROOT) == b"x\0y\0"
        await set_meta(ops, "dir", "on_a_dir", b"yes")
        await set_meta(ops, "", "on_the_root", b"top")
        assert await metadata(ops, "dir") == {b"user.metadata.on_a_dir": b"yes"}
    run(source, scenario)
    stored = dump(capfdbinary, served_tree())
    # (in-process, pytest's stand-in stdout shows bytes that are not UTF-8 as "?": the raw
    # value's round trip is checked through getxattr above)
    assert stored["/a.txt"].pop("raw").endswith(" not utf-8")
    assert stored["/a.txt"] == {"text": "replaced", "utf8": "gr\u00fc\u00df \u2713",
                                "list": ["x", "y"], "big": "x" * 3000, "k\u00e9y": "v"}
    assert stored["/dir"] == {"on_a_dir": "yes"}
    assert stored["/"] == {"on_the_root": "top"} or stored[""] == {"on_the_root": "top"}
    # metadata lives in the store only, never as xattrs of SOURCE's files
    assert not [n for n in os.listxattr(source / "a.txt") if n.startswith("user.metadata.")]


def test_errors_are_those_of_a_native_filesystem(source):
    async def scenario(ops):
        a = await ino(ops, "a.txt")
        assert await error_of(ops.getxattr(a, b"user.metadata.missing", ROOT)) == errno.ENODATA
        assert await error_of(ops.removexattr(a, b"user.metadata.missing", ROOT)) == \
            errno.ENODATA
        assert await error_of(ops.getxattr(a, b"user.not_there", ROOT)) == errno.ENODATA
        assert await error_of(ops.setxattr(a, b"user.metadata.", b"v", ROOT)) == errno.EINVAL
        assert await error_of(ops.setxattr(a, b"user.metadata.huge", b"x" * 65537, ROOT)) == \
            errno.E2BIG
        # natively only regular files and directories take user.* attributes
        for name in ("link", "fifo"):
            node = (await ops.lookup(pyfuse3.ROOT_INODE, name.encode(), ROOT)).st_ino
            assert await error_of(ops.setxattr(node, b"user.metadata.k", b"v", ROOT)) == \
                errno.EPERM, name
        assert await error_of(lookup_path(ops, "nothing/here")) == errno.ENOENT
        assert await error_of(ops.getattr(987654321, ROOT)) == errno.ENOENT
        # a file deleted behind the mount's back takes no metadata
        (source / "b.txt").unlink()
        gone = await ops.lookup(pyfuse3.ROOT_INODE, b"a.txt", ROOT)
        b = await lookup_path(ops, "dir/c.txt")
        (source / "dir" / "c.txt").unlink()
        assert await error_of(ops.setxattr(b.st_ino, b"user.metadata.k", b"v", ROOT)) == \
            errno.ENOENT
        assert gone.st_ino == a
    run(source, scenario)


def test_native_xattrs_stay_on_source_and_lists_merge(source):
    async def scenario(ops):
        a = await ino(ops, "a.txt")
        await ops.setxattr(a, b"user.native", b"on disk", ROOT)
        await ops.setxattr(a, b"user.metadata.stored", b"in the store", ROOT)
        assert os.getxattr(source / "a.txt", "user.native") == b"on disk"
        assert await ops.getxattr(a, b"user.native", ROOT) == b"on disk"
        listed = set(await ops.listxattr(a, ROOT))
        assert {b"user.native", b"user.metadata.stored"} <= listed
        await ops.removexattr(a, b"user.native", ROOT)
        assert "user.native" not in os.listxattr(source / "a.txt")
        assert await error_of(ops.removexattr(a, b"user.native", ROOT)) == errno.ENODATA
        await ops.removexattr(a, b"user.metadata.stored", ROOT)
        assert b"user.metadata.stored" not in await ops.listxattr(a, ROOT)
    run(source, scenario)


def test_metadata_follows_renames_and_goes_with_unlink_and_rmdir(source, capfdbinary):
    async def scenario(ops):
        await set_meta(ops, "a.txt", "k", b"a")
        await set_meta(ops, "b.txt", "k", b"b")
        await set_meta(ops, "dir/c.txt", "k", b"c")
        await set_meta(ops, "dir/sub/d.txt", "k", b"d")
        await set_meta(ops, "dir", "k", b"dir")
        root, d = pyfuse3.ROOT_INODE, await ino(ops, "dir")
        # a file renamed keeps its metadata; one renamed over another replaces the other's
        await ops.rename(root, b"a.txt", root, b"renamed.txt", 0, ROOT)
        assert await metadata(ops, "renamed.txt") == {b"user.metadata.k": b"a"}
        await ops.rename(root, b"renamed.txt", root, b"b.txt", 0, ROOT)
        assert await metadata(ops, "b.txt") == {b"user.metadata.k": b"a"}
        # a directory renamed takes everything below along
        await ops.rename(root, b"dir", root, b"moved", 0, ROOT)
        assert await metadata(ops, "moved/sub/d.txt") == {b"user.metadata.k": b"d"}
        assert await metadata(ops, "moved") == {b"user.metadata.k": b"dir"}
        # RENAME_EXCHANGE swaps them
        await ops.rename(d, b"c.txt", root, b"b.txt", pyfuse3.RENAME_EXCHANGE, ROOT)
        assert await metadata(ops, "b.txt") == {b"user.metadata.k": b"c"}
        assert await metadata(ops, "moved/c.txt") == {b"user.metadata.k": b"a"}
        # what is removed takes its metadata along; a new file of the same name has none
        await ops.unlink(d, b"c.txt", ROOT)
        info, _ = await ops.create(d, b"c.txt", FILE_MODE, os.O_WRONLY, ROOT)
        await ops.release(info.fh)
        assert await metadata(ops, "moved/c.txt") == {}
        sub = await ino(ops, "moved/sub")
        await ops.unlink(sub, b"d.txt", ROOT)
        await ops.rmdir(d, b"sub", ROOT)
        new_sub = await ops.mkdir(d, b"sub", DIR_MODE, ROOT)
        assert await metadata(ops, "moved/sub") == {}
        assert await listdir(ops, new_sub.st_ino) == []
    run(source, scenario)
    stored = dump(capfdbinary, served_tree())
    assert {p: m for p, m in stored.items() if m} == {
        "/b.txt": {"k": "c"}, "/moved": {"k": "dir"}}


def test_a_hard_link_shares_its_files_metadata(source):
    async def scenario(ops):
        a = await ino(ops, "a.txt")
        await ops.link(a, pyfuse3.ROOT_INODE, b"hard.txt", ROOT)
        await set_meta(ops, "hard.txt", "shared", b"yes")
        assert await metadata(ops, "a.txt") == {b"user.metadata.shared": b"yes"}
        await ops.unlink(pyfuse3.ROOT_INODE, b"a.txt", ROOT)  # the other name keeps it
        assert await metadata(ops, "hard.txt") == {b"user.metadata.shared": b"yes"}
    run(source, scenario)


@pytest.mark.parametrize("sync", ["always", "batch", "none"])
def test_metadata_persists_across_services_in_every_sync_mode(source, sync, capfdbinary):
    async def write(ops):
        for i in range(50):
            await set_meta(ops, "a.txt", f"k{i}", str(i).encode())
        await set_meta(ops, "dir/sub/d.txt", "deep", b"yes")

    async def read(ops):
        return await metadata(ops, "a.txt"), await metadata(ops, "dir/sub/d.txt")

    run(source, write, sync=sync)
    a, d = run(source, read, sync=sync)
    assert a == {f"user.metadata.k{i}".encode(): str(i).encode() for i in range(50)}
    assert d == {b"user.metadata.deep": b"yes"}
    assert dump(capfdbinary, served_tree())["/dir/sub/d.txt"] == {"deep": "yes"}


def value_of(name: str, round_: int) -> bytes:
    """3.5 KB: within what one file's metadata may take (4 KiB, docs/security.md)."""
    return f"{name}-{round_}-".ljust(3500, "v").encode()


def test_rotations_keep_every_value(source, capfdbinary):
    """Enough writes to fill the journal several times over: the store rotates in the
    background and on request (user.journalfs.rotate), and nothing is lost on the way."""
    async def scenario(ops):
        views = await ino(ops, ".journalfs")
        before = int(await ops.getxattr(views, b"user.journalfs.rotate", ROOT))
        files = [f"f{i:03d}" for i in range(200)]
        for name in files:
            info, _ = await ops.create(pyfuse3.ROOT_INODE, name.encode(), FILE_MODE,
                                       os.O_WRONLY, ROOT)
            await ops.release(info.fh)
        for rnd in range(2):  # 1.4 MB of entries: more than a journal (1 MiB) holds
            for name in files:
                await set_meta(ops, name, "value", value_of(name, rnd))
        await ops.setxattr(views, b"user.journalfs.rotate", b"1", ROOT)
        after = int(await ops.getxattr(views, b"user.journalfs.rotate", ROOT))
        assert after >= before + 2  # at least one in the background, and the one asked for
        for name in files:
            assert await ops.getxattr(await ino(ops, name), b"user.metadata.value", ROOT) == \
                value_of(name, 1)
        return files
    files = run(source, scenario, sync="batch")
    stored = dump(capfdbinary, served_tree())
    expected = {f"/{n}": {"value": value_of(n, 1).decode()} for n in files}
    got = {path: stored.get(path) for path in expected}
    assert got == expected


def test_settings_are_the_owners_to_change(source):
    async def scenario(ops):
        views = await ino(ops, ".journalfs")
        names = set(await ops.listxattr(views, ROOT))
        assert {b"user.journalfs.sync", b"user.journalfs.ro", b"user.journalfs.rotate"} <= names
        assert await ops.getxattr(views, b"user.journalfs.sync", NOBODY) == b"always"
        assert await error_of(ops.setxattr(views, b"user.journalfs.sync", b"none", NOBODY)) \
            == errno.EPERM
        assert await error_of(ops.setxattr(views, b"user.journalfs.sync", b"often", ROOT)) == \
            errno.EINVAL
        assert await error_of(ops.getxattr(views, b"user.journalfs.nothing", ROOT)) == \
            errno.ENODATA
        # ro: every change refused with EROFS, metadata included, until it is set back
        await ops.setxattr(views, b"user.journalfs.ro", b"1", ROOT)
        a = await ino(ops, "a.txt")
        assert await error_of(ops.setxattr(a, b"user.metadata.k", b"v", ROOT)) == errno.EROFS
        assert await error_of(ops.create(pyfuse3.ROOT_INODE, b"new", FILE_MODE, os.O_WRONLY,
                                         ROOT)) == errno.EROFS
        await ops.setxattr(views, b"user.journalfs.ro", b"0", ROOT)
        await ops.setxattr(a, b"user.metadata.k", b"v", ROOT)
        assert await ops.getxattr(a, b"user.metadata.k", ROOT) == b"v"
    if os.geteuid() != 0:
        pytest.skip("a caller other than the daemon's user needs root")
    run(source, scenario)


def test_a_read_only_mount_reads_the_store_and_changes_nothing(source):
    async def write(ops):
        await set_meta(ops, "a.txt", "k", b"v")

    async def read_only(ops):
        a = await ino(ops, "a.txt")
        assert await ops.getxattr(a, b"user.metadata.k", ROOT) == b"v"
        assert await error_of(ops.setxattr(a, b"user.metadata.k", b"w", ROOT)) == errno.EROFS
        assert await error_of(ops.removexattr(a, b"user.metadata.k", ROOT)) == errno.EROFS
        assert await error_of(ops.unlink(pyfuse3.ROOT_INODE, b"a.txt", ROOT)) == errno.EROFS
    run(source, write)
    run(source, read_only, ro=True)
    assert (source / "a.txt").exists()


@pytest.mark.damaged_store
def test_the_check_after_each_test_finds_a_damaged_store(source):
    """The fsck run after every fast test (tests/conftest.py) does fail on damage."""
    async def write(ops):
        await set_meta(ops, "a.txt", "k", b"v" * 100)
    run(source, write)
    tree = served_tree()
    assert fastops.store_findings(tree) == []
    journals = [p for p in os.listdir(os.path.dirname(tree)) if p.endswith(".log")]
    assert len(journals) == 1, os.listdir(os.path.dirname(tree))
    journal = os.path.join(os.path.dirname(tree), journals[0])
    with open(journal, "r+b") as f:
        f.write(b"\0\0\0\0")  # the journal's magic
    assert fastops.store_findings(tree)
