"""The typed boundary to a metadata store: write operations as values, and the one Protocol
every store backend serves (the embedded :class:`~.service.MetaService` and the gvfsd D-Bus
backend). Paths, keys and values are ``str`` decoded with surrogateescape: any bytes without
a NUL round-trip (gvfs keeps C strings)."""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

Value = Union[str, list[str]]


# Each write operation is its own frozen type (the store dispatches on ``type(op)``); the
# fields they share are declared once, in the private bases below.
_operation = dataclass(frozen=True, slots=True)


@_operation
class _OnPath:
    path: str


@_operation
class _OnKey(_OnPath):
    key: str


@_operation
class _FromTo:
    src: str
    dst: str


@_operation
class SetOp(_OnKey):
    value: Value


@_operation
class UnsetOp(_OnKey):
    """Drop one key of a path."""


@_operation
class RemoveOp(_OnPath):
    """Remove a path and everything below it."""


@_operation
class CopyOp(_FromTo):
    """dst (and below) becomes a copy of src (and below)."""


@_operation
class MoveOp(_FromTo):
    """COPY(dst <- src) then REMOVE(src), as gvfs journals a move."""


WriteOp = Union[SetOp, UnsetOp, RemoveOp, CopyOp, MoveOp]


class InvalidMetadata(OSError, ValueError):
    """A path, key or value the store cannot hold (empty key, NUL byte): EINVAL."""

    def __init__(self, message: str):
        super().__init__(errno.EINVAL, message)


@runtime_checkable
class MetadataBackend(Protocol):
    """What the FUSE layer needs from a metadata store. Errors are OSErrors with a real errno
    (E2BIG entry too large, ENOSPC/EDQUOT disk full, EINVAL bad key, EIO damaged store,
    EBUSY store locked); callers map ``exc.errno`` and never look at class names."""

    async def run(self, *, task_status=...) -> None:
        """Serve until cancelled (background commit, flush and rotation tasks); on the way
        out make every acknowledged write durable."""

    async def get(self, path: str, key: str) -> Value | None: ...

    async def get_all(self, path: str) -> dict[str, Value]: ...

    async def set(self, path: str, key: str, value: Value) -> object: ...

    async def unset(self, path: str, key: str) -> object: ...

    async def remove(self, path: str) -> object: ...

    async def move(self, src: str, dst: str) -> object: ...

    async def copy(self, src: str, dst: str) -> object: ...

    async def sync(self) -> None:
        """Every write acknowledged before this call is durable when it returns."""

    async def compact(self) -> None: ...

    def status(self) -> dict: ...
