"""The ``records`` table written by the tasks that read the journals, in one Spark job.

Each task reads its planned group of slices (:func:`journalfs.spark.source.read_group`, the
data source's own code) and writes the Arrow batches straight to Parquet with pyarrow, one
file per format it met (``records/format=F/part-<task>-<attempt>.snappy.parquet``, the
layout Spark's ``partitionBy("format")`` writes). No row crosses into the JVM: Spark's own
writer would turn every Arrow row into a JVM row and encode it again (most of the JVM's CPU
on big inputs, and on small ones a planned write with a commit protocol of its own). The
tables of the same pass go alongside: ``transactions`` (a row per JRNL transaction) is
written by the tasks likewise, the others travel as small partials. What the tasks send
back are a few rows: the files they wrote, with their row counts, the damage they met and
those partials. The driver keeps exactly the files the successful attempts name (a failed
or retried attempt's files are removed), so the table is complete or the job failed.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import TaskContext

from . import derived
from .read import TRIM_EVERY, malloc_trim
from .schema import DAMAGE_KIND, arrow_schema
from .source import read_group

#: What each task reports, one tuple of these each: a records file it wrote (path, format,
#: rows), a damaged journal (path, offset, reason), a file of a table it wrote (path, rows,
#: table: :data:`journalfs.spark.derived.ROW_TABLES`), or the partial rows of a table
#: computed in this pass (table, Arrow IPC stream: :data:`journalfs.spark.derived.IN_PASS`).
RESULT_NAMES = ("path", "format", "rows", "offset", "reason", "table", "partial")
PARQUET_SUFFIX = ".snappy.parquet"


@dataclass
class Written:
    files: dict[str, int] = field(default_factory=dict)  # Parquet file -> rows
    #: (journal, byte offset, reason) of every damaged journal, sorted
    damage: list[tuple[str, int, str]] = field(default_factory=list)
    #: the tables computed in this pass: name -> Arrow table (None: not computable from the
    #: partials, see :func:`journalfs.spark.derived.finish`)
    tables: dict[str, object] = field(default_factory=dict)
    #: the tables of this pass whose files the tasks wrote (or, with no rows, ``tables`` holds)
    on_disk: set[str] = field(default_factory=set)

    @property
    def rows(self) -> int:
        return sum(self.files.values())


def write_records(spark, groups: list, records_dir: str) -> Written:
    """Read ``groups`` (a plan's task groups) and write the ``records`` table to
    ``records_dir``, in one job of one task per group.

    An RDD job, not a DataFrame one (``range().mapInArrow()``): no row of it is a table
    row, so it needs no SQL planning, code generation or Arrow set-up before its first
    task (the driver JVM's CPU for a whole run was the same within noise: 3.6-3.8 s both
    ways on the 0.25 GB bench corpus, busy machine)."""
    os.makedirs(records_dir, exist_ok=True)
    task = functools.partial(write_groups, groups, records_dir)
    results = [dict(zip(RESULT_NAMES, r)) for r in spark.sparkContext.parallelize(
        range(len(groups)), max(1, len(groups))).mapPartitions(task).collect()]
    written = Written()
    parts: dict[str, list] = {name: [] for name in derived.IN_PASS
                              if name not in derived.ROW_TABLES}
    table_files: dict[str, dict[str, int]] = {name: {} for name in derived.ROW_TABLES}
    given_up = set()
    for r in results:
        if r["table"] is not None and r["partial"] is None:
            table_files[r["table"]][r["path"]] = r["rows"]
        elif r["table"] is not None and not r["partial"]:
            given_up.add(r["table"])
        elif r["table"] is not None:
            parts[r["table"]].append(pa.ipc.open_stream(bytes(r["partial"])).read_all())
        elif r["reason"] is not None:
            written.damage.append((r["path"], r["offset"], r["reason"]))
        else:
            written.files[r["path"]] = r["rows"]
    written.damage.sort()
    missing = [path for path in [*written.files, *(p for f in table_files.values() for p in f)]
               if not _seen(path)]
    if missing:  # executors on other machines wrote to their own disks
        raise OSError(f"the executors wrote {missing[0]} (and {len(missing) - 1} more files) "
                      "where the driver does not see them: on a cluster, the output must be "
                      "on a file system the driver shares with every executor")
    written.tables = {name: None if name in given_up else derived.finish(name, p)
                      for name, p in parts.items()}
    _remove_others(records_dir, written.files)
    open(os.path.join(records_dir, "_SUCCESS"), "wb").close()
    for name, files in table_files.items():
        table_dir = os.path.join(os.path.dirname(records_dir), name)
        if os.path.isdir(table_dir):
            _remove_others(table_dir, files)
        if files:
            open(os.path.join(table_dir, "_SUCCESS"), "wb").close()
        else:  # none met: the table's columns, no rows
            written.tables[name] = derived.finish(name, [])
        written.on_disk.add(name)
    return written


def _seen(path: str) -> bool:
    """A file a task reports is on the driver's file system too."""
    return os.path.isfile(path)


def _remove_others(records_dir: str, keep: dict[str, int]) -> None:
    """What failed or repeated task attempts left behind (and a format's directory that
    only they wrote into)."""
    for d, _dirs, names in os.walk(records_dir, topdown=False):
        for name in names:
            path = os.path.join(d, name)
            if name.endswith(PARQUET_SUFFIX) and path not in keep:
                os.unlink(path)
        if d != records_dir and not os.listdir(d):
            os.rmdir(d)


def write_groups(groups: list, records_dir: str, ids: Iterator[int]) -> Iterator[tuple]:
    """``mapPartitions`` function: ``ids`` are the indexes of the groups this task reads
    (one); yields its :data:`RESULT_NAMES` tuples at the end."""
    ctx = TaskContext.get()
    name = f"part-{ctx.partitionId():05d}-{ctx.attemptNumber()}{PARQUET_SUFFIX}" if ctx \
        else f"part-{os.getpid()}{PARQUET_SUFFIX}"
    files = _FormatFiles(records_dir, name)
    row_tables = _TableFiles(os.path.dirname(records_dir), name)
    damage: list[tuple[str, int, str]] = []
    parts: dict[str, list] = {}
    given_up: set[str] = set()  # tables whose partials grew too big here
    akka = partial_rows = 0
    trim, batches = malloc_trim(), 0
    try:
        for i in ids:
            for batch in read_group(groups[i], True):
                batches += 1
                if batches % TRIM_EVERY == 0:
                    trim()
                is_damage = pc.equal(batch.column("kind"), DAMAGE_KIND)
                if pc.any(is_damage).as_py():
                    bad = batch.filter(is_damage)
                    reasons = pc.map_lookup(bad.column("attrs"), "reason", "first")
                    damage.extend(zip(bad.column("source").to_pylist(),
                                      bad.column("offset").to_pylist(),
                                      reasons.to_pylist()))
                    batch = batch.filter(pc.invert(is_damage))
                files.write(batch)
                for table, part in derived.partials(batch).items():
                    if table in derived.ROW_TABLES:  # as long as the input: to disk
                        row_tables.write(table, part)
                    elif table == "persistence":
                        if table in given_up:
                            continue
                        akka += derived.akka_rows(batch)
                        partial_rows += part.num_rows
                        if derived.partials_too_big(partial_rows, akka):
                            given_up.add(table)
                            parts.pop(table, None)
                        else:
                            parts.setdefault(table, []).append(part)
                    else:
                        parts.setdefault(table, []).append(part)
    finally:
        files.close()
        row_tables.close()
    rows: list[tuple] = [(path, fmt, n, None, None, None, None)
                         for path, (fmt, n) in files.written.items()]
    rows += [(path, None, n, None, None, table, None)
             for path, (table, n) in row_tables.written.items()]
    rows += [(path, None, None, offset, reason, None, None) for path, offset, reason in damage]
    # an empty partial: this task gave the table up (the driver computes it from the records)
    rows += [(None, None, None, None, None, table, b"") for table in given_up]
    for table, tables in parts.items():
        sink = pa.BufferOutputStream()
        combined = pa.concat_tables(tables)
        with pa.ipc.new_stream(sink, combined.schema) as stream:
            stream.write_table(combined)
        rows.append((None, None, None, None, None, table, sink.getvalue().to_pybytes()))
    yield from rows


#: Row groups (one per batch written) a task's Parquet file takes before the task goes on
#: in a new file: a writer keeps every row group's metadata (~9 KB with the records'
#: columns) until it closes, which grew the one worker of a 2 GB JRNL journal from 181 to
#: 254 MB (~8,000 row groups); 256 row groups are about 1 GB of 4 MiB batches.
ROW_GROUPS_PER_FILE = 256


class _PartFiles:
    """The Parquet files a task writes, one open at a time per directory (a format's of
    ``records``, or a table's), opened on its first rows and continued in a new file
    (``<name>`` with ``-1``, ``-2`` ... before the suffix) every
    :data:`ROW_GROUPS_PER_FILE` row groups."""

    def __init__(self, name: str):
        self.name = name
        self.open: dict[str, list] = {}  # directory -> [writer, its path, row groups written]
        self.begun: dict[str, int] = {}  # directory -> files begun there
        self.written: dict[str, tuple[str, int]] = {}  # path -> (format or table, rows)

    def write(self, directory: str, key: str, data, schema) -> None:
        entry = self.open.get(directory)
        if entry is None or entry[2] >= ROW_GROUPS_PER_FILE:
            if entry is not None:
                entry[0].close()
            n = self.begun.get(directory, 0)
            self.begun[directory] = n + 1
            name = self.name.replace(PARQUET_SUFFIX, f"-{n}{PARQUET_SUFFIX}") if n else self.name
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, name)
            entry = self.open[directory] = [pq.ParquetWriter(path, schema, compression="snappy"),
                                            path, 0]
            self.written[path] = (key, 0)
        writer, path, _groups = entry
        if isinstance(data, pa.RecordBatch):
            writer.write_batch(data)
        else:
            writer.write_table(data)
        entry[2] += 1
        self.written[path] = (key, self.written[path][1] + data.num_rows)

    def close(self) -> None:
        for writer, _path, _groups in self.open.values():
            writer.close()
        self.open.clear()


