"""`journalfs pipeline INPUT OUTPUT`: journals -> Parquet tables, on local Spark or a cluster.

One pass over the journals writes ``records/`` (partitioned by format); the derived tables
are then computed from that Parquet (columnar, pruned) with DataFrame operations:
``metadata/``, ``queues/``, ``persistence/``, ``transactions/``; damage goes to ``_damage/``.
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field

from .schema import DAMAGE_KIND

DAMAGE_PARTITION = "format=" + DAMAGE_KIND


@dataclass
class Summary:
    rows: dict[str, int] = field(default_factory=dict)
    damaged_files: int = 0
    output: str = ""


class StageProgress:
    """A rich progress bar fed by Spark's status tracker (polled from a daemon thread)."""

    def __init__(self, spark, console):
        self.tracker = spark.sparkContext.statusTracker()
        self.console = console
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.label = ""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def step(self, label: str) -> None:
        self.label = label
        self.progress.update(self.task, description=label, completed=0, total=None)

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            try:
                stages = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
            except Exception:  # the JVM is shutting down
                return
            stages = [s for s in stages if s is not None]
            if stages:
                total = sum(s.numTasks for s in stages)
                done = sum(s.numCompletedTasks for s in stages)
                self.progress.update(self.task, completed=done, total=total,
                                     description=f"{self.label} (stage {', '.join(str(s.stageId) for s in stages)})")

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        self.progress.__exit__(*exc)


def _records_schema():
    from pyspark.sql.types import StringType, StructField, StructType
    from .schema import spark_schema
    fields = [f for f in spark_schema().fields if f.name != "format"]
    return StructType(fields + [StructField("format", StringType(), True)])


def run(spark, input_path: str, output: str, console=None) -> Summary:
    from pyspark.sql import functions as F
    from . import derived
    console = console or _console()
    output = os.path.abspath(output)
    records_dir = os.path.join(output, "records")
    damage_raw = os.path.join(output, "_damage_raw")
    summary = Summary(output=output)
    with StageProgress(spark, console) as progress:
        progress.step("reading journals")
        df = spark.read.format("journal").option("includeDamage", "true") \
            .option("parallelism", str(spark.sparkContext.defaultParallelism)) \
            .load(os.path.abspath(input_path))
        routed = df.withColumn("format", F.when(F.col("kind") == DAMAGE_KIND, F.lit(DAMAGE_KIND))
                               .otherwise(F.col("format")))
        routed.write.mode("overwrite").partitionBy("format").parquet(records_dir)
        shutil.rmtree(damage_raw, ignore_errors=True)
        if os.path.isdir(os.path.join(records_dir, DAMAGE_PARTITION)):
            os.rename(os.path.join(records_dir, DAMAGE_PARTITION), damage_raw)

        records = spark.read.schema(_records_schema()).parquet(records_dir)
        tables = {"metadata": derived.metadata(records), "queues": derived.queues(records),
                  "persistence": derived.persistence(records),
                  "transactions": derived.transactions(records)}
        for name, table in tables.items():
            progress.step(f"writing {name}")
            table.write.mode("overwrite").parquet(os.path.join(output, name))

        progress.step("writing _damage")
        damage = spark.createDataFrame([], "path string, offset long, reason string")
        if os.path.isdir(damage_raw):
            damage = spark.read.parquet(damage_raw).select(
                F.col("source").alias("path"), "offset", F.col("attrs").getItem("reason").alias("reason"))
        damage.write.mode("overwrite").parquet(os.path.join(output, "_damage"))
        shutil.rmtree(damage_raw, ignore_errors=True)

    for name in ("records", *tables, "_damage"):
        summary.rows[name] = parquet_rows(os.path.join(output, name))
    summary.damaged_files = summary.rows["_damage"]  # one damage row per damaged file
    return summary


def parquet_rows(path: str) -> int:
    """Rows of a Parquet dataset from its footers only (no Spark job, no data read)."""
    import pyarrow.parquet as pq
    total = 0
    for d, _dirs, files in os.walk(path):
        total += sum(pq.read_metadata(os.path.join(d, f)).num_rows for f in files if f.endswith(".parquet"))
    return total


def _console():
    from rich.console import Console
    return Console(stderr=True)


def print_summary(summary: Summary, console=None) -> None:
    from rich.table import Table
    console = console or _console()
    table = Table(title=f"journalfs pipeline -> {summary.output}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, rows in summary.rows.items():
        table.add_row(name, f"{rows:,}")
    table.add_row("damaged files", f"{summary.damaged_files:,}", style="bold red" if summary.damaged_files else None)
    console.print(table)


def spark_for(master: str | None, scratch: str | None = None):
    """The session for a pipeline run; off-machine executors get journalfs as a zip built
    in ``scratch`` (which the caller removes after ``spark.stop()``)."""
    from .session import build_session, package_zip
    master = master or "local[*]"
    conf = {"spark.sql.shuffle.partitions": "8", "spark.ui.showConsoleProgress": "false"}
    spark = build_session(master, "journalfs pipeline", conf)
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(package_zip(scratch))
    return spark
