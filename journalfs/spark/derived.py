"""Derived tables, computed with DataFrame operations on the executors from record rows.

Each table is about one format (the contract's queues, persistence chains, transactions and
metadata); format names, file-name rules and replay semantics come from the codecs.

Each function takes the records DataFrame (the data source's schema, e.g. read back from
``OUTPUT/records``) and returns a DataFrame with the contract's columns: the definition of
each table. The pipeline computes ``queues``, ``persistence`` and ``transactions`` in its
records' pass instead (:func:`partials` per batch on the executors, :func:`finish` on the
driver) and a few small stores' ``metadata`` on the driver (:func:`metadata_of_parquet`),
to the same answers (tests/test_pipeline.py holds them to these functions).
"""
from __future__ import annotations

import bisect
import json
import os
import re
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..formats import CODECS
from ..formats.gvfs_journal import JOURNAL_SUFFIX, tree_and_tag
from ..formats.gvfs_tree import MergedTree, header_tag
from ..formats.kestrel import READER_SUFFIX, WRITER_SUFFIX
from .read import TRIM_EVERY, malloc_trim
from .storage import is_remote, read_head, s3_options


def _format(name: str) -> str:
    """A format of the registry by its contract name (a renamed format fails at import,
    not as a table that silently stays empty)."""
    return CODECS[name].name


WRITER, READER = _format("kestrel-writer"), _format("kestrel-reader")
AKKA_META, AKKA_DATA = _format("akka-meta"), _format("akka-data")
GVFS_TREE, GVFS_JOURNAL = _format("gvfs-tree"), _format("gvfs-journal")
JRNL = _format("jrnl")

#: The derived tables (functions of this module, in output order) and the formats each reads;
#: their columns are in DDLS (after the DDL strings below).
TABLES = {"metadata": (GVFS_TREE, GVFS_JOURNAL), "queues": (WRITER, READER),
          "persistence": (AKKA_META, AKKA_DATA), "transactions": (JRNL,)}

QUEUES_DDL = "queue string, reader string, head long, tail long, pending long"
PERSISTENCE_DDL = "persistence_id string, messages long, highest_seq long, consistent boolean"
TRANSACTIONS_DDL = "source string, offset long, time timestamp, status string, ops array<string>"
METADATA_DDL = "store string, path string, key string, value string, values array<string>"


def _dir(col: str = "source"):
    return F.regexp_extract(F.col(col), r"^(.*)/[^/]*$", 1)


def _long_attr(name: str):
    return F.col("attrs").getItem(name).cast("long")


DDLS = {"metadata": METADATA_DDL, "queues": QUEUES_DDL, "persistence": PERSISTENCE_DDL,
        "transactions": TRANSACTIONS_DDL}


# -- Kestrel queues (spec "Queue state") ----------------------------------------------------

def queues(records: DataFrame) -> DataFrame:
    """(queue, reader, head, tail, pending) per Kestrel queue and reader.

    Writer files ordered by their numeric suffix; tail = last id of the newest writer file with
    items; head = the reader's last READ_HEAD clamped into [first id of the oldest file - 1,
    tail]; pending = PUTs with id > head not in the reader's READ_DONE ids within (head, tail].
    A queue without reader files gets its default reader ("") with head 0.

    Two aggregations on the executors, each a single shuffle: the records to one row per
    file (first, last and head ids, the READ_DONE ids of reader files), which the driver turns
    into heads and tails (a few rows per queue); then the PUTs past each reader's head, with
    the heads and done ids broadcast, counted per reader. Runs its jobs when called."""
    spark = records.sparkSession
    kestrel = records.where(F.col("format").isin(WRITER, READER) & F.col("key").isNotNull())
    is_put = (F.col("format") == WRITER) & (F.col("kind") == "put")
    is_head = F.col("kind") == "read_head"
    is_done = F.col("kind") == "read_done"
    files = kestrel.groupBy("source", "format", F.col("key").alias("queue")).agg(
        F.max_by(F.when(is_put, F.col("id")), F.when(is_put, F.col("seq"))).alias("last_id"),
        F.min_by(F.when(is_put, F.col("id")), F.when(is_put, F.col("seq"))).alias("first_id"),
        F.max_by(F.when(is_head, F.col("id")), F.when(is_head, F.col("seq"))).alias("raw_head"),
        F.flatten(F.collect_list(F.when(is_done, F.from_json(F.col("attrs").getItem("ids"),
                                                              "array<long>")))).alias("done")
    ).collect()
    state = queue_heads(files)
    pending: dict[tuple, int] = {}
    targets = [(source, d, q, reader, head, sorted(done))
               for (d, q, reader), (head, _tail, done) in state.items()
               for source in _writers_with_puts(files, d, q)]
    if targets:
        heads = spark.createDataFrame(
            targets, "source string, dir string, queue string, reader string, head long, "
                     "done array<long>")
        counted = kestrel.where(is_put).select("source", "id") \
            .join(F.broadcast(heads), "source") \
            .where((F.col("id") > F.col("head")) & ~F.array_contains("done", F.col("id"))) \
            .groupBy("dir", "queue", "reader").count().collect()
        pending = {(r["dir"], r["queue"], r["reader"]): r["count"] for r in counted}
    rows = [(q, reader, head, tail, pending.get((d, q, reader), 0))
            for (d, q, reader), (head, tail, _done) in sorted(state.items())]
    return spark.createDataFrame(rows, QUEUES_DDL)


