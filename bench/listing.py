"""Directory listing through the mount: `ls -U`, `ls` and `ls -l` of one N-entry directory on
native, bindfs and journalfs, in rotating rounds.

    sudo .venv/bin/python bench/listing.py [--entries 2000] [--rounds 3] [--workdir DIR]
                                           [--before TREE] [--view] [--image]
                                           [--commands "ls -U,ls"] [--phases cold,warm]
                                           [--struct-writes]

Each cell is the median of the rounds (entries/s; higher is better). For the FUSE daemons it
also gives the READDIR(PLUS) requests of the first listing (so entries per reply) and the
daemon's CPU per request and per entry, counted as bench/fuse.py counts them (schedstat and
the fuse_request_send tracepoint). "cold": a fresh mount with dropped caches; "warm": the same
command right after, the kernel's dentries and attributes still cached. ``--before TREE``
adds a target "journalfs-before": journalfs imported from another source tree (e.g. an
export of an earlier commit), measured in the same rounds.

``--view``: journalfs (and journalfs-before) list the view of a Wallaby index journal of N
records (``.journalfs/records/LOG.idx``: ``records.jsonl`` and N files named
``<seq as 8 digits>.index``) while native and bindfs list the real directory of N empty files
named the same way: a big view side by side with a real directory of that size. The
journal's index is built once before the rounds (it is then read from the store).

``--struct-writes``: journalfs also with its writes into pyfuse3's objects off, in the same
rounds: "journalfs-structs-names" (no reply blocks of fs/direntries.py) and
"journalfs-structs-off" (no name-only entries of fs/dirlist.py either): what they buy.

``--relist N [--memcg MIB]``: only journalfs, a directory of ENTRIES listed once, then N
more times by one `os.listdir` each, from a process in a memory cgroup (v1 or v2) of MIB
MiB when given: per listing the READDIR(PLUS) requests and the daemon's CPU. With room the
kernel keeps the entries' inodes (64 entries a reply); under memory pressure its reclaim
frees them between listings and sends FORGETs, and each listing builds them again, 8 new
inodes a reply (docs/views.md, "When the kernel forgets what a listing made").

``--image``: the real directory is made in an ext4 image (a sparse file in WORKDIR,
loop-mounted; ``large_dir`` so that one directory can hold 12M names) by a small C program
compiled at bench time (7,300-18,000 files/s here, with the load; the Python loop of
make_directory made 1M files in 147-220 s). The
image is unmounted and deleted at the end unless ``--keep-image``; a kept image is reused.
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


class StructWrites(bench_fuse.Target):
    """journalfs with JOURNALFS_STRUCT_WRITES set: its writes into pyfuse3's objects
    (fs/dirlist.py, fs/direntries.py) partly ("names") or wholly ("off") turned off."""

    def __init__(self, mode: str, *args):
        super().__init__(f"journalfs-structs-{mode}", *args)
        self.mode = mode

    def command(self, sync, timeout) -> list[str]:
        return ["env", f"JOURNALFS_STRUCT_WRITES={self.mode}", *super().command(sync, timeout)]


MAKE_FILES_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* make_files DIR FIRST COUNT: empty files FIRST.. named like records (%08ld.index) */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    long first = atol(argv[2]), count = atol(argv[3]);
    char name[32];
    if (dir < 0) { perror(argv[1]); return 1; }
    for (long i = first; i < first + count; i++) {
        snprintf(name, sizeof name, "%08ld.index", i);
        int fd = openat(dir, name, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) { perror(name); return 1; }
        close(fd);
    }
    return 0;
}
"""


def file_count(folder: Path) -> int:
    with os.scandir(folder) as it:
        return sum(1 for _ in it)


