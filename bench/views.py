"""Views on a big journal, side by side with bindfs over a real directory of as many files.

    python bench/views.py [--records N] [--work DIR] [--listing-only] [--real-dir DIR]

Times, for one wallaby-index journal of N records (24 bytes each) mounted by journalfs:
the first ``cat`` of a record after a remount (index from the store directory), ``stat`` of
records.jsonl and of a record, ``ls -U`` and ``ls`` of the view (entries/s, with the
READDIR(PLUS) requests and the daemon's CPU per entry), and reading records.jsonl (MB/s);
then ``ls -U`` and ``ls`` of a real directory of N empty files named like the records,
through bindfs and natively (entries/s). Creating N real files is slow (the directory is
kept for reruns, ``--real-dir``), which is why N defaults to 1M: scale rates, not times.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from journalfs.demo import big_wallaby_index  # noqa: E402  (after the path is set)

_spec = importlib.util.spec_from_file_location("bench_listing", Path(__file__).with_name("listing.py"))
bench_listing = sys.modules["bench_listing"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_listing)
RequestCounter, cpu_ns = bench_listing.bench_fuse.RequestCounter, bench_listing.bench_fuse.cpu_ns
LISTINGS = {"ls -U": ["ls", "-U"], "ls": ["ls"]}


def write_wallaby_index(path: Path, count: int) -> None:
    path.write_bytes(big_wallaby_index(count))


def wait_mounted(mnt: Path, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"mount exited {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{mnt} not mounted after {timeout} s")
        time.sleep(0.05)


def journalfs_mount(src: Path, mnt: Path, store: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "mount", "--foreground",
                             str(src), str(mnt), "--store", str(store)], env=env,
                            stderr=subprocess.DEVNULL)
    wait_mounted(mnt, proc)
    return proc


def unmount(mnt: Path, proc: subprocess.Popen | None = None) -> None:
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    if proc is not None:
        proc.wait(timeout=60)


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def list_rows(what: str, path: Path, pid: int | None = None) -> list[tuple[str, str]]:
    """``ls -U`` and ``ls`` of ``path``: entries/s, and for a FUSE daemon ``pid`` its
    READDIR(PLUS) requests and CPU per entry."""
    rows = []
    counter = None
    if pid is not None and RequestCounter.available():
        counter = RequestCounter(os.minor(os.stat(path).st_dev), (28, 44))
    try:
        for name, command in LISTINGS.items():
            before = (cpu_ns(pid) if pid else 0, counter.count() if counter else 0)
            t, listed = bench_listing.list_once(command, path)
            cpu, calls = (cpu_ns(pid) - before[0] if pid else 0,
                          counter.count() - before[1] if counter else 0)
            extra = f", {calls} READDIR(PLUS) requests" if counter else ""
            extra += f", daemon CPU {cpu / 1e3 / listed:.2f} µs/entry" if pid else ""
            rows.append((f"{what}: {name} ({listed} entries)",
                         f"{t:.2f} s = {listed / t:,.0f} entries/s{extra}"))
    finally:
        if counter is not None:
            counter.close()
    return rows


def read_all(path: Path) -> int:
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--work", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--skip-bindfs", action="store_true")
    ap.add_argument("--listing-only", action="store_true", help="only the ls rows")
    ap.add_argument("--real-dir", type=Path, default=None,
                    help="the directory of N real files for bindfs (kept; default WORK/real)")
    args = ap.parse_args()
    n = args.records
    work = Path(args.work or tempfile.mkdtemp(prefix="jfs-bench-views-"))
    src, mnt, store = work / "src", work / "mnt", work / "store"
    for d in (src, mnt):
        d.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        write_wallaby_index(src / "big.idx", n)
        view = mnt / ".journalfs" / "records" / "big.idx"
        proc = journalfs_mount(src, mnt, store)
        t, _ = timed(lambda: (view / f"{n - 1:08d}.index").read_bytes())
        rows.append(("first cat, no index yet (builds it)", f"{t:.3f} s"))
        unmount(mnt, proc)
        proc = journalfs_mount(src, mnt, store)
        if not args.listing_only:
            t, _ = timed(lambda: (view / f"{n // 2:08d}.index").read_bytes())
            rows.append(("first cat after remount (index on disk)", f"{t:.3f} s"))
            t, _ = timed(lambda: os.stat(view / "records.jsonl"))
            rows.append(("stat records.jsonl", f"{t:.4f} s"))
            t, _ = timed(lambda: os.stat(view / f"{n // 3:08d}.index"))
            rows.append(("stat of another record", f"{t:.4f} s"))
        rows += list_rows("journalfs view", view, proc.pid)
        if not args.listing_only:
            t, size = timed(lambda: read_all(view / "records.jsonl"))
            rows.append((f"read records.jsonl ({size >> 20} MiB)", f"{size / t / 1e6:.0f} MB/s"))
            t, size = timed(lambda: read_all(view / "records.jsonl"))
            rows.append(("read records.jsonl again (layout known)", f"{size / t / 1e6:.0f} MB/s"))
        unmount(mnt, proc)
        if not args.skip_bindfs:
            real, bmnt = args.real_dir or work / "real", work / "bmnt"
            bmnt.mkdir(exist_ok=True)
            t, _ = timed(lambda: bench_listing.make_directory(real, n))
            rows.append((f"(making the directory of {n} real files)", f"{t:.1f} s"))
            bproc = subprocess.Popen(["bindfs", "-f", str(real), str(bmnt)])
            try:
                wait_mounted(bmnt, bproc)
                rows += list_rows("bindfs", bmnt, bproc.pid)
            finally:
                unmount(bmnt, bproc)
            rows += list_rows("native", real)
    finally:
        for m in (mnt, work / "bmnt"):
            if os.path.ismount(m):
                unmount(m)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    for what, figure in rows:
        print(f"{what:<{width}}  {figure}")


if __name__ == "__main__":
    main()
