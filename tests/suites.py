"""Third-party test suites the repository does not carry (pjdfstest, xfstests): where to find
them, and what a test does when one is absent. bench/ shell scripts ask
``python tests/suites.py NAME FILE`` (see main).

A suite ``NAME`` is looked for, first found wins, in
  ``$JOURNALFS_<NAME>`` (a directory holding the suite's files, e.g. ``JOURNALFS_PJDFSTEST``),
  ``$JOURNALFS_SHARED/conformance/<name>``,
  ``../shared/conformance/<name>`` (the project's shared data beside the clone).
When it is absent, the test skips with one line saying how to get it; with
``JOURNALFS_REQUIRE_SUITES=1`` (set by ``.ci/run``) the absence fails the test instead, so CI
cannot pass without having run them.

The project's own test data never comes from here: it is in ``tests/data/``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIRE_ENV = "JOURNALFS_REQUIRE_SUITES"
SHARED_ENV = "JOURNALFS_SHARED"

#: what each suite is and where to get it (for the one-line skip reason)
HOW_TO_GET = {
    "pjdfstest": "pjdfstest-src.tar.gz (`git archive --format=tar.gz` of github.com/pjd/pjdfstest; "
                 "README's Tests section)",
    "xfstests": "xfstests-src.tar.gz (`git archive --format=tar.gz` of xfstests-dev, "
                "git.kernel.org) with xfstests-fuse.patch and sample.txt (README's Tests section)",
}


def env_var(name: str) -> str:
    return f"JOURNALFS_{name.upper()}"


def candidates(name: str) -> list[Path]:
    """The directories looked at for suite ``name``, in order."""
    found = []
    if os.environ.get(env_var(name)):
        found.append(Path(os.environ[env_var(name)]))
    if os.environ.get(SHARED_ENV):
        found.append(Path(os.environ[SHARED_ENV]) / "conformance" / name)
    found.append(REPO.parent / "shared" / "conformance" / name)
    return found


def locate(name: str, required_file: str) -> Path | None:
    """The first candidate directory of suite ``name`` that holds ``required_file``."""
    for directory in candidates(name):
        if (directory / required_file).is_file():
            return directory.resolve()
    return None


def missing_reason(name: str, required_file: str) -> str:
    return (f"{name} not found (third-party suite, not in the repository): put "
            f"{HOW_TO_GET.get(name, required_file)} in a directory and set {env_var(name)} to it, "
            f"or JOURNALFS_SHARED to a directory with conformance/{name}/{required_file}")


def require(name: str, required_file: str) -> Path:
    """Suite ``name``'s directory, else skip the calling test with one line (fail instead
    under JOURNALFS_REQUIRE_SUITES=1)."""
    import pytest  # here: bench/ scripts use this module without pytest
    __tracebackhide__ = True  # the skip is reported at the calling test's line
    directory = locate(name, required_file)
    if directory is not None:
        return directory
    reason = missing_reason(name, required_file)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: CI must run it)", pytrace=False)
    pytest.skip(reason)


def main(argv: list[str]) -> int:
    """``python tests/suites.py NAME REQUIRED_FILE``: print the suite's directory (exit 0), or
    the one-line reason it is missing (exit 77, the "skipped" code). For bench/ shell scripts."""
    if len(argv) != 2:
        print("usage: suites.py NAME REQUIRED_FILE", file=sys.stderr)
        return 2
    directory = locate(*argv)
    if directory is None:
        print(missing_reason(*argv))
        return 77
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
