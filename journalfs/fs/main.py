"""Running a mount: configuration, checks before mounting, and the trio main loop.

``serve`` mounts, starts the metadata service in a nursery, runs pyfuse3's loop until the
filesystem is unmounted (``fusermount3 -u``) or a SIGTERM/SIGINT/SIGHUP arrives, then cancels
the nursery so the service flushes and syncs its store, and finally releases the FUSE session.
"""
from __future__ import annotations

import contextlib
import errno
import faulthandler
import hashlib
import logging
import os
import re
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

# pyfuse3, trio, the store and the FUSE layer are imported where a mount is actually served
# (serve, run and the helpers only they call): every `journalfs mount`/`umount`/`meta`
# command line imports this module (through commands/) for its configuration and checks, and
# should start fast. Each such late import says so.

from ..escaping import EscapingFormatter
from ..options import DEFAULT_READAHEAD_KIB, DEFAULT_TIMEOUT, DEFAULT_WRITEBACK_CACHE, QUOTA_DEFAULTS, SYNC_MODES, parse_size
from .settings import OptionError, RuntimeSettings, parse_timeout

if TYPE_CHECKING:  # annotations only (see above)
    import trio

    from ..metastore.backend import MetadataBackend
    from ..metastore.location import StoreLocation
    from .passthrough import JournalFS

log = logging.getLogger("journalfs.fs")

#: fstab / mount(8) options that mount(8) itself acts on (or that only name the entry):
#: accepted and ignored.
IGNORED_OPTIONS = {"defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group",
                   "nofail", "_netdev"}
IGNORED_PREFIXES = ("x-systemd.", "comment=", "x-")
#: Kernel mount flags that libfuse passes on (option -> the opposite one it replaces). They
#: show in /proc/self/mountinfo as on any other filesystem; "sync" alone is the kernel's
#: synchronous-writes flag, "sync=MODE" journalfs's metadata durability.
MOUNT_FLAGS = {"dev": "nodev", "nodev": "dev", "suid": "nosuid", "nosuid": "suid",
               "exec": "noexec", "noexec": "exec", "atime": "noatime", "noatime": "atime",
               "sync": "async", "async": "sync", "dirsync": None}
