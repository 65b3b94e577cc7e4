"""`journalfs pipeline INPUT OUTPUT`: journals -> Parquet tables, on local Spark or a cluster.

One Spark job reads the journals and writes ``records/`` (partitioned by format): each task
decodes its planned slices and writes their Arrow batches with pyarrow
(:mod:`journalfs.spark.writer`), computing as it goes the partial rows of ``queues/``,
``transactions/`` and ``persistence/`` (for chains: the links a batch holds whole are
checked there, only its loose ends travel), which the driver merges and writes; damage
goes to ``_damage/``. ``metadata/``, which replays a store's tree and journal together, is
then computed from that Parquet: by the driver with pyarrow for a few small stores, else
with DataFrame operations (each store replayed on an executor); only when its formats were
found.
"""
from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import StringType, StructField, StructType
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..fs.indexfiles import user_cache_dir
from . import derived
from .plan import list_journals, local_path, plan
from .schema import spark_schema
from .session import PIPELINE_APP, build_session, package_zip, pipeline_settings
from .storage import is_remote, s3_options
from .writer import write_records

#: Unreadable paths of INPUT named in the summary (the rest are counted).
UNREADABLE_SHOWN = 20


@dataclass
class Summary:
    rows: dict[str, int] = field(default_factory=dict)
    damaged_files: int = 0
    output: str = ""
    #: (path, byte offset, reason) of every damaged file, in path order
    damage: list[tuple[str, int, str]] = field(default_factory=list)
    #: (path, reason) of the files and directories of INPUT that could not be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    files: int = 0
    bytes: int = 0


class StageProgress:
    """A rich progress line fed by Spark's status store (polled from a daemon thread): per
    step, its tasks, the share of the input bytes they cover and the records written so far.
    Shown only on a terminal; elsewhere each step is one plain line."""

    def __init__(self, spark, console, files: int = 0, total_bytes: int = 0):
        self.sc = spark.sparkContext
        self.console = console
        self.files, self.total_bytes = files, total_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.label = ""
        self._seen_stages: set[int] = set()
        self.live = bool(getattr(console, "is_terminal", False))

    def __enter__(self):
        if not self.live:
            return self
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None, detail="")
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def step(self, label: str) -> None:
        self.label = label
        self._seen_stages = self._stage_ids()
        if self.live:
            self.progress.update(self.task, description=label, completed=0, total=None, detail="")
        else:
            self.console.print(f"journalfs pipeline: {label}", highlight=False, soft_wrap=True)

    def _stage_ids(self) -> set[int]:
        try:
            return {int(s.stageId()) for s in self._stages()}
        except Exception:
            return set()

    def _stages(self) -> list:
        store = self.sc._jsc.sc().statusStore()
        stages = store.stageList(None)
        return [stages.apply(i) for i in range(stages.size())]

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            try:
                stages = [s for s in self._stages() if int(s.stageId()) not in self._seen_stages]
                total = sum(int(s.numTasks()) for s in stages)
                done = sum(int(s.numCompleteTasks()) for s in stages)
                written = sum(int(s.outputRecords()) for s in stages)
            except Exception:  # the JVM is shutting down
                return
            detail = f"{done}/{total} tasks" if total else ""
            if self.label.startswith("reading") and total and self.total_bytes:
                detail += (f", {self.files:,} files, ~{done / total * self.total_bytes / 1e6:,.0f}"
                           f" of {self.total_bytes / 1e6:,.0f} MB")
            if written:
                detail += f", {written:,} records written"
            self.progress.update(self.task, completed=done, total=total or None, detail=detail)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        if self.live:
            self.progress.__exit__(*exc)


def _records_schema():
    fields = [f for f in spark_schema().fields if f.name != "format"]
    return StructType(fields + [StructField("format", StringType(), True)])


def run(spark, input_path: str, output: str, console=None, files=None) -> Summary:
    """Write the tables of the journals under ``input_path`` (``files``: its listing, when
    the caller made it already). An input holding no journal raises
    :class:`~journalfs.spark.plan.NoJournalError`."""
    console = console or _console()
    output = os.path.abspath(output)
    records_dir = os.path.join(output, "records")
    summary = Summary(output=output)
    remote = is_remote(input_path)
    storage = s3_options() if remote else ()
    input_path = input_path if remote else local_path(input_path)
    if files is None:
        files = list_journals(input_path, required=True, storage=storage,
                              unreadable=summary.unreadable)
    listed = files
    summary.files, summary.bytes = len(listed), sum(f.size for f in listed)
    with StageProgress(spark, console, summary.files, summary.bytes) as progress:
        present = {f.format for f in listed}
        in_pass = [name for name in derived.IN_PASS if present & set(derived.TABLES[name])]
        progress.step(f"reading journals ({summary.files:,} files, {summary.bytes / 1e6:,.0f} MB)"
                      " -> " + ", ".join(["records", *in_pass]))
        written = write_records(spark, plan_groups(spark, listed, storage), records_dir)
        write_damage(written.damage, os.path.join(output, "_damage"))
        for name, table in written.tables.items():
            if table is not None:
                write_arrow(table, os.path.join(output, name))

        # the tables the pass could not give (see derived.finish) are computed from the records
        tables = [name for name in derived.TABLES
                  if written.tables.get(name) is None and name not in written.on_disk]
        if "metadata" in tables and replayed_here(listed):
            write_arrow(derived.metadata_of_parquet(records_dir), os.path.join(output, "metadata"))
            tables.remove("metadata")
        busy = [name for name in tables if present & set(derived.TABLES[name])]
        # read back only for those: a DataFrame is the SQL engine's set-up in the driver JVM
        records = spark.read.schema(_records_schema()).parquet(_literal(records_dir)) \
            if busy else None
        for name in tables:  # none of its formats found: its columns, no rows, no job
            if name not in busy:
                write_arrow(derived.empty(name), os.path.join(output, name))
        if busy:
            progress.step("writing " + ", ".join(busy))
        # small inputs: each job is mostly fixed driver-side latency (planning, codegen,
        # scheduling), so the tables' jobs run side by side
        pool = ThreadPoolExecutor(max_workers=max(1, len(busy)))
        try:
            jobs = [pool.submit(_write_table, records, name, os.path.join(output, name))
                    for name in busy]
            for job in jobs:
                job.result()
        except BaseException:  # Ctrl-C or a failed table: the others must not run on
            spark.sparkContext.cancelAllJobs()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    for name in ("records", *derived.TABLES, "_damage"):
        summary.rows[name] = parquet_rows(os.path.join(output, name))
    summary.damaged_files = summary.rows["_damage"]  # one damage row per damaged file
    summary.damage = damage_rows(os.path.join(output, "_damage"))
    return summary


