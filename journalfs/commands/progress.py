"""A progress bar for the long-running commands that only shows up when it helps."""
from __future__ import annotations

import sys
import time

#: Seconds of work before a bar appears: quick commands stay silent.
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
