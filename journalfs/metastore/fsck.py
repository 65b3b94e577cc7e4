"""Checking (and repairing) a whole gvfs-format store: tree, journal, and how they match."""
from __future__ import annotations

import os

from ..formats.base import Finding
from ..formats.gvfs_journal import GvfsJournal
from ..formats.gvfs_tree import GvfsTree
from ..journals import mapped, write_backup
from .store import MetaStore, journal_path_for


class StoreCheck(list):
    """The findings (a list of :class:`Finding`), plus ``actions`` taken by a repair."""

    def __init__(self, findings=(), actions=()):
        super().__init__(findings)
        self.actions = list(actions)

    @property
    def findings(self) -> list[Finding]:
        return list(self)


def _tree_findings(tree_path: str) -> tuple[list[Finding], int | None]:
    with mapped(tree_path) as buf:
        findings = GvfsTree().validate(buf, tree_path)
        tag = int.from_bytes(bytes(buf[12:16]), "big") if len(buf) >= 32 else None
    return findings, tag


def check_store(tree_path: str, repair: bool = False) -> StoreCheck:
    """Tree readable; journal present, tied to the tree (tag), sized as its header says, every
    counted entry valid (CRC, sizes). ``repair`` backs up tree + journal beside them, then
    rotates, which keeps every valid entry and drops the invalid tail as gvfs does."""
    if not os.path.exists(tree_path):
        raise FileNotFoundError(f"no metadata store at {tree_path}")
    findings, tag = _tree_findings(tree_path)
    journal = journal_path_for(tree_path, tag) if tag is not None else None
    if journal and os.path.exists(journal):
        with mapped(journal) as buf:
            findings += GvfsJournal().validate(buf, journal, tree_tag=tag)
    elif journal:
        findings.append(Finding(12, f"journal {os.path.basename(journal)} is missing "
                                    "(entries written to it are lost)", "warning"))
    check = StoreCheck(findings)
    damaged = any(f.severity == "error" for f in findings)
    if repair and damaged:
        if any(f.severity == "error" for f in _tree_findings(tree_path)[0]):
            check.actions.append("tree itself is damaged: not repaired (restore from backup)")
            return check
        for path in (tree_path, journal):
            if path and os.path.exists(path):
                with mapped(path) as data:
                    backup = write_backup(path, data)  # fsynced, as fsck's backups are
                check.actions.append(f"backed up {os.path.basename(path)} to "
                                     f"{os.path.basename(backup)}")
        with MetaStore.open(tree_path, sync="always") as store:
            kept = store.status()["entries"]
            store.rotate()
        check.actions.append(f"rotated: {kept} valid journal entries merged into a new tree")
    return check


__all__ = ["StoreCheck", "check_store"]