def _dirname(source: str) -> str:
    return source.rpartition("/")[0]


def _writers_with_puts(files, d: str, q: str) -> list[str]:
    return [f["source"] for f in files if f["format"] == WRITER and f["queue"] == q
            and f["last_id"] is not None and _dirname(f["source"]) == d]


def queue_heads(files) -> dict[tuple[str, str, str], tuple[int, int, set[int]]]:
    """{(dir, queue, reader): (head, tail, done ids within (head, tail])} from one row per
    Kestrel file (source, format, queue, last_id, first_id, raw_head, and ``done``: its
    READ_DONE ids, or ``done_runs``: them as (first id, count) runs, of which only the
    part within (head, tail] is ever held as ids)."""
    bounds: dict[tuple[str, str], tuple] = {}  # (dir, queue) -> (tail, floor)
    newest: dict[tuple[str, str], tuple] = {}
    oldest: dict[tuple[str, str], tuple] = {}
    readers: dict[tuple[str, str, str], dict] = {}
    for f in files:
        d, q = _dirname(f["source"]), f["queue"]
        if f["format"] == WRITER:
            if f["last_id"] is None:
                continue
            bounds.setdefault((d, q), None)
            number = re.search(WRITER_SUFFIX, f["source"])
            if number is None:  # unordered: no say in the tail and the floor
                continue
            no = int(number.group(1))
            if (d, q) not in newest or no > newest[(d, q)][0]:
                newest[(d, q)] = (no, f["last_id"])
            if (d, q) not in oldest or no < oldest[(d, q)][0]:
                oldest[(d, q)] = (no, f["first_id"])
        else:
            name = re.search(READER_SUFFIX, f["source"])
            r = readers.setdefault((d, q, name.group(1) if name else ""),
                                   {"raw_head": None, "done": set(), "runs": []})
            if f["raw_head"] is not None:  # one checkpoint file per reader: the highest head
                r["raw_head"] = f["raw_head"] if r["raw_head"] is None else \
                    max(r["raw_head"], f["raw_head"])
            if "done_runs" in f:
                r["runs"].extend(f["done_runs"] or ())
            else:
                r["done"].update(f["done"] or ())
    for key in bounds:
        tail = newest[key][1] if key in newest else None
        floor = oldest[key][1] - 1 if key in oldest and oldest[key][1] is not None else None
        bounds[key] = (tail, floor)
    with_readers = {(d, q) for d, q, _r in readers}
    for d, q in bounds:
        if (d, q) not in with_readers:  # the default reader of a queue without reader files
            readers[(d, q, "")] = {"raw_head": None, "done": set(), "runs": []}
    state = {}
    for (d, q, reader), r in readers.items():
        tail, floor = bounds.get((d, q)) or (None, None)
        tail = tail if tail is not None else 0
        floor = floor if floor is not None else 0
        head = max(min(r["raw_head"] if r["raw_head"] is not None else 0, tail), min(floor, tail))
        done = {i for i in r["done"] if head < i <= tail}
        for start, length in r["runs"]:
            done.update(range(max(start, head + 1), min(start + length - 1, tail) + 1))
        state[(d, q, reader)] = (head, tail, done)
    return state


# -- Akka persistence chains ----------------------------------------------------------------

def persistence(records: DataFrame) -> DataFrame:
    """(persistence_id, messages, highest_seq, consistent) per meta block.

    Messages carry their persistence id already (the data source follows the chains); a chain
    is consistent when every ``next`` link lands on a block of the same id that links back and
    has a higher sequence number, it has exactly one tail, and the tail matches the meta
    block's ``last`` and ``highest_seq``."""
    meta = records.where((F.col("format") == AKKA_META) & (F.col("kind") == "meta")).select(
        _dir().alias("dir"), F.col("key").alias("persistence_id"),
        _long_attr("first").alias("first"), _long_attr("last").alias("last"),
        _long_attr("highest_seq").alias("highest_seq"))
    msgs = records.where((F.col("format") == AKKA_DATA) & (F.col("kind") == "message")
                         & F.col("key").isNotNull()).select(
        _dir().alias("dir"), F.col("key").alias("persistence_id"), _long_attr("self").alias("self"),
        _long_attr("prev").alias("prev"), _long_attr("next").alias("next"),
        F.col("id").alias("seq_nr"))
    succ = msgs.select(*(F.col(c).alias("n_" + c) for c in msgs.columns))
    linked = msgs.join(succ, (F.col("dir") == F.col("n_dir")) & (F.col("next") == F.col("n_self")),
                       "left")
    link_ok = (F.col("next") == 0) | (
        F.col("n_self").isNotNull() & (F.col("n_prev") == F.col("self"))
        & (F.col("n_seq_nr") > F.col("seq_nr")) & (F.col("n_persistence_id") == F.col("persistence_id")))
    chains = linked.groupBy("dir", "persistence_id").agg(
        F.count(F.lit(1)).alias("messages"),
        F.bool_and(link_ok).alias("links_ok"),
        F.sum(F.when(F.col("next") == 0, 1).otherwise(0)).alias("tails"),
        F.max(F.when(F.col("next") == 0, F.col("self"))).alias("tail_self"),
        F.max(F.when(F.col("next") == 0, F.col("seq_nr"))).alias("tail_seq"))
    joined = meta.join(chains, ["dir", "persistence_id"], "left")
    consistent = F.when(
        F.col("messages").isNull(),
        (F.col("first") == 0) & (F.col("last") == 0) & (F.col("highest_seq") == 0)
    ).otherwise(F.col("links_ok") & (F.col("tails") == 1) & (F.col("tail_self") == F.col("last"))
                & (F.col("tail_seq") == F.col("highest_seq")))
    return joined.select("persistence_id", F.coalesce("messages", F.lit(0)).cast("long").alias("messages"),
                         "highest_seq", F.coalesce(consistent, F.lit(False)).alias("consistent"))


