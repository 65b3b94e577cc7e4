"""The argparse pieces every command shares: one-line usage errors (exit 2), help text laid
out in paragraphs with verbatim example blocks, and a natural message for a missing command.

The same parser objects feed ``--help`` and the man page (:mod:`journalfs.manpage`), so the two
never drift.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

from . import EXIT_USAGE


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs are paragraphs separated by blank lines; a paragraph with an
    indented line (``Examples:`` followed by command lines) is kept exactly as written."""

    def __init__(self, prog, indent_increment=2, max_help_position=26, width=None):
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text, width, indent):
        blocks = []
        for para in textwrap.dedent(text).strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(textwrap.fill(" ".join(para.split()), width,
                                            initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(blocks)


class Parser(argparse.ArgumentParser):
    """Usage errors print the usage and one line, and exit 2 (the contract's usage code)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def add_commands(parser: argparse.ArgumentParser, dest: str,
                 listed: bool = True) -> argparse._SubParsersAction:
    """Subcommands of ``parser``; leaving the command out reads "missing command: choose one
    of ..." rather than argparse's ``the following arguments are required: <dest>``."""
    sub = parser.add_subparsers(dest=dest, metavar="COMMAND", parser_class=Parser,
                                prog=parser.prog)
    # List the commands as a section of their own (not one "COMMAND" entry with the choices
    # indented under it); the usage line still shows COMMAND.
    parser._positionals._group_actions.remove(sub)
    if listed:
        parser.add_argument_group("commands")._group_actions = sub._choices_actions
        parser._action_groups.insert(1, parser._action_groups.pop())  # before the options

    def missing_command(args) -> int:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: missing command: choose one of "
              f"{', '.join(sub.choices)} (details: {parser.prog} --help)", file=sys.stderr)
        return EXIT_USAGE
    parser.set_defaults(run=missing_command)
    return sub


def add_command(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
                *example_lines: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``: its one-line ``summary`` (the command list), what it
    does for the user (``description``) and examples (``example_lines``, see :func:`examples`)."""
    return sub.add_parser(name, help=summary, description=description,
                          epilog=examples(*example_lines))


def examples(*lines: str) -> str:
    """An ``Examples:`` epilog: each line is a command, optionally ``command  # comment``."""
    return "Examples:\n" + "\n".join(f"  {line}" for line in lines)


def runs(module: str, function: str = "run"):
    """A command's ``run`` (for ``set_defaults``) that imports ``journalfs.commands.<module>``
    only when the command runs: building the parser tree, ``--help`` and the man page load no
    command's implementation, and a command loads only its own (start-up time)."""
    def run(args):
        return getattr(importlib.import_module(f"journalfs.commands.{module}"), function)(args)
    run.__qualname__ = run.__name__ = f"{module}.{function}"
    return run
