"""`journalfs records FILE [--json]`: decode any supported journal file.

Records stream straight from an mmap of the file to stdout in batches, so a journal of any size
prints with bounded memory. On damage the valid prefix is printed first, then one line on
stderr naming the file, the byte offset and the reason, and the exit code is 3.

A file whose magic matches no supported format is reported the same way ("not a supported
journal", exit 3): for ``records`` an input that cannot be decoded is damaged input.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TextIO

from ..formats import FormatError
from ..formats.base import Record, record_json_line
from ..journals import mapped, sniff_file

from . import EXIT_DAMAGED, EXIT_OK  # defined once, for every command
#: Lines written (and flushed) per batch: large enough to be cheap, small enough to stream.
BATCH = 2048
#: Fields every record has; the table shows them as fixed columns.
FIXED = ("format", "seq", "offset", "kind")
SUMMARY_VALUE_CHARS = 40


def add_parser(sub) -> None:
    p = sub.add_parser("records", help="decode a journal file into its records",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="any supported journal file (detected by its magic bytes)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per record and line (the contract's fields)")
    p.set_defaults(run=run)


def run(args) -> int:
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


def _print_records(args, codec) -> int:
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        # File names in gvfs files are raw bytes, kept as lone surrogates: print them as
        # "\udcXX", which is also the JSON escape, so every line stays valid JSON.
        out.reconfigure(errors="backslashreplace")
    with mapped(args.file) as buf:
        records = codec.read(buf, args.file)
        try:
            if args.json:
                _write_batched(out, (record_json_line(r) for r in records))
            else:
                _write_batched(out, table_lines(records, codec.name, _terminal_width(out)))
        except FormatError as exc:
            out.flush()
            return _damaged(exc)
        finally:
            records.close()
    out.flush()
    return EXIT_OK


def _damaged(exc: FormatError) -> int:
    sys.stdout.flush()
    print(f"journalfs: {exc}", file=sys.stderr, flush=True)
    return EXIT_DAMAGED


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
