"""Linux calls through the mount, each compared side by side with the same call on SOURCE
directly (issue 11): the answer through journalfs must be the native one.

Every test does the same thing twice: once in ``SOURCE/native-<name>`` and once in
``MOUNT/mounted-<name>`` (which lands in SOURCE too), then compares what each call returned.
Permission rules are exercised by real unprivileged users (jfs-test, jfs-test2) via setpriv.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import pwd
import grp
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gvfsd import gvfs_session  # noqa: F401  (fixture)
from mountutil import mounted
from test_fs_permissions import ensure_test_user
from test_fs_security import run_as
from users import ensure_user

pytestmark = pytest.mark.fuse

JOURNALFS = [sys.executable, "-m", "journalfs.cli"]
libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100


def _errname(fn, *args):
    try:
        return fn(*args)
    except OSError as exc:
        return errno.errorcode[exc.errno]


def _c_call(fn, *args) -> str | int:
    if fn(*args) != 0:
        return errno.errorcode[ctypes.get_errno()]
    return 0


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def second_user() -> pwd.struct_passwd:
    return ensure_user("jfs-test2")


@pytest.fixture(scope="module")
def box():
    """(SOURCE, MOUNT, store) of one shared allow_other mount, reachable by the test users."""
    top = Path(tempfile.mkdtemp(prefix="jfs-calls-"))
    os.chmod(top, 0o755)
    src, mnt, store = top / "src", top / "mnt", top / "store"
    src.mkdir(mode=0o755)
    os.chmod(src, 0o755)
    store.mkdir(mode=0o700)
    try:
        with mounted(src, mnt, "-o", "allow_other", "--store", str(store)):
            yield src, mnt, store
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def pair(box, request):
    """Two fresh, empty directories: (native in SOURCE, through the mount)."""
    src, mnt, _ = box
    name = request.node.name.replace("[", "-").replace("]", "")
    native, through = src / f"native-{name}", mnt / f"mounted-{name}"
    native.mkdir()
    through.mkdir()
    os.chmod(native, 0o777)
    os.chmod(through, 0o777)
    return native, through


# -- directories, names, numbers --------------------------------------------------------------
def test_readdir_lists_dot_and_dotdot(box, pair):
    src, mnt, _ = box
    for d in pair:
        (d / "f").write_text("")
    ls = [subprocess.run(["ls", "-a", str(d)], capture_output=True, text=True).stdout.split()
          for d in pair]
    assert ls[0] == ls[1] == [".", "..", "f"]
    root = subprocess.run(["ls", "-a", str(mnt)], capture_output=True, text=True).stdout.split()
    assert root[:2] == [".", ".."]
    # getdents' d_ino of "." is the directory's own number
    assert subprocess.run(["ls", "-ai", str(pair[1])], capture_output=True, text=True) \
        .stdout.split()[0] == str(os.stat(pair[1]).st_ino)


def test_inode_numbers_are_sources_and_stable_across_drop_caches(pair):
    native, through = pair
    (through / "f").write_text("x")
    (through / "d").mkdir()
    os.link(through / "f", through / "h")
    before = {n: os.lstat(through / n).st_ino for n in ("f", "d", "h")}
    assert before == {n: os.lstat(native.parent / through.name / n).st_ino for n in before}
    assert before["f"] == before["h"]
    drop_caches()
    assert {n: os.lstat(through / n).st_ino for n in before} == before
    os.rename(through / "f", through / "g")
    drop_caches()
    assert os.lstat(through / "g").st_ino == before["f"]


def test_name_max_is_checked_before_any_cached_answer(pair):
    for d in pair:
        for i in range(40):  # enough misses that the daemon answers lookups from a listing
            assert _errname(os.lstat, d / f"missing{i}") == "ENOENT"
    long = "x" * 256
    got = [[_errname(fn, d / long) for fn in (os.lstat, os.mkdir, os.unlink)] for d in pair]
    assert got[0] == got[1] == ["ENAMETOOLONG"] * 3
    got = [_errname(lambda d: open(d / long, "w"), d) for d in pair]
    assert got == ["ENAMETOOLONG", "ENAMETOOLONG"]


def _deep_ops(top: Path) -> list:
    """Build a path of ~4,000 bytes below ``top`` with relative *at() calls and use it."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    out = []
    try:
        os.fchdir(fd)
        part = "d" * 250
        rel = ""
        for _ in range(15):  # 15 * 251 = 3765 bytes below the cwd
            rel = part if not rel else f"{rel}/{part}"
            out.append(_errname(os.mkdir, rel))
        rel = f"{rel}/{'k' * 60}"
        out.append(_errname(os.mkdir, rel))
        leaf = f"{rel}/{'f' * 250}"  # 4076 bytes: only *at() calls relative to the cwd fit
        out.append(_errname(lambda: open(leaf, "w").write("deep")))
        out.append(_errname(lambda: open(leaf).read()))
        out.append(_errname(os.rename, leaf, leaf + "2"))
        out.append(_errname(os.chmod, leaf + "2", 0o600))
        out.append(_errname(lambda: os.stat(leaf + "2").st_mode & 0o777))
        out.append(_errname(os.unlink, leaf + "2"))
        out.append(_errname(os.mkdir, f"{rel}/{'e' * 400}"))
        out.append(_errname(os.mkdir, f"{rel}/{'e' * 250}/{'g' * 200}"))
    finally:
        os.chdir("/")
        os.close(fd)
    return out


