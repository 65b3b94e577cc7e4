"""`journalfs queue`, `journalfs events`, `journalfs transactions`: each system's state from its
journal files, without Spark (the semantics live in :mod:`journalfs.state`)."""
from __future__ import annotations

import json
import os
import sys
import time

from ..jsonlines import payload_fields
from ..selection import format_time
from .. import state

from . import EXIT_DAMAGED, EXIT_ERROR, EXIT_OK

#: Seconds between two looks at the files with --watch.
WATCH_POLL = 0.2


def _emit(lines: list[str]) -> None:
    if hasattr(sys.stdout, "reconfigure"):  # names that are not UTF-8 print as \udcXX
        sys.stdout.reconfigure(errors="backslashreplace")
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _damage(errors) -> int:
    for exc in errors:
        print(f"journalfs: {exc}", file=sys.stderr, flush=True)
    return EXIT_DAMAGED if errors else EXIT_OK


def _watched(args, paths_of, answer) -> int:
    """``answer()`` once, or with --watch again each time the files ``paths_of()`` change."""
    seen = _stamp(paths_of()) if args.watch else None  # before reading: no change missed
    code = answer()
    if not args.watch:
        return code
    try:
        while True:
            time.sleep(WATCH_POLL)
            now = _stamp(paths_of())
            if now != seen:
                seen = now
                if not args.json:
                    _emit(["", f"# {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"])
                answer()
    except KeyboardInterrupt:
        return EXIT_OK


def _stamp(paths) -> list:
    out: list[tuple] = []
    for p in sorted(paths):
        try:
            st = os.stat(p)
            out.append((p, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((p, None))
    return out


# -- queue ----------------------------------------------------------------------------------------

def run_queue(args) -> int:
    targets = state.queues_of(args.queue)
    if not targets:
        if not os.path.exists(os.path.dirname(args.queue) or "."):
            raise FileNotFoundError(2, "No such file or directory", args.queue)
        print(f"journalfs: {args.queue}: no Kestrel queue here", file=sys.stderr)
        return EXIT_ERROR

    def paths():
        out = []
        for directory, _q in targets:
            with_dir = state.queue_files(directory)
            for writers, readers in with_dir.values():
                out.extend(writers)
                out.extend(p for _, p in readers)
        return out

    def answer() -> int:
        errors = []
        lines: list[str] = []
        now_ms = int(time.time() * 1000)
        if not args.json and not args.pending:
            lines.append(f"{'QUEUE':<16} {'READER':<16} {'HEAD':>10} {'TAIL':>10} "
                         f"{'PENDING':>8}  OLDEST PENDING")
        for directory, name in targets:
            qs = state.queue(directory, name, args.reader)
            errors.extend(qs.errors)
            for r in qs.readers:
                if args.pending:
                    lines.extend(_pending_lines(args, r))
                elif args.json:
                    lines.append(json.dumps(r.summary(now_ms), ensure_ascii=False))
                else:
                    oldest = r.oldest_pending_ms
                    when = "-" if oldest is None else \
                        f"{format_time(oldest * 10**6, 'ms', args.utc)} ({_age(now_ms - oldest)} ago)"
                    lines.append(f"{name:<16} {r.reader or '(default)':<16} {r.head:>10} "
                                 f"{r.tail:>10} {r.pending:>8}  {when}")
        _emit(lines)
        return _damage(errors)

    return _watched(args, paths, answer)


def _pending_lines(args, r: state.ReaderState) -> list[str]:
    lines = []
    if not args.json:
        lines.append(f"# {r.queue} reader {r.reader or '(default)'}: {r.pending} pending "
                     f"after head {r.head} (tail {r.tail})")
        lines.append(f"{'ID':>10}  {'ADDED':<29}  {'EXPIRES':<29}  {'ERRORS':>6}  PAYLOAD")
    for item in r.items:
        if args.json:
            out = {"queue": r.queue, "reader": r.reader, "id": item["id"],
                   "add_time": item.get("add_time"), "expire_time": item.get("expire_time"),
                   "error_count": item.get("error_count"), "source": item.get("source"),
                   "offset": item.get("offset")}
            out.update(payload_fields(item.get("payload"), "auto"))
            lines.append(json.dumps(out, ensure_ascii=False))
            continue
        added = format_time(_ms(item.get("add_time")), "ms", args.utc)
        expires = format_time(_ms(item.get("expire_time")), "ms", args.utc)
        lines.append(f"{item['id']:>10}  {added:<29}  {expires:<29}  "
                     f"{item.get('error_count', 0):>6}  {_preview(item.get('payload'))}")
    return lines


def _ms(value):
    return value * 10**6 if isinstance(value, int) else None


def _age(ms: int) -> str:
    """``3d 4h``, ``12min 5s``: the two largest units of a duration."""
    s = max(0, ms) // 1000
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "min"), (s, "s")) if v]
    return " ".join(parts[:2]) or "0s"


def _preview(payload, width: int = 60) -> str:
    if payload is None:
        return "-"
    (name, text), = payload_fields(payload, "auto").items()
    text = ("b64:" if name == "payload_b64" else "") + text
    text = text.replace("\n", "\\n")
    return f"<{len(payload)} B>" + (text if len(text) <= width else text[:width - 1] + "…")


# -- events ---------------------------------------------------------------------------------------

