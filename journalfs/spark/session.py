"""SparkSession set-up shared by the pipeline, the tests and the benchmark."""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile

from pyspark.sql import SparkSession

import journalfs
from . import register

LOOPBACK = "127.0.0.1"


def build_session(master: str = "local[*]", app_name: str = "journalfs", conf: dict | None = None,
                  journal_source: bool = True):
    """A session bound to loopback, UI off, whose Python workers run this interpreter, with
    the ``journal`` data source registered (``journal_source``: registering it makes Spark
    start a Python process to look up data sources, which the pipeline does not need)."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", LOOPBACK)
               .config("spark.driver.bindAddress", LOOPBACK)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if journal_source:
        register(spark)
    return spark


def package_zip(dest_dir: str | None = None) -> str:
    """journalfs as a zip for executors that do not have it installed (cluster mode)."""
    pkg_dir = os.path.dirname(os.path.abspath(journalfs.__file__))
    root = os.path.dirname(pkg_dir)
    fd, path = tempfile.mkstemp(prefix="journalfs-", suffix=".zip", dir=dest_dir)
    os.close(fd)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for d, dirs, files in os.walk(pkg_dir):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    full = os.path.join(d, name)
                    zf.write(full, os.path.relpath(full, root))
    return path