# -- JRNL transactions ----------------------------------------------------------------------

def transactions(records: DataFrame) -> DataFrame:
    """(source, offset, time, status, ops) per JRNL transaction; ops = the op names in order."""
    op_texts = F.from_json(F.col("attrs").getItem("ops"), "array<string>")
    return records.where((F.col("format") == JRNL) & (F.col("kind") == "transaction")).select(
        "source", "offset", "time", F.col("attrs").getItem("status").alias("status"),
        F.transform(op_texts, lambda x: F.coalesce(F.get_json_object(x, "$.op"), x)).alias("ops"))


# -- gvfs metadata stores -------------------------------------------------------------------

def metadata(records: DataFrame) -> DataFrame:
    """(store, path, key, value, values): every store's tree + journal replayed to its current
    state. Replay is ordered and path-structured (copy/remove act on subtrees), so each store's
    rows go to one partition, sorted there (the tree's rows first, then the journals' in
    (source, seq) order: Spark's sort spills to disk), and :func:`replay_batches` walks them a
    batch at a time keeping only the current store's state, never its history (a grouped
    ``applyInArrow`` handed the worker a store's every row as one table: 3.45 GB and growing
    for a 2 GB journal)."""
    gvfs = records.where(F.col("format").isin(GVFS_TREE, GVFS_JOURNAL)).select(
        F.when(F.col("format") == GVFS_TREE, F.col("source"))
        .otherwise(F.regexp_replace("source", JOURNAL_SUFFIX, "")).alias("store"),
        "source", "format", "seq", "kind", "key", "attrs")
    return gvfs.repartition("store") \
        .sortWithinPartitions("store", F.col("format") != GVFS_TREE, "source", "seq") \
        .mapInArrow(replay_batches, METADATA_DDL)


def replay_batches(batches) -> Iterator:
    """``mapInArrow`` function of :func:`metadata`: ``batches`` hold the gvfs rows sorted by
    store, then a store's tree rows before its journals' rows, those by (source, seq); yields
    each store's state rows (:func:`_replay_group`'s, in its order) when the next store
    starts and at the end."""
    replay = None
    trim, seen = malloc_trim(), 0
    for batch in batches:
        seen += 1
        if seen % TRIM_EVERY == 0:
            trim()
        for lo, hi in _store_runs(batch.column("store")):
            store = batch.column("store")[lo].as_py()
            if replay is None or replay.store != store:
                if replay is not None:
                    yield from replay.finish()
                    trim()
                replay = _StoreReplay(store)
            replay.add(batch.slice(lo, hi - lo))
    if replay is not None:
        yield from replay.finish()


def _store_runs(stores) -> list[tuple[int, int]]:
    """(lo, hi) of each run of equal values (nulls equal) in a column of sorted stores."""
    codes = pc.fill_null(stores.dictionary_encode().indices, -1).to_numpy(zero_copy_only=False)
    cuts = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), len(codes)]
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


class _StoreReplay:
    """One store's replay fed its sorted rows a batch at a time (:func:`replay_batches`). The
    tree's rows are kept as they came (Arrow) until an entry of the store's journal is met:
    a store with none is its tree's rows as they are (:func:`_tree_state`); else they become
    a :class:`MergedTree` and the entries are applied as they come, none kept."""

    def __init__(self, store: str | None):
        self.store = store
        self.tag = _tree_tag(store) if store else None
        self.tree: list = []  # the tree's rows, until the first entry to replay
        self.merged: MergedTree | None = None
        self.read: dict[str | None, bool] = {}  # journal source -> whether the tree reads it

    def add(self, rows) -> None:
        is_tree = pc.equal(rows.column("format"), GVFS_TREE)
        tree = rows.filter(is_tree)
        if tree.num_rows:
            if self.merged is None:
                self.tree.append(tree)
            else:  # metadata()'s sort puts a store's tree rows first: a caller's bug
                raise ValueError(f"{self.store}: tree rows after journal entries")
        journal = rows.filter(pc.invert(is_tree))
        if not journal.num_rows:
            return
        sources = journal.column("source")
        for source in pc.unique(sources).to_pylist():
            if source not in self.read:
                named = tree_and_tag(source)
                self.read[source] = self.tag is None or bool(named and named[1] == self.tag)
        read = [s for s, yes in self.read.items() if yes]
        entries = journal.filter(pc.is_in(sources, pa.array(read, pa.string())))
        if entries.num_rows:
            merged = self._merged()
            for r in entries.to_pylist():
                _apply_entry(merged, r["kind"], r["key"], _attrs(r))

    def _merged(self) -> MergedTree:
        if self.merged is None:
            self.merged = MergedTree(None)
            for part in self.tree:
                _set_tree_rows(self.merged, part.to_pylist())
            self.tree = []
        return self.merged

    def finish(self) -> Iterator:
        if self.merged is None:
            tree = pa.Table.from_batches(self.tree) if self.tree else pa.table(
                {"key": pa.array([], pa.string()),
                 "attrs": pa.array([], pa.map_(pa.string(), pa.string()))})
            state = _tree_state(self.store, tree)
            if state is not None:
                yield from state.to_batches()
                return
        yield from _state_batches(self.store, _state_of(self._merged()))


