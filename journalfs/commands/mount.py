"""`journalfs mount SOURCE MOUNTPOINT` and `journalfs umount MOUNTPOINT`.

``mount`` daemonizes by default and returns only once the mount is usable (exit 0), or with
the daemon's one-line error (exit 1). ``--foreground`` stays attached and logs to stderr.
``umount`` runs ``fusermount3 -u`` and waits (bounded) until the daemon has flushed and exited.
"""
from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import subprocess
import sys
import time

# fs.main imports no pyfuse3/trio at module level: every CLI command loads this module.
from ..fs.main import (DEFAULT_READAHEAD_KIB, DEFAULT_TIMEOUT, MountConfig, MountError, OptionError, pidfile_for,
                       preflight)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
UMOUNT_WAIT_SECONDS = 30.0
READY = b"OK\n"


def add_parser(sub) -> None:
    p = sub.add_parser("mount", help="mount SOURCE at MOUNTPOINT (journals + metadata xattrs)",
                       description="Mirror SOURCE at MOUNTPOINT: metadata as user.metadata.* "
                       "xattrs, journals as records under MOUNTPOINT/.journalfs. Returns once "
                       "the mount is usable (or stays attached with --foreground).",
                       epilog="Caching: the kernel keeps names and attributes for "
                       f"timeout={DEFAULT_TIMEOUT:g} seconds by default. Everything changed "
                       "through the mount is seen at once (journalfs invalidates it); a change "
                       "made directly in SOURCE behind the mount may stay unseen for up to the "
                       "timeout. Use -o timeout=0 when SOURCE is also changed by others and "
                       "must be seen immediately (slower: every stat asks journalfs).")
    p.add_argument("source", help="directory to mirror")
    p.add_argument("mountpoint", help="empty directory to mount on")
    p.add_argument("--store", metavar="DIR", help="gvfs-style metadata directory (home/root trees)")
    p.add_argument("--gvfs", action="store_true", help="share the user's running gvfsd-metadata")
    p.add_argument("--exclusive-store", action="store_true",
                   help="refuse a gvfs --store directory when no session bus of its owner is "
                        "reachable (a gvfsd-metadata starting later could write it too)")
    p.add_argument("--foreground", "-f", action="store_true", help="stay attached; log to stderr")
    p.add_argument("--sync", choices=("always", "batch", "none"), help="metadata durability")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="comma list: store=DIR, sync=MODE, gvfs, exclusive_store, allow_other, "
                        "default_permissions, ro, debug, fsname=NAME, nonempty, timeout=SECONDS "
                        f"(kernel cache of names/attributes, default {DEFAULT_TIMEOUT:g}), "
                        f"readahead=KIB (as root; default {DEFAULT_READAHEAD_KIB}, 0: the "
                        "kernel's)")
    p.set_defaults(run=run_mount)

    u = sub.add_parser("umount", help="unmount a journalfs mount and wait for its daemon",
                       description="fusermount3 -u MOUNTPOINT, then wait until the daemon has "
                       "flushed its metadata and exited.")
    u.add_argument("mountpoint")
    u.add_argument("--lazy", "-z", action="store_true", help="detach even if busy")
    u.set_defaults(run=run_umount)


def build_config(args) -> MountConfig:
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
    if config.store:
        config.store = os.path.abspath(config.store)
    return config


def _log_to(handler: logging.Handler, debug: bool) -> None:
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    handler.setFormatter(logging.Formatter("journalfs[%(process)d]: %(levelname)s %(message)s"))


def run_mount(args) -> int:
    try:
        config = build_config(args)
    except OptionError as exc:
        print(f"journalfs mount: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    preflight(config)  # MountError -> one line, exit 1 (cli.main)
    if args.foreground:
        _log_to(logging.StreamHandler(sys.stderr), config.debug)
        from ..fs.main import run
        with _pidfile(config.mountpoint):
            run(config)
        return EXIT_OK
    return _daemonize(config)


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
    from ..fs.main import run

    os.setsid()
    _log_to(_syslog_handler(), config.debug)
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
            run(config, ready)
        return EXIT_OK
    except BaseException as exc:  # the daemon has no terminal: report through the pipe
        message = str(exc) if isinstance(exc, MountError) else f"{type(exc).__name__}: {exc}"
        if not reported:
            os.write(report_fd, message.encode("utf-8", "replace") + b"\n")
        logging.getLogger("journalfs").error("%s", message)
        return EXIT_ERROR


def _syslog_handler() -> logging.Handler:
    if os.path.exists("/dev/log"):
        with contextlib.suppress(OSError):
            return logging.handlers.SysLogHandler(address="/dev/log")
    return logging.NullHandler()


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
    mnt = os.path.abspath(args.mountpoint)
    if not os.path.ismount(mnt):
        print(f"journalfs: {mnt} is not mounted", file=sys.stderr)
        return EXIT_ERROR
    pid = _daemon_pid(mnt)
    cmd = ["fusermount3", "-u"] + (["-z"] if args.lazy else []) + [mnt]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["fusermount3 failed"])[-1]
        print(f"journalfs: cannot unmount {mnt}: {reason}", file=sys.stderr)
        return EXIT_ERROR
    deadline = time.monotonic() + UMOUNT_WAIT_SECONDS
    while pid is not None and _alive(pid):  # let the daemon flush its metadata and exit
        if time.monotonic() > deadline:
            print(f"journalfs: unmounted {mnt}, but daemon {pid} is still running", file=sys.stderr)
            return EXIT_ERROR
        time.sleep(0.05)
    return EXIT_OK
