"""Where GIO keeps the metadata of a mount's own paths, and how the mount's two places in a
gvfs store map onto each other (journalfs/metastore/location.py, mirror.py). The behaviour
with real GIO and gvfsd-metadata is in tests/test_fs_gio.py."""
from __future__ import annotations

import os

import pytest

from journalfs.metastore.location import StoreLocation, mount_paths_location, resolve_store
from journalfs.metastore.mirror import MountView

pytestmark = pytest.mark.fast


def test_mount_paths_live_in_the_root_tree_under_the_mountpoints_real_path(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "mnt").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(home / "mnt", tmp_path / "link")
    monkeypatch.setenv("HOME", str(home))
    store = home / ".local" / "share" / "gvfs-metadata"
    # under HOME, yet not the home directory's device: "root", absolute path
    assert mount_paths_location(str(store), str(home / "mnt")) == \
        StoreLocation(str(store / "root"), str(home / "mnt"))
    # symlinks resolved, as GIO resolves them
    assert mount_paths_location(str(store), str(tmp_path / "link")).prefix == str(home / "mnt")
    assert mount_paths_location(str(store), str(tmp_path / "elsewhere")).prefix == str(tmp_path / "elsewhere")
    # HOME inside the mount: GIO would split the mount's paths between two trees
    assert mount_paths_location(str(store), str(home)) is None
    assert mount_paths_location(str(store), str(tmp_path)) is None


@pytest.mark.parametrize("prefix, path, rel", [
    ("", "/a/b", "/a/b"), ("", "/", "/"), ("/docs", "/docs", "/"), ("/docs", "/docs/a", "/a"),
    ("/docs", "/docsx/a", None), ("/docs", "/", None), ("/", "/a", "/a"),
])
def test_rel_path_inverts_store_path(prefix, path, rel):
    location = StoreLocation("/s/home", prefix)
    assert location.rel_path(path) == rel
    if rel is not None:
        assert location.store_path(rel) == path


def test_a_source_paths_place_maps_to_the_mount_paths_place(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    store = home / ".local" / "share" / "gvfs-metadata"
    source = resolve_store(str(home / "docs"), gvfs=True)
    assert source == StoreLocation(str(store / "home"), "/docs")
    view = MountView(source, mount_paths_location(str(store), "/mnt/q"))
    assert view.to_mount("/docs/a/b") == "/mnt/q/a/b"
    assert view.to_mount("/docs") == "/mnt/q"
    assert view.to_mount("/other") is None
    assert not view.overlaps()


@pytest.mark.parametrize("source, mount, overlap", [
    ("/data", "/mnt/q", False), ("/data", "/data/mnt", True), ("/data/sub", "/data", True),
    ("/data", "/data", True), ("/data", "/datax", False), ("", "/mnt", True),
])
def test_places_that_nest_in_one_tree_are_not_mirrored(source, mount, overlap):
    view = MountView(StoreLocation("/s/root", source), StoreLocation("/s/root", mount))
    assert view.overlaps() is overlap
    assert not MountView(StoreLocation("/s/home", source), StoreLocation("/s/root", mount)).overlaps()


def test_a_block_device_udev_names_gets_its_own_tree_relative_to_its_mountpoint(tmp_path, monkeypatch):
    """As gvfsd-metadata's GetTreeFromDevice answers from udev, and GIO then keeps paths
    relative to that filesystem's mountpoint ("/" itself falls back to "root")."""
    from journalfs.metastore import location
    source = tmp_path / "data" / "docs"
    source.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    dev = os.stat(source).st_dev
    udev = tmp_path / "udev"
    udev.mkdir()
    (udev / f"b{os.major(dev)}:{os.minor(dev)}").write_bytes(
        b"S:disk/by-uuid/x\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID_ENC=1234-ABCD\nE:ID_FS_LABEL_ENC=data\n")
    monkeypatch.setattr(location, "UDEV_DATA", str(udev))
    assert location.tree_for_device(os.major(dev), os.minor(dev)) == "uuid-1234-ABCD"
    mountpoint = str(tmp_path / "data")
    monkeypatch.setattr(location, "_mountpoint_of", lambda real, device: mountpoint)
    got = location.gio_location("/s", str(source))
    assert got == StoreLocation("/s/uuid-1234-ABCD", "/docs")
    monkeypatch.setattr(location, "_mount_root", lambda m: "/exported")  # a bind mount's root
    assert location.gio_location("/s", str(source)).prefix == "/exported/docs"
    monkeypatch.setattr(location, "_mountpoint_of", lambda real, device: "/")
    assert location.gio_location("/s", str(source)) == StoreLocation("/s/root", str(source))
    (udev / f"b{os.major(dev)}:{os.minor(dev)}").write_bytes(b"E:ID_FS_TYPE=tmpfs\n")
    assert location.tree_for_device(os.major(dev), os.minor(dev)) == ""


def test_source_kind_looks_at_source_paths_without_following_symlinks(tmp_path):
    from journalfs.fs.main import _source_kind
    src = tmp_path / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "f").write_text("f")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("s")
    os.symlink(tmp_path / "outside", src / "link")
    kind = _source_kind(str(src))
    assert [kind(p) for p in ("/", "/d", "/d/e", "/d/f", "/d/nope")] == ["dir", "dir", "dir", "file", "absent"]
    assert kind("/link") == "file"  # the symlink itself
    assert kind("/link/secret") == "absent"  # never looked up through it
    assert kind("/.journalfs") == kind("/.journalfs/records/x") == "view"
