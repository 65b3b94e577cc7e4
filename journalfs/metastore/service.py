"""The async face of a metadata store for the FUSE layer (trio): group commit and rotation.

Every store call runs in ``trio.to_thread`` (lookups touch an mmap that may page-fault, so none
is run inline). Under ``sync="batch"`` a write returns only once a group fsync covers its
ticket; the commit task collects writes for ``batch_delay`` seconds and fsyncs once for all.
Rotation runs in a thread when the journal passes ``fill_threshold``, after ``quiet_seconds``
without writes (if anything changed), on :meth:`compact`, and at shutdown.
"""
from __future__ import annotations

import math
import time

import trio


class MetaService:
    def __init__(self, store, *, sync: str | None = None, batch_delay: float = 0.002,
                 fill_threshold: float = 0.75, quiet_seconds: float = 60):
        self.store = store
        self.sync = sync or getattr(store, "sync", "batch")
        self.batch_delay = batch_delay
        self.fill_threshold = fill_threshold
        self.quiet_seconds = quiet_seconds
        self._durable = 0
        self._pending = 0              # highest ticket handed out that may not be durable
        self._commit_wanted = trio.Event()
        self._durable_changed = trio.Event()
        self._rotate_wanted = trio.Event()
        self._last_write = math.inf
        self._commit_error: BaseException | None = None
        self._rotation_lock = trio.Lock()

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
                await trio.to_thread.run_sync(self._shutdown)

    def _shutdown(self) -> None:
        self.store.close()  # flushes and rotates if dirty

    async def _commit_task(self) -> None:
        while True:
            await self._commit_wanted.wait()
            await trio.sleep(self.batch_delay)  # let more writers join this fsync
            self._commit_wanted = trio.Event()
            try:
                self._durable = await trio.to_thread.run_sync(self.store.flush)
                self._commit_error = None
            except OSError as exc:
                self._commit_error = exc
            event, self._durable_changed = self._durable_changed, trio.Event()
            event.set()

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

    async def _write(self, fn, *args) -> int:
        def write_and_check():  # the fill check takes the store lock: keep it off trio's thread
            return fn(*args), self._needs_rotation()
        ticket, full = await self._call(write_and_check)
        self._last_write = time.monotonic()
        if full:
            self._rotate_wanted.set()
        if self.sync == "batch" and isinstance(ticket, int):
            while self._durable < ticket:
                event = self._durable_changed
                self._commit_wanted.set()
                await event.wait()
                if self._commit_error is not None and self._durable < ticket:
                    raise self._commit_error
        return ticket

    async def get(self, path, key):
        return await self._call(self.store.get, path, key)

    async def get_all(self, path):
        return await self._call(self.store.get_all, path)

    async def set(self, path, key, value):
        return await self._write(self.store.set, path, key, value)

    async def unset(self, path, key):
        return await self._write(self.store.unset, path, key)

    async def remove(self, path):
        return await self._write(self.store.remove, path)

    async def move(self, src, dst):
        return await self._write(self.store.move, src, dst)

    async def copy(self, src, dst):
        return await self._write(self.store.copy, src, dst)

    async def compact(self) -> None:
        async with self._rotation_lock:
            await trio.to_thread.run_sync(self.store.rotate)

    def status(self) -> dict:
        status = dict(self.store.status())
        status.update(service_sync=self.sync, batch_delay=self.batch_delay,
                      fill_threshold=self.fill_threshold, quiet_seconds=self.quiet_seconds)
        return status
