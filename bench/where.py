"""Where the time goes: the CPU journalfs spends per FUSE request, split into pyfuse3 + trio +
the interpreter, journalfs's handler, the handler's syscalls and the metadata store, side by
side with the bench's pyfuse3 "floor" filesystem (bench/fuse.py --serve-floor), which answers
from dicts and so costs only what pyfuse3 itself costs.

    sudo .venv/bin/python bench/where.py [--rounds 3] [--files 2000] [--seconds 3]
                                         [--rows getxattr,setxattr,stat-cold,...]
                                         [--tree main=/work/main] [--json FILE]

Rows (every request of a row is of the kind named; the kernel's request counts by opcode
are printed to show it):
  getxattr   os.getxattr(fd, "user.metadata.bench") on open files: GETXATTR
  setxattr   os.setxattr(fd, ...) with a new value each time, default --sync batch: SETXATTR
  stat-cold  os.stat of every file once, right after mounting: LOOKUP of a name not seen yet
  getattr    os.fstat(fd) at -o timeout=0: GETATTR
  lookup     os.stat(name, dir_fd=...) of known names at -o timeout=0: LOOKUP (+ GETATTR)
  ls-l-cold  `ls -l` of the files right after mounting: READDIRPLUS, and GETXATTR of
             security.selinux and the ACL of every entry (SOURCE's own attributes)
  ls-l-warm  the second `ls -l` of the files: READDIRPLUS, GETXATTR of security.selinux
  getfattr-R `getfattr -R -d -m '^user\.'` of the files, each given user.metadata.bench
             first: LISTXATTR + GETXATTR per file
  readdir    after a stat of every file, 5 listings (os.listdir): READDIRPLUS
  create     create + write 4 KiB + close of new files in a new directory (as bench/fuse.py's
             create+write row): CREATE, WRITE, FLUSH, RELEASE (+ GETXATTR of
             security.capability the kernel asks before a write, LOOKUP, GETATTR)
  mv         os.rename of files with no metadata to a new name and back (mv's own requests
             left out): RENAME (+ LOOKUP of the new name)
  read       4 KiB preads at random offsets of an open 64 MiB file, on a fresh mount (the
             mount's page cache cold, SOURCE's warm): READ
  write      4 KiB pwrites at random offsets of an open 64 MiB file: WRITE (+ GETXATTR)
  write-fsync  the same with an fsync every 32 writes (as fio's --fsync=32 row): + FSYNC
The "wall ms" column is how long the measured part took (one command, or --seconds).

Two passes per round and target, in a rotating order (interleaved rounds: a shared machine's
slow phases spread over every target; figures are medians of the rounds):
1. plain: the daemon as the bench runs it. CPU per request = the daemon's CPU time (schedstat
   of every thread) over the requests the kernel sent (fuse_request_send tracepoint, as in
   bench/fuse.py); "main" is the request thread's alone; "kernel" its system time
   (/proc/PID/task/PID/stat, clock ticks: coarse, so rows run for --seconds).
2. instrumented (journalfs targets): the daemon is started by this script (--serve), which
   wraps the FUSE handlers of JournalFS in a timer, the metadata backend's methods in
   another, and the os functions a handler calls (fstat, stat, open, close, getxattr,
   pwrite, ...) in a third, each with its own cost measured at start and taken off. The
   timers read the monotonic clock (vDSO, ~0.1 µs; a thread-CPU clock is a syscall of
   ~0.8 µs here): what a handler waits for (a thread hop, a lock) would count, but the rows'
   handlers do not wait (the CPU per request of the plain pass bounds them anyway). "handler" is the handler's own Python; "syscalls" the os calls it
   makes outside the store; "store" the backend's calls (their syscalls included).
   pyfuse3 + trio + interpreter = that pass's request thread - handler - syscalls - store:
   reading /dev/fuse, waking trio, building the request context, calling the handler, the
   reply (and the timers' own wrapper coroutine). The timers read wall-clock time: on a
   loaded machine a handler preempted half-way counts the wait too.
The floor's handlers are dict lookups: its main thread is pyfuse3's own cost.
3. a hot loop (first, in this process, `--hot-loop-only` for just that): the hot handlers
   driven by hand with warm caches, and the bare syscalls they make: a floor for each
   handler's own cost that a busy machine does not move (CPU time, best of 5).

Needs root (tracefs, drop of caches not used: SOURCE is warm in the page cache, so the
figures are CPU, not disk).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_fuse", Path(__file__).with_name("fuse.py"))
bench_fuse = sys.modules["bench_fuse"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_fuse)

XATTR = "user.metadata.bench"
#: FUSE opcodes whose requests are counted on their own (the rest are "other").
OPCODES = {"LOOKUP": 1, "GETATTR": 3, "SETATTR": 4, "RENAME": 12, "OPEN": 14, "READ": 15,
           "WRITE": 16, "RELEASE": 18, "FSYNC": 20, "SETXATTR": 21, "GETXATTR": 22,
           "LISTXATTR": 23, "FLUSH": 25, "CREATE": 35, "READDIRPLUS": 44, "RENAME2": 45}
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
ROWS = ("getxattr", "setxattr", "stat-cold", "getattr", "lookup", "ls-l-cold", "ls-l-warm",
        "getfattr-R", "readdir", "create", "mv", "read", "write", "write-fsync")
#: the data rows' SOURCE: outside the floor's dicts (bench/fuse.py FLOOR_DIRS), which it
#: serves as a bare passthrough, as in bench/fuse.py's data rows
DATA_DIR, BIG_FILE, BIG_MIB = "data", "data/big.bin", 64
#: the os functions whose calls from a handler count as its syscalls
SYSCALLS = ("fstat", "stat", "lstat", "open", "close", "getxattr", "setxattr", "listxattr",
            "removexattr", "pwrite", "write", "pread", "read", "fsync", "fdatasync", "lseek",
            "readlink", "scandir", "listdir", "rename", "replace", "unlink", "ftruncate",
            "mkdir", "dup")
#: the handlers timed in the instrumented pass
HANDLERS = ("lookup", "getattr", "getxattr", "setxattr", "listxattr", "opendir", "readdir",
            "releasedir", "open", "release", "forget", "flush", "create", "read", "write",
            "fsync", "rename", "setattr", "unlink", "mkdir")
#: the metadata backend's methods timed as "store"
STORE_METHODS = ("get", "get_all", "set", "unset", "remove", "move", "copy", "sync")
#: the backend's methods called without awaiting (setxattr's inline append), also "store"
STORE_SYNC_METHODS = ("set_now",)


# ---------------------------------------------------------------- the instrumented daemon

def serve_instrumented(counters_path: Path, argv: list[str]) -> int:
    """Run ``journalfs <argv>`` in this process with timers around the handlers, the store
    and the os calls; SIGUSR2 writes the totals so far to ``counters_path`` (JSON)."""
    import threading

    from journalfs import cli
    from journalfs.fs import main as fs_main
    from journalfs.fs.passthrough import JournalFS

    main_thread = threading.get_ident()
    wall_ns = time.perf_counter_ns
    totals: dict[str, list[int]] = {}   # name -> [calls, own ns, store ns, syscall ns, syscalls]
    state = {"handler": None, "store": 0, "sys": 0, "nsys": 0, "in_store": False}

    def calibrate(fn, n=20000) -> float:
        start = wall_ns()
        for _ in range(n):
            fn()
        return (wall_ns() - start) / n

    def timed_handler(name, fn):
        async def handler(self, *args, **kwargs):
            outer = dict(state)
            state.update(handler=name, store=0, sys=0, nsys=0, in_store=False)
            start = wall_ns()
            try:
                return await fn(self, *args, **kwargs)
            finally:
                spent = wall_ns() - start
                row = totals.setdefault(name, [0, 0, 0, 0, 0])
                row[0] += 1
                row[1] += spent
                row[2] += state["store"]
                row[3] += state["sys"]
                row[4] += state["nsys"]
                state.update(outer)
        handler.__name__ = fn.__name__
        handler.__dict__.update(fn.__dict__)
        return handler

    def timed_store(fn):
        async def call(*args, **kwargs):
            if state["handler"] is None or state["in_store"]:
                return await fn(*args, **kwargs)
            state["in_store"] = True
            start = wall_ns()
            try:
                return await fn(*args, **kwargs)
            finally:
                state["store"] += wall_ns() - start
                state["in_store"] = False
        return call

    def timed_store_now(fn):
        def call(*args, **kwargs):
            if state["handler"] is None or state["in_store"]:
                return fn(*args, **kwargs)
            state["in_store"] = True
            start = wall_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                state["store"] += wall_ns() - start
                state["in_store"] = False
        return call

    def timed_syscall(fn):
        def call(*args, **kwargs):
            if state["handler"] is None or state["in_store"] or \
                    threading.get_ident() != main_thread:
                return fn(*args, **kwargs)
            start = wall_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                state["sys"] += wall_ns() - start
                state["nsys"] += 1
        return call

    # what a timer itself adds to what it measures, taken off in dump()
    state["handler"] = "calibrating"
    bare = calibrate(lambda: None)
    sys_cost = calibrate(timed_syscall(lambda: None)) - bare
    clock_cost = calibrate(wall_ns) - bare
    state["handler"] = None

    for name in HANDLERS:
        setattr(JournalFS, name, timed_handler(name, getattr(JournalFS, name)))
    for name in SYSCALLS:
        setattr(os, name, timed_syscall(getattr(os, name)))
    assemble = fs_main.assemble

    def assemble_timed(*args, **kwargs):
        ops = assemble(*args, **kwargs)
        for method in STORE_METHODS:
            if hasattr(ops.meta, method):
                setattr(ops.meta, method, timed_store(getattr(ops.meta, method)))
        for method in STORE_SYNC_METHODS:
            if hasattr(ops.meta, method):
                setattr(ops.meta, method, timed_store_now(getattr(ops.meta, method)))
        return ops
    fs_main.assemble = assemble_timed

    def dump(signum, frame):
        out = {"calibration_ns": {"syscall_timer": sys_cost, "clock": clock_cost},
               "handlers": {}}
        for name, (calls, spent, store, sysns, nsys) in totals.items():
            # each os timer's cost lands in the handler's time (around it) and, in part, in
            # the syscall's; one clock read lands in each interval
            handler = spent - store - sysns - nsys * sys_cost - calls * clock_cost
            out["handlers"][name] = {"calls": calls, "handler_ns": handler, "store_ns": store,
                                     "syscall_ns": sysns, "syscalls": nsys}
        tmp = counters_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(counters_path)

    signal.signal(signal.SIGUSR2, dump)
    return cli.main(argv)


# ---------------------------------------------------------------- the handlers in a hot loop

def hot_loop(src: Path, store: Path, files: list[str], calls: int = 20000) -> dict[str, float]:
    """CPU µs per call of the hot handlers driven by hand in this process (no kernel, no
    pyfuse3: JournalFS as fs/main.py assembles it, each call's coroutine sent once), best of
    5 runs of ``calls``: their cost with warm caches, beside an empty coroutine's and the
    bare syscalls they make. The daemon pays more for the same code: between two requests
    the client, the kernel's FUSE path and trio's loop run and take the caches."""
    import pyfuse3
    import trio

    from journalfs.fs.main import MountConfig, _open_metadata, assemble

    class Ctx:
        uid = gid = pid = 0
        umask = 0o022

    def once(coro):
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        except pyfuse3.FUSEError:
            return None
        coro.close()
        raise RuntimeError("a hot handler yielded")

    def best(fn) -> float:
        runs = []
        for _ in range(5):
            start = time.thread_time_ns()
            for _ in range(calls):
                fn()
            runs.append((time.thread_time_ns() - start) / calls / 1e3)
        return min(runs)

    async def main() -> dict[str, float]:
        config = MountConfig(source=str(src), mountpoint=str(store / "mnt"), store=str(store),
                             timeout=0)
        meta, location = _open_metadata(config)
        ops = assemble(config, meta, location, str(src))
        async with trio.open_nursery() as nursery:
            await nursery.start(meta.run)
            ctx = Ctx()
            d = await ops.lookup(pyfuse3.ROOT_INODE, b"files", ctx)
            name = os.fsencode(files[0])
            f = await ops.lookup(d.st_ino, name, ctx)
            await ops.setxattr(f.st_ino, XATTR.encode(), b"where-value", ctx)
            await ops.listxattr(f.st_ino, ctx)
            await ops.getxattr(f.st_ino, XATTR.encode(), ctx)
            node = ops.table.by_ino[f.st_ino]
            dir_fd = ops.table.by_ino[d.st_ino].fd

            async def nothing():
                return None
            out = {"empty coroutine": best(lambda: once(nothing())),
                   "getattr": best(lambda: once(ops.getattr(f.st_ino, ctx))),
                   "lookup (known name)": best(lambda: once(ops.lookup(d.st_ino, name, ctx))),
                   "getxattr user.metadata (cached)":
                       best(lambda: once(ops.getxattr(f.st_ino, XATTR.encode(), ctx))),
                   "getxattr security.selinux (SOURCE's)":
                       best(lambda: once(ops.getxattr(f.st_ino, b"security.selinux", ctx))),
                   "listxattr": best(lambda: once(ops.listxattr(f.st_ino, ctx))),
                   "syscall: os.fstat": best(lambda: os.fstat(node.fd)),
                   "syscall: os.stat at": best(lambda: os.stat(name, dir_fd=dir_fd,
                                                               follow_symlinks=False))}
            out.update(await data_handlers(ops, d.st_ino, ctx, src))
            nursery.cancel_scope.cancel()
        # stat cold: every name looked up once on a new mount at the default timeout (its
        # listing scanned once, an inode and a reply built per name); process CPU, so the
        # part of a big directory's scan a worker thread does counts too
        names = [os.fsencode(f) for f in files]
        runs = []
        for attempt in range(3):
            cold = MountConfig(source=str(src), mountpoint=str(store / "mnt"),
                               store=str(store / f"cold-{attempt}"))
            meta, location = _open_metadata(cold)
            ops = assemble(cold, meta, location, str(src))
            async with trio.open_nursery() as nursery:
                await nursery.start(meta.run)
                d = await ops.lookup(pyfuse3.ROOT_INODE, b"files", ctx)
                start = time.process_time_ns()
                for name in names:
                    await ops.lookup(d.st_ino, name, ctx)
                runs.append((time.process_time_ns() - start) / len(names) / 1e3)
                nursery.cancel_scope.cancel()
        out["lookup (new name, stat cold)"] = min(runs)
        return out

    gc_was = gc.isenabled()
    gc.disable()  # the daemon's full collections are rare (fs/collector.py): none here
    # no SOURCE watcher: nothing here would read its queue, which the data handlers' own
    # changes would fill (the daemon's watcher is measured in the mounted rows)
    watch_was = os.environ.get("JOURNALFS_WATCH")
    os.environ["JOURNALFS_WATCH"] = "off"
    try:
        return trio.run(main)
    finally:
        if gc_was:
            gc.enable()
        if watch_was is None:
            del os.environ["JOURNALFS_WATCH"]
        else:
            os.environ["JOURNALFS_WATCH"] = watch_was


async def data_handlers(ops, dir_ino: int, ctx, src: Path, calls: int = 2000) -> dict[str, float]:
    """CPU µs per call of the data rows' handlers (awaited: they may yield), beside the bare
    syscalls the floor makes for the same request, best of 5 runs of ``calls``."""
    import pyfuse3

    async def best(step) -> float:
        runs = []
        for r in range(5):
            start = time.thread_time_ns()
            for i in range(calls):
                await step(r * calls + i)
            runs.append((time.thread_time_ns() - start) / calls / 1e3)
        return min(runs)

    def bare(fn):
        async def step(i):
            fn(i)
        return step

    hot = src / "files" / "hot-data"
    shutil.rmtree(hot, ignore_errors=True)
    hot.mkdir()
    try:
        h = await ops.lookup(dir_ino, b"hot-data", ctx)
        body = b"y" * 4096
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL

        parts = dict.fromkeys(("create", "write", "flush", "release"), 0)

        async def create(i):
            now = time.thread_time_ns
            start = now()
            fi, attrs = await ops.create(h.st_ino, b"c%07d" % i, stat.S_IFREG | 0o644, flags,
                                         ctx)
            t1 = now()
            await ops.write(fi.fh, 0, body)
            t2 = now()
            await ops.flush(fi.fh)
            t3 = now()
            await ops.release(fi.fh)
            t4 = now()
            for part, spent in zip(parts, (t1 - start, t2 - t1, t3 - t2, t4 - t3)):
                parts[part] += spent
            await ops.forget([(attrs.st_ino, 1)])

        def bare_create(i):
            fd = os.open(b"b%07d" % i, flags, 0o644, dir_fd=hot_fd)
            os.fstat(fd)
            os.pwrite(fd, body, 0)
            os.close(fd)
        hot_fd = os.open(hot, os.O_RDONLY | os.O_DIRECTORY)
        out = {"create+write+flush+release (4 requests)": await best(create)}
        # the four handlers' shares of it (over all runs: the best run's split is the same)
        total = sum(parts.values())
        for part, spent in parts.items():
            out[f"  of it {part}"] = out["create+write+flush+release (4 requests)"] * spent / total
        out |= {
            "bare: open O_CREAT, fstat, pwrite, close": await best(bare(bare_create))}
        names = [b"m%05d" % i for i in range(calls)]
        for n in names:
            os.close(os.open(n, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=hot_fd))
        for n in names:
            await ops.lookup(h.st_ino, n, ctx)

        async def rename(i):
            a, b = (b"", b".b") if i // calls % 2 == 0 else (b".b", b"")
            n = names[i % calls]
            await ops.rename(h.st_ino, n + a, h.st_ino, n + b, 0, ctx)

        def bare_rename(i):
            i += 5 * calls  # on from where the handler's runs left the names
            a, b = (b"", b".b") if i // calls % 2 == 0 else (b".b", b"")
            n = names[i % calls]
            os.rename(n + a, n + b, src_dir_fd=hot_fd, dst_dir_fd=hot_fd)
        out["rename (no metadata)"] = await best(rename)
        out["bare: rename"] = await best(bare(bare_rename))
        big = os.open(b"big", os.O_CREAT | os.O_RDWR, 0o644, dir_fd=hot_fd)
        os.pwrite(big, b"z" * (4 << 20), 0)
        e = await ops.lookup(h.st_ino, b"big", ctx)
        fi = await ops.open(e.st_ino, os.O_RDWR, ctx)
        blocks = 1024
        out["read 4 KiB"] = await best(lambda i: ops.read(fi.fh, i * 7 % blocks * 4096, 4096))
        out["bare: pread"] = await best(bare(lambda i: os.pread(big, 4096, i * 7 % blocks * 4096)))
        out["write 4 KiB"] = await best(lambda i: ops.write(fi.fh, i * 7 % blocks * 4096, body))
        # a writer other than root: each write as the opener's fsuid/fsgid, CAP_SYS_RESOURCE
        # dropped (quotas and root's reserve as on SOURCE; bench clients are root: none)
        writer, ops.files[fi.fh].writer = ops.files[fi.fh].writer, (65534, 65534)
        out["write 4 KiB as a user (setfsuid/setfsgid, capset)"] = await best(
            lambda i: ops.write(fi.fh, i * 7 % blocks * 4096, body))
        ops.files[fi.fh].writer = writer
        out["bare: pwrite"] = await best(bare(lambda i: os.pwrite(big, body, i * 7 % blocks * 4096)))

        async def capability(i):
            try:
                await ops.getxattr(e.st_ino, b"security.capability", ctx)
            except pyfuse3.FUSEError:
                pass
        out["getxattr security.capability"] = await best(capability)
        await ops.release(fi.fh)
        os.close(big)
        os.close(hot_fd)
        return out
    finally:
        shutil.rmtree(hot, ignore_errors=True)


# ---------------------------------------------------------------- measuring

def thread_times(pid: int) -> tuple[int, int, int]:
    """(CPU ns of every thread, CPU ns of the main thread, system ns of the main thread)."""
    total = bench_fuse.cpu_ns(pid)
    main = int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return total, main, int(int(fields[12]) * TICK_NS)  # stime: field 15 of stat


class Daemon(bench_fuse.Target):
    """A FUSE target of bench/fuse.py, optionally started through ``--serve`` (timers), with
    per-opcode request counters."""

    def __init__(self, *args, instrumented: bool = False, counters: Path | None = None, **kw):
        super().__init__(*args, **kw)
        self.instrumented, self.counters = instrumented, counters
        self.by_op: dict[str, bench_fuse.RequestCounter] = {}

    def command(self, sync, timeout):
        cmd = super().command(sync, timeout)
        if self.instrumented:
            assert cmd[1:4] == ["-m", "journalfs.cli", "mount"], cmd
            return [sys.executable, __file__, "--serve", str(self.counters), "--", *cmd[3:]]
        return cmd

    def mount(self, sync=None, timeout=None, cold=False):
        super().mount(sync=sync, timeout=timeout, cold=cold)
        connection = os.minor(os.stat(self.mnt).st_dev)
        self.by_op = {op: bench_fuse.RequestCounter(connection, (code,))
                      for op, code in OPCODES.items()}

    def unmount(self):
        for counter in self.by_op.values():
            counter.close()
        self.by_op = {}
        super().unmount()

    def snapshot(self) -> dict:
        cpu, main, system = thread_times(self.proc.pid)
        snap = {"cpu_ns": cpu, "main_ns": main, "system_ns": system,
                "requests": self.counter.count(),
                "ops": {op: c.count() for op, c in self.by_op.items()}}
        if self.instrumented:
            before = self.counters.stat().st_mtime_ns if self.counters.exists() else 0
            os.kill(self.proc.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 10
            while (not self.counters.exists() or self.counters.stat().st_mtime_ns == before) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            snap["handlers"] = json.loads(self.counters.read_text())["handlers"]
        return snap


def delta(before: dict, after: dict) -> dict:
    out = {k: after[k] - before[k] for k in ("cpu_ns", "main_ns", "system_ns", "requests")}
    out["ops"] = {op: after["ops"][op] - before["ops"][op] for op in after["ops"]}
    if "handlers" in after:
        sums = {"calls": 0, "handler_ns": 0, "store_ns": 0, "syscall_ns": 0, "syscalls": 0}
        for name, now in after["handlers"].items():
            then = before.get("handlers", {}).get(name, {})
            for k in sums:
                sums[k] += now[k] - then.get(k, 0)
        out["handlers"] = sums
    return out


def workload(row: str, t: Daemon, files: list[str], seconds: float):
    """(setup, run) for ``row``: run() is measured; it loops over ``files`` for ``seconds``."""
    paths = [str(t.root / "files" / f) for f in files]
    fds: list[int] = []

    def until(step):
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            step(i)
            i += 1

    data = t.root / DATA_DIR
    if row == "create":
        folder = data / "created"
        body = b"y" * 4096

        def create(i):
            fd = os.open(folder / f"c{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, body)
            os.close(fd)
        return (lambda: folder.mkdir()), (lambda: until(create)), \
            (lambda: shutil.rmtree(t.src / DATA_DIR / "created"))
    if row == "mv":
        names = [f"m{i:05d}" for i in range(len(files))]

        def setup():
            for n in names:
                os.stat(data / "mv" / n)

        def step(i):
            a, b = ("", ".b") if i % 2 == 0 else (".b", "")
            for n in names:
                os.rename(data / "mv" / (n + a), data / "mv" / (n + b))

        def teardown():  # back to the names the next mount's setup expects
            for n in os.listdir(t.src / DATA_DIR / "mv"):
                if n.endswith(".b"):
                    os.rename(t.src / DATA_DIR / "mv" / n, t.src / DATA_DIR / "mv" / n[:-2])
        return setup, (lambda: until(step)), teardown
    if row in ("read", "write", "write-fsync"):
        import random
        rng = random.Random(28)
        blocks = BIG_MIB * 256
        body = b"w" * 4096

        def open_big():
            fds.append(os.open(t.root / BIG_FILE, os.O_RDONLY if row == "read" else os.O_WRONLY))

        def io(i):
            fd = fds[0]
            for n in range(32):
                if row == "read":
                    os.pread(fd, 4096, rng.randrange(blocks) * 4096)
                else:
                    os.pwrite(fd, body, rng.randrange(blocks) * 4096)
            if row == "write-fsync":
                os.fsync(fd)
        return open_big, (lambda: until(io)), (lambda: os.close(fds[0]))
    if row == "stat-cold":
        def run():
            for p in paths:
                os.stat(p)
        return (lambda: None), run, (lambda: None)
    if row == "ls-l-cold":
        return (lambda: None), (lambda: subprocess.run(["ls", "-l", str(t.root / "files")],
                                                       check=True, stdout=subprocess.DEVNULL)), \
            (lambda: None)
    if row == "ls-l-warm":
        def ls_l():
            subprocess.run(["ls", "-l", str(t.root / "files")], check=True,
                           stdout=subprocess.DEVNULL)
        return ls_l, ls_l, (lambda: None)
    if row == "readdir":  # as bench/fuse.py's row: after a stat of every file, 5 listings
        def stat_all():
            for p in paths:
                os.stat(p)
        return stat_all, (lambda: [os.listdir(t.root / "files") for _ in range(5)]), \
            (lambda: None)
    if row == "getfattr-R":
        def setup():
            for p in paths:
                os.setxattr(p, XATTR, b"where-value")
        return setup, (lambda: subprocess.run(["getfattr", "-R", "-d", "-m", "^user\\.",
                                               str(t.root / "files")], check=True,
                                              stdout=subprocess.DEVNULL)), (lambda: None)
    if row == "lookup":
        dir_fd = os.open(t.root / "files", os.O_RDONLY | os.O_DIRECTORY)

        def setup():
            for f in files:
                os.stat(f, dir_fd=dir_fd)
        return setup, (lambda: until(lambda i: [os.stat(f, dir_fd=dir_fd) for f in files])), \
            (lambda: os.close(dir_fd))

    def setup():
        fds.extend(os.open(p, os.O_RDONLY) for p in paths)
        if row == "getxattr":
            for fd in fds:
                os.setxattr(fd, XATTR, b"where-value")

    def teardown():
        for fd in fds:
            os.close(fd)
    if row == "getattr":
        return setup, (lambda: until(lambda i: [os.fstat(fd) for fd in fds])), teardown
    if row == "getxattr":
        return setup, (lambda: until(lambda i: [os.getxattr(fd, XATTR) for fd in fds])), teardown
    if row == "setxattr":
        return setup, (lambda: until(lambda i: [os.setxattr(fd, XATTR, b"v%d-%d" % (i, n))
                                                for n, fd in enumerate(fds)])), teardown
    raise ValueError(row)


def make_data_source(src: Path, count: int) -> None:
    """The data rows' SOURCE: ``count`` small files to rename, a 64 MiB file to read and
    write (kept from earlier runs), no directory of created files left over."""
    data = src / DATA_DIR
    shutil.rmtree(data / "created", ignore_errors=True)
    bench_fuse._fill(data / "mv", count, lambda d, i: (d / f"m{i:05d}").write_bytes(b"m"))
    for n in os.listdir(data / "mv"):
        if n.endswith(".b"):
            os.rename(data / "mv" / n, data / "mv" / n[:-2])
    big = src / BIG_FILE
    if not big.exists() or big.stat().st_size != BIG_MIB << 20:
        with open(big, "wb") as f:
            for _ in range(BIG_MIB):
                f.write(os.urandom(1 << 20))


def measure(t: Daemon, row: str, files: list[str], seconds: float) -> dict:
    # the CPU rows run at timeout 0 (every stat a request); the others at a timeout long
    # enough that no revalidation mixes other requests in
    t.mount(timeout=0 if row in ("getattr", "lookup") else 60)
    try:
        setup, run, teardown = workload(row, t, files, seconds)
        setup()
        before = t.snapshot()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        after = t.snapshot()
        teardown()
        return delta(before, after) | {"run_s": elapsed}
    finally:
        t.unmount()


def summarize(samples: list[dict]) -> dict:
    """Medians over rounds of µs per request."""
    def per(d, ns):
        return ns / d["requests"] / 1e3 if d["requests"] else float("nan")
    out = {"requests": statistics.median(d["requests"] for d in samples),
           "ops": {op: statistics.median(d["ops"][op] for d in samples) for op in OPCODES},
           "total_us": statistics.median(per(d, d["cpu_ns"]) for d in samples),
           "main_us": statistics.median(per(d, d["main_ns"]) for d in samples),
           "kernel_us": statistics.median(per(d, d["system_ns"]) for d in samples),
           "run_ms": statistics.median(d["run_s"] for d in samples) * 1e3,
           "spread_total_us": [min(per(d, d["cpu_ns"]) for d in samples),
                               max(per(d, d["cpu_ns"]) for d in samples)]}
    out["other_threads_us"] = out["total_us"] - out["main_us"]
    return out


def summarize_handlers(samples: list[dict]) -> dict:
    def per(d, k):
        return d["handlers"][k] / d["requests"] / 1e3 if d["requests"] else float("nan")
    return {k.replace("_ns", "_us"): statistics.median(per(d, k) for d in samples)
            for k in ("handler_ns", "syscall_ns", "store_ns")} | {
        "syscalls_per_request": statistics.median(
            d["handlers"]["syscalls"] / d["requests"] for d in samples if d["requests"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/journalfs-where"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=3.0, help="how long each looping row runs")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="also measure journalfs from another checkout as journalfs-NAME")
    ap.add_argument("--no-instrumented", action="store_true",
                    help="skip the instrumented pass (totals only)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--hot-loop-only", action="store_true",
                    help="only the handlers' CPU in a hot loop in this process (no mount)")
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.serve:
        return serve_instrumented(args.serve, [a for a in rest if a != "--"])
    # a kill unwinds like ^C: every mount and tracing instance made is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not bench_fuse.RequestCounter.available():
        print("where.py needs tracefs (run as root)", file=sys.stderr)
        return 1

    work = args.workdir.resolve()
    src = work / "src"
    bench_fuse._fill(src / "files", args.files, lambda d, i: (d / f"f{i:05d}").write_bytes(b"x" * 100))
    files = sorted(os.listdir(src / "files"))[:args.files]
    if any(r in args.rows.split(",") for r in ("create", "mv", "read", "write", "write-fsync")):
        make_data_source(src, len(files))
    trees = [("journalfs", None)] + [(f"journalfs-{label}", Path(tree).resolve())
                                     for label, _, tree in (s.partition("=") for s in args.tree)]
    targets: list[tuple[str, Daemon]] = [("floor", Daemon("floor", src, work / "mnt-floor"))]
    for name, tree in trees:  # the timers for this tree's journalfs only
        for inst in (False, True) if tree is None and not args.no_instrumented else (False,):
            store = work / f"store-{name}{'-inst' if inst else ''}"
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir(parents=True)
            label = name + (" (timers)" if inst else "")
            targets.append((label, Daemon(name, src, work / f"mnt-{name}{'-inst' if inst else ''}",
                                          store, tree=tree, instrumented=inst,
                                          counters=work / f"counters-{name}.json")))
    hot_store = work / "store-hot-loop"
    shutil.rmtree(hot_store, ignore_errors=True)
    hot_store.mkdir(parents=True)
    hot = hot_loop(src, hot_store, files)
    print("handlers in a hot loop (CPU µs per call, best of 5, this process):")
    for what, us in hot.items():
        print(f"  {what:40s} {us:6.2f}")
    if args.hot_loop_only:
        return 0
    rows = args.rows.split(",")
    results: dict[str, dict[str, list[dict]]] = {r: {} for r in rows}
    for rnd in range(args.rounds):
        order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
        for row in rows:
            for label, t in order:
                d = measure(t, row, files, args.seconds)
                results[row].setdefault(label, []).append(d)
                print(f"round {rnd + 1} {row:9s} {label:24s} "
                      f"{d['cpu_ns'] / max(1, d['requests']) / 1e3:6.1f} µs/req "
                      f"({d['requests']} req: {d['ops']})", file=sys.stderr, flush=True)
    report = {"meta": {"rounds": args.rounds, "files": args.files, "seconds": args.seconds,
                       "cpus": os.cpu_count(), "loadavg_end": os.getloadavg(),
                       "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())},
              "hot_loop_us": hot, "rows": {}}
    for row in rows:
        report["rows"][row] = out = {}
        for label, samples in results[row].items():
            if label.endswith("(timers)"):
                continue
            out[label] = summarize(samples)
            timed = results[row].get(label + " (timers)")
            if timed:
                # the split is of the instrumented pass's own request thread: its parts add up
                out[label]["timers"] = summarize_handlers(timed) | {
                    "main_us": summarize(timed)["main_us"]}
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def print_table(report: dict) -> None:
    print(f"CPU µs per request, medians of {report['meta']['rounds']} interleaved rounds "
          f"({report['meta']['cpus']} CPUs, load {report['meta']['loadavg_end'][0]:.1f})")
    print(f"| row | target | total | main thread | of it kernel | pyfuse3 + trio + interpreter "
          f"| handler | handler syscalls | store | other threads | requests | wall ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row, targets in report["rows"].items():
        for label, s in targets.items():
            t = s.get("timers")
            if t:
                rest = t["main_us"] - t["handler_us"] - t["syscall_us"] - t["store_us"]
                parts = (f"{rest:.1f} | {t['handler_us']:.1f} | {t['syscall_us']:.1f} "
                         f"({t['syscalls_per_request']:.1f} calls) | {t['store_us']:.1f}")
            elif label == "floor":
                parts = f"{s['main_us']:.1f} | ~0 (dicts) | 0 | 0"
            else:
                parts = "- | - | - | -"
            ops = ", ".join(f"{op} {n:.0f}" for op, n in s["ops"].items() if n)
            print(f"| {row} | {label} | {s['total_us']:.1f} ({s['spread_total_us'][0]:.1f}.."
                  f"{s['spread_total_us'][1]:.1f}) | {s['main_us']:.1f} | {s['kernel_us']:.1f} | "
                  f"{parts} | {s['other_threads_us']:.1f} | {s['requests']:.0f} ({ops}) | "
                  f"{s['run_ms']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
