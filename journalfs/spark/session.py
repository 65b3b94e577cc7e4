"""SparkSession set-up shared by the pipeline, the tests and the benchmark."""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile

import journalfs
from . import register

LOOPBACK = "127.0.0.1"


def session_options(master: str = "local[*]", app_name: str = "journalfs",
                    conf: dict | None = None) -> dict[str, str]:
    """Every setting of the session :func:`build_session` makes (``conf`` last, so it
    wins): bound to loopback, UI off, Python workers running this interpreter. Sets the
    environment ``spark-submit`` reads (the driver's address, the interpreters) where the
    user has not."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    options = {"spark.master": master, "spark.app.name": app_name,
               "spark.ui.enabled": "false",
               "spark.driver.host": LOOPBACK,
               "spark.driver.bindAddress": LOOPBACK,
               "spark.pyspark.python": sys.executable,
               "spark.pyspark.driver.python": sys.executable,
               "spark.sql.session.timeZone": "UTC"}
    options.update(conf or {})
    return options


#: The pipeline's application name (what Spark's logs and a cluster's UI show).
PIPELINE_APP = "journalfs pipeline"


def pipeline_settings(conf: dict | None = None) -> dict[str, str]:
    """The pipeline's own settings, then ``conf`` (the user's memory sizes and settings,
    which win)."""
    settings = {"spark.sql.shuffle.partitions": "8", "spark.ui.showConsoleProgress": "false",
                # the records' job and the metadata replay (mapInArrow) would set
                # different worker environments and so start two Python daemons
                "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
                # pyarrow's default pool (mimalloc) keeps freed batches' pages: a worker's
                # peak RSS 25-30 MB lower with malloc's, for the same CPU (bench corpus)
                "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system"}
    settings.update(conf or {})
    return settings


def build_session(master: str = "local[*]", app_name: str = "journalfs", conf: dict | None = None,
                  journal_source: bool = True):
    """A session of :func:`session_options`, with the ``journal`` data source registered
    (``journal_source``: registering it makes Spark start a Python process to look up data
    sources, which the pipeline does not need). It uses a driver JVM :func:`launch_driver`
    started already, if any."""
    # pyspark.sql here: the pipeline command works out its settings before it has loaded
    from pyspark.sql import SparkSession
    builder = SparkSession.builder
    for key, value in session_options(master, app_name, conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if journal_source:
        register(spark)
    return spark


def launch_driver(options: dict[str, str], stderr: int):
    """Start the driver JVM of a session of ``options`` (:func:`session_options`) as
    pyspark would, its stderr to the file descriptor ``stderr``: a py4j gateway whose
    ``proc`` is the JVM. :func:`adopt_driver` makes the next session use it, provided
    it is built with the very same options (they are the JVM's system properties)."""
    # as in build_session
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway
    return launch_gateway(SparkConf(loadDefaults=False).setAll(list(options.items())),
                          popen_kwargs={"stderr": stderr})


def adopt_driver(gateway) -> None:
    from pyspark import SparkContext  # as in build_session
    SparkContext._ensure_initialized(gateway=gateway)


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
