"""Runtime settings of a mount as extended attributes of ``MNT/.journalfs`` (as mergerfs
does on its control file)::

    getfattr -d MNT/.journalfs                               # show them
    setfattr -n user.journalfs.timeout -v 5 MNT/.journalfs   # kernel cache timeout, seconds
    setfattr -n user.journalfs.sync -v always MNT/.journalfs # metadata durability
    setfattr -n user.journalfs.log_level -v debug MNT/.journalfs
    setfattr -n user.journalfs.rotate -v 1 MNT/.journalfs    # rotate the store now
    setfattr -n user.journalfs.ro -v 1 MNT/.journalfs        # refuse every change (EROFS)
    setfattr -n user.journalfs.quota_user -v 32M MNT/.journalfs  # metadata quota per uid

``user.journalfs.ro`` is what ``mount -o remount,ro MNT`` (and ``journalfs mount -o
remount,ro MNT``) sets before it flips the kernel's read-only flag: 1 makes the daemon itself
refuse every change with EROFS, metadata included, and makes the metadata written so far
durable; 0 allows changes again (after the kernel's flag is cleared: while the kernel's flag is
set it refuses this setxattr itself). A mount made with ``-o ro`` opened its metadata store
read-only and stays read-only.

Anyone who can see the mount may read them; only the mount's owner (the user the daemon runs
as) and root may change them, others get EPERM. ``user.journalfs.rotate`` reads as the number
of rotations done so far; writing any value rotates the store and returns when it is done.
A refused value answers EINVAL (ENOTSUP where the store does not have the setting); the reason
goes to the daemon's log and to status.json's ``last_error``. ``log_level=debug`` traces every
request, as ``-d`` does at mount time; another level stops the tracing again.
``quota_file``, ``quota_user`` and ``quota_total`` (bytes, K/M/G/T accepted; shown in bytes)
are the metadata quota of a mount that owns its store (docs/security.md); a lower limit
refuses growth from then on, metadata already held stays.
"""
from __future__ import annotations

import errno
import logging
import os
import time

import pyfuse3
import trio

from ..metastore.store import SYNC_MODES
from ..options import QUOTA_DEFAULTS, parse_size
from .main import OptionError, parse_timeout, trace_requests
from .passthrough import SNAPSHOT_TTL

log = logging.getLogger("journalfs.fs.control")

PREFIX = b"user.journalfs."
LOG_LEVELS = ("debug", "info", "warning", "error")
#: no setting takes a longer value; a longer one is cut before it reaches a log line
MAX_VALUE_SHOWN = 64


class SettingRefused(Exception):
    """A value a setting does not take: the errno the caller gets and the reason the log gets."""

    def __init__(self, errno_: int, reason: str):
        super().__init__(reason)
        self.errno, self.reason = errno_, reason


