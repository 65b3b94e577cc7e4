"""FUSE benchmark: the same workloads on the native SOURCE directory, on bindfs (a C FUSE
passthrough, the baseline for "what FUSE costs") and on journalfs, in one interleaved run.

    sudo .venv/bin/python bench/fuse.py [--rounds 3] [--files 10000] [--big-mib 1024]
                                        [--workdir DIR] [--only native,bindfs,journalfs,floor]
                                        [--view-records 200000] [--view-ls-l-records 20000]
                                        [--rows NAME,...] [--list-rows] [--json FILE]

Every round measures every target once, in a rotating order, so slow phases of a busy
machine spread over all of them; each figure is the median of the rounds, with the spread
(min..max) beside it. Every workload is run by the same client code on every tree. Metadata
is the xattr `user.bench` on native/bindfs and `user.metadata.bench` (the journalfs store)
on journalfs. "Cold" means a fresh mount and dropped page/dentry caches.

For the FUSE daemons the bench also reports CPU time per request: the daemon's CPU time (sum
of /proc/PID/task/*/schedstat, i.e. utime+stime of every thread at ns resolution) divided by
the requests the kernel sent it (the fuse:fuse_request_send tracepoint, counted in a private
tracefs instance filtered to the mount's connection). Wall-clock rates swing with the other
load on a shared machine; CPU per request does not.

`floor` is a minimal pyfuse3 filesystem (this file, --serve-floor) answering lookup, getattr,
readdir and the xattr calls from dicts, and serving file data, creation and renames outside
its dicts as a bare passthrough (one syscall per request, no checks): pyfuse3's own cost per
request (its `cat` rows read the plain files that hold the record files' bytes, its view rows
list the same-size directory bindfs lists). It runs every row but the staleness row and the
first listing of a view (the output says which and why). The CPU rows, which journalfs also
runs with `-o timeout=0` (so every stat is a request), it runs too. Its rate beside bindfs's
(`floor/bindfs`) is the bound pyfuse3 itself puts on a row; `jfs/floor` (rate) and
`jfs/floor CPU` (daemon CPU per request) are what journalfs adds on top of it.

View rows (`--view-records N`, 0 for none; `--view-ls-l-records M`; `--view-rows-only`):
`ls -U`, `ls -f` (N) and `ls -l` (M) of the view of a Wallaby index journal of N (M)
records, `.journalfs/records/view-N.idx` (its records and records.jsonl), on journalfs;
of a real directory of as many empty files named like the records on the others. "cold" is
the first listing after a fresh mount with dropped caches, "warm" the same again; the first
listing of all (the journal indexed into the new store) is its own row.

Every row has a short name (`--list-rows`); `--rows NAME,...` (names or shell patterns,
`--rows 'fio-*,readdir'`) runs just those, still every target in interleaved rounds, and
builds only the parts of SOURCE they read; a warm row brings its cold row along, unrecorded.
`--cpu-rows-only` is `--rows 'cpu-*'` (the CPU rows plus fsetxattr, FUSE targets only),
`--view-rows-only` is `--rows 'view-*'`. `--tree NAME=DIR` adds journalfs from another
checkout as target `journalfs-NAME`, so two branches are measured side by side in one run:

    .venv/bin/python bench/fuse.py --rows 'cpu-*,readdir' --rounds 3 --files 2000 \
        --tree main=/work/main --only journalfs,journalfs-main,floor

Every row starts from a settled daemon: a row's set-up and clean-up (files made or removed
in SOURCE or through the mount, xattrs set for it) run outside its clock and CPU counters,
and before the clock starts the bench waits until the daemon's CPU time has stopped moving
(< 1 ms over 0.2 s; the same for every FUSE target), so no row pays for work an earlier row
left (the SOURCE watcher applying `500 x mv`'s clean-up, a batch sync). The JSON has the
wait per row and target (`settle_s`).

Rows whose requests each carry many names (the listings: readdir, `ls -l`, the view rows;
`getfattr -R`, per file) count daemon CPU per entry (file), not per request: a READDIRPLUS
reply holds anything from one entry to the whole kernel buffer, so per request would
compare reply sizes, not work. The table says the unit ("CPU µs per"); `jfs/floor CPU` uses
it; the JSON keeps the per-request figures too (`cpu_us_per_request`, `cpu_unit`,
`cpu_us_per_unit`, `cpu_ratios_per_request`).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import glob
import json
import multiprocessing
import os
import resource
import shutil
import stat
import statistics
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ_CHUNK = 1 << 20
RECORD_PAYLOAD = 64
TRACEFS = Path("/sys/kernel/tracing")
FUSE_READDIR, FUSE_READDIRPLUS = 28, 44
STALE_CAP = 5.0  # seconds the staleness row waits before reporting "more than this"


# ---------------------------------------------------------------- source tree

def wallaby_log(n_records: int) -> bytes:
    """A wallaby LOG file (16-byte header, then u32 size, u32 flags, i64 time ns, payload)."""
    header = b"LOG" + bytes([1]) + struct.pack("<Iq", 0, 0)
    start_ns = 1_700_000_000 * 10**9
    parts = [header]
    for i in range(n_records):
        payload = (b"record %08d " % i).ljust(RECORD_PAYLOAD, b".")
        parts.append(struct.pack("<IIq", len(payload), 0, start_ns + i) + payload)
    return b"".join(parts)


def _fill(folder: Path, count: int, make) -> None:
    if folder.is_dir() and len(os.listdir(folder)) == count:
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(count):
        make(folder, i)


#: The parts of SOURCE beyond files/ that rows read (build_source makes only those of the
#: chosen rows).
SOURCE_PARTS = {
    "ls2000": ("ls-l-cold", "ls-l-warm", "setfattr-500"),
    "tree5005": ("getfattr-r",),
    "records": ("cat-cold", "cat-warm"),
    "big.bin": ("fio-randread", "seq-read-cold", "seq-reread", "fio-seqread"),
    "rand.bin": ("fio-randwrite",),
}


LS_ENTRIES = 2000  # ls2000/: the `ls -l` rows' directory


def build_source(src: Path, n_files: int, big_mib: int,
                 parts: set[str] = set(SOURCE_PARTS)) -> None:
    """Create the tree (files/ and ``parts``) once; reruns reuse what is already there."""
    _fill(src / "files", n_files, lambda d, i: (d / f"f{i:05d}").write_bytes(b"x" * 100))
    if "records" in parts:
        _fill(src / "small", n_files, lambda d, i: (d / f"r{i:05d}").write_bytes(
            (b"record %08d " % i).ljust(RECORD_PAYLOAD, b".")))
    if "ls2000" in parts:
        _fill(src / "ls2000", LS_ENTRIES, lambda d, i: (d / f"entry-{i:05d}.txt").write_bytes(b"l" * 10))
    tree = src / "tree5005"  # getfattr -R: 5 directories of 1,001 files
    if "tree5005" in parts and (
            not tree.is_dir() or sum(len(os.listdir(d)) for d in tree.iterdir()) != 5005):
        shutil.rmtree(tree, ignore_errors=True)
        for d in range(5):
            _fill(tree / f"d{d}", 1001, lambda f, i: (f / f"g{i:04d}").write_bytes(b"g"))
    log = src / "logs" / "bench.log"
    if "records" in parts and (
            not log.exists() or log.stat().st_size != 16 + n_files * (16 + RECORD_PAYLOAD)):
        log.parent.mkdir(exist_ok=True)
        log.write_bytes(wallaby_log(n_files))
    big = src / "big.bin"
    if "big.bin" in parts and (not big.exists() or big.stat().st_size != big_mib << 20):
        block = os.urandom(READ_CHUNK)
        with open(big, "wb") as out:
            for _ in range(big_mib):
                out.write(block)
            os.fsync(out.fileno())
    rnd = src / "rand.bin"  # fio random writes go here, not into big.bin
    if "rand.bin" in parts and (not rnd.exists() or rnd.stat().st_size != 256 << 20):
        with open(rnd, "wb") as out:
            out.truncate(256 << 20)
            out.write(os.urandom(256 << 20))
            os.fsync(out.fileno())


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- measuring the daemons

def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far (ns; first field of schedstat)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(Path(path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total


class RequestCounter:
    """Counts FUSE requests the kernel sends one connection (optionally of some opcodes)
    with the fuse_request_send tracepoint in a private tracefs instance: the ring buffer's
    per-CPU entries+overrun counts every event, whatever the buffer size."""

    _serial = 0

    def __init__(self, connection: int, opcodes: tuple[int, ...] = ()):
        RequestCounter._serial += 1
        self.dir = TRACEFS / "instances" / f"journalfs-bench-{os.getpid()}-{self._serial}"
        self.dir.mkdir()
        (self.dir / "buffer_size_kb").write_text("16")
        event = self.dir / "events" / "fuse" / "fuse_request_send"
        cond = f"connection == {connection}"
        if opcodes:
            cond += " && (" + " || ".join(f"opcode == {op}" for op in opcodes) + ")"
        (event / "filter").write_text(cond)
        (event / "enable").write_text("1")

    def count(self) -> int:
        total = 0
        for stats in glob.glob(str(self.dir / "per_cpu" / "cpu*" / "stats")):
            for line in Path(stats).read_text().splitlines():
                if line.startswith(("entries:", "overrun:")):
                    total += int(line.split()[1])
        return total

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.dir / "events" / "fuse" / "fuse_request_send" / "enable").write_text("0")
            self.dir.rmdir()

    @staticmethod
    def available() -> bool:
        if not (TRACEFS / "events").is_dir():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)],
                           capture_output=True)
        return (TRACEFS / "events" / "fuse" / "fuse_request_send").is_dir()


# ---------------------------------------------------------------- targets

class Target:
    """A tree to run workloads on. FUSE targets are served by a foreground child process
    (its pid is the daemon) and mounted fresh by ``mount``."""

    def __init__(self, name: str, src: Path, mnt: Path | None, store: Path | None = None,
                 extra: list[str] | None = None, tree: Path | None = None):
        self.name, self.src, self.mnt, self.store = name, src, mnt, store
        self.extra = extra or []
        self.tree = tree  # another checkout whose journalfs this target runs
        self.proc: subprocess.Popen | None = None
        self.counter: RequestCounter | None = None
        self.readdirs: RequestCounter | None = None
        self.floor_dirs: tuple[str, ...] = FLOOR_DIRS  # what the floor serves (view rows: more)
        self.indexed: set[int] = set()  # view rows: journals of this many records indexed
        self.valued = 0  # files/'s first this many files have the bench's xattr (ensure_values)

    @property
    def fuse(self) -> bool:
        return self.mnt is not None

    @property
    def root(self) -> Path:
        return self.mnt or self.src

    @property
    def xattr(self) -> str:
        return "user.metadata.bench" if self.name.startswith(("journalfs", "floor")) else "user.bench"

    def command(self, sync: str | None, timeout: float | None) -> list[str]:
        if self.name == "bindfs":
            opts = [] if timeout is None else ["-o", f"entry_timeout={timeout},attr_timeout={timeout}"]
            return ["bindfs", "-f", *opts, str(self.src), str(self.mnt)]
        if self.name == "floor":
            return [sys.executable, __file__, "--serve-floor", str(self.src), str(self.mnt),
                    "--floor-timeout", str(120 if timeout is None else timeout),
                    "--floor-dirs", ",".join(self.floor_dirs)]
        opts = [] if timeout is None else ["-o", f"timeout={timeout}"]
        return [sys.executable, "-m", "journalfs.cli", "mount", "--foreground", str(self.src),
                str(self.mnt), "--store", str(self.store), *self.extra, *opts,
                *([f"--sync={sync}"] if sync else [])]

    def mount(self, sync: str | None = None, timeout: float | None = None, cold: bool = True):
        self.unmount()
        if cold:
            drop_caches()
        if not self.fuse:
            return
        self.mnt.mkdir(parents=True, exist_ok=True)
        # a PYTHONPATH given to the bench comes first: it can measure another tree's journalfs
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [self.tree and str(self.tree), os.environ.get("PYTHONPATH"), str(REPO)])))
        # cwd "/": `python -m` puts its working directory first on sys.path, which from a
        # checkout would run that checkout's journalfs for every --tree target
        self.proc = subprocess.Popen(self.command(sync, timeout), env=env, cwd="/",
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{self.name} did not mount: {self.proc.stderr.read()!r}")
            time.sleep(0.02)
        os.stat(self.mnt)  # INIT answered
        connection = os.minor(os.stat(self.mnt).st_dev)
        if RequestCounter.available():
            self.counter = RequestCounter(connection)
            self.readdirs = RequestCounter(connection, (FUSE_READDIR, FUSE_READDIRPLUS))

    def unmount(self) -> None:
        for counter in (self.counter, self.readdirs):
            if counter is not None:
                counter.close()
        self.counter = self.readdirs = None
        if self.mnt is not None and os.path.ismount(self.mnt):
            for lazy in (False, False, True):
                if subprocess.run(["fusermount3", "-u", *(["-z"] if lazy else []), str(self.mnt)],
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.3)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def sample(self) -> tuple[int, int, int]:
        """(daemon CPU ns, requests, readdir requests) so far."""
        if self.proc is None or self.counter is None:
            return (0, 0, 0)
        return cpu_ns(self.proc.pid), self.counter.count(), self.readdirs.count()

    def record_files(self) -> list[str]:
        if self.name.startswith("journalfs"):
            folder = self.root / ".journalfs" / "records" / "logs" / "bench.log"
            names = sorted(n for n in os.listdir(folder) if n[:8].isdigit())
        else:
            folder = self.root / "small"
            names = sorted(os.listdir(folder))
        return [str(folder / n) for n in names]


# ---------------------------------------------------------------- workloads

def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def file_paths(t: Target, folder: str = "files") -> list[str]:
    return [str(t.root / folder / n) for n in sorted(os.listdir(t.src / folder))]


def stat_all(paths: list[str], repeat: int = 1) -> float:
    def run():
        for _ in range(repeat):
            for p in paths:
                os.stat(p)
    return len(paths) * repeat / timed(run)


def fstat_all(paths: list[str], repeat: int = 3) -> float:
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        def run():
            for _ in range(repeat):
                for fd in fds:
                    os.fstat(fd)
        return len(fds) * repeat / timed(run)
    finally:
        for fd in fds:
            os.close(fd)


def getxattr_all(paths: list[str], name: str, repeat: int = 1) -> float:
    def run():
        for _ in range(repeat):
            for p in paths:
                os.getxattr(p, name)
    return len(paths) * repeat / timed(run)


def setxattr_all(paths: list[str], name: str) -> float:
    def run():
        for i, p in enumerate(paths):
            os.setxattr(p, name, b"value-%d" % i)
    return len(paths) / timed(run)


def fsetxattr_all(fds: list[int], name: str) -> float:
    def run():
        for i, fd in enumerate(fds):
            os.setxattr(fd, name, b"value-%d" % i)
    return len(fds) / timed(run)


def fresh_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # left over by an interrupted run
    folder.mkdir()


def write_new_files(folder: Path, count: int) -> float:
    """Creates ``count`` files of 4 KiB in ``folder`` (made by :func:`fresh_folder`, removed
    by the row's clean-up, both outside the row's clock and CPU counters)."""
    body = b"y" * 4096

    def run():
        for i in range(count):
            fd = os.open(folder / f"c{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, body)
            os.close(fd)
    return count / timed(run)


def create_files(folder: Path, count: int) -> float:
    """The whole create+write row, set-up and clean-up included (bench/writeback.py)."""
    fresh_folder(folder)
    try:
        return write_new_files(folder, count)
    finally:
        shutil.rmtree(folder)


def readdir(folder: Path, repeat: int = 5) -> float:
    entries = 0

    def run():
        nonlocal entries
        for _ in range(repeat):
            entries += len(os.listdir(folder))
    elapsed = timed(run)
    return entries / elapsed


def ls_l(folder: Path, count: int) -> float:
    """`ls -l` (C) of ``folder`` of ``count`` entries: one readdir plus a stat of every
    entry; entries per second. (The count is not listed through the mount: that listing
    would be counted in the row's CPU and fill the kernel's caches before the cold one.)"""
    return count / timed(lambda: subprocess.run(["ls", "-l", str(folder)], check=True,
                                                 stdout=subprocess.DEVNULL))


def sequential_read(path: Path) -> float:
    buf = bytearray(READ_CHUNK)
    total = 0

    def run():
        nonlocal total
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    elapsed = timed(run)
    return total / elapsed / 1e6


def cat_files(paths: list[str], list_file: Path) -> float:
    """`cat` (C) over every file via xargs, so no Python per-file overhead is measured."""
    list_file.write_bytes(b"\0".join(p.encode() for p in paths) + b"\0")
    return len(paths) / timed(lambda: subprocess.run(
        ["xargs", "-0", "-a", str(list_file), "cat"], check=True, stdout=subprocess.DEVNULL))


def _client(args) -> int:
    paths, name, seconds = args
    done, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for p in paths:
            os.stat(p)
            os.getxattr(p, name)
        done += len(paths)
    return done


def parallel_clients(paths: list[str], name: str, clients: int, seconds: float = 2.0) -> float:
    """stat+getxattr pairs per second, ``clients`` processes each on its own slice."""
    slices = [paths[i::clients][:500] for i in range(clients)]
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        start = time.perf_counter()
        done = sum(pool.map(_client, [(s, name, seconds) for s in slices]))
        return done / (time.perf_counter() - start)


def shell(script: str, cwd: Path) -> float:
    """Seconds a bash script takes (the whole command, as a user would run it)."""
    return timed(lambda: subprocess.run(["bash", "-c", script], cwd=cwd, check=True,
                                        stdout=subprocess.DEVNULL))


def mv_dir(t: Target) -> str:
    return f"mv-{t.name}"


def mv_500_setup(t: Target) -> None:
    """500 files made in SOURCE (behind the mount) and listed once through it."""
    d = t.src / mv_dir(t)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for i in range(500):
        (d / f"a{i}").write_bytes(b"m")
    settle(t)  # the watcher has seen them before the listing
    os.listdir(t.root / mv_dir(t))


def rename_500(t: Target) -> float:
    return 500 / shell("for i in $(seq 0 499); do mv a$i b$i; done", t.root / mv_dir(t))


def mv_500(t: Target) -> float:
    """The whole `500 x mv` row, set-up and clean-up included (bench/writeback.py)."""
    mv_500_setup(t)
    try:
        return rename_500(t)
    finally:
        shutil.rmtree(t.src / mv_dir(t))


def setfattr_500(t: Target) -> float:
    d = t.root / "ls2000"
    return 500 / shell(f"for i in $(seq -w 0 499); do setfattr -n {t.xattr} -v v$i "
                       f"entry-00$i.txt; done", d)


TREE_FILES = 5005  # getfattr -R: 5 directories of 1,001 files


def getfattr_tree_setup(t: Target) -> None:
    """Metadata on every file of tree5005 (set once per target, kept after)."""
    tree = t.root / "tree5005"
    for d in sorted(os.listdir(tree)):
        for f in sorted(os.listdir(tree / d))[:1001]:
            p = tree / d / f
            try:
                os.getxattr(p, t.xattr)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
                os.setxattr(p, t.xattr, b"tree")


def getfattr_tree(t: Target) -> float:
    return TREE_FILES / shell("getfattr -R -d -m '^user\\.' . > /dev/null", t.root / "tree5005")


def staleness(t: Target, changes: int = 5) -> float:
    """Milliseconds from an append in SOURCE until a stat through the mount shows the new
    size (median of ``changes``); STALE_CAP s when it never did."""
    src, via = t.src / "stale.txt", t.root / "stale.txt"
    src.write_bytes(b"0")
    deadline = time.monotonic() + STALE_CAP
    while time.monotonic() < deadline and not os.path.exists(via):
        time.sleep(0.001)
    waits = []
    for i in range(changes):
        size = os.stat(via).st_size  # cached by the kernel now
        with open(src, "ab") as f:
            f.write(b"+")
        start = time.monotonic()
        while os.stat(via).st_size == size and time.monotonic() - start < STALE_CAP:
            time.sleep(0.0005)
        waits.append(time.monotonic() - start)
    src.unlink()
    return statistics.median(waits) * 1000


def fio(t: Target, job: list[str], metric: str) -> float:
    out = subprocess.run(["fio", "--output-format=json", "--name=bench", *job],
                         check=True, capture_output=True, text=True).stdout
    res = json.loads(out[out.index("{"):])["jobs"][0]
    if metric == "read_MBps":
        return res["read"]["bw_bytes"] / 1e6
    if metric == "read_iops":
        return res["read"]["iops"]
    if metric == "write_iops":
        return res["write"]["iops"]
    raise ValueError(metric)


def fio_create_dir(t: Target) -> str:
    return f"fio-create-{t.name}"


def fio_create_files(t: Target, count: int = 1000) -> float:
    """fio creating ``count`` files of 4 KiB in the empty directory fio_create_dir(t)."""
    d = t.root / fio_create_dir(t)
    seconds = timed(lambda: subprocess.run(
        ["fio", "--name=create", f"--directory={d}", f"--nrfiles={count}", "--filesize=4k",
         "--bs=4k", "--rw=write", "--create_on_open=1", "--openfiles=1",
         "--file_service_type=sequential", "--fallocate=none", "--output-format=json"],
        check=True, capture_output=True))
    return count / seconds


def fio_create(t: Target, count: int = 1000) -> float:
    """The whole fio file-creation row, set-up and clean-up included (bench/writeback.py)."""
    fresh_folder(t.src / fio_create_dir(t))
    settle(t)
    try:
        return fio_create_files(t, count)
    finally:
        shutil.rmtree(t.src / fio_create_dir(t))


# ---------------------------------------------------------------- rows

#: Every row by a stable short name (``--rows``, ``--list-rows``): name -> the row's title
#: ({N}: --view-records or --view-ls-l-records; view-first is one row per view size).
ROWS = {
    "ls-l-cold": "ls -l 2000 entries, cold",
    "stat-cold": "stat cold",
    "stat-warm": "stat warm",
    "readdir": "readdir (entries/s)",
    "ls-l-warm": "ls -l 2000 entries, warm",
    "setxattr-none": "setxattr (jfs sync=none)",
    "setxattr-batch": "setxattr (default: jfs sync=batch)",
    "getxattr": "getxattr",
    "stat-getxattr-1": "stat+getxattr, 1 client",
    "stat-getxattr-2": "stat+getxattr, 2 clients",
    "stat-getxattr-4": "stat+getxattr, 4 clients",
    "setfattr-500": "500 x setfattr (whole command)",
    "getfattr-r": "getfattr -R, 5,005 files",
    "staleness": "staleness after a SOURCE change",
    "create-write": "create+write 4K+close",
    "mv-500": "500 x mv (whole command)",
    "fio-randread": "fio 4k random read",
    "fio-randwrite": "fio 4k random write, fsync/32",
    "fio-create": "fio creation of 4 KiB files",
    "seq-read-cold": "seq read 1st (cold)",
    "seq-reread": "seq re-read",
    "fio-seqread": "fio seq read 1 GiB, cold",
    "cat-cold": "cat record files cold",
    "cat-warm": "cat record files warm",
    "view-ls-U-cold": "view ls -U, {N} records, cold",
    "view-ls-U-warm": "view ls -U, {N} records, warm",
    "view-ls-f-cold": "view ls -f, {N} records, cold",
    "view-ls-f-warm": "view ls -f, {N} records, warm",
    "view-ls-l-cold": "view ls -l, {N} records, cold",
    "view-ls-l-warm": "view ls -l, {N} records, warm",
    "view-first": "view ls -U, {N} records, first (indexes)",
    "cpu-setxattr": "CPU row: setxattr (fsetxattr)",
    "cpu-lookup": "CPU row: lookup (timeout=0)",
    "cpu-getattr": "CPU row: getattr (fstat, timeout=0)",
    "cpu-getxattr": "CPU row: getxattr",
}
#: What a full run measures (the fsetxattr CPU row only with --cpu-rows-only or --rows).
DEFAULT_ROWS = tuple(k for k in ROWS if k != "cpu-setxattr")
#: Rows that measure the state another row leaves: when they are chosen without it, it runs
#: first, unrecorded.
ROW_NEEDS = {
    "stat-warm": ("stat-cold",), "ls-l-warm": ("ls-l-cold",), "cat-warm": ("cat-cold",),
    "seq-reread": ("seq-read-cold",),
    **{f"view-{c}-warm": (f"view-{c}-cold",) for c in ("ls-U", "ls-f", "ls-l")},
}


def pick_rows(spec: str) -> tuple[str, ...]:
    """``--rows`` (names or shell patterns, comma-separated: ``fio-*,readdir``) -> the
    chosen names in ROWS's order; ValueError names what matches no row."""
    import fnmatch
    chosen: set[str] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        hits = fnmatch.filter(ROWS, part)
        if not hits:
            raise ValueError(f"no row is named {part!r} (--list-rows lists them)")
        chosen.update(hits)
    return tuple(k for k in ROWS if k in chosen)


