"""One-line errors and true warnings when a mount cannot be made as asked (issue #27 §3):
an unprivileged ``-o allow_other`` without ``user_allow_other``, errors from inside the
daemon's trio nurseries, ``--store FILE``, ``-o nonempty`` over SOURCE itself."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mountutil import JOURNALFS, unmount
from users import ensure_user, reachable_dir, user_pythonpath

pytestmark = pytest.mark.fuse

ERRORS_USER = "jfs-errors-test"


def user_journalfs(user, *args, fuse_conf: Path | None = None) -> subprocess.CompletedProcess:
    """``journalfs ARGS`` as ``user`` (the system Python with the venv's packages: the venv's
    interpreter lives under /root), with ``fuse_conf`` bound over /etc/fuse.conf in a private
    mount namespace when given (fusermount3 reads it; the real one is left alone)."""
    cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
           "/usr/bin/python3", "-m", "journalfs.cli", *map(str, args)]
    if fuse_conf is not None:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount --bind "{fuse_conf}" /etc/fuse.conf && exec "$@"', "sh", *cmd]
    env = {**os.environ, "HOME": "/nonexistent", "XDG_RUNTIME_DIR": "",
           "PYTHONPATH": user_pythonpath()}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def user_tree():
    user = ensure_user(ERRORS_USER)
    try:
        with reachable_dir("jfs-errors-") as base:
            src, mnt, store = base / "src", base / "mnt", base / "store"
            for d in (src, mnt, store):
                d.mkdir()
                os.chown(d, user.pw_uid, user.pw_gid)
            conf = base / "fuse.conf"
            conf.write_text("# mount_max = 1000\n#user_allow_other\n")
            yield user, src, mnt, store, conf
            if os.path.ismount(mnt):
                unmount(mnt, lazy=True)
    finally:
        subprocess.run(["userdel", ERRORS_USER], check=False)


@pytest.mark.parametrize("extra", [[], ["--foreground"]])
def test_allow_other_without_user_allow_other_says_why_and_how(user_tree, extra):
    user, src, mnt, store, conf = user_tree
    for option in ("allow_other", "allow_root"):
        done = user_journalfs(user, "mount", src, mnt, "--store", store, "-o", option, *extra,
                              fuse_conf=conf)
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"journalfs: -o {option} needs user_allow_other in /etc/fuse.conf (fusermount3 "
            f"refuses it for users otherwise): as root, add a line user_allow_other to "
            f"/etc/fuse.conf, or mount without -o {option}"], done.stderr
        assert not os.path.ismount(mnt)


def test_with_user_allow_other_the_user_mount_goes_ahead(user_tree):
    user, src, mnt, store, conf = user_tree
    conf.write_text("user_allow_other  # let users share their mounts\n")
    # fusermount3 reads the real /etc/fuse.conf at mount time: run the whole life of the
    # mount inside the namespace that has the permissive one
    script = (f'mount --bind "{conf}" /etc/fuse.conf && '
              f'setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups '
              f'/usr/bin/python3 -m journalfs.cli mount {src} {mnt} --store {store} '
              f'-o allow_other && grep -c allow_other /proc/self/mountinfo && '
              f'fusermount3 -u {mnt}')
    env = {**os.environ, "HOME": "/nonexistent", "XDG_RUNTIME_DIR": "",
           "PYTHONPATH": user_pythonpath()}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                           script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) >= 1


def test_a_refused_mount_inside_the_nursery_is_one_line(user_tree):
    # the mountpoint is not the user's: fusermount3 refuses once the daemon runs; that error
    # leaves trio's nursery wrapped in an ExceptionGroup, which the user must never see
    user, src, mnt, store, conf = user_tree
    os.chown(mnt, 0, 0)
    for extra in ([], ["--foreground"]):
        done = user_journalfs(user, "mount", src, mnt, "--store", store, *extra)
        assert done.returncode == 1
        lines = done.stderr.splitlines()
        assert "ExceptionGroup" not in done.stderr and "sub-exception" not in done.stderr
        assert lines[-1] == (f"journalfs: cannot mount on {mnt}: fusermount3 refused "
                             "(fuse_session_mount failed; its reason is on the line above)")
        assert f"fusermount3: user has no write access to mountpoint {mnt}" in lines[-2]


def test_store_that_is_a_file_is_not_a_directory(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store-file"
    src.mkdir()
    mnt.mkdir()
    store.write_text("not a store\n")
    done = subprocess.run([*JOURNALFS, "mount", src, mnt, "--store", store],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == (f"journalfs: metadata store directory {store}: {store} is not a "
                           "directory\n")
    assert not os.path.ismount(mnt)


def test_nonempty_over_source_itself_warns_truly(tmp_path):
    src, store = tmp_path / "src", tmp_path / "store"
    (src / ".journalfs").mkdir(parents=True)
    (src / "f").write_text("x")
    done = subprocess.run([*JOURNALFS, "mount", src, src, "--store", store, "-o", "nonempty"],
                          capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 0, done.stderr
        assert done.stderr == (
            f"journalfs: warning: {src}/.journalfs exists in SOURCE, which this mount covers: "
            "while it is mounted, .journalfs there is the mount's own and the real one is out "
            "of reach (rename it in SOURCE to see it through the mount)\n")
        assert (src / ".journalfs" / "status.json").exists()  # the mount's own
    finally:
        subprocess.run([*JOURNALFS, "umount", src], check=True, timeout=60)
    # over a mountpoint (not SOURCE) that holds a .journalfs: covered like the rest, no word
    mnt = tmp_path / "mnt"
    (mnt / ".journalfs").mkdir(parents=True)
    (src / ".journalfs").rmdir()
    done = subprocess.run([*JOURNALFS, "mount", src, mnt, "--store", store, "-o", "nonempty"],
                          capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 0 and done.stderr == "", done.stderr
    finally:
        subprocess.run([*JOURNALFS, "umount", mnt], check=True, timeout=60)
