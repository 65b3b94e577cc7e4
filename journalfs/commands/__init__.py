"""One module per subcommand; each has ``add_parser(subparsers)`` which sets ``run``.

The exit codes of every command are defined here, once (the contract's table).
"""
#: 0 ok, 1 anything else, 2 usage error, 3 damaged input. Defined before the command modules
#: are imported so that each of them can import these names from this package.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3
#: Stopped by SIGINT (Ctrl-C) or SIGTERM, as a shell reports a process killed by them.
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143

from . import fsck, meta, mount, pipeline, records, state  # noqa: E402

COMMANDS = (records, state, fsck, meta, mount, pipeline)
#: How ``journalfs --help`` and the man page group the commands, in this order.
COMMAND_GROUPS = (
    ("Mounting", ("mount", "umount")),
    ("Journal files", ("records", "fsck", "pipeline")),
    ("Each system's state", ("queue", "events", "transactions", "changes")),
    ("Metadata stores", ("meta",)),
)
