"""Checking (and repairing) a whole gvfs-format store: tree, journal, and how they match.

Beyond what a reader checks (the chain of entries the header counts, each CRC'd), the journal
is scanned for every valid entry wherever it lies: two processes appending to one journal,
each at its own idea of its end, leave entries that overlap, entries past the damage they
cause, and entries the header's count no longer covers. gvfs stops at the first of them
("found wrong sized entry, possible journal corruption") and drops the rest at its next
rotation; ``--repair`` keeps every valid entry, in file order.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..formats.base import Finding, FormatError
from ..formats.gvfs_journal import FIRST_ENTRY, MIN_ENTRY, GvfsJournal, decode_entry, parse_header
from ..formats.gvfs_tree import GvfsTree
from ..journals import mapped, validate, write_backup
from .store import MetaStore, journal_path_for

_U32 = struct.Struct(">I")
#: Findings listed one by one before the rest are summed up.
LISTED = 20
_GVFS_WARNING = "gvfs stops reading here ('found wrong sized entry, possible journal corruption')"


class StoreCheck(list):
    """The findings (a list of :class:`Finding`), plus ``actions`` taken by a repair."""

    def __init__(self, findings=(), actions=()):
        super().__init__(findings)
        self.actions = list(actions)

    @property
    def findings(self) -> list[Finding]:
        return list(self)


@dataclass
class JournalScan:
    """Every valid entry of a journal: ``chain`` is what readers see (from the first entry,
    as many as the header counts, up to the first invalid one); ``strays`` are the valid
    entries found elsewhere; ``overlaps`` pairs of offsets whose entries share bytes."""

    chain: list[tuple[int, dict, int]] = field(default_factory=list)  # (offset, record, size)
    chain_error: FormatError | None = None
    strays: list[tuple[int, dict, int]] = field(default_factory=list)
    overlaps: list[tuple[int, int]] = field(default_factory=list)
    num_entries: int = 0

    def uncounted_tail(self) -> set[int]:
        """Offsets of valid entries that directly follow an intact chain, each right after the
        previous: a writer wrote them and stopped before bumping the count (a crash), or
        another writer's count replaced ours. Nothing overlaps them."""
        if self.chain_error is not None or self.overlaps:
            return set()
        at = self.chain[-1][0] + self.chain[-1][2] if self.chain else FIRST_ENTRY
        by_offset = {o: s for o, _, s in self.strays}
        tail = set()
        while at in by_offset:
            tail.add(at)
            at += by_offset[at]
        return tail if len(tail) == len(self.strays) else set()

    def kept_in_order(self) -> list[tuple[int, dict, int]]:
        return sorted(self.chain + self.strays, key=lambda e: e[0])


def _claimed_size(buf, offset: int, end: int) -> int | None:
    """The size the entry at ``offset`` claims, if it is plausible at all."""
    if offset + 4 > end:
        return None
    size = _U32.unpack_from(buf, offset)[0]
    return size if MIN_ENTRY <= size <= end - offset and size % 4 == 0 else None


