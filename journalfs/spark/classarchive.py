"""A class-data-sharing archive of the pipeline's driver JVM.

``-XX:SharedArchiveFile`` (JDK 13+) maps the ~14,000 classes a Spark session loads ready
parsed, instead of reading them from 280 jars and verifying them one by one: about 3 s less
start-up and 1 s less first job on this machine (4.3 against 7.4 s and 1.0 against 1.9 s).

Writing one (``-XX:ArchiveClassesAtExit``) slows the JVM that writes it by about 18 CPU-s,
so no user's run does: when a short pipeline run finds none, it starts one detached process
at the lowest priority that runs the pipeline over the demo's journals in a temporary
directory and writes the archive (~190 MB, in ``~/.cache/journalfs/spark-cds/``), as
``git gc --auto`` does its work after the command; the runs after it map the archive.
At most one such process runs at a time (a lock file). The archive is keyed by pyspark's
version and jars, the java binary and the JVM options; a JVM that finds an archive it
cannot use ignores it (``-Xshare:auto``, the default). ``JOURNALFS_SPARK_CDS=0``: none.

    python -m journalfs.spark.classarchive ARCHIVE JAVA_OPTIONS LOCK    (what is started)
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..fs.indexfiles import user_cache_dir

#: CDS's own warnings (classes it skips) would go to the JVM's stdout.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: A lock older than this was left by a builder that died.
STALE_LOCK_S = 900


class ClassArchive:
    def __init__(self, java_options: str, cache_dir: str | None = None):
        self.java = java_options
        self.path = os.path.join(cache_dir or os.path.join(user_cache_dir(), "spark-cds"),
                                 f"driver-{_jvm_key(java_options)}.jsa")

    def java_options(self) -> str:
        """Options that map the archive; "" while there is none."""
        return f"-XX:SharedArchiveFile={self.path} {QUIET}" if os.path.isfile(self.path) else ""

    def make_later(self) -> subprocess.Popen | None:
        """When there is no archive and nobody is making one: start the detached builder."""
        if os.path.isfile(self.path):
            return None
        lock = self.path + ".lock"
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(lock).st_mtime > STALE_LOCK_S:
                    os.unlink(lock)
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        except OSError:  # being made, or no cache directory: this run does without
            return None
        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
        return subprocess.Popen(
            [sys.executable, "-m", __name__, self.path, self.java, lock],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, env=env, preexec_fn=_lowest_priority)


def _lowest_priority() -> None:
    os.nice(19)


def make(path: str, java_options: str, lock: str) -> None:
    """Run the pipeline over the demo's journals with a JVM that writes its classes to
    ``path`` as it exits, and wait for it to."""
    # here, not at the top: the pipeline's command names the archive before loading these
    from pyspark import SparkContext
    from ..demo import write_demo
    from .pipeline import run
    from .session import build_session
    making = f"{path}.{os.getpid()}.tmp"
    _remove_unfinished(path)
    try:
        with tempfile.TemporaryDirectory(prefix="journalfs-class-archive-") as work:
            write_demo(Path(work, "in"))
            spark = build_session("local[2]", "journalfs class archive", {
                "spark.driver.memory": "1g", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.driver.extraJavaOptions":
                    f"{java_options} -XX:ArchiveClassesAtExit={making} {QUIET}"},
                journal_source=False)
            run(spark, os.path.join(work, "in"), os.path.join(work, "out"))
            spark.stop()
            gateway = SparkContext._gateway
            if gateway is not None:  # the JVM writes the archive as it exits
                gateway.proc.stdin.close()
                gateway.proc.wait(600)
        if os.path.getsize(making) > 0:
            os.replace(making, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(making)
        with contextlib.suppress(OSError):
            os.unlink(lock)


def _remove_unfinished(path: str) -> None:
    """Copies of ``path`` a killed builder left half-written (~190 MB each: a builder dies
    with the container or the service that started it); we hold its lock, so no other
    builder of ``path`` is writing one."""
    cache, prefix = os.path.split(path)
    for name in os.listdir(cache):
        if name.startswith(prefix + ".") and name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(cache, name))


def _jvm_key(java_options: str) -> str:
    """What an archive depends on: pyspark and its jars, the java binary, the options."""
    import pyspark  # here: the pipeline command names the archive while pyspark loads
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


if __name__ == "__main__":
    make(*sys.argv[1:4])
