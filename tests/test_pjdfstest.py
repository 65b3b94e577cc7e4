"""pjdfstest, the POSIX filesystem test suite, run whole inside a journalfs mount.

journalfs is mounted as root with ``-o allow_other`` (the suite switches to uids 65534 and
65533) and default options otherwise, over a fresh SOURCE, and once more with the kernel's
writeback cache (``-o writeback_cache``: the kernel then reads pages of write-only files,
places O_APPEND writes and keeps size and times itself); the suite runs with ``prove -r
-j2`` from a 0755 subdirectory of the mount. Any failed subtest fails the test, listing every
failed file with its subtest numbers and first diagnostics. The build is cached (see
tests/pjdfstest_build.py); the first run builds it (~10 s). The suite is not in the repository:
without it the test skips saying how to get it (tests/suites.py).
"""
from __future__ import annotations

import os
import shutil

import pytest

import suites
from mountutil import mounted
from pjdfstest_build import TARBALL_NAME, build, run_suite, searchable_tempdir

pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(os.geteuid() != 0, reason="pjdfstest needs root")]


@pytest.fixture
def public_dir():
    path = searchable_tempdir("journalfs-pjdfstest-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("options", ["allow_other", "allow_other,writeback_cache"],
                         ids=["default", "writeback_cache"])
def test_pjdfstest_passes_in_the_mount(public_dir, options):
    suites.require("pjdfstest", TARBALL_NAME)  # third-party: skips with how to get it
    build()  # before mounting: a build error is then not mistaken for a mount problem
    source, mnt = public_dir / "source", public_dir / "mnt"
    source.mkdir(mode=0o755)
    with mounted(source, mnt, "-o", options) as m:
        work = mnt / "work"
        work.mkdir()
        work.chmod(0o755)
        result = run_suite(work, jobs=2)
        assert m.process.poll() is None, f"journalfs died during the suite:\n{m.stderr()}"
    assert result.total > 8000, f"only {result.total} subtests ran:\n{result.output[-3000:]}"
    if result.failed_files:
        pytest.fail(f"pjdfstest: {result.failed_count} of {result.total} subtests failed "
                    f"({result.seconds:.0f} s):\n{result.report(diagnostics=5)}",
                    pytrace=False)
