"""The journal views on a shared `-o allow_other` mount reveal nothing and stay bounded
(issue 24 items 8 and 6), tried as real unprivileged users (alice, bob).

Item 8: a records/ directory is listed for a user only if that user could list the SOURCE
directory and find a journal they could read below it; a journal only if they could read it.
What alice's requests brought into a cache never shows up for bob.
Item 6: the maps keyed by journal names are bounded: 100,000 renames of a journal, each
looked at through its view, leave the daemon's memory where it was."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import users
from journalfs.formats.gvfs_journal import journal_image
from mountutil import mounted
from test_store_ownership import clean_log, run_as

pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")]


@pytest.fixture
def alice():
    return users.ensure_user("jfs-alice")


@pytest.fixture
def bob():
    return users.ensure_user("jfs-bob")


def journal(path, owner, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(journal_image([], 0x1234, min_size=4096))
    os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(path, mode)


def test_records_lists_only_what_the_caller_could_see(alice, bob):
    with users.reachable_dir("jfs-views-iso-") as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir()
        os.chmod(src, 0o755)
        # alice's 0700 home, with a 0600 journal three levels down
        home = src / "alice"
        journal(home / "a" / "b" / "secret.log", alice, 0o600)
        for d in (home, home / "a", home / "a" / "b"):
            os.chown(d, alice.pw_uid, alice.pw_gid)
        os.chmod(home, 0o700)
        # a shared directory everybody lists: one journal for all, one for alice only
        shared = src / "shared"
        journal(shared / "open.log", alice, 0o644)
        journal(shared / "hidden.log", alice, 0o600)
        # a world-listable directory whose only journal sits in a 0700 subdirectory
        journal(src / "proj" / "private" / "x.log", alice, 0o644)
        os.chown(src / "proj" / "private", alice.pw_uid, alice.pw_gid)
        os.chmod(src / "proj" / "private", 0o700)
        recs = mnt / ".journalfs" / "records"
        with mounted(src, mnt, "-o", "allow_other") as m:
            seen_by_alice = run_as(alice, [
                ("top", f"sorted(os.listdir({str(recs)!r}))"),
                ("shared", f"sorted(os.listdir({str(recs / 'shared')!r}))"),
                ("deep", f"sorted(os.listdir({str(recs / 'alice' / 'a' / 'b')!r}))"),
                ("stat", f"os.stat({str(recs / 'shared' / 'hidden.log')!r}).st_mode"),
            ])
            assert seen_by_alice["top"] == ["alice", "proj", "shared"], seen_by_alice
            assert seen_by_alice["shared"] == ["hidden.log", "open.log"], seen_by_alice
            assert seen_by_alice["deep"] == ["secret.log"], seen_by_alice
            # bob, right after alice (her answers are in every cache there is)
            seen_by_bob = run_as(bob, [
                ("top", f"sorted(os.listdir({str(recs)!r}))"),
                ("shared", f"sorted(os.listdir({str(recs / 'shared')!r}))"),
                ("stat_hidden", f"os.stat({str(recs / 'shared' / 'hidden.log')!r})"),
                ("stat_alice", f"os.stat({str(recs / 'alice')!r})"),
                ("stat_proj", f"os.stat({str(recs / 'proj')!r})"),
                ("src_top", f"sorted(os.listdir({str(src)!r}))"),
            ])
            assert seen_by_bob["top"] == ["shared"], seen_by_bob
            assert seen_by_bob["shared"] == ["open.log"], seen_by_bob
            assert seen_by_bob["stat_hidden"] == "ENOENT", seen_by_bob
            assert seen_by_bob["stat_alice"] == "ENOENT", seen_by_bob
            assert seen_by_bob["stat_proj"] == "ENOENT", seen_by_bob
            assert seen_by_bob["src_top"] == ["alice", "proj", "shared"]  # the names: native
            # and alice again, after bob: her view is whole
            again = run_as(alice, [("top", f"sorted(os.listdir({str(recs)!r}))")])
            assert again["top"] == ["alice", "proj", "shared"], again
            # root sees everything
            assert sorted(os.listdir(recs)) == ["alice", "proj", "shared"]
            clean_log(m)


RENAMES = 100_000
RENAME_LOOP = r"""
import os, sys
src, recs, record, start, stop = sys.argv[1:6]
for i in range(int(start), int(stop)):
    os.rename(f"{src}/j{i}.log", f"{src}/j{i + 1}.log")
    os.stat(f"{recs}/j{i + 1}.log/{record}")
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.soak
def test_renaming_a_journal_100000_times_leaves_memory_bounded(bob):
    """bob renames his journal to a new name and stats one record of it, 100,000 times
    (issue 24 items 6/7): the names the views remember are bounded, and so is the
    daemon's memory. (soak: ~5-8 min. Known open point: run under pytest, the daemon has
    twice taken more than mountutil's 30 s to exit after the unmount, though every
    assertion here held; run standalone, 100,000 renames exit in 0.3 s.)"""
    from journalfs.formats.gvfs_journal import encode_entry
    from journalfs.fs.catalog import MAX_ENTRIES
    from journalfs.fs.viewnodes import JOURNAL_IDS_KEPT
    with users.reachable_dir("jfs-views-rss-") as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir()
        os.chown(src, bob.pw_uid, bob.pw_gid)
        entries = [encode_entry("set", 1_700_000_000, f"/p{i}", "k", "v") for i in range(3)]
        path = src / "j0.log"
        path.write_bytes(journal_image(entries, 0x1234, min_size=4096))
        os.chown(path, bob.pw_uid, bob.pw_gid)
        recs = mnt / ".journalfs" / "records"
        with mounted(src, mnt, "-o", "allow_other") as m:
            record = sorted(os.listdir(recs / "j0.log"))[1]

            def renames(start: int, stop: int) -> None:
                proc = subprocess.run(
                    ["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}",
                     "--init-groups", "--reset-env", "/usr/bin/python3", "-c", RENAME_LOOP,
                     str(src), str(recs), record, str(start), str(stop)],
                    capture_output=True, text=True, timeout=1800)
                assert proc.returncode == 0, proc.stderr[-2000:]

            half = RENAMES // 2  # past every bound (JOURNAL_IDS_KEPT, the catalog's)
            renames(0, half)
            after_half = rss_kib(m.pid)
            renames(half, RENAMES)
            after_all = rss_kib(m.pid)
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            views = status["views"]
            assert views["journal_names"] <= JOURNAL_IDS_KEPT, views
            assert views["catalog_entries"] <= MAX_ENTRIES, views
            assert views["view_inodes"] < 10_000, views  # the kernel's forgets reach us
            # before: +89 MB per 20,000 names, never freed (+222 MB for the second half);
            # now the maps are full after the first half: what the second adds is allocator
            # churn (measured +18 MB; in-process, tracemalloc finds no growth at all)
            assert after_all - after_half < 32 * 1024, (after_half, after_all, views)
            clean_log(m)


