"""Worker threads for the calls that may wait on another process, shared fairly by users.

An open of a file another process holds a lease on waits for the lease break (up to
``/proc/sys/fs/lease-break-time``, 45 s by default), an open of a FIFO waits for its peer, a
truncate by path waits for a lease break too, and a scan of a huge directory takes long. None
of that may run on the trio thread that serves every request: it runs here. Each user (the
request's uid) gets at most ``per_user`` of the ``total`` threads, so one user's slow files
never take all of them; a user past their share waits for their own earlier calls, as their
own processes would wait natively.

A local syscall that cannot wait is still cheaper inline than a thread hop (~185 µs): the
callers try the non-blocking form first (``O_NONBLOCK`` opens, a bounded first part of a
directory scan) and come here only when that says it would wait.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import trio

#: Threads for calls that may wait on another process, in all and per user.
TOTAL_THREADS = 64
PER_USER_THREADS = 16


class FairWorkers:
    """``await run(uid, fn, *args)``: ``fn(*args)`` in a worker thread, at most ``per_user``
    of them busy for one uid. The per-user map holds only uids with calls in flight (at most
    the kernel's pending requests), so it never grows with the number of users seen."""

    def __init__(self, total: int = TOTAL_THREADS, per_user: int = PER_USER_THREADS):
        self.total = trio.CapacityLimiter(total)
        self.per_user = per_user
        self._users: dict[int, list] = {}  # uid -> [its limiter, calls in flight]
        self.calls = 0  # calls handed to a thread so far (status, tests)

    def busy(self) -> dict[int, int]:
        """uid -> calls in flight (queued or running)."""
        return {uid: entry[1] for uid, entry in self._users.items()}

    async def run(self, uid: int, fn: Callable, *args: Any) -> Any:
        entry = self._users.get(uid)
        if entry is None:
            entry = self._users[uid] = [trio.CapacityLimiter(self.per_user), 0]
        entry[1] += 1
        self.calls += 1
        try:
            async with entry[0]:
                return await trio.to_thread.run_sync(functools.partial(fn, *args),
                                                     limiter=self.total)
        finally:
            entry[1] -= 1
            if entry[1] == 0 and self._users.get(uid) is entry:
                del self._users[uid]

    def status(self) -> dict:
        return {"threads": self.total.total_tokens, "per_user": self.per_user,
                "busy": self.total.borrowed_tokens, "users_waiting": len(self._users),
                "calls": self.calls}