def test_paths_up_to_path_max(pair):
    native, through = pair
    got = [_deep_ops(d) for d in pair]
    assert got[0] == got[1]
    assert got[1][16:21] == [4, "deep", None, None, 0o600]


# -- rename ------------------------------------------------------------------------------------
def _renameat2(a: Path, b: Path, flags: int):
    return _c_call(libc.renameat2, AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b),
                   ctypes.c_uint(flags))


def test_renameat2_noreplace_and_exchange(pair):
    got = []
    for d in pair:
        (d / "a").write_text("a")
        (d / "b").write_text("b")
        (d / "da").mkdir()
        (d / "da" / "in").write_text("in-a")
        got.append([_renameat2(d / "a", d / "b", RENAME_NOREPLACE),
                    _renameat2(d / "a", d / "c", RENAME_NOREPLACE),
                    _renameat2(d / "c", d / "b", RENAME_EXCHANGE),
                    (d / "b").read_text(), (d / "c").read_text(),
                    _renameat2(d / "da", d / "b", RENAME_EXCHANGE),
                    (d / "b" / "in").read_text(), (d / "da").read_text(),
                    _renameat2(d / "nothere", d / "b", RENAME_EXCHANGE)])
    assert got[0] == got[1]
    assert got[1][:3] == ["EEXIST", 0, 0]


def test_rename_exchange_swaps_metadata_of_both_subtrees(pair):
    _, d = pair
    (d / "x").mkdir()
    (d / "x" / "child").write_text("")
    (d / "y").write_text("")
    os.setxattr(d / "x", "user.metadata.who", b"x")
    os.setxattr(d / "x" / "child", "user.metadata.who", b"x-child")
    os.setxattr(d / "y", "user.metadata.who", b"y")
    assert _renameat2(d / "x", d / "y", RENAME_EXCHANGE) == 0
    drop_caches()
    assert os.getxattr(d / "y", "user.metadata.who") == b"x"
    assert os.getxattr(d / "y" / "child", "user.metadata.who") == b"x-child"
    assert os.getxattr(d / "x", "user.metadata.who") == b"y"


