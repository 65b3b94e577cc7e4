"""The hot request paths (issue 12: daemon CPU per request near the pyfuse3 floor).

getattr of a known inode, lookup of a known name (timeout 0) and getxattr of a cached
``user.metadata.*`` value must finish without handing control back to trio's scheduler:
a handler that yields (a lock's checkpoint, a thread hop, a sleep) costs a whole run-loop
iteration per request, which no profile of the handler shows. Each call here is driven by
hand with ``coroutine.send(None)``: a handler that yields does not finish on that first send.
The answers must also stay exactly as fresh as the slow paths': SOURCE changes made behind
the mount show at once (timeout 0), renamed/replaced names never answer with the old object.
"""
from __future__ import annotations

import errno
import os
import stat

import pyfuse3
import pytest
import trio

from fastops import ROOT, ReplyBuffer, Yielded, at_once, lookup_path, serving

pytestmark = pytest.mark.fast

KEY = b"user.metadata.colour"


def error_at_once(coro) -> int:
    try:
        at_once(coro)
    except pyfuse3.FUSEError as exc:
        return exc.errno
    raise AssertionError("the call succeeded")


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "dir").mkdir(parents=True)
    (src / "dir" / "a.txt").write_bytes(b"aaa")
    (src / "dir" / "b.txt").write_bytes(b"bb")
    return src


def run(source, scenario, **kwargs):
    async def main():
        async with serving(source, source.parent / "store", sync="batch", **kwargs) as ops:
            return await scenario(ops)
    return trio.run(main)


def test_known_inode_getattr_lookup_getxattr_never_yield(source):
    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        a = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        await ops.setxattr(a.st_ino, KEY, b"blue", ROOT)
        assert await ops.getxattr(a.st_ino, KEY, ROOT) == b"blue"  # fills the cache
        for _ in range(3):
            assert at_once(ops.getattr(a.st_ino, ROOT)).st_size == 3
            assert at_once(ops.getattr(d.st_ino, ROOT)).st_ino == d.st_ino
            assert at_once(ops.lookup(d.st_ino, b"a.txt", ROOT)).st_ino == a.st_ino
            assert at_once(ops.lookup(pyfuse3.ROOT_INODE, b"dir", ROOT)).st_ino == d.st_ino
            assert at_once(ops.getxattr(a.st_ino, KEY, ROOT)) == b"blue"
        assert error_at_once(ops.getxattr(a.st_ino, b"user.metadata.other", ROOT)) \
            == pyfuse3.ENOATTR
        # and they were answered by the fast paths, not the general handlers
        def general(*args):
            raise AssertionError("took the general path")
        for name in ("_getattr", "_lookup", "_getxattr"):
            setattr(ops, name, general)
        at_once(ops.getattr(a.st_ino, ROOT))
        at_once(ops.getattr(d.st_ino, ROOT))
        at_once(ops.lookup(d.st_ino, b"a.txt", ROOT))
        at_once(ops.lookup(pyfuse3.ROOT_INODE, b"dir", ROOT))
        at_once(ops.getxattr(a.st_ino, KEY, ROOT))
        for name in ("_getattr", "_lookup", "_getxattr"):
            delattr(ops, name)
        # a write through the mount updates what the fast path answers
        await ops.setxattr(a.st_ino, KEY, b"green", ROOT)
        assert at_once(ops.getxattr(a.st_ino, KEY, ROOT)) == b"green"
        # each lookup counted one kernel reference, as on the slow path
        node = ops.table.by_ino[a.st_ino]
        assert node.lookups == 1 + 3 + 1
    run(source, scenario, timeout=0)


def test_fast_answers_follow_source_changes_behind_the_mount(source):
    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        a = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        b = await ops.lookup(d.st_ino, b"b.txt", ROOT)
        assert at_once(ops.getattr(a.st_ino, ROOT)).st_size == 3
        with open(source / "dir" / "a.txt", "ab") as f:  # grows in SOURCE
            f.write(b"more")
        assert at_once(ops.getattr(a.st_ino, ROOT)).st_size == 7
        os.chmod(source / "dir" / "a.txt", 0o600)
        assert stat.S_IMODE(at_once(ops.getattr(a.st_ino, ROOT)).st_mode) == 0o600
        # renamed away: the old name is gone, whatever the inode table remembers
        os.rename(source / "dir" / "a.txt", source / "dir" / "moved.txt")
        assert await _error(ops.lookup(d.st_ino, b"a.txt", ROOT)) == errno.ENOENT
        # replaced by another object: the name now answers with that object
        os.rename(source / "dir" / "b.txt", source / "dir" / "a.txt")
        now = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        assert now.st_ino == b.st_ino and now.st_size == 2
        # replaced by a symlink: never followed, answered as the symlink itself
        os.rename(source / "dir" / "a.txt", source / "dir" / "b.txt")
        os.symlink("/etc/passwd", source / "dir" / "a.txt")
        link = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        assert stat.S_ISLNK(link.st_mode) and link.st_ino not in (a.st_ino, b.st_ino)
    run(source, scenario, timeout=0)


