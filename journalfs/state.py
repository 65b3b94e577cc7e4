"""Each system's state from its journal files, without Spark: a Kestrel queue's readers and
their pending items, akka persistence ids and their events in order, JRNL transactions and
their status, what each gvfs journal entry changed.

The semantics are those of the pipeline's derived tables (``spark/derived.py``: ``queues``,
``persistence``, ``transactions``) and come from the codec modules' own definitions
(:func:`journalfs.formats.kestrel.queue_state`, :func:`journalfs.formats.akka.follow_chain`,
the jrnl codec's ``status``), which the pipeline's tests hold the Spark tables to; the CLI's
state commands and the mount's state views read them here. Files are read fresh on every
call (they may be growing); a damaged file contributes its valid prefix and its damage is
returned beside the answer.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from .formats import CODECS, FormatError
from .formats.akka import AkkaData, AkkaMeta, follow_chain
from .formats.base import Record
from .formats.gvfs_journal import GvfsJournal, tree_and_tag
from .formats.gvfs_tree import MergedTree, TreeView, header_tag
from .formats.jrnl import Jrnl
from .formats.kestrel import KestrelReader, KestrelWriter, queue_name, queue_state
from .journals import is_backup_name, open_path, pread_buffer, sniff_file
from .selection import natural_key

WRITER, READER = KestrelWriter.name, KestrelReader.name


def read_records(path: str, codec=None) -> tuple[list[Record], FormatError | None]:
    """Every valid record of ``path`` (read with pread: a file truncated meanwhile reads
    short) and the damage that ended them, if any."""
    codec = codec or sniff_file(path)
    if codec is None:
        return [], FormatError(path, 0, "not a supported journal (unknown magic bytes)")
    fd = open_path(path)
    out: list[Record] = []
    try:
        size = os.fstat(fd).st_size
        with pread_buffer(fd, 0, size, size) as buf:
            try:
                out.extend(codec.read(buf, path))
            except FormatError as exc:
                return out, exc.detached()
    finally:
        os.close(fd)
    return out, None


# -- Kestrel queues ----------------------------------------------------------------------------

@dataclass
class ReaderState:
    """What one reader of a queue sees: the derived table ``queues``'s row, plus the items."""

    queue: str
    reader: str
    head: int
    tail: int
    pending: int
    #: the pending PUT records, by id (their ``source`` file added)
    items: list[Record] = field(default_factory=list, repr=False)

    @property
    def oldest_pending_ms(self) -> int | None:
        times = [r["add_time"] for r in self.items if isinstance(r.get("add_time"), int)]
        return min(times) if times else None

    def summary(self, now_ms: int | None = None) -> dict[str, Any]:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        oldest = self.oldest_pending_ms
        return {"queue": self.queue, "reader": self.reader, "head": self.head,
                "tail": self.tail, "pending": self.pending,
                "oldest_pending_add_time": oldest,
                "oldest_pending_age_ms": None if oldest is None else now_ms - oldest}


@dataclass
class QueueState:
    directory: str
    queue: str
    segments: list[str]
    readers: list[ReaderState]
    errors: list[FormatError]


def queue_files(directory: str) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """``{queue: (writer files in order, [(reader name, reader file)])}`` of ``directory``,
    by the Kestrel file-name rule and each file's content."""
    out: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    try:
        names = sorted(os.listdir(directory or "."), key=natural_key)
    except OSError:
        return out
    for name in names:
        q = queue_name(name)
        if q is None or is_backup_name(name):
            continue
        path = os.path.join(directory, name)
        codec = sniff_file(path)
        if codec is None or codec.name not in (WRITER, READER):
            continue
        writers, readers = out.setdefault(q, ([], []))
        if codec.name == WRITER:
            writers.append(path)
        else:
            readers.append((name[len(q) + len(".read."):], path))
    return out


def queue_readers(name: str, writer_files: list[tuple[str, list[Record]]],
                  reader_files: list[tuple[str, list[Record]]],
                  reader: str | None = None) -> list[ReaderState]:
    """Each reader's state of queue ``name`` from its writer files' PUT records (``(file
    name, records)``, any order) and its reader files' records (``(reader name, records)``;
    none: the default reader "" with head 0), as the derived table ``queues`` has it:
    pending = PUTs after the reader's head, not done, expiry not applied."""
    if not reader_files:
        reader_files = [("", [])]
    by_id = {rec["id"]: rec for _, records in writer_files for rec in records}
    states = []
    for reader_name, reader_records in reader_files:
        if reader is not None and reader_name != reader:
            continue
        st = queue_state(writer_files, reader_records)
        items = [by_id[i] for i in st["pending_ids"] if i in by_id]
        states.append(ReaderState(name, reader_name, st["head"], st["tail"], st["pending"],
                                  items))
    return states


