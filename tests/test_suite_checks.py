"""The checks tests/conftest.py makes after every test can fail, and say why: an unexpected
error in a mount daemon's log (unless the test allows it with ``daemon_log_errors``), a mount
made by a test without the ``fuse`` marker, a damage the store's fsck finds (that one:
tests/test_fast_store.py). The last test runs a small session of its own with real mounts."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mountutil
from mountutil import DaemonLog, log_records, unexpected_errors

TESTS = Path(__file__).resolve().parent


class FakeItem:
    """What the checks read of a pytest item: its node id and markers."""

    def __init__(self, *marks):
        self.nodeid = "tests/test_x.py::test_x"
        self.marks = list(marks)

    def iter_markers(self, name):
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name):
        return next(iter(self.iter_markers(name)), None)


ERROR_LOG = (
    "journalfs[7]: INFO serving /a on /b (store /s, sync batch)\n"
    "journalfs[7]: ERROR metadata set('/x', 'k') failed\n"
    "Traceback (most recent call last):\n"
    "  File \"passthrough.py\", line 1, in _meta_call\n"
    "KeyError: 'x'\n"
    "journalfs[7]: WARNING readahead of /b left as the kernel set it\n"
    "journalfs[7]: ERROR Failed to submit invalidate_entry request for parent inode 2\n"
    "journalfs[7]: INFO half a line")


@pytest.fixture
def daemon_log(tmp_path, monkeypatch):
    monkeypatch.setattr(mountutil, "DAEMON_LOGS", [])
    path = tmp_path / "stderr"
    path.write_text(ERROR_LOG)
    log = DaemonLog(path, "journalfs on /b")
    mountutil.DAEMON_LOGS.append(log)
    return log


@pytest.mark.fast
def test_log_records_keep_a_traceback_with_its_record():
    records = log_records(ERROR_LOG)
    assert len(records) == 5
    assert records[1].startswith("journalfs[7]: ERROR metadata set") and \
        records[1].endswith("KeyError: 'x'")
    with_time = "2026-11-27 10:35:30,415 journalfs[7]: ERROR x\nTraceback\n"
    assert log_records(with_time) == ["2026-11-27 10:35:30,415 journalfs[7]: ERROR x\nTraceback"]


@pytest.mark.fast
def test_unexpected_errors_are_each_error_record_once(daemon_log):
    found = unexpected_errors(FakeItem())
    assert len(found) == 2
    assert "journalfs on /b" in found[0] and "KeyError: 'x'" in found[0]
    assert "invalidate_entry" in found[1]
    assert unexpected_errors(FakeItem()) == []  # each record is checked once
    with open(daemon_log.path, "a") as f:  # the half line completed, then a new error
        f.write(" now whole\njournalfs[7]: CRITICAL out of memory\n")
    assert [e.splitlines()[1].strip() for e in unexpected_errors(FakeItem())] == \
        ["journalfs[7]: CRITICAL out of memory"]
    daemon_log.done = True
    assert unexpected_errors(FakeItem()) == [] and mountutil.DAEMON_LOGS == []


@pytest.mark.fast
def test_a_test_allows_the_errors_it_provokes_by_pattern_and_reason(daemon_log):
    allowing = FakeItem(pytest.mark.daemon_log_errors(
        r"invalidate_entry", reason="the test invalidates a name the kernel never saw").mark)
    found = unexpected_errors(allowing)
    assert len(found) == 1 and "KeyError" in found[0]
    without_reason = FakeItem(pytest.mark.daemon_log_errors(r"KeyError").mark)
    with pytest.raises(AssertionError, match="reason="):
        unexpected_errors(without_reason)


@pytest.mark.fast
def test_errors_logged_in_process_are_taken_as_the_daemons(monkeypatch):
    handler = mountutil.InProcessErrors()
    logger = logging.getLogger("journalfs.fs.test-suite-checks")
    logger.addHandler(handler)
    logger.propagate = False  # this test's own records stay out of the suite's check
    try:
        logger.warning("only a warning")
        try:
            raise KeyError("x")
        except KeyError:
            logger.exception("getxattr failed")
        logger.error("planted in-process")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    allowing = FakeItem(pytest.mark.daemon_log_errors(r"planted", reason="planted here").mark)
    found = handler.take(allowing)
    assert len(found) == 1 and "ERROR getxattr failed" in found[0] and "KeyError: 'x'" in found[0]
    assert handler.take(FakeItem()) == []


@pytest.mark.fast
def test_mounting_without_the_fuse_marker_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setattr(mountutil, "current_test", FakeItem())
    with pytest.raises(AssertionError, match="without the fuse marker"):
        with mountutil.mounted(tmp_path / "src", tmp_path / "mnt"):
            pass
    assert not (tmp_path / "mnt").exists()  # refused before anything was made
    monkeypatch.setattr(mountutil, "current_test", FakeItem(pytest.mark.fuse.mark))
    mountutil.require_fuse_marker("journalfs on /b")  # with it: no complaint


INNER_TESTS = '''
import os, subprocess
import pytest
from mountutil import mounted

def plant(m, text):
    """An error record in the daemon's log, as the daemon writes them (it logs nothing more
    until it exits)."""
    with open(m.stderr_path, "a") as f:
        f.write(f"journalfs[{m.pid}]: ERROR {text}\\n")

def test_helper_mount_without_marker(tmp_path):
    (tmp_path / "src").mkdir()
    with mounted(tmp_path / "src", tmp_path / "mnt"):
        pass

def test_direct_mount_without_marker(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(); mnt.mkdir()
    subprocess.run(["bindfs", str(src), str(mnt)], check=True)
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)

@pytest.mark.fast
@pytest.mark.fuse
def test_fast_that_mounts(tmp_path):
    (tmp_path / "src").mkdir()
    with mounted(tmp_path / "src", tmp_path / "mnt"):
        pass

@pytest.mark.fuse
def test_error_in_the_log(tmp_path):
    (tmp_path / "src").mkdir()
    with mounted(tmp_path / "src", tmp_path / "mnt") as m:
        plant(m, "planted failure")

@pytest.mark.fuse
@pytest.mark.daemon_log_errors(r"planted failure", reason="this test plants it")
def test_error_allowed(tmp_path):
    (tmp_path / "src").mkdir()
    with mounted(tmp_path / "src", tmp_path / "mnt") as m:
        plant(m, "planted failure")

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    base = tmp_path_factory.mktemp("shared")
    (base / "src").mkdir()
    with mounted(base / "src", base / "mnt") as m:
        yield m

@pytest.mark.fuse
def test_module_mount_clean(shared):
    assert os.path.ismount(shared.mountpoint)

@pytest.mark.fuse
def test_module_mount_error(shared):
    plant(shared, "second failure")

@pytest.mark.fuse
def test_module_mount_clean_again(shared):
    assert os.path.ismount(shared.mountpoint)
'''


@pytest.mark.fuse
@pytest.mark.timeout(300)
def test_the_checks_in_a_session_of_their_own(tmp_path):
    """A pytest session with this suite's conftest.py and mountutil.py runs tests that break
    the rules: each is reported failing with its reason, and only those."""
    inner = tmp_path / "inner"
    inner.mkdir()
    for name in ("conftest.py", "mountutil.py", "users.py"):
        (inner / name).write_text((TESTS / name).read_text())
    (inner / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    ini = TESTS.parent / "pyproject.toml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                          "-c", str(ini), "--rootdir", str(inner), str(inner)],
                         capture_output=True, text=True, timeout=280, cwd=inner)
    out = run.stdout
    outcomes: dict[str, set[str]] = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR) \S*::(\w+)", out, re.M):
        outcomes.setdefault(m.group(2), set()).add(m.group(1))
    # a check after the test fails it as an error in its teardown
    assert outcomes == {
        "test_helper_mount_without_marker": {"FAILED"},
        "test_direct_mount_without_marker": {"PASSED", "ERROR"},
        "test_fast_that_mounts": {"PASSED", "ERROR"},
        "test_error_in_the_log": {"PASSED", "ERROR"},
        "test_error_allowed": {"PASSED"},
        "test_module_mount_clean": {"PASSED"},
        "test_module_mount_error": {"PASSED", "ERROR"},
        "test_module_mount_clean_again": {"PASSED"},
    }, out[-6000:]
    assert "mounts (journalfs on" in out and "without the fuse marker" in out
    assert re.search(r"mounted without the fuse marker .*test_direct_mount_without_mark\w*/mnt "
                     r"\(fuse", out)
    assert "a fast test mounted" in out
    assert out.count("planted failure") >= 1 and "second failure" in out
    assert run.returncode == 1, out[-3000:]
