"""The kernel notifier (journalfs/fs/watch.py): every cache invalidation of the process goes
through it, bounded, and none reaches the FUSE session after ``close()`` (issue #27: entries
sent after pyfuse3 had closed the session drew EINVAL, logged with a traceback each)."""
from __future__ import annotations

import threading
import time

import pytest

from journalfs.fs.watch import KernelNotifier, SourceWatcher


@pytest.mark.fast
def test_entries_are_deduplicated_bounded_and_none_is_sent_after_close():
    notifier = KernelNotifier(max_pending=3)
    notifier._session.acquire()  # a call into the session in progress: the thread waits
    try:
        notifier.invalidate_entry(7, b"first")
        deadline = time.monotonic() + 5
        while notifier.status()["pending"] and time.monotonic() < deadline:
            time.sleep(0.01)  # the thread took it and now waits for the session
        for name in (b"a", b"b", b"a", b"c", b"d"):
            notifier.invalidate_entry(7, name)
        # b"a" waits once; past the bound of 3 the oldest waiting one was dropped
        assert notifier.status() == {"pending": 3, "sent": 0, "dropped": 1, "failed": 0}
        assert list(notifier._pending) == [(7, b"b"), (7, b"c"), (7, b"d")]
        started = time.monotonic()
        assert notifier.close(timeout=0.2) is False  # the call in progress outlived it
        assert time.monotonic() - started < 2
        assert notifier.status()["pending"] == 0
    finally:
        notifier._session.release()
    notifier._thread.join(timeout=5)
    assert not notifier._thread.is_alive()
    assert notifier.status()["sent"] == 0 and notifier.status()["failed"] == 0
    notifier.invalidate_entry(7, b"late")  # after close: ignored, nothing queued
    notifier.invalidate_inodes([(7, False)])
    assert notifier.status()["pending"] == 0


@pytest.mark.fast
def test_close_waits_for_a_call_in_progress():
    notifier = KernelNotifier()
    notifier._session.acquire()
    threading.Timer(0.1, notifier._session.release).start()
    assert notifier.close(timeout=5) is True  # returned once the call had ended
    assert notifier.closed


@pytest.mark.fast
def test_a_stopped_watcher_reads_nothing_and_closes_its_notifier(monkeypatch):
    monkeypatch.setenv("JOURNALFS_WATCH", "inotify")
    notifier = KernelNotifier()

    async def changed(ino, name):
        return None

    watcher = SourceWatcher(changed, notifier=notifier)
    assert watcher.fd >= 0
    watcher.stop()
    assert watcher.fd == -1 and watcher.stopped and notifier.closed
    assert watcher.status()["notifications"]["pending"] == 0
