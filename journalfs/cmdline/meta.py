"""The command line of ``journalfs meta`` and its subcommands (their work:
:mod:`journalfs.commands.meta`).
"""
from __future__ import annotations

from ..commands.parsing import add_commands, examples, runs
from ..options import SYNC_MODES


DESCRIPTION = """\
Read and write a gvfs-format metadata store without a mount: the tree file TREE (for example
~/.local/share/gvfs-metadata/home, or a journalfs store's home/root file) and its journal.
Paths are the store's own paths ("/docs/a.txt"); values are strings or lists of strings.

Reading never locks the store. Writing takes the store's lock, so it is refused while a
journalfs mount or gvfsd-metadata holds it: then change metadata through the mount with
setfattr instead (compact alone works through the mount)."""

TREE_HELP = "the store's tree file (e.g. ~/.local/share/gvfs-metadata/home)"


def add_parser(sub) -> None:
    p = sub.add_parser("meta", help="read and write a gvfs metadata store without a mount",
                       description=DESCRIPTION,
                       epilog=examples("journalfs meta dump ~/.local/share/gvfs-metadata/home --json",
                                       "journalfs meta set --create /srv/meta/home /docs/a.txt "
                                       "comment 'checked'",
                                       "journalfs meta get /srv/meta/home /docs/a.txt"))
    msub = add_commands(p, "meta_command")

    def cmd(name, fn, help, description, example, *, writes=False):
        c = msub.add_parser(name, help=help, description=description,
                            epilog=examples(*example))
        c.add_argument("tree", metavar="TREE", help=TREE_HELP)
        if writes:
            c.add_argument("--sync", choices=SYNC_MODES, default="always",
                           help="durability before the command returns: always = fdatasync "
                                "(default), batch/none = written to the kernel only")
        c.set_defaults(run=fn)
        return c

    d = cmd("dump", runs("meta", "run_dump"), "print every path that has metadata, with its keys",
            "Print the merged state of the store (tree plus journal): every path that has at "
            "least one key, with its keys and values. With --json: one JSON object "
            "{path: {key: string or [strings]}}, the same as gio info -a 'metadata::*' reports.",
            ["journalfs meta dump ~/.local/share/gvfs-metadata/home",
             "journalfs meta dump /srv/meta/root --json | jq 'keys'"])
    d.add_argument("--json", action="store_true", help="one JSON object {path: {key: value}}")

    g = cmd("get", runs("meta", "run_get"), "print the keys of one path, or one key's value",
            "Print every key of PATH (key: value lines), or only KEY's value (a list: one "
            "element per line). A path without metadata or a missing key is an error (exit 1), "
            "as with getfattr.",
            ["journalfs meta get /srv/meta/home /docs/a.txt",
             "journalfs meta get /srv/meta/home /docs/a.txt comment",
             "journalfs meta get /srv/meta/home /docs/a.txt --json"])
    g.add_argument("path", metavar="PATH", help="the store path, e.g. /docs/a.txt")
    g.add_argument("key", metavar="KEY", nargs="?", help="one key (default: all of them)")
    g.add_argument("--json", action="store_true",
                   help="JSON: {key: value} for the path, or the key's value")

    s = cmd("set", runs("meta", "run_set"), "set a key of a path (several values: a list)",
            "Set KEY of PATH to VALUE; several values (or --list) store a list. The store must "
            "exist, unless --create is given.",
            ["journalfs meta set /srv/meta/home /docs/a.txt comment 'checked by ops'",
             "journalfs meta set /srv/meta/home /docs/a.txt tags red green",
             "journalfs meta set --create /srv/new-store/home /x rating 5"], writes=True)
    s.add_argument("path", metavar="PATH", help="the store path, e.g. /docs/a.txt")
    s.add_argument("key", metavar="KEY", help="the key (gvfs's metadata::KEY)")
    s.add_argument("values", nargs="+", metavar="VALUE", help="the value, or the list's elements")
    s.add_argument("--list", action="store_true", help="store a list even for one value")
    s.add_argument("--create", action="store_true",
                   help="create the store (tree file and journal) if TREE does not exist")

    u = cmd("unset", runs("meta", "run_unset"), "remove one key of a path",
            "Remove KEY from PATH. A key that is not set is an error (exit 1).",
            ["journalfs meta unset /srv/meta/home /docs/a.txt comment"], writes=True)
    u.add_argument("path", metavar="PATH", help="the store path, e.g. /docs/a.txt")
    u.add_argument("key", metavar="KEY", help="the key to remove")

    r = cmd("rm", runs("meta", "run_rm"), "remove the metadata of a path and of everything below it",
            "Remove every key of PATH and of every path below it, as gvfs does when a file or "
            "directory is deleted.",
            ["journalfs meta rm /srv/meta/home /docs/old"], writes=True)
    r.add_argument("path", metavar="PATH", help="the store path, e.g. /docs/old")

    m = cmd("mv", runs("meta", "run_mv"), "move the metadata of a path (and below it) to another path",
            "Move the metadata of SRC and of every path below it to DST, as gvfs does when a "
            "file or directory is renamed. SRC without any metadata is an error (exit 1).",
            ["journalfs meta mv /srv/meta/home /docs/draft.txt /docs/final.txt"], writes=True)
    m.add_argument("src", metavar="SRC", help="the store path whose metadata moves")
    m.add_argument("dst", metavar="DST", help="its new store path")

    cmd("compact", runs("meta", "run_compact"), "rotate the store: merge its journal into a new tree file",
        "Write a new tree file holding the merged state and start an empty journal (gvfs "
        "calls this rotation). When a journalfs mount holds the store, the mount is asked to "
        "rotate it and the command waits for that.",
        ["journalfs meta compact ~/.local/share/journalfs/stores/data-0123456789ab/home"])
