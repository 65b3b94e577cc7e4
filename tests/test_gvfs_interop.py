"""journalfs and the real GNOME gvfs metadata daemon read and write the same stores.

Every test here runs the real gvfsd-metadata on a private bus (tests/gvfsd.py) and reads
through GIO (python3-gi), i.e. exactly what GNOME applications see.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gvfsd import (GvfsModel, GvfsSession, apply_to_store, gvfs_module_session, gvfs_session,  # noqa: F401
                   random_op, universe)

pytestmark = [pytest.mark.gvfs, pytest.mark.timeout(300)]

store_mod = pytest.importorskip("journalfs.metastore.store")
MetaStore = store_mod.MetaStore
JOURNAL_HEADER = 20


def journal_of(tree: Path) -> Path:
    (journal,) = tree.parent.glob(tree.name + "-*.log")
    return journal


def journal_used(tree: Path) -> int:
    """Bytes of entries in a store's journal (walking the entry sizes)."""
    data = journal_of(tree).read_bytes()
    count = int.from_bytes(data[16:20], "big")
    offset = JOURNAL_HEADER
    for _ in range(count):
        offset += int.from_bytes(data[offset:offset + 4], "big")
    return offset - JOURNAL_HEADER


def assert_gio_sees(session: GvfsSession, expected: dict, paths) -> None:
    """GIO must report `expected` for `paths` from the session's installed home store."""
    paths = sorted(set(paths))
    session.create_files(paths)
    got = session.gio_store_metadata(paths)
    want = {p: expected[p] for p in paths if expected.get(p)}
    assert got == want


# ---- journalfs writes, gvfs reads ----------------------------------------------------
@pytest.mark.parametrize("seed, n_ops, rotate_every, journal_size", [
    (1, 400, 60, 32768),      # several forced rotations, default journal
    (2, 600, 0, 256 * 1024),  # no rotation: one journal holding > 32 KiB of entries
    (3, 300, 7, 32768),       # rotations between almost every write burst
])
def test_journalfs_store_reads_back_through_gio(gvfs_module_session, tmp_path, seed, n_ops, rotate_every,
                                                journal_size):
    rng = random.Random(seed)
    paths = universe()
    model, touched = GvfsModel(), set(paths)
    tree = tmp_path / "home"
    store = MetaStore.open(str(tree), sync="none", journal_size=journal_size)
    try:
        rotations = 0
        for i in range(n_ops):
            op = random_op(rng, paths)
            if store.needs_rotation() or (rotate_every and i % rotate_every == rotate_every - 1):
                store.rotate()
                rotations += 1
            apply_to_store(store, op)
            model.apply(op)
            touched.update(p for p in op[1:] if isinstance(p, str) and p.startswith("/"))
        store.flush()
        dumped = store.dump()
        used = journal_used(tree)
        # tree + live journal, before close() rotates it away
        gvfs_module_session.install_store(tree, restart_daemon=False)
    finally:
        store.close()
    assert dumped == model.dump()
    if rotate_every:
        assert rotations >= 3
    else:
        assert used > 32768
    assert_gio_sees(gvfs_module_session, dumped, touched | set(dumped))


PATHS = universe()
_texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
_keys = st.text("abcdefghijklmnopqrstuvwxyz0123456789.-_", min_size=1, max_size=12)
_ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), _keys, _texts),
    st.tuples(st.just("setv"), st.sampled_from(PATHS), _keys, st.lists(_texts, min_size=1, max_size=4)),
    st.tuples(st.just("unset"), st.sampled_from(PATHS), _keys),
    st.tuples(st.just("remove"), st.sampled_from(PATHS)),
    st.tuples(st.just("move"), st.sampled_from(PATHS), st.sampled_from(PATHS)).filter(
        lambda op: not (op[1] == op[2] or op[2].startswith(op[1] + "/") or op[1].startswith(op[2] + "/"))),
    st.tuples(st.just("rotate"), st.just("")),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_ops, min_size=1, max_size=40))
def test_any_op_sequence_reads_back_through_gio(gvfs_module_session, ops):
    model = GvfsModel()
    with tempfile.TemporaryDirectory() as work:
        tree = Path(work) / "home"
        store = MetaStore.open(str(tree), sync="none", journal_size=32768)
        try:
            for op in ops:
                apply_to_store(store, op)
                model.apply(op)
            dumped = store.dump()
            gvfs_module_session.install_store(tree, restart_daemon=False)
        finally:
            store.close()
    assert dumped == model.dump()
    assert_gio_sees(gvfs_module_session, dumped, PATHS + list(dumped))


