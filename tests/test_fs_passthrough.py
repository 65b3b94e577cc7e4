"""The mount mirrors SOURCE: every ordinary file operation, on a real kernel FUSE mount."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags: int) -> None:
    if _libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), ctypes.c_uint(flags)):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    base = tmp_path_factory.mktemp("passthrough")
    src, mnt = base / "src", base / "mnt"
    src.mkdir()
    (src / "hello.txt").write_text("hello\n")
    (src / "sub").mkdir()
    (src / "sub" / "inner.bin").write_bytes(bytes(range(256)) * 64)
    with mounted(src, mnt, "--store", str(base / "store")) as m:
        yield m


def test_read_and_list(fs):
    mnt, src = fs.mountpoint, fs.source
    assert (mnt / "hello.txt").read_text() == "hello\n"
    assert (mnt / "sub" / "inner.bin").read_bytes() == (src / "sub" / "inner.bin").read_bytes()
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
    out = subprocess.run(["ls", "-l", str(mnt / "sub")], capture_output=True, text=True, check=True)
    assert "inner.bin" in out.stdout and "16384" in out.stdout


def test_getattr_matches_source(fs):
    a, b = os.lstat(fs.mountpoint / "sub" / "inner.bin"), os.lstat(fs.source / "sub" / "inner.bin")
    assert (a.st_mode, a.st_size, a.st_uid, a.st_gid, a.st_mtime_ns) == \
           (b.st_mode, b.st_size, b.st_uid, b.st_gid, b.st_mtime_ns)


def test_create_write_lands_in_source(fs):
    path = fs.mountpoint / "new.txt"
    with open(path, "w") as f:
        f.write("written through the mount")
    assert (fs.source / "new.txt").read_text() == "written through the mount"
    with open(path, "r+b") as f:  # pwrite in the middle, then read back
        f.seek(8)
        f.write(b"THROUGH")
    assert (fs.source / "new.txt").read_bytes() == b"written THROUGH the mount"
    with open(path, "ab") as f:
        f.write(b"!")
    assert path.read_bytes().endswith(b"mount!")


def test_create_exclusive(fs):
    fd = os.open(fs.mountpoint / "excl", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.close(fd)
    assert stat.S_IMODE(os.stat(fs.source / "excl").st_mode) == 0o640 & ~_umask()
    with pytest.raises(FileExistsError):
        os.open(fs.mountpoint / "excl", os.O_CREAT | os.O_EXCL | os.O_WRONLY)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_truncate_chmod_utimens(fs):
    path = fs.mountpoint / "attrs.bin"
    path.write_bytes(b"x" * 1000)
    os.truncate(path, 10)
    assert os.stat(fs.source / "attrs.bin").st_size == 10
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), 3)
    assert (fs.source / "attrs.bin").read_bytes() == b"xxx"
    os.chmod(path, 0o600)
    assert stat.S_IMODE(os.stat(fs.source / "attrs.bin").st_mode) == 0o600
    os.utime(path, ns=(1_000_000_000, 2_000_000_123))
    st = os.stat(fs.source / "attrs.bin")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_123)
    assert os.stat(path).st_mtime_ns == 2_000_000_123
    subprocess.run(["touch", "-m", "-d", "2001-02-03 04:05:06Z", str(path)], check=True)
    assert os.stat(fs.source / "attrs.bin").st_mtime == 981173106


def test_chown(fs):
    path = fs.mountpoint / "owned"
    path.write_text("")
    os.chown(path, 1234, 5678)
    st = os.stat(fs.source / "owned")
    assert (st.st_uid, st.st_gid) == (1234, 5678)


def test_mkdir_rmdir_unlink(fs):
    d = fs.mountpoint / "dir1"
    d.mkdir(mode=0o750)
    assert (fs.source / "dir1").is_dir()
    (d / "f").write_text("1")
    with pytest.raises(OSError) as info:
        d.rmdir()
    assert info.value.errno == errno.ENOTEMPTY
    (d / "f").unlink()
    assert not (fs.source / "dir1" / "f").exists()
    d.rmdir()
    assert not (fs.source / "dir1").exists()
    assert not d.exists()


def test_rename_plain_and_over(fs):
    mnt, src = fs.mountpoint, fs.source
    (mnt / "r1").write_text("one")
    (mnt / "r2").write_text("two")
    os.rename(mnt / "r1", mnt / "r2")
    assert (src / "r2").read_text() == "one" and not (src / "r1").exists()
    (mnt / "rdir").mkdir()
    (mnt / "rdir" / "child").write_text("c")
    os.rename(mnt / "rdir", mnt / "sub" / "moved")
    assert (mnt / "sub" / "moved" / "child").read_text() == "c"
    assert (src / "sub" / "moved" / "child").read_text() == "c"


def test_rename_noreplace(fs):
    mnt, src = fs.mountpoint, fs.source
    (mnt / "n1").write_text("a")
    (mnt / "n2").write_text("b")
    with pytest.raises(OSError) as info:
        renameat2(mnt / "n1", mnt / "n2", RENAME_NOREPLACE)
    assert info.value.errno == errno.EEXIST
    assert (src / "n2").read_text() == "b"
    renameat2(mnt / "n1", mnt / "n3", RENAME_NOREPLACE)
    assert (src / "n3").read_text() == "a" and not (src / "n1").exists()


def test_rename_exchange(fs):
    mnt, src = fs.mountpoint, fs.source
    (mnt / "x1").write_text("first")
    (mnt / "x2").mkdir()
    (mnt / "x2" / "in").write_text("inside")
    renameat2(mnt / "x1", mnt / "x2", RENAME_EXCHANGE)
    assert (src / "x2").read_text() == "first"
    assert (src / "x1" / "in").read_text() == "inside"
    assert (mnt / "x1" / "in").read_text() == "inside"  # our path table followed the swap
    assert (mnt / "x2").read_text() == "first"


def test_open_unlinked_file_keeps_working(fs):
    path = fs.mountpoint / "ghost"
    with open(path, "w+b") as f:
        f.write(b"boo")
        f.flush()
        path.unlink()
        assert not (fs.source / "ghost").exists()
        f.write(b"!")
        f.seek(0)
        assert f.read() == b"boo!"
        assert os.fstat(f.fileno()).st_size == 4
        os.fchmod(f.fileno(), 0o600)
        assert stat.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o600


def test_hard_links_share_an_inode(fs):
    mnt, src = fs.mountpoint, fs.source
    (mnt / "h1").write_text("shared")
    os.link(mnt / "h1", mnt / "h2")
    assert os.stat(src / "h1").st_ino == os.stat(src / "h2").st_ino
    a, b = os.stat(mnt / "h1"), os.stat(mnt / "h2")
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    (mnt / "h1").unlink()
    assert (mnt / "h2").read_text() == "shared"
    with open(mnt / "h2", "a") as f:
        f.write("+")
    assert (src / "h2").read_text() == "shared+"


def test_symlinks_are_not_followed(fs, tmp_path):
    mnt, src = fs.mountpoint, fs.source
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(str(outside), mnt / "link")
    assert os.readlink(src / "link") == str(outside)
    assert os.readlink(mnt / "link") == str(outside)
    assert stat.S_ISLNK(os.lstat(mnt / "link").st_mode)
    # Opening with O_NOFOLLOW through the mount must refuse, like on a native filesystem.
    with pytest.raises(OSError) as info:
        os.open(mnt / "link", os.O_RDONLY | os.O_NOFOLLOW)
    assert info.value.errno == errno.ELOOP
    # lchown / utime(follow_symlinks=False) change the link itself, never its target.
    before = os.stat(outside)
    os.utime(mnt / "link", ns=(5_000_000_000, 6_000_000_000), follow_symlinks=False)
    assert os.lstat(src / "link").st_mtime_ns == 6_000_000_000
    assert os.stat(outside).st_mtime_ns == before.st_mtime_ns
    os.chown(mnt / "link", 4321, 4321, follow_symlinks=False)
    assert os.lstat(src / "link").st_uid == 4321 and os.stat(outside).st_uid == before.st_uid
    # Reading through the link goes out of the mount via the kernel, which is fine.
    assert (mnt / "link").read_text() == "secret"


def test_fifo(fs):
    path = fs.mountpoint / "pipe"
    os.mkfifo(path)
    assert stat.S_ISFIFO(os.lstat(fs.source / "pipe").st_mode)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    writer = subprocess.Popen([sys.executable, "-c",
                               f"open({str(path)!r}, 'w').write('through the fifo')"])
    with open(path) as f:
        assert f.read() == "through the fifo"
    assert writer.wait(timeout=30) == 0


def test_statfs(fs):
    a, b = os.statvfs(fs.mountpoint), os.statvfs(fs.source)
    assert (a.f_bsize, a.f_blocks, a.f_files, a.f_namemax) == \
           (b.f_bsize, b.f_blocks, b.f_files, b.f_namemax)


def test_fsync_and_big_file(fs):
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = fs.mountpoint / "big.bin"
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        os.fdatasync(f.fileno())
    assert (fs.source / "big.bin").read_bytes() == data
    assert path.read_bytes() == data
    out = subprocess.run(["cmp", str(path), str(fs.source / "big.bin")])
    assert out.returncode == 0


def test_changes_in_source_show_up(tmp_path):
    """With -o timeout=0 the kernel caches nothing: changes made in SOURCE behind the mount's
    back show at once (the default 1 s cache shows them within a second)."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "-o", "timeout=0"):
        (src / "external.txt").write_text("made outside")
        assert (mnt / "external.txt").read_text() == "made outside"
        (src / "external.txt").write_text("changed outside!")
        assert (mnt / "external.txt").read_text() == "changed outside!"
        (src / "external.txt").unlink()
        assert not (mnt / "external.txt").exists()
        (src / "external.txt").mkdir()  # same name, now a directory (maybe the same st_ino)
        assert (mnt / "external.txt").is_dir()


