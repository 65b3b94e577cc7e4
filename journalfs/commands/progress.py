"""A progress bar for the long-running commands that only shows up when it helps."""
from __future__ import annotations

import os
import sys
import threading

#: Seconds of work before a bar appears: quick commands stay silent
#: (JOURNALFS_PROGRESS_AFTER sets another delay, e.g. 0 to always show it on a terminal).
try:
    SHOW_AFTER_S = max(0.0, float(os.environ.get("JOURNALFS_PROGRESS_AFTER", "1.0")))
except ValueError:
    SHOW_AFTER_S = 1.0


class Progress:
    """A rich bar on stderr, for ``total`` bytes of work, shown only when stderr is a terminal
    and the work has lasted :data:`SHOW_AFTER_S` seconds. ``update`` is cheap when hidden."""

    def __init__(self, total: int, description: str, stream=None, unit: str = "records",
                 enabled: bool = True):
        self.total = max(total, 1)
        self.description = description
        self.stream = stream if stream is not None else sys.stderr
        self.unit = unit
        #: work done before the current item (callers doing several files set it)
        self.base = 0
        self._bar = None
        self._task = None
        self._lock = threading.Lock()
        self._fields = {"completed": 0, "count": ""}
        try:
            self._enabled = enabled and self.stream.isatty()
        except (AttributeError, ValueError):
            self._enabled = False
        # the bar appears after SHOW_AFTER_S even when a long step sends no update meanwhile
        self._timer = threading.Timer(SHOW_AFTER_S, self._start) if self._enabled else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def update(self, done: int, count: int | None = None, description: str | None = None) -> None:
        if not self._enabled:
            return
        fields = {"completed": min(done, self.total)}
        if count is not None:
            fields["count"] = f"{count:,} {self.unit}"
        if description is not None:
            fields["description"] = description
        with self._lock:
            self._fields.update(fields)
            if self._bar is not None:
                self._bar.update(self._task, **fields)

    def _start(self) -> None:
        with self._lock:
            if self._bar is not None or not self._enabled:
                return
            self._show()

    def _show(self) -> None:
        # late: rich loads only when a bar is actually shown (most runs finish before)
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress as Bar, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)
        self._bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TextColumn("{task.fields[count]}"),
                        TimeRemainingColumn(), console=Console(file=self.stream),
                        transient=True, refresh_per_second=8)
        self._bar.start()
        fields = dict(self._fields)
        self._task = self._bar.add_task(fields.pop("description", self.description),
                                        total=self.total, **fields)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._enabled = False
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
