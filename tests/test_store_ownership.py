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


@pytest.mark.parametrize("watch", ["fanotify", "inotify"])
def test_new_file_at_an_old_path_inherits_nothing_renamed_file_keeps_it(tree, alice, bob, watch):
    """Renames behind the mount's back reach it as fanotify's FAN_RENAME (root) or as
    inotify's paired moves; either way the metadata moves with the file."""
    base, src, mnt = tree
    env = dict(os.environ, JOURNALFS_WATCH=watch)
    with mounted(src, mnt, "-o", "allow_other", "--store", str(base / "store"), env=env) as m:
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
        # the renames reached the mount as renames (not only found later, lazily)
        for _ in range(100):
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            if status["watch"]["renames"] >= 2:
                break
            __import__("time").sleep(0.05)
        assert status["watch"]["renames"] >= 2, status["watch"]
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


# -- item 3: quota and reserve ------------------------------------------------------------------
def test_quota_refuses_bobs_metadata_and_others_keep_writing(tree, alice, bob):
    """One file's metadata is limited to 4 KiB (ENOSPC, as a full ext4 xattr block); a
    user's total to PER_USER_DEFAULT (EDQUOT); alice keeps writing while bob is refused."""
    from journalfs.metastore.ledger import (ENTRY_OVERHEAD, PATH_OVERHEAD, PER_FILE_DEFAULT,
                                            PER_USER_DEFAULT)
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    bobs = sh / "bob"
    bobs.mkdir()
    os.chown(bobs, bob.pw_uid, bob.pw_gid)
    value = 3000
    files = PER_USER_DEFAULT // value + 10  # more than the quota allows
    with mounted(src, mnt, "-o", "allow_other") as m:
        got = run_as(bob, [
            ("mk", f"open({str(msh / 'bob' / 'big')!r}, 'w').write('b')"),
            ("big", f"os.setxattr({str(msh / 'bob' / 'big')!r}, 'user.metadata.big', b'x' * 60000)"),
            ("one", f"os.setxattr({str(msh / 'bob' / 'big')!r}, 'user.metadata.a', b'x' * {value})"),
            ("two", f"os.setxattr({str(msh / 'bob' / 'big')!r}, 'user.metadata.b', b'x' * {value})"),
        ])
        assert got["big"] == "ENOSPC", got      # never E2BIG, never accepted
        assert got["one"] == "ok" and got["two"] == "ENOSPC", got
        # bob writes one value per file until the store refuses him
        script = (f"import os\nfor i in range({files}):\n"
                  f"    p = {str(msh / 'bob')!r} + f'/f{{i}}'\n"
                  "    open(p, 'w').close()\n"
                  "    try:\n"
                  f"        os.setxattr(p, 'user.metadata.k', b'y' * {value})\n"
                  "    except OSError as e:\n"
                  "        print(i, e.errno)\n"
                  "        break\n")
        proc = subprocess.run(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}",
                               "--init-groups", "--reset-env", SYSTEM_PYTHON, "-c", script],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        count, err = (int(x) for x in proc.stdout.split())
        import errno as errnos
        assert err == errnos.EDQUOT, proc.stdout
        per_file = value + len("k") + ENTRY_OVERHEAD + PATH_OVERHEAD
        big = 3000 + len("a") + ENTRY_OVERHEAD + PATH_OVERHEAD  # his first file's value
        assert count * per_file + big <= PER_USER_DEFAULT  # never over his quota
        assert (count + 1) * per_file + big > PER_USER_DEFAULT  # refused at the limit
        # alice's writes go on
        got = run_as(alice, [("mk", f"open({str(msh / 'a')!r}, 'w').write('a')"),
                             ("set", f"os.setxattr({str(msh / 'a')!r}, {NOTE!r}, b'still')"),
                             ("get", f"os.getxattr({str(msh / 'a')!r}, {NOTE!r})")])
        assert got["set"] == "ok" and got["get"] == "still", got
        # bob's removals give his quota back
        got = run_as(bob, [("rm", f"os.unlink({str(msh / 'bob' / 'f0')!r})"),
                           ("again", f"os.setxattr({str(msh / 'bob' / 'f1')!r}, 'user.metadata.k', b'z' * {value})"),
                           ("new", f"os.setxattr({str(msh / 'bob' / f'f{count}')!r}, 'user.metadata.k', b'z' * 10)")])
        assert got["rm"] == "ok" and got["again"] == "ok" and got["new"] == "ok", got
        status = json.loads((mnt / ".journalfs" / "status.json").read_text())
        ledger = status["service"]["ledger"]
        assert ledger["bytes"] <= ledger["total_limit"]
        clean_log(m)


@pytest.mark.daemon_log_errors(
    r"ERROR metadata store .*: background rotation failed \(will retry\): \[Errno 1\] "
    r"Operation not permitted",
    reason="the test makes the store's directory immutable: every rotation fails, is logged "
           "and retried until the directory is writable again")