#: gvfs stores up to this many bytes in all (trees and journals) are replayed by the driver
#: from the records' Parquet with pyarrow (:func:`metadata_of_parquet`): the Spark job
#: (a shuffle, a Python worker, two stages) costs more than the replay of a few stores.
DRIVER_REPLAY_BYTES = 16 << 20


def metadata_of_parquet(records_dir: str):
    """:func:`metadata` as an Arrow table, from the gvfs partitions of a ``records`` table
    written by the pipeline, replayed in this process (:data:`DRIVER_REPLAY_BYTES`)."""
    columns = ["source", "seq", "kind", "key", "attrs"]
    parts = []
    for fmt in (GVFS_TREE, GVFS_JOURNAL):
        d = os.path.join(records_dir, f"format={fmt}")
        if os.path.isdir(d):
            t = pq.read_table(d, columns=columns, partitioning=None)
            parts.append(t.add_column(1, "format", pa.repeat(pa.scalar(fmt), t.num_rows)))
    if not parts:
        return _metadata_schema().empty_table()
    rows = pa.concat_tables(parts)
    sources = rows.column("source").to_pylist()
    formats = rows.column("format").to_pylist()
    stores = [s if f == GVFS_TREE or s is None else _JAVA_JOURNAL_SUFFIX.sub("", s)
              for s, f in zip(sources, formats)]
    rows = rows.add_column(0, "store", pa.array(stores, pa.string()))
    order = pc.sort_indices(rows, [("store", "ascending")])  # stable: file order in a store
    rows = rows.take(order)
    keys = rows.column("store").to_pylist()
    out = []
    lo = 0
    for hi in range(1, len(keys) + 1):
        if hi == len(keys) or keys[hi] != keys[lo]:
            out.append(_replay_group(rows.slice(lo, hi - lo)))
            lo = hi
    return pa.concat_tables(out).cast(_metadata_schema())


#: ``regexp_replace(source, JOURNAL_SUFFIX, "")`` as Java runs it: its ``$`` also matches
#: before a line terminator that ends the text (Python's only before a final "\n").
_JAVA_JOURNAL_SUFFIX = re.compile(
    JOURNAL_SUFFIX.removesuffix("$") + "(?=(?:\r\n|[\n\r\u0085\u2028\u2029])?\\Z)")


#: Rows of a tree turned into state rows at a time (the fast path of _replay_group).
TREE_ROWS_AT_ONCE = 65536


def _replay_group(table):
    store = table.column("store")[0].as_py() if table.num_rows else None
    is_tree = pc.equal(table.column("format"), GVFS_TREE)
    # a store whose journal has nothing to replay is its tree's rows as they are: no
    # MergedTree (a node object per path: GBs for a big tree), no dict per record
    if not _journal_entries(store, table.filter(pc.invert(is_tree)).to_pylist()):
        state = _tree_state(store, table.filter(is_tree))
        if state is not None:
            return state
    return pa.Table.from_batches(
        list(_state_batches(store, replay_store(store, table.to_pylist()))), _metadata_schema())


def _state_batches(store: str | None, state: dict[str, dict]) -> Iterator:
    """The rows of a store's ``{path: {key: value}}``, sorted by path and key, as record
    batches of about :data:`TREE_ROWS_AT_ONCE` rows."""
    out = _empty_state()
    for path in sorted(state):
        for key in sorted(state[path]):
            _state_row(out, store, path, key, state[path][key])
        if len(out["store"]) >= TREE_ROWS_AT_ONCE:
            yield pa.record_batch(out, schema=_metadata_schema())
            out = _empty_state()
    if out["store"]:
        yield pa.record_batch(out, schema=_metadata_schema())


def _metadata_schema():
    return pa.schema([("store", pa.string()), ("path", pa.string()), ("key", pa.string()),
                      ("value", pa.string()), ("values", pa.list_(pa.string()))])


def _empty_state() -> dict[str, list]:
    return {name: [] for name in ("store", "path", "key", "value", "values")}


def _state_row(out: dict[str, list], store, path: str, key: str, value) -> None:
    out["store"].append(store)
    out["path"].append(path)
    out["key"].append(key)
    out["value"].append(value if isinstance(value, str) else None)
    out["values"].append(list(value) if isinstance(value, list) else None)


