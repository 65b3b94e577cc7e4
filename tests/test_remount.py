"""``-o remount``: ro/rw, kernel flags and runtime settings of a running mount, through
``journalfs mount -o remount,... MNT`` (mount(8) and fstab: test_mount_scripts.py), as root
and as an unprivileged user remounting their own mount (xfstests generic/306, 452)."""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from mountutil import JOURNALFS, mounted
from users import ensure_user, reachable_dir, user_pythonpath

pytestmark = pytest.mark.fuse

REMOUNT_USER = "jfs-remount-test"


def mountinfo(mnt: Path) -> tuple[set[str], set[str]]:
    """(per-mount flags, superblock options) of the mount on ``mnt``."""
    for line in Path("/proc/self/mountinfo").read_text(errors="surrogateescape").splitlines():
        fields = line.split()
        if fields[4] == str(mnt):
            sep = fields.index("-")
            return set(fields[5].split(",")), set(fields[sep + 3].split(","))
    raise AssertionError(f"{mnt} not mounted")


def journalfs(*args, user: pwd.struct_passwd | None = None, env: dict | None = None):
    cmd = [*JOURNALFS, *map(str, args)]
    if user is not None:
        # the venv's interpreter lives under /root: the system one with the venv's packages
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               "/usr/bin/python3", "-m", "journalfs.cli", *map(str, args)]
        env = {**os.environ, **(env or {}),
               "PYTHONPATH": user_pythonpath(),
               "HOME": "/nonexistent", "XDG_RUNTIME_DIR": ""}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def settings(mnt: Path) -> dict[str, str]:
    control = mnt / ".journalfs"
    return {name[len("user.journalfs."):]: os.getxattr(control, name).decode()
            for name in os.listxattr(control)}


def refused_with_erofs(fn, *args) -> None:
    with pytest.raises(OSError) as caught:
        fn(*args)
    assert caught.value.errno == 30, caught.value  # EROFS


def test_remount_ro_and_rw_flip_the_kernel_and_the_daemon(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    (src / "f").write_text("data\n")
    log = tmp_path / "log"
    with mounted(src, mnt, "--store", str(store), "--log-file", str(log), "-o", "allow_other"):
        os.setxattr(mnt / "f", "user.metadata.k", b"before")
        done = journalfs("mount", "-o", "remount,ro", mnt)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        flags, supers = mountinfo(mnt)
        assert "ro" in flags and "ro" in supers and {"nosuid", "nodev"} <= flags
        assert settings(mnt)["ro"] == "1"
        assert json.loads((mnt / ".journalfs" / "status.json").read_text())["options"]["ro"]
        refused_with_erofs(os.setxattr, mnt / "f", "user.metadata.k", b"after")
        refused_with_erofs(open, mnt / "new", "w")
        refused_with_erofs(os.unlink, mnt / "f")
        assert (mnt / "f").read_text() == "data\n"  # reading goes on
        assert os.getxattr(mnt / "f", "user.metadata.k") == b"before"

        # back to rw, with a runtime setting and a kernel flag changed on the way
        done = journalfs("mount", "-o", "remount,rw,timeout=5,noexec", mnt)
        assert done.returncode == 0, done.stderr
        flags, supers = mountinfo(mnt)
        assert "rw" in flags and "rw" in supers and "noexec" in flags
        assert settings(mnt)["ro"] == "0" and settings(mnt)["timeout"] == "5"
        os.setxattr(mnt / "f", "user.metadata.k", b"after")
        (mnt / "new").write_text("x")
        assert (src / "new").read_text() == "x"

        # a file open for writing keeps the mount rw, as on any filesystem
        with open(mnt / "new", "a"):
            done = journalfs("mount", "-o", "remount,ro", mnt)
            assert done.returncode == 1
            assert "a file is open for writing" in done.stderr
            assert len(done.stderr.splitlines()) == 1
        assert "rw" in mountinfo(mnt)[0] and settings(mnt)["ro"] == "0"

        # options fixed when mounting: repeating them is fine, changing them is not
        same = journalfs("mount", "-o", f"remount,store={store},allow_other,log_file={log}", mnt)
        assert same.returncode == 0, same.stderr  # mount(8) repeats fstab's (xfstests 294)
        moved = journalfs("mount", "-o", f"remount,log_file={tmp_path}/other.log", mnt)
        assert moved.returncode == 2 and "'log_file' cannot change" in moved.stderr
        other = journalfs("mount", "-o", f"remount,store={tmp_path}", mnt)
        assert other.returncode == 2 and "'store' cannot change on remount" in other.stderr
        assert journalfs("mount", "-o", "remount,frobnicate", mnt).returncode == 2
        # the writeback cache is asked for in the kernel's INIT: fixed too
        assert journalfs("mount", "-o", "remount,no_writeback_cache", mnt).returncode == 0
        cached = journalfs("mount", "-o", "remount,writeback_cache", mnt)
        assert cached.returncode == 2 and "'writeback_cache' cannot change" in cached.stderr

        # read-only, a setting cannot reach the daemon: said so, nothing changes
        assert journalfs("mount", "-o", "remount,ro", mnt).returncode == 0
        stuck = journalfs("mount", "-o", "remount,timeout=9", mnt)
        assert stuck.returncode == 1 and "change with remount,rw" in stuck.stderr
        assert settings(mnt)["timeout"] == "5"
        assert journalfs("mount", "-o", "remount,rw", mnt).returncode == 0
    dump = journalfs("meta", "dump", store / "root", "--json")
    assert json.loads(dump.stdout)[str(src / "f")] == {"k": "after"}
    text = log.read_text()
    assert "setting ro changed to 1" in text and "setting ro changed to 0" in text
    assert "ERROR" not in text and "Traceback" not in text


def test_a_mount_made_read_only_stays_read_only(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "-o", "ro"):
        done = journalfs("mount", "-o", "remount,rw", mnt)
        assert done.returncode == 1
        assert "metadata store is open read-only: unmount it and mount it rw" in done.stderr
        assert "ro" in mountinfo(mnt)[0] and settings(mnt)["ro"] == "1"
        refused_with_erofs(open, mnt / "new", "w")


def test_remount_of_something_else_is_refused(tmp_path):
    done = journalfs("mount", "-o", "remount,ro", tmp_path)
    assert done.returncode == 1 and "is not mounted" in done.stderr
    usage = journalfs("mount", str(tmp_path))
    assert usage.returncode == 2 and "MOUNTPOINT" in usage.stderr


@contextlib.contextmanager
def user_mount(user: pwd.struct_passwd):
    """A mount the unprivileged ``user`` made (through fusermount3) of their own SOURCE."""
    with reachable_dir("jfs-remount-") as base:
        src, mnt, store = base / "src", base / "mnt", base / "store"
        for d in (src, mnt, store):
            d.mkdir()
            os.chown(d, user.pw_uid, user.pw_gid)
        (src / "f").write_text("mine\n")
        os.chown(src / "f", user.pw_uid, user.pw_gid)
        log = store / "daemon.log"
        done = journalfs("mount", src, mnt, "--store", store, "--log-file", log, user=user)
        assert done.returncode == 0, done.stderr
        try:
            yield src, mnt, log
        finally:  # waits for the daemon to exit
            if journalfs("umount", mnt, user=user).returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)


