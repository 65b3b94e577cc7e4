"""The command lines of ``journalfs queue``, ``events``, ``transactions`` and ``changes``
(their work: :mod:`journalfs.commands.state`).
"""
from __future__ import annotations

from ..commands.parsing import add_command, runs
from ..options import PAYLOAD_MODES


def add_parser(sub) -> None:
    p = add_command(
        sub, "queue", "a Kestrel queue's readers: head, tail, pending items",
        "Show what each reader of a Kestrel queue has still to read: its head (the last id "
        "it consumed in order), the queue's tail (the newest id), the number of pending "
        "items and the time of the oldest one. QUEUE is DIR/NAME (the segments NAME.<n> and "
        "readers NAME.read.<r> of DIR), a directory (every queue in it) or one of the "
        "queue's files. Pending means what the pipeline's queues table counts: PUTs after "
        "the reader's head that it has not marked done (expiry is not applied). --pending "
        "lists those items; --watch prints the answer again whenever the files change.",
        "journalfs queue /var/spool/kestrel/jobs",
        "journalfs queue /var/spool/kestrel/jobs --reader mailer --pending",
        "journalfs queue /var/spool/kestrel --json | jq .pending")
    p.add_argument("queue", metavar="QUEUE", help="DIR/NAME, a directory, or a queue file")
    p.add_argument("--reader", metavar="NAME",
                   help="only this reader ('' is the default reader, file NAME.read.)")
    p.add_argument("--pending", action="store_true", help="list the pending items")
    _common(p)
    p.set_defaults(run=runs("state", "run_queue"))

    p = add_command(
        sub, "events", "an akka persistence journal's ids and their events in order",
        "Without --id, list the persistence ids of an akka-persistence file journal (JOURNAL "
        "is its directory or its meta or data file): the number of events along each id's "
        "chain, its highest sequence number and whether the chain agrees with its meta block "
        "(the pipeline's persistence table). With --id, print that id's events in sequence "
        "order, as eventsByPersistenceId does, optionally from/to a sequence number.",
        "journalfs events /data/akka/orders",
        "journalfs events /data/akka/orders --id order-17 --from-seq 3 --payload text",
        "journalfs events /data/akka/orders --id order-17 --json | jq -r .payload")
    p.add_argument("journal", metavar="JOURNAL", help="the journal's directory, meta or data file")
    p.add_argument("--id", dest="persistence_id", metavar="ID", help="one persistence id")
    p.add_argument("--from-seq", type=int, default=None, metavar="N",
                   help="events from sequence number N on")
    p.add_argument("--to-seq", type=int, default=None, metavar="N",
                   help="events up to sequence number N, inclusive")
    p.add_argument("--payload", choices=PAYLOAD_MODES, default="auto",
                   help="how events' payloads are shown (default auto: UTF-8 as text, else "
                        "base64)")
    _common(p)
    p.set_defaults(run=runs("state", "run_events"))

    p = add_command(
        sub, "transactions", "a JRNL journal's transactions and their status",
        "List the transactions of JRNL journal files with their time, status and operations, "
        "as the pipeline's transactions table: complete, redo (incomplete, its operations "
        "all written: to redo) or rollback (incomplete: to roll back).",
        "journalfs transactions db.jrnl",
        "journalfs transactions db.jrnl --incomplete --json")
    p.add_argument("files", nargs="+", metavar="FILE", help="JRNL journal files")
    p.add_argument("--incomplete", action="store_true",
                   help="only transactions that did not complete (redo or rollback)")
    _common(p)
    p.set_defaults(run=runs("state", "run_transactions"))

    p = add_command(
        sub, "changes", "what each entry of a gvfs metadata journal changed",
        "List the entries of a gvfs metadata journal (TREE-<tag>.log) in order with what each "
        "changed: set, set-list and unset with the key's value before and after (replayed on "
        "top of the journal's own tree, as the store's compaction applies them), copy and "
        "remove of a whole subtree.",
        "journalfs changes ~/.local/share/gvfs-metadata/home-5eedface.log",
        "journalfs changes home-5eedface.log --path /docs/notes.md --json")
    p.add_argument("journal", metavar="JOURNAL", help="a gvfs metadata journal file")
    p.add_argument("--path", metavar="PATH", help="only entries about PATH (or below it)")
    _common(p)
    p.set_defaults(run=runs("state", "run_changes"))


def _common(p) -> None:
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--utc", action="store_true", help="times in UTC (default: local time)")
    p.add_argument("-w", "--watch", action="store_true",
                   help="print the answer again whenever the files change (Ctrl-C stops)")
