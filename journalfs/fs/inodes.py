"""The passthrough inode table: our inode numbers <-> SOURCE objects.

The kernel knows files by the inode numbers we hand out. Each number stands for one SOURCE
object, identified by its ``(st_dev, st_ino)``; hard links share one inode. Numbers are
stable for as long as the object exists: on SOURCE's own filesystem the number *is* SOURCE's
``st_ino`` (as bindfs reports it), objects of other filesystems mounted below SOURCE get a
number from a second range, remembered for the life of the mount.

Every request acts on the object itself, never on a path string: an inode holds an
``O_PATH|O_NOFOLLOW`` fd of its object, opened lazily from its parent's fd and the name it
was found under and checked to still be that object (``st_dev``/``st_ino``/type), ESTALE if
not. Swapping a directory for a symlink in SOURCE therefore changes nothing for inodes the
kernel already holds. The fd is closed only when the kernel has forgotten the inode, no file
handle is open and no worker thread is using it (``busy``), so a number can never be reused
under a request.

Paths (relative to SOURCE, b"" = root) are still kept per inode: they are the keys of the
metadata store and of the views.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

import pyfuse3


#: Names remembered per inode (hard links); older ones may be stale anyway.
MAX_PATHS = 8
#: Numbers at or above this are not SOURCE's st_ino: objects of other filesystems below
#: SOURCE, and (from ``VIEW_INO_BASE``) the virtual views' own inodes.
FOREIGN_INO_BASE = 1 << 61
VIEW_INO_BASE = FOREIGN_INO_BASE + (1 << 60)
#: Hard-linked objects whose names are remembered across forgets (bounded).
MAX_LINKED = 200_000
O_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def stale() -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(errno.ESTALE)


@dataclass(eq=False)
class Inode:
    ino: int
    key: tuple[int, int] | None  # (st_dev, st_ino) of the SOURCE object
    paths: list[bytes] = field(default_factory=list)  # relative to SOURCE, b"" = root
    lookups: int = 0
    handles: set[int] = field(default_factory=set)  # open file handles
    cache_ident: tuple | None = None  # (size, mtime_ns) when last closed: keep_cache test
    file_type: int = 0  # S_IFMT bits
    # Where the object was last seen: (parent inode number, name); the fd is opened from it.
    parent: int = 0
    name: bytes = b""
    fd: int | None = None  # O_PATH|O_NOFOLLOW fd of the object, once needed
    busy: int = 0  # requests using ``fd`` right now
    # On another filesystem mounted below SOURCE: the fd is kept only while a request uses
    # it (and for unlinked files), so that filesystem can still be unmounted.
    transient: bool = False
    dropped: bool = False
    # The newest lstat/fstat seen and when (monotonic); ``changes`` counts finished changes
    # through the mount, so a stat taken while another change finished is not kept.
    stat: os.stat_result | None = None
    stat_time: float = 0.0
    changes: int = 0
    # (stat, timeout, EntryAttributes) of the last reply built for it: reused while equal
    reply: tuple | None = None
    meta_path: tuple | None = None  # (path, its store path): see Ownership.store_path

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


def same_object(st: os.stat_result, node: Inode) -> bool:
    return (st.st_dev, st.st_ino) == node.key and stat.S_IFMT(st.st_mode) == node.file_type


class InodeTable:
    """Numbers, fds, lookup counting and path bookkeeping (renames, unlinks)."""

    def __init__(self, root_fd: int, max_fds: int | None = None):
        st = os.fstat(root_fd)
        # fds kept between requests, at most ``max_fds`` (3/4 of the process's limit: open
        # files and the store need theirs); beyond that, fds are opened per request.
        if max_fds is None:
            import resource
            max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0] * 3 // 4
        self.max_fds = max_fds
        self.kept_fds = 0
        self.root_dev = st.st_dev
        self.by_ino: dict[int, Inode] = {}
        self.by_key: dict[tuple[int, int], Inode] = {}
        # path -> inode whose paths hold it: unlinking one file must not scan every inode
        self.by_path: dict[bytes, Inode] = {}
        self._foreign: dict[tuple[int, int], int] = {}  # (dev, ino) -> number, kept
        self._next_foreign = FOREIGN_INO_BASE
        # (dev, ino) -> names of objects with several links, kept across forgets so that a
        # metadata write through one name reaches every name seen (see passthrough).
        self.links: dict[tuple[int, int], list[bytes]] = {}
        root = Inode(pyfuse3.ROOT_INODE, (st.st_dev, st.st_ino), [b""], lookups=1,
                     file_type=stat.S_IFDIR, fd=root_fd)
        self.by_ino[root.ino] = root
        self.by_key[root.key] = root
        self.root = root

    def __contains__(self, ino: int) -> bool:
        return ino in self.by_ino

    def get(self, ino: int) -> Inode:
        try:
            return self.by_ino[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None  # stale inode

    def number(self, key: tuple[int, int]) -> int:
        """The stable inode number of the SOURCE object ``key``."""
        dev, ino = key
        if dev == self.root_dev and pyfuse3.ROOT_INODE < ino < FOREIGN_INO_BASE:
            return ino
        number = self._foreign.get(key)
        if number is None:
            number = self._foreign[key] = self._next_foreign
            self._next_foreign += 1
        return number

    # -- fds ------------------------------------------------------------------------------
    def fd(self, node: Inode) -> int:
        """The O_PATH fd of ``node``'s object, opened (and checked) now if needed."""
        if node.fd is not None:
            return node.fd
        if node.dropped:
            raise stale()
        parent = self.by_ino.get(node.parent)
        if parent is None or parent is node:
            raise stale()
        try:
            fd = os.open(node.name, O_PATH_FLAGS, dir_fd=self.fd(parent))
        finally:
            self.let_go(parent)
        try:
            if not same_object(os.fstat(fd), node):
                raise stale()  # the name now means another object
        except BaseException:
            os.close(fd)
            raise
        node.fd = fd
        self._keep(node)
        return fd

    def _keep(self, node: Inode) -> None:
        """Count ``node``'s new fd, or make it per-request when the budget is spent."""
        if node.transient:
            return
        if self.kept_fds >= self.max_fds:
            node.transient = True
        else:
            self.kept_fds += 1

    def hold(self, node: Inode) -> int:
        """``fd(node)`` for a worker thread: not closed until :meth:`unhold`."""
        fd = self.fd(node)
        node.busy += 1
        return fd

    def unhold(self, node: Inode) -> None:
        node.busy -= 1
        if (node.dropped or node.transient) and node.busy == 0:
            self._close(node)

    def let_go(self, node: Inode) -> None:
        """Done with ``fd(node)`` outside :meth:`hold`: a transient fd is closed now."""
        if node.transient and node.busy == 0:
            self._close(node)

    def _close(self, node: Inode) -> None:
        if node.fd is not None and node.ino != pyfuse3.ROOT_INODE:
            fd, node.fd = node.fd, None
            if not node.transient:
                self.kept_fds -= 1
            os.close(fd)

    # -- finding --------------------------------------------------------------------------
    def remember(self, rel: bytes | None, st: os.stat_result, parent: int, name: bytes,
                 lookups: int = 1, fd: int | None = None) -> Inode:
        """The inode for the SOURCE object ``st``, seen as ``name`` in directory inode
        ``parent`` (path ``rel``), counting ``lookups`` more kernel references (0 for a
        tentative entry: see :meth:`drop_if_unused`). ``fd``, an O_PATH fd of that very
        object, is adopted or closed."""
        key = (st.st_dev, st.st_ino)
        if key == self.root.key:
            if fd is not None:
                os.close(fd)
            self.root.lookups += lookups
            return self.root
        node = self.by_key.get(key)
        if node is not None and node.file_type != stat.S_IFMT(st.st_mode):
            # SOURCE reused an inode number for an object of another type: the old one is
            # gone; the new one must not look like a file turned into a directory.
            self._detach(node)
            node = None
        if node is None:
            number = self.number(key)
            if number in self.by_ino:  # only after a reuse as above
                number = self._next_foreign
                self._next_foreign += 1
            node = Inode(number, key, file_type=stat.S_IFMT(st.st_mode))
            node.transient = st.st_dev != self.root_dev
            self.by_ino[node.ino] = node
            self.by_key[key] = node
        if fd is not None:
            if node.fd is None and not node.transient and self.kept_fds < self.max_fds:
                node.fd = fd
                self.kept_fds += 1
            else:
                os.close(fd)
        node.parent, node.name = parent, name
        if rel is None:  # found in a directory that has no name left
            node.lookups += lookups
            return node
        if self.by_path.get(rel) is not node:
            self._add_path(node, rel)
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            for name_seen in node.paths:  # including those seen while it had one link
                self._linked(key, name_seen)
        node.lookups += lookups
        return node

    def _linked(self, key: tuple[int, int], rel: bytes) -> None:
        names = self.links.get(key)
        if names is None:
            if len(self.links) >= MAX_LINKED:
                self.links.pop(next(iter(self.links)))
            names = self.links[key] = []
        if rel not in names:
            names.append(rel)
            del names[:-MAX_PATHS * 4]

    def names_of(self, node: Inode) -> list[bytes]:
        """Every name ``node`` is known under, newest last (hard links included)."""
        names = [p for p in self.links.get(node.key, ()) if p not in node.paths]
        return names + node.paths

    def _add_path(self, node: Inode, rel: bytes) -> None:
        previous = self.by_path.get(rel)
        if previous is not None and previous is not node and rel in previous.paths:
            previous.paths.remove(rel)  # the name now means another object
        self.by_path[rel] = node
        for old in node.add_path(rel):
            if self.by_path.get(old) is node:
                del self.by_path[old]

    def _detach(self, node: Inode) -> None:
        """``node``'s object is gone from SOURCE: unreachable by key and path from now."""
        if self.by_key.get(node.key) is node:
            del self.by_key[node.key]
        for rel in node.paths:
            if self.by_path.get(rel) is node:
                del self.by_path[rel]
        node.paths = []

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
            if self.by_ino.get(node.ino) is node:
                del self.by_ino[node.ino]
            self._detach(node)
            node.dropped = True
            if node.busy == 0:
                self._close(node)

    def release_handle(self, node: Inode, handle: int) -> None:
        node.handles.discard(handle)
        self._maybe_drop(node)

    def unlinked(self, rel: bytes, is_dir: bool = True) -> None:
        """``rel`` no longer names anything: drop it (and, for a directory, anything below
        it) from every inode. A file costs one dict lookup; a directory a full pass."""
        if not is_dir:
            node = self.by_path.pop(rel, None)
            if node is not None:
                if rel in node.paths:
                    node.paths.remove(rel)
                names = self.links.get(node.key)
                if names is not None and rel in names:
                    names.remove(rel)
            return
        for node in list(self.by_ino.values()):
            if node is not self.root:
                node.paths = [p for p in node.paths if not is_under(p, rel)]
        for key, names in list(self.links.items()):
            self.links[key] = [p for p in names if not is_under(p, rel)]
        self._reindex_paths()

    def _reindex_paths(self) -> None:
        self.by_path = {p: node for node in self.by_ino.values() if node is not self.root
                        for p in node.paths}

    @staticmethod
    def _moved(paths: list[bytes], moves: list[tuple[bytes, bytes]]) -> list[bytes]:
        out = []
        for p in paths:
            for old, new in moves:
                if is_under(p, old):
                    p = new + p[len(old):]
                    break
            out.append(p)
        return out

    def renamed(self, moves: list[tuple[bytes, bytes]], dirs: bool = True) -> None:
        """Apply simultaneous renames ``[(old, new), ...]`` to every known path. ``dirs``
        False (no directory among the objects moved): nothing lies below them, so only the
        inodes named by the moved paths change -- dict lookups, not a pass over every inode."""
        if not dirs:
            nodes = {id(n): n for n in (self.by_path.get(old) for old, _ in moves) if n is not None}
            for node in nodes.values():
                for old in node.paths:
                    if self.by_path.get(old) is node:
                        del self.by_path[old]
                node.paths = self._moved(node.paths, moves)
                names = self.links.get(node.key)
                if names is not None:
                    self.links[node.key] = self._moved(names, moves)
            for node in nodes.values():
                for rel in node.paths:
                    self.by_path[rel] = node
            return
        for node in self.by_ino.values():
            if node is not self.root:
                node.paths = self._moved(node.paths, moves)
        for key, names in self.links.items():
            self.links[key] = self._moved(names, moves)
        self._reindex_paths()
