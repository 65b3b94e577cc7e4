"""The command lines of ``journalfs mount`` and ``umount`` (their work:
:mod:`journalfs.commands.mount`).
"""
from __future__ import annotations

from ..commands.parsing import examples, runs
from ..options import DEFAULT_READAHEAD_KIB, DEFAULT_TIMEOUT, SYNC_MODES


MOUNT_DESCRIPTION = """\
Mirror SOURCE at MOUNTPOINT. Every file operation lands in SOURCE; every file and directory
also carries key/value metadata as user.metadata.KEY extended attributes, kept in a gvfs-format
metadata store (by default one of its own per SOURCE under ~/.local/share/journalfs/stores/).
Every journal file in SOURCE shows, read-only, as one file per record under
MOUNTPOINT/.journalfs/records/; MOUNTPOINT/.journalfs/status.json describes the mount.

The command returns once the mount is usable (the daemon stays in the background) or prints
why it could not mount. Logs go to the system log (journald/syslog) when there is one, else to
journalfs.log in the store directory; status.json names the place ("log")."""

MOUNT_EPILOG = """\
Mount options (-o; also in /etc/fstab lines of type fuse.journalfs):
  store=DIR, sync=MODE, gvfs   as --store, --sync, --gvfs
  exclusive_store              as --exclusive-store
  log_file=PATH                as --log-file
  ro, rw                       read-only mount (metadata too), or read-write (default)
  remount                      change a mounted journalfs: mount -o remount,ro MOUNTPOINT,
                               journalfs mount -o remount,rw,timeout=5 MOUNTPOINT; ro/rw,
                               the kernel flags (root), timeout=, sync=MODE, debug,
                               quota_*= and readahead= change, options fixed when
                               mounting may only be repeated
  allow_other                  let other users in (the kernel checks their permissions)
  allow_root                   let root in besides the owner
  auto_unmount                 unmount by itself when the daemon dies
  nonempty                     mount over a non-empty MOUNTPOINT
  dev, suid (root only), exec, noexec, nodev, nosuid, atime, noatime,
  sync, async, dirsync         kernel mount flags, as on any filesystem (default:
                               nodev,nosuid,relatime); plain "sync" is the kernel's
                               synchronous writes, "sync=MODE" the metadata durability
  timeout=SECONDS              kernel cache of names and attributes (default %(timeout)s;
                               also entry_timeout=, attr_timeout=)
  readahead=KIB                kernel readahead (as root; default %(readahead)s, 0: the kernel's)
  writeback_cache              the kernel's writeback cache (default off): faster small
                               writes, but SOURCE changes to a file open through the
                               mount stay unseen until it is closed (no_writeback_cache)
  fsname=NAME                  the source column of mount(8) and df (default: SOURCE)
  quota_file=SIZE, quota_user=SIZE, quota_total=SIZE
                               metadata quota: one file's, one uid's, everyone's
                               (default 4K, 16M, 64M; K, M, G, T accepted)
  debug                        as --debug

Options journalfs cannot honour (strictatime, lazytime, max_read=, uid=, direct_io, ...) are refused with
the reason; fstab-only options (noauto, nofail, user, _netdev, x-systemd.*) are ignored.

Caching: everything changed through the mount is seen at once (journalfs invalidates it); a
change made directly in SOURCE behind the mount may stay unseen for up to the timeout. Use
-o timeout=0 when SOURCE is also changed by others and must be seen immediately (slower).

Runtime settings: getfattr -d MOUNTPOINT/.journalfs shows them; the mount's owner changes
them with setfattr: user.journalfs.timeout, user.journalfs.sync, user.journalfs.log_level,
user.journalfs.rotate (write 1 to rotate the store now) and user.journalfs.quota_file,
quota_user, quota_total (bytes).

""" % {"timeout": f"{DEFAULT_TIMEOUT:g}", "readahead": DEFAULT_READAHEAD_KIB} + examples(
    "journalfs mount /data /mnt/data",
    "journalfs mount /data /mnt/data -o allow_other,noatime,sync=always",
    "journalfs mount --gvfs ~/Documents ~/mnt/docs     # share GNOME's metadata, live",
    "journalfs mount -f -d /data /mnt/data              # stay attached, trace requests",
    "journalfs mount -o remount,ro /mnt/data            # read-only now (mount -o remount,ro too)",
    "getfattr -d MOUNTPOINT/.journalfs")

UMOUNT_DESCRIPTION = """\
Unmount a journalfs mount (other filesystems are left alone), then wait until its daemon has
made the metadata durable and exited. A busy mount (a process has a file open or its working
directory there) is not unmounted: find the processes with fuser -vm MOUNTPOINT, or detach
it at once with -z; the daemon then exits when the last file is closed."""


def add_parser(sub) -> None:
    p = sub.add_parser("mount", help="mirror SOURCE at MOUNTPOINT with metadata xattrs and "
                       "journal views", description=MOUNT_DESCRIPTION, epilog=MOUNT_EPILOG)
    p.add_argument("source", metavar="SOURCE", help="directory to mirror")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?",
                   help="empty directory to mount on (with -o remount: SOURCE may be left "
                        "out, as in journalfs mount -o remount,ro MOUNTPOINT)")
    p.add_argument("--store", metavar="DIR",
                   help="gvfs-style metadata directory to use (its home/root trees; a "
                        "~/.local/share/gvfs-metadata works)")
    p.add_argument("--gvfs", action="store_true",
                   help="share the running gvfsd-metadata of the user's session (Nautilus and "
                        "gio see the same metadata, live, on SOURCE's paths and on the mount's)")
    p.add_argument("--sync", choices=SYNC_MODES,
                   help="metadata durability: always = fdatasync before each call returns, "
                        "batch = within 1 s (default), none = at rotation and unmount")
    p.add_argument("--exclusive-store", action="store_true",
                   help="refuse a gvfs --store directory when no session bus of its owner is "
                        "reachable (a gvfsd-metadata starting later could write it too)")
    p.add_argument("--foreground", "-f", action="store_true",
                   help="stay attached to the terminal and log to it")
    p.add_argument("--debug", "-d", dest="trace", action="store_true",
                   help="log every FUSE request and its answer (debug level; use with -f to "
                        "see them), and show tracebacks")
    p.add_argument("--log-file", metavar="PATH",
                   help="write the log to PATH instead of the system log")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                   help="comma-separated mount options (listed below)")
    p.set_defaults(run=runs("mount", "run_mount"))

    u = sub.add_parser("umount", help="unmount a journalfs mount and wait for its daemon",
                       description=UMOUNT_DESCRIPTION,
                       epilog=examples("journalfs umount /mnt/data",
                                       "journalfs umount -z /mnt/data     # busy: detach now",
                                       "fuser -vm /mnt/data               # who keeps it busy"))
    u.add_argument("mountpoint", metavar="MOUNTPOINT", help="where the journalfs mount is")
    u.add_argument("--lazy", "-z", action="store_true",
                   help="detach now even if busy; the daemon exits when the last open file "
                        "is closed")
    u.set_defaults(run=runs("mount", "run_umount"))
