"""`journalfs fsck PATH [--repair]`: verify journal files and gvfs metadata stores.

PATH is one file, a gvfs store's tree file, or a directory (every journal file below it,
recursively). Each file is decoded to its end and checked by its codec's ``validate`` with its
related files as context (a Wallaby log and its index, akka meta and data). Files are only
written with ``--repair``: the codec's own recovery rule makes the new bytes, which are
accepted only if every record that was valid before is still there; then a backup
``<file>.journalfs-backup-<UTC time>`` is written and fsynced, and the file is replaced
atomically. Exit 0 when everything is clean (or fully repaired), 3 when damage remains.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..formats import CODECS, Codec, Finding, FormatError
from ..formats.base import Record, record_to_json
from ..journals import (directory_journals, mapped, related_files, replace_atomically,
                        scan, sniff_file, validate, write_backup)
from ..metastore.fsck import check_store as metastore_check
from .progress import Progress

from . import EXIT_DAMAGED, EXIT_ERROR, EXIT_OK  # defined once, for every command
#: Fields a recovery rule may legitimately rewrite (links, completion state, derived offsets);
#: the no-loss check compares records without them.
MUTABLE_FIELDS = frozenset({"format", "seq", "offset", "prev", "next", "self", "complete",
                            "status", "first", "last", "highest_seq", "log_offset"})


@dataclass
class Report:
    """What fsck found in one file (or store) and what it did about it."""

    path: str
    format: str
    records: int | None = None  # None for a store (its check counts no records)
    findings: list[Finding] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    failure: str | None = None  # fsck itself could not check the file (exit 1)

    @property
    def damaged(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


def run(args) -> int:
    path = args.path
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        targets = list(_journal_files(path))
        if not targets:
            print(f"{path}: no journal files found")
            return EXIT_OK
    else:
        codec = sniff_file(path)
        if codec is None:
            print(f"journalfs: {path}: not a supported journal (unknown magic bytes)",
                  file=sys.stderr)
            return EXIT_DAMAGED
        targets = [(path, codec)]
    total = sum(_size(t[0]) for t in targets)
    with Progress(total, "fsck") as progress:
        reports = []
        for target in targets:
            progress.base = sum(_size(r.path) for r in reports)
            reports.append(check_target(*target[:2], args.repair, progress, *target[2:]))
    return _exit_code(reports)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _exit_code(reports: list[Report]) -> int:
    if any(r.damaged for r in reports):
        return EXIT_DAMAGED
    if any(r.failure for r in reports):
        return EXIT_ERROR
    return EXIT_OK


def _journal_files(root: str) -> Iterator[tuple[str, Codec, list[tuple[str, str]]]]:
    """Every journal file below ``root`` in name order with the journals of its directory,
    except our own backups and journals that belong to a store tree beside them (checked
    with their store)."""
    for directory, dirs, _files in os.walk(root):
        dirs.sort()
        siblings = directory_journals(directory)
        format_of = dict(siblings)
        for name, fmt in siblings:
            full = os.path.join(directory, name)
            if os.path.islink(full):
                continue
            codec = CODECS[fmt]
            partners = codec.partners(name, [s for s in siblings if s[0] != name])
            if any(CODECS[format_of[other]].store_label for other in partners.values()):
                continue
            yield full, codec, siblings


def check_target(path: str, codec: Codec, repair: bool, progress: Progress | None = None,
                 siblings: list[tuple[str, str]] | None = None) -> Report:
    try:
        if codec.store_label:
            report = check_store(path, repair, codec.store_label)
        else:
            report = check_file(path, codec, repair, progress, siblings)
    except (OSError, FormatError) as exc:  # FormatError here: from context files or validate
        report = Report(path, codec.name, failure=str(exc))
    print_report(report)
    return report


# -- one journal file ---------------------------------------------------------------------------

def check_file(path: str, codec: Codec, repair: bool, progress: Progress | None = None,
               siblings: list[tuple[str, str]] | None = None) -> Report:
    report = Report(path, codec.name)
    with _context(path, codec, siblings) as context, mapped(path) as buf:
        report.records, report.findings = inspect(buf, path, codec, context, progress)
        if not repair:
            return report
        fix = codec.repair(buf, path, **context)  # None when nothing needs repair
        original = bytes(buf)
    if fix is None or fix.data == original:
        if report.damaged:
            report.actions.append("no automatic repair exists for this damage")
        return report
    refusal = lost_record(original, fix.data, path, codec)
    if refusal:
        report.actions.append(f"repair refused: {refusal}")
        return report
    apply_repair(path, original, fix.data, codec, report, siblings)
    report.actions[:0] = fix.actions or ["repaired"]
    return report


def apply_repair(path: str, original: bytes, repaired: bytes, codec: Codec, report: Report,
                 siblings: list[tuple[str, str]] | None = None) -> None:
    """Backup first, then the atomic replacement; then check the file as it is on disk again
    (putting the original back should it lose a record after all)."""
    backup = write_backup(path, original)
    replace_atomically(path, repaired)
    report.actions.append(f"backup written to {backup}")
    with _context(path, codec, siblings) as context, mapped(path) as buf:
        report.records, report.findings = inspect(buf, path, codec, context)
        lost = lost_record(original, buf, path, codec)
    if lost:
        replace_atomically(path, original)
        report.actions.append(f"repair undone, original restored: {lost}")
        report.findings.append(Finding(0, f"repair undone: {lost}"))


def inspect(buf, path: str, codec: Codec, context: dict[str, Any],
            progress: Progress | None = None) -> tuple[int, list[Finding]]:
    """Decode every record (counting them) and run the codec's validation, holding only a
    bounded part of the file in memory whatever its size."""
    findings: list[Finding] = []
    try:
        count = count_records(buf, path, codec, progress)
    except _Damage as damage:
        count = damage.count
        findings.append(Finding(damage.error.offset, damage.error.reason))
    if progress is not None:
        progress.update(progress.base + len(buf), description=f"validating {os.path.basename(path)}")
    try:
        findings.extend(validate(codec, buf, path, context))
    except FormatError as exc:
        findings.append(Finding(exc.offset, exc.reason))
    return count, _unique(findings)


class _Damage(Exception):
    def __init__(self, count: int, error: FormatError):
        super().__init__(count, error)
        self.count, self.error = count, error


#: Records per counting batch (vectorised codecs).
COUNT_BATCH = 1 << 14


def count_records(buf, path: str, codec: Codec, progress: Progress | None = None) -> int:
    """How many records :meth:`Codec.read` yields for ``buf``; raises :class:`_Damage` (with
    the count of the valid prefix) at damage. Counted in batches of record starts
    (:meth:`Codec.record_offsets`: found without decoding where the codec can)."""
    base = progress.base if progress is not None else 0
    name = os.path.basename(path)

    def moved(offset: int, count: int) -> None:
        progress.update(base + offset, count, f"reading {name}")
    count = 0
    for cols in scan(codec, buf, path, rows=COUNT_BATCH, form="offsets",
                     progress=moved if progress is not None else None):
        count += cols.rows
        if cols.error is not None:
            raise _Damage(count, cols.error)
    return count


def _unique(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in sorted(findings, key=lambda f: f.offset):
        key = (f.offset, f.reason, f.severity)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


@contextlib.contextmanager
def _context(path: str, codec: Codec, siblings: list[tuple[str, str]] | None = None):
    """The related files of ``path`` mapped read-only, as ``validate``/``repair`` keywords."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(mapped(other))
               for name, other in related_files(path, codec, siblings).items()}


