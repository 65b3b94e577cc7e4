"""Where a mount's metadata lives: which tree file, and how mount paths map to store paths."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreLocation:
    tree_path: str
    prefix: str  # store path of the mount root ("" = the mount root is the store's "/")

    def store_path(self, rel: str) -> str:
        """Mount-relative path ("/" or "/a/b") -> canonical store path."""
        if rel[:1] != "/" or rel[-1:] == "/" or "//" in rel:  # else canonical already
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
    ``store_dir`` (or ``gvfs`` -> the user's gvfs-metadata dir): the tree and path GIO uses
    for SOURCE's files (:func:`gio_location`)."""
    real = os.path.realpath(source)
    if store_dir is None and not gvfs:
        digest = hashlib.sha1(os.fsencode(real)).hexdigest()[:12]
        name = f"{os.path.basename(real) or 'root'}-{digest}"
        return StoreLocation(os.path.join(_data_home(), "journalfs", "stores", name, "home"), "")
    directory = os.path.abspath(store_dir) if store_dir is not None else gvfs_store_dir()
    return gio_location(directory, real)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def gio_location(store_dir: str, real: str) -> StoreLocation:
    """The tree and path GIO keeps the metadata of the directory ``real`` (resolved) and of
    the files in it under, as gvfs's metatree.c (meta_lookup_cache_lookup_path) picks them:
    "home", relative to $HOME, for a path under $HOME on the home directory's own device;
    else the tree udev names the path's block device by ("uuid-…", "label-…", as
    gvfsd-metadata's GetTreeFromDevice answers), relative to that filesystem's mountpoint
    (plus the mount's root inside it, for a bind mount), unless that mountpoint is "/";
    else "root", with the absolute path."""
    home = os.path.realpath(os.path.expanduser("~"))
    try:
        device = os.stat(real).st_dev
    except OSError:
        device = None
    try:
        home_device = os.stat(home).st_dev
    except OSError:
        home_device = None
    if _under(real, home) and (device is None or device == home_device):
        rel = real[len(home):] if home != "/" else real
        return StoreLocation(os.path.join(store_dir, "home"), rel if rel not in ("", "/") else "")
    tree = tree_for_device(os.major(device), os.minor(device)) if device is not None else ""
    if tree and device is not None:
        mountpoint = _mountpoint_of(real, device)
        if mountpoint != "/":
            rest = real[len(mountpoint):] or "/"
            extra = _mount_root(mountpoint)
            prefix = os.path.join(extra, rest.lstrip("/")) if extra else rest
            prefix = prefix.rstrip("/") or "/"
            return StoreLocation(os.path.join(store_dir, tree), "" if prefix == "/" else prefix)
    return StoreLocation(os.path.join(store_dir, "root"), "" if real == "/" else real)


def _mountpoint_of(real: str, device: int) -> str:
    """The top directory above ``real`` still on ``device`` (as gvfs finds a mountpoint)."""
    path = real
    while path != "/":
        parent = os.path.dirname(path)
        try:
            if os.stat(parent).st_dev != device:
                return path
        except OSError:
            return path
        path = parent
    return "/"


def _mount_root(mountpoint: str) -> str | None:
    """The root inside its filesystem of the mount on ``mountpoint`` when it is not the
    filesystem's own root (a bind mount), from /proc/self/mountinfo."""
    found = None
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split(b" ")
                if len(fields) > 4 and _unescape(fields[4]) == mountpoint:
                    found = _unescape(fields[3])
    except OSError:
        return None
    return None if found in (None, "/") else found


def _unescape(field: bytes) -> str:
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


#: where udev records the properties of block devices (gvfsd-metadata asks udev the same)
UDEV_DATA = "/run/udev/data"


def tree_for_device(major: int, minor: int) -> str:
    """gvfs's tree name for a block device: uuid-<ID_FS_UUID_ENC>, else label-<ID_FS_LABEL_ENC>,
    as udev recorded them; "" when udev knows neither (GIO then uses the mount's own tree)."""
    props = {}
    try:
        with open(f"{UDEV_DATA}/b{major}:{minor}", "rb") as f:
            for line in f:
                if line.startswith(b"E:"):
                    key, _, value = line[2:].rstrip(b"\n").partition(b"=")
                    props[key] = value
    except OSError:
        return ""
    for key, prefix in ((b"ID_FS_UUID_ENC", "uuid-"), (b"ID_FS_LABEL_ENC", "label-")):
        if props.get(key):
            return prefix + props[key].decode("utf-8", "replace")
    return ""


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
