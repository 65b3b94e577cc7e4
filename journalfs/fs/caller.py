"""Acting with a request's credentials (fsuid/fsgid, supplementary groups, capabilities)."""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Callable

from .linuxcalls import IS_ROOT, check, libc

_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(os.uname().machine)
CAP_SYS_ADMIN = 21
_CAP_SYS_RESOURCE = 24
_CAPABILITY_VERSION_3 = 0x20080522
_setfsuid, _setfsgid, _capset = libc.setfsuid, libc.setfsgid, libc.capset


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def capabilities() -> tuple[_CapHeader, ctypes.Array] | None:
    """This thread's capability sets (capget), or None where that fails."""
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return None
    return header, data


class Caller:
    """Acts with a request's credentials: fsuid/fsgid and supplementary groups are
    per thread on Linux (raw syscalls; glibc's setgroups would change every thread).

    As the caller, the thread also drops CAP_SYS_RESOURCE from its effective set (capset is
    per thread too): ext4 lets root's reserved blocks and disk quotas be overrun by an fsuid
    0 *or* a CAP_SYS_RESOURCE writer, so only both make a user's writes and creations stop
    at the reserve and their quota as on SOURCE (setfsuid itself drops only the fs caps)."""

    def __init__(self):
        self._groups: dict[int, tuple[float, list[int]]] = {}
        self._own_groups = os.getgroups()
        caps = capabilities() if IS_ROOT else None
        self._caps = self._caps_as_user = None  # (header, data) for capset, as pointers
        if caps is not None and caps[1][0].effective >> _CAP_SYS_RESOURCE & 1:
            self._kept = (caps, capabilities())
            self._kept[1][1][0].effective &= ~(1 << _CAP_SYS_RESOURCE)
            self._caps, self._caps_as_user = (
                (ctypes.byref(header), data) for header, data in self._kept)

    def groups(self, pid: int) -> list[int]:
        now = time.monotonic()
        cached = self._groups.get(pid)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        groups: list[int] = []
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Groups:"):
                        groups = [int(g) for g in line.split()[1:]]
                        break
        except (OSError, ValueError):
            pass
        if len(self._groups) > 1024:
            self._groups.clear()
        self._groups[pid] = (now, groups)
        return groups

    def run(self, ctx, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` as the caller (as ourselves when we are not root or it is root)."""
        if not IS_ROOT or ctx is None or (ctx.uid == 0 and ctx.gid == 0) or _SYS_SETGROUPS is None:
            return fn(*args)
        groups = self.groups(ctx.pid) if ctx.pid else []
        self._setgroups(groups)
        try:
            return self.as_user(ctx.uid, ctx.gid, fn, *args)
        finally:
            self._setgroups(self._own_groups)

    def as_user(self, uid: int, gid: int, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` with fsuid ``uid``, fsgid ``gid`` and no CAP_SYS_RESOURCE (for
        writes of file data: no permission check needs the groups then)."""
        if not IS_ROOT or (uid == 0 and gid == 0):
            return fn(*args)
        drop = uid != 0 and self._caps_as_user is not None  # root keeps root's reserve
        if drop and _capset(*self._caps_as_user) != 0:
            check(-1)
        _setfsgid(gid)
        _setfsuid(uid)  # drops the fs capabilities from the effective set
        try:
            return fn(*args)
        finally:
            _setfsuid(0)
            _setfsgid(0)
            if drop and _capset(*self._caps) != 0:
                check(-1)

    @staticmethod
    def _setgroups(groups: list[int]) -> None:
        arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
        check(libc.syscall(_SYS_SETGROUPS, len(groups), arr))

    def capable(self, ctx, cap: int) -> bool:
        """Whether the calling process holds capability ``cap`` (effective set)."""
        if ctx is None or not ctx.pid:
            return ctx is not None and ctx.uid == 0
        try:
            with open(f"/proc/{ctx.pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"CapEff:"):
                        return bool(int(line.split()[1], 16) >> cap & 1)
        except (OSError, ValueError):
            pass
        return ctx.uid == 0
