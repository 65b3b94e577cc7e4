"""The kernel notifier (journalfs/fs/watch.py): every cache invalidation of the process goes
through it, bounded, and none reaches the FUSE session after ``close()`` (issue #27: entries
sent after pyfuse3 had closed the session drew EINVAL, logged with a traceback each)."""
from __future__ import annotations

import threading
import time

import pyfuse3
import pytest

from journalfs.fs.watch import KernelNotifier, SourceWatcher


class BlockedSession:
    """pyfuse3's invalidation calls, recorded; an entry invalidation blocks until ``gate``
    is set, as one does while a READDIR holds its directory's lock."""

    def __init__(self, monkeypatch):
        self.gate = threading.Event()
        self.entries: list[tuple[int, bytes]] = []
        self.inodes: list[tuple[int, bool]] = []
        self.in_call = threading.Event()
        monkeypatch.setattr(pyfuse3, "invalidate_entry", self.invalidate_entry)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", self.invalidate_inode)

    def invalidate_entry(self, parent, name):
        self.entries.append((parent, name))
        self.in_call.set()
        self.gate.wait(10)

    def invalidate_inode(self, ino, attr_only):
        self.inodes.append((ino, attr_only))


@pytest.mark.fast
def test_entries_are_deduplicated_bounded_and_none_is_sent_after_close(monkeypatch):
    session = BlockedSession(monkeypatch)
    notifier = KernelNotifier(max_pending=3)
    try:
        notifier.invalidate_entry(7, b"first")
        assert session.in_call.wait(5)  # the thread is in that call now, the rest wait
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
        session.gate.set()
    notifier._thread.join(timeout=5)
    assert not notifier._thread.is_alive()
    assert session.entries == [(7, b"first")]  # only the call that began before close
    notifier.invalidate_entry(7, b"late")  # after close: ignored, nothing queued
    notifier.invalidate_inodes([(7, False)])
    assert notifier.status()["pending"] == 0 and session.inodes == []


@pytest.mark.fast
def test_close_waits_for_a_call_in_progress(monkeypatch):
    session = BlockedSession(monkeypatch)
    notifier = KernelNotifier()
    notifier.invalidate_entry(7, b"x")
    assert session.in_call.wait(5)
    threading.Timer(0.1, session.gate.set).start()
    assert notifier.close(timeout=5) is True  # returned once the call had ended
    assert notifier.closed


@pytest.mark.fast
def test_an_inode_invalidation_never_waits_for_an_entry_invalidation(monkeypatch):
    """An entry invalidation blocked on a directory's lock (a READDIR of it in progress)
    holds up no inode invalidation: the watcher's round sends those, and a listing may wait
    for that round (fs/dirops.py), so waiting here was a deadlock."""
    session = BlockedSession(monkeypatch)
    notifier = KernelNotifier()
    try:
        notifier.invalidate_entry(7, b"blocked")
        assert session.in_call.wait(5)
        sender = threading.Thread(target=notifier.invalidate_inodes, args=([(9, True)],))
        sender.start()
        sender.join(timeout=5)
        assert not sender.is_alive() and session.inodes == [(9, True)]
    finally:
        session.gate.set()
        notifier.close(timeout=5)


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
