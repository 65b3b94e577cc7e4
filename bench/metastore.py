"""Metadata store benchmark: journalfs's MetaStore beside the real gvfsd-metadata.

    .venv/bin/python bench/metastore.py [--paths 1000000] [--lookups 200000]

Builds a store with --paths paths (one key each), then measures: open time, lookups/s,
sets/s per sync mode (always; batch with concurrent writers through MetaService; none), the
CPU time of one inline set (what a mount's setxattr spends in the store),
rotation time and peak memory (VmHWM of a child process doing it; median of --repeat runs)
-- and, on the SAME store copied into a scratch HOME in the same run, the time a real
gvfsd-metadata (private D-Bus session) takes to rewrite it (its journal filled with D-Bus Set
calls until it rotates: time of the Set during which the tree file is replaced; median of
--repeat rotations; peak = the daemon's VmHWM) plus its D-Bus Set rate. Prints a table
(with journalfs/gvfs ratios) and a JSON blob. Run by hand.

    .venv/bin/python bench/metastore.py --setxattr-loop [--files 2000] [--rounds 8]

instead drives the mount's own setxattr handler in this process (JournalFS as fs/main.py
assembles it, on a SOURCE of --files files, its store as `--store` gives it; no kernel, no
pyfuse3), a round = one `user.metadata.bench` set of every file, as bench/fuse.py's setxattr
row does: CPU µs per set on the request thread (best round), the other threads' CPU per
set (flushes, rotations), and a getxattr and a listxattr of every file after it. Run it with
another checkout first on PYTHONPATH to compare two trees.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from journalfs.metastore.service import MetaService  # noqa: E402
from journalfs.metastore.store import MetaStore  # noqa: E402

KEY = "comment"
GVFS_JOURNAL = 32768  # what gvfsd-metadata creates; the store handed to it uses the same


def bench_paths(n: int) -> list[str]:
    return [f"/bench/d{i // 1000:04d}/f{i:07d}" for i in range(n)]


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


# ---- journalfs -----------------------------------------------------------------------
def build_store(tree: Path, paths: list[str]) -> dict:
    """Bulk sets into one big journal, then one rotation: the fast way to a big tree."""
    store = MetaStore.open(str(tree), sync="none", journal_size=max(GVFS_JOURNAL, 96 * len(paths)))
    try:
        start = time.perf_counter()
        for i, p in enumerate(paths):
            store.set(p, KEY, f"value {i}")
        sets = time.perf_counter() - start
        rotate, _ = timed(store.rotate)
    finally:
        store.close()
    # hand over a gvfs-sized empty journal, as gvfsd-metadata would have it
    with MetaStore.open(str(tree), sync="none", journal_size=GVFS_JOURNAL) as store:
        store.rotate()
    return {"bulk_sets_per_s": len(paths) / sets, "bulk_rotation_s": rotate}


def measure_open(tree: Path, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        seconds, store = timed(lambda: MetaStore.open(str(tree), readonly=True))
        store.close()
        times.append(seconds)
    return statistics.median(times)


def measure_lookups(tree: Path, paths: list[str], n: int) -> tuple[float, float]:
    """n random lookups on a freshly opened store (cold: no directory decoded yet).
    Returns (lookups per wall second, lookups per CPU second of this process -- the figure
    that does not depend on what else the machine is running)."""
    rng = random.Random(1)
    sample = [rng.choice(paths) for _ in range(n)]
    store = MetaStore.open(str(tree), readonly=True)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        hits = sum(store.get(p, KEY) is not None for p in sample)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        store.close()
    assert hits == n, f"only {hits} of {n} lookups found their key"
    return n / seconds, n / cpu


def measure_sets(work: Path, sync: str, n: int) -> float:
    with MetaStore.open(str(work / f"sets-{sync}" / "home"), sync=sync, journal_size=64 << 20) as store:
        start = time.perf_counter()
        for i in range(n):
            store.set(f"/s/d{i % 97}/f{i}", KEY, f"v{i}")
        store.flush()
        return n / (time.perf_counter() - start)


def measure_inline_sets(work: Path, n: int) -> float:
    """CPU us per set that a mount's setxattr spends in the store under --sync batch:
    MetaService.set_now on the event loop's thread (entry and count copied into the mapped
    journal, the index updated, the flush scheduled). Thread CPU time: no other load counts."""
    store = MetaStore.open(str(work / "sets-inline" / "home"), sync="batch", journal_size=64 << 20)
    service = MetaService(store, sync="batch")
    try:
        start = time.thread_time()
        for i in range(n):
            if not service.set_now(f"/i/d{i % 97}/f{i}", KEY, f"v{i}"):
                raise RuntimeError("the store refused an inline set (busy or full)")
        return (time.thread_time() - start) / n * 1e6
    finally:
        store.close()


def measure_batch_service(work: Path, writers: int, per_writer: int) -> float:
    """Concurrent writers on trio through MetaService (--sync batch: each set returns once it
    is in the journal; the background flusher makes it durable within a second)."""
    store = MetaStore.open(str(work / "sets-batch" / "home"), sync="batch", journal_size=64 << 20)
    service = MetaService(store, sync="batch")
    elapsed = 0.0

    async def writer(w: int) -> None:
        for i in range(per_writer):
            await service.set(f"/b/w{w}/f{i}", KEY, f"v{i}")

    async def main() -> None:
        nonlocal elapsed
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            start = time.perf_counter()
            async with trio.open_nursery() as writers_nursery:
                for w in range(writers):
                    writers_nursery.start_soon(writer, w)
            await service.sync()  # the figure includes making every write durable
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()

    trio.run(main)
    return writers * per_writer / elapsed


def _vm_mb(pid: int | str, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rotation_child(tree: str) -> None:
    """In a fresh process: open the store, add one write, rotate; print seconds + peak RSS
    (VmHWM, reset after opening so it is the rotation's own peak)."""
    with MetaStore.open(tree, sync="none", journal_size=GVFS_JOURNAL) as store:
        store.set("/bench/touched", KEY, "x")
        before = _vm_mb("self", "VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        seconds, _ = timed(store.rotate)
        peak = _vm_mb("self", "VmHWM")
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak, "rss_before_mb": before}))


