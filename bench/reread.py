"""Why a re-read through the mount is slower than on SOURCE: the page cache's folio sizes.

    sudo .venv/bin/python bench/reread.py [--mib 256] [--rounds 8] [--workdir DIR]

A re-read of a cached file sends the daemon (almost) no request: the kernel copies from the
mount's own page cache. This bench re-reads one file with ``dd bs=1M``, interleaved rounds, on
SOURCE (ext4 here), through a journalfs mount, and from tmpfs (a filesystem whose page cache
holds 4 KiB pages unless mounted with huge=), and reports for each the median GB/s. Then it
shows where the difference comes from:

- the FUSE requests a re-read sends (``fuse_request_send`` tracepoint, bench/fuse.py's counter);
- the page cache's 2 MiB folios (``FileHugePages`` in /proc/meminfo) while only SOURCE's pages
  are cached, and while only the mount's pages are (SOURCE's evicted with
  ``POSIX_FADV_DONTNEED``);
- what a FUSE filesystem in kernel passthrough mode reaches (bench/fuse_passthrough.c, built
  here with gcc: it speaks /dev/fuse itself, since neither libfuse 3.14 nor pyfuse3 3.5 can
  ask for passthrough): its reads go to SOURCE's own page cache.

Prints a table and a JSON blob.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuse import RequestCounter, drop_caches  # noqa: E402  (bench/fuse.py)

REPO = Path(__file__).resolve().parent.parent


def dd_gbs(path: Path) -> float:
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True,
                         text=True, check=True).stderr.strip().splitlines()[-1]
    size, seconds = int(out.split()[0]), float(out.split(" s,")[0].split(", ")[-1])
    return size / seconds / 1e9


def file_huge_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("FileHugePages:"):
            return int(line.split()[1])
    return -1


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def start_passthrough(src: Path, mnt: Path, work: Path) -> subprocess.Popen | None:
    """bench/fuse_passthrough.c built and mounted on ``mnt`` (serving ``src``); None, with
    the reason on stderr, where it cannot run (no gcc, a kernel without passthrough)."""
    binary = work / "fuse_passthrough"
    try:
        subprocess.run(["gcc", "-Wall", "-O2", "-o", str(binary),
                        str(REPO / "bench" / "fuse_passthrough.c")], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"reread: no FUSE passthrough row: {exc}", file=sys.stderr)
        return None
    mnt.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(binary), str(src), str(mnt)])
    deadline = time.monotonic() + 10
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            print("reread: no FUSE passthrough row: it did not mount", file=sys.stderr)
            return None
        time.sleep(0.02)
    try:
        os.stat(mnt / "big.bin")
    except OSError as exc:  # e.g. the kernel refused the backing file
        print(f"reread: no FUSE passthrough row: {exc}", file=sys.stderr)
        subprocess.run(["umount", str(mnt)], check=False)
        proc.wait(timeout=30)
        return None
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-reread"))
    args = ap.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    src, mnt, store = work / "src", work / "mnt", work / "store"
    for d in (src, mnt, store):
        d.mkdir(parents=True)
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    with open(src / "big.bin", "wb") as f:
        for _ in range(args.mib):
            f.write(os.urandom(1 << 20))
    shutil.copyfile(src / "big.bin", shm / "big.bin")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "journalfs.cli", "mount", "--store", str(store),
                    str(src), str(mnt)], check=True, env=env)
    passthrough = start_passthrough(src, work / "mnt-passthrough", work)
    try:
        files = {"SOURCE (ext4)": src / "big.bin", "journalfs": mnt / "big.bin",
                 "tmpfs": shm / "big.bin"}
        if passthrough is not None:
            files["FUSE passthrough"] = work / "mnt-passthrough" / "big.bin"
        drop_caches()
        for path in files.values():
            dd_gbs(path)  # fill every page cache
        rates: dict[str, list[float]] = {name: [] for name in files}
        for _ in range(args.rounds):
            for name, path in files.items():
                rates[name].append(dd_gbs(path))
        counter = RequestCounter(os.minor(os.stat(mnt).st_dev))
        before = counter.count()
        dd_gbs(files["journalfs"])
        requests = counter.count() - before
        counter.close()
        # folios: only SOURCE's pages cached, then only the mount's
        drop_caches()
        dd_gbs(files["SOURCE (ext4)"])
        source_huge = file_huge_kib()
        drop_caches()
        dd_gbs(files["journalfs"])
        evict(files["SOURCE (ext4)"])
        time.sleep(0.2)
        mount_huge = file_huge_kib()
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        if passthrough is not None:
            subprocess.run(["umount", str(work / "mnt-passthrough")], check=False)
            passthrough.wait(timeout=30)
        shutil.rmtree(shm, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in rates.items()}
    result = {"benchmark": "reread", "mib": args.mib, "rounds": args.rounds,
              "gb_s": rates, "median_gb_s": medians,
              "journalfs_vs_source": medians["journalfs"] / medians["SOURCE (ext4)"],
              "journalfs_vs_tmpfs": medians["journalfs"] / medians["tmpfs"],
              "passthrough_vs_source": (medians["FUSE passthrough"] / medians["SOURCE (ext4)"]
                                        if "FUSE passthrough" in medians else None),
              "fuse_requests_per_reread": requests,
              "file_huge_kib_source_cached": source_huge,
              "file_huge_kib_mount_cached": mount_huge}
    print(f"{'file':<16}{'median GB/s':>12}   rounds")
    for name, v in rates.items():
        print(f"{name:<16}{medians[name]:>12.2f}   {' '.join(f'{x:.1f}' for x in v)}")
    print(f"journalfs / SOURCE {result['journalfs_vs_source']:.2f}, journalfs / tmpfs "
          f"{result['journalfs_vs_tmpfs']:.2f}; FUSE requests per re-read: {requests}")
    if result["passthrough_vs_source"] is not None:
        print(f"FUSE passthrough / SOURCE {result['passthrough_vs_source']:.2f}")
    print(f"2 MiB folios in the page cache (FileHugePages): SOURCE's pages cached "
          f"{source_huge} KiB, only the mount's pages cached {mount_huge} KiB")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