class _TableFiles:
    """The files of the tables of :data:`journalfs.spark.derived.ROW_TABLES` met
    (``OUTPUT/<table>/<name>``)."""

    def __init__(self, output: str, name: str):
        self.output = output
        self.parts = _PartFiles(name)
        self.written = self.parts.written  # path -> (table, rows)

    def write(self, table: str, part) -> None:
        self.parts.write(os.path.join(self.output, table), table, part, part.schema)

    def close(self) -> None:
        self.parts.close()


class _FormatFiles:
    """The ``records`` files of each format met (``records/format=F/<name>``)."""

    def __init__(self, records_dir: str, name: str):
        self.records_dir = records_dir
        self.parts = _PartFiles(name)
        self.written = self.parts.written  # path -> (format, rows)
        schema = arrow_schema()
        self.schema = schema.remove(schema.get_field_index("format"))

    def write(self, batch) -> None:
        if not batch.num_rows:
            return
        formats = batch.column("format")
        for fmt in pc.unique(formats).to_pylist():
            part = batch if len(formats.unique()) == 1 else \
                batch.filter(pc.equal(formats, fmt))
            self.parts.write(os.path.join(self.records_dir, f"format={fmt}"), fmt,
                             part.drop_columns(["format"]), self.schema)

    def close(self) -> None:
        self.parts.close()
