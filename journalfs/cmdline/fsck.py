"""The command line of ``journalfs fsck`` (its work: :mod:`journalfs.commands.fsck`)."""
from __future__ import annotations

from ..commands.parsing import add_command, runs


DESCRIPTION = (
    "Check journal files and gvfs metadata stores: PATH is one file, a store's tree file, or a "
    "directory (every journal file below it). Nothing is written unless --repair is given; "
    "then each format's own recovery rule rewrites a damaged file, only if every record that "
    "was valid is kept, after a backup FILE.journalfs-backup-TIME is written. Exit status 0 "
    "when everything is clean or repaired, 3 when damage remains.")


def add_parser(sub) -> None:
    p = add_command(sub, "fsck", "verify (and with --repair, fix) journal files and stores",
                    DESCRIPTION, "journalfs fsck /data/journals                 # report only",
                    "journalfs fsck /data/wallaby/events.log --repair")
    p.add_argument("path", help="a journal file, a gvfs store tree file, or a directory")
    p.add_argument("--repair", action="store_true",
                   help="apply each format's recovery rule (a backup is written first)")
    p.set_defaults(run=runs("fsck"))
