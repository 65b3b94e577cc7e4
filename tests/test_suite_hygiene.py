"""The suite's own rules: third-party suites are found outside the repository or skipped with
one line saying how to get them (a failure under JOURNALFS_REQUIRE_SUITES=1, as in CI), and a
session that leaves a mount, a loop device, a user or a store behind fails (tests/conftest.py).
The whole of it on a bare clone: .ci/fresh-clone."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import suites
import users
from conftest import (CONFORMANCE, KEEP_FAILED, SESSION_PREFIX, prune_dead_sessions, leftovers,
                      user_stores)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bare_clone(tmp_path, monkeypatch):
    """suites.py as it sees a clone with nothing beside it and no environment set."""
    monkeypatch.setattr(suites, "REPO", tmp_path / "clone")
    for name in (suites.SHARED_ENV, suites.env_var("pjdfstest"), suites.REQUIRE_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.fast
def test_a_missing_suite_skips_with_one_line_saying_how_to_get_it(bare_clone):
    with pytest.raises(pytest.skip.Exception) as skipped:
        suites.require("pjdfstest", "pjdfstest-src.tar.gz")
    reason = str(skipped.value)
    assert "\n" not in reason
    assert reason.startswith("pjdfstest not found (third-party suite, not in the repository)")
    assert "JOURNALFS_PJDFSTEST" in reason and "github.com/pjd/pjdfstest" in reason


@pytest.mark.fast
def test_a_missing_suite_fails_where_suites_are_required(bare_clone, monkeypatch):
    monkeypatch.setenv(suites.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        suites.require("pjdfstest", "pjdfstest-src.tar.gz")
    assert "JOURNALFS_REQUIRE_SUITES=1" in str(failed.value)


@pytest.mark.fast
def test_a_suite_is_found_by_its_variable_then_shared_then_beside_the_clone(bare_clone, monkeypatch):
    beside = bare_clone / "shared" / "conformance" / "pjdfstest"
    beside.mkdir(parents=True)
    (beside / "pjdfstest-src.tar.gz").write_bytes(b"")
    assert suites.require("pjdfstest", "pjdfstest-src.tar.gz") == beside
    shared = bare_clone / "elsewhere"
    (shared / "conformance" / "pjdfstest").mkdir(parents=True)
    (shared / "conformance" / "pjdfstest" / "pjdfstest-src.tar.gz").write_bytes(b"")
    monkeypatch.setenv(suites.SHARED_ENV, str(shared))
    assert suites.require("pjdfstest", "pjdfstest-src.tar.gz") == shared / "conformance" / "pjdfstest"
    own = bare_clone / "own"
    own.mkdir()
    (own / "pjdfstest-src.tar.gz").write_bytes(b"")
    monkeypatch.setenv(suites.env_var("pjdfstest"), str(own))
    assert suites.require("pjdfstest", "pjdfstest-src.tar.gz") == own


@pytest.mark.fast
def test_the_tests_read_no_data_from_outside_the_repository():
    """Only the third-party suites' finder may look beside the clone."""
    assert (CONFORMANCE / "records" / "expected.json").is_file()
    assert (CONFORMANCE / "vectors.json").is_file()
    assert sorted((CONFORMANCE / "gvfs").glob("run-*/snapshots/*/expected.json"))
    pattern = f"{suites.SHARED_ENV}|\\.\\./shared"
    mentions = subprocess.run(["grep", "-rlE", pattern, "tests/"],
                              cwd=REPO, capture_output=True, text=True).stdout.split()
    assert mentions == ["tests/suites.py"], mentions


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts, loop devices and users need root")
def test_leftovers_name_mounts_loop_devices_users_and_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    stores_before = user_stores()
    # users made by earlier tests of this session stay until its end (conftest removes them
    # then); nothing else may be left in this fresh tmp_path
    earlier = [f"user {n} left behind" for n in users.remaining_created()]
    assert leftovers(tmp_path, stores_before) == earlier
    mnt, image = tmp_path / "m", tmp_path / "disk.img"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "jfs-hygiene", str(mnt)], check=True)
    image.write_bytes(bytes(1 << 20))
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True,
                          text=True, check=True).stdout.strip()
    name = f"jfs-hygiene-{os.getpid() % 100000}"
    try:
        users.ensure_user(name)
        (tmp_path / "xdg" / "journalfs" / "stores" / "leaked").mkdir(parents=True)
        found = leftovers(tmp_path, stores_before)
        assert f"mount left on {mnt} (tmpfs)" in found
        assert f"loop device {loop} left on {image}" in found
        assert f"user {name} left behind" in found
        assert "store leaked left in the user's data directory" in found
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run(["losetup", "-d", loop], check=True)
        users.remove_created([name])
    found = leftovers(tmp_path, stores_before)
    assert found == earlier + ["store leaked left in the user's data directory"], found


@pytest.mark.fast
def test_finished_sessions_directories_are_pruned_to_the_newest_few(tmp_path):
    """A failed session keeps its directory to look at; the next session removes all but the
    newest KEEP_FAILED of those, never one of a session still running."""
    dead = []
    for i in range(KEEP_FAILED + 2):
        path = tmp_path / f"{SESSION_PREFIX}{99_999_990 + i}-abc"  # no such process
        path.mkdir()
        (path / "f").write_text("x")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        dead.append(path)
    running = tmp_path / f"{SESSION_PREFIX}{os.getpid()}-abc"
    running.mkdir()
    os.utime(running, (0, 0))
    prune_dead_sessions(tmp_path)
    assert sorted(tmp_path.iterdir()) == sorted(dead[-KEEP_FAILED:] + [running])
