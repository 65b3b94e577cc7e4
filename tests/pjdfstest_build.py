"""Build pjdfstest (the POSIX filesystem test suite) once into a cache directory, run it in a
directory, and read its TAP results.

The source is the tarball ``pjdfstest-src.tar.gz`` (a ``git archive`` of one commit, named in
the README beside it), found as tests/suites.py says; it is never copied into this repository. The build
goes to ``$JOURNALFS_CACHE`` (default ``~/.cache/journalfs``) ``/pjdfstest-<commit>`` and is
reused while that directory exists. Needs autoconf, automake, make, gcc, perl (prove) and
openssl (Debian packages; bootstrap.sh installs them).

Used by tests/test_pjdfstest.py and bench/posix.py; also runnable by hand:

    python tests/pjdfstest_build.py [DIR]     # build, then (with DIR) run the suite in DIR
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import suites

TARBALL_NAME = "pjdfstest-src.tar.gz"
TOOLS = ("autoreconf", "make", "gcc", "prove", "openssl")


class BuildError(RuntimeError):
    """pjdfstest could not be built; the message says what is missing or what failed."""


def source_dir() -> Path:
    """The directory holding the tarball (see tests/suites.py)."""
    found = suites.locate("pjdfstest", TARBALL_NAME)
    if found is None:
        raise BuildError(suites.missing_reason("pjdfstest", TARBALL_NAME))
    return found


def source_commit(tarball: Path) -> str:
    """The commit the tarball was archived from (named in its README, else the tar header)."""
    readme = tarball.parent / "README.md"
    if readme.exists():
        found = re.search(r"\b[0-9a-f]{40}\b", readme.read_text())
        if found:
            return found.group(0)
    with tarfile.open(tarball) as tar:  # `git archive` stores the commit as the pax comment
        comment = tar.pax_headers.get("comment", "")
    if re.fullmatch(r"[0-9a-f]{40}", comment):
        return comment
    raise BuildError(f"cannot tell which pjdfstest commit {tarball} holds")


def cache_root() -> Path:
    base = os.environ.get("JOURNALFS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "journalfs")
    return Path(base)


def build() -> Path:
    """The directory holding the built ``pjdfstest`` binary and its ``tests/`` (built now
    unless a previous build of the same commit is there)."""
    tarball = source_dir() / TARBALL_NAME
    target = cache_root() / f"pjdfstest-{source_commit(tarball)}"
    if (target / "pjdfstest").is_file() and (target / "tests" / "conf").is_file():
        return target
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"cannot build pjdfstest: missing {', '.join(missing)} "
                         "(apt-get install autoconf automake make gcc perl openssl)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".pjdfstest-build-", dir=target.parent))
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(work, filter="data")
        tree = work / "pjdfstest" if (work / "pjdfstest").is_dir() else work
        for cmd in (["autoreconf", "-ifs"], ["./configure"], ["make", "pjdfstest"]):
            done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"pjdfstest build step {' '.join(cmd)} failed:\n"
                                 f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        try:
            os.rename(tree, target)  # atomic: a concurrent build that won keeps its copy
        except OSError:
            if not (target / "pjdfstest").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # the tests run as root but switch to uids 65534/65533 inside the directory under test;
    # they only exec the helper as root, so the cache may stay private
    return target


@dataclass
class FileResult:
    name: str                     # e.g. "rename/09.t"
    failed: list[int] = field(default_factory=list)
    planned: int | None = None
    diagnostics: list[str] = field(default_factory=list)   # the "not ok" lines
    problems: list[str] = field(default_factory=list)      # bad plan, non-zero wait status


@dataclass
class SuiteResult:
    files: dict[str, FileResult]
    total: int                   # subtests run, from prove's summary line
    seconds: float
    output: str

    @property
    def failed_files(self) -> list[FileResult]:
        return [f for f in self.files.values() if f.failed or f.problems]

    @property
    def failed_count(self) -> int:
        return sum(len(f.failed) for f in self.files.values())

    def report(self, diagnostics: int = 3) -> str:
        """One block per failing file: its failed subtest numbers and first diagnostics."""
        lines = []
        for f in sorted(self.failed_files, key=lambda f: f.name):
            head = f"{f.name}: failed {_ranges(f.failed)}" if f.failed else f"{f.name}:"
            lines.append(" ".join([head, *f.problems]))
            lines.extend("    " + _shorten(d) for d in f.diagnostics[:diagnostics])
        return "\n".join(lines)


def _shorten(line: str, longest: int = 100) -> str:
    """pjdfstest's PATH_MAX tests print 4 KiB paths: keep each long word's ends."""
    return re.sub(r"\S{%d,}" % (longest + 1),
                  lambda m: f"{m.group(0)[:40]}...({len(m.group(0))} chars)...{m.group(0)[-30:]}",
                  line)


def _ranges(numbers: list[int]) -> str:
    out, start = [], None
    numbers = sorted(set(numbers))
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def _expand(text: str) -> list[int]:
    numbers = []
    for part in text.replace(" ", "").split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            numbers.extend(range(int(lo), int(hi) + 1))
        elif part:
            numbers.append(int(part))
    return numbers


def _output_line(current: FileResult, line: str) -> None:
    """A line of a test file's own TAP output: its plan, its failures."""
    plan = re.match(r"^1\.\.(\d+)", line)
    if plan:
        current.planned = int(plan.group(1))
    elif line.startswith("not ok"):
        current.diagnostics.append(line.strip())
        number = re.match(r"^not ok (\d+)", line)
        if number and "# TODO" not in line:
            current.failed.append(int(number.group(1)))


