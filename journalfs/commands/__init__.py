"""The commands' work: one module per command (or family of commands), imported only when one
of its commands runs. Their command lines (argparse, --help, the man page) are in
:mod:`journalfs.cmdline`, which loads none of these modules.

The exit codes of every command are defined here, once (the contract's table).
"""
#: 0 ok, 1 anything else, 2 usage error, 3 damaged input.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3
#: Stopped by SIGINT (Ctrl-C) or SIGTERM, as a shell reports a process killed by them.
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
