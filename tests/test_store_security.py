"""The metadata store cannot be turned against root (issue 10 point 1).

A real unprivileged user plants symlinks where root's store files go (the lock file pointing
at a root-owned file, the tree pointing at another); the store refuses a directory that other
users can write (as ssh does with ~/.ssh), never follows a planted link, and the targets stay
byte for byte as they were. New stores are 0700/0600 whatever the umask."""
from __future__ import annotations

import errno
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from journalfs.metastore.files import UnsafeStoreDir
from journalfs.metastore.store import MetaStore, lock_holder

import users

TEST_USER = "jfs-store"
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def ensure_user() -> pwd.struct_passwd:
    return users.ensure_user(TEST_USER)


def as_user(user: pwd.struct_passwd, *argv: str) -> None:
    """Run a real command as the unprivileged user (no capabilities, its own uid/gid)."""
    proc = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                           "--init-groups", "--reset-env", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"


class Victim:
    """A root-owned file the attack aims at; remembers its bytes, mode and times."""

    def __init__(self, path: Path, text: bytes):
        path.write_bytes(text)
        path.chmod(0o644)
        self.path = path
        self.before = self.state()

    def state(self):
        st = os.lstat(self.path)
        return hashlib.sha256(self.path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns, \
            stat.S_IMODE(st.st_mode), st.st_uid

    def untouched(self) -> bool:
        return self.state() == self.before


@pytest.fixture
def attacker():
    return ensure_user()


@pytest.fixture
def tmp_path():
    """A directory the unprivileged user can reach (pytest's own are root-only 0700)."""
    with users.reachable_dir("jfs-store-sec-") as base:
        yield base


@pytest.fixture
def victims(tmp_path):
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    return (Victim(root_only / "passwd-like", b"root:x:0:0:root:/root:/bin/bash\n" * 20),
            Victim(root_only / "tree-target", b"precious root data\n" * 100))


def test_new_store_is_0700_and_0600_even_with_umask_0(tmp_path):
    tree = tmp_path / "a" / "b" / "store" / "home"
    code = ("import os, sys; os.umask(0); from journalfs.metastore.store import MetaStore; "
            "s = MetaStore.open(sys.argv[1]); s.set('/x', 'k', 'v'); s.close()")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code, str(tree)], check=True, env=env, timeout=60)
    for d in (tree.parent, tree.parent.parent, tree.parent.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    names = sorted(p.name for p in tree.parent.iterdir())
    assert len(names) == 3 and "home" in names and "home.journalfs-lock" in names  # + journal
    for p in tree.parent.iterdir():
        st = p.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, p
        assert st.st_uid == os.geteuid()


def test_planted_symlinks_in_a_world_writable_store_dir_are_refused(tmp_path, attacker, victims):
    """The old layout (umask 0: a 0777 store dir): the user plants links, root refuses the
    directory with one clear line and writes nothing."""
    lock_target, tree_target = victims
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    as_user(attacker, "ln", "-s", str(lock_target.path), str(store / "home.journalfs-lock"))
    as_user(attacker, "ln", "-s", str(tree_target.path), str(store / "home"))
    with pytest.raises(UnsafeStoreDir) as caught:
        MetaStore.open(str(store / "home"))
    message = str(caught.value)
    assert caught.value.errno == errno.EPERM and "\n" not in message
    assert "writable by other users" in message and "chmod go-w" in message
    assert lock_target.untouched() and tree_target.untouched()


def test_links_left_in_a_tightened_store_dir_are_never_followed(tmp_path, attacker, victims):
    """Links planted while the dir was open, then the admin fixed its mode: every store file
    is opened with O_NOFOLLOW, so root still never writes the targets."""
    lock_target, tree_target = victims
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    as_user(attacker, "ln", "-s", str(lock_target.path), str(store / "home.journalfs-lock"))
    store.chmod(0o700)
    with pytest.raises(OSError) as caught:
        MetaStore.open(str(store / "home"))
    assert caught.value.errno == errno.ELOOP and "symlink" in str(caught.value)
    assert lock_target.untouched()
    assert lock_holder(str(store / "home")) is None  # the reader does not follow it either

    os.unlink(store / "home.journalfs-lock")
    store.chmod(0o777)
    as_user(attacker, "ln", "-s", str(tree_target.path), str(store / "home"))
    store.chmod(0o700)
    with pytest.raises(OSError) as caught:
        MetaStore.open(str(store / "home"))
    assert caught.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        MetaStore.open(str(store / "home"), readonly=True)
    assert tree_target.untouched() and lock_target.untouched()


def test_journal_swapped_for_a_symlink_is_refused(tmp_path, victims):
    lock_target, _ = victims
    tree = tmp_path / "store" / "home"
    with MetaStore.open(str(tree)) as store:
        store.set("/a", "k", "v")
    with MetaStore.open(str(tree), readonly=True) as reader:
        journal = Path(reader.journal_path)  # the journal of the tree now in place
    journal.unlink()
    journal.symlink_to(lock_target.path)
    with pytest.raises(OSError) as caught:
        MetaStore.open(str(tree))
    assert caught.value.errno == errno.ELOOP
    assert lock_target.untouched()


def test_rotation_marks_the_tree_it_mapped_not_what_the_name_points_to(tmp_path, victims):
    """Rotation's in-place "rotated" mark (0xFFFFFFFF at offset 8) goes through the fd the
    store mapped the old tree from: a tree name swapped for a symlink meanwhile is replaced by
    the rename, its target never written."""
    _, tree_target = victims
    tree = tmp_path / "store" / "home"
    with MetaStore.open(str(tree), sync="none") as store:
        store.set("/a", "k", "v")
        old = tmp_path / "store" / "old-tree"
        os.rename(tree, old)  # keep the mapped file around under another name
        tree.symlink_to(tree_target.path)
        store.rotate()
        assert not tree.is_symlink()
        assert old.read_bytes()[8:12] == b"\xff\xff\xff\xff"  # the mapped old tree is marked
        assert store.get("/a", "k") == "v"
    assert tree_target.untouched()
    with MetaStore.open(str(tree), readonly=True) as reader:
        assert reader.dump() == {"/a": {"k": "v"}}


def test_store_dir_owned_by_another_user_is_refused(tmp_path, attacker):
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    os.chown(store, attacker.pw_uid, attacker.pw_gid)
    with pytest.raises(UnsafeStoreDir, match=f"owned by uid {attacker.pw_uid}"):
        MetaStore.open(str(store / "home"))
    assert list(store.iterdir()) == []


@pytest.fixture
def searchable_dir():
    """A directory every user can reach (pytest's own tmp_path sits in a 0700 directory)."""
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="jfs-open-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_parent_writable_by_others_is_refused_unless_sticky(searchable_dir, attacker):
    public = searchable_dir / "public"
    public.mkdir()
    public.chmod(0o777)
    with pytest.raises(UnsafeStoreDir, match="public is writable by other users"):
        MetaStore.open(str(public / "store" / "home"))
    public.chmod(0o1777)  # like /tmp: others cannot rename or delete our entries
    with MetaStore.open(str(public / "store" / "home")) as store:
        store.set("/a", "k", "v")
    # a file of another user in our dir is not ours to write
    store_dir = public / "store"
    os.unlink(store_dir / "home.journalfs-lock")
    (store_dir / "home.journalfs-lock").write_bytes(b"")
    os.chown(store_dir / "home.journalfs-lock", attacker.pw_uid, attacker.pw_gid)
    with pytest.raises(OSError, match="owned by uid"):
        MetaStore.open(str(store_dir / "home"))


def test_parent_writable_by_others_is_accepted_where_nobody_else_can_reach_it(searchable_dir):
    """Like /root/.local made 0777 inside a 0700 /root: no other user can reach it. The store
    directory itself must still not be writable by others."""
    private = searchable_dir / "private"
    private.mkdir(mode=0o700)
    loose = private / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with MetaStore.open(str(loose / "store" / "home"), create=True) as store:
        store.set("/a", "k", "v")
    (loose / "store").chmod(0o777)
    with pytest.raises(UnsafeStoreDir, match="store is writable by other users"):
        MetaStore.open(str(loose / "store" / "home"))
    private.chmod(0o711)  # searchable by others again: the loose parent is refused
    (loose / "store").chmod(0o700)
    with pytest.raises(UnsafeStoreDir, match="loose is writable by other users"):
        MetaStore.open(str(loose / "store" / "home"))


def test_mount_refuses_an_unsafe_store_with_one_line(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    for d in (src, mnt, store):
        d.mkdir()
    store.chmod(0o777)
    proc = subprocess.run([sys.executable, "-m", "journalfs.cli", "mount", "--foreground",
                           "--store", str(store), str(src), str(mnt)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode != 0 and not os.path.ismount(mnt)
    assert "Traceback" not in proc.stderr
    assert "refusing metadata store directory" in proc.stderr
