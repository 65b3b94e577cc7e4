"""Benchmark: the `journal` Spark data source vs a single-process reader and vs binaryFile.

    .venv/bin/python bench/spark.py --pipeline [ROWS] [--size GB | --sizes GB,GB | --input DIR]
                                    [--rounds N] [--out bench/out]
    .venv/bin/python bench/spark.py [--size GB] [--out bench/out]

``--pipeline``: in one run over the same files, one Python process writing every table of
the pipeline with pyarrow (the data source's reader, the pipeline's own per-batch partials
and gvfs replay), then `journalfs pipeline` on local[1], local[2], a standalone cluster
started here on 127.0.0.1 with one executor of 1 and of 2 cores, `binaryFile` +
`mapInArrow` writing the records with Spark's writer, and local[2] with the input in a moto
S3 server on 127.0.0.1; wall time and CPU seconds per component (driver JVM, executor JVM,
Python workers, driver Python) from /proc, and the largest RSS of one Python worker.
``--sizes 0.25,1``: every row on the generated corpus of each size, in one run and one
table (the README's), each size's rows interleaved over ``--rounds``.

Without ``--pipeline``, the data source alone:

Generates (once, cached under OUT/spark-corpus-<size>GB/) a corpus mixing every format: a
few big journals (kestrel, wallaby log + index, akka: 2.8, 2.0 + 0.8 and 1.2 GB at the default
8 GB) and many small files. Then, in the
same run and over the same files:
  decode     (information only) one Python process: sniff + mmap + codec.read_columns, no
             conversion to the contract schema
  single     one Python process doing the data source's own work without Spark: listing and
             planning, then every slice decoded AND converted to Arrow batches of the
             contract schema (the baseline the Spark runs are compared with)
  ds-local1  spark.read.format("journal") on local[1]
  ds-local2  spark.read.format("journal") on local[2]
  ds-local2-u2g, binaryFile-u2g
             the data source on local[2], and spark.read.format("binaryFile") + mapInArrow on
             local[2] decoding and converting each file's bytes with the very same reader code
             (read_buffer), both over the files binaryFile can load at all (< 2 GiB each: it
             holds a whole file in one byte array; the 2.8 GB queue journal is left out)
Spark runs force every column through the JVM with a `noop` write; `single` builds the same
batches in Python. Memory is the peak of
anonymous RSS (heap, not page cache of mapped files) over the whole process tree (driver
JVM + Python workers), and separately of the largest single Python worker.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from journalfs.formats import CODECS, kestrel  # noqa: E402
from journalfs.formats.akka import AkkaData  # noqa: E402
from journalfs.formats.wallaby import write_log_and_index  # noqa: E402
from journalfs.journals import mapped, sniff_file  # noqa: E402

MB = 1_000_000
#: Spark's binaryFile cannot load a file bigger than this (one byte array); corpus files up to
#: it live under UNDER_2G, which binaryFile reads (beside the data source on the same files).
BINARY_FILE_MAX = 2**31 - 1
UNDER_2G = "under2g"
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
RNG = np.random.default_rng(7)


# -- corpus -----------------------------------------------------------------------------------

def _payloads(n: int, lo: int = 50, hi: int = 350) -> list[bytes]:
    sizes = RNG.integers(lo, hi, n)
    blob = RNG.integers(0, 256, int(sizes.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(sizes)
    return [blob[e - s:e] for s, e in zip(sizes.tolist(), ends.tolist())]


def _repeat_body(path: Path, head: bytes, body: bytes, target: int) -> None:
    """A file of ``head`` then whole copies of ``body`` (self-contained records) up to ``target``."""
    with open(path, "wb") as f:
        f.write(head)
        written = len(head)
        while written + len(body) <= target:
            f.write(body)
            written += len(body)


def _akka_data(path: Path, meta_path: Path, target: int, pids: int = 64, payload: int = 150) -> None:
    """A linked akka data file built with numpy (self offsets must be real, so no repeating)."""
    block = 24 + payload
    n = min((target - 8) // block, (2**31 - 1 - 8) // block)
    offsets = 8 + np.arange(n, dtype=np.int64) * block
    rec = np.zeros(n, dtype=[("size", ">i4"), ("self", ">i4"), ("prev", ">i4"), ("next", ">i4"),
                             ("seq", ">i8"), ("payload", f"V{payload}")])
    rec["size"] = block
    rec["self"] = offsets
    idx = np.arange(n)
    rec["prev"] = np.where(idx >= pids, offsets - pids * block, 0)
    rec["next"] = np.where(idx + pids < n, offsets + pids * block, 0)
    rec["seq"] = idx // pids + 1
    with open(path, "wb") as f:
        f.write(b"AKFD" + int(n * block).to_bytes(4, "big"))
        rec.tofile(f)
    metas = []
    for p in range(min(pids, n)):
        last = p + ((n - 1 - p) // pids) * pids
        metas.append({"persistence_id": f"pid-{p}", "first": int(offsets[p]), "last": int(offsets[last]),
                      "highest_seq": int(last // pids + 1)})
    meta_path.write_bytes(CODECS["akka-meta"].write(metas))


def _small_files(d: Path, budget: int, shared: Path | None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    n, used = 0, 0
    while used < budget:
        kind = n % 4
        if kind == 0:
            data = kestrel.build_writer_file(_payloads(200), first_id=1 + n * 1000)
            (d / f"q{n}.{1700000000000 + n}").write_bytes(data)
        elif kind == 1:
            log, idx = write_log_and_index([(10**18 + i, p) for i, p in enumerate(_payloads(200))])
            (d / f"w{n}.log").write_bytes(log)
            (d / f"w{n}.log.idx").write_bytes(idx)
            data = log + idx
        elif kind == 2:
            txs = [{"time": 1_700_000_000 + i, "complete": i % 3 != 0,
                    "ops": [{"op": "alloc", "page": i}, {"op": "complete"}]} for i in range(300)]
            data = CODECS["jrnl"].write(txs)
            (d / f"db{n}.jrnl").write_bytes(data)
        else:
            data, meta = AkkaData.build([(f"p{i % 9}", i // 9 + 1, p) for i, p in enumerate(_payloads(150))])
            (d / f"a{n}").mkdir()
            (d / f"a{n}" / "data").write_bytes(data)
            (d / f"a{n}" / "meta").write_bytes(meta)
        used += len(data)
        n += 1
    if shared:  # a few real gvfs stores
        for i, snap in enumerate(sorted(shared.glob("conformance/gvfs/*/snapshots/*"))[:6]):
            shutil.copytree(snap / "gvfs-metadata", d / f"gvfs{i}")


def corpus(out: Path, size_gb: float) -> Path:
    root = out / f"spark-corpus-{size_gb:g}GB"
    if (root / ".done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    big = root / UNDER_2G / "big"
    big.mkdir(parents=True)
    total = int(size_gb * 1e9)
    print(f"generating {size_gb:g} GB corpus under {root} ...", file=sys.stderr)
    chunk = kestrel.build_writer_file(_payloads(40000))
    queue_size = int(total * 0.35)
    queue_dir = root / "over2g" if queue_size > BINARY_FILE_MAX else big  # binaryFile cannot
    queue_dir.mkdir(exist_ok=True)
    _repeat_body(queue_dir / "jobs.1700000000000", chunk[:4], chunk[4:], queue_size)
    log, idx = write_log_and_index([(10**18 + i, p) for i, p in enumerate(_payloads(40000))])
    _repeat_body(big / "events.log", log[:16], log[16:], int(total * 0.25))
    _repeat_body(big / "events.log.idx", idx[:16], idx[16:], int(total * 0.10))
    (big / "akka").mkdir()
    _akka_data(big / "akka" / "data", big / "akka" / "meta", int(total * 0.15))
    corpus = REPO / "tests" / "data" / "conformance"
    _small_files(root / UNDER_2G / "small", int(total * 0.15), corpus.parent if corpus.exists() else None)
    (root / ".done").write_text("ok")
    return root


# -- measuring ----------------------------------------------------------------------------------

def _anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakMemory:
    """Polls anonymous RSS of this process tree; remembers the total and the largest Python worker."""

    def __init__(self):
        import psutil
        self.me = psutil.Process()
        self.tree_kb = self.worker_kb = 0
        self._stop = threading.Event()

    def _poll(self):
        while not self._stop.wait(0.1):
            procs = [self.me] + self.me.children(recursive=True)
            sizes = {p.pid: _anon_kb(p.pid) for p in procs}
            self.tree_kb = max(self.tree_kb, sum(sizes.values()))
            for p in procs[1:]:
                try:
                    if "python" in p.name():
                        self.worker_kb = max(self.worker_kb, sizes[p.pid])
                except Exception:
                    pass

    def __enter__(self):
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def single_process(root: Path) -> int:
    """The data source's planning + reading + conversion, in this process, no Spark."""
    from journalfs.spark.plan import list_journals, plan
    from journalfs.spark.read import read_slice
    from journalfs.spark.source import BATCH_ROWS
    rows = 0
    for group in plan(list_journals(str(root)), 1, cache_dir=None).groups:
        for sl in group:
            for batch in read_slice(sl, False, BATCH_ROWS):
                rows += batch.num_rows
    return rows


