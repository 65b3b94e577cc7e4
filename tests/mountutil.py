"""Real kernel mounts for tests: ``with mounted(src, mnt, "--store", store) as m: ...``.

Starts ``journalfs mount --foreground`` as a subprocess, waits until the mountpoint is live
(at most 30 s; fails at once with the daemon's stderr if it died), and on exit unmounts with
``fusermount3 -u`` (``-z`` if busy), then asserts the daemon exited 0 and the mount is gone.
Unless the caller passes ``--store``/``--gvfs``/``-o store=``, XDG_DATA_HOME points into a
temporary directory so no test touches the real user's data.

The suite's rules for mounts (enforced from tests/conftest.py):

- a test that mounts carries the ``fuse`` marker: :func:`mounted` fails at once without it,
  and a watch on the mount table fails any test in whose run a FUSE mount appeared below the
  session's directory without it (:class:`MountWatch`, whatever made the mount);
- the daemon's log must hold no unexpected error: the log of every :func:`mounted` daemon
  (its stderr: ``--foreground`` logs there), and of daemons others started that a test hands
  to :func:`check_log_file`, is read after each test, and any record at ERROR or
  CRITICAL, or with a traceback, fails the test, unless the test allows it by name with
  ``@pytest.mark.daemon_log_errors(PATTERN..., reason=WHY)`` (:func:`unexpected_errors`);
  a ``fast`` test serves JournalFS in-process, so what it logs at ERROR there counts the same
  (:class:`InProcessErrors`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MOUNT_TIMEOUT = 30.0
EXIT_TIMEOUT = 30.0
JOURNALFS = [sys.executable, "-m", "journalfs.cli"]

#: the pytest item running now (tests/conftest.py sets it): mounts check its markers
current_test = None

#: a log record at one of these levels, or with a traceback, is an unexpected error
LOG_ERRORS = (": ERROR ", ": CRITICAL ", "Traceback")
#: a log record starts "journalfs[PID]: LEVEL ..." (fs/main.py's LOG_FORMAT), in a log file
#: after its time: "2026-11-27 10:35:30,415 journalfs[PID]: LEVEL ..."; other lines (a
#: traceback, libfuse's own) continue the record before them
LOG_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ )?journalfs\[\d+\]: [A-Z]+ ")
#: the marker a test allows expected errors of its mounts' daemons with
ALLOW_MARKER = "daemon_log_errors"


def log_records(text: str) -> list[str]:
    """The log's records, each with its continuation lines (a traceback)."""
    records: list[str] = []
    for line in text.splitlines():
        if LOG_RECORD.match(line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records


def is_error(record: str) -> bool:
    return any(word in record for word in LOG_ERRORS)


@dataclass
class DaemonLog:
    """One mount daemon's log, read a piece at a time (after each test, and at unmount,
    before its directory goes)."""

    path: Path
    label: str
    done: bool = False
    _offset: int = 0
    _unread: str = ""

    def collect(self) -> None:
        """Take in what the daemon wrote since, up to its last complete line."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not self.done:
            data = data[:data.rfind(b"\n") + 1]
        self._offset += len(data)
        self._unread += data.decode(errors="replace")

    def take_errors(self) -> list[str]:
        """The error records among what was collected and not yet taken."""
        self.collect()
        text, self._unread = self._unread, ""
        return [record for record in log_records(text) if is_error(record)]


#: the logs of the mounts made by :func:`mounted` not yet checked to their end
DAEMON_LOGS: list[DaemonLog] = []


def check_log_file(path: Path, label: str) -> None:
    """Check the log file of a daemon :func:`mounted` did not start (``journalfs mount``
    run daemonized: it logs to a file beside its store where there is no system log) after
    this test like theirs; call it once that daemon has exited."""
    DAEMON_LOGS.append(DaemonLog(Path(path), label, done=True))


def allowed_patterns(item) -> list[re.Pattern]:
    """The patterns of the errors ``item`` provokes on purpose (its ``daemon_log_errors``
    markers; each must say why)."""
    patterns = []
    for mark in item.iter_markers(ALLOW_MARKER):
        if not mark.kwargs.get("reason") or not mark.args:
            raise AssertionError(f"{item.nodeid}: @pytest.mark.{ALLOW_MARKER} needs patterns "
                                 "and reason=... (why the test provokes them)")
        patterns += [re.compile(p, re.S) for p in mark.args]
    return patterns


def unexpected_errors(item) -> list[str]:
    """The error records the mount daemons logged since the last check that ``item`` does
    not allow, each with the mount it came from; finished logs are dropped."""
    allowed = allowed_patterns(item) if item is not None else []
    found = []
    for log in list(DAEMON_LOGS):
        for record in log.take_errors():
            if not any(p.search(record) for p in allowed):
                found.append(f"{log.label}:\n    " + record.replace("\n", "\n    "))
        if log.done:
            DAEMON_LOGS.remove(log)
    return found


class InProcessErrors(logging.Handler):
    """The error records logged in this process (the fast tier's JournalFS is the daemon
    there), formatted as the daemon's log shows them, for :func:`unexpected_in_process`."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.setFormatter(logging.Formatter("journalfs[%(process)d]: %(levelname)s %(message)s"))
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))

    def take(self, item) -> list[str]:
        """The records since the last call that ``item`` does not allow."""
        records, self.records = self.records, []
        allowed = allowed_patterns(item) if item is not None else []
        return ["logged in-process:\n    " + r.replace("\n", "\n    ") for r in records
                if not any(p.search(r) for p in allowed)]


def require_fuse_marker(what: str) -> None:
    """Fail the running test at once if it mounts without the ``fuse`` marker."""
    if current_test is not None and current_test.get_closest_marker("fuse") is None:
        raise AssertionError(f"{current_test.nodeid} mounts ({what}) without the fuse marker: "
                             "every test that mounts carries @pytest.mark.fuse (or a module's "
                             "pytestmark), so that `pytest -m 'not fuse'` runs none")


