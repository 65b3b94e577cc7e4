"""`journalfs mount SOURCE MOUNTPOINT` and `journalfs umount MOUNTPOINT`.

``mount`` daemonizes by default and returns only once the mount is usable (exit 0), or with
the daemon's one-line error (exit 1). ``--foreground`` stays attached and logs to stderr.
``umount`` unmounts only journalfs mounts (by their type in /proc/self/mountinfo), runs
``fusermount3 -u`` and waits (bounded) until the daemon has flushed and exited.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

# fs.main imports no pyfuse3/trio at module level: every CLI command loads this module.
from ..fs.main import (DEFAULT_READAHEAD_KIB, DEFAULT_TIMEOUT, MountConfig, MountError,
                       SYNC_MODES, OptionError, mount_entry, pidfile_for, preflight,
                       resolved_mountpoint)
from . import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .parsing import examples

UMOUNT_WAIT_SECONDS = 30.0
#: After a lazy unmount the daemon serves files still open; wait this long, then report.
LAZY_WAIT_SECONDS = 2.0
READY = b"OK\n"

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
                               the kernel flags (root), timeout=, sync=MODE, debug and
                               readahead= change, options fixed when mounting may only
                               be repeated
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
  fsname=NAME                  the source column of mount(8) and df (default: SOURCE)
  debug                        as --debug

Options journalfs cannot honour (strictatime, lazytime, max_read=, uid=, direct_io, ...) are refused with
the reason; fstab-only options (noauto, nofail, user, _netdev, x-systemd.*) are ignored.

Caching: everything changed through the mount is seen at once (journalfs invalidates it); a
change made directly in SOURCE behind the mount may stay unseen for up to the timeout. Use
-o timeout=0 when SOURCE is also changed by others and must be seen immediately (slower).

Runtime settings: getfattr -d MOUNTPOINT/.journalfs shows them; the mount's owner changes
them with setfattr: user.journalfs.timeout, user.journalfs.sync, user.journalfs.log_level,
and user.journalfs.rotate (write 1 to rotate the store now).

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
    p.set_defaults(run=run_mount)

    u = sub.add_parser("umount", help="unmount a journalfs mount and wait for its daemon",
                       description=UMOUNT_DESCRIPTION,
                       epilog=examples("journalfs umount /mnt/data",
                                       "journalfs umount -z /mnt/data     # busy: detach now",
                                       "fuser -vm /mnt/data               # who keeps it busy"))
    u.add_argument("mountpoint", metavar="MOUNTPOINT", help="where the journalfs mount is")
    u.add_argument("--lazy", "-z", action="store_true",
                   help="detach now even if busy; the daemon exits when the last open file "
                        "is closed")
    u.set_defaults(run=run_umount)


def build_config(args) -> MountConfig:
    # argv paths are str decoded with surrogateescape: abspath keeps any bytes as they are
    config = MountConfig(os.path.abspath(args.source), os.path.abspath(args.mountpoint))
    for text in args.options:
        config.apply_options(text)
    if args.store:
        config.store = args.store
    if args.gvfs:
        config.gvfs = True
    if args.exclusive_store:
        config.exclusive_store = True
    if args.sync:
        config.sync = args.sync
    if args.trace:
        config.debug = True
    if args.log_file:
        config.log_file = args.log_file
    if config.store:
        config.store = os.path.abspath(config.store)
    return config


def run_mount(args) -> int:
    from ..fs.remount import is_remount
    if is_remount(args.options):
        return run_remount(args)
    if args.mountpoint is None:
        print("journalfs mount: error: the following arguments are required: MOUNTPOINT "
              "(only -o remount takes a MOUNTPOINT alone)", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = build_config(args)
    except OptionError as exc:
        print(f"journalfs mount: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in preflight(config):  # MountError -> one line, exit 1 (cli.main)
        print(f"journalfs: warning: {warning}", file=sys.stderr)
    if args.foreground:
        from ..fs.main import run
        with _pidfile(config.mountpoint):
            run(config, foreground=True)
        return EXIT_OK
    return _daemonize(config)


def run_remount(args) -> int:
    """``-o remount,...``: change the running mount on MOUNTPOINT (fs/remount.py)."""
    from ..fs.remount import remount
    mountpoint = args.mountpoint or args.source  # mount(8) passes SOURCE MOUNTPOINT
    extra = [f"sync={args.sync}"] if args.sync else []
    if args.trace:
        extra.append("debug")
    for flag, name in ((args.store, "--store"), (args.gvfs, "--gvfs"),
                       (args.exclusive_store, "--exclusive-store"), (args.foreground, "-f"),
                       (args.log_file, "--log-file")):
        if flag:
            print(f"journalfs mount: error: {name} is fixed when mounting; remount cannot "
                  "change it", file=sys.stderr)
            return EXIT_USAGE
    try:
        warnings = remount(mountpoint, args.options + extra)
    except OptionError as exc:
        print(f"journalfs mount: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:  # MountError -> one line, exit 1 (cli.main)
        print(f"journalfs: warning: {warning}", file=sys.stderr)
    return EXIT_OK


def _daemonize(config: MountConfig) -> int:
    """Fork; the child mounts and reports READY (or its error line) through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_end)
        os._exit(_daemon_main(config, write_end))
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    if report.startswith(READY):
        return EXIT_OK
    os.waitpid(pid, 0)
    line = report.decode("utf-8", "replace").strip() or "the mount daemon died before mounting"
    print(f"journalfs: {line}", file=sys.stderr)
    return EXIT_ERROR


