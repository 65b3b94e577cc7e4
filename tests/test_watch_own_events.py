"""The SOURCE watcher and the daemon's own changes (journalfs/fs/watch.py, #28): fanotify
reports every write, create and rename made through the mount back to the daemon, which
drops them by pid. A stream of them must not wake the watcher once per request: after a
round of only its own events it leaves the queue alone for ``OWN_EVENTS_PAUSE``, and a
change made behind the mount meanwhile is still applied, in the next round."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
import trio

from journalfs.fs import watch
from journalfs.fs.watch import KernelNotifier, SourceWatcher

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root")


def test_own_events_gather_while_a_foreign_change_still_applies(tmp_path, monkeypatch):
    # a long pause, so that the test's own timing has seconds of margin
    monkeypatch.setattr(watch, "OWN_EVENTS_PAUSE", 2.0)
    monkeypatch.setenv("JOURNALFS_WATCH", "fanotify")
    own, foreign = tmp_path / "own.bin", tmp_path / "foreign.txt"
    own.write_bytes(b"\0" * 4096)
    foreign.write_text("x")
    seen: list[tuple[int, bytes | None]] = []

    async def changed(ino, name):
        seen.append((ino, name))
        return None  # no kernel inode: nothing for the notifier to send

    notifier = KernelNotifier()
    watcher = SourceWatcher(changed, notifier=notifier)
    if watcher.mechanism != "fanotify":
        watcher.stop()
        pytest.skip(f"fanotify unavailable here: {watcher.reason}")
    rounds = 0
    read_all = watcher._read_all

    def counted(*args):
        nonlocal rounds
        rounds += 1
        return read_all(*args)
    monkeypatch.setattr(watcher, "_read_all", counted)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    watcher.directory_known(1, fd=dir_fd)
    fd = os.open(own, os.O_WRONLY)

    def own_writes(count: int) -> None:
        # from a thread of this process (fanotify names the process), spaced so that a
        # watcher that woke for each would see each on its own
        for i in range(count):
            os.pwrite(fd, b"w", i)
            time.sleep(0.005)

    async def wait_for(check, seconds: float = 10.0) -> bool:
        deadline = trio.current_time() + seconds
        while not check():
            if trio.current_time() > deadline:
                return False
            await trio.sleep(0.01)
        return True

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            os.pwrite(fd, b"w", 0)
            assert await wait_for(lambda: rounds == 1)  # read, and found only its own
            await trio.to_thread.run_sync(own_writes, 50)
            subprocess.run(["sh", "-c", f"echo y >> '{foreign}'"], check=True)
            assert await wait_for(lambda: (1, b"foreign.txt") in seen)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        os.close(fd)
        os.close(dir_fd)
        watcher.stop()
    # 50 own writes over ~0.3 s came in one round with the foreign change (woken once per
    # write they would take ~50); the daemon's own changes are never applied as foreign
    assert rounds <= 3, rounds
    assert all(name != b"own.bin" for _, name in seen), seen
