"""Permissions through a real mount with `-o allow_other,default_permissions`, exercised by an
unprivileged user (jfs-test) running real processes via setpriv."""
from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from mountutil import mounted
from users import ensure_user

pytestmark = pytest.mark.fuse

TEST_USER = "jfs-test"
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter lives under /root, closed to others

# Runs as the test user: performs each [name, op, path, arg] and prints {name: "ok" | result | ERRNAME}.
USER_SCRIPT = r"""
import errno, json, os, sys
def run(op, path, arg):
    if op == "read":
        with open(path, "rb") as f:
            return f.read().decode()
    if op == "write":
        with open(path, "ab") as f:
            f.write(arg.encode())
        return "ok"
    if op == "create":
        with open(path, "xb") as f:
            f.write(arg.encode())
        return "ok"
    if op == "unlink":
        os.unlink(path); return "ok"
    if op == "rename":
        os.rename(path, arg); return "ok"
    if op == "mkdir":
        os.mkdir(path); return "ok"
    if op == "setxattr":
        os.setxattr(path, arg[0], arg[1].encode()); return "ok"
    if op == "getxattr":
        return os.getxattr(path, arg).decode()
    if op == "removexattr":
        os.removexattr(path, arg); return "ok"
    raise ValueError(op)
out = {}
for name, op, path, arg in json.load(sys.stdin):
    try:
        out[name] = run(op, path, arg)
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


def ensure_test_user() -> pwd.struct_passwd:
    return ensure_user(TEST_USER)


def as_user(user: pwd.struct_passwd, steps: list[tuple[str, str, Path, object]]) -> dict:
    proc = subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         "--reset-env", SYSTEM_PYTHON, "-c", USER_SCRIPT],
        input=json.dumps([[n, op, str(p), arg] for n, op, p, arg in steps]),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def world():
    """SOURCE, mountpoint and store under a directory other users can traverse
    (pytest's tmp_path is private to root)."""
    user = ensure_test_user()
    base = Path(tempfile.mkdtemp(prefix="jfs-perm-"))
    base.chmod(0o755)
    src, mnt, store = base / "src", base / "mnt", base / "store"
    for d in (src, mnt, store):
        d.mkdir(mode=0o755)
    (src / "public.txt").write_text("for everyone\n")
    (src / "public.txt").chmod(0o644)
    (src / "secret.txt").write_text("root only\n")
    (src / "secret.txt").chmod(0o600)
    own = src / "userdir"
    own.mkdir()
    (own / "mine.txt").write_text("the user's\n")
    for p in (own, own / "mine.txt"):
        os.chown(p, user.pw_uid, user.pw_gid)
    yield user, src, mnt, store
    shutil.rmtree(base, ignore_errors=True)


def test_unprivileged_user_gets_native_permission_semantics(world):
    user, src, mnt, store = world
    with mounted(src, mnt, "--store", str(store), "-o", "allow_other,default_permissions"):
        os.setxattr(mnt / "public.txt", "user.metadata.color", b"blue")
        os.setxattr(mnt / "secret.txt", "user.metadata.color", b"red")
        os.setxattr(mnt / "userdir" / "mine.txt", "user.metadata.tag", b"seed")

        results = as_user(user, [
            ("read public", "read", mnt / "public.txt", None),
            ("read secret", "read", mnt / "secret.txt", None),
            ("write public", "write", mnt / "public.txt", "x"),
            ("create in root dir", "create", mnt / "new.txt", "x"),
            ("unlink public", "unlink", mnt / "public.txt", None),
            ("get meta public", "getxattr", mnt / "public.txt", "user.metadata.color"),
            ("get meta secret", "getxattr", mnt / "secret.txt", "user.metadata.color"),
            ("set meta public", "setxattr", mnt / "public.txt", ["user.metadata.color", "green"]),
            ("remove meta public", "removexattr", mnt / "public.txt", "user.metadata.color"),
            ("set meta own", "setxattr", mnt / "userdir" / "mine.txt", ["user.metadata.tag", "mine"]),
            ("get meta own", "getxattr", mnt / "userdir" / "mine.txt", "user.metadata.tag"),
            ("write own", "write", mnt / "userdir" / "mine.txt", "more\n"),
            ("create own", "create", mnt / "userdir" / "made.txt", "made\n"),
            ("set meta made", "setxattr", mnt / "userdir" / "made.txt", ["user.metadata.k", "v"]),
            ("mkdir own", "mkdir", mnt / "userdir" / "sub", None),
            ("rename own", "rename", mnt / "userdir" / "mine.txt", str(mnt / "userdir" / "sub" / "moved.txt")),
            ("get meta moved", "getxattr", mnt / "userdir" / "sub" / "moved.txt", "user.metadata.tag"),
        ])
        denied = {"EACCES", "EPERM"}
        assert results["read public"] == "for everyone\n"
        assert results["read secret"] == "EACCES"
        assert results["write public"] == "EACCES"
        assert results["create in root dir"] == "EACCES"
        assert results["unlink public"] == "EACCES"
        assert results["get meta public"] == "blue"
        assert results["get meta secret"] == "EACCES"  # user.* needs read permission
        assert results["set meta public"] in denied
        assert results["remove meta public"] in denied
        for step in ("set meta own", "write own", "create own", "set meta made", "mkdir own", "rename own"):
            assert results[step] == "ok", (step, results[step])
        assert results["get meta own"] == "mine"
        assert results["get meta moved"] == "mine"  # metadata followed the rename

        # the denied writes changed nothing; the allowed ones landed in SOURCE as the user
        assert os.getxattr(mnt / "public.txt", "user.metadata.color") == b"blue"
        assert os.getxattr(mnt / "secret.txt", "user.metadata.color") == b"red"
        assert (src / "public.txt").read_text() == "for everyone\n"
        assert not (src / "new.txt").exists()
        made = (src / "userdir" / "made.txt").stat()
        assert (made.st_uid, made.st_gid) == (user.pw_uid, user.pw_gid)
        assert (src / "userdir" / "sub" / "moved.txt").read_text() == "the user's\nmore\n"
        assert (src / "userdir" / "sub").stat().st_uid == user.pw_uid


def test_root_is_not_limited_by_mode_bits(world):
    """root (CAP_DAC_OVERRIDE) writes metadata on a file whose owner cannot, as natively."""
    user, src, mnt, store = world
    (src / "readonly.txt").write_text("r\n")
    (src / "readonly.txt").chmod(0o444)
    with mounted(src, mnt, "--store", str(store), "-o", "allow_other,default_permissions"):
        os.setxattr(mnt / "readonly.txt", "user.metadata.note", b"root wrote")
        assert os.getxattr(mnt / "readonly.txt", "user.metadata.note") == b"root wrote"
        results = as_user(user, [("get", "getxattr", mnt / "readonly.txt", "user.metadata.note"),
                                 ("missing", "getxattr", mnt / "readonly.txt", "user.metadata.none")])
        assert results == {"get": "root wrote", "missing": errno.errorcode[errno.ENODATA]}