def _daemon_main(config: MountConfig, report_fd: int) -> int:
    import logging

    from ..fs.main import run

    os.setsid()
    reported = False

    def ready() -> None:  # the mount is live: release the waiting parent, detach from the tty
        nonlocal reported
        os.write(report_fd, READY)
        os.close(report_fd)
        reported = True
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)

    try:
        with _pidfile(config.mountpoint):
            run(config, ready, foreground=False)
        return EXIT_OK
    except BaseException as exc:  # the daemon has no terminal: report through the pipe
        message = str(exc) if isinstance(exc, MountError) else f"{type(exc).__name__}: {exc}"
        if not reported:  # the waiting `journalfs mount` prints it
            os.write(report_fd, message.encode("utf-8", "backslashreplace") + b"\n")
        else:
            logging.getLogger("journalfs").error("%s", message)
        return EXIT_ERROR


@contextlib.contextmanager
def _pidfile(mountpoint: str):
    path = pidfile_for(mountpoint)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{os.getpid()}\n")
    except OSError:
        path = None  # only `umount` waiting needs it
    try:
        yield
    finally:
        if path:
            with contextlib.suppress(OSError):
                with open(path) as f:
                    mine = f.read().strip() == str(os.getpid())
                if mine:
                    os.unlink(path)


def _daemon_pid(mountpoint: str) -> int | None:
    try:
        with open(pidfile_for(mountpoint)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"journalfs" in f.read()
    except OSError:
        return False


def run_umount(args) -> int:
    mnt = resolved_mountpoint(args.mountpoint)
    entry = mount_entry(mnt)
    if entry is None:
        print(f"journalfs: {mnt} is not mounted", file=sys.stderr)
        return EXIT_ERROR
    if not entry.is_journalfs:
        print(f"journalfs: {mnt} is not a journalfs mount (it is {entry.fstype}); "
              "journalfs umount leaves it alone", file=sys.stderr)
        return EXIT_USAGE
    pid = _daemon_pid(mnt)
    cmd = ["fusermount3", "-u"] + (["-z"] if args.lazy else []) + [mnt]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["fusermount3 failed"])[-1]
        if "busy" in reason.lower():
            print(f"journalfs: {mnt} is busy (a process has a file open or its working "
                  f"directory there): see fuser -vm {mnt}, or detach it now with "
                  f"journalfs umount -z {mnt}", file=sys.stderr)
        else:
            print(f"journalfs: cannot unmount {mnt}: {reason}", file=sys.stderr)
        return EXIT_ERROR
    wait = LAZY_WAIT_SECONDS if args.lazy else UMOUNT_WAIT_SECONDS
    deadline = time.monotonic() + wait
    while pid is not None and _alive(pid):  # let the daemon flush its metadata and exit
        if time.monotonic() > deadline:
            if args.lazy:
                print(f"journalfs: detached {mnt}; its daemon (pid {pid}) still serves the "
                      "files open there and exits when the last one is closed", file=sys.stderr)
                return EXIT_OK
            print(f"journalfs: unmounted {mnt}, but daemon {pid} is still running", file=sys.stderr)
            return EXIT_ERROR
        time.sleep(0.05)
    return EXIT_OK
