"""Journals in object storage: the `journal` data source and `journalfs pipeline` reading
s3:// and s3a:// URIs from a REAL S3-compatible server (moto_server, from `moto[server]`) on
127.0.0.1, against the same files read locally. Spark runs in subprocesses, so that its
Python workers get the AWS variables from their environment (as on a real machine)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from journalfs.spark.testing import free_port, stop_processes

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[1]
BUCKET = "journals"
QUICK_JVM = '--driver-java-options "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" pyspark-shell'


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(endpoint URL, environment for subprocesses) of a moto S3 server on 127.0.0.1."""
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if server is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]'; pinned in the test extra)")
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
               AWS_ENDPOINT_URL=endpoint, PYTHONPATH=str(REPO), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_SUBMIT_ARGS=QUICK_JVM, JOURNALFS_SPARK_CDS="0")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        yield endpoint, env
    finally:
        stop_processes([proc])
        log.close()


def s3fs(endpoint: str):
    from pyarrow import fs
    return fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                           scheme="http", endpoint_override=endpoint.removeprefix("http://"),
                           allow_bucket_creation=True)


@pytest.fixture(scope="module")
def uploaded(s3, tmp_path_factory, conformance_dir):
    """The records corpus and a gvfs store, locally and under s3://journals/in/."""
    from pyarrow import fs
    endpoint, _env = s3
    local = tmp_path_factory.mktemp("s3in") / "in"
    shutil.copytree(conformance_dir / "records", local)
    snap = sorted((conformance_dir / "gvfs").glob("*/snapshots/*"))[-1]
    shutil.copytree(snap / "gvfs-metadata", local / "store")
    remote = s3fs(endpoint)
    remote.create_dir(BUCKET)
    fs.copy_files(str(local), f"{BUCKET}/in", source_filesystem=fs.LocalFileSystem(),
                  destination_filesystem=remote)
    return local


def pipeline(env, *argv):
    return subprocess.run([sys.executable, "-m", "journalfs.cli", "pipeline", *argv],
                          capture_output=True, text=True, env=env, timeout=900)


def rows(out: Path, name: str, local: Path) -> list:
    """A table's rows, sorted, with s3://journals/in (or s3a://) written as the local dir."""
    def norm(v):
        if isinstance(v, str):
            for scheme in ("s3", "s3a"):
                v = v.replace(f"{scheme}://{BUCKET}/in", str(local))
            return v
        return v
    table = pq.read_table(out / name)
    out_rows = [tuple((k, norm(v) if not isinstance(v, list) else [norm(x) for x in v])
                      for k, v in sorted(r.items())) for r in table.to_pylist()]
    return sorted(out_rows, key=repr)


def test_pipeline_from_s3_gives_the_tables_of_a_local_run(s3, uploaded, tmp_path):
    _endpoint, env = s3
    local = uploaded
    proc = pipeline(env, str(local), str(tmp_path / "local"))
    assert proc.returncode == 3, proc.stderr[-3000:]  # the corpus holds one damaged file
    proc = pipeline(env, f"s3a://{BUCKET}/in", f"s3://{BUCKET}/out")  # from S3 to S3
    assert proc.returncode == 3, proc.stderr[-3000:]
    again = pipeline(env, f"s3a://{BUCKET}/in", f"s3://{BUCKET}/out")
    assert again.returncode == 2 and "already holds objects" in again.stderr, again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    proc = pipeline(env, f"s3a://{BUCKET}/in", f"s3://{BUCKET}/out", "--overwrite")
    assert proc.returncode == 3, proc.stderr[-3000:]
    from pyarrow import fs
    fs.copy_files(f"{BUCKET}/out", str(tmp_path / "remote"), source_filesystem=s3fs(s3[0]),
                  destination_filesystem=fs.LocalFileSystem())
    for name in ("records", "metadata", "queues", "persistence", "transactions", "_damage"):
        assert rows(tmp_path / "remote", name, local) == rows(tmp_path / "local", name, local), name
    assert pq.read_table(tmp_path / "remote" / "records").num_rows > 200
    sources = set(pq.read_table(tmp_path / "remote" / "records").column("source").to_pylist())
    assert all(s.startswith(f"s3a://{BUCKET}/in/") for s in sources)


def test_pipeline_refuses_missing_and_non_journal_objects(s3, uploaded, tmp_path):
    _endpoint, env = s3
    for uri, words in ((f"s3://{BUCKET}/nope", f"s3://{BUCKET}/nope: no such object or prefix"),
                       (f"s3://{BUCKET}/in/expected.json",
                        f"s3://{BUCKET}/in/expected.json: not a journal (supported formats: ")):
        proc = pipeline(env, uri, str(tmp_path / "out"))
        assert proc.returncode == 1, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert words in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists()


