"""The data source's row schema (one row per journal record) and its Arrow twin."""
from __future__ import annotations

import functools

import pyarrow as pa

#: Column order and types of ``spark.read.format("journal")`` (CONTRACT.md, "The Spark pipeline").
DDL = ("source string, format string, seq long, offset long, kind string, time timestamp, "
       "key string, id long, payload binary, attrs map<string,string>")
COLUMNS = ("source", "format", "seq", "offset", "kind", "time", "key", "id", "payload", "attrs")

#: ``kind`` of the rows that report damage (kept out of the normal output; see ``includeDamage``).
DAMAGE_KIND = "_damage"


def spark_schema():
    # pyspark (optional: the spark extra): this module loads with the package, whose
    # planning (the pipeline's checks before Spark starts) runs without it
    from pyspark.sql.types import (BinaryType, LongType, MapType, StringType, StructField,
                                   StructType, TimestampType)
    types = {"string": StringType(), "long": LongType(), "timestamp": TimestampType(),
             "binary": BinaryType(), "map<string,string>": MapType(StringType(), StringType())}
    fields = []
    for part in DDL.split(", "):
        name, typ = part.split(" ", 1)
        fields.append(StructField(name, types[typ], True))
    return StructType(fields)


@functools.lru_cache(maxsize=1)
def arrow_schema():
    """Exactly the Arrow schema Spark checks yielded batches against (what
    ``pyspark.sql.pandas.types.to_arrow_schema(spark_schema(), timezone="UTC")`` gives; built
    here with pyarrow alone so executors need not import pandas)."""
    entries = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
    attrs = pa.map_(entries.field(0), entries.field(1))
    return pa.schema([("source", pa.string()), ("format", pa.string()), ("seq", pa.int64()),
                      ("offset", pa.int64()), ("kind", pa.string()),
                      ("time", pa.timestamp("us", tz="UTC")), ("key", pa.string()),
                      ("id", pa.int64()), ("payload", pa.binary()), ("attrs", attrs)])
