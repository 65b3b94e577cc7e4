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
#: An open that waited this long past BUILD_INTERVAL looks at the background task: still
#: waiting to be woken (a lost wake-up), it builds the document itself and logs an ERROR
#: naming where the task waits (a safety net, see current()); building or resting after a
#: build, it waits on, up to STUCK_BUILD seconds in all.
BUILD_MARGIN = 4.0
STUCK_BUILD = 60.0


def await_chain(task) -> str:
    """Where ``task`` is suspended: its coroutine frames, outermost first ("file:line in
    function" each), for a log line that says what a stuck task waits for."""
    where = []
    coro = getattr(task, "coro", None)
    while coro is not None and len(where) < 64:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(where) or "not suspended in a coroutine"


class StatusFile:
    """The newest status.json bytes; ``build`` (async, returns the bytes) makes new ones."""

    def __init__(self, build: Callable[[], Awaitable[bytes]]):
        self._build = build
        self.data: bytes | None = None
        self.mtime_ns = time.time_ns()
        self.started = 0   # builds started so far
        self.builds = 0    # builds finished so far
        self.running = False
        self.rescued = 0   # opens that built the document themselves (see current())
        self._task = None  # the background task, for the log line of the safety net
        self.phase = "waiting"  # the background task: waiting (to be woken), building, resting
        self._wanted = trio.Event()
        self._ready = trio.Event()

    async def run(self) -> None:
        """The background task (in the mount's nursery): build when wanted, then rest."""
        self._task = trio.lowlevel.current_task()
        self.running = True
        try:
            while True:
                self.phase = "waiting"
                await self._wanted.wait()
                self._wanted = trio.Event()
                self.phase = "building"
                await self._build_now()
                self.phase = "resting"
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
        share a build.

        No wake-up can be lost here: ``_wanted`` is replaced only by run() right after its
        wait returned, with no checkpoint between, and a reader sets the current one after
        checking its ticket, also with no checkpoint between; ``_ready`` is swapped and set
        in one step, and a reader picks the current one in the same step as its check (trio
        switches tasks only at an await). tests/test_fs_isolation_fast.py drives thousands
        of random schedules of readers and build durations through it. The open once seen
        "waiting forever" in test_live_metadata_journal_empties_after_a_rotation was most
        likely that test running out of its 600 s on a loaded machine: it read status.json
        ~200 times, each waiting for the next build (~220 s on a quiet machine), so a
        snapshot of it nearly always shows an open in this wait and the background task idle
        between builds. The test now reads it only near the threshold (~5 s). Should a build still not come, the open builds the document itself and
        logs an ERROR naming where the background task waits; so does one that waited
        STUCK_BUILD seconds on a build that does not end."""
        if not self.running:  # served without the background task (in-process tests)
            await self._build_now()
            return self.data
        ticket = self.started + 1
        since = trio.current_time()
        while self.builds < ticket:
            self._wanted.set()
            with trio.move_on_after(BUILD_INTERVAL + BUILD_MARGIN):
                await self._ready.wait()
                continue
            waited = trio.current_time() - since
            if self.phase != "waiting" and waited < STUCK_BUILD:
                continue  # a slow build, or the rest after one: the next one is coming
            self.rescued += 1
            log.error("status.json: no build after %.0f s, the background task %s (builds %d "
                      "of %d started); built by the open; the task waits at: %s", waited,
                      "not woken" if self.phase == "waiting" else f"{self.phase} too long",
                      self.builds, self.started, await_chain(self._task))
            await self._build_now()
        return self.data