# -- file data -----------------------------------------------------------------------------
def test_copy_file_range_big_offsets_mmap_both_ways_and_o_direct(pair):
    got = []
    for d in pair:
        out = []
        (d / "a").write_bytes(b"0123456789" * 1000)
        fi, fo = os.open(d / "a", os.O_RDONLY), os.open(d / "b", os.O_WRONLY | os.O_CREAT, 0o644)
        out.append(os.copy_file_range(fi, fo, 5000, 10, 0))
        os.close(fi)
        os.close(fo)
        out.append((d / "b").read_bytes()[:20])
        fd = os.open(d / "big", os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, b"far", 5 << 30)  # beyond 4 GiB
        out += [os.pread(fd, 3, 5 << 30), os.fstat(fd).st_size, os.pread(fd, 3, 1 << 20)]
        os.close(fd)
        os.unlink(d / "big")
        (d / "m").write_bytes(b"\0" * 8192)
        fd = os.open(d / "m", os.O_RDWR)
        with mmap.mmap(fd, 8192, mmap.MAP_SHARED) as m:
            m[0:5] = b"hello"
            m.flush()
            out.append(os.pread(fd, 5, 0))   # mmap write seen by read
            os.pwrite(fd, b"world", 4096)
            out.append(m[4096:4101])         # write seen by the mapping
        os.close(fd)
        fd = os.open(d / "direct", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        buf = mmap.mmap(-1, 4096)
        buf.write(b"D" * 4096)
        out.append(os.pwritev(fd, [buf], 0))
        os.close(fd)
        out.append((d / "direct").read_bytes() == b"D" * 4096)
        got.append(out)
    assert got[0] == got[1]


def test_o_append_from_several_writers(pair):
    def appender(path: Path, tag: int):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for i in range(200):
            os.write(fd, b"%02d-%03d\n" % (tag, i))
        os.close(fd)

    for d in pair:
        threads = [threading.Thread(target=appender, args=(d / "log", t)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = [sorted((d / "log").read_bytes().splitlines()) for d in pair]
    assert lines[0] == lines[1] and len(lines[1]) == 800


def test_statfs_is_sources(box):
    src, mnt, _ = box
    a, b = os.statvfs(src), os.statvfs(mnt)
    for field in ("f_bsize", "f_frsize", "f_blocks", "f_files", "f_namemax"):
        assert getattr(a, field) == getattr(b, field), field


@pytest.mark.xfail(strict=True, reason="pyfuse3 3.5 has no fallocate, lseek or tmpfile "
                   "handler: the kernel answers EOPNOTSUPP / treats the file as all data")
@pytest.mark.parametrize("call", ["punch_hole", "seek_hole", "o_tmpfile"])
def test_calls_pyfuse3_cannot_pass_on(pair, call):
    got = []
    for d in pair:
        if call == "punch_hole":
            fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
            os.write(fd, b"x" * 65536)
            r = _c_call(libc.fallocate, fd, 3, ctypes.c_long(4096), ctypes.c_long(8192))
            got.append((r, os.pread(fd, 4, 4096), os.fstat(fd).st_size))
        elif call == "seek_hole":
            fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(fd, b"data", 1 << 20)
            got.append((os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE)))
        else:
            fd = _errname(os.open, d, os.O_TMPFILE | os.O_RDWR, 0o600)
            got.append(type(fd).__name__)
        if isinstance(fd, int):
            os.close(fd)
    assert got[0] == got[1]


# -- locks ---------------------------------------------------------------------------------
LOCKER = r"""
import fcntl, sys, errno
f = open(sys.argv[1], "r+")
try:
    if sys.argv[2] == "flock":
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
    print("locked")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def _lock(f, kind: str, operation: int) -> None:
    """``operation`` (LOCK_EX, LOCK_UN) on the whole file with flock, or on bytes 0-9 with a
    POSIX record lock: the locks LOCKER tries."""
    if kind == "flock":
        fcntl.flock(f, operation)
    else:
        fcntl.lockf(f, operation, 10, 0)


def test_flock_and_posix_locks_between_processes(pair):
    got = []
    for d in pair:
        path = d / "lock"
        path.write_text("")
        out = []
        with open(path, "r+") as mine:
            for kind in ("flock", "posix"):
                for operation in (fcntl.LOCK_EX, fcntl.LOCK_UN):  # held, then released
                    _lock(mine, kind, operation)
                    out.append(subprocess.run([sys.executable, "-c", LOCKER, str(path), kind],
                                              capture_output=True, text=True).stdout.strip())
        got.append(out)
    assert got[0] == got[1] == [["EAGAIN", "locked", "EAGAIN", "locked"]][0]


# -- permissions with real users ---------------------------------------------------------------
def make_file(path: Path, text: str = "", mode: int = 0o644,
              owner: pwd.struct_passwd | None = None) -> Path:
    """A file with this content and mode, root's or ``owner``'s (and their group)."""
    path.write_text(text)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(path, mode)
    return path


def test_setgid_and_sticky_directories(pair):
    user, other = ensure_test_user(), second_user()
    group = grp.getgrgid(user.pw_gid)
    got = []
    for d in pair:
        sg = d / "sg"
        sg.mkdir()
        os.chown(sg, 0, 0)
        os.chmod(sg, 0o2777)
        sticky = d / "sticky"
        sticky.mkdir()
        os.chmod(sticky, 0o1777)
        res = run_as(user, [
            ("f", f"open({str(sg / 'f')!r}, 'w').write('x')"),
            ("mk", f"os.mkdir({str(sg / 'sub')!r})"),
            ("mine", f"open({str(sticky / 'mine')!r}, 'w').write('x')"),
        ])
        st_f, st_sub = os.stat(sg / "f"), os.stat(sg / "sub")
        res2 = run_as(other, [
            ("rm", f"os.unlink({str(sticky / 'mine')!r})"),
            ("mv", f"os.rename({str(sticky / 'mine')!r}, {str(sticky / 'theirs')!r})"),
            ("own", f"open({str(sticky / 'own')!r}, 'w').write('y')"),
            ("rmown", f"os.unlink({str(sticky / 'own')!r})"),
        ])
        got.append([res, res2, st_f.st_gid, st_f.st_uid == user.pw_uid, st_sub.st_gid,
                    oct(st_sub.st_mode & 0o7777), group.gr_gid != 0])
    assert got[0] == got[1]
    assert got[1][2] == 0 and got[1][4] == 0  # the directory's group, not the user's
    assert got[1][1]["rm"] == "EPERM"


def test_chown_chmod_rules_for_non_root(pair):
    user = ensure_test_user()
    got = []
    for d in pair:
        f, g = make_file(d / "f", owner=user), make_file(d / "rootfile")
        res = run_as(user, [
            ("chmod-own", f"os.chmod({str(f)!r}, 0o600)"),
            ("chmod-setgid-foreign-group", f"os.chown({str(f)!r}, -1, 0)"),
            ("chown-to-root", f"os.chown({str(f)!r}, 0, -1)"),
            ("chmod-other", f"os.chmod({str(g)!r}, 0o666)"),
            ("chown-other", f"os.chown({str(g)!r}, {user.pw_uid}, -1)"),
            ("utime-other", f"os.utime({str(g)!r}, (1, 1))"),
            ("utime-now-other", f"os.utime({str(g)!r})"),
            ("utime-own", f"os.utime({str(f)!r}, (5, 5))"),
            ("truncate-other", f"os.truncate({str(g)!r}, 0)"),
        ])
        got.append([res, oct(os.stat(f).st_mode), os.stat(f).st_uid, os.stat(f).st_mtime])
    assert got[0] == got[1]
    assert got[1][0]["chown-to-root"] == "EPERM" and got[1][0]["chmod-other"] == "EPERM"


def test_setfacl_by_an_owner_outside_the_group_clears_setgid(pair):
    # xfstests generic/375: the ACL is set with the caller's credentials, so SOURCE itself
    # drops S_ISGID when the owner is not in the file's group (and keeps it when they are)
    if not shutil.which("setfacl"):
        pytest.skip("setfacl not installed (package acl)")
    user = ensure_test_user()
    other_group = grp.getgrnam("nogroup").gr_gid
    got = []
    for d in pair:
        modes = []
        for gid in (user.pw_gid, other_group):
            for kind in ("file", "dir"):
                path = d / f"{kind}-{gid}"
                path.mkdir() if kind == "dir" else path.write_text("")
                os.chown(path, user.pw_uid, gid)
                os.chmod(path, 0o2755)
                done = subprocess.run(
                    ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                     "--clear-groups", "setfacl", "-m", "u::rwx,g::rwx,o::rwx", str(path)],
                    capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
                modes.append(oct(os.stat(path).st_mode))
        got.append(modes)
    assert got[0] == got[1]
    assert got[1] == [oct(0o102777), oct(0o42777), oct(0o100777), oct(0o40777)]


def test_metadata_xattr_permissions_follow_the_files(pair):
    user = ensure_test_user()
    got = []
    for d in pair:
        ro, mine = make_file(d / "readonly"), make_file(d / "mine", owner=user)
        name = "user.metadata.k" if d.name.startswith("mounted") else "user.k"
        got.append(run_as(user, [
            ("set-readonly", f"os.setxattr({str(ro)!r}, {name!r}, b'v')"),
            ("set-mine", f"os.setxattr({str(mine)!r}, {name!r}, b'v')"),
            ("get-mine", f"os.getxattr({str(mine)!r}, {name!r})"),
        ]))
    assert got[0] == got[1]
    assert got[1]["set-readonly"] == "EACCES"


def test_posix_acls_are_enforced_as_natively(pair):
    if not shutil.which("setfacl"):
        pytest.skip("setfacl not installed (package acl)")
    user = ensure_test_user()
    got = []
    for d in pair:
        f = make_file(d / "f", "secret\n", 0o600)
        sub = d / "closed"
        sub.mkdir(mode=0o700)
        make_file(sub / "in", "inside\n")
        steps = [("read", f"open({str(f)!r}).read()"), ("write", f"open({str(f)!r}, 'a').write('x')"),
                 ("list", f"sorted(os.listdir({str(sub)!r}))"),
                 ("read-in", f"open({str(sub / 'in')!r}).read()")]
        out = [run_as(user, steps)]
        subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:r", str(f)], check=True)
        subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:x", str(sub)], check=True)
        out.append(run_as(user, steps))
        subprocess.run(["setfacl", "-m", "m::-", str(f)], check=True)
        out.append(run_as(user, steps))
        out.append(subprocess.run(["getfacl", "-c", str(f)], capture_output=True,
                                  text=True).stdout)
        got.append(out)
    assert got[0] == got[1]
    assert got[1][0]["read"] == "EACCES" and got[1][1]["read"] == "secret\n"
    assert got[1][1]["list"] == "EACCES" and got[1][1]["read-in"] == "inside\n"


# -- hard links and metadata -------------------------------------------------------------------
def _dump(store: Path) -> dict:
    out = subprocess.run([*JOURNALFS, "meta", "dump", str(store / "root"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out or "{}")


def test_hard_links_share_metadata_on_every_name(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    store.mkdir(mode=0o700)
    with mounted(src, mnt, "--store", str(store)):
        (mnt / "h1").write_text("data")
        os.setxattr(mnt / "h1", "user.metadata.k", b"old")
        os.link(mnt / "h1", mnt / "h2")
        assert os.getxattr(mnt / "h1", "user.metadata.k") == b"old"
        assert os.getxattr(mnt / "h2", "user.metadata.k") == b"old"
        os.setxattr(mnt / "h1", "user.metadata.k", b"set-via-h1")
        drop_caches()
        for name in ("h1", "h2"):
            assert os.getxattr(mnt / name, "user.metadata.k") == b"set-via-h1"
        os.setxattr(mnt / "h2", "user.metadata.k", b"set-via-h2")  # h1 may be forgotten
        assert os.getxattr(mnt / "h1", "user.metadata.k") == b"set-via-h2"
        os.link(mnt / "h2", mnt / "h3")
        drop_caches()
        os.unlink(mnt / "h1")
        for name in ("h2", "h3"):
            assert os.getxattr(mnt / name, "user.metadata.k") == b"set-via-h2"
    stored = {os.path.basename(p): v for p, v in _dump(store).items()}
    assert stored == {"h2": {"k": "set-via-h2"}, "h3": {"k": "set-via-h2"}}


def test_inode_numbers_with_another_filesystem_below_source(tmp_path):
    """Objects of a filesystem mounted inside SOURCE get numbers of their own (their st_ino
    may equal one of SOURCE's), unique and stable across drop_caches."""
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    (src / "sub").mkdir(parents=True)
    store.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "jfs-test-tmpfs", str(src / "sub")],
                   check=True)
    try:
        for i in range(5):
            (src / "sub" / f"t{i}").write_text("")
            (src / f"s{i}").write_text("")
        names = ["sub"] + [f"sub/t{i}" for i in range(5)] + [f"s{i}" for i in range(5)]
        with mounted(src, mnt, "--store", str(store)):
            before = {n: os.lstat(mnt / n).st_ino for n in names}
            assert len(set(before.values())) == len(names)
            for i in range(5):  # SOURCE's own filesystem: SOURCE's numbers
                assert before[f"s{i}"] == os.lstat(src / f"s{i}").st_ino
            drop_caches()
            assert {n: os.lstat(mnt / n).st_ino for n in names} == before
            # the mount does not pin the filesystem below SOURCE: it can still be unmounted
            umount = subprocess.run(["umount", str(src / "sub")], capture_output=True, text=True)
            assert umount.returncode == 0, umount.stderr
            assert os.listdir(mnt / "sub") == []
    finally:
        subprocess.run(["umount", "-l", str(src / "sub")], capture_output=True)


@pytest.mark.gvfs
def test_hard_link_metadata_is_seen_by_gio_on_every_name(gvfs_session, tmp_path,  # noqa: F811
                                                         monkeypatch):
    from test_fs_gio import desktop_source
    src, mnt = desktop_source(gvfs_session, tmp_path, monkeypatch)
    (src / "h1").write_text("x")
    gvfs_session.stop_daemon()  # store mode: journalfs is the only writer
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir), "--sync", "always"):
        os.setxattr(mnt / "h1", "user.metadata.comment", b"old")
        os.link(mnt / "h1", mnt / "h2")
        drop_caches()
        os.setxattr(mnt / "h2", "user.metadata.comment", b"new")
        assert gvfs_session.gio_metadata([src / "h1", src / "h2"]) == {
            str(src / "h1"): {"comment": "new"}, str(src / "h2"): {"comment": "new"}}
        os.unlink(mnt / "h1")
        assert gvfs_session.gio_metadata([src / "h2"]) == {str(src / "h2"): {"comment": "new"}}
