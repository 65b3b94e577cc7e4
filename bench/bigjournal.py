"""Big-journal benchmark: one generated ~1 GB journal per format, as a new user meets it.

    .venv/bin/python bench/bigjournal.py [--mb 1000] [--formats kestrel-writer,wallaby-log]
                                         [--skip mount,pipeline] [--master spark://...]

For each format a journal of about --mb MB is generated once (numpy, written in chunks, so
generating needs little memory) and cached in bench/out/bigjournal/. Then, timed with the wall
clock and with the peak RSS of every process involved:

- ``cat FILE > /dev/null`` (reading the bytes, nothing else),
- ``journalfs records FILE --json > /dev/null`` and ``journalfs fsck FILE``,
- through a real mount of the file's directory (``journalfs mount``): the first ``cat`` of
  record 0 of the view, ``stat`` of ``records.jsonl``, ``ls`` of the view, and reading
  ``records.jsonl`` whole (MB/s),
- ``journalfs pipeline`` of the file into Parquet (default settings, local[*]).

Prints a table and a JSON blob. Each figure is one run (these take tens of seconds each).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out" / "bigjournal"
#: Records generated per chunk (bounds the generator's memory).
CHUNK = 1 << 20
PAYLOAD = 64
BASE_MS = 1_700_000_000_000
MB = 1_000_000


# -- generating ------------------------------------------------------------------------------

def _payloads(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """``n`` printable payloads of ``width`` bytes each (JSON-ish text, as queues carry)."""
    return rng.integers(ord("a"), ord("z") + 1, size=(n, width), dtype=np.uint8)


def write_kestrel_writer(path: Path, size: int, seed: int = 1) -> int:
    """PUT records (25-byte header, ``PAYLOAD``-byte payload) with ids 1, 2, 3, ...; returns
    the record count."""
    dtype = np.dtype([("cmd", "u1"), ("length", "<i4"), ("errors", "<i4"), ("id", "<i8"),
                      ("add_time", "<i8"), ("payload", "u1", PAYLOAD)])
    rng = np.random.default_rng(seed)
    total = (size - 4) // dtype.itemsize
    with open(path, "wb") as f:
        f.write(bytes.fromhex("27642603"))
        for first in range(0, total, CHUNK):
            n = min(CHUNK, total - first)
            rec = np.zeros(n, dtype)
            rec["cmd"] = 0x86  # PUT (command 8), 6 header words
            rec["length"] = PAYLOAD
            rec["id"] = np.arange(first + 1, first + n + 1)
            rec["add_time"] = BASE_MS + np.arange(first, first + n) * 7
            rec["payload"] = _payloads(rng, n, PAYLOAD)
            f.write(rec.tobytes())
    return total


def write_wallaby_log(path: Path, size: int, seed: int = 2) -> int:
    """Records of a 16-byte header (size, flags, time in ns) and a ``PAYLOAD``-byte payload."""
    dtype = np.dtype([("size", "<u4"), ("flags", "<u4"), ("time", "<i8"),
                      ("payload", "u1", PAYLOAD)])
    rng = np.random.default_rng(seed)
    header = bytes.fromhex("4c4f4701") + bytes(12)
    total = (size - len(header)) // dtype.itemsize
    with open(path, "wb") as f:
        f.write(header)
        for first in range(0, total, CHUNK):
            n = min(CHUNK, total - first)
            rec = np.zeros(n, dtype)
            rec["size"] = PAYLOAD
            rec["time"] = BASE_MS * 1_000_000 + np.arange(first, first + n) * 1_000_003
            rec["payload"] = _payloads(rng, n, PAYLOAD)
            f.write(rec.tobytes())
    return total


#: format -> (generator, file name, kind of its records)
GENERATORS = {"kestrel-writer": (write_kestrel_writer, "jobs.1700000000000", "put"),
              "wallaby-log": (write_wallaby_log, "LOG", "record")}


def journal(fmt: str, megabytes: int) -> tuple[Path, int]:
    """The cached generated journal of ``fmt`` (its path and record count)."""
    generate, name, _kind = GENERATORS[fmt]
    directory = OUT / f"{fmt}-{megabytes}mb"
    path = directory / name
    count_file = directory / "count"
    if path.exists() and count_file.exists():
        return path, int(count_file.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    print(f"generating {path} ...", file=sys.stderr, flush=True)
    count = generate(path, megabytes * MB)
    count_file.write_text(str(count))
    return path, count


# -- measuring -------------------------------------------------------------------------------

def _session_rss(sid: int) -> dict[int, tuple[str, int]]:
    """``{pid: (command name, RSS bytes)}`` of every process in session ``sid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            out[int(entry)] = (name, int(fields[21]) * resource.getpagesize())
    return out


