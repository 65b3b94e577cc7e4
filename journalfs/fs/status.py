"""``MNT/.journalfs/status.json``, built off the request path.

Building the document asks the store for its status (which may wait for the store's lock)
and renders up to ``DAMAGE_LIST_MAX`` damaged journals: too much for the trio thread, and
anyone may stat the file in a loop. So a background task builds it, at most once a second and
only while someone reads it (the JSON rendered in a worker thread); requests get the newest
bytes. Its size shows as 0 (as /proc files do; reads are direct I/O): a stat by a user who
cannot read it (the file is the mount owner's, 0600) tells them nothing about the damaged
journals of others that the document lists.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Awaitable, Callable

import trio

log = logging.getLogger("journalfs.fs.status")

#: Seconds between two builds at most.
BUILD_INTERVAL = 1.0


class StatusFile:
    """The newest status.json bytes; ``build`` (async, returns the bytes) makes new ones."""

    def __init__(self, build: Callable[[], Awaitable[bytes]]):
        self._build = build
        self.data: bytes | None = None
        self.built = -math.inf       # monotonic time of the newest bytes
        self.mtime_ns = time.time_ns()
        self.builds = 0
        self.running = False
        self._wanted = trio.Event()
        self._ready = trio.Event()

    async def run(self) -> None:
        """The background task (in the mount's nursery): build when wanted, then rest."""
        self.running = True
        try:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                await self._build_now()
                await trio.sleep(BUILD_INTERVAL)
        finally:
            self.running = False

    async def _build_now(self) -> None:
        try:
            self.data = await self._build()
        except Exception:
            log.exception("building status.json failed")
            if self.data is None:
                self.data = b"{}\n"
        self.built, self.mtime_ns = time.monotonic(), time.time_ns()
        self.builds += 1
        ready, self._ready = self._ready, trio.Event()
        ready.set()

    async def current(self) -> bytes:
        """The newest bytes; older than ``BUILD_INTERVAL``: a new build is asked for (and
        waited for only when there are none yet)."""
        if time.monotonic() - self.built > BUILD_INTERVAL or self.data is None:
            if not self.running:  # served without the background task (in-process tests)
                await self._build_now()
                return self.data
            self._wanted.set()
            if self.data is None:
                await self._ready.wait()
        return self.data
