"""Spark side of journalfs: the ``journal`` data source and the ``journalfs pipeline`` job.

``journalfs.spark.register(spark)`` then ``spark.read.format("journal").load(PATH)``.
"""
from __future__ import annotations

from .schema import COLUMNS, DAMAGE_KIND, DDL


def register(spark) -> None:
    """Register the ``journal`` data source with ``spark`` (and enable its filter push-down)."""
    from .source import register as _register  # pyspark: the package loads without it
    _register(spark)


__all__ = ["COLUMNS", "DAMAGE_KIND", "DDL", "register"]
