"""Worker threads for the calls that may wait on another process, shared fairly by users.

An open of a file another process holds a lease on waits for the lease break (up to
``/proc/sys/fs/lease-break-time``, 45 s by default), an open of a FIFO waits for its peer, a
truncate by path waits for a lease break too, and a scan of a huge directory takes long. None
of that may run on the trio thread that serves every request: it runs here. Each user (the
request's uid) gets at most ``per_user`` of the ``total`` threads, so one user's slow files
never take all of them; a user past their share waits for their own earlier calls, as their
own processes would wait natively.

Work that is long by itself, not by waiting (indexing a user's journals), is held to a CPU
budget per user instead (:class:`CpuBudget`): the threads doing it charge the CPU time they
used and pause while their user's budget is spent.

A local syscall that cannot wait is still cheaper inline than a thread hop (~185 µs): the
callers try the non-blocking form first (``O_NONBLOCK`` opens, a bounded first part of a
directory scan) and come here only when that says it would wait.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import trio

#: Threads for calls that may wait on another process, in all and per user.
TOTAL_THREADS = 64
PER_USER_THREADS = 16
#: How long a thread running Python keeps the interpreter lock while another thread waits
#: for it (CPython's default: 5 ms). A worker scanning a user's huge directory or indexing
#: his journal hands the lock to the request thread within this, so each of another user's
#: requests waits at most ~1 ms for it, not 5 (an open+close is two requests). Costs a few
#: µs per switch, at most ~1,000 switches a second. `JOURNALFS_SWITCH_INTERVAL` (seconds)
#: overrides it (benchmarks).
SWITCH_INTERVAL = 0.001


def switch_interval(text: str | None) -> float:
    """The interpreter's switch interval: JOURNALFS_SWITCH_INTERVAL's (if a sane number of
    seconds) or SWITCH_INTERVAL."""
    try:
        value = float(text) if text else SWITCH_INTERVAL
    except ValueError:
        return SWITCH_INTERVAL
    return value if 1e-5 <= value <= 1.0 else SWITCH_INTERVAL


#: Yields at most per look at the kernel's queue (see KernelQueue.let_through): enough for the
#: task that reads /dev/fuse to take what waits, few enough that a long task always goes on.
LET_THROUGH_YIELDS = 4
#: Longest a long task runs on the request thread between two trio checkpoints when nothing
#: waits in the kernel's queue: trio's other tasks are not in it (a request whose worker
#: thread is done, e.g. another user's first view being indexed, waits for the next
#: checkpoint). ~15 µs a checkpoint: at most ~3% of such a task.
CHECKPOINT_SECONDS = 0.0005
#: How long after a request last waited between two steps replies stay one step long.
CONTENDED_SECONDS = 0.1


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


# PyDLL: the call keeps the interpreter lock (a plain os/select call would hand it to a worker
# thread running Python, and the request thread could wait a switch interval to get it back)
_poll = ctypes.PyDLL(None, use_errno=True).poll
_poll.argtypes = [ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.c_int]
_poll.restype = ctypes.c_int
_POLLIN = 0x001


class KernelQueue:
    """Whether a request waits in the kernel's queue of this process's FUSE session (sent by
    someone, not yet read by the daemon), and a way to let it through first.

    A handler that does a long task in steps on the one request thread (a readdir reply of
    thousands of entries) looks between steps: while nothing waits it goes on (a user alone
    gets big replies, few requests), and when something waits it yields, so the task that
    reads /dev/fuse takes the waiting request and serves it before the next step: another
    user's request waits for at most one step, not for the whole reply. ``poll`` of the
    /dev/fuse fd with no timeout is the look (EPOLLIN while the kernel's pending list, its
    FORGETs or its interrupts are not empty: ``fuse_dev_poll``), ~1 µs.

    pyfuse3 keeps the session's fd to itself: it is found at the first look, as the lowest
    fd open on /dev/fuse (opened at mount, before the inodes' fds). Without one (no kernel:
    the in-process tests) nothing ever waits."""

    def __init__(self, fd: int | None = None):
        self._fd = fd
        self._pollfd = _PollFd(fd if fd is not None else -1, _POLLIN, 0)
        self.yields = 0  # times a step let waiting requests through (status, tests)
        self.checkpoints = 0  # times a step let trio's other tasks run (tests)
        self.contended_at = float("-inf")  # when a request last waited between steps

    @staticmethod
    def find_fuse_fd(limit: int = 4096) -> int:
        """The lowest fd of this process open on /dev/fuse, or -1."""
        for fd in range(limit):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == "/dev/fuse":
                    return fd
            except OSError:
                continue
        return -1

    def waiting(self) -> bool:
        if self._fd is None:
            self._fd = self._pollfd.fd = self.find_fuse_fd()
        if self._fd < 0:
            return False
        self._pollfd.revents = 0
        return _poll(ctypes.byref(self._pollfd), 1, 0) > 0 and bool(self._pollfd.revents & _POLLIN)

    async def let_through(self) -> None:
        """If a request waits in the kernel: yield (trio), until pyfuse3's reading task has
        taken it or LET_THROUGH_YIELDS times."""
        if not self.waiting():
            return
        self.yields += 1
        for _ in range(LET_THROUGH_YIELDS):
            await trio.sleep(0)
            if not self.waiting():
                return

    async def between_steps(self, since: float) -> float | None:
        """Between two steps of a long task that last let trio run at ``since``
        (``time.perf_counter()``). None: end the task's reply here, after letting a request
        waiting in the kernel through: others use the mount (a request waited within
        CONTENDED_SECONDS), so replies stay one step long and the kernel's round trip paces
        the long task, as its steps alone would not (the request thread serving one user
        without a pause takes a core from everyone on a busy machine). Else when trio last
        ran others: now if CHECKPOINT_SECONDS had passed."""
        now = time.perf_counter()
        if self.waiting():
            self.contended_at = now
            await self.let_through()
            return None
        if now - self.contended_at < CONTENDED_SECONDS:
            return None
        if now - since < CHECKPOINT_SECONDS:
            return since
        self.checkpoints += 1
        await trio.sleep(0)
        return time.perf_counter()


#: The process's one FUSE session (one mount per daemon).
KERNEL_QUEUE = KernelQueue()


class FairWorkers:
    """``await run(uid, fn, *args)``: ``fn(*args)`` in a worker thread, at most ``per_user``
    of them busy for one uid. The per-user map holds only uids with calls in flight (at most
    the kernel's pending requests), so it never grows with the number of users seen."""

    def __init__(self, total: int = TOTAL_THREADS, per_user: int = PER_USER_THREADS):
        # the workers run Python beside the request thread: it gets the interpreter back soon
        sys.setswitchinterval(switch_interval(os.environ.get("JOURNALFS_SWITCH_INTERVAL")))
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


#: CPU time one user's index work (the views: indexing, measuring records.jsonl) may take: a
#: quarter of one core on average, in bursts of up to a second. A small journal (a few ms)
#: never waits; past that, the owner's indexing pauses (sleeping: no CPU, no interpreter
#: lock) until the budget has refilled. `JOURNALFS_INDEX_CPU=SHARE,BURST` overrides both
#: (tests, benchmarks).
INDEX_CPU_SHARE = 0.25
INDEX_CPU_BURST = 1.0
#: Longest single pause (a paused job checks for its next turn this often), and shortest.
INDEX_PAUSE_MAX = 0.25
INDEX_PAUSE_MIN = 0.001
#: A user's index work pauses only while another user's ran this recently (see CpuBudget).
INDEX_CONTENTION_SECONDS = 10.0
#: Users whose index CPU status.json shows at most (least recently charged dropped first).
INDEX_CPU_USERS = 256


def index_cpu_setting(text: str | None) -> tuple[float, float]:
    """``SHARE,BURST`` of JOURNALFS_INDEX_CPU (the defaults for None or nonsense)."""
    try:
        share, burst = (float(x) for x in (text or "").split(","))
    except ValueError:
        return INDEX_CPU_SHARE, INDEX_CPU_BURST
    if not (0 < share and 0 < burst):
        return INDEX_CPU_SHARE, INDEX_CPU_BURST
    return share, burst


class CpuBudget:
    """Index CPU per uid as a token bucket: ``burst`` CPU-seconds at most, refilled at
    ``share`` CPU-seconds per second. The threads doing a user's index work charge the CPU
    time they used (``time.thread_time``) between batches and pause while the bucket is
    empty, so one user's huge journals take at most ``share`` of a core however many he
    makes, and leave the interpreter lock to the request thread meanwhile.

    Work-conserving, as the kernel's scheduler: a user pauses only while another user's
    index work ran within the last ``contention`` seconds; alone on the mount he indexes
    at full speed (a big journal's first view is not made slower for nobody's benefit).
    What he used meanwhile is still charged, down to at most ``burst`` of debt, so once
    someone else comes his next pause is at most ``2 * burst / share``. Thread-safe.
    Memory: a bucket only for users not yet refilled, totals for INDEX_CPU_USERS users."""

    def __init__(self, share: float = INDEX_CPU_SHARE, burst: float = INDEX_CPU_BURST,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 contention: float = INDEX_CONTENTION_SECONDS):
        self.share, self.burst, self.contention = share, burst, contention
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._left: dict[int, tuple[float, float]] = {}  # uid -> (CPU-seconds left, when)
        #: uid -> [CPU seconds charged, seconds paused, pauses, threads paused now,
        #: when last charged]
        self.totals: OrderedDict[int, list] = OrderedDict()

    def _charge(self, uid: int, cpu: float) -> float:
        """Charge ``cpu`` seconds to ``uid``: how long its work must pause now (0: none)."""
        with self._lock:
            now = self._clock()
            left, at = self._left.get(uid, (self.burst, now))
            left = max(-self.burst, min(self.burst, left + (now - at) * self.share) - cpu)
            if left >= self.burst:
                self._left.pop(uid, None)  # full: the same as no entry
            else:
                self._left[uid] = (left, now)
            total = self.totals.pop(uid, None) or [0.0, 0.0, 0, 0, now]
            total[0] += cpu
            if cpu:
                total[4] = now
            self.totals[uid] = total
            contended = any(now - t[4] < self.contention
                            for other, t in self.totals.items() if other != uid)
            while len(self.totals) > INDEX_CPU_USERS:
                self.totals.popitem(last=False)
            if len(self._left) > INDEX_CPU_USERS:  # only refilled ones can go: they are full
                for other, (o_left, o_at) in list(self._left.items()):
                    if o_left + (now - o_at) * self.share >= self.burst:
                        del self._left[other]
            wait = -left / self.share
            # (rounding leaves crumbs)
            return wait if contended and wait >= INDEX_PAUSE_MIN else 0.0

    def meter(self, uid: int) -> Callable[[], None]:
        """For one thread's job: call it between steps; it charges the CPU this thread used
        since the last call (or since the meter was made) and pauses while over budget."""
        last = time.thread_time()

        def charge() -> None:
            nonlocal last
            now = time.thread_time()
            wait = self._charge(uid, now - last)
            if wait > 0:
                self._note(uid, pauses=1, now=1)
                try:
                    while wait > 0:
                        step = min(wait, INDEX_PAUSE_MAX)
                        self._sleep(step)
                        self._note(uid, paused=step)
                        wait = self._charge(uid, 0.0)
                finally:
                    self._note(uid, now=-1)
            last = time.thread_time()
        return charge

    def _note(self, uid: int, pauses: int = 0, paused: float = 0.0, now: int = 0) -> None:
        with self._lock:
            total = self.totals.get(uid)
            if total is not None:  # (dropped only past INDEX_CPU_USERS users)
                total[1] += paused
                total[2] += pauses
                total[3] += now

    def status(self) -> dict:
        with self._lock:
            return {"share": self.share, "burst_s": self.burst,
                    "users": {str(uid): {"cpu_s": round(t[0], 3), "paused_s": round(t[1], 3),
                                         "pauses": t[2], "paused_now": t[3]}
                              for uid, t in self.totals.items()}}
