"""Runtime settings of a mount as extended attributes of ``MNT/.journalfs`` (as mergerfs
does on its control file)::

    getfattr -d MNT/.journalfs                               # show them
    setfattr -n user.journalfs.timeout -v 5 MNT/.journalfs   # kernel cache timeout, seconds
    setfattr -n user.journalfs.sync -v always MNT/.journalfs # metadata durability
    setfattr -n user.journalfs.log_level -v debug MNT/.journalfs
    setfattr -n user.journalfs.rotate -v 1 MNT/.journalfs    # rotate the store now
    setfattr -n user.journalfs.ro -v 1 MNT/.journalfs        # refuse every change (EROFS)

``user.journalfs.ro`` is what ``mount -o remount,ro MNT`` (and ``journalfs mount -o
remount,ro MNT``) sets before it flips the kernel's read-only flag: 1 makes the daemon itself
refuse every change with EROFS, metadata included, and makes the metadata written so far
durable; 0 allows changes again (after the kernel's flag is cleared: while the kernel's flag is
set it refuses this setxattr itself). A mount made with ``-o ro`` opened its metadata store
read-only and stays read-only.

Anyone who can see the mount may read them; only the mount's owner (the user the daemon runs
as) and root may change them, others get EPERM. ``user.journalfs.rotate`` reads as the number
of rotations done so far; writing any value rotates the store and returns when it is done.
A refused value answers EINVAL; a setting the store does not have (``sync`` and ``rotate``
where gvfsd-metadata writes the store: it decides durability and rotation itself) is not
listed, and setting it answers ENOTSUP. The reason goes to the daemon's log and to
status.json's ``last_error``. ``log_level=debug`` traces every
request, as ``-d`` does at mount time; another level stops the tracing again.
"""
from __future__ import annotations

import errno
import functools
import inspect
import logging
import os
import time
from typing import Any, Callable

import pyfuse3

from ..metastore.backend import MetadataBackend, NotSupported
from ..options import SYNC_MODES
from .settings import OptionError, RuntimeSettings, parse_timeout

log = logging.getLogger("journalfs.fs.control")

PREFIX = b"user.journalfs."
LOG_LEVELS = ("debug", "info", "warning", "error")
#: every setting there is (a store may not have all: see the module doc)
SETTINGS = (b"timeout", b"ro", b"log_level", b"sync", b"rotate")
#: no setting takes a longer value; a longer one is cut before it reaches a log line
MAX_VALUE_SHOWN = 64


class SettingRefused(Exception):
    """A value a setting does not take: the errno the caller gets and the reason the log gets."""

    def __init__(self, errno_: int, reason: str):
        super().__init__(reason)
        self.errno, self.reason = errno_, reason