def make_image_directory(work: Path, count: int) -> Path:
    """``count`` empty files named like records in WORK/image/dir, an ext4 image mounted on
    WORK/image (made, or reused when it already holds exactly that)."""
    image, mnt = work / "real.img", work / "image"
    folder = mnt / "dir"
    mnt.mkdir(parents=True, exist_ok=True)
    if image.exists() and not os.path.ismount(mnt):
        subprocess.run(["mount", "-o", "loop,noatime", str(image), str(mnt)], check=True)
    if folder.is_dir() and file_count(folder) == count:
        return folder
    remove_image(work)
    mnt.mkdir(parents=True, exist_ok=True)
    # 128-byte inodes and no journal: creation is bounded by the inode writes
    subprocess.run(["truncate", "-s", f"{max(1, count * 640 // 10**9 + 1)}G", str(image)],
                   check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-I", "128", "-N",
                    str(count + 100_000), "-O", "large_dir,^has_journal,^metadata_csum",
                    "-E", "lazy_itable_init=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop,noatime", str(image), str(mnt)], check=True)
    folder.mkdir()
    tool = work / "make_files"
    (work / "make_files.c").write_text(MAKE_FILES_C)
    subprocess.run(["gcc", "-O2", "-o", str(tool), str(work / "make_files.c")], check=True)
    started = time.perf_counter()
    subprocess.run([str(tool), str(folder), "0", str(count)], check=True)
    print(f"made {count:,} files in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return folder


def remove_image(work: Path) -> None:
    """Unmount (by mountpoint) and delete the image of make_image_directory."""
    mnt = work / "image"
    if os.path.ismount(mnt):
        subprocess.run(["umount", str(mnt)], check=True)
    (work / "real.img").unlink(missing_ok=True)


def make_view_source(src: Path, count: int) -> Path:
    """SOURCE for journalfs with one Wallaby index journal of ``count`` records."""
    journal = src / "LOG.idx"
    size = 16 + 24 * count  # header + 24 bytes a record (checked below)
    if not (journal.exists() and journal.stat().st_size == size):
        sys.path.insert(0, str(bench_fuse.REPO))
        from journalfs.demo import big_wallaby_index
        src.mkdir(parents=True, exist_ok=True)
        data = big_wallaby_index(count)
        if len(data) != size:
            raise SystemExit(f"unexpected Wallaby index size {len(data)} for {count} records")
        journal.write_bytes(data)
    return journal


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


def measure(t, folder_of, count: int, cells: dict, commands=COMMANDS,
            phases=("cold", "warm")) -> None:
    """One round on target ``t``: every command cold (fresh mount) then warm."""
    for name, command in commands.items():
        t.mount(cold=True)
        try:
            folder, count = folder_of(t)
            for phase in phases:
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
    mine = [n for n in names if n.startswith("journalfs")]
    lines = [f"| {count:,} entries (entries/s) | " + " | ".join(names) + " | "
             + " | ".join(f"{n} ÷ bindfs" for n in mine) + " | "
             f"READDIR(PLUS) requests: {' / '.join(daemons)} | daemon CPU µs per request: "
             f"{' / '.join(daemons)} | daemon CPU µs per entry: {' / '.join(daemons)} |",
             "|---" * (len(names) + len(mine) + 4) + "|"]
    for row, by in cells.items():
        rates = {n: med(by[n]["rate"]) for n in names if n in by}
        ratios = [rates[n] / rates["bindfs"] if rates.get("bindfs") and n in rates else None
                  for n in mine]

        def fuse_figure(key, fmt="{:.0f}", who=daemons):
            return " / ".join(fmt.format(med(by[n][key])) if by.get(n, {}).get(key) else "-"
                              for n in who)
        lines.append(f"| {row} | " + " | ".join(f"{rates[n]:,.0f}" if n in rates else "-"
                                                 for n in names)
                     + "".join(f" | {'-' if r is None else f'{r:.2f}'}" for r in ratios)
                     + f" | {fuse_figure('readdir_requests')}"
                     + f" | {fuse_figure('cpu_us_request')}"
                     + f" | {fuse_figure('cpu_us_entry', '{:.2f}')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-bench-listing"))
    ap.add_argument("--only", default="native,bindfs,journalfs")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--before", type=Path, help="also measure journalfs from this tree")
    ap.add_argument("--view", action="store_true",
                    help="journalfs lists a view of N records, the others N real files")
    ap.add_argument("--image", action="store_true",
                    help="make the real files in a loop-mounted ext4 image (for millions)")
    ap.add_argument("--keep-image", action="store_true")
    ap.add_argument("--struct-writes", action="store_true",
                    help="also journalfs with JOURNALFS_STRUCT_WRITES=names and =off")
    ap.add_argument("--relist", type=int, metavar="N",
                    help="only journalfs: list the directory N more times, per listing figures")
    ap.add_argument("--memcg", type=int, metavar="MIB",
                    help="--relist: the listing process in a memory cgroup of MIB MiB")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--phases", default="cold,warm")
    args = ap.parse_args()
    work = args.workdir.resolve()
    commands = {name: COMMANDS[name] for name in args.commands.split(",")}
    phases = tuple(args.phases.split(","))
    try:
        if args.relist:
            return relist(args, work)
        return run(args, work, commands, phases)
    finally:
        if args.image and not args.keep_image:
            remove_image(work)


LISTER = "import os, sys\nos.listdir(sys.argv[1])"


