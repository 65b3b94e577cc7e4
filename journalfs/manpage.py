"""journalfs(1), written from the very argparse parsers that make ``--help``, so the manual
page and the help never drift. ``journalfs --man`` prints it; ``mount_scripts/install.sh``
installs it.
"""
from __future__ import annotations

import argparse
import textwrap

from . import __version__
from .cmdline import COMMAND_GROUPS

EXIT_STATUS = (("0", "success"), ("1", "an error (one line on stderr)"), ("2", "a usage error"),
               ("3", "damaged input: the valid part was used, the damage is named on stderr"))
FILES = (
    ("~/.local/share/journalfs/stores/", "the metadata store of each SOURCE mounted without "
     "--store or --gvfs"),
    ("~/.local/share/gvfs-metadata/", "GNOME's metadata store (--gvfs)"),
    ("STORE/journalfs.log", "the mount's log when there is no system log (/dev/log) and no "
     "--log-file"),
    ("MOUNTPOINT/.journalfs/", "records/ (journal views), metadata/journal/ (the live metadata "
     "journal), status.json; settings as user.journalfs.* xattrs"),
    ("/sbin/mount.fuse.journalfs", "the mount(8) helper: mount -t fuse.journalfs and /etc/fstab"),
)
SEE_ALSO = r"\fBgetfattr\fR(1), \fBsetfattr\fR(1), \fBgio\fR(1), \fBmount\fR(8), " \
           r"\fBfusermount3\fR(1), \fBfuse\fR(8), \fBbindfs\fR(1)"


def escape(text: str) -> str:
    """Roff-safe text: backslashes, hyphens of options, and leading control characters."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in text.split("\n"))


def paragraphs(text: str | None) -> list[str]:
    """The same paragraph rule as the help formatter: an indented line makes a block verbatim."""
    if not text:
        return []
    out = []
    for para in textwrap.dedent(text).strip("\n").split("\n\n"):
        lines = para.splitlines()
        if any(line.startswith(" ") for line in lines):
            out.append(".nf\n" + escape(para) + "\n.fi")
        else:
            out.append(escape(" ".join(para.split())))
    return out


def _usage(parser: argparse.ArgumentParser) -> str:
    text = parser.format_usage().strip()
    text = text.removeprefix("usage: ")
    return " ".join(text.split())


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    out = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        invocation = formatter._format_action_invocation(action)
        help_text = formatter._expand_help(action) if action.help else ""
        out.append(f".TP\n\\fB{escape(invocation)}\\fR\n{escape(' '.join(help_text.split()))}")
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command(parser: argparse.ArgumentParser) -> list[str]:
    """One command's section: usage, description, options, examples; then its subcommands."""
    out = [f'.SS "{escape(parser.prog)}"', ".nf", escape(_usage(parser)), ".fi"]
    for para in paragraphs(parser.description):
        out += [".PP", para]
    options = _options(parser)
    if options:
        out += [".PP", "Arguments and options:", ".RS", *options, ".RE"]
    for para in paragraphs(parser.epilog):
        out += [".PP", para]
    for child in _subparsers(parser).values():
        out += _command(child)
    return out


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page for the top-level ``journalfs`` parser."""
    commands = _subparsers(parser)
    summary = "journal files as browsable records, gvfs\\-compatible metadata as xattrs"
    out = [f'.TH JOURNALFS 1 "" "journalfs {__version__}" "User Commands"',
           ".SH NAME", f"journalfs \\- {summary}",
           ".SH SYNOPSIS", ".nf", escape(_usage(parser))]
    out += [escape(f"journalfs {name} ...") for name in commands]
    out += [".fi", ".SH DESCRIPTION"]
    for para in paragraphs(parser.description):
        out += [para, ".PP"]
    out += [".SH OPTIONS", *_options(parser), ".SH COMMANDS"]
    listed = set()
    for title, names in COMMAND_GROUPS:
        out += [f".SS {escape(title)}"]
        for name in names:
            if name in commands:
                listed.add(name)
                out += _command(commands[name])
    for name, child in commands.items():
        if name not in listed:
            out += _command(child)
    out += [".SH EXAMPLES"]
    for para in paragraphs(parser.epilog):
        out += [para, ".PP"]
    out += [".SH EXIT STATUS"]
    for code, meaning in EXIT_STATUS:
        out += [".TP", f"\\fB{code}\\fR", escape(meaning)]
    out += [".SH FILES"]
    for path, meaning in FILES:
        out += [".TP", f"\\fI{escape(path)}\\fR", escape(meaning)]
    out += [".SH SEE ALSO", SEE_ALSO, ""]
    return "\n".join(out)