def run_events(args) -> int:
    if not os.path.exists(args.journal):
        raise FileNotFoundError(2, "No such file or directory", args.journal)

    def paths():
        return [p for p in state.akka_pair(args.journal) if p]

    def answer() -> int:
        journal = state.persistence(args.journal, args.persistence_id)
        if journal.meta is None:
            print(f"journalfs: {args.journal}: no akka-persistence meta file here",
                  file=sys.stderr)
            return EXIT_ERROR
        if args.persistence_id is not None and not journal.ids:
            print(f"journalfs: {args.journal}: no persistence id {args.persistence_id!r}",
                  file=sys.stderr)
            return EXIT_ERROR
        lines: list[str] = []
        if args.persistence_id is None:
            if not args.json:
                lines.append(f"{'PERSISTENCE ID':<24} {'EVENTS':>8} {'HIGHEST SEQ':>12}  "
                             "CONSISTENT")
            for pid in journal.ids:
                if args.json:
                    lines.append(json.dumps(pid.summary(), ensure_ascii=False))
                else:
                    why = "" if pid.consistent else f"  ({'; '.join(pid.problems)})"
                    lines.append(f"{pid.persistence_id:<24} {pid.messages:>8} "
                                 f"{pid.highest_seq:>12}  {'yes' if pid.consistent else 'no'}{why}")
        else:
            (pid,) = journal.ids
            if not args.json:
                lines.append(f"# {pid.persistence_id}: {pid.messages} events, highest "
                             f"sequence number {pid.highest_seq}"
                             + ("" if pid.consistent else f"; inconsistent: {'; '.join(pid.problems)}"))
                lines.append(f"{'SEQ_NR':>8}  {'OFFSET':>10}  PAYLOAD")
            for ev in pid.events:
                n = ev["seq_nr"]
                if (args.from_seq is not None and n < args.from_seq) or \
                        (args.to_seq is not None and n > args.to_seq):
                    continue
                if args.json:
                    out = {"persistence_id": pid.persistence_id, "seq_nr": n,
                           "source": journal.data, "offset": ev["offset"]}
                    out.update(payload_fields(ev.get("payload"), args.payload))
                    lines.append(json.dumps(out, ensure_ascii=False))
                else:
                    (name, text), = payload_fields(ev.get("payload"), args.payload).items()
                    if name == "payload_b64" and args.payload == "auto":
                        text = "b64:" + text
                    lines.append(f"{n:>8}  {ev['offset']:>10}  {text}")
        _emit(lines)
        return _damage(journal.errors)

    return _watched(args, paths, answer)


# -- transactions ---------------------------------------------------------------------------------

def run_transactions(args) -> int:
    for path in args.files:
        with open(path, "rb"):  # missing or unreadable: an ordinary error, named
            pass

    def answer() -> int:
        errors = []
        lines: list[str] = []
        if not args.json:
            lines.append(f"{'OFFSET':>10}  {'TIME':<25}  {'STATUS':<9}  OPS")
        for path in args.files:
            rows, error = state.transactions(path)
            if error is not None:
                errors.append(error)
            if not args.json and len(args.files) > 1:
                lines.append(f"# {path}")
            for row in rows:
                if args.incomplete and row["status"] == "complete":
                    continue
                if args.json:
                    lines.append(json.dumps(row, ensure_ascii=False))
                else:
                    t = row["time"]
                    when = format_time(t * 10**9 if isinstance(t, int) else None, "s", args.utc)
                    lines.append(f"{row['offset']:>10}  {when:<25}  {row['status']:<9}  "
                                 f"{','.join(str(o) for o in row['ops'])}")
        _emit(lines)
        return _damage(errors)

    return _watched(args, lambda: list(args.files), answer)


# -- gvfs changes ---------------------------------------------------------------------------------

def run_changes(args) -> int:
    with open(args.journal, "rb"):  # missing or unreadable: an ordinary error, named
        pass

    def under(row) -> bool:
        if args.path is None:
            return True
        base = args.path.rstrip("/") or "/"
        return any(isinstance(p, str) and (p == base or p.startswith(base.rstrip("/") + "/"))
                   for p in (row["path"], row["source"]))

    def answer() -> int:
        rows, error = state.metadata_changes(args.journal)
        lines: list[str] = []
        if not args.json:
            lines.append(f"{'SEQ':>6}  {'TIME':<25}  {'CHANGE':<8}  PATH  KEY: BEFORE -> AFTER")
        for row in rows:
            if not under(row):
                continue
            if args.json:
                lines.append(json.dumps(row, ensure_ascii=False))
                continue
            t = row["time"]
            when = format_time(t * 10**9 if isinstance(t, int) else None, "s", args.utc)
            what = f"{row['path']}"
            if row["change"] == "copy":
                what = f"{row['source']} -> {row['path']}"
            elif row["key"] is not None:
                what += f"  {row['key']}: {_value(row.get('before'))} -> {_value(row.get('after'))}"
            lines.append(f"{row['seq']:>6}  {when:<25}  {row['change']:<8}  {what}")
        _emit(lines)
        return _damage([error] if error is not None else [])

    return _watched(args, lambda: [args.journal], answer)


def _value(value) -> str:
    if value is None:
        return "(unset)"
    return json.dumps(value, ensure_ascii=False)


__all__ = ["run_changes", "run_events", "run_queue", "run_transactions"]