def test_errors_are_native(fs):
    mnt = fs.mountpoint
    with pytest.raises(FileNotFoundError):
        (mnt / "missing").read_text()
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt / "hello.txt")
    with pytest.raises(IsADirectoryError):
        open(mnt / "sub", "w")
    with pytest.raises(FileExistsError):
        (mnt / "sub").mkdir()


# -- the mount / umount commands ---------------------------------------------------------------
def journalfs(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "journalfs.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def cli_env(tmp_path):
    env = dict(os.environ, JOURNALFS_RUNTIME_DIR=str(tmp_path / "run"),
               XDG_DATA_HOME=str(tmp_path / "xdg"))
    return env


def test_daemon_mount_returns_when_usable_and_umount_waits(tmp_path, cli_env, monkeypatch):
    import psutil
    from journalfs.fs.main import pidfile_for

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_text("daemon")
    monkeypatch.setenv("JOURNALFS_RUNTIME_DIR", cli_env["JOURNALFS_RUNTIME_DIR"])
    done = journalfs("mount", src, mnt, "--store", tmp_path / "store", env=cli_env)
    try:
        assert done.returncode == 0, done.stderr
        assert os.path.ismount(mnt)  # usable as soon as the command returned
        assert (mnt / "f").read_text() == "daemon"
        os.setxattr(mnt / "f", "user.metadata.k", b"v")
        pid = int(open(pidfile_for(str(mnt))).read())
        assert psutil.pid_exists(pid)
        done = journalfs("umount", mnt, env=cli_env)
        assert done.returncode == 0, done.stderr
        assert not os.path.ismount(mnt)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not os.path.exists(pidfile_for(str(mnt)))
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
    # The daemon flushed the metadata on its way out.
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        assert os.getxattr(mnt / "f", "user.metadata.k") == b"v"


def test_mount_errors_are_one_line(tmp_path, cli_env):
    src, mnt, full = tmp_path / "src", tmp_path / "mnt", tmp_path / "full"
    src.mkdir()
    mnt.mkdir()
    full.mkdir()
    (full / "x").write_text("")
    cases = [
        (("mount", tmp_path / "missing", mnt), 1, "does not exist"),
        (("mount", src, tmp_path / "nomnt"), 1, "does not exist"),
        (("mount", src, full), 1, "not empty"),
        (("mount", src, mnt, "-o", "bogus"), 2, "unknown mount option"),
        (("mount", src, mnt, "-o", "sync=sometimes"), 2, "sync must be"),
        (("mount", src, mnt, "-o", "readahead=lots"), 2, "readahead must be"),
        (("umount", mnt), 1, "not mounted"),
    ]
    for args, code, words in cases:
        done = journalfs(*args, env=cli_env)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not os.path.ismount(mnt)


def test_readahead_is_set_on_the_mount(tmp_path):
    """Journals are read front to back: the mount's kernel readahead (its bdi's sysfs knob)
    is 1 MiB unless -o readahead= says otherwise; 0 keeps what the kernel chose."""
    src = tmp_path / "src"
    src.mkdir()
    store = str(tmp_path / "store")

    def readahead(mnt, expected: int | None = None) -> int:
        """The mount's readahead; set by the daemon once it has answered the kernel's INIT,
        a moment after the mount appears (--foreground does not wait for that)."""
        dev = os.stat(mnt).st_dev
        deadline = time.monotonic() + 30  # a bound against hanging, not a timing check
        while True:
            with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb") as f:
                value = int(f.read())
            if value == expected or expected is None or time.monotonic() > deadline:
                return value
            time.sleep(0.02)
    with mounted(src, tmp_path / "mnt0", "--store", store, "-o", "readahead=0") as m:
        kernels = readahead(m.mountpoint)
    with mounted(src, tmp_path / "mnt1", "--store", store) as m:
        assert readahead(m.mountpoint, 1024) == 1024 != kernels
        status = json.loads((m.mountpoint / ".journalfs" / "status.json").read_text())
        assert status["options"]["readahead_kib"] == 1024
    with mounted(src, tmp_path / "mnt 2", "--store", store, "-o", "readahead=256") as m:
        assert readahead(m.mountpoint, 256) == 256  # a mountpoint with a space: escaped in mountinfo


def test_store_locked_and_busy_mountpoint(tmp_path, cli_env):
    src, mnt, mnt2 = tmp_path / "src", tmp_path / "mnt", tmp_path / "mnt2"
    for d in (src, mnt2):
        d.mkdir()
    store = tmp_path / "store"
    with mounted(src, mnt, "--store", str(store)):
        done = journalfs("mount", src, mnt2, "--store", store, env=cli_env)
        assert done.returncode == 1 and "locked" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not os.path.ismount(mnt2)
        done = journalfs("mount", src, mnt, "--store", tmp_path / "other", env=cli_env)
        assert done.returncode == 1 and "busy" in done.stderr, done.stderr


def test_fstab_options_are_accepted(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "f").write_text("x")
    opts = ("rw,defaults,auto,noauto,user,users,nofail,_netdev,dev,suid,exec,nodev,nosuid,"
            f"noexec,x-systemd.automount,comment=hello,store={tmp_path / 'store'},sync=none")
    with mounted(src, mnt, "-o", opts, "-o", "fsname=myjournals"):
        assert (mnt / "f").read_text() == "x"
        with open("/proc/self/mounts") as f:
            line = next(l for l in f if f" {mnt} " in l)
        assert line.startswith("myjournals ") and "fuse.journalfs" in line
        status = json.loads((mnt / ".journalfs" / "status.json").read_text())
        assert status["options"]["sync"] == "none"


def test_read_only_mount(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "f").write_text("x")
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "-o", "ro"):
        assert (mnt / "f").read_text() == "x"
        for attempt in (lambda: open(mnt / "f", "w"), lambda: (mnt / "g").write_text(""),
                        lambda: os.setxattr(mnt / "f", "user.metadata.k", b"v")):
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS
    assert (src / "f").read_text() == "x"


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_signal_unmounts_cleanly(tmp_path, signum):
    import signal
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    (src / "f").write_text("")
    with mounted(src, mnt, "--store", str(store), "--sync", "none") as m:
        os.setxattr(mnt / "f", "user.metadata.k", b"kept")
        m.process.send_signal(getattr(signal, signum))
        assert m.process.wait(timeout=30) == 0, m.stderr()
        assert not os.path.ismount(mnt)
    with mounted(src, mnt, "--store", str(store)):  # sync=none, yet flushed on the way out
        assert os.getxattr(mnt / "f", "user.metadata.k") == b"kept"


