"""The Linux calls the mirror needs beyond ``os``: ``*at()`` variants with AT_EMPTY_PATH on
O_PATH fds, renameat2, statx's inode flags, fstatfs's filesystem type, the fd limit.
Each raises ``OSError`` with the call's errno."""
from __future__ import annotations

import ctypes
import errno
import os
import resource
import struct
from typing import NamedTuple

libc = ctypes.CDLL(None, use_errno=True)
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100
_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400
IS_ROOT = os.geteuid() == 0
#: statfs f_type of local filesystems: syscalls there are cheaper inline than a thread hop,
#: and close(2) flushes nothing (no deferred write errors): ext2/3/4, xfs, btrfs, tmpfs, f2fs.
LOCAL_FS_TYPES = {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010}


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def fs_type(fd: int) -> int | None:
    buf = _Statfs()
    if libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


def check(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int) -> None:
    check(libc.renameat2(old_dir, old, new_dir, new, ctypes.c_uint(flags)))


def chown_fd(fd: int, uid: int, gid: int) -> None:
    """chown of the object an O_PATH fd stands for (a symlink itself, too)."""
    check(libc.fchownat(fd, b"", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utime_fd(fd: int, atime_ns: int, mtime_ns: int) -> None:
    times = (_Timespec * 2)(_Timespec(*divmod(atime_ns, 10**9)),
                            _Timespec(*divmod(mtime_ns, 10**9)))
    check(libc.utimensat(fd, b"", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))


_STATX_FROZEN = 0x10 | 0x20


def frozen(fd: int) -> bool:
    """Whether the object of O_PATH ``fd`` is immutable or append-only (chattr +i/+a):
    statx reports the inode flags without opening the file (no lease break, no FIFO wait)."""
    buf = ctypes.create_string_buffer(256)
    check(libc.statx(fd, b"", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, 0, buf))
    return bool(int.from_bytes(buf.raw[8:16], "little") & _STATX_FROZEN)


def proc_path(fd: int) -> bytes:
    """The kernel's link to exactly the object ``fd`` stands for (no path walk)."""
    return b"/proc/self/fd/%d" % fd


def link_fd(fd: int, dir_fd: int, name: bytes) -> None:
    """A new name ``name`` in ``dir_fd`` for the object of O_PATH ``fd``."""
    if IS_ROOT:  # linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH
        check(libc.linkat(fd, b"", dir_fd, name, AT_EMPTY_PATH))
    else:  # the proc link leads to the same object
        check(libc.linkat(_AT_FDCWD, proc_path(fd), dir_fd, name, _AT_SYMLINK_FOLLOW))


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
#: openat2's RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH
_RESOLVE_STRICT = 0x02 | 0x04 | 0x08
_openat2 = [True]  # False once the kernel said ENOSYS
_HOW_SIZE = ctypes.sizeof(_OpenHow)


def stat_beneath(dir_fd: int, rel: bytes) -> os.stat_result:
    """lstat of ``rel`` below the directory ``dir_fd``, no symlink followed on the way
    (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: ELOOP where one is met, the last
    component included): what the mirror's own lookups would reach by that path now."""
    if _openat2[0]:
        how = _OpenHow(os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, 0, _RESOLVE_STRICT)
        fd = libc.syscall(_SYS_OPENAT2, dir_fd, rel, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            try:
                return os.fstat(fd)
            finally:
                os.close(fd)
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), rel)
        _openat2[0] = False
    parts = rel.split(b"/")  # before Linux 5.6: one component at a time
    fd = dir_fd
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                              dir_fd=fd)
            if fd != dir_fd:
                os.close(fd)
            fd = next_fd
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    finally:
        if fd != dir_fd:
            os.close(fd)


_HOW_STRICT = _OpenHow(os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, 0, _RESOLVE_STRICT)
_STATX_IDENTITY = 0x1 | 0x2 | 0x8 | 0x100 | 0x800  # TYPE | MODE | UID | INO | BTIME
_STATX_BTIME = 0x800
#: struct statx: mask, attributes, uid, mode, ino, btime (sec, nsec), dev (major, minor)
_STATX_FIELDS = struct.Struct("=I4xQ4xI4xH2xQ40xqI4x40xII")
_StatxBuf = ctypes.c_char * 256
_HOW_STRICT_REF = ctypes.byref(_HOW_STRICT)
_STATX_EMPTY_NOFOLLOW = AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW
_syscall, _statx = libc.syscall, libc.statx
_new_tuple = tuple.__new__


class BeneathStat(NamedTuple):
    """What :func:`statx_beneath` reports of the object a path names."""
    dev: int
    ino: int
    mode: int
    uid: int
    btime_ns: int  # 0 where the filesystem keeps no birth time
    frozen: bool  # immutable or append-only (chattr +i/+a)


def statx_beneath(dir_fd: int, rel: bytes) -> BeneathStat:
    """:func:`stat_beneath` (no symlink followed, nothing outside ``dir_fd``) with what
    statx adds -- birth time and inode flags -- in three syscalls: openat2, statx, close.
    OSError(ENOSYS) on kernels without openat2 (callers take stat_beneath's way)."""
    if not _openat2[0]:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    # (every setxattr of user.metadata.* comes here: the argument objects are made once,
    # the result built as a plain tuple; ctypes' argtypes would convert more slowly)
    fd = _syscall(_SYS_OPENAT2, dir_fd, rel, _HOW_STRICT_REF, _HOW_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    buf = _StatxBuf()
    try:
        failed = _statx(fd, b"", _STATX_EMPTY_NOFOLLOW, _STATX_IDENTITY, buf)
    finally:
        os.close(fd)
    if failed:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    mask, attributes, uid, mode, ino, btime_s, btime_ns, major, minor = \
        _STATX_FIELDS.unpack_from(buf)
    return _new_tuple(BeneathStat, (os.makedev(major, minor), ino, mode, uid,
                                    btime_s * 1_000_000_000 + btime_ns if mask & _STATX_BTIME
                                    else 0, bool(attributes & _STATX_FROZEN)))


def raise_fd_limit() -> None:
    """One O_PATH fd per inode the kernel holds: allow as many as the system does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if IS_ROOT:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                want = max(hard, int(f.read()))
        except (OSError, ValueError):
            pass
    for limit in ((want, want), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return
        except (ValueError, OSError):
            continue
