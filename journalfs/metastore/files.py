"""The files of a store directory, handled so that nothing in it can be turned against root.

A store is a directory holding ``<name>`` (the tree), ``<name>-<tag>.log`` (its journal),
``<name>.journalfs-lock`` and, during a rotation, ``<name>.XXXXXX`` temp trees. Every one of
them is opened relative to the directory's fd with O_NOFOLLOW|O_CLOEXEC and checked with fstat
(a regular file, and -- for a writer -- owned by us); the daemon writes only through fds it
opened itself. A writer refuses a directory that another user can write, as ssh refuses such a
``~/.ssh``: that user could otherwise plant or swap the files root writes.
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import secrets
import stat
import string
from typing import Any

from ..formats.gvfs_journal import journal_name  # the one naming rule

# every open of a store file: never through a symlink, never inherited by a child
O_STORE = os.O_NOFOLLOW | os.O_CLOEXEC
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_SUFFIX = ".journalfs-lock"
TREE_HEADER_PROBE = 32
TREE_MAGIC = b"\xda\x1ameta"
_TEMP_CHARS = string.ascii_letters + string.digits


class UnsafeStoreDir(PermissionError):
    """A store directory (or one of its parents) that another user could change under us."""


def journal_path_for(tree_path: str, tag: int) -> str:
    return journal_name(tree_path, tag)


def lock_path_for(tree_path: str) -> str:
    return tree_path + LOCK_SUFFIX


def write_all(fd: int, data, offset: int | None = None) -> None:
    """Write every byte (a short write is continued; a write of 0 bytes is ENOSPC), so a
    full disk always surfaces as an OSError instead of a silently short file."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        chunk = view[done:]
        n = os.write(fd, chunk) if offset is None else os.pwrite(fd, chunk, offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


def _unsafe_reason(st: os.stat_result, euid: int, final: bool, hidden: bool) -> str | None:
    """Why a directory on the way to a store is unsafe, or None. ``hidden``: an ancestor only
    its trusted owner can search, so nobody else can reach this parent to use its write bits
    (e.g. /root/.local made 0777 inside a 0700 /root); the store directory itself must still
    not be writable by others."""
    if st.st_uid not in (0, euid):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and (final or not (hidden or st.st_mode & stat.S_ISVTX)):
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _private(st: os.stat_result, euid: int) -> bool:
    """Only its owner (root or us) can search this directory."""
    return st.st_uid in (0, euid) and not st.st_mode & 0o011


def _open_chain(path: str, create: bool, check: bool) -> int:
    """An fd of directory ``path``, reached from "/" one component at a time with O_NOFOLLOW
    (after resolving the symlinks the path names when we start: a component that becomes a
    symlink later is refused). Missing components are made 0700 when ``create``. With
    ``check`` each directory on the way must be safe (see :func:`_unsafe_reason`; parents
    with the sticky bit, such as /tmp, may be writable by all)."""
    real = os.path.realpath(path)
    euid = os.geteuid()
    parts = [p for p in real.split("/") if p]
    hidden = False  # below a directory only its trusted owner can search
    # parents need only search permission (O_PATH); the store directory itself is read
    fd = os.open("/", O_DIR if not parts else O_DIR | os.O_PATH)
    try:
        for i, name in enumerate(parts):
            final = i == len(parts) - 1
            flags = O_DIR if final else O_DIR | os.O_PATH
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(name, flags, dir_fd=fd)
                if final:
                    os.fchmod(nxt, 0o700)  # whatever the umask (the daemon runs with umask 0)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/" + "/".join(parts[:i + 1])
                    try:
                        plain = not stat.S_ISLNK(os.stat(name, dir_fd=fd,
                                                         follow_symlinks=False).st_mode)
                    except OSError:
                        plain = False
                    if plain:  # e.g. --store naming a file: no race, just not a directory
                        raise NotADirectoryError(
                            errno.ENOTDIR, f"metadata store directory {real}: "
                            f"{where} is not a directory") from None
                    raise UnsafeStoreDir(errno.EPERM, f"metadata store directory {real}: "
                                         f"{where} changed into a symlink while being "
                                         "opened") from None
                raise
            os.close(fd)
            fd = nxt
            if check:
                st = os.fstat(fd)
                why = _unsafe_reason(st, euid, final, hidden)
                hidden = hidden or _private(st, euid)
                if why:
                    where = "/" + "/".join(parts[:i + 1])
                    advice = "chmod go-w" if "writable" in why else "chown"
                    raise UnsafeStoreDir(errno.EPERM, f"refusing metadata store directory {real}: "
                                         f"{where} is {why} ({advice} {where}, as for ~/.ssh)")
        return fd
    except BaseException:
        os.close(fd)
        raise


class StoreDir:
    """An open store directory and the files of one tree in it.

    ``writer`` stores check the directory's safety and the ownership of every file they use."""

    def __init__(self, fd: int, path: str, tree_name: str, writer: bool):
        self.fd = fd
        self.path = path
        self.tree_name = tree_name
        self.writer = writer
        self.euid = os.geteuid()

    @classmethod
    def open(cls, tree_path: str, *, writer: bool, create: bool) -> "StoreDir":
        directory, name = os.path.split(os.path.abspath(tree_path))
        fd = _open_chain(directory, create=create and writer, check=writer)
        return cls(fd, directory, name, writer)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- names -----------------------------------------------------------------------------
    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def lock_name(self) -> str:
        return self.tree_name + LOCK_SUFFIX

    def journal_name(self, tag: int) -> str:
        return journal_name(self.tree_name, tag)

    # -- files -----------------------------------------------------------------------------
    def checked(self, fd: int, name: str) -> os.stat_result:
        """fstat ``fd`` (just opened as ``name``): a regular file, and ours when writing."""
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif self.writer and st.st_uid != self.euid:
            problem = f"is owned by uid {st.st_uid}, not by this store's user {self.euid}"
        if problem:
            os.close(fd)
            raise OSError(errno.EPERM, f"metadata store file {self.where(name)} {problem}")
        return st

    def open_file(self, name: str, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
        try:
            fd = os.open(name, flags | O_STORE | os.O_NONBLOCK, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, f"metadata store file {self.where(name)} is a "
                              "symlink: refusing to follow it") from None
            raise
        st = self.checked(fd, name)
        if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        return fd, st

    def create_new(self, name: str) -> int:
        """A new 0600 file of ours (O_EXCL: never an existing file or symlink)."""
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_STORE, 0o600, dir_fd=self.fd)
        os.fchmod(fd, 0o600)
        return fd

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.lstat(name) is not None

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def map_tree(self) -> tuple[Any, int, int | None]:
        """(read-only mapping of the tree, its inode, an fd of it): a writer keeps the fd
        (opened read-write) for rotation's in-place "rotated" mark on this very file; the
        mapping stays valid after a rename over the name."""
        fd, st = self.open_file(self.tree_name, os.O_RDWR if self.writer else os.O_RDONLY)
        try:
            buf = b"" if st.st_size == 0 else mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        if not self.writer:
            os.close(fd)
            return buf, st.st_ino, None
        return buf, st.st_ino, fd

    # -- the writer's lock -----------------------------------------------------------------
    def take_lock(self) -> int:
        """flock the lock file (made 0600 if new); it names our pid for ``meta`` to report.
        Raises BlockingIOError (EWOULDBLOCK) with the holder's words when someone holds it."""
        fd, _ = self.open_file(self.lock_name, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            exc.holder = holder  # type: ignore[attr-defined]  # read by store.py's StoreLocked
            raise
        try:
            os.ftruncate(fd, 0)
            write_all(fd, f"pid {os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the flock is the lock, the pid only a courtesy
        return fd

    # -- temp trees of a rotation ----------------------------------------------------------
    def create_temp_tree(self) -> tuple[int, str]:
        """A new ``<tree>.XXXXXX`` (gvfs's temp name). The suffix starts with a digit, so the
        next writer can tell it from the user's ``home.backup`` (see remove_stale_temp_trees)."""
        for _ in range(100):
            suffix = str(secrets.randbelow(10)) + "".join(secrets.choice(_TEMP_CHARS) for _ in range(5))
            name = f"{self.tree_name}.{suffix}"
            try:
                return self.create_new(name), name
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, f"{self.where(self.tree_name)}: no free temp tree name")

    def remove_stale_temp_trees(self) -> None:
        """Delete ``<tree>.XXXXXX`` temp trees a writer killed mid-rotation left behind. Only
        the writer holding the lock calls this, so no rotation of ours is in flight."""
        temp_name = re.compile(re.escape(self.tree_name) + r"\.[A-Za-z0-9_]{6}(?:[A-Za-z0-9_]{2})?")
        for name in os.listdir(self.fd):
            if temp_name.fullmatch(name) and self._looks_like_temp_tree(name):
                self.unlink(name)

    def _looks_like_temp_tree(self, name: str) -> bool:
        """A regular file of ours left unfinished: empty or still all zeros where the header
        goes (write_tree writes it last); or a finished tree never renamed into place, when
        its suffix is not a plain word (``home.backup`` may be the user's own copy)."""
        try:
            fd, _ = self.open_file(name, os.O_RDONLY)
        except OSError:
            return False
        try:
            head = os.pread(fd, TREE_HEADER_PROBE, 0)
        finally:
            os.close(fd)
        if not head.strip(b"\0"):
            return True
        return head.startswith(TREE_MAGIC) and not name.rsplit(".", 1)[1].isalpha()


def lock_holder(tree_path: str) -> int | None:
    """The pid the store's writer lock names (its holder wrote it there), or None."""
    try:
        store_dir = StoreDir.open(tree_path, writer=False, create=False)
    except OSError:
        return None
    try:
        fd, _ = store_dir.open_file(store_dir.lock_name, os.O_RDONLY)
        try:
            words = os.pread(fd, 200, 0).split()
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        store_dir.close()
    return int(words[1]) if len(words) >= 2 and words[0] == b"pid" and words[1].isdigit() else None