def measure_rotation(tree: Path, repeat: int) -> dict:
    """Median of ``repeat`` rotations, each in a fresh process (its own VmHWM)."""
    runs = [json.loads(subprocess.run([sys.executable, __file__, "--rotation-child", str(tree)],
                                      capture_output=True, text=True, check=True).stdout)
            for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} | \
        {"all_seconds": [r["seconds"] for r in runs]}


# ---- gvfs ------------------------------------------------------------------------------
_GIO_LOOKUPS = r"""
import json, sys, time
import gi
gi.require_version("Gio", "2.0")
from gi.repository import Gio
files = [Gio.File.new_for_path(p) for p in json.load(sys.stdin)]
start = time.perf_counter()
found = sum(f.query_info("metadata::comment", 0, None).get_attribute_string("metadata::comment") is not None
            for f in files)
print(json.dumps({"seconds": time.perf_counter() - start, "found": found}))
"""


def measure_gio_lookups(session, paths: list[str], n: int) -> float:
    """GIO clients read the store themselves (mmap): metadata::comment of n random files."""
    sample = random.Random(2).sample(paths, n)
    session.create_files(sample)
    out = json.loads(session._system_python(_GIO_LOOKUPS, [str(session.file_of(p)) for p in sample]))
    assert out["found"] == n, out
    return n / out["seconds"]


