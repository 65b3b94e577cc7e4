"""`journalfs meta` (placeholder until it lands)."""


def add_parser(sub):
    p = sub.add_parser("meta", help="(not yet available)")
    p.set_defaults(run=lambda args: 1)
