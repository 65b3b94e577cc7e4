"""What the long-running commands share: a progress bar that only shows up when it helps, and
reading a mapped file front to back without keeping what was already read resident."""
from __future__ import annotations

import mmap
import sys
import threading
import time

#: Seconds of work before a bar appears: quick commands stay silent.
SHOW_AFTER_S = 1.0
#: Bytes of a mapping read behind the reader before those pages are dropped from this
#: process (they stay in the page cache): bounds RSS whatever the file size.
RELEASE_EVERY = 8 << 20
#: How often :class:`DroppingPages` drops the pages of files a codec reads by itself.
DROP_EVERY_S = 0.1


class Progress:
    """A rich bar on stderr, for ``total`` bytes of work, shown only when stderr is a terminal
    and the work has lasted :data:`SHOW_AFTER_S` seconds. ``update`` is cheap when hidden."""

    def __init__(self, total: int, description: str, stream=None, unit: str = "records",
                 enabled: bool = True):
        self.total = max(total, 1)
        self.description = description
        self.stream = stream if stream is not None else sys.stderr
        self.unit = unit
        self._t0 = time.monotonic()
        #: work done before the current item (callers doing several files set it)
        self.base = 0
        self._bar = None
        self._task = None
        try:
            self._enabled = enabled and self.stream.isatty()
        except (AttributeError, ValueError):
            self._enabled = False

    def update(self, done: int, count: int | None = None, description: str | None = None) -> None:
        if not self._enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._t0 < SHOW_AFTER_S:
                return
            self._start()
        fields = {"completed": min(done, self.total)}
        if count is not None:
            fields["count"] = f"{count:,} {self.unit}"
        if description is not None:
            fields["description"] = description
        self._bar.update(self._task, **fields)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress as Bar, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)
        self._bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TextColumn("{task.fields[count]}"),
                        TimeRemainingColumn(), console=Console(file=self.stream),
                        transient=True, refresh_per_second=8)
        self._bar.start()
        self._task = self._bar.add_task(self.description, total=self.total, count="")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Releaser:
    """Drops the pages of a read-only mapping below a point the reader has passed, so that
    streaming through a file of any size keeps a bounded resident set. Re-reading a dropped
    page (a codec following a back link) only faults it in again from the page cache."""

    def __init__(self, buf):
        self.buf = buf if isinstance(buf, mmap.mmap) and hasattr(buf, "madvise") else None
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


class DroppingPages:
    """While a codec walks mapped files on its own (``validate``), drop their pages from this
    process every :data:`DROP_EVERY_S` seconds from a helper thread, so its resident set stays
    bounded by what it reads in that time, not by the files' sizes. The reads themselves are
    unaffected: a dropped page faults back in from the page cache."""

    def __init__(self, *buffers):
        self.maps = [b for b in buffers if isinstance(b, mmap.mmap) and hasattr(b, "madvise")]
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