def run_measured(argv: list[str], *, stdout=subprocess.DEVNULL, env: dict | None = None,
                 timeout: float = 3600) -> dict:
    """Run ``argv`` in a session of its own; wall seconds, exit code, and the peak RSS of the
    whole session (the sum over its processes: CLI, JVM, Python workers) and of its largest
    process, sampled every 0.2 s."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, env=env,
                            cwd=REPO, start_new_session=True)  # -m imports from the cwd first
    peak_total, peak_one, peak_name = 0, 0, ""
    while proc.poll() is None:
        sample = _session_rss(proc.pid)
        total = sum(rss for _name, rss in sample.values())
        peak_total = max(peak_total, total)
        for name, rss in sample.values():
            if rss > peak_one:
                peak_one, peak_name = rss, name
        if time.perf_counter() - started > timeout:
            os.killpg(proc.pid, 9)
        time.sleep(0.2)
    err = proc.stderr.read().decode(errors="replace")
    return {"seconds": time.perf_counter() - started, "exit": proc.returncode,
            "peak_rss_mb": peak_total / 2**20, "peak_process_mb": peak_one / 2**20,
            "peak_process": peak_name, "stderr_tail": err.strip().splitlines()[-3:]}


def _timed(fn, timeout: float) -> dict:
    """Seconds ``fn()`` took in a thread, or a timeout marker (the thread is left behind)."""
    import threading
    result: dict = {}

    def work():
        t0 = time.perf_counter()
        try:
            result["value"] = fn()
        except Exception as exc:  # a failed step is reported, the others still run
            result["error"] = repr(exc)
        result["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"seconds": None, "timeout": timeout}
    return result


def measure_mount(path: Path, count: int, timeout: float, env: dict) -> dict:
    """First record, stat, ls and records.jsonl of ``path``'s view through a real mount."""
    out: dict = {}
    work = Path(tempfile.mkdtemp(prefix="bigjournal-mnt-"))
    mnt, store = work / "mnt", work / "store"
    mnt.mkdir()
    log = open(work / "mount.log", "wb")
    daemon = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "mount", "--foreground",
                               "--store", str(store), str(path.parent), str(mnt)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mount failed: {(work / 'mount.log').read_text()[-2000:]}")
            time.sleep(0.05)
        view = mnt / ".journalfs" / "records" / path.name
        kind = next(k for _fmt, (_g, name, k) in GENERATORS.items() if name == path.name)
        out["first_record"] = _timed(lambda: len((view / f"00000000.{kind}").read_bytes()), timeout)
        out["stat_records_jsonl"] = _timed(lambda: os.stat(view / "records.jsonl").st_size, timeout)
        out["ls_view"] = _timed(lambda: sum(1 for _ in os.scandir(view)), timeout)

        def read_jsonl() -> int:
            total = 0
            with open(view / "records.jsonl", "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
            return total
        jsonl = _timed(read_jsonl, timeout)
        if jsonl.get("seconds"):
            jsonl["mb_s"] = jsonl.get("value", 0) / jsonl["seconds"] / MB
        out["read_records_jsonl"] = jsonl
        try:
            with open(f"/proc/{daemon.pid}/status") as f:
                out["daemon_peak_rss_mb"] = next(int(l.split()[1]) for l in f
                                                 if l.startswith("VmHWM")) / 1024
        except OSError:
            pass
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


def measure(fmt: str, megabytes: int, skip: set[str], master: str | None, timeout: float) -> dict:
    path, count = journal(fmt, megabytes)
    size = path.stat().st_size
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cli = [sys.executable, "-m", "journalfs.cli"]
    row: dict = {"format": fmt, "bytes": size, "records": count}
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache
    row["cat"] = run_measured(["cat", str(path)])
    row["cli_records_json"] = run_measured([*cli, "records", str(path), "--json"], env=env,
                                           timeout=timeout)
    row["cli_fsck"] = run_measured([*cli, "fsck", str(path)], env=env, timeout=timeout)
    if "mount" not in skip:
        row["mount"] = measure_mount(path, count, timeout, env)
    if "pipeline" not in skip:
        out = Path(tempfile.mkdtemp(prefix="bigjournal-out-")) / "tables"
        argv = [*cli, "pipeline", str(path), str(out)] + (["--master", master] if master else [])
        row["pipeline"] = run_measured(argv, env=env, timeout=timeout)
        shutil.rmtree(out.parent, ignore_errors=True)
    return row


# -- scaling: one process vs Spark executors ------------------------------------------------------

def single_process(path: Path) -> dict:
    """The data source's own work without Spark, in this one process: plan the file into
    slices, decode and convert every slice to Arrow batches of the contract schema."""
    from journalfs.spark.plan import list_journals, plan
    from journalfs.spark.read import read_slice
    from journalfs.spark.source import BATCH_ROWS
    t0, c0 = time.perf_counter(), time.process_time()
    rows = 0
    for group in plan(list_journals(str(path)), 1, cache_dir=None).groups:
        for sl in group:
            rows += sum(b.num_rows for b in read_slice(sl, False, None, BATCH_ROWS))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"rows": rows, "seconds": wall, "cpu_seconds": cpu, "rows_per_cpu_s": rows / cpu}