def lost_record(before, after: bytes, path: str, codec: Codec) -> str | None:
    """Why ``after`` would lose a record that ``before`` holds as valid, or None.

    The valid records of ``before`` must reappear in ``after`` in the same order (``after`` may
    hold more); records the format's recovery rule discards by definition (transactions to roll
    back) do not count, and fields that recovery rewrites (links, completion) are ignored.
    Derived files (indexes) are rebuilt from their source and are exempt.
    """
    if codec.derived:
        return None
    kept = (r for r in _valid_prefix(codec, before, path) if r.get("status") != "rollback")
    repaired = _valid_prefix(codec, after, path)
    for old, new in itertools.zip_longest(kept, repaired):
        if old is None:
            return None
        if new is None:
            return f"record {old['seq']} (byte {old['offset']}) would be lost"
        if _identity(old) != _identity(new):
            return f"record {old['seq']} (byte {old['offset']}) would change"
    return None


def _valid_prefix(codec: Codec, buf, path: str) -> Iterator[Record]:
    records = codec.read(buf, path)
    try:
        yield from records
    except FormatError:
        return
    finally:
        records.close()


def _identity(rec: Record) -> str:
    return json.dumps({k: v for k, v in record_to_json(rec).items() if k not in MUTABLE_FIELDS},
                      sort_keys=True)


# -- gvfs metadata stores -----------------------------------------------------------------------

def check_store(tree_path: str, repair: bool, label: str) -> Report:
    """A store (tree + journal) is checked as a whole by the metastore's own fsck."""
    result = metastore_check(tree_path, repair)
    return Report(tree_path, label, findings=list(result.findings), actions=list(result.actions))


# -- output -------------------------------------------------------------------------------------

def print_report(report: Report) -> None:
    if report.failure:
        print(f"{report.path}: {report.format}: could not check: {report.failure}")
        return
    errors = sum(f.severity == "error" for f in report.findings)
    state = "DAMAGED" if errors else "ok"
    counts = ([] if report.records is None else [f"{report.records} records"]) + (
        [f"{errors} errors"] if errors else [])
    print(f"{report.path}: {report.format}: {state}" + (f" ({', '.join(counts)})" if counts else ""))
    for f in report.findings:
        print(f"  byte {f.offset}: {f.severity}: {f.reason}")
    for action in report.actions:
        print(f"  {action}")
    sys.stdout.flush()