def queue(directory: str, name: str, reader: str | None = None) -> QueueState:
    """The state of queue ``name`` in ``directory`` for each of its readers
    (:func:`queue_readers`)."""
    writers, readers = queue_files(directory).get(name, ([], []))
    errors: list[FormatError] = []
    writer_files = []
    for path in writers:
        records, error = read_records(path, CODECS[WRITER])
        for rec in records:
            rec["source"] = path
        writer_files.append((os.path.basename(path), records))
        if error is not None:
            errors.append(error)
    reader_files = []
    for reader_name, path in readers:
        records, error = read_records(path, CODECS[READER])
        if error is not None:
            errors.append(error)
        reader_files.append((reader_name, records))
    states = queue_readers(name, writer_files, reader_files, reader)
    return QueueState(directory, name, writers, states, errors)


def queues_of(arg: str) -> list[tuple[str, str]]:
    """(directory, queue) pairs a command-line argument names: ``DIR/Q`` or every queue of
    ``DIR``; a writer or reader file names its queue."""
    if os.path.isdir(arg):
        return [(arg, q) for q in queue_files(arg)]
    directory, name = os.path.split(arg)
    if os.path.isfile(arg):
        q = queue_name(name)
        return [(directory, q)] if q else []
    return [(directory, name)] if name in queue_files(directory) else []


# -- akka persistence -----------------------------------------------------------------------------

@dataclass
class PersistenceId:
    """One persistence id: the derived table ``persistence``'s row and its events in order."""

    persistence_id: str
    messages: int
    highest_seq: int
    consistent: bool
    problems: list[str]
    events: list[Record] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        return {"persistence_id": self.persistence_id, "messages": self.messages,
                "highest_seq": self.highest_seq, "consistent": self.consistent,
                "problems": self.problems}


@dataclass
class Journal:
    directory: str
    meta: str | None
    data: str | None
    ids: list[PersistenceId]
    errors: list[FormatError]


def akka_pair(arg: str) -> tuple[str | None, str | None]:
    """(meta file, data file) of an akka file journal named by its directory or either file."""
    directory = arg if os.path.isdir(arg) else os.path.dirname(arg)
    files = {}
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(directory, name)
        if is_backup_name(name) or not os.path.isfile(path):
            continue
        codec = sniff_file(path)
        if codec is not None and codec.name in (AkkaMeta.name, AkkaData.name):
            files.setdefault(codec.name, []).append(name)
    metas, datas = files.get(AkkaMeta.name, []), files.get(AkkaData.name, [])
    meta = (os.path.join(directory, "meta") if "meta" in metas
            else os.path.join(directory, metas[0]) if metas else None)
    data = None
    if meta is not None:
        partner = AkkaMeta().partners(os.path.basename(meta),
                                      [(n, AkkaData.name) for n in datas])
        data = os.path.join(directory, partner["data"]) if "data" in partner else None
    elif datas:
        data = os.path.join(directory, datas[0])
    return meta, data


def persistence_ids(metas: list[Record], blocks: list[Record],
                    persistence_id: str | None = None) -> list[PersistenceId]:
    """Each persistence id of a meta file's records (or just ``persistence_id``), its chain
    followed through the data file's blocks (:func:`~journalfs.formats.akka.follow_chain`)."""
    by_offset = {b["self"]: b for b in blocks}
    ids = []
    for m in metas:
        if persistence_id is not None and m["persistence_id"] != persistence_id:
            continue
        chain, problems = follow_chain(m, by_offset)
        ids.append(PersistenceId(m["persistence_id"], len(chain), m["highest_seq"],
                                 not problems, problems, chain))
    return ids


def persistence(arg: str, persistence_id: str | None = None) -> Journal:
    """Every persistence id of the akka journal ``arg`` names (or just ``persistence_id``):
    messages along its chain, highest_seq from its meta block, consistent as the derived
    table ``persistence`` has it, and the events (data blocks) in chain order."""
    meta, data = akka_pair(arg)
    errors: list[FormatError] = []
    metas: list[Record] = []
    blocks: list[Record] = []
    if meta is not None:
        metas, error = read_records(meta, CODECS[AkkaMeta.name])
        if error is not None:
            errors.append(error)
    if data is not None:
        blocks, error = read_records(data, CODECS[AkkaData.name])
        if error is not None:
            errors.append(error)
    ids = persistence_ids(metas, blocks, persistence_id)
    directory = arg if os.path.isdir(arg) else os.path.dirname(arg)
    return Journal(directory, meta, data, ids, errors)