#: Flags only root may clear (libfuse's fusermount3 forces nodev,nosuid for everyone else).
ROOT_ONLY_FLAGS = {"dev", "suid"}
#: Standard options journalfs cannot honour, each with the reason shown to the user.
REFUSED_OPTIONS = {
    "strictatime": "libfuse 3.14 cannot set strictatime on a FUSE mount (atime, noatime work)",
    "nostrictatime": "libfuse 3.14 cannot set strictatime on a FUSE mount (atime, noatime work)",
    "norelatime": "libfuse 3.14 cannot clear relatime on a FUSE mount (noatime works)",
    "diratime": "libfuse 3.14 cannot set diratime flags on a FUSE mount (noatime works)",
    "nodiratime": "libfuse 3.14 cannot set diratime flags on a FUSE mount (noatime works)",
    "lazytime": "libfuse 3.14 cannot set lazytime on a FUSE mount",
    "nolazytime": "libfuse 3.14 cannot set lazytime on a FUSE mount",
    "silent": "libfuse 3.14 cannot set it on a FUSE mount",
    "loud": "libfuse 3.14 cannot set it on a FUSE mount",
    "iversion": "libfuse 3.14 cannot set it on a FUSE mount",
    "noiversion": "libfuse 3.14 cannot set it on a FUSE mount",
    "nosymfollow": "libfuse 3.14 cannot set it on a FUSE mount",
    "symfollow": "libfuse 3.14 cannot set it on a FUSE mount",
    "mand": "mandatory locks are gone from Linux",
    "nomand": "mandatory locks are gone from Linux",
    "blkdev": "journalfs is not a block-device filesystem",
    "blksize": "only block-device FUSE filesystems (blkdev) have a block size",
    "subtype": "a journalfs mount's type is always fuse.journalfs (umount and mount(8) rely on it)",
    "uid": "journalfs shows SOURCE's owners as they are (no remapping; bindfs does that)",
    "gid": "journalfs shows SOURCE's owners as they are (no remapping; bindfs does that)",
    "umask": "journalfs shows SOURCE's modes as they are (no remapping; bindfs does that)",
    "user_id": "set by the FUSE library itself",
    "group_id": "set by the FUSE library itself",
    "rootmode": "set by the FUSE library itself",
    "fd": "set by the FUSE library itself",
    "context": "SELinux mount contexts are not supported",
    "fscontext": "SELinux mount contexts are not supported",
    "defcontext": "SELinux mount contexts are not supported",
    "rootcontext": "SELinux mount contexts are not supported",
    "kernel_cache": "a high-level libfuse option; journalfs keeps file contents cached already "
                    "and invalidates what changes (see timeout=)",
    "auto_cache": "a high-level libfuse option; journalfs keeps file contents cached already "
                  "and invalidates what changes (see timeout=)",
    "direct_io": "a high-level libfuse option; journalfs reads through the page cache",
    "negative_timeout": "journalfs does not cache missing names (a new file in SOURCE shows "
                        "at once)",
    "use_ino": "journalfs numbers its own inodes (they stay stable while a file is in use)",
    "readdir_ino": "journalfs numbers its own inodes (they stay stable while a file is in use)",
    "hard_remove": "a high-level libfuse option; unlinked open files keep working in journalfs",
    "noforget": "a high-level libfuse option",
    "remember": "a high-level libfuse option",
    "intr": "a high-level libfuse option; journalfs requests are not interruptible",
    "large_read": "a FUSE 2 option with no effect on Linux 2.6 and later",
    "big_writes": "a FUSE 2 option; large writes are always on",
    "max_read": "pyfuse3 does not hand max_read to the kernel's INIT reply, so libfuse "
                "would refuse the session",
}
#: libfuse's own name for the high-level cache timeouts: both are journalfs's timeout=.
TIMEOUT_ALIASES = ("entry_timeout", "attr_timeout")


class MountError(Exception):
    """A mount that cannot be made; the message is the one line shown to the user."""