def measure_gvfs(tree: Path, set_calls: int, paths: list[str], lookups: int,
                 rotation_repeat: int) -> dict:
    """Copy the store into a private gvfs HOME; fill gvfsd's journal over D-Bus until it
    rotates; the Set during which the tree file is replaced took the rotation."""
    from gvfsd import GvfsSession
    from jeepney.io.blocking import open_dbus_connection
    from journalfs.metastore.gvfsd import set_message
    result = {}
    with GvfsSession() as session:
        session.install_store(tree)
        tree_file = session.home_tree
        result["gio_lookups_per_s"] = measure_gio_lookups(session, paths, lookups)
        with open_dbus_connection(session.address) as conn:
            def call(msg):
                reply = conn.send_and_get_reply(msg, timeout=600)
                assert reply.header.message_type.name == "method_return", reply.body

            # D-Bus Set rate (small values: no rotation within the run)
            start = time.perf_counter()
            for i in range(set_calls):
                call(set_message(tree_file, f"/bench/d0000/f{i % 1000:07d}", {"rating": str(i)}))
            result["gvfs_dbus_sets_per_s"] = set_calls / (time.perf_counter() - start)
            pid = session.daemon_pid
            result["gvfs_rss_before_mb"] = _vm_mb(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # the rotation's own peak, as for ours
            rotations, fill = [], 0
            for _ in range(rotation_repeat):  # each: fill the 32 KiB journal until it rotates
                ino = os.stat(tree_file).st_ino
                for _ in range(200):  # 8 KB values: a 32 KiB journal is full within a few calls
                    start = time.perf_counter()
                    call(set_message(tree_file, f"/bench/fill{fill}", {KEY: "f" * 8000}))
                    seconds = time.perf_counter() - start
                    fill += 1
                    if os.stat(tree_file).st_ino != ino:
                        rotations.append(seconds)
                        break
            rotation = statistics.median(rotations) if rotations else None
            result["gvfs_rotation_all_s"] = rotations
            result["gvfs_rotation_s"] = rotation
            result["gvfs_peak_rss_mb"] = _vm_mb(pid, "VmHWM")
    return result


# ---- report ----------------------------------------------------------------------------
def report(res: dict, targets: dict) -> None:
    def fmt(v):
        return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3f}")

    rows = [
        ("open (ms, read-only, median)", res["open_ms"], None, "<= 100"),
        ("lookups/s (get, 1 thread, cold)", res["lookups_per_s"], res.get("gio_lookups_per_s"), ">= 200,000"),
        ("  per CPU second", res["lookups_per_cpu_s"], None, ""),
        ("sets/s sync=none", res["sets_none_per_s"], res.get("gvfs_dbus_sets_per_s"), ""),
        ("sets/s sync=batch (MetaService)", res["sets_batch_per_s"], res.get("gvfs_dbus_sets_per_s"), ">= 50,000"),
        ("  with 256 writers", res["sets_batch_256_per_s"], res.get("gvfs_dbus_sets_per_s"), ""),
        ("  one writer", res["sets_batch_1_per_s"], res.get("gvfs_dbus_sets_per_s"), ""),
        ("  inline set (CPU us, setxattr's)", res["inline_set_cpu_us"], None, ""),
        ("sets/s sync=always", res["sets_always_per_s"], res.get("gvfs_dbus_sets_per_s"), ""),
        ("bulk sets/s (build, none)", res["bulk_sets_per_s"], None, ""),
        ("rotation of the store (s, median)", res["rotation_s"], res.get("gvfs_rotation_s"), "<= gvfs"),
        ("rotation peak RSS (MB)", res["rotation_peak_rss_mb"], res.get("gvfs_peak_rss_mb"), ""),
        ("  (RSS before rotating)", res["rotation_rss_before_mb"], res.get("gvfs_rss_before_mb"), ""),
    ]
    print(f"metastore benchmark: {res['paths']:,} paths, tree {res['tree_mb']:.1f} MB")
    print(f"{'metric':34} {'journalfs':>12} {'gvfs':>12} {'jfs/gvfs':>9}  target")
    for name, ours, theirs, target in rows:
        ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "-"
        print(f"{name:34} {fmt(ours):>12} {fmt(theirs):>12} {ratio:>9}  {target}")
    print("(gvfs lookups = GIO query_info(metadata::comment) per file, incl. its stat;\n"
          " gvfs sets = D-Bus Set calls to gvfsd-metadata, one at a time; gvfs RSS = the daemon's;\n"
          " gvfs rotation = its rewrite of the same store)")
    print(json.dumps({"metastore": res, "targets_met": targets}))


