"""The typed boundary to a metadata store: write operations as values, and the one Protocol
every store backend serves (the embedded :class:`~.service.MetaService` and the gvfsd D-Bus
backend). Paths, keys and values are ``str`` decoded with surrogateescape: any bytes without
a NUL round-trip (gvfs keeps C strings)."""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Union, runtime_checkable

import trio

from .ledger import Ledger

Value = Union[str, list[str]]


# Each write operation is its own frozen type (the store dispatches on ``type(op)``); the
# fields they share are declared once, in the private bases below (spelled out on each:
# type checkers see a dataclass only through the decorator itself).


@dataclass(frozen=True, slots=True)
class _OnPath:
    path: str


@dataclass(frozen=True, slots=True)
class _OnKey(_OnPath):
    key: str


@dataclass(frozen=True, slots=True)
class _FromTo:
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class SetOp(_OnKey):
    value: Value


@dataclass(frozen=True, slots=True)
class UnsetOp(_OnKey):
    """Drop one key of a path."""


@dataclass(frozen=True, slots=True)
class RemoveOp(_OnPath):
    """Remove a path and everything below it."""


@dataclass(frozen=True, slots=True)
class CopyOp(_FromTo):
    """dst (and below) becomes a copy of src (and below)."""


@dataclass(frozen=True, slots=True)
class MoveOp(_FromTo):
    """COPY(dst <- src) then REMOVE(src), as gvfs journals a move."""


WriteOp = Union[SetOp, UnsetOp, RemoveOp, CopyOp, MoveOp]


def below(path: str, root: str) -> str | None:
    """The rest of store path ``path`` below ``root`` ("" for root itself), or None if it is
    not inside."""
    if root == "/":
        return path if path != "/" else ""
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root):]
    return None


def keyed_below(dump: Mapping[str, Mapping[str, Value]], root: str) -> dict[str, dict[str, Value]]:
    """{path below root ("" = root): keys} of every path of ``dump`` at or below ``root``
    that has keys (what a backend's ``subtree`` answers)."""
    found = {}
    for path, keys in dump.items():
        rest = below(path, root)
        if rest is not None and keys:
            found[rest] = dict(keys)
    return found


class InvalidMetadata(OSError, ValueError):
    """A path, key or value the store cannot hold (empty key, NUL byte): EINVAL."""

    def __init__(self, message: str):
        super().__init__(errno.EINVAL, message)


class NotSupported(OSError):
    """What a backend cannot do (ENOTSUP): set the durability of a store another process
    writes, rotate a store on request. The message is the one line a user reads."""

    def __init__(self, message: str):
        super().__init__(errno.ENOTSUP, message)

    def __str__(self) -> str:
        return self.strerror or ""


#: what a gvfsd-metadata-written store answers to a sync mode or a rotation (one wording)
GVFSD_DECIDES_SYNC = "gvfsd-metadata writes this store and decides when it reaches the disk"
GVFSD_DECIDES_ROTATION = ("gvfsd-metadata writes this store and rotates it on its own "
                          "schedule (60 s after changes, and when it exits); nothing can "
                          "ask it to rotate now")


@runtime_checkable
class MetadataBackend(Protocol):
    """Everything the mount (fs/) needs from a metadata store, and the only way it reaches
    one: the embedded store (:class:`~.service.MetaService`), gvfsd-metadata over D-Bus
    (:class:`~.gvfsd.GvfsdBackend`), the session's store served or joined
    (:class:`~.gvfs_service.SessionStoreBackend`) and the mirroring wrapper
    (:class:`~.mirror.MirroredBackend`) all serve it; :func:`~.gvfs_service.open_metadata_backend`
    chooses one. Errors are OSErrors with a real errno (E2BIG entry too large, ENOSPC/EDQUOT
    disk full, EINVAL bad key, EIO damaged store, EBUSY store locked, ENOTSUP
    :class:`NotSupported`); callers map ``exc.errno`` and never look at class names.

    What a backend cannot do it says up front (``sync_mode`` None, ``rotations()`` None)
    and refuses with :class:`NotSupported` when asked anyway. A backend that learns who
    writes the store only in :meth:`run` (the session's store: serve or join) claims
    nothing before: ``sole_writer`` False, ``ledger`` None."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (background commit, flush and rotation tasks); on the way
        out make every acknowledged write durable."""

    async def get(self, path: str, key: str) -> Value | None: ...

    async def get_all(self, path: str) -> dict[str, Value]: ...

    async def set(self, path: str, key: str, value: Value) -> object: ...

    def set_now(self, path: str, key: str, value: Value) -> bool:
        """:meth:`set`, done on the caller's thread if that takes no wait (no lock held
        elsewhere, no rotation, no fsync, no message): True once done -- durable as
        :meth:`set` would make it -- False when :meth:`set` must do it (then nothing was
        written). A bad write raises as :meth:`set` does. Backends that cannot say False."""

    async def unset(self, path: str, key: str) -> object: ...

    async def remove(self, path: str) -> object: ...

    async def move(self, src: str, dst: str) -> object: ...

    async def copy(self, src: str, dst: str) -> object: ...

    async def sync(self) -> None:
        """Every write acknowledged before this call is durable when it returns."""

    async def compact(self) -> None:
        """Rotate the store now (its journal folded into a new tree) and return when done;
        :class:`NotSupported` where another process decides when (gvfsd-metadata)."""

    def rotations(self) -> int | None:
        """Rotations this backend made so far; None: it does not rotate the store itself
        (then :meth:`compact` raises NotSupported). Memory only."""

    @property
    def sync_mode(self) -> str | None:
        """The durability of acknowledged writes (one of ``options.SYNC_MODES``), owned
        here and nowhere else; None: not this backend's to decide (gvfsd-metadata)."""

    def set_sync(self, mode: str) -> None:
        """Change :attr:`sync_mode` at run time: ValueError for a mode not in SYNC_MODES,
        :class:`NotSupported` where ``sync_mode`` is None."""

    @property
    def readonly(self) -> bool:
        """The store was opened read-only (a mount made with ``-o ro``): every write fails."""

    @property
    def sole_writer(self) -> bool:
        """Only this process writes the store, so a value read stays true until this
        process changes it: callers may cache values (and the store keeps a ledger)."""

    @property
    def ledger(self) -> Ledger | None:
        """Who owns each path's metadata and the quota (:mod:`.ledger`), where this backend
        keeps one (the embedded store, writable); None elsewhere."""

    def journal_path(self) -> str | None:
        """The journal file being written now (None: the store has none yet). It may read
        the store's files (gvfsd may have rotated): call it from a worker thread."""

    def status(self) -> dict[str, Any]:
        """The store's figures for status.json (``tree_path``, ``journal_path``, ``fill``,
        ``entries``, ``rotations``, ...). It may wait for the store's lock or read its
        files: call it from a worker thread."""