def test_native_getxattr_and_listxattr_never_yield_and_follow_source(source):
    # ls -l asks security.selinux and the ACL of every entry, getfattr lists every file
    native = b"user.colour"  # SOURCE's own attribute, set behind the mount
    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        a = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        await ops.setxattr(a.st_ino, KEY, b"blue", ROOT)
        assert await ops.listxattr(a.st_ino, ROOT) == [KEY]  # binds the store path
        def general(*args):
            raise AssertionError("took the general path")
        for name in ("_getxattr", "_listxattr", "_on"):
            setattr(ops, name, general)
        assert error_at_once(ops.getxattr(a.st_ino, b"security.selinux", ROOT)) \
            == errno.ENODATA
        assert error_at_once(ops.getxattr(a.st_ino, native, ROOT)) == errno.ENODATA
        os.setxattr(source / "dir" / "a.txt", native, b"red")
        assert at_once(ops.getxattr(a.st_ino, native, ROOT)) == b"red"
        assert at_once(ops.listxattr(a.st_ino, ROOT)) == [native, KEY]
        assert at_once(ops.listxattr(d.st_ino, ROOT)) == []
        for name in ("_getxattr", "_listxattr", "_on"):
            delattr(ops, name)
        # SOURCE's own user.metadata.* stays shadowed by the store's
        os.setxattr(source / "dir" / "a.txt", KEY, b"from-source")
        assert at_once(ops.getxattr(a.st_ino, KEY, ROOT)) == b"blue"
        assert at_once(ops.listxattr(a.st_ino, ROOT)) == [native, KEY]
        await ops.removexattr(a.st_ino, KEY, ROOT)
        assert at_once(ops.listxattr(a.st_ino, ROOT)) == [native]
        os.removexattr(source / "dir" / "a.txt", native)
        assert error_at_once(ops.getxattr(a.st_ino, native, ROOT)) == errno.ENODATA
    run(source, scenario, timeout=0)


def test_hard_links_and_views_take_the_full_path(source):
    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        os.link(source / "dir" / "a.txt", source / "dir" / "link.txt")
        a = await ops.lookup(d.st_ino, b"a.txt", ROOT)
        link = await ops.lookup(d.st_ino, b"link.txt", ROOT)
        assert link.st_ino == a.st_ino and link.st_nlink == 2
        # a name of a linked object is remembered with every other name (full path)
        assert b"dir/link.txt" in ops.table.names_of(ops.table.by_ino[a.st_ino])
        views = await ops.lookup(pyfuse3.ROOT_INODE, b".journalfs", ROOT)
        assert stat.S_ISDIR(views.st_mode) and ops.views.owns(views.st_ino)
        assert stat.S_ISDIR((await ops.getattr(views.st_ino, ROOT)).st_mode)
    run(source, scenario, timeout=0)


async def _error(call) -> int:
    try:
        await call
    except pyfuse3.FUSEError as exc:
        return exc.errno
    raise AssertionError("the call succeeded")


async def _entries(ops, inode: int) -> dict[bytes, pyfuse3.EntryAttributes]:
    """What one listing of directory ``inode`` sends per name (without . and ..)."""
    fh = await ops.opendir(inode, ROOT)
    replies = ReplyBuffer()
    try:
        while True:
            before = len(replies)
            await ops.readdir(fh, replies[-1][2] if replies else 0, replies)
            if len(replies) == before:
                break
    finally:
        await ops.releasedir(fh)
    return {name: attrs for name, attrs, _next in replies if name not in (b".", b"..")}