@dataclass
class MountConfig:
    """Options of one mount. ``timeout`` is how long the kernel may cache names and
    attributes: journalfs invalidates what it changes itself at once, so only changes made
    directly in SOURCE (behind the mount) can stay unseen for up to that long."""

    source: str
    mountpoint: str
    store: str | None = None
    gvfs: bool = False
    exclusive_store: bool = False  # refuse a gvfs store no session bus can guard
    sync: str = "batch"
    allow_other: bool = False
    allow_root: bool = False
    auto_unmount: bool = False
    default_permissions: bool = True  # always on: the kernel checks permissions for us
    ro: bool = False
    debug: bool = False
    nonempty: bool = False
    fsname: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    readahead: int = DEFAULT_READAHEAD_KIB
    #: the kernel's writeback cache (-o writeback_cache / no_writeback_cache): see
    #: DEFAULT_WRITEBACK_CACHE
    writeback_cache: bool = DEFAULT_WRITEBACK_CACHE
    log_file: str | None = None
    #: the metadata quota's options given (quota_file, quota_user, quota_total), in bytes
    quotas: dict[str, int] = field(default_factory=dict)
    #: where the daemon's log goes (status.json "log"), filled in when logging starts
    log: str = "stderr"
    #: kernel mount flags asked for (dev/nodev, suid/nosuid, exec/noexec, atime/noatime,
    #: sync/async, dirsync), in the order given; see MOUNT_FLAGS
    flags: dict[str, None] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)

    def apply_options(self, text: str) -> None:
        """Apply one ``-o a,b=c`` list (later options win)."""
        for opt in filter(None, (o.strip() for o in text.split(","))):
            self._apply_option(opt)

    def _apply_option(self, opt: str) -> None:
        name, eq, value = opt.partition("=")
        if opt in IGNORED_OPTIONS or opt.startswith(IGNORED_PREFIXES):
            return
        if name in REFUSED_OPTIONS:
            raise OptionError(f"option {opt!r} is not supported: {REFUSED_OPTIONS[name]}")
        if opt == "relatime":  # the kernel's default: undo atime/noatime given before
            self.flags.pop("atime", None)
            self.flags.pop("noatime", None)
        elif opt in MOUNT_FLAGS:
            if opt in ROOT_ONLY_FLAGS and os.geteuid() != 0:
                raise OptionError(f"option {opt!r} needs root (FUSE mounts of other users "
                                  "are always nodev,nosuid)")
            opposite = MOUNT_FLAGS[opt]
            if opposite is not None:
                self.flags.pop(opposite, None)
            self.flags.pop(opt, None)
            self.flags[opt] = None
        elif name == "store" and value:
            self.store = value
        elif name == "sync" and eq:
            if value not in SYNC_MODES:
                raise OptionError(f"sync must be one of {', '.join(SYNC_MODES)}, not {value!r}")
            self.sync = value
        elif name == "fsname" and value:
            self.fsname = value
        elif name in ("timeout", *TIMEOUT_ALIASES) and value:
            self.timeout = parse_timeout(value)
        elif name == "readahead" and value:
            if not value.isdigit() or int(value) > 1 << 20:
                raise OptionError(f"readahead must be 0..1048576 KiB, not {value!r}")
            self.readahead = int(value)
        elif name == "log_file" and value:
            self.log_file = value
        elif name in QUOTA_DEFAULTS and eq:
            try:
                self.quotas[name] = parse_size(value)
            except ValueError as exc:
                raise OptionError(f"{name}: {exc}") from None
        elif opt in ("writeback_cache", "no_writeback_cache"):
            self.writeback_cache = opt == "writeback_cache"
        elif opt == "gvfs":
            self.gvfs = True
        elif opt == "exclusive_store":
            self.exclusive_store = True
        elif opt in ("rw", "ro"):
            self.ro = opt == "ro"
        elif opt in ("allow_other", "allow_root", "auto_unmount", "default_permissions",
                     "debug", "nonempty"):
            setattr(self, opt, True)
        else:
            raise OptionError(f"unknown mount option {opt!r} (journalfs mount --help lists them)")
        if self.allow_other and self.allow_root:
            raise OptionError("allow_other and allow_root exclude each other")
        if self.auto_unmount and ROOT_ONLY_FLAGS & self.flags.keys():
            raise OptionError("auto_unmount mounts through fusermount3, which always sets "
                              "nodev,nosuid: drop dev/suid or auto_unmount")

    def summary(self) -> dict[str, object]:
        """The options as status.json shows them."""
        return {"source": self.source, "mountpoint": self.mountpoint, "store": self.store,
                "gvfs": self.gvfs, "exclusive_store": self.exclusive_store, "sync": self.sync, "allow_other": self.allow_other,
                "allow_root": self.allow_root, "auto_unmount": self.auto_unmount,
                "default_permissions": True, "ro": self.ro, "debug": self.debug,
                "fsname": self.fs_name, "entry_timeout": self.timeout,
                "attr_timeout": self.timeout, "readahead_kib": self.readahead,
                "writeback_cache": self.writeback_cache,
                "mount_flags": list(self.flags), "log": self.log,
                "quota": {**QUOTA_DEFAULTS, **self.quotas}}

    @property
    def fs_name(self) -> str:
        return self.fsname or self.source

    def fuse_options(self) -> set[str]:
        # libfuse splits options at commas: escape them (and backslashes) in the name
        fsname = os.fsencode(self.fs_name).replace(b"\\", b"\\\\").replace(b",", b"\\,")
        opts = {"default_permissions", FuseOption(b"fsname=" + fsname), "subtype=journalfs",
                *self.flags}
        for flag in ("allow_other", "allow_root", "auto_unmount", "ro"):
            if getattr(self, flag):
                opts.add(flag)
        return opts


