"""``mount -o remount,OPTIONS MNT`` of a running journalfs mount.

mount(8) (and /etc/fstab's ``mount -o remount MNT``) runs the helper as
``mount.fuse.journalfs SOURCE MNT -o remount,ro,nosuid,nodev,relatime,user_id=0,...``: the
options asked for merged with what /proc/self/mountinfo shows. The helper hands them to
``journalfs mount``, which comes here. Two parties change:

- the daemon, through its runtime settings on ``MNT/.journalfs`` (fs/control.py):
  ``user.journalfs.ro`` (it refuses every change with EROFS, metadata included),
  ``timeout``, ``sync``, ``log_level``;
- the kernel, with mount(2) ``MS_REMOUNT`` (root only): its read-only flag and the mount
  flags (nosuid, noexec, noatime, ...). A FUSE superblock accepts a remount; the kernel then
  refuses writes before they reach the daemon, and refuses ``remount,ro`` while a file is
  open for writing (EBUSY), as on any filesystem.

Order matters because a read-only kernel refuses the setxattr that carries a setting: going
read-only, the settings and the daemon come first, then the kernel; going read-write, the
kernel first. Options that only take effect when mounting (store=, gvfs, fsname=, ...) may be
repeated with their current value (fstab lines are) but not changed.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
from dataclasses import dataclass, field

from .main import (IGNORED_OPTIONS, IGNORED_PREFIXES, MountConfig, MountError, OptionError,
                   mount_entry, resolved_mountpoint, set_readahead)

CONTROL = ".journalfs"
SETTING = "user.journalfs."

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_SYNCHRONOUS = 1, 2, 4, 8, 16
MS_REMOUNT, MS_DIRSYNC, MS_NOATIME, MS_NODIRATIME = 32, 128, 1024, 2048
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
#: per-mount flags as /proc/self/mountinfo names them
MOUNT_FLAG_BITS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                   "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
#: superblock flags as its options show them
SUPER_FLAG_BITS = {"sync": MS_SYNCHRONOUS, "dirsync": MS_DIRSYNC}
#: FUSE superblock options mount(8) copies from mountinfo into a remount's option list: they
#: are fixed for the life of the mount, so only their current value is accepted.
FUSE_SUPER_OPTIONS = ("user_id", "group_id", "default_permissions", "allow_other",
                      "max_read", "blksize", "rootmode", "fd")
#: journalfs options fixed when mounting: a remount may repeat them, not change them
#: (option name -> key of status.json's "options").
FIXED_OPTIONS = {"writeback_cache": "writeback_cache", "store": "store", "gvfs": "gvfs", "exclusive_store": "exclusive_store",
                 "fsname": "fsname", "log_file": "log", "allow_root": "allow_root",
                 "auto_unmount": "auto_unmount", "allow_other": "allow_other"}


@dataclass
class Remount:
    """What one remount asks for, parsed against the mount's current state."""

    mountpoint: str
    readonly: bool | None = None           # None: leave as it is
    flags: dict[str, None] = field(default_factory=dict)  # kernel flags given (MOUNT_FLAGS)
    relatime: bool = False
    settings: dict[str, str] = field(default_factory=dict)  # runtime setting -> value
    readahead: int | None = None
    notes: list[str] = field(default_factory=list)


def is_remount(options: list[str]) -> bool:
    return any(o.strip() == "remount" for text in options for o in text.split(","))


def _super_options(entry) -> dict[str, str]:
    out = {}
    for opt in entry.super_options:
        name, _, value = opt.partition("=")
        out[name] = value
    return out