def test_store_with_100k_paths_reads_back_through_gio(gvfs_module_session, tmp_path):
    rng = random.Random(100)
    tree = tmp_path / "home"
    model = GvfsModel()
    paths = [f"/big/d{i // 500:03d}/f{i:06d}" for i in range(100_000)]
    store = MetaStore.open(str(tree), sync="none", journal_size=32 * 1024 * 1024)
    try:
        for i, p in enumerate(paths):  # one journal, then one rotation: the fast way in
            op = ("setv", p, "tags", [str(i), "x"]) if i % 7 == 0 else ("set", p, "comment", f"file {i}")
            apply_to_store(store, op)
            model.apply(op)
        store.rotate()
        # a journal on top of the big tree: overrides, unsets, moves
        store.move("/big/d007", "/big/moved-dir")
        model.apply(("move", "/big/d007", "/big/moved-dir"))
        for i in range(300):
            p = rng.choice(paths)
            op = rng.choice([("set", p, "comment", "changed ✓"), ("unset", p, "comment"),
                             ("move", p, f"{p}.moved{i}"), ("set", p, "rating", str(rng.randint(1, 5)))])
            apply_to_store(store, op)
            model.apply(op)
        store.flush()
        dumped = store.dump()
        gvfs_module_session.install_store(tree, restart_daemon=False)
    finally:
        store.close()
    assert len(dumped) > 99_000
    assert dumped == model.dump()
    sample = rng.sample(sorted(dumped), 300) + rng.sample(paths, 100) + ["/big/moved-dir/f003500"]
    assert_gio_sees(gvfs_module_session, dumped, sample)


# ---- gvfs writes, journalfs reads ----------------------------------------------------
def gvfs_random_writes(session: GvfsSession, rng: random.Random, n: int) -> set[str]:
    """Random sets/list sets/unsets, file and directory moves and deletes through GIO
    (one GIO process) on real files under HOME; returns every store path touched."""
    dirs = ["/w", "/w/d1", "/w/d1/sub", "/w/d2"]
    files = [f"{d}/f{i}" for d in dirs for i in range(4)]
    session.create_files(files)
    touched = set(files) | set(dirs)
    exists = set(files) | set(dirs)  # what is on disk once the GIO ops have run
    ops = []

    def touch_missing():  # moved/removed names come back as new, empty files
        for p in files:
            if p not in exists:
                ops.append(("touch", session.file_of(p)))
                exists.add(p)
        exists.update(dirs)

    for i in range(n):
        op = random_op(rng, files)
        if op[0] in ("set", "setv", "unset"):
            ops.append(("set", session.file_of(op[1]), op[2], None if op[0] == "unset" else op[3]))
            continue
        if op[0] == "move" and rng.random() < 0.3:  # a whole directory
            src, dst = "/w/d1/sub", f"/w/d2/sub{i}"
            moved = {p for p in exists if p == src or p.startswith(src + "/")}
            ops.append(("move", session.file_of(src), session.file_of(dst)))
            exists -= moved
            exists |= {dst + p[len(src):] for p in moved}
        elif op[0] == "move":
            src, dst = op[1], f"{op[1]}.mv{i}"
            ops.append(("move", session.file_of(src), session.file_of(dst)))
            exists.discard(src)
            exists.add(dst)
        else:
            ops.append(("remove", session.file_of(op[1])))
            exists.discard(op[1])
        touch_missing()
        touched |= exists
    session.gio_apply(ops)
    return touched


def journalfs_dump(tree: Path) -> dict:
    store = MetaStore.open(str(tree), readonly=True)
    try:
        store.refresh()
        return store.dump()
    finally:
        store.close()


