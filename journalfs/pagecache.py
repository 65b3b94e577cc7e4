"""Reading a mapped file of any size with a bounded resident set.

A read-only mapping's pages count towards a process's RSS once touched, so streaming through a
1 GB journal would otherwise end with 1 GB resident. These helpers drop the pages behind the
reader from this process (they stay in the page cache, so nothing is read twice from disk).
"""
from __future__ import annotations

import mmap
import threading

#: Bytes of a mapping read behind the reader before those pages are dropped from this
#: process (they stay in the page cache): bounds RSS whatever the file size.
RELEASE_EVERY = 8 << 20
#: How often :class:`DroppingPages` drops the pages of files a codec reads by itself.
DROP_EVERY_S = 0.02


class FileMapping(mmap.mmap):
    """A read-only mapping of a file (``journals.mapped_fd`` makes them). The helpers here
    drop the pages of these only: a file's dropped page faults back in from the page cache,
    while an anonymous mapping's (the views' pread buffers) would read as zeros."""


def _droppable(buf) -> bool:
    return isinstance(buf, FileMapping) and hasattr(buf, "madvise")


class Releaser:
    """Drops the pages of a read-only mapping below a point the reader has passed, so that
    streaming through a file of any size keeps a bounded resident set. Re-reading a dropped
    page (a codec following a back link) only faults it in again from the page cache."""

    def __init__(self, buf):
        self.buf = buf if _droppable(buf) else None
        self.released = 0

    def passed(self, offset: int | None) -> None:
        if self.buf is None or offset is None or offset - self.released < RELEASE_EVERY:
            return
        upto = offset - offset % mmap.PAGESIZE
        try:
            self.buf.madvise(mmap.MADV_DONTNEED, 0, upto)
        except (OSError, ValueError):
            self.buf = None  # not supported here: keep working, just without the release
            return
        self.released = upto


class PagePacer:
    """Drops every page of some read-only mappings from this process each time it is called.
    A validator that reads in steps (``validate(..., pace=pacer)``) calls it after each step,
    so what it keeps resident is what one step reads, in step with the reading whatever the
    machine's load. The reads are unaffected: a dropped page faults back in from the page
    cache (nothing is read from disk again)."""

    def __init__(self, *buffers):
        self.maps = [b for b in buffers if _droppable(b)]
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        for m in list(self.maps):
            try:
                m.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # closed or unsupported: nothing left to drop
                self.maps.remove(m)


class DroppingPages:
    """While a codec walks mapped files on its own (``validate``), drop their pages from this
    process every :data:`DROP_EVERY_S` seconds from a helper thread, so its resident set stays
    bounded by what it reads in that time, not by the files' sizes. The reads themselves are
    unaffected: a dropped page faults back in from the page cache."""

    def __init__(self, *buffers):
        self.maps = [b for b in buffers if _droppable(b)]
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "DroppingPages":
        if self.maps:
            self._thread = threading.Thread(target=self._run, name="drop-pages", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(DROP_EVERY_S):
            for m in self.maps:
                try:
                    m.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):  # closed or unsupported: nothing left to drop
                    return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