def _tree_state(store: str | None, tree):
    """The state rows of a store with nothing to replay, from its tree's rows (an Arrow
    table) a batch at a time, sorted by path and key as :func:`replay_store`'s; None when a
    path is not canonical ("/a/b": no empty component, no trailing "/") or occurs twice,
    which MergedTree would merge."""
    paths = tree.column("key")
    if paths.null_count or len(pc.unique(paths)) != len(paths):
        return None
    odd = pc.or_(pc.invert(pc.starts_with(paths, "/")), pc.match_substring(paths, "//"))
    odd = pc.or_(odd, pc.and_(pc.ends_with(paths, "/"), pc.not_equal(paths, "/")))
    if len(paths) and pc.any(odd).as_py():
        return None
    order = pc.sort_indices(paths)  # UTF-8 bytes sort as code points: sorted()'s order
    paths = paths.take(order)
    texts = pc.map_lookup(tree.column("attrs").take(order), "metadata", "first")
    batches = []
    for lo in range(0, len(paths), TREE_ROWS_AT_ONCE):
        out = _empty_state()
        for path, text in zip(paths[lo:lo + TREE_ROWS_AT_ONCE].to_pylist(),
                              texts[lo:lo + TREE_ROWS_AT_ONCE].to_pylist()):
            meta = json.loads(text or "{}")
            for key in sorted(meta):
                _state_row(out, store, path, key, meta[key])
        batches.append(pa.record_batch(out, schema=_metadata_schema()))
    return pa.Table.from_batches(batches, schema=_metadata_schema())


def _tree_tag(tree_path: str) -> str | None:
    """The tree header's random_tag as the 8 hex digits journal names carry."""
    try:
        if is_remote(tree_path):  # the settings of this process's environment
            tag = header_tag(read_head(tree_path, 16, s3_options()))
        else:
            with open(tree_path, "rb") as f:
                tag = header_tag(f.read(16))
    except OSError:
        return None
    return None if tag is None else f"{tag:08x}"


def replay_store(store: str | None, rows: list[dict]) -> dict[str, dict]:
    """The merged ``{path: {key: str | [str]}}`` of one store from its record rows: the tree's
    nodes, then the entries of the journal whose tag matches the tree, oldest first, applied
    as the store's own compaction applies them (:class:`MergedTree`)."""
    merged = MergedTree(None)
    _set_tree_rows(merged, rows)
    for _source, _seq, kind, path, attrs in _journal_entries(store, rows):
        _apply_entry(merged, kind, path, attrs)
    return _state_of(merged)


def _set_tree_rows(merged: MergedTree, rows: list[dict]) -> None:
    for r in rows:
        if r["format"] == GVFS_TREE:
            attrs = _attrs(r)
            for key, value in json.loads(attrs.get("metadata") or "{}").items():
                merged.set(r["key"], key, value, 0)


def _apply_entry(merged: MergedTree, kind: str, path: str, attrs: dict) -> None:
    value = attrs.get("value", "")
    merged.apply({"kind": kind, "path": path, "key": attrs.get("key"), "mtime": 0,
                  "value": json.loads(value or "[]") if kind == "setv" else value,
                  "source": attrs.get("source")})


def _state_of(merged: MergedTree) -> dict[str, dict]:
    return {path: meta for path, meta, _mtime in merged.items()}


def _attrs(row: dict) -> dict:
    attrs = row["attrs"] or {}
    return dict(attrs) if isinstance(attrs, list) else attrs  # Arrow map: (key, value) pairs


def _journal_entries(store: str | None, rows: list[dict]) -> list[tuple]:
    """(source, seq, kind, path, attrs) of the journal rows among ``rows`` that the store's
    tree reads (a journal named with the tree's tag; any when the tag is unknown), oldest
    first."""
    tag = _tree_tag(store) if store else None
    entries = []
    for r in rows:
        if r["format"] != GVFS_TREE:
            named = tree_and_tag(r["source"])
            if tag is None or (named and named[1] == tag):
                entries.append((r["source"], r["seq"], r["kind"], r["key"], _attrs(r)))
    return sorted(entries, key=lambda e: (e[0], e[1]))


# -- tables computed in the records' pass ------------------------------------------------------
# The pipeline's tasks hand every batch they write to :func:`partials`; the driver merges what
# the tasks send back (a few rows per file) with :func:`finish`. These tables cost no Spark job
# and no second read of the records. The DataFrame functions above stay for the data source's
# users and hold these to the same answers (tests/test_pipeline.py).

#: The tables computed in the records' pass.
IN_PASS = ("queues", "persistence", "transactions")
#: Those of them whose partials are their rows, as many as the input's records: the tasks
#: write them to Parquet as they go (the driver would hold them all).
ROW_TABLES = ("transactions",)


def partials(batch) -> dict:
    """{table: partial Arrow table} of one batch of record rows (the data source's schema)."""
    out = {}
    formats = batch.column("format")
    akka = _persistence_partial(batch, formats)
    if akka is not None:
        out["persistence"] = akka
    kestrel = batch.filter(pc.and_(pc.is_in(formats, value_set=pa.array([WRITER, READER])),
                                   pc.is_valid(batch.column("key"))))
    if kestrel.num_rows:
        out["queues"] = _queue_partial(kestrel)
    jrnl = batch.filter(pc.and_(pc.equal(formats, JRNL),
                                pc.equal(batch.column("kind"), "transaction")))
    if jrnl.num_rows:
        out["transactions"] = _transaction_rows(jrnl)
    return out


def _queue_schema():
    longs = pa.list_(pa.int64())
    return pa.schema([("source", pa.string()), ("format", pa.string()), ("queue", pa.string()),
                      ("first_seq", pa.int64()), ("first_id", pa.int64()),
                      ("last_seq", pa.int64()), ("last_id", pa.int64()),
                      ("head_seq", pa.int64()), ("head_id", pa.int64()),
                      ("done_starts", longs), ("done_lengths", longs),
                      ("run_starts", longs), ("run_lengths", longs)])


