"""The command line of ``journalfs records`` (its work: :mod:`journalfs.commands.records`)."""
from __future__ import annotations

import argparse

from ..commands.parsing import add_command, runs
from ..options import PAYLOAD_MODES


DESCRIPTION = (
    "Decode journal files of any supported format (found by their content) and print their "
    "records: a table by default, or with --json one JSON object per record and line (the "
    "fields are listed in docs/contract.md). FILE may be a journal file, a directory (every "
    "journal under it, in name order) or a queue DIR/NAME (every Kestrel segment NAME.<n> of "
    "DIR in order, then its readers NAME.read.<r>).\n\n"
    "Selections: -n the last N records, --count the first N, --from/--to a range of record "
    "numbers, --since/--until a range of the records' own times (formats that have one), "
    "--kind, --key and --grep. They never decode the records they skip: a record index (kept "
    "in ~/.cache/journalfs/indexes for big files) finds where records start, so -n 10 or "
    "--since on a journal of gigabytes answers at once after the first run. With several "
    "files the selection runs over all of them in order, and each JSON line starts with "
    "its \"source\" file.\n\n"
    "-f/--follow keeps printing records as they are appended (within 0.2 s), picks up new "
    "files of a directory or queue, and reports on stderr a file that is truncated, rotated "
    "(replaced) or removed, then goes on. Without a selection it starts with the last 10 "
    "records, as journalctl -f does.\n\n"
    "Times: --since/--until take ISO-8601 (2026-11-27, '2026-11-27 10:00', "
    "2026-11-27T10:00:00Z, 10:00), relative times (-10min, -1h30min, '2 days ago', +5min), "
    "now, today, yesterday, tomorrow and @EPOCH; times without a zone are local (UTC with "
    "--utc). The table shows each record's time as ISO-8601 (local, or UTC with --utc); the "
    "JSON keeps the raw numbers.\n\n"
    "On damage the valid records are printed first, then one line on stderr names the file, "
    "the byte offset and the reason, and the exit status is 3.")


def add_parser(sub) -> None:
    p = add_command(sub, "records", "decode journal files into their records, select, follow",
                    DESCRIPTION,
                    "journalfs records /data/queues/jobs.1700000000000",
                    "journalfs records -f /data/queues/jobs      # follow a whole queue live",
                    "journalfs records -n 10 --since -10min big.log",
                    "journalfs records --kind put --grep order-17 --payload text queues/jobs",
                    "journalfs records db.jrnl --json | jq -r .status")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="a journal file (detected by its magic bytes), a directory, or a queue "
                        "DIR/NAME")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per record and line (the contract's fields)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing records as they are appended (Ctrl-C stops)")
    p.add_argument("-n", "--lines", type=_count, metavar="N",
                   help="only the last N records (of the selection)")
    p.add_argument("-c", "--count", type=_count, metavar="N",
                   help="only the first N records (of the selection)")
    p.add_argument("--from", dest="from_seq", type=_count, metavar="SEQ",
                   help="records from record number SEQ on (0-based, per file)")
    p.add_argument("--to", dest="to_seq", type=_count, metavar="SEQ",
                   help="records up to record number SEQ, inclusive")
    p.add_argument("-S", "--since", metavar="TIME", help="records whose time is TIME or later")
    p.add_argument("-U", "--until", metavar="TIME", help="records whose time is TIME or earlier")
    p.add_argument("--kind", metavar="KIND[,KIND...]",
                   help="only records of these kinds (put, message, transaction, set, ...)")
    p.add_argument("--key", metavar="KEY",
                   help="only records of this key: the queue, the persistence id, the "
                        "metadata path")
    p.add_argument("-g", "--grep", metavar="REGEX",
                   help="only records whose JSON line (payload as text where it is UTF-8) "
                        "matches this Python regular expression")
    p.add_argument("--payload", choices=PAYLOAD_MODES,
                   help="how payloads are shown: auto (UTF-8 as text, else base64; the "
                        "table's default), text, hex, base64 (the JSON default: payload_b64)")
    p.add_argument("--utc", action="store_true",
                   help="times in UTC (the table's times; --since/--until without a zone)")
    p.set_defaults(run=runs("records"))


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return value