def _summary_line(current: FileResult, line: str) -> FileResult | None:
    """A line below a file's entry in prove's summary report; None once the entry has ended."""
    failed = re.match(r"^\s+Failed tests?:\s+(.*)$", line)
    if failed:
        current.failed = _expand(failed.group(1))
    elif re.match(r"^\s+(Non-zero|Parse errors|Bad plan|No plan)", line):
        current.problems.append(line.strip())
    elif not line.startswith(" "):
        return None
    return current


def parse(output: str, tests_dir: Path) -> tuple[dict[str, FileResult], int]:
    """Read ``prove -v`` output: per file its "not ok" lines, then prove's summary report
    (authoritative for failed numbers, bad plans and exit statuses) and the Tests= total."""
    prefix = str(tests_dir).rstrip("/") + "/"
    files: dict[str, FileResult] = {}

    def result(path: str) -> FileResult:
        name = path[len(prefix):] if path.startswith(prefix) else path
        return files.setdefault(name, FileResult(name))

    current = None
    summary = False
    for line in output.splitlines():
        if line.startswith("Test Summary Report"):
            summary, current = True, None
            continue
        # in either part, a line naming a test file starts the lines that belong to it
        named = re.match(r"^(\S+\.t)\s+\(Wstat" if summary else r"^(\S+\.t) \.\.", line)
        if named:
            current = result(named.group(1))
            if summary:
                current.failed = []  # the summary's list replaces what the output said
        elif current is not None and summary:
            current = _summary_line(current, line)
        elif current is not None:
            _output_line(current, line)
    totals = re.search(r"^Files=\d+, Tests=(\d+)", output, re.M)
    return files, int(totals.group(1)) if totals else 0


def run_suite(directory: str | os.PathLike, jobs: int = 2, only: list[str] | None = None,
              timeout: float = 1800) -> SuiteResult:
    """Run the whole suite (or ``only`` these subdirectories/files of tests/) with ``prove -r
    -j<jobs> -v`` from ``directory``, which must be a 0755 directory on the filesystem under
    test whose parents others can search (the tests switch to uids 65534 and 65533)."""
    built = build()
    tests = built / "tests"
    targets = [str(tests / t) for t in only] if only else [str(tests)]
    started = time.monotonic()
    done = subprocess.run(["prove", "-r", f"-j{jobs}", "-v", *targets], cwd=directory,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout)
    seconds = time.monotonic() - started
    files, total = parse(done.stdout, tests)
    result = SuiteResult(files, total, seconds, done.stdout)
    if done.returncode != 0 and not result.failed_files:
        raise RuntimeError(f"prove exited {done.returncode} without a failing test:\n"
                           f"{done.stdout[-3000:]}")
    return result


def searchable_tempdir(prefix: str) -> Path:
    """A fresh 0755 directory whose every parent others can search (not pytest's 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


if __name__ == "__main__":
    where = build()
    print(where)
    if len(sys.argv) > 1:
        res = run_suite(sys.argv[1])
        print(res.report() or "all passed")
        print(f"failed {res.failed_count} of {res.total} subtests in {res.seconds:.0f} s")