# -- JRNL transactions ----------------------------------------------------------------------------

#: A transaction's status (the contract's ``status``) and what it means to a DBA.
TRANSACTION_STATUS = {"complete": "complete", "redo": "incomplete: to redo",
                      "rollback": "incomplete: to roll back"}


def transactions(path: str) -> tuple[list[dict[str, Any]], FormatError | None]:
    """(source, offset, seq, time, status, ops) of every transaction of a JRNL file, as the
    derived table ``transactions`` has them (ops = the operation names in order)."""
    records, error = read_records(path, CODECS[Jrnl.name])
    return transaction_rows(path, records), error


def transaction_rows(source: str, records: list[Record]) -> list[dict[str, Any]]:
    """The transactions among a JRNL file's records (see :func:`transactions`)."""
    out = []
    for rec in records:
        if rec.get("kind") != "transaction":
            continue
        ops = [op.get("op") if isinstance(op, dict) else op for op in rec.get("ops") or []]
        out.append({"source": source, "offset": rec["offset"], "seq": rec["seq"],
                    "time": rec.get("time"), "status": rec.get("status"), "ops": ops})
    return out


# -- gvfs journal entries -------------------------------------------------------------------------

#: What each kind of gvfs journal entry does, in words for `ls`.
CHANGE_NAMES = {"set": "set", "setv": "set-list", "unset": "unset", "copy": "copy",
                "remove": "remove"}


def change_rows(records: list[Record], tree=None) -> list[dict[str, Any]]:
    """What each gvfs journal entry changed, in order, replayed as the store's compaction
    applies them on top of ``tree`` (a :class:`~journalfs.formats.gvfs_tree.TreeView` of the
    journal's own tree, or None): ``{seq, offset, time, change, path, key, before, after,
    source}``; ``before``/``after`` are the key's values (a string, a list, or null when
    unset) around a set, set-list or unset; a copy (``source`` to ``path``) and a remove act
    on a whole subtree and carry none."""
    merged = MergedTree(tree)
    out = []
    for rec in records:
        kind, path, key = rec.get("kind"), rec.get("path"), rec.get("key")
        row = {"seq": rec["seq"], "offset": rec["offset"], "time": rec.get("mtime"),
               "change": CHANGE_NAMES.get(kind, kind), "path": path, "key": key,
               "source": rec.get("source")}
        keyed = kind in ("set", "setv", "unset") and isinstance(path, str)
        if keyed:
            row["before"] = _meta_value(merged, path, key)
        merged.apply(rec)
        if keyed:
            row["after"] = _meta_value(merged, path, key)
        out.append(row)
    return out


def _meta_value(merged, path: str, key):
    node = merged.node(path)
    return None if node is None else merged.metadata_of(node).get(key)


def metadata_changes(path: str) -> tuple[list[dict[str, Any]], FormatError | None]:
    """:func:`change_rows` of the gvfs metadata journal ``path``, on top of its tree (the
    file its name names, when that tree's tag is the journal's)."""
    records, error = read_records(path, CODECS[GvfsJournal.name])
    tree = None
    named = tree_and_tag(os.path.basename(path))
    if named is not None:
        tree_path = os.path.join(os.path.dirname(path), named[0])
        try:
            fd = open_path(tree_path)
        except OSError:
            fd = None
        if fd is not None:
            try:
                size = os.fstat(fd).st_size
                with pread_buffer(fd, 0, size, size) as buf:
                    tag = header_tag(bytes(buf[:16]))
                    if tag is not None and f"{tag:08x}" == named[1]:
                        tree = TreeView(bytes(buf), tree_path)
                        return change_rows(records, tree), error
            except (OSError, FormatError):
                pass
            finally:
                os.close(fd)
    return change_rows(records, tree), error


__all__ = ["Journal", "PersistenceId", "QueueState", "ReaderState", "TRANSACTION_STATUS",
           "CHANGE_NAMES", "akka_pair", "change_rows", "metadata_changes", "persistence", "persistence_ids", "queue",
           "queue_files", "queue_readers", "queues_of", "read_records", "transaction_rows",
           "transactions"]