def setxattr_loop(files: int, rounds: int) -> dict:
    """The setxattr handler's CPU per set in-process (see the module doc)."""
    import gc

    import pyfuse3

    from journalfs.fs.main import MountConfig, _open_metadata, assemble

    class Ctx:
        uid = gid = pid = 0
        umask = 0o022

    work = Path(tempfile.mkdtemp(prefix="jfs-setxattr-"))
    src, store = work / "src", work / "store"
    (src / "files").mkdir(parents=True)
    store.mkdir()
    names = [b"f%05d" % i for i in range(files)]
    for name in names:
        (src / "files" / os.fsdecode(name)).write_bytes(b"x")
    attr, out = b"user.metadata.bench", {}

    def per_call(start: int, calls: int) -> float:
        return (time.thread_time_ns() - start) / calls / 1e3

    async def run() -> None:
        config = MountConfig(source=str(src), mountpoint=str(store / "mnt"), store=str(store))
        meta, location = _open_metadata(config)
        ops = assemble(config, meta, location, str(src))
        async with trio.open_nursery() as nursery:
            await nursery.start(meta.run)
            ctx = Ctx()
            top = await ops.lookup(pyfuse3.ROOT_INODE, b"files", ctx)
            inodes = [(await ops.lookup(top.st_ino, name, ctx)).st_ino for name in names]
            work_items = [(ino, b"value-%d" % i) for i, ino in enumerate(inodes)]
            for ino, value in work_items:  # bound, cached: as after bench/fuse.py's first round
                await ops.setxattr(ino, attr, value, ctx)
            per_round = []
            process, thread = time.process_time_ns(), time.thread_time_ns()
            for _ in range(rounds):
                await trio.sleep(0.05)  # the flusher and a rotation may run in between
                start = time.thread_time_ns()
                for ino, value in work_items:
                    await ops.setxattr(ino, attr, value, ctx)  # (no yield: no trio switch)
                per_round.append(per_call(start, files))
            others = (time.process_time_ns() - process) - (time.thread_time_ns() - thread)
            out["setxattr_us"] = min(per_round)
            out["setxattr_rounds_us"] = [round(x, 2) for x in per_round]
            out["other_threads_us_per_set"] = others / rounds / files / 1e3
            for op, call in (("getxattr", lambda ino: ops.getxattr(ino, attr, ctx)),
                             ("listxattr", lambda ino: ops.listxattr(ino, ctx))):
                start = time.thread_time_ns()
                for ino, _ in work_items:
                    await call(ino)
                out[f"{op}_us"] = per_call(start, files)
            nursery.cancel_scope.cancel()

    gc_was = gc.isenabled()
    gc.disable()  # the daemon's collections (fs/collector.py) are not the handler's cost
    try:
        trio.run(run)
    finally:
        if gc_was:
            gc.enable()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setxattr-loop", action="store_true",
                    help="only the mount's setxattr handler in-process (see above)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--paths", type=int, default=1_000_000)
    ap.add_argument("--lookups", type=int, default=200_000)
    ap.add_argument("--no-gvfs", action="store_true", help="skip the gvfsd-metadata side")
    ap.add_argument("--repeat", type=int, default=3, help="rotations measured on each side (median)")
    ap.add_argument("--rotation-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rotation_child:
        rotation_child(args.rotation_child)
        return 0
    if args.setxattr_loop:
        res = setxattr_loop(args.files, args.rounds)
        print(f"setxattr {res['setxattr_us']:.2f} µs CPU per set (best of {args.rounds} rounds of "
              f"{args.files}), other threads {res['other_threads_us_per_set']:.2f} µs per set; "
              f"getxattr {res['getxattr_us']:.2f}, listxattr {res['listxattr_us']:.2f} µs")
        print(json.dumps({"setxattr_loop": res}))
        return 0
    work = Path(tempfile.mkdtemp(prefix="jfs-bench-"))
    try:
        paths = bench_paths(args.paths)
        tree = work / "big" / "home"
        res = {"paths": args.paths, **build_store(tree, paths)}
        res["tree_mb"] = tree.stat().st_size / 1e6
        res["open_ms"] = measure_open(tree) * 1000
        res["lookups_per_s"], res["lookups_per_cpu_s"] = measure_lookups(tree, paths, args.lookups)
        res["sets_none_per_s"] = measure_sets(work, "none", 100_000)
        res["sets_always_per_s"] = measure_sets(work, "always", 2_000)
        res["sets_batch_per_s"] = measure_batch_service(work, writers=64, per_writer=500)
        res["sets_batch_256_per_s"] = measure_batch_service(work / "256", writers=256, per_writer=125)
        res["sets_batch_1_per_s"] = measure_batch_service(work / "one", writers=1, per_writer=20_000)
        res["inline_set_cpu_us"] = measure_inline_sets(work, 100_000)
        rotation = measure_rotation(tree, args.repeat)
        res["rotation_all_s"] = rotation["all_seconds"]
        res["rotation_s"] = rotation["seconds"]
        res["rotation_peak_rss_mb"] = rotation["peak_rss_mb"]
        res["rotation_rss_before_mb"] = rotation["rss_before_mb"]
        if not args.no_gvfs:
            res.update(measure_gvfs(tree, set_calls=300, paths=paths, lookups=min(args.lookups, 20_000),
                                    rotation_repeat=args.repeat))
        gvfs_rot = res.get("gvfs_rotation_s")
        targets = {
            "open_le_100ms": res["open_ms"] <= 100,
            "lookups_ge_200k": res["lookups_per_s"] >= 200_000,
            "batch_sets_ge_50k": res["sets_batch_per_s"] >= 50_000,
            "rotation_le_gvfs": None if gvfs_rot is None else res["rotation_s"] <= gvfs_rot,
        }
        report(res, targets)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
