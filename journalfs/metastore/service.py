"""The async face of a metadata store for the FUSE layer (trio): durability per ``--sync``,
group commit, background flush and rotation.

Writes (typed ops, :mod:`.backend`):

* ``batch`` (default) and ``none``: a write that finds the store lock free and the journal
  roomy is appended inline on the trio thread (``MetaStore.try_append``, ``set_now``: the
  entry, then the count, copied into the writer's shared mapping of the preallocated
  journal, i.e. into the kernel's page cache) and acknowledged at once; kill -9 of the
  daemon cannot lose it. Under ``batch`` a background flusher fdatasyncs the journal within
  ``flush_delay`` (+ the fdatasync itself, well under 1 s) of the first unflushed write.
* ``always``: writes are queued and applied by one commit task, everything queued while the
  previous commit ran in ONE worker-thread call (``MetaStore.write_many``: one append, one
  fdatasync), every writer of that commit woken by one event.
* :meth:`MetaService.sync` makes every earlier acknowledged write durable (fsync, fsyncdir,
  syncfs); shutdown does too.

Reads: :meth:`get` / :meth:`get_all` answer inline on the trio thread whenever the store lock
is free (``store.try_get_all``: the journal index and the mapped tree, memory only); only
while a rotation or a worker-thread commit holds the lock do they wait in ``trio.to_thread``.

Rotation runs in a thread when the journal passes ``fill_threshold``, after ``quiet_seconds``
without writes (if anything changed), on :meth:`compact`, and at shutdown. A background task
that fails (a full disk, an I/O error) never ends the daemon: the failure is logged, listed in
``status()["background_errors"]`` and the work retried later.
"""
from __future__ import annotations

import logging
import math
import time

from typing import Any, Mapping

import trio

from .backend import CopyOp, MoveOp, RemoveOp, SetOp, UnsetOp, Value, WriteOp, keyed_below
from .ledger import Ledger
from ..options import SYNC_MODES
from .store import MetaStore, RotationPostponed, canonical

log = logging.getLogger(__name__)

BACKGROUND_ERRORS_KEPT = 20
RETRY_SECONDS = 1.0


class _Commit:
    """The writes of one group commit and the event that wakes their writers."""

    __slots__ = ("ops", "results", "done")

    def __init__(self) -> None:
        self.ops: list[WriteOp] = []
        self.results: list[int | BaseException] = []
        self.done = trio.Event()


