"""Every command's command line: one module per command (or family of commands), each with
``add_parser(subparsers)``. They hold the argparse definitions only -- descriptions, options,
examples -- so that ``journalfs --help``, each command's --help and the man page are complete
while loading nothing heavy; each command's ``run`` imports its implementation in
:mod:`journalfs.commands` when the command runs (see :func:`journalfs.commands.parsing.runs`).
"""
from . import fsck, meta, mount, pipeline, records, state

COMMANDS = (records, state, fsck, meta, mount, pipeline)
#: How ``journalfs --help`` and the man page group the commands, in this order.
COMMAND_GROUPS = (
    ("Mounting", ("mount", "umount")),
    ("Journal files", ("records", "fsck", "pipeline")),
    ("Each system's state", ("queue", "events", "transactions", "changes")),
    ("Metadata stores", ("meta",)),
)