class FuseOption(str):
    """A libfuse option whose bytes need not be ASCII (an fsname naming a SOURCE path that is
    UTF-8 or not UTF-8 at all): pyfuse3 encodes each option with ``.encode("us-ascii")``,
    which this answers with the raw bytes."""

    raw: bytes

    def __new__(cls, raw: bytes) -> FuseOption:
        option = super().__new__(cls, raw.decode("ascii", "backslashreplace"))
        option.raw = raw
        return option

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    device: str        # major:minor
    mountpoint: str
    fstype: str
    source: str
    flags: tuple[str, ...]       # per-mount flags (rw, nosuid, noatime, ...)
    super_options: tuple[str, ...]

    @property
    def is_journalfs(self) -> bool:
        return self.fstype == "fuse.journalfs"


def mount_entries() -> list[MountEntry]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        lines = f.read().splitlines()
    entries = []
    for line in lines:
        fields = line.split(" ")
        sep = fields.index("-")
        entries.append(MountEntry(fields[2], unescape_mountinfo(fields[4]), fields[sep + 1],
                                  unescape_mountinfo(fields[sep + 2]),
                                  tuple(fields[5].split(",")), tuple(fields[sep + 3].split(","))))
    return entries


def mount_entry(target: str) -> MountEntry | None:
    """The newest mount on ``target`` (a resolved path), or None."""
    found = None
    for entry in mount_entries():
        if entry.mountpoint == target:
            found = entry
    return found