def cli_dump(tree: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "journalfs.cli", "meta", "dump", str(tree), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_gvfsd_writes_journalfs_reads(gvfs_session):
    touched = gvfs_random_writes(gvfs_session, random.Random(7), 150)
    tree = gvfs_session.home_tree
    seen = gvfs_session.gio_store_metadata(p for p in touched if gvfs_session.file_of(p).exists())
    dumped = journalfs_dump(tree)
    assert seen and {p: dumped[p] for p in seen} == seen
    assert all(p not in dumped for p in touched if p not in seen and gvfs_session.file_of(p).exists())
    assert cli_dump(tree) == dumped


def test_journalfs_reads_gvfsd_store_after_its_rotation(gvfs_session):
    session = gvfs_session
    touched = gvfs_random_writes(session, random.Random(8), 40)
    first_journal = journal_of(session.home_tree).name
    # fill gvfsd's 32 KiB journal: it must rotate (new tag, new journal) to take more
    files = [f"/fill/f{i}" for i in range(60)]
    session.create_files(files)
    session.gio_set_many([(session.file_of(p), "comment", f"{p} " + "v" * 700) for p in files])
    touched |= set(files)
    assert journal_of(session.home_tree).name != first_journal
    existing = [p for p in touched if session.file_of(p).exists()]
    seen = session.gio_store_metadata(existing)
    dumped = journalfs_dump(session.home_tree)
    assert {p: dumped[p] for p in seen} == seen
    assert all(p not in dumped for p in existing if p not in seen)
    # and once more after the daemon exits, which rotates everything it has open
    session.stop_daemon()
    assert journalfs_dump(session.home_tree) == dumped


# ---- --gvfs mode: journalfs writes through the running daemon ------------------------
def test_gvfsd_backend_writes_through_daemon(gvfs_session):
    from journalfs.metastore.gvfsd import GvfsdBackend
    session = gvfs_session
    files = ["/m/a.txt", "/m/dir/b.txt", "/m/dir/c d.txt", "/m/other"]
    session.create_files(files)
    backend = GvfsdBackend(session.home_tree, bus=session.address)

    async def scenario():
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.run)
            await backend.set("/m/a.txt", "comment", "über ✓")
            await backend.set("/m/a.txt", "tags", ["x", "", "y z"])
            await backend.set("/m/dir/b.txt", "rating", "5")
            await backend.set("/m/dir/c d.txt", "gone", "soon")
            await backend.unset("/m/dir/c d.txt", "gone")
            await backend.set("/m/other", "k", "v")
            await backend.remove("/m/other")
            assert await backend.get("/m/a.txt", "comment") == "über ✓"
            assert await backend.get_all("/m/a.txt") == {"comment": "über ✓", "tags": ["x", "", "y z"]}
            status = await trio.to_thread.run_sync(backend.status)
            assert status["connected"] and status["writes"] == 7 and status["entries"] >= 7
            assert status["journal_path"] == str(journal_of(session.home_tree))
            async with trio.open_nursery() as writers:  # concurrent writers, as FUSE handlers are
                for i in range(12):
                    writers.start_soon(backend.set, "/m/dir/b.txt", f"k{i % 4}", f"v{i}")
            assert sorted(await backend.get_all("/m/dir/b.txt")) == ["k0", "k1", "k2", "k3", "rating"]
            for i in range(4):
                await backend.unset("/m/dir/b.txt", f"k{i}")
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert session.gio_store_metadata(files) == {
        "/m/a.txt": {"comment": "über ✓", "tags": ["x", "", "y z"]},
        "/m/dir/b.txt": {"rating": "5"},
    }

    # the other way: GIO writes, the backend reads (its reader refreshes)
    session.gio_set(session.file_of("/m/dir/b.txt"), "rating", "1")
    session.gio_set(session.file_of("/m/a.txt"), "tags", None)

    async def read_back():
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.run)
            assert await backend.get("/m/dir/b.txt", "rating") == "1"
            assert await backend.get_all("/m/a.txt") == {"comment": "über ✓"}
            await backend.move("/m/dir", "/m/dir2")  # as a rename in the mount does
            assert await backend.get_all("/m/dir2/b.txt") == {"rating": "1"}
            assert await backend.get_all("/m/dir/b.txt") == {}
            nursery.cancel_scope.cancel()

    trio.run(read_back)
    session.create_files(["/m/dir2/b.txt"])
    assert session.gio_store_metadata(["/m/dir2/b.txt", "/m/dir/b.txt"]) == {"/m/dir2/b.txt": {"rating": "1"}}