class MetaService:
    """The embedded store as a :class:`~.backend.MetadataBackend`. The sync mode is the
    store's own (``MetaStore.sync``, which decides its fsyncs): read and changed here."""

    def __init__(self, store: MetaStore, *, sync: str | None = None, batch_delay: float = 0.0,
                 fill_threshold: float = 0.75, quiet_seconds: float = 60,
                 flush_delay: float = 0.2):
        self.store = store
        if sync is not None:
            self.set_sync(sync)
        self.batch_delay = batch_delay  # extra wait before a commit (more writers join it)
        self.fill_threshold = fill_threshold
        self.quiet_seconds = quiet_seconds
        self.flush_delay = flush_delay  # batch: how long unflushed writes may wait to group
        self._queued = _Commit()
        self._commit_wanted = trio.Event()
        self._rotate_wanted = trio.Event()
        self._flush_wanted = trio.Event()
        self._last_write = math.inf
        self._rotation_lock = trio.Lock()
        self.commits = 0
        self.background_flushes = 0
        self.background_errors: list[dict[str, Any]] = []
        self.background_error_count = 0

    # ----------------------------------------------------------------------------- lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._commit_task)
                nursery.start_soon(self._rotation_task)
                nursery.start_soon(self._flush_task)  # idle unless batch writes wake it
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self._commit_queued()  # writers still waiting get their answer
                await trio.to_thread.run_sync(self.store.close)  # flushes; rotates if dirty

    # ----------------------------------------------------------------------------- settings
    @property
    def sync_mode(self) -> str:
        return self.store.sync

    def set_sync(self, mode: str) -> None:
        """Switch the durability mode at run time (the mount's `user.journalfs.sync`)."""
        if mode not in SYNC_MODES:
            raise ValueError(f"unknown sync mode {mode!r}")
        self.store.sync = mode

    @property
    def readonly(self) -> bool:
        return self.store.readonly

    @property
    def sole_writer(self) -> bool:
        # the store lock is ours (a read-only store is not locked: others may write it)
        return not self.store.readonly

    @property
    def ledger(self) -> Ledger | None:
        return self.store.ledger if not self.store.readonly else None

    def rotations(self) -> int:
        return self.store.rotations

    def journal_path(self) -> str | None:
        return self.store.journal_path or None

    def _background_failure(self, task: str, exc: BaseException) -> None:
        """Log and record a failure of background work; the caller retries later."""
        self.background_error_count += 1
        self.background_errors.append({"time": time.time(), "task": task,
                                       "error": f"{type(exc).__name__}: {exc}"})
        del self.background_errors[:-BACKGROUND_ERRORS_KEPT]
        log.error("metadata store %s: background %s failed (will retry): %s",
                  self.store.tree_path, task, exc)

    async def _commit_task(self) -> None:
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted = trio.Event()
            if self.batch_delay:
                await trio.sleep(self.batch_delay)
            await self._commit_queued()

    async def _commit_queued(self) -> None:
        """Hand everything queued so far to the store in one worker-thread call."""
        commit, self._queued = self._queued, _Commit()
        if not commit.ops:
            return
        durable = self.sync_mode == "always"

        def apply() -> tuple[list[int | BaseException], bool]:  # the fill check takes the store lock: keep it off trio's thread
            return self.store.write_many(commit.ops, durable=durable), self._needs_rotation()
        try:
            commit.results, full = await trio.to_thread.run_sync(apply)
        except Exception as exc:  # e.g. the fdatasync failed: every writer of this commit sees it
            commit.results, full = [exc] * len(commit.ops), False
        finally:
            commit.done.set()
        self.commits += 1
        self._wrote()
        if full:
            self._rotate_wanted.set()

    def _wrote(self) -> None:
        self._last_write = time.monotonic()
        if self.store.sync == "batch":
            self._flush_wanted.set()

    async def _flush_task(self) -> None:
        """batch: fdatasync the journal shortly after each write, so a write is durable
        within a second of its acknowledgement (retried while it fails)."""
        while True:
            await self._flush_wanted.wait()
            await trio.sleep(self.flush_delay)
            self._flush_wanted = trio.Event()
            try:
                await trio.to_thread.run_sync(self.store.flush)
                self.background_flushes += 1
            except OSError as exc:
                self._background_failure("flush", exc)
                self._flush_wanted.set()
                await trio.sleep(RETRY_SECONDS)

    async def _rotation_task(self) -> None:
        while True:
            with trio.move_on_after(min(self.quiet_seconds, 5.0)):
                await self._rotate_wanted.wait()
            self._rotate_wanted = trio.Event()
            quiet = time.monotonic() - self._last_write >= self.quiet_seconds
            try:
                if await trio.to_thread.run_sync(self._needs_rotation) or \
                        (quiet and self.store.dirty):
                    await self.compact()
            except RotationPostponed:
                pass  # backing off after a failure for want of space: already reported
            except Exception as exc:  # a full disk: the old tree and journal stay in use
                self._background_failure("rotation", exc)

    def _needs_rotation(self) -> bool:
        return self.store.needs_rotation(self.fill_threshold)

    # ----------------------------------------------------------------------------- writes
    def _write_now(self, op: WriteOp) -> int | None:
        """``op`` appended on this thread if that takes no wait (``batch``/``none``, nothing
        queued before it, the store lock free, room in the journal): its ticket, else None."""
        if self.store.sync == "always" or self._queued.ops:
            return None
        return self._applied(self.store.try_append(op))

    def _applied(self, applied: tuple[int, float] | None) -> int | None:
        """The ticket of a write the store took inline (try_append), with what follows it:
        the background flush, and a rotation once the journal is full enough."""
        if applied is None:
            return None
        ticket, fill = applied
        self._wrote()
        if fill >= self.fill_threshold:
            self._rotate_wanted.set()
        return ticket

    def set_now(self, path: str, key: str, value: Value) -> bool:
        if self._queued.ops:  # (and under "always" try_set says None)
            return False
        return self._applied(self.store.try_set(path, key, value)) is not None

    async def write(self, op: WriteOp) -> int:
        """Apply one write; return its ticket once it is in the journal (and, under
        ``always``, fdatasynced) -- or raise what applying it raised (an OSError)."""
        ticket = self._write_now(op)
        if ticket is not None:
            return ticket
        commit = self._queued
        slot = len(commit.ops)
        commit.ops.append(op)
        self._commit_wanted.set()
        await commit.done.wait()
        if slot >= len(commit.results):
            raise RuntimeError("the metadata service stopped before this write was applied")
        result = commit.results[slot]
        if isinstance(result, BaseException):
            raise result
        return result

    async def set(self, path: str, key: str, value: Value) -> int:
        return await self.write(SetOp(path, key, value))

    async def unset(self, path: str, key: str) -> int:
        return await self.write(UnsetOp(path, key))

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None:
        """{key: value, None = unset} at ``path``, one write per key."""
        for key, value in changes.items():
            if value is None:
                await self.unset(path, key)
            else:
                await self.set(path, key, value)

    def _nothing_to_restructure(self, *paths: str) -> bool:
        """A remove/move of paths with no metadata at or below them is a no-op: skip its
        journal entries (a rename of a plain file then costs the store nothing). Only when
        no write waits in the queue: each acknowledged write is in the store already."""
        return not self._queued.ops and self.store.holds_nothing_at(*paths)

    # The ledger (who owns each path's metadata, quota) follows every structural change;
    # its records are written by the mount, which knows the files (fs/ownership.py).
    async def remove(self, path: str) -> int:
        ticket = self.store.ticket
        if not self._nothing_to_restructure(path):
            ticket = await self.write(RemoveOp(path))
        if self.store.ledger is not None:
            self.store.ledger.removed(canonical(path))
        return ticket

    async def move(self, src: str, dst: str) -> int:
        ticket = self.store.ticket
        if not self._nothing_to_restructure(src, dst):  # dst too: a move clears what it had
            ticket = await self.write(MoveOp(src, dst))
        if self.store.ledger is not None:
            self.store.ledger.moved(canonical(src), canonical(dst))
        return ticket

    async def copy(self, src: str, dst: str) -> int:
        ticket = await self.write(CopyOp(src, dst))
        if self.store.ledger is not None:
            self.store.ledger.moved(canonical(src), canonical(dst), copy=True)
        return ticket

    async def sync(self) -> None:
        """Make every write acknowledged before this call durable (fdatasync of the journal;
        writes of a rotation are fsynced by the rotation itself)."""
        await trio.to_thread.run_sync(self.store.flush)

    async def compact(self) -> None:
        async with self._rotation_lock:
            await trio.to_thread.run_sync(self.store.rotate)

    # ----------------------------------------------------------------------------- reads
    def get_cached(self, path: str, key: str | None = None) -> tuple[bool, Any]:
        """``(True, answer)`` if the answer is in memory, else ``(False, None)``; inline-safe
        (no lock wait, no file access). ``key=None``: all keys, as :meth:`get_all`."""
        found: tuple[bool, Any] = self.store.peek(path, key)
        return found

    async def get(self, path: str, key: str) -> Value | None:
        return (await self.get_all(path)).get(key)

    async def get_all(self, path: str) -> dict[str, Value]:
        # inline unless the store lock is busy (a rotation's swap, a thread's commit): all
        # keys, so the store caches the node and the next read of it is a dict lookup
        values = self.store.try_get_all(path)
        if values is None:
            values = await trio.to_thread.run_sync(self.store.get_all, path)
        return values

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        """{path below root ("" = root): keys} of every keyed path at or below ``root``
        (one pass over the store, in a worker thread)."""
        return await trio.to_thread.run_sync(lambda: keyed_below(self.store.dump(), root))

    def status(self) -> dict[str, Any]:
        status = dict(self.store.status())
        status.update(service_sync=self.sync_mode, batch_delay=self.batch_delay,
                      fill_threshold=self.fill_threshold, quiet_seconds=self.quiet_seconds,
                      flush_delay=self.flush_delay, group_commits=self.commits,
                      background_flushes=self.background_flushes,
                      background_errors=list(self.background_errors),
                      background_error_count=self.background_error_count)
        return status
