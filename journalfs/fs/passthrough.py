"""The pyfuse3 Operations: SOURCE mirrored through, metadata as xattrs, views under /.journalfs.

Every request acts on the SOURCE object the kernel's inode stands for, never on a path
string: each inode holds an ``O_PATH|O_NOFOLLOW`` fd of its object (see inodes.py), names
are resolved one component at a time relative to the parent's fd with the ``*at()`` calls
and no symlink following, and calls that need a real fd on the object itself go through
``/proc/self/fd/N`` (the kernel's link to that exact object, no path walk). So a directory
swapped for a symlink in SOURCE, a long path or a reused fd number can never make the daemon
act on anything but what the caller reached.

Objects are created with the caller's fsuid/fsgid/groups (per thread, restored at once), so
ownership, setgid inheritance and the permission checks of SOURCE itself are native.

On a local SOURCE filesystem (by statfs f_type) syscalls run inline on the trio thread: a
thread hop costs more than the syscall. fsync, anything on a network/FUSE SOURCE and opens
of anything but regular files and directories run in worker threads.

``JournalFS`` is one class made of a core and one class per group of operations, each in its
module (as mergerfs keeps one operation group per file):

========================  ===========================================================
``mountcore.MountCore``   the mount's state; attributes, remembered stats, SOURCE calls
``storecalls.StoreCalls`` the metadata store from the handlers (errnos, values cache)
``nodeops.NodeOps``       lookup, forget, getattr, setattr, readlink, access, statfs
``nameops.NamespaceOps``  mkdir, rmdir, unlink, rename, symlink, link, mknod
``dirops.DirectoryOps``   opendir, readdir, releasedir, fsyncdir
``fileops.FileOps``       open, create, read, write, flush, fsync, release
``xattrops.XattrOps``     getxattr, setxattr, removexattr, listxattr
========================  ===========================================================

Requests for ``MNT/.journalfs`` go to ``fs/views.py``; every handler is guarded (fs/guards.py).
"""
from __future__ import annotations

from .dirops import DirectoryOps
from .fileops import FileOps
from .mountcore import SNAPSHOT_TTL
from .nameops import NamespaceOps
from .nodeops import NodeOps
from .xattrops import XattrOps

__all__ = ["JournalFS", "SNAPSHOT_TTL"]


class JournalFS(NodeOps, NamespaceOps, DirectoryOps, FileOps, XattrOps):
    """SOURCE passthrough + ``user.metadata.*`` xattrs backed by a metadata service."""

    # -o writeback_cache sets it per mount (fs/main.py assemble; README "FUSE" says why off)
    enable_writeback_cache = False
    # The kernel reads system.posix_acl_* through getxattr and enforces them itself, as on
    # SOURCE (with default_permissions, which the POSIX_ACL flag implies anyway).
    enable_acl = True
