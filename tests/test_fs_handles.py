"""Open by file handle through the mount after the kernel forgot the inode (xfstests
generic/426, 467, 756; what NFS export of a mount needs): name_to_handle_at on the mount,
drop the kernel's caches, open_by_handle_at. Side by side with the same on SOURCE, and a
handle must never reach anything outside SOURCE."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import struct
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse

_libc = ctypes.CDLL(None, use_errno=True)


def name_to_handle(path) -> bytes:
    buf = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("I", buf, 0, 128)
    mount_id = ctypes.c_int()
    if _libc.name_to_handle_at(-100, os.fsencode(path), buf, ctypes.byref(mount_id), 0):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))
    return buf.raw[:8 + struct.unpack_from("I", buf, 0)[0]]


def open_by_handle(mount_dir, handle: bytes, flags: int = os.O_RDONLY) -> int:
    mount_fd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _libc.open_by_handle_at(mount_fd, handle, flags)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd
    finally:
        os.close(mount_fd)


def forget_everything() -> None:
    """Make the kernel drop unused dentries and inodes: FUSE sends FORGET for them."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("2")


def read_by_handle(mount_dir, handle) -> bytes:
    fd = open_by_handle(mount_dir, handle)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def assert_stale(mount_dir, handle) -> None:
    with pytest.raises(OSError) as caught:
        os.close(open_by_handle(mount_dir, handle))
    assert caught.value.errno == errno.ESTALE, caught.value


@pytest.fixture
def tree(tmp_path):
    src, mnt, outside = tmp_path / "src", tmp_path / "mnt", tmp_path / "outside"
    for d in (src / "dir" / "sub", outside):
        d.mkdir(parents=True)
    (src / "dir" / "file").write_text("in a directory\n")
    (src / "dir" / "sub" / "deep").write_text("deeper\n")
    (src / "top").write_text("at the top\n")
    os.link(src / "top", src / "dir" / "top-link")
    (src / "doomed").write_text("to be deleted\n")
    (src / "leaving").write_text("to move out of SOURCE\n")
    (src / "renamed").write_text("renamed behind the mount\n")
    (outside / "secret").write_text("outside SOURCE\n")
    # files with a second name never seen through the mount: in the same directory, and in
    # another one
    (src / "two").mkdir()
    (src / "two" / "pair").write_text("two names\n")
    os.link(src / "two" / "pair", src / "two" / "pair-link")
    (src / "far").write_text("two names, far apart\n")
    (src / "elsewhere").mkdir()
    os.link(src / "far", src / "elsewhere" / "far-link")
    return src, mnt, outside


