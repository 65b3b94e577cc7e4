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