def _candidates(buf, end: int) -> list[int]:
    """4-aligned offsets whose leading and trailing sizes agree on a plausible entry (one
    vectorised pass: zero-filled space and most bytes inside entries drop out here)."""
    words = np.frombuffer(buf, dtype=">u4", count=end // 4).astype(np.int64)
    at = np.arange(len(words), dtype=np.int64) * 4
    plausible = (words >= MIN_ENTRY) & (words % 4 == 0) & (at + words <= end) & (at >= FIRST_ENTRY)
    idx = np.nonzero(plausible)[0]
    trailing = words[(at[idx] + words[idx]) // 4 - 1]
    return [int(o) for o in at[idx][trailing == words[idx]]]


def scan_journal(buf, source: str) -> JournalScan:
    """Walk the chain like a reader, then try every 4-aligned offset for a valid entry (cheap
    size checks first, the CRC only for candidates): bounded by the file's size."""
    header = parse_header(buf, source, exact_size=False)
    end = min(header.file_size, len(buf))
    scan = JournalScan(num_entries=header.num_entries)
    offset = FIRST_ENTRY
    for _ in range(header.num_entries):
        try:
            rec, size = decode_entry(buf, offset, source, end)
        except FormatError as exc:
            scan.chain_error = exc.detached()
            break
        scan.chain.append((offset, rec, size))
        offset += size
    in_chain = {e[0] for e in scan.chain}
    found = list(scan.chain)
    for offset in _candidates(buf, end):
        if offset in in_chain:
            continue
        try:
            rec, size = decode_entry(buf, offset, source, end)
        except FormatError:
            continue
        scan.strays.append((offset, rec, size))
        found.append((offset, rec, size))
    # spans that share bytes: valid entries with each other, or with the damaged chain entry
    spans = sorted((o, o + s) for o, _, s in found)
    if scan.chain_error is not None:
        bad = scan.chain[-1][0] + scan.chain[-1][2] if scan.chain else FIRST_ENTRY
        claimed = _claimed_size(buf, bad, end)
        if claimed:
            spans = sorted(spans + [(bad, bad + claimed)])
    for (a, a_end), (b, _b_end) in zip(spans, spans[1:]):
        if b < a_end:
            scan.overlaps.append((a, b))
    return scan


def _describe(rec: dict) -> str:
    target = f"{rec['source']} -> {rec['path']}" if rec["kind"] == "copy" else rec["path"]
    key = f" {rec['key']}" if "key" in rec else ""
    return f"{rec['kind']} {target}{key}"


def journal_findings(scan: JournalScan) -> list[Finding]:
    findings = []
    for a, b in scan.overlaps[:LISTED]:
        findings.append(Finding(b, f"entry at byte {b} overlaps the entry at byte {a}: two writers "
                                   f"appended to this journal; {_GVFS_WARNING}"))
    if len(scan.overlaps) > LISTED:
        findings.append(Finding(scan.overlaps[LISTED][1], f"{len(scan.overlaps) - LISTED} more overlapping entries"))
    uncounted = scan.uncounted_tail()
    for offset, rec, _ in scan.strays[:LISTED]:
        if offset in uncounted:  # what a writer stopped between entry and count leaves
            findings.append(Finding(offset, f"entry ({_describe(rec)}) written after the {len(scan.chain)} "
                                            "counted ones but never counted: readers ignore it", "warning"))
            continue
        findings.append(Finding(offset, f"valid entry ({_describe(rec)}) outside the {len(scan.chain)} "
                                        "entries readers see: gvfs never reads it and drops it at its "
                                        "next rotation (fsck --repair keeps it)"))
    if len(scan.strays) > LISTED:
        findings.append(Finding(scan.strays[LISTED][0], f"{len(scan.strays) - LISTED} more valid entries "
                                                        "outside the readable chain"))
    return findings


def _tree_findings(tree_path: str) -> tuple[list[Finding], int | None]:
    with mapped(tree_path) as buf:
        # the pages read are dropped in step: a tree of any size is checked in bounded memory
        findings = validate(GvfsTree(), buf, tree_path, {})
        tag = int.from_bytes(bytes(buf[12:16]), "big") if len(buf) >= 32 else None
    return findings, tag


def check_store(tree_path: str, repair: bool = False) -> StoreCheck:
    """Tree readable; journal present, tied to the tree (tag), sized as its header says, every
    counted entry valid (CRC, sizes), no valid entry outside that chain, none overlapping.
    ``repair`` backs up tree + journal beside them, rotates (what readers see goes into a new
    tree), then writes every valid entry readers missed, in file order, and rotates again."""
    if not os.path.exists(tree_path):
        raise FileNotFoundError(f"no metadata store at {tree_path}")
    findings, tag = _tree_findings(tree_path)
    journal = journal_path_for(tree_path, tag) if tag is not None else None
    scan = None
    if journal and os.path.exists(journal):
        with mapped(journal) as buf:
            findings += validate(GvfsJournal(), buf, journal, {"tree_tag": tag})
            try:
                if parse_header(buf, journal, exact_size=False).tag == tag:
                    scan = scan_journal(buf, journal)
            except FormatError:
                pass  # the header itself is bad: already reported
        if scan is not None:
            findings += journal_findings(scan)
    elif journal:
        findings.append(Finding(12, f"journal {os.path.basename(journal)} is missing "
                                    "(entries written to it are lost)", "warning"))
    check = StoreCheck(findings)
    damaged = any(f.severity == "error" for f in findings)
    if repair and damaged:
        _repair(tree_path, journal, scan, check)
    return check


def _repair(tree_path: str, journal: str | None, scan: JournalScan | None, check: StoreCheck) -> None:
    if any(f.severity == "error" for f in _tree_findings(tree_path)[0]):
        check.actions.append("tree itself is damaged: not repaired (restore from backup)")
        return
    # trio and jeepney (D-Bus): only a repair asks who else writes the store
    from .gvfs_service import StoreRefused, gvfsd_metadata_processes
    writers = gvfsd_metadata_processes(os.path.dirname(os.path.abspath(tree_path)))
    if writers:  # it would go on appending to the journal we replace
        raise StoreRefused(f"gvfsd-metadata (pid {writers[0]}) writes {tree_path}: stop it before "
                           "repairing the store")
    for path in (tree_path, journal):
        if path and os.path.exists(path):
            with mapped(path) as data:
                backup = write_backup(path, data)  # fsynced, as fsck's backups are
            check.actions.append(f"backed up {os.path.basename(path)} to {os.path.basename(backup)}")
    with MetaStore.open(tree_path, sync="always") as store:
        seen = store.status().get("entries", 0)  # the chain prefix the store itself read
        store.rotate()
        check.actions.append(f"rotated: {seen} valid journal entries merged into a new tree")
        read = {offset for offset, _, _ in (scan.chain[:seen] if scan else ())}
        missed = [] if scan is None else [e for e in scan.kept_in_order() if e[0] not in read]
        for _, rec, _ in missed:
            _replay(store, rec)
        if missed:
            store.rotate()
            check.actions.append(f"kept {len(missed)} more valid entries readers could not reach "
                                 "(in file order), rotated again")


def _replay(store: MetaStore, rec: dict) -> None:
    """One journal record, written again through the store's own API."""
    kind = rec["kind"]
    if kind in ("set", "setv"):
        store.set(rec["path"], rec["key"], rec["value"])
    elif kind == "unset":
        store.unset(rec["path"], rec["key"])
    elif kind == "remove":
        store.remove(rec["path"])
    elif kind == "copy":
        store.copy(rec["source"], rec["path"])


__all__ = ["JournalScan", "StoreCheck", "check_store", "journal_findings", "scan_journal"]