#: A daemon counts as settled when its CPU time grew less than SETTLE_CPU_NS over the last
#: SETTLE_WINDOW seconds (an idle pyfuse3/trio daemon uses next to none); SETTLE_MAX caps
#: the wait (the row then notes it).
SETTLE_WINDOW = 0.2
SETTLE_CPU_NS = 1_000_000
SETTLE_MAX = 15.0


def settle(t: Target) -> float:
    """Wait until ``t``'s daemon is idle: what an earlier row or a set-up left it to do (the
    SOURCE watcher applying 500 renames or removals, a store's batch sync, indexing) must not
    be counted in the next row, nor slow it. The same for every FUSE target; seconds waited
    (-1 when SETTLE_MAX passed first)."""
    if t.proc is None:
        return 0.0
    start = time.monotonic()
    samples = [(start, cpu_ns(t.proc.pid))]
    while True:
        time.sleep(SETTLE_WINDOW / 4)
        now = time.monotonic()
        samples.append((now, cpu_ns(t.proc.pid)))
        while samples[1][0] <= now - SETTLE_WINDOW:
            samples.pop(0)
        if samples[0][0] <= now - SETTLE_WINDOW and samples[-1][1] - samples[0][1] < SETTLE_CPU_NS:
            return now - start
        if now - start > SETTLE_MAX:
            return -1.0