def _queue_partial(kestrel):
    """Per (file, queue) of the batch: the first and last PUT and the last READ_HEAD (by
    seq), and the READ_DONE ids and the PUT ids as runs of consecutive ids (a queue file's
    ids are mostly one run, so a file's PUTs travel as a few numbers; a reader's done ids
    mostly follow its head: as a list they made a 2 GB reader file's worker 680 MB)."""
    rows = []
    keys = pc.binary_join_element_wise(kestrel.column("source"), kestrel.column("format"),
                                       kestrel.column("key"), "\0")
    for group in pc.unique(keys).to_pylist():
        part = kestrel.filter(pc.equal(keys, group))
        source, fmt, queue = group.split("\0")
        kind = part.column("kind")
        seqs = part.column("seq").to_numpy(zero_copy_only=False)
        ids = part.column("id").fill_null(0).to_numpy(zero_copy_only=False)
        row = {"source": source, "format": fmt, "queue": queue}
        puts = _where(kind, "put") if fmt == WRITER else np.array([], dtype=np.int64)
        heads = _where(kind, "read_head")
        for name, at in (("first", puts[np.argmin(seqs[puts])] if len(puts) else None),
                         ("last", puts[np.argmax(seqs[puts])] if len(puts) else None),
                         ("head", heads[np.argmax(seqs[heads])] if len(heads) else None)):
            row[f"{name}_seq"] = None if at is None else int(seqs[at])
            row[f"{name}_id"] = None if at is None else int(ids[at])
        dones = _where(kind, "read_done")
        done = np.array([], dtype=np.int64)
        if len(dones):
            texts = pc.map_lookup(part.column("attrs").take(pa.array(dones)), "ids", "first")
            done = np.unique(np.fromiter((i for text in texts.to_pylist()
                                          for i in _json_longs(text)), np.int64))
        row["done_starts"], row["done_lengths"] = _runs(done)
        row["run_starts"], row["run_lengths"] = \
            _runs(ids[puts[np.argsort(seqs[puts], kind="stable")]])
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=_queue_schema())


def _runs(ids) -> tuple[list[int], list[int]]:
    """(starts, lengths) of the runs of consecutive ids in ``ids`` (in their order)."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks)) if len(ids) else breaks
    ends = np.concatenate((breaks, [len(ids)])) if len(ids) else breaks
    return ids[starts].tolist(), (ends - starts).tolist()


def _where(column, value: str):
    """Row numbers where a string column equals ``value`` (no Python string per row)."""
    return np.flatnonzero(pc.fill_null(pc.equal(column, value), False)
                          .to_numpy(zero_copy_only=False))


def _json_longs(text: str | None) -> list[int]:
    """``from_json(text, "array<long>")``: the integers of a JSON list (nothing else)."""
    try:
        values = json.loads(text) if text else None
    except ValueError:
        return []
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)
            and -(1 << 63) <= v < (1 << 63)]


def _transaction_schema():
    return pa.schema([("source", pa.string()), ("offset", pa.int64()),
                      ("time", pa.timestamp("us", tz="UTC")), ("status", pa.string()),
                      ("ops", pa.list_(pa.string()))])


def _transaction_rows(jrnl):
    """:func:`transactions`'s rows of a batch of JRNL transaction rows."""
    attrs = jrnl.column("attrs")
    ops = [_op_names(text) for text in pc.map_lookup(attrs, "ops", "first").to_pylist()]
    return pa.table([jrnl.column("source"), jrnl.column("offset"), jrnl.column("time"),
                     pc.map_lookup(attrs, "status", "first"),
                     pa.array(ops, pa.list_(pa.string()))], schema=_transaction_schema())


def _op_names(text: str | None) -> list | None:
    """Each op's ``op`` field, else the op itself as text (what ``transactions`` computes
    with ``from_json`` and ``get_json_object``)."""
    try:
        values = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(values, list):
        return None
    return [_json_text(v.get("op")) if isinstance(v, dict) and v.get("op") is not None
            else _json_text(v) for v in values]


def _json_text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def finish(table: str, parts: list):
    """The Arrow table ``table`` from the partial tables of every task (None: the partials
    cannot give it exactly, and the DataFrame function must compute it)."""
    if table == "persistence":
        return _persistence_table(pa.concat_tables(parts) if parts else
                                  _persistence_schema().empty_table())
    if table == "transactions":
        return pa.concat_tables([p.cast(_transaction_schema()) for p in parts]) if parts else \
            _transaction_schema().empty_table()
    return _queues_table(pa.concat_tables(parts) if parts else _queue_schema().empty_table())


def empty(table: str):
    """The Arrow table ``table`` without rows (the columns :data:`DDLS` declares), for an
    input holding none of its formats: written without a Spark job."""
    return _metadata_schema().empty_table() if table == "metadata" else finish(table, [])