def test_gvfsd_backend_copy_from_blocking_code(gvfs_session, monkeypatch):
    """One backend for the mount and for blocking callers (under trio.run); the bus comes
    from DBUS_SESSION_BUS_ADDRESS, as for the user's own session."""
    from journalfs.metastore.gvfsd import GvfsdBackend
    session = gvfs_session
    session.create_files(["/c/src/a", "/c/src/b", "/c/dst/z"])
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", session.address)
    backend = GvfsdBackend(session.home_tree)

    async def scenario():
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.run)
            await backend.set("/c/src/a", "comment", "A")
            await backend.set("/c/src/b", "tags", ["1", "2"])
            await backend.set("/c/dst/z", "comment", "old")
            await backend.copy("/c/src", "/c/dst")
            await backend.sync()
            got = {p: await backend.get_all(p) for p in ("/c/src/a", "/c/src/b", "/c/dst/a", "/c/dst/b", "/c/dst/z")}
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(scenario) == {
        "/c/src/a": {"comment": "A"}, "/c/src/b": {"tags": ["1", "2"]},
        "/c/dst/a": {"comment": "A"}, "/c/dst/b": {"tags": ["1", "2"]}, "/c/dst/z": {},
    }
    session.create_files(["/c/dst/a", "/c/dst/b"])
    assert session.gio_store_metadata(["/c/dst/a", "/c/dst/b", "/c/dst/z"]) == {
        "/c/dst/a": {"comment": "A"}, "/c/dst/b": {"tags": ["1", "2"]}}


def test_gvfsd_unreachable_is_a_clear_error(gvfs_session, tmp_path):
    from journalfs.metastore.gvfsd import GvfsdBackend, GvfsdUnavailable
    gvfs_session.stop_daemon()  # the private bus has no service files: nothing can start it

    async def start(bus):
        async with trio.open_nursery() as nursery:
            await nursery.start(GvfsdBackend(gvfs_session.home_tree, bus=bus).run)

    for bus in (gvfs_session.address, f"unix:path={tmp_path}/no-bus"):
        with pytest.RaisesGroup(pytest.RaisesExc(GvfsdUnavailable, match="no gvfsd-metadata"),
                                allow_unwrapped=True, flatten_subgroups=True):
            trio.run(start, bus)


# ---- fsck: two writers on one journal ------------------------------------------------
def _copy_store(tree: Path, into: Path) -> Path:
    into.mkdir()
    for f in tree.parent.glob(tree.name + "*"):
        if f.name == tree.name or f.name.endswith(".log"):
            shutil.copyfile(f, into / f.name)
    return into / tree.name


def test_fsck_finds_a_second_writers_entries_and_repair_keeps_them(gvfs_session, tmp_path):
    """What issue 14 saw: journalfs and gvfsd-metadata appending to one journal, each at
    its own idea of its end. fsck finds the valid entries gvfs no longer reads; --repair
    keeps every one of them."""
    from journalfs.metastore.fsck import check_store
    session = gvfs_session
    session.create_files(["/w/a", "/w/b"])
    session.gio_set(session.file_of("/w/a"), "first", "gvfsd")  # gvfsd-metadata maps the store
    second = MetaStore.open(str(session.home_tree), sync="always")  # the second writer
    try:
        for i in range(3):
            second.set("/w/b", f"long{i}", "x" * 150)
    finally:
        second._release()  # as a killed writer: its entries stay where it put them
    session.gio_set(session.file_of("/w/a"), "then", "gvfsd again")  # writes over long0
    copy = _copy_store(session.home_tree, tmp_path / "copy")
    problems = check_store(str(copy))
    strays = [f for f in problems if "outside" in f.reason]
    assert len(strays) == 2 and all(f.severity == "error" for f in strays), problems
    assert "set /w/b long1" in strays[0].reason
    check = check_store(str(copy), repair=True)
    assert any("kept 2 more valid entries" in a for a in check.actions), check.actions
    assert check_store(str(copy)) == []
    assert journalfs_dump(copy) == {"/w/a": {"first": "gvfsd", "then": "gvfsd again"},
                                    "/w/b": {"long1": "x" * 150, "long2": "x" * 150}}
    # and gvfs reads the repaired store the same way
    session.install_store(copy)
    assert session.gio_store_metadata(["/w/a", "/w/b"]) == journalfs_dump(copy)


def test_fsck_reports_overlapping_entries_and_keeps_the_valid_one(tmp_path):
    from journalfs.formats.gvfs_journal import encode_entry
    from journalfs.metastore.fsck import check_store
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none", journal_size=32768) as store:
        store.set("/kept", "k", "tree")
    with MetaStore.open(str(tree), readonly=True) as reader:
        journal = Path(reader.journal_path)
    data = bytearray(journal.read_bytes())
    first = encode_entry("set", 1, "/a", "k", "a" * 80)
    inner = encode_entry("set", 2, "/b", "k", "b" * 40)
    after = encode_entry("set", 3, "/c", "k", "c")
    data[20:20 + len(first)] = first
    data[60:60 + len(inner)] = inner  # a second writer's entry over the middle of the first
    data[60 + len(inner):60 + len(inner) + len(after)] = after
    data[16:20] = (1).to_bytes(4, "big")
    journal.write_bytes(bytes(data))
    problems = check_store(str(tree))
    assert any(f.offset == 60 and "overlaps the entry at byte 20" in f.reason for f in problems), problems
    assert any("trailing entry size" in f.reason and f.offset == 124 for f in problems)  # gvfs: "wrong sized"
    check_store(str(tree), repair=True)
    assert check_store(str(tree)) == []
    assert journalfs_dump(tree) == {"/kept": {"k": "tree"}, "/b": {"k": "b" * 40}, "/c": {"k": "c"}}