def decode_only(root: Path) -> int:
    rows = 0
    for d, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            codec = sniff_file(path)
            if codec is None:
                continue
            with mapped(path) as buf:
                start, seq = None, 0
                while True:
                    cols = codec.read_columns(buf, path, start, seq, None, 16384)
                    rows += cols.rows
                    seq = cols.next_seq
                    if cols.error is not None or cols.next_offset is None:
                        break
                    start = cols.next_offset
    return rows


def _decode_binary_files(batches):
    from journalfs.formats import detect
    from journalfs.spark.plan import FileSlice, JournalFile, key_partners
    from journalfs.spark.read import read_buffer
    from journalfs.spark.source import BATCH_ROWS
    for batch in batches:
        for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
            codec = detect(content[:64])
            if codec is None:
                continue
            local = path.removeprefix("file:")
            partners = key_partners(JournalFile(local, codec.name, len(content)), [])
            yield from read_buffer(content, FileSlice(local, codec.name, partners=partners), False,
                                   BATCH_ROWS)


# -- the pipeline against one process writing the same records table with pyarrow ---------------

def single_parquet(root: Path, out: Path) -> int:
    """One Python process: list, plan, decode and convert every slice (the data source's own
    code) and write the pipeline's tables with pyarrow: OUT/records/format=F/part-0.parquet,
    ``queues``, ``persistence`` and ``transactions`` from the same per-batch partials the
    pipeline's tasks make, and ``metadata`` by replaying each gvfs store's rows (the code
    the pipeline runs in its Python workers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from journalfs.spark import derived
    from journalfs.spark.pipeline import write_arrow
    from journalfs.spark.plan import list_journals, plan
    from journalfs.spark.read import read_slice
    from journalfs.spark.schema import arrow_schema
    from journalfs.spark.source import BATCH_ROWS
    schema = arrow_schema()
    without_format = schema.remove(schema.get_field_index("format"))
    writers: dict[str, pq.ParquetWriter] = {}
    parts: dict[str, list] = {name: [] for name in derived.IN_PASS}
    stores: dict[str, list] = {}
    gvfs = {derived.GVFS_TREE, derived.GVFS_JOURNAL}
    rows = 0
    try:
        for group in plan(list_journals(str(root)), 1, cache_dir=None).groups:
            for sl in group:
                for batch in read_slice(sl, False, BATCH_ROWS):
                    fmt = sl.format
                    if fmt not in writers:
                        d = out / "records" / f"format={fmt}"
                        d.mkdir(parents=True, exist_ok=True)
                        writers[fmt] = pq.ParquetWriter(d / "part-0.parquet", without_format,
                                                        compression="snappy")
                    writers[fmt].write_batch(batch.drop_columns(["format"]))
                    for name, part in derived.partials(batch).items():
                        parts[name].append(part)
                    if fmt in gvfs:
                        store = sl.path if fmt == derived.GVFS_TREE else \
                            re.sub(derived.JOURNAL_SUFFIX, "", sl.path)
                        stores.setdefault(store, []).append(batch)
                    rows += batch.num_rows
    finally:
        for w in writers.values():
            w.close()
    for name, p in parts.items():
        write_arrow(derived.finish(name, p), str(out / name))
    replayed = []
    for store, batches in sorted(stores.items()):
        t = pa.Table.from_batches(batches)
        t = t.select(["source", "format", "seq", "kind", "key", "attrs"])
        t = t.add_column(0, "store", pa.repeat(pa.scalar(store), t.num_rows))
        replayed.append(derived._replay_group(t))
    write_arrow(pa.concat_tables(replayed) if replayed else
                derived._metadata_schema().empty_table(), str(out / "metadata"))
    return rows


def _classify(cmdline: bytes, comm: str) -> str | None:
    """A process's component by its command line (None: not known yet, e.g. the
    ``spark-class`` script before it execs java)."""
    argv = cmdline.split(b"\0")
    program = os.path.basename(argv[0])
    if program == b"java":
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return "executor_jvm"
        if b"deploy.worker.Worker" in cmdline or b"deploy.master.Master" in cmdline:
            return "cluster_daemons"
        return "driver_jvm"
    if program.startswith(b"python"):
        if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
            return "python_workers"  # the daemon and the workers it forks
        return "python_driver"
    return None if not cmdline or program in (b"bash", b"sh") else comm


#: (pid, start time) -> component, as last seen (an exiting process's cmdline reads empty)
_KNOWN: dict[tuple[int, str], str] = {}


def _session_processes(sessions: set[int]):
    """(pid, component, CPU seconds, RSS kB) of every process in ``sessions``."""
    tick = os.sysconf("SC_CLK_TCK")
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) not in sessions:
            continue
        key = (int(pid), fields[19])  # with its start time: pids are reused
        what = _classify(cmdline, stat[stat.index("(") + 1:stat.rindex(")")]) or \
            _KNOWN.get(key, "scripts")
        _KNOWN[key] = what
        yield int(pid), what, (int(fields[11]) + int(fields[12])) / tick, int(fields[21]) * page_kb


def run_measured(cmd: list[str], env: dict | None = None, sessions: tuple[int, ...] = ()) -> dict:
    """Wall time and CPU seconds by component (driver JVM, executor JVMs, Python workers,
    the driver's Python) of a command and every process of its session, sampled from /proc
    every 0.1 s; ``sessions``: other sessions to count too (a standalone worker's, whose
    executors it starts), less what their processes had used before the command."""
    import subprocess
    before = {pid: c for pid, _w, c, _r in _session_processes(set(sessions))}
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    cpu: dict[int, tuple[str, float]] = {}
    peak: dict[str, int] = {}  # component -> largest RSS of one of its processes (kB)
    watched = {proc.pid, *sessions}
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        for pid, what, c, rss_kb in _session_processes(watched):
            cpu[pid] = (what, c - before.get(pid, 0))
            peak[what] = max(peak.get(what, 0), rss_kb)
        time.sleep(0.1)
    seconds = time.perf_counter() - t
    # executors outlive the application by a moment: their last CPU seconds
    deadline = time.monotonic() + 3
    while sessions and time.monotonic() < deadline:
        alive = [pid for pid, what, c, _r in _session_processes(set(sessions))
                 if what in ("executor_jvm", "python_workers")]
        for pid, what, c, _r in _session_processes(set(sessions)):
            cpu[pid] = (what, c - before.get(pid, 0))
        if not alive:
            break
        time.sleep(0.1)
    reader.join()
    err = "".join(stderr)
    by: dict[str, float] = {}
    for what, c in cpu.values():
        by[what] = round(by.get(what, 0) + c, 1)
    return {"seconds": round(seconds, 2), "rc": proc.returncode, "cpu_s": by,
            "peak_rss_mb": {k: round(v / 1024) for k, v in peak.items()},
            "error": err.strip().splitlines()[-1] if proc.returncode not in (0, 3) and err.strip() else None}


def _wait_for_line(log: Path, text: str, procs, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a Spark daemon exited early; see {log}")
        time.sleep(0.5)
    raise RuntimeError(f"{text!r} did not appear in {log}")


@contextlib.contextmanager
def standalone(work: Path, cores: int):
    """A standalone master and one worker of ``cores`` cores on 127.0.0.1, started from the
    pyspark package's own scripts and stopped by pid; yields (master URL, the worker's
    session id, under which it starts its executors)."""
    import subprocess
    import pyspark
    from journalfs.spark.testing import free_port, stop_processes
    home = os.path.dirname(pyspark.__file__)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_WORKER_DIR=str(work / "worker"),
               SPARK_LOG_DIR=str(work / "logs"), SPARK_NO_DAEMONIZE="1",
               PYTHONPATH=str(REPO))
    spark_class = os.path.join(home, "bin", "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list = []
    try:
        with open(work / "master.log", "w") as log:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for_line(work / "master.log", "I have been elected leader", procs)
        with open(work / "worker.log", "w") as log:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", "2g", "--webui-port", str(free_port()),
                 "--work-dir", str(work / "worker"), url],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for_line(work / "master.log", "Registering worker", procs)
        yield url, procs[1].pid
    finally:
        stop_processes(procs)


def binary_file_job(root: str, out: str, master: str) -> None:
    """What a user without the ``journal`` source would do: ``binaryFile`` (each file whole,
    as one value) + ``mapInArrow`` running the data source's reader on the bytes, written
    by Spark's Parquet writer partitioned by format. The records table only (akka data
    files get no persistence ids: a file's partner is not in its row)."""
    from journalfs.spark.schema import DDL
    from journalfs.spark.session import build_session
    spark = build_session(master, "bench binaryFile", {
        "spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false",
        # few whole files per Arrow batch, to bound the JVM's and the worker's memory
        ARROW_BATCH_CONF: "16"}, journal_source=False)
    df = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(root) \
        .mapInArrow(_decode_binary_files, DDL)
    df.write.mode("overwrite").partitionBy("format").parquet(os.path.join(out, "records"))
    spark.stop()


