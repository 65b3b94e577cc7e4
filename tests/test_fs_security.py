"""Security of the plain mirror on a shared `-o allow_other` mount (issue 10, points 3, 4, 5,
7, 8, 11): an unprivileged user (jfs-test, via setpriv) can do through the mount exactly what
they could do on SOURCE, and nothing in SOURCE can make the root daemon act elsewhere."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mountutil import mounted
from test_fs_permissions import SYSTEM_PYTHON, ensure_test_user
from users import reachable_dir

pytestmark = pytest.mark.fuse

JOURNALFS = [sys.executable, "-m", "journalfs.cli"]
JOURNAL_MAGIC = b"\xda\x1ajour"


@pytest.fixture
def user():
    return ensure_test_user()


@pytest.fixture
def tmp_path():
    """A directory the test user can reach (pytest's own lives under a 0700 directory)."""
    with reachable_dir("jfs-sec-") as path:
        yield path


def _shared_tree(tmp_path: Path, user) -> tuple[Path, Path, Path]:
    """SOURCE with a directory the user owns; a root-only directory outside SOURCE."""
    for d in (tmp_path, tmp_path / "src"):
        d.mkdir(exist_ok=True)
    os.chmod(tmp_path, 0o755)
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    os.chmod(src, 0o755)
    home = src / "home"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    (home / "d").mkdir()
    os.chown(home / "d", user.pw_uid, user.pw_gid)
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("root only\n")
    os.chmod(secret / "key", 0o600)
    return src, mnt, secret


USER_RUN = r"""
import errno, json, os, sys
steps = json.load(sys.stdin)
out = {}
for name, code in steps:
    try:
        out[name] = eval(code) if code.startswith(("open(", "os.", "sorted(")) else exec(code)
        if isinstance(out[name], bytes):
            out[name] = out[name].decode(errors="replace")
        if out[name] is None:
            out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
print(json.dumps(out, default=str))
"""


def run_as(user, steps: list[tuple[str, str]], cwd: str = "/") -> dict:
    proc = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         "--reset-env", SYSTEM_PYTHON, "-c", USER_RUN], input=json.dumps(steps), cwd=cwd,
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# -- point 4: a directory swapped for a symlink ----------------------------------------------
def test_swapped_directory_never_reaches_root_only_directory(tmp_path, user):
    src, mnt, secret = _shared_tree(tmp_path, user)
    d, real = mnt / "home" / "d", src / "home" / "d"
    with mounted(src, mnt, "-o", "allow_other"):
        # The user works in their directory through the mount (their cwd holds the kernel's
        # inode), swaps it in SOURCE for a symlink to a root-only directory, waits for every
        # cache to expire, then reads, creates and deletes relative to that cwd.
        got = run_as(user, [
            ("cd", f"os.chdir({str(d)!r})"),
            ("ls", "sorted(os.listdir('.'))"),
            ("mv", f"os.rename({str(real)!r}, {str(real) + '.old'!r})"),
            ("ln", f"os.symlink({str(secret)!r}, {str(real)!r})"),
            ("wait", "__import__('time').sleep(2.5)"),
            ("read", "open('key').read()"),
            ("create", "open('planted', 'w').write('x')"),
            ("list", "sorted(os.listdir('.'))"),
            ("unlink", "os.unlink('key')"),
        ])
        assert got["ls"] == [], got
        assert got["read"] == "ENOENT", got
        # whatever the user did landed in their own (moved) directory, never in the secret one
        assert got["create"] == 1 and got["list"] == ["planted"], got
        assert got["unlink"] == "ENOENT", got
        assert sorted(os.listdir(secret)) == ["key"]
        assert (secret / "key").read_text() == "root only\n"
        assert (src / "home" / "d.old" / "planted").read_text() == "x"


def test_file_swapped_for_symlink_after_lookup(tmp_path, user):
    """A file the kernel knows, replaced in SOURCE by a symlink to a root-only file: opening
    it through the mount reaches the old file or fails, never the symlink's target."""
    src, mnt, secret = _shared_tree(tmp_path, user)
    f = src / "home" / "d" / "f"
    f.write_text("mine\n")
    os.chown(f, user.pw_uid, user.pw_gid)
    with mounted(src, mnt, "-o", "allow_other"):
        mf = mnt / "home" / "d" / "f"
        assert run_as(user, [("r", f"open({str(mf)!r}).read()")])["r"] == "mine\n"
        run_as(user, [("mv", f"os.rename({str(f)!r}, {str(f) + '.old'!r})"),
                      ("ln", f"os.symlink({str(secret / 'key')!r}, {str(f)!r})")])
        got = run_as(user, [("r", f"open({str(mf)!r}).read()"),
                            ("w", f"open({str(mf)!r}, 'a').write('owned')")])
        assert got["r"] in ("mine\n", "ESTALE", "ENOENT", "EACCES"), got
        assert got["w"] in (5, "ESTALE", "ENOENT", "EACCES"), got
        assert (secret / "key").read_text() == "root only\n"


