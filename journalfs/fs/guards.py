"""What may leave a FUSE handler: only ``FUSEError`` (pyfuse3 ends the whole mount on any
other exception). Every handler of ``JournalFS`` is :func:`guarded`, or, for the hottest
ones (getattr, lookup, getxattr, listxattr, setxattr), :func:`guards_itself`: the same
translation written in its own body, which saves a wrapper coroutine per request (ARCHITECTURE.md:
"A syscall"). ``tests/test_fs_handlers.py`` checks both kinds."""
from __future__ import annotations

import errno
import functools
import logging
from typing import Any, Callable, TypeVar

import pyfuse3
import trio

log = logging.getLogger("journalfs.fs")

F = TypeVar("F", bound=Callable[..., Any])
#: How a handler keeps other exceptions in: "wrapped" (guarded) or "inline" (guards_itself)
GUARD = "_journalfs_guard"


def fuse_error(exc: Exception, what: str) -> pyfuse3.FUSEError:
    """What a handler raises for ``exc``: FUSEError as is, OSError with its errno, anything
    else logged and EIO."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, OSError):
        return pyfuse3.FUSEError(exc.errno or errno.EIO)
    log.error("%s failed", what, exc_info=exc)
    return pyfuse3.FUSEError(errno.EIO)


def guarded(fn: F) -> F:
    """Only FUSEError may leave a handler: OSError keeps its errno, anything else is EIO."""
    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            raise fuse_error(exc, fn.__name__) from None
    setattr(handler, GUARD, "wrapped")
    return handler  # type: ignore[return-value]


def guards_itself(fn: F) -> F:
    """Marks a hot handler whose whole body is ``try: ... except Exception as exc: raise
    fuse_error(exc, name) from None``: :func:`guarded`'s translation without its extra
    coroutine (~0.17 µs and three allocations per request, measured on this machine)."""
    setattr(fn, GUARD, "inline")
    return fn


async def in_thread(fn: Callable, *args: Any, limiter=None) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)
