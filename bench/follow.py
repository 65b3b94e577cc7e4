"""Following and selecting: how fast new records show, and how fast -n / --since answer.

    .venv/bin/python bench/follow.py [--mb 1000] [--appends 200] [--interval 0.05]

1. Selections on the ~--mb MB Kestrel journal of bench/bigjournal.py (cached in
   bench/out/bigjournal/): ``journalfs records -n 10 --json`` and ``--since`` (the last 1 %
   of its time span), the first run (builds the record index and keeps it in a private
   cache directory) and warm runs (index loaded); ``--since`` also for the last 1,000
   records (finding them is the cost) besides the last 1 % (printing them is); against
   ``journalfs records --json | tail -n 10`` of the same file (the whole file decoded) and,
   when there is one, ``journalctl -n 10`` on the system journal; start-up alone: ``python -c pass``,
   ``journalfs --help`` and ``journalfs records --help`` (median of >= 5 runs).
2. Follow latency, append to record visible, over --appends PUTs written one at a time every
   --interval s to a Kestrel segment: through ``journalfs records -f --json`` (CLI), and
   through a real mount with GNU ``tail -f`` on records.jsonl (its default 1 s polling, and
   ``-s 0.1``). p50 / p99 / max in ms.
3. On a mount of the --mb MB journal (a fresh store): how long after the first ``stat`` of
   its records.jsonl the size shows (indexing, then every line measured in the background),
   and ``tail -n 10`` of it then; the same after a remount (both loaded from the store).

Prints a table, then one JSON object. Needs FUSE (``fusermount3``) for the mount part.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests")]

import bigjournal  # noqa: E402
from mountutil import mounted  # noqa: E402

from journalfs import demo  # noqa: E402
from journalfs.formats import CODECS  # noqa: E402

KESTREL = CODECS["kestrel-writer"]
JOURNALFS = [sys.executable, "-m", "journalfs.cli"]


def timed(argv: list[str], env: dict, shell: bool = False) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False, shell=shell)
    return time.perf_counter() - t


def selections(mb: int, env: dict, warm: int) -> list[dict]:
    path, count = bigjournal.journal("kestrel-writer", mb)
    with open(path, "rb") as f:
        first_ms = next(KESTREL.read(f.read(1 << 12) + bytes(0), str(path)))["add_time"]
    # bigjournal's add_time grows by 7 ms a record
    since = f"@{(first_ms + int(count * 0.99) * 7) / 1000:.3f}"
    since_1000 = f"@{(first_ms + (count - 1000) * 7) / 1000:.3f}"
    cases = [("-n 10", ["records", "-n", "10", "--json", str(path)]),
             ("--since (last 1,000)", ["records", "--since", since_1000, "--json", str(path)]),
             (f"--since (last 1 %: {count - int(count * 0.99):,})",
              ["records", "--since", since, "--json", str(path)])]
    out = []
    for name, argv in cases:
        cache = tempfile.mkdtemp(prefix="jfs-bench-cache-")
        run_env = dict(env, XDG_CACHE_HOME=cache)
        first = timed(JOURNALFS + argv, run_env)
        warms = [timed(JOURNALFS + argv, run_env) for _ in range(warm)]
        shutil.rmtree(cache, ignore_errors=True)
        out.append({"case": f"journalfs records {name}", "first_s": round(first, 3),
                    "warm_s": round(statistics.median(warms), 3)})
    for name, argv in (("python -c pass (start-up floor)", [sys.executable, "-c", "pass"]),
                       ("journalfs --help", JOURNALFS + ["--help"]),
                       ("journalfs records --help", JOURNALFS + ["records", "--help"])):
        out.append({"case": name, "first_s": None,
                    "warm_s": round(statistics.median(timed(argv, env) for _ in range(
                        max(5, warm))), 3)})
    whole = f"{' '.join(JOURNALFS)} records --json {path} | tail -n 10"
    out.append({"case": "records --json | tail -n 10", "first_s": None,
                "warm_s": round(timed(whole, env, shell=True), 3)})
    if shutil.which("journalctl"):
        out.append({"case": "journalctl -n 10 (system journal)", "first_s": None,
                    "warm_s": round(timed(["journalctl", "-n", "10", "--no-pager"], env), 3)})
    for row in out:
        row.update(mb=mb, records=count)
    return out


class Lines:
    def __init__(self, proc: subprocess.Popen):
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            self.q.put((time.perf_counter(), line))


def latencies(start_follower, path: Path, appends: int, interval: float) -> dict:
    """Append PUTs to ``path`` one by one; the time each takes to come out of the follower."""
    records = demo.kestrel_put_records(random.Random(1), appends + 2)
    path.write_bytes(KESTREL.write(records[:2]))
    proc = start_follower()
    lines = Lines(proc)
    try:
        for _ in range(2):
            lines.q.get(timeout=30)  # the existing records
        got = []
        for rec in records[2:]:
            frame = KESTREL.write([rec])[4:]
            t = time.perf_counter()
            with open(path, "ab") as f:
                f.write(frame)
            seen, line = lines.q.get(timeout=30)
            assert json.loads(line)["id"] == rec["id"], line
            got.append(seen - t)
            time.sleep(interval)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got.sort()
    return {"appends": len(got), "p50_ms": round(1000 * got[len(got) // 2], 1),
            "p99_ms": round(1000 * got[min(len(got) - 1, int(len(got) * 0.99))], 1),
            "max_ms": round(1000 * got[-1], 1)}


def follow(appends: int, interval: float, env: dict) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="jfs-bench-follow-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        seg = src / "jobs.1700000000000"

        def cli():
            return subprocess.Popen(JOURNALFS + ["records", "-f", "--json", str(src / "jobs")],
                                    stdout=subprocess.PIPE, text=True, env=env)
        out.append({"case": "journalfs records -f", **latencies(cli, seg, appends, interval)})
        with mounted(src, Path(tmp) / "mnt", "--store", str(Path(tmp) / "store")) as m:
            jsonl = m.mountpoint / ".journalfs" / "records" / seg.name / "records.jsonl"
            for poll in (None, "0.1"):
                def tail(poll=poll):
                    argv = ["tail", "-f", "-n", "+1", *(["-s", poll] if poll else []),
                            str(jsonl)]
                    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                seg.unlink()
                name = "tail -f records.jsonl" + (f" -s {poll}" if poll else " (1 s polls)")
                out.append({"case": name, **latencies(tail, seg, max(20, appends // 4)
                                                      if poll is None else appends, interval)})
    return out


def big_jsonl(mb: int) -> list[dict]:
    """On a mount of the --mb MB journal's directory (a fresh store): the time from the first
    stat of its records.jsonl until its size shows (indexing, then measuring every line in the
    background), then `tail -n 10` of it (seeks to the end), and the same after a remount
    (index and size loaded from the store)."""
    path, count = bigjournal.journal("kestrel-writer", mb)
    out = []
    with tempfile.TemporaryDirectory(prefix="jfs-bench-bigjsonl-") as tmp:
        store = Path(tmp) / "store"
        for run in ("first mount", "after a remount"):
            with mounted(path.parent, Path(tmp) / "mnt", "--store", str(store)) as m:
                jsonl = m.mountpoint / ".journalfs" / "records" / path.name / "records.jsonl"
                t = time.perf_counter()
                while os.stat(jsonl).st_size == 0:
                    time.sleep(0.05)
                shown = time.perf_counter() - t
                t = time.perf_counter()
                last = subprocess.run(["tail", "-n", "10", str(jsonl)], capture_output=True,
                                      check=True).stdout.splitlines()
                tail_s = time.perf_counter() - t
                assert json.loads(last[-1])["seq"] == count - 1, last[-1]
                out.append({"case": f"records.jsonl of {mb} MB, {run}",
                            "size_shown_s": round(shown, 2), "tail_n10_s": round(tail_s, 3),
                            "records": count})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--appends", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--skip-mount", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # as installed (pip compiles bytecode): without it every run compiles journalfs again
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    load_before = os.getloadavg()
    sel = selections(args.mb, env, args.warm)
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {os.getloadavg()}")
    print(f"{'selection':<46} {'first (s)':>10} {'warm (s)':>10}")
    for row in sel:
        first = "-" if row["first_s"] is None else f"{row['first_s']:.3f}"
        print(f"{row['case']:<46} {first:>10} {row['warm_s']:>10.3f}")
    fol = [] if args.skip_mount else follow(args.appends, args.interval, env)
    big = [] if args.skip_mount else big_jsonl(args.mb)
    if big:
        print(f"\n{'mount, big records.jsonl':<40} {'size shown (s)':>15} {'tail -n 10 (s)':>15}")
        for row in big:
            print(f"{row['case']:<40} {row['size_shown_s']:>15} {row['tail_n10_s']:>15}")
    if fol:
        print(f"\n{'follow latency':<40} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for row in fol:
            print(f"{row['case']:<40} {row['p50_ms']:>8} {row['p99_ms']:>8} {row['max_ms']:>8}")
    print(json.dumps({"selections": sel, "follow": fol, "big_jsonl": big, "load_before": load_before,
                      "load_after": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