# -- the inode table, without a mount ----------------------------------------------------------
def test_inode_table_bookkeeping(tmp_path):
    from journalfs.fs.inodes import InodeTable
    root_fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    table = InodeTable(root_fd)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("")
    os.link(tmp_path / "d" / "f", tmp_path / "g")
    d = table.remember(b"d", os.lstat(tmp_path / "d"), 1, b"d")
    f = table.remember(b"d/f", os.lstat(tmp_path / "d" / "f"), d.ino, b"f")
    g = table.remember(b"g", os.lstat(tmp_path / "g"), 1, b"g")
    assert f is g and f.paths == [b"d/f", b"g"] and f.lookups == 2  # hard links: one inode
    assert f.ino == os.lstat(tmp_path / "g").st_ino  # SOURCE's own inode number
    assert table.names_of(f) == [b"d/f", b"g"]
    table.renamed([(b"d", b"e")])
    assert d.path == b"e" and f.paths == [b"e/f", b"g"]
    table.unlinked(b"g", is_dir=False)  # a file's name: found by index, no full pass
    assert f.path == b"e/f" and b"g" not in table.by_path and table.by_path[b"e/f"] is f
    assert table.names_of(f) == [b"e/f"]
    f.parent, f.name = d.ino, b"f"
    fd = table.fd(f)  # opened from the parent's fd, checked to be the same object
    assert os.fstat(fd).st_ino == f.ino
    f.open_handle(99)
    table.forget(f.ino, 2)
    assert f.ino in table  # still open
    table.release_handle(f, 99)
    assert f.ino not in table and f.fd is None  # its O_PATH fd is closed with it
    os.unlink(tmp_path / "d" / "f")
    os.rmdir(tmp_path / "d")
    table.forget(d.ino, 1)
    assert d.ino not in table


