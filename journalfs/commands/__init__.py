"""One module per subcommand; each has ``add_parser(subparsers)`` which sets ``run``."""
from . import fsck, meta, mount, pipeline, records

COMMANDS = (records, fsck, meta, mount, pipeline)