def test_rm_succeeds_when_the_store_cannot_take_the_removal(tree, alice):
    """The store's directory turns immutable (rotation fails), the journal fills up; then
    `rm` of a file with metadata still succeeds and says so, and a new file at its path
    shows nothing of the old one."""
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    store = base / "store"
    with mounted(src, mnt, "-o", "allow_other", "--store", str(store)) as m:
        files = [msh / f"f{i}" for i in range(20)]
        run_as(alice, [(f"mk{i}", f"open({str(p)!r}, 'w').write('x')") for i, p in enumerate(files)]
               + [("set", f"os.setxattr({str(files[0])!r}, {NOTE!r}, b'old')")])
        subprocess.run(["chattr", "+i", str(store)], check=True)
        try:
            script = (f"import os\nfor i in range(2000):\n"
                      f"    p = {str(msh)!r} + f'/f{{1 + i % 19}}'\n"
                      "    try:\n"
                      f"        os.setxattr(p, 'user.metadata.k', str(i).encode() + b'y' * 3000)\n"
                      "    except OSError as e:\n"
                      "        print(i, e.errno)\n"
                      "        break\n")
            proc = subprocess.run(["setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}",
                                   "--init-groups", "--reset-env", SYSTEM_PYTHON, "-c", script],
                                  capture_output=True, text=True, timeout=600)
            assert proc.stdout.strip(), "the store never refused a write"
            got = run_as(alice, [("rm", f"os.unlink({str(files[0])!r})"),
                                 ("gone", f"os.path.exists({str(files[0])!r})"),
                                 ("mk", f"open({str(files[0])!r}, 'w').write('new')"),
                                 ("get", f"os.getxattr({str(files[0])!r}, {NOTE!r})")])
            assert got["rm"] == "ok" and got["gone"] is False, got
            assert got["get"] == "ENODATA", got
            cmd = subprocess.run(["setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}",
                                  "--init-groups", "--reset-env", "rm", str(files[1])],
                                 capture_output=True, text=True)
            assert cmd.returncode == 0 and cmd.stderr == "", cmd.stderr
        finally:
            subprocess.run(["chattr", "-i", str(store)], check=True)
        assert m.process.poll() is None


def test_parked_metadata_cannot_be_claimed_by_name(tree, alice, bob):
    """Entries of a file no longer at its name wait at /.journalfs-detached/<ino>-<btime>
    in the store; bob making a file of that name in SOURCE gets nothing of them (and cannot
    set metadata there), and alice's file still finds its own."""
    from journalfs.metastore.ledger import file_identity
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    os.chmod(src, 0o777)
    # the embedded store (store path = SOURCE path): the parking place could be a name
    env = dict(os.environ, XDG_DATA_HOME=str(base / "xdg"))
    with mounted(src, mnt, "-o", "allow_other", env=env) as m:
        run_as(alice, [("mk", f"open({str(msh / 'report')!r}, 'w').write('r')"),
                       ("set", f"os.setxattr({str(msh / 'report')!r}, {NOTE!r}, b'alice')")])
        clean_log(m)
    fd = os.open(sh / "report", os.O_PATH)
    (ino, btime), _ = file_identity(fd)
    os.close(fd)
    # while nothing is mounted: alice moves her file away, bob makes one at its old name
    (src / "elsewhere").mkdir()
    os.chmod(src / "elsewhere", 0o777)
    got = run_as(alice, [("mv", f"os.rename({str(sh / 'report')!r}, {str(src / 'elsewhere' / 'kept')!r})")])
    got.update(run_as(bob, [("mk", f"open({str(sh / 'report')!r}, 'w').write('bob')")]))
    assert got == {"mv": "ok", "mk": 3}, got
    with mounted(src, mnt, "-o", "allow_other", env=env) as m:
        assert note_of(bob, msh / "report") == "ENODATA"  # alice's entries are parked now
        park = src / ".journalfs-detached"
        claim = mnt / ".journalfs-detached" / f"{ino}-{btime}"
        got = run_as(bob, [("d", f"os.makedirs({str(park)!r})"),
                           ("f", f"open({str(park / f'{ino}-{btime}')!r}, 'w').write('x')"),
                           ("get", f"os.getxattr({str(claim)!r}, {NOTE!r})"),
                           ("set", f"os.setxattr({str(claim)!r}, {NOTE!r}, b'bob')")])
        assert got["get"] == "ENODATA" and got["set"] == "EPERM", got
        assert note_of(alice, mnt / "elsewhere" / "kept") == "alice"
        clean_log(m)


def _expiry_done(mnt: Path) -> dict:
    """The ledger's status once the mount's pass for files that are gone has ended."""
    for _ in range(200):
        ledger = json.loads((mnt / ".journalfs" / "status.json").read_text())["service"]["ledger"]
        if ledger["expiry"]["state"] not in ("not started", "running"):
            return ledger
        __import__("time").sleep(0.05)
    raise AssertionError(f"the expiry pass did not end: {ledger}")


