"""POSIX conformance side by side: pjdfstest on a native directory, on bindfs (the C FUSE
passthrough) and on journalfs, in one run.

    sudo .venv/bin/python bench/posix.py [--targets native,bindfs,journalfs] [--jobs 2]
                                         [--journalfs-option timeout=0 ...] [--json FILE]

Each target gets a fresh SOURCE directory in /tmp (ext4 here) and the suite runs with
``prove -r -j<jobs>`` from a 0755 subdirectory of it (or of the mount over it). FUSE targets
are mounted as root with allow_other. Prints the table (filesystem | failed subtests | total),
the failing files per target, and a JSON blob. The build of pjdfstest is shared with the test
suite (tests/pjdfstest_build.py, cached under ~/.cache/journalfs).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mountutil import mounted, unmount  # noqa: E402
from pjdfstest_build import build, run_suite, searchable_tempdir  # noqa: E402


@contextlib.contextmanager
def bindfs_mount(source: Path, mnt: Path):
    mnt.mkdir(exist_ok=True)
    subprocess.run(["bindfs", "-o", "allow_other", str(source), str(mnt)], check=True)
    try:
        yield
    finally:
        for _ in range(20):
            if unmount(mnt).returncode == 0:
                break
            time.sleep(0.2)
        else:
            unmount(mnt, lazy=True)


def run_target(target: str, jobs: int, journalfs_options: list[str], only: list[str] | None):
    base = searchable_tempdir(f"journalfs-posix-{target}-")
    try:
        source = base / "source"
        source.mkdir(mode=0o755)
        if target == "native":
            mount = contextlib.nullcontext()
            work_parent = source
        elif target == "bindfs":
            mount = bindfs_mount(source, base / "mnt")
            work_parent = base / "mnt"
        elif target == "journalfs":
            opts = ",".join(["allow_other", *journalfs_options])
            mount = mounted(source, base / "mnt", "-o", opts)
            work_parent = base / "mnt"
        else:
            raise SystemExit(f"unknown target {target!r}")
        with mount:
            work = work_parent / "work"
            work.mkdir()
            work.chmod(0o755)
            return run_suite(work, jobs=jobs, only=only)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="native,bindfs,journalfs")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--journalfs-option", action="append", default=[],
                        help="extra -o option for journalfs (repeatable), e.g. timeout=0")
    parser.add_argument("--only", action="append", default=None,
                        help="a subdirectory of pjdfstest's tests/ (repeatable), e.g. rename")
    parser.add_argument("--json", help="also write the JSON result to this file")
    parser.add_argument("--report", help="also write the failing files, subtests and first "
                        "diagnostics per target to this file")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/posix.py needs root (pjdfstest switches users)")
    build()
    results = {}
    for target in args.targets.split(","):
        label = target
        if target == "journalfs" and args.journalfs_option:
            label += " (-o " + ",".join(args.journalfs_option) + ")"
        res = run_target(target, args.jobs, args.journalfs_option, args.only)
        results[label] = res
        print(f"{label}: {res.failed_count} of {res.total} failed, {res.seconds:.0f} s",
              file=sys.stderr, flush=True)

    print("\n| filesystem | failed subtests | total | seconds |")
    print("|---|---|---|---|")
    for label, res in results.items():
        print(f"| {label} | {res.failed_count} | {res.total} | {res.seconds:.0f} |")
    for label, res in results.items():
        if res.failed_files:
            print(f"\n## {label}\n{res.report(diagnostics=2)}")
    blob = {label: {"failed": res.failed_count, "total": res.total,
                    "seconds": round(res.seconds, 1), "jobs": args.jobs,
                    "failed_files": {f.name: f.failed for f in res.failed_files}}
            for label, res in results.items()}
    text = json.dumps(blob, indent=1, sort_keys=True)
    print("\n" + text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.report:
        import journalfs
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        parts = [f"pjdfstest run of {when}; journalfs code from "
                 f"{Path(journalfs.__file__).resolve().parents[1]}; prove -r -j{args.jobs}\n"]
        for label, res in results.items():
            parts.append(f"== {label}: {res.failed_count} of {res.total} subtests failed "
                         f"in {len(res.failed_files)} files ({res.seconds:.0f} s)\n"
                         f"{res.report(diagnostics=3)}\n")
        tmp = Path(args.report + ".tmp")
        tmp.write_text("\n".join(parts))
        tmp.replace(args.report)


if __name__ == "__main__":
    main()