def test_listed_with_attributes_after_a_metadata_write_unless_the_acl_is_cached(source):
    # An inode the kernel holds goes by name only: the kernel keeps its attributes and the
    # ACL it cached (`ls -l` asks each entry's; an entry with attributes drops it). But a
    # setxattr through the mount made the kernel invalidate its attributes (ctime): unless
    # it holds the ACL, the entry carries them (else `getfattr -R` after setting metadata
    # costs a GETATTR per file), once.
    (source / "dir" / "c.txt").write_bytes(b"c")

    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        nodes = {}
        for name in (b"a.txt", b"b.txt", b"c.txt"):
            nodes[name] = ops.table.by_ino[(await ops.lookup(d.st_ino, name, ROOT)).st_ino]

        def with_attributes(entries):
            return {name for name, node in nodes.items()
                    if entries[name] is node.reply[2] and entries[name].st_ino == node.ino}

        assert with_attributes(await _entries(ops, d.st_ino)) == set(nodes)  # the first
        assert with_attributes(await _entries(ops, d.st_ino)) == set()
        a, b = nodes[b"a.txt"], nodes[b"b.txt"]
        assert await _error(ops.getxattr(a.ino, b"system.posix_acl_access", ROOT)) \
            == errno.ENODATA  # `ls -l`: the kernel now caches "no ACL" of a.txt
        await ops.setxattr(a.ino, KEY, b"red", ROOT)
        await ops.setxattr(b.ino, KEY, b"blue", ROOT)
        assert with_attributes(await _entries(ops, d.st_ino)) == {b"b.txt"}
        assert with_attributes(await _entries(ops, d.st_ino)) == set()  # once
        # an entry with attributes drops the kernel's ACL: counted, and sent so once only
        lookups_a = a.lookups
        a.acl_cached = False
        await ops.setxattr(a.ino, KEY, b"green", ROOT)
        assert with_attributes(await _entries(ops, d.st_ino)) == {b"a.txt"}
        assert a.lookups == lookups_a + 1 and not a.acl_cached
        # the kernel forgets the inode, and its cached ACL with it
        assert await _error(ops.getxattr(a.ino, b"system.posix_acl_access", ROOT)) \
            == errno.ENODATA
        assert a.acl_cached
        await ops.forget([(a.ino, a.lookups)])
        assert not a.acl_cached
    run(source, scenario)


def test_native_getxattr_of_a_listed_inode_never_yields(source):
    # `ls -l` asks security.selinux of every entry right after READDIRPLUS made its inode:
    # the inode has no fd yet; the first getxattr opens it (checked: the same object) inline
    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        await _entries(ops, d.st_ino)
        node = ops.table.by_path[b"dir/a.txt"]
        assert node.fd is None and node.lookups == 1
        os.setxattr(source / "dir" / "a.txt", "user.colour", b"red")
        def general(*args):
            raise AssertionError("took the general path")
        for name in ("_getxattr", "_on"):
            setattr(ops, name, general)
        assert at_once(ops.getxattr(node.ino, b"user.colour", ROOT)) == b"red"
        assert node.fd is not None
        # a name that now means another object: ESTALE, never the other object's attributes
        other = ops.table.by_path[b"dir/b.txt"]
        os.rename(source / "dir" / "a.txt", source / "dir" / "b.txt")
        assert other.fd is None
        assert error_at_once(ops.getxattr(other.ino, b"user.colour", ROOT)) == errno.ESTALE
    run(source, scenario)


@pytest.mark.parametrize("timeout", [0, 60])
def test_replies_carry_source_attributes_exactly(source, timeout):
    # the reply of a name seen for the first time (timeout 0: opened O_PATH; 60: from the
    # directory's listing once it is busy enough to scan) is SOURCE's lstat field by field
    # (directories with the big blksize that sizes READDIRPLUS replies), numbered by inode
    from journalfs.fs.dirlist import DIR_BLKSIZE

    os.mkfifo(source / "dir" / "fifo")
    os.symlink("a.txt", source / "dir" / "link")
    (source / "dir" / "sub").mkdir()
    if os.geteuid() == 0:  # a device's number is in the reply too
        os.mknod(source / "dir" / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    for n in range(40):  # past the lookups that make a listing worth scanning
        (source / "dir" / f"f{n}").write_bytes(b"x" * n)
    os.utime(source / "dir" / "a.txt", ns=(1_000_000_123, 2_000_000_456))
    names = sorted(os.listdir(source / "dir"))

    async def scenario(ops):
        d = await lookup_path(ops, "dir")
        replies = {name: await ops.lookup(d.st_ino, os.fsencode(name), ROOT) for name in names}
        if timeout:  # answered from the listing, as the test means
            assert ops.snapshots.listing(b"dir") is not None
        for name, a in replies.items():
            st = os.lstat(source / "dir" / name)
            assert a.st_ino == ops.table.number((st.st_dev, st.st_ino)) == st.st_ino
            assert a.generation == 0 and a.entry_timeout == a.attr_timeout == timeout
            for field in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                          "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
                assert getattr(a, field) == getattr(st, field), (name, field)
            assert a.st_blksize == (DIR_BLKSIZE if stat.S_ISDIR(st.st_mode) else st.st_blksize)
            node = ops.table.by_ino[a.st_ino]
            assert node.paths == [b"dir/" + os.fsencode(name)]
            assert ops.table.by_path[node.paths[0]] is node
    run(source, scenario, timeout=timeout)
