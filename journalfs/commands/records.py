"""`journalfs records FILE... [--json] [selection] [-f]`: decode, select and follow journal files.

Records stream straight from an mmap of the file to stdout in batches, so a journal of any size
prints with bounded memory. On damage the valid prefix is printed first, then one line on
stderr naming the file, the byte offset and the reason, and the exit code is 3.

A file whose magic matches no supported format is reported the same way ("not a supported
journal", exit 3): for ``records`` an input that cannot be decoded is damaged input.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import time
from typing import Iterable, Iterator, TextIO

from ..escaping import escaped
from ..formats import Codec, FormatError
from ..formats.base import Record
from ..fs.indexfiles import IndexCache
from ..journals import mapped, read_records, scan
from ..jsonlines import (columns_chunk, keep_freed_memory, payload_fields, record_line,
                         records_chunk)
from ..selection import (FileRecords, Follower, Keys, Notice, RecordFilter, Source,
                         expand_sources, format_time, parse_time, record_time_ns)
from .progress import Progress

from . import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE  # defined once, for every command
#: Lines written (and flushed) per batch: large enough to be cheap, small enough to stream.
BATCH = 2048
#: Fields every record has; the table shows them as fixed columns.
FIXED = ("format", "seq", "offset", "kind")
SUMMARY_VALUE_CHARS = 40
#: Columnar decoding: the most rows per batch, and the file bytes a batch aims to span (so
#: that records with big payloads still make small batches).
MAX_ROWS, BATCH_SPAN = 16384, 2 << 20
#: The JSON a batch aims to write at most: records whose lines are long (jrnl transactions with
#: many operations) make smaller batches, so the objects built for them stay few.
OUTPUT_SPAN = 2 << 20


def _selective(args) -> bool:
    return bool(args.follow or args.lines is not None or args.count is not None
                or args.from_seq is not None or args.to_seq is not None or args.since
                or args.until or args.kind or args.key is not None or args.grep
                or args.payload or args.utc)


def run(args) -> int:
    if args.json:
        keep_freed_memory()
    try:
        select = _selection(args)
    except ValueError as exc:
        print(f"journalfs records: error: {escaped(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    groups, sources = expand_sources(args.files)
    if not sources:
        raise OSError(errno.ENOENT, "no journal files here", args.files[0])
    plain = len(args.files) == 1 and groups[0].kind == "file" and not _selective(args)
    try:
        if plain:
            return _print_records(args, sources[0].codec, sources[0].path)
        return _print_selection(args, select, groups, sources)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:  # -f stopped with Ctrl-C: what was printed is the answer
        sys.stdout.flush()
        return EXIT_OK


def _selection(args) -> RecordFilter:
    """The content filter of ``args``; ValueError (a usage error) for what cannot be read."""
    if args.lines is not None and args.count is not None:
        raise ValueError("-n/--lines and -c/--count exclude each other")
    if args.from_seq is not None and args.to_seq is not None and args.to_seq < args.from_seq:
        raise ValueError(f"--to {args.to_seq} is before --from {args.from_seq}")
    grep = None
    if args.grep:
        try:
            grep = re.compile(args.grep)
        except re.error as exc:
            raise ValueError(f"--grep: {exc}") from None
    since = until = None
    if args.since:
        since = parse_time(args.since, args.utc)
    if args.until:
        until = parse_time(args.until, args.utc)
    kinds = frozenset(k.strip() for k in args.kind.split(",") if k.strip()) if args.kind else None
    return RecordFilter(kinds, args.key, grep, since, until)


# -- selections and following ---------------------------------------------------------------------

#: How often a follower looks at its files (new records show within twice this).
FOLLOW_POLL = 0.05


class Printer:
    """Writes records as the table or JSON lines, and notices on stderr."""

    def __init__(self, args, several: bool):
        self.json, self.utc, self.several = args.json, args.utc, several
        self.payload = args.payload or ("base64" if args.json else "auto")
        self.out = sys.stdout
        if hasattr(self.out, "reconfigure"):
            self.out.reconfigure(errors="backslashreplace")
        self.width = 0 if self.json else _terminal_width(self.out)
        self.current = None
        self.lines: list[str] = []
        if not self.json and several:
            self.lines.append(_row("SEQ", "OFFSET", "TIME", "KIND", "FIELDS", self.width))

    def record(self, source: Source, rec: Record) -> None:
        if self.json:
            self.lines.append(record_line(rec, self.payload,
                                          source.path if self.several else None))
            return
        if source.path != self.current:
            self.current = source.path
            self.lines.append(f"# {source.path} ({source.codec.name})" if self.several
                              else f"# {source.codec.name}")
            if not self.several:
                self.lines.append(_row("SEQ", "OFFSET", "TIME", "KIND", "FIELDS", self.width))
        self.lines.append(table_row(rec, source.codec, self.payload, self.utc, self.width))

    def record_header(self, source: Source) -> None:
        self.current = source.path
        if self.several:
            return
        self.lines.append(f"# {source.codec.name}")
        self.lines.append(_row("SEQ", "OFFSET", "TIME", "KIND", "FIELDS", self.width))

    def flush(self) -> None:
        if self.lines:
            self.lines.append("")
            self.out.write("\n".join(self.lines))
            self.lines.clear()
        self.out.flush()

    def notice(self, path: str, text: str) -> None:
        self.flush()
        print(f"journalfs: {escaped(str(path))}: {escaped(text)}", file=sys.stderr, flush=True)


def _print_selection(args, select: RecordFilter, groups, sources: list[Source]) -> int:
    several = len(sources) > 1 or any(g.kind != "file" for g in groups)
    printer = Printer(args, several)
    cache = IndexCache()
    try:
        return _select(args, select, groups, sources, printer, cache)
    finally:
        cache.close()


def _select(args, select: RecordFilter, groups, sources: list[Source], printer: "Printer",
            cache) -> int:
    several = printer.several
    # indexed when first reached: -n on a directory of many journals touches the last ones
    files = [FileRecords(src, lambda src=src: cache(src)) for src in sources]
    lines = args.lines
    if lines is None and args.follow and args.count is None and args.from_seq is None \
            and not select.by_time:
        lines = 10  # journalctl -f
    keys = {f.path: Keys(f.source) for f in files} if select.key is not None else {}

    def passes(f: FileRecords, rec: Record) -> bool:
        key = keys[f.path](rec) if keys else None
        return select.matches(f.codec, rec, key)

    if lines is not None:
        picked: list[tuple[FileRecords, list[Record]]] = []
        need = lines
        for f in reversed(files):
            if need <= 0:
                break
            lo, hi = _bounds(args, select, f)
            for piece in f.backward(lo, hi):
                kept = [r for r in piece if passes(f, r)][-need:] if need else []
                if kept:
                    picked.append((f, kept))
                    need -= len(kept)
                if need <= 0:
                    break
        for f, recs in reversed(picked):
            for rec in recs:
                printer.record(f.source, rec)
        printer.flush()
    else:
        left = args.count
        for f in files:
            if left is not None and left <= 0:
                break
            lo, hi = _bounds(args, select, f)
            for rec in f.forward(lo, hi):
                if passes(f, rec):
                    printer.record(f.source, rec)
                    if len(printer.lines) >= BATCH:
                        printer.flush()
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            break
        printer.flush()
    if not args.json and not several and files and printer.current is None:
        printer.record_header(files[0].source)
        printer.flush()
    damaged = [f.error for f in files if f.indexed and f.error is not None]
    for exc in damaged:
        print(f"journalfs: {escaped(str(exc))}", file=sys.stderr, flush=True)
    if not args.follow:
        return EXIT_DAMAGED if damaged else EXIT_OK
    return _follow(args, select, groups, files, printer, passes)


def _bounds(args, select: RecordFilter, f: FileRecords) -> tuple[int, int]:
    lo, hi = 0, f.count
    if args.from_seq is not None:
        lo = max(lo, args.from_seq)
    if args.to_seq is not None:
        hi = min(hi, args.to_seq + 1)
    if select.by_time:
        tlo, thi = f.time_bounds(select.since_ns, select.until_ns)
        lo, hi = max(lo, tlo), min(hi, thi)
    return lo, max(lo, hi)


def _follow(args, select, groups, files: list[FileRecords], printer: Printer, passes) -> int:
    follower = Follower(groups)
    by_path = {f.path: f for f in files}
    try:
        for f in files:
            last, seen = None, f.index.identity or None
            if f.count:
                try:
                    rec = next(iter(f.forward(f.count - 1, f.count)), None)
                except (FormatError, OSError):  # changed since the selection was read
                    printer.notice(f.path, "truncated or rewritten while it was read: "
                                           "reading it from its start")
                    rec, seen = None, (0, -1, 0)
                if rec is not None:
                    last = (rec["offset"], rec["seq"])
            follower.start(f.source, last, seen)
        while True:
            for item in follower.poll():
                if isinstance(item, Notice):
                    printer.notice(item.path, item.text)
                    continue
                source, rec = item
                if args.to_seq is not None and rec["seq"] > args.to_seq:
                    continue
                f = by_path.get(source.path)
                if f is None or f.codec is not source.codec:
                    f = by_path[source.path] = _Live(source)
                if passes(f, rec):
                    printer.record(source, rec)
            printer.flush()
            time.sleep(FOLLOW_POLL)
    finally:
        follower.close()


class _Live:
    """What the filter asks of a file that appeared while following."""

    def __init__(self, source: Source):
        self.source, self.path, self.codec = source, source.path, source.codec


def _print_records(args, codec: Codec, path: str) -> int:
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        # a table row may show a raw file name (lone surrogates): print those as "\udcXX"
        out.reconfigure(errors="backslashreplace")
    with mapped(path) as buf, Progress(len(buf), os.path.basename(path)) as progress:
        try:
            if args.json:
                for chunk in json_chunks(codec, buf, path, progress):
                    _write(out, chunk)
            else:
                records = _record_stream(codec, buf, path, progress)
                _write_batched(out, table_lines(records, codec, _terminal_width(out)))
        except FormatError as exc:
            out.flush()
            progress.close()
            return _damaged(exc)
    out.flush()
    return EXIT_OK


def _damaged(exc: FormatError) -> int:
    sys.stdout.flush()
    print(f"journalfs: {escaped(str(exc))}", file=sys.stderr, flush=True)
    return EXIT_DAMAGED


def _write(out: TextIO, chunk: bytes) -> None:
    """One chunk of whole output lines (about a megabyte), straight to the byte stream when
    there is one, and flushed: the output streams."""
    if hasattr(out, "buffer"):
        out.flush()
        out.buffer.write(chunk)
    else:  # an in-memory text stream (tests)
        out.write(chunk.decode("utf-8"))
    out.flush()


def _record_stream(codec: Codec, buf, path: str, progress: Progress) -> Iterator[Record]:
    """:meth:`Codec.read`'s records of ``path`` through the one reader, the bar moved."""
    return read_records(codec, buf, path, progress.update)


