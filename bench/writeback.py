"""The write rows with and without the kernel's writeback cache, side by side (issue #28).

    sudo .venv/bin/python bench/writeback.py [--rounds 3] [--tree base=/work/main]
                                             [--only journalfs,journalfs-wb,journalfs-base,floor]

Targets: ``journalfs`` (this checkout, default options), ``journalfs-wb`` (this checkout with
``-o writeback_cache``), ``journalfs-NAME`` (another checkout, ``--tree NAME=DIR``) and
``floor`` (bench/fuse.py's minimal pyfuse3 passthrough). Rows: create+write 4K+close, 500 x
mv, fio 4k random read, fio 4k random write with fsync every 32, fio creation of 4 KiB files
(bench/fuse.py's own workloads, reused), 64 MiB written sequentially in 4 KiB writes, and ``cp -a`` / ``tar x`` of a tree of 600 files
(4-60 KiB, 6 directories) into the mount. Each round runs every target once in a rotating
order; figures are medians of the rounds. Besides the rate, the daemon's CPU per request and
per operation (file, I/O or rename): with writeback the kernel sends fewer, larger requests,
so CPU per request alone would flatter it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuse as fb  # noqa: E402  (bench/fuse.py: targets, request counting, workloads)

TREE_DIRS, TREE_FILES = 6, 100
SEQ_WRITES = 16384  # 64 MiB


def build_tree(src: Path) -> Path:
    """SOURCE/cptree (what cp -a copies) and a tarball of it outside SOURCE (what tar x
    unpacks); reused when present."""
    tree = src / "cptree"
    if not tree.is_dir():
        for d in range(TREE_DIRS):
            (tree / f"d{d}").mkdir(parents=True)
            for i in range(TREE_FILES):
                (tree / f"d{d}" / f"f{i:03d}").write_bytes(os.urandom(4096 * (1 + i % 15)))
    tarball = src.parent / "cptree.tar"
    if not tarball.exists():
        with tarfile.open(tarball, "w") as tar:
            tar.add(tree, arcname="cptree")
    return tarball


def cp_a(t: fb.Target) -> float:
    dest = f"cp-{t.name}"
    shutil.rmtree(t.src / dest, ignore_errors=True)
    seconds = fb.shell(f"cp -a cptree {dest}", t.root)
    shutil.rmtree(t.src / dest)
    return TREE_DIRS * TREE_FILES / seconds


def tar_x(t: fb.Target, tarball: Path) -> float:
    dest = t.src / f"tar-{t.name}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    time.sleep(0.1)
    seconds = fb.shell(f"tar xf {tarball}", t.root / dest.name)
    shutil.rmtree(dest)
    return TREE_DIRS * TREE_FILES / seconds


def dd_4k(t: fb.Target) -> float:
    """Sequential 4 KiB writes into a new file (a log written line by line, an unbuffered
    copy): where the writeback cache gathers writes into large requests."""
    path = t.root / f"seq-{t.name}"
    seconds = fb.shell(f"dd if=/dev/zero of={path} bs=4k count={SEQ_WRITES} conv=fsync "
                       "status=none", t.root)
    os.unlink(t.src / path.name)
    return SEQ_WRITES / seconds


def fio_ops(t: fb.Target, job: list[str], metric: str, counted: dict) -> float:
    """fio's IOPS; the I/Os it did go to ``counted`` (for CPU per operation)."""
    out = subprocess.run(["fio", "--output-format=json", "--name=bench", *job],
                         check=True, capture_output=True, text=True).stdout
    res = json.loads(out[out.index("{"):])["jobs"][0][metric]
    counted["ops"] = res["total_ios"]
    return res["iops"]


