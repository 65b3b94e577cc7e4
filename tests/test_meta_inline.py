"""Metadata reads on the event loop: a store-cache miss is answered inline (no worker-thread
hop), a busy store lock (a rotation swapping files in) makes the read wait in a thread, and
reads racing with rotations always see the right values."""
from __future__ import annotations

import threading

import trio

from journalfs.metastore.service import MetaService
from journalfs.metastore.store import MetaStore


def _store_with_tree_values(tmp_path, count: int) -> str:
    tree = str(tmp_path / "home")
    with MetaStore.open(tree, sync="none") as store:  # closing rotates: the values are in the tree
        for i in range(count):
            store.set(f"/d/f{i}", "k", f"tree {i}")
    return tree


def test_a_cache_miss_is_answered_inline(tmp_path, monkeypatch):
    tree = _store_with_tree_values(tmp_path, 3)
    store = MetaStore.open(tree, sync="none")
    try:
        assert store.peek("/d/f1", "k") == (False, None)  # not in memory yet: a miss

        def no_threads(*args, **kwargs):
            raise AssertionError("a metadata read took a worker-thread hop")

        async def main():
            service = MetaService(store, sync="none")
            monkeypatch.setattr(trio.to_thread, "run_sync", no_threads)
            assert await service.get_all("/d/f1") == {"k": "tree 1"}
            assert await service.get("/d/f2", "k") == "tree 2"
            assert await service.get("/d/f2", "other") is None
            assert await service.get_all("/nothing/here") == {}
            await service.set("/d/f0", "k", "journal 0")  # the journal wins over the tree
            assert await service.get("/d/f0", "k") == "journal 0"
            await service.move("/d", "/e")
            assert await service.get_all("/d/f1") == {}
            assert await service.get_all("/e/f1") == {"k": "tree 1"}
            assert await service.get("/e/f0", "k") == "journal 0"
        trio.run(main)
    finally:
        store.close()


def test_a_read_waits_in_a_thread_while_the_store_lock_is_busy(tmp_path, monkeypatch):
    tree = _store_with_tree_values(tmp_path, 2)
    store = MetaStore.open(tree, sync="none")
    taken, release = threading.Event(), threading.Event()

    def hold_lock():  # as a rotation does while it swaps the new tree in
        with store._lock:
            taken.set()
            release.wait(60)
    holder = threading.Thread(target=hold_lock)
    hops = []
    real = trio.to_thread.run_sync

    async def counting(fn, *args, **kwargs):
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    async def main():
        service = MetaService(store, sync="none")
        monkeypatch.setattr(trio.to_thread, "run_sync", counting)
        answers = []

        async def read():
            answers.append(await service.get("/d/f1", "k"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep(0.3)
            assert answers == [] and len(hops) == 1  # waiting for the lock, in a thread
            release.set()
        assert answers == ["tree 1"]
        assert await service.get("/d/f0", "k") == "tree 0"  # lock free again: inline
        assert len(hops) == 1

    holder.start()
    taken.wait(60)
    try:
        trio.run(main)
    finally:
        release.set()
        holder.join()
        store.close()


def test_reads_racing_with_rotations_see_every_value(tmp_path):
    """A thread rotates the store over and over while the event loop writes new values and
    reads old and new ones back (inline, or in a thread when the rotation holds the lock)."""
    tree = _store_with_tree_values(tmp_path, 200)
    store = MetaStore.open(tree, sync="none")
    stop = threading.Event()
    rotations = []

    def rotate_forever():
        while not stop.is_set():
            store.rotate()
            rotations.append(1)
            stop.wait(0.01)  # the event loop gets the lock free, too

    async def main():
        service = MetaService(store, sync="none", quiet_seconds=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)  # writes that find the lock busy are committed there
            try:
                await read_and_write(service)
            finally:
                stop.set()  # before the service closes the store
                await trio.to_thread.run_sync(rotator.join)
            nursery.cancel_scope.cancel()

    async def read_and_write(service):
        written: dict[str, str] = {}
        for rnd in range(8):
            for i in range(0, 200, 7):
                path = f"/d/f{(i + rnd) % 200}"
                value = f"round {rnd}"
                await service.set(path, "k", value)
                written[path] = value
            for i in range(rnd, 200, 5):
                path = f"/d/f{i}"
                assert await service.get(path, "k") == written.get(path, f"tree {i}"), path
            await trio.sleep(0)

    rotator = threading.Thread(target=rotate_forever)
    rotator.start()
    try:
        trio.run(main)
    finally:
        stop.set()
        rotator.join()
    assert len(rotations) >= 1
    with MetaStore.open(tree, readonly=True) as reader:  # the service closed the store
        assert reader.get("/d/f0", "k") is not None


def test_moves_and_removes_of_paths_without_metadata_write_nothing(tmp_path):
    tree = _store_with_tree_values(tmp_path, 2)  # /d/f0, /d/f1 in the tree
    store = MetaStore.open(tree, sync="none")
    try:
        async def main():
            service = MetaService(store, sync="none")
            await service.set("/j/a", "k", "journal")
            entries = store.status()["entries"]
            await service.move("/plain", "/plain2")       # nothing at either: skipped
            await service.move("/d/none", "/x/y")
            await service.remove("/d/none")
            await service.remove("/j/b")
            assert store.status()["entries"] == entries
            # metadata at or below the source, or at the destination: written
            await service.move("/d", "/e")                # the tree has /d below
            assert await service.get_all("/e/f1") == {"k": "tree 1"}
            await service.move("/j", "/j2")               # the journal has /j/a below
            assert await service.get("/j2/a", "k") == "journal"
            await service.move("/nothing", "/e/f0")       # clears the destination's values
            assert await service.get_all("/e/f0") == {}
            await service.remove("/e")
            assert await service.get_all("/e/f1") == {}
            assert store.status()["entries"] == entries + 7
            await service.move("/e/f1", "/e/f9")          # under a removed path: unsure, written
            assert store.status()["entries"] == entries + 9
        trio.run(main)
    finally:
        store.close()
    with MetaStore.open(tree, readonly=True) as reader:
        assert reader.dump() == {"/j2/a": {"k": "journal"}}
