"""``MNT/.journalfs/``: the read-only virtual tree (CONTRACT "The mount").

::

    .journalfs/records/<p>/            for every journal file SOURCE/<p> (found by content)
        records.jsonl                  exactly `journalfs records SOURCE/<p> --json`
        <seq:08d>.<kind>               payload bytes, else the record's JSON line
    .journalfs/metadata/journal/       the live metadata journal, the same way
    .journalfs/status.json             store paths, journal fill, counters, mount options
    .journalfs/queues/, persistence/, transactions/   each system's state (fs/stateviews.py)

Permissions follow SOURCE: a directory under ``records/`` carries its SOURCE directory's owner,
group and mode (without write bits); a journal's view directory and its files carry the
journal's owner, group and read bits (x added on the directory where r is set). The mount uses
default_permissions, so the kernel refuses to others what SOURCE refuses them. The store's own
journal view and status.json belong to the mount's owner, 0700/0600.

Journals are opened only through :class:`~journalfs.fs.sourcefiles.SourceTree` (component by
component from a SOURCE directory fd, never following a symlink, never opening anything but a
regular file for reading). Indexing a journal runs in a worker thread of its own; requests for
records it has already passed are answered from the partial index, and no other request waits
for it. Indexes are kept on disk in the store directory (:mod:`journalfs.fs.indexfiles`), so a
remount finds any record of a big journal at once. Everything remembered between requests lives
in one :class:`~journalfs.fs.catalog.Catalog`.

The tree is served by one class, :class:`Views`, made of one class per job, each in its module:

==============================  ==========================================================
``viewnodes``                   kinds of view inodes, their numbers, handles, JournalInfo
``viewbase.ViewsBase``          inode table; what a SOURCE file is; who sees what; threads
``viewindex.ViewIndexes``       index jobs, decoded record batches, records.jsonl layouts
``viewattrs.ViewAttrs``         attributes and lookups
``viewlisting.ViewListing``     opendir/readdir/releasedir (a journal's records three ways)
``viewfiles.ViewFiles``         open/read/release (records.jsonl: ``jsonlview``)
``viewxattrs.ViewXattrs``       record fields, damage, ACLs, the mount's settings
``Views`` (here)                all of them, and what status.json says
==============================  ==========================================================
"""
from __future__ import annotations

import base64
import json
import os

import trio

from .status import StatusFile
from .viewfiles import ViewFiles
from .viewlisting import ViewListing
from .viewnodes import VIEWS_NAME, ViewContext
from .viewxattrs import ViewXattrs

__all__ = ["VIEWS_NAME", "ViewContext", "Views"]


def _status_json(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()


def _rel_text(rel: bytes) -> dict:
    """A SOURCE-relative path for JSON: ``path``, or ``path_b64`` when not UTF-8."""
    try:
        return {"path": rel.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path_b64": base64.b64encode(rel).decode("ascii")}


class Views(ViewListing, ViewFiles, ViewXattrs):
    """Inodes, attributes, listings and reads of ``MNT/.journalfs``."""

    def __init__(self, ctx, options: dict):
        """``ctx``: a :class:`ViewContext`; a JournalFS is accepted too (its collaborators are
        taken from it once, :meth:`ViewContext.of_mount`)."""
        super().__init__(ctx, options)
        self.status_file = StatusFile(self._status_bytes)

    def status_fields(self) -> dict:
        """What the views add to status.json (INTERFACES point 6)."""
        damaged = [{**_rel_text(rel), "offset": off, "reason": reason}
                   for rel, (off, reason) in sorted(self.damaged.items())]
        return {
            "damaged_journals": damaged,
            "views": {"indexing": [_rel_text(r) for r in sorted(self._jobs)],
                      "index_dir": (os.path.join(self.ctx.store_dir, "indexes")
                                    if self.index_dir.usable and self.ctx.store_dir else None),
                      "catalog_bytes": self.catalog.used, "catalog_entries": len(self.catalog),
                      "catalog_owner_limit": self.catalog.owner_budget,
                      "journal_names": len(self._journal_ids),
                      "index_files": self.index_dir.status(),
                      "index_cpu": self.index_cpu.status(),
                      "view_inodes": len(self.by_ino),
                      **self.counters},
        }

    async def _status_bytes(self) -> bytes:
        # it may wait for the store's lock or read its files: a worker thread
        status = await trio.to_thread.run_sync(self.ctx.meta.status)
        settings = self.ctx.settings
        doc = {
            "source": self.options.get("source") or self.ctx.source_name,
            "mountpoint": self.options.get("mountpoint"),
            "store": {"tree": self.ctx.tree_path, "prefix": self.ctx.prefix,
                      "journal": status.get("journal_path")},
            # the figures people look for first, then everything the service reports
            "journal_fill": status.get("fill"),
            "entries": status.get("entries"),
            "rotations": status.get("rotations"),
            "last_fsync": status.get("last_fsync"),
            "service": status,
            "watch": self.ctx.watch.status() if self.ctx.watch is not None else None,
            # the mount's configuration, and the runtime settings as they are now
            "options": {**self.options, **(settings.options() if settings is not None else {})},
            # the last runtime setting refused, and why (fs/control.py)
            "last_error": self.control.last_error if self.control is not None else None,
            **self.status_fields(),
        }
        # rendered in a worker thread: up to DAMAGE_LIST_MAX long names
        return await trio.to_thread.run_sync(_status_json, doc)
