"""Fixtures shared by every test module: the conformance corpus the repository carries
(tests/data/conformance), and the suite's own clean-up check.

Every test session works in one private temporary directory (TMPDIR and ``tempfile``'s default
point into it, pytest's ``tmp_path`` too). When the session ends, the users it created are
removed (tests/users.py), and the session fails if any mount or loop device it made is still
there, or a store appeared in the real user's data directory; the directory is removed when
the session passed.

Per test (s3ql's pytest_checklogs and its fsck after each test are the model):

- the daemons of the test's mounts logged no unexpected error (tests/mountutil.py: the
  ``daemon_log_errors`` marker allows named ones), checked once the test and its fixtures are
  torn down;
- a test in whose run a FUSE mount appeared carries the ``fuse`` marker (mountutil.MountWatch);
- every metadata store the fast tier served (tests/fastops.py) passes the store's fsck, and a
  fast test logged no unexpected error in-process (its JournalFS is the daemon there).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import mountutil
import users

REPO = Path(__file__).resolve().parents[1]
#: the project's conformance corpus, in the repository (its README says what made each file)
CONFORMANCE = REPO / "tests" / "data" / "conformance"

#: this session's temporary directory (set in pytest_configure)
SESSION_TMP: Path | None = None
SESSION_PREFIX = "journalfs-tests-"
#: directories of failed sessions kept to look at (older ones are removed)
KEEP_FAILED = 3
#: watches the mount table below SESSION_TMP (set in pytest_configure)
MOUNT_WATCH: mountutil.MountWatch | None = None
PRESENT_MOUNTS = pytest.StashKey[set]()
#: what the fast tier's in-process daemon logs at ERROR
IN_PROCESS_ERRORS = mountutil.InProcessErrors()


def prune_dead_sessions(parent: Path) -> None:
    """Remove the directories of finished sessions (failed ones, which keep theirs) beyond
    the newest KEEP_FAILED; a session still running or with a mount below is left alone."""
    dead = []
    for path in parent.glob(SESSION_PREFIX + "*-*"):
        pid = path.name[len(SESSION_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and not mounts_under(path):
            dead.append(path)
    dead.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for path in dead[KEEP_FAILED:]:
        shutil.rmtree(path, ignore_errors=True)


def pytest_configure(config):
    global SESSION_TMP
    if SESSION_TMP is not None:
        return
    prune_dead_sessions(Path(tempfile.gettempdir()))
    # 0755: tests hand sub-directories to unprivileged users and to allow_other mounts
    SESSION_TMP = Path(tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-"))
    SESSION_TMP.chmod(0o755)
    tempfile.tempdir = str(SESSION_TMP)
    os.environ["TMPDIR"] = str(SESSION_TMP)
    global MOUNT_WATCH
    MOUNT_WATCH = mountutil.MountWatch(SESSION_TMP).start()
    logging.getLogger().addHandler(IN_PROCESS_ERRORS)


def pytest_unconfigure(config):
    if MOUNT_WATCH is not None:
        MOUNT_WATCH.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    mountutil.current_test = item  # mounted() checks its fuse marker
    if MOUNT_WATCH is not None:  # mounts left by earlier tests' fixtures are not this test's
        item.stash[PRESENT_MOUNTS] = MOUNT_WATCH.begin()
    mountutil.unexpected_errors(None)  # nor what their daemons logged before it
    IN_PROCESS_ERRORS.take(None)
    root = logging.getLogger()
    if IN_PROCESS_ERRORS not in root.handlers:  # a test that set up logging as main.py does
        root.addHandler(IN_PROCESS_ERRORS)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test's own teardown and that of the fixtures it was the last user of (a
    module's mount ends there, and logs its last lines)."""
    try:
        result = yield
    except BaseException as exc:  # the teardown failed itself: say both
        mountutil.current_test = None
        problems = _problems_after_test(item)
        if problems:
            exc.add_note("\n".join(problems))
        raise
    mountutil.current_test = None
    problems = _problems_after_test(item)
    if problems:
        pytest.fail(f"{item.nodeid}:\n" + "\n".join(problems), pytrace=False)
    return result