def test_metadata_of_files_deleted_while_unmounted_expires_at_a_later_mount(tree):
    """Entries of files deleted while nothing was mounted (at their path, or parked for a
    file that never came back) no longer count against their owner's quota: the next mount
    drops them. Files alive elsewhere (renamed) keep theirs."""
    base, src, mnt = tree
    sh, msh = src / "shared", mnt / "shared"
    store = base / "store"
    names = ("deleted", "replaced", "renamed", "kept", "parked")
    with mounted(src, mnt, "--store", str(store)) as m:
        for name in names:
            (msh / name).write_text(name)
            os.setxattr(msh / name, NOTE, name.encode() * 20)
        first = _expiry_done(mnt)
        assert first["paths"] == 5 and first["expiry"]["expired"] == 0, first
        clean_log(m)
    os.unlink(sh / "deleted")
    os.unlink(sh / "replaced")
    (sh / "replaced").write_text("new")  # a new file (often the same inode number) at the path
    os.rename(sh / "renamed", sh / "renamed.new")
    os.rename(sh / "parked", sh / "parked.new")
    (sh / "parked").write_text("new")
    with mounted(src, mnt, "--store", str(store)) as m:
        second = _expiry_done(mnt)
        assert second["expiry"]["state"] == "done" and second["expiry"]["checked"] == 5, second
        assert second["expiry"]["expired"] == 2, second  # deleted, replaced
        assert second["expiry"]["bytes"] > 0
        assert with_note(msh / "replaced") is None
        assert with_note(msh / "renamed.new") == b"renamed" * 20  # alive: followed its file
        assert with_note(msh / "kept") == b"kept" * 20
        assert with_note(msh / "parked") is None  # a new file: the old one's entries park
        clean_log(m)
    os.unlink(sh / "parked.new")  # the parked entries' file is gone now
    with mounted(src, mnt, "--store", str(store)) as m:
        third = _expiry_done(mnt)
        assert third["expiry"]["expired"] == 1, third
        assert third["paths"] == 2 and third["bytes"] < second["bytes"], third  # renamed, kept
        assert with_note(msh / "kept") == b"kept" * 20
        clean_log(m)


def with_note(path: Path):
    try:
        return os.getxattr(path, NOTE)
    except OSError as exc:
        assert exc.errno == __import__("errno").ENODATA, exc
        return None


def test_the_quota_is_a_mount_option_a_runtime_setting_and_a_remount_option(tree):
    base, src, mnt = tree
    (src / "shared" / "f").write_text("x")
    control = mnt / ".journalfs"
    target = mnt / "shared" / "f"

    def cli(*args):
        return subprocess.run([__import__("sys").executable, "-m", "journalfs.cli", *args],
                              capture_output=True, text=True, timeout=120)

    bad = cli("mount", "-o", "quota_file=lots", str(src), str(mnt))
    assert bad.returncode == 2 and "quota_file: a quota is a number of bytes" in bad.stderr
    with mounted(src, mnt, "--store", str(base / "store"), "-o", "quota_file=1K") as m:
        status = json.loads((control / "status.json").read_text())
        assert status["options"]["quota"] == {"quota_file": 1024, "quota_user": 16 << 20,
                                              "quota_total": 64 << 20}
        assert status["service"]["ledger"]["per_file"] == 1024
        assert os.getxattr(control, "user.journalfs.quota_file") == b"1024"
        with pytest.raises(OSError) as refused:
            os.setxattr(target, NOTE, b"x" * 1000)  # 256 + 1000 + key + 32 > 1 KiB
        assert refused.value.errno == __import__("errno").ENOSPC
        os.setxattr(control, "user.journalfs.quota_file", b"8K")  # at run time
        os.setxattr(target, NOTE, b"x" * 1000)
        with pytest.raises(OSError) as invalid:
            os.setxattr(control, "user.journalfs.quota_user", b"lots")
        assert invalid.value.errno == __import__("errno").EINVAL
        status = json.loads((control / "status.json").read_text())
        assert status["last_error"]["setting"] == "quota_user", status["last_error"]
        assert status["options"]["quota"]["quota_file"] == 8192
        done = cli("mount", "-o", "remount,quota_user=1K", str(mnt))  # as mount(8) would
        assert done.returncode == 0, done.stderr
        assert os.getxattr(control, "user.journalfs.quota_user") == b"1024"
        with pytest.raises(OSError) as over:
            os.setxattr(target, "user.metadata.more", b"y")  # the uid holds ~1.3 KiB already
        assert over.value.errno == __import__("errno").EDQUOT
        assert os.getxattr(target, NOTE) == b"x" * 1000  # what is held stays
        os.removexattr(target, NOTE)  # shrinking always works
        clean_log(m)
