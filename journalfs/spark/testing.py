"""Pytest fixtures for the Spark tests: ONE local SparkSession for the whole test session.

Test modules use it with ``from journalfs.spark.testing import spark  # noqa: F401``. The
standalone-cluster test and bench/bigjournal.py share the port and process helpers.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from .session import build_session  # pyspark is optional: without it the tests skip
    session = build_session("local[2]", "journalfs-tests", TEST_CONF)
    yield session
    session.stop()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (what a Spark master or web UI binds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Stop exactly the processes we started, by pid: newest first, SIGKILL after 30 s."""
    for p in reversed(procs):
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
