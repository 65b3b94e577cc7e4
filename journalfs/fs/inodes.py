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

Open by file handle (``open_by_handle_at``, NFS export): the kernel's handle of a file on the
mount is our inode number. When the kernel has forgotten that inode, it asks for it again as
LOOKUP(number, "."). So that a forgotten inode can be found again, a forget keeps (bounded,
``MAX_FORGOTTEN``, oldest dropped first) the object's SOURCE file handle, taken from its
O_PATH fd before the fd is closed (one syscall per forget, nothing on lookups), and its newest
names. :meth:`InodeTable.find_forgotten` opens the handle (root only: CAP_DAC_READ_SEARCH),
takes the path the kernel reconnected it at (handles of files are "connectable", so the
kernel finds their directory), and accepts it only when walking that path down from SOURCE's
own fd, one component at a time and following no symlink, reaches the very same object: a
handle can never reach anything outside SOURCE. Without the handle (not root) the names kept
are walked the same way. A deleted file is ESTALE; so is a file whose every name known
to journalfs is gone while its other hard links, never seen through the mount, all lie in
other directories (the kernel cannot reconnect its handle, and nothing else proves that it
is still inside SOURCE).
"""
from __future__ import annotations

import ctypes
import errno
import itertools
import os
import resource
import stat
import struct
from collections import OrderedDict
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
#: Numbers of objects on other filesystems below SOURCE remembered across forgets; beyond
#: this, the oldest of objects the kernel no longer holds are forgotten (the object gets a
#: new number if it is looked up again: nothing holds the old one any more).
MAX_FOREIGN = 100_000
O_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
#: Forgotten inodes that open-by-handle and NFS can still reach (each about 300 bytes: a
#: 24-byte SOURCE handle, its key and up to two names); older ones are ESTALE.
MAX_FORGOTTEN = 100_000
#: Names kept per forgotten inode (tried when the handle cannot be used).
FORGOTTEN_NAMES = 2

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400
_AT_HANDLE_CONNECTABLE = 0x002  # Linux 6.13: the handle names the file's directory too
_MAX_HANDLE_SZ = 128


def source_handle(fd: int, is_dir: bool) -> bytes | None:
    """The file handle (``struct file_handle`` bytes) of the object O_PATH ``fd`` stands for,
    connectable for non-directories when the kernel can; None when SOURCE's filesystem has
    no handles. Through /proc/self/fd/N, which resolves to exactly that object (a symlink
    itself, too)."""
    path = b"/proc/self/fd/%d" % fd
    for flags in ((0,) if is_dir else (_AT_HANDLE_CONNECTABLE, 0)):
        buf = ctypes.create_string_buffer(8 + _MAX_HANDLE_SZ)
        struct.pack_into("I", buf, 0, _MAX_HANDLE_SZ)
        mount_id = ctypes.c_int()
        if _libc.name_to_handle_at(_AT_FDCWD, path, buf, ctypes.byref(mount_id),
                                   _AT_SYMLINK_FOLLOW | flags) == 0:
            size = struct.unpack_from("I", buf, 0)[0]
            return buf.raw[:8 + size]
    return None


def open_handle(mount_fd: int, handle: bytes) -> int | None:
    """An O_PATH fd of the object ``handle`` names, or None (gone, not root, ...)."""
    fd = _libc.open_by_handle_at(mount_fd, handle, os.O_PATH | os.O_CLOEXEC)
    return fd if fd >= 0 else None


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What is kept of an inode the kernel forgot, to find it again by number."""
    key: tuple[int, int]
    file_type: int
    handle: bytes | None
    names: tuple[bytes, ...]


def stale() -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(errno.ESTALE)


#: The handles of an inode with none open: shared, so 100k listed inodes carry no set each.
NO_HANDLES: frozenset[int] = frozenset()


