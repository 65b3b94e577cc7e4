"""Running a mount: configuration, checks before mounting, and the trio main loop.

``serve`` mounts, starts the metadata service in a nursery, runs pyfuse3's loop until the
filesystem is unmounted (``fusermount3 -u``) or a SIGTERM/SIGINT/SIGHUP arrives, then cancels
the nursery so the service flushes and syncs its store, and finally releases the FUSE session.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Callable

# pyfuse3 and trio are imported where a mount is actually served: every other `journalfs`
# command imports this module (through commands/mount.py) and should start fast.

log = logging.getLogger("journalfs.fs")

SYNC_MODES = ("always", "batch", "none")
#: fstab / mount(8) options that mean nothing to a FUSE filesystem: accepted and ignored.
IGNORED_OPTIONS = {"rw", "defaults", "auto", "noauto", "user", "users", "nofail", "_netdev",
                   "dev", "suid", "exec", "nodev", "nosuid", "noexec", "async", "atime",
                   "noatime", "relatime", "nouser"}
IGNORED_PREFIXES = ("x-systemd.", "comment=", "x-")
#: Seconds the kernel may cache names and attributes (-o timeout=). Long, because journalfs
#: invalidates precisely whatever it changes itself; only changes made directly in SOURCE
#: behind the mount wait for the timeout to become visible.
DEFAULT_TIMEOUT = 120.0
#: KiB the kernel reads ahead on the mount (-o readahead=, 0 keeps the kernel's 128). Journals
#: are read front to back: 1 MiB readahead means 8x fewer READ requests, each a worker-thread
#: round trip, than the kernel's default.
DEFAULT_READAHEAD_KIB = 1024


class MountError(Exception):
    """A mount that cannot be made; the message is the one line shown to the user."""


class OptionError(ValueError):
    """A bad ``-o`` option (a usage error)."""


@dataclass
class MountConfig:
    """Options of one mount. ``timeout`` is how long the kernel may cache names and
    attributes: journalfs invalidates what it changes itself at once, so only changes made
    directly in SOURCE (behind the mount) can stay unseen for up to that long."""

    source: str
    mountpoint: str
    store: str | None = None
    gvfs: bool = False
    sync: str = "batch"
    allow_other: bool = False
    default_permissions: bool = True  # always on: the kernel checks permissions for us
    ro: bool = False
    debug: bool = False
    nonempty: bool = False
    fsname: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    readahead: int = DEFAULT_READAHEAD_KIB
    extra: list[str] = field(default_factory=list)

    def apply_options(self, text: str) -> None:
        """Apply one ``-o a,b=c`` list (later options win)."""
        for opt in filter(None, (o.strip() for o in text.split(","))):
            name, eq, value = opt.partition("=")
            if opt in IGNORED_OPTIONS or opt.startswith(IGNORED_PREFIXES):
                continue
            if name == "store" and value:
                self.store = value
            elif name == "sync" and eq:
                if value not in SYNC_MODES:
                    raise OptionError(f"sync must be one of {', '.join(SYNC_MODES)}, not {value!r}")
                self.sync = value
            elif name == "fsname" and value:
                self.fsname = value
            elif name == "timeout" and value:
                try:
                    self.timeout = float(value)
                except ValueError:
                    raise OptionError(f"timeout must be a number of seconds, not {value!r}") from None
                if not 0 <= self.timeout < 1e9:  # also rejects nan
                    raise OptionError(f"timeout must be 0 or more seconds, not {value!r}")
            elif name == "readahead" and value:
                if not value.isdigit() or int(value) > 1 << 20:
                    raise OptionError(f"readahead must be 0..1048576 KiB, not {value!r}")
                self.readahead = int(value)
            elif opt == "gvfs":
                self.gvfs = True
            elif opt in ("allow_other", "default_permissions", "ro", "debug", "nonempty"):
                setattr(self, opt, True)
            else:
                raise OptionError(f"unknown mount option {opt!r}")

    def summary(self) -> dict:
        """The options as status.json shows them."""
        return {"source": self.source, "mountpoint": self.mountpoint, "store": self.store,
                "gvfs": self.gvfs, "sync": self.sync, "allow_other": self.allow_other,
                "default_permissions": True, "ro": self.ro, "debug": self.debug,
                "fsname": self.fs_name, "entry_timeout": self.timeout,
                "attr_timeout": self.timeout, "readahead_kib": self.readahead}

    @property
    def fs_name(self) -> str:
        return self.fsname or self.source

    def fuse_options(self) -> set[str]:
        opts = {"default_permissions", f"fsname={self.fs_name}", "subtype=journalfs"}
        for flag in ("allow_other", "ro", "debug"):
            if getattr(self, flag):
                opts.add(flag)
        return opts


def preflight(config: MountConfig) -> None:
    """Refuse, with one clear line, what would fail or misbehave once mounted."""
    src, mnt = config.source, config.mountpoint
    if not os.path.exists(src):
        raise MountError(f"source {src} does not exist")
    if not os.path.isdir(src):
        raise MountError(f"source {src} is not a directory")
    if not os.path.exists(mnt):
        raise MountError(f"mountpoint {mnt} does not exist")
    if not os.path.isdir(mnt):
        raise MountError(f"mountpoint {mnt} is not a directory")
    if os.path.ismount(mnt):
        raise MountError(f"mountpoint {mnt} is busy (something is already mounted there)")
    if not config.nonempty and os.listdir(mnt):
        raise MountError(f"mountpoint {mnt} is not empty (use -o nonempty to mount over it)")


def _mounted_device(target: str) -> str | None:
    """``major:minor`` of the newest mount on ``target`` (a resolved path), from
    /proc/self/mountinfo: a stat of the mountpoint would ask this very process, which is not
    serving yet."""
    device = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == target:
                device = fields[2]
    return device


def set_readahead(mountpoint: str, kib: int) -> bool:
    """Set the kernel's readahead for the mount (root only: a sysfs knob of its bdi).
    ``mountpoint`` must be resolved before mounting (resolving it after would deadlock)."""
    device = _mounted_device(mountpoint)
    if device is None:
        return False
    try:
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w") as f:
            f.write(str(kib))
    except OSError as exc:
        log.info("readahead of %s left as the kernel set it: %s", mountpoint, exc)
        return False
    return True


def pidfile_for(mountpoint: str) -> str:
    """Where the daemon serving ``mountpoint`` records its pid (for ``journalfs umount``)."""
    base = os.environ.get("JOURNALFS_RUNTIME_DIR")
    if not base:
        base = "/run/journalfs" if os.geteuid() == 0 else os.path.join(
            os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"journalfs-{os.geteuid()}")
    digest = hashlib.sha1(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:16]
    return os.path.join(base, f"{digest}.pid")


def _open_metadata(config: MountConfig):
    """(service, location): the metadata backend the mount serves xattrs from."""
    from ..metastore.location import resolve_store

    location = resolve_store(config.source, config.store, gvfs=config.gvfs)
    if config.gvfs:
        from ..metastore.gvfsd import GvfsdBackend
        return GvfsdBackend(location.tree_path), location
    from ..metastore.service import MetaService
    from ..metastore.store import MetaStore, StoreLocked
    try:
        store = MetaStore.open(location.tree_path, sync=config.sync, readonly=config.ro)
    except StoreLocked as exc:
        raise MountError(f"metadata store {location.tree_path} is locked by another process "
                         f"({exc})") from None
    return MetaService(store, sync=config.sync), location


async def _handle_signals(meta, task_status) -> None:
    """SIGTERM/SIGINT/SIGHUP unmount; SIGUSR1 rotates the store now (what `journalfs meta
    compact` sends to the mount holding a store)."""
    import pyfuse3
    import trio

    wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    with trio.open_signal_receiver(*wanted) as signals:
        task_status.started()
        async with trio.open_nursery() as compactions:
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    compactions.start_soon(_compact_now, meta)
                    continue
                log.info("signal %d: unmounting", signum)
                pyfuse3.terminate()
                return


async def _compact_now(meta) -> None:
    compact = getattr(meta, "compact", None)
    if compact is None:
        log.info("SIGUSR1: this mount's metadata store is not journalfs's to compact")
        return
    try:
        await compact()
    except Exception:
        log.exception("compaction on request failed")


async def _when_served(mountpoint: str, readahead: int, ready: Callable[[], None]) -> None:
    """Once the kernel's INIT is answered -- a stat of the mountpoint, served by this very
    loop, returns -- set the readahead (INIT caps any earlier setting at the kernel's
    default), then report the mount usable."""
    import trio

    def settle() -> None:
        try:
            os.stat(mountpoint)
        except OSError as exc:
            log.warning("mount %s does not answer: %s", mountpoint, exc)
            return
        if readahead:
            set_readahead(mountpoint, readahead)
    await trio.to_thread.run_sync(settle)
    ready()


async def serve(config: MountConfig, ready: Callable[[], None] = lambda: None) -> None:
    """Mount, serve until unmounted or signalled, then flush metadata and unmount."""
    import pyfuse3
    import trio

    from .passthrough import JournalFS

    meta, location = _open_metadata(config)
    # Reach SOURCE through a directory fd opened before mounting: that keeps working when
    # the mount covers SOURCE itself (mountpoint == source) or SOURCE is renamed.
    source_fd = os.open(config.source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ops = JournalFS(f"/proc/self/fd/{source_fd}", meta, location, timeout=config.timeout,
                        options=config.summary())
        mountpoint = os.path.realpath(config.mountpoint)  # now, while it is not ours yet
        async with trio.open_nursery() as nursery:
            await nursery.start(meta.run)
            await nursery.start(_handle_signals, meta)
            try:
                pyfuse3.init(ops, config.mountpoint, config.fuse_options())
            except RuntimeError as exc:
                raise MountError(f"cannot mount on {config.mountpoint}: {exc}") from None
            nursery.start_soon(_when_served, mountpoint, config.readahead, ready)
            nursery.start_soon(ops.watch.run)  # SOURCE changes made behind the mount
            try:
                await pyfuse3.main()
            finally:
                nursery.cancel_scope.cancel()
                pyfuse3.close(unmount=True)
    finally:
        os.close(source_fd)


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def run(config: MountConfig, ready: Callable[[], None] = lambda: None) -> None:
    """Serve ``config`` on a fresh trio loop; a MountError carries the user-facing line."""
    import trio

    os.umask(0)  # the kernel already applied the caller's umask to every mode we receive
    try:
        trio.run(serve, config, ready)
    except* MountError as group:
        raise _first(group) from None
    except* OSError as group:
        exc = _first(group)
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise MountError(f"permission denied: {exc}") from None
        raise MountError(str(exc)) from None
    except* Exception as group:
        exc = _first(group)
        log.error("journalfs stopped", exc_info=exc)
        raise MountError(f"{type(exc).__name__}: {exc}") from None
