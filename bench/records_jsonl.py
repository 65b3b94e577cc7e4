"""records.jsonl bench: stream a big journal's records.jsonl through a real mount with dd.

    .venv/bin/python bench/records_jsonl.py [--mb 1000] [--passes 2] [--code DIR]
                                            [--formats kestrel-writer,wallaby-log,...]

For each format (default kestrel-writer), mounts the directory of the generated ~--mb MB
journal of bench/bigjournal.py (made once, cached in bench/out/bigjournal/) with ``journalfs mount`` (the code in --code, default
this tree) and reads MNT/.journalfs/records/<j>/records.jsonl with ``dd bs=1M`` --passes
times: the first pass also indexes the journal (its records.jsonl has size 0 until read once),
later ones stream a known layout. Meanwhile another thread stats and reads one record file of
the same journal every 0.2 s: the longest of those waits shows whether other requests wait
behind the rendering. Per pass: MB/s (wall clock), the daemon's CPU seconds and MB/s per CPU
second, its peak RSS; then a JSON blob.
"""
from __future__ import annotations

import argparse
import json
import os
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


def daemon_cpu_and_peak(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, peak RSS in MB) of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    return cpu, peak


def read_passes(view: Path, passes: int, pid: int, kind: str) -> list[dict]:
    results = []
    record = view / f"00000005.{kind}"
    with os.scandir(view) as entries:  # kinds vary per record in some formats (kestrel-reader)
        for entry in entries:
            if entry.name.startswith("00000005."):
                record = view / entry.name
                break
    for _ in range(passes):
        stop, waits = threading.Event(), []

        def probe():
            while not stop.is_set():
                t = time.monotonic()
                os.stat(record)
                record.read_bytes()
                waits.append(time.monotonic() - t)
                stop.wait(0.2)
        prober = threading.Thread(target=probe)
        cpu0, _ = daemon_cpu_and_peak(pid)
        prober.start()
        t0 = time.monotonic()
        dd = subprocess.run(["dd", f"if={view / 'records.jsonl'}", "of=/dev/null", "bs=1M"],
                            capture_output=True, text=True, check=True)
        seconds = time.monotonic() - t0
        stop.set()
        prober.join()
        total = int(dd.stderr.strip().splitlines()[-1].split()[0])
        cpu, peak = daemon_cpu_and_peak(pid)
        results.append({"bytes": total, "seconds": seconds, "mb_s": total / seconds / 1e6,
                        "daemon_cpu_s": cpu - cpu0, "mb_per_cpu_s": total / (cpu - cpu0) / 1e6,
                        "daemon_peak_rss_mb": peak, "other_request_max_ms": max(waits) * 1e3,
                        "load": os.getloadavg()[0]})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--code", default=str(REPO), help="the journalfs tree to mount with")
    parser.add_argument("--formats", default="kestrel-writer",
                        help="comma-separated formats of bench/bigjournal.py")
    args = parser.parse_args()
    code = str(Path(args.code).resolve())
    env = dict(os.environ, PYTHONPATH=code)
    report = []
    for fmt in [f for f in args.formats.split(",") if f]:
        path, count = bigjournal.journal(fmt, args.mb)
        kind = bigjournal.GENERATORS[fmt][2]
        cwd = os.getcwd()
        os.chdir(code)  # `python -m journalfs.cli` imports from the current directory first
        try:
            with tempfile.TemporaryDirectory(prefix="records-jsonl-") as work:
                with mounted(path.parent, Path(work) / "mnt", "--store",
                             str(Path(work) / "store"), env=env) as mount:
                    results = read_passes(mount.mountpoint / ".journalfs" / "records"
                                          / path.name, args.passes, mount.pid, kind)
        finally:
            os.chdir(cwd)
        report.append({"format": fmt, "bytes": path.stat().st_size, "records": count,
                       "passes": results})
    print(f"records.jsonl through the mount (code: {code})")
    print(f"{'format':<15}{'pass':>4}{'MB':>7}{'s':>8}{'MB/s':>7}{'CPU s':>8}{'MB/CPU s':>9}"
          f"{'RSS MB':>8}{'other max ms':>13}{'load':>6}")
    for entry in report:
        for i, r in enumerate(entry["passes"]):
            print(f"{entry['format']:<15}{i:>4}{r['bytes'] / 1e6:>7.0f}{r['seconds']:>8.1f}"
                  f"{r['mb_s']:>7.0f}{r['daemon_cpu_s']:>8.1f}{r['mb_per_cpu_s']:>9.0f}"
                  f"{r['daemon_peak_rss_mb']:>8.0f}{r['other_request_max_ms']:>13.0f}"
                  f"{r['load']:>6.1f}")
    print(json.dumps({"benchmark": "records_jsonl", "code": code, "journals": report},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
