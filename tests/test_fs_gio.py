"""The mount and real GNOME gvfs share one metadata store: what setfattr writes through the
mount, `gio info` reads; what `gio set` writes via gvfsd-metadata, getfattr reads through the
mount.  SOURCE lives under the gvfs session's scratch HOME, so store paths are HOME-relative."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gvfsd import gvfs_session  # noqa: F401  (fixture)
from mountutil import mounted

pytestmark = [pytest.mark.fuse, pytest.mark.gvfs]

POLL_TIMEOUT = 20.0  # how long a change may take to cross between gvfsd and the mount


@pytest.fixture
def home_source(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """SOURCE = HOME/docs with two files; the mount process inherits the session's HOME/bus."""
    src = gvfs_session.home / "docs"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    (src / "sub").mkdir()
    (src / "sub" / "b.txt").write_text("b\n")
    for key, value in gvfs_session.env().items():
        monkeypatch.setenv(key, value)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    return src, mnt


def xattr_or_none(path: Path, key: str) -> bytes | None:
    try:
        return os.getxattr(path, f"user.metadata.{key}")
    except OSError:
        return None


def eventually(probe, want, what: str):
    """Poll `probe()` until it returns `want` (changes cross processes asynchronously)."""
    deadline = time.monotonic() + POLL_TIMEOUT
    while (got := probe()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want, f"{what}: got {got!r}, want {want!r}"


def test_setfattr_through_the_mount_is_read_by_gio(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.stop_daemon()  # store mode: journalfs is the only writer
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir), "--sync", "always"):
        os.setxattr(mnt / "a.txt", "user.metadata.comment", "grüße".encode())
        os.setxattr(mnt / "sub" / "b.txt", "user.metadata.emblems", b"important\0urgent\0")
        os.setxattr(mnt / "sub", "user.metadata.color", b"teal")
        # gio reads the store files itself (as every GNOME application does)
        assert gvfs_session.gio_metadata([src / "a.txt", src / "sub" / "b.txt", src / "sub"]) == {
            str(src / "a.txt"): {"comment": "grüße"},
            str(src / "sub" / "b.txt"): {"emblems": ["important", "urgent"]},
            str(src / "sub"): {"color": "teal"},
        }
        assert "metadata::comment: grüße" in gvfs_session.gio("info", "-a", "metadata::*", src / "a.txt")
        os.removexattr(mnt / "a.txt", "user.metadata.comment")
        os.rename(mnt / "sub", mnt / "moved")
        assert gvfs_session.gio_metadata([src / "a.txt", src / "moved", src / "moved" / "b.txt"]) == {
            str(src / "moved" / "b.txt"): {"emblems": ["important", "urgent"]},
            str(src / "moved"): {"color": "teal"},
        }


def test_gio_set_is_read_through_the_mount(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.gio_set(src / "a.txt", "comment", "from gio")
    gvfs_session.gio_set(src / "sub" / "b.txt", "emblems", ["one", "two"])
    # gvfsd-metadata owns the store while it runs: stop it (it flushes on SIGTERM) first
    gvfs_session.stop_daemon()
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir)):
        assert os.getxattr(mnt / "a.txt", "user.metadata.comment") == b"from gio"
        assert os.getxattr(mnt / "sub" / "b.txt", "user.metadata.emblems") == b"one\0two\0"
        assert "user.metadata.comment" in os.listxattr(mnt / "a.txt")
    # and gvfs, started again, still reads its store after journalfs had it
    gvfs_session.start_daemon()
    assert gvfs_session.gio_metadata([src / "a.txt"]) == {str(src / "a.txt"): {"comment": "from gio"}}


def test_gvfs_mode_shares_the_running_daemon(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.gio_set(src / "a.txt", "before", "mount")
    with mounted(src, mnt, "--gvfs", "--store", str(gvfs_session.metadata_dir)):
        assert os.getxattr(mnt / "a.txt", "user.metadata.before") == b"mount"
        # gio set -> gvfsd-metadata -> store -> the mount
        gvfs_session.gio_set(src / "a.txt", "comment", "via gio")
        eventually(lambda: xattr_or_none(mnt / "a.txt", "comment"), b"via gio", "gio set seen by getfattr")
        gvfs_session.gio_set(src / "sub" / "b.txt", "tags", ["x", "y"])
        eventually(lambda: xattr_or_none(mnt / "sub" / "b.txt", "tags"), b"x\0y\0", "gio stringv")
        # setfattr -> the mount -> (gvfsd) -> store -> gio
        os.setxattr(mnt / "sub" / "b.txt", "user.metadata.note", b"via setfattr")
        eventually(lambda: gvfs_session.gio_metadata([src / "sub" / "b.txt"]).get(str(src / "sub" / "b.txt")),
                   {"tags": ["x", "y"], "note": "via setfattr"}, "setfattr seen by gio")
        gvfs_session.gio_set(src / "a.txt", "comment", None)
        eventually(lambda: xattr_or_none(mnt / "a.txt", "comment"), None, "gio unset seen by getfattr")
    assert gvfs_session.daemon_on_bus(), "the mount must leave the shared gvfsd-metadata running"
    assert gvfs_session.gio_metadata([src / "a.txt", src / "sub" / "b.txt"]) == {
        str(src / "a.txt"): {"before": "mount"},
        str(src / "sub" / "b.txt"): {"tags": ["x", "y"], "note": "via setfattr"},
    }
