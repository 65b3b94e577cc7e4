"""The ``journalfs`` command: the top-level parser, its help, and the one-line error policy.
Each command's command line lives in :mod:`journalfs.cmdline`, its work in
:mod:`journalfs.commands`, imported only when it runs: start-up (``records -n 10`` on a big
journal, ``--help``) loads no other command's modules."""
from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .cmdline import COMMAND_GROUPS, COMMANDS
from .commands import EXIT_DAMAGED, EXIT_ERROR
from .commands.parsing import Parser, add_commands, examples

DESCRIPTION = """\
journalfs mirrors a directory through FUSE and adds two things to it: key/value metadata on
every file and directory, as user.metadata.* extended attributes kept in a store that GNOME's
gvfs reads and writes too; and a read-only view of every journal file inside
(MOUNTPOINT/.journalfs/records/), one file per record.

Ten journal formats are understood, found by their content: gvfs metadata tree and journal,
Kestrel queue writer and reader files, akka-persistence file journals, Wallaby LOG and IDX,
JRNL transaction journals and SQLite write-ahead logs. The same decoding works without a mount
(records, fsck) and on Apache Spark (pipeline).

Each system's state is one command or one path away: a queue's pending items per reader
(queue), a persistence id's events in order (events), incomplete transactions
(transactions), what each metadata change did (changes); on a mount under
MOUNTPOINT/.journalfs/queues/, persistence/, transactions/ and changes/. journalfs records -f
and tail -f on a view's records.jsonl follow journals as they grow."""

EPILOG = examples(
    "journalfs mount ~/queues /mnt/q          # returns once the mount is usable",
    "setfattr -n user.metadata.comment -v checked /mnt/q/jobs.1700000000000",
    "ls /mnt/q/.journalfs/records/jobs.1700000000000/",
    "journalfs umount /mnt/q",
    "journalfs records db.jrnl --json         # one JSON object per record",
    "journalfs records -f ~/queues/jobs       # follow a live queue",
    "journalfs queue ~/queues/jobs --pending  # what each reader has still to read",
    "journalfs meta dump ~/.local/share/gvfs-metadata/home",
) + """

Exit status: 0 success, 1 error, 2 usage error, 3 damaged input. Errors are one line on
stderr; --debug shows the traceback. Each command has its own --help; the manual page is
journalfs(1) (journalfs --man prints it)."""

#: What journalfs.commands.pipeline does for the user, with examples
#: (their modules' docstrings are written for developers).
OTHER_COMMAND_TEXTS = {
    "pipeline": (
        "Read every journal file under INPUT with Apache Spark and write Parquet tables "
        "under OUTPUT: records, metadata, queues, persistence, transactions (and _damage). "
        "Spark runs locally (local[*]) unless --master names a cluster.",
        examples("journalfs pipeline /data/journals /data/tables",
                 "journalfs pipeline /data/journals /data/tables --master spark://127.0.0.1:7077")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="journalfs", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"journalfs {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (for bug reports)")
    parser.add_argument("--man", action="store_true",
                        help="print the manual page (roff) and exit")
    sub = add_commands(parser, "command", listed=False)  # listed by group instead
    for module in COMMANDS:
        module.add_parser(sub)
    for name, (description, epilog) in OTHER_COMMAND_TEXTS.items():
        if name in sub.choices:
            sub.choices[name].description = description
            sub.choices[name].epilog = sub.choices[name].epilog or epilog
    _group_commands(parser, sub)
    return parser


def _group_commands(parser: argparse.ArgumentParser, sub) -> None:
    """List the commands in COMMAND_GROUPS' sections, before the options."""
    by_name = {choice.dest: choice for choice in sub._choices_actions}
    grouped: set[str] = set()
    groups = []
    for title, names in COMMAND_GROUPS:
        group = argparse._ArgumentGroup(parser, title=title)
        group._group_actions.extend(by_name[n] for n in names if n in by_name)
        grouped.update(names)
        groups.append(group)
    rest = [a for n, a in by_name.items() if n not in grouped]
    if rest:  # a command added without a group still shows
        group = argparse._ArgumentGroup(parser, title="Other commands")
        group._group_actions.extend(rest)
        groups.append(group)
    positionals, optionals, *others = parser._action_groups
    parser._action_groups = [positionals, *groups, optionals, *others]


#: Options whose value may start with "-" (a relative time: ``--since -10min``, as journalctl
#: takes it); argparse would read such a value as an option.
DASH_VALUE_OPTIONS = ("--since", "--until", "-S", "-U", "--from-time", "--to-time")


def _join_dash_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return out + argv[i:]
        if arg in DASH_VALUE_OPTIONS and i + 1 < len(argv) and argv[i + 1][:1] == "-" \
                and argv[i + 1][1:2].isdigit():
            out.append(f"{arg}={argv[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else list(argv)))
    if args.man:  # needs no command
        from .manpage import render  # late: only --man renders the page
        sys.stdout.write(render(parser))
        return 0
    debug = args.debug or getattr(args, "trace", False)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # one clear line unless --debug
        if debug:
            raise
        # Damaged input is a FormatError; without journalfs.formats loaded there can be none
        # (importing it here only to compare would cost every other command's error its time).
        formats = sys.modules.get("journalfs.formats")
        damaged = formats is not None and isinstance(exc, formats.FormatError)
        code = EXIT_DAMAGED if damaged else EXIT_ERROR
        print(f"journalfs: {error_line(exc)}", file=sys.stderr)
        return code


def error_line(exc: BaseException) -> str:
    """The one line shown for an error: an OSError as "FILE: reason" (no "[Errno N]")."""
    if isinstance(exc, OSError) and exc.strerror:
        if exc.filename is not None:
            return f"{os.fsdecode(exc.filename)}: {exc.strerror}"
        return exc.strerror
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