def rows(t: fb.Target, tarball: Path, args) -> list[tuple[str, object, int | None]]:
    """(row, workload returning a rate, operations it does or None when the workload
    reports them itself)."""
    big = [f"--filename={t.root / 'big.bin'}", "--size=256m", "--bs=4k",
           f"--runtime={args.fio_seconds}", "--time_based"]
    return [
        ("create+write 4K+close", lambda: fb.create_files(t.root / f"new-{t.name}", args.create),
         args.create),
        ("500 x mv (whole command)", lambda: fb.mv_500(t), 500),
        ("fio 4k random read", lambda c: fio_ops(t, [*big, "--rw=randread"], "read", c), None),
        ("fio 4k random write, fsync/32", lambda c: fio_ops(
            t, [f"--filename={t.root / 'rand.bin'}", "--size=256m", "--bs=4k", "--rw=randwrite",
                "--fsync=32", f"--runtime={args.fio_seconds}", "--time_based"], "write", c), None),
        ("fio creation of 4 KiB files", lambda: fb.fio_create(t), 1000),
        ("dd 64 MiB in 4 KiB writes", lambda: dd_4k(t), SEQ_WRITES),
        ("cp -a of a tree (600 files)", lambda: cp_a(t), TREE_DIRS * TREE_FILES),
        ("tar x of a tree (600 files)", lambda: tar_x(t, tarball), TREE_DIRS * TREE_FILES),
    ]


def measure(t: fb.Target, tarball: Path, args, results: dict) -> None:
    t.mount(cold=False)
    for name, fn, ops in rows(t, tarball, args):
        if args.rows and not any(part in name for part in args.rows.split(",")):
            continue
        before = t.sample()
        counted: dict = {}
        try:
            rate = fn(counted) if ops is None else fn()
        except Exception as exc:
            print(f"  {t.name}: {name} failed: {exc!r}", file=sys.stderr)
            continue
        after = t.sample()
        ops = counted.get("ops", ops)
        cpu, requests = after[0] - before[0], after[1] - before[1]
        row = results.setdefault(name, {}).setdefault(t.name, {"rate": [], "requests": [],
                                                               "cpu_us_request": [],
                                                               "cpu_us_op": []})
        row["rate"].append(rate)
        row["requests"].append(requests)
        if requests:
            row["cpu_us_request"].append(cpu / requests / 1e3)
        row["cpu_us_op"].append(cpu / ops / 1e3)
        print(f"  {t.name:16s} {name:32s} {rate:10.0f}/s  {requests:7d} req  "
              f"{cpu / ops / 1e3:7.1f} µs CPU/op", file=sys.stderr, flush=True)
    t.unmount()


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def table(results: dict, names: list[str]) -> str:
    lines = [f"{'row':32s} " + " ".join(f"{n:>26s}" for n in names),
             f"{'':32s} " + " ".join(f"{'rate  req  µs/req  µs/op':>26s}" for _ in names)]
    for row, by_target in results.items():
        cells = []
        for n in names:
            r = by_target.get(n)
            if not r or not r["rate"]:
                cells.append(f"{'-':>26s}")
                continue
            req = median(r["requests"])
            per_req = median(r["cpu_us_request"])
            cells.append(f"{median(r['rate']):8.0f} {req:6.0f} {per_req or 0:6.1f} "
                         f"{median(r['cpu_us_op']):6.1f}")
        lines.append(f"{row:32s} " + " ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/journalfs-bench-writeback"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--create", type=int, default=2000)
    parser.add_argument("--fio-seconds", type=int, default=3)
    parser.add_argument("--only", default="journalfs,journalfs-wb,floor")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--rows", default="", help="only rows whose name contains one of "
                        "these comma-separated words")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = args.workdir.resolve()
    src = work / "src"
    fb.build_source(src, 1, 256)
    tarball = build_tree(src)
    targets: dict[str, fb.Target] = {
        "journalfs": fb.Target("journalfs", src, work / "mnt-journalfs", work / "store"),
        "journalfs-wb": fb.Target("journalfs-wb", src, work / "mnt-journalfs-wb",
                                  work / "store-wb", ["-o", "writeback_cache"]),
        "floor": fb.Target("floor", src, work / "mnt-floor"),
    }
    for spec in args.tree:
        label, _, tree = spec.partition("=")
        targets[f"journalfs-{label}"] = fb.Target(
            f"journalfs-{label}", src, work / f"mnt-journalfs-{label}", work / f"store-{label}",
            tree=Path(tree).resolve())
    for t in targets.values():
        if t.store is not None:
            t.store.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",")
    chosen = [targets[n] for n in names]
    results: dict = {}
    for rnd in range(args.rounds):
        for t in chosen[rnd % len(chosen):] + chosen[:rnd % len(chosen)]:
            print(f"round {rnd + 1}/{args.rounds}: {t.name}", file=sys.stderr, flush=True)
            try:
                measure(t, tarball, args, results)
            finally:
                t.unmount()
    print(table(results, names))
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