DATA_SOURCE = """
import sys
from journalfs.spark.session import build_session
spark = build_session("local[2]", "s3-source", {"spark.sql.shuffle.partitions": "2"})
local, remote, endpoint = sys.argv[1:4]
def keyed(df):
    return sorted((r["source"].replace(remote, local), r["seq"], r["kind"], r["payload"])
                  for r in df.select("source", "seq", "kind", "payload").collect())
from_s3 = spark.read.format("journal").option("endpoint", endpoint).option("region", "us-east-1")
print("EQUAL", keyed(from_s3.load(remote)) == keyed(spark.read.format("journal").load(local)))
print("KESTREL", from_s3.option("formats", "kestrel-writer").load(remote).count())
try:
    from_s3.load(remote + "/nope").count()
    print("MISSING no error")
except Exception as exc:
    print("MISSING", "no such object or prefix" in str(exc))
spark.stop()
"""


def test_data_source_reads_s3_like_local_files(s3, uploaded):
    """load("s3://…") with the endpoint as an option (the environment's is removed)."""
    endpoint, env = s3
    env = {k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"}
    proc = subprocess.run([sys.executable, "-c", DATA_SOURCE, str(uploaded), f"s3://{BUCKET}/in",
                           endpoint], capture_output=True, text=True, env=env, timeout=900)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("EQUAL", "KESTREL", "MISSING")))
    assert lines.get("EQUAL") == "True", proc.stdout + proc.stderr[-3000:]
    assert int(lines["KESTREL"]) > 0
    assert lines["MISSING"] == "True"


@pytest.fixture(scope="module")
def uploaded_big(s3, tmp_path_factory):
    """Journals over 1 MiB, locally and under s3://journals/big/."""
    from pyarrow import fs
    from journalfs.formats import CODECS, kestrel
    from journalfs.formats.akka import AkkaData
    endpoint, _env = s3
    local = tmp_path_factory.mktemp("s3big") / "big"
    (local / "akka").mkdir(parents=True)
    payloads = [bytes([n % 251]) * (n % 700) for n in range(6000)]
    (local / "big.1").write_bytes(kestrel.build_writer_file(payloads, first_id=1))
    data, meta = AkkaData.build([(f"pid-{n % 7}", n // 7 + 1, bytes(n % 300)) for n in range(9000)])
    (local / "akka" / "data").write_bytes(data)
    (local / "akka" / "meta").write_bytes(meta)
    (local / "w.log.idx").write_bytes(CODECS["wallaby-index"].write(
        [{"time": 10**18 + n, "index": n, "log_offset": 16 + n} for n in range(100_000)]))
    remote = s3fs(endpoint)
    with contextlib.suppress(OSError):
        remote.create_dir(BUCKET)
    fs.copy_files(str(local), f"{BUCKET}/big", source_filesystem=fs.LocalFileSystem(),
                  destination_filesystem=remote)
    return local


def test_objects_are_split_only_by_arithmetic(s3, uploaded_big, monkeypatch):
    """Planning reads no object whole: a fixed-width index is split by its record size, a
    big variable-width object is one task (its executor reads it)."""
    from journalfs.spark.plan import list_journals, plan
    from journalfs.spark.storage import s3_options
    endpoint, env = s3
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.setenv(key, env[key])
    storage = s3_options({"endpoint": endpoint, "region": "us-east-1"})
    files = list_journals(f"s3://{BUCKET}/big", storage=storage)
    assert {f.path.rpartition("/")[2]: f.format for f in files} == {
        "big.1": "kestrel-writer", "data": "akka-data", "meta": "akka-meta", "w.log.idx": "wallaby-index"}
    slices: dict[str, list] = {}
    for group in plan(files, 2, 1 << 20, None, storage).groups:
        for s in group:
            slices.setdefault(s.path.rpartition("/")[2], []).append(s)
            assert s.storage == storage
    assert len(slices["w.log.idx"]) >= 2 and len(slices["big.1"]) == len(slices["data"]) == 1
    assert dict(slices["data"][0].partners) == {"meta": f"s3://{BUCKET}/big/akka/meta"}


SPLIT_SOURCE = """
import sys
from journalfs.spark.session import build_session
spark = build_session("local[2]", "s3-split", {"spark.sql.shuffle.partitions": "2"})
local, remote = sys.argv[1:3]
def keyed(df):
    return sorted((r["source"].replace(remote, local), r["seq"], r["offset"], r["key"], r["id"],
                   r["payload"]) for r in df.collect())
def load(path):
    return spark.read.format("journal").option("maxSplitBytes", str(1 << 20)).load(path)
print("EQUAL", keyed(load(remote)) == keyed(load(local)), load(remote).rdd.getNumPartitions())
spark.stop()
"""


def test_split_objects_and_partner_keys_read_like_local_files(s3, uploaded_big):
    _endpoint, env = s3
    proc = subprocess.run([sys.executable, "-c", SPLIT_SOURCE, str(uploaded_big),
                           f"s3://{BUCKET}/big"], capture_output=True, text=True, env=env, timeout=900)
    line = [x for x in proc.stdout.splitlines() if x.startswith("EQUAL")]
    assert line and line[0].split()[1] == "True", proc.stdout + proc.stderr[-3000:]
    assert int(line[0].split()[2]) >= 3
