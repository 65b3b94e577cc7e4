"""`journalfs pipeline --master spark://...` on a REAL standalone cluster: one master and two
workers on 127.0.0.1, started from the pyspark package's own scripts and stopped by pid."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from journalfs.spark.testing import free_port, stop_processes

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[1]
STARTUP_LIMIT = 300  # seconds; a loaded 2-core machine starts JVMs slowly


def spark_home() -> str:
    import pyspark
    return os.path.dirname(pyspark.__file__)


def spark_env(work: Path) -> dict:
    return dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1",
                PYSPARK_PYTHON=sys.executable, SPARK_WORKER_DIR=str(work / "worker"),
                SPARK_LOG_DIR=str(work / "logs"), SPARK_NO_DAEMONIZE="1")


def wait_for(log: Path, text: str, count: int, proc_list) -> None:
    deadline = time.monotonic() + STARTUP_LIMIT
    while time.monotonic() < deadline:
        if log.exists() and log.read_text(errors="replace").count(text) >= count:
            return
        for p in proc_list:
            assert p.poll() is None, f"a Spark daemon exited early; see {log}"
        time.sleep(0.5)
    pytest.fail(f"{text!r} x{count} did not appear in {log}")


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int = 2, hide: Path | None = None):
    """A master and ``workers`` 1-core workers on 127.0.0.1; yields the master URL. ``hide``:
    the workers run in a mount namespace of their own where that directory is an empty
    tmpfs (a cluster whose workers cannot see the driver's files)."""
    work.mkdir(exist_ok=True)
    env = spark_env(work)
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = []
    master_log = work / "master.log"
    try:
        with open(master_log, "w") as log:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        wait_for(master_log, "I have been elected leader", 1, procs)
        for n in range(workers):
            worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                      "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                      "--work-dir", str(work / f"worker{n}"), master_url]
            if hide is not None:  # exec: the pid we stop is the worker's own
                worker = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount -t tmpfs -o size=1m,mode=0755 journalfs-hidden "$0" && exec "$@"',
                          str(hide), *worker]
            with open(work / f"worker{n}.log", "w") as log:
                procs.append(subprocess.Popen(worker, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True))
        wait_for(master_log, "Registering worker", workers, procs)
        yield master_url
    finally:
        stop_processes(procs)


@pytest.fixture
def cluster(tmp_path):
    work = tmp_path / "spark"
    with standalone_cluster(work) as master_url:
        yield master_url, work


def test_pipeline_on_a_standalone_cluster(cluster, tmp_path, conformance_dir):
    master_url, work = cluster
    src = tmp_path / "in"
    shutil.copytree(conformance_dir / "records", src)
    snap = sorted((conformance_dir / "gvfs").glob("*/snapshots/*"))[-1]
    shutil.copytree(snap / "gvfs-metadata", src / "store")
    out = tmp_path / "out"
    # a tiny input: JVM start-up and warm-up dominate, so C1-only JIT and serial GC
    quick_jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    env = dict(os.environ, PYTHONPATH=str(REPO), SPARK_LOCAL_IP="127.0.0.1", JOURNALFS_SPARK_CDS="0",
               PYSPARK_SUBMIT_ARGS=(
        f'--driver-java-options "{quick_jvm}" --conf "spark.executor.extraJavaOptions={quick_jvm}" '
        "pyspark-shell"))
    proc = subprocess.run([sys.executable, "-m", "journalfs.cli", "pipeline", str(src), str(out),
                           "--master", master_url], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 3, proc.stderr[-3000:]  # the corpus's damaged file
    # both workers ran executors for this application
    apps = list((work / "worker0").glob("app-*")) + list((work / "worker1").glob("app-*"))
    assert len(apps) == 2, apps
    import json
    metadata: dict = {}
    for r in pq.read_table(out / "metadata").to_pylist():
        metadata.setdefault(r["path"], {})[r["key"]] = r["values"] if r["values"] is not None else r["value"]
    assert metadata == json.loads((snap / "expected.json").read_text())
    records = pq.read_table(out / "records").num_rows
    expected = json.loads((src / "expected.json").read_text())
    store_rows = 0
    from journalfs.journals import read_file
    for f in (src / "store").iterdir():
        store_rows += sum(1 for _ in read_file(str(f)))
    assert records == sum(len(v["records"]) for v in expected.values()) + store_rows
    damaged = {name for name, v in expected.items() if v["exit"] == 3}  # the corpus's damaged files
    assert {Path(p).relative_to(src).as_posix()
            for p in pq.read_table(out / "_damage").column("path").to_pylist()} == damaged
    assert pq.read_table(out / "queues").num_rows == 4


QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: the data source on a cluster, from a driver of its own (one SparkContext per process)
COUNT_ON_CLUSTER = """
import sys
from journalfs.spark.session import build_session, package_zip
spark = build_session(sys.argv[1], "hidden-input", {"spark.task.maxFailures": "2"})
spark.sparkContext.addPyFile(package_zip())
try:
    print("ROWS", spark.read.format("journal").load(sys.argv[2]).count())
except Exception as exc:
    print("FAILED", " ".join(str(exc).split()))
spark.stop()
"""


def test_workers_that_cannot_see_the_input_fail_loudly(tmp_path, records_corpus):
    """The driver lists the files, the only worker runs in a mount namespace where the data
    directory is an empty tmpfs: the tasks fail (after Spark's retries), the pipeline exits 1
    naming a file it could not read, and the data source raises instead of counting 0."""
    data = tmp_path / "data"
    shutil.copytree(records_corpus, data / "in")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), SPARK_LOCAL_IP="127.0.0.1", JOURNALFS_SPARK_CDS="0",
               PYSPARK_SUBMIT_ARGS=(
        f'--driver-java-options "{QUICK_JVM}" pyspark-shell'))
    with standalone_cluster(tmp_path / "spark", workers=1, hide=data) as master_url:
        proc = subprocess.run([sys.executable, "-m", "journalfs.cli", "pipeline", str(data / "in"),
                               str(out), "--master", master_url, "--conf", "spark.task.maxFailures=2"],
                              capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 1, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("journalfs: pipeline: cannot read " + str(data / "in")), last
        assert "No such file or directory" in last and "every executor must see" in last, last
        assert "Traceback" not in proc.stderr
        assert not out.exists()
        count = subprocess.run([sys.executable, "-c", COUNT_ON_CLUSTER, master_url, str(data / "in")],
                               capture_output=True, text=True, env=env, timeout=900)
        result = [line for line in count.stdout.splitlines() if line.startswith(("ROWS", "FAILED"))]
        assert len(result) == 1 and result[0].startswith("FAILED"), count.stdout + count.stderr[-3000:]
        assert "cannot read " + str(data / "in") in result[0], result[0]