def _queues_table(parts):
    """:func:`queues` from the per-batch partials: merged per file, then
    :func:`queue_heads`, then the PUTs past each reader's head counted from the runs."""
    merged: dict[tuple, dict] = {}
    for p in parts.to_pylist():
        f = merged.setdefault((p["source"], p["format"], p["queue"]), {
            "source": p["source"], "format": p["format"], "queue": p["queue"],
            "first": None, "last": None, "head": None, "done": [], "runs": []})
        for name, pick in (("first", min), ("last", max), ("head", max)):
            if p[f"{name}_seq"] is not None:
                here = (p[f"{name}_seq"], p[f"{name}_id"])
                f[name] = here if f[name] is None else pick(f[name], here)
        f["done"].extend(zip(p["done_starts"] or (), p["done_lengths"] or ()))
        f["runs"].extend(zip(p["run_starts"] or (), p["run_lengths"] or ()))
    files = [{"source": f["source"], "format": f["format"], "queue": f["queue"],
              "first_id": f["first"][1] if f["first"] else None,
              "last_id": f["last"][1] if f["last"] else None,
              "raw_head": f["head"][1] if f["head"] else None, "done_runs": f["done"]}
             for f in merged.values()]
    state = queue_heads(files)
    runs = {f["source"]: f["runs"] for f in merged.values() if f["format"] == WRITER}
    rows = []
    for (d, q, reader), (head, tail, done) in sorted(state.items()):
        done_ids = sorted(done)
        pending = 0
        for source in _writers_with_puts(files, d, q):
            for start, length in runs.get(source, ()):
                lo, hi = max(start, head + 1), start + length - 1
                if hi >= lo:
                    pending += hi - lo + 1 - (bisect.bisect_right(done_ids, hi)
                                              - bisect.bisect_left(done_ids, lo))
        rows.append((q, reader, head, tail, pending))
    schema = pa.schema([("queue", pa.string()), ("reader", pa.string()), ("head", pa.int64()),
                        ("tail", pa.int64()), ("pending", pa.int64())])
    columns = list(zip(*rows)) if rows else [[]] * 5
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)


# -- persistence in the records' pass -----------------------------------------------------------
# :func:`persistence` joins every message to the message its ``next`` names (same directory,
# ``self`` = ``next``). A data block's ``self`` is where the codec found it, so within one data
# file ``self`` is unique: a link is good only between a mutual pair (``next`` of one is the
# other's ``self``, whose ``prev`` is the first's ``self``). Each batch checks the links whose
# both ends it holds and sends on only its loose ends: the links that leave it ("edge") and
# the messages whose ``prev`` it does not hold ("node"; a link from elsewhere to a message whose
# ``prev`` is in the batch cannot be good), plus one row per persistence id ("chain": counts,
# tail, whether its checked links held) and the meta blocks ("meta"). For interleaved chains
# that is a few rows per persistence id and batch, whatever the batch's size.

#: Row kinds of the persistence partials.
META, CHAIN, EDGE, NODE = 0, 1, 2, 3
#: A task whose persistence partials pass this many rows and 1/PARTIAL_SHARE of its akka
#: records gives up on them (many ids, each with few messages in a batch: the partials would
#: be as big as the records, and the driver would merge them all): the table then comes
#: from the DataFrame function.
PARTIAL_ROWS_FLOOR = 100_000
PARTIAL_SHARE = 16


def partials_too_big(partial_rows: int, akka_rows: int) -> bool:
    return partial_rows > PARTIAL_ROWS_FLOOR and partial_rows * PARTIAL_SHARE > akka_rows


def akka_rows(batch) -> int:
    """The akka records of a batch (what the persistence partials stand for)."""
    return pc.sum(pc.is_in(batch.column("format"),
                           value_set=pa.array([AKKA_META, AKKA_DATA]))).as_py() or 0


def _persistence_schema():
    """(what, source, pid, a, b, c, d, ok): meta: first, last, highest_seq; chain: messages,
    tails, tail's self, tail's seq (ok: its links checked in the batch held); edge: self,
    next, seq; node: self, prev, seq."""
    longs = [(name, pa.int64()) for name in "abcd"]
    return pa.schema([("what", pa.int8()), ("source", pa.string()), ("pid", pa.string()),
                      *longs, ("ok", pa.bool_())])


def _long_attrs(table, name: str):
    """``attrs[name]`` as long (Spark's ``cast("long")`` of the text; the codec writes
    integers)."""
    return pc.cast(pc.map_lookup(table.column("attrs"), name, "first"), pa.int64())


def _persistence_partial(batch, formats):
    metas = batch.filter(pc.and_(pc.equal(formats, AKKA_META),
                                 pc.equal(batch.column("kind"), "meta")))
    msgs = batch.filter(pc.and_(pc.and_(pc.equal(formats, AKKA_DATA),
                                        pc.equal(batch.column("kind"), "message")),
                                pc.is_valid(batch.column("key"))))
    if not metas.num_rows and not msgs.num_rows:
        return None
    schema = _persistence_schema()
    parts = []
    if metas.num_rows:
        n = metas.num_rows
        parts.append(pa.table([pa.repeat(pa.scalar(META, pa.int8()), n), metas.column("source"),
                               metas.column("key"), _long_attrs(metas, "first"),
                               _long_attrs(metas, "last"), _long_attrs(metas, "highest_seq"),
                               pa.nulls(n, pa.int64()), pa.nulls(n, pa.bool_())], schema=schema))
    if msgs.num_rows:
        sources = msgs.column("source")
        for source in pc.unique(sources).to_pylist():
            part = msgs if len(pc.unique(sources)) == 1 else \
                msgs.filter(pc.equal(sources, source))
            parts.append(_chain_rows(part, source, schema))
    return pa.concat_tables(parts)


