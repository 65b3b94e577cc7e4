"""What the kernel FUSE capabilities that pyfuse3 3.5 does not expose would give, measured
with a small libfuse3 C filesystem (bench/libfuse_caps.c: a passthrough, and a synthetic
directory for listings; compiled into a temporary directory here; needs gcc, pkg-config and
libfuse3-dev).

    sudo .venv/bin/python bench/libfuse_caps.py [--workdir /var/tmp/journalfs-bench]

Each workload runs on the same C filesystem with and without one capability; reported are
wall time and the requests the kernel sent (the fuse_request_send tracepoint, see
bench/fuse.py). Uses the source tree bench/fuse.py builds (files/, small/).
Not measurable here: FUSE passthrough (needs libfuse >= 3.16; Debian 12 has 3.14).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuse import RequestCounter, Target  # noqa: E402

HERE = Path(__file__).resolve().parent


def build(where: Path) -> Path:
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True,
                           capture_output=True, text=True).stdout.split()
    binary = where / "libfuse_caps"
    subprocess.run(["gcc", "-Wall", "-O2", "-o", str(binary), str(HERE / "libfuse_caps.c"),
                    *flags], check=True)
    return binary


class CFilesystem(Target):
    """The C filesystem as one of bench/fuse.py's targets (a foreground child that
    ``mount`` starts and waits for, its requests counted; ``unmount`` stops it): a
    passthrough of ``src``, or with ``src=None`` the synthetic directory of ``entries`` names."""

    def __init__(self, binary: Path, mnt: Path, src: Path | None = None, flags: list[str] = (),
                 entries: int = 0):
        super().__init__("libfuse_caps", src, mnt)
        self.binary, self.flags, self.entries = binary, list(flags), entries

    def command(self, sync: str | None, timeout: float | None) -> list[str]:
        served = [str(self.src)] if self.src is not None else ["--listing", str(self.entries)]
        return [str(self.binary), *served, str(self.mnt), *self.flags]


@contextlib.contextmanager
def mounted(fs: CFilesystem, cold: bool):
    fs.mount(cold=cold)
    try:
        yield fs
    finally:
        fs.unmount()


def readdir_cache(binary: Path, mnt: Path, entries: int = 10_000, listings: int = 5) -> dict:
    """Listings of a synthetic directory with and without cache_readdir."""
    out = {}
    for variant in ([], ["--cache-readdir"]):
        with mounted(CFilesystem(binary, mnt, flags=variant, entries=entries), cold=False) as fs:
            first = fs.counter.count()
            os.listdir(mnt)
            after_first = fs.counter.count()
            start = time.perf_counter()
            for _ in range(listings - 1):
                os.listdir(mnt)
            seconds = time.perf_counter() - start
            out["cache_readdir" if variant else "without"] = {
                "first listing requests": after_first - first,
                "later listings requests each": (fs.counter.count() - after_first) / (listings - 1),
                "later listings seconds each": round(seconds / (listings - 1), 4)}
    return out


def measure(mount: CFilesystem, fn) -> dict:
    before = mount.counter.count()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 4), "requests": mount.counter.count() - before}


def run(binary: Path, src: Path, mnt: Path) -> dict:
    results: dict[str, dict] = {}
    small = sorted(os.listdir(src / "small"))[:2000]
    list_file = Path(tempfile.mkstemp(prefix="caps-list-")[1])

    def cat_small():
        list_file.write_bytes(b"\0".join(os.fsencode(mnt / "small" / n) for n in small) + b"\0")
        subprocess.run(["xargs", "-0", "-a", str(list_file), "cat"], check=True,
                       stdout=subprocess.DEVNULL)

    def create_small():
        d = mnt / "caps-create"
        d.mkdir()
        body = b"w" * 4096
        for i in range(2000):
            fd = os.open(d / f"c{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, body)
            os.close(fd)

    def small_writes():
        with open(mnt / "caps-stream", "wb", buffering=0) as f:
            block = b"s" * 4096
            for _ in range(16384):  # 64 MiB in 4 KiB writes
                f.write(block)

    def cleanup():
        shutil.rmtree(src / "caps-create", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(src / "caps-stream")

    experiments = [
        ("cat of 2,000 small files, twice", lambda: (cat_small(), cat_small()), "--no-open"),
        ("cat of 2,000 small files, twice", lambda: (cat_small(), cat_small()), "--keep-cache"),
        ("create+write 4K+close x 2,000", create_small, "--writeback"),
        ("64 MiB in 4 KiB writes", small_writes, "--writeback"),
    ]
    for name, fn, flag in experiments:
        for variant in ([], [flag]):
            cleanup()
            with mounted(CFilesystem(binary, mnt, src, variant), cold=True) as m:
                results.setdefault(name, {})[flag.lstrip("-") if variant else "without"] = \
                    measure(m, fn)
            cleanup()
    list_file.unlink()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-bench"))
    args = ap.parse_args()
    src = args.workdir / "src"
    if not (src / "files").is_dir() or not (src / "small").is_dir():
        raise SystemExit(f"run bench/fuse.py first to build {src}")
    if not RequestCounter.available():
        raise SystemExit("the fuse_request_send tracepoint is not available")
    with tempfile.TemporaryDirectory(prefix="libfuse-caps-") as tmp:
        binary = build(Path(tmp))
        results = run(binary, src, Path(tmp) / "mnt")
        listing = readdir_cache(binary, Path(tmp) / "mnt2")
    print("| workload | variant | seconds | requests |")
    print("|---|---|---|---|")
    for name, variants in results.items():
        for variant, r in variants.items():
            print(f"| {name} | {variant} | {r['seconds']:.3f} | {r['requests']:,} |")
    print("\n| listing of 10,000 entries (low-level API) | first listing: requests "
          "| each later listing: requests | each later listing: seconds |")
    print("|---|---|---|---|")
    for variant, r in listing.items():
        print(f"| {variant} | {r['first listing requests']} | "
              f"{r['later listings requests each']:.1f} | {r['later listings seconds each']:.4f} |")
    print(json.dumps({"capabilities": results, "readdir_cache": listing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
