"""Metadata belongs to the file, not to its name (issue 24 item 2), and the store's quota and
reserve (item 3): real unprivileged users (alice, bob) on a shared `-o allow_other` mount,
changing SOURCE directly behind the mount's back as a user with a shell can.

Mechanisms asserted: a new file at an old path shows nothing of the old file's metadata; a
file renamed in SOURCE (while mounted, or while nothing was mounted) keeps its metadata; a
hard link made in SOURCE shares it, and keeps it after `rm MNT/h1`; a metadata write over the
quota is refused with ENOSPC (one file's 4 KiB) or EDQUOT (a user's total) while other users
keep writing; `rm` of a file whose metadata cannot be removed still succeeds."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import users
from mountutil import mounted
from test_fs_permissions import SYSTEM_PYTHON

pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")]

NOTE = "user.metadata.note"
USER_RUN = r"""
import errno, json, os, sys
steps = json.load(sys.stdin)
out = {}
for name, code in steps:
    try:
        out[name] = eval(code)
        if isinstance(out[name], bytes):
            out[name] = out[name].decode(errors="replace")
        if out[name] is None:
            out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
print(json.dumps(out, default=str))
"""


def run_as(user, steps: list[tuple[str, str]]) -> dict:
    proc = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         "--reset-env", SYSTEM_PYTHON, "-c", USER_RUN], input=json.dumps(steps),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def note_of(user, path: Path):
    return run_as(user, [("g", f"os.getxattr({str(path)!r}, {NOTE!r})")])["g"]


def clean_log(m) -> None:
    """Mount tests fail on an unexpected error in the daemon's log."""
    text = m.stderr()
    assert "Traceback" not in text and " ERROR " not in text and "CRITICAL" not in text, text


@pytest.fixture
def alice():
    return users.ensure_user("jfs-alice")


@pytest.fixture
def bob():
    return users.ensure_user("jfs-bob")


@pytest.fixture
def tree():
    """SOURCE with a world-writable shared directory, and a place for the mount."""
    with users.reachable_dir("jfs-own-") as base:
        src = base / "src"
        src.mkdir()
        shared = src / "shared"
        shared.mkdir()
        os.chmod(src, 0o755)
        os.chmod(shared, 0o777)
        yield base, src, base / "mnt"


def test_new_file_at_an_old_path_inherits_nothing_renamed_file_keeps_it(tree, alice, bob):
    base, src, mnt = tree
    with mounted(src, mnt, "-o", "allow_other") as m:
        sh, msh = src / "shared", mnt / "shared"
        got = run_as(alice, [
            ("mk", f"open({str(msh / 'report')!r}, 'w').write('r')"),
            ("mk2", f"open({str(msh / 'gone')!r}, 'w').write('g')"),
            ("mkd", f"os.makedirs({str(msh / 'dir')!r})"),
            ("mk3", f"open({str(msh / 'dir' / 'f')!r}, 'w').write('f')"),
            ("set", f"os.setxattr({str(msh / 'report')!r}, {NOTE!r}, b'alice report')"),
            ("set2", f"os.setxattr({str(msh / 'gone')!r}, {NOTE!r}, b'alice gone')"),
            ("set3", f"os.setxattr({str(msh / 'dir' / 'f')!r}, {NOTE!r}, b'alice f')"),
            ("get", f"os.getxattr({str(msh / 'report')!r}, {NOTE!r})"),
            # directly in SOURCE, while mounted: rename, delete, move the directory
            ("mv", f"os.rename({str(sh / 'report')!r}, {str(sh / 'report.old')!r})"),
            ("rm", f"os.unlink({str(sh / 'gone')!r})"),
            ("mvd", f"os.rename({str(sh / 'dir')!r}, {str(sh / 'dir.old')!r})"),
        ])
        assert got["get"] == "alice report", got
        # bob makes new files at the old paths, directly in SOURCE
        run_as(bob, [("a", f"open({str(sh / 'report')!r}, 'w').write('bob')"),
                     ("b", f"open({str(sh / 'gone')!r}, 'w').write('bob')"),
                     ("c", f"os.makedirs({str(sh / 'dir')!r})"),
                     ("d", f"open({str(sh / 'dir' / 'f')!r}, 'w').write('bob')")])
        for name in ("report", "gone", "dir/f"):
            assert note_of(bob, msh / name) == "ENODATA", name
            listed = run_as(bob, [("l", f"os.listxattr({str(msh / name)!r})")])["l"]
            assert NOTE not in listed, (name, listed)
        # alice's renamed file and the file in the moved directory keep theirs
        assert note_of(alice, msh / "report.old") == "alice report"
        assert note_of(alice, msh / "dir.old" / "f") == "alice f"
        # bob's own metadata on his new file is his alone
        run_as(bob, [("s", f"os.setxattr({str(msh / 'report')!r}, {NOTE!r}, b'bob')")])
        assert note_of(bob, msh / "report") == "bob"
        assert note_of(alice, msh / "report.old") == "alice report"
        clean_log(m)