def parse(mountpoint: str, options: list[str], entry, current: dict) -> Remount:
    """The remount ``options`` (comma lists, ``remount`` among them) of the mount ``entry``
    whose status.json options are ``current``."""
    wanted = Remount(mountpoint)
    supers = _super_options(entry)
    config = MountConfig("", mountpoint)  # validates and interprets journalfs's options
    given: list[str] = []
    for text in options:
        for opt in filter(None, (o.strip() for o in text.split(","))):
            name, eq, value = opt.partition("=")
            if opt == "remount" or opt in IGNORED_OPTIONS or opt.startswith(IGNORED_PREFIXES):
                continue
            if name in FUSE_SUPER_OPTIONS and name not in FIXED_OPTIONS or \
                    (name == "allow_other" and name in supers):
                if name not in supers or supers[name] != value:
                    raise OptionError(f"option {opt!r} cannot change on remount (the kernel "
                                      "fixes it when mounting): unmount and mount again")
                continue
            if opt == "relatime":
                wanted.relatime = True
                wanted.flags.pop("atime", None)
                wanted.flags.pop("noatime", None)
                continue
            config.apply_options(opt)  # OptionError for unknown or refused options
            given.append(name.removeprefix("no_") if name == "no_writeback_cache" else name)
    if "ro" in given or "rw" in given:
        wanted.readonly = config.ro
    wanted.flags.update(config.flags)
    if any(n in given for n in ("timeout", "entry_timeout", "attr_timeout")):
        wanted.settings["timeout"] = f"{config.timeout:g}"
    if "sync" in given and "sync" not in config.flags:
        wanted.settings["sync"] = config.sync
    if "debug" in given:
        wanted.settings["log_level"] = "debug"
    for name, size in config.quotas.items():  # the metadata quota (fs/control.py)
        wanted.settings[name] = str(size)
    if "readahead" in given:
        wanted.readahead = config.readahead
    for name, key in FIXED_OPTIONS.items():
        if name not in given:
            continue
        asked = getattr(config, name)
        if name in ("store", "log_file") and asked:
            asked = os.path.abspath(asked)
        now = current.get(key) if key else None
        if name == "log_file":  # "log" lists every place the log goes (stderr too)
            unchanged = asked in (now or "").split(", ")
        else:
            unchanged = key is not None and (now or None) == (asked or None)
        if not unchanged:
            raise OptionError(f"option {name!r} cannot change on remount (it is fixed when "
                              "mounting): unmount and mount again")
    return wanted


def kernel_flags(entry, wanted: Remount) -> tuple[int, int]:
    """(mount(2) flags of the mount as it is, those the remount asks for), MS_REMOUNT aside."""
    now = 0
    for opt in entry.flags:
        now |= MOUNT_FLAG_BITS.get(opt, 0)
    for opt in entry.super_options:
        now |= SUPER_FLAG_BITS.get(opt, 0)
    if "ro" in entry.flags or "ro" in entry.super_options:
        now |= MS_RDONLY
    new = now
    if wanted.readonly is not None:
        new = new | MS_RDONLY if wanted.readonly else new & ~MS_RDONLY
    pairs = {"nodev": MS_NODEV, "nosuid": MS_NOSUID, "noexec": MS_NOEXEC,
             "sync": MS_SYNCHRONOUS}
    for opt in wanted.flags:
        if opt in pairs:
            new |= pairs[opt]
        elif opt in ("dev", "suid", "exec", "async"):
            new &= ~pairs["no" + opt if opt != "async" else "sync"]
        elif opt == "dirsync":
            new |= MS_DIRSYNC
        elif opt == "noatime":
            new = (new & ~MS_RELATIME) | MS_NOATIME
        elif opt == "atime":
            new &= ~MS_NOATIME
            if not new & MS_RELATIME:
                new |= MS_STRICTATIME
    if wanted.relatime:
        new = (new & ~MS_NOATIME) | MS_RELATIME
    return now, new


_libc = ctypes.CDLL(None, use_errno=True)