def test_inode_fd_refuses_another_object(tmp_path):
    """A name that now means another object gives ESTALE, never that object."""
    import pyfuse3
    from journalfs.fs.inodes import InodeTable
    table = InodeTable(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY))
    (tmp_path / "d").mkdir()
    d = table.remember(b"d", os.lstat(tmp_path / "d"), 1, b"d")
    os.rename(tmp_path / "d", tmp_path / "d.old")
    (tmp_path / "other").mkdir(mode=0o700)
    os.symlink("other", tmp_path / "d")
    with pytest.raises(pyfuse3.FUSEError) as err:
        table.fd(d)
    assert err.value.errno == errno.ESTALE


def test_fsync_and_fsyncdir_make_metadata_durable(tmp_path):
    """CONTRACT: fsync/fdatasync of any file or directory in the mount makes every earlier
    metadata write durable (the store journal is fdatasynced) even with --sync none."""
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    store.mkdir(mode=0o700)
    (src / "f").write_text("x")

    def last_fsync():
        return json.loads((mnt / ".journalfs" / "status.json").read_text())["last_fsync"]

    with mounted(src, mnt, "--store", str(store), "--sync", "none"):
        for i, sync in enumerate((os.fsync, os.fdatasync, "dir")):
            os.setxattr(mnt / "f", "user.metadata.k", b"v%d" % i)
            before = last_fsync()
            time.sleep(0.05)
            if sync == "dir":
                fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
                os.fsync(fd)
            else:
                fd = os.open(mnt / "f", os.O_RDONLY)
                sync(fd)
            os.close(fd)
            after = last_fsync()
            assert after is not None and after != before, (sync, before, after)