def memory_cgroup(name: str, mib: int) -> Path:
    """A memory cgroup of ``mib`` MiB (v2 if mounted with its memory controller, else v1)."""
    for top, limit in ((Path("/sys/fs/cgroup"), "memory.max"),
                       (Path("/sys/fs/cgroup/unified"), "memory.max"),
                       (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes")):
        controllers = top / "cgroup.controllers"
        if limit == "memory.max" and not (controllers.exists()
                                          and "memory" in controllers.read_text().split()):
            continue
        if (top / "cgroup.procs").exists():
            group = top / name
            group.mkdir(exist_ok=True)
            (group / limit).write_text(str(mib << 20))
            return group
    raise SystemExit("no memory cgroup controller mounted")


def relist(args, work: Path) -> int:
    src = work / "src"
    make_directory(src / "dir", args.entries)
    (work / "store").mkdir(parents=True, exist_ok=True)
    t = bench_fuse.Target("journalfs", src, work / "mnt-journalfs", work / "store")
    group = memory_cgroup(f"journalfs-bench-listing-{os.getpid()}", args.memcg) \
        if args.memcg else None
    rows = []
    t.mount(cold=False)
    try:
        for n in range(args.relist + 1):
            before = t.sample()
            command = [sys.executable, "-c", LISTER, str(t.root / "dir")]
            if group is not None:  # the lister's dentries and inodes are charged to the group
                command = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh",
                           *command]
            subprocess.run(command, check=True)
            after = t.sample()
            rows.append({"listing": n, "readdir_requests": after[2] - before[2],
                         "daemon_cpu_s": round((after[0] - before[0]) / 1e9, 3)})
    finally:
        t.unmount()
        if group is not None:
            group.rmdir()
    print(f"| listing of {args.entries:,} entries"
          f"{f' (memory cgroup {args.memcg} MiB)' if args.memcg else ''} "
          "| READDIR(PLUS) requests | daemon CPU s |\n|---|---|---|")
    for row in rows:
        print(f"| {'first' if not row['listing'] else row['listing']} "
              f"| {row['readdir_requests']:,} | {row['daemon_cpu_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"entries": args.entries, "memcg_mib": args.memcg,
                                         "kernel": os.uname().release, "listings": rows},
                                        indent=1) + "\n")
    return 0


def run(args, work: Path, commands: dict, phases: tuple) -> int:
    if args.image:
        real = make_image_directory(work, args.entries)
        src = real.parent
    else:
        src = work / "src"
        make_directory(src / "dir", args.entries)
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    view_src = work / "view-src"
    if args.view:
        make_view_source(view_src, args.entries)
    fs_src = view_src if args.view else src
    targets = {
        "native": bench_fuse.Target("native", src, None),
        "bindfs": bench_fuse.Target("bindfs", src, work / "mnt-bindfs"),
        "journalfs": bench_fuse.Target("journalfs", fs_src, work / "mnt-journalfs", store),
    }
    # each target once, whether --only names it too or not (it was measured and shown twice)
    names = list(dict.fromkeys(args.only.split(",")))
    if args.before:
        # the other tree's journalfs first on PYTHONPATH, run from "/" (as bench/fuse.py --tree)
        targets["journalfs-before"] = bench_fuse.Target(
            "journalfs-before", fs_src, work / "mnt-before", work / "store-before",
            tree=args.before.resolve())
        (work / "store-before").mkdir(exist_ok=True)
        names = [n for n in names if n != "journalfs-before"] + ["journalfs-before"]
    if args.struct_writes:
        for mode in ("names", "off"):
            t = StructWrites(mode, fs_src, work / f"mnt-{mode}", work / f"store-{mode}")
            (work / f"store-{mode}").mkdir(exist_ok=True)
            targets[t.name] = t
            names = [n for n in names if n != t.name] + [t.name]
    unknown = [n for n in names if n not in targets]
    if unknown:
        raise SystemExit(f"--only: no target {', '.join(unknown)} (journalfs-before needs "
                         "--before, journalfs-structs-* --struct-writes)")
    order = [targets[n] for n in names]

    def folder_of(t) -> tuple[Path, int]:
        if args.view and t.name.startswith("journalfs"):  # records.jsonl is listed too
            return t.root / ".journalfs" / "records" / "LOG.idx", args.entries + 1
        return t.root / "dir", args.entries

    if args.view:  # each journalfs builds its index once, into its store, before timing
        for t in order:
            if t.name.startswith("journalfs"):
                t.mount(cold=False)
                try:
                    started = time.perf_counter()
                    list_once(["ls", "-U"], folder_of(t)[0])
                    print(f"{t.name}: first listing (indexing) "
                          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
                finally:
                    t.unmount()
    cells: dict = {}
    started = time.time()
    for rnd in range(args.rounds):
        for t in order[rnd % len(order):] + order[:rnd % len(order)]:
            print(f"round {rnd + 1}/{args.rounds}: {t.name}", file=sys.stderr, flush=True)
            measure(t, folder_of, args.entries, cells, commands, phases)
    text = table(cells, names, args.entries)
    print(text)
    meta = {"entries": args.entries, "rounds": args.rounds, "kernel": os.uname().release,
            "view": args.view, "image": args.image,
            "loadavg_end": os.getloadavg(), "seconds": round(time.time() - started),
            "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