# ---- who writes a store: the decision, without a mount -------------------------------
def test_store_guard_decision(gvfs_session, tmp_path, monkeypatch):
    from journalfs.metastore import gvfs_service as gs
    session = gvfs_session
    private = tmp_path / "private-store"
    assert gs.decide(str(private)).mode == "private"  # not a gvfs directory, nothing maps it
    # the session's own directory, its bus in the environment: the running daemon is joined
    for key, value in session.env().items():
        monkeypatch.setenv(key, value)
    session.gio_set(session.home, "k", "v")
    guard = gs.decide(str(session.metadata_dir))
    assert (guard.mode, guard.bus) == ("join", session.address)
    assert gs.gvfsd_metadata_processes(str(session.metadata_dir)) == [session.daemon_pid]
    session.stop_daemon()
    assert gs.decide(str(session.metadata_dir)).mode == "serve"
    # no bus: a gvfs-named directory is taken with a warning, or refused when exclusive
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS")
    if not os.path.exists(f"/run/user/{os.geteuid()}/bus"):
        guard = gs.decide(str(session.metadata_dir))
        assert guard.mode == "unguarded" and "desktop session" in guard.warning
        assert guard.status()["store_warning"] == guard.warning
        with pytest.raises(gs.StoreRefused, match="--exclusive-store"):
            gs.decide(str(session.metadata_dir), exclusive=True)
    # a bus that belongs to someone else is not the store owner's bus
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", session.address)
    assert gs.session_bus_candidates(os.geteuid() + 4242) == []
    assert gs.session_bus_candidates(os.geteuid())[0] == session.address


def test_a_gvfsd_of_another_session_on_the_same_directory_is_refused(gvfs_session, monkeypatch):
    """Two sessions of one user (same HOME): the one on our bus has no gvfsd-metadata, the
    other's writes the directory. Claiming the name on our bus would make two writers."""
    from journalfs.metastore import gvfs_service as gs
    monkeypatch.setattr(gs, "STARTING_WAIT", 0.01)
    other = GvfsSession(gvfs_session.scratch, start_metadata_daemon=False)  # same HOME
    with other:
        for key, value in other.env().items():
            monkeypatch.setenv(key, value)
        assert not other.daemon_on_bus() and gvfs_session.daemon_pid
        with pytest.raises(gs.StoreRefused, match=f"pid {gvfs_session.daemon_pid}.*another session"):
            gs.decide(str(other.metadata_dir))


def test_fsck_calls_an_uncounted_tail_a_warning_and_a_gap_an_error(tmp_path):
    """Entries right after the counted ones are what a writer killed between writing an entry
    and counting it leaves (never acknowledged): a warning. A valid entry past a gap is a
    second writer's: an error, and --repair keeps it."""
    from journalfs.formats.gvfs_journal import encode_entry
    from journalfs.metastore.fsck import check_store
    tree = tmp_path / "home"
    with MetaStore.open(str(tree), sync="none", journal_size=32768):
        pass
    with MetaStore.open(str(tree), readonly=True) as reader:
        journal = Path(reader.journal_path)
    counted, tail = encode_entry("set", 1, "/a", "k", "1"), encode_entry("set", 2, "/b", "k", "2")
    data = bytearray(journal.read_bytes())
    data[20:20 + len(counted) + len(tail)] = counted + tail
    data[16:20] = (1).to_bytes(4, "big")
    journal.write_bytes(bytes(data))
    (finding,) = check_store(str(tree))
    assert finding.severity == "warning" and "never counted" in finding.reason
    gap = 20 + len(counted) + len(tail) + 64
    data[gap:gap + len(tail)] = encode_entry("set", 3, "/c", "k", "3")
    journal.write_bytes(bytes(data))
    assert [f.severity for f in check_store(str(tree))] == ["error", "error"]
    check_store(str(tree), repair=True)
    assert journalfs_dump(tree) == {"/a": {"k": "1"}, "/b": {"k": "2"}, "/c": {"k": "3"}}
