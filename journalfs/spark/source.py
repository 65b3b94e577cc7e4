"""The ``journal`` Spark data source (Python Data Source API, Spark >= 4.1).

``partitions()`` runs once on the driver (listing + :mod:`journalfs.spark.plan`); ``read()``
runs on executors, maps each file and turns the codecs' columnar output straight into Arrow
record batches. Damage ends a file's records (its valid prefix is kept) and never fails the
job; with option ``includeDamage=true`` each damaged file adds one ``kind = '_damage'`` row.
Loud failures instead of empty results: ``load()`` of a path that does not exist, of an
unsupported URI scheme or of an input holding no journal raises; a slice an executor cannot
open fails its task (Spark retries it, elsewhere on a cluster) and then the job.

Options: ``formats`` (comma list), ``recursive`` (default true), ``pathGlobFilter``,
``includeDamage`` (default false), ``parallelism`` (tasks are sized for it; default: the
driver's CPU count), ``maxSplitBytes``, ``checkpointCache`` (the directory whose ``indexes/``
keeps big journals' record indexes, shared with the CLI; default ``~/.cache/journalfs``;
"" for none);
for ``s3://``/``s3a://`` paths ``endpoint`` and ``region`` (:mod:`journalfs.spark.storage`).
"""
from __future__ import annotations

import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..fs.indexfiles import user_cache_dir
from .plan import list_journals, plan
from .read import BATCH_BYTES, read_slice
from .schema import DDL
from .storage import is_remote, s3_options

#: Rows per decoded batch, and the size small files' batches are merged up to before they go
#: to the JVM (every batch costs an Arrow IPC message and JVM-side set-up).
BATCH_ROWS = 65536


def _true(value: str | None, default: bool) -> bool:
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


class JournalPartition(InputPartition):
    def __init__(self, slices):
        super().__init__(slices)
        self.slices = slices


class JournalDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "journal"

    def schema(self) -> str:
        return DDL

    def reader(self, schema) -> "JournalReader":
        return JournalReader(dict(self.options))


class JournalReader(DataSourceReader):
    def __init__(self, options: dict):
        self.options = {k.lower(): v for k, v in options.items()}
        formats = self.options.get("formats") or ""
        self.formats = {f.strip() for f in formats.split(",") if f.strip()}

    # -- planning (driver) -----------------------------------------------------------------
    # No pushFilters: Spark (4.1) plans a Python data source's reader once per relation, so
    # filters pushed by one scan of a DataFrame pruned the others too; a self-join (the
    # persistence table's links) then read akka data rows in place of meta rows, and a
    # union of two filtered scans read the first filter's files twice. The ``formats``
    # option prunes files explicitly.
    def partitions(self):
        path = self.options.get("path")
        if not path:
            raise ValueError("journal data source: load(PATH) needs a path")
        storage = s3_options(self.options) if is_remote(path) else ()
        # a wrong path, an unsupported scheme or no journal at all raise: never a silent 0 rows
        files = list_journals(path, _true(self.options.get("recursive"), True),
                              self.options.get("pathglobfilter"), required=True, storage=storage)
        if self.formats:
            files = [f for f in files if f.format in self.formats]
        parallelism = int(self.options.get("parallelism") or os.cpu_count() or 1)
        max_split = int(self.options.get("maxsplitbytes") or 128 << 20)
        cache = self.options.get("checkpointcache")
        cache = user_cache_dir() if cache is None else (cache or None)
        groups = plan(files, parallelism, max_split, cache, storage).groups
        return [JournalPartition(g) for g in groups]

    # -- reading (executors) ---------------------------------------------------------------
    def read(self, partition) -> Iterator:
        if partition is None or getattr(partition, "slices", None) is None:
            return iter(())
        include_damage = _true(self.options.get("includedamage"), False)
        return read_group(partition.slices, include_damage)


def read_group(slices, include_damage: bool) -> Iterator:
    """The record batches of one task's slices (small files' batches merged)."""
    return coalesce((batch for s in slices
                     for batch in read_slice(s, include_damage, BATCH_ROWS)), BATCH_ROWS)


def coalesce(batches: Iterator, rows: int, max_bytes: int | None = None) -> Iterator:
    """Merge runs of small batches (one per small file) into batches of about ``rows`` rows
    (or ``max_bytes`` bytes, whichever comes first)."""
    max_bytes = max_bytes or BATCH_BYTES
    pending: list = []
    pending_rows = pending_bytes = 0
    for batch in batches:
        if not pending and (batch.num_rows >= rows // 2 or batch.nbytes >= max_bytes // 2):
            yield batch  # big enough already: no copy
            continue
        pending.append(batch)
        pending_rows += batch.num_rows
        pending_bytes += batch.nbytes
        if pending_rows >= rows or pending_bytes >= max_bytes:
            yield pa.concat_batches(pending)
            pending, pending_rows, pending_bytes = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def register(spark) -> None:
    """Make ``spark.read.format("journal")`` available in this session."""
    spark.dataSource.register(JournalDataSource)
