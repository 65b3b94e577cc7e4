"""What the kernel FUSE capabilities that pyfuse3 3.5 does not expose would give, measured
with a small libfuse3 C passthrough (bench/libfuse_caps.c, compiled into a temporary
directory here; needs gcc, pkg-config and libfuse3-dev).

    sudo .venv/bin/python bench/libfuse_caps.py [--workdir /var/tmp/journalfs-bench]

Each workload runs on the same C filesystem with and without one capability; reported are
wall time and the requests the kernel sent (the fuse_request_send tracepoint, see
bench/fuse.py). Uses the source tree bench/fuse.py builds (files/, small/).
Not measurable here: FUSE passthrough (needs libfuse >= 3.16; Debian 12 has 3.14).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuse import RequestCounter, drop_caches  # noqa: E402

HERE = Path(__file__).resolve().parent


def build(where: Path) -> Path:
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True,
                           capture_output=True, text=True).stdout.split()
    binary = where / "libfuse_caps"
    subprocess.run(["gcc", "-Wall", "-O2", "-o", str(binary), str(HERE / "libfuse_caps.c"),
                    *flags], check=True)
    return binary


class CMount:
    def __init__(self, binary: Path, src: Path, mnt: Path, flags: list[str]):
        self.binary, self.src, self.mnt, self.flags = binary, src, mnt, flags

    def __enter__(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([str(self.binary), str(self.src), str(self.mnt), *self.flags],
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"libfuse_caps did not mount: {self.proc.stderr.read()!r}")
            time.sleep(0.02)
        self.counter = RequestCounter(os.minor(os.stat(self.mnt).st_dev))
        return self

    def __exit__(self, *exc):
        self.counter.close()
        subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
        self.proc.wait(timeout=20)


def measure(mount: CMount, fn) -> dict:
    before = mount.counter.count()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 4), "requests": mount.counter.count() - before}


def run(binary: Path, src: Path, mnt: Path) -> dict:
    results: dict[str, dict] = {}
    files = src / "files"
    small = sorted(os.listdir(src / "small"))[:2000]
    list_file = Path(tempfile.mkstemp(prefix="caps-list-")[1])

    def listings():
        for _ in range(5):
            os.listdir(mnt / "files")

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
        with contextlib_suppress():
            os.unlink(src / "caps-stream")

    experiments = [
        ("5 listings of files/ (10k entries)", listings, "--cache-readdir"),
        ("cat of 2,000 small files, twice", lambda: (cat_small(), cat_small()), "--no-open"),
        ("cat of 2,000 small files, twice", lambda: (cat_small(), cat_small()), "--keep-cache"),
        ("create+write 4K+close x 2,000", create_small, "--writeback"),
        ("64 MiB in 4 KiB writes", small_writes, "--writeback"),
    ]
    for name, fn, flag in experiments:
        for variant in ([], [flag]):
            cleanup()
            drop_caches()
            with CMount(binary, src, mnt, variant) as m:
                results.setdefault(name, {})[flag.lstrip("-") if variant else "without"] = \
                    measure(m, fn)
            cleanup()
    list_file.unlink()
    return results


class contextlib_suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, FileNotFoundError)


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
    print("| workload | variant | seconds | requests |")
    print("|---|---|---|---|")
    for name, variants in results.items():
        for variant, r in variants.items():
            print(f"| {name} | {variant} | {r['seconds']:.3f} | {r['requests']:,} |")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
