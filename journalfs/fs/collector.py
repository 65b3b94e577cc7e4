"""When the daemon's cyclic garbage collector runs (docs/security.md, "Slower").

CPython collects its oldest generation once the objects that survived two young collections
have grown by a quarter since the last full collection, and a full collection walks every
object it tracks, on whichever thread allocated last: here, the one request thread. A user
listing a 100k-entry directory in a loop makes about that many long-lived objects (lstats,
inodes, the attributes built for them) whenever the kernel brings the entries back, so the
oldest generation grew by a quarter every second or so and every user's requests stopped
for 0.1-0.3 s each time (12 full collections in 10 s of attack 5, bench/attacks.py).

The policy: the young generations are collected automatically as before (their pauses
are bounded by their thresholds: a few ms); the oldest is never collected automatically,
only by :meth:`run`, at most once every ``full_every`` seconds and only when young
collections moved anything into it since. Each such collection freezes what survives it
(``gc.freeze``: what start-up made, a kept listing's 100k inodes), so the next one walks
only what was made since; objects frozen are still freed when their last reference goes,
only a cycle among them waits: for the walk of the whole heap (unfreeze, collect, freeze),
at most once every ``whole_every`` seconds. Garbage cycles therefore live at most that long
and memory stays bounded; the one long pause (0.1-0.3 s with a 100k listing held) comes at
most once per ``whole_every``.
"""
from __future__ import annotations

import gc
import time

import trio

#: Seconds between two full collections (of what is not frozen) at least.
FULL_EVERY = 30.0
#: Seconds between two walks of the whole heap at least.
WHOLE_EVERY = 600.0
#: A threshold for the oldest generation that is never reached (young collections counted).
NEVER = 2**31 - 1


class Collector:
    """The collector's policy for one mount; counts its full collections and their pauses."""

    def __init__(self, full_every: float = FULL_EVERY, whole_every: float = WHOLE_EVERY):
        self.full_every, self.whole_every = full_every, whole_every
        self.full_collections = self.whole_walks = 0
        self.longest_full = 0.0  # seconds
        self._last_whole = time.monotonic()

    def start(self) -> None:
        """At start-up, once everything that lives as long as the mount is made: collect,
        freeze the survivors, and stop automatic full collections."""
        gc.collect()
        gc.freeze()
        young, older, _ = gc.get_threshold()
        gc.set_threshold(young, older, NEVER)

    def due(self) -> bool:
        """Young collections moved objects into the oldest generation since the last full
        collection (CPython counts them in the oldest generation's count)."""
        return gc.get_count()[2] > 0

    def collect(self) -> None:
        started = time.perf_counter()
        if time.monotonic() - self._last_whole >= self.whole_every:
            gc.unfreeze()
            self.whole_walks += 1
            self._last_whole = time.monotonic()
        gc.collect()
        gc.freeze()
        self.full_collections += 1
        self.longest_full = max(self.longest_full, time.perf_counter() - started)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.full_every)
            if self.due():
                self.collect()
