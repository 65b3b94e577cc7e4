"""Real unprivileged users for the tests that act as someone other than root."""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path


def ensure_user(name: str) -> pwd.struct_passwd:
    """The system user ``name`` (no home, no login shell), created when it does not exist."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    proc = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                           name], capture_output=True, text=True)
    if proc.returncode not in (0, 9):  # 9: created meanwhile by someone else
        raise RuntimeError(f"useradd {name}: {proc.stderr.strip()}")
    return pwd.getpwnam(name)


@contextlib.contextmanager
def reachable_dir(prefix: str):
    """A fresh directory under /tmp another user can reach (pytest's own tmp_path lives
    under a root-only 0700 directory); removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