def test_changes_made_while_unmounted_are_found_at_the_next_mount(tree, alice, bob):
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    store = base / "store"
    with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
        run_as(alice, [("mk", f"open({str(msh / 'report')!r}, 'w').write('r')"),
                       ("set", f"os.setxattr({str(msh / 'report')!r}, {NOTE!r}, b'alice')")])
        clean_log(m)
    run_as(alice, [("mv", f"os.rename({str(sh / 'report')!r}, {str(sh / 'moved')!r})")])
    run_as(bob, [("mk", f"open({str(sh / 'report')!r}, 'w').write('bob')")])
    with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
        assert note_of(bob, msh / "report") == "ENODATA"  # looked up first: nothing shown
        assert note_of(alice, msh / "moved") == "alice"   # the metadata followed the file
        assert note_of(bob, msh / "report") == "ENODATA"
        clean_log(m)
    # after the next remount too (the ledger beside the store is durable)
    with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
        assert note_of(alice, msh / "moved") == "alice"
        assert note_of(bob, msh / "report") == "ENODATA"
        clean_log(m)


def test_inode_number_reused_at_the_same_path_shows_nothing(tree, alice, bob):
    """ext4 hands a freed inode number out again at once: the birth time tells them apart."""
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    with mounted(src, mnt, "-o", "allow_other") as m:
        reused = 0
        for i in range(5):
            name = f"f{i}"
            run_as(alice, [("mk", f"open({str(msh / name)!r}, 'w').write('a')"),
                           ("set", f"os.setxattr({str(msh / name)!r}, {NOTE!r}, b'alice')")])
            ino = os.stat(sh / name).st_ino
            run_as(alice, [("rm", f"os.unlink({str(sh / name)!r})")])
            run_as(bob, [("mk", f"open({str(sh / name)!r}, 'w').write('b')")])
            reused += os.stat(sh / name).st_ino == ino
            assert note_of(bob, msh / name) == "ENODATA", name
        clean_log(m)


def test_hard_links_made_in_source_share_metadata(tree, alice):
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    with mounted(src, mnt, "-o", "allow_other") as m:
        got = run_as(alice, [
            ("mk", f"open({str(msh / 'h1')!r}, 'w').write('h')"),
            ("set", f"os.setxattr({str(msh / 'h1')!r}, {NOTE!r}, b'linked')"),
            ("ln3", f"os.link({str(sh / 'h1')!r}, {str(sh / 'h3')!r})"),
            ("get3", f"os.getxattr({str(msh / 'h3')!r}, {NOTE!r})"),
            ("ln2", f"os.link({str(sh / 'h1')!r}, {str(sh / 'h2')!r})"),
            ("rm1", f"os.unlink({str(msh / 'h1')!r})"),
            ("get2", f"os.getxattr({str(msh / 'h2')!r}, {NOTE!r})"),
            ("get3b", f"os.getxattr({str(msh / 'h3')!r}, {NOTE!r})"),
        ])
        assert got["get3"] == "linked", got
        assert got["rm1"] == "ok", got
        assert got["get2"] == "linked", got
        assert got["get3b"] == "linked", got
        clean_log(m)