def test_symlink_in_source_is_never_followed_by_the_daemon(tmp_path, user):
    src, mnt, secret = _shared_tree(tmp_path, user)
    os.symlink(secret / "key", src / "home" / "link")
    with mounted(src, mnt, "-o", "allow_other"):
        link = mnt / "home" / "link"
        got = run_as(user, [("read", f"open({str(link)!r}).read()"),
                            ("meta", f"os.setxattr({str(link)!r}, 'user.metadata.k', b'v', "
                                     f"follow_symlinks=False)"),
                            ("readlink", f"os.readlink({str(link)!r})")])
        assert got["read"] == "EACCES"  # the kernel follows it, as the user: no access
        assert got["meta"] == "EPERM"   # user.* on a symlink, as natively
        assert got["readlink"] == str(secret / "key")
        # root's own truncate through the mount follows the link in the kernel, like native
        os.truncate(mnt / "home" / "link", 4)
        assert (secret / "key").read_text() == "root"


# -- point 5: handles and unlinked files under concurrency ------------------------------------
def _churn(mnt: Path, worker: int, rounds: int, errors: list) -> None:
    for i in range(rounds):
        path = mnt / f"w{worker}" / f"f{i % 7}"
        payload = os.urandom(1000 + i)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, payload, 0)
                if i % 2:
                    os.unlink(path)  # unlinked but open: calls by handle must still work
                os.pwrite(fd, payload, 0)
                os.ftruncate(fd, len(payload))
                os.fchmod(fd, 0o600)
                st = os.fstat(fd)
                assert st.st_size == len(payload), (path, st.st_size)
                got = os.pread(fd, len(payload) + 100, 0)
                assert got == payload, f"{path}: read {got[:16]!r}"
                try:
                    os.getxattr(fd, "user.x")
                except OSError as exc:
                    assert exc.errno == errno.ENODATA, exc
                if i % 2:
                    # reopen the unlinked file by inode while the previous handle's release
                    # is still under way in the daemon
                    for _ in range(5):
                        again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
                        os.close(fd)
                        fd = again
                        got = os.pread(fd, len(payload) + 100, 0)
                        assert got == payload, f"{path} reopened: read {got[:16]!r}"
                        os.pwrite(fd, payload, 0)
            finally:
                os.close(fd)
        except Exception as exc:  # collected: the main thread asserts
            errors.append(f"w{worker} round {i}: {exc!r}")
            return


