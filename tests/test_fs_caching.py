"""Caching must never show stale state for changes made THROUGH the mount.

The kernel keeps names and attributes for the (long) mount timeout, and journalfs answers
lookups, getattr, listings and metadata reads from memory; every change through the mount must
invalidate exactly what it made stale. A random sequence of operations is applied through the
mount and after each one every name's attributes seen through the mount must equal SOURCE's.
"""
from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse

#: lstat fields a passthrough must mirror exactly (st_ino is ours, atime is not compared).
FIELDS = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_mtime_ns", "st_ctime_ns")


def tree_state(top) -> dict:
    """{relative path: (lstat fields...)} of everything under ``top`` (listing + lstat)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(os.path.join(dirpath, name))
            state[rel] = tuple(getattr(st, f) for f in FIELDS)
    root = os.lstat(top)
    state["."] = tuple(getattr(root, f) for f in FIELDS)
    return state


@pytest.fixture
def fs(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    busy = src / "busy"  # enough names that lookups are answered from a directory listing
    busy.mkdir()
    for i in range(80):
        (busy / f"f{i:03d}").write_bytes(b"x" * i)
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "--sync", "none") as m:
        yield m


def random_operation(rng: random.Random, mnt) -> str:
    dirs = [d for d in (mnt / "busy", mnt / "busy" / "sub", mnt) if d.is_dir()]
    where = rng.choice(dirs)
    names = sorted(os.listdir(where))
    files = [where / n for n in names if (where / n).is_file() and not (where / n).is_symlink()]
    op = rng.choice(["create", "write", "truncate", "chmod", "utime", "link", "unlink",
                     "rename", "mkdir", "rmdir", "symlink", "setxattr"])
    target = where / f"n{rng.randrange(40)}"
    try:
        if op == "create":
            with open(target, "wb") as f:
                f.write(b"y" * rng.randrange(5000))
        elif op == "write" and files:
            with open(rng.choice(files), "r+b") as f:
                f.seek(rng.randrange(3000))
                f.write(b"z" * rng.randrange(1, 3000))
        elif op == "truncate" and files:
            os.truncate(rng.choice(files), rng.randrange(100))
        elif op == "chmod" and files:
            os.chmod(rng.choice(files), rng.choice([0o600, 0o644, 0o755]))
        elif op == "utime" and files:
            os.utime(rng.choice(files), ns=(rng.randrange(10**18), rng.randrange(10**18)))
        elif op == "link" and files:
            os.link(rng.choice(files), target)
        elif op == "unlink" and files:
            os.unlink(rng.choice(files))
        elif op == "rename" and files:
            os.rename(rng.choice(files), rng.choice(dirs) / f"n{rng.randrange(40)}")
        elif op == "mkdir":
            os.mkdir(mnt / "busy" / "sub")
        elif op == "rmdir":
            os.rmdir(mnt / "busy" / "sub")
        elif op == "symlink":
            os.symlink("f001", target)
        elif op == "setxattr" and files:
            os.setxattr(rng.choice(files), "user.native", b"v")  # native xattr: ctime
    except OSError as exc:  # e.g. the name exists, the directory is not empty
        return f"{op} -> {type(exc).__name__}"
    return op


def test_random_changes_through_the_mount_are_never_stale(fs):
    rng = random.Random(20261122)
    mnt, src = fs.mountpoint, fs.source
    assert tree_state(mnt) == tree_state(src)
    for step in range(300):
        op = random_operation(rng, mnt)
        seen, truth = tree_state(mnt), tree_state(src)
        stale = {k: (seen.get(k), truth.get(k)) for k in set(seen) | set(truth)
                 if seen.get(k) != truth.get(k)}
        assert not stale, f"step {step} ({op}): mount differs from SOURCE: {stale}"


def test_lookups_in_a_busy_directory_follow_changes(fs):
    """After many lookups a directory is answered from a listing: names created, removed
    and renamed through the mount must still be found (or not) at once."""
    busy = fs.mountpoint / "busy"
    for i in range(80):
        os.stat(busy / f"f{i:03d}")
    for i in range(5):  # never-seen names: negative lookups reach journalfs
        assert not (busy / f"new{i}").exists()
    (busy / "new0").write_bytes(b"abc")
    assert os.stat(busy / "new0").st_size == 3
    os.rename(busy / "f000", busy / "new1")
    assert not (busy / "f000").exists() and (busy / "new1").exists()
    os.unlink(busy / "new1")
    assert not (busy / "new1").exists()
    os.mkdir(busy / "new2")
    assert stat.S_ISDIR(os.stat(busy / "new2").st_mode)
    assert os.stat(busy).st_nlink == os.lstat(fs.source / "busy").st_nlink == 3
    assert sorted(os.listdir(busy)) == sorted(os.listdir(fs.source / "busy"))


def test_metadata_reads_follow_writes_renames_and_removals(fs):
    f = fs.mountpoint / "busy" / "f001"
    name = "user.metadata.colour"
    for value in (b"red", b"green", b"a\0b\0"):
        os.setxattr(f, name, value)
        assert os.getxattr(f, name) == value
    os.removexattr(f, name)
    with pytest.raises(OSError):
        os.getxattr(f, name)
    os.setxattr(f, name, b"blue")
    moved = fs.mountpoint / "busy" / "moved"
    os.rename(f, moved)
    assert os.getxattr(moved, name) == b"blue"
    f.write_bytes(b"")  # a new file under the old name has no metadata
    assert name not in os.listxattr(f)
    os.unlink(moved)
    moved.write_bytes(b"")
    assert name not in os.listxattr(moved)


def test_default_timeout_is_long_and_documented(fs):
    status = json.loads((fs.mountpoint / ".journalfs" / "status.json").read_text())
    assert status["options"]["entry_timeout"] >= 60 and status["options"]["attr_timeout"] >= 60
    done = subprocess.run([sys.executable, "-m", "journalfs.cli", "mount", "--help"],
                          capture_output=True, text=True, check=True)
    assert "behind the mount" in done.stdout and "timeout=0" in done.stdout