def _write_batched(out: TextIO, lines: Iterable[str]) -> None:
    """Write ``lines`` in batches of :data:`BATCH`, flushing each batch (streaming output);
    a batch in progress when the iterator raises is written before the exception propagates."""
    batch: list[str] = []
    try:
        for line in lines:
            batch.append(line)
            if len(batch) >= BATCH:
                _flush_batch(out, batch)
    finally:
        if batch:
            _flush_batch(out, batch)


def _flush_batch(out: TextIO, batch: list[str]) -> None:
    batch.append("")
    out.write("\n".join(batch))
    out.flush()
    batch.clear()


# -- JSON lines ---------------------------------------------------------------------------------

def json_chunks(codec: Codec, buf, path: str, progress: Progress | None = None
                ) -> Iterator[bytes]:
    """The ``--json`` output of ``path`` (mapped as ``buf``) in chunks of whole lines, each
    line exactly :func:`journalfs.jsonlines.json_line` of a record, in file order; raises the
    codec's :class:`FormatError` after the chunks of the valid prefix.

    A codec with a column decoder of its own is read in batches of about ``BATCH_SPAN``
    bytes (:func:`journalfs.journals.scan`) rendered by
    :func:`journalfs.jsonlines.columns_chunk`; the others stream :meth:`Codec.read`. Pages
    behind the reader are released."""
    progress = progress or Progress(0, "", enabled=False)
    if not codec.columnar:
        records = read_records(codec, buf, path, progress.update)
        with contextlib.closing(records):
            while True:
                chunk = records_chunk(records, BATCH)
                if chunk.rows:
                    yield chunk.data
                if chunk.error is not None:
                    raise chunk.error
                if chunk.rows < BATCH:
                    return
    start, most = None, MAX_ROWS
    for cols in scan(codec, buf, path, rows=lambda: most, span=BATCH_SPAN,
                     progress=progress.update):
        if cols.rows:
            stop = cols.next_offset if cols.error is None else cols.error.offset
            data = columns_chunk(codec, buf, path, cols, start, cols.next_seq - cols.rows,
                                 stop).data
            most = min(MAX_ROWS, max(16, OUTPUT_SPAN * cols.rows // max(len(data), 1)))
            yield data
            del data  # the next batch is decoded and rendered without this one's text
        if cols.error is not None:
            raise cols.error
        start = cols.next_offset


# -- the readable table -------------------------------------------------------------------------

def _terminal_width(out: TextIO) -> int:
    if not out.isatty():
        return 0  # unlimited: do not cut lines that go to a pipe or file
    from rich.console import Console  # only for a terminal: its size, no per-line rendering

    return Console(file=out).width


def table_lines(records: Iterator[Record], codec: Codec, width: int = 0,
                payload: str = "auto", utc: bool = False) -> Iterator[str]:
    """A header, then one fixed-width row per record (:func:`table_row`)."""
    yield f"# {codec.name}"
    yield _row("SEQ", "OFFSET", "TIME", "KIND", "FIELDS", width)
    for rec in records:
        yield table_row(rec, codec, payload, utc, width)


def table_row(rec: Record, codec: Codec, payload: str = "auto", utc: bool = False,
              width: int = 0) -> str:
    """seq, offset, the record's time as ISO-8601 (``-`` without one), kind and a compact
    ``field=value`` summary of the rest (cut to ``width`` when non-zero)."""
    when = format_time(record_time_ns(codec, rec), codec.columns.time_unit, utc)
    return _row(rec.get("seq"), rec.get("offset"), when, rec.get("kind"),
                summary(rec, payload, skip=codec.columns.time), width)


def _row(seq, offset, when, kind, fields: str, width: int) -> str:
    line = f"{seq!s:>8}  {offset!s:>12}  {when!s:<29}  {kind!s:<12}  {fields}"
    if width and len(line) > width:
        line = line[: max(width - 1, 0)] + "…"
    return line


def summary(rec: Record, payload: str = "auto", skip: str | None = None) -> str:
    """``field=value`` for every non-fixed field (but ``skip``, the time shown in its own
    column); payloads as their length and a preview."""
    parts = []
    for name, value in rec.items():
        if name in FIXED or name == skip:
            continue
        if name == "payload":
            parts.append(_payload_summary(value, payload))
        else:
            parts.append(f"{name}={_short(value)}")
    return " ".join(parts)


def _payload_summary(value, mode: str = "auto") -> str:
    if value is None:
        return "payload=null"
    data = bytes(value)
    if mode == "text":  # bytes that are not UTF-8 come out as \xNN (escaped() below)
        text = data.decode("utf-8", "surrogateescape")
    else:
        (name, text), = payload_fields(data, mode).items()
        if name == "payload_b64" and mode == "auto":
            text = "b64:" + text
    text = escaped(text)  # no control byte of a hostile payload reaches the terminal
    if len(text) > SUMMARY_VALUE_CHARS:
        text = text[: SUMMARY_VALUE_CHARS - 1] + "…"
    return f"payload=<{len(data)} B>{text}"
def _short(value) -> str:
    if isinstance(value, str):
        text = repr(value) if (not value or " " in value) else escaped(value)
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        text = "[" + ",".join(str(v.get("op", "?")) for v in value) + "]"  # jrnl ops by name
    else:
        text = str(value).replace(" ", "")
    if len(text) > SUMMARY_VALUE_CHARS:
        text = text[: SUMMARY_VALUE_CHARS - 1] + "…"
    return text