def test_a_sparse_journal_is_not_millions_of_zero_records(bob, records_corpus):
    """bob extends a copy of a small Wallaby .idx to 1 GiB with `truncate` (a hole) and
    lists its view (issue 24 item 4): the hole is one damage entry; the daemon decodes the
    records before it, not ~90 M all-zero ones."""
    with users.reachable_dir("jfs-views-sparse-") as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir()
        os.chown(src, bob.pw_uid, bob.pw_gid)
        for name in ("wal0.log", "wal0.log.idx"):
            (src / name).write_bytes((records_corpus / name).read_bytes())
            os.chown(src / name, bob.pw_uid, bob.pw_gid)
        recs = mnt / ".journalfs" / "records"
        with mounted(src, mnt, "-o", "allow_other") as m:
            before = len(run_as(bob, [("l", f"os.listdir({str(recs / 'wal0.log.idx')!r})")])["l"])
            got = run_as(bob, [
                ("grow", f"os.truncate({str(src / 'wal0.log.idx')!r}, 1 << 30)"),
                ("list", f"len(os.listdir({str(recs / 'wal0.log.idx')!r}))"),
            ])
            assert got["grow"] == "ok", got
            # the records of the data before the hole (its last block's zeros included)
            assert before <= got["list"] <= before + 4096 // 8, (before, got)
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            assert status["views"]["records_indexed"] < 10_000, status["views"]
            damage = [d for d in status["damaged_journals"] if d["path"].endswith("wal0.log.idx")]
            assert damage and "hole" in damage[0]["reason"], status["damaged_journals"]
            assert damage[0]["offset"] <= (records_corpus / "wal0.log.idx").stat().st_size + 4096