@dataclass
class Row:
    workload: str
    unit: str
    better: str = "higher"          # "lower" for times
    values: dict[str, list[float]] = field(default_factory=dict)
    cpu_us: dict[str, list[float]] = field(default_factory=dict)   # daemon CPU per request
    requests: dict[str, list[int]] = field(default_factory=dict)
    note: dict[str, str] = field(default_factory=dict)
    #: what "CPU µs" counts on this row: "request", or on rows whose requests each carry
    #: many names (listings, getfattr -R) "entry"/"file", as one request may carry 10 or 500
    cpu_unit: str = "request"
    cpu_us_per_unit: dict[str, list[float]] = field(default_factory=dict)
    settle_s: dict[str, list[float]] = field(default_factory=dict)  # waited before the row

    def cpu(self, name: str) -> list[float] | None:
        """The row's CPU figures of target ``name`` in its own unit."""
        return self.cpu_us.get(name) if self.cpu_unit == "request" else self.cpu_us_per_unit.get(name)


class Recorder:
    def __init__(self, rows: tuple[str, ...] = DEFAULT_ROWS):
        self.rows: dict[str, Row] = {}
        self.chosen = set(rows)
        self.needed = set(rows)
        for key in rows:
            self.needed.update(ROW_NEEDS.get(key, ()))

    def wants(self, *keys: str) -> bool:
        """Whether any of ``keys`` runs (recorded or as another chosen row's prerequisite)."""
        return any(k in self.needed for k in keys)

    def measure(self, t: Target, key: str, workload: str, unit: str, fn, *args,
                better="higher", per: tuple[str, int] | None = None, setup=None, cleanup=None):
        """Row ``key`` on target ``t``: ``setup()``, then the daemon settles, then ``fn(*args)``
        between the clock's and the CPU counters' readings, then ``cleanup()`` (whose
        background work the next row's settling waits out). ``per`` = (unit, count): the
        CPU figure that compares is per entry/file, not per request."""
        if key not in self.needed:
            return None
        row = None
        if key in self.chosen:
            row = self.rows.setdefault(workload, Row(workload, unit, better))
            if per:
                row.cpu_unit = per[0]
        try:
            if setup is not None:
                setup()
            waited = settle(t)
            before = t.sample()
            value = fn(*args)
            after = t.sample()
        except Exception as exc:
            print(f"  {t.name}: {workload} failed: {exc!r}", file=sys.stderr)
            if row is not None:
                row.note[t.name] = f"failed: {exc!r}"[:200]
            return None
        finally:
            if cleanup is not None:
                with contextlib.suppress(OSError):
                    cleanup()
        if row is None:  # run only for the state a chosen row measures
            return value
        row.values.setdefault(t.name, []).append(value)
        requests = after[1] - before[1]
        if t.fuse and t.counter is not None:
            row.settle_s.setdefault(t.name, []).append(round(waited, 3))
            notes = [f"daemon still busy after {SETTLE_MAX:.0f} s of waiting"] if waited < 0 else []
            row.requests.setdefault(t.name, []).append(requests)
            cpu = after[0] - before[0]
            if requests > 0:
                row.cpu_us.setdefault(t.name, []).append(cpu / requests / 1e3)
            if per:
                row.cpu_us_per_unit.setdefault(t.name, []).append(cpu / per[1] / 1e3)
                calls = after[2] - before[2]
                if calls:  # and every request per listed entry (ls -l: stats, getxattrs)
                    plural = "entries" if per[0] == "entry" else f"{per[0]}s"
                    notes.append(f"{per[1] / calls:.0f} {plural} per READDIR(PLUS) reply, "
                                 f"{requests / per[1]:.2f} requests per {per[0]}")
            if notes:
                row.note[t.name] = "; ".join(notes)
        print(f"  {t.name:10s} {workload:34s} {fmt(value):>10s} {unit}"
              + (f"  ({requests} req)" if t.fuse else ""), file=sys.stderr, flush=True)
        return value


