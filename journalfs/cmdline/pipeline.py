"""The command line of ``journalfs pipeline`` (its work: :mod:`journalfs.commands.pipeline`)."""
from __future__ import annotations

import argparse
import re

from ..commands.parsing import examples, runs
from ..options import DEFAULT_DRIVER_GIB

#: Seconds to wait for a standalone master to accept a connection, and for executors.
MASTER_TIMEOUT_S = 20
_SIZE = re.compile(r"^\d+[kmgt]?$", re.IGNORECASE)
EXAMPLES = examples(
    "journalfs pipeline /var/queues /tmp/tables",
    "journalfs pipeline big.journal out --driver-memory 4g --overwrite",
    "journalfs pipeline /data out --master spark://127.0.0.1:7077 --executor-memory 4g",
    "journalfs pipeline /data out --conf spark.sql.shuffle.partitions=64")


def _size(text: str) -> str:
    if not _SIZE.match(text):
        raise ValueError(text)
    return text.lower()


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(text)
    return key.strip(), value


_size.__name__ = "memory size (e.g. 4g, 512m)"
_conf.__name__ = "KEY=VALUE"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="turn directories of journals into Parquet tables (Spark)",
        description="Write OUTPUT/records (partitioned by format), metadata, queues, "
                    "persistence, transactions and _damage as Parquet. Big journals are split "
                    "into byte ranges, so memory does not grow with file size.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="a journal file or a directory of them (a path, "
                   "file:// URI, or s3:// / s3a:// object or prefix)")
    p.add_argument("output", metavar="OUTPUT", help="directory (or s3:// prefix) for the Parquet "
                   "tables")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default local[*]; e.g. spark://127.0.0.1:7077)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUTPUT if it already holds files (refused otherwise)")
    p.add_argument("--driver-memory", type=_size, default=None, metavar="SIZE",
                   help=f"heap of the driver JVM (default {DEFAULT_DRIVER_GIB}g; with local[*] "
                        "the driver does all the work)")
    p.add_argument("--executor-memory", type=_size, default=None, metavar="SIZE",
                   help="heap of each executor on a cluster (Spark's default: 1g)")
    p.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="any Spark setting, repeatable (e.g. spark.executor.cores=2)")
    p.add_argument("--master-timeout", type=float, default=MASTER_TIMEOUT_S, metavar="S",
                   help=f"give up when the master does not answer, or no executor joins, "
                        f"within S seconds (default {MASTER_TIMEOUT_S})")
    p.set_defaults(run=runs("pipeline"))
