"""Pytest fixtures for the Spark tests: ONE local SparkSession for the whole test session.

Test modules use it with ``from journalfs.spark.testing import spark  # noqa: F401``.
"""
from __future__ import annotations

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
    from .session import build_session
    session = build_session("local[2]", "journalfs-tests", TEST_CONF)
    yield session
    session.stop()
