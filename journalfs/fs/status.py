"""``MNT/.journalfs/status.json``, built off the request path.

Building the document asks the store for its status (which may wait for the store's lock)
and renders up to ``DAMAGE_LIST_MAX`` damaged journals: too much for the trio thread, and
anyone may stat the file in a loop. So a background task builds it, at most once a second and
only when someone opens it (the JSON rendered in a worker thread); an open waits for a build
that started after it, so what it reads is never older than the open. A stat builds nothing. Its size shows as 0 (as /proc files do; reads are direct I/O): a stat by a user who
cannot read it (the file is the mount owner's, 0600) tells them nothing about the damaged
journals of others that the document lists.
"""
from __future__ import annotations

import logging
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
        self.mtime_ns = time.time_ns()
        self.started = 0   # builds started so far
        self.builds = 0    # builds finished so far
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
        self.started += 1
        try:
            self.data = await self._build()
        except Exception:
            log.exception("building status.json failed")
            if self.data is None:
                self.data = b"{}\n"
        self.mtime_ns = time.time_ns()
        self.builds += 1
        ready, self._ready = self._ready, trio.Event()
        ready.set()

    async def current(self) -> bytes:
        """Bytes of a build that started after this call (so a read shows what happened
        before it), waiting up to ``BUILD_INTERVAL`` for the next one; concurrent readers
        share a build."""
        if not self.running:  # served without the background task (in-process tests)
            await self._build_now()
            return self.data
        ticket = self.started + 1
        while self.builds < ticket:
            self._wanted.set()
            # never wait on the background task alone: a mount was seen with an open of
            # status.json waiting here for minutes, the background task idle (cause not
            # found); past that (and a slow build) this open builds it itself
            with trio.move_on_after(BUILD_INTERVAL + 4):
                await self._ready.wait()
                continue
            log.info("status.json: the background build did not come; built by the open")
            await self._build_now()
        return self.data
