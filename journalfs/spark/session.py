"""SparkSession set-up shared by the pipeline, the tests and the benchmark."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import zipfile

LOOPBACK = "127.0.0.1"


def build_session(master: str = "local[*]", app_name: str = "journalfs", conf: dict | None = None,
                  journal_source: bool = True):
    """A session bound to loopback, UI off, whose Python workers run this interpreter, with
    the ``journal`` data source registered (``journal_source``: registering it makes Spark
    start a Python process to look up data sources, which the pipeline does not need)."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
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
        from . import register
        register(spark)
    return spark


def package_zip(dest_dir: str | None = None) -> str:
    """journalfs as a zip for executors that do not have it installed (cluster mode)."""
    import journalfs
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


class ClassArchive:
    """A dynamic class-data-sharing archive of the driver JVM (JDK 13+ ``-XX:SharedArchiveFile``):
    the ~14,000 classes a Spark session loads, mapped ready-parsed instead of read from 280
    jars and verified one by one. It saves about 3 s of the session's start and 1 s of its
    first job on this machine (4.3 against 7.4 s and 1.0 against 1.9 s, one core's worth).

    The first run with given JVM options has none: its JVM writes one at exit
    (``-XX:ArchiveClassesAtExit``, ~150 MB in ``$XDG_CACHE_HOME/journalfs/spark-cds``), which
    :meth:`finish` waits for and moves into place; later runs map it. The archive is keyed
    by pyspark's version, its jars, the java binary and the options; a JVM that finds an
    archive it cannot use (another JDK build) ignores it (``-Xshare:auto``, the default)."""

    #: CDS's own warnings (classes it skips) would go to the JVM's stdout: the user's.
    QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

    def __init__(self, java_options: str, cache_dir: str | None = None):
        from ..fs.indexfiles import user_cache_dir  # the user's cache directory, one place
        self.path = os.path.join(cache_dir or os.path.join(user_cache_dir(), "spark-cds"),
                                 f"driver-{_jvm_key(java_options)}.jsa")
        self.making: str | None = None

    def java_options(self) -> str:
        """Options that map the archive, or make it at this JVM's exit."""
        if os.path.isfile(self.path):
            return f"-XX:SharedArchiveFile={self.path} {self.QUIET}"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        except OSError:
            return ""
        self.making = f"{self.path}.{os.getpid()}.tmp"
        return f"-XX:ArchiveClassesAtExit={self.making} {self.QUIET}"

    def finish(self, timeout: float = 120.0) -> None:
        """After ``spark.stop()`` in a process that needs no further session: when this run
        makes the archive, end the JVM (its gateway exits on EOF) and wait for it to write
        the archive, then move it into place (another run's archive of the same key may
        have won meanwhile: either is good)."""
        if not self.making:
            return
        import subprocess
        from pyspark import SparkContext
        proc = getattr(SparkContext._gateway, "proc", None)
        try:
            if proc is not None:
                proc.stdin.close()
                proc.wait(timeout)
            if os.path.getsize(self.making) > 0:
                os.replace(self.making, self.path)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.making)


def _jvm_key(java_options: str) -> str:
    """What an archive depends on: pyspark and its jars, the java binary, the options."""
    import hashlib
    import shutil
    import pyspark
    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or ""
    parts = [pyspark.__version__, java_options]
    with contextlib.suppress(OSError):
        st = os.stat(os.path.realpath(java))
        parts.append(f"{os.path.realpath(java)}:{st.st_size}:{st.st_mtime_ns}")
    with contextlib.suppress(OSError):
        parts.extend(sorted(os.listdir(jars)))
    return hashlib.sha1("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]