class Control:
    """Reads and changes the settings of one running mount: ``settings`` (their owner, with
    the store backend), ``trace(on)`` turns request tracing on or off."""

    def __init__(self, settings: RuntimeSettings, trace: Callable[[bool], None],
                 owner_uid: int | None = None):
        self.settings = settings
        self.trace = trace
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        #: status.json's "last_error": the last setting refused, with why (None until one is)
        self.last_error: dict[str, Any] | None = None

    @property
    def backend(self) -> MetadataBackend:
        return self.settings.backend

    # -- reading (memory only: inline on the request thread)
    def _current(self) -> dict[bytes, str]:
        settings = self.settings
        values = {b"timeout": f"{settings.timeout:g}",
                  b"ro": "1" if settings.readonly else "0",
                  b"log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()}
        if settings.sync is not None:
            values[b"sync"] = settings.sync
        rotations = self.backend.rotations()
        if rotations is not None:
            values[b"rotate"] = str(rotations)
        return values

    async def listxattr(self) -> list[bytes]:
        return [PREFIX + name for name in self._current()]

    async def getxattr(self, name: bytes) -> bytes:
        setting = self._setting(name)
        value = self._current().get(setting) if setting is not None else None
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value.encode()

    @staticmethod
    def _setting(name: bytes) -> bytes | None:
        return name[len(PREFIX):] if name.startswith(PREFIX) else None

    # -- changing --------------------------------------------------------------------------
    async def setxattr(self, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        setting = self._setting(name)
        if setting is None:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        if setting not in SETTINGS:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
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
            await self._rotate()

    def _set_timeout(self, text: str) -> None:
        try:
            seconds = parse_timeout(text)
        except OptionError as exc:
            raise SettingRefused(errno.EINVAL, str(exc)) from None
        self.settings.set_timeout(seconds)

    def _set_sync(self, mode: str) -> None:
        if mode not in SYNC_MODES:
            raise SettingRefused(errno.EINVAL, f"sync must be one of {', '.join(SYNC_MODES)}")
        try:
            self.settings.set_sync(mode)
        except NotSupported as exc:
            raise SettingRefused(errno.ENOTSUP, str(exc)) from None

    async def _rotate(self) -> None:
        log.info("rotation requested through %s", (PREFIX + b"rotate").decode())
        try:
            await self.backend.compact()
        except NotSupported as exc:
            raise SettingRefused(errno.ENOTSUP, str(exc)) from None

    async def _set_readonly(self, text: str) -> None:
        if text not in ("0", "1"):
            log.warning("user.journalfs.ro must be 0 or 1, not %r", text)
            raise pyfuse3.FUSEError(errno.EINVAL)
        readonly = text == "1"
        if not readonly and self.settings.readonly and self.backend.readonly:
            log.warning("cannot make the mount writable: it was mounted read-only, so its "
                        "metadata store is open read-only (unmount and mount it rw)")
            raise pyfuse3.FUSEError(errno.EROFS)
        self.settings.set_readonly(readonly)
        if readonly:  # what was written so far is durable before the mount turns read-only
            await self.backend.sync()

    def _set_log_level(self, text: str) -> None:
        if text.lower() not in LOG_LEVELS:
            raise SettingRefused(errno.EINVAL, f"log_level must be one of {', '.join(LOG_LEVELS)}")
        logging.getLogger().setLevel(text.upper())
        self.trace(text.lower() == "debug")


# -- request tracing (-d at mount time, log_level=debug at run time) -------------------------
def trace_requests(ops: pyfuse3.Operations, on: bool = True) -> None:
    """Log every FUSE request and its answer at debug level (``-d``, or ``log_level=debug``
    at run time): each operation of ``ops`` is wrapped on the instance, so nothing is paid
    while tracing is off; ``on=False`` puts the unwrapped handlers back."""
    untraced: dict[str, Callable[..., Any]] | None = ops.__dict__.get("_untraced_handlers")
    if not on:
        if untraced is not None:
            for name, handler in untraced.items():
                setattr(ops, name, handler)
            del ops.__dict__["_untraced_handlers"]
        return
    if untraced is not None:  # already tracing
        return
    trace = logging.getLogger("journalfs.requests")
    names = [n for n, f in inspect.getmembers(pyfuse3.Operations, inspect.iscoroutinefunction)
             if not n.startswith("_")]
    ops.__dict__["_untraced_handlers"] = untraced = {}
    for name in names:
        # the handlers are the instance's own, wrapped on the instance by name (pyfuse3
        # calls them by name): the one place attributes are reached by a computed name
        handler = untraced[name] = getattr(ops, name)

        @functools.wraps(handler)
        async def traced(*args: Any, _name: str = name, _handler: Callable[..., Any] = handler) -> Any:
            shown = ", ".join(_short(a) for a in args if not isinstance(a, pyfuse3.RequestContext))
            trace.debug("%s(%s)", _name, shown)
            try:
                result = await _handler(*args)
            except pyfuse3.FUSEError as exc:
                trace.debug("%s -> %s", _name, errno.errorcode.get(exc.errno, exc.errno))
                raise
            trace.debug("%s -> %s", _name, _short(result))
            return result
        setattr(ops, name, traced)


def _short(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) > 64:
        return f"<{len(value)} bytes>"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"<{len(value)} items>"
    if isinstance(value, pyfuse3.EntryAttributes):
        return f"<attrs ino={value.st_ino} mode={value.st_mode:o} size={value.st_size}>"
    return repr(value)
