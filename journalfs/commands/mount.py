"""`journalfs mount SOURCE MOUNTPOINT` and `journalfs umount MOUNTPOINT`.

``mount`` daemonizes by default and returns only once the mount is usable (exit 0), or with
the daemon's one-line error (exit 1). ``--foreground`` stays attached and logs to stderr.
``umount`` unmounts only journalfs mounts (by their type in /proc/self/mountinfo), runs
``fusermount3 -u`` and waits (bounded) until the daemon has flushed and exited.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time

# fs.main imports no pyfuse3/trio at module level: they load only where a mount is served.
from ..fs.main import (MountConfig, MountError, OptionError, mount_entry, pidfile_for, preflight,
                       resolved_mountpoint, run)
from ..fs.remount import is_remount, remount
from . import EXIT_ERROR, EXIT_OK, EXIT_USAGE

UMOUNT_WAIT_SECONDS = 30.0
#: After a lazy unmount the daemon serves files still open; wait this long, then report.
LAZY_WAIT_SECONDS = 2.0
READY = b"OK\n"

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
        with _pidfile(config.mountpoint):
            run(config, foreground=True)
        return EXIT_OK
    return _daemonize(config)


def run_remount(args) -> int:
    """``-o remount,...``: change the running mount on MOUNTPOINT (fs/remount.py)."""
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
        written = True
    except OSError:
        written = False  # only `umount` waiting needs it
    try:
        yield
    finally:
        if written:
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
