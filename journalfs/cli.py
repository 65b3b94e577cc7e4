"""The `journalfs` command: argument parsing and dispatch only; each command lives in
:mod:`journalfs.commands`."""
from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS
from .formats import FormatError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2 with one line
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="journalfs", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # one clear line unless --debug
        if args.debug:
            raise
        code = EXIT_DAMAGED if isinstance(exc, FormatError) else EXIT_ERROR
        print(f"journalfs: {exc}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