def _unescape(field: bytes) -> str:
    """A mountinfo field: octal escapes (\\040 for a space) undone, bytes as the OS's names."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def mount_table() -> list[tuple[str, str, str]]:
    """(mount id, mountpoint, filesystem type) of every mount in this mount namespace."""
    table = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            table.append((os.fsdecode(fields[0]), _unescape(fields[4]),
                          os.fsdecode(fields[fields.index(b"-") + 1])))
    return table


def mounts_under(top: Path) -> list[tuple[str, str, str]]:
    """(mount id, mountpoint, type) of every mount at or below ``top``."""
    prefix = str(top).rstrip("/") + "/"
    return [m for m in mount_table() if m[1] == str(top) or m[1].startswith(prefix)]


def fuse_mounts_under(top: Path) -> set[tuple[str, str, str]]:
    """(mount id, mountpoint, type) of every FUSE mount at or below ``top`` now."""
    return {m for m in mounts_under(top) if m[2].split(".")[0] in ("fuse", "fuseblk")}


@dataclass
class MountWatch:
    """Every FUSE mount that appears below ``top`` while it runs: a thread woken by the
    kernel on each change of the mount table (poll on /proc/self/mountinfo), however the
    mount was made (:func:`mounted`, ``journalfs mount`` run directly, bindfs, a script)."""

    top: Path
    seen: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "MountWatch":
        self._thread = threading.Thread(target=self._run, name="mount-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with open("/proc/self/mountinfo") as table:
            poll = select.poll()
            poll.register(table, select.POLLPRI | select.POLLERR)
            while not self._stop.is_set():
                with self._lock:
                    self.seen |= fuse_mounts_under(self.top)
                poll.poll(200)

    def begin(self) -> set:
        """Start a test: forget what was seen; the mounts there now (a module's fixture's) are
        what :meth:`new_since` leaves out."""
        with self._lock:
            self.seen = set()
            return fuse_mounts_under(self.top)

    def new_since(self, present: set) -> set:
        """The mounts seen since :meth:`begin` returned ``present`` that were not there then."""
        if self._thread is not None and not self._thread.is_alive():
            raise AssertionError("the mount-table watch has stopped (see its exception above)")
        with self._lock:
            return (self.seen | fuse_mounts_under(self.top)) - present

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class Mount:
    source: Path
    mountpoint: Path
    process: subprocess.Popen
    stderr_path: Path
    log: DaemonLog | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def _wait_mounted(proc: subprocess.Popen, mnt: Path, stderr_path: Path) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            raise AssertionError(f"journalfs mount exited {proc.returncode} before mounting:\n"
                                 f"{stderr_path.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{mnt} not mounted after {MOUNT_TIMEOUT}s:\n"
                                 f"{stderr_path.read_text(errors='replace')}")
        time.sleep(0.02)


def unmount(mnt: str | os.PathLike, lazy: bool = False) -> subprocess.CompletedProcess:
    cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [os.fspath(mnt)]
    return subprocess.run(cmd, capture_output=True, text=True)


def _needs_private_store(args: tuple[str, ...]) -> bool:
    joined = " ".join(args)
    return not ("--store" in args or "--gvfs" in args or "store=" in joined or "gvfs" in joined)


@contextlib.contextmanager
def mounted(source, mnt, *extra_args: str, env: dict | None = None, check_exit: bool = True):
    """Mount ``source`` on ``mnt`` with ``journalfs mount --foreground *extra_args``."""
    require_fuse_marker(f"journalfs on {mnt}")
    source, mnt = Path(source), Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    run_env = dict(os.environ if env is None else env)
    cleanup = contextlib.ExitStack()
    with cleanup:
        if _needs_private_store(extra_args) and env is None:
            data_home = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="journalfs-xdg-"))
            run_env["XDG_DATA_HOME"] = data_home
        if "JOURNALFS_RUNTIME_DIR" not in run_env:  # pid file, saved file handles: ours
            run_env["JOURNALFS_RUNTIME_DIR"] = cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="journalfs-run-"))
        log_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="journalfs-log-")))
        stderr_path = log_dir / "stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen([*JOURNALFS, "mount", "--foreground", str(source), str(mnt),
                                     *extra_args], stdout=subprocess.DEVNULL, stderr=err,
                                    env=run_env)
        log = DaemonLog(stderr_path, f"journalfs on {mnt} (log of the daemon, pid {proc.pid})")
        DAEMON_LOGS.append(log)
        try:
            _wait_mounted(proc, mnt, stderr_path)
            yield Mount(source, mnt, proc, stderr_path, log)
        finally:
            holders = ""
            if os.path.ismount(mnt):
                if unmount(mnt).returncode != 0:
                    time.sleep(0.2)  # e.g. a test's child still holds a file open
                    if unmount(mnt).returncode != 0:
                        holders = subprocess.run(["fuser", "-vm", os.fspath(mnt)],
                                                 capture_output=True, text=True).stderr
                        unmount(mnt, lazy=True)
            try:
                code = proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGQUIT)  # the daemon prints its threads' stacks
                time.sleep(1)
                proc.kill()
                proc.wait()
                raise AssertionError(f"journalfs did not exit after unmount (held by: {holders or 'nobody seen'}):\n"
                                     f"{stderr_path.read_text()}")
            finally:
                log.done = True
                log.collect()  # all of it, before its directory goes
        if check_exit:
            assert code == 0, f"journalfs exited {code}:\n{stderr_path.read_text(errors='replace')}"
            assert not os.path.ismount(mnt), f"{mnt} still mounted"