def replayed_here(files) -> bool:
    """Whether the ``metadata`` table of ``files`` is replayed by the driver (a few small
    gvfs stores: :data:`journalfs.spark.derived.DRIVER_REPLAY_BYTES`)."""
    gvfs = [f.size for f in files if f.format in derived.TABLES["metadata"]]
    return bool(gvfs) and sum(gvfs) <= derived.DRIVER_REPLAY_BYTES


def plan_groups(spark, files, storage: tuple = ()) -> list:
    """The task groups of ``files``: planned here on the driver from the listing already
    made (the ``journal`` data source would list again and start three Python processes of
    its own: look-up, schema, planning, about 1.5 s each before the first task)."""
    return plan(files, spark.sparkContext.defaultParallelism, cache_dir=user_cache_dir(),
                storage=storage).groups


def _literal(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped: Spark globs the paths it reads
    (an OUTPUT named ``out[2]`` would match nothing)."""
    return re.sub(r"([\[\]{}*?\\])", r"\\\1", path)


def _write_table(records, name: str, path: str) -> None:
    """Derived table ``name`` computed by Spark from ``records``."""
    getattr(derived, name)(records).write.mode("overwrite").parquet(path)


def write_damage(damage: list[tuple[str, int, str]], path: str) -> None:
    """The ``_damage`` table (path, offset, reason; one row per damaged file) from what the
    records' tasks reported: a few rows, written with pyarrow (no Spark job)."""
    schema = pa.schema([("path", pa.string()), ("offset", pa.int64()), ("reason", pa.string())])
    columns: list = list(zip(*sorted(damage))) if damage else [[], [], []]
    write_arrow(pa.table([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema),
                path)


def write_arrow(table, path: str) -> None:
    """A table the driver holds, as a Parquet dataset of one file (with ``_SUCCESS``)."""
    os.makedirs(path, exist_ok=True)
    pq.write_table(table, os.path.join(path, "part-00000.snappy.parquet"), compression="snappy")
    open(os.path.join(path, "_SUCCESS"), "wb").close()


def damage_rows(path: str) -> list[tuple[str, int, str]]:
    """(path, offset, reason) of every row of the ``_damage`` table (one per damaged file)."""
    if not os.path.isdir(path):
        return []
    rows = pq.read_table(path, columns=["path", "offset", "reason"]).to_pylist()
    return sorted((r["path"], r["offset"], r["reason"]) for r in rows)


def parquet_rows(path: str) -> int:
    """Rows of a Parquet dataset from its footers only (no Spark job, no data read)."""
    total = 0
    for d, _dirs, files in os.walk(path):
        total += sum(pq.read_metadata(os.path.join(d, f)).num_rows for f in files if f.endswith(".parquet"))
    return total


def _console():
    return Console(stderr=True)


def print_summary(summary: Summary, console=None) -> None:
    console = console or _console()
    table = Table(title=f"journalfs pipeline -> {summary.output}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, rows in summary.rows.items():
        table.add_row(name, f"{rows:,}")
    table.add_row("damaged files", f"{summary.damaged_files:,}", style="bold red" if summary.damaged_files else None)
    console.print(table)
    for path, offset, reason in summary.damage:
        console.print(escape(f"damaged: {path}: at byte {offset}: {reason}"), highlight=False,
                      soft_wrap=True)
    for path, reason in summary.unreadable[:UNREADABLE_SHOWN]:
        console.print(escape(f"not read: {path}: {reason}"), highlight=False, soft_wrap=True)
    if len(summary.unreadable) > UNREADABLE_SHOWN:
        console.print(f"not read: {len(summary.unreadable) - UNREADABLE_SHOWN:,} more files or "
                      "directories", highlight=False)


def spark_for(master: str | None, scratch: str | None = None, conf: dict | None = None):
    """The session for a pipeline run (:func:`~journalfs.spark.session.pipeline_settings`);
    off-machine executors get journalfs as a zip built in ``scratch`` (which the caller
    removes after ``spark.stop()``)."""
    master = master or "local[*]"
    spark = build_session(master, PIPELINE_APP, pipeline_settings(conf), journal_source=False)
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(package_zip(scratch))
    return spark