def test_handles_unlinks_and_metadata_never_touch_the_store(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    store.mkdir(mode=0o700)
    workers, rounds = 8, 150
    for w in range(workers):
        (src / f"w{w}").mkdir()
    (src / "meta").mkdir()
    for i in range(20):
        (src / "meta" / f"m{i}").write_text("")
    errors: list[str] = []
    with mounted(src, mnt, "--store", str(store), "--sync", "batch"):
        stop = threading.Event()

        def metadata_writer():
            n = 0
            while not stop.is_set():
                os.setxattr(mnt / "meta" / f"m{n % 20}", "user.metadata.n", str(n).encode())
                n += 1
            metadata_writer.last = n

        meta_thread = threading.Thread(target=metadata_writer)
        meta_thread.start()
        threads = [threading.Thread(target=_churn, args=(mnt, w, rounds, errors))
                   for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        stop.set()
        meta_thread.join(timeout=60)
        assert not errors, "\n".join(errors[:10])
        for w in range(workers):
            for name in os.listdir(src / f"w{w}"):
                assert not (src / f"w{w}" / name).read_bytes().startswith(JOURNAL_MAGIC)
        values = {int(os.getxattr(mnt / "meta" / f"m{i}", "user.metadata.n")) for i in range(20)}
        assert max(values) == metadata_writer.last - 1
    # the store was written by the store code only: fsck finds it healthy
    fsck = subprocess.run([*JOURNALFS, "fsck", str(store / "root")], capture_output=True,
                          text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    for entry in os.scandir(store):
        if entry.is_dir():  # indexes/: the views' on-disk journal indexes
            continue
        data = Path(entry.path).read_bytes()
        assert len(data) > 64 or entry.name.endswith("lock"), (entry.name, len(data))


# -- point 11: metadata of a path deleted behind the mount's back -----------------------------
def test_setfattr_on_path_deleted_from_source_is_enoent(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    store.mkdir(mode=0o700)
    (src / "gone").write_text("x")
    (src / "dir").mkdir()
    with mounted(src, mnt, "--store", str(store)):
        os.stat(mnt / "gone")
        os.stat(mnt / "dir")
        os.unlink(src / "gone")
        os.rmdir(src / "dir")
        for name in ("gone", "dir"):
            with pytest.raises(OSError) as err:
                os.setxattr(mnt / name, "user.metadata.k", b"v")
            assert err.value.errno == errno.ENOENT
    dump = subprocess.run([*JOURNALFS, "meta", "dump", str(store / "root"), "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(dump.stdout or "{}") == {}


# -- point 7: xattr namespaces ----------------------------------------------------------------
def test_trusted_hidden_from_users_security_and_acls_pass_through(tmp_path, user):
    if not shutil.which("setcap") or not shutil.which("getfacl"):
        pytest.skip("setcap/getfacl not installed (libcap2-bin, acl)")
    src, mnt, _ = _shared_tree(tmp_path, user)
    f = src / "home" / "f"
    f.write_text("x")
    os.chmod(f, 0o644)
    os.setxattr(f, "trusted.t", b"1")
    with mounted(src, mnt, "-o", "allow_other"):
        mf = mnt / "home" / "f"
        # trusted.*: listed to root only, as natively
        assert "trusted.t" in os.listxattr(mf)
        native = run_as(user, [("l", f"os.listxattr({str(f)!r})")])["l"]
        mounted_ = run_as(user, [("l", f"os.listxattr({str(mf)!r})")])["l"]
        assert "trusted.t" not in native and mounted_ == native
        refused = [run_as(user, [("get", f"os.getxattr({str(p)!r}, 'trusted.t')"),
                                 ("set", f"os.setxattr({str(p)!r}, 'trusted.u', b'1')")])
                   for p in (f, mf)]
        assert refused[0] == refused[1] == {"get": "ENODATA", "set": "EPERM"}
        # security.*: setcap through the mount, getcap on both sides
        subprocess.run(["setcap", "cap_net_raw+ep", str(mf)], check=True)
        for p in (f, mf):
            out = subprocess.run(["getcap", str(p)], capture_output=True, text=True).stdout
            assert "cap_net_raw" in out, (p, out)
        # POSIX ACLs: set through the mount, read back on both sides
        subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:r", str(mf)], check=True)
        for p in (f, mf):
            out = subprocess.run(["getfacl", "-c", str(p)], capture_output=True, text=True).stdout
            assert f"user:{user.pw_name}:r--" in out, (p, out)


# -- point 8: names and values are bytes ------------------------------------------------------
def test_non_utf8_names_keys_and_values(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    store.mkdir(mode=0o700)
    name = b"\xff\xfe-file"
    with mounted(src, mnt, "--store", str(store)):
        path = os.fsencode(mnt) + b"/" + name
        with open(path, "wb") as f:
            f.write(b"data")
        assert name in os.listdir(os.fsencode(mnt))
        value, key = b"caf\xe9 \x80", b"user.metadata.k\xfe"
        os.setxattr(path, key, value)
        assert os.getxattr(path, key) == value
        assert key in [os.fsencode(k) for k in os.listxattr(path)]
        os.setxattr(path, b"user.native\xff", b"\xff\x00\x01")
        assert os.getxattr(path, b"user.native\xff") == b"\xff\x00\x01"
        os.rename(path, os.fsencode(mnt) + b"/\xfdmoved")
        assert os.getxattr(os.fsencode(mnt) + b"/\xfdmoved", key) == value


# -- point 3: FIFOs and devices never block the mount -----------------------------------------
def test_blocked_fifo_opens_never_block_the_mount(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "plain").write_text("still here\n")
    for i in range(60):
        os.mkfifo(src / f"fifo{i}")
    with mounted(src, mnt):
        readers = [subprocess.Popen([sys.executable, "-c", f"open({str(mnt / f'fifo{i}')!r}).read()"])
                   for i in range(60)]  # each blocks until a writer shows up
        try:
            probe = subprocess.run(
                [sys.executable, "-c", f"import os; os.stat({str(mnt)!r}); "
                 f"print(open({str(mnt / 'plain')!r}).read(), end=''); "
                 f"os.setxattr({str(mnt / 'plain')!r}, 'user.metadata.k', b'v'); "
                 f"os.fsync(os.open({str(mnt / 'plain')!r}, os.O_RDONLY))"],
                capture_output=True, text=True, timeout=20)
            assert probe.returncode == 0, probe.stderr
            assert probe.stdout == "still here\n"
            assert all(r.poll() is None for r in readers)  # really blocked
        finally:
            for r in readers:
                r.kill()
                r.wait()
