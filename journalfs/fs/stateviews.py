"""Each system's state as read-only paths under ``MNT/.journalfs/`` (CONTRACT "The mount")::

    queues/<dir>/<queue>/                 a Kestrel queue of SOURCE/<dir> (its NAME.<n>, NAME.read.<r>)
        state.json                        every reader: head, tail, pending, oldest pending item
        <reader>/                         one per reader ("(default)": file NAME.read., or none)
            state.json                    head, tail, pending, oldest_pending_add_time, its age
            <id:08d>.item                 each pending item (its payload), in id order
    persistence/<dir>/<journal>/          an akka file journal, SOURCE/<dir>/<journal>/{meta,data}
        state.json                        every persistence id: events, highest_seq, consistent
        <persistence id>/                 ("/" written %2F, "%" %25)
            state.json
            <seq_nr:08d>.event            its events in sequence order (payloads)
    transactions/<p>/                     a JRNL journal SOURCE/<p>
        state.json                        transactions by status, and the incomplete ones
        <seq:08d>.<status>                each transaction (complete, redo, rollback): its JSON
    changes/<p>/                          a gvfs metadata journal SOURCE/<p>
        state.json                        entries by change
        <seq:08d>.<change>                what each entry changed (set, set-list, unset, copy,
                                          remove): path, key, before, after (on its tree)

The answers are :mod:`journalfs.state`'s (the pipeline's derived tables' semantics), computed
in a worker thread from the files as they are (attributes are never cached: the state follows
the journals). Permissions as under ``records/``: a mirrored directory carries its SOURCE
directory's owner, group and read/search bits; a system's directory and its files carry the
owner and group of its newest file and only the read bits every one of its files grants
(a file of another owner or group counts with its "other" bits), so nobody reads through a
state path what they could not read in SOURCE. Files are opened only through the views'
SourceTree; a system whose files hold more than ``STATE_MAX_BYTES`` is refused (EFBIG), and at
most ``MAX_ENTRIES`` items are listed per directory (state.json has the full count).
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from .. import state
from ..formats import FormatError
from ..formats.akka import AkkaData, AkkaMeta
from ..formats.gvfs_journal import GvfsJournal, tree_and_tag
from ..formats.gvfs_tree import GvfsTree, TreeView, header_tag
from ..formats.jrnl import Jrnl
from ..formats.kestrel import KestrelReader, KestrelWriter, queue_name
from ..journals import is_backup_name, pread_buffer
from ..selection import natural_key

TOPS = (b"queues", b"persistence", b"transactions", b"changes")
STATE_JSON = b"state.json"
DEFAULT_READER = b"(default)"
#: The most bytes of journal files one state is computed from (hostile input: bounded).
STATE_MAX_BYTES = 256 << 20
#: The most entries a state directory lists (the rest are counted in its state.json).
MAX_ENTRIES = 100_000
#: How long a SOURCE directory's journals (names, lstat) are reused without a new scan: the
#: state shows a change within this time (ls -l of a reader's items scans about once).
STATE_TRUST_SECONDS = 0.2
#: How long "does this SOURCE dir hold any such journal" answers are reused.
SCAN_TTL = 2.0

WRITER, READER = KestrelWriter.name, KestrelReader.name


@dataclass
class Entry:
    """What one state path is: a directory (its children's names) or a file (its bytes)."""

    is_dir: bool
    owner: tuple[int, int]
    mode: int
    mtime_ns: int
    children: list[bytes] = field(default_factory=list)
    content: bytes = b""


def escape_name(text: str) -> bytes:
    """A persistence id as a file name: ``%`` and ``/`` escaped, NUL refused by the kernel
    anyway (escaped too)."""
    return text.replace("%", "%25").replace("/", "%2F").replace("\0", "%00") \
        .encode("utf-8", "surrogateescape")


def _join(d: bytes, name: bytes) -> bytes:
    return d + b"/" + name if d else name


class StateTree:
    """The state paths of one mount; ``views`` is the :class:`~journalfs.fs.views.Views` they
    belong to (its SourceTree, journal sniffing cache and catalog)."""

    def __init__(self, views):
        self.views = views

    # -- SOURCE ---------------------------------------------------------------------------
    def _files(self, d: bytes) -> list[tuple[bytes, os.stat_result, Any]]:
        """(name, lstat, journal info) of the journals of SOURCE dir ``d``, by name."""
        key = ("statefiles", d)
        cached = self.views.catalog.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < STATE_TRUST_SECONDS:
            return cached[1]
        out = []
        try:
            entries = sorted(self.views.source.scan(d), key=lambda e: natural_key(
                e[0].decode("utf-8", "surrogateescape")))
        except OSError:
            entries = []
        for name, st in entries:
            if not stat.S_ISREG(st.st_mode) or is_backup_name(name):
                continue
            info = self.views._journal_info(_join(d, name), st)
            if info is not None:
                out.append((name, st, info))
        self.views.catalog.put(key, (now, out), 200 + 200 * len(out))
        return out

    def _subdirs(self, d: bytes) -> list[tuple[bytes, os.stat_result]]:
        try:
            entries = sorted(self.views.source.scan(d))
        except OSError:
            return []
        return [(n, st) for n, st in entries if stat.S_ISDIR(st.st_mode)
                and _join(d, n) != b".journalfs"]

    def _holds(self, d: bytes, top: bytes) -> bool:
        """SOURCE dir ``d`` has, anywhere below, what ``top`` shows."""
        key = ("stateholds", top, d)
        cached = self.views.catalog.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < SCAN_TTL:
            return cached[1]
        found, pending = False, [d]
        while pending and not found:
            cur = pending.pop()
            if self._here(cur, top):
                found = True
                break
            pending.extend(_join(cur, n) for n, _ in self._subdirs(cur))
        self.views.catalog.put(key, (now, found), 100 + len(d))
        return found

    def _here(self, d: bytes, top: bytes) -> list[bytes]:
        """The names of the systems ``top`` shows right in SOURCE dir ``d``."""
        if top == b"queues":
            return list(self._queues(d))
        if top == b"transactions":
            return [n for n, _, info in self._files(d) if info.codec.name == Jrnl.name]
        if top == b"changes":
            return [n for n, _, info in self._files(d) if info.codec.name == GvfsJournal.name]
        return [n for n, _ in self._subdirs(d) if self._akka(_join(d, n)) is not None]

    def _queues(self, d: bytes) -> dict[bytes, tuple[list, list]]:
        """``{queue: ([(name, st, info)] writer files in order, [(reader, name, st, info)])}``."""
        out: dict[bytes, tuple[list, list]] = {}
        for name, st, info in self._files(d):
            if info.codec.name not in (WRITER, READER):
                continue
            q = queue_name(name.decode("utf-8", "surrogateescape"))
            if q is None:
                continue
            qb = q.encode("utf-8", "surrogateescape")
            writers, readers = out.setdefault(qb, ([], []))
            if info.codec.name == WRITER:
                writers.append((name, st, info))
            else:
                readers.append((name[len(qb) + len(b".read."):], name, st, info))
        return out

    def _akka(self, d: bytes):
        """(meta, data) of the akka journal in SOURCE dir ``d`` ((name, st, info) each, data
        may be None), or None."""
        files = self._files(d)
        metas = [f for f in files if f[2].codec.name == AkkaMeta.name]
        if not metas:
            return None
        meta = next((f for f in metas if f[0] == b"meta"), metas[0])
        datas = [f for f in files if f[2].codec.name == AkkaData.name]
        partner = AkkaMeta().partners(meta[0].decode("utf-8", "surrogateescape"),
                                      [(f[0].decode("utf-8", "surrogateescape"), AkkaData.name)
                                       for f in datas])
        want = partner.get("data")
        data = next((f for f in datas if f[0].decode("utf-8", "surrogateescape") == want), None)
        return meta, data

    def _records(self, rel: bytes, info) -> tuple[list[dict], FormatError | None]:
        """Every valid record of SOURCE/``rel`` (remembered per file identity)."""
        key = ("staterecords", rel, info.ident)
        cached = self.views.catalog.get(key)
        if cached is not None:
            return cached
        fd = self.views._open(rel)
        try:
            size = os.fstat(fd).st_size
            records: list[dict] = []
            error = None
            with pread_buffer(fd, 0, size, size) as buf:
                try:
                    records.extend(info.codec.read(buf, self.views._display_path(rel)))
                except FormatError as exc:
                    error = exc.detached()
        finally:
            os.close(fd)
        cost = size + 300 * len(records)
        self.views.catalog.put(key, (records, error), cost)
        return records, error

    @staticmethod
    def _check_size(files) -> None:
        if sum(f[1].st_size for f in files) > STATE_MAX_BYTES:
            raise OSError(errno.EFBIG, "journal files too big for a state view")

    # -- permissions ---------------------------------------------------------------------------
    @staticmethod
    def _perms(files) -> tuple[tuple[int, int], int, int]:
        """(owner, dir mode, file mode) of a system's paths from its files' lstats: owner and
        group of the newest; the read bits every file grants (see the module doc)."""
        newest = max(files, key=lambda f: f[1].st_mtime_ns)[1]
        owner = (newest.st_uid, newest.st_gid)
        bits = 0o444
        for _, st in files:
            if (st.st_uid, st.st_gid) == owner:
                bits &= st.st_mode & 0o444
            else:
                other = st.st_mode & 0o004
                bits &= other * 0o111
        return owner, stat.S_IFDIR | bits | (bits >> 2), stat.S_IFREG | bits

    def _mirror(self, d: bytes, top: bytes) -> Entry:
        st = self.views.source.lstat(d)
        names = [n for n, _ in self._subdirs(d) if self._holds(_join(d, n), top)]
        here = self._here(d, top)
        children = sorted(set(names) | set(here))
        return Entry(True, (st.st_uid, st.st_gid), stat.S_IFDIR | (st.st_mode & 0o555),
                     st.st_mtime_ns, children)

    # -- resolving a path (worker thread) ------------------------------------------------------
    def resolve(self, rel: bytes) -> Entry | None:
        """What ``rel`` (``queues/...``, ``persistence/...``, ``transactions/...``) is now."""
        comps = rel.split(b"/")
        top, comps = comps[0], comps[1:]
        d = b""
        for i, c in enumerate(comps):
            if top == b"queues" and c in self._queues(d):
                return self._queue(d, c, comps[i + 1:])
            sub = _join(d, c)
            if top == b"persistence" and self._akka(sub) is not None:
                return self._journal(sub, comps[i + 1:])
            if top == b"transactions" and c in self._here(d, top):
                return self._transactions(sub, comps[i + 1:])
            if top == b"changes" and c in self._here(d, top):
                return self._changes(sub, comps[i + 1:])
            if not any(n == c for n, _ in self._subdirs(d)) or not self._holds(sub, top):
                return None
            d = sub
        return self._mirror(d, top)

    def _queue(self, d: bytes, name: bytes, rest: list[bytes]) -> Entry | None:
        writers, readers = self._queues(d)[name]
        files = [(n, st) for n, st, _ in writers] + [(n, st) for _, n, st, _ in readers]
        self._check_size(files)
        owner, dmode, fmode = self._perms(files)
        mtime = max(st.st_mtime_ns for _, st in files)
        key = ("statequeue", d, name, tuple(info.ident for *_, info in writers + readers))
        states = self.views.catalog.get(key)
        if states is None:  # computed once per version of the files (ls -l asks per item)
            writer_files = []
            for n, _, info in writers:
                records, _ = self._records(_join(d, n), info)
                writer_files.append((n.decode("utf-8", "surrogateescape"), records))
            reader_files = [(r.decode("utf-8", "surrogateescape"),
                             self._records(_join(d, n), info)[0]) for r, n, _, info in readers]
            states = {(escape_name(r.reader) if r.reader else DEFAULT_READER):
                      (r, {b"%08d.item" % i["id"]: i for i in r.items})
                      for r in state.queue_readers(name.decode("utf-8", "surrogateescape"),
                                                   writer_files, reader_files)}
            self.views.catalog.put(key, states, 1000 + 100 * sum(len(v[1]) for v in states.values()))
        now_ms = int(time.time() * 1000)
        if not rest:
            return Entry(True, owner, dmode, mtime, [STATE_JSON] + list(states))
        if rest == [STATE_JSON]:
            doc = [r.summary(now_ms) for r, _ in states.values()]
            return Entry(False, owner, fmode, mtime, content=_json(doc))
        if rest[0] not in states or len(rest) > 2:
            return None
        reader, items = states[rest[0]]
        if len(rest) == 1:
            return Entry(True, owner, dmode, mtime, [STATE_JSON] + list(items)[:MAX_ENTRIES])
        if rest[1] == STATE_JSON:
            return Entry(False, owner, fmode, mtime, content=_json(reader.summary(now_ms)))
        item = items.get(rest[1])
        if item is None:
            return None
        return Entry(False, owner, fmode, mtime, content=bytes(item.get("payload") or b""))

    def _journal(self, sub: bytes, rest: list[bytes]) -> Entry | None:
        meta, data = self._akka(sub)
        parts = [meta] + ([data] if data is not None else [])
        files = [(n, st) for n, st, _ in parts]
        self._check_size(files)
        owner, dmode, fmode = self._perms(files)
        mtime = max(st.st_mtime_ns for _, st in files)
        key = ("statejournal", sub, tuple(f[2].ident for f in parts))
        ids = self.views.catalog.get(key)
        if ids is None:  # computed once per version of the files
            metas = self._records(_join(sub, meta[0]), meta[2])[0]
            blocks = self._records(_join(sub, data[0]), data[2])[0] if data is not None else []
            ids = {escape_name(p.persistence_id): (p, {b"%08d.event" % e["seq_nr"]: e
                                                       for e in p.events})
                   for p in state.persistence_ids(metas, blocks)}
            self.views.catalog.put(key, ids, 1000 + 100 * sum(len(v[1]) for v in ids.values()))
        if not rest:
            return Entry(True, owner, dmode, mtime, [STATE_JSON] + list(ids))
        if rest == [STATE_JSON]:
            doc = [p.summary() for p, _ in ids.values()]
            return Entry(False, owner, fmode, mtime, content=_json(doc))
        if rest[0] not in ids or len(rest) > 2:
            return None
        pid, events = ids[rest[0]]
        if len(rest) == 1:
            return Entry(True, owner, dmode, mtime, [STATE_JSON] + list(events)[:MAX_ENTRIES])
        if rest[1] == STATE_JSON:
            return Entry(False, owner, fmode, mtime, content=_json(pid.summary()))
        ev = events.get(rest[1])
        if ev is None:
            return None
        return Entry(False, owner, fmode, mtime, content=bytes(ev.get("payload") or b""))

    def _transactions(self, sub: bytes, rest: list[bytes]) -> Entry | None:
        d, _, name = sub.rpartition(b"/")
        found = next((f for f in self._files(d) if f[0] == name), None)
        if found is None:
            return None
        name, st, info = found
        self._check_size([(name, st)])
        owner, dmode, fmode = self._perms([(name, st)])
        records, error = self._records(sub, info)
        key = ("statetx", sub, info.ident)
        named = self.views.catalog.get(key)
        if named is None:
            rows = state.transaction_rows(sub.decode("utf-8", "surrogateescape"), records)
            named = {b"%08d.%s" % (r["seq"], str(r["status"]).encode()): r for r in rows}
            self.views.catalog.put(key, named, 1000 + 300 * len(named))
        rows = list(named.values())
        if not rest:
            return Entry(True, owner, dmode, st.st_mtime_ns,
                         [STATE_JSON] + list(named)[:MAX_ENTRIES])
        if len(rest) > 1:
            return None
        if rest[0] == STATE_JSON:
            by_status: dict[str, int] = {}
            for r in rows:
                by_status[r["status"]] = by_status.get(r["status"], 0) + 1
            doc = {"transactions": len(rows), "by_status": by_status,
                   "incomplete": [r for r in rows if r["status"] != "complete"],
                   "damage": None if error is None else
                   {"offset": error.offset, "reason": error.reason}}
            return Entry(False, owner, fmode, st.st_mtime_ns, content=_json(doc))
        row = named.get(rest[0])
        if row is None:
            return None
        return Entry(False, owner, fmode, st.st_mtime_ns,
                     content=(json.dumps(row, ensure_ascii=False) + "\n").encode())


    def _changes(self, sub: bytes, rest: list[bytes]) -> Entry | None:
        d, _, name = sub.rpartition(b"/")
        files = self._files(d)
        found = next((f for f in files if f[0] == name), None)
        if found is None:
            return None
        name, st, info = found
        parts = [(name, st)]
        tree = None
        named = tree_and_tag(name.decode("utf-8", "surrogateescape"))
        tree_file = None
        if named is not None:
            tree_file = next((f for f in files if f[0].decode("utf-8", "surrogateescape")
                              == named[0] and f[2].codec.name == GvfsTree.name), None)
        self._check_size(parts + ([(tree_file[0], tree_file[1])] if tree_file else []))
        owner, dmode, fmode = self._perms(parts)
        key = ("statechanges", sub, info.ident, tree_file[2].ident if tree_file else None)
        named_rows = self.views.catalog.get(key)
        if named_rows is None:
            records, error = self._records(sub, info)
            if tree_file is not None:
                tree = self._tree(_join(d, tree_file[0]), named[1])
            rows = state.change_rows(records, tree)
            named_rows = ({b"%08d.%s" % (r["seq"], str(r["change"]).encode()): r for r in rows},
                          error)
            self.views.catalog.put(key, named_rows, 1000 + 300 * len(rows))
        by_name, error = named_rows
        if not rest:
            return Entry(True, owner, dmode, st.st_mtime_ns,
                         [STATE_JSON] + list(by_name)[:MAX_ENTRIES])
        if len(rest) > 1:
            return None
        if rest[0] == STATE_JSON:
            counts: dict[str, int] = {}
            for r in by_name.values():
                counts[r["change"]] = counts.get(r["change"], 0) + 1
            doc = {"entries": len(by_name), "by_change": counts,
                   "damage": None if error is None else
                   {"offset": error.offset, "reason": error.reason}}
            return Entry(False, owner, fmode, st.st_mtime_ns, content=_json(doc))
        row = by_name.get(rest[0])
        if row is None:
            return None
        return Entry(False, owner, fmode, st.st_mtime_ns,
                     content=(json.dumps(row, ensure_ascii=False) + "\n").encode(
                         "utf-8", "surrogateescape"))

    def _tree(self, rel: bytes, tag: str):
        """A TreeView of the tree SOURCE/``rel`` when its tag is ``tag``, else None."""
        fd = self.views._open(rel)
        try:
            size = os.fstat(fd).st_size
            with pread_buffer(fd, 0, size, size) as buf:
                data = bytes(buf)
        finally:
            os.close(fd)
        got = header_tag(data[:16])
        if got is None or f"{got:08x}" != tag:
            return None
        try:
            return TreeView(data, self.views._display_path(rel))
        except FormatError:
            return None


def _json(doc) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, indent=1) + "\n").encode("utf-8",
                                                                        "surrogateescape")


__all__ = ["DEFAULT_READER", "Entry", "StateTree", "TOPS", "escape_name"]