def cluster_runs(path: Path, executors: list[int], work: Path) -> list[dict]:
    """``spark.read.format("journal")`` of ``path`` forced through a ``noop`` write on a real
    standalone cluster (master + one 1-core worker per executor on 127.0.0.1), for each
    executor count; the daemons are stopped by pid."""
    import pyspark
    from journalfs.spark.session import build_session, package_zip
    from journalfs.spark.testing import free_port, stop_processes
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    results = []
    for count in executors:
        port = free_port()
        url = f"spark://127.0.0.1:{port}"
        procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master",
                                   "--host", "127.0.0.1", "--port", str(port),
                                   "--webui-port", str(free_port())],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  start_new_session=True)]
        try:
            time.sleep(5)
            for n in range(count):
                procs.append(subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--cores", "1", "--memory", "2g", "--webui-port", str(free_port()),
                     "--work-dir", str(work / f"w{count}-{n}"), url],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                    start_new_session=True))
            spark = build_session(url, "bigjournal-scaling", {
                "spark.executor.cores": "1", "spark.cores.max": str(count),
                "spark.executor.memory": "1g", "spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.addPyFile(package_zip(str(work)))
            jsc = spark.sparkContext._jsc.sc()
            deadline = time.monotonic() + 300
            while jsc.getExecutorMemoryStatus().size() < count + 1:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {jsc.getExecutorMemoryStatus().size() - 1} executors")
                time.sleep(0.5)
            spark.range(4).repartition(count).count()  # warm the executors' Python workers
            t0 = time.perf_counter()
            spark.read.format("journal").option("parallelism", str(count)).load(str(path)) \
                .write.format("noop").mode("overwrite").save()
            results.append({"executors": count, "seconds": time.perf_counter() - t0})
            spark.stop()
        finally:
            stop_processes(procs)
    return results


def _cell(entry: dict | None, key: str = "seconds") -> str:
    if not entry:
        return "-"
    if entry.get("timeout"):
        return f">{entry['timeout']:.0f} s"
    value = entry.get(key)
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[dict]) -> None:
    head = (f"{'format':<15}{'MB':>6}{'records':>12}{'cat s':>7}{'records --json s':>17}"
            f"{'MB RSS':>8}{'fsck s':>8}{'MB RSS':>8}{'1st rec s':>10}{'stat s':>8}{'ls s':>8}"
            f"{'jsonl MB/s':>11}{'pipeline s':>11}{'MB RSS':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        mount = r.get("mount", {})
        jsonl = mount.get("read_records_jsonl", {})
        pipe = r.get("pipeline")
        speed = f"{jsonl['mb_s']:.0f}" if jsonl.get("mb_s") else _cell(jsonl)
        print(f"{r['format']:<15}{r['bytes'] / MB:>6.0f}{r['records']:>12,}{_cell(r['cat']):>7}"
              f"{_cell(r['cli_records_json']):>17}{r['cli_records_json']['peak_rss_mb']:>8.0f}"
              f"{_cell(r['cli_fsck']):>8}{r['cli_fsck']['peak_rss_mb']:>8.0f}"
              f"{_cell(mount.get('first_record')):>10}{_cell(mount.get('stat_records_jsonl')):>8}"
              f"{_cell(mount.get('ls_view')):>8}"
              f"{speed:>11}"
              f"{_cell(pipe):>11}{(pipe['peak_rss_mb'] if pipe else 0):>8.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1000, help="journal size per format (MB)")
    parser.add_argument("--formats", default=",".join(GENERATORS))
    parser.add_argument("--skip", default="", help="comma list of: mount, pipeline")
    parser.add_argument("--master", default=None, help="Spark master for the pipeline")
    parser.add_argument("--timeout", type=float, default=600, help="per step, seconds")
    parser.add_argument("--scaling", action="store_true",
                        help="instead: the first format's journal read by one process and by "
                             "1 and 2 executors of a standalone cluster")
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(GENERATORS)
    if unknown:
        parser.error(f"no generator for: {', '.join(sorted(unknown))} "
                     f"(have: {', '.join(GENERATORS)})")
    skip = {s for s in args.skip.split(",") if s}
    if args.scaling:
        path, count = journal(formats[0], args.mb)
        work = Path(tempfile.mkdtemp(prefix="bigjournal-cluster-"))
        try:
            single = single_process(path)
            runs = cluster_runs(path, [1, 2], work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for run in runs:
            run["rows_per_s"] = count / run["seconds"]
            run["rows_per_s_per_executor"] = run["rows_per_s"] / run["executors"]
        print(f"one process (no Spark): {single['rows_per_cpu_s']:,.0f} rows per CPU-second "
              f"({single['seconds']:.1f} s wall)")
        for run in runs:
            print(f"{run['executors']} executor(s): {run['seconds']:.1f} s, "
                  f"{run['rows_per_s']:,.0f} rows/s, {run['rows_per_s_per_executor']:,.0f} per executor")
        print(json.dumps({"benchmark": "bigjournal-scaling", "format": formats[0], "mb": args.mb,
                          "records": count, "load": os.getloadavg()[0], "single": single,
                          "cluster": runs}, indent=1))
        return 0
    rows = []
    for fmt in formats:
        rows.append(measure(fmt, args.mb, skip, args.master, args.timeout))
        print(f"measured {fmt}", file=sys.stderr, flush=True)
    print_table(rows)
    print(json.dumps({"benchmark": "bigjournal", "mb": args.mb, "load": os.getloadavg()[0],
                      "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