def _chain_rows(msgs, source: str, schema):
    """The persistence partial of one data file's messages in one batch."""
    selfs = _long_attrs(msgs, "self").to_numpy(zero_copy_only=False)
    prevs = _long_attrs(msgs, "prev").to_numpy(zero_copy_only=False)
    nexts = _long_attrs(msgs, "next").to_numpy(zero_copy_only=False)
    seqs = msgs.column("id").to_numpy(zero_copy_only=False)
    keys = msgs.column("key")
    encoded = pc.dictionary_encode(keys.combine_chunks() if isinstance(keys, pa.ChunkedArray)
                                   else keys)
    pids = encoded.indices.to_numpy(zero_copy_only=False)
    names = encoded.dictionary
    order = np.argsort(selfs, kind="stable")
    ordered = selfs[order]

    def find(offsets):  # row of the message whose self is each offset, -1 where none
        at = np.searchsorted(ordered, offsets)
        inside = at < len(ordered)
        hit = np.zeros(len(offsets), dtype=bool)
        hit[inside] = ordered[at[inside]] == offsets[inside]
        return np.where(hit, order[np.minimum(at, len(order) - 1)], -1)

    linked = nexts != 0
    target = find(nexts)
    held = linked & (target >= 0)
    t = target[held]
    good = (prevs[t] == selfs[held]) & (seqs[t] > seqs[held]) & (pids[t] == pids[held])
    groups = len(names)
    bad = np.bincount(pids[held][~good], minlength=groups)
    tail = ~linked
    tails = np.bincount(pids[tail], minlength=groups)
    counts = np.bincount(pids, minlength=groups)
    tail_self = np.full(groups, np.iinfo(np.int64).min)
    tail_seq = tail_self.copy()
    np.maximum.at(tail_self, pids[tail], selfs[tail])
    np.maximum.at(tail_seq, pids[tail], seqs[tail])
    has_tail = tails > 0
    chain = pa.table([pa.repeat(pa.scalar(CHAIN, pa.int8()), groups),
                      pa.repeat(pa.scalar(source, pa.string()), groups), names,
                      pa.array(counts, pa.int64()), pa.array(tails, pa.int64()),
                      pa.array(tail_self, pa.int64(), mask=~has_tail),
                      pa.array(tail_seq, pa.int64(), mask=~has_tail),
                      pa.array(bad == 0)], schema=schema)
    edge = linked & (target < 0)
    node = find(prevs) < 0
    loose = []
    for what, rows, link in ((EDGE, edge, nexts), (NODE, node, prevs)):
        n = int(rows.sum())
        loose.append(pa.table([pa.repeat(pa.scalar(what, pa.int8()), n),
                               pa.repeat(pa.scalar(source, pa.string()), n),
                               names.take(pa.array(pids[rows])), pa.array(selfs[rows]),
                               pa.array(link[rows]), pa.array(seqs[rows]),
                               pa.nulls(n, pa.int64()), pa.nulls(n, pa.bool_())],
                              schema=schema))
    return pa.concat_tables([chain, *loose])


#: What ``regexp_extract(source, "^(.*)/[^/]*$", 1)`` gives (Java's ``.`` stops at line
#: terminators; no match gives "").
_JAVA_DIR = re.compile(r"([^\n\r\u0085\u2028\u2029]*)/[^/]*\Z")


def _java_dir(source: str) -> str:
    match = _JAVA_DIR.match(source)
    return match.group(1) if match else ""


def _persistence_table(parts):
    """:func:`persistence` from the partials; None when a directory holds several akka data
    files (their ``self`` offsets repeat, and the join pairs them across files)."""
    chains: dict[tuple, list] = {}
    nodes: dict[tuple, tuple] = {}
    edges = []
    metas = []
    files: dict[str, set] = {}
    for what, source, pid, a, b, c, d, ok in zip(*(parts.column(i).to_pylist()
                                                   for i in range(parts.num_columns))):
        d_ = _java_dir(source)
        if what == META:
            metas.append((d_, pid, a, b, c))
            continue
        files.setdefault(d_, set()).add(source)
        if what == CHAIN:
            f = chains.setdefault((d_, pid), [0, 0, None, None, True])
            f[0] += a
            f[1] += b
            if c is not None:
                f[2] = c if f[2] is None else max(f[2], c)
                f[3] = d if f[3] is None else max(f[3], d)
            f[4] = f[4] and ok
        elif what == EDGE:
            edges.append((d_, pid, a, b, c))
        else:
            nodes[(d_, a)] = (b, c, pid)
    if any(len(sources) > 1 for sources in files.values()):
        return None
    for d_, pid, self_, next_, seq in edges:
        t = nodes.get((d_, next_))
        if t is None or t[0] != self_ or t[1] <= seq or t[2] != pid:
            chains[(d_, pid)][4] = False
    rows = []
    for d_, pid, first, last, highest in metas:
        f = chains.get((d_, pid)) if pid is not None else None
        if f is None:
            consistent = first == 0 and last == 0 and highest == 0
        else:
            messages, tails, tail_self, tail_seq, links_ok = f
            consistent = links_ok and tails == 1 and tail_self is not None and \
                tail_self == last and tail_seq == highest
        rows.append((pid, f[0] if f else 0, highest, bool(consistent)))
    schema = pa.schema([("persistence_id", pa.string()), ("messages", pa.int64()),
                        ("highest_seq", pa.int64()), ("consistent", pa.bool_())])
    columns = list(zip(*rows)) if rows else [[]] * 4
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)
