"""The async face of a metadata store for the FUSE layer (trio): group commit and rotation.

Writes are queued on the trio thread and applied by one commit task: everything queued while
the previous commit ran goes to the store in ONE worker-thread call (``MetaStore.write_many``:
one pwrite for all entries, then one fsync under ``sync`` batch/always), and every writer of
that commit is woken by one event. Under ``sync="none"`` no fsync is made, and a write that
finds the store free and its journal roomy is appended inline (``MetaStore.try_append``).

Reads: :meth:`MetaService.get` / :meth:`get_all` answer inline (on the trio thread) when the
answer is already in memory -- decided by the journal index or by the store's cache of decoded
tree metadata, which get_all fills -- via ``store.peek``, which never blocks on the store lock, never touches the
mapped files and never does I/O; otherwise they run in ``trio.to_thread``.
:meth:`get_cached` is that inline half alone. Rotation runs in a thread when the journal
passes ``fill_threshold``, after ``quiet_seconds`` without writes (if anything changed), on
:meth:`compact`, and at shutdown.
"""
from __future__ import annotations

import math
import time

import trio


class _Commit:
    """The writes of one group commit and the event that wakes their writers."""

    __slots__ = ("calls", "results", "done")

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []
        self.results: list = []
        self.done = trio.Event()


class MetaService:
    def __init__(self, store, *, sync: str | None = None, batch_delay: float = 0.0,
                 fill_threshold: float = 0.75, quiet_seconds: float = 60):
        self.store = store
        self.sync = sync or getattr(store, "sync", "batch")
        self.batch_delay = batch_delay  # extra wait before a commit (more writers join it)
        self.fill_threshold = fill_threshold
        self.quiet_seconds = quiet_seconds
        self._queued = _Commit()
        self._commit_wanted = trio.Event()
        self._rotate_wanted = trio.Event()
        self._last_write = math.inf
        self._rotation_lock = trio.Lock()
        self.commits = 0

    # ----------------------------------------------------------------------------- lifecycle
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._commit_task)
                nursery.start_soon(self._rotation_task)
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self._commit_queued()  # writers still waiting get their answer
                await trio.to_thread.run_sync(self._shutdown)

    def _shutdown(self) -> None:
        self.store.close()  # flushes and rotates if dirty

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
        if not commit.calls:
            return
        durable = self.sync != "none"

        def apply():  # the fill check takes the store lock: keep it off trio's thread
            return self.store.write_many(commit.calls, durable=durable), self._needs_rotation()
        try:
            commit.results, full = await trio.to_thread.run_sync(apply)
        except Exception as exc:  # e.g. the fsync failed: every writer of this commit sees it
            commit.results, full = [exc] * len(commit.calls), False
        finally:
            commit.done.set()
        self.commits += 1
        self._last_write = time.monotonic()
        if full:
            self._rotate_wanted.set()

    async def _rotation_task(self) -> None:
        while True:
            with trio.move_on_after(min(self.quiet_seconds, 5.0)):
                await self._rotate_wanted.wait()
            self._rotate_wanted = trio.Event()
            quiet = time.monotonic() - self._last_write >= self.quiet_seconds
            if await trio.to_thread.run_sync(self._needs_rotation) or (quiet and getattr(self.store, "dirty", False)):
                await self.compact()

    def _needs_rotation(self) -> bool:
        check = getattr(self.store, "needs_rotation", None)
        if check is None:
            return False
        try:
            return check(self.fill_threshold)
        except TypeError:
            return check()

    # ----------------------------------------------------------------------------- calls
    async def _call(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args)

    async def _write(self, name: str, *args) -> int:
        """Queue one write for the next group commit; return its ticket once it is applied
        (and, unless sync is "none", fsynced) -- or raise what applying it raised. Under
        sync "none" a write that needs no lock wait, rotation or fsync is applied inline:
        one thread round trip costs far more than the append itself."""
        if self.sync == "none" and not self._queued.calls:
            append = getattr(self.store, "try_append", None)
            applied = append(name, args) if append is not None else None
            if applied is not None:
                ticket, fill = applied
                self._last_write = time.monotonic()
                if fill >= self.fill_threshold:
                    self._rotate_wanted.set()
                return ticket
        commit = self._queued
        slot = len(commit.calls)
        commit.calls.append((name, args))
        self._commit_wanted.set()
        await commit.done.wait()
        if slot >= len(commit.results):
            raise RuntimeError("the metadata service stopped before this write was applied")
        result = commit.results[slot]
        if isinstance(result, BaseException):
            raise result
        return result

    def get_cached(self, path, key=None):
        """``(True, answer)`` if the answer is in memory, else ``(False, None)``; inline-safe
        (no lock wait, no file access). ``key=None``: all keys, as :meth:`get_all`."""
        peek = getattr(self.store, "peek", None)
        return peek(path, key) if peek is not None else (False, None)

    async def get(self, path, key):
        found, value = self.get_cached(path, key)
        if found:
            return value
        if getattr(self.store, "peek", None) is None:
            return await self._call(self.store.get, path, key)
        # all keys, so the store caches the node and the next read of this path is inline
        return (await self._call(self.store.get_all, path)).get(key)

    async def get_all(self, path):
        found, value = self.get_cached(path)
        if found:
            return dict(value)
        return await self._call(self.store.get_all, path)

    async def set(self, path, key, value):
        return await self._write("set", path, key, value)

    async def unset(self, path, key):
        return await self._write("unset", path, key)

    async def remove(self, path):
        return await self._write("remove", path)

    async def move(self, src, dst):
        return await self._write("move", src, dst)

    async def copy(self, src, dst):
        return await self._write("copy", src, dst)

    async def compact(self) -> None:
        async with self._rotation_lock:
            await trio.to_thread.run_sync(self.store.rotate)

    def status(self) -> dict:
        status = dict(self.store.status())
        status.update(service_sync=self.sync, batch_delay=self.batch_delay,
                      fill_threshold=self.fill_threshold, quiet_seconds=self.quiet_seconds,
                      group_commits=self.commits)
        return status