@contextlib.contextmanager
def s3_copy(root: Path):
    """A moto S3 server on 127.0.0.1 (`moto[server]`, the test extra) holding a copy of
    ``root`` under s3://bench/in; yields (URI, environment for the pipeline)."""
    import socket
    import subprocess
    from pyarrow import fs
    from journalfs.spark.testing import free_port, stop_processes
    port = free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                               "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.2)
        env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        remote = fs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1",
                                 scheme="http", endpoint_override=f"127.0.0.1:{port}",
                                 allow_bucket_creation=True)
        remote.create_dir("bench")
        fs.copy_files(str(root), "bench/in", source_filesystem=fs.LocalFileSystem(),
                      destination_filesystem=remote)
        yield "s3a://bench/in", env
    finally:
        stop_processes([server])


#: The rows of ``--pipeline`` (all by default), in the order they run.
PIPELINE_ROWS = ("local[1]", "local[2]", "cluster-1core", "cluster-2cores", "binaryFile",
                 "s3")


def pipeline_rows(root: Path, out: Path, rows: list[str], extra: list[str],
                  rounds: int = 1, table: bool = True) -> dict:
    """`journalfs pipeline` against :func:`single_parquet` on the same files, in one run:
    ``local[N]`` or a ``spark://`` master as given; ``cluster-Ncore(s)``: a standalone
    master and one worker of N cores started here on 127.0.0.1; ``binaryFile``:
    :func:`binary_file_job` on local[2]; ``s3``: local[2] with the input copied into a
    moto S3 server on 127.0.0.1. ``rounds``: every row that many times, interleaved (the
    single process, then each row, then again); each row's fastest round is reported."""
    results: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cli = [sys.executable, "-m", "journalfs.cli", "pipeline"]

    def dest(name: str) -> Path:
        d = out / ("run-" + "".join(ch if ch.isalnum() else "-" for ch in name))
        shutil.rmtree(d, ignore_errors=True)
        return d

    def keep(name: str, result: dict) -> None:
        """The fastest round's figures, with every round's wall time and the largest RSS of
        any round."""
        before = results.get(name, {})
        result["rounds_s"] = before.get("rounds_s", []) + [result["seconds"]]
        peak = dict(before.get("peak_rss_mb", {}))
        for what, mb in result.get("peak_rss_mb", {}).items():
            peak[what] = max(peak.get(what, 0), mb)
        if before and before["seconds"] <= result["seconds"]:
            result = dict(before, rounds_s=result["rounds_s"])
        results[name] = dict(result, peak_rss_mb=peak)
        print(f"{name}: {result}", file=sys.stderr)

    with contextlib.ExitStack() as stack:
        for _round in range(rounds):
            target = dest("single-parquet")
            t, c = time.perf_counter(), time.process_time()
            single_parquet(root, target)
            keep("single process", {"seconds": round(time.perf_counter() - t, 2), "rc": 0,
                                    "cpu_s": {"python_driver": round(time.process_time() - c, 1)}})
            for row in rows:
                if row.startswith("cluster-"):
                    cores = int(row.split("-")[1].rstrip("cores"))
                    with standalone(out / f"cluster-{cores}", cores) as (url, worker):
                        name = f"pipeline, standalone, 1 executor of {cores} core{'s' * (cores > 1)}"
                        keep(name, run_measured([*cli, str(root), str(dest(row)), "--master", url,
                                                 *extra], env, sessions=(worker,)))
                elif row == "binaryFile":
                    keep("binaryFile + mapInArrow, local[2] (records only)", run_measured(
                        [sys.executable, str(Path(__file__).resolve()), "--binaryfile-job",
                         str(root), str(dest(row)), "local[2]"], env))
                elif row == "s3":
                    if "s3" not in results:  # one copy into one server for every round
                        results["s3"] = {"server": stack.enter_context(s3_copy(root))}
                    uri, s3_env = results["s3"]["server"]
                    keep("pipeline local[2], input in S3 (moto on 127.0.0.1)", run_measured(
                        [*cli, uri, str(dest(row)), "--master", "local[2]", *extra],
                        dict(env, **s3_env)))
                else:
                    keep(f"pipeline {row}", run_measured([*cli, str(root), str(dest(row)),
                                                          "--master", row, *extra], env))
        results.pop("s3", None)
    if table:
        print_pipeline_table([("", results)], rounds)
    return results


