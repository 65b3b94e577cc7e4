"""`journalfs records` (placeholder until it lands)."""


def add_parser(sub):
    p = sub.add_parser("records", help="(not yet available)")
    p.set_defaults(run=lambda args: 1)
