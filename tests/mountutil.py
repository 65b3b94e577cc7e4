"""Real kernel mounts for tests: ``with mounted(src, mnt, "--store", store) as m: ...``.

Starts ``journalfs mount --foreground`` as a subprocess, waits until the mountpoint is live
(at most 30 s; fails at once with the daemon's stderr if it died), and on exit unmounts with
``fusermount3 -u`` (``-z`` if busy), then asserts the daemon exited 0 and the mount is gone.
Unless the caller passes ``--store``/``--gvfs``/``-o store=``, XDG_DATA_HOME points into a
temporary directory so no test touches the real user's data.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MOUNT_TIMEOUT = 30.0
EXIT_TIMEOUT = 30.0
JOURNALFS = [sys.executable, "-m", "journalfs.cli"]


@dataclass
class Mount:
    source: Path
    mountpoint: Path
    process: subprocess.Popen
    stderr_path: Path

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
        try:
            _wait_mounted(proc, mnt, stderr_path)
            yield Mount(source, mnt, proc, stderr_path)
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
        if check_exit:
            assert code == 0, f"journalfs exited {code}:\n{stderr_path.read_text(errors='replace')}"
            assert not os.path.ismount(mnt), f"{mnt} still mounted"