def resolved_mountpoint(path: str) -> str:
    """``path`` made absolute and resolved without stat-ing the last component (a dead or
    hung FUSE mount there would fail or block)."""
    path = os.path.abspath(path)
    if path == "/":
        return path
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def is_dead_mount(path: str) -> bool:
    """A FUSE mount whose daemon is gone answers every request with ENOTCONN (statfs: a
    stat could be answered from the kernel's attribute cache)."""
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def journalfs_mount_of(pid: int) -> tuple[str, str, dict[str, str | bool]] | None:
    """(source, mountpoint, options) of the ``journalfs mount`` process ``pid``, from its
    command line, or None when ``pid`` is not one."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    if "mount" not in argv or not any("journalfs" in a for a in argv[:3]):
        return None
    rest = argv[argv.index("mount") + 1:]
    with_value = {"--store", "--sync", "-o", "--log-file"}
    positional: list[str] = []
    options: dict[str, str | bool] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in with_value and i + 1 < len(rest):
            options[arg] = rest[i + 1]
            i += 2
            continue
        if not arg.startswith("-"):
            positional.append(os.path.join(cwd, arg))
        elif arg == "--gvfs":
            options[arg] = True
        i += 1
    if len(positional) < 2:
        return None
    return positional[0], positional[1], options


def preflight(config: MountConfig) -> list[str]:
    """Refuse, with one clear line, what would fail or misbehave once mounted; return the
    warnings to show (the mount goes ahead). A dead journalfs mount left on the mountpoint
    (its daemon was killed) is cleaned up here."""
    src, mnt = config.source, config.mountpoint
    warnings = []
    if not os.path.exists(src):
        raise MountError(f"source {src} does not exist")
    if not os.path.isdir(src):
        raise MountError(f"source {src} is not a directory")
    target = resolved_mountpoint(mnt)
    entry = mount_entry(target)
    if entry is not None and entry.is_journalfs and is_dead_mount(target):
        done = subprocess.run(["fusermount3", "-u", "-z", target], capture_output=True, text=True)
        if done.returncode != 0:
            raise MountError(f"{mnt} holds a dead journalfs mount (its daemon is gone) that "
                             f"cannot be removed: {_last_line(done.stderr)}; "
                             f"try: journalfs umount {mnt}")
        warnings.append(f"removed the dead journalfs mount left on {mnt} (its daemon had died)")
        entry = mount_entry(target)
    if not os.path.exists(mnt):
        raise MountError(f"mountpoint {mnt} does not exist")
    if not os.path.isdir(mnt):
        raise MountError(f"mountpoint {mnt} is not a directory")
    if entry is not None or os.path.ismount(mnt):
        if entry is not None and entry.is_journalfs:
            raise MountError(f"{mnt} is already a journalfs mount (of {entry.source}); "
                             f"unmount it first: journalfs umount {mnt}")
        kind = f" ({entry.fstype})" if entry is not None else ""
        raise MountError(f"mountpoint {mnt} is busy: something is already mounted there{kind}")
    if not config.nonempty and os.listdir(mnt):
        raise MountError(f"mountpoint {mnt} is not empty (use -o nonempty to mount over it)")
    for option in ("allow_other", "allow_root"):
        if getattr(config, option) and os.geteuid() != 0 and not user_allow_other():
            raise MountError(f"-o {option} needs user_allow_other in {FUSE_CONF} (fusermount3 "
                             f"refuses it for users otherwise): as root, add a line "
                             f"user_allow_other to {FUSE_CONF}, or mount without -o {option}")
    if config.gvfs and not config.store and not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        raise MountError("--gvfs needs the D-Bus session bus of the user's desktop session "
                         "(DBUS_SESSION_BUS_ADDRESS is not set); run it there, or use "
                         "--store DIR for a store of its own")
    own = os.path.join(src, ".journalfs")
    if os.path.lexists(own):
        if os.path.realpath(src) == target:  # -o nonempty over SOURCE itself
            warnings.append(f"{own} exists in SOURCE, which this mount covers: while it is "
                            "mounted, .journalfs there is the mount's own and the real one "
                            "is out of reach (rename it in SOURCE to see it through the mount)")
        else:
            warnings.append(f"{own} exists in SOURCE but the mount shows its own .journalfs "
                            "there instead: reach the real one in SOURCE directly")
    return warnings


FUSE_CONF = "/etc/fuse.conf"


def user_allow_other() -> bool:
    """Whether fusermount3 lets users mount with allow_other/allow_root (fuse.conf)."""
    try:
        with open(FUSE_CONF, encoding="utf-8", errors="replace") as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no reason given"


def _mounted_device(target: str) -> str | None:
    """``major:minor`` of the newest mount on ``target`` (a resolved path), from
    /proc/self/mountinfo: a stat of the mountpoint would ask this very process, which is not
    serving yet."""
    entry = mount_entry(target)
    return entry.device if entry is not None else None


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


def _open_metadata(config: MountConfig) -> tuple[MetadataBackend, StoreLocation]:
    """(backend, location): the metadata backend the mount serves xattrs from. Who may write
    a shared (--store) gvfs directory is the metastore's decision (gvfs_service)."""
    # late: serving only (see the imports above)
    from ..metastore.gvfs_service import open_metadata_backend
    from ..metastore.gvfsd import StoreBusError
    from ..metastore.location import resolve_store
    from ..metastore.store import StoreLocked

    location = resolve_store(config.source, config.store, gvfs=config.gvfs)
    try:
        return open_metadata_backend(location.tree_path, shared_dir=config.store is not None,
                                     gvfs=config.gvfs, sync=config.sync, readonly=config.ro,
                                     exclusive=config.exclusive_store, location=location,
                                     mountpoint=resolved_mountpoint(config.mountpoint),
                                     source_kind=_source_kind(config.source)), location
    except StoreBusError as exc:  # gvfs_service's own one-line refusal
        raise MountError(exc.strerror) from None
    except StoreLocked:
        raise MountError(store_in_use_message(location.tree_path, config.source)) from None