def as_user(user, *cmd):
    return subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                           "--clear-groups", *map(str, cmd)], capture_output=True, text=True,
                          timeout=60)


def test_an_unprivileged_user_remounts_their_own_mount_read_only():
    user = ensure_user(REMOUNT_USER)
    try:
        with user_mount(user) as (src, mnt, log):
            done = journalfs("mount", "-o", "remount,ro", mnt, user=user)
            assert done.returncode == 0, done.stderr
            # the kernel's flag is root's; journalfs itself refuses every change
            assert "read-only flag is root's to set" in done.stderr
            assert "rw" in mountinfo(mnt)[0]
            touch = as_user(user, "touch", mnt / "new")
            assert touch.returncode == 1 and "Read-only file system" in touch.stderr
            meta = as_user(user, "setfattr", "-n", "user.metadata.k", "-v", "v", mnt / "f")
            assert meta.returncode == 1 and "Read-only file system" in meta.stderr
            append = as_user(user, "sh", "-c", f"echo more >> {mnt}/f")
            assert append.returncode != 0 and "Read-only file system" in append.stderr
            assert (src / "f").read_text() == "mine\n"
            done = journalfs("mount", "-o", "remount,rw", mnt, user=user)
            assert done.returncode == 0 and done.stderr == "", done.stderr
            assert as_user(user, "touch", mnt / "new").returncode == 0
            assert as_user(user, "setfattr", "-n", "user.metadata.k", "-v", "v",
                           mnt / "f").returncode == 0
            # kernel flags stay root's
            flags = journalfs("mount", "-o", "remount,noexec", mnt, user=user)
            assert flags.returncode == 1 and "needs root" in flags.stderr
            text = log.read_text()
            assert "ERROR" not in text and "Traceback" not in text, text
    finally:
        subprocess.run(["userdel", REMOUNT_USER], check=False)


@pytest.mark.fast
def test_a_setting_the_mount_does_not_have_reads_as_absent(tmp_path):
    """Remount compares each wanted setting with the current one: where the daemon has no
    such setting (sync or the quota where gvfsd-metadata writes the store), it is absent
    (then setting it says why), never an unhandled OSError."""
    from journalfs.fs import remount  # the module under test, as the command loads it
    (tmp_path / ".journalfs").write_text("")
    os.setxattr(tmp_path / ".journalfs", b"user.journalfs.timeout", b"1")
    assert remount._setting(str(tmp_path), "timeout") == "1"
    assert remount._setting(str(tmp_path), "quota_user") is None
    with pytest.raises(remount.MountError, match="cannot read the setting timeout"):
        remount._setting(str(tmp_path / "missing"), "timeout")