def test_index_files_of_journals_that_are_gone_are_removed(bob):
    """The views keep indexes of big journals in the store's directory, charged to the
    journal's owner (issue 24 item 4): once the journal is gone -- deleted while mounted, or
    while nothing was mounted -- its index file goes too."""
    from journalfs.formats.gvfs_journal import encode_entry
    with users.reachable_dir("jfs-views-idx-") as base:
        src, mnt, store = base / "src", base / "mnt", base / "store"
        src.mkdir()
        os.chown(src, bob.pw_uid, bob.pw_gid)
        entries = [encode_entry("set", 1_700_000_000, f"/p{i}", "k", "v") for i in range(50)]
        for name in ("a.log", "b.log"):
            (src / name).write_bytes(journal_image(entries, 0x1234, min_size=2 << 20))
            os.chown(src / name, bob.pw_uid, bob.pw_gid)
        recs = mnt / ".journalfs" / "records"

        def index_files():
            return sorted(p.name for p in (store / "indexes").glob("*.jfsidx"))

        with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
            listed = run_as(bob, [("a", f"len(os.listdir({str(recs / 'a.log')!r}))"),
                                  ("b", f"len(os.listdir({str(recs / 'b.log')!r}))")])
            assert listed == {"a": 51, "b": 51}, listed
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            assert status["views"]["index_files"]["files"] == 2, json.dumps(status["views"])
            assert len(index_files()) == 2
            run_as(bob, [("rm", f"os.unlink({str(src / 'a.log')!r})")])  # behind the mount
            deadline = 200
            while len(index_files()) != 1 and deadline:  # the watcher's event is async
                deadline -= 1
                __import__("time").sleep(0.05)
            assert len(index_files()) == 1
            clean_log(m)
        os.unlink(src / "b.log")  # while nothing is mounted
        with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
            deadline = 200
            while index_files() and deadline:  # the sweep at start runs in the background
                deadline -= 1
                __import__("time").sleep(0.05)
            assert index_files() == []
            clean_log(m)


def test_a_users_indexing_pauses_over_its_cpu_budget_and_others_go_on(bob, alice,
                                                                        records_corpus):
    """Index work is held to a CPU budget per journal owner (issue 24 item 4): bob's journal
    of millions of records (a Wallaby .idx followed by 64 MiB of written zeros) spends his
    budget and his indexing pauses (no CPU, no interpreter lock) while it is still going,
    as alice has been indexing too (alone he would not pause: the budget is
    work-conserving); meanwhile alice's next small journal is indexed and listed, from her
    own budget, unpaused. A tiny budget (JOURNALFS_INDEX_CPU) makes bob's pauses certain on
    any machine."""
    template = (records_corpus / "wal0.log.idx").read_bytes()
    with users.reachable_dir("jfs-views-cpu-") as base:
        src, mnt = base / "src", base / "mnt"
        for who in (bob, alice):
            (src / who.pw_name).mkdir(parents=True)
            os.chown(src / who.pw_name, who.pw_uid, who.pw_gid)
        huge = src / bob.pw_name / "huge.log.idx"
        with open(huge, "wb") as f:
            f.write(template)
            for _ in range(64):
                f.write(bytes(1 << 20))
        first = src / alice.pw_name / "first.log.idx"
        small = src / alice.pw_name / "small.log.idx"
        for path, who in ((huge, bob), (first, alice), (small, alice)):
            if who is alice:
                path.write_bytes(template)
            os.chown(path, who.pw_uid, who.pw_gid)
        recs = mnt / ".journalfs" / "records"
        env = dict(os.environ, JOURNALFS_INDEX_CPU="0.005,0.02")
        with mounted(src, mnt, "-o", "allow_other", "--store", str(base / "store"),
                     env=env) as m:
            def views() -> dict:
                return json.loads((mnt / ".journalfs" / "status.json").read_bytes())["views"]

            run_as(alice, [("l", "len(os.listdir(%r))"
                            % str(recs / alice.pw_name / "first.log.idx"))])
            lister = subprocess.Popen(
                ["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--init-groups",
                 "--reset-env", "ls", "-U", str(recs / bob.pw_name / "huge.log.idx")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                for _ in range(600):  # his first pause: within his first 20 ms of CPU
                    bob_cpu = views()["index_cpu"]["users"].get(str(bob.pw_uid))
                    if bob_cpu and bob_cpu["paused_now"]:
                        break
                    assert lister.poll() is None, lister.stderr.read()
                    __import__("time").sleep(0.05)
                else:
                    pytest.fail(f"bob's indexing never paused: {views()['index_cpu']}")
                listed = run_as(alice, [("l", "sorted(os.listdir(%r))"
                                         % str(recs / alice.pw_name / "small.log.idx"))])["l"]
                now = views()
                # bob's journal is still being indexed, paused: alice did not wait for it
                assert any(p.get("path", "").endswith("huge.log.idx") for p in now["indexing"]), now
                cpu = now["index_cpu"]["users"]
                assert cpu[str(bob.pw_uid)]["pauses"] >= 1
                assert cpu[str(alice.pw_uid)]["pauses"] == 0, cpu
            finally:
                lister.kill()
                lister.wait()
            # what alice saw is her journal's whole view
            assert listed == sorted(os.listdir(recs / alice.pw_name / "small.log.idx"))
            assert "records.jsonl" in listed and len(listed) > 2, listed
            clean_log(m)