def _source_kind(source: str) -> Callable[[str], str]:
    """What a mount-relative path is in SOURCE, for the metadata mirror of the mount's
    paths (run in a worker thread): "view" (the mount's own views), "dir", "file" or
    "absent". Walked one directory at a time from SOURCE, never through a symlink."""
    from .views import VIEWS_NAME  # late: serving only (see the imports above)

    root = os.path.abspath(source)
    views = "/" + os.fsdecode(VIEWS_NAME)
    nofollow_dir = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def kind(rel: str) -> str:
        if rel == views or rel.startswith(views + "/"):
            return "view"
        *parents, name = [p for p in rel.split("/") if p] or [""]
        try:
            fd = os.open(root, nofollow_dir)
        except OSError:
            return "absent"
        try:
            for part in parents:
                fd, parent = os.open(part, nofollow_dir, dir_fd=fd), fd
                os.close(parent)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False) if name else os.fstat(fd)
        except OSError:
            return "absent"
        finally:
            os.close(fd)
        return "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return kind


def store_in_use_message(tree_path: str, source: str) -> str:
    """One line for a store whose writer lock another process holds: which one, and for a
    journalfs mount, where it is mounted."""
    from ..metastore.store import lock_holder  # late: the store (see the imports above)

    pid = lock_holder(tree_path)
    holder = journalfs_mount_of(pid) if pid is not None else None
    if holder is not None:
        if os.path.realpath(holder[0]) == os.path.realpath(source):
            return f"{source} is already mounted by journalfs on {holder[1]} (pid {pid})"
        return (f"metadata store {tree_path} is in use by the journalfs mount on "
                f"{holder[1]} (pid {pid})")
    who = f"pid {pid}" if pid is not None else "another process"
    return f"metadata store {tree_path} is in use by {who}"


async def _handle_signals(meta: MetadataBackend, task_status: trio.TaskStatus[None]) -> None:
    """SIGTERM/SIGINT/SIGHUP unmount; SIGUSR1 rotates the store now (what `journalfs meta
    compact` sends to the mount holding a store)."""
    import pyfuse3  # late: serving only (see the imports above)
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


async def _compact_now(meta: MetadataBackend) -> None:
    from ..metastore.backend import NotSupported  # late: serving only (see the imports above)
    try:
        await meta.compact()
    except NotSupported as exc:  # gvfsd-metadata rotates its store itself
        log.info("SIGUSR1: not rotated: %s", exc)
    except Exception:
        log.exception("compaction on request failed")


async def _when_served(mountpoint: str, readahead: int, ready: Callable[[], None]) -> None:
    """Once the kernel's INIT is answered -- a stat of the mountpoint, served by this very
    loop, returns -- set the readahead (INIT caps any earlier setting at the kernel's
    default), then report the mount usable."""
    import trio  # late: serving only (see the imports above)

    def settle() -> None:
        try:
            os.stat(mountpoint)
        except OSError as exc:  # e.g. libfuse refused the kernel's INIT
            raise MountError(f"the new mount on {mountpoint} does not answer: "
                             f"{exc.strerror}") from None
        if readahead:
            set_readahead(mountpoint, readahead)
    await trio.to_thread.run_sync(settle)
    ready()


# -- logs ------------------------------------------------------------------------------------
LOG_FORMAT = "journalfs[%(process)d]: %(levelname)s %(message)s"
LOG_FILE_NAME = "journalfs.log"


def _syslog_handler() -> logging.Handler | None:
    """The system log (journald or a syslog daemon) when something listens on /dev/log."""
    import logging.handlers  # late: only a daemon without --log-file logs there

    if not os.path.exists("/dev/log"):
        return None
    try:
        return logging.handlers.SysLogHandler(address="/dev/log")
    except OSError:
        return None