def test_handles_open_after_the_kernel_forgot_the_inodes(tree, tmp_path):
    src, mnt, outside = tree
    log = tmp_path / "log"
    names = ["dir/file", "dir/sub/deep", "top", "dir/top-link", "renamed"]
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "-d", "--log-file", str(log)):
        handles = {n: name_to_handle(mnt / n) for n in names}
        native = {n: name_to_handle(src / n) for n in names}
        dir_handle = name_to_handle(mnt / "dir" / "sub")
        doomed, leaving = name_to_handle(mnt / "doomed"), name_to_handle(mnt / "leaving")
        pair, far = name_to_handle(mnt / "two" / "pair"), name_to_handle(mnt / "far")
        os.unlink(mnt / "two" / "pair")  # its other name lives on (xfstests generic/426 -u)
        os.unlink(mnt / "far")
        (src / "renamed").rename(src / "dir" / "moved-here")  # behind the mount's back
        os.unlink(mnt / "doomed")
        shutil.move(src / "leaving", outside / "left")  # behind the mount's back
        forget_everything()
        for name in names:
            expected = (src / ("dir/moved-here" if name == "renamed" else name)).read_bytes()
            assert read_by_handle(mnt, handles[name]) == expected, name
            assert read_by_handle(src, native[name]) == expected, name  # as SOURCE does
        fd = open_by_handle(mnt, dir_handle, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert os.listdir(fd) == ["deep"]
            assert os.stat("deep", dir_fd=fd).st_ino == (mnt / "dir/sub/deep").stat().st_ino
        finally:
            os.close(fd)
        assert read_by_handle(mnt, pair) == b"two names\n"
        # its only name is in a directory journalfs never saw it in: nothing proves that
        # name lies inside SOURCE (the kernel cannot reconnect the handle), so ESTALE
        assert_stale(mnt, far)
        assert_stale(mnt, doomed)
        # moved out of SOURCE: the kernel would find it, journalfs must not
        assert_stale(mnt, leaving)
        # a handle forged for a file outside SOURCE on the same filesystem
        ino = (outside / "secret").stat().st_ino
        forged = handles["top"][:8] + struct.pack("<II", ino >> 32, ino & 0xFFFFFFFF) + \
            handles["top"][16:]
        assert_stale(mnt, forged)
        forget_everything()  # and once more, for inodes found again the first time
        assert read_by_handle(mnt, handles["dir/sub/deep"]) == b"deeper\n"
    text = log.read_text()
    assert "lookup(" in text and ", b'.')" in text, "the kernel never asked for a forgotten inode"
    assert "ERROR" not in text and "Traceback" not in text


def test_a_symlink_swapped_in_does_not_lead_out(tree, tmp_path):
    src, mnt, outside = tree
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        handle = name_to_handle(mnt / "dir" / "file")
        # behind the mount: dir now leads outside, with a file of the same name there
        (src / "dir").rename(src / "dir-old")
        (outside / "file").write_text("outside SOURCE\n")
        (src / "dir").symlink_to(outside)
        forget_everything()
        assert read_by_handle(mnt, handle) == b"in a directory\n"  # found at dir-old/file
        (src / "dir-old" / "file").unlink()
        forget_everything()
        assert_stale(mnt, handle)


def test_handles_stay_valid_across_unmount_and_mount(tree, tmp_path):
    # xfstests generic/477: our numbers are SOURCE's, so a handle outlives the mount
    src, mnt, outside = tree
    env = {**os.environ, "JOURNALFS_RUNTIME_DIR": str(tmp_path / "run")}
    store = str(tmp_path / "store")
    with mounted(src, mnt, "--store", store, env=env):
        handles = {n: name_to_handle(mnt / n) for n in ("dir/file", "dir/sub/deep", "top")}
        directory = name_to_handle(mnt / "dir" / "sub")
        leaving = name_to_handle(mnt / "leaving")
    (src / "dir" / "sub").rename(src / "dir" / "sub-renamed")  # between the mounts
    shutil.move(src / "leaving", outside / "left")
    with mounted(src, mnt, "--store", store, "--log-file", str(tmp_path / "log"), env=env):
        forget_everything()
        assert read_by_handle(mnt, handles["dir/file"]) == b"in a directory\n"
        assert read_by_handle(mnt, handles["dir/sub/deep"]) == b"deeper\n"
        assert read_by_handle(mnt, handles["top"]) == b"at the top\n"
        fd = open_by_handle(mnt, directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert os.listdir(fd) == ["deep"]
        finally:
            os.close(fd)
        assert_stale(mnt, leaving)  # now outside SOURCE
    assert "file handles of the last mount" in (tmp_path / "log").read_text()
    # a damaged file of saved handles is taken up to the damage and only ever proposes:
    # each handle opens what it named or is ESTALE, never anything else
    saved = next((tmp_path / "run").glob("handles-*"))
    data = saved.read_bytes()
    for damaged in (data[:len(data) // 2], data[:40] + os.urandom(200), b"garbage"):
        saved.write_bytes(damaged)
        with mounted(src, mnt, "--store", store, env=env):
            forget_everything()
            for name, expected in (("dir/file", b"in a directory\n"), ("top", b"at the top\n")):
                try:
                    assert read_by_handle(mnt, handles[name]) == expected
                except OSError as exc:
                    assert exc.errno == errno.ESTALE


def test_forgotten_inodes_are_bounded(tmp_path, monkeypatch):
    from journalfs.fs import inodes

    monkeypatch.setattr(inodes, "MAX_FORGOTTEN", 10)
    root_fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    table = inodes.InodeTable(root_fd)
    numbers = []
    for i in range(30):
        name = b"f%d" % i
        (tmp_path / name.decode()).write_text("x")
        fd = os.open(name, inodes.O_PATH_FLAGS, dir_fd=root_fd)
        node = table.remember(name, os.fstat(fd), 1, name, fd=fd)
        numbers.append(node.ino)
        table.forget(node.ino, 1)
    assert len(table.forgotten) == 10
    assert list(table.forgotten) == numbers[-10:]  # the oldest went first
    rel, st, fd, parent = table.find_forgotten(numbers[-1])
    os.close(fd)
    assert rel == b"f29" and st.st_ino == numbers[-1] and parent == 1
    with pytest.raises(Exception) as caught:
        table.find_forgotten(numbers[0])
    assert getattr(caught.value, "errno", None) == errno.ESTALE


def test_what_a_forgotten_inode_costs(tmp_path):
    """Memory per forgotten inode, as MAX_FORGOTTEN's comment says (about 300 bytes)."""
    from journalfs.fs import inodes

    root_fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    table = inodes.InodeTable(root_fd)
    (tmp_path / "d").mkdir()
    nodes = []
    for i in range(2000):
        name = b"file-%06d.log" % i
        (tmp_path / "d" / name.decode()).write_text("x")
        fd = os.open(b"d/" + name, inodes.O_PATH_FLAGS, dir_fd=root_fd)
        nodes.append(table.remember(b"d/" + name, os.fstat(fd), 2, name, fd=fd))
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for node in nodes:
        table._keep_forgotten(node)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_entry = sum(s.size_diff for s in after.compare_to(before, "filename")) / len(nodes)
    assert all(e.handle is not None for e in table.forgotten.values())
    assert per_entry < 400, per_entry
    for node in nodes:
        os.close(node.fd)


def test_nfs_export_of_a_mount(tree):
    filesystems = Path("/proc/filesystems").read_text()
    if "nfsd" not in filesystems or not shutil.which("exportfs"):
        pytest.skip("no kernel NFS server here (nfsd is not in /proc/filesystems): NFS "
                    "export of a mount is not tested; open by handle above is what it needs")
    pytest.skip("kernel NFS server present but this test does not start one (it would "
                "export to the network)")


def test_saved_handle_files_are_bounded(tmp_path):
    from journalfs.fs import main

    for i in range(main.MAX_HANDLE_FILES + 8):
        path = tmp_path / f"handles-{i:x}-1"
        path.write_bytes(b"x")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    (tmp_path / "other").write_bytes(b"kept")
    main._prune_handle_files(str(tmp_path))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == main.MAX_HANDLE_FILES + 1 and "other" in left
    assert "handles-0-1" not in left and f"handles-{main.MAX_HANDLE_FILES + 7:x}-1" in left
