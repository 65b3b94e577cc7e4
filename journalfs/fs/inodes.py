"""The passthrough inode table: our inode numbers <-> SOURCE paths.

The kernel knows files by the inode numbers we hand out. Each number stands for one SOURCE
object (identified by its ``(st_dev, st_ino)``), so hard links share one inode. An inode keeps
every SOURCE path it is known under (hard links), its kernel lookup count and its open file
handles; it lives until the kernel forgets it *and* the last handle is closed, which is what
keeps open-but-unlinked files working.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import pyfuse3


#: Names remembered per inode (hard links); older ones may be stale anyway.
MAX_PATHS = 8


@dataclass(eq=False)
class Inode:
    ino: int
    key: tuple[int, int] | None  # (st_dev, st_ino) of the SOURCE object
    paths: list[bytes] = field(default_factory=list)  # relative to SOURCE, b"" = root
    lookups: int = 0
    handles: set[int] = field(default_factory=set)  # open fds (our file handles)
    cache_ident: tuple | None = None  # (size, mtime_ns) when last closed: keep_cache test
    file_type: int = 0  # S_IFMT bits: a reused SOURCE inode number of another type is new
    # The newest lstat/fstat seen and when (monotonic); ``changes`` counts finished changes
    # through the mount, so a stat taken while another change finished is not kept.
    stat: os.stat_result | None = None
    stat_time: float = 0.0
    changes: int = 0

    @property
    def path(self) -> bytes | None:
        """The most recently seen SOURCE path, None once every name is unlinked."""
        return self.paths[-1] if self.paths else None

    def add_path(self, rel: bytes) -> list[bytes]:
        """Remember ``rel`` as the newest name; returns the names forgotten to make room."""
        if rel in self.paths:
            self.paths.remove(rel)
        self.paths.append(rel)
        dropped = self.paths[:-MAX_PATHS]
        del self.paths[:-MAX_PATHS]
        return dropped


def is_under(rel: bytes, top: bytes) -> bool:
    return rel == top or (top == b"" and rel != b"") or rel.startswith(top + b"/")


def join(parent: bytes, name: bytes) -> bytes:
    return name if parent == b"" else parent + b"/" + name


class InodeTable:
    """Allocation, lookup counting and path bookkeeping (renames, unlinks)."""

    def __init__(self, allocate):
        self._allocate = allocate  # shared counter with the virtual views
        self.by_ino: dict[int, Inode] = {}
        self.by_key: dict[tuple[int, int], Inode] = {}
        # path -> inode whose paths hold it: unlinking one file must not scan every inode
        self.by_path: dict[bytes, Inode] = {}
        root = Inode(pyfuse3.ROOT_INODE, None, [b""], lookups=1)
        self.by_ino[root.ino] = root
        self.root = root

    def __contains__(self, ino: int) -> bool:
        return ino in self.by_ino

    def get(self, ino: int) -> Inode:
        try:
            return self.by_ino[ino]
        except KeyError:
            raise pyfuse3.FUSEError(2) from None  # ENOENT: stale inode

    def remember(self, rel: bytes, st: os.stat_result, lookups: int = 1) -> Inode:
        """The inode for the SOURCE object ``st`` seen at ``rel``, counting ``lookups``
        more kernel references (0 for a tentative entry: see :meth:`drop_if_unused`)."""
        if rel == b"":
            self.root.key = (st.st_dev, st.st_ino)
            return self.root
        key = (st.st_dev, st.st_ino)
        node = self.by_key.get(key)
        if node is None or node.file_type != stat.S_IFMT(st.st_mode):
            # SOURCE reused an inode number (file replaced behind our back): a new inode, or
            # the kernel would see a file turn into a directory under the same number.
            node = Inode(self._allocate(), key, file_type=stat.S_IFMT(st.st_mode))
            self.by_ino[node.ino] = node
            self.by_key[key] = node
        if self.by_path.get(rel) is not node:
            self._add_path(node, rel)
        node.lookups += lookups
        return node

    def _add_path(self, node: Inode, rel: bytes) -> None:
        previous = self.by_path.get(rel)
        if previous is not None and previous is not node and rel in previous.paths:
            previous.paths.remove(rel)  # the name now means another object
        self.by_path[rel] = node
        for old in node.add_path(rel):
            if self.by_path.get(old) is node:
                del self.by_path[old]

    def drop_if_unused(self, node: Inode) -> None:
        self._maybe_drop(node)

    def forget(self, ino: int, count: int) -> None:
        node = self.by_ino.get(ino)
        if node is None or node is self.root:
            return
        node.lookups = max(0, node.lookups - count)
        self._maybe_drop(node)

    def _maybe_drop(self, node: Inode) -> None:
        if node.lookups == 0 and not node.handles and node is not self.root:
            self.by_ino.pop(node.ino, None)
            if self.by_key.get(node.key) is node:
                del self.by_key[node.key]
            for rel in node.paths:
                if self.by_path.get(rel) is node:
                    del self.by_path[rel]

    def release_handle(self, node: Inode, fd: int) -> None:
        node.handles.discard(fd)
        self._maybe_drop(node)

    def unlinked(self, rel: bytes, is_dir: bool = True) -> None:
        """``rel`` no longer names anything: drop it (and, for a directory, anything below
        it) from every inode. A file costs one dict lookup; a directory a full pass."""
        if not is_dir:
            node = self.by_path.pop(rel, None)
            if node is not None and rel in node.paths:
                node.paths.remove(rel)
            return
        for node in list(self.by_ino.values()):
            if node is not self.root:
                node.paths = [p for p in node.paths if not is_under(p, rel)]
        self._reindex_paths()

    def _reindex_paths(self) -> None:
        self.by_path = {p: node for node in self.by_ino.values() if node is not self.root
                        for p in node.paths}

    def renamed(self, moves: list[tuple[bytes, bytes]]) -> None:
        """Apply simultaneous renames ``[(old, new), ...]`` to every known path."""
        for node in self.by_ino.values():
            if node is self.root:
                continue
            new_paths = []
            for p in node.paths:
                for old, new in moves:
                    if is_under(p, old):
                        p = new + p[len(old):]
                        break
                new_paths.append(p)
            node.paths = new_paths
        self._reindex_paths()
