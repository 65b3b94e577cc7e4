"""Real unprivileged users for the tests that act as someone other than root.

A user this process creates is removed again when the test session ends (tests/conftest.py
calls ``remove_created``); a user that already existed is left alone."""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

#: the users this process created with useradd, removed by remove_created()
_created: list[str] = []


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
    if proc.returncode == 0:
        _created.append(name)
    return pwd.getpwnam(name)


def remove_created(names: list[str] | None = None) -> None:
    """userdel every user this process created (or those of ``names`` it created), with the
    group useradd made for it; one that cannot be removed (a process of theirs still runs)
    stays listed by remaining_created()."""
    for name in [n for n in _created if names is None or n in names]:
        proc = subprocess.run(["userdel", name], capture_output=True, text=True)
        if proc.returncode in (0, 6):  # 6: already gone
            _created.remove(name)


def remaining_created() -> list[str]:
    """Users this process created that still exist."""
    out = []
    for name in _created:
        try:
            pwd.getpwnam(name)
            out.append(name)
        except KeyError:
            pass
    return out


@contextlib.contextmanager
def reachable_dir(prefix: str):
    """A fresh directory another user can reach, in the session's 0755 temporary directory
    (pytest's own tmp_path lives under a root-only 0700 directory); removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: the checkout and the venv's packages: what a user needs on PYTHONPATH to run journalfs with
#: the system interpreter (the venv's own interpreter may live under /root)
REPO = Path(__file__).resolve().parents[1]


def user_pythonpath() -> str:
    """PYTHONPATH for ``/usr/bin/python3 -m journalfs.cli`` run as another user; skips the
    calling test (one line) when that user could not read the checkout or the venv."""
    import site
    packages = site.getsitepackages()[0]
    for place in (REPO / "journalfs" / "cli.py", Path(packages) / "trio" / "__init__.py"):
        for parent in reversed(place.parents):
            if not os.stat(parent).st_mode & 0o001:
                import pytest
                pytest.skip(f"{parent} is not searchable by other users: journalfs cannot run "
                            f"as an unprivileged user from this checkout")
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(REPO), packages) if p)