def listing_rows(t: Target, rec: Recorder, files: list[str]) -> None:
    """Right after a cold mount: `ls -l`, stat and readdir."""
    m = rec.measure
    ls_entries = LS_ENTRIES
    m(t, "ls-l-cold", ROWS["ls-l-cold"], "entries/s", ls_l, t.root / "ls2000", ls_entries,
      per=("entry", ls_entries))
    m(t, "stat-cold", ROWS["stat-cold"], "ops/s", stat_all, files)
    m(t, "stat-warm", ROWS["stat-warm"], "ops/s", stat_all, files)
    m(t, "readdir", ROWS["readdir"], "entries/s", readdir, t.root / "files",
      per=("entry", 5 * len(files)))
    m(t, "ls-l-warm", ROWS["ls-l-warm"], "entries/s", ls_l, t.root / "ls2000", ls_entries,
      per=("entry", ls_entries))


READ_ROWS = ("getxattr", "stat-getxattr-1", "stat-getxattr-2", "stat-getxattr-4")
#: The rows run_round measures on the mount with default options.
MAIN_MOUNT_ROWS = ("setxattr-batch", *READ_ROWS, "setfattr-500", "getfattr-r", "staleness",
                   "create-write", "mv-500", "fio-randread", "fio-randwrite", "fio-create")


def read_rows(t: Target, rec: Recorder, files: list[str]) -> None:
    """Metadata reads of every file (each already has the xattr): 1, 2 and 4 clients."""
    m = rec.measure
    m(t, "getxattr", ROWS["getxattr"], "ops/s", getxattr_all, files, t.xattr)
    for n in (1, 2, 4):
        m(t, f"stat-getxattr-{n}", ROWS[f"stat-getxattr-{n}"], "pairs/s",
          parallel_clients, files, t.xattr, n)


def ensure_values(t: Target, files: list[str]) -> None:
    """Every one of ``files`` (files/'s first ones) has the bench's xattr, for the rows that
    read it when the setxattr rows did not run (once per target and run; the floor starts
    with it in every file)."""
    if t.valued < len(files) and t.name != "floor":
        setxattr_all(files[t.valued:], t.xattr)
    t.valued = max(t.valued, len(files))