# slots: a huge listing makes 100k of these; without a __dict__ each is one object for the
# garbage collector to walk instead of two, and ~40% smaller (docs/security.md, "Slower").
@dataclass(eq=False, slots=True)
class Inode:
    ino: int
    key: tuple[int, int] | None  # (st_dev, st_ino) of the SOURCE object
    paths: list[bytes] = field(default_factory=list)  # relative to SOURCE, b"" = root
    lookups: int = 0
    handles: set[int] | frozenset[int] = NO_HANDLES  # open file handles: see open_handle
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
    # The kernel asked for its ACL (which it then caches: enable_acl) since a READDIRPLUS
    # entry last carried its attributes (such an entry drops that cache): readdir sends it
    # by name only then, else with attributes (dirops.py)
    acl_cached: bool = False

    def open_handle(self, fh: int) -> None:
        if self.handles:
            self.handles.add(fh)
        else:
            self.handles = {fh}

    @property
    def path(self) -> bytes | None:
        """The most recently seen SOURCE path, None once every name is unlinked."""
        return self.paths[-1] if self.paths else None

    def add_path(self, rel: bytes) -> list[bytes] | tuple[()]:
        """Remember ``rel`` as the newest name; returns the names forgotten to make room."""
        paths = self.paths
        if rel in paths:
            paths.remove(rel)
        paths.append(rel)
        if len(paths) <= MAX_PATHS:  # nearly always: no copies made (every name listed)
            return ()
        dropped = paths[:-MAX_PATHS]
        del paths[:-MAX_PATHS]
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
            max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0] * 3 // 4
        self.max_fds = max_fds
        self.kept_fds = 0
        self.root_dev = st.st_dev
        self.by_ino: dict[int, Inode] = {}
        self.by_key: dict[tuple[int, int], Inode] = {}
        # path -> inode whose paths hold it: unlinking one file must not scan every inode
        self.by_path: dict[bytes, Inode] = {}
        self._foreign: dict[tuple[int, int], int] = {}  # (dev, ino) -> number, bounded
        self.max_foreign = MAX_FOREIGN
        self._next_foreign = FOREIGN_INO_BASE
        # (dev, ino) -> names of objects with several links, kept across forgets so that a
        # metadata write through one name reaches every name seen (see passthrough).
        self.links: dict[tuple[int, int], list[bytes]] = {}
        # number -> Forgotten, oldest first (MAX_FORGOTTEN)
        self.forgotten: OrderedDict[int, Forgotten] = OrderedDict()
        self._mount_fd: int | None = None  # open_by_handle_at wants a non-O_PATH fd
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
        foreign = self._foreign
        number = foreign.get(key)
        if number is None:
            number = foreign[key] = self._next_foreign
            self._next_foreign += 1
            if len(foreign) > self.max_foreign:
                self._forget_foreign()
        return number

    def _forget_foreign(self) -> None:
        """Bring the foreign numbers back under their bound: drop the oldest of objects no
        inode stands for now (those still in use move to the end)."""
        foreign, alive = self._foreign, self.by_key
        for old in list(itertools.islice(foreign, 64)):
            if len(foreign) <= self.max_foreign:
                return
            if old in alive:
                foreign[old] = foreign.pop(old)
            else:
                del foreign[old]

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
                 lookups: int = 1, fd: int | None = None, reuse: Inode | None = None) -> Inode:
        """The inode for the SOURCE object ``st``, seen as ``name`` in directory inode
        ``parent`` (path ``rel``), counting ``lookups`` more kernel references (0 for a
        tentative entry: see :meth:`drop_if_unused`). ``fd``, an O_PATH fd of that very
        object, is adopted or closed. ``reuse``: an inode of this object that was dropped
        (the kernel forgot it) and that a kept listing still holds; it stands for the object
        again, with the attributes built for it, when no other inode took its place."""
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
            if reuse is not None and reuse.dropped and reuse.key == key and \
                    reuse.file_type == stat.S_IFMT(st.st_mode) and \
                    reuse.ino not in self.by_ino and self.number(key) == reuse.ino:
                # after a huge listing the kernel forgets thousands of inodes that the next
                # listing brings back: no new objects for them (docs/security.md, "Slower")
                node = reuse
                node.dropped = False
                node.stat = node.meta_path = None  # seen again: nothing cached is trusted
            else:
                number = self.number(key)
                if number in self.by_ino:  # only after a reuse as above
                    number = self._next_foreign
                    self._next_foreign += 1
                node = Inode(number, key, file_type=stat.S_IFMT(st.st_mode))
                node.transient = st.st_dev != self.root_dev
            if self.forgotten:
                self.forgotten.pop(node.ino, None)
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
        previous = self.by_path.get(rel)
        if previous is not node:
            if previous is None and not node.paths:  # a new inode's first name (stat cold)
                self.by_path[rel] = node
                node.paths.append(rel)
            else:
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
        if node.lookups == 0:
            node.acl_cached = False  # the kernel's inode, and its cached ACL, are gone
            if not node.handles:
                self._keep_forgotten(node)
        self._maybe_drop(node)

    def _keep_forgotten(self, node: Inode) -> None:
        """Remember how to find ``node`` again once dropped (see the module's docstring)."""
        if node.key is None or node.key[0] != self.root_dev or node.ino != node.key[1]:
            return  # only SOURCE's own filesystem's objects keep their numbers
        handle = None
        if node.fd is not None:
            try:
                handle = source_handle(node.fd, node.file_type == stat.S_IFDIR)
            except OSError:
                pass
        # e.g. a file whose name was unlinked while another hard link, not looked up, lives
        names = tuple(self.names_of(node)[-FORGOTTEN_NAMES:]) if node.paths or \
            node.key in self.links else ()
        if handle is None and not names:
            return
        forgotten = self.forgotten
        forgotten[node.ino] = Forgotten(node.key, node.file_type, handle, names)
        forgotten.move_to_end(node.ino)
        if len(forgotten) > MAX_FORGOTTEN:
            forgotten.popitem(last=False)

    # -- across mounts ----------------------------------------------------------------------
    # The kernel's handles of a mount stay valid across an unmount and mount of the same
    # SOURCE (our numbers are SOURCE's): at unmount the handles of every inode still known
    # are saved (at most MAX_FORGOTTEN, newest last), and the next mount of that SOURCE
    # loads them. The file is treated as hostile: it only proposes candidates, which
    # find_forgotten accepts only after its walk inside SOURCE reaches that very object.
    _SAVED_MAGIC = b"journalfs-handles 1\n"
    _SAVED_RECORD = struct.Struct("<QQQIH")  # number, st_dev, st_ino, file type, handle size

    def save_forgotten(self, path: str) -> None:
        for node in list(self.by_ino.values()):
            if node is not self.root:
                self._keep_forgotten(node)
        out = bytearray(self._SAVED_MAGIC)
        for ino, entry in self.forgotten.items():
            if entry.handle is not None and len(entry.handle) <= 8 + _MAX_HANDLE_SZ:
                out += self._SAVED_RECORD.pack(ino, entry.key[0], entry.key[1],
                                               entry.file_type, len(entry.handle))
                out += entry.handle
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, bytes(out))
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def load_forgotten(self, path: str) -> int:
        """Load what :meth:`save_forgotten` wrote; returns how many entries were taken."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                    st.st_size > MAX_FORGOTTEN * (self._SAVED_RECORD.size + 8 + _MAX_HANDLE_SZ):
                return 0
            data = os.read(fd, st.st_size)
        finally:
            os.close(fd)
        if not data.startswith(self._SAVED_MAGIC):
            return 0
        pos, taken, size = len(self._SAVED_MAGIC), 0, self._SAVED_RECORD.size
        while pos + size <= len(data) and taken < MAX_FORGOTTEN:
            ino, dev, st_ino, file_type, length = self._SAVED_RECORD.unpack_from(data, pos)
            pos += size
            handle = data[pos:pos + length]
            pos += length
            if len(handle) != length or length < 8 or dev != self.root_dev or ino != st_ino:
                break  # damaged: what came before stands
            if ino not in self.by_ino:
                self.forgotten[ino] = Forgotten((dev, st_ino), stat.S_IFMT(file_type), handle, ())
                taken += 1
        return taken

    def find_forgotten(self, ino: int) -> tuple[bytes, os.stat_result, int, int]:
        """(path, stat, O_PATH fd, parent's number) of the forgotten inode ``ino``, found
        again inside SOURCE; ESTALE when it cannot be (see the module's docstring).
        Syscalls only: the caller remembers it."""
        entry = self.forgotten.get(ino)
        if entry is None:
            raise stale()
        candidates = []
        if entry.handle is not None:
            real = self._handle_path(entry.handle)
            if real is not None:
                candidates.append(real)
        candidates += [n for n in reversed(entry.names) if n not in candidates]
        for rel in candidates:
            found = self.walk(rel)
            if found is None:
                continue
            fd, st, parent_key = found
            if (st.st_dev, st.st_ino) == entry.key and stat.S_IFMT(st.st_mode) == entry.file_type:
                return rel, st, fd, self.number(parent_key) if parent_key != self.root.key \
                    else pyfuse3.ROOT_INODE
            os.close(fd)
        raise stale()

    def _handle_path(self, handle: bytes) -> bytes | None:
        """The SOURCE-relative path the kernel reconnects ``handle`` at, or None."""
        if self._mount_fd is None:
            try:
                self._mount_fd = os.open(b"/proc/self/fd/%d" % self.root.fd,
                                         os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return None
        fd = open_handle(self._mount_fd, handle)
        if fd is None:
            return None
        try:
            real = os.readlink(b"/proc/self/fd/%d" % fd)
            top = os.readlink(b"/proc/self/fd/%d" % self.root.fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        top = top.rstrip(b"/") + b"/"
        return real[len(top):] if real.startswith(top) and len(real) > len(top) else None

    def walk(self, rel: bytes) -> tuple[int, os.stat_result, tuple[int, int]] | None:
        """(O_PATH fd, stat, key of its directory) of ``rel``, reached from SOURCE's fd one
        name at a time with no symlink followed, or None."""
        parts = rel.split(b"/")
        if any(p in (b"", b".", b"..") for p in parts):
            return None
        fd, parent_fd = self.root.fd, None
        try:
            for part in parts:
                next_fd = os.open(part, O_PATH_FLAGS, dir_fd=fd)
                if parent_fd is not None:
                    os.close(parent_fd)
                parent_fd = fd if fd != self.root.fd else None
                fd = next_fd
            st = os.fstat(fd)
            up = os.fstat(parent_fd) if parent_fd is not None else os.fstat(self.root.fd)
            return fd, st, (up.st_dev, up.st_ino)
        except OSError:
            if fd != self.root.fd:
                os.close(fd)
            return None
        finally:
            if parent_fd is not None:
                os.close(parent_fd)

    def _maybe_drop(self, node: Inode) -> None:
        if node.lookups == 0 and not node.handles and node is not self.root:
            if self.by_ino.get(node.ino) is node:
                del self.by_ino[node.ino]
            self._detach(node)
            node.dropped = True
            if node.busy == 0:
                self._close(node)

    def release_handle(self, node: Inode, handle: int) -> None:
        if handle in node.handles:
            node.handles.discard(handle)
        if node.lookups == 0 and not node.handles and not node.dropped:
            self._keep_forgotten(node)
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
