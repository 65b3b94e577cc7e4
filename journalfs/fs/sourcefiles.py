"""Opening files under SOURCE for the views, never leaving SOURCE and never blocking.

The daemon runs as root over a tree other users write. Every path below SOURCE is walked one
component at a time from a directory fd opened once at mount time, each step with
``O_PATH | O_DIRECTORY | O_NOFOLLOW``: a component swapped for a symlink (or anything but a
directory) ends the walk with an error instead of leading elsewhere. A journal is first
opened with ``O_PATH | O_NOFOLLOW`` (no side effects even on a device or FIFO), checked with
fstat to be a regular file, and only then re-opened for reading through that very inode
(``/proc/self/fd``), with ``O_NONBLOCK``. Anything that is not a regular file is not a journal.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Iterator

_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
_DIR_STEP = _PATH_FLAGS | os.O_DIRECTORY | os.O_NOFOLLOW
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
ACL_ACCESS = "system.posix_acl_access"


class NotRegularFile(OSError):
    """The name is there but is not a regular file (symlink, FIFO, device, socket, dir)."""

    def __init__(self, rel: bytes, mode: int):
        super().__init__(errno.ENOENT, f"not a regular file (mode {stat.filemode(mode)})",
                         os.fsdecode(rel))


def _components(rel: bytes) -> list[bytes]:
    parts = [p for p in rel.split(b"/") if p]
    for part in parts:
        if part in (b".", b".."):
            raise OSError(errno.ENOENT, "path component . or .. refused", os.fsdecode(rel))
    return parts


class SourceTree:
    """SOURCE, reached only through the directory fd :attr:`root_fd`."""

    def __init__(self, root: str | bytes):
        # The mount's own argument (often /proc/self/fd/N of a fd opened before mounting):
        # the one path that is trusted and followed.
        self.root_fd = os.open(root, _PATH_FLAGS | os.O_DIRECTORY)

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    # -- directories -------------------------------------------------------------------------
    def open_dir(self, rel: bytes) -> int:
        """An O_PATH fd of the directory SOURCE/``rel`` (caller closes it)."""
        fd = os.open(".", _PATH_FLAGS | os.O_DIRECTORY, dir_fd=self.root_fd)
        try:
            for part in _components(rel):
                child = os.open(part, _DIR_STEP, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _parent(self, rel: bytes) -> tuple[int, bytes]:
        """(fd of the directory holding ``rel``, ``rel``'s last component)."""
        parts = _components(rel)
        if not parts:
            raise OSError(errno.EINVAL, "SOURCE itself has no parent", os.fsdecode(rel))
        return self.open_dir(b"/".join(parts[:-1])), parts[-1]

    def lstat(self, rel: bytes) -> os.stat_result:
        """lstat of SOURCE/``rel`` (SOURCE itself for ``b""``), reached without following."""
        if not _components(rel):
            return os.stat(self.root_fd)
        dfd, name = self._parent(rel)
        try:
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)

    def access(self, rel: bytes, mode: int) -> bool:
        """faccessat(AT_EACCESS) of SOURCE/``rel``: whether this thread's fsuid/fsgid/groups
        may access it with ``mode`` (R_OK, X_OK), as the kernel decides (ACLs included)."""
        if not _components(rel):
            return os.access(".", mode, dir_fd=self.root_fd, effective_ids=True)
        dfd, name = self._parent(rel)
        try:
            return os.access(name, mode, dir_fd=dfd, effective_ids=True, follow_symlinks=False)
        finally:
            os.close(dfd)

    def _readable_dir(self, rel: bytes) -> int:
        """A readable fd of the directory SOURCE/``rel`` (reached with no symlink followed)."""
        dfd = self.open_dir(rel)
        try:
            return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)

    def listdir(self, rel: bytes) -> list[bytes]:
        """Names in the directory SOURCE/``rel``."""
        fd = self._readable_dir(rel)
        try:
            return [os.fsencode(n) for n in os.listdir(fd)]
        finally:
            os.close(fd)

    def scan(self, rel: bytes) -> Iterator[tuple[bytes, os.stat_result]]:
        """(name, lstat) of every entry of the directory SOURCE/``rel``; entries that vanish
        meanwhile are skipped."""
        fd = self._readable_dir(rel)
        try:
            with os.scandir(fd) as it:
                entries = [(os.fsencode(e.name), e) for e in it]
            for name, entry in entries:
                try:
                    yield name, entry.stat(follow_symlinks=False)
                except OSError:
                    continue
        finally:
            os.close(fd)

    def _path_fd(self, rel: bytes) -> int:
        """An O_PATH fd of SOURCE/``rel`` itself (a final symlink is the symlink, never its
        target); the caller closes it."""
        dfd, name = self._parent(rel)
        try:
            return os.open(name, _PATH_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
        finally:
            os.close(dfd)

    def access_acl(self, rel: bytes) -> bytes | None:
        """The raw ``system.posix_acl_access`` of the directory or regular file SOURCE/``rel``
        (SOURCE itself for ``b""``), read through an O_PATH fd of that very inode; None when
        it has none (or is anything else: a symlink swapped in is never followed)."""
        fd = self._path_fd(rel) if _components(rel) else \
            os.open(".", _PATH_FLAGS | os.O_DIRECTORY, dir_fd=self.root_fd)
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return None
            try:
                return os.getxattr(f"/proc/self/fd/{fd}", ACL_ACCESS)
            except OSError as exc:
                if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP):
                    return None
                raise
        finally:
            os.close(fd)

    # -- regular files -------------------------------------------------------------------------
    def open_regular(self, rel: bytes) -> int:
        """A read-only, non-blocking fd of the regular file SOURCE/``rel`` (caller closes it).
        Raises :class:`NotRegularFile` for anything else, never opening it for reading."""
        path_fd = self._path_fd(rel)
        try:
            return reopen_regular(path_fd, rel)
        finally:
            os.close(path_fd)


def reopen_regular(path_fd: int, rel: bytes | str = b"") -> int:
    """Open for reading the inode an O_PATH fd stands for, when it is a regular file."""
    mode = os.fstat(path_fd).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(os.fsencode(rel), mode)
    return os.open(f"/proc/self/fd/{path_fd}", _READ_FLAGS)


def open_regular_path(path: str | bytes) -> int:
    """A read-only, non-blocking fd of the regular file at ``path``, its last component not
    followed (for files the daemon itself keeps, such as the store's journal)."""
    path_fd = os.open(path, _PATH_FLAGS | os.O_NOFOLLOW)
    try:
        return reopen_regular(path_fd, os.fsencode(path))
    finally:
        os.close(path_fd)


__all__ = ["NotRegularFile", "SourceTree", "open_regular_path", "reopen_regular"]