def run_round(t: Target, rec: Recorder, args, work: Path) -> None:
    m = rec.measure
    files = file_paths(t)
    if t.name == "floor":
        run_floor_rows(t, rec, files, args, work)
        return
    # the round's first mount drops the caches, whichever rows run (as in a full run, where
    # the listing rows' is first: a later row reads big.bin cold, on every target alike)
    cold = True
    if rec.wants("ls-l-cold", "stat-cold", "stat-warm", "readdir", "ls-l-warm"):
        t.mount()
        cold = False
        listing_rows(t, rec, files)
    if rec.wants("setxattr-none"):
        t.mount(sync="none", cold=cold)
        cold = False
        stat_all(files)  # names known to the kernel, as for the other warm rows
        if m(t, "setxattr-none", ROWS["setxattr-none"], "ops/s", setxattr_all, files[:2000],
             t.xattr) is not None:
            setxattr_all(files[2000:], t.xattr)  # the getxattr rows read every file's value
            t.valued = len(files)
    if rec.wants(*MAIN_MOUNT_ROWS):
        t.mount(cold=cold)  # default options from here on
    if rec.wants("setxattr-batch"):
        stat_all(files)
        m(t, "setxattr-batch", ROWS["setxattr-batch"], "ops/s", setxattr_all, files[:2000],
          t.xattr)
    if rec.wants(*READ_ROWS):
        ensure_values(t, files)
        read_rows(t, rec, files)
    m(t, "setfattr-500", ROWS["setfattr-500"], "ops/s", setfattr_500, t)
    m(t, "getfattr-r", ROWS["getfattr-r"], "files/s", getfattr_tree, t,
      per=("file", TREE_FILES), setup=lambda: getfattr_tree_setup(t))
    m(t, "staleness", ROWS["staleness"], "ms", staleness, t, better="lower")
    data_rows(t, rec, args)
    cat_rows(t, rec, work)
    if args.view_records:
        view_rows(t, rec, args)
    if t.fuse:
        run_cpu_rows(t, rec, files)
    t.unmount()


def cat_rows(t: Target, rec: Recorder, work: Path) -> None:
    """`cat` of small files: journalfs's record files, the same bytes as files elsewhere."""
    if not rec.wants("cat-cold", "cat-warm"):
        return
    records = t.record_files()
    t.mount()
    for key in ("cat-cold", "cat-warm"):
        rec.measure(t, key, ROWS[key], "files/s", cat_files, records, work / f"list-{t.name}")


def data_rows(t: Target, rec: Recorder, args) -> None:
    """File data, creation and renames (the floor serves them as a bare passthrough). Each
    row's set-up and clean-up (files made or removed in SOURCE or through the mount) run
    outside its counters, and the next row starts once the daemon has settled them."""
    m = rec.measure
    new = t.root / f"new-{t.name}"
    m(t, "create-write", ROWS["create-write"], "ops/s", write_new_files, new, args.create,
      setup=lambda: fresh_folder(new), cleanup=lambda: shutil.rmtree(new))
    m(t, "mv-500", ROWS["mv-500"], "ops/s", rename_500, t, setup=lambda: mv_500_setup(t),
      cleanup=lambda: shutil.rmtree(t.src / mv_dir(t)))
    m(t, "fio-randread", ROWS["fio-randread"], "IOPS", fio, t,
      [f"--filename={t.root / 'big.bin'}", "--rw=randread", "--bs=4k", f"--size={min(256, args.big_mib)}m",
       "--runtime=4", "--time_based"], "read_iops")
    m(t, "fio-randwrite", ROWS["fio-randwrite"], "IOPS", fio, t,
      [f"--filename={t.root / 'rand.bin'}", "--rw=randwrite", "--bs=4k", "--size=256m",
       "--fsync=32", "--runtime=4", "--time_based"], "write_iops")
    fio_src = t.src / fio_create_dir(t)
    m(t, "fio-create", ROWS["fio-create"], "files/s", fio_create_files, t,
      setup=lambda: fresh_folder(fio_src), cleanup=lambda: shutil.rmtree(fio_src))
    if rec.wants("seq-read-cold", "seq-reread"):
        t.mount()
        m(t, "seq-read-cold", ROWS["seq-read-cold"], "MB/s", sequential_read, t.root / "big.bin")
        m(t, "seq-reread", ROWS["seq-reread"], "MB/s", sequential_read, t.root / "big.bin")
    if rec.wants("fio-seqread"):
        t.mount()
        m(t, "fio-seqread", ROWS["fio-seqread"], "MB/s", fio, t,
          [f"--filename={t.root / 'big.bin'}", "--rw=read", "--bs=1m", f"--size={args.big_mib}m"],
          "read_MBps")


def run_floor_rows(t: Target, rec: Recorder, files: list[str], args, work: Path) -> None:
    """The rows the floor filesystem (pyfuse3 answering from dicts, or passing data through
    with one syscall) can serve, by the same client code: the rate pyfuse3 itself reaches
    where every call is a FUSE round trip."""
    m = rec.measure
    if rec.wants("ls-l-cold", "stat-cold", "stat-warm", "readdir", "ls-l-warm",
                 "setxattr-none", *MAIN_MOUNT_ROWS):
        t.mount()
    listing_rows(t, rec, files)
    m(t, "setxattr-none", ROWS["setxattr-none"], "ops/s", setxattr_all, files[:2000], t.xattr)
    m(t, "setxattr-batch", ROWS["setxattr-batch"], "ops/s", setxattr_all, files[:2000], t.xattr)
    read_rows(t, rec, files)
    m(t, "setfattr-500", ROWS["setfattr-500"], "ops/s", setfattr_500, t)
    m(t, "getfattr-r", ROWS["getfattr-r"], "files/s", getfattr_tree, t,
      per=("file", TREE_FILES), setup=lambda: getfattr_tree_setup(t))
    data_rows(t, rec, args)
    cat_rows(t, rec, work)
    if args.view_records:
        view_rows(t, rec, args)
    run_cpu_rows(t, rec, files)
    t.unmount()


# ---------------------------------------------------------------- journal view listings

#: The view rows' commands: `ls -U` (names, unsorted), `ls -f` (the same, with . and ..,
#: no stat even for colours) and `ls -l` (a stat and two getxattrs of every entry: ACL and
#: SELinux label).
VIEW_COMMANDS = {"ls -U": ["ls", "-U"], "ls -f": ["ls", "-f"], "ls -l": ["ls", "-l"]}


def view_journal(count: int) -> str:
    """SOURCE's Wallaby index journal of ``count`` records (24 bytes each) for the view rows."""
    return f"view-{count}.idx"


def view_dir(count: int) -> str:
    """SOURCE's real directory of ``count`` empty files named like that journal's records."""
    return f"view-dir-{count}"


def build_view_source(src: Path, counts: set[int]) -> None:
    """The view rows' journals and same-size directories (reruns reuse them)."""
    sys.path.insert(0, str(REPO))
    from journalfs.formats.wallaby import big_index
    for count in counts:
        journal = src / view_journal(count)
        if not journal.exists() or journal.stat().st_size != 16 + 24 * count:
            journal.write_bytes(big_index(count))
        _fill(src / view_dir(count), count, lambda d, i: os.close(
            os.open(d / f"{i:08d}.index", os.O_CREAT | os.O_WRONLY, 0o644)))


def view_folder(t: Target, count: int) -> tuple[Path, int]:
    """What target ``t`` lists for the view rows and how many entries that is: journalfs the
    journal's view (its records and records.jsonl), the others the real directory."""
    if t.name.startswith("journalfs"):
        return t.root / ".journalfs" / "records" / view_journal(count), count + 1
    return t.root / view_dir(count), count


