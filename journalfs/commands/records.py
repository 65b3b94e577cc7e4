"""`journalfs records FILE [--json]`: decode any supported journal file.

Records stream straight from an mmap of the file to stdout in batches, so a journal of any size
prints with bounded memory. On damage the valid prefix is printed first, then one line on
stderr naming the file, the byte offset and the reason, and the exit code is 3.

A file whose magic matches no supported format is reported the same way ("not a supported
journal", exit 3): for ``records`` an input that cannot be decoded is damaged input.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterable, Iterator, TextIO

from ..formats import Codec, FormatError
from ..formats.base import Columns, Record
from ..journals import mapped, sniff_file
from ..jsonlines import columns_chunk, has_columns, keep_freed_memory, records_chunk, render_rows
from ..pagecache import PagePacer, Releaser
from .parsing import add_command
from .progress import Progress

from . import EXIT_DAMAGED, EXIT_OK  # defined once, for every command
#: Lines written (and flushed) per batch: large enough to be cheap, small enough to stream.
BATCH = 2048
#: Fields every record has; the table shows them as fixed columns.
FIXED = ("format", "seq", "offset", "kind")
SUMMARY_VALUE_CHARS = 40
#: Columnar decoding: rows of the first batch, the most rows per batch, and the file bytes a
#: batch aims to span (so that records with big payloads still make small batches).
FIRST_ROWS, MAX_ROWS, BATCH_SPAN = 1024, 16384, 2 << 20
#: The JSON a batch aims to write at most: records whose lines are long (jrnl transactions with
#: many operations) make smaller batches, so the objects built for them stay few.
OUTPUT_SPAN = 2 << 20


DESCRIPTION = (
    "Decode a journal file of any supported format (found by its content) and print its "
    "records: a table by default, or with --json one JSON object per record and line (the "
    "fields are listed in docs/contract.md). On damage the valid records are printed first, "
    "then one line on stderr names the file, the byte offset and the reason, and the exit "
    "status is 3.")


def add_parser(sub) -> None:
    p = add_command(sub, "records", "decode a journal file into its records", DESCRIPTION,
                    "journalfs records /data/queues/jobs.1700000000000",
                    "journalfs records db.jrnl --json | jq -r .status")
    p.add_argument("file", help="any supported journal file (detected by its magic bytes)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per record and line (the contract's fields)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.json:
        keep_freed_memory()
    codec = sniff_file(args.file)
    if codec is None:
        with open(args.file, "rb"):  # a missing/unreadable file is an ordinary error (exit 1)
            pass
        return _damaged(FormatError(args.file, 0, "not a supported journal (unknown magic bytes)"))
    try:
        return _print_records(args, codec)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _print_records(args, codec: Codec) -> int:
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        # a table row may show a raw file name (lone surrogates): print those as "\udcXX"
        out.reconfigure(errors="backslashreplace")
    with mapped(args.file) as buf, Progress(len(buf), os.path.basename(args.file)) as progress:
        try:
            if args.json:
                for chunk in json_chunks(codec, buf, args.file, progress):
                    _write(out, chunk)
            else:
                records = _record_stream(codec, buf, args.file, progress)
                _write_batched(out, table_lines(records, codec.name, _terminal_width(out)))
        except FormatError as exc:
            out.flush()
            progress.close()
            return _damaged(exc)
    out.flush()
    return EXIT_OK


def _damaged(exc: FormatError) -> int:
    sys.stdout.flush()
    print(f"journalfs: {exc}", file=sys.stderr, flush=True)
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
    """:meth:`Codec.read`'s records of ``path``; a codec that streams only in batches of
    columns (a gvfs tree, which cannot resume mid-file) is read through them."""
    if not hasattr(codec, "column_batches"):
        return _released(codec.read(buf, path), buf, progress)
    return (rec for cols in _column_batches(codec, buf, path, progress)
            for rec in cols.records())


def _column_batches(codec: Codec, buf, path: str, progress: Progress) -> Iterator[Columns]:
    """``codec.column_batches`` of ``path``, the mapping's pages dropped after each batch and
    the bar moved; raises the damage after the batches of the valid rows."""
    count = 0
    with contextlib.closing(codec.column_batches(buf, path, MAX_ROWS, PagePacer(buf))) as batches:
        for cols in batches:
            if cols.rows:
                yield cols
                count += cols.rows
                progress.update(int(cols.data["offset"][-1]), count)
            if cols.error is not None:
                raise cols.error


def _released(records: Iterator[Record], buf, progress: Progress) -> Iterator[Record]:
    """``records`` as they come, dropping the mapping's pages behind them and moving the bar."""
    releaser = Releaser(buf)
    try:
        for n, rec in enumerate(records):
            if not n & 1023:
                releaser.passed(rec["offset"])
                progress.update(rec["offset"], n)
            yield rec
    finally:
        records.close()


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

    Codecs that decode columns are read in batches of about ``BATCH_SPAN`` bytes and rendered
    by :func:`journalfs.jsonlines.columns_chunk`; one that cannot resume mid-file (a gvfs
    tree) is rendered from its ``column_batches`` as they come; the others
    stream :meth:`Codec.read`. Pages behind the reader are released."""
    progress = progress or Progress(0, "", enabled=False)
    if hasattr(codec, "column_batches"):
        for cols in _column_batches(codec, buf, path, progress):
            order = list(cols.data)  # a record's fields: the columns are in their order
            for lo in range(0, cols.rows, MAX_ROWS):
                yield render_rows(cols, order, lo, min(cols.rows, lo + MAX_ROWS))
        return
    if not (codec.resumable and has_columns(codec)):
        with contextlib.closing(_released(codec.read(buf, path), buf, progress)) as records:
            while True:
                chunk = records_chunk(records, BATCH)
                if chunk.rows:
                    yield chunk.data
                if chunk.error is not None:
                    raise chunk.error
                if chunk.rows < BATCH:
                    return
    releaser = Releaser(buf)
    start, seq, rows, count = None, 0, FIRST_ROWS, 0
    while True:
        cols = codec.read_columns(buf, path, start, seq, None, rows)
        if cols.rows:
            stop = cols.next_offset if cols.error is None else cols.error.offset
            data = columns_chunk(codec, buf, path, cols, start, seq, stop).data
            yield data
            first, last = int(cols.data["offset"][0]), int(cols.data["offset"][-1])
            rows = min(_next_rows(cols.rows, (stop if stop is not None else last + 1) - first),
                       max(16, OUTPUT_SPAN * cols.rows // max(len(data), 1)))
            count += cols.rows
            releaser.passed(last)
            progress.update(last, count)
        if cols.error is not None:
            raise cols.error
        if cols.next_offset is None or (not cols.rows and cols.next_offset == start):
            return
        start, seq = cols.next_offset, cols.next_seq


def _next_rows(rows: int, span: int) -> int:
    per_record = max(1, span // max(rows, 1))
    return int(min(MAX_ROWS, max(16, BATCH_SPAN // per_record)))


# -- the readable table -------------------------------------------------------------------------

def _terminal_width(out: TextIO) -> int:
    if not out.isatty():
        return 0  # unlimited: do not cut lines that go to a pipe or file
    from rich.console import Console  # only for a terminal: its size, no per-line rendering

    return Console(file=out).width


def table_lines(records: Iterator[Record], fmt: str, width: int = 0) -> Iterator[str]:
    """A header, then one fixed-width row per record: seq, offset, kind and a compact
    ``field=value`` summary of the rest (cut to ``width`` when non-zero)."""
    yield f"# {fmt}"
    yield _row("SEQ", "OFFSET", "KIND", "FIELDS", width)
    for rec in records:
        yield _row(rec.get("seq"), rec.get("offset"), rec.get("kind"), summary(rec), width)


def _row(seq, offset, kind, fields: str, width: int) -> str:
    line = f"{seq!s:>8}  {offset!s:>12}  {kind!s:<12}  {fields}"
    if width and len(line) > width:
        line = line[: max(width - 1, 0)] + "…"
    return line


def summary(rec: Record) -> str:
    """``field=value`` for every non-fixed field; payloads as their length and a preview."""
    parts = []
    for name, value in rec.items():
        if name in FIXED:
            continue
        if name == "payload":
            parts.append(_payload_summary(value))
        else:
            parts.append(f"{name}={_short(value)}")
    return " ".join(parts)


def _payload_summary(payload) -> str:
    if payload is None:
        return "payload=null"
    data = bytes(payload[:SUMMARY_VALUE_CHARS])
    return f"payload=<{len(payload)} B>{data!r}"


def _short(value) -> str:
    if isinstance(value, str):
        text = repr(value) if (not value or " " in value) else value
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