def print_pipeline_table(inputs: list[tuple[str, dict]], rounds: int) -> None:
    """The README's table of :func:`pipeline_rows`' results, one block of rows per input
    (``inputs``: (its label, e.g. "0.25 GB", or "" for one input; its results))."""
    label = any(name for name, _r in inputs)
    print("\n|" + " input |" * label + " run | wall s | ÷ single | CPU-s: driver JVM | executor JVM "
          "| Python workers | driver Python | largest Python worker RSS |")
    print("|" + "---|" * (8 + label))
    for input_name, results in inputs:
        base = results["single process"]["seconds"]
        for name, r in results.items():
            cpu, rss = r["cpu_s"], r.get("peak_rss_mb", {})
            cells = [f"{cpu[k]:.1f}" if k in cpu else "–" for k in
                     ("driver_jvm", "executor_jvm", "python_workers", "python_driver")]
            print("|" + f" {input_name} |" * label
                  + f" {name} | {r['seconds']:.1f} | {r['seconds'] / base:.2f}× | "
                  + " | ".join(cells) + f" | {rss.get('python_workers', '–')} MB |"
                  + (f" FAILED: {r['error']}" if r.get("error") else ""))
    print(f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}, fastest of {rounds} "
          "interleaved round(s)")


def spark_session(master: str, heap: str):
    """A warm session (JVM and Python workers started) so that only the query is timed."""
    from journalfs.spark.session import build_session
    spark = build_session(master, "bench", {
        "spark.driver.memory": heap, "spark.ui.showConsoleProgress": "false"})
    spark.range(4).mapInArrow(lambda it: it, "id long").count()
    return spark