def _file_handler(path: str) -> logging.Handler:
    """Append to ``path``: created 0600, never through a symlink, only a regular file of ours."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        raise MountError(f"cannot open the log file {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise MountError(f"log file {path} is not a regular file owned by uid {os.geteuid()}")
    handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace"))
    handler.setFormatter(EscapingFormatter("%(asctime)s " + LOG_FORMAT))
    return handler


def start_logging(config: MountConfig, location: StoreLocation, foreground: bool) -> None:
    """Log where the user will look and note where in ``config.log`` (status.json "log"):
    --log-file PATH if given; else the terminal with --foreground; else the system log
    (journald/syslog through /dev/log) when there is one; else a file in the store directory."""
    handlers: list[logging.Handler] = []
    places = []
    if foreground:
        handlers.append(logging.StreamHandler(sys.stderr))
        # under systemd (journalfs@.service) stderr is the journal
        places.append("stderr (systemd journal)" if os.environ.get("JOURNAL_STREAM") else "stderr")
    if config.log_file:
        path = os.path.abspath(config.log_file)
        handlers.append(_file_handler(path))
        places.append(path)
    elif not foreground:
        syslog = _syslog_handler()
        if syslog is not None:
            handlers.append(syslog)
            places.append("syslog (/dev/log)")
        else:
            directory = os.path.dirname(os.path.abspath(location.tree_path))
            os.makedirs(directory, mode=0o700, exist_ok=True)  # gvfs's may not exist yet
            path = os.path.join(directory, LOG_FILE_NAME)
            handlers.append(_file_handler(path))
            places.append(path)
    for handler in handlers:
        if handler.formatter is None:
            handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(logging.DEBUG if config.debug else logging.INFO)
    config.log = ", ".join(places)


async def serve(config: MountConfig, ready: Callable[[], None] = lambda: None,
                foreground: bool = True) -> None:
    """Mount, serve until unmounted or signalled, then flush metadata and unmount."""
    # late: serving only (see the imports above)
    import pyfuse3
    import trio

    from .collector import Collector
    from .control import trace_requests

    meta, location = _open_metadata(config)
    start_logging(config, location, foreground)
    # SIGQUIT prints every thread's stack to stderr (as a JVM's thread dump) and the mount
    # goes on: what a stuck daemon is waiting for, without a debugger
    faulthandler.register(signal.SIGQUIT, all_threads=True, chain=False)
    # Reach SOURCE through a directory fd opened before mounting: that keeps working when
    # the mount covers SOURCE itself (mountpoint == source) or SOURCE is renamed.
    source_fd = os.open(config.source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ops = assemble(config, meta, location, f"/proc/self/fd/{source_fd}")
        _load_handles(ops, source_fd)
        if config.debug:
            trace_requests(ops)
        log.info("serving %s on %s (store %s, sync %s)", config.source, config.mountpoint,
                 location.tree_path, config.sync)
        mountpoint = os.path.realpath(config.mountpoint)  # now, while it is not ours yet
        async with trio.open_nursery() as nursery:
            await nursery.start(meta.run)
            await nursery.start(_handle_signals, meta)
            try:
                pyfuse3.init(ops, config.mountpoint, config.fuse_options())
            except RuntimeError as exc:
                # libfuse (or fusermount3, for users) printed its reason to stderr already
                raise MountError(f"cannot mount on {config.mountpoint}: "
                                 f"{'fusermount3' if os.geteuid() else 'libfuse'} refused "
                                 f"({exc}; its reason is on the line above)") from None
            nursery.start_soon(_when_served, mountpoint, config.readahead, ready)
            nursery.start_soon(ops.watch.run)  # SOURCE changes made behind the mount
            nursery.start_soon(ops.views.status_file.run)  # status.json, off the request path
            nursery.start_soon(ops.ownership.expire_gone)  # metadata of files now gone
            # Everything made so far (modules, the store's index) lives as long as the mount:
            # out of the collector's sight, a full collection no longer walks it (it cost
            # tens of ms each, about 1 us per request on average); full collections only
            # from a background task, at a bounded rate (see collector.py).
            collector = Collector()
            collector.start()
            nursery.start_soon(collector.run)
            try:
                await pyfuse3.main()
            finally:
                nursery.cancel_scope.cancel()
                ops.watch.stop()  # no event read, no invalidation sent, past this point
                pyfuse3.close(unmount=True)
                _save_handles(ops, source_fd)
    finally:
        os.close(source_fd)


def assemble(config: MountConfig, meta: MetadataBackend, location: StoreLocation,
             source: str) -> JournalFS:
    """The operations a mount serves on ``source``: JournalFS, its runtime settings and the
    control file on MNT/.journalfs (the in-process tests build theirs here too)."""
    # late: serving only (see the imports above)
    from .control import Control, trace_requests
    from .passthrough import SNAPSHOT_TTL, JournalFS

    settings = RuntimeSettings(meta, timeout=config.timeout, readonly=config.ro,
                               cache_cap=SNAPSHOT_TTL)
    ops = JournalFS(source, meta, location, timeout=config.timeout, options=config.summary(),
                    settings=settings)
    ops.enable_writeback_cache = config.writeback_cache  # asked for in pyfuse3's fuse_init
    ops.watch.kernel_owns_sizes = config.writeback_cache
    ops.ownership.set_quota(config.quotas)
    ops.views.control = Control(settings, trace=lambda on: trace_requests(ops, on))
    return ops


def handles_file_for(source_fd: int) -> str | None:
    """Where the file handles of SOURCE's inodes are kept between mounts (root only: only
    root can open by handle): the runtime directory, by SOURCE's identity."""
    if os.geteuid() != 0:
        return None
    st = os.fstat(source_fd)
    base = os.environ.get("JOURNALFS_RUNTIME_DIR") or "/run/journalfs"
    return os.path.join(base, f"handles-{st.st_dev:x}-{st.st_ino:x}")