class Control:
    """Reads and changes the settings of one running mount (``ops``: its JournalFS)."""

    def __init__(self, ops, owner_uid: int | None = None):
        self.ops = ops
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        #: status.json's "last_error": the last setting refused, with why (None until one is)
        self.last_error: dict | None = None

    # -- reading ---------------------------------------------------------------------------
    def _values(self) -> dict[bytes, str]:
        meta = self.ops.meta
        values = {b"timeout": f"{self.ops.timeout:g}",
                  b"ro": "1" if self.ops.readonly else "0",
                  b"log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()}
        if hasattr(meta, "compact"):  # journalfs's own store (not gvfsd's)
            values[b"sync"] = str(getattr(meta, "sync_mode", ""))
            status = meta.status() if callable(getattr(meta, "status", None)) else {}
            values[b"rotate"] = str((status or {}).get("rotations", 0))
        ledger = self.ops.ownership.ledger if hasattr(self.ops, "ownership") else None
        if ledger is not None:  # the metadata quota (docs/security.md)
            values.update((name.encode(), str(size)) for name, size in ledger.quota().items())
        return values

    async def _current(self) -> dict[bytes, str]:
        # the store's status may wait for its lock (a rotation): not on the trio thread
        return await trio.to_thread.run_sync(self._values)

    async def listxattr(self) -> list[bytes]:
        return [PREFIX + name for name in await self._current()]

    async def getxattr(self, name: bytes) -> bytes:
        value = (await self._current()).get(self._setting(name))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value.encode()

    @staticmethod
    def _setting(name: bytes) -> bytes | None:
        return name[len(PREFIX):] if name.startswith(PREFIX) else None

    # -- changing --------------------------------------------------------------------------
    async def setxattr(self, name: bytes, value: bytes, ctx) -> None:
        setting = self._setting(name)
        if setting not in await self._current():
            raise pyfuse3.FUSEError(errno.ENOTSUP if setting is None else pyfuse3.ENOATTR)
        if ctx.uid not in (self.owner_uid, 0):
            raise pyfuse3.FUSEError(errno.EPERM)
        text = value.decode("utf-8", "replace").strip()[:MAX_VALUE_SHOWN]
        try:
            await self._change(setting, text)
        except SettingRefused as refused:
            self._refuse(setting, text, ctx.uid, refused)
            raise pyfuse3.FUSEError(refused.errno) from None
        if setting != b"rotate":
            log.info("setting %s changed to %s by uid %d", setting.decode(), text, ctx.uid)

    def _refuse(self, setting: bytes, text: str, uid: int, refused: SettingRefused) -> None:
        """Say in the log and in status.json why a value was refused (only the owner and root
        get this far, so nobody else can fill the log)."""
        message = (f"setting {setting.decode()} to {text!r} refused "
                   f"({errno.errorcode[refused.errno]}): {refused.reason}")
        log.warning("%s (uid %d)", message, uid)
        self.last_error = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "setting": setting.decode(),
                           "value": text, "errno": errno.errorcode[refused.errno],
                           "message": message}

    async def _change(self, setting: bytes, text: str) -> None:
        if setting == b"timeout":
            self._set_timeout(text)
        elif setting == b"sync":
            self._set_sync(text)
        elif setting == b"log_level":
            self._set_log_level(text)
        elif setting == b"ro":
            await self._set_readonly(text)
        elif setting == b"rotate":
            log.info("rotation requested through %s", (PREFIX + setting).decode())
            await self.ops.meta.compact()
        elif setting.decode() in QUOTA_DEFAULTS:
            self._set_quota(setting.decode(), text)

    def _set_quota(self, name: str, text: str) -> None:
        try:
            size = parse_size(text)
        except ValueError as exc:
            raise SettingRefused(errno.EINVAL, str(exc)) from None
        self.ops.ownership.ledger.set_quota(name, size)
        options = getattr(getattr(self.ops, "views", None), "options", None)
        if isinstance(options, dict) and isinstance(options.get("quota"), dict):
            options["quota"][name] = size

    def _set_timeout(self, text: str) -> None:
        try:
            seconds = parse_timeout(text)
        except OptionError as exc:
            raise SettingRefused(errno.EINVAL, str(exc)) from None
        ops = self.ops
        ops.timeout = seconds  # entry/attr timeouts of every later reply
        # the daemon's own short-lived caches never outlive the kernel's (as when mounting)
        cap = min(seconds, SNAPSHOT_TTL)
        if hasattr(ops, "stat_ttl"):
            ops.stat_ttl = cap
        snapshots = getattr(ops, "snapshots", None)
        if snapshots is not None and hasattr(snapshots, "ttl"):
            snapshots.ttl = cap
        options = getattr(getattr(ops, "views", None), "options", None)
        if isinstance(options, dict):
            options["entry_timeout"] = options["attr_timeout"] = seconds

    def _set_sync(self, mode: str) -> None:
        if mode not in SYNC_MODES:
            raise SettingRefused(errno.EINVAL, f"sync must be one of {', '.join(SYNC_MODES)}")
        meta = self.ops.meta
        set_sync = getattr(meta, "set_sync", None)
        if set_sync is None:  # gvfsd-metadata owns durability of the stores it writes
            raise SettingRefused(errno.ENOTSUP, "gvfsd-metadata writes this store and decides "
                                 "when it reaches the disk")
        set_sync(mode)
        options = getattr(getattr(self.ops, "views", None), "options", None)
        if isinstance(options, dict):
            options["sync"] = mode

    async def _set_readonly(self, text: str) -> None:
        if text not in ("0", "1"):
            log.warning("user.journalfs.ro must be 0 or 1, not %r", text)
            raise pyfuse3.FUSEError(errno.EINVAL)
        ops = self.ops
        readonly = text == "1"
        if not readonly and ops.readonly and self.store_readonly():
            log.warning("cannot make the mount writable: it was mounted read-only, so its "
                        "metadata store is open read-only (unmount and mount it rw)")
            raise pyfuse3.FUSEError(errno.EROFS)
        ops.readonly = readonly
        options = getattr(getattr(ops, "views", None), "options", None)
        if isinstance(options, dict):
            options["ro"] = readonly
        if readonly:  # what was written so far is durable before the mount turns read-only
            await ops.meta.sync()

    def store_readonly(self) -> bool:
        """Whether the metadata store was opened read-only (a mount made with -o ro)."""
        store = getattr(self.ops.meta, "store", None)
        return bool(getattr(store, "readonly", False))

    def _set_log_level(self, text: str) -> None:
        if text.lower() not in LOG_LEVELS:
            raise SettingRefused(errno.EINVAL, f"log_level must be one of {', '.join(LOG_LEVELS)}")
        logging.getLogger().setLevel(text.upper())
        trace_requests(self.ops, text.lower() == "debug")
