"""Where a mount's metadata lives: which tree file, and how mount paths map to store paths."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreLocation:
    tree_path: str
    prefix: str  # store path of the mount root ("" = the mount root is the store's "/")

    def store_path(self, rel: str) -> str:
        """Mount-relative path ("/" or "/a/b") -> canonical store path."""
        rel = "/" + "/".join(p for p in rel.split("/") if p)
        if not self.prefix or self.prefix == "/":
            return rel
        return self.prefix if rel == "/" else self.prefix + rel

    def rel_path(self, store_path: str) -> str | None:
        """Inverse of :meth:`store_path`: the mount-relative path of a canonical store path
        of this tree, or None when it lies outside the mount's part of the tree."""
        prefix = "" if self.prefix == "/" else self.prefix
        if not prefix:
            return store_path
        if store_path == prefix:
            return "/"
        if store_path.startswith(prefix + "/"):
            return store_path[len(prefix):]
        return None


def _data_home() -> str:
    return os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")


def gvfs_store_dir() -> str:
    return os.path.join(_data_home(), "gvfs-metadata")


def resolve_store(source: str, store_dir: str | None = None, gvfs: bool = False) -> StoreLocation:
    """Default: an embedded store private to this SOURCE (store path = mount path). With
    ``store_dir`` (or ``gvfs`` -> the user's gvfs-metadata dir): gvfs's own mapping, "home" tree
    for paths under $HOME (relative to it), else the "root" tree with absolute paths."""
    real = os.path.realpath(source)
    if store_dir is None and not gvfs:
        digest = hashlib.sha1(os.fsencode(real)).hexdigest()[:12]
        name = f"{os.path.basename(real) or 'root'}-{digest}"
        return StoreLocation(os.path.join(_data_home(), "journalfs", "stores", name, "home"), "")
    directory = os.path.abspath(store_dir) if store_dir is not None else gvfs_store_dir()
    home = os.path.realpath(os.path.expanduser("~"))
    if real == home or real.startswith(home.rstrip("/") + "/"):
        rel = os.path.relpath(real, home)
        return StoreLocation(os.path.join(directory, "home"), "" if rel == "." else "/" + rel)
    return StoreLocation(os.path.join(directory, "root"), "" if real == "/" else real)


def mount_paths_location(store_dir: str, mountpoint: str) -> StoreLocation | None:
    """Where GIO keeps the metadata of the mount's own paths (MNT/f), in the gvfs directory
    ``store_dir``. GIO picks a tree by the file's device (gvfs metatree.c,
    meta_lookup_cache_lookup_path): "home" only for the home directory's own device, a
    uuid-/label- tree only for a block device udev knows; a FUSE mount (device major 0) is
    neither, so its paths live in the "root" tree under their absolute path, with symlinks in
    the parents resolved. ``mountpoint`` must be resolved before mounting (``realpath`` of a
    live mount of ours would ask this very process). None when the home directory lies inside
    the mount: GIO would then split MNT's paths between two trees, which is not mirrored."""
    real = os.path.realpath(mountpoint)
    home = os.path.realpath(os.path.expanduser("~"))
    if home == real or home.startswith(real.rstrip("/") + "/"):
        return None
    return StoreLocation(os.path.join(os.path.abspath(store_dir), "root"), "" if real == "/" else real)
