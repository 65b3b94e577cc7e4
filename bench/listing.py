"""Directory listing through the mount: `ls -U`, `ls` and `ls -l` of one N-entry directory on
native, bindfs and journalfs, in rotating rounds.

    sudo .venv/bin/python bench/listing.py [--entries 2000] [--rounds 3] [--workdir DIR]
                                           [--before TREE]

Each cell is the median of the rounds (entries/s; higher is better). For the FUSE daemons it
also gives the READDIR(PLUS) requests of the first listing (so entries per reply) and the
daemon's CPU per request and per entry, counted as bench/fuse.py counts them (schedstat and
the fuse_request_send tracepoint). "cold": a fresh mount with dropped caches; "warm": the same
command right after, the kernel's dentries and attributes still cached. ``--before TREE``
adds a target "journalfs-before": journalfs imported from another source tree (e.g. an
export of an earlier commit), measured in the same rounds.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_fuse", Path(__file__).with_name("fuse.py"))
bench_fuse = sys.modules["bench_fuse"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_fuse)

COMMANDS = {"ls -U": ["ls", "-U"], "ls": ["ls"], "ls -l": ["ls", "-l"]}


class OtherTree(bench_fuse.Target):
    """journalfs as imported from another source tree."""

    def __init__(self, name: str, tree: Path, *args):
        super().__init__(name, *args)
        self.tree = tree

    def command(self, sync, timeout) -> list[str]:
        # python -m imports from the working directory first: run it in the tree
        return ["env", "-C", str(self.tree), f"PYTHONPATH={self.tree}",
                *super().command(sync, timeout)]


def make_directory(folder: Path, count: int) -> None:
    """``count`` empty files named like records (reruns reuse the directory)."""
    if folder.is_dir() and len(os.listdir(folder)) == count:
        return
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir(parents=True)
    for i in range(count):
        os.close(os.open(folder / f"{i:08d}.index", os.O_CREAT | os.O_WRONLY, 0o644))


def list_once(command: list[str], folder: Path) -> tuple[float, int]:
    start = time.perf_counter()
    out = subprocess.run([*command, str(folder)], check=True, capture_output=True).stdout
    return time.perf_counter() - start, out.count(b"\n") - (command[-1] == "-l")


def measure(t, folder_of, count: int, cells: dict) -> None:
    """One round on target ``t``: every command cold (fresh mount) then warm."""
    for name, command in COMMANDS.items():
        t.mount(cold=True)
        try:
            folder = folder_of(t)
            for phase in ("cold", "warm"):
                before = t.sample()
                elapsed, listed = list_once(command, folder)
                after = t.sample()
                if listed != count:
                    raise SystemExit(f"{t.name}: {name} listed {listed} of {count}")
                cell = cells.setdefault(f"{name}, {phase}", {}).setdefault(t.name, {
                    "rate": [], "readdir_requests": [], "requests": [], "cpu_us_request": [],
                    "cpu_us_entry": []})
                cell["rate"].append(count / elapsed)
                if t.fuse and t.counter is not None:
                    requests, readdirs = after[1] - before[1], after[2] - before[2]
                    cpu_us = (after[0] - before[0]) / 1e3
                    cell["requests"].append(requests)
                    cell["readdir_requests"].append(readdirs)
                    cell["cpu_us_request"].append(cpu_us / max(1, requests))
                    cell["cpu_us_entry"].append(cpu_us / count)
        finally:
            t.unmount()


def table(cells: dict, names: list[str], count: int) -> str:
    med = statistics.median
    daemons = [n for n in names if n != "native"]
    lines = [f"| {count:,} entries | " + " | ".join(names) + " | journalfs ÷ bindfs | "
             f"READDIR(PLUS) requests: {' / '.join(daemons)} | daemon CPU µs per request: "
             f"{' / '.join(daemons)} | daemon CPU µs per entry: {' / '.join(daemons[1:])} |",
             "|---" * (len(names) + 5) + "|"]
    for row, by in cells.items():
        rates = {n: med(by[n]["rate"]) for n in names if n in by}
        ratio = rates.get("journalfs", 0) / rates["bindfs"] if rates.get("bindfs") else None

        def fuse_figure(key, fmt="{:.0f}", who=("bindfs", "journalfs")):
            return " / ".join(fmt.format(med(by[n][key])) if by.get(n, {}).get(key) else "-"
                              for n in who)
        lines.append(f"| {row} | " + " | ".join(f"{rates[n]:,.0f}" if n in rates else "-"
                                                 for n in names)
                     + f" | {'-' if ratio is None else f'{ratio:.2f}'}"
                     + f" | {fuse_figure('readdir_requests', who=daemons)}"
                     + f" | {fuse_figure('cpu_us_request', who=daemons)}"
                     + f" | {fuse_figure('cpu_us_entry', '{:.1f}', daemons[1:])} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-bench-listing"))
    ap.add_argument("--only", default="native,bindfs,journalfs")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--before", type=Path, help="also measure journalfs from this tree")
    args = ap.parse_args()
    work = args.workdir.resolve()
    src = work / "src"
    make_directory(src / "dir", args.entries)
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    targets = {
        "native": bench_fuse.Target("native", src, None),
        "bindfs": bench_fuse.Target("bindfs", src, work / "mnt-bindfs"),
        "journalfs": bench_fuse.Target("journalfs", src, work / "mnt-journalfs", store),
    }
    names = args.only.split(",")
    if args.before:
        targets["journalfs-before"] = OtherTree("journalfs-before", args.before.resolve(), src,
                                                work / "mnt-before", work / "store-before")
        (work / "store-before").mkdir(exist_ok=True)
        names.append("journalfs-before")
    order = [targets[n] for n in names]
    cells: dict = {}
    started = time.time()
    for rnd in range(args.rounds):
        for t in order[rnd % len(order):] + order[:rnd % len(order)]:
            print(f"round {rnd + 1}/{args.rounds}: {t.name}", file=sys.stderr, flush=True)
            measure(t, lambda t: t.root / "dir", args.entries, cells)
    text = table(cells, names, args.entries)
    print(text)
    meta = {"entries": args.entries, "rounds": args.rounds, "kernel": os.uname().release,
            "loadavg_end": os.getloadavg(), "seconds": round(time.time() - started),
            "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