def _load_handles(ops: JournalFS, source_fd: int) -> None:
    path = handles_file_for(source_fd)
    if path is not None:
        taken = ops.table.load_forgotten(path)
        if taken:
            log.info("%d file handles of the last mount of this SOURCE still open", taken)


def _save_handles(ops: JournalFS, source_fd: int) -> None:
    path = handles_file_for(source_fd)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        ops.table.save_forgotten(path)
        _prune_handle_files(os.path.dirname(path))
    except OSError as exc:
        log.warning("file handles of this mount not kept for the next one: %s", exc)


#: Saved handle files kept (one per SOURCE, the most recently unmounted ones).
MAX_HANDLE_FILES = 32


def _prune_handle_files(directory: str) -> None:
    files = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("handles-") and entry.is_file(follow_symlinks=False):
                files.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _, old in sorted(files)[:-MAX_HANDLE_FILES]:
        with contextlib.suppress(OSError):
            os.unlink(old)


def _first(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups: trio's nurseries wrap
    every error, and the user gets one line about the one that stopped the mount."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _os_error_line(exc: OSError) -> str:
    """An OSError as one line without "[Errno N]"; permission errors say so first."""
    text = exc.strerror or str(exc)
    if exc.filename is not None:
        text = f"{os.fsdecode(exc.filename)}: {text}"
    if isinstance(exc, PermissionError):
        return text if text.lower().startswith("permission denied") or \
            text.startswith("refusing") else f"permission denied: {text}"
    return text


def run(config: MountConfig, ready: Callable[[], None] = lambda: None,
        foreground: bool = True) -> None:
    """Serve ``config`` on a fresh trio loop; a MountError carries the user-facing line.
    (Not ``except*``: an exception raised in an ``except*`` clause leaves it wrapped in a
    new ExceptionGroup, which is what the user then saw.)"""
    import trio  # late: serving only (see the imports above)

    os.umask(0)  # the kernel already applied the caller's umask to every mode we receive
    try:
        trio.run(serve, config, ready, foreground)
    except BaseException as caught:
        exc = _first(caught)
        if isinstance(exc, MountError):
            raise exc from None
        if isinstance(exc, OSError):
            raise MountError(_os_error_line(exc)) from None
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
            raise exc from None
        if type(exc).__module__.startswith("journalfs."):  # our errors speak to the user
            log.error("journalfs stopped: %s", exc)
            raise MountError(str(exc)) from None
        log.error("journalfs stopped", exc_info=exc)
        raise MountError(f"{type(exc).__name__}: {exc}") from None