def _problems_after_test(item) -> list[str]:
    problems = []
    errors = mountutil.unexpected_errors(item)
    in_process = IN_PROCESS_ERRORS.take(item)
    if item.get_closest_marker("fast") is not None:
        errors += in_process
    if errors:
        problems.append("unexpected errors in the journalfs daemon's log (a test that provokes "
                        f"them on purpose names them with @pytest.mark.{mountutil.ALLOW_MARKER}"
                        "(PATTERN, reason=...)):\n  " + "\n  ".join(errors))
    present = item.stash.get(PRESENT_MOUNTS, None)
    mounts = MOUNT_WATCH.new_since(present) if present is not None else set()
    if mounts and item.get_closest_marker("fuse") is None:
        problems.append("mounted without the fuse marker (every test that mounts carries "
                        "@pytest.mark.fuse): " + ", ".join(sorted(f"{point} ({fstype})"
                                                                  for _, point, fstype in mounts)))
    if mounts and item.get_closest_marker("fast") is not None:
        problems.append("a fast test mounted (the fast tier runs in-process, no kernel mount): "
                        + ", ".join(sorted(point for _, point, _ in mounts)))
    fastops = sys.modules.get("fastops")
    if fastops is not None:
        findings = [line for tree in fastops.take_served_stores()
                    for line in fastops.store_findings(tree)]
        if findings and item.get_closest_marker("damaged_store") is None:
            problems.append("the store's fsck found:\n  " + "\n  ".join(findings))
    return problems


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")


def mounts_under(top: Path) -> list[tuple[str, str]]:
    """(mountpoint, filesystem type) of every mount at or below ``top``, deepest first."""
    found = [(point, fstype) for _, point, fstype in mountutil.mounts_under(top)]
    return sorted(found, key=lambda m: m[0].count("/"), reverse=True)


def loops_under(top: Path) -> list[tuple[str, str]]:
    """(loop device, backing file) of every loop device whose image lies below ``top``."""
    out = subprocess.run(["losetup", "--list", "--noheadings", "--raw", "--output", "NAME,BACK-FILE"],
                         capture_output=True, text=True).stdout
    prefix = str(top).rstrip("/") + "/"
    found = []
    for line in out.splitlines():
        name, _, back = line.partition(" ")
        back = _unescape(back.strip()).removesuffix(" (deleted)")
        if back.startswith(prefix):
            found.append((name, back))
    return found


def user_stores() -> set[str]:
    """The stores in the real user's data directory (where `journalfs mount` puts a default
    store); no test may add one."""
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    stores = data / "journalfs" / "stores"
    return set(os.listdir(stores)) if stores.is_dir() else set()


def leftovers(top: Path, stores_before: set[str]) -> list[str]:
    """What the suite made and did not remove: mounts and loop devices under ``top``, users it
    created, stores added to the real user's data directory."""
    problems = [f"mount left on {point} ({fstype})" for point, fstype in mounts_under(top)]
    problems += [f"loop device {name} left on {back}" for name, back in loops_under(top)]
    problems += [f"user {name} left behind" for name in users.remaining_created()]
    problems += [f"store {name} left in the user's data directory"
                 for name in sorted(user_stores() - stores_before)]
    return problems


def _remove_leftovers(top: Path) -> None:
    """Best effort, so that one leak does not break the next run (the session fails anyway)."""
    for point, _ in mounts_under(top):
        subprocess.run(["umount", "-l", point], capture_output=True)
    for name, _ in loops_under(top):
        subprocess.run(["losetup", "-d", name], capture_output=True)


@pytest.fixture(scope="session", autouse=True)
def suite_cleans_up(request):
    """Removes the users the session created; fails the session if it left a mount, a loop
    device, a user or a store behind."""
    stores_before = user_stores()
    yield
    users.remove_created()
    problems = leftovers(SESSION_TMP, stores_before)
    if problems:
        _remove_leftovers(SESSION_TMP)
        pytest.fail("the test suite left behind what it made:\n  " + "\n  ".join(problems),
                    pytrace=False)


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path clean-up, which reads the directory
def pytest_sessionfinish(session, exitstatus):
    # a passed session (or one that selected no test: 5) leaves nothing; a failed one keeps
    # its files to look at
    if SESSION_TMP is not None and exitstatus in (0, 5) and not mounts_under(SESSION_TMP):
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    """tests/data/conformance: gvfs/, records/, vectors.json."""
    return CONFORMANCE


@pytest.fixture(scope="session")
def records_corpus() -> Path:
    """tests/data/conformance/records (holds expected.json)."""
    return CONFORMANCE / "records"


@pytest.fixture(scope="session")
def records_expected(records_corpus) -> dict:
    return json.loads((records_corpus / "expected.json").read_text())


@pytest.fixture(scope="session")
def vectors() -> dict:
    return json.loads((CONFORMANCE / "vectors.json").read_text())


@pytest.fixture(scope="session")
def gvfs_snapshots() -> list[Path]:
    """Every snapshot directory of the real-gvfs corpora (each has gvfs-metadata/ and expected.json)."""
    snaps = sorted((CONFORMANCE / "gvfs").glob("*/snapshots/*"))
    assert snaps, "no gvfs snapshots found"
    return snaps
