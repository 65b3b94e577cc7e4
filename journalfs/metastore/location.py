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