def list_view(command: list[str], folder: Path, expected: int) -> float:
    """Entries per second of one listing by ``command`` (C), checked complete."""
    start = time.perf_counter()
    out = subprocess.run([*command, str(folder)], check=True, capture_output=True).stdout
    elapsed = time.perf_counter() - start
    lines = out.splitlines()[1 if command[-1] == "-l" else 0:]  # -l: "total" first
    # . and .. (ls -f) as far as the filesystem lists them (bindfs does, pyfuse3 ones not)
    listed = len(lines) - lines.count(b".") - lines.count(b"..")
    if listed != expected:
        raise RuntimeError(f"{' '.join(command)} listed {listed} of {expected} entries")
    return listed / elapsed


VIEW_ROWS = tuple(k for k in ROWS if k.startswith("view-"))


def view_rows(t: Target, rec: Recorder, args) -> None:
    """`ls -U`, `ls -f` and `ls -l` of a journal view (journalfs) beside a real directory of
    as many files (the others): the first listing after a fresh mount with dropped caches
    ("cold"), then the same again ("warm")."""
    if not rec.wants(*VIEW_ROWS):
        return
    every = {"ls -U": args.view_records, "ls -f": args.view_records,
             "ls -l": args.view_ls_l_records}
    sizes = {label: count for label, count in every.items()
             if rec.wants(f"view-{label.replace(' -', '-')}-cold")}
    if t.name == "floor":
        t.floor_dirs = FLOOR_DIRS + tuple(view_dir(n) for n in set(sizes.values()))
    try:
        if t.name.startswith("journalfs"):  # the store is new: the first listing indexes
            indexed = set(every.values()) if rec.wants("view-first") else set(sizes.values())
            for count in sorted(indexed - t.indexed):
                t.mount()
                folder, expected = view_folder(t, count)
                title = ROWS["view-first"].replace("{N}", f"{count:,}")
                if rec.wants("view-first"):
                    rec.measure(t, "view-first", title, "entries/s", list_view,
                                VIEW_COMMANDS["ls -U"], folder, expected, per=("entry", expected))
                else:  # the cold rows measure an indexed view
                    list_view(VIEW_COMMANDS["ls -U"], folder, expected)
                t.indexed.add(count)
        for label, count in sizes.items():
            t.mount()
            folder, expected = view_folder(t, count)
            for phase in ("cold", "warm"):
                key = f"view-{label.replace(' -', '-')}-{phase}"
                rec.measure(t, key, ROWS[key].replace("{N}", f"{count:,}"), "entries/s",
                            list_view, VIEW_COMMANDS[label], folder, expected,
                            per=("entry", expected))
    finally:
        t.floor_dirs = FLOOR_DIRS
        t.unmount()


#: Files each CPU row goes through (--cpu-files): longer rows average out a busy machine.
CPU_ROW_FILES = 1000
CPU_ROWS = ("cpu-setxattr", "cpu-lookup", "cpu-getattr", "cpu-getxattr")


def run_cpu_rows(t: Target, rec: Recorder, files: list[str]) -> None:
    """Rows where every call is one request (timeout 0): CPU per LOOKUP, GETATTR, GETXATTR
    (and SETXATTR, which also gives the getxattr row its values)."""
    if not rec.wants(*CPU_ROWS):
        return
    subset = files[:CPU_ROW_FILES]
    t.mount(timeout=0, cold=False)
    if rec.wants("cpu-setxattr"):
        fds = [os.open(p, os.O_RDONLY) for p in subset]  # one LOOKUP each before the row
        try:
            if rec.measure(t, "cpu-setxattr", ROWS["cpu-setxattr"], "ops/s", fsetxattr_all,
                           fds, t.xattr) is not None:
                t.valued = max(t.valued, len(subset))
        finally:
            for fd in fds:
                os.close(fd)
    if rec.wants("cpu-getxattr"):
        ensure_values(t, subset)
    rec.measure(t, "cpu-lookup", ROWS["cpu-lookup"], "ops/s", stat_all, subset)
    rec.measure(t, "cpu-getattr", ROWS["cpu-getattr"], "ops/s", fstat_all, subset)
    rec.measure(t, "cpu-getxattr", ROWS["cpu-getxattr"], "ops/s", getxattr_all, subset,
                t.xattr, 2)
    t.unmount()


# ---------------------------------------------------------------- report

def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def summary(values: list[float] | None) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def ratio(row: Row, a: str, b: str) -> float | None:
    va, vb = (statistics.median(row.values[k]) if row.values.get(k) else None for k in (a, b))
    if not va or not vb:
        return None
    return va / vb if row.better == "higher" else vb / va


#: Rows the floor does not run (by a part of their name), and why; any other row it
#: lacks failed (see the row's note).
FLOOR_CANNOT = {
    "staleness after a SOURCE change": "the floor answers from dicts built at start-up and "
    "never looks at SOURCE again: there is no staleness of its own to measure",
    ", first (indexes)": "the first listing of a view indexes its journal; the floor has no "
    "journal to index (it lists the real directory, as bindfs does, in the other view rows)",
}


def short(name: str) -> str:
    return name.replace("journalfs", "jfs", 1)


def cpu_ratio(row: Row, a: str, b: str, per_request: bool = False) -> float | None:
    """Daemon CPU per request of ``a`` ÷ that of ``b`` (medians); per entry (file) on the rows
    that count CPU so, unless ``per_request``."""
    if per_request:
        ca, cb = row.cpu_us.get(a), row.cpu_us.get(b)
    else:
        ca, cb = row.cpu(a), row.cpu(b)
    if not ca or not cb:
        return None
    return statistics.median(ca) / statistics.median(cb)


def floor_missing(rec: Recorder, names: list[str]) -> dict[str, str]:
    """Rows some journalfs ran that the floor did not, with the reason."""
    if "floor" not in names:
        return {}
    out = {}
    for r in rec.rows.values():
        if r.values.get("floor") or not any(r.values.get(n) for n in names
                                            if n.startswith("journalfs")):
            continue
        out[r.workload] = next((why for part, why in FLOOR_CANNOT.items()
                                if part in r.workload), None) \
            or r.note.get("floor") or "not run"
    return out


def report(rec: Recorder, names: list[str], meta: dict) -> dict:
    fuse = [n for n in names if n != "native"]
    mine = [n for n in names if n.startswith("journalfs")]
    # journalfs (and every --tree) against bindfs and, beside it, against the floor: what
    # pyfuse3 itself reaches on the row; then the floor against bindfs
    pairs = [(n, b) for n in mine for b in ("bindfs", "floor") if b in names]
    if "journalfs" in names and "native" in names:
        pairs.append(("journalfs", "native"))
    if "floor" in names and "bindfs" in names:
        pairs.append(("floor", "bindfs"))
    cpu_pairs = [(n, "floor") for n in mine if "floor" in names]
    head = ["workload", "unit", *names, *(f"{short(a)}/{b}" for a, b in pairs),
            "CPU µs per", *(f"{n} CPU µs" for n in fuse),
            *(f"{short(a)}/{b} CPU" for a, b in cpu_pairs)]
    rows = []
    for r in rec.rows.values():
        cells = [r.workload, r.unit]
        for n in names:
            v = r.values.get(n)
            if not v:
                cells.append("-")
            elif len(v) > 1:
                cells.append(f"{fmt(statistics.median(v))} ({fmt(min(v))}..{fmt(max(v))})")
            else:
                cells.append(fmt(v[0]))
        for a, b in pairs:
            q = ratio(r, a, b)
            cells.append(f"{q:.2f}" if q else "-")
        cells.append(r.cpu_unit)
        for n in fuse:
            c = r.cpu(n)
            cells.append(f"{statistics.median(c):.1f}" if c else "-")
        for a, b in cpu_pairs:
            q = cpu_ratio(r, a, b)
            cells.append(f"{q:.2f}" if q else "-")
        rows.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    print("| " + line(head) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + line(row) + " |")
    if cpu_pairs:
        print("- x/floor: rate ÷ the floor's (higher is better); x/floor CPU: daemon CPU per "
              "request ÷ the floor's (lower is better); per entry (per file) on the rows whose "
              "\"CPU µs per\" says so: listings, where one request carries 1 to thousands of "
              "entries (per-request figures are in the JSON)")
    missing = floor_missing(rec, names)
    for workload, why in missing.items():
        print(f"- the floor does not run \"{workload}\": {why}")
    notes = [(r.workload, n, text) for r in rec.rows.values() for n, text in r.note.items()]
    for workload, n, text in notes:
        print(f"- {workload}, {n}: {text}")
    blob = {**meta, "floor_not_run": missing, "results": [
        {"workload": r.workload, "unit": r.unit, "better": r.better,
         "values": {n: summary(v) for n, v in r.values.items()},
         "cpu_us_per_request": {n: summary(v) for n, v in r.cpu_us.items()},
         # the unit CPU compares in: "request", or "entry"/"file" on listing rows
         "cpu_unit": r.cpu_unit,
         "cpu_us_per_unit": {n: summary(r.cpu(n)) for n in r.cpu_us_per_unit or r.cpu_us},
         "settle_s": r.settle_s,
         "requests": r.requests, "notes": r.note,
         "ratio_journalfs_bindfs": ratio(r, "journalfs", "bindfs"),
         "ratio_journalfs_floor": ratio(r, "journalfs", "floor"),
         "ratio_journalfs_native": ratio(r, "journalfs", "native"),
         "ratio_floor_bindfs": ratio(r, "floor", "bindfs"),
         "ratio_journalfs_floor_cpu": cpu_ratio(r, "journalfs", "floor"),
         # every pair of the table, --tree targets included ("journalfs-main/floor": ...)
         "ratios": {f"{a}/{b}": ratio(r, a, b) for a, b in pairs},
         "cpu_ratios": {f"{a}/{b}": cpu_ratio(r, a, b) for a, b in cpu_pairs},
         "cpu_ratios_per_request": {f"{a}/{b}": cpu_ratio(r, a, b, per_request=True)
                                    for a, b in cpu_pairs}}
        for r in rec.rows.values()]}
    print(json.dumps(blob, indent=1))
    return blob