def spark_run(spark, root: Path, method: str) -> None:
    from journalfs.spark.schema import DDL
    # binaryFile needs few files (whole contents) per Arrow input batch to bound its memory;
    # the data source's own batches must not be cut that small (64 rows made it ~2x slower)
    if method == "binaryFile":
        spark.conf.set(ARROW_BATCH_CONF, "64")
    else:
        spark.conf.unset(ARROW_BATCH_CONF)
    if method == "binaryFile":
        df = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(str(root)) \
            .mapInArrow(_decode_binary_files, DDL)
    else:
        df = spark.read.format("journal").option("checkpointCache", "") \
            .option("parallelism", str(spark.sparkContext.defaultParallelism)).load(str(root))
    df.write.format("noop").mode("overwrite").save()


def _tree_bytes(root: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=8.0,
                    help="corpus size in GB (default 8: journals of 2.8, 2.0 and 1.2 GB)")
    ap.add_argument("--sizes", default=None, metavar="GB,GB",
                    help="with --pipeline: every row on the corpus of each size (e.g. 0.25,1), "
                         "one table")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    ap.add_argument("--skip", default="", help="comma list of methods to skip")
    # One JVM serves every session of a run, so one heap for all. binaryFile holds whole files
    # (bytes, row and Arrow copies of each): a 2 GB journal does not fit 6g; the data source's
    # bounded batches need far less (its peak is reported either way).
    ap.add_argument("--heap", default="16g", help="Spark driver heap (default 16g)")
    ap.add_argument("--pipeline", nargs="?", const=",".join(PIPELINE_ROWS), default=None,
                    metavar="ROWS",
                    help="instead: `journalfs pipeline` against one Python process writing the "
                         "same tables with pyarrow, CPU seconds per component; ROWS (comma "
                         f"list, default all): {', '.join(PIPELINE_ROWS)}, or a spark:// master")
    ap.add_argument("--input", default=None, help="with --pipeline: this directory, not the corpus")
    ap.add_argument("--rounds", type=int, default=1, help="with --pipeline: every row this many "
                    "times, interleaved; the fastest round of each is reported")
    ap.add_argument("--binaryfile-job", nargs=3, metavar=("ROOT", "OUT", "MASTER"),
                    help=argparse.SUPPRESS)  # the binaryFile row's own process
    args = ap.parse_args(argv)
    if args.binaryfile_job:
        binary_file_job(*args.binaryfile_job)
        return 0
    if args.pipeline:
        rows = [m for m in args.pipeline.split(",") if m]
        if args.input:
            inputs = [("", Path(args.input))]
        else:
            sizes = [float(x) for x in args.sizes.split(",")] if args.sizes else [args.size]
            # every corpus first: generating one must not fall between the rows of another
            inputs = [(f"{size:g} GB" if args.sizes else "", corpus(Path(args.out), size))
                      for size in sizes]
        started = time.perf_counter()
        done = []
        for label, root in inputs:
            if len(inputs) > 1:
                print(f"-- {label}: {root}", file=sys.stderr)
            done.append((label, root, pipeline_rows(root, Path(args.out) / "pipeline-runs",
                                                    rows, [], args.rounds, table=len(inputs) == 1)))
        if len(inputs) > 1:
            print_pipeline_table([(label, results) for label, _root, results in done],
                                 args.rounds)
        print(f"{time.perf_counter() - started:.0f} s for the whole run")
        print(json.dumps([{"input": str(root), "mb": round(_tree_bytes(root) / MB),
                           "results": results} for _label, root, results in done]))
        return 0
    root = corpus(Path(args.out), args.size)
    total_bytes = _tree_bytes(root)
    biggest = max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    methods = [("decode", None), ("single", None), ("ds-local1", "local[1]"), ("ds-local2", "local[2]"),
               ("ds-local2-u2g", "local[2]"), ("binaryFile-u2g", "local[2]")]
    skip = set(filter(None, args.skip.split(",")))
    results = {}
    failed: dict[str, str] = {}
    records = None
    spark, spark_master = None, None
    for method, master in methods:
        if method in skip:
            continue
        if master and master != spark_master:
            if spark is not None:
                spark.stop()
            spark, spark_master = spark_session(master, args.heap), master
        with PeakMemory() as mem:
            t = time.perf_counter()
            if method == "decode":
                decode_only(root)
            elif master is None:
                records = single_process(root)
            else:
                try:
                    spark_run(spark, root / UNDER_2G if method.endswith("-u2g") else root,
                              "binaryFile" if method.startswith("binaryFile") else "journal")
                except Exception as exc:  # e.g. binaryFile running out of memory: say so, go on
                    why = str(exc).splitlines()[0][:300]
                    if isinstance(exc, ConnectionError):
                        why = f"the Spark JVM died ({why}; dmesg shows if the OOM killer took it)"
                    print(f"{method} failed: {why}", file=sys.stderr)
                    failed[method] = why
                    try:
                        spark.stop()
                    except Exception:  # the JVM itself died (e.g. out of heap)
                        pass
                    spark, spark_master = None, None
                    continue
            seconds = time.perf_counter() - t
        results[method] = {"seconds": round(seconds, 2), "peak_tree_anon_mb": round(mem.tree_kb / 1024),
                           "peak_worker_anon_mb": round(mem.worker_kb / 1024)}
        print(f"{method}: {seconds:.1f}s", file=sys.stderr)
    if spark is not None:
        spark.stop()
    if records is None:
        records = single_process(root)
    sub_records = single_process(root / UNDER_2G) if any(m.endswith("-u2g") for m in results) else 0
    sub_bytes = _tree_bytes(root / UNDER_2G)
    for m, r in results.items():
        n, size = (sub_records, sub_bytes) if m.endswith("-u2g") else (records, total_bytes)
        r["records_per_s"] = round(n / r["seconds"])
        r["mb_per_s"] = round(size / MB / r["seconds"], 1)
    ratios = {}
    if "single" in results:
        for m in ("ds-local1", "ds-local2"):
            if m in results:
                ratios[f"{m}_vs_single"] = round(results["single"]["seconds"] / results[m]["seconds"], 2)
    if "ds-local2-u2g" in results and "binaryFile-u2g" in results:
        ratios["ds-local2_vs_binaryFile (files < 2 GiB)"] = round(
            results["binaryFile-u2g"]["seconds"] / results["ds-local2-u2g"]["seconds"], 2)
    print(f"\ncorpus {root}: {total_bytes / MB:,.0f} MB, {records:,} records, largest file {biggest / MB:,.0f} MB "
          f"(-u2g: the {sub_bytes / MB:,.0f} MB, {sub_records:,} records in files binaryFile can load), "
          f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}")
    print(f"{'method':<16}{'seconds':>9}{'records/s':>12}{'MB/s':>8}{'tree MB':>9}{'worker MB':>11}")
    for m, r in results.items():
        print(f"{m:<16}{r['seconds']:>9.1f}{r['records_per_s']:>12,}{r['mb_per_s']:>8.1f}"
              f"{r['peak_tree_anon_mb']:>9}{r['peak_worker_anon_mb']:>11}")
    for k, v in ratios.items():
        print(f"{k}: {v}x")
    for m, why in failed.items():
        print(f"{m}: FAILED ({why})")
    print(json.dumps({"corpus_mb": round(total_bytes / MB), "records": records,
                      "largest_file_mb": round(biggest / MB), "results": results, "ratios": ratios,
                      "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
