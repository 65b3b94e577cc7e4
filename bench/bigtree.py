"""Big gvfs metadata trees: `records --json` and `fsck` in bounded memory, beside `cat`.

    .venv/bin/python bench/bigtree.py [--shapes files=1000,directories=500] [--repeat 1]

A tree cannot resume mid-file (breadth-first, paths implicit), so the commands stream it with
``GvfsTree.scan``. Two generated shapes, each made once with the codec's own writer
and cached (the writer builds the whole tree in memory: about 20 GB and 5 minutes for 1 GB):

- ``files``: bench/parse.py's tree, 1000 files per directory (bench/out/parse/);
- ``directories``: one file per directory, so one level holds as many directories as the tree
  has files: what costs a streamed walk most (bench/out/bigtree/).

Per shape, in child processes with the file in the page cache: ``cat FILE > /dev/null``,
``journalfs records FILE --json > /dev/null``, ``journalfs fsck FILE``, and, for comparison,
the whole-file column decoder the commands used before (``read_columns`` of the whole tree,
its rows then rendered as JSON lines). Wall seconds, CPU seconds and peak RSS (sampled from
/proc while each runs); prints a table and a JSON blob.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import parse  # noqa: E402  (the files shape and its cache)
from journalfs.formats import CODECS  # noqa: E402

OUT = REPO / "bench" / "out" / "bigtree"

#: The previous code path, for comparison: the whole tree decoded as columns at once.
WHOLE_FILE = """
import sys
from journalfs.formats import CODECS
from journalfs.journals import mapped
from journalfs.jsonlines import render_rows
with mapped(sys.argv[1]) as buf:
    cols = CODECS["gvfs-tree"].read_columns(buf, sys.argv[1])
    for lo in range(0, cols.rows, 16384):
        render_rows(cols, list(cols.data), lo, min(cols.rows, lo + 16384))
"""


def _one_per_directory(n: int) -> bytes:
    return CODECS["gvfs-tree"].write(
        [{"path": f"/home/user/project-{i:07d}/notes.txt", "mtime": 1_700_000_000 + i,
          "metadata": {"annotation": f"note {i}"}} for i in range(n)], tag=0x12345678)


def tree_file(shape: str, megabytes: int) -> Path:
    if shape == "files":
        return parse.input_file("gvfs-tree", megabytes)
    path = OUT / f"directories-{megabytes}mb.bin"
    target = megabytes * 1_000_000
    if path.exists() and path.stat().st_size >= target:
        return path
    per_node = len(_one_per_directory(2000)) / 2000
    n = int(target / per_node * 1.03) + 1
    print(f"generating {path.name}: ~{n:,} directories ...", file=sys.stderr, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(_one_per_directory(n))
    tmp.replace(path)
    return path


def run(cmd: list[str]) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit status) of ``cmd`` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    status, peak = parse.run_sampled(cmd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 1024, status


def best(repeat: int, cmd: list[str]) -> dict:
    runs = [run(cmd) for _ in range(repeat)]
    wall, cpu, peak, status = min(runs)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": max(r[2] for r in runs),
            "exit": status}


def measure(shape: str, path: Path, repeat: int) -> dict:
    records = _count(path)
    py = sys.executable
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache
    return {"shape": shape, "mb": round(path.stat().st_size / 1e6), "records": records,
           "cat": best(repeat, ["cat", str(path)]),
           "records_json": best(repeat, [py, "-m", "journalfs.cli", "records", str(path),
                                         "--json"]),
           "fsck": best(repeat, [py, "-m", "journalfs.cli", "fsck", str(path)]),
           "whole_file_columns": best(1, [py, "-c", WHOLE_FILE, str(path)])}


def _count(path: Path) -> int:
    from journalfs.journals import mapped
    with mapped(str(path)) as buf:
        return sum(cols.rows for cols in CODECS["gvfs-tree"].scan(buf, str(path)))


def print_table(rows: list[dict]) -> None:
    head = ("shape", "MB", "records", "cat s", "records --json s / MB", "rec/s",
            "fsck s / MB", "whole-file columns s / MB")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        j, f, w = r["records_json"], r["fsck"], r["whole_file_columns"]
        print(f"| {r['shape']} | {r['mb']} | {r['records']:,} | {r['cat']['wall_s']:.2f} | "
              f"{j['wall_s']:.1f} / {j['peak_rss_mb']:.0f} | {r['records'] / j['cpu_s']:,.0f} | "
              f"{f['wall_s']:.1f} / {f['peak_rss_mb']:.0f} | "
              f"{w['wall_s']:.1f} / {w['peak_rss_mb']:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="files=1000,directories=500",
                        help="shape=MB pairs (shapes: files, directories)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for item in args.shapes.split(","):
        shape, mb = item.split("=")
        path = tree_file(shape, int(mb))
        rows.append(measure(shape, path, args.repeat))
    print_table(rows)
    print(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "load": os.getloadavg()[0], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
