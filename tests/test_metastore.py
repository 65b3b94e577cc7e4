"""MetaStore, MetaService, store location and store fsck, on real gvfs stores and real gio."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import random
import shutil
import stat
import struct
import threading
import time
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings, strategies as st

from journalfs.formats.gvfs_journal import HEADER_SIZE
from journalfs.metastore.fsck import check_store
from journalfs.metastore.location import resolve_store
from journalfs.metastore.service import MetaService
from journalfs.metastore import store as store_module
from journalfs.metastore.store import (MAPPED_APPENDS, SPACE_RECHECK_MARGIN, EntryTooLarge,
                                      MetaStore, StoreLocked, journal_path_for)

from gvfsd import GvfsSession, gvfs_module_session  # noqa: F401


def copy_snapshot(snap: Path, dest: Path) -> Path:
    shutil.copytree(snap / "gvfs-metadata", dest)
    for f in dest.iterdir():
        f.chmod(0o600)
    return dest / "home"


def under(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root + "/")


class Model:
    """gvfs semantics as plain dicts: {path: {key: value}} (moves never overlap, as renames)."""

    def __init__(self, state=None):
        self.state = {p: dict(m) for p, m in (state or {}).items()}

    def set(self, p, k, v):
        self.state.setdefault(p, {})[k] = v

    def unset(self, p, k):
        self.state.get(p, {}).pop(k, None)

    def remove(self, p):
        for q in [q for q in self.state if under(q, p)]:
            del self.state[q]

    def move(self, src, dst):
        moved = {dst + q[len(src):]: dict(m) for q, m in self.state.items() if under(q, src)}
        self.remove(dst)
        self.remove(src)
        self.state.update(moved)

    def dump(self):
        return {p: m for p, m in self.state.items() if m}


def random_path(rng) -> str:
    return "/" + "/".join(rng.choice("abcd") for _ in range(rng.randint(1, 3)))


def random_op(rng, store: MetaStore, model: Model) -> None:
    r, p = rng.random(), random_path(rng)
    if r < 0.5:
        k = rng.choice(["comment", "tags", "ключ"])
        v = rng.choice(["v", "", "ünï ✓", ["x", "y"], [], "w" * rng.randint(0, 90)])
        store.set(p, k, v)
        model.set(p, k, v)
    elif r < 0.65:
        k = rng.choice(["comment", "tags", "ключ"])
        store.unset(p, k)
        model.unset(p, k)
    elif r < 0.8:
        store.remove(p)
        model.remove(p)
    else:
        q = random_path(rng)
        if under(p, q) or under(q, p):
            return
        store.move(p, q)
        model.move(p, q)


def assert_store_equals(store: MetaStore, model: Model, probes=()) -> None:
    want = model.dump()
    assert store.dump() == want
    for p in set(want) | set(probes):
        assert store.get_all(p) == dict(sorted(want.get(p, {}).items()))
        for k, v in want.get(p, {}).items():
            assert store.get(p, k) == v


# ---- reading real gvfs stores -----------------------------------------------------------
def test_lookups_on_real_stores_equal_gio_ground_truth(gvfs_snapshots):
    for snap in gvfs_snapshots:
        want = json.loads((snap / "expected.json").read_text())
        with MetaStore.open(str(snap / "gvfs-metadata" / "home"), readonly=True, create=False) as store:
            assert store.dump() == want
            for path, meta in want.items():
                assert store.get_all(path) == dict(sorted(meta.items()))
                for key, value in meta.items():
                    assert store.get(path, key) == value
                assert store.get(path, "no-such-key") is None
            assert store.get_all("/no/such/path") == {}


def test_writing_on_a_real_gvfs_store_keeps_its_state(gvfs_snapshots, tmp_path):
    snap = gvfs_snapshots[-1]
    tree = copy_snapshot(snap, tmp_path / "store")
    model = Model(json.loads((snap / "expected.json").read_text()))
    rng = random.Random(5)
    with MetaStore.open(str(tree), sync="none", journal_size=32768) as store:
        for _ in range(300):
            random_op(rng, store, model)
        assert_store_equals(store, model)
        store.rotate()
        assert_store_equals(store, model)
    with MetaStore.open(str(tree), readonly=True) as store:
        assert store.dump() == model.dump()


# ---- writing: random model ---------------------------------------------------------------
@pytest.mark.parametrize("seed, journal_size", [(1, 2048), (2, 32768), (3, 1 << 20)])
def test_random_writes_match_model_after_every_step(tmp_path, seed, journal_size):
    rng = random.Random(seed)
    model = Model()
    with MetaStore.open(str(tmp_path / "home"), sync="none", journal_size=journal_size) as store:
        for step in range(600):
            random_op(rng, store, model)
            if step % 97 == 0:
                store.rotate()
            assert_store_equals(store, model, [random_path(rng) for _ in range(3)])
        assert_store_equals(store, model)
        rotations = store.rotations
    assert rotations >= 6 and (journal_size > 2048 or rotations > 12)
    with MetaStore.open(str(tmp_path / "home"), readonly=True) as store:
        assert store.dump() == model.dump()


def test_journal_layout_of_a_new_store(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="always", journal_size=65536) as store:
        store.set("/a", "k", "v")
        journal = Path(store.journal_path)
        assert store.durable_ticket == 1
        assert journal.name.startswith("home-") and journal.stat().st_size == 65536
        assert stat.S_IMODE(journal.stat().st_mode) == 0o600
        data = journal.read_bytes()
        assert data[:6] == b"\xda\x1ajour" and struct.unpack_from(">I", data, 16)[0] == 1
        tag = struct.unpack_from(">I", (tmp_path / "home").read_bytes(), 12)[0]
        assert journal.name == f"home-{tag:08x}.log"


def test_rotation_replaces_files_and_marks_the_old_tree(tmp_path):
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none") as store:
        store.set("/a", "k", "v")
        old_journal = store.journal_path
        old_tree = open(tree, "rb")  # what a reader holds across the rotation
        store.rotate()
        assert not os.path.exists(old_journal) and os.path.exists(store.journal_path)
        assert old_tree.read(12)[8:12] == b"\xff\xff\xff\xff"  # rotated flag in the old inode
        assert open(tree, "rb").read(12)[8:12] == b"\0\0\0\0"
        old_tree.close()
        assert store.get("/a", "k") == "v" and store.status()["entries"] == 0
    tag = struct.unpack_from(">I", tree.read_bytes(), 12)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["home", "home.journalfs-lock", Path(journal_path_for(str(tree), tag)).name])


def test_a_journal_of_sets_is_merged_from_its_newest_entry_per_key_into_the_same_tree(
        tmp_path, monkeypatch):
    """A rotation after a burst of sets folds in only the newest entry of each (path, key)
    (JournalIndex.deciding_sets): the tree it writes is byte for byte the one every entry
    applied in order gives (values, each node's mtime, the time range); an UNSET or a
    structural entry makes it apply them all."""
    from journalfs.formats.gvfs_tree import MergedTree, write_tree
    clock = iter(range(1_700_000_000, 1_700_100_000, 7))
    monkeypatch.setattr(store_module.time, "time", lambda: next(clock))

    def tree_bytes(merged: MergedTree, name: str) -> bytes:
        with open(tmp_path / name, "w+b") as f:
            write_tree(merged, f, 1234)
        return (tmp_path / name).read_bytes()

    with MetaStore.open(str(tmp_path / "home"), sync="none") as store:
        rng = random.Random(7)
        for n in range(1200):
            store.set(f"/d{rng.randrange(4)}/f{rng.randrange(30)}", f"k{rng.randrange(3)}",
                      f"v{n}" if n % 5 else [f"a{n}", f"b{n}"])
        records = store._index.records
        deciding = store._index.deciding_sets(len(records))
        assert deciding is not None and 0 < len(deciding) < len(records) // 2
        every = MergedTree(store._tree)
        for rec in records:
            every.apply(rec)
        assert tree_bytes(store._merged(), "folded") == tree_bytes(every, "every")
        store.unset("/d0/f1", "k0")
        assert store._index.deciding_sets(len(store._index.records)) is None
        before = store.dump()
        store.rotate()
        assert store.dump() == before and store._index.deciding_sets(0) is not None


def test_full_journal_rotates_and_retries(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="none", journal_size=1024) as store:
        for i in range(50):
            store.set(f"/f{i}", "comment", "x" * 100)
        assert store.rotations >= 5
        assert store.dump() == {f"/f{i}": {"comment": "x" * 100} for i in range(50)}
        with pytest.raises(EntryTooLarge):
            store.set("/big", "comment", "x" * 2000)
        assert store.get("/big", "comment") is None


def test_entry_over_32k_fits_a_bigger_journal(tmp_path):
    big = "y" * 40000  # gvfs itself can never store this (its journals are 32 KiB)
    with MetaStore.open(str(tmp_path / "home"), sync="none") as store:
        store.set("/a", "comment", big)
        assert store.get("/a", "comment") == big
    with MetaStore.open(str(tmp_path / "home"), readonly=True) as store:
        assert store.get("/a", "comment") == big


def test_second_writer_is_refused_with_the_holder_named(tmp_path):
    with MetaStore.open(str(tmp_path / "home")) as store:
        with pytest.raises(StoreLocked, match=f"pid {os.getpid()}"):
            MetaStore.open(str(tmp_path / "home"))
        with MetaStore.open(str(tmp_path / "home"), readonly=True) as reader:  # readers need no lock
            store.set("/a", "k", "v")
            assert reader.get("/a", "k") == "v"
    with MetaStore.open(str(tmp_path / "home")):  # released on close
        pass


def test_reader_follows_new_entries_and_rotations(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="none", journal_size=2048) as writer:
        reader = MetaStore.open(str(tmp_path / "home"), readonly=True)
        model = Model()
        rng = random.Random(9)
        for _ in range(200):
            random_op(rng, writer, model)
            assert reader.dump() == model.dump()
        assert writer.rotations > 3
        reader.close()


def test_writes_during_rotation_are_not_lost(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="none", journal_size=1 << 16) as store:
        for i in range(3000):  # a tree worth compacting
            store.set(f"/base/d{i % 30}/f{i}", "comment", f"base {i}")
        stop = threading.Event()
        written: list[int] = []

        def writer():
            i = 0
            while not stop.is_set() or i < 200:
                store.set(f"/live/f{i}", "n", str(i))
                written.append(i)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        for _ in range(5):
            store.rotate()
        stop.set()
        t.join()
        state = store.dump()
        assert store.rotations >= 5
        assert all(state[f"/live/f{i}"] == {"n": str(i)} for i in written)
        assert len([p for p in state if p.startswith("/base/")]) == 3000
    with MetaStore.open(str(tmp_path / "home"), readonly=True) as store:
        assert store.dump() == state


def test_open_race_rotated_tree_is_reopened(tmp_path):
    """A reader that maps a tree whose rotated flag is set and whose name now points to a new
    inode must follow to the new tree (spec: re-check after opening the journal)."""
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none") as store:
        store.set("/a", "k", "1")
        reader = MetaStore.open(str(tree), readonly=True)
        store.set("/a", "k", "2")
        store.rotate()  # reader's mapped tree is now rotated, its journal unlinked
        assert reader.get("/a", "k") == "2"
        assert reader.status()["journal_path"] == store.journal_path
        reader.close()


def test_invalid_journal_tail_is_dropped_by_rotation_like_gvfs(tmp_path):
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none") as store:
        store.rotate()
        for i in range(5):
            store.set(f"/f{i}", "k", str(i))
        journal = store.journal_path
    # close() rotated: write fresh entries, then corrupt the 4th entry's CRC
    store = MetaStore.open(str(tree), sync="none")
    for i in range(5):
        store.set(f"/g{i}", "k", str(i))
    store.flush()
    journal = store.journal_path
    data = bytearray(Path(journal).read_bytes())
    off = HEADER_SIZE
    for _ in range(3):
        off += struct.unpack_from(">I", data, off)[0]
    data[off + 20] ^= 0xFF
    Path(journal).write_bytes(bytes(data))
    store._release()  # simulate a crash: no close(), no rotation

    problems = check_store(str(tree))
    assert any("CRC" in f.reason for f in problems)
    with MetaStore.open(str(tree), readonly=True) as reader:
        assert reader.get("/g2", "k") == "2" and reader.get("/g3", "k") is None
    check = check_store(str(tree), repair=True)
    assert any("backed up" in a for a in check.actions)
    backups = sorted(tmp_path.glob("home*.journalfs-backup-*"))
    assert sorted(b.name.split(".journalfs-backup-")[0] for b in backups) == \
        sorted(["home", Path(journal).name])
    assert check_store(str(tree)) == []
    with MetaStore.open(str(tree), readonly=True) as reader:
        # fsck --repair keeps every valid entry, /g4 after the damaged /g3 too (issue 14)
        want = {f"/f{i}": {"k": str(i)} for i in range(5)} | {f"/g{i}": {"k": str(i)} for i in (0, 1, 2, 4)}
        assert reader.dump() == want


def test_unset_of_a_key_no_one_ever_set(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="none") as store:
        store.set("/data", "k", "v")
        store.unset("/data", "never-set")
        store.unset("/nowhere", "never-set-either")
        store.rotate()
        assert store.dump() == {"/data": {"k": "v"}}


def test_invalid_keys_and_values_are_refused(tmp_path):
    with MetaStore.open(str(tmp_path / "home"), sync="none") as store:
        for bad in (lambda: store.set("/a", "", "v"), lambda: store.set("/a", "k\0", "v"),
                    lambda: store.set("/a", "k", "v\0w"), lambda: store.set("/a\0b", "k", "v")):
            with pytest.raises(ValueError):
                bad()
        assert store.dump() == {}


# ---- the async service -----------------------------------------------------------------
def test_service_group_commit_and_compaction(tmp_path):
    tree = str(tmp_path / "home")
    store = MetaStore.open(tree, sync="batch", journal_size=4096)

    async def main():
        service = MetaService(store, batch_delay=0.001, fill_threshold=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)

            tickets = []

            async def one(i):
                tickets.append(await service.set(f"/f{i}", "n", str(i)))

            async with trio.open_nursery() as writers:
                for i in range(60):
                    writers.start_soon(one, i)
            await service.sync()  # every acknowledged write durable when it returns
            assert store.durable_ticket >= max(tickets)
            assert await service.get("/f7", "n") == "7"
            await service.move("/f1", "/moved")
            assert await service.get_all("/moved") == {"n": "1"}
            await service.compact()
            assert service.status()["rotations"] >= 1
            nursery.cancel_scope.cancel()
        return service

    trio.run(main)
    with MetaStore.open(tree, readonly=True) as reader:  # shutdown flushed, rotated, unlocked
        state = reader.dump()
        assert state["/moved"] == {"n": "1"} and "/f1" not in state and len(state) == 60
        assert reader.status()["entries"] == 0
    with MetaStore.open(tree):
        pass


def test_service_rotates_in_the_background_past_the_fill_threshold(tmp_path):
    store = MetaStore.open(str(tmp_path / "home"), sync="none", journal_size=8192)

    async def main():
        service = MetaService(store, sync="none", fill_threshold=0.2, quiet_seconds=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            for i in range(40):  # 40 x 56 bytes: past 20 % of 8 KiB, far from full
                await service.set(f"/f{i}", "comment", "x" * 20)
            with trio.fail_after(60):  # generous: a bound against hanging, not a timing check
                while store.rotations == 0:
                    await trio.sleep(0.01)
            assert store.fill() < 0.2
            nursery.cancel_scope.cancel()

    trio.run(main)
    with MetaStore.open(str(tmp_path / "home"), readonly=True) as reader:
        assert reader.dump() == {f"/f{i}": {"comment": "x" * 20} for i in range(40)}


@contextlib.contextmanager
def lock_held_by_another_thread(store: MetaStore):
    """The store's lock taken by a second thread until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold_lock():
        with store._lock:
            taken.set()
            release.wait(60)
    holder = threading.Thread(target=hold_lock)
    holder.start()
    taken.wait(60)
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_sync_none_writes_are_applied_inline_unless_the_store_is_busy_or_full(tmp_path):
    """sync "none": a write that fits and finds the store lock free is appended on the event
    loop itself (no group commit); one that finds the lock taken (e.g. by a rotation) or the
    journal full goes through the commit task -- and nothing is lost either way."""
    tree = str(tmp_path / "home")
    store = MetaStore.open(tree, sync="none", journal_size=4096)

    async def main():
        service = MetaService(store, sync="none", fill_threshold=0.99, quiet_seconds=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.set("/a", "k", "1")
            assert service.commits == 0 and store.get("/a", "k") == "1"
            with pytest.raises(ValueError):
                await service.set("/a", "", "bad key")  # refused, as through a commit
            async with trio.open_nursery() as writers:
                with lock_held_by_another_thread(store):
                    writers.start_soon(service.set, "/b", "k", "2")
                    await trio.sleep(0.05)
                    assert store._index.count == 1  # queued behind the lock, not applied or dropped
            assert service.commits == 1
            for i in range(100):  # 100 x ~56 bytes never fit 4 KiB: full -> commit + rotation
                await service.set(f"/c{i}", "k", f"{i:020}")
            assert store.rotations >= 1 and service.commits >= 2
            nursery.cancel_scope.cancel()

    trio.run(main)
    with MetaStore.open(tree, readonly=True) as reader:
        assert reader.dump() == {"/a": {"k": "1"}, "/b": {"k": "2"},
                                 **{f"/c{i}": {"k": f"{i:020}"} for i in range(100)}}


def test_an_append_is_in_the_file_before_any_flush(tmp_path):
    """A write returns once its entry and the count covering it are in the kernel's copy of
    the journal (what kill -9 cannot take back): another open of the file -- a gvfs reader
    maps it -- sees both, with no flush, rotation or close in between. Where the CPU keeps
    one CPU's stores in order the writer copies them into its shared mapping (no syscall)."""
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="batch") as store:
        assert store._journal_mapped_rw == MAPPED_APPENDS
        store.set("/a", "k", "v1")
        assert store.try_set("/b", "k", ["x", "y"]) is not None
        assert store.durable_ticket < store.ticket == 2  # nothing flushed yet
        with open(store.journal_path, "rb") as f:
            assert int.from_bytes(f.read(HEADER_SIZE)[16:20], "big") == 2
        with MetaStore.open(str(tree), readonly=True) as reader:
            assert reader.dump() == {"/a": {"k": "v1"}, "/b": {"k": ["x", "y"]}}


def test_a_journal_with_holes_is_made_whole_before_appends(tmp_path):
    """A journal left sparse by another writer gets real zeros in its free part at open, so
    no append lands on a page without a block (through a mapping, a full disk would then
    be SIGBUS instead of ENOSPC); the entries already in it stay."""
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none", journal_size=1 << 20) as store:
        store.set("/a", "k", "1")
        journal = store.journal_path
        store._release()  # handed over as it is
    size = os.path.getsize(journal)
    fd = os.open(journal, os.O_RDWR)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        punch = 0x2 | 0x1  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if libc.fallocate(fd, punch, ctypes.c_long(65536), ctypes.c_long(size - 65536)) != 0:
            pytest.skip(f"no hole punching here: {os.strerror(ctypes.get_errno())}")
        if os.lseek(fd, HEADER_SIZE, os.SEEK_HOLE) != 65536:
            pytest.skip("this filesystem does not report holes")
        with MetaStore.open(str(tree), sync="none") as store:
            assert os.lseek(fd, HEADER_SIZE, os.SEEK_HOLE) == size  # no hole left
            assert os.path.getsize(journal) == size
            store.set("/b", "k", "2")
            assert store.dump() == {"/a": {"k": "1"}, "/b": {"k": "2"}}
    finally:
        os.close(fd)
    with MetaStore.open(str(tree), readonly=True) as reader:
        assert reader.dump() == {"/a": {"k": "1"}, "/b": {"k": "2"}}


@pytest.mark.skipif(not MAPPED_APPENDS, reason="appends take pwrite on this CPU")
def test_batch_appends_make_no_syscall_and_always_appends_use_pwrite(tmp_path, monkeypatch):
    """batch/none: an append is memory copies into the mapped journal (no write call);
    always: pwrite, whose pages cost the fdatasync that follows no ext4 journal commit."""
    written = []
    real = store_module.write_all
    monkeypatch.setattr(store_module, "write_all", lambda *a: (written.append(a), real(*a)))
    with MetaStore.open(str(tmp_path / "home"), sync="batch") as store:
        del written[:]  # (creating the store writes its files)
        store.set("/a", "k", "1")
        assert store.try_set("/b", "k", "2") is not None and written == []
        store.sync = "always"
        store.set("/c", "k", "3")
        assert len(written) == 2  # the entry, then the count
        assert store.dump() == {"/a": {"k": "1"}, "/b": {"k": "2"}, "/c": {"k": "3"}}


def test_free_space_is_asked_again_near_the_line_and_refused_below_it(tmp_path, monkeypatch):
    """A set is refused (ENOSPC) when it would leave less than a rotation's room free. The
    filesystem is asked on every set once the room left is within SPACE_RECHECK_MARGIN of
    that line, and otherwise only every SPACE_RECHECK_SECONDS (set huge here)."""
    monkeypatch.setattr(store_module, "SPACE_RECHECK_SECONDS", 3600.0)
    asked = []
    with MetaStore.open(str(tmp_path / "home"), sync="none") as store:
        free = {"bytes": store.rotation_room() + SPACE_RECHECK_MARGIN // 2}

        def space_left():
            asked.append(free["bytes"])
            return free["bytes"]
        monkeypatch.setattr(store, "_space_left", space_left)
        for i in range(10):
            store.set(f"/near{i}", "k", "v")
        assert len(asked) == 10  # near the line: every set asks
        free["bytes"] = store.rotation_room()  # a set now would eat into a rotation's room
        with pytest.raises(OSError) as full:
            store.set("/over", "k", "v")
        assert full.value.errno == errno.ENOSPC and store.refused_for_space == 1
        store.unset("/near0", "k")  # unsets are never refused
        free["bytes"] = 1 << 40
        del asked[:]
        for i in range(20):
            store.set(f"/far{i}", "k", "v")
        assert len(asked) == 1  # far from it: asked once, then counted down
        assert store.get("/far19", "k") == "v" and store.get("/over", "k") is None


# ---- where stores live ----------------------------------------------------------------------
def test_resolve_store_locations(tmp_path, monkeypatch):
    home = tmp_path / "h"
    (home / "docs").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    loc = resolve_store(str(home / "docs"))
    assert loc.prefix == "" and loc.store_path("/a/b") == "/a/b"
    parts = Path(loc.tree_path).parts
    assert parts[-1] == "home" and parts[-2].startswith("docs-") and len(parts[-2]) == 5 + 12
    assert str(home / ".local/share/journalfs/stores") in loc.tree_path
    assert resolve_store(str(home / "docs")) == loc
    g = resolve_store(str(home / "docs"), gvfs=True)
    assert g.tree_path == str(home / ".local/share/gvfs-metadata/home")
    assert g.store_path("/") == "/docs" and g.store_path("/x/y") == "/docs/x/y"
    assert resolve_store(str(home), store_dir=str(tmp_path / "s")).store_path("/x") == "/x"
    r = resolve_store(str(tmp_path / "elsewhere"), store_dir=str(tmp_path / "s"))
    assert r.tree_path == str(tmp_path / "s" / "root")
    assert r.store_path("/f") == os.path.realpath(tmp_path / "elsewhere") + "/f"


# ---- real gvfs reads what we write ------------------------------------------------------------
@pytest.mark.gvfs
@pytest.mark.timeout(300)
def test_gio_reads_journalfs_stores(gvfs_module_session, tmp_path):
    """A journalfs store with a 1 MiB journal holding > 32 KiB of entries (no rotation), then
    the same store compacted: gio sees exactly our dump both times."""
    session = gvfs_module_session
    rng = random.Random(11)
    model = Model()
    tree = tmp_path / "home"
    paths = set()
    with MetaStore.open(str(tree), sync="none") as store:
        for _ in range(700):
            p = "/data" + random_path(rng)
            paths.add(p)
            k = rng.choice(["comment", "tags", "ключ", "a.b.c"])
            v = rng.choice(["v", "ünï ✓", ["x", "sp ace"], "w" * rng.randint(1, 200)])
            store.set(p, k, v)
            model.set(p, k, v)
            if rng.random() < 0.1:
                q = "/data" + random_path(rng)
                if not (under(p, q) or under(q, p)):
                    store.move(p, q)
                    model.move(p, q)
                    paths.add(q)
        store.flush()
        assert store.status()["journal_used"] > 32 * 1024 and store.rotations == 0
        assert store.dump() == model.dump()
        paths |= set(model.dump())  # moved subtrees land on paths never named directly
        session.install_store(tree)
        session.create_files(paths)
        assert session.gio_store_metadata(paths) == model.dump()
        store.rotate()
        session.install_store(tree)
        assert session.gio_store_metadata(paths) == model.dump()


@pytest.mark.gvfs
@pytest.mark.timeout(600)
def test_gio_reads_a_100k_path_store(gvfs_module_session, tmp_path):
    session = gvfs_module_session
    tree = tmp_path / "home"
    paths = [f"/big/d{i // 1000:03d}/f{i:06d}" for i in range(100_000)]
    with MetaStore.open(str(tree), sync="none", journal_size=8 << 20) as store:
        for i, p in enumerate(paths):
            store.set(p, "comment", f"file {i}")
            if i % 10 == 0:
                store.set(p, "tags", [str(i), "x"])
        store.rotate()
    session.install_store(tree)
    sample = paths[::97] + paths[-3:]
    session.create_files(sample)
    got = session.gio_store_metadata(sample)
    want = {p: {"comment": f"file {int(p[-6:])}"} for p in sample}
    for p in sample:
        i = int(p[-6:])
        if i % 10 == 0:
            want[p]["tags"] = [str(i), "x"]
    assert got == want


@pytest.mark.gvfs
@pytest.mark.timeout(300)
def test_gvfsd_appends_to_our_big_journal_and_we_read_it(tmp_path):
    """gvfsd-metadata takes over a journalfs store whose 1 MiB journal already holds > 32 KiB of
    entries, appends to it (it honours file_size), and journalfs reads the result."""
    session = GvfsSession(tmp_path / "gvfs")
    session.scratch.mkdir()
    with session:
        tree = tmp_path / "home"
        model = Model()
        with MetaStore.open(str(tree), sync="none") as store:
            for i in range(400):
                store.set(f"/docs/f{i % 40}", "comment", f"value {i} " + "z" * 80)
                model.set(f"/docs/f{i % 40}", "comment", f"value {i} " + "z" * 80)
            store.flush()
            assert store.status()["journal_used"] > 32 * 1024
            store._release()  # hand the store over as-is (no compaction at close)
        session.install_store(tree)
        session.create_files(list(model.dump()) + ["/docs/new"])
        session.gio_set(session.file_of("/docs/new"), "comment", "from gvfs")
        session.gio_set(session.file_of("/docs/f3"), "tags", ["a", "b"])
        model.set("/docs/new", "comment", "from gvfs")
        model.set("/docs/f3", "tags", ["a", "b"])
        with MetaStore.open(str(session.home_tree), readonly=True) as reader:
            for _ in range(100):  # the daemon writes asynchronously
                if reader.get("/docs/f3", "tags") == ["a", "b"]:
                    break
                time.sleep(0.05)
            assert reader.dump() == model.dump()
            assert reader.status()["journal_size"] == 1 << 20  # still our journal, appended to


# ---- performance work: group commit, inline reads, leftovers --------------------------------
def test_service_applies_concurrent_writes_in_few_commits(tmp_path):
    """Many writers: far fewer group commits (one store call + one fdatasync each) than
    writes; a bad write fails alone; a full journal mid-batch rotates without losing any."""
    tree = str(tmp_path / "home")
    store = MetaStore.open(tree, sync="always", journal_size=8192)
    writes = 300
    failures = []

    async def main():
        service = MetaService(store, fill_threshold=0.99, quiet_seconds=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)

            async def one(i):
                key = "" if i == 13 else "n"  # an invalid key: only this write may fail
                try:
                    ticket = await service.set(f"/d{i % 7}/f{i}", key, str(i))
                except ValueError:
                    failures.append(i)
                    return
                assert store.durable_ticket >= ticket

            async with trio.open_nursery() as writers:
                for i in range(writes):
                    writers.start_soon(one, i)
            assert service.commits < writes // 2
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert failures == [13]
    assert store.rotations >= 1  # 300 entries of ~40 bytes never fit 8 KiB
    with MetaStore.open(tree, readonly=True) as reader:
        assert reader.dump() == {f"/d{i % 7}/f{i}": {"n": str(i)} for i in range(writes) if i != 13}


def test_inline_reads_answer_only_from_memory(tmp_path):
    tree = str(tmp_path / "home")
    with MetaStore.open(tree, sync="none") as store:
        store.set("/in/tree", "k", "t")
    store = MetaStore.open(tree, sync="none")
    try:
        store.set("/in/journal", "k", "j")
        store.remove("/gone")
        assert store.peek("/in/journal", "k") == (True, "j")
        assert store.peek("/gone/below", "k") == (True, None)   # a REMOVE decides it
        assert store.peek("/in/tree", "k") == (False, None)     # needs the mapped tree
        assert store.get("/in/tree", "k") == "t"                # one key: not cached
        assert store.peek("/in/tree", "k") == (False, None)
        assert store.get_all("/in/tree") == {"k": "t"}          # get_all caches the node
        assert store.peek("/in/tree", "k") == (True, "t")
        assert store.peek("/in/tree") == (True, {"k": "t"})
        store.set("/in/tree", "k", "newer")                     # the journal wins over the cache
        assert store.peek("/in/tree", "k") == (True, "newer")

        with lock_held_by_another_thread(store):  # inline reads give up instead of waiting
            assert store.peek("/in/journal", "k") == (False, None)

        with MetaStore.open(tree + "2", sync="none") as other:
            other.set("/t", "k", "tree value")
        other = MetaStore.open(tree + "2", sync="none")

        async def via_service():
            service = MetaService(store, sync="none")
            assert service.get_cached("/in/journal", "k") == (True, "j")
            assert await service.get("/in/journal", "k") == "j"
            assert await service.get_all("/in/tree") == {"k": "newer"}
            service = MetaService(other, sync="none")
            assert service.get_cached("/t", "k") == (False, None)
            assert await service.get("/t", "k") == "tree value"   # a thread, once ...
            assert service.get_cached("/t", "k") == (True, "tree value")  # ... then inline
            assert service.get_cached("/t") == (True, {"k": "tree value"})
        trio.run(via_service)
        other.close()
    finally:
        store.close()
    with MetaStore.open(tree, readonly=True) as reader:
        assert reader.peek("/in/tree", "k") == (False, None)  # readers re-check the files


def _kill_during_rotation(tree: str, after_temp_written: bool) -> None:
    """A writer process killed by SIGKILL inside rotate(), with its temp tree on disk."""
    code = f"""
import os, signal
import journalfs.metastore.store as store_mod
from journalfs.formats import gvfs_tree
real = gvfs_tree.write_tree
def dying(merged, f, tag):
    if {after_temp_written!r}:
        real(merged, f, tag)
        f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
store_mod.write_tree = dying
s = store_mod.MetaStore.open({tree!r}, sync="always")
s.set("/kept", "k", "v")
s.rotate()
"""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


@pytest.mark.parametrize("after_temp_written", [False, True])
def test_temp_tree_of_a_killed_rotation_is_removed_at_next_open(tmp_path, after_temp_written):
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none") as store:
        store.set("/old", "k", "v")
    user_copy = tmp_path / "home.backup"  # a name like ours, but the user's own copy
    shutil.copy(tree, user_copy)
    _kill_during_rotation(str(tree), after_temp_written)
    leftovers = [p for p in tmp_path.glob("home.*") if p.name[5:6].isdigit()]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0 or not after_temp_written
    assert leftovers, "the killed writer left no temp tree"
    with MetaStore.open(str(tree), readonly=True) as reader:  # readers never delete
        assert reader.get("/kept", "k") == "v"
    assert all(p.exists() for p in leftovers)
    with MetaStore.open(str(tree), sync="none") as store:
        assert not any(p.exists() for p in leftovers)
        assert store.get("/kept", "k") == "v" and store.get("/old", "k") == "v"
    assert user_copy.exists()


def test_gvfsd_backend_status_names_the_journal(tmp_path):
    from journalfs.metastore.gvfsd import GvfsdBackend
    tree = tmp_path / "home"
    assert GvfsdBackend(tree).status()["journal_path"] is None  # gvfsd wrote nothing yet
    with MetaStore.open(str(tree), sync="none") as store:
        store.set("/a", "k", "v")
    with MetaStore.open(str(tree), readonly=True) as reader:
        journal = reader.journal_path  # close() rotated: the journal of the new tree
    backend = GvfsdBackend(tree)
    assert backend.status()["journal_path"] == journal and os.path.exists(journal)


# ---- names, keys and values are bytes (surrogateescape), as gvfs keeps C strings ----------
def _fs(raw: bytes) -> str:
    return os.fsdecode(raw)


def test_non_utf8_paths_keys_and_values_round_trip_as_raw_bytes(tmp_path):
    tree = tmp_path / "store" / "home"
    path, key, value = _fs(b"/caf\xe9/\xff\xfe.txt"), _fs(b"k\xff"), _fs(b"v\xfe\x80 \xc3")
    listed = [_fs(b"\xff"), "ok", _fs(b"\x80\x81")]
    with MetaStore.open(str(tree), sync="none") as store:
        store.set(path, key, value)
        store.set(path, "tags", listed)
        store.set(_fs(b"/moved-from-\xfa"), "k", "x")
        store.move(_fs(b"/moved-from-\xfa"), _fs(b"/moved-to-\xfb"))
        assert store.get(path, key) == value  # from the journal
        journal = Path(store.journal_path).read_bytes()
        assert b"/caf\xe9/\xff\xfe.txt\0" in journal and b"v\xfe\x80 \xc3\0" in journal
        with pytest.raises(OSError) as caught:  # a str no bytes make: EINVAL, nothing written
            store.set("/x", "k", "\ud800")
        assert caught.value.errno == errno.EINVAL and isinstance(caught.value, ValueError)
    raw = tree.read_bytes()  # rotated at close: the raw bytes in the tree, not UTF-8 mangled
    assert b"\xff\xfe.txt\0" in raw and b"k\xff\0" in raw and b"v\xfe\x80 \xc3\0" in raw
    with MetaStore.open(str(tree), readonly=True) as reader:
        assert reader.get(path, key) == value
        assert reader.get_all(path) == {key: value, "tags": listed}
        assert reader.get(_fs(b"/moved-to-\xfb"), "k") == "x"
        assert _fs(b"/moved-from-\xfa") not in reader.dump()


_GIO_BYTES_SCRIPT = r"""
import base64, json, sys
import gi
gi.require_version("Gio", "2.0")
from gi.repository import Gio
req = json.load(sys.stdin)
f = Gio.File.new_for_path(base64.b64decode(req["path"]))
if req.get("set"):
    f.set_attribute_string("metadata::" + req["set"][0], req["set"][1], Gio.FileQueryInfoFlags.NONE, None)
info = f.query_info("metadata::*", Gio.FileQueryInfoFlags.NOFOLLOW_SYMLINKS, None)
print(json.dumps({a: info.get_attribute_as_string(a) for a in info.list_attributes("metadata") or []}))
"""


@pytest.mark.gvfs
@pytest.mark.timeout(300)
def test_non_utf8_file_names_interoperate_with_real_gvfs(tmp_path):
    """Our store holds a non-UTF-8 path that GIO (reading the store files itself) finds for
    that very file; and what gvfsd-metadata writes for such a file we read back."""
    import base64
    import subprocess

    from gvfsd import SYSTEM_PYTHON

    session = GvfsSession(tmp_path / "gvfs")
    session.scratch.mkdir()
    with session:
        name_ours, name_theirs = b"ours-\xff\xfe.txt", b"theirs-\xe9\xfa.txt"
        for name in (name_ours, name_theirs):
            open(os.fsencode(session.home) + b"/" + name, "wb").close()

        def gio(name: bytes, set_=None) -> dict:
            req = {"path": base64.b64encode(os.fsencode(session.home) + b"/" + name).decode()}
            if set_:
                req["set"] = set_
            p = subprocess.run([SYSTEM_PYTHON, "-c", _GIO_BYTES_SCRIPT], env=session.env(),
                               input=json.dumps(req), capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            return json.loads(p.stdout)

        tree = tmp_path / "ours" / "home"
        with MetaStore.open(str(tree), sync="none") as store:
            store.set("/" + _fs(name_ours), "comment", "set by journalfs")
        session.install_store(tree)
        assert gio(name_ours) == {"metadata::comment": "set by journalfs"}
        gio(name_theirs, ("comment", "set by gvfs"))
        with MetaStore.open(str(session.home_tree), readonly=True) as reader:
            for _ in range(200):  # the daemon writes asynchronously
                got = reader.get("/" + _fs(name_theirs), "comment")
                if got is not None:
                    break
                time.sleep(0.05)
                reader.refresh()
            assert got == "set by gvfs"
            assert reader.get("/" + _fs(name_ours), "comment") == "set by journalfs"


_name_bytes = st.binary(min_size=1, max_size=12).map(lambda b: b.replace(b"\0", b"").replace(b"/", b"")).filter(bool)
_text_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\0", b""))


@settings(max_examples=40, deadline=None)
@given(writes=st.lists(st.tuples(st.lists(_name_bytes, min_size=1, max_size=3), _name_bytes,
                                 st.one_of(_text_bytes, st.lists(_text_bytes, max_size=3))),
                       min_size=1, max_size=12))
def test_any_bytes_without_nul_round_trip(tmp_path_factory, writes):
    """gvfs keeps C strings: every path, key and value of bytes without a NUL comes back as
    the same bytes, from the journal and after rotation into the tree."""
    tree = tmp_path_factory.mktemp("bytes") / "home"
    want: dict[str, dict] = {}
    with MetaStore.open(str(tree), sync="none") as store:
        for parts, key, value in writes:
            path = "/" + "/".join(_fs(p) for p in parts)
            val = [_fs(v) for v in value] if isinstance(value, list) else _fs(value)
            store.set(path, _fs(key), val)
            want.setdefault(path, {})[_fs(key)] = val
        assert {p: store.get_all(p) for p in want} == want  # journal
    with MetaStore.open(str(tree), readonly=True) as reader:  # rotated into the tree at close
        got = {p: reader.get_all(p) for p in want}
    assert got == want