# ---------------------------------------------------------------- the floor filesystem

#: The parts of SOURCE the floor filesystem serves (everything its rows touch).
FLOOR_DIRS = ("files", "ls2000", "tree5005")


def serve_floor(src: Path, mnt: Path, timeout: float, dir_blksize: int | None = None,
                dirs: tuple[str, ...] = FLOOR_DIRS) -> None:
    """A pyfuse3 filesystem answering from dicts built at start: the directories ``dirs``
    (``FLOOR_DIRS``, and the view rows' directories for those) of SOURCE with every entry's
    stat, and xattrs kept in a dict (every file
    starts with ``user.metadata.bench``). What pyfuse3 itself costs per request."""
    import pyfuse3
    import trio

    attrs: dict[int, pyfuse3.EntryAttributes] = {}
    children: dict[tuple[int, bytes], int] = {}
    names: dict[int, list[bytes]] = {}
    xattrs: dict[int, dict[bytes, bytes]] = {}
    numbers = iter(range(pyfuse3.ROOT_INODE + 1, 1 << 62))

    def entry(ino: int, st: os.stat_result) -> None:
        a = pyfuse3.EntryAttributes()
        for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blksize",
                    "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(a, key, getattr(st, key))
        a.st_ino, a.entry_timeout, a.attr_timeout = ino, timeout, timeout
        attrs[ino] = a
        xattrs[ino] = {} if stat.S_ISDIR(st.st_mode) else {b"user.metadata.bench": b"floor-value"}

    def add_tree(parent: int, path: Path) -> None:
        names[parent] = []
        for name in sorted(os.listdir(path)):
            ino = next(numbers)
            st = os.lstat(path / name)
            entry(ino, st)
            children[(parent, os.fsencode(name))] = ino
            names[parent].append(os.fsencode(name))
            if stat.S_ISDIR(st.st_mode):
                add_tree(ino, path / name)

    entry(pyfuse3.ROOT_INODE, os.lstat(src))
    names[pyfuse3.ROOT_INODE] = []
    for top in dirs:
        if (src / top).is_dir():
            ino = next(numbers)
            entry(ino, os.lstat(src / top))
            if dir_blksize:
                attrs[ino].st_blksize = dir_blksize
            children[(pyfuse3.ROOT_INODE, top.encode())] = ino
            names[pyfuse3.ROOT_INODE].append(top.encode())
            add_tree(ino, src / top)

    # Everything outside FLOOR_DIRS (big.bin, the rows' new files and directories) is served
    # as a minimal passthrough does it: one syscall on SOURCE per request, paths kept in a
    # dict, no checks, no thread hops. What pyfuse3 costs on the data rows.
    fixed = set(attrs)
    paths: dict[int, bytes] = {pyfuse3.ROOT_INODE: os.fsencode(src)}
    inode_of: dict[bytes, int] = {}
    FD_HANDLE = 1 << 40  # handles of real fds; the fixed files' handles are their inodes

    def passed(path: bytes, st: os.stat_result) -> pyfuse3.EntryAttributes:
        ino = inode_of.get(path)
        if ino is None:
            ino = inode_of[path] = next(numbers)
            paths[ino] = path
        entry(ino, st)
        return attrs[ino]

    def child_path(parent: int, name: bytes) -> bytes:
        return paths[parent] + b"/" + name

    def errors(fn):
        async def call(*args):
            try:
                return fn(*args)
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
        return call

    class Floor(pyfuse3.Operations):
        async def lookup(self, parent, name, ctx=None):
            ino = children.get((parent, name))
            if ino is not None:
                return attrs[ino]
            try:
                path = child_path(parent, name)
                return passed(path, os.lstat(path))
            except (OSError, KeyError):
                raise pyfuse3.FUSEError(errno.ENOENT) from None

        async def getattr(self, ino, ctx=None):
            if ino in fixed:
                return attrs[ino]
            return passed(paths[ino], os.lstat(paths[ino]))

        @errors
        def setattr(self, ino, attr, fields, fh, ctx):
            path = paths[ino]
            if fields.update_size:
                if fh is not None and fh & FD_HANDLE:
                    os.ftruncate(fh ^ FD_HANDLE, attr.st_size)
                else:
                    os.truncate(path, attr.st_size)
            if fields.update_mode:
                os.chmod(path, stat.S_IMODE(attr.st_mode))
            if fields.update_atime or fields.update_mtime:
                os.utime(path, ns=(attr.st_atime_ns, attr.st_mtime_ns))
            return passed(path, os.lstat(path))

        async def getxattr(self, ino, name, ctx=None):
            value = xattrs.get(ino, {}).get(name)
            if value is None:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            return value

        async def setxattr(self, ino, name, value, ctx):
            xattrs.setdefault(ino, {})[name] = bytes(value)

        async def listxattr(self, ino, ctx):
            return list(xattrs.get(ino, {}))

        @errors
        def open(self, ino, flags, ctx):
            if ino in fixed:
                return pyfuse3.FileInfo(fh=ino)
            fd = os.open(paths[ino], flags & ~os.O_CREAT)
            return pyfuse3.FileInfo(fh=fd | FD_HANDLE, keep_cache=True)

        @errors
        def create(self, parent, name, mode, flags, ctx):
            path = child_path(parent, name)
            fd = os.open(path, flags | os.O_CREAT, mode)
            return pyfuse3.FileInfo(fh=fd | FD_HANDLE), passed(path, os.fstat(fd))

        @errors
        def read(self, fh, off, size):
            return os.pread(fh ^ FD_HANDLE, size, off)

        @errors
        def write(self, fh, off, buf):
            return os.pwrite(fh ^ FD_HANDLE, buf, off)

        @errors
        def fsync(self, fh, datasync):
            if fh & FD_HANDLE:
                (os.fdatasync if datasync else os.fsync)(fh ^ FD_HANDLE)

        async def flush(self, fh):
            pass

        async def release(self, fh):
            if fh & FD_HANDLE:
                os.close(fh ^ FD_HANDLE)

        @errors
        def mkdir(self, parent, name, mode, ctx):
            path = child_path(parent, name)
            os.mkdir(path, mode)
            return passed(path, os.lstat(path))

        @errors
        def unlink(self, parent, name, ctx):
            os.unlink(child_path(parent, name))

        @errors
        def rmdir(self, parent, name, ctx):
            os.rmdir(child_path(parent, name))

        @errors
        def rename(self, parent_old, name_old, parent_new, name_new, flags, ctx):
            old, new = child_path(parent_old, name_old), child_path(parent_new, name_new)
            os.rename(old, new)
            ino = inode_of.pop(old, None)
            if ino is not None:
                inode_of[new], paths[ino] = ino, new

        async def opendir(self, ino, ctx):
            return ino

        async def readdir(self, fh, start, token):
            if fh in fixed:
                listed = names.get(fh, [])
                for i in range(start, len(listed)):
                    if not pyfuse3.readdir_reply(token, listed[i], attrs[children[(fh, listed[i])]], i + 1):
                        return
                return
            entries = sorted(os.listdir(paths[fh]))
            for i in range(start, len(entries)):
                path = child_path(fh, entries[i])
                if not pyfuse3.readdir_reply(token, entries[i], passed(path, os.lstat(path)), i + 1):
                    return

        async def releasedir(self, fh):
            pass

        async def forget(self, inode_list):
            pass

    pyfuse3.init(Floor(), str(mnt), {"fsname=floor", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


def readdir_experiment(src: Path, mnt: Path) -> dict:
    """Does the directory's st_blksize size the kernel's READDIR buffer? glibc's opendir sizes
    its getdents64 buffer from st_blksize (32 KiB .. 1 MiB); the kernel then clamps that count
    to [one page, max_pages]. Counted: READDIRPLUS requests for one listing of files/."""
    entries = len(os.listdir(src / "files"))
    out = {}
    for blksize in (4096, 65536, 131072, 1 << 20):
        floor = Target("floor", src, mnt)
        floor.command = lambda sync, timeout, b=blksize: [  # noqa: E731
            sys.executable, __file__, "--serve-floor", str(src), str(mnt), "--floor-dir-blksize",
            str(b)]
        floor.mount(cold=False)
        try:
            for how, listing in (("os.listdir", lambda: os.listdir(mnt / "files")),
                                 ("ls -f", lambda: subprocess.run(
                                     ["ls", "-f", str(mnt / "files")], check=True,
                                     stdout=subprocess.DEVNULL))):
                before = floor.readdirs.count()
                listing()
                calls = floor.readdirs.count() - before
                out[f"{how}, st_blksize {blksize}"] = {
                    "requests": calls, "entries_per_reply": round(entries / max(1, calls - 1))}
        finally:
            floor.unmount()
    print(json.dumps({"entries": entries, "results": out}, indent=1))
    return out


# ---------------------------------------------------------------- main

def main() -> int:
    global CPU_ROW_FILES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-bench"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--create", type=int, default=2_000)
    ap.add_argument("--only", default="native,bindfs,journalfs,floor")
    ap.add_argument("--journalfs-arg", action="append", default=[],
                    help="extra argument for journalfs mount (repeatable), e.g. --journalfs-arg=--sync=batch")
    ap.add_argument("--json", type=Path, help="also write the JSON result here")
    ap.add_argument("--rows", metavar="NAME,...",
                    help="run only these rows (names from --list-rows, or shell patterns such "
                         "as 'fio-*'; a warm row also runs its cold row first, unrecorded); "
                         "only the parts of SOURCE they read are built")
    ap.add_argument("--list-rows", action="store_true",
                    help="print every row's short name and title, then exit")
    ap.add_argument("--cpu-rows-only", action="store_true",
                    help="only the CPU rows (setxattr, lookup, getattr, getxattr at timeout=0) "
                         "on the FUSE targets, as --rows 'cpu-*'")
    ap.add_argument("--cpu-files", type=int, default=1000,
                    help="files each CPU row goes through (at most --files)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="also run journalfs from another checkout DIR as target "
                         "journalfs-NAME (repeatable; add it to --only), e.g. to compare "
                         "branches in one run: --tree main=/work/main --only journalfs,journalfs-main")
    ap.add_argument("--view-records", type=int, default=200_000,
                    help="the view rows list a journal view of this many records beside a "
                         "directory of as many files (0: no view rows)")
    ap.add_argument("--view-ls-l-records", type=int, default=20_000,
                    help="records of the view (and files of the directory) `ls -l` lists")
    ap.add_argument("--view-rows-only", action="store_true",
                    help="only the view rows, as --rows 'view-*'")
    ap.add_argument("--serve-floor", nargs=2, metavar=("SRC", "MNT"), help=argparse.SUPPRESS)
    ap.add_argument("--floor-timeout", type=float, default=120, help=argparse.SUPPRESS)
    ap.add_argument("--floor-dir-blksize", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--floor-dirs", default=",".join(FLOOR_DIRS), help=argparse.SUPPRESS)
    ap.add_argument("--readdir-experiment", action="store_true",
                    help="only measure READDIRPLUS entries per reply against the listing "
                         "directory's st_blksize (floor filesystem, os.listdir and ls)")
    args = ap.parse_args()
    if args.list_rows:
        for key, title in ROWS.items():
            print(f"{key:16s} {title}{'' if key in DEFAULT_ROWS else '  (not in a full run)'}")
        return 0
    try:
        rows = pick_rows(args.rows or ("cpu-*" if args.cpu_rows_only else
                                       "view-*" if args.view_rows_only else ",".join(DEFAULT_ROWS)))
    except ValueError as exc:
        ap.error(str(exc))
    CPU_ROW_FILES = args.cpu_files
    # the setxattr CPU row holds one fd per file
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.serve_floor:
        serve_floor(Path(args.serve_floor[0]), Path(args.serve_floor[1]), args.floor_timeout,
                    args.floor_dir_blksize, tuple(filter(None, args.floor_dirs.split(","))))
        return 0

    work = args.workdir.resolve()
    src = work / "src"
    rec = Recorder(rows)
    build_source(src, args.files, args.big_mib,
                 {part for part, keys in SOURCE_PARTS.items() if rec.wants(*keys)})
    if args.view_records and rec.wants(*VIEW_ROWS):
        build_view_source(src, {args.view_records, args.view_ls_l_records})
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    all_targets = {
        "native": Target("native", src, None),
        "bindfs": Target("bindfs", src, work / "mnt-bindfs"),
        "journalfs": Target("journalfs", src, work / "mnt-journalfs", store, args.journalfs_arg),
        "floor": Target("floor", src, work / "mnt-floor"),
    }
    for spec in args.tree:
        label, _, tree = spec.partition("=")
        name = f"journalfs-{label}"
        tree_store = work / f"store-{label}"
        shutil.rmtree(tree_store, ignore_errors=True)
        tree_store.mkdir(parents=True)
        all_targets[name] = Target(name, src, work / f"mnt-{name}", tree_store,
                                   args.journalfs_arg, tree=Path(tree).resolve())
    if args.readdir_experiment:
        readdir_experiment(src, work / "mnt-floor")
        return 0
    names = args.only.split(",")
    targets = [all_targets[n] for n in names]
    started = time.time()

    def meta(rounds_done: int) -> dict:
        return {"files": args.files, "big_mib": args.big_mib, "create": args.create,
                "view_records": args.view_records, "view_ls_l_records": args.view_ls_l_records,
                "rounds": args.rounds, "rounds_done": rounds_done, "rows": list(rows),
                "journalfs_args": args.journalfs_arg, "cpus": os.cpu_count(),
                "kernel": os.uname().release, "loadavg_end": os.getloadavg(),
                "seconds": round(time.time() - started),
                "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                "request_counting": RequestCounter.available()}

    for rnd in range(args.rounds):
        order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
        for target in order:
            print(f"round {rnd + 1}/{args.rounds}: {target.name}", file=sys.stderr, flush=True)
            try:
                run_round(target, rec, args, work)
            except Exception as exc:  # keep the other targets' figures
                print(f"{target.name}: failed: {exc!r}", file=sys.stderr)
                traceback.print_exc()
            finally:
                target.unmount()
        if args.json and rnd + 1 < args.rounds:  # what is done so far survives an interruption
            with open(args.json.with_suffix(".partial.txt"), "w") as out, \
                    contextlib.redirect_stdout(out):
                args.json.write_text(json.dumps(report(rec, names, meta(rnd + 1)), indent=1) + "\n")
    blob = report(rec, names, meta(args.rounds))
    if args.json:
        args.json.write_text(json.dumps(blob, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
