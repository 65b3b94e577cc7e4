"""`journalfs pipeline INPUT OUTPUT [--master URL]`: journals -> Parquet tables with Spark."""
from __future__ import annotations

import os
import sys
import tempfile


def add_parser(sub):
    p = sub.add_parser("pipeline", help="turn directories of journals into Parquet tables (Spark)",
                       description="Write OUTPUT/records, metadata, queues, persistence, "
                                   "transactions and _damage as Parquet.")
    p.add_argument("input", metavar="INPUT", help="a journal file or a directory of them")
    p.add_argument("output", metavar="OUTPUT", help="directory for the Parquet tables")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default local[*]; e.g. spark://127.0.0.1:7077)")
    p.set_defaults(run=run)


def run(args) -> int:
    if not os.path.exists(args.input):
        print(f"journalfs: pipeline: no such file or directory: {args.input}", file=sys.stderr)
        return 1
    from ..spark.pipeline import print_summary, run as run_pipeline, spark_for
    with tempfile.TemporaryDirectory(prefix="journalfs-pipeline-") as scratch:
        spark = spark_for(args.master, scratch)
        try:
            summary = run_pipeline(spark, args.input, args.output)
        finally:
            spark.stop()
    print_summary(summary)
    return 0