def _mount_remount(mountpoint: str, flags: int) -> None:
    if _libc.mount(None, os.fsencode(mountpoint), None, ctypes.c_ulong(MS_REMOUNT | flags),
                   None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _setting(mnt: str, name: str) -> str | None:
    """The setting's current value; None where this mount has no such setting (sync and
    the quota where gvfsd-metadata writes the store): setting it then says why."""
    try:
        return os.getxattr(os.path.join(mnt, CONTROL), SETTING + name).decode()
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise MountError(f"cannot read the setting {name} of {mnt}: {exc.strerror}") from None


def _set(mnt: str, name: str, value: str) -> None:
    try:
        os.setxattr(os.path.join(mnt, CONTROL), SETTING + name, value.encode())
    except OSError as exc:
        why = {errno.EPERM: "only the mount's owner and root may change it",
               errno.EINVAL: "invalid value", errno.ENOTSUP: "not with this metadata store",
               errno.EROFS: "the mount is read-only"}.get(exc.errno, exc.strerror)
        raise MountError(f"cannot set {name}={value} on {mnt}: {why}") from None


def remount(mountpoint: str, options: list[str]) -> list[str]:
    """Apply a remount to the journalfs mount on ``mountpoint``; returns warnings.
    MountError/OptionError carry the one line for the user."""
    mnt = resolved_mountpoint(mountpoint)
    entry = mount_entry(mnt)
    if entry is None:
        raise MountError(f"{mnt} is not mounted (remount changes a mounted journalfs)")
    if not entry.is_journalfs:
        raise MountError(f"{mnt} is not a journalfs mount (it is {entry.fstype})")
    try:
        with open(os.path.join(mnt, CONTROL, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError) as exc:
        raise MountError(f"cannot read {mnt}/{CONTROL}/status.json: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    current = status.get("options") or {}
    wanted = parse(mnt, options, entry, current)
    now, new = kernel_flags(entry, wanted)
    kernel_ro = bool(now & MS_RDONLY)
    daemon_ro = _setting(mnt, "ro") == "1"
    going_ro = bool(new & MS_RDONLY)
    settings = {k: v for k, v in wanted.settings.items() if _setting(mnt, k) != v}
    warnings: list[str] = []
    if not going_ro and daemon_ro and (status.get("service") or {}).get("readonly"):
        raise MountError(f"{mnt} was mounted read-only, so its metadata store is open "
                         f"read-only: unmount it and mount it rw")
    if going_ro:
        if settings and kernel_ro:
            raise MountError(f"{mnt} is read-only: its runtime settings "
                             f"({', '.join(settings)}) change with remount,rw")
        for name, value in settings.items():
            _set(mnt, name, value)
        if not daemon_ro:
            _set(mnt, "ro", "1")
        try:
            warnings += _kernel(mnt, now, new, daemon_only_ok=True)
        except MountError:
            if not daemon_ro:
                _set(mnt, "ro", "0")
            raise
    else:
        warnings += _kernel(mnt, now, new, daemon_only_ok=False)
        if daemon_ro:
            _set(mnt, "ro", "0")
        for name, value in settings.items():
            _set(mnt, name, value)
    if wanted.readahead and not set_readahead(mnt, wanted.readahead):
        warnings.append("readahead is the kernel's to set: only root may change it")
    return warnings


def _kernel(mnt: str, now: int, new: int, daemon_only_ok: bool) -> list[str]:
    """mount(2) MS_REMOUNT with ``new`` when it differs from ``now``. ``daemon_only_ok``:
    the daemon already refuses changes, so a user who may not remount the kernel's mount
    (only root may) still gets a read-only mount, with a warning."""
    if new == now:
        return []
    try:
        _mount_remount(mnt, new)
    except OSError as exc:
        if exc.errno == errno.EPERM and daemon_only_ok and new ^ now == MS_RDONLY:
            return [f"{mnt}: journalfs refuses every change now (EROFS); the kernel's "
                    f"read-only flag is root's to set (as root: mount -o remount,ro {mnt})"]
        if exc.errno == errno.EBUSY:
            raise MountError(f"cannot remount {mnt} read-only: a file is open for writing "
                             f"there (see fuser -vm {mnt})") from None
        raise MountError(f"cannot remount {mnt}: {exc.strerror}"
                         + (" (changing the kernel's mount flags needs root)"
                            if exc.errno == errno.EPERM else "")) from None
    return []