def test_inode_fds_beyond_the_budget_are_opened_per_request(tmp_path):
    """More inodes than the fd budget: the extra ones keep no fd between requests."""
    from journalfs.fs.inodes import O_PATH_FLAGS, InodeTable
    table = InodeTable(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY), max_fds=2)
    nodes = []
    for i in range(4):
        (tmp_path / f"f{i}").write_text("")
        fd = os.open(tmp_path / f"f{i}", O_PATH_FLAGS)
        nodes.append(table.remember(f"f{i}".encode(), os.fstat(fd), 1, f"f{i}".encode(), fd=fd))
    assert [n.fd is not None for n in nodes] == [True, True, False, False]
    assert table.kept_fds == 2
    fd = table.hold(nodes[3])  # opened for the request ...
    assert os.fstat(fd).st_ino == nodes[3].ino
    table.unhold(nodes[3])
    assert nodes[3].fd is None  # ... and closed after it
    table.forget(nodes[0].ino, 1)
    assert table.kept_fds == 1
    table.hold(nodes[3])
    table.unhold(nodes[3])
    assert nodes[3].fd is None


def _wait_for(check, seconds: float = 10.0) -> bool:
    """Whether ``check()`` comes true within ``seconds`` (the watcher's invalidation is
    asynchronous; this waits for the mechanism, it times nothing)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user: needs root")
def test_writeback_cache_option(tmp_path):
    """-o writeback_cache: the kernel gathers writes in its page cache. It then reads pages
    of files opened write-only (to fill a partly written page) and places O_APPEND writes
    itself, so the daemon opens them read-write, without O_APPEND; a user still gets exactly
    what SOURCE allows. A file changed in SOURCE behind the mount shows its new size once
    closed (the kernel keeps its own size of a file it caches: the watcher drops its entry)."""
    from users import ensure_user, reachable_dir
    user = ensure_user("jfs-test")
    with reachable_dir("jfs-wb-") as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir(mode=0o755)
        (src / "wo.txt").write_bytes(b"0123456789")
        (src / "wo.txt").chmod(0o622)  # others may write, not read
        with mounted(src, mnt, "--store", str(base / "store"),
                     "-o", "allow_other,writeback_cache") as m:
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            assert status["options"]["writeback_cache"] is True
            script = (f"import os\nfd = os.open({str(mnt / 'wo.txt')!r}, os.O_WRONLY)\n"
                      "os.pwrite(fd, b'ab', 3)\nos.close(fd)\n"
                      f"try:\n    open({str(mnt / 'wo.txt')!r}, 'rb')\n"
                      "except PermissionError:\n    print('EACCES')\n")
            done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}",
                                   f"--regid={user.pw_gid}", "--init-groups", "--reset-env",
                                   "/usr/bin/python3", "-c", script],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == "EACCES"  # the daemon's read-write fd is its own
            assert (src / "wo.txt").read_bytes() == b"012ab56789"

            for part in (b"one ", b"two"):
                with open(mnt / "log.txt", "ab") as f:
                    f.write(part)
            with open(mnt / "log.txt", "ab") as f:
                os.pwrite(f.fileno(), b"!", 0)  # O_APPEND: at the end whatever the offset
            assert (src / "log.txt").read_bytes() == b"one two!"

            (mnt / "grown.txt").write_bytes(b"hello")
            with open(src / "grown.txt", "ab") as f:  # behind the mount's back
                f.write(b" world")
            assert _wait_for(lambda: os.stat(mnt / "grown.txt").st_size == 11)
            assert (mnt / "grown.txt").read_bytes() == b"hello world"
            assert m.process.poll() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user: needs root")
def test_posix_acls_are_enforced_by_the_kernel(tmp_path):
    """enable_acl: the kernel checks SOURCE's POSIX ACLs (not only the mode bits) for every
    user, with the same outcome as on SOURCE itself: an ACL entry grants a read the mode
    alone denies, and denies one the mode alone grants."""
    if not shutil.which("setfacl"):
        pytest.skip("setfacl not installed (acl)")
    from users import ensure_user, reachable_dir
    user = ensure_user("jfs-test")
    with reachable_dir("jfs-acl-") as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir(mode=0o755)
        for name, mode, acl in (("granted", 0o600, "r"), ("denied", 0o644, "-")):
            (src / name).write_text(name)
            (src / name).chmod(mode)
            subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:{acl}", str(src / name)],
                           check=True)
        script = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p).read()\n"
                  "        print('ok')\n    except PermissionError:\n        print('EACCES')\n")
        with mounted(src, mnt, "--store", str(base / "store"), "-o", "allow_other"):
            done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                                   "--init-groups", "--reset-env", "/usr/bin/python3", "-c",
                                   script, *(str(d / n) for d in (src, mnt)
                                             for n in ("granted", "denied"))],
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["ok", "EACCES", "ok", "EACCES"]
